//! The target figures, computed from the measured records (never
//! hard-coded): alloc_free at 2 threads, mmkit against mimalloc and against
//! buddy_system_allocator; alloc_free_batch at 8 threads, the zone lock
//! contention of the mmkit variants; cross_cpu_free at 2 threads, mmkit against
//! mmkit-eager. A figure whose inputs were not measured says so.

use crate::record::{lookup, Record};

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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(workload: &str, variant: &str, threads: usize, metric: &str, value: f64) -> Record {
        Record {
            workload: workload.into(),
            variant: variant.into(),
            threads,
            metric: metric.into(),
            value,
            unit: String::new(),
            case: None,
            params: None,
        }
    }

    #[test]
    fn figures_come_from_records() {
        let recs = vec![
            rec("alloc_free", "mmkit", 2, "ops_per_sec", 300.0),
            rec("alloc_free", "mimalloc", 2, "ops_per_sec", 200.0),
            rec(
                "alloc_free_batch",
                "mmkit",
                8,
                "zone_lock_contended_pct",
                1.5,
            ),
        ];
        let f = figures(&recs);
        assert_eq!(
            f[0],
            "alloc_free @ 2 threads: mmkit / mimalloc ops_per_sec = 1.50x (300 vs 200 1/s)"
        );
        assert!(f[1].ends_with("not measured"));
        assert_eq!(
            f[2],
            "alloc_free_batch @ 8 threads: zone_lock_contended_pct mmkit 1.50%"
        );
        assert!(f[3].ends_with("not measured"));
    }
}
