//! Automatic NUMA balancing, the policy half: how fast a space's PTEs are scanned
//! (Linux's `update_task_scan_period`, `task_scan_min` / `task_scan_max` in
//! `kernel/sched/fair.c`) and whether a hint fault should migrate its page
//! (`should_numa_migrate_memory`'s two-stage filter), and the counters
//! (`counters.rs`). The scanner (`task_numa_work`) and the hint fault
//! (`do_numa_page`) call into this module; it has no threads, no page tables
//! and no clock of its own.
//!
//! Names: this directory is the policy, named for the feature and its sysctl
//! (`numa_balancing`); the mechanism sits under `space/`, where the page
//! tables are, in files named for the Linux functions they hold:
//! `space/task_numa.rs` (`task_numa_work`, `task_numa_fault`,
//! `task_numa_placement`, with `do_numa_page`'s migration half) and
//! `space/task_tick_numa.rs` (`task_tick_numa`, what starts a pass).
//!
//! Every scan window (one period) the fault path hands [`ScanPeriod::update`] a
//! [`ScanWindow`] record: hint faults local/remote and private/shared,
//! migrations that succeeded, and those that failed by [`MigrateFail`] cause. The
//! period adapts under one of three [`ScanPolicy`] values, all sharing the
//! locality rule of Linux 4.0 (the kernel the seed patched):
//! - `NoFailBackoff` (4.0-rc1): failures are ignored; remote faults keep the
//!   scanner fast even when nothing can be migrated.
//! - `FailBackoff` (Mel Gorman's "mm: numa: Slow PTE scan rate if migration failures
//!   occur", docs/upstream.md, as Linux still has it): a window with any failure
//!   doubles the period, and the failure count is never cleared, so after one bad
//!   window the period doubles every window up to the maximum, for good.
//! - `Adaptive` (mmkit): failures age (halved every window), the back-off depends
//!   on their cause (a full target node or rate limiting backs off at once; pinned
//!   or policy-refused pages only when they make up most of the faults), a window
//!   whose migrations succeed ends the back-off and restarts at the fastest period
//!   (so the period is back to the minimum within two windows), and target nodes
//!   found full are reported in [`ScanDecision::avoid_targets`] for two windows, so
//!   the scanner does not arm PTEs whose only possible target is such a node.
//!   A converged window (at least 9 in 10 hint faults found their page
//!   already local: neither left remote nor just migrated) slows down as an
//!   idle one does (the period doubles): the scanner costs little once pages
//!   sit where they are used, without Linux's trick of never forgetting a
//!   failure (which, after one busy page in thousands, slows that patch's policy
//!   down for good).
//!   It also reads "no faults" as no hint faults at all, where Linux tests
//!   `local + shared == 0` and so slows down a window of private remote faults.
//!
//! Invariants: after every update, `task_scan_min <= period <= task_scan_max` for
//! the space's size (that patch's early return clamps only to the maximum, as Linux).
//! Locking: a `ScanPeriod` is plain data; the space keeps it under its NUMA
//! balancing lock (one scanner at a time per space, as Linux's `numa_next_scan`
//! cmpxchg ensures).

use mmkit_core::node::{NodeMask, MAX_NUMNODES};
use mmkit_core::PAGE_SHIFT;

/// How the scan period reacts to migration failures (a runtime choice, so the
/// lab runs all three side by side).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScanPolicy {
    /// Linux 4.0-rc1: failures are ignored.
    NoFailBackoff,
    /// Seed 004 as Linux still has it: any failure doubles the period and is
    /// never forgotten.
    FailBackoff,
    /// mmkit: back off by cause, forget as failures age, recover at once.
    #[default]
    Adaptive,
}

/// What drives a space's automatic scanner: which clock its scan period is
/// measured on (a runtime choice in `MmBuilder::numa_scan_trigger`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum ScanTrigger {
    /// No automatic scanning: only `Space::task_numa_work` scans (tests drive it
    /// by hand).
    Manual,
    /// Linux's: the CPU time of the space's own threads (`task_tick_numa` on
    /// `sum_exec_runtime`). The access path of each thread samples its CPU
    /// clock every `TICK_PAGES` page accesses and adds what passed to the
    /// space's clock; the thread that finds the period elapsed runs the pass
    /// itself on its way out of the access (Linux's `task_work` on return to
    /// user space). Scan passes are proportional to the work done, whatever the
    /// load of the host.
    #[default]
    TaskCpu,
    /// A fixed cost of `ns` nanoseconds of space time per page access, instead
    /// of measured CPU time: deterministic (the pass count follows from the
    /// access count alone), for tests and models.
    Accesses {
        /// Space time charged per page accessed.
        ns: u64,
    },
    /// A background thread per space that wakes every tenth of the minimum
    /// period and scans once the period has elapsed in wall-clock time (mmkit's
    /// first scanner; it scans less the busier the host is).
    Wall,
}

/// Why a NUMA-balancing migration failed.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MigrateFail {
    /// The target node is below its high watermark (Linux's
    /// `migrate_misplaced_folio_prepare` refusing with `-EAGAIN`).
    NodeFull = 0,
    /// The page is pinned or busy (extra references, locked, under writeback).
    Pinned = 1,
    /// The range's memory policy does not allow the target node.
    Policy = 2,
    /// A migration rate limit refused it (Linux 4.0's 1280 MB/s per node).
    RateLimited = 3,
}

/// Number of [`MigrateFail`] causes.
pub const NR_MIGRATE_FAIL: usize = 4;

impl MigrateFail {
    /// Every cause, in index order.
    pub const ALL: [MigrateFail; NR_MIGRATE_FAIL] = [
        MigrateFail::NodeFull,
        MigrateFail::Pinned,
        MigrateFail::Policy,
        MigrateFail::RateLimited,
    ];

    /// The counter name (`numa_migrate_fail_<name>` in vmstat).
    pub const fn name(self) -> &'static str {
        match self {
            MigrateFail::NodeFull => "node_full",
            MigrateFail::Pinned => "pinned",
            MigrateFail::Policy => "policy",
            MigrateFail::RateLimited => "rate_limited",
        }
    }
}

/// What the hint faults of one scan window saw (pages, as Linux counts them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanWindow {
    /// Hint faults on a page on (or migrated to) the faulting thread's node.
    pub faults_local: u64,
    /// Hint faults on a page left on another node.
    pub faults_remote: u64,
    /// Hint faults whose previous accessor was the same thread.
    pub faults_private: u64,
    /// Hint faults whose previous accessor was another thread.
    pub faults_shared: u64,
    /// Pages migrated toward the faulting thread.
    pub migrated: u64,
    /// Failed migrations, indexed by [`MigrateFail`] as `usize`.
    pub failed: [u64; NR_MIGRATE_FAIL],
    /// Target nodes that refused a migration for lack of memory.
    pub full_nodes: NodeMask,
    /// Target nodes that accepted at least one page.
    pub migrated_to: NodeMask,
}

impl ScanWindow {
    /// Counts `pages` failed migrations toward `target` for `cause`.
    pub fn record_fail(&mut self, cause: MigrateFail, target: usize, pages: u64) {
        self.failed[cause as usize] += pages;
        if cause == MigrateFail::NodeFull {
            self.full_nodes.insert(target);
        }
    }

    /// Counts `pages` migrated to `target`.
    pub fn record_migrated(&mut self, target: usize, pages: u64) {
        self.migrated += pages;
        self.migrated_to.insert(target);
    }

    /// All failed migrations.
    pub fn failed_total(&self) -> u64 {
        self.failed.iter().sum()
    }

    /// All hint faults (local + remote).
    pub fn hint_faults(&self) -> u64 {
        self.faults_local + self.faults_remote
    }
}

/// The scanner's settings (Linux's `numa_balancing_scan_*` sysctls).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ScanParams {
    /// Time to scan a 256 MB space at the fastest rate (`scan_period_min_ms`).
    pub period_min_ms: u64,
    /// Time to scan it at the slowest rate (`scan_period_max_ms`).
    pub period_max_ms: u64,
    /// Space scanned per pass, in MiB (`scan_size_mb`).
    pub scan_size_mb: u64,
    /// Delay before a new space's first scan (`scan_delay_ms`).
    pub scan_delay_ms: u64,
}

impl Default for ScanParams {
    fn default() -> ScanParams {
        ScanParams {
            period_min_ms: 1000,
            period_max_ms: 60000,
            scan_size_mb: 256,
            scan_delay_ms: 1000,
        }
    }
}

/// Linux's `MAX_SCAN_WINDOW`: never scan more than this many MiB per second.
const MAX_SCAN_WINDOW_MB: u64 = 2560;

impl ScanParams {
    /// Number of `scan_size` windows that cover a space of `rss_pages` resident
    /// pages, at least one (Linux's `task_nr_scan_windows`).
    pub fn nr_scan_windows(&self, rss_pages: u64) -> u64 {
        let scan_pages = (self.scan_size_mb.max(1) << (20 - PAGE_SHIFT)).max(1);
        let rss = if rss_pages == 0 {
            scan_pages
        } else {
            rss_pages
        };
        rss.div_ceil(scan_pages)
    }

    /// The shortest period for a space of `rss_pages` (Linux's `task_scan_min`):
    /// the minimum divided by the windows, floored so that no more than
    /// `MAX_SCAN_WINDOW` MiB are scanned per second.
    pub fn scan_min(&self, rss_pages: u64) -> u64 {
        let size = self.scan_size_mb.max(1);
        let windows = if size < MAX_SCAN_WINDOW_MB {
            MAX_SCAN_WINDOW_MB / size
        } else {
            1
        };
        let floor = 1000 / windows;
        (self.period_min_ms / self.nr_scan_windows(rss_pages)).max(floor)
    }

    /// The longest period for a space of `rss_pages` (Linux's `task_scan_max`,
    /// without numa groups), never below `scan_min`.
    pub fn scan_max(&self, rss_pages: u64) -> u64 {
        (self.period_max_ms / self.nr_scan_windows(rss_pages)).max(self.scan_min(rss_pages))
    }
}

/// What the scanner should do next.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ScanDecision {
    /// Time until the next scan pass, in ms.
    pub period_ms: u64,
    /// Nodes not worth migrating to now: do not arm PTEs whose only possible
    /// target is one of these (always empty except under `Adaptive`).
    pub avoid_targets: NodeMask,
}

/// Linux's `NUMA_PERIOD_SLOTS` and `NUMA_PERIOD_THRESHOLD`.
const NUMA_PERIOD_SLOTS: u64 = 10;
const NUMA_PERIOD_THRESHOLD: u64 = 7;
/// Adaptive: the largest back-off shift (the period is also capped at the max).
const MAX_BACKOFF: u32 = 8;
/// Adaptive: windows a full target node stays in `avoid_targets` unless renewed.
const FULL_NODE_HOLD: u8 = 2;

/// The scan period of one space and the state its policy keeps.
#[derive(Clone, Debug)]
pub struct ScanPeriod {
    policy: ScanPolicy,
    params: ScanParams,
    period_ms: u64,
    /// Linux's `numa_faults_locality`: remote, local, failed (the Linux policies).
    locality: [u64; 3],
    /// Adaptive: the period the locality rule alone would give.
    base_ms: u64,
    /// Adaptive: the period is `base << backoff`.
    backoff: u32,
    /// Adaptive: failures by cause, halved every window.
    aged: [u64; NR_MIGRATE_FAIL],
    /// Adaptive: windows left for which each node counts as full.
    full_hold: [u8; MAX_NUMNODES],
}

impl ScanPeriod {
    /// A new space's scan period: the minimum for its size (Linux's
    /// `task_scan_start` without numa groups).
    pub fn new(policy: ScanPolicy, params: ScanParams, rss_pages: u64) -> ScanPeriod {
        let start = params.scan_min(rss_pages);
        ScanPeriod {
            policy,
            params,
            period_ms: start,
            locality: [0; 3],
            base_ms: start,
            backoff: 0,
            aged: [0; NR_MIGRATE_FAIL],
            full_hold: [0; MAX_NUMNODES],
        }
    }

    /// The policy.
    pub fn policy(&self) -> ScanPolicy {
        self.policy
    }

    /// The settings.
    pub fn params(&self) -> &ScanParams {
        &self.params
    }

    /// The current period, in ms.
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The failure count the Linux policies keep (`numa_faults_locality[2]`).
    pub fn failure_record(&self) -> u64 {
        self.locality[2]
    }

    /// Adaptive's aged failure counts, by cause.
    pub fn aged_failures(&self) -> [u64; NR_MIGRATE_FAIL] {
        self.aged
    }

    /// The nodes the scanner should not arm PTEs for.
    pub fn avoid_targets(&self) -> NodeMask {
        (0..MAX_NUMNODES)
            .filter(|&n| self.full_hold[n] > 0)
            .collect()
    }

    /// Ends a scan window: folds its record in and computes the next period for a
    /// space of `rss_pages` resident pages.
    pub fn update(&mut self, w: &ScanWindow, rss_pages: u64) -> ScanDecision {
        let (min, max) = (
            self.params.scan_min(rss_pages),
            self.params.scan_max(rss_pages),
        );
        match self.policy {
            ScanPolicy::NoFailBackoff => self.update_linux(w, min, max, false),
            ScanPolicy::FailBackoff => self.update_linux(w, min, max, true),
            ScanPolicy::Adaptive => self.update_adaptive(w, min, max),
        }
        ScanDecision {
            period_ms: self.period_ms,
            avoid_targets: self.avoid_targets(),
        }
    }

    /// Linux 4.0's `task_numa_fault` accumulation and `update_task_scan_period`,
    /// with that patch's failure check when `fail_backoff`.
    fn update_linux(&mut self, w: &ScanWindow, min: u64, max: u64, fail_backoff: bool) {
        self.locality[0] += w.faults_remote;
        self.locality[1] += w.faults_local;
        if fail_backoff {
            self.locality[2] += w.failed_total();
        }
        let (remote, local) = (self.locality[0], self.locality[1]);
        if local + w.faults_shared == 0 || (fail_backoff && self.locality[2] != 0) {
            // The early return: slower, and the record is not cleared.
            self.period_ms = max.min(self.period_ms << 1);
            return;
        }
        self.period_ms = locality_rule(
            self.period_ms,
            local,
            remote,
            w.faults_private,
            w.faults_shared,
            min,
            max,
        );
        self.locality = [0; 3];
    }

    fn update_adaptive(&mut self, w: &ScanWindow, min: u64, max: u64) {
        // Failures age: every window halves what earlier windows recorded.
        for (aged, &now) in self.aged.iter_mut().zip(&w.failed) {
            *aged = *aged / 2 + now;
        }
        // Only resource failures (a full node, rate limiting) hold misplaced
        // pages back; a few busy pages are not a reason to rescan at full rate.
        let had_failures = self.backoff > 0
            || self.aged[MigrateFail::NodeFull as usize] > 0
            || self.aged[MigrateFail::RateLimited as usize] > 0;
        let (fails, migrated) = (w.failed_total(), w.migrated);
        // Converged: at least 9 in 10 hint faults found their page already on
        // the faulting thread's node. The misplaced ones are those left remote
        // (failed migrations included) and those just migrated (counted local
        // after the move): a few stragglers moving, or a page busy now and then,
        // are not a reason to keep scanning at the rate of the migration phase.
        let misplaced = w.faults_remote + migrated;
        let converged = w.hint_faults() > 0 && misplaced * 10 <= w.hint_faults();

        // The base follows locality on this window alone (nothing is kept). No
        // hint fault at all means idle, and a converged window has nothing to
        // do either: slower (Linux's `local + shared == 0` also slows down a
        // window of private faults that stayed remote).
        self.base_ms = if w.hint_faults() == 0 || converged {
            max.min(self.base_ms.max(min) << 1)
        } else {
            let (local, remote) = (w.faults_local, w.faults_remote);
            let (private, shared) = (w.faults_private, w.faults_shared);
            locality_rule(self.base_ms, local, remote, private, shared, min, max)
        };

        if migrated > 0 && migrated >= fails {
            // Migrations succeed again: misplaced pages are waiting, scan at the
            // fastest rate and let the locality rule slow down from there.
            if had_failures {
                self.base_ms = min;
                self.aged = [0; NR_MIGRATE_FAIL];
            }
            self.backoff = 0;
        } else if fails > 0 {
            let step = match self.dominant_cause() {
                MigrateFail::NodeFull | MigrateFail::RateLimited => 1,
                // Page-specific causes: back off only when such pages are most of
                // what the scanner finds.
                MigrateFail::Pinned | MigrateFail::Policy => u32::from(fails * 2 > w.hint_faults()),
            };
            self.backoff = (self.backoff + step).min(MAX_BACKOFF);
        } else {
            self.backoff = self.backoff.saturating_sub(1);
        }

        for (node, hold) in self.full_hold.iter_mut().enumerate() {
            if w.full_nodes.contains(node) && !w.migrated_to.contains(node) {
                *hold = FULL_NODE_HOLD;
            } else if w.migrated_to.contains(node) {
                *hold = 0;
            } else {
                *hold = hold.saturating_sub(1);
            }
        }
        self.period_ms = (self.base_ms << self.backoff).clamp(min, max);
    }

    /// The cause with the most aged failures (the first on a tie).
    fn dominant_cause(&self) -> MigrateFail {
        let mut best = MigrateFail::NodeFull;
        for c in MigrateFail::ALL {
            if self.aged[c as usize] > self.aged[best as usize] {
                best = c;
            }
        }
        best
    }
}

/// Linux 4.0's period adjustment from the locality of the window's faults: mostly
/// local (7 in 10 or more) slows down by a slot or more; otherwise speed up in
/// proportion to the remote share, scaled down by how shared the faults are.
fn locality_rule(
    period: u64,
    local: u64,
    remote: u64,
    private: u64,
    shared: u64,
    min: u64,
    max: u64,
) -> u64 {
    let period_slot = period.div_ceil(NUMA_PERIOD_SLOTS) as i64;
    let ratio = ((local * NUMA_PERIOD_SLOTS) / (local + remote).max(1)) as i64;
    let threshold = NUMA_PERIOD_THRESHOLD as i64;
    let diff = if ratio >= threshold {
        (ratio - threshold).max(1) * period_slot
    } else {
        let diff = -(threshold - ratio) * period_slot;
        let priv_ratio = (private * NUMA_PERIOD_SLOTS).div_ceil(private + shared + 1) as i64;
        diff * priv_ratio / NUMA_PERIOD_SLOTS as i64
    };
    let next = (period as i64 + diff).max(0) as u64;
    next.clamp(min, max)
}

// ---------------------------------------------------------------------------------
// The two-stage filter
// ---------------------------------------------------------------------------------

/// The last accessor of a page (Linux's `last_cpupid` in the page flags): the
/// node it ran on and the low 16 bits of its thread id, or unset.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Cpupid(u32);

const CPUPID_VALID: u32 = 1 << 31;
const CPUPID_PID_BITS: u32 = 16;
const CPUPID_PID_MASK: u32 = (1 << CPUPID_PID_BITS) - 1;

impl Cpupid {
    /// No accessor recorded yet.
    pub const UNSET: Cpupid = Cpupid(0);

    /// Thread `pid` (only its low 16 bits are kept, as Linux keeps a few) running
    /// on `node` (below `MAX_NUMNODES`; larger values are masked).
    pub const fn new(node: usize, pid: u32) -> Cpupid {
        let node = (node % MAX_NUMNODES) as u32;
        Cpupid(CPUPID_VALID | (node << CPUPID_PID_BITS) | (pid & CPUPID_PID_MASK))
    }

    /// The packed value, to keep in a page descriptor's atomic field.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// From a packed value.
    pub const fn from_raw(raw: u32) -> Cpupid {
        Cpupid(raw)
    }

    /// True when no accessor is recorded.
    pub const fn is_unset(self) -> bool {
        self.0 & CPUPID_VALID == 0
    }

    /// The accessor's node.
    pub const fn node(self) -> Option<usize> {
        if self.is_unset() {
            None
        } else {
            Some(((self.0 >> CPUPID_PID_BITS) as usize) % MAX_NUMNODES)
        }
    }

    /// The 10-bit form kept in a page descriptor's flags (mmkit-core's
    /// `LAST_CPUPID_SHIFT`): valid bit, node mod 8, the low 6 bits of the id.
    /// Compare only values that went through the same packing.
    pub const fn to_page_bits(self) -> u32 {
        if self.is_unset() {
            return 0;
        }
        let node = (self.0 >> CPUPID_PID_BITS) & 7;
        (1 << 9) | (node << 6) | (self.0 & 0x3f)
    }

    /// From the 10-bit form of [`to_page_bits`](Self::to_page_bits).
    pub const fn from_page_bits(bits: u32) -> Cpupid {
        if bits & (1 << 9) == 0 {
            return Cpupid::UNSET;
        }
        Cpupid::new(((bits >> 6) & 7) as usize, bits & 0x3f)
    }

    /// True when both name the same thread (low bits of the id).
    pub const fn same_pid(self, other: Cpupid) -> bool {
        !self.is_unset() && !other.is_unset() && (self.0 ^ other.0) & CPUPID_PID_MASK == 0
    }
}

/// Fault statistics of the faulting thread's numa group (Linux's
/// `group_faults_cpu` / `group_faults`), for shared pages.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupFaults {
    /// Group faults from CPUs of the destination node.
    pub cpu_dst: u64,
    /// Group faults from CPUs of the source node.
    pub cpu_src: u64,
    /// The thread's faults on memory of the source node.
    pub mem_src: u64,
    /// The thread's faults on memory of the destination node.
    pub mem_dst: u64,
}

/// One hint fault's migration question.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MigrateQuery {
    /// The faulting thread (and its node, the destination).
    pub this: Cpupid,
    /// The page's previous accessor (the value `this` replaced).
    pub last: Cpupid,
    /// The page's node.
    pub src_nid: usize,
    /// The faulting thread's node.
    pub dst_nid: usize,
    /// True early in the space's life: no preferred node yet, or at most four
    /// scan sequences done.
    pub early: bool,
    /// The thread's numa group, if it has one.
    pub group: Option<GroupFaults>,
}

/// Linux's `ACTIVE_NODE_FRACTION`.
const ACTIVE_NODE_FRACTION: u64 = 3;

/// Linux's `should_numa_migrate_memory`: migrate a page toward the faulting
/// thread only when the relation looks lasting. Early on, first or private faults
/// migrate at once; later, the previous accessor must have been on the same node
/// (two faults in a row from there: the two-stage filter), then private faults
/// migrate, and shared ones by the group's CPU and memory use with 3/4 hysteresis.
pub fn should_numa_migrate_memory(q: &MigrateQuery) -> bool {
    if q.early && (q.last.is_unset() || q.last.same_pid(q.this)) {
        return true;
    }
    if let Some(last_nid) = q.last.node() {
        if last_nid != q.dst_nid {
            return false;
        }
    }
    if q.last.same_pid(q.this) {
        return true;
    }
    let Some(g) = q.group else {
        return true;
    };
    if g.cpu_dst > g.cpu_src * ACTIVE_NODE_FRACTION {
        return true;
    }
    g.cpu_dst * g.mem_src * 3 > g.cpu_src * g.mem_dst * 4
}

/// The NUMA balancing settings and counters of one Mm (`MmBuilder`).
#[derive(Default)]
pub(crate) struct MmNumab {
    pub(crate) policy: ScanPolicy,
    pub(crate) params: ScanParams,
    /// What drives each space's automatic scanner.
    pub(crate) trigger: ScanTrigger,
    /// All spaces' counters summed.
    pub(crate) stats: NumabCounters,
}

mod counters;
pub use counters::NumabStats;
pub(crate) use counters::{NumabCounters, NumabStat};

#[cfg(test)]
mod tests;
