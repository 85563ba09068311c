//! The target figures, computed from the measured records (never
//! hard-coded): alloc_free at 2 threads, mmkit against mimalloc and against
//! buddy_system_allocator; alloc_free_batch at 8 threads, the zone lock
//! contention of the mmkit variants; cross_cpu_free at 2 threads, mmkit against
//! mmkit-eager; page_fault1 (both cases), mmkit against the kernel at 2 threads
//! and against clear-only at 1 thread; clear_huge, mmkit against the best raw
//! loop (1GiB) and against the kernel (2MiB); highalloc's success and
//! order0_thp_mix's two scores, mmkit against mmkit-eager; autonuma at 4
//! threads (the seed's direction and mmkit's scan policy in numa01-full, the
//! recovery in numa01-recover, convergence and cost in numa02 and
//! numa01_THREAD_ALLOC); pmbench (the swap-cache and LRU locks and the score
//! against the 2019 policies at 8 threads, against the kernel at 2); reclaim
//! (device reads against the kernel, exact LRU and fixed ceilings, the scan
//! cost, kswapd CPU against the classic policy); memcg (A's hit ratio and
//! throughput with `low`, without groups beside them, the limit held). A figure
//! whose inputs were not measured says so.

use crate::record::{lookup, lookup_case, Record};

/// What a ratio should reach.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// At least this factor, printed as `4.00x`.
    Times(f64),
    /// At least this percentage, printed as `85.0%`.
    Pct(f64),
    /// At most this factor, printed as `0.60x`.
    AtMost(f64),
    /// Within this fraction of 1 either way, printed as `1.05x`.
    Within(f64),
}

/// A value as the tables print it: no decimals from 1000 up, else two.
fn num(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// `a / b` of `metric` in `case` at `threads`, against `target`, as a line.
#[allow(clippy::too_many_arguments)]
fn case_ratio(
    records: &[Record],
    workload: &str,
    case: &str,
    threads: usize,
    metric: &str,
    a: &str,
    b: &str,
    target: Target,
) -> String {
    target_ratio(records, workload, Some(case), threads, metric, a, b, target)
}

/// As `case_ratio`, for a workload without cases.
fn point_ratio(
    records: &[Record],
    workload: &str,
    threads: usize,
    metric: &str,
    a: &str,
    b: &str,
    target: Target,
) -> String {
    target_ratio(records, workload, None, threads, metric, a, b, target)
}

#[allow(clippy::too_many_arguments)]
fn target_ratio(
    records: &[Record],
    workload: &str,
    case: Option<&str>,
    threads: usize,
    metric: &str,
    a: &str,
    b: &str,
    target: Target,
) -> String {
    let t = if threads == 1 { "thread" } else { "threads" };
    let head = match case {
        Some(c) => format!("{workload} ({c}) @ {threads} {t}: {a} / {b} {metric}"),
        None => format!("{workload} @ {threads} {t}: {a} / {b} {metric}"),
    };
    let unit = records
        .iter()
        .find(|r| r.workload == workload && r.metric == metric)
        .map_or("", |r| r.unit.as_str());
    let get = |v: &str| match case {
        Some(c) => lookup_case(records, workload, v, threads, metric, c),
        None => lookup(records, workload, v, threads, metric),
    };
    match (get(a), get(b)) {
        (Some(x), Some(y)) if y > 0.0 => {
            let r = x / y;
            let (shown, want, met) = match target {
                Target::Times(k) => (format!("{r:.2}x"), format!(">= {k}x"), r >= k),
                Target::Pct(p) => (
                    format!("{:.1}%", r * 100.0),
                    format!(">= {p}%"),
                    r * 100.0 >= p,
                ),
                Target::AtMost(k) => (format!("{r:.2}x"), format!("<= {k}x"), r <= k),
                Target::Within(f) => (
                    format!("{r:.2}x"),
                    format!("within {}%", f * 100.0),
                    (r - 1.0).abs() <= f,
                ),
            };
            format!(
                "{head} = {shown} ({} vs {} {unit}; target {want}: {})",
                num(x),
                num(y),
                if met { "met" } else { "not met" }
            )
        }
        // A zero baseline: only "at least k times" holds (any positive value is
        // infinitely many times zero); the other targets do not.
        (Some(x), Some(y)) if y == 0.0 && x > 0.0 => {
            let (want, met) = match target {
                Target::Times(k) => (format!(">= {k}x"), true),
                Target::Pct(p) => (format!(">= {p}%"), true),
                Target::AtMost(k) => (format!("<= {k}x"), false),
                Target::Within(f) => (format!("within {}%", f * 100.0), false),
            };
            format!(
                "{head} = inf ({} vs 0 {unit}; target {want}: {})",
                num(x),
                if met { "met" } else { "not met" }
            )
        }
        _ => format!("{head}: not measured"),
    }
}

/// The raw loop of clear_huge with the highest gb_per_sec in `case`.
fn best_raw(records: &[Record], case: &str) -> Option<&'static str> {
    ["raw-memset", "raw-stosb", "raw-nt"]
        .into_iter()
        .filter_map(|v| {
            lookup_case(records, "clear_huge", v, 1, "gb_per_sec", case).map(|x| (v, x))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(v, _)| v)
}

/// `a / b` of one metric at one point, as a line.
fn ratio(records: &[Record], workload: &str, threads: usize, a: &str, b: &str) -> String {
    let metric = "ops_per_sec";
    let head = format!("{workload} @ {threads} threads: {a} / {b} ops_per_sec");
    match (
        lookup(records, workload, a, threads, metric),
        lookup(records, workload, b, threads, metric),
    ) {
        (Some(x), Some(y)) if y > 0.0 => format!("{head} = {:.2}x ({x:.0} vs {y:.0} 1/s)", x / y),
        _ => format!("{head}: not measured"),
    }
}

/// One variant's value of `metric` in `case` against a floor, as a line.
fn case_floor(
    records: &[Record],
    workload: &str,
    case: &str,
    threads: usize,
    metric: &str,
    variant: &str,
    floor: f64,
) -> String {
    let t = if threads == 1 { "thread" } else { "threads" };
    let head = format!("{workload} ({case}) @ {threads} {t}: {variant} {metric}");
    match lookup_case(records, workload, variant, threads, metric, case) {
        Some(x) => format!(
            "{head} = {} (target >= {floor}: {})",
            num(x),
            if x >= floor { "met" } else { "not met" }
        ),
        None => format!("{head}: not measured"),
    }
}

/// The autonuma figures (4 threads).
fn autonuma(records: &[Record], out: &mut Vec<String>) {
    let w = "autonuma";
    let (linux, v40) = ("mmkit-numab-linux", "mmkit-numab-4.0");
    for metric in ["system_ms", "pte_updates", "hint_faults"] {
        let t = Target::AtMost(0.6);
        out.push(case_ratio(
            records,
            w,
            "numa01-full",
            4,
            metric,
            linux,
            v40,
            t,
        ));
    }
    let t = Target::AtMost(0.8);
    out.push(case_ratio(
        records,
        w,
        "numa01-full",
        4,
        "system_ms",
        "mmkit",
        linux,
        t,
    ));
    let (m, t) = ("local_access_pct_after", Target::Times(1.2));
    out.push(case_ratio(
        records,
        w,
        "numa01-recover",
        4,
        m,
        "mmkit",
        linux,
        t,
    ));
    for case in ["numa02", "numa01_THREAD_ALLOC"] {
        out.push(case_floor(records, w, case, 4, m, "mmkit", 90.0));
        let t = Target::Within(0.1);
        out.push(case_ratio(
            records,
            w,
            case,
            4,
            "system_ms",
            "mmkit",
            linux,
            t,
        ));
    }
}

/// One variant's value of `metric` at `threads` against a ceiling (percent),
/// with the other variants' values beside it, as a line.
fn point_ceiling(
    records: &[Record],
    workload: &str,
    threads: usize,
    metric: &str,
    variants: &[&str],
    ceiling: f64,
) -> String {
    let head = format!("{workload} @ {threads} threads: {metric}");
    let vals: Vec<(&str, f64)> = variants
        .iter()
        .filter_map(|v| lookup(records, workload, v, threads, metric).map(|x| (*v, x)))
        .collect();
    match vals.first() {
        Some(&(v, x)) if v == variants[0] => {
            let others: Vec<String> = vals[1..]
                .iter()
                .map(|(v, x)| format!(", {v} {x:.2}%"))
                .collect();
            format!(
                "{head} {v} {x:.2}% (target <= {ceiling}%: {}){}",
                if x <= ceiling { "met" } else { "not met" },
                others.concat()
            )
        }
        _ => format!("{head}: not measured"),
    }
}

/// The pmbench figures: the swap-cache and LRU locks and the score
/// against the 2019 policies at 8 threads, and against the kernel at 2.
fn pmbench(records: &[Record], out: &mut Vec<String>) {
    let w = "pmbench";
    let locks = ["mmkit", "mmkit-swap-2019", "mmkit-swap-2020"];
    out.push(point_ceiling(
        records,
        w,
        8,
        "swap_cache_lock_contended_pct",
        &locks,
        1.0,
    ));
    let t = Target::Times(1.15);
    out.push(point_ratio(
        records,
        w,
        8,
        "accesses_per_sec",
        "mmkit",
        "mmkit-swap-2019",
        t,
    ));
    for metric in [
        "accesses_per_sec",
        "swapin_gb_per_sec",
        "swapout_gb_per_sec",
    ] {
        out.push(point_ratio(
            records,
            w,
            2,
            metric,
            "mmkit",
            "kernel",
            Target::Times(3.0),
        ));
    }
    out.push(point_ceiling(
        records,
        w,
        8,
        "lru_lock_contended_pct",
        &["mmkit"],
        5.0,
    ));
}

/// One variant's value of `metric` in `case` (1 thread) against a ceiling: a
/// number, or (`plus`) another variant's value plus that many.
fn case_ceiling(
    records: &[Record],
    workload: &str,
    case: &str,
    metric: &str,
    variant: &str,
    ceiling: f64,
    plus: Option<&str>,
) -> String {
    let head = format!("{workload} ({case}): {variant} {metric}");
    let get = |v: &str| lookup_case(records, workload, v, 1, metric, case);
    let limit = match plus {
        Some(other) => get(other).map(|y| (y + ceiling, format!("{other} {} + {ceiling}", num(y)))),
        None => Some((ceiling, num(ceiling))),
    };
    match (get(variant), limit) {
        (Some(x), Some((l, shown))) => format!(
            "{head} = {} (target <= {shown}: {})",
            num(x),
            if x <= l { "met" } else { "not met" }
        ),
        _ => format!("{head}: not measured"),
    }
}

/// The reclaim figures: which pages mmkit's eviction keeps, against the
/// kernel, exact LRU and the classic policy.
fn reclaim(records: &[Record], out: &mut Vec<String>) {
    let w = "reclaim";
    let (pct, hot, swapins) = ("device_reads_pct", "device_reads_per_hot_page", "swapins");
    let r = |case: &str, m: &str, b: &str, k: f64| {
        case_ratio(records, w, case, 1, m, "mmkit", b, Target::AtMost(k))
    };
    out.push(case_ceiling(records, w, "zipf", pct, "mmkit", 22.0, None));
    out.push(r("zipf", pct, "kernel", 0.92));
    out.push(case_ceiling(records, w, "scan", hot, "mmkit", 0.05, None));
    out.push(r("shift", swapins, "kernel", 0.8));
    out.push(r("shift", swapins, "lru-exact", 1.0));
    out.push(case_ceiling(
        records,
        w,
        "shift",
        "settle_faults_per_memory",
        "mmkit",
        1.0,
        None,
    ));
    out.push(case_ceiling(
        records,
        w,
        "loop",
        pct,
        "mmkit",
        1.0,
        Some("lru-exact"),
    ));
    out.push(r("loop", pct, "kernel", 1.0));
    for case in ["zipf", "scan"] {
        out.push(case_ceiling(
            records,
            w,
            case,
            "pgscan_per_pgsteal",
            "mmkit",
            2.0,
            None,
        ));
    }
    let classic = "mmkit-lru-classic";
    out.push(r("zipf", "kswapd_cpu_ns_per_page", classic, 1.0));
}

/// The memcg figures (1 thread per group), per case: A's hit ratio and
/// throughput with `low` against their targets, the same without groups
/// beside them, and the limit held where B has a `max`.
fn memcg(records: &[Record], out: &mut Vec<String>) {
    let w = "memcg";
    for case in ["uniform", "zipf"] {
        out.push(case_floor(
            records,
            w,
            case,
            1,
            "a_hit_pct",
            "mmkit-low",
            99.0,
        ));
        let t = Target::Times(0.9);
        let low = "mmkit-low";
        for a in ["a_accesses_per_sec", "a_accesses_per_cpu_sec"] {
            out.push(case_ratio(records, w, case, 1, a, low, "mmkit-alone", t));
        }
        let get = |v: &str, m: &str| lookup_case(records, w, v, 1, m, case);
        let head = format!("{w} ({case}) @ 1 thread: without groups (mmkit-root)");
        out.push(
            match (
                get("mmkit-root", "a_hit_pct"),
                get("mmkit-root", "a_vs_alone"),
            ) {
                (Some(h), Some(r)) => {
                    format!("{head}: a_hit_pct {} and a_vs_alone {r:.2}x", num(h))
                }
                (Some(h), None) => format!("{head}: a_hit_pct {}, a_vs_alone not measured", num(h)),
                _ => format!("{head}: not measured"),
            },
        );
        for v in ["mmkit-max", "kernel"] {
            out.push(case_ceiling(
                records,
                w,
                case,
                "samples_over_max",
                v,
                0.0,
                None,
            ));
        }
    }
}

/// The figures, one line each.
pub fn figures(records: &[Record]) -> Vec<String> {
    let mut out = vec![
        ratio(records, "alloc_free", 2, "mmkit", "mimalloc"),
        ratio(records, "alloc_free", 2, "mmkit", "buddy_system_allocator"),
    ];
    let pcts: Vec<String> = ["mmkit", "mmkit-eager", "mmkit-nopcp"]
        .iter()
        .filter_map(|v| {
            lookup(records, "alloc_free_batch", v, 8, "zone_lock_contended_pct")
                .map(|p| format!("{v} {p:.2}%"))
        })
        .collect();
    let head = "alloc_free_batch @ 8 threads: zone_lock_contended_pct";
    out.push(if pcts.is_empty() {
        format!("{head}: not measured")
    } else {
        format!("{head} {}", pcts.join(", "))
    });
    out.push(ratio(records, "cross_cpu_free", 2, "mmkit", "mmkit-eager"));
    for case in ["shared", "per-thread"] {
        out.push(case_ratio(
            records,
            "page_fault1",
            case,
            2,
            "faults_per_sec",
            "mmkit",
            "kernel",
            Target::Times(4.0),
        ));
        out.push(case_ratio(
            records,
            "page_fault1",
            case,
            1,
            "faults_per_sec",
            "mmkit",
            "clear-only",
            Target::Pct(85.0),
        ));
    }
    let raw = best_raw(records, "1GiB").unwrap_or("best raw loop");
    out.push(case_ratio(
        records,
        "clear_huge",
        "1GiB",
        1,
        "gb_per_sec",
        "mmkit",
        raw,
        Target::Pct(95.0),
    ));
    out.push(case_ratio(
        records,
        "clear_huge",
        "2MiB",
        1,
        "gb_per_sec",
        "mmkit",
        "kernel",
        Target::Times(4.0),
    ));
    out.push(point_ratio(
        records,
        "highalloc",
        2,
        "success_pct",
        "mmkit",
        "mmkit-eager",
        Target::Times(1.0),
    ));
    for (metric, k) in [("order0_score", 1.2), ("thp_score", 1.0)] {
        out.push(point_ratio(
            records,
            "order0_thp_mix",
            4,
            metric,
            "mmkit",
            "mmkit-eager",
            Target::Times(k),
        ));
    }
    autonuma(records, &mut out);
    pmbench(records, &mut out);
    reclaim(records, &mut out);
    memcg(records, &mut out);
    out
}

#[cfg(test)]
mod tests;
