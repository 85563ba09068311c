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
//! reverse link. A slot whose page was evicted holds a shadow instead
//! (`workingset.rs`: the eviction clock, node and workingset bit, tagged with
//! `SHADOW_TAG`, as Linux 6.18's swap table holds NULL, a folio or a shadow):
//! lookups do not see it, an insert replaces it, the refault reads it first
//! (`swap_shadow`), and freeing the slot clears it (`clear_shadow`, under the
//! cluster lock, as Linux's swap table does): a shadow belongs to the slot's
//! one eviction, never to a later owner of the slot.
//! Invariants: at most one pfn per slot; an entry is inserted only where no page
//! is, and deleted only by naming the pfn it holds; `nr_cached` is the number of
//! page entries (per-CPU counters folded on read).
//!
//! A page in the swap cache has `PG_SWAPCACHE` and its entry in `swap_entry`;
//! the page-side helpers (`Mm::swapcache_add`/`swapcache_drop`) change the
//! three together, only under the page lock. They, and the cache's operations
//! on a device (`add_to_swap_cache`, `lookup_swap_cache`,
//! `delete_from_swap_cache` on `SwapInfoStruct`), take the device pinned by the
//! caller (`swap_device.rs`): the cache never looks a device up itself
//! (`swapcache_drop_page` pins one for a path that has none).
//!
//! # Swap-in
//!
//! [`Mm::read_swap_cache_start`] (Linux's `__read_swap_cache_async` with
//! `swap_read_folio`) is the one routine that brings a slot into the cache, for
//! the fault (`do_swap_page` in `space/swap.rs`) and for both readaheads
//! (`swap_readahead.rs`): a page already cached is returned as it is;
//! otherwise alloc, `swapcache_prepare`, lock, add, read (CRC32C verified), and
//! on failure the undo (`swapin_undo`, also the fault's when its PTE changed).
//! It comes in two halves, `read_swap_cache_start` (up to the read, started
//! and not waited for) and `read_swap_cache_end` (wait, verify, or undo), so
//! that a fault has its read-ahead reads in flight with its own.
//!
//! Locking: `Trunks`: each trunk's map under its lock (statistics in
//! `trunk_lock_stats`). `Table`: entries written under the cluster lock of the
//! swap map (`SwapMap::lock_cluster`), read with `Acquire` loads. The swap-in
//! routine holds one page lock (the new page's) while it adds and reads; the
//! cache and map locks are leaves taken inside it.
//!
//! Readahead, which brings more slots in through the same routine, is in
//! `swap_readahead.rs`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::{LockStats, Platform};

use mmkit_core::page::PG_SWAPCACHE;

use crate::page_io::SwapRead;
use crate::pgtable::{desc, Pte, SwapEntry};
use crate::platform::StdPlatform;
use crate::rmap::PageGuard;
use crate::swap_cluster::{MapError, SwapMap, SWAP_ADDRESS_SPACE_PAGES};
use crate::swapfile::{SwapError, SwapInfoStruct};
use crate::sync::{LockClassStats, StatLock};
use crate::workingset::SHADOW_TAG;
use crate::{Error, Gfp, Mm, Pfn};

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
    /// `pfn + 1` per slot, a shadow (`SHADOW_TAG` set), or 0 when empty: (S)
    /// written under the slot's cluster lock, read without it (locking
    /// letters: see `rmap.rs`).
    Table(Box<[AtomicU32]>),
}

/// Does a slot word hold a page (`pfn + 1`), rather than nothing or a shadow?
fn is_page(word: u32) -> bool {
    word != 0 && word & SHADOW_TAG == 0
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
    #[cfg_attr(any(not(test), loom), expect(dead_code))] // used by the unit tests
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
        assert!(
            pfn + 1 < SHADOW_TAG,
            "pfn {pfn} does not fit a swap-table entry"
        );
        match &self.index {
            Index::Trunks(t) => {
                let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                if let Some(&old) = g.get(&slot).filter(|&&w| is_page(w)) {
                    return Err(CacheExists { slot, pfn: old - 1 });
                }
                g.insert(slot, pfn + 1);
            }
            Index::Table(t) => {
                let _ci = map.lock_cluster(slot);
                let e = &t[slot as usize];
                let old = e.load(Ordering::Relaxed);
                if is_page(old) {
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
        let word = self.word(slot);
        is_page(word).then(|| word - 1)
    }

    /// The slot's word: 0, `pfn + 1` or a shadow.
    fn word(&self, slot: u32) -> u32 {
        match &self.index {
            Index::Trunks(t) => Self::trunk(t, slot)
                .lock(&self.trunk_lock_stats)
                .get(&slot)
                .copied()
                .unwrap_or(0),
            Index::Table(t) => t[slot as usize].load(Ordering::Acquire),
        }
    }

    /// The shadow the slot holds, if it holds one (Linux's
    /// `swap_cache_get_shadow`); the refault's caller owns the slot's cache
    /// reference, so nothing replaces it meanwhile.
    pub(crate) fn swap_shadow(&self, slot: u32) -> Option<u32> {
        let word = self.word(slot);
        (word & SHADOW_TAG != 0).then_some(word)
    }

    /// Leaves `shadow` in a slot that caches no page (the victim of a swap-in
    /// exchange, evicted into a slot no page is cached for); false when a page
    /// is cached there.
    pub(crate) fn set_shadow(&self, map: &SwapMap, slot: u32, shadow: u32) -> bool {
        debug_assert!(shadow & SHADOW_TAG != 0);
        match &self.index {
            Index::Trunks(t) => {
                let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                if g.get(&slot).is_some_and(|&w| is_page(w)) {
                    return false;
                }
                g.insert(slot, shadow);
            }
            Index::Table(t) => {
                let _ci = map.lock_cluster(slot);
                let e = &t[slot as usize];
                if is_page(e.load(Ordering::Relaxed)) {
                    return false;
                }
                e.store(shadow, Ordering::Release);
            }
        }
        true
    }

    /// Entries of the `Trunks` index (pages and shadows), or None with `Table`.
    #[cfg(test)]
    pub(crate) fn nr_trunk_entries(&self) -> Option<usize> {
        match &self.index {
            Index::Trunks(t) => Some(t.iter().map(|g| g.lock(&self.trunk_lock_stats).len()).sum()),
            Index::Table(_) => None,
        }
    }

    /// Forgets the shadow of a slot that became free (Linux's
    /// `__swap_cluster_free_entries` clears its table entries): a later
    /// owner of the slot never reads the evicted page's. The caller holds the
    /// slot's cluster lock (the table's writers' lock); a free slot caches no
    /// page, so only a shadow can be there.
    pub(crate) fn clear_shadow(&self, slot: u32) {
        match &self.index {
            Index::Trunks(t) => {
                let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                if g.get(&slot).is_some_and(|&w| w & SHADOW_TAG != 0) {
                    g.remove(&slot);
                }
            }
            Index::Table(t) => {
                let e = &t[slot as usize];
                if e.load(Ordering::Relaxed) & SHADOW_TAG != 0 {
                    e.store(0, Ordering::Release);
                }
            }
        }
    }

    /// Removes `slot -> pfn` (Linux's `__delete_from_swap_cache`), leaving
    /// `shadow` (a `SHADOW_TAG` word, or 0 for none) in its place; false (and
    /// no change) when the slot does not cache that pfn.
    pub(crate) fn delete_from_swap_cache(
        &self,
        map: &SwapMap,
        slot: u32,
        pfn: u32,
        shadow: u32,
    ) -> bool {
        debug_assert!(shadow == 0 || shadow & SHADOW_TAG != 0);
        let want = pfn.wrapping_add(1);
        let done = is_page(want)
            && match &self.index {
                Index::Trunks(t) => {
                    let mut g = Self::trunk(t, slot).lock(&self.trunk_lock_stats);
                    if g.get(&slot) == Some(&want) {
                        if shadow == 0 {
                            g.remove(&slot);
                        } else {
                            g.insert(slot, shadow);
                        }
                        true
                    } else {
                        false
                    }
                }
                Index::Table(t) => {
                    let _ci = map.lock_cluster(slot);
                    let e = &t[slot as usize];
                    if e.load(Ordering::Relaxed) == want {
                        e.store(shadow, Ordering::Release);
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

/// The swap cache's operations on a pinned device (`SwapDevices::get`): the
/// entry's slot is checked to be the device's; the totals follow.
impl SwapInfoStruct {
    /// Puts `pfn` in the swap cache for `entry`.
    pub(crate) fn add_to_swap_cache(&self, entry: SwapEntry, pfn: u32) -> Result<(), SwapError> {
        self.cache
            .add_to_swap_cache(&self.map, self.slot(entry)?, pfn)?;
        self.totals.cached(1);
        Ok(())
    }

    /// The pfn cached for `entry` (a snapshot: lock the page and check).
    pub(crate) fn lookup_swap_cache(&self, entry: SwapEntry) -> Option<u32> {
        self.cache.lookup_swap_cache(self.slot(entry).ok()?)
    }

    /// Removes `entry -> pfn` from the swap cache, leaving `shadow` (a
    /// `workingset.rs` shadow, 0 for none); false when it was not there.
    pub(crate) fn delete_from_swap_cache(&self, entry: SwapEntry, pfn: u32, shadow: u32) -> bool {
        let Ok(slot) = self.slot(entry) else {
            return false;
        };
        let done = self
            .cache
            .delete_from_swap_cache(&self.map, slot, pfn, shadow);
        if done {
            self.totals.cached(-1);
        }
        done
    }

    /// The shadow `entry`'s slot holds, if any (the caller owns the slot's
    /// cache reference).
    pub(crate) fn swap_shadow(&self, entry: SwapEntry) -> Option<u32> {
        self.cache.swap_shadow(self.slot(entry).ok()?)
    }

    /// Leaves `shadow` in `entry`'s slot, which caches no page.
    pub(crate) fn set_swap_shadow(&self, entry: SwapEntry, shadow: u32) -> bool {
        self.slot(entry)
            .is_ok_and(|slot| self.cache.set_shadow(&self.map, slot, shadow))
    }
}

/// What a swap-in of a slot found.
pub(crate) enum SwapCacheRead<'a> {
    /// A new page holding the slot's verified content: locked, in the swap
    /// cache, not mapped (`swapin_undo` takes it back).
    Read(PageGuard<'a>),
    /// A page caches the slot already (read ahead, being written out, or being
    /// read by another task): its pfn, a snapshot to lock and check.
    Cached(Pfn),
    /// Another task claimed the slot and has not added its page yet.
    Busy,
}

/// Why a swap-in of a slot read nothing (nothing changed).
pub(crate) enum SwapInFail {
    /// No free page (the allocation's error).
    NoMemory(Error),
    /// The slot is not this device's or not in use (a stale entry).
    Slot(SwapError),
    /// The read failed, or its checksum did not match.
    Read(SwapError),
}

/// A slot's swap-in under way ([`Mm::read_swap_cache_start`]): its new page,
/// locked and in the swap cache, its read started. Must be passed to
/// [`Mm::read_swap_cache_end`] (the read may still be writing the page).
#[must_use = "a started swap-in must be ended"]
pub(crate) struct SwapInPending<'a> {
    lock: PageGuard<'a>,
    entry: SwapEntry,
    shadow: Option<u32>,
    read: SwapRead,
}

impl SwapInPending<'_> {
    /// The entry being read.
    pub(crate) fn entry(&self) -> SwapEntry {
        self.entry
    }
}

/// What [`Mm::read_swap_cache_start`] found.
pub(crate) enum SwapCacheStart<'a> {
    /// A new page whose read is under way.
    Started(SwapInPending<'a>),
    /// As [`SwapCacheRead::Cached`].
    Cached(Pfn),
    /// As [`SwapCacheRead::Busy`].
    Busy,
}

impl Mm {
    /// Brings `entry`'s slot of the pinned `dev` into the swap cache (Linux's
    /// `__read_swap_cache_async` with `swap_read_folio`), for a fault and for
    /// both readaheads, up to the read, which is started and not waited
    /// for: a page cached for the slot is returned as it is; otherwise a new
    /// page (`gfp`), `swapcache_prepare` (of concurrent callers one wins, the
    /// others get `Busy`), locked, added to the cache, and its read started
    /// (on an NBD device it is in flight when this returns; `block`: it may
    /// wait for a free request slot, else the read fails with nothing
    /// changed). [`Mm::read_swap_cache_end`] waits, verifies and finishes.
    /// Any failure undoes what was done.
    pub(crate) fn read_swap_cache_start(
        &self,
        dev: &SwapInfoStruct,
        entry: SwapEntry,
        gfp: Gfp,
        block: bool,
    ) -> Result<SwapCacheStart<'_>, SwapInFail> {
        dev.slot(entry).map_err(SwapInFail::Slot)?;
        if let Some(pfn) = dev.lookup_swap_cache(entry) {
            return Ok(SwapCacheStart::Cached(Pfn::new(pfn as u64)));
        }
        let page = self
            .alloc_owned_pages(gfp, 0)
            .map_err(SwapInFail::NoMemory)?;
        match dev.swapcache_prepare(entry) {
            Ok(()) => {}
            Err(e) => {
                self.free_owned_pages(page, 0)
                    .expect("our unpublished page");
                return match e {
                    SwapError::Map(MapError::CacheBusy(_)) => Ok(SwapCacheStart::Busy),
                    e => Err(SwapInFail::Slot(e)),
                };
            }
        }
        // The slot's shadow first: the insert replaces it.
        let shadow = dev.swap_shadow(entry);
        let mut lock = self.lock_page(page);
        self.swapcache_add(dev, &lock, entry);
        let dst = lock.bytes_mut().as_mut_ptr();
        // SAFETY: the page is ours (allocated above, locked by us) and stays
        // so until `read_swap_cache_end` ends the read: `SwapInPending`
        // carries the lock there, and nothing touches the bytes meanwhile.
        match unsafe { dev.swap_read_start(entry, dst, block) } {
            Ok(read) => Ok(SwapCacheStart::Started(SwapInPending {
                lock,
                entry,
                shadow,
                read,
            })),
            Err(e) => {
                self.swapin_undo(dev, lock);
                Err(SwapInFail::Read(e))
            }
        }
    }

    /// Waits for the read of `p` and verifies it: the page, locked, in the
    /// swap cache, not mapped; or, on failure, everything undone.
    pub(crate) fn read_swap_cache_end<'a>(
        &'a self,
        dev: &SwapInfoStruct,
        p: SwapInPending<'a>,
    ) -> Result<PageGuard<'a>, SwapInFail> {
        let SwapInPending {
            lock,
            entry,
            shadow,
            read,
        } = p;
        if let Err(e) = dev.swap_read_end(read, lock.bytes()) {
            self.swapin_undo(dev, lock);
            return Err(SwapInFail::Read(e));
        }
        self.swapin_refault(lock.pfn(), shadow, dev.swap_owner(entry));
        Ok(lock)
    }

    /// The LRU state of a page just read back from a slot that held `shadow`
    /// (Linux's `workingset_refault` in the swap-in): the policy's start
    /// state, with `LRU_ACTIVATE` when the refault is recent. Kept in the
    /// page's LRU state until the fault that maps it queues it (`lru_add`).
    pub(crate) fn swapin_refault(&self, page: Pfn, shadow: Option<u32>, owner: u16) {
        let lru = self.lru();
        let base = lru.policy.new_page_state(lru.policy.fault_sets_young());
        let sh = shadow.and_then(crate::workingset::Shadow::unpack);
        let st = match sh {
            Some(sh) => crate::workingset::workingset_refault(self, sh, base),
            None => base,
        };
        lru.set_state(page, st);
        // The refault counts for the memory cgroup the slot was charged to.
        if let (Some(sh), Some(g)) = (sh, (owner != 0).then(|| self.memcg().get(owner)).flatten()) {
            use crate::memcontrol::Event;
            use mmkit_core::lru_policy::LRU_ACTIVATE;
            g.stats.event(Event::Refault);
            if st & LRU_ACTIVATE != 0 && base & LRU_ACTIVATE == 0 {
                g.stats.event(Event::Activate);
                if sh.workingset {
                    g.stats.event(Event::Restore);
                }
            }
        }
    }

    /// Takes back a page that `read_swap_cache_start` added and nothing mapped: out
    /// of the swap cache (with the cache's slot reference), unlocked, freed.
    pub(crate) fn swapin_undo(&self, dev: &SwapInfoStruct, lock: PageGuard<'_>) {
        self.swapcache_drop(dev, &lock);
        let page = lock.pfn();
        drop(lock);
        self.free_owned_pages(page, 0)
            .expect("a page the swap cache alone held");
    }

    /// Puts the locked page `page` in the swap cache of the pinned `dev` for
    /// `entry` (whose slot holds the cache's reference): the index entry,
    /// `PG_SWAPCACHE` and the page's `swap_entry` (Linux's `add_to_swap_cache`).
    pub(crate) fn swapcache_add(
        &self,
        dev: &SwapInfoStruct,
        page: &PageGuard<'_>,
        entry: SwapEntry,
    ) {
        dev.add_to_swap_cache(entry, page.pfn().get() as u32)
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

    /// Takes the locked page out of the swap cache of the pinned `dev`, if it
    /// is in it, and drops the cache's slot reference, which frees the slot
    /// when no PTE holds it (Linux's `delete_from_swap_cache` +
    /// `put_swap_folio`). Its entry, if any.
    pub(crate) fn swapcache_drop(
        &self,
        dev: &SwapInfoStruct,
        page: &PageGuard<'_>,
    ) -> Option<SwapEntry> {
        self.swapcache_evict(dev, page, 0)
    }

    /// `swapcache_drop` for a page evicted now: its slot keeps `shadow`
    /// (`workingset_eviction`'s, packed; 0 for none).
    pub(crate) fn swapcache_evict(
        &self,
        dev: &SwapInfoStruct,
        page: &PageGuard<'_>,
        shadow: u32,
    ) -> Option<SwapEntry> {
        let entry = self.swapcache_entry(page)?;
        let d = desc(self, page.pfn());
        if !dev.delete_from_swap_cache(entry, page.pfn().get() as u32, shadow) {
            self.swap_bad_entry(entry, &"its page was not in its device's swap cache");
        }
        d.clear_flag(PG_SWAPCACHE);
        d.swap_entry().store(0, Ordering::Relaxed);
        if let Err(e) = dev.swapcache_clear(entry) {
            self.swap_bad_entry(entry, &e);
        }
        Some(entry)
    }

    /// `swapcache_drop` for a path that has not pinned the page's device.
    pub(crate) fn swapcache_drop_page(&self, page: &PageGuard<'_>) -> Option<SwapEntry> {
        let entry = self.swapcache_entry(page)?;
        match self.swap().get(entry) {
            Some(dev) => self.swapcache_drop(&dev, page),
            None => {
                self.swap_bad_entry(entry, &"a page in the swap cache names no device");
                None
            }
        }
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
            assert!(!c.delete_from_swap_cache(&map, 7, 71, 0));
            assert!(c.delete_from_swap_cache(&map, 7, 70, 0));
            assert!(!c.delete_from_swap_cache(&map, 7, 70, 0));
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
                assert!(c.delete_from_swap_cache(&map, s, pfn, 0));
            }
            assert_eq!(c.nr_cached(), 0);
        }
    }
}
