//! mmkit: the Linux memory-management subsystem as an embeddable library.
//!
//! [`Mm`] manages an arena of real memory as 4 KiB page frames with the kernel's
//! page allocator (zones, buddy lists per migratetype, pageblocks, watermarks,
//! per-CPU page lists) from [`mmkit_core`], and adds the std runtime: the arena
//! (mmap, THP / hugetlb), per-CPU identity, a background worker for per-CPU list
//! auto-tuning, address spaces, page migration and compaction (direct, and the
//! kcompactd thread), typed errors and `/proc`-style views.
//!
//! This file is the facade: the public re-exports and `Mm`'s entry points. The
//! modules follow Linux's `mm/`: `builder` (MmBuilder, Variant), `error`, `arena`,
//! `platform` and `rseq` (the per-CPU caches' restartable sequences), `kthread`
//! (background threads), `space` (address spaces and faults), `rmap`, `migrate`,
//! `compaction` (and kcompactd), `views`. `Mm` is a handle on `MmInner`, shared by
//! its clones; the locks are the allocator's and each space's, none here.
//!
//! ```
//! use mmkit::{Gfp, Mm};
//! let mm = Mm::builder().memory(64 << 20).build()?;
//! let pfn = mm.alloc_pages(Gfp::KERNEL | Gfp::ZERO, 2)?;     // 4 pages, zeroed
//! let p = mm.page_address(pfn);
//! unsafe { p.write(42) };
//! mm.free_pages(pfn, 2)?;
//! mm.check()?;
//! # Ok::<(), mmkit::Error>(())
//! ```

/// docs/api-contract.md, whose code blocks run as this crate's doctests, so the
/// contract cannot drift from the code (only under `cfg(doctest)`: not part of
/// the API).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/api-contract.md")]
pub struct ApiContract;

mod arena;
mod builder;
mod calibrate;
mod compaction;
mod error;
mod kswapd;
mod kthread;
mod lru;
mod memcontrol;
mod mempolicy;
mod migrate;
mod nbd;
mod numa;
mod numa_balancing;
mod page_alloc_hooks;
mod page_io;
mod pgtable;
mod platform;
mod registry;
mod rmap;
mod rseq;
mod space;
mod swap_cluster;
mod swap_device;
mod swap_exchange;
mod swap_readahead;
mod swap_state;
mod swapfile;
mod swapon;
mod sync;
mod thrash;
mod topology;
mod views;
mod vmscan;
mod workingset;

use std::sync::Arc;

pub use arena::Backing;
pub use builder::{MmBuilder, Variant};
pub use calibrate::{clear_calibration, clear_plan, ClearCalibration, CLEAR_PLAN_ENV};
pub use compaction::CompactSummary;
pub use error::Error;
pub use memcontrol::{MemCgEvents, MemCgStat, MemCgroup, Pressure, MAX_GROUPS};
pub use mempolicy::{MbindFlags, MemPolicy, MempolicyError, Placement};
pub use mmkit_core;
pub use mmkit_core::clear::{ClearPlan, ClearStrategy, PlanSource};
pub use mmkit_core::node::{Distances, NodeMask};
pub use mmkit_core::{
    CompactPriority, CompactResult, CompactStats, Config, Gfp, LockStats, LruPolicy, MergePolicy,
    MigrateType, PcpHighPolicy, PcpPolicy, Pfn, RefillPolicy, VmEvent, VmEvents, ZoneInfo,
    MAX_ORDER, PAGEBLOCK_ORDER, PAGE_SIZE,
};
pub use mmkit_core::{NodeReq, NumaStats};
pub use nbd::{NbdBackend, NbdStats, NBD_READ_DEPTH_MAX};
pub use numa::NodeAccesses;
pub use numa_balancing::{
    should_numa_migrate_memory, Cpupid, GroupFaults, MigrateFail, MigrateQuery, NumabStats,
    ScanDecision, ScanParams, ScanPeriod, ScanPolicy, ScanTrigger, ScanWindow,
};
pub use page_io::SwapBackend;
pub use pgtable::{Pte, SwapEntry, PMD_SIZE, TASK_SIZE};
pub use platform::StdPlatform;
pub use rseq::rseq_aborts;
pub use space::MbindReport;
pub use space::{
    MapFlags, PinnedPage, Space, SpaceStats, Translation, MMAP_BASE, SPARSE_TOUCH_BYTES,
};
pub use swap_cluster::SwapAllocPolicy;
pub use swap_readahead::SwapReadahead;
pub use swap_state::SwapCacheIndex;
pub use swapfile::{SwapFreePolicy, SwapId, SwapInfo, SwapKind};
pub use swapon::SwapDevice;
pub use thrash::LoadControl;
pub use topology::{NodeInfo, Topology, TopologyError};

use compaction::CompactConfig;
use error::free_err;
use kthread::Kthread;
use mmkit_core::{AllocError, Claim, PageAlloc};
use page_alloc_hooks::AllocHooks;

/// What the clones of one `Mm` share. Dropping it stops the background threads
/// (their `Kthread` handles are dropped with it).
struct MmInner {
    alloc: PageAlloc<StdPlatform>,
    arena: arena::Arena,
    clear: ClearStrategy,
    /// What `Auto` runs where (`calibrate.rs`).
    clear_plan: ClearPlan,
    fault_around: usize,
    /// The vmstat worker (started under auto-tuned per-CPU `high` only).
    vmstat: Kthread<()>,
    compact: CompactConfig,
    /// kcompactd, woken with the highest order asked for since its last run.
    kcompactd: Option<Kthread<u32>>,
    /// Compaction runs in progress (`Mm::wait_compaction_idle`).
    compacting: std::sync::atomic::AtomicUsize,
    /// The live address spaces of this Mm, by id (`registry.rs`).
    spaces: registry::SpaceRegistry,
    /// The page locks, by pfn (`rmap.rs`).
    page_locks: rmap::PageLocks,
    /// The nodes, their CPUs and distances (`numa.rs`).
    topology: Topology,
    /// This Mm's id among all Mms of the process (thread-to-node bindings).
    id: u64,
    /// Local and remote accesses per node (`numa.rs`).
    node_access: numa::AccessCounters,
    /// Why the arena's parts could not be bound to their nodes, if they could not.
    numa_note: Option<String>,
    /// The anonymous LRU lists and their per-CPU add batches (`lru.rs`).
    lru: lru::Lru,
    /// Memory cgroups: ids, page owners, root counters, charge stocks
    /// (`memcontrol/`).
    memcg: Arc<memcontrol::MemCgTable>,
    /// The swap devices that are on (`swapfile/`).
    swap: swapfile::SwapDevices,
    /// One kswapd per node (`kswapd.rs`); empty when turned off.
    kswapd: Vec<Kthread<bool>>,
    /// Per node, the high watermark summed over its zones (kswapd's goal).
    wmark_high: Vec<u64>,
    /// Load control under thrashing (`thrash.rs`).
    thrash: thrash::Thrash,
    /// Automatic NUMA balancing: the scan policy and settings of every space,
    /// what triggers the scanner (`ScanTrigger`), and the counters of all spaces.
    numab: numa_balancing::MmNumab,
}

/// A memory manager over one arena. Cheap to clone; clones share the allocator.
/// Its debug view shows the arena, the nodes and how pages are cleared.
#[derive(Clone)]
pub struct Mm {
    inner: Arc<MmInner>,
}

impl Mm {
    /// A builder with the `mmkit` variant's policies and one per-CPU slot per CPU.
    pub fn builder() -> MmBuilder {
        MmBuilder::new()
    }

    /// Allocates 2^order contiguous pages.
    #[inline]
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        if self.nr_nodes() > 1 {
            return self.alloc_pages_here(gfp, order);
        }
        // A cache hit builds no slow-path hooks (nothing to drop either).
        match self.inner.alloc.alloc_page_cached(gfp, order) {
            Some(pfn) => self.finish_alloc(Ok(pfn), gfp, order),
            None => self.alloc_pages_uncached(gfp, order),
        }
    }

    /// `alloc_pages` on one node after the cache missed.
    #[inline]
    fn alloc_pages_uncached(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        let r = self
            .inner
            .alloc
            .alloc_pages_uncached(gfp, order, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    /// `alloc_pages` on the calling thread's node (more than one node).
    #[cold]
    #[inline(never)]
    fn alloc_pages_here(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        let here = self.thread_node();
        let req = NodeReq::node(here, here);
        let r = self
            .inner
            .alloc
            .alloc_pages_nodemask(gfp, order, req, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    /// `alloc_pages` for this crate's own use (data and table pages of address
    /// spaces): the block carries `PG_OWNED`, so a caller's `free_pages`,
    /// `get_page` and `put_page` refuse it ([`Error::OwnedBySpace`]).
    #[inline]
    pub(crate) fn alloc_owned_pages(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        if self.nr_nodes() > 1 {
            return self.alloc_owned_pages_here(gfp, order);
        }
        let r = self
            .inner
            .alloc
            .alloc_owned_pages(gfp, order, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    #[cold]
    #[inline(never)]
    fn alloc_owned_pages_here(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        let here = self.thread_node();
        self.alloc_owned_pages_req(gfp, order, NodeReq::node(here, here))
    }

    /// `alloc_owned_pages` on nodes (a memory policy's placement).
    #[inline]
    pub(crate) fn alloc_owned_pages_req(
        &self,
        gfp: Gfp,
        order: u32,
        req: NodeReq,
    ) -> Result<Pfn, Error> {
        let r =
            self.inner
                .alloc
                .alloc_owned_pages_nodemask(gfp, order, req, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    #[inline]
    fn finish_alloc(&self, r: Result<Pfn, AllocError>, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        match r {
            Ok(pfn) => {
                if gfp.contains(Gfp::ZERO) {
                    // SAFETY: the block is ours, 2^order pages inside the arena.
                    unsafe {
                        mmkit_core::clear::clear_pages_with(
                            self.page_address(pfn),
                            PAGE_SIZE << order,
                            self.inner
                                .clear_plan
                                .resolve(self.inner.clear, PAGE_SIZE << order),
                        )
                    };
                }
                Ok(pfn)
            }
            Err(AllocError::InvalidOrder) => Err(Error::InvalidOrder { order }),
            Err(AllocError::NoMemory) => Err(Error::NoMemory { order }),
            Err(AllocError::BadNode) => Err(Error::BadNode {
                node: usize::MAX,
                nr_nodes: self.nr_nodes(),
            }),
        }
    }

    /// Up to `out.len()` owned order-0 pages on the fast path only (see
    /// `PageAlloc::alloc_pages_bulk`); returns how many were written.
    #[inline]
    pub(crate) fn alloc_owned_pages_bulk(&self, gfp: Gfp, out: &mut [Pfn]) -> usize {
        if self.nr_nodes() > 1 {
            let here = self.thread_node();
            return self.alloc_owned_pages_bulk_req(gfp, NodeReq::node(here, here), out);
        }
        self.inner.alloc.alloc_owned_pages_bulk(gfp, out)
    }

    /// `alloc_owned_pages_bulk` on nodes (a memory policy's placement).
    #[inline]
    pub(crate) fn alloc_owned_pages_bulk_req(
        &self,
        gfp: Gfp,
        req: NodeReq,
        out: &mut [Pfn],
    ) -> usize {
        self.inner
            .alloc
            .alloc_owned_pages_bulk_nodemask(gfp, req, out)
    }

    /// Frees a block; bad input is refused with an error and changes nothing.
    /// Only blocks `alloc_pages` handed out can be freed: a page an address
    /// space maps, or one of its table pages, is refused with
    /// [`Error::OwnedBySpace`].
    #[inline]
    pub fn free_pages(&self, pfn: Pfn, order: u32) -> Result<(), Error> {
        self.inner
            .alloc
            .free_pages(pfn, order)
            .map_err(|e| free_err(e, pfn, order))
    }

    /// Frees a block this crate allocated for its own use (`alloc_owned_pages`).
    #[inline]
    pub(crate) fn free_owned_pages(&self, pfn: Pfn, order: u32) -> Result<(), Error> {
        self.inner
            .alloc
            .free_pages_claim(pfn, order, Claim::Owner)
            .map_err(|e| free_err(e, pfn, order))
    }

    /// Takes a reference on a block `alloc_pages` handed out: it is not freed
    /// until a matching `put_page`. Refused (and nothing changes) for a pfn that
    /// does not head an allocated block, or one that belongs to an address space.
    pub fn get_page(&self, pfn: Pfn) -> Result<(), Error> {
        let a = &self.inner.alloc;
        a.user_block_order(pfn).map_err(|e| free_err(e, pfn, 0))?;
        a.get_page(pfn);
        Ok(())
    }

    /// Drops a reference taken by `alloc_pages` or `get_page`; the last one frees
    /// the block (`Ok(true)`). Refused like `get_page`.
    pub fn put_page(&self, pfn: Pfn) -> Result<bool, Error> {
        let a = &self.inner.alloc;
        a.user_block_order(pfn).map_err(|e| free_err(e, pfn, 0))?;
        Ok(a.put_page(pfn))
    }

    /// Pins a block this crate maps (a reference for the length of an access).
    #[inline]
    pub(crate) fn pin_page(&self, pfn: Pfn) {
        self.inner.alloc.get_page(pfn)
    }

    /// Drops a pin or a mapping's reference; the last one frees the block.
    #[inline]
    pub(crate) fn unpin_page(&self, pfn: Pfn) -> bool {
        self.inner.alloc.put_page(pfn)
    }

    /// Drops a reference on each block, freeing those that reach zero in one
    /// batch (an address space's mmu_gather). Returns the number freed.
    pub(crate) fn put_pages_bulk(&self, blocks: &[(Pfn, u32)]) -> usize {
        self.inner.alloc.put_pages_bulk(blocks)
    }

    /// The address of a block's first byte (null for a pfn outside the arena).
    #[inline]
    pub fn page_address(&self, pfn: Pfn) -> *mut u8 {
        let off = (pfn.get() as usize).wrapping_mul(PAGE_SIZE);
        if pfn.get() >= self.inner.alloc.nr_pages() {
            return std::ptr::null_mut();
        }
        // SAFETY: off < arena length, so the result stays inside the mapping.
        unsafe { self.inner.arena.base().add(off) }
    }

    /// The pfn of an address inside the arena.
    pub fn pfn_of(&self, addr: *const u8) -> Option<Pfn> {
        let off = (addr as usize).checked_sub(self.inner.arena.base() as usize)?;
        (off < self.inner.arena.len()).then(|| Pfn::new((off / PAGE_SIZE) as u64))
    }

    /// Walks every free list and descriptor and verifies the invariants. Meant
    /// for a quiescent allocator: a block being freed or moved between lists by
    /// another thread at that moment is in neither place and is reported. The
    /// Mm's own background reclaim is waited for first (a kswapd batch still
    /// freeing the pages of a space just dropped is such a block).
    pub fn check(&self) -> Result<(), Error> {
        self.wait_reclaim_idle();
        self.inner.alloc.check().map_err(Error::Corrupt)?;
        self.inner.lru.check(self).map_err(Error::Corrupt)?;
        memcontrol::check(self).map_err(Error::Corrupt)?;
        self.inner.swap.check().map_err(Error::Corrupt)
    }

    /// Allocatable pages: on the buddy lists and the per-CPU lists.
    pub fn nr_free_pages(&self) -> u64 {
        self.inner.alloc.nr_free_pages()
    }

    /// Pages the zones manage.
    pub fn nr_managed_pages(&self) -> u64 {
        self.inner.alloc.nr_managed_pages()
    }

    /// Memory nodes of this Mm.
    pub fn nr_nodes(&self) -> usize {
        self.inner.alloc.nr_nodes()
    }

    /// The node of a frame.
    pub fn node_of(&self, pfn: Pfn) -> usize {
        self.inner.alloc.pfn_to_nid(pfn)
    }

    /// Flushes every CPU's per-CPU lists to the buddy lists.
    pub fn drain_all_pages(&self) {
        self.inner.alloc.drain_all_pages()
    }

    /// Zone lock statistics, summed over zones.
    pub fn zone_lock_stats(&self) -> LockStats {
        self.inner.alloc.zone_lock_stats()
    }

    /// Folded vmstat event counters.
    pub fn vm_events(&self) -> VmEvents {
        self.inner.alloc.vm_events()
    }

    /// Clears the event counters and lock statistics.
    pub fn reset_stats(&self) {
        self.inner.alloc.reset_stats()
    }

    /// A snapshot of every zone.
    pub fn zone_info(&self) -> Vec<ZoneInfo> {
        self.inner.alloc.zone_info()
    }

    /// The clearing strategy in force.
    pub fn clear_strategy(&self) -> ClearStrategy {
        self.inner.clear
    }

    /// What [`ClearStrategy::Auto`] runs for huge pages, 1 GiB extents and
    /// fault-around batches in this `Mm`: calibrated on the running host at the
    /// first build of the process, unless overridden (see [`clear_calibration`]).
    #[inline]
    pub fn clear_plan(&self) -> ClearPlan {
        self.inner.clear_plan
    }

    /// Pages a fault on an order-0 mapping populates at most (1: fault-around off).
    #[inline]
    pub fn fault_around(&self) -> usize {
        self.inner.fault_around
    }

    /// The policies in force.
    pub fn config(&self) -> &Config {
        self.inner.alloc.config()
    }

    /// Whether order-0 allocations and frees go through the lock-free per-CPU
    /// caches (asked for, and rseq and membarrier available here).
    pub fn has_pcp_caches(&self) -> bool {
        self.inner.alloc.has_pcp_caches()
    }

    /// How the arena is backed, and why hugetlb was not used if it was asked for.
    pub fn backing(&self) -> (Backing, Option<String>) {
        (
            self.inner.arena.backing(),
            self.inner.arena.fallback_note.clone(),
        )
    }

    /// The swap devices (`swapfile/`).
    pub(crate) fn swap(&self) -> &swapfile::SwapDevices {
        &self.inner.swap
    }

    /// The anonymous LRU (`lru.rs`).
    pub(crate) fn lru(&self) -> &lru::Lru {
        &self.inner.lru
    }

    pub(crate) fn thrash(&self) -> &thrash::Thrash {
        &self.inner.thrash
    }

    /// LRU lock statistics, summed over nodes (like [`Mm::zone_lock_stats`]).
    pub fn lru_lock_stats(&self) -> LockStats {
        self.inner.lru.lock_stats()
    }

    /// The core allocator, for layers built on top.
    pub fn page_alloc(&self) -> &PageAlloc<StdPlatform> {
        &self.inner.alloc
    }
}

/// The README's example, compiled and run as a doctest so the README stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
