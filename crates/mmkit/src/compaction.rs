//! Compaction (Linux's `mm/compaction.c`, the half that moves pages): builds free
//! high-order blocks by migrating movable pages out of the way, driven from three
//! places.
//!
//! - **Direct compaction**: the allocator's slow path calls it, through the
//!   hooks of `page_alloc_hooks.rs`, for every `Mm::alloc_pages` of an order
//!   above 0 that may reclaim. Unless
//!   compaction of that order is deferred (`mmkit_core::compaction`) or not
//!   suitable (too little free memory, or a fragmentation index saying the
//!   failure is lack of memory), it runs `compact_zone` for the order from the
//!   cached scanner positions and captures the first block of the order it frees,
//!   which the slow path returns without another search. A run that went
//!   through the whole zone without success defers the next ones; a success
//!   resets that. A run whose scanners met after starting from cached positions
//!   defers nothing: the slow path compacts again at a higher priority
//!   (`should_compact_retry`), and that run starts from the zone's ends.
//!   Each run is a compaction stall, counted with its outcome per order.
//! - **kcompactd**: a thread per `Mm` (off with `MmBuilder::kcompactd(false)`),
//!   woken by the slow path of a high-order request whose fragmentation index
//!   is above the threshold (the failure is fragmentation, not lack of memory);
//!   it compacts for that order in the background until `KCOMPACTD_GOAL_BLOCKS`
//!   blocks of it are free (Linux's stops at one: requests that keep coming
//!   would each find the one block taken and compact themselves); a run that
//!   ends short of the goal with a block of the order free is a success, not a
//!   reason to defer. Every 500 ms it also checks the proactive score and,
//!   above `100 - proactiveness + 10`, compacts the whole zone until the score
//!   is at most `100 - proactiveness` (Linux's proactive compaction, backing off
//!   32 s when a pass did not lower the score).
//! - **`Mm::compact_memory`**: the whole of every zone, now (Linux's
//!   `/proc/sys/vm/compact_memory`).
//!
//! `compact_zone`: merge on demand first (the cheap step: under lazy merging a
//! block may only be waiting to be merged), then, until the scanners meet or the
//! goal is reached: the migrate scanner yields the candidates of the next
//! pageblock, the free scanner isolates as many free pages from the end of the
//! zone, each candidate is migrated (`migrate.rs`) through the reverse map, the
//! sources are freed into the buddy lists merged, and the goal is tested again.
//!
//! Statistics (vmstat events, see `VmEvent`): a stall (`compact_stall`, one per
//! direct run) ends in `compact_success` or in `compact_fail`, also counted per
//! order in `CompactStats`; a page isolated for migration (`compact_isolated`)
//! ends in `pgmigrate_success` or in `pgmigrate_fail`, and `pgmigrate_fail_pinned`
//! counts the failures due to a pin or an access in progress.
//!
//! Locking: a run holds no lock between steps. Per page, the page side of the lock
//! order in `rmap.rs`: the page lock with `try_lock`, the Mm's registry mutex (to
//! find the space, not held after), the space's VMA lock shared with `try_read`;
//! the zone lock only inside the core's scanner and free calls, never while a
//! space lock is wanted. Direct compaction may run inside a
//! fault that holds its space's VMA lock shared; it never waits for any space lock,
//! so it cannot deadlock against that fault or an `munmap` queued behind it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mmkit_core::compaction::{COMPACT_CLUSTER_MAX, KCOMPACTD_GOAL_BLOCKS};
use mmkit_core::{CompactControl, CompactMode, CompactPriority, CompactResult, CompactStats};

use crate::kthread::Kthread;
use crate::migrate::{migrate_page, MigrateError};
use crate::rmap::RmapWalkControl;
use crate::{MigrateType, Mm, MmInner, Pfn, VmEvent};

/// How often kcompactd checks the proactive score (Linux's
/// `HPAGE_FRAG_CHECK_INTERVAL_MSEC`).
const PROACTIVE_INTERVAL: Duration = Duration::from_millis(500);
/// Checks skipped after a proactive pass that did not lower the score (Linux
/// backs off by `1 << COMPACT_MAX_DEFER_SHIFT` intervals).
const PROACTIVE_BACKOFF: u32 = 1 << mmkit_core::compaction::COMPACT_MAX_DEFER_SHIFT;

/// Compaction settings of an `Mm`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct CompactConfig {
    /// Direct compaction in the allocation slow path.
    pub direct: bool,
    /// The background thread.
    pub kcompactd: bool,
    /// Linux's `vm.compaction_proactiveness` (0..=100; 0: no proactive compaction).
    pub proactiveness: u32,
}

impl Default for CompactConfig {
    fn default() -> Self {
        CompactConfig {
            direct: true,
            kcompactd: true,
            proactiveness: mmkit_core::compaction::DEFAULT_PROACTIVENESS,
        }
    }
}

/// What one [`Mm::compact_memory`] call did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactSummary {
    /// Pages the migrate scanner looked at.
    pub migrate_scanned: u64,
    /// Pages the free scanner looked at.
    pub free_scanned: u64,
    /// Pages migrated.
    pub migrated: u64,
    /// Pages whose migration failed (all of them pinned or in use).
    pub failed: u64,
}

/// Per-run tallies, added to the vmstat events at the end.
#[derive(Default)]
struct Tally {
    migrated: u64,
    failed: u64,
    pinned: u64,
}

enum Outcome {
    /// Not isolated: no longer mapped where the reverse map said, or its space is
    /// busy with an mmap/munmap.
    Skipped,
    Migrated,
    Failed {
        pinned: bool,
    },
}

fn migrate_one(mm: &Mm, rwc: &mut RmapWalkControl, src: Pfn, dst: Pfn) -> Outcome {
    match migrate_page(mm, rwc, src, dst) {
        Ok(()) => Outcome::Migrated,
        Err(MigrateError::Changed) => Outcome::Skipped,
        Err(MigrateError::Pinned) => Outcome::Failed { pinned: true },
    }
}

/// Counts a compaction run in progress while alive.
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn enter(c: &'a AtomicUsize) -> Self {
        c.fetch_add(1, Ordering::AcqRel);
        Running(c)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a run whose scanners met without success ended (Linux's
/// `__compact_finished`): `Complete` if it went through the whole zone,
/// `PartialSkipped` if it started from cached positions.
fn scanners_met_result(cc: &CompactControl) -> CompactResult {
    if cc.whole_zone {
        CompactResult::Complete
    } else {
        CompactResult::PartialSkipped
    }
}

/// Linux's `compact_zone`. `proactive_low`: a whole-zone run that stops once the
/// proactive score is at most this.
fn compact_zone(
    mm: &Mm,
    cc: &mut CompactControl,
    proactive_low: Option<u32>,
    tally_out: &mut CompactSummary,
) -> CompactResult {
    let pa = mm.page_alloc();
    let z = cc.zone;
    let _running = Running::enter(&mm.inner.compacting);
    pa.compaction_merge(z);
    if pa.compaction_done(cc) {
        pa.compact_finish(cc);
        return CompactResult::Success;
    }
    let mut cands: Vec<Pfn> = Vec::new();
    let mut targets: Vec<Pfn> = Vec::new();
    let mut sources: Vec<Pfn> = Vec::with_capacity(COMPACT_CLUSTER_MAX);
    let mut tally = Tally::default();
    let mut result = 'run: loop {
        cands.clear();
        if !pa.isolate_migratepages(cc, &mut cands) {
            break scanners_met_result(cc);
        }
        for batch in cands.chunks(COMPACT_CLUSTER_MAX) {
            if targets.len() < batch.len() {
                pa.isolate_freepages(cc, batch.len() - targets.len(), &mut targets);
            }
            // Spaces are held for one batch only: a space dropped meanwhile is
            // freed right after it, not at the end of the run.
            let mut spaces = RmapWalkControl::default();
            for &src in batch {
                let Some(&dst) = targets.last() else { break };
                match migrate_one(mm, &mut spaces, src, dst) {
                    Outcome::Migrated => {
                        targets.pop();
                        sources.push(src);
                        tally.migrated += 1;
                    }
                    Outcome::Failed { pinned } => {
                        tally.failed += 1;
                        tally.pinned += pinned as u64;
                    }
                    Outcome::Skipped => {}
                }
            }
            drop(spaces);
            if !sources.is_empty() {
                pa.put_sources(cc, &sources);
                sources.clear();
            }
            // The goal first: a block captured in this very batch must not be
            // reported as a run that found nothing.
            if pa.compaction_done(cc) {
                break 'run CompactResult::Success;
            }
            if targets.is_empty() && cc.scanners_met() {
                break 'run scanners_met_result(cc);
            }
        }
        if let Some(low) = proactive_low {
            if pa.proactive_score(z) <= low {
                break CompactResult::Success;
            }
        }
    };
    if cc.captured.is_some() {
        result = CompactResult::Success;
    }
    pa.release_freepages(z, &mut targets);
    pa.compact_finish(cc);
    pa.count_vm_event(VmEvent::CompactIsolated, tally.migrated + tally.failed);
    pa.count_vm_event(VmEvent::PgMigrateSuccess, tally.migrated);
    pa.count_vm_event(VmEvent::PgMigrateFail, tally.failed);
    pa.count_vm_event(VmEvent::PgMigratePinned, tally.pinned);
    tally_out.migrate_scanned += cc.migrate_scanned;
    tally_out.free_scanned += cc.free_scanned;
    tally_out.migrated += tally.migrated;
    tally_out.failed += tally.failed;
    result
}

/// Linux's `try_to_compact_pages` for the allocator's slow path: direct
/// compaction of every zone for a block of `order` at priority `prio`. Returns
/// the result and the block captured for the caller, if any (already allocated
/// to it).
///
/// Deferral is consulted below the highest priority; `SyncFull` starts the
/// scanners from the zone's ends. Only a run that went through the whole zone
/// without success (`Complete`) defers the order, at any priority (Linux does
/// not defer after its async first try, since async migration gives up on
/// contended pages; mmkit's migration never waits at any priority, so a
/// whole-zone failure is a verdict whatever the priority). A run whose scanners
/// met after starting from cached positions (`PartialSkipped`: kcompactd or
/// earlier requests had already scanned most of the zone) is no verdict on the
/// zone: meeting reset the positions, so the retry the slow path makes at the
/// next priority goes through the whole zone, and only its failure defers.
pub(crate) fn try_to_compact_pages(
    mm: &Mm,
    order: u32,
    mt: MigrateType,
    prio: CompactPriority,
) -> (CompactResult, Option<Pfn>) {
    let pa = mm.page_alloc();
    let mut res = CompactResult::Skipped;
    for z in 0..pa.nr_zones() {
        if prio > CompactPriority::SyncFull && pa.compaction_deferred(z, order) {
            res = res.max(CompactResult::Deferred);
            continue;
        }
        if !pa.compaction_suitable(z, order) {
            continue;
        }
        let whole_zone = prio == CompactPriority::SyncFull;
        let mut cc = pa.compact_control_from(z, Some(order), mt, CompactMode::Direct, whole_zone);
        let r = compact_zone(mm, &mut cc, None, &mut CompactSummary::default());
        // compact_zone reports a run that captured a block as a success.
        debug_assert!(cc.captured.is_none() || r == CompactResult::Success);
        let ok = r == CompactResult::Success;
        pa.record_compaction(z, order, ok);
        if ok {
            pa.compaction_defer_reset(z, order, cc.captured.is_some());
            return (r, cc.captured);
        }
        if r == CompactResult::Complete {
            pa.defer_compaction(z, order);
        }
        res = res.max(r);
    }
    (res, None)
}

/// Starts kcompactd for `inner` on its handle `kc` (holding the `Mm` only weakly
/// between runs): a run for the order it was woken with, or, on its period
/// without a wake-up, a proactive check.
pub(crate) fn start_kcompactd(inner: &Arc<MmInner>, kc: &Kthread<u32>) {
    let weak: Weak<MmInner> = Arc::downgrade(inner);
    let proactiveness = inner.compact.proactiveness.min(100);
    let mut backoff = 0u32;
    kc.start("mmkit-kcompactd", PROACTIVE_INTERVAL, move |order| {
        let Some(inner) = weak.upgrade() else {
            return false;
        };
        let mm = Mm { inner };
        if order > 0 {
            kcompactd_do_work(&mm, order);
        } else if proactiveness > 0 {
            if backoff > 0 {
                backoff -= 1;
            } else if !proactive_compact(&mm, proactiveness) {
                backoff = PROACTIVE_BACKOFF;
            }
        }
        true
    });
}

/// Linux's `kcompactd_do_work`: background compaction for `order`.
fn kcompactd_do_work(mm: &Mm, order: u32) {
    let pa = mm.page_alloc();
    for z in 0..pa.nr_zones() {
        if pa.compaction_deferred(z, order) || !pa.compaction_suitable(z, order) {
            continue;
        }
        pa.count_vm_event(VmEvent::CompactDaemonWake, 1);
        let mut cc = pa.compact_control(
            z,
            Some(order),
            MigrateType::Movable,
            CompactMode::Background,
        );
        cc.goal_blocks = KCOMPACTD_GOAL_BLOCKS;
        let mut r = compact_zone(mm, &mut cc, None, &mut CompactSummary::default());
        if r != CompactResult::Success {
            // Short of the goal, but a request of the order is served now.
            cc.goal_blocks = 1;
            if pa.compaction_done(&cc) {
                r = CompactResult::Success;
            }
        }
        match r {
            CompactResult::Success => pa.compaction_defer_reset(z, order, false),
            CompactResult::Complete => pa.defer_compaction(z, order),
            _ => {}
        }
    }
}

/// Linux's proactive compaction: whole-zone runs while the score is above the
/// high mark, down to the low mark. False when a pass did not lower the score
/// (the caller backs off).
fn proactive_compact(mm: &Mm, proactiveness: u32) -> bool {
    let pa = mm.page_alloc();
    let low = 100u32.saturating_sub(proactiveness).max(5);
    let high = (low + 10).min(100);
    let mut progress = true;
    for z in 0..pa.nr_zones() {
        let before = pa.proactive_score(z);
        // Nothing worth building with fewer free pages than two pageblocks.
        let enough =
            pa.zone_nr_free(z) > pa.zone_low_wmark(z) + 2 * mmkit_core::PAGEBLOCK_NR_PAGES as u64;
        if before <= high || !enough {
            continue;
        }
        pa.count_vm_event(VmEvent::CompactProactive, 1);
        let mut cc = pa.compact_control(z, None, MigrateType::Movable, CompactMode::Full);
        compact_zone(mm, &mut cc, Some(low), &mut CompactSummary::default());
        if pa.proactive_score(z) >= before {
            progress = false;
        }
    }
    progress
}

impl Mm {
    /// Compacts the whole of every zone now (Linux's `echo 1 >
    /// /proc/sys/vm/compact_memory`): merges what lazy merging left, then migrates
    /// every movable page it can from the start of the zone to free pages at its
    /// end. Pinned pages and pages in use stay (counted as failed).
    pub fn compact_memory(&self) -> CompactSummary {
        let pa = self.page_alloc();
        let mut sum = CompactSummary::default();
        pa.drain_all_pages();
        for z in 0..pa.nr_zones() {
            let mut cc = pa.compact_control(z, None, MigrateType::Movable, CompactMode::Full);
            compact_zone(self, &mut cc, None, &mut sum);
        }
        sum
    }

    /// One direct compaction for a block of `order`, as the allocator's slow path
    /// runs it at its default priority (deferral, suitability, stall statistics;
    /// from the cached scanner positions, and a failure defers). A captured block
    /// is given back.
    pub fn compact(&self, order: u32) -> CompactResult {
        let (r, captured) = try_to_compact_pages(
            self,
            order.min(crate::MAX_ORDER),
            MigrateType::Movable,
            CompactPriority::DEF,
        );
        if let Some(p) = captured {
            let _ = self.free_pages(p, order);
        }
        r
    }

    /// Waits until no compaction run is in progress (direct, kcompactd or
    /// `compact_memory`, from any thread) and drops a pending kcompactd wake-up.
    /// Pages isolated by a run are not free until it ends, so a caller that wants
    /// `nr_free_pages()` exact after dropping its spaces calls this first.
    pub fn wait_compaction_idle(&self) {
        if let Some(kc) = &self.inner.kcompactd {
            kc.cancel_work();
        }
        while self.inner.compacting.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Deferral state and direct-compaction results per order, summed over zones.
    pub fn compaction_stats(&self) -> CompactStats {
        let pa = self.page_alloc();
        let mut out = CompactStats::default();
        for z in 0..pa.nr_zones() {
            let s = pa.compaction_stats(z);
            for o in 0..out.success.len() {
                out.success[o] += s.success[o];
                out.fail[o] += s.fail[o];
                out.deferred[o] += s.deferred[o];
            }
            out.defer_shift = out.defer_shift.max(s.defer_shift);
            out.order_failed = out.order_failed.max(s.order_failed);
        }
        out
    }

    /// Linux's fragmentation index of `order` (first zone): -1000 if a free block
    /// of the order exists, else 0 (lack of memory) ..= 1000 (fragmentation).
    pub fn fragmentation_index(&self, order: u32) -> i32 {
        self.page_alloc().fragmentation_index(0, order)
    }

    /// Linux's proactive-compaction fragmentation score (first zone): percent of
    /// free memory not in free blocks of at least a pageblock.
    pub fn fragmentation_score(&self) -> u32 {
        self.page_alloc().fragmentation_score(0)
    }

    /// Wakes kcompactd for `order` if the failure of such a request would be
    /// fragmentation (index above the threshold) rather than lack of memory.
    pub(crate) fn wakeup_kcompactd(&self, order: u32) {
        let Some(kc) = &self.inner.kcompactd else {
            return;
        };
        let fi = self.page_alloc().fragmentation_index(0, order);
        if fi > mmkit_core::compaction::EXTFRAG_THRESHOLD {
            // The highest order asked for since the last run.
            kc.wake(|pending| {
                let raise = order > *pending;
                if raise {
                    *pending = order;
                }
                raise
            });
        }
    }
}
