//! Tests of the target figures: each computed from records, and "not measured"
//! where its inputs are missing.

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
        rounds: None,
    }
}

#[test]
fn pmbench_figures_come_from_records() {
    let recs = vec![
        rec("pmbench", "mmkit", 8, "swap_cache_lock_contended_pct", 0.5),
        rec(
            "pmbench",
            "mmkit-swap-2019",
            8,
            "swap_cache_lock_contended_pct",
            7.0,
        ),
        rec("pmbench", "mmkit", 8, "accesses_per_sec", 120.0),
        rec("pmbench", "mmkit-swap-2019", 8, "accesses_per_sec", 100.0),
        rec("pmbench", "mmkit", 2, "swapin_gb_per_sec", 3.0),
        rec("pmbench", "kernel", 2, "swapin_gb_per_sec", 0.5),
        rec("pmbench", "mmkit", 8, "lru_lock_contended_pct", 6.0),
    ];
    let f = figures(&recs);
    let has = |s: &str| f.iter().any(|l| l == s);
    assert!(has(
        "pmbench @ 8 threads: swap_cache_lock_contended_pct mmkit 0.50% (target <= 1%: met), \
         mmkit-swap-2019 7.00%"
    ));
    assert!(has(
        "pmbench @ 8 threads: mmkit / mmkit-swap-2019 accesses_per_sec = 1.20x \
         (120.00 vs 100.00 ; target >= 1.15x: met)"
    ));
    assert!(has(
        "pmbench @ 2 threads: mmkit / kernel swapin_gb_per_sec = 6.00x \
         (3.00 vs 0.50 ; target >= 3x: met)"
    ));
    assert!(has(
        "pmbench @ 2 threads: mmkit / kernel accesses_per_sec: not measured"
    ));
    assert!(has(
        "pmbench @ 8 threads: lru_lock_contended_pct mmkit 6.00% (target <= 5%: not met)"
    ));
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
    assert_eq!(f.len(), 51);
    assert!(f[4..].iter().all(|l| l.ends_with("not measured")));
}

fn case_rec(workload: &str, variant: &str, threads: usize, case: &str, value: f64) -> Record {
    let metric = if workload == "clear_huge" {
        "gb_per_sec"
    } else {
        "faults_per_sec"
    };
    let mut r = rec(workload, variant, threads, metric, value);
    r.case = Some(case.into());
    r.unit = if workload == "clear_huge" {
        "GB/s"
    } else {
        "1/s"
    }
    .into();
    r
}

#[test]
fn space_figures_come_from_case_records() {
    let recs = vec![
        case_rec("page_fault1", "mmkit", 2, "shared", 5e6),
        case_rec("page_fault1", "kernel", 2, "shared", 1e6),
        case_rec("page_fault1", "mmkit", 1, "per-thread", 3e6),
        case_rec("page_fault1", "clear-only", 1, "per-thread", 4e6),
        case_rec("clear_huge", "mmkit", 1, "1GiB", 9.6),
        case_rec("clear_huge", "raw-stosb", 1, "1GiB", 8.0),
        case_rec("clear_huge", "raw-nt", 1, "1GiB", 10.0),
        case_rec("clear_huge", "mmkit", 1, "2MiB", 9.0),
        case_rec("clear_huge", "kernel", 1, "2MiB", 3.0),
    ];
    let f = figures(&recs);
    assert_eq!(
        f[4],
        "page_fault1 (shared) @ 2 threads: mmkit / kernel faults_per_sec = 5.00x \
         (5000000 vs 1000000 1/s; target >= 4x: met)"
    );
    assert!(f[5].ends_with("not measured"), "{}", f[5]);
    assert!(f[6].ends_with("not measured"), "{}", f[6]);
    assert_eq!(
        f[7],
        "page_fault1 (per-thread) @ 1 thread: mmkit / clear-only faults_per_sec = 75.0% \
         (3000000 vs 4000000 1/s; target >= 85%: not met)"
    );
    assert_eq!(
        f[8],
        "clear_huge (1GiB) @ 1 thread: mmkit / raw-nt gb_per_sec = 96.0% \
         (9.60 vs 10.00 GB/s; target >= 95%: met)"
    );
    assert_eq!(
        f[9],
        "clear_huge (2MiB) @ 1 thread: mmkit / kernel gb_per_sec = 3.00x \
         (9.00 vs 3.00 GB/s; target >= 4x: not met)"
    );
}

#[test]
fn compaction_figures_come_from_records() {
    let recs = vec![
        rec("highalloc", "mmkit", 2, "success_pct", 99.0),
        rec("highalloc", "mmkit-eager", 2, "success_pct", 100.0),
        rec("order0_thp_mix", "mmkit", 4, "order0_score", 3e6),
        rec("order0_thp_mix", "mmkit-eager", 4, "order0_score", 2e6),
        rec("order0_thp_mix", "mmkit", 4, "thp_score", 2e6),
        rec("order0_thp_mix", "mmkit-eager", 4, "thp_score", 2e6),
    ];
    let f = figures(&recs);
    assert_eq!(
        f[10],
        "highalloc @ 2 threads: mmkit / mmkit-eager success_pct = 0.99x \
         (99.00 vs 100.00 ; target >= 1x: not met)"
    );
    assert_eq!(
        f[11],
        "order0_thp_mix @ 4 threads: mmkit / mmkit-eager order0_score = 1.50x \
         (3000000 vs 2000000 ; target >= 1.2x: met)"
    );
    assert!(f[12].contains("thp_score = 1.00x") && f[12].ends_with("met)"));
}

fn rc(variant: &str, case: &str, metric: &str, value: f64) -> Record {
    let mut r = rec("reclaim", variant, 1, metric, value);
    r.case = Some(case.into());
    r
}

#[test]
fn reclaim_figures_come_from_case_records() {
    let recs = vec![
        rc("mmkit", "zipf", "device_reads_pct", 21.5),
        rc("kernel", "zipf", "device_reads_pct", 23.9),
        rc("mmkit", "loop", "device_reads_pct", 100.5),
        rc("lru-exact", "loop", "device_reads_pct", 99.0),
        rc("mmkit", "scan", "device_reads_per_hot_page", 0.5),
    ];
    let f = figures(&recs);
    let find = |head: &str| f.iter().find(|l| l.starts_with(head)).unwrap().clone();
    assert_eq!(
        find("reclaim (zipf): mmkit device_reads_pct"),
        "reclaim (zipf): mmkit device_reads_pct = 21.50 (target <= 22.00: met)"
    );
    assert!(find("reclaim (zipf) @ 1 thread: mmkit / kernel").contains("0.90x"));
    assert!(find("reclaim (zipf) @ 1 thread: mmkit / kernel").ends_with(": met)"));
    assert_eq!(
        find("reclaim (loop): mmkit device_reads_pct"),
        "reclaim (loop): mmkit device_reads_pct = 100.50 \
         (target <= lru-exact 99.00 + 1: not met)"
    );
    assert!(find("reclaim (scan): mmkit device_reads_per_hot_page").ends_with("not met)"));
    assert!(find("reclaim (shift)").ends_with("not measured"));
}

fn an(variant: &str, case: &str, metric: &str, value: f64) -> Record {
    let mut r = rec("autonuma", variant, 4, metric, value);
    r.case = Some(case.into());
    r
}

#[test]
fn autonuma_figures_come_from_case_records() {
    let recs = vec![
        an("mmkit-numab-linux", "numa01-full", "system_ms", 30.0),
        an("mmkit-numab-4.0", "numa01-full", "system_ms", 60.0),
        an("mmkit", "numa01-full", "system_ms", 27.0),
        an("mmkit", "numa01-recover", "local_access_pct_after", 90.0),
        an(
            "mmkit-numab-linux",
            "numa01-recover",
            "local_access_pct_after",
            50.0,
        ),
        an("mmkit", "numa02", "local_access_pct_after", 95.0),
        an("mmkit", "numa02", "system_ms", 12.0),
        an("mmkit-numab-linux", "numa02", "system_ms", 10.0),
    ];
    let f = figures(&recs);
    assert_eq!(f.len(), 51);
    assert_eq!(
        f[13],
        "autonuma (numa01-full) @ 4 threads: mmkit-numab-linux / mmkit-numab-4.0 \
         system_ms = 0.50x (30.00 vs 60.00 ; target <= 0.6x: met)"
    );
    assert!(f[14].ends_with("not measured") && f[15].ends_with("not measured"));
    assert!(f[16].contains("= 0.90x") && f[16].ends_with("target <= 0.8x: not met)"));
    assert!(f[17].contains("= 1.80x") && f[17].ends_with("met)"));
    assert_eq!(
        f[18],
        "autonuma (numa02) @ 4 threads: mmkit local_access_pct_after = 95.00 \
         (target >= 90: met)"
    );
    assert!(f[19].contains("= 1.20x") && f[19].ends_with("within 10%: not met)"));
    assert!(f[20].ends_with("not measured") && f[21].ends_with("not measured"));
}

#[test]
fn a_zero_baseline_is_infinitely_many_times_not_unmeasured() {
    let recs = vec![
        an("mmkit", "numa01-recover", "local_access_pct_after", 99.0),
        an(
            "mmkit-numab-linux",
            "numa01-recover",
            "local_access_pct_after",
            0.0,
        ),
        an("mmkit", "numa01-full", "system_ms", 5.0),
        an("mmkit-numab-linux", "numa01-full", "system_ms", 0.0),
    ];
    let f = figures(&recs);
    assert!(
        f[17].contains("= inf (99.00 vs 0 ") && f[17].ends_with("target >= 1.2x: met)"),
        "{}",
        f[17]
    );
    assert!(f[16].contains("= inf") && f[16].ends_with("target <= 0.8x: not met)"));
}

#[test]
fn memcg_figures_come_from_case_records() {
    let m = |variant: &str, metric: &str, value: f64| Record {
        case: Some("zipf".into()),
        unit: "%".into(),
        ..rec("memcg", variant, 1, metric, value)
    };
    let recs = vec![
        m("mmkit-low", "a_hit_pct", 99.5),
        m("mmkit-low", "a_accesses_per_sec", 950.0),
        m("mmkit-alone", "a_accesses_per_sec", 1000.0),
        m("mmkit-root", "a_hit_pct", 80.0),
        m("mmkit-root", "a_vs_alone", 0.5),
        m("mmkit-max", "samples_over_max", 0.0),
        m("kernel", "samples_over_max", 2.0),
    ];
    let f = figures(&recs);
    let has = |s: &str| f.iter().any(|l| l == s);
    assert!(has(
        "memcg (zipf) @ 1 thread: mmkit-low a_hit_pct = 99.50 (target >= 99: met)"
    ));
    assert!(has(
        "memcg (zipf) @ 1 thread: mmkit-low / mmkit-alone a_accesses_per_sec = 0.95x \
         (950.00 vs 1000 %; target >= 0.9x: met)"
    ));
    assert!(has(
        "memcg (zipf) @ 1 thread: mmkit-low / mmkit-alone a_accesses_per_cpu_sec: \
         not measured"
    ));
    assert!(has(
        "memcg (zipf) @ 1 thread: without groups (mmkit-root): a_hit_pct 80.00 and \
         a_vs_alone 0.50x"
    ));
    assert!(has(
        "memcg (zipf): mmkit-max samples_over_max = 0.00 (target <= 0.00: met)"
    ));
    assert!(has(
        "memcg (zipf): kernel samples_over_max = 2.00 (target <= 0.00: not met)"
    ));
    assert!(has(
        "memcg (uniform) @ 1 thread: mmkit-low a_hit_pct: not measured"
    ));
}
