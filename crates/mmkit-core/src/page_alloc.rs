//! The page allocator: the entry points `alloc_pages` / `free_pages`, the fast and
//! slow paths, per-CPU refill and drain policies, and the invariant walk.
//!
//! Fast path (Linux's `get_page_from_freelist`): for orders 0..=3 pop the CPU's
//! list; refill it from the zone (one lock hold per batch) when empty, after a
//! low-watermark check. Higher orders go to the zone's buddy lists directly.
//! Slow path (`__alloc_pages_slowpath`): wake kswapd (hook), retry at the min
//! watermark (atomic requests may go lower: half of min for `__GFP_HIGH`, a further
//! quarter when they cannot sleep), merge what lazy merging skipped (merge on
//! demand; not under `LazyNoMerge`) after draining every CPU's lists for orders
//! up to 3, try compaction (hooks; a block the compaction captured is returned at
//! once) and reclaim, and compact again at a higher priority while
//! `should_compact_retry` says a retry can help (the first run only went on from
//! where the last one stopped, or its block was taken meanwhile; bounded); a
//! costly order (above 3) drains the lists only then, as Linux drains after
//! reclaim failed (a drain of every list is thousands of pages under auto-tuned
//! `high`, and the faulting CPUs refill them at once); give back high-atomic
//! reserves, and only then report out of memory. Background threads are woken
//! only for requests whose `Gfp` allows it.
//!
//! Free validation: `free_pages` claims the block by one compare-and-swap of its head
//! descriptor from `Alloc` (with the caller's order) to `None`. Anything else — a
//! free page, an interior page, a double free racing with itself, a wrong order — is
//! refused before any list is touched.
//!
//! Locking: per-CPU lock, then zone lock. `check` takes every per-CPU lock of a zone
//! and then its zone lock.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::compaction::{
    should_compact_retry, CompactPriority, CompactResult, PAGE_ALLOC_COSTLY_ORDER,
};
use crate::config::{Config, MergePolicy, PcpHighPolicy, PcpPolicy, RefillPolicy};
use crate::gfp::{
    AllocContext, Gfp, MigrateType, ALLOC_HARDER, ALLOC_WMARK_LOW, ALLOC_WMARK_MASK,
    MIGRATE_PCPTYPES, MIGRATE_TYPES,
};
use crate::page::{
    fl_mt, fl_order, fl_state, mk_flags, Page, PageState, Pfn, MAX_ORDER, NR_ORDERS,
    PAGEBLOCK_NR_PAGES, PAGEBLOCK_ORDER, PG_MERGE_SKIPPED, PG_OWNED,
};
use crate::pcp::{PcpGuard, PcpList, PerCpuPages, PCP_BATCH_SCALE_MAX, PCP_MAX_ORDER, PCP_ORDERS};
use crate::pcp_cache::{FencedCaches, PcpCacheTable, PCP_CACHE_SLOTS};
use crate::platform::Platform;
use crate::stat::{AtomicEvents, LockStats, VmEvent, VmEvents};
use crate::zone::{MemMap, Span, Zone, ZoneGuard};

/// Cluster refills of at least this many pages merge lazily freed pages first.
const PCP_CLUSTER_MERGE_PAGES: u32 = 256;

/// Extra slow-path rounds a request gets because direct reclaim made progress
/// (bounded; reclaim is a hook of the layer above).
const MAX_RECLAIM_RETRIES: u32 = 3;

/// Why an allocation failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// No block of the order could be had after draining, merging and the hooks.
    NoMemory,
    /// The order is above `MAX_ORDER`.
    InvalidOrder,
}

/// Why a free was refused. Nothing was changed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// The order is above `MAX_ORDER`.
    InvalidOrder,
    /// The pfn is outside the memory this allocator manages.
    OutOfRange,
    /// The pfn is not aligned to 2^order.
    Misaligned,
    /// Not the head of an allocated block (never allocated, already free, interior).
    NotAllocated,
    /// Allocated with another order.
    WrongOrder {
        /// The order the block was allocated with.
        allocated: u32,
    },
    /// The block belongs to the layer above (an address space's data or table
    /// page, a swap-cache page): only that layer frees it.
    Owned,
}

/// Who releases a block, and so which blocks it may release.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum Claim {
    /// A caller of `free_pages`: only blocks `alloc_pages` handed out, never one
    /// allocated with [`PG_OWNED`].
    User,
    /// The layer that owns the block (an address space's zap, migration): any
    /// allocated block.
    Owner,
}

/// Slow-path hooks filled in by the layers above (reclaim, compaction, kswapd).
pub trait SlowPathHooks {
    /// Wake the background reclaimer.
    fn wake_kswapd(&self, _order: u32) {}
    /// Try direct compaction for a block of `order` at priority `prio` (Linux's
    /// `__alloc_pages_direct_compact`); `Success` if a free block of the order
    /// is there (possibly captured, see `take_captured`).
    fn direct_compact(
        &self,
        _order: u32,
        _mt: MigrateType,
        _prio: CompactPriority,
    ) -> CompactResult {
        CompactResult::Skipped
    }
    /// A block of `order` that the last `direct_compact` captured for this request
    /// (Linux's `compaction_capture`): already allocated (state `Alloc`, refcount
    /// 1), so no other task could take it between the compaction and the retry.
    fn take_captured(&self, _order: u32) -> Option<Pfn> {
        None
    }
    /// Try direct reclaim; returns the pages freed.
    fn direct_reclaim(&self, _order: u32) -> u64 {
        0
    }
}

/// Hooks that do nothing: an allocator without reclaim or compaction.
pub struct NoHooks;
impl SlowPathHooks for NoHooks {}

/// A snapshot of one zone, for the text views.
#[derive(Clone, Debug)]
pub struct ZoneInfo {
    /// Zone name ("Normal").
    pub name: &'static str,
    /// First pfn of the zone.
    pub start_pfn: u64,
    /// Pages spanned.
    pub spanned: u64,
    /// Pages managed by the buddy allocator.
    pub managed: u64,
    /// min, low, high watermarks.
    pub wmark: [u64; 3],
    /// Pages on the buddy lists.
    pub nr_free: u64,
    /// Pages on per-CPU lists.
    pub nr_pcp: u64,
    /// Order-0 pages freed without merging.
    pub nr_unmerged: u64,
    /// Free blocks per order and migratetype.
    pub free_blocks: [[u64; MIGRATE_TYPES]; NR_ORDERS],
    /// Pageblocks per migratetype.
    pub pageblocks: [u64; MIGRATE_TYPES],
    /// Zone lock statistics.
    pub lock: LockStats,
    /// (high, count) per CPU.
    pub pcp_high: Vec<(u32, u32)>,
}

/// The page allocator over a memmap of `nr_pages` frames.
pub struct PageAlloc<P: Platform> {
    pub(crate) cfg: Config,
    pub(crate) mem: MemMap,
    pub(crate) zones: Box<[Zone<P>]>,
    pcp: Box<[PerCpuPages]>,
    /// Lock-free order-0 caches in front of `pcp` (None: off or unavailable).
    caches: Option<PcpCacheTable>,
    pub(crate) events: Box<[AtomicEvents]>,
    ncpu: usize,
    nr_pages: u64,
}

/// The event of a watermark check that failed for `alloc_flags`.
#[inline]
fn wmark_fail_event(alloc_flags: u32) -> VmEvent {
    if alloc_flags & ALLOC_WMARK_MASK == ALLOC_WMARK_LOW {
        VmEvent::WmarkLowFail
    } else {
        VmEvent::WmarkMinFail
    }
}

/// Pages a cache miss moves from the per-CPU list into the cache: half of it, so
/// that a CPU alternating between allocating and freeing does not bounce at
/// either end (a free into a full cache moves the whole cache back).
const PCP_CACHE_BATCH: usize = PCP_CACHE_SLOTS / 2;

/// Linux's `zone_batchsize`: a quarter of 1/1024 of the zone, at most 256 pages,
/// rounded to 2^n - 1 to keep batches from aliasing in caches.
fn zone_batchsize(managed: u64) -> u32 {
    let mut batch = (managed / 1024).min(256) / 4;
    if batch < 1 {
        batch = 1;
    }
    let b = batch + batch / 2;
    let r = 1u64 << (63 - b.leading_zeros());
    (r.saturating_sub(1)).max(1) as u32
}

impl<P: Platform> PageAlloc<P> {
    /// Builds an allocator managing `nr_pages` frames (pfn 0..nr_pages), all free,
    /// in one zone. `nr_pages` must be at least one pageblock and fit `u32`.
    pub fn new(cfg: Config, nr_pages: u64) -> Result<Self, &'static str> {
        if nr_pages < PAGEBLOCK_NR_PAGES as u64 {
            return Err("memory too small: need at least one pageblock (2 MiB)");
        }
        if nr_pages >= u32::MAX as u64 {
            return Err("memory too large: at most 2^32 - 1 pages (16 TiB)");
        }
        if cfg.nr_cpus == 0 {
            return Err("nr_cpus must be at least 1");
        }
        let pages: Box<[Page]> = (0..nr_pages).map(|_| Page::default()).collect();
        let nr_pb = (nr_pages as usize).div_ceil(PAGEBLOCK_NR_PAGES);
        let pageblock_mt: Box<[AtomicU8]> = (0..nr_pb)
            .map(|_| AtomicU8::new(MigrateType::Movable as u8))
            .collect();
        let mem = MemMap {
            pages,
            pageblock_mt,
        };
        let span = Span {
            start: 0,
            end: nr_pages as u32,
        };
        let zone = Zone::<P>::new("Normal", span, nr_pages);
        let batch = cfg
            .pcp_batch
            .unwrap_or_else(|| zone_batchsize(nr_pages))
            .max(1);
        let high_min = 6 * batch;
        let high_max = match cfg.pcp_high {
            PcpHighPolicy::Fixed => high_min,
            PcpHighPolicy::Auto => ((nr_pages / 8 / cfg.nr_cpus as u64) as u32)
                .min(16384)
                .max(high_min),
        };
        let ncpu = cfg.nr_cpus;
        let zones: Box<[Zone<P>]> = alloc::vec![zone].into_boxed_slice();
        let pcp_count = if cfg.pcp == PcpPolicy::On {
            ncpu * zones.len()
        } else {
            0
        };
        let pcp: Box<[PerCpuPages]> = (0..pcp_count)
            .map(|_| PerCpuPages::new(batch, high_min, high_max))
            .collect();
        let events: Box<[AtomicEvents]> = (0..ncpu).map(|_| AtomicEvents::new()).collect();
        let caches = (pcp_count > 0 && cfg.pcp_cache && P::cache_ops_available())
            .then(|| PcpCacheTable::new(zones.len(), ncpu));
        let pa = PageAlloc {
            cfg,
            mem,
            zones,
            pcp,
            caches,
            events,
            ncpu,
            nr_pages,
        };
        for z in pa.zones.iter() {
            let mut g = z.lock();
            g.free_range_unmerged(
                &pa.mem,
                z.span.start,
                z.span.end,
                MigrateType::Movable as usize,
            );
            g.lock_stats = LockStats::default();
            g.merge_on_demand = pa.cfg.merge.merges_on_demand();
        }
        Ok(pa)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Frames spanned.
    pub fn nr_pages(&self) -> u64 {
        self.nr_pages
    }

    /// Frames managed by the zones.
    pub fn nr_managed_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.managed).sum()
    }

    /// The descriptor of a frame.
    pub fn page(&self, pfn: Pfn) -> Option<&Page> {
        self.mem.pages.get(pfn.get() as usize)
    }

    #[inline]
    pub(crate) fn cpu(&self) -> usize {
        let id = P::cpu_id();
        if id < self.ncpu {
            id
        } else {
            id % self.ncpu
        }
    }

    #[inline]
    fn zone_of(&self, idx: u32) -> usize {
        if self.zones.len() == 1 {
            return 0;
        }
        self.zones
            .iter()
            .position(|z| idx >= z.span.start && idx < z.span.end)
            .unwrap_or(0)
    }

    #[inline]
    fn pcp_of(&self, zone: usize, cpu: usize) -> &PerCpuPages {
        &self.pcp[zone * self.ncpu + cpu]
    }

    /// Allocates a block of 2^order pages.
    #[inline]
    pub fn alloc_pages(
        &self,
        gfp: Gfp,
        order: u32,
        hooks: &impl SlowPathHooks,
    ) -> Result<Pfn, AllocError> {
        self.alloc_pages_flags(gfp, order, hooks, 0)
    }

    /// Allocates a block for the layer above's own use (an address space's data
    /// and table pages, swap-cache pages): its head carries [`PG_OWNED`], so
    /// `free_pages` with [`Claim::User`] refuses it; the owner releases it with
    /// [`Claim::Owner`] or its last reference.
    #[inline]
    pub fn alloc_owned_pages(
        &self,
        gfp: Gfp,
        order: u32,
        hooks: &impl SlowPathHooks,
    ) -> Result<Pfn, AllocError> {
        self.alloc_pages_flags(gfp, order, hooks, PG_OWNED)
    }

    /// `alloc_pages` with page flags `pg` (0 or [`PG_OWNED`]) set at the head.
    /// Every per-CPU path checks the zone's free count against the low mark
    /// before it touches a list or a cache (Linux's `zone_watermark_fast`), so
    /// pages parked on per-CPU lists are never handed out below the watermark.
    #[inline(always)]
    fn alloc_pages_flags(
        &self,
        gfp: Gfp,
        order: u32,
        hooks: &impl SlowPathHooks,
        pg: u32,
    ) -> Result<Pfn, AllocError> {
        if order > MAX_ORDER {
            return Err(AllocError::InvalidOrder);
        }
        let ac = AllocContext::new(gfp);
        if order == 0 && ac.mt < MIGRATE_PCPTYPES {
            if let Some(c) = &self.caches {
                for z in 0..self.zones.len() {
                    if !self.zones[z].watermark_ok(0, ALLOC_WMARK_LOW) {
                        continue;
                    }
                    if let Some(idx) = c.pop::<P>(z, ac.mt) {
                        return Ok(self.prep_new_page(idx, 0, ac.mt, pg));
                    }
                }
            }
        }
        if let Some(idx) = self.get_page_from_freelist(order, ALLOC_WMARK_LOW, &ac) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        self.alloc_slowpath(order, &ac, hooks, pg)
    }

    /// Whether the lock-free per-CPU caches are in use.
    pub fn has_pcp_caches(&self) -> bool {
        self.caches.is_some()
    }

    /// Allocates up to `out.len()` order-0 pages on the fast path only (Linux's
    /// `alloc_pages_bulk`): one per-CPU lock hold for the whole batch, no slow path,
    /// so it may return fewer (even 0) when the lists and the zone above its low
    /// watermark cannot supply them. Returns the number written to `out`.
    pub fn alloc_pages_bulk(&self, gfp: Gfp, out: &mut [Pfn]) -> usize {
        self.alloc_pages_bulk_flags(gfp, out, 0)
    }

    /// `alloc_pages_bulk` for the layer above's own use: every page carries
    /// [`PG_OWNED`] (see [`Self::alloc_owned_pages`]).
    pub fn alloc_owned_pages_bulk(&self, gfp: Gfp, out: &mut [Pfn]) -> usize {
        self.alloc_pages_bulk_flags(gfp, out, PG_OWNED)
    }

    #[inline(always)]
    fn alloc_pages_bulk_flags(&self, gfp: Gfp, out: &mut [Pfn], pg: u32) -> usize {
        let ac = AllocContext::new(gfp);
        let mut n = 0;
        if !self.pcp.is_empty() && ac.mt < MIGRATE_PCPTYPES {
            // The cache first: it holds the pages that come next off the list.
            if let Some(c) = &self.caches {
                let mut buf = [0u32; PCP_CACHE_SLOTS];
                for z in 0..self.zones.len() {
                    let want = (out.len() - n).min(PCP_CACHE_SLOTS);
                    if want == 0 {
                        break;
                    }
                    if !self.zones[z].watermark_ok(0, ALLOC_WMARK_LOW) {
                        continue;
                    }
                    let got = c.pop_many::<P>(z, ac.mt, &mut buf[..want]);
                    for (o, &idx) in out[n..n + got].iter_mut().zip(&buf[..got]) {
                        *o = Pfn::new(idx as u64);
                    }
                    n += got;
                }
            }
            for z in 0..self.zones.len() {
                if n == out.len() {
                    break;
                }
                let Some(mut g) = self.pcp_trylock(z) else {
                    continue;
                };
                while n < out.len() {
                    match self.rmqueue_pcplist(z, &mut g, 0, ac.mt, ALLOC_WMARK_LOW) {
                        Some(idx) => out[n] = Pfn::new(idx as u64),
                        None => break,
                    }
                    n += 1;
                }
                drop(g);
                if n == out.len() {
                    break;
                }
            }
        } else {
            while n < out.len() {
                match self.get_page_from_freelist(0, ALLOC_WMARK_LOW, &ac) {
                    Some(idx) => out[n] = Pfn::new(idx as u64),
                    None => break,
                }
                n += 1;
            }
        }
        for p in &out[..n] {
            self.prep_new_page(p.get() as u32, 0, ac.mt, pg);
        }
        n
    }

    /// Hands out a block taken off a list: one reference, state `Alloc` with its
    /// order and migratetype, and the page flags `pg` (0 or [`PG_OWNED`]).
    #[inline]
    pub(crate) fn prep_new_page(&self, idx: u32, order: u32, mt: usize, pg: u32) -> Pfn {
        let p = self.mem.page(idx);
        p.refcount.store(1, Ordering::Relaxed);
        p.flags.store(
            mk_flags(PageState::Alloc, order, mt as u32) | pg,
            Ordering::Release,
        );
        Pfn::new(idx as u64)
    }

    #[inline]
    fn get_page_from_freelist(
        &self,
        order: u32,
        alloc_flags: u32,
        ac: &AllocContext,
    ) -> Option<u32> {
        for z in 0..self.zones.len() {
            if let Some(idx) = self.rmqueue(z, order, alloc_flags, ac) {
                return Some(idx);
            }
        }
        None
    }

    #[inline]
    fn rmqueue(&self, z: usize, order: u32, alloc_flags: u32, ac: &AllocContext) -> Option<u32> {
        if !self.pcp.is_empty() && order <= PCP_MAX_ORDER && ac.mt < MIGRATE_PCPTYPES {
            if let Some(mut g) = self.pcp_trylock(z) {
                let r = self.rmqueue_pcplist(z, &mut g, order, ac.mt, alloc_flags);
                if order == 0 && r.is_some() && self.caches.is_some() {
                    self.fill_cache(z, g, ac.mt);
                }
                return r;
            }
        }
        self.rmqueue_buddy(z, order, ac.mt, alloc_flags)
    }

    /// After a cache miss served by the per-CPU list: moves up to
    /// `PCP_CACHE_BATCH` more of its hot pages into the current CPU's cache, so
    /// the next allocations take no lock. Pages the cache no longer has room for
    /// (another thread on this CPU filled it meanwhile, or a drain fenced it) go
    /// back to the per-CPU list.
    #[cold]
    fn fill_cache(&self, z: usize, mut g: PcpGuard<'_>, mt: usize) {
        let Some(c) = &self.caches else { return };
        let mut buf = [0u32; PCP_CACHE_BATCH];
        let mut n = 0;
        while n < PCP_CACHE_BATCH {
            match g.lists[0][mt].pop() {
                Some(idx) => buf[n] = idx,
                None => break,
            }
            n += 1;
        }
        g.count -= n as u32;
        drop(g);
        // Hottest last, so it ends on top of the cache.
        buf[..n].reverse();
        let pushed = c.push_many::<P>(z, mt, &buf[..n]);
        self.events[self.cpu()].add(VmEvent::PcpCacheFill, pushed as u64);
        if pushed < n {
            // The hottest did not fit: hottest first for `return_to_pcp`.
            buf[pushed..n].reverse();
            self.return_to_pcp(z, mt, &buf[pushed..n]);
        }
    }

    /// Puts free order-0 pages (hottest first) back on a per-CPU list, or on the
    /// buddy lists when no per-CPU list can be had.
    #[cold]
    fn return_to_pcp(&self, z: usize, mt: usize, pages: &[u32]) {
        if let Some(mut g) = self.pcp_trylock(z) {
            for &idx in pages.iter().rev() {
                self.free_unref_page_commit(z, &mut g, idx, 0, mt);
            }
            return;
        }
        let zone = &self.zones[z];
        let mut zg = zone.lock();
        for &idx in pages {
            zg.free_one(&self.mem, zone.span, idx, 0, !self.cfg.merge.skips_merge());
        }
    }

    /// A free found the current CPU's cache full: moves the whole cache to the
    /// per-CPU list, bottom (oldest) first, so that the list (whose drains free
    /// sorted clusters from its cold end) sees runs of neighbouring pages whole
    /// and in the order they were freed.
    #[cold]
    fn spill_cache(&self, z: usize, g: &mut PcpGuard<'_>, mt: usize) {
        let Some(c) = &self.caches else { return };
        let mut buf = [0u32; PCP_CACHE_SLOTS];
        let n = c.pop_many::<P>(z, mt, &mut buf);
        // Oldest first onto the list, so its hot end gets the cache's top.
        for &idx in buf[..n].iter().rev() {
            self.free_unref_page_commit(z, g, idx, 0, mt);
        }
        g.events[VmEvent::PcpCacheSpill as usize] += n as u64;
    }

    /// Empties every CPU's cache onto that CPU's per-CPU lists (the first step of
    /// `drain_all_pages`, whose list drain then frees them in sorted clusters).
    fn drain_caches(&self) {
        let Some(c) = &self.caches else { return };
        // Nothing to take: spare every CPU the fence's interrupt. (A page pushed
        // right after this look is no different from one freed right after the
        // drain.)
        if c.lists().iter().all(|l| l.is_empty()) {
            return;
        }
        let mut taken: Vec<(usize, usize, usize, u32)> = Vec::new();
        let mut pages = Vec::new();
        c.with_fenced::<P, _>(|f| {
            for z in 0..self.zones.len() {
                for mt in 0..MIGRATE_PCPTYPES {
                    for cpu in 0..self.ncpu {
                        pages.clear();
                        f.take_all(z, mt, cpu, &mut pages);
                        taken.extend(pages.iter().map(|&p| (z, cpu, mt, p)));
                    }
                }
            }
        });
        if taken.is_empty() {
            return;
        }
        self.events[self.cpu()].add(VmEvent::PcpCacheDrain, taken.len() as u64);
        taken.sort_by_key(|t| (t.0, t.1));
        for group in taken.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (z, cpu) = (group[0].0, group[0].1);
            let mut g = self.pcp_of(z, cpu).lock(P::relax);
            for &(_, _, mt, idx) in group {
                self.free_unref_page_commit(z, &mut g, idx, 0, mt);
            }
        }
    }

    /// Takes the current CPU's list set. The kernel takes it with preemption
    /// disabled, so a failed trylock means a remote drain; here a thread can be
    /// preempted while holding it, and every other thread scheduled on that CPU
    /// would then miss its lists for a whole time slice. So on failure yield once
    /// (letting the holder run) and retry on whatever CPU we are then on, before
    /// falling back to the zone.
    #[inline]
    fn pcp_trylock(&self, z: usize) -> Option<PcpGuard<'_>> {
        let cpu = self.cpu();
        if let Some(g) = self.pcp_of(z, cpu).try_lock() {
            return Some(g);
        }
        self.pcp_trylock_slow(z, cpu)
    }

    #[cold]
    #[inline(never)]
    fn pcp_trylock_slow(&self, z: usize, cpu: usize) -> Option<PcpGuard<'_>> {
        self.events[cpu].inc(VmEvent::PcpTrylockFail);
        for _ in 0..2 {
            P::relax();
            let cpu = self.cpu();
            if let Some(g) = self.pcp_of(z, cpu).try_lock() {
                return Some(g);
            }
        }
        None
    }

    #[inline]
    fn rmqueue_pcplist(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        order: u32,
        mt: usize,
        alloc_flags: u32,
    ) -> Option<u32> {
        // The zone's free count decides, not what the list holds (Linux checks
        // the watermark before `rmqueue`): pages parked on per-CPU lists are
        // not handed out below the mark; the slow path drains them instead.
        if !self.zones[z].watermark_ok(order, alloc_flags) {
            g.events[wmark_fail_event(alloc_flags) as usize] += 1;
            return None;
        }
        let o = order as usize;
        if g.lists[o][mt].len() == 0 && !self.pcp_refill(z, g, order, mt, alloc_flags) {
            return None;
        }
        let idx = g.lists[o][mt].pop()?;
        g.count -= 1 << order;
        g.free_count >>= 1;
        g.events[VmEvent::PgAlloc as usize] += 1;
        g.events[VmEvent::PcpAllocHit as usize] += 1;
        Some(idx)
    }

    /// Refills one per-CPU list with a batch (Linux's `rmqueue_bulk`).
    #[cold]
    fn pcp_refill(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        order: u32,
        mt: usize,
        alloc_flags: u32,
    ) -> bool {
        let zone = &self.zones[z];
        let entries = self.nr_pcp_alloc(z, g, order);
        let g = &mut **g;
        let list = &mut g.lists[order as usize][mt];
        let mut zg = zone.lock();
        // A batch never takes the zone below the request's watermark: bound it
        // by the headroom, read exactly under the lock.
        let room = zone.headroom(zg.nr_free, zg.nr_reserved_highatomic, alloc_flags) >> order;
        let entries = entries.min(room.min(u32::MAX as u64) as u32);
        if entries == 0 {
            drop(zg);
            g.events[wmark_fail_event(alloc_flags) as usize] += 1;
            return false;
        }
        let n = match self.cfg.refill {
            RefillPolicy::PageByPage => {
                let mut n = 0;
                while n < entries {
                    match zg.rmqueue(&self.mem, zone.span, order, mt, alloc_flags) {
                        Some(idx) => list.push(idx),
                        None => break,
                    }
                    n += 1;
                }
                n
            }
            RefillPolicy::Cluster => {
                self.rmqueue_cluster(&mut zg, zone.span, order, mt, entries, list)
            }
        };
        drop(zg);
        g.count += n << order;
        g.events[VmEvent::PcpRefill as usize] += 1;
        g.events[VmEvent::PcpRefillPages as usize] += (n as u64) << order;
        n > 0
    }

    /// Entries to refill (Linux 6.7's `nr_pcp_alloc`). Under auto-tuning a CPU that
    /// keeps allocating without freeing doubles its order-0 refill each time (up to
    /// batch << 5) and raises `high` to make room, so it goes to the zone less often.
    #[inline]
    fn nr_pcp_alloc(&self, z: usize, g: &mut PcpGuard<'_>, order: u32) -> u32 {
        let base = g.batch;
        if self.cfg.pcp_high != PcpHighPolicy::Auto {
            return (base >> order).max(2);
        }
        let mut batch = if order == 0 {
            base << g.alloc_factor
        } else {
            base
        };
        if !self.zones[z].below_high() {
            let new = (g.high + batch).min(g.high_max);
            if new > g.high {
                g.events[VmEvent::PcpHighGrow as usize] += 1;
            }
            g.high = new;
        }
        if order == 0 {
            let max_nr_alloc = g.high.saturating_sub(g.count + base).max(base);
            if batch <= max_nr_alloc && g.alloc_factor < PCP_BATCH_SCALE_MAX {
                g.alloc_factor += 1;
            }
            batch = batch.min(max_nr_alloc);
        }
        (batch >> order).max(2)
    }

    /// Cluster refill: takes `entries` blocks of `order` as contiguous runs cut
    /// from as few buddy blocks as possible, writing only the heads of the blocks it
    /// takes apart, never the descriptors of the pages it hands to the CPU.
    fn rmqueue_cluster(
        &self,
        zg: &mut ZoneGuard<'_, P>,
        span: Span,
        order: u32,
        mt: usize,
        entries: u32,
        list: &mut PcpList,
    ) -> u32 {
        let mem = &self.mem;
        // A refill of a whole run is a high-order request in disguise: merge the
        // order-0 pages that lazy merging left behind first (merge on demand), so
        // the run comes from a few recently freed blocks rather than from many
        // fragments or from a cold, never-split block.
        if zg.nr_unmerged > 0 && zg.merge_on_demand && entries << order >= PCP_CLUSTER_MERGE_PAGES {
            zg.merge_all(mem, span);
        }
        let mut got = 0u32;
        while got < entries {
            let need_pages = (entries - got) << order;
            let want = (32 - (need_pages - 1).leading_zeros()).clamp(order, MAX_ORDER);
            // Blocks smaller than the rest first, largest first: they are the most
            // recently freed (cache-warm) and the fragments, and using them up keeps
            // large blocks whole for high-order requests. Only then split the
            // smallest block that covers the rest. Fragments are blocks below a
            // pageblock: a large refill (auto-tuned batches reach 2016 pages) must
            // not take whole free pageblocks, which huge pages need, while smaller
            // blocks are free.
            let small = want.min(PAGEBLOCK_ORDER).max(order);
            let mut pick = None;
            for o in (order..small).rev() {
                if zg.free_area[o as usize][mt].nr > 0 {
                    pick = Some(o);
                    break;
                }
            }
            if pick.is_none() {
                for o in small..=MAX_ORDER {
                    if zg.free_area[o as usize][mt].nr > 0 {
                        pick = Some(o);
                        break;
                    }
                }
            }
            match pick {
                Some(o) => {
                    let head = zg.free_area[o as usize][mt].head;
                    zg.del_free(mem, head);
                    let take = ((1u32 << o) >> order).min(entries - got);
                    for j in (0..take).rev() {
                        list.push(head + (j << order));
                    }
                    let used = take << order;
                    if used < (1 << o) {
                        zg.free_range_unmerged(mem, head + used, head + (1 << o), mt);
                    }
                    got += take;
                }
                None => {
                    // Nothing of this migratetype: the one-block path merges on
                    // demand and falls back / steals; then runs resume.
                    match zg.rmqueue(mem, span, order, mt, 0) {
                        Some(idx) => {
                            list.push(idx);
                            got += 1;
                        }
                        None => break,
                    }
                }
            }
        }
        got
    }

    #[inline(never)]
    fn rmqueue_buddy(&self, z: usize, order: u32, mt: usize, alloc_flags: u32) -> Option<u32> {
        let zone = &self.zones[z];
        if !zone.watermark_ok(order, alloc_flags) {
            self.events[self.cpu()].inc(wmark_fail_event(alloc_flags));
            return None;
        }
        let mut zg = zone.lock();
        // The mirror may be a moment old: decide on the exact count.
        if zone.headroom(zg.nr_free, zg.nr_reserved_highatomic, alloc_flags) >> order == 0 {
            drop(zg);
            self.events[self.cpu()].inc(wmark_fail_event(alloc_flags));
            return None;
        }
        let idx = zg.rmqueue(&self.mem, zone.span, order, mt, alloc_flags)?;
        zg.events[VmEvent::PgAlloc as usize] += 1;
        if order > 0 && alloc_flags & ALLOC_HARDER != 0 {
            zg.reserve_highatomic(&self.mem, zone.span, zone.managed, idx);
        }
        Some(idx)
    }

    #[cold]
    #[inline(never)]
    fn alloc_slowpath(
        &self,
        order: u32,
        ac: &AllocContext,
        hooks: &impl SlowPathHooks,
        pg: u32,
    ) -> Result<Pfn, AllocError> {
        let cpu = self.cpu();
        self.events[cpu].inc(VmEvent::AllocSlowpath);
        if ac.gfp.can_wake_kswapd() {
            hooks.wake_kswapd(order);
        }
        let flags = ac.slow_flags;
        let attempt = |this: &Self| this.get_page_from_freelist(order, flags, ac);
        if let Some(idx) = attempt(self) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        // Lazily freed pages count as free: merge them before going further (the
        // cheap first step). So do pages held on per-CPU lists, but draining every
        // CPU's lists is not cheap (thousands of pages under auto-tuned `high`,
        // each a cache miss and a zone-lock hold per chunk) and empties the lists
        // of CPUs that are busy faulting: as Linux does, a costly order tries
        // direct compaction first and drains only when that failed (Linux drains
        // after reclaim made no progress), while small orders drain at once.
        let costly = order > PAGE_ALLOC_COSTLY_ORDER;
        if !costly {
            self.drain_all_pages();
        }
        if self.cfg.merge.merges_on_demand() {
            self.merge_all();
        }
        if let Some(idx) = attempt(self) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        if ac.gfp.can_direct_reclaim() {
            // Linux's retry loop: compact at rising priority while compaction
            // failed or withdrew without having seen the whole zone, or while it
            // succeeded but another task took the block (`should_compact_retry`,
            // bounded); reclaim progress also earns a bounded retry.
            let mut prio = CompactPriority::INIT;
            let mut compact_retries = 0;
            let mut reclaim_retries = 0;
            loop {
                let result = if order > 0 {
                    hooks.direct_compact(order, MigrateType::from_index(ac.mt), prio)
                } else {
                    CompactResult::Skipped
                };
                if result == CompactResult::Success {
                    if let Some(pfn) = hooks.take_captured(order) {
                        return Ok(self.prep_new_page(pfn.get() as u32, order, ac.mt, pg));
                    }
                }
                let reclaimed = hooks.direct_reclaim(order) > 0;
                if result == CompactResult::Success || reclaimed {
                    if let Some(idx) = attempt(self) {
                        return Ok(self.prep_new_page(idx, order, ac.mt, pg));
                    }
                }
                if reclaimed && reclaim_retries < MAX_RECLAIM_RETRIES {
                    reclaim_retries += 1;
                    continue;
                }
                if !should_compact_retry(order, result, &mut prio, &mut compact_retries) {
                    break;
                }
            }
        }
        if costly {
            // Compaction could not build the block: the per-CPU lists are the
            // free memory left to try.
            self.drain_all_pages();
            if self.cfg.merge.merges_on_demand() {
                self.merge_all();
            }
            if let Some(idx) = attempt(self) {
                return Ok(self.prep_new_page(idx, order, ac.mt, pg));
            }
        }
        let mut unreserved = false;
        for z in self.zones.iter() {
            unreserved |= z.lock().unreserve_highatomic(&self.mem, z.span, ac.mt);
        }
        if unreserved {
            if let Some(idx) = attempt(self) {
                return Ok(self.prep_new_page(idx, order, ac.mt, pg));
            }
        }
        self.events[self.cpu()].inc(VmEvent::AllocFail);
        Err(AllocError::NoMemory)
    }

    /// Frees a block allocated with `order` by a caller of `alloc_pages`
    /// ([`Claim::User`]: a block of the layer above is refused). Refuses bad
    /// input without changing anything.
    #[inline]
    pub fn free_pages(&self, pfn: Pfn, order: u32) -> Result<(), FreeError> {
        self.free_pages_claim(pfn, order, Claim::User)
    }

    /// Frees a block as `who`: the layer above frees its own blocks (allocated
    /// with [`Self::alloc_owned_pages`]) with [`Claim::Owner`].
    #[inline]
    pub fn free_pages_claim(&self, pfn: Pfn, order: u32, who: Claim) -> Result<(), FreeError> {
        match self.claim_for_free(pfn, order, who) {
            Ok(mt) => {
                self.free_claimed(pfn.get() as u32, order, mt);
                Ok(())
            }
            Err(e) => {
                self.events[self.cpu()].inc(VmEvent::FreeInvalid);
                Err(e)
            }
        }
    }

    /// Validates a free and takes ownership of the block; returns its migratetype.
    #[inline]
    pub(crate) fn claim_for_free(
        &self,
        pfn: Pfn,
        order: u32,
        who: Claim,
    ) -> Result<usize, FreeError> {
        if order > MAX_ORDER {
            return Err(FreeError::InvalidOrder);
        }
        let idx = pfn.get();
        if idx >= self.nr_pages {
            return Err(FreeError::OutOfRange);
        }
        if idx & ((1 << order) - 1) != 0 {
            return Err(FreeError::Misaligned);
        }
        let page = self.mem.page(idx as u32);
        let mut f = page.flags.load(Ordering::Relaxed);
        loop {
            if fl_state(f) != PageState::Alloc as u32 {
                return Err(FreeError::NotAllocated);
            }
            if who == Claim::User && f & PG_OWNED != 0 {
                return Err(FreeError::Owned);
            }
            if fl_order(f) != order {
                return Err(FreeError::WrongOrder {
                    allocated: fl_order(f),
                });
            }
            match page
                .flags
                .compare_exchange_weak(f, 0, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => f = now,
            }
        }
        page.refcount.store(0, Ordering::Relaxed);
        Ok(fl_mt(f))
    }

    /// The order of the allocated block headed by `pfn` if a caller of
    /// `alloc_pages` may hold a reference on it: in range, the head of an
    /// allocated block with a reference, not a block of the layer above.
    pub fn user_block_order(&self, pfn: Pfn) -> Result<u32, FreeError> {
        let p = self.page(pfn).ok_or(FreeError::OutOfRange)?;
        let f = p.flags.load(Ordering::Acquire);
        if fl_state(f) != PageState::Alloc as u32 || p.refcount.load(Ordering::Relaxed) == 0 {
            return Err(FreeError::NotAllocated);
        }
        if f & PG_OWNED != 0 {
            return Err(FreeError::Owned);
        }
        Ok(fl_order(f))
    }

    /// Takes a reference on an allocated block (Linux's `get_page`): the block
    /// is not freed until a matching `put_page`. Used to pin a page during an access.
    #[inline]
    pub fn get_page(&self, pfn: Pfn) {
        if let Some(p) = self.mem.pages.get(pfn.get() as usize) {
            p.refcount.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops a reference on an allocated head (Linux's `put_page_testzero`); if
    /// it was the last, claims the block for freeing, whoever owns it, with
    /// `order` (`None`: the order its head records) and returns the order and
    /// migratetype. The one place a reference count reaches zero.
    #[inline]
    pub(crate) fn put_page_testzero(&self, pfn: Pfn, order: Option<u32>) -> Option<(u32, usize)> {
        let p = self.mem.pages.get(pfn.get() as usize)?;
        if p.refcount.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        let order = order.unwrap_or_else(|| fl_order(p.flags.load(Ordering::Relaxed)));
        // A refused claim (not an allocated head) leaves the count as it was.
        p.refcount.fetch_add(1, Ordering::Relaxed);
        let mt = self.claim_for_free(pfn, order, Claim::Owner).ok()?;
        Some((order, mt))
    }

    /// Drops a reference (Linux's `put_page`); the last one frees the block.
    /// Returns true if the block was freed.
    #[inline]
    pub fn put_page(&self, pfn: Pfn) -> bool {
        match self.put_page_testzero(pfn, None) {
            Some((order, mt)) => {
                self.free_claimed(pfn.get() as u32, order, mt);
                true
            }
            None => false,
        }
    }

    /// Drops one reference on each block and frees those whose count reached
    /// zero, taking the per-CPU lock (or the zone lock) once for the whole batch
    /// (the allocator side of an mmu_gather). Returns the number of blocks freed.
    pub fn put_pages_bulk(&self, blocks: &[(Pfn, u32)]) -> usize {
        let mut freed = 0;
        let mut pcp: Option<(usize, PcpGuard<'_>)> = None;
        for &(pfn, order) in blocks.iter().rev() {
            let Some((_, mt)) = self.put_page_testzero(pfn, Some(order)) else {
                continue;
            };
            freed += 1;
            let idx = pfn.get() as u32;
            let z = self.zone_of(idx);
            if !self.pcp.is_empty() && order <= PCP_MAX_ORDER && mt < MIGRATE_PCPTYPES {
                if !matches!(pcp, Some((pz, _)) if pz == z) {
                    drop(pcp.take());
                    pcp = self.pcp_trylock(z).map(|g| (z, g));
                }
                if let Some((_, g)) = pcp.as_mut() {
                    self.free_unref_page_commit(z, g, idx, order, mt);
                    g.events[VmEvent::PgFree as usize] += 1;
                    continue;
                }
            }
            self.free_claimed(idx, order, mt);
        }
        freed
    }

    #[inline]
    fn free_claimed(&self, idx: u32, order: u32, mt: usize) {
        let z = self.zone_of(idx);
        if !self.pcp.is_empty() && order <= PCP_MAX_ORDER && mt < MIGRATE_PCPTYPES {
            let cached = order == 0 && self.caches.is_some();
            if let Some(c) = self.caches.as_ref().filter(|_| cached) {
                if c.push::<P>(z, mt, idx) {
                    return;
                }
            }
            if let Some(mut g) = self.pcp_trylock(z) {
                // The cache's pages go first: they were freed before this one, and
                // the list keeps free order so that its drains see runs in order.
                if cached {
                    self.spill_cache(z, &mut g, mt);
                }
                self.free_unref_page_commit(z, &mut g, idx, order, mt);
                g.events[VmEvent::PgFree as usize] += 1;
                return;
            }
        }
        let zone = &self.zones[z];
        let mut zg = zone.lock();
        let merge = !(order == 0 && self.cfg.merge.skips_merge());
        zg.free_one(&self.mem, zone.span, idx, order, merge);
        zg.events[VmEvent::PgFree as usize] += 1;
    }

    #[inline]
    fn free_unref_page_commit(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        idx: u32,
        order: u32,
        mt: usize,
    ) {
        let o = order as usize;
        if g.lists[o][mt].is_full() {
            let b = g.batch;
            self.free_pcppages_bulk(z, g, b);
        }
        g.lists[o][mt].push(idx);
        g.count += 1 << order;
        g.free_count = g.free_count.saturating_add(1 << order);
        g.alloc_factor >>= 1;
        if g.count >= g.high {
            let high = self.nr_pcp_high(z, g);
            if g.count >= high {
                let to_free = (g.count - high + g.batch).min(g.count);
                self.free_pcppages_bulk(z, g, to_free);
            }
        }
    }

    /// The `high` to enforce now; auto-tuning adjusts it (Linux 6.7's `nr_pcp_high`).
    #[inline]
    fn nr_pcp_high(&self, z: usize, g: &mut PcpGuard<'_>) -> u32 {
        if self.cfg.pcp_high == PcpHighPolicy::Fixed {
            return g.high;
        }
        if self.zones[z].below_high() {
            let new = g.high.saturating_sub(g.batch).max(g.high_min);
            if new < g.high {
                g.events[VmEvent::PcpHighShrink as usize] += 1;
            }
            g.high = new;
        } else if g.free_count >= g.batch {
            let new = (g.high + g.batch).min(g.high_max);
            if new > g.high {
                g.events[VmEvent::PcpHighGrow as usize] += 1;
            }
            g.high = new;
        }
        g.high
    }

    /// Frees `to_free` pages from the cold ends of a CPU's lists to the zone
    /// (Linux's `free_pcppages_bulk`), in chunks of up to 128 entries, one zone
    /// lock hold per chunk.
    fn free_pcppages_bulk(&self, z: usize, g: &mut PcpGuard<'_>, to_free: u32) {
        const CHUNK: usize = 128;
        let zone = &self.zones[z];
        let mut left = to_free.min(g.count);
        let nlists = (PCP_ORDERS * MIGRATE_PCPTYPES) as u32;
        while left > 0 {
            // Gather a chunk of one (order, migratetype) list, round robin.
            let mut buf = [0u32; CHUNK];
            let mut n = 0usize;
            let mut order = 0;
            for step in 0..nlists {
                let li = (g.drain_rr + step) % nlists;
                let (o, mt) = (
                    (li as usize) / MIGRATE_PCPTYPES,
                    (li as usize) % MIGRATE_PCPTYPES,
                );
                if g.lists[o][mt].len() == 0 {
                    continue;
                }
                order = o as u32;
                let g = &mut **g;
                let list = &mut g.lists[o][mt];
                while n < CHUNK && left > 0 {
                    match list.pop_cold() {
                        Some(idx) => {
                            buf[n] = idx;
                            n += 1;
                            left = left.saturating_sub(1 << o);
                            g.count -= 1 << o;
                        }
                        None => break,
                    }
                }
                g.drain_rr = li + 1;
                break;
            }
            if n == 0 {
                break;
            }
            let chunk = &mut buf[..n];
            let cluster = self.cfg.refill == RefillPolicy::Cluster;
            if cluster {
                chunk.sort_unstable();
            }
            let lazy0 = order == 0 && self.cfg.merge.skips_merge();
            let mut zg = zone.lock();
            if cluster {
                // Free aligned contiguous runs as whole blocks: one head written per run.
                let mut i = 0;
                while i < n {
                    let x = chunk[i];
                    let mut k = order;
                    while k < MAX_ORDER
                        && x & ((2 << k) - 1) == 0
                        && i + ((2usize << k) >> order) <= n
                        && chunk[i + ((2usize << k) >> order) - 1] == x + (2 << k) - (1 << order)
                    {
                        k += 1;
                    }
                    zg.free_one(&self.mem, zone.span, x, k, !(lazy0 && k == 0));
                    i += (1usize << k) >> order;
                }
            } else {
                for &x in chunk.iter() {
                    zg.free_one(&self.mem, zone.span, x, order, !lazy0);
                }
            }
            drop(zg);
            g.events[VmEvent::PcpDrain as usize] += 1;
            g.events[VmEvent::PcpDrainPages as usize] += (n as u64) << order;
        }
    }

    /// Flushes every CPU's lists to the buddy lists (Linux's `drain_all_pages`).
    pub fn drain_all_pages(&self) {
        if self.pcp.is_empty() {
            return;
        }
        self.events[self.cpu()].inc(VmEvent::DrainAll);
        self.drain_caches();
        for z in 0..self.zones.len() {
            for cpu in 0..self.ncpu {
                let mut g = self.pcp_of(z, cpu).lock(P::relax);
                let c = g.count;
                self.free_pcppages_bulk(z, &mut g, c);
            }
        }
    }

    /// Merges every lazily freed order-0 page (merge on demand).
    pub fn merge_all(&self) {
        for z in self.zones.iter() {
            let mut g = z.lock();
            if g.nr_unmerged > 0 {
                g.merge_all(&self.mem, z.span);
            }
        }
    }

    /// Auto-tuning decay, run about once a second by the environment (Linux's
    /// `decay_pcp_high` from the vmstat worker): lowers `high` by 1/8 towards
    /// `high_min` and frees what is above it.
    pub fn decay_pcp_high(&self) {
        if let Some(c) = &self.caches {
            c.fold::<P>();
        }
        if self.cfg.pcp_high != PcpHighPolicy::Auto {
            return;
        }
        for z in 0..self.zones.len() {
            for cpu in 0..self.ncpu {
                let Some(mut g) = self.pcp_of(z, cpu).try_lock() else {
                    continue;
                };
                if g.high > g.high_min {
                    let new = g
                        .count
                        .saturating_sub(g.batch << 5)
                        .max(g.high - g.high / 8)
                        .max(g.high_min);
                    if new < g.high {
                        g.events[VmEvent::PcpHighShrink as usize] += 1;
                    }
                    g.high = new;
                }
                if g.count > g.high {
                    let n = g.count - g.high;
                    self.free_pcppages_bulk(z, &mut g, n);
                }
                g.free_count = 0;
            }
        }
    }

    /// Allocatable pages: on buddy lists and on per-CPU lists.
    pub fn nr_free_pages(&self) -> u64 {
        let buddy: u64 = self
            .zones
            .iter()
            .map(|z| z.nr_free_mirror.load(Ordering::Relaxed))
            .sum();
        let pcp: u64 = self
            .pcp
            .iter()
            .map(|p| p.count_mirror.load(Ordering::Relaxed) as u64)
            .sum();
        let cached: u64 = self
            .caches
            .as_ref()
            .map_or(0, |c| (0..c.nr_zones()).map(|z| c.nr_pages(z)).sum());
        buddy + pcp + cached
    }

    /// Adds `n` to an event counter (for the layers above: compaction, migration).
    #[inline]
    pub fn count_vm_event(&self, e: VmEvent, n: u64) {
        self.events[self.cpu()].add(e, n);
    }

    /// Folded event counters.
    pub fn vm_events(&self) -> VmEvents {
        let mut ev = VmEvents::default();
        for e in self.events.iter() {
            e.fold_into(&mut ev);
        }
        for z in self.zones.iter() {
            ev.add(&z.lock().events);
        }
        for p in self.pcp.iter() {
            ev.add(&p.lock(P::relax).events);
        }
        if let Some(c) = &self.caches {
            // The caches count raw pops and pushes; those that moved pages between
            // layers (fills, spills, drains, counted above) are not allocations or frees.
            // Folded after reading those counts, so a move in flight is never subtracted
            // before its pops are seen.
            c.fold::<P>();
            let pops = c.total_pops.load(Ordering::Relaxed);
            let pushes = c.total_pushes.load(Ordering::Relaxed);
            let allocs = pops
                .saturating_sub(ev.get(VmEvent::PcpCacheSpill) + ev.get(VmEvent::PcpCacheDrain));
            let frees = pushes.saturating_sub(ev.get(VmEvent::PcpCacheFill));
            ev.0[VmEvent::PgAlloc as usize] += allocs;
            ev.0[VmEvent::PcpAllocHit as usize] += allocs;
            ev.0[VmEvent::PgFree as usize] += frees;
        }
        ev
    }

    /// Zone lock statistics, summed over zones.
    pub fn zone_lock_stats(&self) -> LockStats {
        let mut s = LockStats::default();
        for z in self.zones.iter() {
            let g = z.lock();
            s.add(&g.lock_stats);
        }
        s
    }

    /// Clears every event counter and lock statistic.
    pub fn reset_stats(&self) {
        for e in self.events.iter() {
            e.reset();
        }
        for z in self.zones.iter() {
            let mut g = z.lock();
            g.events = [0; crate::stat::NR_VM_EVENTS];
            g.lock_stats = LockStats::default();
            z.compact.reset_counters();
        }
        for p in self.pcp.iter() {
            p.lock(P::relax).events = [0; crate::stat::NR_VM_EVENTS];
        }
        if let Some(c) = &self.caches {
            c.reset_totals::<P>();
        }
    }

    /// A snapshot of every zone.
    pub fn zone_info(&self) -> Vec<ZoneInfo> {
        let mut out = Vec::new();
        for (zi, z) in self.zones.iter().enumerate() {
            let mut pcp_high = Vec::new();
            let mut nr_pcp = 0u64;
            for cpu in 0..self.ncpu.min(self.pcp.len()) {
                let g = self.pcp_of(zi, cpu).lock(P::relax);
                pcp_high.push((g.high, g.count));
                nr_pcp += g.count as u64;
            }
            nr_pcp += self.caches.as_ref().map_or(0, |c| c.nr_pages(zi));
            let g = z.lock();
            let mut free_blocks = [[0u64; MIGRATE_TYPES]; NR_ORDERS];
            for (o, row) in free_blocks.iter_mut().enumerate() {
                for (mt, c) in row.iter_mut().enumerate() {
                    *c = g.free_area[o][mt].nr;
                }
            }
            let mut pageblocks = [0u64; MIGRATE_TYPES];
            let mut pb = z.span.start;
            while pb < z.span.end {
                pageblocks[self.mem.pageblock_mt(pb)] += 1;
                pb += PAGEBLOCK_NR_PAGES as u32;
            }
            out.push(ZoneInfo {
                name: z.name,
                start_pfn: z.span.start as u64,
                spanned: (z.span.end - z.span.start) as u64,
                managed: z.managed,
                wmark: z.wmark,
                nr_free: g.nr_free,
                nr_pcp,
                nr_unmerged: g.nr_unmerged,
                free_blocks,
                pageblocks,
                lock: g.lock_stats,
                pcp_high,
            });
        }
        out
    }

    /// Walks every list and descriptor and verifies the invariants (see `zone`).
    pub fn check(&self) -> Result<(), String> {
        match &self.caches {
            Some(c) => c.with_fenced::<P, _>(|f| self.check_fenced(Some(f))),
            None => self.check_fenced(None),
        }
    }

    fn check_fenced(&self, caches: Option<&FencedCaches<'_>>) -> Result<(), String> {
        let mut cover = vec![0u8; self.nr_pages as usize];
        let mem = &self.mem;
        for (zi, z) in self.zones.iter().enumerate() {
            let pcps: Vec<PcpGuard<'_>> = (0..if self.pcp.is_empty() { 0 } else { self.ncpu })
                .map(|cpu| self.pcp_of(zi, cpu).lock(P::relax))
                .collect();
            let g = z.lock();
            let mut total = 0u64;
            let mut unmerged = 0u64;
            for o in 0..NR_ORDERS {
                for mt in 0..MIGRATE_TYPES {
                    let l = &g.free_area[o][mt];
                    let (mut i, mut prev, mut n) = (l.head, crate::page::NIL, 0u64);
                    while i != crate::page::NIL {
                        if i < z.span.start || i >= z.span.end {
                            return Err(format!(
                                "free list order {o} {mt}: index {i} outside zone"
                            ));
                        }
                        let p = mem.page(i);
                        let f = p.raw_flags();
                        if fl_state(f) != PageState::Buddy as u32
                            || fl_order(f) as usize != o
                            || fl_mt(f) != mt
                        {
                            return Err(format!(
                                "pfn {i} on free list order {o} type {mt} has flags {f:#x}"
                            ));
                        }
                        if p.prev() != prev {
                            return Err(format!(
                                "pfn {i}: broken prev link on list order {o} type {mt}"
                            ));
                        }
                        if i & ((1 << o) - 1) != 0 || i + (1 << o) > z.span.end {
                            return Err(format!(
                                "pfn {i}: misaligned or overhanging order-{o} free block"
                            ));
                        }
                        if f & PG_MERGE_SKIPPED != 0 {
                            unmerged += 1;
                        }
                        cover_block(&mut cover, mem, i, o as u32, "free block")?;
                        if self.cfg.merge == MergePolicy::Eager && (o as u32) < MAX_ORDER {
                            let b = i ^ (1 << o);
                            if b >= z.span.start && b + (1 << o) <= z.span.end {
                                let bf = mem.page(b).raw_flags();
                                if fl_state(bf) == PageState::Buddy as u32
                                    && fl_order(bf) as usize == o
                                {
                                    return Err(format!("pfn {i} and its buddy {b} are both free at order {o} under eager merging"));
                                }
                            }
                        }
                        n += 1;
                        total += 1 << o;
                        prev = i;
                        i = p.next();
                        if n > self.nr_pages {
                            return Err(format!("free list order {o} type {mt} has a cycle"));
                        }
                    }
                    if n != l.nr {
                        return Err(format!(
                            "free list order {o} type {mt}: counted {n}, recorded {}",
                            l.nr
                        ));
                    }
                    if l.tail != prev {
                        return Err(format!("free list order {o} type {mt}: tail mismatch"));
                    }
                }
            }
            if total != g.nr_free {
                return Err(format!(
                    "zone {}: lists hold {total} pages, nr_free says {}",
                    z.name, g.nr_free
                ));
            }
            if unmerged != g.nr_unmerged {
                return Err(format!(
                    "zone {}: {unmerged} merge-skipped pages, nr_unmerged says {}",
                    z.name, g.nr_unmerged
                ));
            }
            for (cpu, pg) in pcps.iter().enumerate() {
                let mut count = 0u32;
                for o in 0..PCP_ORDERS {
                    for mt in 0..MIGRATE_PCPTYPES {
                        for i in pg.lists[o][mt].iter() {
                            if i < z.span.start || i >= z.span.end || i & ((1 << o) - 1) != 0 {
                                return Err(format!("cpu {cpu} list order {o}: bad entry {i}"));
                            }
                            if mem.page(i).raw_flags() != 0 {
                                return Err(format!(
                                    "cpu {cpu} list order {o}: pfn {i} has flags {:#x}",
                                    mem.page(i).raw_flags()
                                ));
                            }
                            cover_block(&mut cover, mem, i, o as u32, "per-CPU entry")?;
                            count += 1 << o;
                        }
                    }
                }
                if count != pg.count {
                    return Err(format!(
                        "cpu {cpu}: lists hold {count} pages, count says {}",
                        pg.count
                    ));
                }
                if let Some(f) = caches {
                    for mt in 0..MIGRATE_PCPTYPES {
                        for i in f.entries(zi, mt, cpu) {
                            if i < z.span.start || i >= z.span.end {
                                return Err(format!("cpu {cpu} cache type {mt}: bad entry {i}"));
                            }
                            if mem.page(i).raw_flags() != 0 {
                                return Err(format!(
                                    "cpu {cpu} cache type {mt}: pfn {i} has flags {:#x}",
                                    mem.page(i).raw_flags()
                                ));
                            }
                            cover_block(&mut cover, mem, i, 0, "per-CPU cache entry")?;
                        }
                    }
                }
                if pg.high < pg.high_min || pg.high > pg.high_max {
                    return Err(format!(
                        "cpu {cpu}: high {} outside [{}, {}]",
                        pg.high, pg.high_min, pg.high_max
                    ));
                }
            }
            drop(g);
            drop(pcps);
        }
        // Allocated and reserved pages, and nothing left over.
        let mut i = 0u32;
        while (i as u64) < self.nr_pages {
            let f = mem.page(i).raw_flags();
            match fl_state(f) {
                s if s == PageState::Alloc as u32 => {
                    let o = fl_order(f);
                    if i & ((1 << o) - 1) != 0 {
                        return Err(format!("allocated pfn {i} misaligned for order {o}"));
                    }
                    cover_block(&mut cover, mem, i, o, "allocated block")?;
                    i += 1 << o;
                    continue;
                }
                s if s == PageState::Reserved as u32 => {
                    if cover[i as usize] != 0 {
                        return Err(format!("reserved pfn {i} also on a list"));
                    }
                    cover[i as usize] = 1;
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(p) = cover.iter().position(|&c| c != 1) {
            return Err(format!(
                "pfn {p} is neither free, allocated nor reserved (flags {:#x})",
                mem.page(p as u32).raw_flags()
            ));
        }
        Ok(())
    }
}

/// Marks the pages of a block as covered; its interior descriptors must be `None`.
fn cover_block(
    cover: &mut [u8],
    mem: &MemMap,
    i: u32,
    order: u32,
    what: &str,
) -> Result<(), String> {
    let end = i as usize + (1usize << order);
    if end > cover.len() {
        return Err(format!(
            "{what} at pfn {i} order {order} overhangs the memmap"
        ));
    }
    for (j, c) in cover[i as usize..end].iter_mut().enumerate() {
        if *c != 0 {
            return Err(format!(
                "pfn {} covered twice ({what} at {i} order {order})",
                i as usize + j
            ));
        }
        *c = 1;
        if j > 0 {
            let f = mem.page(i + j as u32).raw_flags();
            if f & 0xffff != 0 {
                return Err(format!(
                    "interior pfn {} of {what} at {i} has flags {f:#x}",
                    i as usize + j
                ));
            }
        }
    }
    Ok(())
}

// The pageblock order must let a pageblock hold whole per-CPU blocks.
const _: () = assert!(PAGEBLOCK_ORDER > PCP_MAX_ORDER);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::sync::atomic::AtomicBool;

    /// A test spinlock; the core takes any `lock_api::RawMutex`.
    struct Spin(AtomicBool);
    // SAFETY: a test-and-set lock: `lock` returns only after winning the swap.
    unsafe impl lock_api::RawMutex for Spin {
        #[allow(clippy::declare_interior_mutable_const)]
        const INIT: Spin = Spin(AtomicBool::new(false));
        type GuardMarker = lock_api::GuardSend;
        fn lock(&self) {
            while !self.try_lock() {
                std::thread::yield_now();
            }
        }
        fn try_lock(&self) -> bool {
            !self.0.swap(true, Ordering::Acquire)
        }
        unsafe fn unlock(&self) {
            self.0.store(false, Ordering::Release)
        }
    }
    struct TestPlatform;
    impl Platform for TestPlatform {
        type ZoneLock = Spin;
        fn cpu_id() -> usize {
            0
        }
        fn now_ns() -> u64 {
            0
        }
    }

    fn pa(
        pcp: PcpPolicy,
        merge: MergePolicy,
        refill: RefillPolicy,
        pages: u64,
    ) -> PageAlloc<TestPlatform> {
        let cfg = Config {
            pcp,
            merge,
            refill,
            pcp_high: PcpHighPolicy::Fixed,
            nr_cpus: 2,
            pcp_batch: None,
            pcp_cache: false,
        };
        PageAlloc::new(cfg, pages).unwrap()
    }

    std::thread_local! {
        static EMU_CPU: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }
    /// Serialises the emulated restartable operations (one at a time, as if no
    /// thread were ever preempted inside one).
    static EMU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A platform whose restartable per-CPU cache operations are emulated in Rust
    /// with the layout's semantics, and whose CPU id the test sets, so the core's
    /// cache accounting is tested without the std runtime's assembly.
    struct EmuPlatform;
    impl Platform for EmuPlatform {
        type ZoneLock = Spin;
        fn cpu_id() -> usize {
            EMU_CPU.with(|c| c.get())
        }
        fn now_ns() -> u64 {
            0
        }
        fn cache_ops_available() -> bool {
            true
        }
        unsafe fn cache_pop(row: *const crate::pcp_cache::PcpCacheList, nr: usize) -> Option<u32> {
            let _g = EMU_LOCK.lock().unwrap();
            let cpu = Self::cpu_id();
            if cpu >= nr {
                return None;
            }
            // SAFETY: the caller passes `nr` lists.
            let l = unsafe { &*row.add(cpu) };
            let len = l.len();
            if l.fenced.load(Ordering::Relaxed) != 0 || len == 0 {
                return None;
            }
            let v = l.slots[len as usize - 1].load(Ordering::Relaxed);
            l.pops.fetch_add(1, Ordering::Relaxed);
            Some(v)
        }
        unsafe fn cache_push(
            row: *const crate::pcp_cache::PcpCacheList,
            nr: usize,
            idx: u32,
        ) -> bool {
            let _g = EMU_LOCK.lock().unwrap();
            let cpu = Self::cpu_id();
            if cpu >= nr {
                return false;
            }
            // SAFETY: the caller passes `nr` lists.
            let l = unsafe { &*row.add(cpu) };
            let len = l.len() as usize;
            if l.fenced.load(Ordering::Relaxed) != 0 || len == PCP_CACHE_SLOTS {
                return false;
            }
            l.slots[len].store(idx, Ordering::Relaxed);
            l.pushes.fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    #[test]
    fn pcp_cache_accounting_drain_and_check() {
        let cfg = Config {
            nr_cpus: 2,
            pcp_batch: Some(15),
            ..Config::default()
        };
        let a = PageAlloc::<EmuPlatform>::new(cfg, 8192).unwrap();
        assert!(a.has_pcp_caches());
        let free0 = a.nr_free_pages();
        let ev0 = a.vm_events();
        let mut held = std::vec::Vec::new();
        let (mut allocs, mut frees) = (0u64, 0u64);
        // Allocate and free on alternating CPUs, in runs long enough to fill,
        // spill and refill the caches.
        for round in 0..20usize {
            EMU_CPU.with(|c| c.set(round % 2));
            for _ in 0..(37 * (round % 5) + 3) {
                held.push(a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap());
                allocs += 1;
            }
            a.check().unwrap();
            EMU_CPU.with(|c| c.set((round + 1) % 2));
            let keep = held.len() / 3;
            for p in held.drain(keep..) {
                a.free_pages(p, 0).unwrap();
                frees += 1;
            }
            a.check().unwrap();
            assert_eq!(a.nr_free_pages(), free0 - held.len() as u64);
        }
        // Refused frees go nowhere near the caches.
        assert_eq!(
            a.free_pages(held[0], 1),
            Err(FreeError::WrongOrder { allocated: 0 })
        );
        for p in held.drain(..) {
            a.free_pages(p, 0).unwrap();
            frees += 1;
        }
        let ev = a.vm_events();
        assert!(ev.get(VmEvent::PcpCacheFill) > 0 && ev.get(VmEvent::PcpCacheSpill) > 0);
        assert_eq!(ev.get(VmEvent::PgAlloc) - ev0.get(VmEvent::PgAlloc), allocs);
        assert_eq!(ev.get(VmEvent::PgFree) - ev0.get(VmEvent::PgFree), frees);
        assert!(a.zone_info()[0].nr_pcp > 0);
        assert_eq!(a.nr_free_pages(), free0);
        a.drain_all_pages();
        assert_eq!(a.zone_info()[0].nr_pcp, 0);
        assert!(a.vm_events().get(VmEvent::PcpCacheDrain) > 0);
        // Draining is not freeing: the counts stay exact.
        assert_eq!(
            a.vm_events().get(VmEvent::PgFree) - ev0.get(VmEvent::PgFree),
            frees
        );
        a.check().unwrap();
        assert_eq!(a.nr_free_pages(), free0);
        // Everything merges back (lazy merging, merge on demand).
        let big = a.alloc_pages(Gfp::MOVABLE, MAX_ORDER, &NoHooks).unwrap();
        a.free_pages(big, MAX_ORDER).unwrap();
        a.reset_stats();
        assert_eq!(a.vm_events().get(VmEvent::PgAlloc), 0);
    }

    /// Records what the per-CPU lists held when the slow path asked for direct
    /// compaction, and compacts nothing.
    struct SeeLists<'a> {
        a: &'a PageAlloc<TestPlatform>,
        calls: core::cell::Cell<u32>,
        pcp_at_first_call: core::cell::Cell<u64>,
    }
    impl SlowPathHooks for SeeLists<'_> {
        fn direct_compact(&self, _: u32, _: MigrateType, _: CompactPriority) -> CompactResult {
            if self.calls.get() == 0 {
                self.pcp_at_first_call.set(self.a.zone_info()[0].nr_pcp);
            }
            self.calls.set(self.calls.get() + 1);
            CompactResult::Complete
        }
    }

    /// A compaction run's goal counts blocks of its order, a larger free block as
    /// the blocks it splits into.
    #[test]
    fn compaction_goal_counts_blocks_of_the_order() {
        let a = pa(
            PcpPolicy::On,
            MergePolicy::Lazy,
            RefillPolicy::Cluster,
            4096,
        );
        let free_order9 = a.zone_info()[0]
            .free_blocks
            .iter()
            .enumerate()
            .skip(9)
            .map(|(o, b)| b.iter().sum::<u64>() << (o - 9))
            .sum::<u64>();
        assert!(free_order9 >= 4, "{free_order9}");
        let mut cc = a.compact_control(
            0,
            Some(9),
            MigrateType::Movable,
            crate::CompactMode::Background,
        );
        for (goal, done) in [
            (1, true),
            (free_order9 as u32, true),
            (free_order9 as u32 + 1, false),
        ] {
            cc.goal_blocks = goal;
            assert_eq!(a.compaction_done(&cc), done, "goal {goal}");
        }
        // One block taken: one fewer.
        let p = a.alloc_pages(Gfp::MOVABLE, 9, &NoHooks).unwrap();
        cc.goal_blocks = free_order9 as u32;
        assert!(!a.compaction_done(&cc));
        a.free_pages(p, 9).unwrap();
        assert!(a.compaction_done(&cc));
    }

    /// An allocator with every page allocated as order 0 except the aligned
    /// block of `1 << order` pages at `at`, freed page by page (so that its last
    /// pages sit on a per-CPU list), and the pages still held.
    fn all_but_one_block(
        merge: MergePolicy,
        order: u32,
        at: u64,
    ) -> (PageAlloc<TestPlatform>, Vec<Pfn>) {
        let a = pa(PcpPolicy::On, merge, RefillPolicy::Cluster, 4096);
        let mut held = Vec::new();
        while let Ok(p) = a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks) {
            held.push(p);
        }
        // What is left is the reserve below the min watermark: less than a block.
        assert!(a.nr_free_pages() < 1 << order);
        held.sort_unstable_by_key(|p| p.get());
        let i = held.iter().position(|p| p.get() == at).unwrap();
        for p in held.drain(i..i + (1 << order)) {
            assert!(p.get() < at + (1 << order));
            a.free_pages(p, 0).unwrap();
        }
        (a, held)
    }

    /// The only free pageblock, partly on a per-CPU list: a costly order asks
    /// for compaction before draining the lists (as Linux does), and still gets
    /// the block from the drain when compaction could not build it.
    #[test]
    fn slowpath_costly_order_compacts_before_draining_lists() {
        for merge in [MergePolicy::Eager, MergePolicy::Lazy] {
            let (a, held) = all_but_one_block(merge, 9, 2048);
            let on_lists = a.zone_info()[0].nr_pcp;
            assert!(on_lists > 0 && on_lists < 512, "{on_lists}");
            let drains0 = a.vm_events().get(VmEvent::DrainAll);
            let hooks = SeeLists {
                a: &a,
                calls: core::cell::Cell::new(0),
                pcp_at_first_call: core::cell::Cell::new(0),
            };
            let big = a.alloc_pages(Gfp::MOVABLE, 9, &hooks).unwrap();
            assert_eq!(big.get(), 2048, "{merge:?}");
            assert!(hooks.calls.get() > 0, "{merge:?}: compaction was not tried");
            assert_eq!(
                hooks.pcp_at_first_call.get(),
                on_lists,
                "{merge:?}: the lists were drained before compaction"
            );
            assert_eq!(a.vm_events().get(VmEvent::DrainAll), drains0 + 1);
            a.free_pages(big, 9).unwrap();
            for p in held {
                a.free_pages(p, 0).unwrap();
            }
            a.check().unwrap();
        }
    }

    fn order10_blocks(a: &PageAlloc<TestPlatform>) -> u64 {
        a.zone_info()[0].free_blocks[MAX_ORDER as usize]
            .iter()
            .sum()
    }

    #[test]
    fn batch_size_follows_linux() {
        assert_eq!(zone_batchsize(262_144), 63); // 1 GiB
        assert_eq!(zone_batchsize(16_384), 3); // 64 MiB
    }

    #[test]
    fn starts_with_all_memory_in_max_order_blocks() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Eager,
            RefillPolicy::PageByPage,
            4096,
        );
        assert_eq!(a.nr_free_pages(), 4096);
        assert_eq!(order10_blocks(&a), 4);
        a.check().unwrap();
    }

    #[test]
    fn odd_sized_zone_is_covered_by_aligned_blocks() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Eager,
            RefillPolicy::PageByPage,
            1024 + 512 + 3,
        );
        assert_eq!(a.nr_free_pages(), 1539);
        a.check().unwrap();
    }

    #[test]
    fn eager_free_merges_back_to_max_order() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Eager,
            RefillPolicy::PageByPage,
            2048,
        );
        let pfns: std::vec::Vec<Pfn> = (0..100)
            .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
            .collect();
        assert!(order10_blocks(&a) < 2);
        for p in pfns {
            a.free_pages(p, 0).unwrap();
        }
        assert_eq!(order10_blocks(&a), 2);
        a.check().unwrap();
    }

    #[test]
    fn lazy_free_skips_merge_until_needed() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Lazy,
            RefillPolicy::PageByPage,
            4096,
        );
        let pfns: std::vec::Vec<Pfn> = (0..2048)
            .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
            .collect();
        for p in pfns {
            a.free_pages(p, 0).unwrap();
        }
        let zi = &a.zone_info()[0];
        assert_eq!(zi.nr_unmerged, 2048);
        assert_eq!(order10_blocks(&a), 2);
        a.check().unwrap();
        // Three order-10 requests: two blocks are whole, the third must come from merging.
        let x: std::vec::Vec<Pfn> = (0..3)
            .map(|_| a.alloc_pages(Gfp::MOVABLE, 10, &NoHooks).unwrap())
            .collect();
        assert!(x[0] != x[1] && x[1] != x[2]);
        assert_eq!(a.zone_info()[0].nr_unmerged, 0);
        assert!(a.vm_events().get(VmEvent::MergeOnDemand) >= 1);
        a.check().unwrap();
    }

    #[test]
    fn unmovable_fallback_steals_a_pageblock() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Eager,
            RefillPolicy::PageByPage,
            2048,
        );
        assert_eq!(
            a.zone_info()[0].pageblocks[MigrateType::Unmovable as usize],
            0
        );
        let p = a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).unwrap();
        let zi = &a.zone_info()[0];
        // The fallback found an order-10 block and took both its pageblocks.
        assert_eq!(
            zi.pageblocks[MigrateType::Unmovable as usize],
            2,
            "whole block stolen"
        );
        assert!(a.vm_events().get(VmEvent::AllocFallback) >= 1);
        // The next unmovable allocation comes from the stolen pageblock, without fallback.
        let before = a.vm_events().get(VmEvent::AllocFallback);
        let q = a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).unwrap();
        assert_eq!(a.vm_events().get(VmEvent::AllocFallback), before);
        assert_eq!(p.get() >> PAGEBLOCK_ORDER, q.get() >> PAGEBLOCK_ORDER);
        a.check().unwrap();
    }

    #[test]
    fn kernel_stops_at_min_watermark_atomic_dips_below_boundedly() {
        let a = pa(
            PcpPolicy::Off,
            MergePolicy::Eager,
            RefillPolicy::PageByPage,
            4096,
        );
        let min = a.zone_info()[0].wmark[0];
        let mut n = 0;
        while a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).is_ok() {
            n += 1;
        }
        let left = a.nr_free_pages();
        assert!(left >= min, "KERNEL went below min: {left} < {min}");
        let mut extra = 0;
        while a.alloc_pages(Gfp::ATOMIC, 0, &NoHooks).is_ok() {
            extra += 1;
        }
        assert!(extra > 0, "ATOMIC got nothing below min");
        assert!(a.nr_free_pages() > 0, "ATOMIC emptied the reserve");
        assert!(n > 0);
        a.check().unwrap();
    }

    #[test]
    fn refused_frees_change_nothing() {
        let a = pa(
            PcpPolicy::On,
            MergePolicy::Lazy,
            RefillPolicy::Cluster,
            4096,
        );
        let p = a.alloc_pages(Gfp::KERNEL, 3, &NoHooks).unwrap();
        let free = a.nr_free_pages();
        assert_eq!(
            a.free_pages(p, 2),
            Err(FreeError::WrongOrder { allocated: 3 })
        );
        let r = a.free_pages(p, 4);
        assert!(
            matches!(
                r,
                Err(FreeError::Misaligned) | Err(FreeError::WrongOrder { allocated: 3 })
            ),
            "{r:?}"
        );
        assert_eq!(
            a.free_pages(Pfn::new(p.get() + 1), 0),
            Err(FreeError::NotAllocated)
        );
        assert_eq!(a.free_pages(Pfn::new(4096), 0), Err(FreeError::OutOfRange));
        assert_eq!(a.free_pages(p, 11), Err(FreeError::InvalidOrder));
        assert_eq!(a.nr_free_pages(), free);
        a.check().unwrap();
        a.free_pages(p, 3).unwrap();
        assert_eq!(a.free_pages(p, 3), Err(FreeError::NotAllocated));
        a.check().unwrap();
    }

    #[test]
    fn cluster_refill_and_free_keep_blocks_whole() {
        let cfg = Config {
            pcp_batch: Some(63),
            ..Config::default()
        };
        let a = PageAlloc::<TestPlatform>::new(cfg, 4096).unwrap();
        let pfns: std::vec::Vec<Pfn> = (0..500)
            .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
            .collect();
        for p in &pfns {
            a.free_pages(*p, 0).unwrap();
        }
        a.drain_all_pages();
        a.check().unwrap();
        // Runs went back as aligned blocks, so little is left unmerged.
        assert!(
            a.zone_info()[0].nr_unmerged < 64,
            "{}",
            a.zone_info()[0].nr_unmerged
        );
        assert_eq!(a.nr_free_pages(), 4096);
    }

    #[test]
    fn pcp_ring_is_lifo_at_the_hot_end_fifo_at_the_cold_end() {
        let mut l = PcpList::new(4);
        for i in 0..4 {
            l.push(i);
        }
        assert!(l.is_full());
        assert_eq!(l.pop(), Some(3));
        assert_eq!(l.pop_cold(), Some(0));
        l.push(9);
        l.push(10);
        assert_eq!(l.iter().collect::<std::vec::Vec<_>>(), [1, 2, 9, 10]);
    }
}
