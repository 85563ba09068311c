//! loom models of the `PerCpuCluster` protocol, on the real `SwapMap` (clusters of
//! 2 slots under `--cfg loom`): CPUs allocate from the clusters they own under
//! the cluster lock; giving one back and taking another moves it under the device
//! lock (cluster lock -> device lock); the device lock only `try_lock`s a cluster;
//! a free that changes a cluster's list takes the device lock under the cluster
//! lock. loom explores the interleavings (and the atomics' orderings): no slot is
//! handed out twice, no deadlock, and the counts and lists are exact afterwards.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p mmkit --lib --release swap_cluster::loom`

use super::*;
use loom::sync::Arc;
use loom::thread;

/// The bound for models whose spinning makes unbounded exploration endless.
const PREEMPTIONS: usize = 10;

/// Runs `f` under loom, with at most `preemptions` preemptions per path (None:
/// every interleaving); returns how many interleavings it explored.
fn model(preemptions: Option<usize>, f: impl Fn() + Sync + Send + 'static) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let mut b = loom::model::Builder::new();
    // Spinning lock waiters and `Busy` retries make long paths.
    b.preemption_bound = preemptions;
    b.max_branches = 20_000;
    let r = runs.clone();
    b.check(move || {
        r.fetch_add(1, Ordering::Relaxed);
        f()
    });
    runs.load(Ordering::Relaxed)
}

/// A map of two clusters, every slot in use, both clusters on the full list.
fn full_map() -> Arc<SwapMap> {
    let m = Arc::new(SwapMap::new(
        2 * SWAPFILE_CLUSTER,
        SwapAllocPolicy::PerCpuCluster,
        2,
        1,
    ));
    let mut all = Vec::new();
    assert_eq!(m.get_swap_pages(1, 4, &mut all), 4);
    m.drain_percpu();
    m
}

/// Two CPUs allocate concurrently on two clusters: one each, then the one that
/// uses its cluster up takes the other's leftovers (steal) or finds none.
#[test]
fn loom_percpu_cluster_two_allocators() {
    let runs = model(None, || {
        let m = Arc::new(SwapMap::new(
            2 * SWAPFILE_CLUSTER,
            SwapAllocPolicy::PerCpuCluster,
            2,
            1,
        ));
        let m1 = m.clone();
        let t = thread::spawn(move || {
            let mut v = Vec::new();
            m1.get_swap_pages(1, 2, &mut v);
            v
        });
        let mut a = Vec::new();
        m.get_swap_pages(0, 1, &mut a);
        m.get_swap_pages(0, 1, &mut a);
        let b = t.join().unwrap();
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        assert_eq!(all.len(), 4);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, vec![0, 1, 2, 3], "a slot handed out twice");
        assert_eq!(m.inuse(), 4);
        m.check().unwrap();
    });
    eprintln!("{runs} interleavings");
    assert!(runs > 10);
}

/// A free moves a full cluster back to the nonfull list (cluster lock, then
/// device lock) while another CPU looks for a cluster under the device lock
/// (try_lock only): no deadlock, and the allocator gets the freed slot or finds
/// the device full.
#[test]
fn loom_percpu_cluster_free_races_isolate() {
    let runs = model(None, || {
        let m = full_map();
        let m1 = m.clone();
        let t = thread::spawn(move || {
            assert_eq!(m1.swapcache_clear(0, &mut |_| {}), Ok(0));
        });
        let mut got = Vec::new();
        m.get_swap_pages(0, 1, &mut got);
        t.join().unwrap();
        assert!(got.is_empty() || got == [0], "{got:?}");
        assert_eq!(m.inuse(), 3 + got.len() as u64);
        m.check().unwrap();
        if got.is_empty() {
            assert_eq!(m.get_swap_pages(0, 1, &mut got), 1);
            assert_eq!(got, [0]);
        }
        m.drain_percpu();
        assert_eq!(m.list_counts(), [0, 0, 0, 2, 0]);
    });
    eprintln!("{runs} interleavings");
    assert!(runs > 10);
}

/// A free empties a nonfull cluster (cluster lock held, device lock wanted) while
/// another CPU, holding the device lock, finds that cluster locked on the nonfull
/// list: it must let go and retry (`Isolated::Busy`), not wait (deadlock).
#[test]
fn loom_percpu_cluster_busy_cluster_is_retried() {
    let runs = model(Some(PREEMPTIONS), || {
        let m = full_map();
        assert_eq!(m.swapcache_clear(1, &mut |_| {}), Ok(0));
        assert_eq!(m.list_counts(), [0, 1, 0, 1, 0]);
        let m1 = m.clone();
        let t = thread::spawn(move || {
            assert_eq!(m1.swapcache_clear(0, &mut |_| {}), Ok(0));
        });
        let mut got = Vec::new();
        assert_eq!(m.get_swap_pages(0, 1, &mut got), 1);
        t.join().unwrap();
        assert!(got == [0] || got == [1], "{got:?}");
        assert_eq!(m.inuse(), 3);
        m.check().unwrap();
    });
    eprintln!("{runs} interleavings");
    assert!(runs > 10);
}
