//! The counters of automatic NUMA balancing (Linux's `numa_*` and `pgmigrate_*`
//! vmstat items, plus one per [`MigrateFail`] cause, which Linux lacks), kept per
//! space and summed per Mm, and the CPU time the balancing work took.
//!
//! Invariants: every counter only grows and is exact (one atomic add per event,
//! no sampling); `numa_hint_faults = local + remote` and
//! `pgmigrate_fail = sum of the causes` hold between any two events of one space.
//! Locking: none (relaxed atomics; a snapshot may straddle an event).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{MigrateFail, NR_MIGRATE_FAIL};

/// A snapshot of the NUMA balancing counters (of a space, or of a whole Mm).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NumabStats {
    /// Pages whose entries the scanner turned into NUMA hints (a huge PMD counts
    /// its 512 pages, as Linux's `numa_pte_updates`).
    pub numa_pte_updates: u64,
    /// Huge PMDs the scanner turned into NUMA hints.
    pub numa_huge_pte_updates: u64,
    /// Hint faults taken (a huge PMD's fault counts one).
    pub numa_hint_faults: u64,
    /// Hint faults on a page on (or migrated to) the faulting thread's node.
    pub numa_hint_faults_local: u64,
    /// Pages migrated by NUMA balancing.
    pub numa_pages_migrated: u64,
    /// Migrations that succeeded.
    pub pgmigrate_success: u64,
    /// Migrations that failed (the sum of `migrate_fail`).
    pub pgmigrate_fail: u64,
    /// Failed migrations by cause, indexed by [`MigrateFail`] as `usize`.
    pub migrate_fail: [u64; NR_MIGRATE_FAIL],
    /// Scan passes (`task_numa_work` runs).
    pub scan_passes: u64,
    /// Thread CPU time of the scanner, hint faults and migration copies, in ns:
    /// the lab's "system time".
    pub system_ns: u64,
}

impl NumabStats {
    /// Failed migrations of one cause.
    pub fn failed(&self, cause: MigrateFail) -> u64 {
        self.migrate_fail[cause as usize]
    }
}

/// One counter.
#[derive(Copy, Clone, Debug)]
pub(crate) enum NumabStat {
    PteUpdates,
    HugePteUpdates,
    HintFaults,
    HintFaultsLocal,
    PagesMigrated,
    MigrateSuccess,
    MigrateFailed,
    ScanPasses,
    SystemNs,
}
const NR_COUNTERS: usize = 9;

/// The live counters (see the header).
#[derive(Default)]
pub(crate) struct NumabCounters {
    c: [AtomicU64; NR_COUNTERS],
    fail: [AtomicU64; NR_MIGRATE_FAIL],
}

impl NumabCounters {
    pub(crate) fn add(&self, s: NumabStat, v: u64) {
        self.c[s as usize].fetch_add(v, Ordering::Relaxed);
    }

    /// Counts a failed migration of `pages` for `cause` (and in `pgmigrate_fail`).
    pub(crate) fn add_fail(&self, cause: MigrateFail, pages: u64) {
        self.fail[cause as usize].fetch_add(pages, Ordering::Relaxed);
        self.add(NumabStat::MigrateFailed, pages);
    }

    pub(crate) fn snapshot(&self) -> NumabStats {
        let g = |s: NumabStat| self.c[s as usize].load(Ordering::Relaxed);
        NumabStats {
            numa_pte_updates: g(NumabStat::PteUpdates),
            numa_huge_pte_updates: g(NumabStat::HugePteUpdates),
            numa_hint_faults: g(NumabStat::HintFaults),
            numa_hint_faults_local: g(NumabStat::HintFaultsLocal),
            numa_pages_migrated: g(NumabStat::PagesMigrated),
            pgmigrate_success: g(NumabStat::MigrateSuccess),
            pgmigrate_fail: g(NumabStat::MigrateFailed),
            migrate_fail: std::array::from_fn(|i| self.fail[i].load(Ordering::Relaxed)),
            scan_passes: g(NumabStat::ScanPasses),
            system_ns: g(NumabStat::SystemNs),
        }
    }
}
