//! The page allocator (Linux's `mm/page_alloc.c`): the entry points and the
//! fast path. One job per file:
//!
//! - `mod.rs` (here): `PageAlloc`, `alloc_pages` / `alloc_pages_bulk` and their
//!   owned forms, `get_page_from_freelist` -> `rmqueue` (per-CPU list or buddy),
//!   statistics and the zone views.
//! - [`pcplist`]: the per-CPU lists and their lock-free caches: refill
//!   (`rmqueue_bulk`, cluster refill), free (`free_unref_page_commit`), drain
//!   (`free_pcppages_bulk`, `drain_all_pages`), auto-tuned `high`.
//! - [`slowpath`]: `__alloc_pages_slowpath`: min watermark, drain, merge on
//!   demand, compaction and reclaim hooks, high-atomic unreserve.
//! - [`free`]: validation of frees, ownership (`Claim`), reference counts.
//! - [`check`]: the invariant walk.
//!
//! Fast path (Linux's `get_page_from_freelist`): for orders 0..=3 pop the CPU's
//! cache or list, for higher orders the zone's buddy lists. The zone's free count
//! is checked against the low watermark before a per-CPU list or cache is
//! touched (Linux's `zone_watermark_fast`), and a refill takes at most the
//! zone's headroom above the request's mark under the zone lock: pages parked on
//! per-CPU lists are never handed out below the watermark, and `Gfp::KERNEL`
//! never takes the zone below min on any path. The slow path drains every CPU's
//! lists and caches before it reports out of memory, so the pages a `KERNEL`
//! request can have are exactly the free pages above min, wherever they sit.
//!
//! Ownership: a block allocated for the layer above's own use
//! (`alloc_owned_pages`: an address space's data and table pages) carries
//! `PG_OWNED`; a caller's `free_pages` (`Claim::User`) refuses it.
//!
//! Locking: per-CPU lock, then zone lock. `check` takes every per-CPU lock of a zone
//! and then its zone lock.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::compaction::{CompactPriority, CompactResult};
use crate::config::{Config, PcpHighPolicy, PcpPolicy};
use crate::gfp::{
    AllocContext, Gfp, MigrateType, ALLOC_HARDER, ALLOC_WMARK_LOW, ALLOC_WMARK_MASK,
    MIGRATE_PCPTYPES, MIGRATE_TYPES,
};
use crate::node::{Distances, NodeMask, NodeStates, Zonelists, MAX_NUMNODES};
use crate::page::{
    mk_flags, Page, PageState, Pfn, MAX_ORDER, NR_ORDERS, PAGEBLOCK_NR_PAGES, PAGEBLOCK_ORDER,
    PG_OWNED,
};
use crate::pcp::{PerCpuPages, PCP_MAX_ORDER};
use crate::pcp_cache::{PcpCacheTable, PCP_CACHE_SLOTS};
use crate::platform::Platform;
use crate::stat::{AtomicEvents, LockStats, VmEvent, VmEvents};
use crate::zone::{MemMap, Span, Zone};
use numa::{node_allowed, NumaCounters};
pub use numa::{NodeReq, NumaStat, NumaStats};

/// Highest order that is cheap to satisfy (Linux's `PAGE_ALLOC_COSTLY_ORDER`):
/// the highest order with per-CPU lists; above it the slow path compacts before
/// it drains the lists, the fragmentation index is consulted, and requests may
/// fail rather than retry compaction at every priority.
pub const PAGE_ALLOC_COSTLY_ORDER: u32 = PCP_MAX_ORDER;

mod check;
mod extfrag;
mod free;
mod numa;
mod pcplist;
mod slowpath;
#[cfg(test)]
mod tests;

/// Why an allocation failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// No block of the order could be had after draining, merging and the hooks.
    NoMemory,
    /// The order is above `MAX_ORDER`.
    InvalidOrder,
    /// The preferred node is not one of this allocator's, or the nodemask holds
    /// none of them.
    BadNode,
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
    /// Wake the background compactor for a request of `order` (> 0).
    fn wake_kcompactd(&self, _order: u32) {}
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
    /// Could direct reclaim free anything at all (Linux's "reclaimable pages"
    /// in `should_reclaim_retry`): while it could, a small request keeps
    /// retrying until reclaim stops making progress.
    fn can_reclaim(&self) -> bool {
        false
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
    /// The node the zone belongs to.
    pub node: usize,
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
    /// Each node's fallback order (one zone per node: zone index == node id).
    zonelists: Zonelists,
    /// Per-CPU NUMA counters, `[cpu * nr_nodes + node]`; empty with one node
    /// (then every allocation is a local hit, derived on read).
    numa: Box<[NumaCounters]>,
    ncpu: usize,
    nr_pages: u64,
}

/// The event of a watermark check that failed for `alloc_flags`.
#[inline]
pub(super) fn wmark_fail_event(alloc_flags: u32) -> VmEvent {
    if alloc_flags & ALLOC_WMARK_MASK == ALLOC_WMARK_LOW {
        VmEvent::WmarkLowFail
    } else {
        VmEvent::WmarkMinFail
    }
}

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
    /// in one zone on one node. `nr_pages` must be at least one pageblock and fit
    /// `u32`.
    pub fn new(cfg: Config, nr_pages: u64) -> Result<Self, &'static str> {
        let one = Zonelists::build(
            &Distances::uniform(1),
            &NodeStates {
                memory: NodeMask::first_n(1),
                cpu: NodeMask::first_n(1),
            },
        );
        Self::with_nodes(cfg, &[nr_pages], one)
    }

    /// Builds an allocator over consecutive nodes: node `i` holds `node_pages[i]`
    /// frames, right after node `i - 1`'s, in one zone of its own (Linux's
    /// ZONE_NORMAL per pgdat) with its own watermarks (its share of the total),
    /// free lists, statistics, per-CPU lists and caches. Every node but the last
    /// must be a multiple of a MAX_ORDER block (buddies never straddle nodes),
    /// each at least one pageblock; `zonelists` gives each node's fallback order
    /// and must have one entry per node.
    pub fn with_nodes(
        cfg: Config,
        node_pages: &[u64],
        zonelists: Zonelists,
    ) -> Result<Self, &'static str> {
        let nr_nodes = node_pages.len();
        if nr_nodes == 0 || nr_nodes > MAX_NUMNODES {
            return Err("need between 1 and 64 nodes");
        }
        if zonelists.nr_nodes() != nr_nodes
            || (0..nr_nodes).any(|n| zonelists.fallback_order(n).first() != Some(&n))
        {
            return Err("zonelists must cover every node, each starting with itself");
        }
        if node_pages.iter().any(|&p| p < PAGEBLOCK_NR_PAGES as u64) {
            return Err("memory too small: need at least one pageblock (2 MiB) per node");
        }
        if node_pages[..nr_nodes - 1]
            .iter()
            .any(|&p| p % (1u64 << MAX_ORDER) != 0)
        {
            return Err("every node but the last must be a multiple of a MAX_ORDER block (4 MiB)");
        }
        let nr_pages: u64 = node_pages.iter().sum();
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
        let ncpu = cfg.nr_cpus;
        let mut zones = Vec::with_capacity(nr_nodes);
        let mut pcp = Vec::new();
        let mut start = 0u64;
        for &np in node_pages {
            let span = Span {
                start: start as u32,
                end: (start + np) as u32,
            };
            start += np;
            zones.push(Zone::<P>::new("Normal", span, np, nr_pages));
            let batch = cfg.pcp_batch.unwrap_or_else(|| zone_batchsize(np)).max(1);
            let high_min = 6 * batch;
            let high_max = match cfg.pcp_high {
                PcpHighPolicy::Fixed => high_min,
                PcpHighPolicy::Auto => ((np / 8 / ncpu as u64) as u32).min(16384).max(high_min),
            };
            if cfg.pcp == PcpPolicy::On {
                pcp.extend((0..ncpu).map(|_| PerCpuPages::new(batch, high_min, high_max)));
            }
        }
        let zones: Box<[Zone<P>]> = zones.into_boxed_slice();
        let pcp: Box<[PerCpuPages]> = pcp.into_boxed_slice();
        let events: Box<[AtomicEvents]> = (0..ncpu).map(|_| AtomicEvents::new()).collect();
        let caches = (!pcp.is_empty() && cfg.pcp_cache && P::cache_ops_available())
            .then(|| PcpCacheTable::new(zones.len(), ncpu));
        let numa: Box<[NumaCounters]> = if nr_nodes > 1 {
            (0..ncpu * nr_nodes)
                .map(|_| NumaCounters::default())
                .collect()
        } else {
            Box::default()
        };
        let pa = PageAlloc {
            cfg,
            mem,
            zones,
            pcp,
            caches,
            events,
            zonelists,
            numa,
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

    /// Memory nodes (Linux's `nr_online_nodes`). Per-node state of the layers
    /// above (LRU lists, kswapd, kcompactd) is indexed `0..nr_nodes()`.
    pub fn nr_nodes(&self) -> usize {
        self.zones.len()
    }

    /// The node of a frame (Linux's `pfn_to_nid`); `0..nr_nodes()`.
    #[inline]
    pub fn pfn_to_nid(&self, pfn: Pfn) -> usize {
        self.zone_of(pfn.get().min(u32::MAX as u64) as u32)
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
        // Spans are consecutive: the last zone starting at or below `idx`.
        self.zones
            .iter()
            .rposition(|z| z.span.start <= idx)
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
        let one_zone = order == 0 && self.zones.len() == 1;
        if one_zone {
            // One node: its zone is the whole zonelist and every nodemask allows
            // it, so the cache hit needs no allocation context (and counts no
            // NUMA statistics, derived on read with one node).
            let mt = gfp.migratetype() as usize;
            if let Some(idx) = self.cache_pop_first_zone(mt) {
                return Ok(self.prep_new_page(idx, 0, mt, pg));
            }
        }
        self.alloc_pages_ac(&AllocContext::new(gfp), order, hooks, pg, !one_zone)
    }

    /// The allocation proper (Linux's `__alloc_pages`): the fast path along the
    /// zonelist of `ac`'s preferred node (within its nodemask), then the slow path.
    /// `try_cache`: false when the caller has just missed the cache.
    #[inline(always)]
    fn alloc_pages_ac(
        &self,
        ac: &AllocContext,
        order: u32,
        hooks: &impl SlowPathHooks,
        pg: u32,
        try_cache: bool,
    ) -> Result<Pfn, AllocError> {
        if order > MAX_ORDER {
            return Err(AllocError::InvalidOrder);
        }
        if try_cache && order == 0 && ac.mt < MIGRATE_PCPTYPES {
            if let Some(c) = &self.caches {
                // The first zone above its mark serves the request: on a cache
                // miss its per-CPU list and buddy lists are next, before any
                // farther zone (`get_page_from_freelist`).
                for &z in self.zonelist(ac) {
                    if !node_allowed(ac, z) || !self.zones[z].watermark_ok(0, ALLOC_WMARK_LOW) {
                        continue;
                    }
                    if let Some(idx) = c.pop::<P>(z, ac.mt) {
                        self.zone_statistics(ac, z, 1);
                        return Ok(self.prep_new_page(idx, 0, ac.mt, pg));
                    }
                    break;
                }
            }
        }
        if let Some(idx) = self.get_page_from_freelist(order, ALLOC_WMARK_LOW, ac) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        self.alloc_slowpath(order, ac, hooks, pg)
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
        self.alloc_pages_bulk_ac(&AllocContext::new(gfp), out, pg)
    }

    /// `alloc_pages_bulk` for the context `ac` (its zonelist and nodemask).
    #[inline(always)]
    fn alloc_pages_bulk_ac(&self, ac: &AllocContext, out: &mut [Pfn], pg: u32) -> usize {
        let mut n = 0;
        if !self.pcp.is_empty() && ac.mt < MIGRATE_PCPTYPES {
            // Zone by zone along the zonelist: the cache first (it holds the
            // pages that come next off the list), then the per-CPU list.
            for &z in self.zonelist(ac) {
                if n == out.len() {
                    break;
                }
                if !node_allowed(ac, z) {
                    continue;
                }
                if let Some(c) = &self.caches {
                    if self.zones[z].watermark_ok(0, ALLOC_WMARK_LOW) {
                        let mut buf = [0u32; PCP_CACHE_SLOTS];
                        let want = (out.len() - n).min(PCP_CACHE_SLOTS);
                        let got = c.pop_many::<P>(z, ac.mt, &mut buf[..want]);
                        for (o, &idx) in out[n..n + got].iter_mut().zip(&buf[..got]) {
                            *o = Pfn::new(idx as u64);
                        }
                        n += got;
                        self.zone_statistics(ac, z, got as u64);
                        if n == out.len() {
                            break;
                        }
                    }
                }
                let Some(mut g) = self.pcp_trylock(z) else {
                    continue;
                };
                let before = n;
                while n < out.len() {
                    match self.rmqueue_pcplist(z, &mut g, 0, ac.mt, ALLOC_WMARK_LOW) {
                        Some(idx) => out[n] = Pfn::new(idx as u64),
                        None => break,
                    }
                    n += 1;
                }
                drop(g);
                self.zone_statistics(ac, z, (n - before) as u64);
                if n == out.len() {
                    break;
                }
            }
        } else {
            while n < out.len() {
                match self.get_page_from_freelist(0, ALLOC_WMARK_LOW, ac) {
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
        for &z in self.zonelist(ac) {
            if !node_allowed(ac, z) {
                continue;
            }
            if let Some(idx) = self.rmqueue(z, order, alloc_flags, ac) {
                self.zone_statistics(ac, z, 1);
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
        for c in self.numa.iter() {
            c.reset();
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
                node: zi,
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
}

// The pageblock order must let a pageblock hold whole per-CPU blocks.
const _: () = assert!(PAGEBLOCK_ORDER > PCP_MAX_ORDER);
