//! Tests of the swap map: reference counts, the three allocation policies, the
//! cluster lists, and allocation under real threads.

use super::*;
use std::collections::HashSet;
use std::sync::atomic::AtomicU8;
use std::sync::Arc;

const POLICIES: [SwapAllocPolicy; 3] = [
    SwapAllocPolicy::SharedCursor,
    SwapAllocPolicy::PerCpuCursor,
    SwapAllocPolicy::PerCpuCluster,
];

fn free_all(m: &SwapMap, slots: &[u32]) {
    for &s in slots {
        assert_eq!(m.swapcache_clear(s, &mut |_| {}), Ok(0));
    }
}

#[test]
fn swap_map_fills_and_empties_every_policy() {
    // Three whole clusters and a partial one.
    let nr = 3 * SWAPFILE_CLUSTER + 100;
    for p in POLICIES {
        let m = SwapMap::new(nr, p, 4, 1);
        let mut got = Vec::new();
        let mut calls = 0;
        while m.get_swap_pages(calls % 4, 7, &mut got) > 0 {
            calls += 1;
        }
        assert_eq!(got.len(), nr as usize, "{p:?}");
        assert_eq!(
            got.iter().collect::<HashSet<_>>().len(),
            nr as usize,
            "{p:?}"
        );
        assert_eq!(m.inuse(), nr as u64);
        assert_eq!(m.get_swap_pages(0, 1, &mut got), 0);
        m.check().unwrap();
        m.drain_percpu();
        assert_eq!(m.list_counts(), [0, 0, 0, 4, 0], "{p:?}");
        free_all(&m, &got);
        assert_eq!(m.inuse(), 0);
        m.check().unwrap();
        assert_eq!(m.list_counts(), [4, 0, 0, 0, 0], "{p:?}");
    }
}

#[test]
fn swap_map_counts_follow_duplicate_and_free() {
    let m = SwapMap::new(SWAPFILE_CLUSTER, SwapAllocPolicy::PerCpuCluster, 1, 1);
    let mut v = Vec::new();
    assert_eq!(m.get_swap_pages(0, 1, &mut v), 1);
    let s = v[0];
    assert_eq!(m.map_count(s), SWAP_HAS_CACHE);
    assert_eq!(m.swapcache_prepare(s), Err(MapError::CacheBusy(s)));
    m.swap_duplicate(s).unwrap();
    m.swap_duplicate(s).unwrap();
    assert_eq!(m.map_count(s), SWAP_HAS_CACHE | 2);
    let mut freed = Vec::new();
    assert_eq!(m.swapcache_clear(s, &mut |x| freed.push(x)), Ok(2));
    assert_eq!(
        m.swapcache_clear(s, &mut |x| freed.push(x)),
        Err(MapError::NoCache(s))
    );
    m.swapcache_prepare(s).unwrap();
    assert_eq!(m.swapcache_clear(s, &mut |x| freed.push(x)), Ok(2));
    assert_eq!(m.swap_free(s, &mut |x| freed.push(x)), Ok(1));
    assert!(freed.is_empty());
    assert_eq!(m.swap_free(s, &mut |x| freed.push(x)), Ok(0));
    assert_eq!(freed, vec![s]);
    assert_eq!(m.inuse(), 0);
    // A free slot refuses every operation and stays free.
    assert_eq!(
        m.swap_free(s, &mut |_| panic!()),
        Err(MapError::NotInUse(s))
    );
    assert_eq!(m.swap_duplicate(s), Err(MapError::NotInUse(s)));
    assert_eq!(m.swapcache_prepare(s), Err(MapError::NotInUse(s)));
    assert_eq!(
        m.swap_free(SWAPFILE_CLUSTER, &mut |_| {}),
        Err(MapError::OutOfRange(SWAPFILE_CLUSTER))
    );
    // The count saturates at SWAP_MAP_MAX.
    v.clear();
    m.get_swap_pages(0, 1, &mut v);
    for _ in 0..SWAP_MAP_MAX {
        m.swap_duplicate(v[0]).unwrap();
    }
    assert_eq!(m.swap_duplicate(v[0]), Err(MapError::TooManyRefs(v[0])));
    assert_eq!(m.map_count(v[0]), SWAP_HAS_CACHE | SWAP_MAP_MAX);
    m.check().unwrap();
}

#[test]
fn swap_map_lists_follow_frees() {
    for p in POLICIES {
        let m = SwapMap::new(2 * SWAPFILE_CLUSTER, p, 1, 1);
        let mut v = Vec::new();
        m.get_swap_pages(0, 2 * SWAPFILE_CLUSTER as usize, &mut v);
        m.drain_percpu();
        assert_eq!(m.list_counts(), [0, 0, 0, 2, 0], "{p:?}");
        // One free in a full cluster: nonfull.
        free_all(&m, &v[..1]);
        assert_eq!(m.list_counts(), [0, 1, 0, 1, 0], "{p:?}");
        // The whole cluster free: back on the free list.
        free_all(&m, &v[1..SWAPFILE_CLUSTER as usize]);
        assert_eq!(m.list_counts(), [1, 0, 0, 1, 0], "{p:?}");
        m.check().unwrap();
    }
}

#[test]
fn percpu_cluster_takes_device_lock_only_to_move_clusters() {
    let m = SwapMap::new(8 * SWAPFILE_CLUSTER, SwapAllocPolicy::PerCpuCluster, 1, 1);
    let si0 = m.device_lock_stats();
    let mut v = Vec::new();
    for _ in 0..4 * SWAPFILE_CLUSTER {
        assert_eq!(m.get_swap_pages(0, 1, &mut v), 1);
    }
    // Four clusters used up: 4 isolations and 3 give-backs (the 4th is still owned).
    assert_eq!(m.device_lock_stats().since(&si0).acquisitions, 7);
    assert!(m.cluster_lock_stats().acquisitions >= 4 * SWAPFILE_CLUSTER as u64);
    // The cursor policies take it for every allocation.
    let m = SwapMap::new(8 * SWAPFILE_CLUSTER, SwapAllocPolicy::SharedCursor, 1, 1);
    for _ in 0..100 {
        m.get_swap_pages(0, 1, &mut v);
    }
    assert_eq!(m.device_lock_stats().acquisitions, 100);
}

/// Fills a device, frees every other slot (no free cluster left), then lets two
/// CPUs allocate alternately; returns how often both got slots of the same trunk.
fn same_trunk_pairs(p: SwapAllocPolicy) -> usize {
    let nr = 4 * SWAP_ADDRESS_SPACE_PAGES;
    let m = SwapMap::new(nr, p, 2, 7);
    let mut v = Vec::new();
    m.get_swap_pages(0, nr as usize, &mut v);
    let odd: Vec<u32> = v.iter().copied().filter(|s| s % 2 == 1).collect();
    free_all(&m, &odd);
    let mut same = 0;
    for _ in 0..200 {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert_eq!(m.get_swap_pages(0, 1, &mut a), 1);
        assert_eq!(m.get_swap_pages(1, 1, &mut b), 1);
        if a[0] / SWAP_ADDRESS_SPACE_PAGES == b[0] / SWAP_ADDRESS_SPACE_PAGES {
            same += 1;
        }
    }
    m.check().unwrap();
    same
}

#[test]
fn cursor_policies_reproduce_the_seed() {
    // One shared cursor: neighbouring slots go to different CPUs, same trunk.
    assert!(same_trunk_pairs(SwapAllocPolicy::SharedCursor) >= 190);
    // Per-CPU cursors in different trunks.
    assert!(same_trunk_pairs(SwapAllocPolicy::PerCpuCursor) <= 100);
}

/// 16 threads (16 CPU ids on however many cores) allocate and free at random on
/// a device too small for all of them: no slot is handed out twice, the counts are
/// exact, and freeing everything leaves every cluster on the free list.
fn hammer(p: SwapAllocPolicy) {
    const THREADS: usize = 16;
    let nr = 4 * SWAPFILE_CLUSTER + 37;
    let m = Arc::new(SwapMap::new(nr, p, THREADS, 3));
    let owner: Arc<Vec<AtomicU8>> = Arc::new((0..nr).map(|_| AtomicU8::new(0)).collect());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, owner) = (m.clone(), owner.clone());
            std::thread::spawn(move || {
                let mut rng =
                    0x1234_5678_9abc_def1u64 ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let (mut held, mut allocated, mut freed, mut short) =
                    (Vec::new(), 0u64, 0u64, 0u64);
                for _ in 0..300 {
                    let n = (next() % 48 + 1) as usize;
                    let start = held.len();
                    let got = m.get_swap_pages(t, n, &mut held);
                    allocated += got as u64;
                    short += (got < n) as u64;
                    for &s in &held[start..] {
                        assert_eq!(
                            owner[s as usize].swap(1, Ordering::Relaxed),
                            0,
                            "slot {s} handed out twice"
                        );
                    }
                    let k = (next() as usize) % (held.len() + 1);
                    for _ in 0..k / 3 {
                        let i = (next() as usize) % held.len();
                        let s = held.swap_remove(i);
                        owner[s as usize].store(0, Ordering::Relaxed);
                        assert_eq!(m.swapcache_clear(s, &mut |_| {}), Ok(0));
                        freed += 1;
                    }
                }
                (held, allocated, freed, short)
            })
        })
        .collect();
    let mut held = Vec::new();
    let (mut allocated, mut freed, mut short) = (0, 0, 0);
    for h in handles {
        let (h, a, f, s) = h.join().unwrap();
        held.extend(h);
        allocated += a;
        freed += f;
        short += s;
    }
    // The device ran full: the exhaustion paths (scan, steal) were taken.
    assert!(short > 0, "{p:?}: the device never filled up");
    assert_eq!(m.inuse(), allocated - freed, "{p:?}");
    assert_eq!(m.inuse(), held.len() as u64, "{p:?}");
    m.check().unwrap();
    free_all(&m, &held);
    assert_eq!(m.inuse(), 0, "{p:?}");
    m.drain_percpu();
    m.check().unwrap();
    assert_eq!(m.list_counts(), [5, 0, 0, 0, 0], "{p:?}");
}

#[test]
fn swap_alloc_threads_shared_cursor() {
    hammer(SwapAllocPolicy::SharedCursor);
}

#[test]
fn swap_alloc_threads_percpu_cursor() {
    hammer(SwapAllocPolicy::PerCpuCursor);
}

#[test]
fn swap_alloc_threads_percpu_cluster() {
    hammer(SwapAllocPolicy::PerCpuCluster);
}
