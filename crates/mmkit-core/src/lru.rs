//! LRU list mechanics (Linux's `lruvec` lists and `list_head` in `struct folio`):
//! intrusive doubly linked lists of frames, the links kept in arrays indexed by
//! pfn ([`LruLinks`]), one [`LruLists`] (an inactive and an active list) per node.
//!
//! Invariants: a frame is on at most one list; `LruLinks::which(pfn)` says which
//! (or none); `len` counts the frames linked; `head`/`tail` are `NIL` exactly when
//! the list is empty. The layer above keeps `PG_LRU` equal to "on a list".
//!
//! Locking: none here. Every call that changes a node's lists, and every read of
//! the links of that node's frames, is made under one lock per node that the
//! caller holds (the std crate's LRU lock, with its statistics); the links are
//! relaxed atomics only so that the arrays can be shared between nodes' locks.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering};

/// No frame.
pub const LRU_NIL: u32 = u32::MAX;

/// The two anonymous lists of a node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LruList {
    /// Cold pages, scanned for reclaim from the tail.
    Inactive = 0,
    /// Pages found referenced on the inactive list.
    Active = 1,
}

const ON_NONE: u8 = 0;

const fn tag(list: LruList) -> u8 {
    list as u8 + 1
}

/// The per-frame links of every list (Linux's `folio->lru`), for `nr_pages` frames.
pub struct LruLinks {
    next: Box<[AtomicU32]>,
    prev: Box<[AtomicU32]>,
    which: Box<[AtomicU8]>,
    /// The policy's per-frame state (`lru_policy::LRU_*` bits, Linux's
    /// `PG_referenced`/`PG_workingset`/use counter); kept across isolation.
    state: Box<[AtomicU8]>,
}

impl LruLinks {
    /// Links for `nr_pages` frames, none on a list.
    pub fn new(nr_pages: usize) -> LruLinks {
        let v = |x: u32| (0..nr_pages).map(|_| AtomicU32::new(x)).collect::<Vec<_>>();
        LruLinks {
            next: v(LRU_NIL).into_boxed_slice(),
            prev: v(LRU_NIL).into_boxed_slice(),
            which: (0..nr_pages).map(|_| AtomicU8::new(ON_NONE)).collect(),
            state: (0..nr_pages).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// The policy state of `pfn` (`lru_policy::LRU_*`), read by whoever owns
    /// its place on the lists (the LRU lock, its isolator, its fault).
    pub fn state(&self, pfn: u32) -> u8 {
        self.state[pfn as usize].load(Ordering::Relaxed)
    }

    /// Sets the policy state of `pfn` (same owners as [`state`](Self::state)).
    pub fn set_state(&self, pfn: u32, v: u8) {
        self.state[pfn as usize].store(v, Ordering::Relaxed);
    }

    /// The list `pfn` is on (under its node's lock).
    pub fn which(&self, pfn: u32) -> Option<LruList> {
        match self.which[pfn as usize].load(Ordering::Relaxed) {
            ON_NONE => None,
            1 => Some(LruList::Inactive),
            _ => Some(LruList::Active),
        }
    }
}

/// One node's inactive and active lists.
pub struct LruLists {
    head: [u32; 2],
    tail: [u32; 2],
    len: [u64; 2],
}

impl Default for LruLists {
    fn default() -> Self {
        LruLists {
            head: [LRU_NIL; 2],
            tail: [LRU_NIL; 2],
            len: [0; 2],
        }
    }
}

impl LruLists {
    /// Frames on `list`.
    pub fn len(&self, list: LruList) -> u64 {
        self.len[list as usize]
    }

    /// Is `list` empty?
    pub fn is_empty(&self, list: LruList) -> bool {
        self.len(list) == 0
    }

    /// The oldest frame of `list` (reclaim scans from here).
    pub fn tail(&self, list: LruList) -> Option<u32> {
        let t = self.tail[list as usize];
        (t != LRU_NIL).then_some(t)
    }

    /// Adds `pfn` (on no list) at the head of `list`.
    pub fn add_head(&mut self, links: &LruLinks, pfn: u32, list: LruList) {
        debug_assert!(links.which(pfn).is_none());
        let l = list as usize;
        let old = self.head[l];
        links.next[pfn as usize].store(old, Ordering::Relaxed);
        links.prev[pfn as usize].store(LRU_NIL, Ordering::Relaxed);
        if old == LRU_NIL {
            self.tail[l] = pfn;
        } else {
            links.prev[old as usize].store(pfn, Ordering::Relaxed);
        }
        self.head[l] = pfn;
        self.len[l] += 1;
        links.which[pfn as usize].store(tag(list), Ordering::Relaxed);
    }

    /// Takes `pfn` off its list; the list it was on, `None` if it was on none.
    pub fn del(&mut self, links: &LruLinks, pfn: u32) -> Option<LruList> {
        let list = links.which(pfn)?;
        let l = list as usize;
        let n = links.next[pfn as usize].load(Ordering::Relaxed);
        let p = links.prev[pfn as usize].load(Ordering::Relaxed);
        if p == LRU_NIL {
            self.head[l] = n;
        } else {
            links.next[p as usize].store(n, Ordering::Relaxed);
        }
        if n == LRU_NIL {
            self.tail[l] = p;
        } else {
            links.prev[n as usize].store(p, Ordering::Relaxed);
        }
        self.len[l] -= 1;
        links.which[pfn as usize].store(ON_NONE, Ordering::Relaxed);
        Some(list)
    }

    /// Walks `list` from head to tail, calling `f` on each frame, and checks the
    /// back links, the tags and the length. The first broken invariant, as text.
    pub fn check(
        &self,
        links: &LruLinks,
        list: LruList,
        mut f: impl FnMut(u32) -> Result<(), &'static str>,
    ) -> Result<(), (u32, &'static str)> {
        let (mut p, mut prev, mut n) = (self.head[list as usize], LRU_NIL, 0u64);
        while p != LRU_NIL {
            if links.which(p) != Some(list) {
                return Err((p, "linked on a list it is not tagged with"));
            }
            if links.prev[p as usize].load(Ordering::Relaxed) != prev {
                return Err((p, "broken back link"));
            }
            f(p).map_err(|e| (p, e))?;
            prev = p;
            p = links.next[p as usize].load(Ordering::Relaxed);
            n += 1;
        }
        if n != self.len[list as usize] || self.tail[list as usize] != prev {
            return Err((prev, "length or tail does not match the links"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_del_tail_and_check() {
        let links = LruLinks::new(16);
        let mut l = LruLists::default();
        for p in [3, 5, 7] {
            l.add_head(&links, p, LruList::Inactive);
        }
        l.add_head(&links, 9, LruList::Active);
        assert_eq!(l.len(LruList::Inactive), 3);
        assert_eq!(l.tail(LruList::Inactive), Some(3));
        assert_eq!(l.del(&links, 5), Some(LruList::Inactive));
        assert_eq!(l.del(&links, 5), None);
        assert_eq!(l.del(&links, 3), Some(LruList::Inactive));
        assert_eq!(l.tail(LruList::Inactive), Some(7));
        assert_eq!(links.which(9), Some(LruList::Active));
        let mut seen = Vec::new();
        l.check(&links, LruList::Inactive, |p| {
            seen.push(p);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [7]);
        l.check(&links, LruList::Active, |_| Ok(())).unwrap();
        assert_eq!(l.del(&links, 7), Some(LruList::Inactive));
        assert!(l.is_empty(LruList::Inactive) && l.tail(LruList::Inactive).is_none());
    }
}
