//! The seeds' table: claims read from records, per-CPU reading, the Markdown,
//! HTML and plots.

use super::*;

fn rec(
    workload: &str,
    case: Option<&str>,
    variant: &str,
    threads: usize,
    metric: &str,
    value: f64,
) -> Record {
    Record {
        workload: workload.into(),
        variant: variant.into(),
        threads,
        metric: metric.into(),
        value,
        unit: "u".into(),
        case: case.map(Into::into),
        params: None,
        rounds: None,
    }
}

#[test]
fn claims_come_from_records_and_compare_with_the_published_ratio() {
    let recs = vec![
        rec("cross_cpu_free", None, "mmkit", 2, "ops_per_sec", 200.0),
        rec(
            "cross_cpu_free",
            None,
            "mmkit-eager",
            2,
            "ops_per_sec",
            100.0,
        ),
        rec(
            "alloc_free_batch",
            None,
            "mmkit",
            8,
            "zone_lock_contended_pct",
            0.0,
        ),
        rec(
            "alloc_free_batch",
            None,
            "mmkit-eager",
            8,
            "zone_lock_contended_pct",
            0.0,
        ),
        rec(
            "clear_huge",
            Some("1GiB"),
            "mmkit-multi-page",
            1,
            "gb_per_sec",
            20.0,
        ),
        rec(
            "clear_huge",
            Some("1GiB"),
            "mmkit-page-at-a-time",
            1,
            "gb_per_sec",
            10.0,
        ),
        rec(
            "autonuma",
            Some("numa01-full"),
            "mmkit-numab-linux",
            4,
            "system_ms",
            30.0,
        ),
        rec(
            "autonuma",
            Some("numa01-full"),
            "mmkit-numab-4.0",
            4,
            "system_ms",
            60.0,
        ),
    ];
    let rows = rows(&recs);
    assert_eq!(
        rows.len(),
        SEEDS.iter().map(|s| s.claims.len()).sum::<usize>()
    );
    let find = |label: &str| rows.iter().find(|r| r.claim.label == label).unwrap();
    // 2x against a published 1.30x, higher is better: met.
    let r = find("alloc/free CPUs");
    assert_eq!(r.ratio_text(), "2.00x");
    assert_eq!(r.met(), Some(true));
    assert_eq!(
        r.measures(),
        "cross_cpu_free @ 2 threads: mmkit / mmkit-eager ops_per_sec (200.00 vs 100.00 u)"
    );
    // No contention either way: no change shown, not met.
    let r = find("zone lock");
    assert_eq!(r.measured, Outcome::BothZero);
    assert_eq!(r.met_text(), "not met");
    // 2.00x against a published 2.07x: not met.
    let r = find("1 GiB");
    assert_eq!(r.met(), Some(false));
    // 0.50x against a published 0.35x, lower is better: not met.
    let r = find("system time");
    assert_eq!(r.ratio_text(), "0.50x");
    assert_eq!(r.met(), Some(false));
    assert_eq!(find("score").ratio_text(), "not measured");
    assert_eq!(find("score").met_text(), "-");
    let md = markdown(&rows);
    assert_eq!(md.lines().count(), rows.len() + 2);
    assert!(md.contains("| 000 zone->lock contention"));
    let html = html(&rows).unwrap();
    assert_eq!(html.matches("class=\"plot seedplot\"").count(), SEEDS.len());
    assert_eq!(html.matches("<tr").count(), rows.len() + 1);
    assert!(html.contains("<td class=\"met\">met</td>"));
}

#[test]
fn a_per_cpu_claim_is_read_at_one_thread_per_cpu_of_this_host() {
    let on = |cpus: Option<u64>, threads: &[usize]| {
        let mut recs = Vec::new();
        for &t in threads {
            for (v, x) in [
                ("mmkit-swap-2019", 100.0),
                ("mmkit-swap-2020", 100.0 + t as f64),
            ] {
                let mut r = rec("pmbench", None, v, t, "accesses_per_sec", x);
                if let Some(c) = cpus {
                    let mut p = serde_json::Map::new();
                    p.insert("host".into(), serde_json::json!({ "cpus": c }));
                    r.params = Some(p);
                }
                recs.push(r);
            }
        }
        let rows = rows(&recs);
        let r = rows.iter().find(|r| r.claim.label == "score").unwrap();
        (r.threads, r.ratio_text(), r.measures(), r.met())
    };
    // Two CPUs: read at 2 threads even though 4 and 16 ran.
    let (t, ratio, measures, met) = on(Some(2), &[1, 2, 4, 16]);
    assert_eq!((t, ratio.as_str(), met), (2, "1.02x", Some(false)));
    assert_eq!(
        measures,
        "pmbench @ 2 threads (one per CPU; the series: 16 on 48 CPUs): \
         mmkit-swap-2020 / mmkit-swap-2019 accesses_per_sec (102.00 vs 100.00 u)"
    );
    // Records of scaled sizes say so.
    let mut recs = vec![
        rec(
            "pmbench",
            None,
            "mmkit-swap-2019",
            2,
            "accesses_per_sec",
            1.0,
        ),
        rec(
            "pmbench",
            None,
            "mmkit-swap-2020",
            2,
            "accesses_per_sec",
            2.0,
        ),
    ];
    let mut p = serde_json::Map::new();
    p.insert("scaled".into(), true.into());
    recs[1].params = Some(p);
    let r = rows(&recs);
    let score = r.iter().find(|r| r.claim.label == "score").unwrap();
    assert!(score.scaled);
    let want = "pmbench @ 2 threads (one per CPU; the series: 16 on 48 CPUs; scaled sizes): ";
    assert!(score.measures().starts_with(want), "{}", score.measures());
    // 64 CPUs: the series' own 16.
    assert_eq!(on(Some(64), &[1, 2, 4, 16]).0, 16);
    // 8 CPUs, 8 not run: the largest below.
    assert_eq!(on(Some(8), &[1, 2, 4, 16]).0, 4);
    // No CPU count in the records: at most the series' 16.
    assert_eq!(on(None, &[1, 2, 4]).0, 4);
    // Only one variant at 2 threads: read where both ran.
    let mut recs = vec![
        rec(
            "pmbench",
            None,
            "mmkit-swap-2019",
            1,
            "accesses_per_sec",
            1.0,
        ),
        rec(
            "pmbench",
            None,
            "mmkit-swap-2020",
            1,
            "accesses_per_sec",
            2.0,
        ),
        rec(
            "pmbench",
            None,
            "mmkit-swap-2020",
            2,
            "accesses_per_sec",
            9.0,
        ),
    ];
    let r = rows(&recs);
    let score = r.iter().find(|r| r.claim.label == "score").unwrap();
    assert_eq!((score.threads, score.ratio_text().as_str()), (1, "2.00x"));
    // Nothing measured: not measured, at the series' count.
    recs.clear();
    let r = rows(&recs);
    let score = r.iter().find(|r| r.claim.label == "score").unwrap();
    assert_eq!((score.threads, score.met()), (16, None));
}

#[test]
fn a_zero_baseline_is_infinite_and_a_zero_ratio_is_drawn() {
    let recs = vec![
        rec(
            "alloc_free_batch",
            None,
            "mmkit",
            8,
            "zone_lock_contended_pct",
            0.0,
        ),
        rec(
            "alloc_free_batch",
            None,
            "mmkit-eager",
            8,
            "zone_lock_contended_pct",
            12.0,
        ),
        rec("cross_cpu_free", None, "mmkit", 2, "ops_per_sec", 5.0),
        rec("cross_cpu_free", None, "mmkit-eager", 2, "ops_per_sec", 0.0),
    ];
    let rows = rows(&recs);
    let zl = rows.iter().find(|r| r.claim.label == "zone lock").unwrap();
    assert_eq!(zl.ratio_text(), "0.00x");
    assert_eq!(zl.met(), Some(true));
    let cc = rows
        .iter()
        .find(|r| r.claim.label == "alloc/free CPUs")
        .unwrap();
    assert_eq!(cc.ratio_text(), "inf");
    assert_eq!(cc.met(), Some(true));
    let mine: Vec<&Row> = rows.iter().filter(|r| r.seed.id == "000").collect();
    let svg = svg(&SEEDS[0], &mine).unwrap();
    assert!(svg.starts_with("<svg"));
    // Background, then per claim a published bar, and a measured one where
    // both values were found (two of the four claims).
    assert!(svg.matches("<rect").count() >= 1 + 4 + 2, "{svg}");
}
