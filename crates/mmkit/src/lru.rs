//! The LRU lists of anonymous pages (Linux's `lruvec` and the folio batches of
//! `mm/swap.c`): per node an active and an inactive list, and per CPU an
//! `lru_add` batch through which newly mapped pages reach them, so that the LRU
//! lock is taken once per batch instead of once per fault.
//!
//! The list mechanics (intrusive lists with links indexed by pfn) are the core's
//! ([`mmkit_core::lru`]); this file adds the per-node LRU lock, the per-CPU
//! batches, and `PG_LRU` on the page descriptor, kept equal to "on a list" as
//! Linux's flag is.
//!
//! Invariants (all under the LRU lock of the frame's node):
//! - a frame is on a list only if it is an allocated order-0 page mapped by some
//!   space (`mapping != 0`) at the moment it is linked; whoever clears `mapping`
//!   (unmap through the mmu_gather, migration) takes it off with that same lock
//!   (`remove_batch`, `replace`) before the page is freed;
//! - an isolated page (`isolate`) is off the lists with `PG_LRU` clear and holds
//!   an extra reference taken under the lock, so it cannot be freed until its
//!   isolator drops that reference after `putback`;
//! - a frame pending in a per-CPU batch holds nothing: the batch re-checks it
//!   under the lock when it drains (a page unmapped meanwhile is skipped, one
//!   reallocated and mapped again is linked once, `PG_LRU` stops a second link).
//!
//! Locking: per-CPU batch mutex (uncontended but for remote drains) -> node LRU
//! lock ([`StatLock`], its acquisitions and waits counted like the zone lock's).
//! The link arrays are atomics written only under the owning node's lock, read
//! only under it.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::lru::{LruLinks, LruLists};
use mmkit_core::page::PG_LRU;
use mmkit_core::{LockStats, PageState, Platform};

pub(crate) use mmkit_core::lru::LruList;

use crate::pgtable::desc;
use crate::swap_lock::{Guard, LockClassStats, StatLock};
use crate::{Mm, Pfn, StdPlatform};

/// Pages a per-CPU `lru_add` batch holds before it drains (Linux's folio batch).
pub(crate) const LRU_ADD_BATCH: usize = 31;

/// The anonymous LRU of one Mm: per-node lists, per-CPU add batches.
pub(crate) struct Lru {
    links: LruLinks,
    nodes: Box<[CachePadded<StatLock<LruLists>>]>,
    lock_stats: LockClassStats,
    batches: Box<[CachePadded<parking_lot::Mutex<Vec<u32>>>]>,
    /// Per node: pages isolated from its lists by reclaimers now (Linux's
    /// `NR_ISOLATED_ANON`), for `too_many_isolated`.
    isolated: Box<[CachePadded<AtomicU64>]>,
    /// Per node: (active, inactive) lengths as of the last unlock, so that
    /// reclaim's sizing decisions never take the lock (Linux's lruvec sizes).
    lens: Box<[CachePadded<[AtomicU64; 2]>]>,
}

/// A held node LRU lock and the links it guards.
struct Locked<'a> {
    links: &'a LruLinks,
    g: Guard<'a, LruLists>,
    /// The node's list lengths for lock-free readers, published on unlock.
    lens: &'a [AtomicU64; 2],
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.lens[0].store(self.g.len(LruList::Active), Ordering::Relaxed);
        self.lens[1].store(self.g.len(LruList::Inactive), Ordering::Relaxed);
    }
}

impl Locked<'_> {
    fn on_lru(&self, pfn: u32) -> bool {
        self.links.which(pfn).is_some()
    }
    fn add(&mut self, pfn: u32, list: LruList) {
        self.g.add_head(self.links, pfn, list);
    }
    fn del(&mut self, pfn: u32) -> Option<LruList> {
        self.g.del(self.links, pfn)
    }
}

/// May `pfn` go on a list: an allocated order-0 page some space maps?
fn linkable(mm: &Mm, pfn: u32) -> bool {
    let d = desc(mm, Pfn::new(pfn as u64));
    d.mapping.load(Ordering::Acquire) != 0 && d.state() == PageState::Alloc && d.order() == 0
}

impl Lru {
    pub(crate) fn new(nr_pages: u64, nr_nodes: usize, nr_cpus: usize) -> Lru {
        Lru {
            links: LruLinks::new(nr_pages as usize),
            nodes: (0..nr_nodes.max(1))
                .map(|_| CachePadded::new(StatLock::new(LruLists::default())))
                .collect(),
            lock_stats: LockClassStats::new(),
            batches: (0..nr_cpus.max(1))
                .map(|_| CachePadded::new(parking_lot::Mutex::new(Vec::new())))
                .collect(),
            isolated: (0..nr_nodes.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            lens: (0..nr_nodes.max(1))
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
        }
    }

    fn lock(&self, nid: usize) -> Locked<'_> {
        let nid = self.node(nid);
        Locked {
            links: &self.links,
            g: self.nodes[nid].lock(&self.lock_stats),
            lens: &self.lens[nid],
        }
    }

    fn node(&self, nid: usize) -> usize {
        nid.min(self.nodes.len() - 1)
    }

    /// Linux's `too_many_isolated`: reclaimers of node `nid` hold more pages
    /// isolated than its inactive list has left, so another direct reclaimer
    /// would find little to do but make the others' batches smaller (kswapd is
    /// never throttled).
    pub(crate) fn too_many_isolated(&self, nid: usize) -> bool {
        let isolated = self.nr_isolated(nid);
        isolated > 0 && isolated > self.nr_pages(nid).1
    }

    /// Pages of node `nid` isolated by reclaimers now.
    pub(crate) fn nr_isolated(&self, nid: usize) -> u64 {
        self.isolated[self.node(nid)].load(Ordering::Relaxed)
    }

    /// The isolation of `n` pages of node `nid` has ended (the caller put them
    /// back and dropped their references).
    pub(crate) fn end_isolation(&self, nid: usize, n: usize) {
        self.isolated[self.node(nid)].fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// LRU lock statistics, summed over nodes.
    pub(crate) fn lock_stats(&self) -> LockStats {
        self.lock_stats.snapshot()
    }

    /// `(active, inactive)` pages on node `nid`'s lists.
    pub(crate) fn nr_pages(&self, nid: usize) -> (u64, u64) {
        let l = &self.lens[self.node(nid)];
        (l[0].load(Ordering::Relaxed), l[1].load(Ordering::Relaxed))
    }

    /// Linux's `lru_add_drain`: this CPU's batch to the lists.
    pub(crate) fn drain_local(&self, mm: &Mm) {
        let cpu = StdPlatform::cpu_id() % self.batches.len();
        let mut b = self.batches[cpu].lock();
        if !b.is_empty() {
            self.add_batch(mm, &b);
            b.clear();
        }
    }

    /// Linux's `folio_add_lru`: queues newly mapped pages on this CPU's batch,
    /// draining it to the lists (one LRU lock hold) when it is full.
    pub(crate) fn lru_cache_add(&self, mm: &Mm, pfns: &[Pfn]) {
        let cpu = StdPlatform::cpu_id() % self.batches.len();
        let mut b = self.batches[cpu].lock();
        b.extend(pfns.iter().map(|p| p.get() as u32));
        if b.len() >= LRU_ADD_BATCH {
            self.add_batch(mm, &b);
            b.clear();
        }
    }

    /// Linux's `lru_add_drain_all`: every CPU's batch to the lists.
    pub(crate) fn drain_all(&self, mm: &Mm) {
        for b in self.batches.iter() {
            let mut b = b.lock();
            if !b.is_empty() {
                self.add_batch(mm, &b);
                b.clear();
            }
        }
    }

    /// Links the pages of a batch that are still mapped and not yet on a list to
    /// the head of their node's inactive list, one lock hold per node.
    fn add_batch(&self, mm: &Mm, pfns: &[u32]) {
        self.per_node(mm, pfns, |l, pfn| {
            if !l.on_lru(pfn) && linkable(mm, pfn) {
                l.add(pfn, LruList::Inactive);
                desc(mm, Pfn::new(pfn as u64)).set_flag(PG_LRU);
            }
        });
    }

    /// Runs `f` on each pfn under its node's lock, taking each node's lock once
    /// (pfns of one batch are nearly always of one node).
    fn per_node(&self, mm: &Mm, pfns: &[u32], mut f: impl FnMut(&mut Locked<'_>, u32)) {
        if pfns.is_empty() {
            return;
        }
        let nid0 = mm.node_of(Pfn::new(pfns[0] as u64));
        let mut others = false;
        {
            let mut l = self.lock(nid0);
            for &p in pfns {
                if mm.node_of(Pfn::new(p as u64)) == nid0 {
                    f(&mut l, p);
                } else {
                    others = true;
                }
            }
        }
        if others {
            for nid in (0..self.nodes.len()).filter(|&n| n != nid0) {
                let mut l = self.lock(nid);
                for &p in pfns {
                    if mm.node_of(Pfn::new(p as u64)) == nid {
                        f(&mut l, p);
                    }
                }
            }
        }
    }

    /// Takes pages that are being freed off the lists (the mmu_gather's flush,
    /// Linux's `__folio_put` -> `lruvec_del_folio`), one lock hold per node.
    /// Their reverse maps are already cleared.
    pub(crate) fn remove_batch(&self, mm: &Mm, pfns: &[u32]) {
        self.per_node(mm, pfns, |l, pfn| {
            if l.del(pfn).is_some() {
                desc(mm, Pfn::new(pfn as u64)).clear_flag(PG_LRU);
            }
        });
    }

    /// Migration moved `old` to `new` (whose reverse map is set): `new` takes
    /// `old`'s place (or goes on the inactive list when `old` was pending in a
    /// batch).
    pub(crate) fn replace(&self, mm: &Mm, old: Pfn, new: Pfn) {
        let mut l = self.lock(mm.node_of(old));
        let list = l.del(old.get() as u32).unwrap_or(LruList::Inactive);
        desc(mm, old).clear_flag(PG_LRU);
        drop(l);
        let mut l = self.lock(mm.node_of(new));
        if !l.on_lru(new.get() as u32) {
            l.add(new.get() as u32, list);
            desc(mm, new).set_flag(PG_LRU);
        }
    }

    /// Linux's `isolate_lru_folios`: up to `n` pages from the tail of `list` on
    /// node `nid`, taken off the list with `PG_LRU` cleared and a reference each
    /// (dropped by the caller after `putback`, then `end_isolation`), appended
    /// to `out`.
    pub(crate) fn isolate(&self, mm: &Mm, nid: usize, list: LruList, n: usize, out: &mut Vec<Pfn>) {
        let mut l = self.lock(nid);
        for _ in 0..n {
            let Some(pfn) = l.g.tail(list) else {
                break;
            };
            l.del(pfn);
            let p = Pfn::new(pfn as u64);
            desc(mm, p).clear_flag(PG_LRU);
            // Linked means allocated and not yet through the gather's flush,
            // which needs this lock: the reference is safe to take.
            mm.pin_page(p);
            out.push(p);
            self.isolated[self.node(nid)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Linux's `move_folios_to_lru`: puts isolated pages back at the head of
    /// the list given, those still mapped; the caller then drops the isolation
    /// references.
    pub(crate) fn putback(&self, mm: &Mm, pages: &[(Pfn, LruList)]) {
        for nid in 0..self.nodes.len() {
            if !pages.iter().any(|(p, _)| mm.node_of(*p) == nid) {
                continue;
            }
            let mut l = self.lock(nid);
            for &(p, list) in pages.iter().filter(|(p, _)| mm.node_of(*p) == nid) {
                let pfn = p.get() as u32;
                if !l.on_lru(pfn) && linkable(mm, pfn) {
                    l.add(pfn, list);
                    desc(mm, p).set_flag(PG_LRU);
                }
            }
        }
    }

    /// Walks every list and checks the links, the lengths, `PG_LRU` and that
    /// every frame on a list is allocated (quiescent).
    pub(crate) fn check(&self, mm: &Mm) -> Result<(), String> {
        for nid in 0..self.nodes.len() {
            let l = self.lock(nid);
            for list in [LruList::Inactive, LruList::Active] {
                l.g.check(l.links, list, |p| {
                    let d = desc(mm, Pfn::new(p as u64));
                    if !d.test_flag(PG_LRU) {
                        return Err("on a list without PG_LRU");
                    }
                    if d.state() != PageState::Alloc {
                        return Err("on a list but not allocated");
                    }
                    Ok(())
                })
                .map_err(|(p, e)| format!("LRU of node {nid}, {list:?} list: pfn {p}: {e}"))?;
            }
        }
        Ok(())
    }
}
