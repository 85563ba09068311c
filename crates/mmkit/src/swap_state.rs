//! The swap cache of one device (Linux's `mm/swap_state.c`): which page frame
//! holds the content of a swap slot while a page is on its way out (swap-out has
//! allocated the slot, the write is pending) or back in (read, not yet mapped by
//! every user).
//!
//! Two indexes, chosen at run time ([`SwapCacheIndex`]):
//! - `Trunks` (Linux until 6.17): one index and one lock per 64 MiB of device
//!   (`SWAP_ADDRESS_SPACE_PAGES` slots); every insert, delete and lookup takes the
//!   trunk's lock. (Linux's xarray lookups ran under RCU; this one is locked.)
//! - `Table` (Linux 6.18's swap table): an atomic entry per slot, grouped by
//!   cluster; inserts and deletes happen under the slot's cluster lock (the swap
//!   map's), lookups are one atomic load with no lock.
//!
//! Entries map a slot to a pfn (a `u32` page index); the page side keeps the
//! reverse link. Invariants: at most one pfn per slot; an entry is inserted only
//! where none is, and deleted only by naming the pfn it holds; `nr_cached` is the
//! number of entries (per-CPU counters folded on read).
//!
//! A page in the swap cache has `PG_SWAPCACHE` and its entry in `swap_entry`;
//! the page-side helpers (`Mm::swapcache_add`/`swapcache_drop`) change the
//! three together, only under the page lock.
//!
//! Locking: `Trunks`: each trunk's map under its lock (statistics in
//! `trunk_lock_stats`). `Table`: entries written under the cluster lock of the
//! swap map (`SwapMap::lock_cluster`), read with `Acquire` loads.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::{LockStats, Platform};

use mmkit_core::page::PG_SWAPCACHE;

use crate::pgtable::{desc, Pte, SwapEntry};
use crate::platform::StdPlatform;
use crate::rmap::PageGuard;
use crate::swap_cluster::{SwapMap, SWAP_ADDRESS_SPACE_PAGES};
use crate::swap_lock::{LockClassStats, StatLock};

/// Which index the swap cache uses (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SwapCacheIndex {
    /// One index and one lock per 64 MiB trunk (Linux until 6.17).
    Trunks,
    /// A per-cluster table of atomic entries (Linux 6.18).
    #[default]
    Table,
}

/// A hasher for slot numbers (a multiply, no DoS concern: keys are ours).
#[derive(Default)]
struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Trunk = HashMap<u32, u32, BuildHasherDefault<SlotHasher>>;

enum Index {
    Trunks(Box<[CachePadded<StatLock<Trunk>>]>),
    /// `pfn + 1` per slot, 0 when empty.
    Table(Box<[AtomicU32]>),
}

/// The swap cache already holds a page for the slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("swap slot {slot} is already cached in pfn {pfn}")]
pub(crate) struct CacheExists {
    pub slot: u32,
    pub pfn: u32,
}

const NR_SHARDS: usize = 64;

/// The swap cache of one device.
pub(crate) struct SwapCache {
    index: Index,
    nr_cached: Box<[CachePadded<AtomicI64>]>,
    pub(crate) trunk_lock_stats: LockClassStats,
}

impl SwapCache {
    /// An empty cache for `nr_slots` slots.
    pub(crate) fn new(kind: SwapCacheIndex, nr_slots: u32) -> SwapCache {
        let index = match kind {
            SwapCacheIndex::Trunks => Index::Trunks(
                (0..nr_slots.div_ceil(SWAP_ADDRESS_SPACE_PAGES))
                    .map(|_| CachePadded::new(StatLock::new(Trunk::default())))
                    .collect(),
            ),
            SwapCacheIndex::Table => {
                Index::Table((0..nr_slots).map(|_| AtomicU32::new(0)).collect())
            }
        };
        SwapCache {
            index,
            nr_cached: (0..NR_SHARDS)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
            trunk_lock_stats: LockClassStats::new(),
        }
    }

    /// The index in use.
    #[cfg_attr(any(not(test), loom), allow(dead_code))] // used by the unit tests
    pub(crate) fn kind(&self) -> SwapCacheIndex {
        match self.index {
            Index::Trunks(_) => SwapCacheIndex::Trunks,
            Index::Table(_) => SwapCacheIndex::Table,
        }
    }

    fn count(&self, d: i64) {
        self.nr_cached[StdPlatform::cpu_id() % NR_SHARDS].fetch_add(d, Ordering::Relaxed);
    }

    /// Pages in the cache (`SwapCached`).
    pub(crate) fn nr_cached(&self) -> u64 {
        self.nr_cached
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<i64>()
            .max(0) as u64
    }

    /// Statistics of the trunk locks (zero with `Table`).
    pub(crate) fn trunk_lock_stats(&self) -> LockStats {
        self.trunk_lock_stats.snapshot()
    }

    fn trunk(t: &[CachePadded<StatLock<Trunk>>], slot: u32) -> &StatLock<Trunk> {
        &t[(slot / SWAP_ADDRESS_SPACE_PAGES) as usize]
    }

    /// Inserts `slot -> pfn` (Linux's `add_to_swap_cache`); refused when the slot
    /// already has a page. `map` is the device's swap map (its cluster lock
    /// guards the table).
    pub(crate) fn add_to_swap_cache(
        &self,
        map: &SwapMap,
        slot: u32,
        pfn: u32,
    ) -> Result<(), CacheExists> {
        assert!(pfn < u32::MAX, "pfn {pfn} does not fit a swap-table entry");
        match &self.index {
            Index::Trunks(t) => {
                let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                if let Some(&old) = g.get(&slot) {
                    return Err(CacheExists { slot, pfn: old });
                }
                g.insert(slot, pfn);
            }
            Index::Table(t) => {
                let _ci = map.lock_cluster(slot);
                let e = &t[slot as usize];
                let old = e.load(Ordering::Relaxed);
                if old != 0 {
                    return Err(CacheExists { slot, pfn: old - 1 });
                }
                e.store(pfn + 1, Ordering::Release);
            }
        }
        self.count(1);
        Ok(())
    }

    /// The pfn cached for `slot` (Linux's `swap_cache_get_folio`): a snapshot;
    /// the caller locks the page and checks it still caches the slot.
    pub(crate) fn lookup_swap_cache(&self, slot: u32) -> Option<u32> {
        match &self.index {
            Index::Trunks(t) => Self::trunk(t, slot)
                .lock(&self.trunk_lock_stats)
                .get(&slot)
                .copied(),
            Index::Table(t) => match t[slot as usize].load(Ordering::Acquire) {
                0 => None,
                v => Some(v - 1),
            },
        }
    }

    /// Removes `slot -> pfn` (Linux's `__delete_from_swap_cache`); false (and no
    /// change) when the slot does not cache that pfn.
    pub(crate) fn delete_from_swap_cache(&self, map: &SwapMap, slot: u32, pfn: u32) -> bool {
        let done = match &self.index {
            Index::Trunks(t) => {
                let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                if g.get(&slot) == Some(&pfn) {
                    g.remove(&slot);
                    true
                } else {
                    false
                }
            }
            Index::Table(t) => {
                let _ci = map.lock_cluster(slot);
                let e = &t[slot as usize];
                if e.load(Ordering::Relaxed) == pfn.wrapping_add(1) && pfn != u32::MAX {
                    e.store(0, Ordering::Release);
                    true
                } else {
                    false
                }
            }
        };
        if done {
            self.count(-1);
        }
        done
    }
}

impl crate::Mm {
    /// Puts the locked page `page` in the swap cache for `entry` (whose slot
    /// holds the cache's reference): the index entry, `PG_SWAPCACHE` and the
    /// page's `swap_entry` (Linux's `add_to_swap_cache`).
    pub(crate) fn swapcache_add(&self, page: &PageGuard<'_>, entry: SwapEntry) {
        self.swap()
            .add_to_swap_cache(entry, page.pfn().get() as u32)
            .expect("the slot's swap-cache reference is ours");
        let d = desc(self, page.pfn());
        d.swap_entry()
            .store(Pte::swap(entry).raw(), Ordering::Relaxed);
        d.set_flag(PG_SWAPCACHE);
    }

    /// The swap entry the locked page caches, if it is in the swap cache.
    pub(crate) fn swapcache_entry(&self, page: &PageGuard<'_>) -> Option<SwapEntry> {
        let d = desc(self, page.pfn());
        if !d.test_flag(PG_SWAPCACHE) {
            return None;
        }
        Pte::from_raw(d.swap_entry().load(Ordering::Relaxed)).swap_entry()
    }

    /// Takes the locked page out of the swap cache, if it is in it, and drops
    /// the cache's slot reference, which frees the slot when no PTE holds it
    /// (Linux's `delete_from_swap_cache` + `put_swap_folio`). Its entry, if any.
    pub(crate) fn swapcache_drop(&self, page: &PageGuard<'_>) -> Option<SwapEntry> {
        let entry = self.swapcache_entry(page)?;
        let d = desc(self, page.pfn());
        self.swap()
            .delete_from_swap_cache(entry, page.pfn().get() as u32);
        d.clear_flag(PG_SWAPCACHE);
        d.swap_entry().store(0, Ordering::Relaxed);
        let _ = self.swap().swapcache_clear(entry);
        Some(entry)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::swap_cluster::{SwapAllocPolicy, SWAPFILE_CLUSTER};
    use std::sync::Arc;

    #[test]
    fn swap_cache_add_lookup_delete_both_indexes() {
        for kind in [SwapCacheIndex::Trunks, SwapCacheIndex::Table] {
            let nr = 2 * SWAP_ADDRESS_SPACE_PAGES + 5;
            let map = SwapMap::new(nr, SwapAllocPolicy::PerCpuCluster, 1, 1);
            let c = SwapCache::new(kind, nr);
            assert_eq!(c.kind(), kind);
            for (slot, pfn) in [
                (0, 0),
                (7, 70),
                (SWAP_ADDRESS_SPACE_PAGES, 9),
                (nr - 1, 1 << 30),
            ] {
                assert_eq!(c.lookup_swap_cache(slot), None);
                c.add_to_swap_cache(&map, slot, pfn).unwrap();
                assert_eq!(c.lookup_swap_cache(slot), Some(pfn));
                assert_eq!(
                    c.add_to_swap_cache(&map, slot, 5),
                    Err(CacheExists { slot, pfn })
                );
            }
            assert_eq!(c.nr_cached(), 4);
            assert!(!c.delete_from_swap_cache(&map, 7, 71));
            assert!(c.delete_from_swap_cache(&map, 7, 70));
            assert!(!c.delete_from_swap_cache(&map, 7, 70));
            assert_eq!(c.lookup_swap_cache(7), None);
            assert_eq!(c.nr_cached(), 3);
            match kind {
                SwapCacheIndex::Trunks => {
                    assert!(c.trunk_lock_stats().acquisitions >= 12);
                    assert_eq!(map.cluster_lock_stats().acquisitions, 0);
                }
                SwapCacheIndex::Table => {
                    assert_eq!(c.trunk_lock_stats().acquisitions, 0);
                    // Writes only (4 adds, 4 refused adds, 3 deletes); lookups are lock-free.
                    assert_eq!(map.cluster_lock_stats().acquisitions, 11);
                }
            }
        }
    }

    #[test]
    fn swap_cache_threads_one_winner_per_slot() {
        for kind in [SwapCacheIndex::Trunks, SwapCacheIndex::Table] {
            let nr = 4 * SWAPFILE_CLUSTER;
            let map = Arc::new(SwapMap::new(nr, SwapAllocPolicy::PerCpuCluster, 8, 1));
            let c = Arc::new(SwapCache::new(kind, nr));
            let wins: Vec<u32> = (0..8u32)
                .map(|t| {
                    let (map, c) = (map.clone(), c.clone());
                    std::thread::spawn(move || {
                        (0..nr)
                            .filter(|&s| c.add_to_swap_cache(&map, s, t).is_ok())
                            .count() as u32
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert_eq!(wins.iter().sum::<u32>(), nr);
            assert_eq!(c.nr_cached(), nr as u64);
            for s in 0..nr {
                let pfn = c.lookup_swap_cache(s).unwrap();
                assert!(c.delete_from_swap_cache(&map, s, pfn));
            }
            assert_eq!(c.nr_cached(), 0);
        }
    }
}
