//! The workloads: what each measured point runs. A workload is a `Workload`
//! (name, description, metric list, default thread counts, and a `run` that
//! measures one point for one variant at one thread count); adding one is a new
//! file here plus a line in `all()`, and a section in docs/lab.md.
//!
//! Most workloads are a per-thread loop (`runner::Worker`) under
//! `runner::run_workers`, and report the `STANDARD` metrics through
//! `standard_figures`; those that time their own phases run them through
//! `phase::drive`.
//!
//! A workload file imports only shared code, never another workload: what two
//! workloads share lives in a file of its own here (`metrics`, `presets`,
//! `space_loop`, `batch_loop`), in this file, or on the host side
//! (`crate::host`).

mod alloc_free;
mod alloc_free_batch;
mod alloc_free_orders;
mod anon_w_seq;
mod autonuma;
mod clear_huge;
mod cross_cpu_free;
mod highalloc;
pub mod memcg;
mod order0_thp_mix;
mod page_fault1;
mod parallel_free;
pub mod pmbench;
pub mod reclaim;

mod batch_loop;
mod metrics;
mod presets;
mod space_loop;

pub use metrics::{
    Metric, ALLOC_FAILURES, FAULTS_PER_SEC, GB_PER_SEC, HUGE_PCT, OPS_PER_SEC,
    ZONE_LOCK_ACQUISITIONS_PER_KOP, ZONE_LOCK_CONTENDED_PCT,
};

use crate::peers::{Peer, VariantInfo, VARIANTS};
use crate::record::Record;
use crate::runner::{Config, Measured, Timing};
use anyhow::Result;
use serde_json::{Map, Value};

/// The metrics of a `run_workers` workload.
pub const STANDARD: &[Metric] = &[
    OPS_PER_SEC,
    ZONE_LOCK_CONTENDED_PCT,
    ZONE_LOCK_ACQUISITIONS_PER_KOP,
    ALLOC_FAILURES,
];

/// Every metric any workload reports, for `mmlab list`.
pub fn all_metrics() -> Vec<&'static Metric> {
    let mut out: Vec<&'static Metric> = Vec::new();
    for w in all() {
        for m in w.metrics() {
            if !out.iter().any(|o| o.name == m.name) {
                out.push(m);
            }
        }
    }
    out
}

/// One value a workload measured at one point.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub metric: &'static str,
    pub value: f64,
    /// Sub-case, e.g. "2MiB"; `None` for a workload's plain figures.
    pub case: Option<String>,
}

impl Figure {
    pub fn new(metric: &'static str, value: f64) -> Figure {
        Figure {
            metric,
            value,
            case: None,
        }
    }
}

/// A lab workload.
pub trait Workload: Sync {
    /// Stable name, used on the command line and in the records.
    fn name(&self) -> &'static str;
    /// One paragraph: what each thread does and what an op is.
    fn description(&self) -> &'static str;
    /// The metrics it reports, in table order.
    fn metrics(&self) -> &'static [Metric] {
        STANDARD
    }
    /// Thread counts when `--threads` is not given.
    fn default_threads(&self) -> &'static [usize] {
        &[1, 2, 4, 8]
    }
    /// Thread counts with `--quick` when `--threads` is not given.
    fn quick_threads(&self) -> &'static [usize] {
        self.default_threads()
    }
    /// Whether it runs in `variant` by default.
    fn applies_to(&self, _variant: &str) -> bool {
        true
    }
    /// Its own settings, for the records' `params` (batch size, orders, ...).
    fn params(&self) -> Map<String, Value> {
        Map::new()
    }
    /// Its settings under `config` (sizes that depend on `--quick`, its arena), for
    /// the records' `params`; by default `params()`.
    fn params_for(&self, _config: &Config) -> Map<String, Value> {
        self.params()
    }
    /// The variants of a workload that brings its own (the host kernel, raw
    /// loops, mmkit with a given clearing strategy), in default column order;
    /// `None` (the default) means the lab's allocator variants, `peers::VARIANTS`.
    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        None
    }
    /// Builds `variant` for a run under `config`, once, before its first point.
    /// By default the allocator peer of that name with a `config.memory` arena.
    fn build(&self, variant: &str, config: &Config) -> Result<Peer> {
        Peer::create(variant, config.memory)
    }
    /// The arena of its mmkit variants under `config`; custom variants (`--set`)
    /// get the same.
    fn mmkit_arena(&self, config: &Config) -> usize {
        config.memory
    }
    /// The most memory it holds at once under `config` with `variants` variants
    /// built (for `mmlab run`'s memory plan): by default each variant's arena,
    /// prefaulted (a native variant maps at most as much data as an arena holds).
    fn peak_bytes(&self, config: &Config, variants: usize) -> usize {
        variants.max(1) * self.mmkit_arena(config)
    }
    /// Measures one point: `threads` threads on `peer` for `timing`.
    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure>;
    /// Whether the runner may repeat a point `--rounds` times and report the
    /// median. Workloads whose point is a fixed amount of work that already takes
    /// its own median (or that would take too long three times) say no.
    fn repeatable(&self) -> bool {
        true
    }
}

/// Every workload, in run order.
pub fn all() -> Vec<&'static dyn Workload> {
    vec![
        &alloc_free::AllocFree,
        &alloc_free_batch::AllocFreeBatch,
        &alloc_free_orders::AllocFreeOrders,
        &cross_cpu_free::CrossCpuFree,
        &page_fault1::PageFault1,
        &parallel_free::ParallelFree,
        &clear_huge::ClearHuge,
        &anon_w_seq::AnonWSeq,
        &highalloc::HighAlloc,
        &order0_thp_mix::Order0ThpMix,
        &pmbench::Pmbench,
        &reclaim::Reclaim,
        &autonuma::Autonuma,
        &memcg::Memcg,
    ]
}

/// The variants `w` knows: its own, or the lab's allocator variants.
pub fn variants_of(w: &dyn Workload) -> &'static [VariantInfo] {
    w.own_variants().unwrap_or(VARIANTS)
}

/// Whether some workload knows a variant called `name`.
pub fn is_variant(name: &str) -> bool {
    crate::peers::is_variant(name)
        || all()
            .iter()
            .any(|w| variants_of(*w).iter().any(|v| v.name == name))
}

/// The values of one figure (metric and case) in every round, in round order.
pub fn round_values(rounds: &[Vec<Figure>], metric: &str, case: &Option<String>) -> Vec<f64> {
    rounds
        .iter()
        .flat_map(|r| r.iter())
        .filter(|g| g.metric == metric && &g.case == case)
        .map(|g| g.value)
        .collect()
}

/// Per figure (metric and case) of the first round, the median over all rounds.
pub fn median_figures(rounds: &[Vec<Figure>]) -> Vec<Figure> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|f| Figure {
            value: median(&round_values(rounds, f.metric, &f.case)).unwrap_or(f.value),
            ..f.clone()
        })
        .collect()
}

/// The median of `v` (the mean of the middle two for an even count); `None` when
/// `v` is empty. NaNs sort last.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Bytes per second as GB/s (10^9 bytes).
pub fn gb_per_sec(bytes: f64, secs: f64) -> f64 {
    bytes / secs.max(1e-12) / 1e9
}

/// The largest thread count `w` runs at under `config` (for sizing its arena).
pub fn max_threads(w: &dyn Workload, config: &Config) -> usize {
    crate::runner::threads_for(w, config)
        .into_iter()
        .max()
        .unwrap_or(1)
        .max(1)
}

/// An mmkit arena for `data` bytes of data pages: the data, its page tables
/// (1/512 of it, rounded up generously), and 64 MiB for per-CPU lists and slack,
/// in whole 4 MiB blocks.
pub fn arena_for(data: usize) -> usize {
    let bytes = data + data / 256 + (64 << 20);
    bytes.div_ceil(4 << 20) * (4 << 20)
}

/// The workload called `name`.
pub fn by_name(name: &str) -> Option<&'static dyn Workload> {
    all().into_iter().find(|w| w.name() == name)
}

/// The `STANDARD` figures of a `run_workers` measurement, whose ops are
/// alloc+free pairs (or freed blocks).
pub fn standard_figures(m: &Measured) -> Vec<Figure> {
    let mut out = vec![Figure::new(OPS_PER_SEC.name, m.ops_per_sec())];
    if let Some(l) = &m.lock {
        let pct = if l.acquisitions == 0 {
            0.0
        } else {
            l.contended as f64 * 100.0 / l.acquisitions as f64
        };
        let per_kop = if m.ops == 0 {
            0.0
        } else {
            l.acquisitions as f64 * 1000.0 / m.ops as f64
        };
        out.push(Figure::new(ZONE_LOCK_CONTENDED_PCT.name, pct));
        out.push(Figure::new(ZONE_LOCK_ACQUISITIONS_PER_KOP.name, per_kop));
    }
    out.push(Figure::new(ALLOC_FAILURES.name, m.failures as f64));
    out
}

/// The unit of `metric` as `workload` declares it ("" if undeclared).
fn unit_of(workload: &dyn Workload, metric: &str) -> &'static str {
    workload
        .metrics()
        .iter()
        .find(|m| m.name == metric)
        .map_or("", |m| m.unit)
}

/// Turns one point's figures into records, with the run's settings as params.
pub fn to_records(
    workload: &dyn Workload,
    variant: &str,
    threads: usize,
    config: &Config,
    figures: Vec<Figure>,
) -> Vec<Record> {
    let mut params = Map::new();
    params.insert(
        "duration_ms".into(),
        (config.timing.duration.as_millis() as u64).into(),
    );
    params.insert(
        "warmup_ms".into(),
        (config.timing.warmup.as_millis() as u64).into(),
    );
    params.insert("memory_bytes".into(), (config.memory as u64).into());
    params.extend(workload.params_for(config));
    if let Some(s) = config.settings.iter().find(|s| s.name() == variant) {
        params.insert("set".into(), s.to_json().into());
    }
    params.extend(config.params.clone());
    figures
        .into_iter()
        .map(|f| Record {
            workload: workload.name().to_string(),
            variant: variant.to_string(),
            threads,
            metric: f.metric.to_string(),
            value: f.value,
            unit: unit_of(workload, f.metric).to_string(),
            case: f.case,
            params: Some(params.clone()),
            rounds: None,
        })
        .collect()
}

/// A small, fast PRNG (xorshift64*) so that mixed-order workloads draw the same
/// sequence in every variant.
pub struct XorShift(u64);

impl XorShift {
    /// Seeded per thread; equal seeds give equal sequences.
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    #[test]
    fn names_are_unique_and_found() {
        let mut seen = HashSet::new();
        for w in all() {
            assert!(seen.insert(w.name()), "duplicate {}", w.name());
            assert!(by_name(w.name()).is_some());
            assert!(!w.description().is_empty());
            assert!(!w.metrics().is_empty());
            let mut vs = HashSet::new();
            for v in variants_of(w) {
                assert!(
                    vs.insert(v.name),
                    "{}: duplicate variant {}",
                    w.name(),
                    v.name
                );
                assert!(is_variant(v.name));
            }
        }
        assert!(!is_variant("no-such-variant"));
    }

    #[test]
    fn median_figures_per_metric_and_case() {
        let r = |a: f64, b: f64| {
            vec![
                Figure::new("ops_per_sec", a),
                Figure {
                    metric: "ops_per_sec",
                    value: b,
                    case: Some("x".into()),
                },
            ]
        };
        let m = median_figures(&[r(1.0, 10.0), r(3.0, 30.0), r(2.0, 20.0)]);
        assert_eq!(m[0].value, 2.0);
        assert_eq!(m[1].value, 20.0);
        assert_eq!(m[1].case.as_deref(), Some("x"));
        assert!(median_figures(&[]).is_empty());
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[1.0, f64::NAN, 2.0]), Some(2.0));
        assert_eq!(gb_per_sec(2e9, 2.0), 1.0);
    }

    #[test]
    fn arenas_hold_the_data_and_are_whole_blocks() {
        for data in [0usize, 16 << 20, 1 << 30, 4 * (128 << 20)] {
            let a = arena_for(data);
            assert!(a >= data + data / 512 + (64 << 20));
            assert_eq!(a % (4 << 20), 0);
        }
    }

    #[test]
    fn standard_figures_from_a_measurement() {
        let m = Measured {
            ops: 2000,
            elapsed: Duration::from_secs(2),
            lock: Some(mmkit::LockStats {
                acquisitions: 100,
                contended: 25,
                wait_ns: 0,
            }),
            failures: 0,
        };
        let f = standard_figures(&m);
        let get = |n: &str| f.iter().find(|x| x.metric == n).unwrap().value;
        assert_eq!(get("ops_per_sec"), 1000.0);
        assert_eq!(get("zone_lock_contended_pct"), 25.0);
        assert_eq!(get("zone_lock_acquisitions_per_kop"), 50.0);
        let no_lock = Measured { lock: None, ..m };
        assert!(standard_figures(&no_lock)
            .iter()
            .all(|x| !x.metric.starts_with("zone_lock")));
    }

    #[test]
    fn xorshift_is_deterministic() {
        let (mut a, mut b) = (XorShift::new(7), XorShift::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    fn quick_timing() -> Timing {
        Timing {
            warmup: Duration::from_millis(5),
            duration: Duration::from_millis(20),
            quick: true,
        }
    }

    #[test]
    fn every_allocator_workload_runs_briefly_on_a_peer() {
        let timing = quick_timing();
        let peer = Peer::create("buddy_system_allocator", 32 << 20).unwrap();
        for w in all().into_iter().filter(|w| w.own_variants().is_none()) {
            for t in [1, 2, 3] {
                // A 20 ms window can pass without the workers getting a CPU on
                // a loaded 2-core host: what is checked is that the workload
                // runs at all, so a window that saw nothing is retried longer.
                let mut timing = timing;
                let ops = loop {
                    let f = w.run(&peer, t, &timing);
                    let ops = f.iter().find(|x| x.metric == "ops_per_sec").unwrap().value;
                    if ops > 0.0 || timing.duration >= Duration::from_secs(2) {
                        break ops;
                    }
                    timing.duration *= 10;
                };
                assert!(ops > 0.0, "{} at {t} threads did nothing", w.name());
            }
            peer.check().unwrap();
        }
    }

    /// Every variant of every workload with its own variants, built as a quick
    /// run builds it, measures something at 1 and 2 threads and gives its pages
    /// back (kernel-hugetlb may be skipped where hugetlb pages are refused).
    #[test]
    fn every_own_variant_workload_runs_briefly() {
        let timing = quick_timing();
        let config = Config {
            threads: Some(vec![1, 2]),
            variants: None,
            timing,
            memory: 64 << 20,
            progress: false,
            rounds: 1,
            settings: Vec::new(),
            params: Map::new(),
            swap_file: None,
            sizes: Vec::new(),
        };
        for w in all() {
            let Some(own) = w.own_variants() else {
                continue;
            };
            // reclaim replays fixed traces (its own tests: reclaim/tests.rs);
            // a scan-resistant variant reads nothing back in `scan`.
            if w.name() == "reclaim" {
                continue;
            }
            let first = w.metrics()[0].name;
            for v in own {
                let peer = w.build(v.name, &config).unwrap();
                for t in [1, 2] {
                    peer.settle();
                    let mut f = w.run(&peer, t, &timing);
                    let measured = |f: &[Figure]| {
                        f.iter()
                            .filter(|x| x.metric == first)
                            .map(|x| x.value)
                            .collect::<Vec<f64>>()
                    };
                    // One step of a workload (a whole region mapped, written and
                    // unmapped) can outlast 20 ms on a loaded 2-core host: a
                    // point that completed no step is measured again, longer.
                    if measured(&f).iter().any(|x| *x <= 0.0) {
                        let longer = Timing {
                            duration: timing.duration * 20,
                            ..timing
                        };
                        peer.settle();
                        f = w.run(&peer, t, &longer);
                    }
                    let vals = measured(&f);
                    // pmbench: the kernel peer needs root and the mmlab binary,
                    // the mmkit variants need swap in the library.
                    let may_skip = v.name == "kernel-hugetlb"
                        || w.name() == "pmbench"
                        || (t > 1 && (w.name() == "clear_huge" || v.name == "kernel"))
                        // autonuma's kernel needs a multi-node host.
                        || (w.name() == "autonuma" && v.name == "kernel")
                        // memcg's kernel needs root, and under --quick the
                        // host swap opt-in.
                        || (w.name() == "memcg" && v.name == "kernel");
                    assert!(
                        may_skip || !vals.is_empty(),
                        "{} / {} at {t} threads measured nothing: {f:?}",
                        w.name(),
                        v.name
                    );
                    assert!(
                        vals.iter().all(|x| *x > 0.0),
                        "{} / {}: {f:?}",
                        w.name(),
                        v.name
                    );
                    // The host's hugetlb pool is shared with whatever else runs
                    // (other tests, other processes): its peer may be refused.
                    let fails = f.iter().filter(|x| x.metric == "alloc_failures");
                    assert!(
                        v.name == "kernel-hugetlb" || fails.map(|x| x.value).sum::<f64>() == 0.0,
                        "{}: {f:?}",
                        v.name
                    );
                }
                if let Err(e) = peer.check() {
                    panic!("{} / {}: {e:#}", w.name(), v.name);
                }
            }
        }
    }
}
