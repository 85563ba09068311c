//! Tests of the scan-period policies on synthetic window sequences, and of the
//! two-stage filter.

use super::*;

/// A 256 MiB space: scan_min 1000 ms, scan_max 60000 ms with the defaults.
const RSS: u64 = 256 << (20 - PAGE_SHIFT);

fn new(policy: ScanPolicy) -> ScanPeriod {
    ScanPeriod::new(policy, ScanParams::default(), RSS)
}

/// Faults on remote pages, half of them shared (numa01's pattern), nothing
/// migrated (pages stay misplaced).
fn remote(n: u64) -> ScanWindow {
    ScanWindow {
        faults_remote: n,
        faults_private: n / 2,
        faults_shared: n - n / 2,
        ..ScanWindow::default()
    }
}

/// Private remote faults whose migrations all fail: target node 1 is full.
fn failing(n: u64) -> ScanWindow {
    let mut w = remote(n);
    w.record_fail(MigrateFail::NodeFull, 1, n);
    w
}

/// Migrations succeed again: 30 of 100 faults moved their page (local after the
/// move), 70 still remote.
fn recovering() -> ScanWindow {
    let mut w = ScanWindow {
        faults_local: 30,
        faults_remote: 70,
        faults_private: 50,
        faults_shared: 50,
        ..ScanWindow::default()
    };
    w.record_migrated(1, 30);
    w
}

fn run(p: &mut ScanPeriod, w: &ScanWindow, times: usize) -> Vec<u64> {
    (0..times).map(|_| p.update(w, RSS).period_ms).collect()
}

#[test]
fn scan_period_scales_with_space_size() {
    let s = ScanParams::default();
    assert_eq!((s.scan_min(0), s.scan_max(0)), (1000, 60000));
    assert_eq!((s.scan_min(RSS), s.scan_max(RSS)), (1000, 60000));
    // 2.5 GiB: 10 windows.
    assert_eq!((s.scan_min(10 * RSS), s.scan_max(10 * RSS)), (100, 6000));
    // 10 GiB: 40 windows, the minimum floored at 100 ms (2560 MB/s at most).
    assert_eq!((s.scan_min(40 * RSS), s.scan_max(40 * RSS)), (100, 1500));
    // Just over one window rounds up to two.
    assert_eq!(s.nr_scan_windows(RSS + 1), 2);
    for p in ScanPolicy::ALL_FOR_TESTS {
        assert_eq!(ScanPeriod::new(p, s, 10 * RSS).period_ms(), 100);
    }
}

#[test]
fn remote_faults_keep_every_policy_fast_without_failures() {
    for policy in ScanPolicy::ALL_FOR_TESTS {
        let mut p = new(policy);
        let periods = run(&mut p, &remote(100), 10);
        assert!(
            periods.iter().all(|&ms| ms == 1000),
            "{policy:?}: {periods:?}"
        );
        // Mostly local faults slow every policy down: Linux's by the locality
        // rule, Adaptive's (converged: nothing to move) by doubling.
        let local = ScanWindow {
            faults_local: 100,
            faults_private: 100,
            ..ScanWindow::default()
        };
        let slower = run(&mut p, &local, 3);
        let want = if policy == ScanPolicy::Adaptive {
            vec![2000, 4000, 8000]
        } else {
            vec![1300, 1690, 2197]
        };
        assert_eq!(slower, want, "{policy:?}");
    }
}

#[test]
fn only_private_remote_faults_slow_linux_down_but_not_adaptive() {
    // Linux tests `local + shared == 0` as "no faults": a window of private
    // faults that all stayed remote doubles the period there. Adaptive tests for
    // no hint faults at all.
    let w = ScanWindow {
        faults_remote: 100,
        faults_private: 100,
        ..ScanWindow::default()
    };
    for policy in [ScanPolicy::NoFailBackoff, ScanPolicy::FailBackoff] {
        assert_eq!(
            run(&mut new(policy), &w, 3),
            vec![2000, 4000, 8000],
            "{policy:?}"
        );
    }
    assert_eq!(run(&mut new(ScanPolicy::Adaptive), &w, 3), vec![1000; 3]);
    let idle = ScanWindow::default();
    assert_eq!(
        run(&mut new(ScanPolicy::Adaptive), &idle, 3),
        vec![2000, 4000, 8000]
    );
}

#[test]
fn no_fail_backoff_ignores_failures() {
    let mut p = new(ScanPolicy::NoFailBackoff);
    let periods = run(&mut p, &failing(100), 20);
    assert!(periods.iter().all(|&ms| ms == 1000), "{periods:?}");
    assert_eq!(p.failure_record(), 0);
    assert!(p.avoid_targets().is_empty());
}

#[test]
fn fail_backoff_stays_slow_forever_after_one_bad_window() {
    let mut p = new(ScanPolicy::FailBackoff);
    run(&mut p, &remote(100), 3);
    assert_eq!(p.period_ms(), 1000);
    assert_eq!(p.update(&failing(100), RSS).period_ms, 2000);
    // Migrations succeed from now on, yet the record is never cleared: the
    // period doubles every window up to the maximum and stays there.
    let after = run(&mut p, &recovering(), 50);
    assert_eq!(&after[..5], &[4000, 8000, 16000, 32000, 60000]);
    assert!(after[4..].iter().all(|&ms| ms == 60000), "{after:?}");
    assert_eq!(p.failure_record(), 100);
    assert!(p.avoid_targets().is_empty());
}

#[test]
fn adaptive_backs_off_on_a_full_node_and_recovers_within_two_periods() {
    let mut p = new(ScanPolicy::Adaptive);
    run(&mut p, &remote(100), 3);
    let bad = run(&mut p, &failing(100), 6);
    assert_eq!(bad, vec![2000, 4000, 8000, 16000, 32000, 60000]);
    assert_eq!(p.avoid_targets(), NodeMask::from_nodes(&[1]));
    let good = run(&mut p, &recovering(), 2);
    assert_eq!(good[1], 1000, "back to the min period within two: {good:?}");
    assert_eq!(good[0], 1000);
    assert!(p.avoid_targets().is_empty(), "node 1 accepted pages again");
    assert_eq!(p.aged_failures(), [0; NR_MIGRATE_FAIL]);
}

#[test]
fn seed_direction_fewer_scans_while_migrations_fail() {
    // Passes made in 10 minutes of failing windows, per policy.
    let passes = |policy| {
        let mut p = new(policy);
        let (mut t, mut n) = (0u64, 0u64);
        while t < 600_000 {
            t += p.update(&failing(100), RSS).period_ms;
            n += 1;
        }
        n
    };
    let (linux4, seed, adaptive) = (
        passes(ScanPolicy::NoFailBackoff),
        passes(ScanPolicy::FailBackoff),
        passes(ScanPolicy::Adaptive),
    );
    assert_eq!(linux4, 600);
    assert!(seed * 10 < linux4, "{seed} vs {linux4}");
    assert!(adaptive <= seed, "{adaptive} vs {seed}");
}

#[test]
fn adaptive_forgets_failures_as_they_age() {
    let mut p = new(ScanPolicy::Adaptive);
    run(&mut p, &failing(100), 3);
    assert_eq!(p.period_ms(), 8000);
    assert_eq!(p.aged_failures()[MigrateFail::NodeFull as usize], 175);
    // No migration is attempted any more (nothing passes the filter) and no
    // failure is seen: the back-off unwinds a step per window, the aged record
    // halves, and the full node leaves the avoid set after two windows.
    let later = run(&mut p, &remote(100), 4);
    assert_eq!(later, vec![4000, 2000, 1000, 1000]);
    assert_eq!(p.aged_failures()[MigrateFail::NodeFull as usize], 175 / 16);
    assert!(p.avoid_targets().is_empty());
}

#[test]
fn adaptive_full_node_leaves_avoid_set_after_two_windows() {
    let mut p = new(ScanPolicy::Adaptive);
    p.update(&failing(10), RSS);
    assert_eq!(p.avoid_targets(), NodeMask::from_nodes(&[1]));
    p.update(&remote(10), RSS);
    assert_eq!(p.avoid_targets(), NodeMask::from_nodes(&[1]));
    p.update(&remote(10), RSS);
    assert!(p.avoid_targets().is_empty());
}

#[test]
fn adaptive_backs_off_by_cause() {
    // A few pinned pages among many faults: keep scanning at full rate.
    let mut p = new(ScanPolicy::Adaptive);
    let mut w = remote(100);
    w.record_fail(MigrateFail::Pinned, 1, 10);
    w.record_migrated(1, 5);
    assert!(run(&mut p, &w, 5).iter().all(|&ms| ms == 1000));
    // Pinned pages make up most faults: back off.
    let mut w = remote(100);
    w.record_fail(MigrateFail::Pinned, 1, 80);
    assert_eq!(run(&mut p, &w, 2), vec![2000, 4000]);
    assert!(p.avoid_targets().is_empty(), "pinned is not a full node");
    // Rate limiting backs off at once, even when it is a minority.
    let mut p = new(ScanPolicy::Adaptive);
    let mut w = remote(100);
    w.record_fail(MigrateFail::RateLimited, 0, 10);
    assert_eq!(run(&mut p, &w, 2), vec![2000, 4000]);
}

#[test]
fn periods_stay_within_bounds() {
    let windows = [
        remote(100),
        failing(100),
        recovering(),
        ScanWindow::default(),
    ];
    for policy in ScanPolicy::ALL_FOR_TESTS {
        let mut p = ScanPeriod::new(policy, ScanParams::default(), 10 * RSS);
        for i in 0..200usize {
            let ms = p.update(&windows[(i * 7 + i / 3) % 4], 10 * RSS).period_ms;
            assert!((100..=6000).contains(&ms), "{policy:?}: {ms}");
        }
    }
}

impl ScanPolicy {
    const ALL_FOR_TESTS: [ScanPolicy; 3] = [
        ScanPolicy::NoFailBackoff,
        ScanPolicy::FailBackoff,
        ScanPolicy::Adaptive,
    ];
}

#[test]
fn cpupid_packing() {
    let a = Cpupid::new(5, 0x1_2345);
    assert_eq!(a.node(), Some(5));
    assert!(a.same_pid(Cpupid::new(3, 0x2345)));
    assert!(!a.same_pid(Cpupid::new(5, 0x2346)));
    assert_eq!(Cpupid::from_raw(a.raw()), a);
    assert!(Cpupid::UNSET.is_unset() && Cpupid::UNSET.node().is_none());
    assert!(!Cpupid::UNSET.same_pid(Cpupid::UNSET));
}

#[test]
fn two_stage_filter() {
    let me = Cpupid::new(1, 7);
    let q = |last, early, group| MigrateQuery {
        this: me,
        last,
        src_nid: 0,
        dst_nid: 1,
        early,
        group,
    };
    // Early in the space's life: first and private faults migrate at once.
    assert!(should_numa_migrate_memory(&q(Cpupid::UNSET, true, None)));
    assert!(should_numa_migrate_memory(&q(
        Cpupid::new(0, 7),
        true,
        None
    )));
    // Later: the previous fault must come from the destination node.
    assert!(!should_numa_migrate_memory(&q(
        Cpupid::new(0, 7),
        false,
        None
    )));
    assert!(!should_numa_migrate_memory(&q(
        Cpupid::new(0, 9),
        false,
        None
    )));
    assert!(should_numa_migrate_memory(&q(
        Cpupid::new(1, 7),
        false,
        None
    )));
    // A shared fault from the same node without a group migrates.
    assert!(should_numa_migrate_memory(&q(
        Cpupid::new(1, 9),
        false,
        None
    )));
    assert!(should_numa_migrate_memory(&q(Cpupid::UNSET, false, None)));
    // With a group: the destination must be much busier, or win with 3/4
    // hysteresis.
    let g = |cpu_dst, cpu_src, mem_src, mem_dst| {
        Some(GroupFaults {
            cpu_dst,
            cpu_src,
            mem_src,
            mem_dst,
        })
    };
    let shared = Cpupid::new(1, 9);
    assert!(should_numa_migrate_memory(&q(
        shared,
        false,
        g(31, 10, 0, 100)
    )));
    assert!(!should_numa_migrate_memory(&q(
        shared,
        false,
        g(10, 10, 10, 10)
    )));
    assert!(should_numa_migrate_memory(&q(
        shared,
        false,
        g(20, 10, 10, 10)
    )));
    assert!(!should_numa_migrate_memory(&q(
        shared,
        false,
        g(13, 10, 10, 10)
    )));
}
