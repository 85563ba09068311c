//! `memcg`'s metrics (docs/lab.md has each with its unit and meaning).

use crate::workloads::Metric;

macro_rules! metric {
    ($c:ident, $n:literal, $u:literal, $hib:literal, $hz:literal, $d:literal) => {
        pub const $c: Metric = Metric {
            name: $n,
            unit: $u,
            description: $d,
            higher_is_better: $hib,
            mmkit_only: false,
            hide_if_zero: $hz,
        };
    };
}

metric!(
    A_HIT,
    "a_hit_pct",
    "%",
    true,
    false,
    "A's accesses that found their page mapped (needed no swap-in, not even from the swap \
     cache), in percent of A's measured accesses (kernel: the child's minor + major faults)"
);
metric!(
    A_MISSES,
    "a_misses",
    "count",
    false,
    false,
    "A's measured accesses that faulted (mmkit: its space's faults; kernel: the child's minor \
     + major faults)"
);
metric!(
    A_RATE,
    "a_accesses_per_sec",
    "1/s",
    true,
    false,
    "A's 4-byte reads per second, its threads summed"
);
metric!(
    A_VS_ALONE,
    "a_vs_alone",
    "x",
    true,
    true,
    "A's accesses per second over A alone's (mmkit: the mmkit-alone column of the same round; \
     kernel: A alone in the same point, before B starts)"
);
metric!(
    A_CPU_RATE,
    "a_accesses_per_cpu_sec",
    "1/s",
    true,
    true,
    "A's reads per second of its threads' CPU time (mmkit: /proc/self/task schedstat of the \
     memcg-a threads; kernel: the A child's getrusage): its throughput with the host's CPU \
     share taken out"
);
metric!(
    A_CPU_VS_ALONE,
    "a_cpu_vs_alone",
    "x",
    true,
    true,
    "a_accesses_per_cpu_sec over A alone's (as a_vs_alone)"
);
metric!(
    A_CPU_PCT,
    "a_cpu_pct",
    "%",
    true,
    true,
    "CPU time of A's threads over the measured wall time x A's threads, in percent: the CPU \
     share A got"
);
metric!(
    B_RATE,
    "b_pages_per_sec",
    "1/s",
    true,
    true,
    "pages B wrote per second, its threads summed (each page once, never reused)"
);
metric!(
    A_CUR,
    "a_current_peak_mib",
    "MiB",
    false,
    true,
    "the largest memory.current of A's group sampled while measuring (every 5-10 ms)"
);
metric!(
    B_CUR,
    "b_current_peak_mib",
    "MiB",
    false,
    true,
    "the largest memory.current of B's group sampled while measuring"
);
metric!(
    A_SWAP,
    "a_swap_peak_mib",
    "MiB",
    false,
    true,
    "the largest swap usage of A's group sampled while measuring (kernel v1: memsw - usage)"
);
metric!(
    B_SWAP,
    "b_swap_peak_mib",
    "MiB",
    false,
    true,
    "the largest swap usage of B's group sampled while measuring"
);
metric!(
    B_PEAK_PCT,
    "b_peak_pct_of_max",
    "%",
    false,
    true,
    "B's memory.peak (v1: max_usage_in_bytes) over its memory.max, in percent, where a max \
     is set: at most 100 if the limit held"
);
metric!(
    OVER_MAX,
    "samples_over_max",
    "count",
    false,
    false,
    "samples in which a group's memory.current was above its memory.max (must be 0), where \
     a max is set"
);
metric!(
    A_SCAN,
    "a_pgscan",
    "pages",
    false,
    true,
    "pages of A's group scanned by reclaim while measuring (memory.stat pgscan)"
);
metric!(
    A_STEAL,
    "a_pgsteal",
    "pages",
    false,
    true,
    "pages of A's group reclaimed while measuring (memory.stat pgsteal)"
);
metric!(
    B_SCAN,
    "b_pgscan",
    "pages",
    false,
    true,
    "pages of B's group scanned by reclaim while measuring"
);
metric!(
    B_STEAL,
    "b_pgsteal",
    "pages",
    false,
    true,
    "pages of B's group reclaimed while measuring"
);
metric!(
    A_LOW,
    "a_events_low",
    "count",
    false,
    true,
    "memory.events low of A's group while measuring: reclaimed although under its low"
);
metric!(
    FAILED,
    "failed_accesses",
    "count",
    false,
    true,
    "accesses and writes of A and B that failed (out of memory at a limit, a swap error)"
);

pub const METRICS: &[Metric] = &[
    A_HIT,
    A_MISSES,
    A_RATE,
    A_VS_ALONE,
    A_CPU_RATE,
    A_CPU_VS_ALONE,
    A_CPU_PCT,
    B_RATE,
    A_CUR,
    B_CUR,
    A_SWAP,
    B_SWAP,
    B_PEAK_PCT,
    OVER_MAX,
    A_SCAN,
    A_STEAL,
    B_SCAN,
    B_STEAL,
    A_LOW,
    FAILED,
];
