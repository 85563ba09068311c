//! One swap device pinned (Linux's `get_swap_device`/`put_swap_device` in
//! `mm/swapfile.c`) and the per-slot operations that run on it: the map's
//! references (`swap_duplicate`, `swap_free`, `swapcache_prepare`/`clear`) and
//! I/O (`swap_writepage(s)`, `swap_readpage`); the swap cache's operations on a
//! device are in `swap_state.rs`.
//!
//! A path pins a device once per operation ([`SwapDevices::get`], one read of
//! the device table) or once per device for a batch ([`SwapPins`]: a reclaim
//! batch, a zap's range, a readahead window), then calls the device directly.
//!
//! Invariants: a [`DeviceRef`] is an `Arc` of the device, so its map, cache and
//! backend outlive `swapoff` while pinned; `swapoff` succeeds only with no slot
//! in use, so a pin held past it names no entry that is still referenced. A
//! slot operation checks that the entry is this device's and within it. An
//! entry that names no device, or a refused slot operation, where the
//! caller's references say it must succeed, is a bad entry
//! ([`Mm::swap_bad_entry`]): counted in vmstat and a `debug_assert`, never
//! dropped silently. [`SwapTotals`] counts slots and cached pages over all
//! devices exactly (checked by `SwapDevices::check`).
//!
//! Locking: no lock of its own. `writeok` and `on` are written under the device
//! table's write lock (`swapfile/`) and read without it (`Acquire`); the
//! totals are per-CPU atomics, summed on read. The map's and cache's locks are
//! in `swap_cluster/` and `swap_state.rs`, the I/O's in `page_io/`.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use mmkit_core::{Platform, VmEvent};

use crate::page_io::SwapRead;
use crate::pgtable::SwapEntry;
use crate::swap_cluster::SWAP_HAS_CACHE;
use crate::swapfile::{SwapDevices, SwapError, SwapInfoStruct};
use crate::{Mm, StdPlatform};

/// A device pinned by [`SwapDevices::get`] (Linux's `get_swap_device`; the
/// drop is `put_swap_device`): the per-slot operations run on it.
#[derive(Clone)]
pub(crate) struct DeviceRef(pub(crate) Arc<SwapInfoStruct>);

impl Deref for DeviceRef {
    type Target = SwapInfoStruct;
    fn deref(&self) -> &SwapInfoStruct {
        &self.0
    }
}

/// The devices a batch of entries lives on, each looked up once: a reclaim
/// batch, a zap's range, a readahead window.
#[derive(Default)]
pub(crate) struct SwapPins(Vec<DeviceRef>);

impl SwapPins {
    /// Adds `dev` (pinned by `get_swap_pages`) unless it is in already.
    pub(crate) fn add(&mut self, dev: DeviceRef) {
        if !self.0.iter().any(|d| Arc::ptr_eq(&d.0, &dev.0)) {
            self.0.push(dev);
        }
    }

    /// The device of `entry`, pinned already or now (a table read per device
    /// of the batch); `None` when it names no device that is on.
    pub(crate) fn get(&mut self, swap: &SwapDevices, entry: SwapEntry) -> Option<&DeviceRef> {
        let ty = entry.ty();
        let at = match self
            .0
            .iter()
            .position(|d| d.id.swap_type() == ty && d.is_on())
        {
            Some(at) => at,
            None => {
                self.0.push(swap.get(entry)?);
                self.0.len() - 1
            }
        };
        Some(&self.0[at])
    }
}

/// Counts over every device that is on (Linux's `total_swap_pages`,
/// `nr_swap_pages` and `NR_SWAPCACHE`), per CPU where they change per page.
pub(crate) struct SwapTotals {
    pub(crate) total: AtomicU64,
    /// Devices in the table that take no allocations (`swapoff` under way).
    pub(crate) closing: AtomicUsize,
    /// Per CPU: slots allocated minus slots freed; pages added to the swap
    /// caches minus pages deleted.
    used: Box<[CachePadded<(AtomicI64, AtomicI64)>]>,
    /// The memory cgroups of the Mm, to uncharge a freed slot's owner.
    pub(crate) memcg: std::sync::OnceLock<Arc<crate::memcontrol::MemCgTable>>,
}

impl SwapTotals {
    pub(crate) fn new(nr_cpus: usize) -> SwapTotals {
        SwapTotals {
            total: AtomicU64::new(0),
            closing: AtomicUsize::new(0),
            used: (0..nr_cpus.max(1)).map(|_| Default::default()).collect(),
            memcg: std::sync::OnceLock::new(),
        }
    }
    /// Sets `writeok` of `si` (under the table's write lock), counting the
    /// devices that are closing.
    pub(crate) fn set_writeok(&self, si: &SwapInfoStruct, on: bool) {
        if si.writeok.swap(on, Ordering::AcqRel) != on {
            let c = &self.closing;
            _ = if on {
                c.fetch_sub(1, Ordering::Relaxed)
            } else {
                c.fetch_add(1, Ordering::Relaxed)
            };
        }
    }

    fn here(&self) -> &(AtomicI64, AtomicI64) {
        &self.used[StdPlatform::cpu_id() % self.used.len()]
    }
    /// `n` slots allocated (negative: freed).
    pub(crate) fn slots(&self, n: i64) {
        self.here().0.fetch_add(n, Ordering::Relaxed);
    }
    /// `n` pages added to a swap cache (negative: deleted).
    pub(crate) fn cached(&self, n: i64) {
        self.here().1.fetch_add(n, Ordering::Relaxed);
    }
    /// (slots in all, slots free, pages in the swap caches).
    pub(crate) fn read(&self) -> (u64, u64, u64) {
        let (mut used, mut cached) = (0, 0);
        for c in self.used.iter() {
            used += c.0.load(Ordering::Relaxed);
            cached += c.1.load(Ordering::Relaxed);
        }
        let total = self.total.load(Ordering::Relaxed);
        let used = (used.max(0) as u64).min(total);
        (total, total - used, cached.max(0) as u64)
    }
}

impl SwapInfoStruct {
    /// Still in the table (`swapoff` has not removed it).
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Takes allocations (`swapoff` has not begun).
    pub(crate) fn writeok(&self) -> bool {
        self.writeok.load(Ordering::Acquire)
    }

    /// The slot `entry` names on this device, or why it names none.
    pub(crate) fn slot(&self, entry: SwapEntry) -> Result<u32, SwapError> {
        if entry.ty() == self.id.swap_type() && entry.offset() < self.map.nr_slots() as u64 {
            Ok(entry.offset() as u32)
        } else {
            Err(SwapError::BadEntry { entry })
        }
    }

    /// A slot became free (under its cluster lock): its checksum and its
    /// shadow are forgotten, and it is counted.
    fn on_free(&self, slot: u32) {
        self.io.invalidate(slot);
        self.cache.clear_shadow(slot);
        self.totals.slots(-1);
        let o = &self.memcg_owner[slot as usize];
        if o.load(Ordering::Relaxed) != 0 {
            let id = o.swap(0, Ordering::Relaxed);
            if let Some(t) = self.totals.memcg.get() {
                crate::memcontrol::uncharge_swap(t, id);
            }
        }
    }

    /// The memory cgroup charged for `entry`'s slot (0: the root).
    pub(crate) fn swap_owner(&self, entry: SwapEntry) -> u16 {
        self.slot(entry)
            .map_or(0, |s| self.memcg_owner[s as usize].load(Ordering::Relaxed))
    }

    /// Records the memory cgroup charged for `entry`'s slot (just allocated
    /// for a page of that group: Linux's `swap_cgroup_record`).
    pub(crate) fn set_swap_owner(&self, entry: SwapEntry, id: u16) {
        if let Ok(slot) = self.slot(entry) {
            self.memcg_owner[slot as usize].store(id, Ordering::Relaxed);
        }
    }

    /// Adds a reference to an in-use entry (`swap_duplicate`).
    pub(crate) fn swap_duplicate(&self, entry: SwapEntry) -> Result<(), SwapError> {
        Ok(self.map.swap_duplicate(self.slot(entry)?)?)
    }

    /// Drops a reference (`swap_free`); returns the map byte left (0: the slot
    /// is free, and its checksum forgotten).
    pub(crate) fn swap_free(&self, entry: SwapEntry) -> Result<u8, SwapError> {
        let slot = self.slot(entry)?;
        Ok(self.map.swap_free(slot, &mut |x| self.on_free(x))?)
    }

    /// The PTE references `entry`'s slot holds (its map count without the
    /// cache's), a snapshot.
    pub(crate) fn swap_count(&self, entry: SwapEntry) -> Result<u8, SwapError> {
        Ok(self.map.map_count(self.slot(entry)?) & !SWAP_HAS_CACHE)
    }

    /// Claims the swap-cache reference of an in-use entry (`swapcache_prepare`).
    pub(crate) fn swapcache_prepare(&self, entry: SwapEntry) -> Result<(), SwapError> {
        Ok(self.map.swapcache_prepare(self.slot(entry)?)?)
    }

    /// Drops the swap-cache reference (`put_swap_folio`).
    pub(crate) fn swapcache_clear(&self, entry: SwapEntry) -> Result<u8, SwapError> {
        let slot = self.slot(entry)?;
        Ok(self.map.swapcache_clear(slot, &mut |x| self.on_free(x))?)
    }

    /// Writes a page to an entry's slot (`swap_writepage`).
    pub(crate) fn swap_writepage(&self, entry: SwapEntry, page: &[u8]) -> Result<(), SwapError> {
        Ok(self.io.swap_writepage(self.slot(entry)?, page)?)
    }

    /// Writes pages to the contiguous slots from `first` on, in one request.
    #[cfg(test)]
    pub(crate) fn swap_writepages(
        &self,
        first: SwapEntry,
        pages: &[&[u8]],
    ) -> Result<(), SwapError> {
        let s = self.slot(first)?;
        if s as u64 + pages.len() as u64 > self.map.nr_slots() as u64 {
            return Err(SwapError::BadEntry { entry: first });
        }
        Ok(self.io.swap_writepages(s, pages)?)
    }

    /// Writes `runs` (first entry, pages of contiguous slots) together
    /// (`SwapIo::swap_writepages_batch`): `ok[r]` says whether run `r` was
    /// written. A run outside the device fails alone.
    pub(crate) fn swap_writepages_batch(&self, runs: &[(SwapEntry, &[&[u8]])], ok: &mut [bool]) {
        let mut slots = Vec::with_capacity(runs.len());
        let mut idx = Vec::with_capacity(runs.len());
        for (r, &(first, pages)) in runs.iter().enumerate() {
            ok[r] = false;
            match self.slot(first) {
                Ok(s) if s as u64 + pages.len() as u64 <= self.map.nr_slots() as u64 => {
                    slots.push((s, pages));
                    idx.push(r);
                }
                _ => {}
            }
        }
        let mut done = vec![false; slots.len()];
        self.io
            .swap_writepages_batch(&slots, &mut done, &mut |_, _| {});
        for (&r, d) in idx.iter().zip(done) {
            ok[r] = d;
        }
    }

    /// Starts reading an entry's slot into `page` (`SwapIo::swap_read_start`).
    ///
    /// # Safety
    /// As `SwapIo::swap_read_start`: `page` is 4096 bytes of ours until the
    /// read is ended by `swap_read_end`.
    pub(crate) unsafe fn swap_read_start(
        &self,
        entry: SwapEntry,
        page: *mut u8,
        block: bool,
    ) -> Result<SwapRead, SwapError> {
        let slot = self.slot(entry)?;
        // SAFETY: the caller's contract.
        Ok(unsafe { self.io.swap_read_start(slot, page, block)? })
    }

    /// Waits for and verifies a read started by `swap_read_start`.
    pub(crate) fn swap_read_end(&self, r: SwapRead, page: &[u8]) -> Result<(), SwapError> {
        Ok(self.io.swap_read_end(r, page)?)
    }

    /// Reads an entry's slot and verifies its checksum (`swap_read_folio`).
    pub(crate) fn swap_readpage(&self, entry: SwapEntry, page: &mut [u8]) -> Result<(), SwapError> {
        Ok(self.io.swap_readpage(self.slot(entry)?, page)?)
    }
}

impl Mm {
    /// A bad swap entry (Linux's "Bad swap file entry"): `entry` names no
    /// device, or its slot refused what the caller's references allow.
    /// Counted in vmstat (`swap_bad_entry`); a debug build stops here.
    #[cold]
    pub(crate) fn swap_bad_entry(&self, entry: SwapEntry, why: &dyn fmt::Display) {
        self.page_alloc().count_vm_event(VmEvent::SwapBadEntry, 1);
        debug_assert!(false, "bad swap entry {entry:?}: {why}");
    }
}
