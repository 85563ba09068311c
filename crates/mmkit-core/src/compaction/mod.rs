//! Compaction's free-page side (the half of Linux's `mm/compaction.c` that works
//! on the memmap and the buddy lists): the two scanners, isolation of free pages
//! as migration targets, giving back what was not used, freeing migrated sources
//! merged (with capture for a direct compactor), the end-of-compaction test, the
//! fragmentation index and score, and deferral.
//!
//! What moves pages lives above (`mmkit`'s `compaction.rs`/`migrate.rs`): the core
//! knows no address spaces. It offers *candidates* — allocated order-0 blocks of
//! migratetype Movable whose owner set a reverse map (`Page::mapping != 0`) — and
//! the layer above migrates those it can through its reverse map.
//!
//! Scanners (Linux's): the migrate scanner walks the zone upwards from its start, a
//! pageblock per call, the free scanner walks it downwards from its end, a pageblock
//! at a time; a run ends when they meet. For a request of order `o` the migrate
//! scanner skips every `o`-aligned block holding a page it cannot move (an
//! unmovable or reserved page, a huge page, a page without reverse map): migrating
//! its other pages could not free it (Linux's `skip_on_failure`). The free scanner
//! takes free blocks only from Movable pageblocks, never from a pageblock that is
//! free as a whole, and splits them into order-0 pages in state `Alloc` (owned by the
//! compactor, so `check()` stays clean while they are out). The scanners' positions
//! are cached per zone so that successive direct compactions go on where the last
//! stopped; they restart from the zone's ends once they met.
//!
//! Deferral (Linux's `defer_compaction`/`compaction_deferred`): after a run that
//! went through the whole zone without success ([`CompactResult::Complete`]),
//! compaction of that order and above is skipped for the next 2^shift requests
//! (shift 1..=6, growing with each failure) and reset by a success. A run whose
//! scanners met after starting from cached positions did not look at the whole
//! zone ([`CompactResult::PartialSkipped`]); it defers nothing, and the next run
//! starts from the zone's ends.
//!
//! Priorities (Linux's `enum compact_priority`, reduced): the slow path compacts
//! at [`CompactPriority::Async`] first and raises the priority while compaction
//! failed or withdrew ([`should_compact_retry`]); only the highest,
//! [`CompactPriority::SyncFull`], which requests above the costly order never
//! reach, starts from the zone's ends and ignores deferral. Migration in mmkit
//! never waits for a lock at any priority, so the priorities differ in that only.
//!
//! Invariants: a page isolated as a target is `Alloc` order 0 Movable, refcount 1,
//! mapping 0, and on no list; it goes back with `release_freepages` (merged). A
//! migrated source is freed only when its last reference goes (`put_sources`), into
//! the buddy lists directly and merged, never to a per-CPU list.
//!
//! Locking: the migrate scanner reads descriptors without any lock (a racy
//! snapshot; the layer above validates each candidate under its own locks). The free
//! scanner, the frees and the finished test take the zone lock, a pageblock (or 256
//! pages) per hold. Deferral state and counters are atomics. Nothing here takes a
//! per-CPU lock, except `drain_all_pages` (per-CPU lock, then zone lock).

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::gfp::{MigrateType, MIGRATE_PCPTYPES};
use crate::page::{
    fl_mt, fl_order, fl_state, mk_flags, PageState, Pfn, MAX_ORDER, NR_ORDERS, PAGEBLOCK_NR_PAGES,
    PAGEBLOCK_ORDER, PG_OWNED,
};
use crate::page_alloc::PageAlloc;
use crate::page_alloc::PAGE_ALLOC_COSTLY_ORDER;
use crate::platform::Platform;
use crate::stat::VmEvent;

/// Pages migrated per batch (Linux's `COMPACT_CLUSTER_MAX`).
pub const COMPACT_CLUSTER_MAX: usize = 32;
/// Largest deferral shift: compaction is retried at least once every 64 requests.
pub const COMPACT_MAX_DEFER_SHIFT: u32 = 6;
/// Linux's `sysctl_extfrag_threshold`: above this fragmentation index a failure
/// is due to fragmentation (compaction helps), at or below to lack of memory.
pub const EXTFRAG_THRESHOLD: i32 = 500;
/// Linux's default `vm.compaction_proactiveness`.
pub const DEFAULT_PROACTIVENESS: u32 = 20;
/// Free blocks of the woken order a kcompactd run builds before it stops
/// (Linux's kcompactd stops at one). The requests that woke it keep coming: with
/// one block, each finds the block taken by the one before and compacts itself.
pub const KCOMPACTD_GOAL_BLOCKS: u32 = 8;
const PB: u32 = PAGEBLOCK_NR_PAGES as u32;
/// Pages freed per zone-lock hold when giving pages back.
const FREE_CHUNK: usize = 256;

/// How a compaction run ended (Linux's `enum compact_result`, reduced), in
/// Linux's order: of the results of several zones, the largest is the one reported.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompactResult {
    /// Not run: too little free memory, or the failure is not fragmentation
    /// (compaction cannot help without reclaim).
    Skipped,
    /// Not run: compaction of the order is deferred after failures.
    Deferred,
    /// The scanners met without success in a run over the whole zone.
    Complete,
    /// The scanners met without success, but the run started from cached scanner
    /// positions, so part of the zone was not looked at; the next run starts from
    /// the zone's ends.
    PartialSkipped,
    /// A free block of the order is there (or, for a whole-zone run, the goal
    /// was reached).
    Success,
}

/// How hard a direct compaction tries (Linux's `enum compact_priority`); a lower
/// value is a higher priority, as in Linux.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompactPriority {
    /// The last resort for orders up to `PAGE_ALLOC_COSTLY_ORDER` (3): from the
    /// zone's ends, not skipped by deferral (Linux's `MIN_COMPACT_PRIORITY`).
    SyncFull = 0,
    /// From the cached scanner positions, skipped while deferred (Linux's
    /// `DEF_COMPACT_PRIORITY`, and `MIN_COMPACT_COSTLY_PRIORITY` above the
    /// costly order).
    SyncLight = 1,
    /// The first try of an allocation: from the cached scanner positions,
    /// skipped while deferred (Linux's `INIT_COMPACT_PRIORITY`).
    Async = 2,
}

impl CompactPriority {
    /// The priority of the first direct compaction of a request.
    pub const INIT: CompactPriority = CompactPriority::Async;
    /// Linux's `DEF_COMPACT_PRIORITY`: a single direct run outside an allocation.
    pub const DEF: CompactPriority = CompactPriority::SyncLight;

    /// The highest priority a request of `order` may reach (Linux's
    /// `MIN_COMPACT_PRIORITY` / `MIN_COMPACT_COSTLY_PRIORITY`): costly orders are
    /// allowed to fail, so they never run a deferral-ignoring whole-zone pass.
    pub const fn min_for(order: u32) -> CompactPriority {
        if order > PAGE_ALLOC_COSTLY_ORDER {
            CompactPriority::SyncLight
        } else {
            CompactPriority::SyncFull
        }
    }

    /// The next higher priority, if any.
    pub const fn raised(self) -> Option<CompactPriority> {
        match self {
            CompactPriority::Async => Some(CompactPriority::SyncLight),
            CompactPriority::SyncLight => Some(CompactPriority::SyncFull),
            CompactPriority::SyncFull => None,
        }
    }
}

/// Retries of a request after compaction succeeded but the block was taken by
/// someone else (Linux's `MAX_COMPACT_RETRIES`; a quarter of it above the costly
/// order).
pub const MAX_COMPACT_RETRIES: u32 = 16;

/// Linux's `should_compact_retry`: after direct compaction of `order` ended in
/// `result` and the allocation still failed, should the slow path compact again?
/// Raises `prio` (and resets `retries`) when compaction failed or withdrew
/// (deferred, or its scanners met without seeing the whole zone); counts a
/// success whose block went to someone else against [`MAX_COMPACT_RETRIES`]; gives
/// up when compaction was skipped (only reclaim could help) or the highest
/// priority allowed for the order already failed.
pub fn should_compact_retry(
    order: u32,
    result: CompactResult,
    prio: &mut CompactPriority,
    retries: &mut u32,
) -> bool {
    if order == 0 {
        return false;
    }
    match result {
        CompactResult::Skipped => return false,
        CompactResult::Success => {
            let max = if order > PAGE_ALLOC_COSTLY_ORDER {
                MAX_COMPACT_RETRIES / 4
            } else {
                MAX_COMPACT_RETRIES
            };
            *retries += 1;
            if *retries <= max {
                return true;
            }
        }
        CompactResult::Deferred | CompactResult::PartialSkipped | CompactResult::Complete => {}
    }
    match prio.raised() {
        Some(p) if p >= CompactPriority::min_for(order) => {
            *prio = p;
            *retries = 0;
            true
        }
        _ => false,
    }
}

/// Per-zone compaction state: deferral, cached scanner positions, counters.
pub struct CompactState {
    considered: AtomicU32,
    defer_shift: AtomicU32,
    order_failed: AtomicU32,
    cached_migrate_pfn: AtomicU32,
    cached_free_pfn: AtomicU32,
    success: [AtomicU64; NR_ORDERS],
    fail: [AtomicU64; NR_ORDERS],
    deferred: [AtomicU64; NR_ORDERS],
    start: u32,
    end: u32,
}

impl CompactState {
    pub(crate) fn new(start: u32, end: u32) -> Self {
        CompactState {
            considered: AtomicU32::new(0),
            defer_shift: AtomicU32::new(0),
            order_failed: AtomicU32::new(0),
            cached_migrate_pfn: AtomicU32::new(start),
            cached_free_pfn: AtomicU32::new(last_block(start, end)),
            success: core::array::from_fn(|_| AtomicU64::new(0)),
            fail: core::array::from_fn(|_| AtomicU64::new(0)),
            deferred: core::array::from_fn(|_| AtomicU64::new(0)),
            start,
            end,
        }
    }

    pub(crate) fn reset_counters(&self) {
        for a in self
            .success
            .iter()
            .chain(self.fail.iter())
            .chain(self.deferred.iter())
        {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// Start of the last pageblock of `[start, end)` (the free scanner's first block).
fn last_block(start: u32, end: u32) -> u32 {
    if end <= start {
        return start;
    }
    ((end - 1) & !(PB - 1)).max(start)
}

/// Who runs a compaction, which decides what it scans.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum CompactMode {
    /// An allocating task (direct compaction): takes sources only from pageblocks
    /// of the request's migratetype, starts from the cached scanner positions, and
    /// captures the first block of the requested order it frees.
    Direct,
    /// The background thread (kcompactd) for an order: every pageblock, cached
    /// positions, no capture.
    Background,
    /// The whole zone from both ends (proactive compaction, or a manual request):
    /// every pageblock, every movable page, no capture.
    Full,
}

/// One compaction run in one zone (Linux's `struct compact_control`).
#[derive(Debug)]
pub struct CompactControl {
    /// The zone compacted.
    pub zone: usize,
    /// The order worked for; `None` for a whole-zone (proactive / manual) run.
    pub order: Option<u32>,
    pub(crate) mt: usize,
    /// Who runs it.
    pub mode: CompactMode,
    /// Next pfn the migrate scanner looks at.
    pub migrate_pfn: u32,
    /// Start of the pageblock the free scanner looks at next (it goes down).
    pub free_pfn: u32,
    /// The free scanner went below the zone's start.
    free_done: bool,
    /// The scanners started from the zone's ends (not from cached positions).
    pub whole_zone: bool,
    /// The block captured for a direct compactor (already `Alloc`).
    pub captured: Option<Pfn>,
    /// Free blocks of `order` the run is done at (1 for direct compaction, which
    /// wants one block; kcompactd builds a few ahead of the requests).
    pub goal_blocks: u32,
    /// Pages looked at by the migrate scanner in this run.
    pub migrate_scanned: u64,
    /// Pages looked at by the free scanner in this run.
    pub free_scanned: u64,
    /// Free pages isolated as targets in this run.
    pub free_isolated: u64,
}

impl CompactControl {
    /// Have the scanners met (Linux's `compact_scanners_met`)?
    pub fn scanners_met(&self) -> bool {
        self.free_done || (self.free_pfn / PB) <= (self.migrate_pfn / PB)
    }
}

/// What the layer above needs to know about a zone's deferral state and results.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Direct compactions that succeeded, per order.
    pub success: [u64; NR_ORDERS],
    /// Direct compactions that failed, per order.
    pub fail: [u64; NR_ORDERS],
    /// Direct compactions skipped by deferral, per order.
    pub deferred: [u64; NR_ORDERS],
    /// Current deferral shift (requests skipped: up to 2^shift - 1).
    pub defer_shift: u32,
    /// Lowest order whose compaction failed since the last success.
    pub order_failed: u32,
}

impl<P: Platform> PageAlloc<P> {
    /// Number of zones (compaction works zone by zone).
    pub fn nr_zones(&self) -> usize {
        self.zones.len()
    }

    /// Linux's `compaction_deferred`: should this request skip compaction of
    /// `order` in `zone`? Counts the skip.
    pub fn compaction_deferred(&self, zone: usize, order: u32) -> bool {
        let cs = &self.zones[zone].compact;
        if order < cs.order_failed.load(Ordering::Relaxed) {
            return false;
        }
        let limit = 1u32 << cs.defer_shift.load(Ordering::Relaxed);
        let c = cs.considered.fetch_add(1, Ordering::Relaxed) + 1;
        if c >= limit {
            cs.considered.store(limit, Ordering::Relaxed);
            return false;
        }
        cs.deferred[(order as usize).min(NR_ORDERS - 1)].fetch_add(1, Ordering::Relaxed);
        self.count_vm_event(VmEvent::CompactDeferred, 1);
        true
    }

    /// Linux's `defer_compaction`: a run of `order` failed; skip the next ones.
    pub fn defer_compaction(&self, zone: usize, order: u32) {
        let cs = &self.zones[zone].compact;
        cs.considered.store(0, Ordering::Relaxed);
        let s = cs.defer_shift.load(Ordering::Relaxed);
        cs.defer_shift
            .store((s + 1).min(COMPACT_MAX_DEFER_SHIFT), Ordering::Relaxed);
        cs.order_failed.fetch_min(order, Ordering::Relaxed);
    }

    /// Linux's `compaction_defer_reset`: a run of `order` succeeded (and the
    /// allocation too, if `alloc_success`).
    pub fn compaction_defer_reset(&self, zone: usize, order: u32, alloc_success: bool) {
        let cs = &self.zones[zone].compact;
        if alloc_success {
            cs.considered.store(0, Ordering::Relaxed);
            cs.defer_shift.store(0, Ordering::Relaxed);
        }
        cs.order_failed.fetch_max(order + 1, Ordering::Relaxed);
    }

    /// Records the outcome of one direct compaction (a stall) of `order`.
    pub fn record_compaction(&self, zone: usize, order: u32, success: bool) {
        let cs = &self.zones[zone].compact;
        let o = (order as usize).min(NR_ORDERS - 1);
        self.count_vm_event(VmEvent::CompactStall, 1);
        if success {
            cs.success[o].fetch_add(1, Ordering::Relaxed);
            self.count_vm_event(VmEvent::CompactSuccess, 1);
        } else {
            cs.fail[o].fetch_add(1, Ordering::Relaxed);
            self.count_vm_event(VmEvent::CompactFail, 1);
        }
    }

    /// Deferral state and per-order results of a zone.
    pub fn compaction_stats(&self, zone: usize) -> CompactStats {
        let cs = &self.zones[zone].compact;
        let ld =
            |a: &[AtomicU64; NR_ORDERS]| core::array::from_fn(|i| a[i].load(Ordering::Relaxed));
        CompactStats {
            success: ld(&cs.success),
            fail: ld(&cs.fail),
            deferred: ld(&cs.deferred),
            defer_shift: cs.defer_shift.load(Ordering::Relaxed),
            order_failed: cs.order_failed.load(Ordering::Relaxed),
        }
    }

    /// Linux's proactive-compaction score of a zone (`extfrag_for_order` at the
    /// pageblock order): the percentage of its free memory not in free blocks of at
    /// least a pageblock. 0 when nothing is free.
    pub fn fragmentation_score(&self, zone: usize) -> u32 {
        let (pages, _, _, suitable_pages) = self.contig_page_info(zone, PAGEBLOCK_ORDER);
        if pages == 0 {
            return 0;
        }
        ((pages - suitable_pages) * 100 / pages) as u32
    }

    /// The score kcompactd's proactive compaction goes by: Linux's
    /// [`fragmentation_score`](Self::fragmentation_score), except that pages lazy
    /// merging left unmerged are left out when the policy merges on demand (the
    /// cheap merge step, not migration, takes care of them; counting them would
    /// make a background thread merge the lists every half second and take away
    /// what lazy merging saves).
    pub fn proactive_score(&self, zone: usize) -> u32 {
        let (pages, suitable_pages, unmerged) = {
            let g = self.zones[zone].lock();
            let (mut pages, mut suitable) = (0u64, 0u64);
            for (o, row) in g.free_area.iter().enumerate() {
                let n: u64 = row.iter().map(|l| l.nr).sum();
                pages += n << o;
                if o as u32 >= PAGEBLOCK_ORDER {
                    suitable += n << o;
                }
            }
            let unmerged = if g.merge_on_demand { g.nr_unmerged } else { 0 };
            (pages, suitable, unmerged)
        };
        let pages = pages - unmerged.min(pages);
        if pages == 0 {
            return 0;
        }
        (pages.saturating_sub(suitable_pages) * 100 / pages) as u32
    }

    /// Free pages on the buddy lists of a zone (a snapshot).
    pub fn zone_nr_free(&self, zone: usize) -> u64 {
        self.zones[zone].nr_free_mirror.load(Ordering::Relaxed)
    }

    /// The low watermark of a zone.
    pub fn zone_low_wmark(&self, zone: usize) -> u64 {
        self.zones[zone].wmark[1]
    }

    /// Linux's `compaction_suitable`: is there enough free memory to compact for
    /// `order` (the low watermark plus twice the request, for the targets), and —
    /// above the costly order — is a failure due to fragmentation rather than lack
    /// of memory (fragmentation index above [`EXTFRAG_THRESHOLD`])?
    pub fn compaction_suitable(&self, zone: usize, order: u32) -> bool {
        let z = &self.zones[zone];
        let free = z.nr_free_mirror.load(Ordering::Relaxed);
        if free < z.wmark[1] + (2u64 << order) {
            return false;
        }
        if order > PAGE_ALLOC_COSTLY_ORDER {
            let fi = self.fragmentation_index(zone, order);
            if (0..=EXTFRAG_THRESHOLD).contains(&fi) {
                return false;
            }
        }
        true
    }

    /// The cheap first step of compaction: merge what lazy merging left unmerged
    /// in a zone (nothing under `Eager`, nor under `LazyNoMerge`, which never
    /// merges on demand). Returns the pages that were unmerged.
    pub fn compaction_merge(&self, zone: usize) -> u64 {
        let z = &self.zones[zone];
        let mut g = z.lock();
        let n = g.nr_unmerged;
        if n > 0 && g.merge_on_demand {
            g.merge_all(&self.mem, z.span);
            n
        } else {
            0
        }
    }

    /// A compaction run of `order` (`None`: the whole zone) for migratetype `mt`,
    /// from the cached scanner positions (`Direct`, `Background`) or from the
    /// zone's ends (`Full`).
    pub fn compact_control(
        &self,
        zone: usize,
        order: Option<u32>,
        mt: MigrateType,
        mode: CompactMode,
    ) -> CompactControl {
        self.compact_control_from(zone, order, mt, mode, mode == CompactMode::Full)
    }

    /// As [`compact_control`](Self::compact_control), from the zone's ends when
    /// `whole_zone` (Linux's `cc->whole_zone`: the retry of a direct compaction
    /// whose run from the cached positions found nothing).
    pub fn compact_control_from(
        &self,
        zone: usize,
        order: Option<u32>,
        mt: MigrateType,
        mode: CompactMode,
        whole_zone: bool,
    ) -> CompactControl {
        let cs = &self.zones[zone].compact;
        let (mut m, mut f) = (cs.start, last_block(cs.start, cs.end));
        if !whole_zone {
            let (cm, cf) = (
                cs.cached_migrate_pfn.load(Ordering::Relaxed),
                cs.cached_free_pfn.load(Ordering::Relaxed),
            );
            if cf / PB > cm / PB && cm >= cs.start && cf < cs.end {
                (m, f) = (cm, cf);
            }
        }
        let whole_zone = m == cs.start && f == last_block(cs.start, cs.end);
        CompactControl {
            zone,
            order,
            mt: mt as usize,
            mode,
            migrate_pfn: m,
            free_pfn: f,
            free_done: false,
            whole_zone,
            captured: None,
            goal_blocks: 1,
            migrate_scanned: 0,
            free_scanned: 0,
            free_isolated: 0,
        }
    }

    /// Ends a run: stores the scanner positions for the next one (or resets them
    /// when the scanners met) and counts what was scanned.
    pub fn compact_finish(&self, cc: &CompactControl) {
        let cs = &self.zones[cc.zone].compact;
        if cc.mode != CompactMode::Full {
            if cc.scanners_met() {
                cs.cached_migrate_pfn.store(cs.start, Ordering::Relaxed);
                cs.cached_free_pfn
                    .store(last_block(cs.start, cs.end), Ordering::Relaxed);
            } else {
                cs.cached_migrate_pfn
                    .store(cc.migrate_pfn, Ordering::Relaxed);
                cs.cached_free_pfn.store(cc.free_pfn, Ordering::Relaxed);
            }
        }
        self.count_vm_event(VmEvent::CompactMigrateScanned, cc.migrate_scanned);
        self.count_vm_event(VmEvent::CompactFreeScanned, cc.free_scanned);
        self.count_vm_event(VmEvent::CompactFreeIsolated, cc.free_isolated);
    }

    /// The migrate scanner (Linux's `isolate_migratepages`): scans pageblocks from
    /// `cc.migrate_pfn` up until one yields candidates, and appends them to `out`
    /// (ascending pfns). Returns false when the scanners met and nothing was added.
    /// Candidates are a racy snapshot: allocated order-0 Movable pages with a
    /// reverse map; the caller validates each before moving it.
    pub fn isolate_migratepages(&self, cc: &mut CompactControl, out: &mut Vec<Pfn>) -> bool {
        let z = &self.zones[cc.zone];
        let mem = &self.mem;
        let movable = MigrateType::Movable as usize;
        // Granularity of skip-on-failure: the requested order (at most a pageblock).
        let unit = match cc.order {
            Some(o) if o > 0 => 1u32 << o.min(PAGEBLOCK_ORDER),
            _ => 1,
        };
        let skip_on_failure = unit > 1;
        let mut chunk: Vec<Pfn> = Vec::new();
        loop {
            if cc.scanners_met() {
                return false;
            }
            let start = cc.migrate_pfn.max(z.span.start);
            let pb_end = ((start / PB) + 1) * PB;
            let end = pb_end.min(z.span.end);
            cc.migrate_pfn = pb_end;
            cc.migrate_scanned += (end - start) as u64;
            if cc.mode == CompactMode::Direct && mem.pageblock_mt(start) != cc.mt {
                continue;
            }
            let before = out.len();
            let mut u = start & !(unit - 1);
            while u < end {
                let u_end = (u + unit).min(end);
                chunk.clear();
                let mut ok = true;
                let mut i = u.max(start);
                while i < u_end {
                    let p = mem.page(i);
                    let f = p.raw_flags();
                    let st = fl_state(f);
                    if st == PageState::Buddy as u32 {
                        // Racy order: only trust it when it is aligned.
                        let o = fl_order(f).min(MAX_ORDER);
                        i += if i & ((1 << o) - 1) == 0 { 1 << o } else { 1 };
                    } else if st == PageState::Alloc as u32 {
                        let o = fl_order(f).min(MAX_ORDER);
                        if o == 0 && fl_mt(f) == movable && p.mapping.load(Ordering::Relaxed) != 0 {
                            chunk.push(Pfn::new(i as u64));
                            i += 1;
                        } else {
                            if skip_on_failure {
                                ok = false;
                                break;
                            }
                            i += if i & ((1 << o) - 1) == 0 { 1 << o } else { 1 };
                        }
                    } else if st == PageState::Reserved as u32 {
                        if skip_on_failure {
                            ok = false;
                            break;
                        }
                        i += 1;
                    } else {
                        i += 1;
                    }
                }
                if ok {
                    out.extend_from_slice(&chunk);
                }
                u = u_end;
            }
            if out.len() > before {
                return true;
            }
        }
    }

    /// The free scanner (Linux's `isolate_freepages`): isolates the free blocks of
    /// whole pageblocks from `cc.free_pfn` down, split into order-0 pages (state
    /// `Alloc`, Movable, refcount 1, mapping 0), until at least `want` pages were
    /// added to `out` or the scanners met. Only Movable pageblocks that are not
    /// free as a whole are used. Returns the pages added.
    pub fn isolate_freepages(
        &self,
        cc: &mut CompactControl,
        want: usize,
        out: &mut Vec<Pfn>,
    ) -> usize {
        let z = &self.zones[cc.zone];
        let mem = &self.mem;
        let movable = MigrateType::Movable as usize;
        let mut got = 0usize;
        while got < want && !cc.scanners_met() {
            let start = cc.free_pfn.max(z.span.start);
            let end = (cc.free_pfn + PB).min(z.span.end);
            if cc.free_pfn < z.span.start + PB {
                cc.free_done = true;
            } else {
                cc.free_pfn -= PB;
            }
            cc.free_scanned += (end - start) as u64;
            if mem.pageblock_mt(start) != movable {
                continue;
            }
            let mut g = z.lock();
            let mut i = start;
            let mut taken: Vec<(u32, u32)> = Vec::new();
            while i < end {
                let f = mem.page(i).raw_flags();
                let st = fl_state(f);
                if st == PageState::Buddy as u32 {
                    let o = fl_order(f);
                    if o >= PAGEBLOCK_ORDER {
                        // A free pageblock: what compaction is building, not a target.
                        break;
                    }
                    taken.push((i, o));
                    i += 1 << o;
                } else if st == PageState::Alloc as u32 {
                    i += 1 << fl_order(f);
                } else {
                    i += 1;
                }
            }
            // Isolated targets are the library's own: once a migration maps one,
            // only its address space may free it (`PG_OWNED`).
            let flags = mk_flags(PageState::Alloc, 0, movable as u32) | PG_OWNED;
            for &(head, o) in &taken {
                g.del_free(mem, head);
                for j in head..head + (1 << o) {
                    let p = mem.page(j);
                    p.refcount.store(1, Ordering::Relaxed);
                    p.mapping.store(0, Ordering::Relaxed);
                    p.private.store(0, Ordering::Relaxed);
                    p.flags.store(flags, Ordering::Release);
                    out.push(Pfn::new(j as u64));
                }
                got += 1 << o;
            }
            drop(g);
        }
        cc.free_isolated += got as u64;
        got
    }

    /// Gives isolated free pages that were not used back to the buddy lists,
    /// merged (Linux's `release_freepages`). Empties `pages`.
    pub fn release_freepages(&self, zone: usize, pages: &mut Vec<Pfn>) {
        let z = &self.zones[zone];
        pages.sort_unstable();
        for chunk in pages.chunks(FREE_CHUNK) {
            let mut g = z.lock();
            for &pfn in chunk {
                let idx = pfn.get() as u32;
                let p = self.mem.page(idx);
                debug_assert_eq!(fl_state(p.raw_flags()), PageState::Alloc as u32);
                p.refcount.store(0, Ordering::Relaxed);
                p.set_raw_flags(0);
                g.free_one(&self.mem, z.span, idx, 0, true);
            }
        }
        pages.clear();
    }

    /// Drops the mapping's reference of each migrated source page; those whose
    /// last reference it was go to the buddy lists directly, merged. A direct
    /// run (`cc.mode == Direct`) captures the first free block of its order that
    /// this produces. Returns the pages freed.
    pub fn put_sources(&self, cc: &mut CompactControl, sources: &[Pfn]) -> usize {
        let mut to_free: Vec<u32> = Vec::with_capacity(sources.len());
        for &pfn in sources {
            // Someone may still hold a reference; their put_page frees it then.
            if self.put_page_testzero(pfn, Some(0)).is_some() {
                to_free.push(pfn.get() as u32);
            }
        }
        let z = &self.zones[cc.zone];
        let want = match (cc.mode, cc.order) {
            (CompactMode::Direct, Some(o)) => Some(o),
            _ => None,
        };
        for chunk in to_free.chunks(FREE_CHUNK) {
            let mut g = z.lock();
            for &idx in chunk {
                let (head, o) = g.free_one(&self.mem, z.span, idx, 0, true);
                let Some(w) = want else { continue };
                if cc.captured.is_some() || o < w {
                    continue;
                }
                let list_mt = fl_mt(self.mem.page(head).raw_flags());
                if list_mt != cc.mt && o < PAGEBLOCK_ORDER {
                    continue;
                }
                // Capture: take the block off the list for the compactor.
                g.del_free(&self.mem, head);
                if list_mt != cc.mt {
                    let mut pb = head;
                    while pb < head + (1 << o) {
                        self.mem.set_pageblock_mt(pb, cc.mt);
                        pb += PB;
                    }
                }
                g.expand(&self.mem, head, w, o, cc.mt);
                g.events[VmEvent::PgAlloc as usize] += 1;
                cc.captured = Some(self.prep_new_page(head, w, cc.mt, 0));
            }
        }
        to_free.len()
    }

    /// Linux's `compact_finished` for an order: merges what lazy merging left
    /// (merge on demand, when the policy has it) and tells whether `goal_blocks`
    /// free blocks of `order` (a larger block counting as the blocks it splits
    /// into) are now on lists the request can use (its migratetype's, or any list
    /// at pageblock order and above, which a fallback takes whole).
    pub fn compaction_done(&self, cc: &CompactControl) -> bool {
        if cc.captured.is_some() {
            return true;
        }
        let Some(order) = cc.order else {
            return false;
        };
        let z = &self.zones[cc.zone];
        let mut g = z.lock();
        if g.nr_unmerged > 0 && g.merge_on_demand {
            g.merge_all(&self.mem, z.span);
        }
        // Blocks of `order` in the usable free blocks, a larger block counting as
        // the blocks of `order` it splits into.
        let goal = u64::from(cc.goal_blocks.max(1));
        let mut have = 0u64;
        for o in order..=MAX_ORDER {
            let row = &g.free_area[o as usize];
            let n = if o >= PAGEBLOCK_ORDER {
                row[..MIGRATE_PCPTYPES].iter().map(|l| l.nr).sum::<u64>()
            } else {
                row[cc.mt].nr
            };
            have += n << (o - order);
            if have >= goal {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests;
