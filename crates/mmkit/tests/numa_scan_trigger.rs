//! What starts automatic NUMA scan passes (`ScanTrigger`), tried from outside on
//! an emulated 2-node topology:
//!
//! - `Accesses { ns }` (a fixed scan-clock cost per page accessed): N accesses
//!   with a period P make exactly the passes the clock says (the first at the
//!   first access after `scan_delay`, then one every P of clock), counted the
//!   same through `write`, `read`, `touch`, `populate` and `with_page`;
//! - threads of one space racing over the due time: one pass per due time
//!   (never more passes than the clock allows), the data intact;
//! - `Manual`: no pass without `task_numa_work`; balancing off: none either;
//! - `TaskCpu` (the default, Linux's): a thread that keeps accessing its space
//!   makes the scanner run, within a bounded number of accesses.
//!
//! The periods are fixed (min = max) so that every policy gives the same one;
//! nothing here depends on timing except the bounded `TaskCpu` check.

use mmkit::{Mm, ScanParams, ScanPolicy, ScanTrigger, Space, Topology};

mod common;
use common::space_on_node0;

const PAGE: u64 = 4096;
const MS: u64 = 1_000_000;

/// A fixed period of `period_ms` (min = max; 1 MiB windows put Linux's scan
/// floor below it) after `delay_ms`.
fn params(period_ms: u64, delay_ms: u64) -> ScanParams {
    ScanParams {
        period_min_ms: period_ms,
        period_max_ms: period_ms,
        scan_size_mb: 1,
        scan_delay_ms: delay_ms,
    }
}

fn mm_with(trigger: ScanTrigger, p: ScanParams, policy: ScanPolicy) -> Mm {
    Mm::builder()
        .memory(32 << 20)
        .topology(Topology::emulated(2))
        .kcompactd(false)
        .numa_scan_policy(policy)
        .numa_scan_params(p)
        .numa_scan_trigger(trigger)
        .build()
        .expect("building an emulated 2-node mm")
}

fn passes(s: &Space) -> u64 {
    s.numa_balancing_stats().scan_passes
}

/// Passes after `n` accesses of 1 ms each, period `p` ms, delay `d` ms: at
/// clock values d' = max(d, 1), d' + p, d' + 2p, ... up to n.
fn expected(n: u64, p: u64, d: u64) -> u64 {
    let first = d.max(1);
    if n < first {
        0
    } else {
        1 + (n - first) / p
    }
}

#[test]
fn accesses_clock_gives_the_passes_the_period_says() {
    for policy in [
        ScanPolicy::Adaptive,
        ScanPolicy::FailBackoff,
        ScanPolicy::NoFailBackoff,
    ] {
        for (n, p, d) in [(1000, 100, 0), (1001, 100, 0), (999, 50, 30), (20, 100, 30)] {
            let mm = mm_with(ScanTrigger::Accesses { ns: MS }, params(p, d), policy);
            let (s, a) = space_on_node0(&mm, 8);
            let buf = [3u8; PAGE as usize];
            for i in 0..n {
                s.write(a + (i % 8) * PAGE, &buf).unwrap();
                assert_eq!(
                    passes(&s),
                    expected(i + 1, p, d),
                    "{policy:?}: after {} accesses, period {p} ms, delay {d} ms",
                    i + 1
                );
            }
            let st = s.numa_balancing_stats();
            // Every pass armed the 8 pages (all restored by the accesses between
            // passes, or still armed from the last one).
            assert!(st.numa_pte_updates <= 8 * st.scan_passes);
            assert!(st.scan_passes == 0 || st.numa_pte_updates >= 8);
            assert_eq!(st.numa_hint_faults, st.numa_hint_faults_local);
            assert_eq!(s.numa_scan_period_ms(), Some(p));
        }
    }
}

#[test]
fn every_access_call_advances_the_clock_by_its_pages() {
    let mm = mm_with(
        ScanTrigger::Accesses { ns: MS },
        params(10, 0),
        ScanPolicy::Adaptive,
    );
    let (s, a) = space_on_node0(&mm, 16);
    let mut buf = vec![0u8; PAGE as usize];
    s.touch(a, true).unwrap(); // clock 1: first pass
    assert_eq!(passes(&s), 1);
    s.read(a, &mut buf).unwrap(); // 2
    s.with_page(a + PAGE, false, |_| ()).unwrap(); // 3
    drop(s.pin_page(a, false).unwrap()); // 4
    assert_eq!(passes(&s), 1);
    // A write across 3 pages (from the middle of page 0): clock 7.
    s.write(a + PAGE / 2, &vec![5u8; 2 * PAGE as usize])
        .unwrap();
    assert_eq!(passes(&s), 1);
    // Populate 4 pages: clock 11, past the due time 1 + 10.
    s.populate(a, 4 * PAGE as usize, false).unwrap();
    assert_eq!(passes(&s), 2);
    // The next is due at 11 + 10 = 21.
    s.populate(a, 9 * PAGE as usize, true).unwrap(); // 20
    assert_eq!(passes(&s), 2);
    s.touch(a, false).unwrap(); // 21
    assert_eq!(passes(&s), 3);
    // Content intact through the armed entries.
    s.read(a + 8 * PAGE, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 8));
}

#[test]
fn racing_threads_scan_once_per_due_time() {
    let (threads, per, p) = (4u64, 500u64, 100u64);
    let mm = mm_with(
        ScanTrigger::Accesses { ns: MS },
        params(p, 0),
        ScanPolicy::NoFailBackoff,
    );
    let pages = 64;
    let (s, a) = space_on_node0(&mm, pages);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let s = &s;
            sc.spawn(move || {
                s.mm().set_thread_node((t % 2) as usize).unwrap();
                let mut buf = vec![0u8; PAGE as usize];
                for i in 0..per {
                    let page = (t * 16 + i) % pages;
                    s.read(a + page * PAGE, &mut buf).unwrap();
                    assert!(buf.iter().all(|&b| b == page as u8), "page {page}");
                }
            });
        }
    });
    let n = passes(&s);
    // Claimed at clock values at least a period apart, the first at >= 1.
    assert!(n >= 1, "no pass at all");
    assert!(n <= expected(threads * per, p, 0), "{n} passes");
}

#[test]
fn manual_trigger_and_balancing_off_never_scan_by_themselves() {
    let mm = mm_with(ScanTrigger::Manual, params(10, 0), ScanPolicy::Adaptive);
    let (s, a) = space_on_node0(&mm, 8);
    for i in 0..1000 {
        s.touch(a + (i % 8) * PAGE, true).unwrap();
    }
    assert_eq!(passes(&s), 0);
    assert_eq!(s.task_numa_work(), 8);
    assert_eq!(passes(&s), 1);

    let mm = mm_with(
        ScanTrigger::Accesses { ns: MS },
        params(10, 0),
        ScanPolicy::Adaptive,
    );
    let (s, a) = space_on_node0(&mm, 8);
    s.set_numa_balancing(false);
    for i in 0..1000 {
        s.touch(a + (i % 8) * PAGE, true).unwrap();
    }
    assert_eq!(passes(&s), 0);
    // On again: the clock did not run meanwhile; the first pass comes at once.
    s.set_numa_balancing(true);
    s.touch(a, true).unwrap();
    assert_eq!(passes(&s), 1);
}

#[test]
fn task_cpu_clock_scans_as_the_threads_work() {
    // A 2 ms period of the thread's CPU time: a few thousand accesses at most
    // (each is a page copy and a page-table walk), bounded so it cannot hang.
    let mm = mm_with(ScanTrigger::TaskCpu, params(2, 0), ScanPolicy::Adaptive);
    let (s, a) = space_on_node0(&mm, 32);
    let buf = [9u8; PAGE as usize];
    let mut i = 0u64;
    while passes(&s) < 3 && i < 5_000_000 {
        s.write(a + (i % 32) * PAGE, &buf).unwrap();
        i += 1;
    }
    assert!(passes(&s) >= 3, "{} passes after {i} accesses", passes(&s));
    let mut out = vec![0u8; PAGE as usize];
    for p in 0..32 {
        s.read(a + p * PAGE, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 9 || b == p as u8));
    }
}
