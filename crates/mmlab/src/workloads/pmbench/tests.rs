//! Tests of the pmbench loop, its figures, the steadiness check and sizes.

use super::device::swap_file_for;
use super::*;

/// Plain host memory for the loop's tests.
struct VecMem(Vec<u32>);

impl Memory for VecMem {
    fn len(&self) -> u64 {
        self.0.len() as u64 * 4
    }
    fn read4(&mut self, off: u64) -> bool {
        std::hint::black_box(self.0[(off / 4) as usize]);
        true
    }
    fn write4(&mut self, off: u64, v: u32) -> bool {
        self.0[(off / 4) as usize] = v | 1;
        true
    }
}

#[test]
fn the_mix_is_80_20_and_uniform() {
    let pages = 64;
    let mut lp = AccessLoop::new(VecMem(vec![0; pages * 1024]), 3);
    assert_eq!(lp.batch(100_000, true), 100_000);
    let w = lp.writes as f64 / 100_000.0;
    assert!((0.19..0.21).contains(&w), "write share {w}");
    assert_eq!(lp.reads + lp.writes, 100_000);
    assert_eq!(lp.samples.len(), (100_000 / SAMPLE_EVERY) as usize);
    // Every page was written some time (uniform over the pages).
    let touched = (0..pages)
        .filter(|p| lp.mem.0[p * 1024..(p + 1) * 1024].iter().any(|&x| x != 0))
        .count();
    assert_eq!(touched, pages);
    // Warmup accesses are not timed.
    let before = lp.samples.len();
    lp.batch(1000, false);
    assert_eq!(lp.samples.len(), before);
}

#[test]
fn figures_of_a_small_case() {
    let o = Outcome {
        accesses: 2_000_000,
        reads: 1_600_000,
        writes: 400_000,
        failures: 0,
        elapsed: Duration::from_secs(2),
        samples: (1..=100).map(|x| x * 10).collect(),
        per_thread: vec![1_200_000, 200_000, 600_000],
    };
    let f = figures(&o, 2.0, 500_000, 250_000, None);
    let get = |n: &str| f.iter().find(|x| x.metric == n).unwrap().value;
    assert_eq!(get("accesses_per_sec"), 1e6);
    assert!((get("swapin_gb_per_sec") - 1.024).abs() < 1e-9);
    assert!((get("swapout_gb_per_sec") - 0.512).abs() < 1e-9);
    assert!((get("access_latency_p50_ns") - 500.0).abs() <= 1.0);
    assert!((get("access_latency_p99_ns") - 990.0).abs() <= 1.0);
    assert!(f.iter().all(|x| !x.metric.ends_with("contended_pct")));
    // Per-thread rates over the same 2 s: 100k, 300k, 600k per second.
    assert_eq!(get("thread_accesses_per_sec_min"), 100_000.0);
    assert_eq!(get("thread_accesses_per_sec_median"), 300_000.0);
    assert_eq!(get("thread_accesses_per_sec_max"), 600_000.0);
    let l = LockPcts {
        swap_cache: 1.0,
        swap: 2.0,
        lru: 3.0,
    };
    let f = figures(&o, 2.0, 0, 0, Some(l));
    assert_eq!(f.len(), METRICS.len());
    assert_eq!(quantile(&[], 0.5), 0.0);
}

#[test]
fn lock_percentages_and_swap_files() {
    let l = |acquisitions, contended| LockStats {
        acquisitions,
        contended,
        wait_ns: 0,
    };
    let before = SwapLocks::default();
    let trunks = SwapLocks {
        device: l(100, 1),
        cluster: l(100, 3),
        trunk: l(200, 20),
        lru: l(50, 5),
    };
    let p = trunks.pcts_since(&before);
    assert_eq!((p.swap_cache, p.swap, p.lru), (10.0, 2.0, 10.0));
    // The swap table takes no trunk lock: its writes take the cluster lock.
    let table = SwapLocks {
        trunk: l(0, 0),
        ..trunks
    };
    assert_eq!(table.pcts_since(&before).swap_cache, 3.0);
    assert_eq!(trunks.pcts_since(&trunks).swap, 0.0);
    let f = swap_file_for(std::path::Path::new("/var/tmp/s"), "mmkit-swap-6.18");
    assert_eq!(f, std::path::PathBuf::from("/var/tmp/s.mmkit-swap-6.18"));
}

#[test]
fn steadiness() {
    let mut s = Steady::default();
    assert!(!s.feed(0.0, 0, 0));
    assert!(!s.feed(1.0, 100, 100));
    assert!(!s.feed(2.0, 300, 300), "two rates are not enough");
    assert!(!s.feed(3.0, 400, 400), "100, 200, 100: not steady");
    assert!(!s.feed(4.0, 510, 510));
    assert!(s.feed(5.0, 615, 615), "100, 110, 105");
    let mut z = Steady::default();
    assert!((0..6).all(|i| !z.feed(f64::from(i), 0, 0)), "no swapping");
    // Filling: steady swap-in, but far more going out.
    let mut f = Steady::default();
    assert!((0..6u32).all(|i| !f.feed(f64::from(i), u64::from(i) * 10, u64::from(i) * 100)));
}

#[test]
fn sizes() {
    assert_eq!(wss_per_thread(32 << 20, 2), 64 << 20);
    assert_eq!(wss_per_thread(32 << 20, 3) % 4096, 0);
    assert_eq!(swap_bytes(32 << 20), 136 << 20);
    let p = Plan::of(&Timing {
        warmup: Duration::from_millis(30),
        duration: Duration::from_millis(150),
        quick: true,
    });
    assert!(p.min_warmup < p.max_warmup && p.max_warmup <= Duration::from_secs(2));
}

/// The mmkit side of the loop on a working set that fits the arena (no
/// swap): it measures accesses and latencies, and swaps nothing.
#[test]
fn mmkit_loop_without_swap() {
    let mm = Mm::builder().memory(32 << 20).build().unwrap();
    let plan = Plan {
        min_warmup: Duration::from_millis(10),
        max_warmup: Duration::from_millis(30),
        interval: Duration::from_millis(10),
        duration: Duration::from_millis(50),
    };
    let f = run_mmkit(&mm, 2, 2 << 20, &plan, || (0, 0), || None).unwrap();
    let get = |n: &str| f.iter().find(|x| x.metric == n).unwrap().value;
    assert!(get("accesses_per_sec") > 0.0);
    assert!(get("access_latency_p99_ns") >= get("access_latency_p50_ns"));
    assert_eq!(get("swapin_gb_per_sec"), 0.0);
}
