//! Tests of `memcg`: sizes, the page picker, the loops, the sampler, the
//! figures, the kernel child's protocol and cgroup files, and small points
//! on mmkit.

use super::kernel::{keyed, Mark};
use super::mmkit::{run_point, Setup};
use super::*;

#[test]
fn sizes_fit_together() {
    for quick in [true, false] {
        let s = Sizes::of(quick);
        assert_eq!(s.hot % 4096, 0);
        assert!(s.low >= s.hot, "low must cover the hot set");
        assert!(s.swap >= s.region + s.hot);
        assert!(s.region >= 2 * s.memory, "B streams several memories");
        let bmax = s.b_max(s.memory);
        assert!(bmax > 0 && bmax + s.low <= s.memory, "{s:?}");
        assert_eq!(bmax % 4096, 0);
        assert!(s.warm_pages() * 4096 > s.memory);
    }
    assert_eq!(Sizes::of(true).memory, QUICK_MEMORY);
    assert_eq!(Sizes::for_memory(8 << 20).b_max(1 << 20), 0);
}

#[test]
fn cases_by_name() {
    for c in Case::ALL {
        assert_eq!(Case::from_name(c.name()), Some(c));
    }
    assert_eq!(Case::from_name("scan"), None);
}

#[test]
fn uniform_and_zipf_pick_inside_the_hot_set() {
    let n = 1000;
    let mut rng = XorShift::new(3);
    let u = Picker::new(Case::Uniform, n);
    let z = Picker::new(Case::Zipf, n);
    let mut hu = vec![0u64; n as usize];
    let mut hz = vec![0u64; n as usize];
    for _ in 0..200_000 {
        let r = rng.next_u64();
        hu[u.pick(r) as usize] += 1;
        hz[z.pick(r) as usize] += 1;
    }
    // Uniform: every page seen, none far from the mean of 200.
    assert!(hu.iter().all(|&c| (100..300).contains(&c)), "{hu:?}");
    // Zipf(0.9) over 1000 ranks: the hottest page takes about 8% of the
    // accesses, the top tenth about half, and the coldest are rare.
    let mut sorted = hz.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let top = sorted[0] as f64 / 200_000.0;
    assert!((0.06..0.11).contains(&top), "{top}");
    let tenth: u64 = sorted[..100].iter().sum();
    assert!(
        (0.45..0.65).contains(&(tenth as f64 / 200_000.0)),
        "{tenth}"
    );
    assert!(sorted[999] < 40);
    // The hottest rank is scattered, not page 0 (the permutation is fixed).
    let hottest = hz.iter().position(|&c| c == sorted[0]).unwrap();
    assert_eq!(Picker::new(Case::Zipf, n).pick(0), hottest as u64);
    assert_eq!(Picker::new(Case::Uniform, 1).pick(u64::MAX), 0);
}

/// Pages in a Vec, counting what the loops do to them.
struct Vecs {
    pages: Vec<u32>,
    reads: u64,
    recycled: u64,
    fail_every: u64,
    n: u64,
}

impl Pages for Vecs {
    fn pages(&self) -> u64 {
        self.pages.len() as u64
    }
    fn read(&mut self, page: u64) -> bool {
        self.reads += 1;
        self.n += 1;
        assert!(page < self.pages());
        self.fail_every == 0 || !self.n.is_multiple_of(self.fail_every)
    }
    fn write(&mut self, page: u64) -> bool {
        self.pages[page as usize] += 1;
        true
    }
    fn recycle(&mut self) -> bool {
        assert!(
            self.pages.iter().all(|&w| w == 1),
            "each page once per pass"
        );
        self.pages.iter_mut().for_each(|w| *w = 0);
        self.recycled += 1;
        true
    }
}

fn vecs(n: usize, fail_every: u64) -> Vecs {
    Vecs {
        pages: vec![0; n],
        reads: 0,
        recycled: 0,
        fail_every,
        n: 0,
    }
}

#[test]
fn loops_count_what_they_do_and_stop() {
    // Each loop on its own thread until the word says stop; the counters
    // agree with what the pages saw.
    let (pa, pb) = (Progress::default(), Progress::default());
    let picker = Picker::new(Case::Zipf, 64);
    let ((), out) = crate::phase::drive(
        vec![(true, vecs(64, 7)), (false, vecs(100, 0))],
        |_| crate::phase::Placement::anywhere(),
        |_, (is_a, mut v), word| {
            if is_a {
                read_loop(&mut v, &picker, 1, &pa, word);
            } else {
                stream_loop(&mut v, &pb, word);
            }
            v
        },
        |_| {
            while pb.ops() < 1000 || pa.ops() < 1000 {
                std::thread::sleep(Duration::from_millis(1));
            }
        },
    );
    let (a, b) = (&out[0], &out[1]);
    assert_eq!(pa.ops(), a.reads);
    assert_eq!(pa.failures(), a.reads / 7);
    let written: u64 = b.pages.iter().map(|&w| u64::from(w)).sum();
    assert_eq!(pb.ops(), b.recycled * 100 + written);
    assert!(b.recycled >= 9);
    assert_eq!(pb.failures(), 0);
}

#[test]
fn the_sampler_keeps_peaks_and_counts_samples_over_max() {
    let mut s = Sampled::new(Some(100));
    for (c, w) in [(50, 0), (100, 7), (101, 3), (90, 9), (120, 1)] {
        s.sample(c, w);
    }
    assert_eq!(
        s,
        Sampled {
            samples: 5,
            current_peak: 120,
            swap_peak: 9,
            max: Some(100),
            over_max: 2,
        }
    );
    // No limit ("max" is u64::MAX): nothing is over it.
    let mut s = Sampled::new(Some(u64::MAX));
    s.sample(u64::MAX - 1, 0);
    assert_eq!((s.max, s.over_max), (None, 0));
}

fn get(f: &[Figure], case: &str, metric: &str) -> Option<f64> {
    f.iter()
        .find(|x| x.metric == metric && x.case.as_deref() == Some(case))
        .map(|x| x.value)
}

#[test]
fn figures_of_an_outcome() {
    let g = |max, peak| GroupReport {
        sampled: Sampled {
            samples: 10,
            current_peak: 8 << 20,
            swap_peak: 2 << 20,
            max,
            over_max: 0,
        },
        peak,
        pgscan: Some(30),
        pgsteal: Some(20),
        events_low: Some(1),
    };
    let o = Outcome {
        secs: 2.0,
        a_accesses: 1000,
        a_misses: 5,
        b_pages: 400,
        failures: 0,
        a_cpu_ns: 1_000_000_000,
        alone: None,
        a: Some(g(None, None)),
        b: Some(g(Some(16 << 20), Some(12 << 20))),
    };
    let alone = Alone {
        rate: 1000.0,
        cpu_rate: Some(4000.0),
    };
    let f = figures(Case::Zipf, &o, 1, Some(alone));
    let v = |m| get(&f, "zipf", m).unwrap_or_else(|| panic!("{m} missing: {f:?}"));
    assert_eq!(v("a_hit_pct"), 99.5);
    assert_eq!(v("a_misses"), 5.0);
    assert_eq!(v("a_accesses_per_sec"), 500.0);
    assert_eq!(v("a_vs_alone"), 0.5);
    // 1000 accesses in 1 s of CPU over 2 s: half a CPU, 1000/s of it.
    assert_eq!(v("a_accesses_per_cpu_sec"), 1000.0);
    assert_eq!(v("a_cpu_vs_alone"), 0.25);
    assert_eq!(v("a_cpu_pct"), 50.0);
    assert_eq!(v("b_pages_per_sec"), 200.0);
    assert_eq!(v("a_current_peak_mib"), 8.0);
    assert_eq!(v("b_swap_peak_mib"), 2.0);
    assert_eq!(v("b_peak_pct_of_max"), 75.0);
    assert_eq!(v("samples_over_max"), 0.0);
    assert_eq!(v("a_pgscan"), 30.0);
    assert_eq!(v("b_pgsteal"), 20.0);
    assert_eq!(v("a_events_low"), 1.0);
    assert_eq!(v("failed_accesses"), 0.0);
    // Every figure is one of the workload's metrics, with the case.
    for x in &f {
        assert!(METRICS.iter().any(|m| m.name == x.metric), "{}", x.metric);
    }
    // No groups, no B, no baseline: only what applies.
    let bare = Outcome {
        a: None,
        b: None,
        b_pages: 0,
        a_cpu_ns: 0,
        ..o
    };
    let f = figures(Case::Uniform, &bare, 2, None);
    let names: Vec<_> = f.iter().map(|x| x.metric).collect();
    assert_eq!(
        names,
        [
            "a_hit_pct",
            "a_misses",
            "a_accesses_per_sec",
            "failed_accesses"
        ]
    );
}

#[test]
fn kernel_protocol_and_cgroup_files_parse() {
    let m = Mark {
        ops: 10,
        failures: 1,
        minflt: 2,
        majflt: 3,
        cpu_ns: 5,
        ns: 99,
    };
    assert_eq!(Mark::parse(&m.line()), Some(m));
    assert_eq!(Mark::parse("mark 1 2 3 4 5"), None);
    assert_eq!(Mark::parse("mark 1 2 3 4 5 x"), None);
    assert_eq!(Mark::parse("ready"), None);
    let stat = "anon 4096\npgscan 12\npgsteal 7\n";
    assert_eq!(keyed(stat, "pgscan"), Some(12));
    assert_eq!(keyed(stat, "pgsteal"), Some(7));
    assert_eq!(keyed(stat, "pgs"), None);
    assert_eq!(keyed("low x\n", "low"), None);
}

#[test]
fn setups_by_variant() {
    for v in VARIANTS {
        let s = Setup::from_variant(v.name);
        assert_eq!(s.is_some(), v.name.starts_with("mmkit-"), "{}", v.name);
    }
}

fn tiny_plan() -> Plan {
    Plan {
        warmup: Duration::from_millis(20),
        max_warmup: Duration::from_secs(20),
        duration: Duration::from_millis(100),
        sample: Duration::from_millis(2),
    }
}

/// Small points of every mmkit setup: A measured, B streaming where it runs,
/// the groups reported where there are groups, nothing failed, and the `Mm`
/// whole afterwards (`run_point` checks it).
#[test]
fn mmkit_points_measure_and_leave_nothing() {
    let sizes = Sizes::for_memory(16 << 20);
    for setup in [
        Setup::Alone,
        Setup::Low,
        Setup::Max,
        Setup::NoLow,
        Setup::Root,
    ] {
        let run = |plan: &Plan| {
            run_point(setup, Case::Zipf, &sizes, 1, plan)
                .unwrap_or_else(|e| panic!("{setup:?}: {e}"))
        };
        let mut o = run(&tiny_plan());
        // B can spend a 100 ms window in one reclaim on a loaded 2-core host
        // (a debug build): a window in which B wrote nothing is measured
        // again, longer.
        if o.b_pages == 0 && setup != Setup::Alone {
            o = run(&Plan {
                duration: Duration::from_secs(2),
                ..tiny_plan()
            });
        }
        assert!(o.a_accesses > 0, "{setup:?}: {o:?}");
        assert!(o.a_misses <= o.a_accesses);
        assert_eq!(o.b_pages > 0, setup != Setup::Alone, "{setup:?}: {o:?}");
        assert_eq!(o.a.is_some(), setup != Setup::Root);
        assert_eq!(o.b.is_some(), !matches!(setup, Setup::Root | Setup::Alone));
        if let Some(b) = &o.b {
            assert_eq!(b.sampled.max.is_some(), setup == Setup::Max);
        }
    }
}

/// A small kernel point (only with `MMLAB_HOST_SWAP=1`: it turns swap on for
/// the host): it measures A alone and beside B, B's limit holds, and nothing
/// of it is left on the host (cgroups, swap, loop devices).
#[test]
fn kernel_point_measures_and_tears_down() {
    if !crate::host::swap::opted_in() {
        eprintln!("skipped: set MMLAB_HOST_SWAP=1 to set up swap on this host");
        return;
    }
    let sizes = Sizes::for_memory(16 << 20);
    let plan = Plan {
        max_warmup: Duration::from_secs(5),
        ..tiny_plan()
    };
    match super::kernel::run_point(Case::Uniform, &sizes, 1, &plan) {
        Ok(o) => {
            assert!(o.a_accesses > 0 && o.b_pages > 0, "{o:?}");
            assert!(o.alone.is_some_and(|a| a.rate > 0.0), "{o:?}");
            let b = o.b.unwrap();
            assert_eq!(b.sampled.max, Some(sizes.b_max(sizes.memory)));
            assert_eq!(b.sampled.over_max, 0, "{b:?}");
            assert!(b.sampled.samples > 0);
        }
        Err(why) => eprintln!("skipped: memcg kernel point: {why}"),
    }
    let me = format!("{}{}-", crate::host::PREFIX, std::process::id());
    let loops = crate::host::swap::our_loops();
    assert!(loops.iter().all(|(_, f)| !f.contains(&me)), "{loops:?}");
    if let Ok(root) = crate::host::cgroup::CgroupRoot::find() {
        let left: Vec<_> = std::fs::read_dir(root.dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&me))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
