//! Automatic NUMA balancing, tried from outside on an
//! emulated 2-node topology, the scanner driven by hand (`task_numa_work`, the
//! background thread off) except where said:
//!
//! - a scan pass arms exactly the present entries; hint faults restore them with
//!   the content intact, and count as local;
//! - pages migrate toward the node that faults on them; every byte survives
//!   readers and writers on both nodes running through scans and migrations;
//! - pinned pages never move (failed: pinned), a `Bind` range is refused by
//!   policy, a full target node fails as node-full, with exact counts;
//! - the counters add up (hint faults = local + remote, failures = sum of the
//!   causes, the Mm's = the sum of its spaces');
//! - the three scan policies through the real scanner, the target node full and
//!   then freed: `NoFailBackoff` stays fast, `FailBackoff` slows to the maximum
//!   and stays there, `Adaptive` backs off and recovers within two periods;
//! - the background scanner arms entries by itself.

use std::time::{Duration, Instant};

use mmkit::{
    Error, Gfp, MapFlags, MbindFlags, MemPolicy, MigrateFail, Mm, NodeMask, NumabStats, Pfn,
    ScanParams, ScanPolicy, Space, Topology,
};

const MIB: usize = 1 << 20;
mod common;
use common::space_on_node0;

const PAGE: u64 = 4096;

fn params() -> ScanParams {
    ScanParams {
        period_min_ms: 100,
        period_max_ms: 1600,
        scan_size_mb: 256,
        scan_delay_ms: 0,
    }
}

fn mm_with(policy: ScanPolicy, kthread: bool) -> Mm {
    Mm::builder()
        .memory(32 * MIB)
        .topology(Topology::emulated(2))
        .kcompactd(false)
        .numa_scan_policy(policy)
        .numa_scan_params(params())
        .numa_scan_thread(kthread)
        .build()
        .expect("building an emulated 2-node mm")
}

/// Reads every page from a new thread on `node`; checks each page's bytes.
fn read_all_from(s: &Space, a: u64, pages: u64, node: usize) {
    std::thread::scope(|sc| {
        sc.spawn(|| {
            s.mm().set_thread_node(node).unwrap();
            let mut buf = vec![0u8; PAGE as usize];
            for i in 0..pages {
                s.read(a + i * PAGE, &mut buf).unwrap();
                assert!(buf.iter().all(|&b| b == i as u8), "page {i} changed");
            }
        });
    });
}

fn nodes_of(s: &Space, a: u64, pages: u64) -> Vec<usize> {
    (0..pages)
        .map(|i| s.node_of(a + i * PAGE).unwrap())
        .collect()
}

/// hint faults = local + remote; failures = sum of causes; migrations =
/// successes (nothing else migrates here).
fn check_sums(st: &NumabStats, remote: u64) {
    assert_eq!(st.numa_hint_faults, st.numa_hint_faults_local + remote);
    assert_eq!(st.pgmigrate_fail, st.migrate_fail.iter().sum::<u64>());
    assert_eq!(st.numa_pages_migrated, st.pgmigrate_success);
}

fn exhaust_node(mm: &Mm, node: usize) -> Vec<Pfn> {
    let mut got = Vec::new();
    loop {
        match mm.alloc_pages_node(node, Gfp::KERNEL | Gfp::THISNODE, 0) {
            Ok(p) => got.push(p),
            Err(Error::NoMemory { .. }) => return got,
            Err(e) => panic!("alloc on node {node}: {e:?}"),
        }
    }
}

#[test]
fn hint_faults_restore_access_with_content_intact() {
    let mm = mm_with(ScanPolicy::Adaptive, false);
    let (s, a) = space_on_node0(&mm, 40);
    assert_eq!(s.task_numa_work(), 40);
    assert!((0..40).all(|i| s.translate(a + i * PAGE).unwrap().numa_hint));
    read_all_from(&s, a, 40, 0);
    assert!((0..40).all(|i| !s.translate(a + i * PAGE).unwrap().numa_hint));
    let st = s.numa_balancing_stats();
    assert_eq!(st.numa_pte_updates, 40);
    assert_eq!(st.numa_huge_pte_updates, 0);
    assert_eq!(st.numa_hint_faults, 40);
    assert_eq!(st.numa_hint_faults_local, 40);
    assert_eq!(st.numa_pages_migrated, 0);
    check_sums(&st, 0);
    assert_eq!(nodes_of(&s, a, 40), vec![0; 40]);
    // Off: nothing is armed.
    s.set_numa_balancing(false);
    assert_eq!(s.task_numa_work(), 0);
    drop(s);
    mm.check().unwrap();
}

#[test]
fn huge_pmds_are_armed_and_restored() {
    let mm = mm_with(ScanPolicy::Adaptive, false);
    mm.set_thread_node(0).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
    s.write(a, b"huge").unwrap();
    s.write(a + 2 * MIB as u64, b"page").unwrap();
    assert_eq!(s.stats().huge_pages, 2);
    s.set_numa_balancing(true);
    assert_eq!(s.task_numa_work(), 1024);
    let st = s.numa_balancing_stats();
    assert_eq!((st.numa_pte_updates, st.numa_huge_pte_updates), (1024, 2));
    let mut b = [0u8; 4];
    s.read(a, &mut b).unwrap();
    assert_eq!(&b, b"huge");
    s.read(a + 2 * MIB as u64, &mut b).unwrap();
    assert_eq!(&b, b"page");
    let st = s.numa_balancing_stats();
    assert_eq!((st.numa_hint_faults, st.numa_hint_faults_local), (2, 2));
    drop(s);
    mm.check().unwrap();
}

#[test]
fn pages_migrate_toward_the_faulting_node() {
    let mm = mm_with(ScanPolicy::Adaptive, false);
    let (s, a) = space_on_node0(&mm, 64);
    assert_eq!(s.task_numa_work(), 64);
    read_all_from(&s, a, 64, 1);
    assert_eq!(nodes_of(&s, a, 64), vec![1; 64]);
    let st = s.numa_balancing_stats();
    assert_eq!(st.numa_hint_faults, 64);
    // Migrated, so local after the fault (Linux's TNF_MIGRATED).
    assert_eq!(st.numa_hint_faults_local, 64);
    assert_eq!(st.numa_pages_migrated, 64);
    assert_eq!(st.pgmigrate_fail, 0);
    check_sums(&st, 0);
    read_all_from(&s, a, 64, 1);
    assert_eq!(mm.numa_balancing_stats(), s.numa_balancing_stats());
    drop(s);
    mm.check().unwrap();
}

/// Writers on node 1 and readers on both nodes run while the main thread scans
/// and pages migrate back and forth; every page always holds one value
/// repeated, values only grow, and the last written value is what stays.
#[test]
fn every_byte_survives_concurrent_readers_and_writers() {
    const PAGES: u64 = 32;
    const ROUNDS: u8 = 60;
    let mm = mm_with(ScanPolicy::NoFailBackoff, false);
    let (s, a) = space_on_node0(&mm, PAGES);
    for i in 0..PAGES {
        s.write(a + i * PAGE, &[0; PAGE as usize]).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let writer = sc.spawn(|| {
            mm.set_thread_node(1).unwrap();
            for v in 1..=ROUNDS {
                for i in 0..PAGES {
                    s.write(a + i * PAGE, &[v; PAGE as usize]).unwrap();
                }
            }
        });
        for node in [0, 1] {
            let (s, mm, done) = (&s, &mm, &done);
            sc.spawn(move || {
                mm.set_thread_node(node).unwrap();
                let mut last = [0u8; PAGES as usize];
                let mut buf = vec![0u8; PAGE as usize];
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    for i in 0..PAGES {
                        s.read(a + i * PAGE, &mut buf).unwrap();
                        let v = buf[0];
                        assert!(buf.iter().all(|&b| b == v), "torn page {i}");
                        assert!(v >= last[i as usize], "page {i} went back");
                        last[i as usize] = v;
                    }
                }
            });
        }
        while !writer.is_finished() {
            s.task_numa_work();
            std::thread::yield_now();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    let mut buf = vec![0u8; PAGE as usize];
    for i in 0..PAGES {
        s.read(a + i * PAGE, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == ROUNDS));
    }
    let st = s.numa_balancing_stats();
    assert_eq!(st.pgmigrate_fail, st.migrate_fail.iter().sum::<u64>());
    assert_eq!(st.numa_pages_migrated, st.pgmigrate_success);
    assert_eq!(s.stats().rss_pages, PAGES);
    drop(s);
    mm.check().unwrap();
}

#[test]
fn pinned_pages_never_move() {
    let mm = mm_with(ScanPolicy::Adaptive, false);
    let (s, a) = space_on_node0(&mm, 16);
    let pins: Vec<_> = (0..16)
        .step_by(4)
        .map(|i| s.pin_page(a + i * PAGE, false).unwrap())
        .collect();
    for _ in 0..3 {
        s.task_numa_work();
        read_all_from(&s, a, 16, 1);
    }
    let want: Vec<usize> = (0..16).map(|i| usize::from(i % 4 != 0)).collect();
    assert_eq!(nodes_of(&s, a, 16), want);
    for p in &pins {
        assert_eq!(mm.node_of(p.pfn()), 0);
    }
    let st = s.numa_balancing_stats();
    assert_eq!(st.numa_pages_migrated, 12);
    // Each pass re-arms the four pinned pages; each fault on them fails.
    assert_eq!(st.failed(MigrateFail::Pinned), 4 * 3);
    assert_eq!(st.pgmigrate_fail, 12);
    assert_eq!(st.numa_hint_faults, 16 + 16 + 16);
    check_sums(&st, 12);
    drop(pins);
    drop(s);
    mm.check().unwrap();
}

#[test]
fn bind_refuses_and_full_node_fails_by_cause() {
    let mm = mm_with(ScanPolicy::NoFailBackoff, false);
    let (s, a) = space_on_node0(&mm, 16);
    s.mbind(
        a,
        8 * PAGE as usize,
        MemPolicy::Bind(NodeMask::from_nodes(&[0])),
        MbindFlags::empty(),
    )
    .unwrap();
    s.task_numa_work();
    read_all_from(&s, a, 16, 1);
    let st = s.numa_balancing_stats();
    assert_eq!(st.failed(MigrateFail::Policy), 8);
    assert_eq!(st.numa_pages_migrated, 8);
    assert_eq!(nodes_of(&s, a, 8), vec![0; 8]);
    // Node 1 full: the pages that moved there stay; those bound stay; a new
    // range's pages fail as node-full.
    let b = s.mmap(8 * PAGE as usize, MapFlags::empty()).unwrap();
    for i in 0..8 {
        s.write(b + i * PAGE, &[i as u8; PAGE as usize]).unwrap();
    }
    mm.drain_all_pages();
    let hog = exhaust_node(&mm, 1);
    assert!(!hog.is_empty());
    s.task_numa_work();
    read_all_from(&s, b, 8, 1);
    let st = s.numa_balancing_stats();
    assert_eq!(st.failed(MigrateFail::NodeFull), 8);
    assert_eq!(st.failed(MigrateFail::Policy), 8);
    assert_eq!(st.failed(MigrateFail::Pinned), 0);
    assert_eq!(st.pgmigrate_fail, 16);
    assert_eq!(nodes_of(&s, b, 8), vec![0; 8]);
    // The pass armed all 24 pages; only `b`'s were accessed: 16 + 8 faults,
    // remote: the 8 bound pages the first time and the 8 of `b`.
    assert_eq!(st.numa_pte_updates, 16 + 24);
    assert_eq!(st.numa_hint_faults, 24);
    check_sums(&st, 8 + 8);
    for p in hog {
        mm.free_pages(p, 0).unwrap();
    }
    drop(s);
    mm.check().unwrap();
}

/// One window: a scan pass, then a new thread on node 1 reads every page (a
/// new thread each window, so the faults are shared, as numa01's are).
fn window(s: &Space, a: u64, pages: u64) -> u64 {
    s.task_numa_work();
    read_all_from(s, a, pages, 1);
    s.numa_scan_period_ms().unwrap()
}

/// The scan periods of `policy` over 8 windows with node 1 full, then 6 windows
/// after it was freed; and the pages on node 1 at the end.
fn periods(policy: ScanPolicy) -> (Vec<u64>, Vec<u64>, usize) {
    let mm = mm_with(policy, false);
    let (s, a) = space_on_node0(&mm, 64);
    mm.drain_all_pages();
    let hog = exhaust_node(&mm, 1);
    let full: Vec<u64> = (0..8).map(|_| window(&s, a, 64)).collect();
    for p in hog {
        mm.free_pages(p, 0).unwrap();
    }
    let after: Vec<u64> = (0..6).map(|_| window(&s, a, 64)).collect();
    let st = s.numa_balancing_stats();
    check_sums(&st, st.numa_hint_faults - st.numa_hint_faults_local);
    assert_eq!(st.pgmigrate_fail, st.failed(MigrateFail::NodeFull));
    let on1 = nodes_of(&s, a, 64).iter().filter(|&&n| n == 1).count();
    drop(s);
    mm.check().unwrap();
    (full, after, on1)
}

#[test]
fn scan_policies_through_the_scanner_full_then_freed() {
    // The Linux rules double the period after the empty first window and after
    // the window of first (private, remote) faults; shared remote faults then
    // keep it there, failures or not.
    let (full, _, on1) = periods(ScanPolicy::NoFailBackoff);
    assert_eq!(full, [200, 400, 400, 400, 400, 400, 400, 400]);
    assert_eq!(on1, 64);

    // The seed: every window with a failure on record doubles the period, and
    // the record is never cleared.
    let (full, after, _) = periods(ScanPolicy::FailBackoff);
    assert_eq!(full, [200, 400, 800, 1600, 1600, 1600, 1600, 1600]);
    assert_eq!(after, [1600; 6], "the flaw");

    // Backs off while the node is full (only probes armed), and the second
    // window after the node was freed is back at the minimum.
    let (full, after, on1) = periods(ScanPolicy::Adaptive);
    assert_eq!(full, [200, 200, 400, 800, 1600, 1600, 1600, 1600]);
    assert_eq!(after[..2], [1600, 100], "recovers within two periods");
    assert_eq!(on1, 64);
}

#[test]
fn the_background_scanner_arms_entries() {
    let mm = mm_with(ScanPolicy::Adaptive, true);
    let (s, a) = space_on_node0(&mm, 32);
    let t0 = Instant::now();
    while s.numa_balancing_stats().numa_pte_updates < 32 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no scan ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    read_all_from(&s, a, 32, 1);
    assert!(s.numa_balancing_stats().numa_hint_faults >= 1);
    assert!(s.numa_balancing_stats().scan_passes >= 1);
    s.set_numa_balancing(false);
    drop(s);
    mm.check().unwrap();
}
