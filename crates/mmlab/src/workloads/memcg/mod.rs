//! `memcg`: a noisy neighbour. Group A reads its hot set (`uniform` or `zipf`
//! case) while group B streams writes through memory several times the arena,
//! every page written once and never reused; both in one `Mm` (one host
//! memory cgroup tree for the `kernel` peer) with swap on a RAM device, A and B
//! on threads of their own. What is measured: how much of A's hot set stays
//! resident (A's hit ratio: accesses that found their page mapped, so needed no
//! swap-in) and how fast A runs beside B, against A alone.
//!
//! Variants (`VARIANTS`, the first the tables' baseline):
//! - `mmkit-alone`: A alone, in a group (no B): the throughput baseline;
//! - `mmkit-low`: A's group has `memory.low` >= its hot set;
//! - `mmkit-max`: no protection; B's group limited (`memory.max`) to what A's
//!   protection leaves, the way a cgroup v1 host protects A (`kernel`'s setup);
//! - `mmkit-nolow`: both groups, no limit, no protection;
//! - `mmkit-root`: no groups: both spaces in the root (one global LRU);
//! - `kernel`: the host kernel, A and B child processes in two memory cgroups
//!   under a parent limited to the arena, swapping to a loop device over tmpfs
//!   (`kernel.rs`); cgroup v1 has no `memory.low`, so there it runs with B's
//!   limit alone and says so; on v2 it sets A's `memory.low` too.
//!
//! A custom variant (`--set`) runs `mmkit-low`'s setup on its own `Mm`.
//!
//! Layout: this file holds the sizes, the metrics, the access loops (shared by
//! mmkit and the kernel's child processes through `Pages`), the group sampler
//! and the figures; `mmkit.rs` and `kernel.rs` run a point on each side,
//! `metrics.rs` names what is reported.
//!
//! State: `ALONE` hands `mmkit-alone`'s A throughput of each case to the other
//! mmkit variants of the same round (a lock taken once per point).

pub mod kernel;
mod metrics;
pub mod mmkit;

use super::{Figure, Metric, Workload, XorShift};
use crate::peers::{Peer, VariantInfo};
use crate::phase::{Phase, PhaseWord};
use crate::runner::{Config, Timing};
use metrics::*;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The arena (mmkit's memory; the kernel's parent cgroup limit), full run.
pub const MEMORY: u64 = 256 << 20;
/// The same with `--quick`.
pub const QUICK_MEMORY: u64 = 32 << 20;
/// A's hot set, in eighths of the memory.
pub const HOT_EIGHTHS: u64 = 3;
/// B's region (written through, then unmapped and mapped again), in memories.
pub const STREAM_FACTOR: u64 = 2;
/// The Zipf exponent of the `zipf` case.
pub const ZIPF_S: f64 = 0.9;
/// Accesses between two updates of a loop's shared counter and phase reads.
const BATCH: u64 = 256;

/// The sizes of a run, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub memory: u64,
    /// A's hot set.
    pub hot: u64,
    /// A's `memory.low`: the hot set, a sixteenth and 1 MiB (the per-CPU
    /// charge stocks and page-table pages stay well inside it).
    pub low: u64,
    /// B's region, all threads together.
    pub region: u64,
    /// The swap device: B's region and twice A's hot set (its pages can hold
    /// slots while resident, in the swap cache), a sixteenth and 4 MiB.
    pub swap: u64,
}

impl Sizes {
    pub fn of(quick: bool) -> Sizes {
        Sizes::for_memory(if quick { QUICK_MEMORY } else { MEMORY })
    }

    pub fn for_memory(memory: u64) -> Sizes {
        let hot = memory * HOT_EIGHTHS / 8 / 4096 * 4096;
        let region = memory * STREAM_FACTOR;
        let both = region + 2 * hot;
        Sizes {
            memory,
            hot,
            low: hot + hot / 16 + (1 << 20),
            region,
            swap: (both + both / 16 + (4 << 20)) / 4096 * 4096,
        }
    }

    /// B's `memory.max` in the limits-alone setup: what the memory (`usable`
    /// bytes of it) leaves after A's protection, less a sixteenth for the
    /// watermarks and per-CPU lists.
    pub fn b_max(&self, usable: u64) -> u64 {
        usable.saturating_sub(self.low).saturating_sub(usable / 16) / 4096 * 4096
    }

    /// B's pages written before measuring: memory filled, then one more
    /// memory streamed through under reclaim.
    pub fn warm_pages(&self) -> u64 {
        (2 * self.memory - self.hot) / 4096
    }
}

/// How A picks its pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Uniform,
    Zipf,
}

impl Case {
    pub const ALL: [Case; 2] = [Case::Uniform, Case::Zipf];

    pub fn name(self) -> &'static str {
        match self {
            Case::Uniform => "uniform",
            Case::Zipf => "zipf",
        }
    }

    pub fn from_name(s: &str) -> Option<Case> {
        Case::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// A's page picker: uniform over the hot set, or Zipf(`ZIPF_S`) over it with
/// the ranks scattered over the pages (a fixed permutation), so that the hot
/// pages are not neighbours.
pub struct Picker {
    pages: u64,
    /// Zipf: cumulative probabilities by rank, scaled to 2^32.
    cdf: Vec<u32>,
    /// Zipf: the page of each rank.
    perm: Vec<u32>,
}

impl Picker {
    pub fn new(case: Case, pages: u64) -> Picker {
        let pages = pages.max(1);
        if case == Case::Uniform {
            return Picker {
                pages,
                cdf: Vec::new(),
                perm: Vec::new(),
            };
        }
        let w: Vec<f64> = (1..=pages).map(|r| (r as f64).powf(-ZIPF_S)).collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let cdf = w
            .iter()
            .map(|x| {
                acc += x / total;
                (acc * 4294967296.0).min(4294967295.0) as u32
            })
            .collect();
        let mut perm: Vec<u32> = (0..pages as u32).collect();
        let mut rng = XorShift::new(0x21bf);
        for i in (1..perm.len()).rev() {
            let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
            perm.swap(i, j);
        }
        Picker { pages, cdf, perm }
    }

    /// The page for random bits `r`.
    #[inline]
    pub fn pick(&self, r: u64) -> u64 {
        if self.cdf.is_empty() {
            return ((u128::from(r) * u128::from(self.pages)) >> 64) as u64;
        }
        let u = (r >> 32) as u32;
        let rank = self
            .cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1);
        u64::from(self.perm[rank])
    }
}

/// Pages a loop works on: page `i` of `pages()`.
pub trait Pages {
    fn pages(&self) -> u64;
    /// Reads 4 bytes of page `page`; false on failure.
    fn read(&mut self, page: u64) -> bool;
    /// Writes a byte to page `page`; false on failure.
    fn write(&mut self, page: u64) -> bool;
    /// Throws every page away and maps the region anew (B, after a pass).
    fn recycle(&mut self) -> bool;
}

/// What a loop did: ops done (accesses or pages written) and failed, counted
/// as they happen (a batch at a time) so that a controller can read them.
#[derive(Default)]
pub struct Progress {
    pub ops: AtomicU64,
    pub failures: AtomicU64,
}

impl Progress {
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A's loop: reads pages `picker` picks until the phase says stop.
pub fn read_loop(mem: &mut impl Pages, picker: &Picker, seed: u64, p: &Progress, w: &PhaseWord) {
    let mut rng = XorShift::new(seed);
    while w.get() != Phase::Stop {
        let mut bad = 0;
        for _ in 0..BATCH {
            if !mem.read(picker.pick(rng.next_u64())) {
                bad += 1;
            }
        }
        p.ops.fetch_add(BATCH, Ordering::Relaxed);
        if bad > 0 {
            p.failures.fetch_add(bad, Ordering::Relaxed);
        }
    }
}

/// B's loop: writes its pages in order, each once per pass, and after a pass
/// throws them away (`recycle`), until the phase says stop.
pub fn stream_loop(mem: &mut impl Pages, p: &Progress, w: &PhaseWord) {
    let n = mem.pages();
    let mut page = 0;
    while w.get() != Phase::Stop {
        let mut bad = 0;
        let mut done = 0;
        while done < BATCH && page < n {
            if !mem.write(page) {
                bad += 1;
            }
            page += 1;
            done += 1;
        }
        p.ops.fetch_add(done, Ordering::Relaxed);
        if page == n {
            page = 0;
            if !mem.recycle() {
                bad += 1;
            }
        }
        if bad > 0 {
            p.failures.fetch_add(bad, Ordering::Relaxed);
        }
    }
}

/// The largest `current` and swap usage of a group seen by `sample`, and the
/// samples whose `current` was above the group's `max`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sampled {
    pub samples: u64,
    pub current_peak: u64,
    pub swap_peak: u64,
    /// `memory.max`, if one is set.
    pub max: Option<u64>,
    pub over_max: u64,
}

impl Sampled {
    pub fn new(max: Option<u64>) -> Sampled {
        Sampled {
            max: max.filter(|&m| m != u64::MAX),
            ..Sampled::default()
        }
    }

    /// One sample: `current` and swap usage, bytes.
    pub fn sample(&mut self, current: u64, swap: u64) {
        self.samples += 1;
        self.current_peak = self.current_peak.max(current);
        self.swap_peak = self.swap_peak.max(swap);
        if self.max.is_some_and(|m| current > m) {
            self.over_max += 1;
        }
    }
}

/// What one group reported over a measured interval (where the side can tell).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupReport {
    pub sampled: Sampled,
    /// `memory.peak` (v1: `max_usage_in_bytes`) at the end, bytes.
    pub peak: Option<u64>,
    pub pgscan: Option<u64>,
    pub pgsteal: Option<u64>,
    pub events_low: Option<u64>,
}

/// A's throughput alone: per second of wall time and per second of its
/// threads' CPU time (None: unknown).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Alone {
    pub rate: f64,
    pub cpu_rate: Option<f64>,
}

impl Outcome {
    /// A's accesses per second.
    pub fn a_rate(&self) -> f64 {
        self.a_accesses as f64 / self.secs.max(1e-9)
    }

    /// A's accesses per second of its threads' CPU time, if known.
    pub fn a_cpu_rate(&self) -> Option<f64> {
        (self.a_cpu_ns > 0).then(|| self.a_accesses as f64 * 1e9 / self.a_cpu_ns as f64)
    }

    /// A as the baseline of other columns.
    pub fn as_alone(&self) -> Alone {
        Alone {
            rate: self.a_rate(),
            cpu_rate: self.a_cpu_rate(),
        }
    }
}

/// One point of one case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The measured interval, seconds.
    pub secs: f64,
    pub a_accesses: u64,
    /// A's accesses that faulted (the page was not mapped: swapped out).
    pub a_misses: u64,
    /// B's pages written (0: no B).
    pub b_pages: u64,
    /// Accesses and writes that failed, A and B.
    pub failures: u64,
    /// CPU time of A's threads while measuring, ns (0: unknown).
    pub a_cpu_ns: u64,
    /// A alone, measured by this point (the kernel's first interval), else
    /// `None` (mmkit: the `mmkit-alone` column's).
    pub alone: Option<Alone>,
    pub a: Option<GroupReport>,
    pub b: Option<GroupReport>,
}

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit-alone",
        description: "mmkit: A alone in its group, no B (the throughput baseline)",
    },
    VariantInfo {
        name: "mmkit-low",
        description: "mmkit: A's group protected with memory.low >= its hot set, B's unlimited",
    },
    VariantInfo {
        name: "mmkit-max",
        description: "mmkit: no protection; B's group limited (memory.max) to what A's \
                      protection leaves (limits alone, as the kernel peer on cgroup v1)",
    },
    VariantInfo {
        name: "mmkit-nolow",
        description: "mmkit: A and B in groups of their own, no limits, no protection",
    },
    VariantInfo {
        name: "mmkit-root",
        description: "mmkit without groups: both spaces in the root (one global LRU)",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: A and B child processes in memory cgroups under a \
                      parent limited to the arena, swap on a loop device over tmpfs; B \
                      limited as mmkit-max (cgroup v1 has no memory.low), and on cgroup v2 \
                      A's memory.low set too (needs root)",
    },
];

/// `mmkit-alone`'s A throughput per case and thread count, its latest round.
type AloneRates = HashMap<(&'static str, usize), Alone>;
static ALONE: Mutex<Option<AloneRates>> = Mutex::new(None);

/// Records A alone's throughput of `case` at `threads` for the other columns
/// of this round.
fn set_alone(case: Case, threads: usize, rate: Alone) {
    let mut g = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashMap::new)
        .insert((case.name(), threads), rate);
}

/// A alone's latest throughput of `case` at `threads`, if measured.
fn alone(case: Case, threads: usize) -> Option<Alone> {
    let g = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref()
        .and_then(|m| m.get(&(case.name(), threads)).copied())
}

/// How a point is paced.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// A alone: its warmup; with B: the least warmup after B's warm pages.
    pub warmup: Duration,
    /// Longest wait for B's warm pages.
    pub max_warmup: Duration,
    pub duration: Duration,
    /// Between two samples of the groups' usage.
    pub sample: Duration,
}

impl Plan {
    /// Quick: the run's times, at least 300 ms measured; full: at least 2 s.
    pub fn of(t: &Timing) -> Plan {
        let (min, max, sample) = if t.quick {
            (300, 5_000, 5)
        } else {
            (2_000, 30_000, 10)
        };
        Plan {
            warmup: t.warmup,
            max_warmup: Duration::from_millis(max).max(t.warmup),
            duration: t.duration.max(Duration::from_millis(min)),
            sample: Duration::from_millis(sample),
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// The figures of one case's outcome on `threads` threads per group;
/// `alone` is A alone's throughput (None: unknown, no ratios).
pub fn figures(case: Case, o: &Outcome, threads: usize, alone: Option<Alone>) -> Vec<Figure> {
    let secs = o.secs.max(1e-9);
    let acc = o.a_accesses.max(1) as f64;
    let rate = o.a_rate();
    let mut f = vec![
        Figure::new(A_HIT.name, 100.0 * (1.0 - o.a_misses as f64 / acc)),
        Figure::new(A_MISSES.name, o.a_misses as f64),
        Figure::new(A_RATE.name, rate),
    ];
    if let Some(a) = alone.filter(|a| a.rate > 0.0) {
        f.push(Figure::new(A_VS_ALONE.name, rate / a.rate));
    }
    if let Some(c) = o.a_cpu_rate() {
        f.push(Figure::new(A_CPU_RATE.name, c));
        if let Some(a) = alone.and_then(|a| a.cpu_rate).filter(|a| *a > 0.0) {
            f.push(Figure::new(A_CPU_VS_ALONE.name, c / a));
        }
        let wall = secs * 1e9 * threads.max(1) as f64;
        f.push(Figure::new(
            A_CPU_PCT.name,
            o.a_cpu_ns as f64 * 100.0 / wall,
        ));
    }
    if o.b_pages > 0 {
        f.push(Figure::new(B_RATE.name, o.b_pages as f64 / secs));
    }
    let mut over = 0;
    let mut any_max = false;
    for (g, cur, swap) in [(&o.a, A_CUR, A_SWAP), (&o.b, B_CUR, B_SWAP)] {
        if let Some(g) = g {
            f.push(Figure::new(cur.name, mib(g.sampled.current_peak)));
            f.push(Figure::new(swap.name, mib(g.sampled.swap_peak)));
            over += g.sampled.over_max;
            any_max |= g.sampled.max.is_some();
        }
    }
    if let Some(b) = &o.b {
        if let (Some(max), Some(peak)) = (b.sampled.max, b.peak) {
            f.push(Figure::new(
                B_PEAK_PCT.name,
                peak as f64 * 100.0 / max.max(1) as f64,
            ));
        }
    }
    if any_max {
        f.push(Figure::new(OVER_MAX.name, over as f64));
    }
    let counts = [(&o.a, A_SCAN, A_STEAL), (&o.b, B_SCAN, B_STEAL)];
    for (g, scan, steal) in counts {
        if let Some(g) = g {
            if let Some(x) = g.pgscan {
                f.push(Figure::new(scan.name, x as f64));
            }
            if let Some(x) = g.pgsteal {
                f.push(Figure::new(steal.name, x as f64));
            }
        }
    }
    if let Some(x) = o.a.as_ref().and_then(|a| a.events_low) {
        f.push(Figure::new(A_LOW.name, x as f64));
    }
    f.push(Figure::new(FAILED.name, o.failures as f64));
    for x in &mut f {
        x.case = Some(case.name().to_string());
    }
    f
}

pub struct Memcg;

impl Workload for Memcg {
    fn name(&self) -> &'static str {
        "memcg"
    }

    fn description(&self) -> &'static str {
        "a noisy neighbour: group A reads its hot set (3/8 of memory; uniform, zipf) on one \
         thread while group B streams writes through 2x memory, never reused, on another; \
         one Mm of 256 MiB (quick: 32 MiB) with a RAM swap device; A's hit ratio and \
         throughput beside A alone, per protection setup and the host kernel"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[1]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(VARIANTS)
    }

    fn mmkit_arena(&self, config: &Config) -> usize {
        Sizes::of(config.timing.quick).memory as usize
    }

    fn peak_bytes(&self, config: &Config, _variants: usize) -> usize {
        // The named variants build their Mm (arena and RAM swap) per point,
        // one at a time, and the kernel's cgroup and swap are as large; each
        // custom variant holds one of its own for the whole workload.
        let s = Sizes::of(config.timing.quick);
        (1 + config.settings.len()) * (s.memory + s.swap) as usize
    }

    fn build(&self, variant: &str, config: &Config) -> anyhow::Result<Peer> {
        let _ = config;
        match VARIANTS.iter().find(|v| v.name == variant) {
            Some(info) => Ok(Peer::Native(info.name)),
            None => anyhow::bail!("unknown variant {variant:?} for memcg"),
        }
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let s = Sizes::of(config.timing.quick);
        let mut p = Map::new();
        p.insert("memory_bytes".into(), s.memory.into());
        p.insert("hot_bytes".into(), s.hot.into());
        p.insert("low_bytes".into(), s.low.into());
        p.insert("stream_region_bytes".into(), s.region.into());
        p.insert("swap_bytes".into(), s.swap.into());
        p.insert("zipf_s".into(), ZIPF_S.into());
        if let Ok(root) = crate::host::cgroup::CgroupRoot::find() {
            p.insert("kernel_protection".into(), kernel::protection(&root).into());
        }
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let name = peer.native().unwrap_or("set");
        let plan = Plan::of(timing);
        let sizes = Sizes::of(timing.quick);
        let mut out = Vec::new();
        for case in Case::ALL {
            let r = match (peer.mm(), name) {
                (Some(mm), _) => mmkit::run_custom(mm, case, &sizes, threads, &plan),
                (None, "kernel") if timing.quick && !crate::host::swap::opted_in() => {
                    Err(crate::host::swap::NOT_OPTED_IN.to_string())
                }
                (None, "kernel") => kernel::run_point(case, &sizes, threads, &plan),
                (None, n) => match mmkit::Setup::from_variant(n) {
                    Some(setup) => mmkit::run_point(setup, case, &sizes, threads, &plan),
                    None => Err(format!("unknown variant {n}")),
                },
            };
            match r {
                Ok(o) => {
                    let base = if name == "mmkit-alone" {
                        set_alone(case, threads, o.as_alone());
                        Some(o.as_alone())
                    } else {
                        o.alone.or_else(|| alone(case, threads))
                    };
                    if o.failures > 0 {
                        eprintln!(
                            "note: memcg {name} {}: {} accesses failed",
                            case.name(),
                            o.failures
                        );
                    }
                    out.extend(figures(case, &o, threads, base));
                }
                Err(why) => eprintln!("note: memcg {name} {} skipped: {why}", case.name()),
            }
        }
        out
    }

    fn repeatable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
