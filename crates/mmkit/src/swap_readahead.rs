//! Swap readahead (Linux's `swapin_readahead`, in its `mm/swap_state.c`):
//! a swap-in may read more slots into the swap cache, `Cluster` (the slots
//! after the faulting one on the device, Linux's `swap_cluster_readahead`)
//! or `Vma` (the swap entries of the following PTEs, Linux's
//! `swap_vma_readahead`; `space/swap.rs` picks them). The window adapts as
//! Linux's `__swapin_nr_pages` does: two more than the hits since the last
//! fault, rounded up to a power of two, at most [`SWAP_RA_MAX`]; without
//! hits only a sequential fault reads ahead, and the window shrinks by half
//! at a time.
//!
//! A fault's read-ahead reads go out together with its own ([`RaBatch`]):
//! the fault starts its read, starts the read-ahead ones on the same device
//! (an NBD device has them all in flight at once), waits for its own first,
//! then for the others. Entries on another device are read after, one at a
//! time (`swap_readahead_one`).
//!
//! A page read ahead is in the cache, unmapped, with `PG_READAHEAD`, and owns
//! the allocation's reference; a fault on its entry maps it (a `swap_ra_hit`,
//! the reference becomes the mapping's). Otherwise it is dropped and freed when
//! the last PTE of its slot goes (`try_to_reclaim_swap`, from the zap), by
//! reclaim (oldest first, before the LRU), or when the queue of read-ahead
//! pages is full. The queue may hold stale entries (pages mapped or dropped
//! since); every use re-checks the page under its lock.
//!
//! Invariants: every read an [`RaBatch`] started is ended (waited for and
//! verified, or undone) when the batch is dropped, before the fault maps its
//! own page: a fault holds the read-ahead pages' locks only while their
//! reads are in flight, and takes no other page lock meanwhile.
//!
//! Locking: the per-CPU history is atomics. The queue's mutex is a leaf: no
//! page lock is taken under it. A read-ahead page is locked from its
//! allocation to the end of its read, as in `read_swap_cache_start`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::page::PG_READAHEAD;
use mmkit_core::{Platform, VmEvent};

use crate::pgtable::{desc, SwapEntry};
use crate::platform::StdPlatform;
use crate::rmap::PageGuard;
use crate::swap_state::{SwapCacheStart, SwapInPending};
use crate::swapfile::{SwapInfoStruct, SwapPins};
use crate::{Gfp, Mm, Pfn};

/// What a swap-in reads besides the faulting slot (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SwapReadahead {
    /// Only the faulting slot.
    Off,
    /// The slots after it on the device, within its cluster.
    Cluster,
    /// The swap entries of the PTEs after it, within its page table (Linux's
    /// default).
    #[default]
    Vma,
}

/// The largest readahead window, in pages (Linux's `page_cluster` = 3).
pub(crate) const SWAP_RA_MAX: u64 = 8;
/// Read-ahead pages waiting for a fault at most; the oldest go first.
const SWAP_RA_QUEUE_MAX: usize = 4096;

/// One CPU's readahead history (Linux keeps it per VMA and globally; per
/// CPU, a pinned task's faults see their own sequence and no fault writes a
/// line that every CPU's faults write).
#[derive(Default)]
struct RaState {
    hits: AtomicU64,
    prev: AtomicU64,
    last_window: AtomicU64,
}

/// Readahead state of one Mm (Linux's `swapin_readahead_hits`, `prev_offset`,
/// `last_readahead_pages`, per CPU) and the pages read ahead, oldest first.
pub(crate) struct SwapRa {
    pub(crate) policy: SwapReadahead,
    cpus: Box<[CachePadded<RaState>]>,
    queue: parking_lot::Mutex<VecDeque<(u32, SwapEntry)>>,
}

impl SwapRa {
    pub(crate) fn new(policy: SwapReadahead, nr_cpus: usize) -> SwapRa {
        SwapRa {
            policy,
            cpus: (0..nr_cpus.max(1))
                .map(|_| CachePadded::default())
                .collect(),
            queue: Default::default(),
        }
    }

    fn here(&self) -> &RaState {
        &self.cpus[StdPlatform::cpu_id() % self.cpus.len()]
    }

    /// Linux's `__swapin_nr_pages`: the window for a fault at `key` (a slot
    /// offset for `Cluster`, a virtual page for `Vma`), counting the faulting
    /// page; 1 means no readahead.
    pub(crate) fn window(&self, key: u64) -> u64 {
        if self.policy == SwapReadahead::Off {
            return 1;
        }
        let st = self.here();
        let hits = st.hits.swap(0, Ordering::Relaxed);
        let prev = st.prev.swap(key, Ordering::Relaxed);
        let mut pages = hits + 2;
        if pages == 2 {
            if key != prev.wrapping_add(1) && key != prev.wrapping_sub(1) {
                pages = 1;
            }
        } else {
            pages = pages.next_power_of_two();
        }
        pages = pages.min(SWAP_RA_MAX);
        let last = st.last_window.load(Ordering::Relaxed);
        pages = pages.max(last / 2);
        st.last_window.store(pages, Ordering::Relaxed);
        pages
    }

    /// A fault found a page read ahead.
    pub(crate) fn hit(&self) {
        self.here().hits.fetch_add(1, Ordering::Relaxed);
    }
}

/// Read-ahead reads of one fault at most.
const RA_BATCH: usize = SWAP_RA_MAX as usize - 1;

/// The read-ahead reads of one fault, started behind the fault's own read
/// (see the module header); dropping the batch ends them all.
pub(crate) struct RaBatch<'a> {
    mm: &'a Mm,
    dev: &'a SwapInfoStruct,
    pending: [Option<SwapInPending<'a>>; RA_BATCH],
    /// Entries on other devices, read when the batch ends.
    other: [Option<SwapEntry>; RA_BATCH],
}

impl<'a> RaBatch<'a> {
    /// An empty batch on the fault's pinned device `dev`.
    pub(crate) fn new(mm: &'a Mm, dev: &'a SwapInfoStruct) -> RaBatch<'a> {
        RaBatch {
            mm,
            dev,
            pending: std::array::from_fn(|_| None),
            other: [None; RA_BATCH],
        }
    }

    /// Reads `entry` ahead: started now on the fault's device, or noted to
    /// be read at the end on another one. Beyond the batch's room: ignored.
    pub(crate) fn add(&mut self, entry: SwapEntry) {
        if entry.ty() != self.dev.id.swap_type() {
            if let Some(o) = self.other.iter_mut().find(|o| o.is_none()) {
                *o = Some(entry);
            }
            return;
        }
        let Some(room) = self.pending.iter_mut().find(|p| p.is_none()) else {
            return;
        };
        *room = self.mm.swap_readahead_start(self.dev, entry);
    }
}

impl Drop for RaBatch<'_> {
    fn drop(&mut self) {
        for p in self.pending.iter_mut() {
            if let Some(p) = p.take() {
                self.mm.swap_readahead_end(self.dev, p);
            }
        }
        let mut pins = SwapPins::default();
        for e in self.other.iter_mut().filter_map(|o| o.take()) {
            // A PTE read without its page lock may be stale: an entry of a
            // device gone since is skipped.
            if let Some(d) = pins.get(self.mm.swap(), e) {
                self.mm.swap_readahead_one(d, e);
            }
        }
    }
}

impl Mm {
    /// Reads `entry` of the pinned `dev` ahead into the swap cache: a page of
    /// its own, unmapped, `PG_READAHEAD`, queued. False (nothing changed) when
    /// the slot is free, already cached or being read, no page is free without
    /// reclaim, or the read fails (a later fault reads it again and reports).
    pub(crate) fn swap_readahead_one(&self, dev: &SwapInfoStruct, entry: SwapEntry) -> bool {
        match self.read_swap_cache_start(dev, entry, Gfp::MOVABLE_NOWAIT, true) {
            Ok(SwapCacheStart::Started(p)) => self.swap_readahead_end(dev, p),
            _ => false,
        }
    }

    /// Starts reading `entry` of the pinned `dev` ahead, not waiting for the
    /// read (nor for a free NBD request slot: with none, nothing is read).
    fn swap_readahead_start<'a>(
        &'a self,
        dev: &SwapInfoStruct,
        entry: SwapEntry,
    ) -> Option<SwapInPending<'a>> {
        match self.read_swap_cache_start(dev, entry, Gfp::MOVABLE_NOWAIT, false) {
            Ok(SwapCacheStart::Started(p)) => Some(p),
            _ => None,
        }
    }

    /// Ends a read ahead: verified, the page is unlocked, `PG_READAHEAD`
    /// and queued; a failed read is undone (false).
    fn swap_readahead_end(&self, dev: &SwapInfoStruct, p: SwapInPending<'_>) -> bool {
        let entry = p.entry();
        let Ok(lock) = self.read_swap_cache_end(dev, p) else {
            return false;
        };
        let page = lock.pfn();
        desc(self, page).set_flag(PG_READAHEAD);
        drop(lock);
        let pa = self.page_alloc();
        pa.count_vm_event(VmEvent::SwapRa, 1);
        pa.count_vm_event(VmEvent::PswpIn, 1);
        let full = {
            let mut q = self.swap().ra().queue.lock();
            q.push_back((page.get() as u32, entry));
            q.len() > SWAP_RA_QUEUE_MAX
        };
        if full {
            self.shrink_readahead(1);
        }
        true
    }

    /// Drops the page cached for `entry` of the pinned `dev` if it is a
    /// read-ahead page no fault mapped (Linux's `__try_to_reclaim_swap`, as
    /// `free_swap_and_cache` uses it once the last PTE of the slot is gone);
    /// frees its slot with it.
    pub(crate) fn try_to_reclaim_swap(&self, dev: &SwapInfoStruct, entry: SwapEntry) -> bool {
        let Some(pfn) = dev.lookup_swap_cache(entry) else {
            return false;
        };
        let lock = self.lock_page(Pfn::new(pfn as u64));
        self.drop_readahead_page(dev, lock, entry)
    }

    /// Drops the locked page if it still caches `entry` unmapped, read ahead.
    fn drop_readahead_page(
        &self,
        dev: &SwapInfoStruct,
        lock: PageGuard<'_>,
        entry: SwapEntry,
    ) -> bool {
        let d = desc(self, lock.pfn());
        if self.swapcache_entry(&lock) != Some(entry)
            || !d.test_flag(PG_READAHEAD)
            || d.mapping.load(Ordering::Acquire) != 0
        {
            return false;
        }
        d.clear_flag(PG_READAHEAD);
        self.swapin_undo(dev, lock);
        true
    }

    /// Reclaim's share: drops up to `n` read-ahead pages that no fault used,
    /// oldest first; returns how many were freed.
    pub(crate) fn shrink_readahead(&self, n: usize) -> u64 {
        let swap = self.swap();
        let mut pins = SwapPins::default();
        let mut freed = 0;
        let mut looked = 0;
        while (freed as usize) < n && looked < 4 * n.max(1) {
            let Some((pfn, entry)) = swap.ra().queue.lock().pop_front() else {
                break;
            };
            looked += 1;
            // A stale queue entry may name a device gone since: its page left
            // the cache before the device could go.
            let Some(dev) = pins.get(swap, entry) else {
                continue;
            };
            match self.trylock_page(Pfn::new(pfn as u64)) {
                Some(lock) => freed += u64::from(self.drop_readahead_page(dev, lock, entry)),
                // In use this moment (a fault mapping it): look again later.
                None => swap.ra().queue.lock().push_back((pfn, entry)),
            }
        }
        freed
    }
}
