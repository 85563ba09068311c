//! Automatic NUMA balancing of one space, the mechanism (Linux's
//! `task_numa_work`, `task_numa_fault` and `task_numa_placement` in
//! `kernel/sched/fair.c`, and `do_numa_page`'s migration half in
//! `mm/memory.c`); the file is named for the `task_numa_*` functions it holds
//! (a Linux task's NUMA work is a space's here). The policy (scan period, the
//! two-stage filter, the counters) is `numa_balancing/`; what starts a pass is
//! `task_tick_numa.rs`:
//!
//! - [`Space::task_numa_work`] ends the current scan window (its record goes to
//!   [`ScanPeriod::update`], which gives the next period and the nodes to avoid)
//!   and, through `change_prot_numa` (`mprotect.rs`), turns up to `scan_size`
//!   of present PTEs and huge PMDs into NUMA-hint entries, from where the
//!   previous pass stopped, looking at no more than `VIRT_SCAN_FACTOR` times
//!   that of virtual space; a pass that reaches the end of
//!   the space starts a new scan sequence (fault statistics halved, preferred
//!   node chosen). Under `Adaptive`, an entry whose page could only move to a
//!   node found full is left alone, but for one in `PROBE_EVERY` (by address),
//!   whose faults tell when the node accepts pages again.
//! - The automatic scanner is chosen by `MmBuilder::numa_scan_trigger`: by
//!   default (`ScanTrigger::TaskCpu`, as Linux) the space's own threads run
//!   `task_numa_work` on their way out of an access once the period has elapsed
//!   in their CPU time (`task_tick_numa.rs`); `ScanTrigger::Wall` is a background
//!   thread per space (`kthread.rs`) that wakes every tenth of the minimum
//!   period and scans once the period has elapsed in wall-clock time. Under
//!   `Adaptive`, both also scan as soon as a node avoided as full has free
//!   pages above its high watermark again (a pass also stops avoiding such a
//!   node): recovery does not wait out a backed-off period.
//! - `do_numa_page` (dispatched from `memory.rs`) restores the entry, swaps the
//!   page's last accessor (`Page::xchg_last_cpupid`), and, for a page on another
//!   node than the faulting thread, asks `should_numa_migrate_memory`, checks the
//!   range's policy, allocates on the thread's node with `Gfp::THISNODE` and
//!   migrates with `migrate.rs` (a busy page is tried up to 10 times, as
//!   Linux's `migrate_pages` retries `-EAGAIN`). Every outcome is counted by
//!   cause.
//! - The thread CPU time of all of it is added to the space's `system_ns`.
//!
//! Only the default and local policies, and `Bind` whose mask holds the thread's
//! node, let a page move; other policies place pages themselves (refused by
//! policy, as Linux without `MPOL_F_MOF`). Huge pages and sub-pages of split huge
//! pages take hint faults (recorded) but are not migrated (`migrate.rs` moves
//! order-0 pages only).
//!
//! Invariants: the counters are exact (`numa_balancing/counters.rs`); `hint faults = local +
//! remote`; every migration attempt ends in exactly one of success or one cause.
//! Locking (the order is in `rmap.rs`): `ScanState` is under its mutex (a
//! leaf, held for bookkeeping only, never across a page-table walk, an
//! allocation or a migration); the hint fault records its accessor under the
//! page lock (`xchg_last_cpupid_mapped`), released before it migrates; the scan runs
//! under the shared VMA lock (`change_prot_numa`); the hint fault's migration
//! runs inside the fault (shared VMA lock held) and only try-locks (`migrate.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mmkit_core::node::NodeMask;
use mmkit_core::NodeReq;

use super::memory::VmFault;
use super::mempolicy::allowed_nodes;
use super::mprotect::{clear_numa_hint, ProtNuma};
use super::{Space, SpaceInner, Stat, PAGE};
use crate::kthread::Kthread;
use crate::mempolicy::MemPolicy;
use crate::migrate::{migrate_page, MigrateError};
use crate::numa_balancing::{
    should_numa_migrate_memory, Cpupid, MigrateFail, MigrateQuery, NumabCounters, NumabStat,
    NumabStats, ScanPeriod, ScanTrigger, ScanWindow,
};
use crate::pgtable::{desc, Pte, HPAGE_PMD_NR, TASK_SIZE};
use crate::rmap::RmapWalkControl;
use crate::{Gfp, Pfn};

/// Linux: a pass looks at no more than this many times `scan_size` of virtual
/// space (holes and non-present entries included).
const VIRT_SCAN_FACTOR: u64 = 8;
/// Adaptive: of the entries whose only targets are full nodes, one in this many
/// is still armed, a probe that sees the node accept pages again.
const PROBE_EVERY: u64 = 16;
/// Linux's `NR_MAX_MIGRATE_PAGES_RETRY`: tries of a busy page before it counts
/// as a failed migration (pinned).
const NR_MAX_MIGRATE_PAGES_RETRY: u32 = 10;
/// Scan sequences during which any first or private fault migrates at once.
const EARLY_SEQS: u64 = 4;

/// The balancing state of one space.
#[derive(Default)]
pub(super) struct SpaceNumab {
    pub(super) enabled: AtomicBool,
    stats: NumabCounters,
    /// (N) Scan sequences completed (read without the lock by the fault
    /// path; locking letters: see `rmap.rs`).
    scan_seq: AtomicU64,
    /// (N) The preferred node + 1 (0: none).
    preferred: AtomicU32,
    /// The space's scan clock in ns (`task_tick_numa.rs`): its threads' CPU time,
    /// or the declared cost of its accesses.
    pub(super) clock_ns: AtomicU64,
    /// The clock value at which the next automatic pass is due (`u64::MAX`
    /// while a claimed pass runs).
    pub(super) next_scan_ns: AtomicU64,
    /// (N) The last decision's `avoid_targets`, for the tick to read unlocked.
    pub(super) avoid_bits: AtomicU64,
    state: Mutex<Option<ScanState>>,
    kthread: Mutex<Option<Kthread<()>>>,
}

/// The scanner's bookkeeping.
struct ScanState {
    period: ScanPeriod,
    window: ScanWindow,
    /// Where the next pass starts.
    next_addr: u64,
    /// When the automatic scanner runs next.
    next_scan: Instant,
    /// Nodes not worth arming PTEs for (the last decision's `avoid_targets`).
    avoid: NodeMask,
    /// Hint faults (pages) by memory node x CPU node, halved each sequence.
    faults: Vec<u64>,
    nr_nodes: usize,
}

impl ScanState {
    /// Linux's `task_numa_placement`: the node with the most faults on its
    /// memory becomes the preferred node, then every count is halved.
    fn placement(&mut self) -> Option<usize> {
        let n = self.nr_nodes;
        let per_mem = |m: usize| self.faults[m * n..(m + 1) * n].iter().sum::<u64>();
        let best = (0..n).max_by_key(|&m| (per_mem(m), std::cmp::Reverse(m)));
        let best = best.filter(|&m| per_mem(m) > 0);
        for f in &mut self.faults {
            *f /= 2;
        }
        best
    }

    /// The CPU nodes that faulted on this space lately (the possible targets).
    fn cpu_nodes(&self) -> NodeMask {
        let n = self.nr_nodes;
        (0..n)
            .filter(|&c| (0..n).any(|m| self.faults[m * n + c] > 0))
            .collect()
    }
}

thread_local! {
    /// A small per-thread id for the last-accessor field (Linux's pid bits).
    static TID: Cell<u32> = const { Cell::new(0) };
}
static NEXT_TID: AtomicU32 = AtomicU32::new(1);

fn thread_pid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// This thread's CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`, a system call).
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the
    // kernel knows. On failure `ts` stays zero, which only loses accounting.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The nodes of `mask` short of memory: free pages at or below the high
/// watermark (where Linux's `migrate_misplaced_folio_prepare` refuses). A few
/// atomic loads per node (the allocator's mirrored counts), no lock.
pub(super) fn still_full(mm: &crate::Mm, mask: NodeMask) -> NodeMask {
    mask.iter()
        .filter(|&n| {
            let high = mm.inner.wmark_high.get(n).copied().unwrap_or(0);
            mm.node_nr_free_pages(n) <= high
        })
        .collect()
}

impl SpaceNumab {
    fn lock(&self) -> MutexGuard<'_, Option<ScanState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Space {
    /// Turns automatic NUMA balancing of this space on or off (off by default).
    /// On, [`task_numa_work`](Self::task_numa_work) runs every scan period
    /// (after `scan_delay_ms`) as `MmBuilder::numa_scan_trigger` says (by
    /// default in the space's own threads, the period measured in their CPU
    /// time); hint faults migrate pages toward the threads that use them. Off,
    /// the scanner stops; entries already armed still fault and are restored,
    /// without migration. No-op with one node.
    pub fn set_numa_balancing(&self, on: bool) {
        let inner = &self.inner;
        let mm = &inner.mm;
        if mm.nr_nodes() < 2 {
            return;
        }
        if on {
            let mut st = inner.numab.lock();
            if st.is_none() {
                *st = Some(inner.new_scan_state());
            }
            let delay = mm
                .inner
                .numab
                .params
                .scan_delay_ms
                .saturating_mul(1_000_000);
            let now = inner.numab.clock_ns.load(Ordering::Relaxed);
            inner
                .numab
                .next_scan_ns
                .store(now.saturating_add(delay), Ordering::Release);
        }
        inner.numab.enabled.store(on, Ordering::Release);
        let mut kt = inner
            .numab
            .kthread
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !on {
            *kt = None;
            return;
        }
        let cfg = &mm.inner.numab;
        if kt.is_some() || cfg.trigger != ScanTrigger::Wall {
            return;
        }
        let k = Kthread::new();
        let weak = Arc::downgrade(&self.inner);
        let tick = Duration::from_millis((cfg.params.period_min_ms / 10).clamp(1, 100));
        k.start("numa_scan", tick, move |()| {
            let Some(s) = weak.upgrade() else {
                return false;
            };
            // Due, or (Adaptive) a node it avoids has room again: scan now rather
            // than wait out the backed-off period.
            let (due, avoid) = s
                .numab
                .lock()
                .as_ref()
                .map_or((false, NodeMask::default()), |st| {
                    (Instant::now() >= st.next_scan, st.avoid)
                });
            let due = due || (!avoid.is_empty() && still_full(&s.mm, avoid) != avoid);
            if due && s.numab.enabled.load(Ordering::Acquire) {
                s.task_numa_work(None);
            }
            true
        });
        *kt = Some(k);
    }

    /// Is NUMA balancing on for this space?
    pub fn numa_balancing(&self) -> bool {
        self.inner.numab.enabled.load(Ordering::Acquire)
    }

    /// One scan pass now (Linux's `task_numa_work`): ends the scan window, sets
    /// the next period, and turns up to `scan_size` of present PTEs and huge PMDs
    /// (512 pages each) into NUMA-hint entries, from where the previous pass
    /// stopped. Returns the pages marked (`numa_pte_updates` added). 0 with
    /// balancing off.
    pub fn task_numa_work(&self) -> u64 {
        self.inner.task_numa_work(None)
    }

    /// The NUMA balancing counters of this space.
    pub fn numa_balancing_stats(&self) -> NumabStats {
        self.inner.numab.stats.snapshot()
    }

    /// The current scan period in ms (None before balancing was turned on).
    pub fn numa_scan_period_ms(&self) -> Option<u64> {
        self.inner
            .numab
            .lock()
            .as_ref()
            .map(|s| s.period.period_ms())
    }

    /// The preferred node from the fault statistics (None until a scan
    /// sequence with hint faults completed).
    pub fn numa_preferred_node(&self) -> Option<usize> {
        self.inner.preferred_node()
    }
}

impl SpaceInner {
    fn new_scan_state(&self) -> ScanState {
        let mm = &self.mm;
        let cfg = &mm.inner.numab;
        let n = mm.nr_nodes();
        ScanState {
            period: ScanPeriod::new(cfg.policy, cfg.params, self.stats.get(Stat::Rss)),
            window: ScanWindow::default(),
            next_addr: 0,
            next_scan: Instant::now() + Duration::from_millis(cfg.params.scan_delay_ms),
            avoid: NodeMask::default(),
            faults: vec![0; n * n],
            nr_nodes: n,
        }
    }

    fn preferred_node(&self) -> Option<usize> {
        let p = self.numab.preferred.load(Ordering::Relaxed);
        (p > 0).then(|| p as usize - 1)
    }

    /// Counts in the space's and the Mm's counters.
    pub(super) fn numab_add(&self, s: NumabStat, v: u64) {
        self.numab.stats.add(s, v);
        self.mm.inner.numab.stats.add(s, v);
    }

    fn numab_fail(&self, cause: MigrateFail) {
        self.numab.stats.add_fail(cause, 1);
        self.mm.inner.numab.stats.add_fail(cause, 1);
    }

    /// One pass; `claimed` is the scan-clock value at which the tick claimed
    /// it (the next pass is due a period after it), None for a pass asked for
    /// otherwise (the clock's current value).
    pub(super) fn task_numa_work(&self, claimed: Option<u64>) -> u64 {
        if !self.numab.enabled.load(Ordering::Acquire) {
            return 0;
        }
        let t0 = thread_cpu_ns();
        let mm = &self.mm;
        let params = mm.inner.numab.params;
        let rss = self.stats.get(Stat::Rss);
        let (start, avoid, targets) = {
            let mut g = self.numab.lock();
            let Some(st) = g.as_mut() else {
                return 0;
            };
            let w = std::mem::take(&mut st.window);
            let d = st.period.update(&w, rss);
            st.avoid = d.avoid_targets;
            st.next_scan = Instant::now() + Duration::from_millis(d.period_ms);
            let now = claimed.unwrap_or_else(|| self.numab.clock_ns.load(Ordering::Relaxed));
            let next = now.saturating_add(d.period_ms.saturating_mul(1_000_000));
            self.numab.next_scan_ns.store(next, Ordering::Release);
            (st.next_addr, st.avoid, st.cpu_nodes())
        };
        // A node avoided since the last window that has room again is not.
        let avoid = if avoid.is_empty() {
            avoid
        } else {
            still_full(mm, avoid)
        };
        let budget = (params.scan_size_mb.max(1) << 20) / PAGE;
        let virt_budget = budget * VIRT_SCAN_FACTOR;
        let all: NodeMask = (0..mm.nr_nodes()).collect();
        let targets = if targets.is_empty() { all } else { targets };
        // Would a page on `node` only have full nodes to go to?
        let skip = |node: usize| {
            if avoid.is_empty() {
                return false;
            }
            let mut t = targets;
            t.remove(node);
            !t.is_empty() && t.iter().all(|n| avoid.contains(n))
        };
        let probe = |a: u64| (a / PAGE).is_multiple_of(PROBE_EVERY);
        let mut scan = ProtNuma::new(budget, virt_budget, |a, pfn| {
            probe(a) || !skip(mm.node_of(pfn))
        });
        // 0: the end of the space was reached.
        let next = {
            let g = self.read_lock();
            self.change_prot_numa(&g, start, TASK_SIZE, &mut scan)
                .unwrap_or(0)
        };
        let (marked, huge) = (scan.marked, scan.huge);
        {
            let mut g = self.numab.lock();
            if let Some(st) = g.as_mut() {
                // The nodes this pass avoided (those with room again dropped).
                st.avoid = avoid;
                self.numab.avoid_bits.store(avoid.bits(), Ordering::Relaxed);
                st.next_addr = next;
                if next == 0 {
                    let p = st.placement();
                    if let Some(p) = p {
                        self.numab.preferred.store(p as u32 + 1, Ordering::Relaxed);
                    }
                    self.numab.scan_seq.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.numab_add(NumabStat::PteUpdates, marked);
        self.numab_add(NumabStat::HugePteUpdates, huge);
        self.numab_add(NumabStat::ScanPasses, 1);
        self.numab_add(NumabStat::SystemNs, thread_cpu_ns().saturating_sub(t0));
        marked
    }

    /// Linux's `do_numa_page`: a NUMA-hinting fault on the PTE `slot` (which held
    /// `e`): restore it, record the fault, maybe migrate the page toward the
    /// faulting thread (see the header).
    pub(super) fn do_numa_page(&self, vmf: &VmFault<'_>, slot: &AtomicU64, e: Pte) {
        if !clear_numa_hint(slot, e) {
            return; // changed meanwhile: the access retries anyway
        }
        let t0 = thread_cpu_ns();
        let migratable = !e.is_compound();
        self.numa_hint_fault(vmf, slot, e.pfn(), 1, migratable);
        self.numab_add(NumabStat::SystemNs, thread_cpu_ns().saturating_sub(t0));
    }

    /// A hint fault on a huge PMD, already restored: recorded for its 512 pages,
    /// not migrated.
    pub(super) fn numa_huge_hint_fault(&self, vmf: &VmFault<'_>, slot: &AtomicU64, head: Pfn) {
        let t0 = thread_cpu_ns();
        self.numa_hint_fault(vmf, slot, head, HPAGE_PMD_NR, false);
        self.numab_add(NumabStat::SystemNs, thread_cpu_ns().saturating_sub(t0));
    }

    /// `task_numa_fault` with the migration decision before it, for the page
    /// `pfn` that the restored entry `slot` mapped. Nothing is recorded when
    /// `slot` no longer maps it (see `xchg_last_cpupid_mapped`): the access
    /// retries anyway.
    fn numa_hint_fault(
        &self,
        vmf: &VmFault<'_>,
        slot: &AtomicU64,
        pfn: Pfn,
        pages: u64,
        migratable: bool,
    ) {
        let mm = &self.mm;
        let mem = mm.node_of(pfn);
        let cpu = mm.thread_node();
        let this = Cpupid::from_page_bits(Cpupid::new(cpu, thread_pid()).to_page_bits());
        let Some(last) = self.xchg_last_cpupid_mapped(slot, pfn, this) else {
            return;
        };
        let private = last.is_unset() || last.same_pid(this);
        let mut node = mem;
        let mut outcome: Option<Result<(), MigrateFail>> = None;
        if mem != cpu && migratable && self.numab.enabled.load(Ordering::Acquire) {
            let early = self.preferred_node().is_none()
                || self.numab.scan_seq.load(Ordering::Relaxed) <= EARLY_SEQS;
            let q = MigrateQuery {
                this,
                last,
                src_nid: mem,
                dst_nid: cpu,
                early,
                group: None,
            };
            if should_numa_migrate_memory(&q) {
                let r = self.migrate_misplaced_page(vmf, pfn, cpu, this);
                if r.is_ok() {
                    node = cpu;
                }
                outcome = Some(r);
            }
        }
        let local = node == cpu;
        self.numab_add(NumabStat::HintFaults, 1);
        if local {
            self.numab_add(NumabStat::HintFaultsLocal, 1);
        }
        match outcome {
            Some(Ok(())) => {
                self.numab_add(NumabStat::PagesMigrated, pages);
                self.numab_add(NumabStat::MigrateSuccess, pages);
            }
            Some(Err(c)) => self.numab_fail(c),
            None => {}
        }
        let mut g = self.numab.lock();
        let Some(st) = g.as_mut() else {
            return;
        };
        let w = &mut st.window;
        if local {
            w.faults_local += pages;
        } else {
            w.faults_remote += pages;
        }
        if private {
            w.faults_private += pages;
        } else {
            w.faults_shared += pages;
        }
        match outcome {
            Some(Ok(())) => w.record_migrated(cpu, pages),
            Some(Err(c)) => w.record_fail(c, cpu, pages),
            None => {}
        }
        let n = st.nr_nodes;
        if node < n && cpu < n {
            st.faults[node * n + cpu] += pages;
        }
    }

    /// Swaps the last accessor of the page `pfn` for `this`, under the page
    /// lock and only while `slot` still maps `pfn`; `None` (nothing written)
    /// when it does not. Restoring the entry made the page reachable again:
    /// from then on another thread's hint fault may migrate it, or reclaim
    /// swap it out, and either frees it; a write to a free frame's flags
    /// leaves last-cpupid bits where the allocator expects none. Linux
    /// writes the field under the PTL, which keeps the folio mapped; here the
    /// page lock does: page-side code unmaps a page only under its lock, and
    /// `munmap` waits for the shared VMA lock this fault holds. (The address
    /// side of the lock order: VMA lock shared, then one page lock.)
    pub(super) fn xchg_last_cpupid_mapped(
        &self,
        slot: &AtomicU64,
        pfn: Pfn,
        this: Cpupid,
    ) -> Option<Cpupid> {
        let mm = &self.mm;
        let _lock = mm.lock_page(pfn);
        let now = Pte::from_raw(slot.load(Ordering::Acquire));
        if !now.is_present() || now.pfn() != pfn {
            return None;
        }
        let last = desc(mm, pfn).xchg_last_cpupid(this.to_page_bits());
        Some(Cpupid::from_page_bits(last))
    }

    /// Linux's `migrate_misplaced_folio`: moves the order-0 page `src` to `nid`,
    /// or says why not. The new page's last accessor is `this`.
    fn migrate_misplaced_page(
        &self,
        vmf: &VmFault<'_>,
        src: Pfn,
        nid: usize,
        this: Cpupid,
    ) -> Result<(), MigrateFail> {
        let mm = &self.mm;
        let pol = self.policies.effective(vmf.vma);
        match &*pol {
            MemPolicy::Default | MemPolicy::Local => {}
            MemPolicy::Bind(_) => {
                if !allowed_nodes(&pol, nid).is_some_and(|m| m.contains(nid)) {
                    return Err(MigrateFail::Policy);
                }
            }
            _ => return Err(MigrateFail::Policy),
        }
        let req = NodeReq {
            preferred: nid,
            local: nid,
            nodemask: Some(NodeMask::from_nodes(&[nid])),
            interleave: false,
        };
        let gfp = Gfp::MOVABLE | Gfp::NOWARN | Gfp::THISNODE;
        let Ok(dst) = mm.alloc_owned_pages_req(gfp, 0, req) else {
            return Err(MigrateFail::NodeFull);
        };
        // Isolated and ours until the migration maps it.
        desc(mm, dst).xchg_last_cpupid(this.to_page_bits());
        // A page busy right now (an access holds its lock or a reference) is
        // tried again, as Linux's `migrate_pages` retries `-EAGAIN`; a page that
        // stays pinned fails once, as pinned.
        let mut tries = 1;
        let r = loop {
            let mut rwc = RmapWalkControl::default();
            let r = migrate_page(mm, &mut rwc, src, dst);
            drop(rwc);
            match r {
                Err(MigrateError::Pinned) if tries < NR_MAX_MIGRATE_PAGES_RETRY => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => break r,
            }
        };
        match r {
            Ok(()) => {
                // The mapping's reference of the old page: the last one frees it.
                mm.unpin_page(src);
                Ok(())
            }
            Err(_) => {
                mm.free_owned_pages(dst, 0)
                    .expect("freeing our own unpublished page");
                Err(MigrateFail::Pinned)
            }
        }
    }
}

impl crate::Mm {
    /// The NUMA balancing counters of all spaces of this Mm, summed (spaces
    /// gone included).
    pub fn numa_balancing_stats(&self) -> NumabStats {
        self.inner.numab.stats.snapshot()
    }

    /// The NUMA balancing scan policy of this Mm's spaces.
    pub fn numa_scan_policy(&self) -> crate::ScanPolicy {
        self.inner.numab.policy
    }
}
