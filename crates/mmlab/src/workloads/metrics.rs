//! The metrics: a `Metric` names a figure (stable name, unit, which way is
//! better), and the metrics that more than one workload reports are defined
//! here, once; a workload's own metrics stay in its file.

/// A named figure a workload reports. Names are stable (docs/lab.md).
#[derive(Debug)]
pub struct Metric {
    pub name: &'static str,
    pub unit: &'static str,
    pub description: &'static str,
    pub higher_is_better: bool,
    /// Only mmkit variants report it (the others have no zone lock).
    pub mmkit_only: bool,
    /// Leave its table out of the report when every value is zero.
    pub hide_if_zero: bool,
}

pub const OPS_PER_SEC: Metric = Metric {
    name: "ops_per_sec",
    unit: "1/s",
    description: "operations per second, all threads summed (the workload says what an op is)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

pub const ZONE_LOCK_CONTENDED_PCT: Metric = Metric {
    name: "zone_lock_contended_pct",
    unit: "%",
    description: "zone lock acquisitions that found the lock held, in percent of all \
                  acquisitions over the measured interval (0 if none)",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};

pub const ZONE_LOCK_ACQUISITIONS_PER_KOP: Metric = Metric {
    name: "zone_lock_acquisitions_per_kop",
    unit: "1/kop",
    description: "zone lock acquisitions per 1000 ops over the measured interval",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};

pub const ALLOC_FAILURES: Metric = Metric {
    name: "alloc_failures",
    unit: "count",
    description: "allocations that failed (out of memory) during the point, warmup included; \
                  its table is shown only when some value is not zero",
    higher_is_better: false,
    mmkit_only: false,
    hide_if_zero: true,
};

/// Pages first written per second (`page_fault1`, `highalloc`'s background
/// threads).
pub const FAULTS_PER_SEC: Metric = Metric {
    name: "faults_per_sec",
    unit: "1/s",
    description: "pages first written per second, all threads summed: each is one page fault \
                  (clear-only: pages cleared)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

/// Bytes written per second (`anon_w_seq`, `clear_huge`).
pub const GB_PER_SEC: Metric = Metric {
    name: "gb_per_sec",
    unit: "GB/s",
    description: "bytes written per second, all threads summed, in 10^9 bytes (clear_huge: \
                  bytes faulted in, or cleared, per second)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

/// The share mapped by huge pages (`clear_huge`, `order0_thp_mix`).
pub const HUGE_PCT: Metric = Metric {
    name: "huge_pct",
    unit: "%",
    description: "share of the region that huge pages mapped: mmkit faults that installed an \
                  order-9 page, the kernel's AnonHugePages (100 for hugetlb)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
