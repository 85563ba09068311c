//! Address spaces (Linux's `mm_struct` without files or fork): the [`Space`]
//! handle, its inner state, its locks and counters, and its teardown.
//!
//! A [`Space`] is one process's anonymous memory: a tree of VMAs (`[start, end)`
//! ranges with flags), a 4-level page table (`pgtable.rs`) whose table pages come
//! from the [`Mm`] itself, and data pages faulted in on first touch. What is reached
//! from an address under this space's VMA lock lives in this directory, one job
//! per file, as in Linux's `mm/`:
//!
//! - `mmap.rs`: [`MapFlags`], VMAs, the VMA tree, `mmap` / `munmap`.
//! - `pagewalk.rs`: walking the page table without allocating: the one range
//!   walker (`walk_page_range` with `MmWalkOps`), `follow_pte`, the per-thread
//!   walk cache, `translate`.
//! - `mmu.rs`: the emulated MMU: the access path that sets the accessed and dirty
//!   bits, `read` / `write` / `touch` / `populate` / `with_page`, page pins.
//! - `memory.rs`: the fault path, `handle_mm_fault` -> `handle_pte_fault`, the one
//!   place that dispatches to `do_anonymous_page`, `do_numa_page`, `do_swap_page`
//!   (and to `huge_memory.rs` for a PMD).
//! - `huge_memory.rs`: huge (order-9) faults, PMD split and zap.
//! - `zap.rs`: unmap: `mmu_gather`, `zap_*`, freeing tables, parallel free.
//! - `swap.rs`: swap-in (`do_swap_page`) and swapoff's walk (`unuse`).
//! - `mprotect.rs`: `change_prot_numa`.
//! - `mempolicy.rs`: the space side of memory policies: `set_mempolicy`,
//!   `mbind`, `get_mempolicy`, the node a fault allocates on.
//! - `task_numa.rs`: the mechanism of automatic NUMA balancing: the scanner
//!   (`task_numa_work`), the hint fault's record and migration
//!   (`task_numa_fault`), placement; `task_tick_numa.rs`: what starts a
//!   scan pass. The policy they consult is the top-level `numa_balancing/`.
//!
//! What is reached from a page (pfn -> reverse map -> space) lives at the top
//! level: `rmap.rs` (the walk, the page lock, **the lock order**), `migrate.rs`
//! (the migration-entry protocol), `registry.rs` (the spaces of one Mm, by id).
//!
//! Invariants:
//! - No entry maps a page outside a VMA; a huge PMD lies entirely inside one.
//! - A mapped data page holds one reference for its mapping (a huge page one for
//!   all its sub-pages); `with_page` holds one more while the closure runs.
//! - Each table page's used count (`Page::pt_used`) counts its non-zero entries.
//! - The space's id is registered in its Mm's registry from `new_space` until the
//!   inner state is dropped; the reverse map of its pages records that id.
//!
//! Locking (the full order, page side included, is in the header of `rmap.rs`):
//! 1. `vmas` (a sharded reader-writer lock, "the VMA lock"): shared for every
//!    access and fault, exclusive for `mmap`/`munmap`. Entries go from 0 to
//!    non-zero only under the shared lock (by CAS), and back to 0, and table pages
//!    are freed, only under the exclusive lock; a reference to a table page is
//!    never used after the guard that protected the walk is dropped (the walkers
//!    take the guard's `&VmaTree` as a witness, and the returned references borrow
//!    from it). Each exclusive hold starts a new epoch of the tree, which voids the
//!    per-thread walk caches (`pagewalk.rs`).
//! 2. Page locks (`rmap::PageLocks`, on the Mm, keyed by pfn): see `mmu.rs` for
//!    when the access path holds one.
//! - The counters are per-CPU atomics; `nr_vmas` is written under the exclusive
//!   VMA lock.

mod huge_memory;
mod memory;
mod mempolicy;
mod mmap;
mod mmu;
mod mprotect;
mod pagewalk;
mod swap;
mod task_numa;
mod task_tick_numa;
#[cfg(test)]
pub(crate) mod tests;
mod zap;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use crossbeam_utils::CachePadded;
use mmkit_core::Platform;

use crate::memcontrol::MemCgInner;
use crate::pgtable::{alloc_table, table, Pte, Table, TASK_SIZE};
use crate::{Error, Mm, Pfn, StdPlatform, PAGE_SIZE};

pub(crate) use huge_memory::HugeSplit;
pub use mempolicy::MbindReport;
pub use mmap::MapFlags;
pub(crate) use mmap::VmaTree;
pub use mmu::PinnedPage;
use pagewalk::next_gen;
use zap::{MmuGather, FREE_UPPER};

/// Lowest address `mmap` hands out.
pub const MMAP_BASE: u64 = 0x1000_0000_0000;
const PAGE: u64 = PAGE_SIZE as u64;
/// A first access of at most this many bytes of a page is sparse (four cache
/// lines): under [`ClearStrategy::Auto`](crate::ClearStrategy::Auto) its
/// fault-around batch is cleared with streaming stores and the lines it covers are
/// prefetched in every page of the batch (see `memory.rs`, `do_anonymous_page`).
/// `touch` and `populate` are sparse, `with_page` is dense, `read`/`write` go by
/// the bytes they copy.
pub const SPARSE_TOUCH_BYTES: usize = 256;

// ---------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------

/// Counters of one address space.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Faults handled (first touches and NUMA-hinting faults, including lost races).
    pub faults: u64,
    /// Faults that installed an order-9 page.
    pub huge_faults: u64,
    /// Huge-eligible faults that fell back to order 0 (no order-9 block).
    pub huge_fallbacks: u64,
    /// 4 KiB frames mapped (a huge page counts 512).
    pub rss_pages: u64,
    /// Order-9 pages mapped by a PMD.
    pub huge_pages: u64,
    /// Table pages, the root included.
    pub pgtable_pages: u64,
    /// Mappings.
    pub vmas: u64,
    /// Accesses of pages on the accessing thread's node (counted with more
    /// than one node only).
    pub local_accesses: u64,
    /// Accesses of pages on another node than the accessing thread's.
    pub remote_accesses: u64,
}

#[derive(Copy, Clone)]
enum Stat {
    Faults,
    HugeFaults,
    HugeFallbacks,
    Rss,
    HugePages,
    PgTables,
    LocalAccesses,
    RemoteAccesses,
}
const NR_STATS: usize = 8;

/// Per-CPU counters, folded on read (signed deltas kept as wrapping u64).
struct Counters {
    slots: Box<[CachePadded<[AtomicU64; NR_STATS]>]>,
}

impl Counters {
    fn new(n: usize) -> Counters {
        Counters {
            slots: (0..n.max(1)).map(|_| CachePadded::default()).collect(),
        }
    }
    #[inline]
    fn add(&self, s: Stat, v: i64) {
        let i = StdPlatform::cpu_id() % self.slots.len();
        self.slots[i][s as usize].fetch_add(v as u64, Ordering::Relaxed);
    }
    fn get(&self, s: Stat) -> u64 {
        self.slots.iter().fold(0u64, |a, c| {
            a.wrapping_add(c[s as usize].load(Ordering::Relaxed))
        })
    }
}

// ---------------------------------------------------------------------------------
// The address space
// ---------------------------------------------------------------------------------

/// What a virtual address maps to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The 4 KiB frame holding the address.
    pub pfn: Pfn,
    /// The head of the block the frame belongs to (`pfn` for an order-0 page).
    pub head: Pfn,
    /// Order of that block: 0, or 9 for a huge page (mapped whole or split).
    pub order: u32,
    /// Mapped by one PMD (a huge page not split).
    pub huge: bool,
    /// Accessed bit of the entry.
    pub accessed: bool,
    /// Dirty bit of the entry.
    pub dirty: bool,
    /// The entry is in the NUMA-hinting state (the next access faults).
    pub numa_hint: bool,
}

/// An address space: mappings, a page table and the pages faulted into it.
/// `Send + Sync`; every method takes `&self`. Dropping it unmaps everything.
pub struct Space {
    inner: Arc<SpaceInner>,
    /// The handle `new_space` gave out (not one a reverse-map walk resolved):
    /// its drop unmaps everything at once, even while a reclaimer or a
    /// migration still holds the space for the batch it is working on (they
    /// then find nothing mapped; the table pages go with the last reference).
    owner: bool,
}

impl Drop for Space {
    fn drop(&mut self) {
        if self.owner && Arc::strong_count(&self.inner) > 1 {
            let mut g = self.inner.write_lock();
            // The whole range is page-aligned and split-free at its ends: this
            // cannot fail (munmap needs no memory).
            let _ = self.inner.do_munmap(&mut g, 0, TASK_SIZE, 1);
        }
    }
}

pub(crate) struct SpaceInner {
    /// The id the reverse map records, registered in `mm`'s registry.
    id: u64,
    mm: Mm,
    /// The root table page (PGD).
    pgd: Pfn,
    /// The VMA lock and what it protects (see the header).
    vmas: ShardedLock<VmaTree>,
    stats: Counters,
    /// Number of VMAs (written under the exclusive VMA lock).
    nr_vmas: AtomicU64,
    /// The memory policies of the space and its ranges (`mempolicy.rs`).
    policies: mempolicy::Policies,
    /// Automatic NUMA balancing (`task_numa.rs`).
    numab: task_numa::SpaceNumab,
    /// The memory cgroup its pages are charged to (`None`: the root, never
    /// charged).
    memcg: Option<Arc<MemCgInner>>,
    /// Load control's counters (`thrash.rs`).
    load: crate::thrash::SpaceLoad,
}

impl Mm {
    /// A new, empty address space whose table and data pages come from this Mm.
    pub fn new_space(&self) -> Result<Space, Error> {
        self.new_space_charged(None)
    }

    /// A new address space charged to `memcg` (`None`: the root).
    pub(crate) fn new_space_charged(&self, memcg: Option<Arc<MemCgInner>>) -> Result<Space, Error> {
        let id = self.spaces().reserve_id()?;
        let pgd = match alloc_table(self) {
            Ok(p) => p,
            Err(e) => {
                self.spaces().release_id(id);
                return Err(e);
            }
        };
        let inner = Arc::new(SpaceInner {
            id,
            mm: self.clone(),
            pgd,
            vmas: ShardedLock::new(VmaTree::new(MMAP_BASE, next_gen())),
            stats: Counters::new(self.config().nr_cpus),
            nr_vmas: AtomicU64::new(0),
            policies: mempolicy::Policies::default(),
            numab: Default::default(),
            memcg,
            load: Default::default(),
        });
        if let Some(g) = &inner.memcg {
            g.space_added();
        }
        inner.stats.add(Stat::PgTables, 1);
        self.spaces().publish(id, &inner);
        Ok(Space { inner, owner: true })
    }
}

impl fmt::Debug for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Space")
            .field("id", &self.inner.id)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Space {
    /// A weak reference to the space (load control's member list).
    pub(crate) fn downgrade(&self) -> std::sync::Weak<SpaceInner> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn from_inner(inner: Arc<SpaceInner>) -> Space {
        Space {
            inner,
            owner: false,
        }
    }

    pub(crate) fn inner(&self) -> &SpaceInner {
        &self.inner
    }

    /// The memory cgroup this space is charged to; `None` for the root.
    pub fn memcg(&self) -> Option<crate::MemCgroup> {
        self.inner
            .memcg
            .clone()
            .map(|inner| crate::MemCgroup { inner })
    }

    /// The id the reverse map records ([`Mm::rmap_lookup`]), unique among the
    /// live spaces of its Mm.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The memory manager the pages come from.
    pub fn mm(&self) -> &Mm {
        &self.inner.mm
    }

    /// Counters (folded per-CPU values, so a snapshot).
    pub fn stats(&self) -> SpaceStats {
        let s = &self.inner.stats;
        let vmas = self.inner.nr_vmas.load(Ordering::Relaxed);
        SpaceStats {
            faults: s.get(Stat::Faults),
            huge_faults: s.get(Stat::HugeFaults),
            huge_fallbacks: s.get(Stat::HugeFallbacks),
            rss_pages: s.get(Stat::Rss),
            huge_pages: s.get(Stat::HugePages),
            pgtable_pages: s.get(Stat::PgTables),
            vmas,
            local_accesses: s.get(Stat::LocalAccesses),
            remote_accesses: s.get(Stat::RemoteAccesses),
        }
    }
}

impl SpaceInner {
    /// Load control's counters of this space.
    pub(crate) fn load(&self) -> &crate::thrash::SpaceLoad {
        &self.load
    }

    /// 4 KiB frames mapped now.
    pub(crate) fn rss_pages(&self) -> u64 {
        self.stats.get(Stat::Rss)
    }

    /// Waits while load control holds this space back (`thrash.rs`); before
    /// an access takes any lock.
    #[inline]
    fn throttle(&self) {
        self.mm.thrash().throttle(&self.mm, &self.load);
    }

    fn read_lock(&self) -> ShardedLockReadGuard<'_, VmaTree> {
        self.vmas.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared VMA lock if it can be had without waiting (page-side code never
    /// waits for an address space: it may hold a page lock that an accessor under
    /// this lock waits for, or run inside a fault of this very space).
    pub(crate) fn try_read_lock(&self) -> Option<ShardedLockReadGuard<'_, VmaTree>> {
        self.vmas.try_read().ok()
    }

    /// The exclusive VMA lock, in a new walk-cache epoch: every walk-cache entry
    /// filled before is void from now on (`pagewalk.rs`).
    fn write_lock(&self) -> ShardedLockWriteGuard<'_, VmaTree> {
        let mut g = self.vmas.write().unwrap_or_else(|e| e.into_inner());
        g.gen = next_gen();
        g
    }

    /// The id the reverse map records.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The table page at `pfn`, valid while `_held` (a VMA lock guard) lives.
    #[inline]
    fn tbl<'a>(&'a self, _held: &'a VmaTree, pfn: Pfn) -> &'a Table {
        // SAFETY: `pfn` came from this space's root or from a table entry read under
        // the VMA lock, so it is a live table page of this space; table pages are
        // freed only under the exclusive VMA lock (or in `drop`), after the last use
        // of references to them, and `_held` proves a guard is alive for 'a.
        unsafe { table(&self.mm, pfn) }
    }
}

/// A present, writable leaf for a frame of the arena (pfns fit in 32 bits).
#[inline]
fn leaf(pfn: Pfn, huge: bool) -> Pte {
    Pte::page(pfn, huge).expect("arena pfns fit in the PTE's 40-bit pfn field")
}

impl SpaceInner {
    /// The memory cgroup charged for this space's pages (`None`: the root).
    #[inline]
    pub(crate) fn memcg(&self) -> Option<&Arc<MemCgInner>> {
        self.memcg.as_ref()
    }
}

impl Drop for SpaceInner {
    fn drop(&mut self) {
        // No other reference exists: no walker, no lock needed.
        let held = std::mem::take(self.vmas.get_mut().unwrap_or_else(|e| e.into_inner()));
        {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(&held, 0, TASK_SIZE, FREE_UPPER, &mut tlb);
            tlb.remove_table(self.pgd);
        }
        if let Some(g) = &self.memcg {
            g.space_gone(self.stats.get(Stat::Faults));
        }
        self.mm.spaces().release_id(self.id);
    }
}
