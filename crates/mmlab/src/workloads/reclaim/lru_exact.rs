//! `lru-exact`: exact LRU over the trace's pages with a fixed number of
//! resident pages (the count measured in mmkit's run of the same trace), as a
//! `replay::Target`. A miss on a page seen before is a device read; a first
//! touch, or a touch after its segment was dropped, is a zero fill.
//!
//! The list is intrusive over the dense page numbers (prev/next arrays), so
//! every access is O(1) and the model holds 12 bytes per page of the trace.

use super::replay::{Snapshot, Target};

const NIL: u32 = u32::MAX;

/// Exact LRU with `capacity` resident pages.
pub struct LruExact {
    capacity: u64,
    resident: u64,
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Bit 0: resident; bit 1: content exists (written or swapped) somewhere.
    state: Vec<u8>,
    /// The page number stored in each page (its first 4 bytes).
    value: Vec<u32>,
    head: u32,
    tail: u32,
    reads: u64,
    segment_pages: u64,
}

const RESIDENT: u8 = 1;
const EXISTS: u8 = 2;

impl LruExact {
    pub fn new(pages: u64, segment_pages: u64, capacity: u64) -> LruExact {
        let n = pages as usize;
        LruExact {
            capacity: capacity.max(1),
            resident: 0,
            prev: vec![NIL; n],
            next: vec![NIL; n],
            state: vec![0; n],
            value: vec![0; n],
            head: NIL,
            tail: NIL,
            reads: 0,
            segment_pages: segment_pages.max(1),
        }
    }

    fn unlink(&mut self, p: u32) {
        let (a, b) = (self.prev[p as usize], self.next[p as usize]);
        if a == NIL {
            self.head = b;
        } else {
            self.next[a as usize] = b;
        }
        if b == NIL {
            self.tail = a;
        } else {
            self.prev[b as usize] = a;
        }
        self.prev[p as usize] = NIL;
        self.next[p as usize] = NIL;
    }

    fn push_head(&mut self, p: u32) {
        self.prev[p as usize] = NIL;
        self.next[p as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = p;
        }
        self.head = p;
        if self.tail == NIL {
            self.tail = p;
        }
    }

    /// Whether `page` is resident.
    #[cfg(test)]
    pub fn is_resident(&self, page: u64) -> bool {
        self.state[page as usize] & RESIDENT != 0
    }
}

impl Target for LruExact {
    fn access(&mut self, page: u64, write: bool, value: u32) -> Option<u32> {
        let p = u32::try_from(page).ok()?;
        let i = p as usize;
        if i >= self.state.len() {
            return None;
        }
        if self.state[i] & RESIDENT != 0 {
            self.unlink(p);
        } else {
            if self.state[i] & EXISTS != 0 {
                self.reads += 1;
            }
            if self.resident == self.capacity {
                let victim = self.tail;
                self.unlink(victim);
                self.state[victim as usize] &= !RESIDENT;
                self.resident -= 1;
            }
            self.state[i] |= RESIDENT | EXISTS;
            self.resident += 1;
        }
        self.push_head(p);
        if write {
            self.value[i] = value;
        }
        Some(self.value[i])
    }

    fn discard(&mut self, n: u64) -> Result<(), String> {
        let from = n * self.segment_pages;
        let to = (from + self.segment_pages).min(self.state.len() as u64);
        for page in from..to {
            let i = page as usize;
            if self.state[i] & RESIDENT != 0 {
                self.unlink(page as u32);
                self.resident -= 1;
            }
            self.state[i] = 0;
            self.value[i] = 0;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Snapshot {
        Snapshot {
            reads: self.reads,
            ..Snapshot::default()
        }
    }

    fn resident(&mut self) -> u64 {
        self.resident
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = LruExact::new(8, 4, 3);
        for p in [0, 1, 2] {
            l.access(p, true, p as u32 + 1);
        }
        l.access(0, false, 0); // 0 most recent: order 0, 2, 1
        l.access(3, true, 4); // evicts 1
        assert!(!l.is_resident(1));
        assert!(l.is_resident(0) && l.is_resident(2) && l.is_resident(3));
        assert_eq!(l.snapshot().reads, 0);
        assert_eq!(l.access(1, false, 0), Some(2)); // a read back: device read
        assert_eq!(l.snapshot().reads, 1);
        assert!(!l.is_resident(2)); // 2 was the least recent
                                    // Dropping segment 0 (pages 0..4) frees them: the next touch is fresh.
        l.discard(0).unwrap();
        assert_eq!(l.resident(), 0);
        assert_eq!(l.access(2, false, 0), Some(0));
        assert_eq!(l.snapshot().reads, 1);
    }

    #[test]
    fn a_loop_larger_than_memory_always_misses() {
        let mut l = LruExact::new(5, 5, 4);
        for _ in 0..3 {
            for p in 0..5 {
                l.access(p, false, 0);
            }
        }
        // The first pass faults fresh pages; the next two miss every page.
        assert_eq!(l.snapshot().reads, 10);
    }
}
