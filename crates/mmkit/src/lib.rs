//! mmkit: the Linux memory-management subsystem as an embeddable library.
//!
//! [`Mm`] manages an arena of real memory as 4 KiB page frames with the kernel's
//! page allocator (zones, buddy lists per migratetype, pageblocks, watermarks,
//! per-CPU page lists) from [`mmkit_core`], and adds the std runtime: the arena
//! (mmap, THP / hugetlb), per-CPU identity, a background worker for per-CPU list
//! auto-tuning, address spaces, page migration and compaction (direct, and the
//! kcompactd thread), typed errors and `/proc`-style views.
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

mod arena;
mod compaction;
mod migrate;
mod pgtable;
mod platform;
mod registry;
mod rmap;
mod space;
mod views;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use arena::Backing;
pub use compaction::CompactSummary;
pub use mmkit_core;
pub use mmkit_core::clear::ClearStrategy;
pub use mmkit_core::{
    CompactPriority, CompactResult, CompactStats, Config, Gfp, LockStats, MergePolicy, MigrateType,
    PcpHighPolicy, PcpPolicy, Pfn, RefillPolicy, VmEvent, VmEvents, ZoneInfo, MAX_ORDER,
    PAGEBLOCK_ORDER, PAGE_SIZE,
};
pub use pgtable::{Pte, SwapEntry, PMD_SIZE, TASK_SIZE};
pub use platform::{rseq_aborts, StdPlatform};
pub use space::{MapFlags, Space, SpaceStats, Translation, MMAP_BASE, SPARSE_TOUCH_BYTES};

use compaction::{AllocHooks, CompactConfig, Kcompactd};
use mmkit_core::{AllocError, Claim, FreeError, PageAlloc};

/// Errors of the mmkit API. Every refused call changed nothing.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No block of the order could be found, after draining per-CPU lists and
    /// merging; free memory or ask for a smaller order.
    #[error("out of memory: no free block of order {order} (free memory or use a smaller order)")]
    NoMemory {
        /// The requested order.
        order: u32,
    },
    /// Orders go from 0 to MAX_ORDER (10).
    #[error("invalid order {order}: orders go from 0 to {MAX_ORDER}")]
    InvalidOrder {
        /// The order given.
        order: u32,
    },
    /// The pfn is not in this Mm's arena.
    #[error("pfn {pfn} is outside the arena")]
    OutOfRange {
        /// The pfn given.
        pfn: u64,
    },
    /// The pfn is not aligned to 2^order pages, so it cannot head a block of that order.
    #[error("pfn {pfn} is not aligned to order {order}")]
    Misaligned {
        /// The pfn given.
        pfn: u64,
        /// The order given.
        order: u32,
    },
    /// The pfn is not the head of an allocated block: never allocated, already
    /// freed, or an interior page of a block.
    #[error(
        "pfn {pfn} is not an allocated block (never allocated, already freed, or inside a block)"
    )]
    NotAllocated {
        /// The pfn given.
        pfn: u64,
    },
    /// The block was allocated with another order.
    #[error("pfn {pfn} was allocated with order {allocated}, freed with order {given}")]
    WrongOrder {
        /// The pfn given.
        pfn: u64,
        /// The order it was allocated with.
        allocated: u32,
        /// The order given to free.
        given: u32,
    },
    /// The block belongs to an address space (its fault path or page table
    /// allocated it): only that space releases it, when it unmaps.
    #[error(
        "pfn {pfn} belongs to an address space (a mapped or page-table page); only blocks from alloc_pages can be freed or pinned by a caller"
    )]
    OwnedBySpace {
        /// The pfn given.
        pfn: u64,
    },
    /// The arena could not be mapped.
    #[error("arena: {0}")]
    Arena(String),
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(String),
    /// `check()` found a broken invariant.
    #[error("invariant broken: {0}")]
    Corrupt(String),
    /// An address range given to an address space was refused: zero length,
    /// unaligned, wrapping, outside `0..2^47`, or not mapped.
    #[error("bad address range {addr:#x} (+{len:#x} bytes): {reason}")]
    BadAddress {
        /// The address given.
        addr: u64,
        /// The length given.
        len: u64,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// `mmap` found no free range of the length in the address space; unmap
    /// something or map less.
    #[error(
        "no room for a mapping of {len} bytes in the address space (unmap something or map less)"
    )]
    AddressSpaceFull {
        /// The length asked for.
        len: u64,
    },
    /// A fault could not be handled (or an address-space call was made from inside
    /// a `with_page` closure).
    #[error("fault at {addr:#x} not handled: {reason}")]
    Fault {
        /// The faulting address.
        addr: u64,
        /// Why.
        reason: &'static str,
    },
}

/// The named policy sets the lab compares.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The best defaults: PCP with auto-tuned high, lazy order-0 merging with merge
    /// on demand, cluster refill.
    Mmkit,
    /// Linux before the zone-lock work: PCP with fixed high, eager merging,
    /// page-by-page refill.
    MmkitEager,
    /// No per-CPU lists, eager merging: every call takes the zone lock.
    MmkitNoPcp,
    /// `Mmkit` with lazy order-0 merging but no merge on demand
    /// (`MergePolicy::LazyNoMerge`): Linux's first skip-merge patch alone, fast for
    /// order 0 and poor for huge pages; compaction migrates as for the others but
    /// has no merge step.
    MmkitNoMerge,
}

impl Variant {
    /// All variants.
    pub const ALL: [Variant; 4] = [
        Variant::Mmkit,
        Variant::MmkitEager,
        Variant::MmkitNoPcp,
        Variant::MmkitNoMerge,
    ];
    /// The lab name.
    pub const fn name(self) -> &'static str {
        match self {
            Variant::Mmkit => "mmkit",
            Variant::MmkitEager => "mmkit-eager",
            Variant::MmkitNoPcp => "mmkit-nopcp",
            Variant::MmkitNoMerge => "mmkit-nomerge",
        }
    }
    /// From a lab name.
    pub fn from_name(s: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == s)
    }
    /// Anonymous fault-around batch: 16 pages for the mmkit policies, off (1) for
    /// the Linux baselines.
    pub const fn fault_around(self) -> usize {
        match self {
            Variant::Mmkit | Variant::MmkitNoMerge => 16,
            Variant::MmkitEager | Variant::MmkitNoPcp => 1,
        }
    }
    fn apply(self, c: &mut Config) {
        let (pcp, merge, refill, high) = match self {
            Variant::Mmkit => (
                PcpPolicy::On,
                MergePolicy::Lazy,
                RefillPolicy::Cluster,
                PcpHighPolicy::Auto,
            ),
            Variant::MmkitEager => (
                PcpPolicy::On,
                MergePolicy::Eager,
                RefillPolicy::PageByPage,
                PcpHighPolicy::Fixed,
            ),
            Variant::MmkitNoPcp => (
                PcpPolicy::Off,
                MergePolicy::Eager,
                RefillPolicy::PageByPage,
                PcpHighPolicy::Fixed,
            ),
            Variant::MmkitNoMerge => (
                PcpPolicy::On,
                MergePolicy::LazyNoMerge,
                RefillPolicy::Cluster,
                PcpHighPolicy::Auto,
            ),
        };
        c.pcp = pcp;
        // The lock-free per-CPU caches are mmkit's; the baselines are Linux's lists.
        c.pcp_cache = matches!(self, Variant::Mmkit | Variant::MmkitNoMerge);
        c.merge = merge;
        c.refill = refill;
        c.pcp_high = high;
    }
}

/// Builds an [`Mm`].
#[derive(Clone, Debug)]
pub struct MmBuilder {
    memory: Option<usize>,
    cfg: Config,
    hugetlb: bool,
    prefault: bool,
    clear: ClearStrategy,
    fault_around: usize,
    compact: CompactConfig,
}

/// A quarter of RAM, capped at 4 GiB.
fn default_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, psize) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = (pages.max(0) as usize).saturating_mul(psize.max(0) as usize);
    (ram / 4).clamp(64 << 20, 4 << 30)
}

impl MmBuilder {
    /// Arena size in bytes (rounded down to 4 KiB; at least 2 MiB).
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = Some(bytes);
        self
    }
    /// A named policy set.
    pub fn variant(mut self, v: Variant) -> Self {
        v.apply(&mut self.cfg);
        self.fault_around = v.fault_around();
        self
    }
    /// Anonymous fault-around: a fault on an order-0 mapping also populates up to
    /// `pages - 1` following empty entries of the same page table and mapping, in
    /// one batch (1 = off, Linux's anonymous behaviour; at most 64).
    pub fn fault_around(mut self, pages: usize) -> Self {
        self.fault_around = pages.clamp(1, 64);
        self
    }
    /// Per-CPU lists on/off.
    pub fn pcp(mut self, p: PcpPolicy) -> Self {
        self.cfg.pcp = p;
        self
    }
    /// Merging policy.
    pub fn merge(mut self, m: MergePolicy) -> Self {
        self.cfg.merge = m;
        self
    }
    /// Refill policy.
    pub fn refill(mut self, r: RefillPolicy) -> Self {
        self.cfg.refill = r;
        self
    }
    /// Per-CPU `high` policy.
    pub fn pcp_high(mut self, h: PcpHighPolicy) -> Self {
        self.cfg.pcp_high = h;
        self
    }
    /// Lock-free per-CPU order-0 caches driven by restartable sequences in front
    /// of the per-CPU lists (default on for `mmkit`; used where the kernel and libc
    /// provide rseq and membarrier, otherwise every call takes the lists' lock).
    pub fn pcp_cache(mut self, on: bool) -> Self {
        self.cfg.pcp_cache = on;
        self
    }
    /// Per-CPU batch (default derived from the zone size).
    pub fn pcp_batch(mut self, b: u32) -> Self {
        self.cfg.pcp_batch = Some(b);
        self
    }
    /// Number of per-CPU slots (default: the CPUs the system may bring online).
    pub fn cpus(mut self, n: usize) -> Self {
        self.cfg.nr_cpus = n;
        self
    }
    /// Try hugetlb backing; falls back to THP with a message when refused.
    pub fn hugetlb(mut self, on: bool) -> Self {
        self.hugetlb = on;
        self
    }
    /// How pages are cleared on `Gfp::ZERO` and in the fault path (default `Auto`).
    pub fn clear(mut self, c: ClearStrategy) -> Self {
        self.clear = c;
        self
    }
    /// Fault the whole arena in at build time.
    pub fn prefault(mut self, on: bool) -> Self {
        self.prefault = on;
        self
    }
    /// Direct compaction in the allocation slow path of high-order requests
    /// (default on).
    pub fn compaction(mut self, on: bool) -> Self {
        self.compact.direct = on;
        self
    }
    /// The background compaction thread, kcompactd (default on).
    pub fn kcompactd(mut self, on: bool) -> Self {
        self.compact.kcompactd = on;
        self
    }
    /// Linux's `vm.compaction_proactiveness`, 0..=100 (default 20): kcompactd
    /// compacts in the background while the fragmentation score is above
    /// `110 - proactiveness`, down to `100 - proactiveness`; 0 turns it off.
    pub fn compaction_proactiveness(mut self, p: u32) -> Self {
        self.compact.proactiveness = p.min(100);
        self
    }
    /// Maps the arena and builds the allocator.
    pub fn build(self) -> Result<Mm, Error> {
        let len = self.memory.unwrap_or_else(default_memory) & !(PAGE_SIZE - 1);
        if len < (2 << 20) {
            return Err(Error::Config(format!(
                "memory {len} bytes is below the 2 MiB minimum (one pageblock)"
            )));
        }
        let arena = arena::Arena::new(len, self.hugetlb, self.prefault)
            .map_err(|e| Error::Arena(format!("mmap of {len} bytes failed: {e}")))?;
        let alloc = PageAlloc::<StdPlatform>::new(self.cfg.clone(), (len / PAGE_SIZE) as u64)
            .map_err(|e| Error::Config(e.to_string()))?;
        let kcompactd = self
            .compact
            .kcompactd
            .then(|| Arc::new(Kcompactd::default()));
        let inner = Arc::new(MmInner {
            alloc,
            arena,
            clear: self.clear,
            fault_around: self.fault_around,
            worker: Arc::new((Mutex::new(false), Condvar::new())),
            compact: self.compact,
            kcompactd: kcompactd.clone(),
            compacting: std::sync::atomic::AtomicUsize::new(0),
            spaces: Default::default(),
            page_locks: Default::default(),
        });
        if self.cfg.pcp == PcpPolicy::On && self.cfg.pcp_high == PcpHighPolicy::Auto {
            spawn_vmstat_worker(&inner);
        }
        if let Some(kc) = kcompactd {
            compaction::spawn_kcompactd(&inner, kc);
        }
        Ok(Mm { inner })
    }
}

/// The per-second worker (Linux's vmstat_update): decays per-CPU `high`.
fn spawn_vmstat_worker(inner: &Arc<MmInner>) {
    let weak = Arc::downgrade(inner);
    let stop = inner.worker.clone();
    std::thread::Builder::new()
        .name("mmkit-vmstat".into())
        .spawn(move || loop {
            {
                let (m, cv) = &*stop;
                let g = m.lock().unwrap_or_else(|e| e.into_inner());
                let (g, _) = cv
                    .wait_timeout(g, Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner());
                if *g {
                    return;
                }
            }
            match weak.upgrade() {
                Some(mm) => mm.alloc.decay_pcp_high(),
                None => return,
            }
        })
        .ok();
}

struct MmInner {
    alloc: PageAlloc<StdPlatform>,
    arena: arena::Arena,
    clear: ClearStrategy,
    fault_around: usize,
    worker: Arc<(Mutex<bool>, Condvar)>,
    compact: CompactConfig,
    kcompactd: Option<Arc<Kcompactd>>,
    /// Compaction runs in progress (`Mm::wait_compaction_idle`).
    compacting: std::sync::atomic::AtomicUsize,
    /// The live address spaces of this Mm, by id (`registry.rs`).
    spaces: registry::SpaceRegistry,
    /// The page locks, by pfn (`rmap.rs`).
    page_locks: rmap::PageLocks,
}

impl Drop for MmInner {
    fn drop(&mut self) {
        let (m, cv) = &*self.worker;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(kc) = &self.kcompactd {
            kc.stop();
        }
    }
}

/// A memory manager over one arena. Cheap to clone; clones share the allocator.
#[derive(Clone)]
pub struct Mm {
    inner: Arc<MmInner>,
}

fn free_err(e: FreeError, pfn: Pfn, order: u32) -> Error {
    let pfn = pfn.get();
    match e {
        FreeError::InvalidOrder => Error::InvalidOrder { order },
        FreeError::OutOfRange => Error::OutOfRange { pfn },
        FreeError::Misaligned => Error::Misaligned { pfn, order },
        FreeError::NotAllocated => Error::NotAllocated { pfn },
        FreeError::WrongOrder { allocated } => Error::WrongOrder {
            pfn,
            allocated,
            given: order,
        },
        FreeError::Owned => Error::OwnedBySpace { pfn },
    }
}

impl Mm {
    /// A builder with the `mmkit` variant's policies and one per-CPU slot per CPU.
    pub fn builder() -> MmBuilder {
        let mut cfg = Config {
            nr_cpus: platform::nr_cpus(),
            ..Config::default()
        };
        Variant::Mmkit.apply(&mut cfg);
        MmBuilder {
            memory: None,
            cfg,
            hugetlb: false,
            prefault: false,
            clear: ClearStrategy::Auto,
            fault_around: Variant::Mmkit.fault_around(),
            compact: CompactConfig::default(),
        }
    }

    /// Allocates 2^order contiguous pages.
    #[inline]
    pub fn alloc_pages(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        let r = self
            .inner
            .alloc
            .alloc_pages(gfp, order, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    /// `alloc_pages` for this crate's own use (data and table pages of address
    /// spaces): the block carries `PG_OWNED`, so a caller's `free_pages`,
    /// `get_page` and `put_page` refuse it ([`Error::OwnedBySpace`]).
    #[inline]
    pub(crate) fn alloc_owned_pages(&self, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        let r = self
            .inner
            .alloc
            .alloc_owned_pages(gfp, order, &AllocHooks::new(self));
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
                            self.inner.clear,
                        )
                    };
                }
                Ok(pfn)
            }
            Err(AllocError::InvalidOrder) => Err(Error::InvalidOrder { order }),
            Err(AllocError::NoMemory) => Err(Error::NoMemory { order }),
        }
    }

    /// Up to `out.len()` owned order-0 pages on the fast path only (see
    /// `PageAlloc::alloc_pages_bulk`); returns how many were written.
    #[inline]
    pub(crate) fn alloc_owned_pages_bulk(&self, gfp: Gfp, out: &mut [Pfn]) -> usize {
        self.inner.alloc.alloc_owned_pages_bulk(gfp, out)
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
    /// another thread at that moment is in neither place and is reported.
    pub fn check(&self) -> Result<(), Error> {
        self.inner.alloc.check().map_err(Error::Corrupt)
    }

    /// Allocatable pages: on the buddy lists and the per-CPU lists.
    pub fn nr_free_pages(&self) -> u64 {
        self.inner.alloc.nr_free_pages()
    }

    /// Pages the zones manage.
    pub fn nr_managed_pages(&self) -> u64 {
        self.inner.alloc.nr_managed_pages()
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

    /// The core allocator, for layers built on top.
    pub fn page_alloc(&self) -> &PageAlloc<StdPlatform> {
        &self.inner.alloc
    }
}

/// The README's example, compiled and run as a doctest so the README stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
