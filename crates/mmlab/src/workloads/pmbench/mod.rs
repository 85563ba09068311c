//! `pmbench` (the swap experiment of Huang Ying's swap-slot series,
//! docs/upstream.md): each thread has its own address space and loops over uniformly random pages of its working set, 80% 4-byte
//! reads and 20% 4-byte writes; the working sets together are `WSS_FACTOR` times
//! the arena, and swap is a RAM device sized to hold them with a sixteenth to
//! spare (nearly full and fragmented, as in the seed). Each point warms up until
//! swapping is steady (the swap-out rate of three consecutive intervals within
//! 30% of each other, bounded by a maximum warmup), then measures.
//!
//! Variants: `mmkit` and its swap presets (`mmkit-swap-2019`, `-2020`, `-6.18`),
//! and `kernel`, the same loop in a child process in a memory cgroup swapping to
//! a loop device over tmpfs (`kernel`, on `host::swap` and `host::child`). The
//! NBD pair swaps to nbdkit's memory plugin on a Unix socket (`host::nbd`):
//! `mmkit-nbd` through `SwapDevice::nbd`, `kernel-nbd` through a loop device
//! over an nbdfuse file. An mmkit variant's device is on only for its points
//! (`device.rs`), so one device is backed at a time.
//!
//! The access loop (`AccessLoop`) and `run_loops` are shared by both sides:
//! `run_loops` runs a loop per working set through `phase::drive`, whose
//! threads read one phase word (warmup, measure, stop) that a controller
//! flips; they count accesses and time one access in `SAMPLE_EVERY` only while
//! measuring. An op is one 4-byte access.

pub mod device;
pub mod kernel;

use super::{Figure, Metric, Workload, XorShift};
use crate::host::{cpu, nbd, now_ns};
use crate::peers::{Peer, VariantInfo};
use crate::phase::{self, Phase, PhaseWord, Placement};
use crate::runner::{Config, Timing};
use hdrhistogram::Histogram;
use mmkit::{LockStats, Mm, Space, Variant, VmEvent};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

/// The working sets together, in arenas.
pub const WSS_FACTOR: usize = 4;
/// The arena (mmkit) and the cgroup's limit (kernel), full run: 256 MiB keeps
/// the 40 points of a default run (each warmed up until swapping is steady)
/// at a few minutes on a small host; the working sets are 1 GiB.
pub const ARENA: usize = 256 << 20;
/// The same with `--quick`.
pub const QUICK_ARENA: usize = 32 << 20;
/// Writes, in percent of accesses.
pub const WRITE_PCT: u64 = 20;
/// One access in this many is timed while measuring.
pub const SAMPLE_EVERY: u64 = 64;
/// Latency samples kept per thread (a ring: the latest).
pub const MAX_SAMPLES: usize = 1 << 16;
/// Accesses between two reads of the phase word.
const BATCH: u64 = 256;

pub const ACCESSES_PER_SEC: Metric = Metric {
    name: "accesses_per_sec",
    unit: "1/s",
    description: "4-byte accesses (80% reads, 20% writes) per second, all threads summed: \
                  the pmbench score",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const SWAPIN_GB_PER_SEC: Metric = Metric {
    name: "swapin_gb_per_sec",
    unit: "GB/s",
    description: "pages swapped in (pswpin) x 4096 bytes per second over the measured interval \
                  (kernel: the host's /proc/vmstat)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const SWAPOUT_GB_PER_SEC: Metric = Metric {
    name: "swapout_gb_per_sec",
    unit: "GB/s",
    description: "pages swapped out (pswpout) x 4096 bytes per second over the measured \
                  interval (kernel: the host's /proc/vmstat)",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const LATENCY_P50: Metric = Metric {
    name: "access_latency_p50_ns",
    unit: "ns",
    description: "median latency of one access (one access in 64 timed while measuring)",
    higher_is_better: false,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const LATENCY_P99: Metric = Metric {
    name: "access_latency_p99_ns",
    unit: "ns",
    description: "99th percentile latency of one access (the same samples)",
    higher_is_better: false,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const SWAP_CACHE_LOCK_PCT: Metric = Metric {
    name: "swap_cache_lock_contended_pct",
    unit: "%",
    description: "swap-cache lock acquisitions (trunk locks; the cluster locks that guard the \
                  table) that found the lock held, in percent",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};
pub const SWAP_LOCK_PCT: Metric = Metric {
    name: "swap_lock_contended_pct",
    unit: "%",
    description: "swap device and cluster lock acquisitions that found the lock held, in percent",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};
pub const LRU_LOCK_PCT: Metric = Metric {
    name: "lru_lock_contended_pct",
    unit: "%",
    description: "LRU lock acquisitions that found the lock held, in percent",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};

pub const THREAD_MIN: Metric = Metric {
    name: "thread_accesses_per_sec_min",
    unit: "1/s",
    description: "the slowest thread's accesses per second over the measured interval",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const THREAD_MEDIAN: Metric = Metric {
    name: "thread_accesses_per_sec_median",
    unit: "1/s",
    description: "the median thread's accesses per second over the measured interval",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};
pub const THREAD_MAX: Metric = Metric {
    name: "thread_accesses_per_sec_max",
    unit: "1/s",
    description: "the fastest thread's accesses per second over the measured interval",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

const METRICS: &[Metric] = &[
    ACCESSES_PER_SEC,
    THREAD_MIN,
    THREAD_MEDIAN,
    THREAD_MAX,
    SWAPIN_GB_PER_SEC,
    SWAPOUT_GB_PER_SEC,
    LATENCY_P50,
    LATENCY_P99,
    SWAP_CACHE_LOCK_PCT,
    SWAP_LOCK_PCT,
    LRU_LOCK_PCT,
];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit, default policies: swap table and per-CPU clusters, RAM swap device",
    },
    VariantInfo {
        name: "mmkit-loadctl",
        description: "mmkit with working-set load control: groups of threads whose working \
                      sets fit take turns while the sets together thrash",
    },
    VariantInfo {
        name: "mmkit-swap-2019",
        description: "mmkit with Linux's swap before the per-CPU swap-slot cursors: one shared \
                      scan cursor, swap cache in 64 MiB trunks",
    },
    VariantInfo {
        name: "mmkit-swap-2020",
        description: "mmkit with per-CPU swap-slot cursors jumping to random trunks, trunks",
    },
    VariantInfo {
        name: "mmkit-swap-6.18",
        description: "mmkit as Linux 6.18: per-CPU clusters, the swap table, Linux's LRU",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: the same loop in a child process, in a memory cgroup \
                      limited to the arena, swapping to a loop device over tmpfs (needs root)",
    },
    VariantInfo {
        name: "mmkit-nbd",
        description: "mmkit, default policies, swapping to nbdkit's memory plugin on a Unix \
                      socket (SwapDevice::nbd; needs nbdkit)",
    },
    VariantInfo {
        name: "kernel-nbd",
        description: "the host kernel as `kernel`, swapping to the same kind of nbdkit through \
                      a loop device over an nbdfuse file (needs root, nbdkit, nbdfuse, FUSE)",
    },
];

/// The arena under `timing`.
pub fn arena(quick: bool) -> usize {
    if quick {
        QUICK_ARENA
    } else {
        ARENA
    }
}

/// Each thread's working set when `threads` share `WSS_FACTOR` arenas (whole
/// pages).
pub fn wss_per_thread(arena: usize, threads: usize) -> usize {
    (arena * WSS_FACTOR / threads.max(1)) / 4096 * 4096
}

/// The swap device: the working sets and a sixteenth more.
pub fn swap_bytes(arena: usize) -> usize {
    let wss = arena * WSS_FACTOR;
    wss + wss / 16
}

/// How a point is paced: warmup bounds, the steadiness check's interval and the
/// measured interval.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub min_warmup: Duration,
    pub max_warmup: Duration,
    pub interval: Duration,
    pub duration: Duration,
}

impl Plan {
    /// Quick: 0.2..2 s of warmup; full: 1..20 s; at least the run's warmup.
    /// Measured: the run's duration, at least 2 s in a full run.
    pub fn of(timing: &Timing) -> Plan {
        let (min, max, interval) = if timing.quick {
            (200, 2_000, 50)
        } else {
            (1_000, 20_000, 200)
        };
        // One round per point (the warmup is long): a full run measures at
        // least 2 s, so that a point is not one scheduler hiccup on a small host.
        let min_duration = Duration::from_millis(if timing.quick { 0 } else { 2_000 });
        Plan {
            min_warmup: timing.warmup.max(Duration::from_millis(min)),
            max_warmup: Duration::from_millis(max).max(timing.warmup),
            interval: Duration::from_millis(interval),
            duration: timing.duration.max(min_duration),
        }
    }
}

/// Memory the access loop works on: `len` bytes from offset 0.
pub trait Memory {
    fn len(&self) -> u64;
    /// Reads the 4 bytes at `off` (4-aligned, below `len`); false on failure.
    fn read4(&mut self, off: u64) -> bool;
    /// Writes `v` to the 4 bytes at `off`; false on failure.
    fn write4(&mut self, off: u64, v: u32) -> bool;
}

/// One thread's uniformly random 80/20 read/write loop over its `Memory`.
pub struct AccessLoop<M: Memory> {
    mem: M,
    rng: XorShift,
    pages: u64,
    pub reads: u64,
    pub writes: u64,
    pub failures: u64,
    /// Timed accesses, ns (a ring of `MAX_SAMPLES`).
    pub samples: Vec<u32>,
    timed: u64,
    n: u64,
}

impl<M: Memory> AccessLoop<M> {
    pub fn new(mem: M, seed: u64) -> Self {
        let pages = (mem.len() / 4096).max(1);
        AccessLoop {
            mem,
            rng: XorShift::new(seed),
            pages,
            reads: 0,
            writes: 0,
            failures: 0,
            samples: Vec::new(),
            timed: 0,
            n: 0,
        }
    }

    #[inline]
    fn one(&mut self) -> bool {
        let r = self.rng.next_u64();
        // The page: the high 64 bits of r * pages (uniform, no division).
        let page = ((u128::from(r) * u128::from(self.pages)) >> 64) as u64;
        let off = page * 4096 + (r & 1023) * 4;
        if (r >> 10) % 100 < WRITE_PCT {
            self.writes += 1;
            self.mem.write4(off, r as u32)
        } else {
            self.reads += 1;
            self.mem.read4(off)
        }
    }

    /// Does `count` accesses (timing one in `SAMPLE_EVERY` if `measure`);
    /// returns how many succeeded.
    pub fn batch(&mut self, count: u64, measure: bool) -> u64 {
        let mut ok = 0;
        for _ in 0..count {
            self.n += 1;
            let good = if measure && self.n.is_multiple_of(SAMPLE_EVERY) {
                let t0 = now_ns();
                let g = self.one();
                let ns = u32::try_from(now_ns().saturating_sub(t0)).unwrap_or(u32::MAX);
                let i = (self.timed % MAX_SAMPLES as u64) as usize;
                if i < self.samples.len() {
                    self.samples[i] = ns;
                } else {
                    self.samples.push(ns);
                }
                self.timed += 1;
                g
            } else {
                self.one()
            };
            if good {
                ok += 1;
            } else {
                self.failures += 1;
            }
        }
        ok
    }
}

/// What the threads of one point did while measuring.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub accesses: u64,
    pub reads: u64,
    pub writes: u64,
    pub failures: u64,
    pub elapsed: Duration,
    pub samples: Vec<u32>,
    /// Each thread's accesses while measuring, in thread order.
    pub per_thread: Vec<u64>,
}

/// Runs an `AccessLoop` per memory on its own thread (thread i on the i-th
/// allowed CPU, round robin) while `control` moves the phase to `Measure` and
/// then `Stop`; `control` returns the measured interval. Counts only what was
/// done while measuring.
pub fn run_loops<M: Memory + Send>(
    mems: Vec<M>,
    seed: u64,
    control: impl FnOnce(&PhaseWord) -> Duration,
) -> Outcome {
    let cpus = cpu::allowed_cpus();
    let (elapsed, outs) = phase::drive(
        mems,
        |i| Placement::on(cpu::round_robin(&cpus, i)),
        |i, mem, word| {
            let mut lp = AccessLoop::new(mem, seed.wrapping_add(i as u64 * 7919));
            let (mut acc, mut r0, mut w0, mut f0) = (0, 0, 0, 0);
            let mut measuring = false;
            loop {
                let ph = word.get();
                if ph == Phase::Stop {
                    break;
                }
                if ph == Phase::Measure && !measuring {
                    measuring = true;
                    (r0, w0, f0) = (lp.reads, lp.writes, lp.failures);
                }
                let n = lp.batch(BATCH, measuring);
                if measuring {
                    acc += n;
                }
            }
            if !measuring {
                (r0, w0, f0) = (lp.reads, lp.writes, lp.failures);
            }
            Outcome {
                accesses: acc,
                reads: lp.reads - r0,
                writes: lp.writes - w0,
                failures: lp.failures - f0,
                elapsed: Duration::ZERO,
                samples: lp.samples,
                per_thread: Vec::new(),
            }
        },
        control,
    );
    let mut out = Outcome {
        elapsed,
        ..Outcome::default()
    };
    for o in outs {
        out.accesses += o.accesses;
        out.reads += o.reads;
        out.writes += o.writes;
        out.failures += o.failures;
        out.samples.extend(o.samples);
        out.per_thread.push(o.accesses);
    }
    out
}

/// Steadiness of swapping from the cumulative swap-in and swap-out counters
/// sampled at intervals: steady once the last three swap-in rates are non-zero
/// and within 30% of each other, and the last one is at least half the swap-out
/// rate (while the working sets are still being filled, pages go out and few
/// come back).
#[derive(Default)]
pub struct Steady {
    last: Option<(f64, u64, u64)>,
    rates: Vec<(f64, f64)>,
}

impl Steady {
    /// Adds a sample (seconds since start, pswpin, pswpout); true when steady.
    pub fn feed(&mut self, t: f64, ins: u64, outs: u64) -> bool {
        if let Some((t0, i0, o0)) = self.last {
            let dt = (t - t0).max(1e-9);
            let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            self.rates.push((r(ins, i0), r(outs, o0)));
        }
        self.last = Some((t, ins, outs));
        let Some(last3) = self.rates.len().checked_sub(3).map(|i| &self.rates[i..]) else {
            return false;
        };
        let min = last3.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let max = last3.iter().map(|r| r.0).fold(0.0, f64::max);
        let (i, o) = last3[2];
        min > 0.0 && max <= min * 1.3 && i >= 0.5 * o
    }
}

/// Waits until `counters()` (pswpin, pswpout) says swapping is steady (after
/// `min_warmup`) or `max_warmup` passed; true if it became steady. `alive` is
/// polled too: a false ends the warmup (the child died).
pub fn warm_up(
    plan: &Plan,
    mut counters: impl FnMut() -> (u64, u64),
    mut alive: impl FnMut() -> bool,
) -> bool {
    let t0 = Instant::now();
    let mut st = Steady::default();
    loop {
        std::thread::sleep(plan.interval);
        let t = t0.elapsed();
        let (i, o) = counters();
        let steady = st.feed(t.as_secs_f64(), i, o);
        if !alive() {
            return false;
        }
        if steady && t >= plan.min_warmup {
            return true;
        }
        if t >= plan.max_warmup {
            return false;
        }
    }
}

/// Lock contention in percent of the swap cache, the swap device and
/// clusters, and the LRU (mmkit variants).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LockPcts {
    pub swap_cache: f64,
    pub swap: f64,
    pub lru: f64,
}

/// The p-th quantile (0..=1) of latency samples in ns; 0 without samples.
pub fn quantile(samples: &[u32], q: f64) -> f64 {
    let mut h = Histogram::<u64>::new_with_bounds(1, 1 << 40, 3).expect("valid bounds");
    for &s in samples {
        h.saturating_record(u64::from(s.max(1)));
    }
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64
    }
}

/// The figures of one point: `o` from the threads, the pages swapped in and out
/// over `swap_secs` (the controller's view of the measured interval).
pub fn figures(
    o: &Outcome,
    swap_secs: f64,
    swapin_pages: u64,
    swapout_pages: u64,
    locks: Option<LockPcts>,
) -> Vec<Figure> {
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let mut rates: Vec<f64> = o.per_thread.iter().map(|&a| a as f64 / secs).collect();
    rates.sort_by(f64::total_cmp);
    let mut out = vec![
        Figure::new(ACCESSES_PER_SEC.name, o.accesses as f64 / secs),
        Figure::new(
            SWAPIN_GB_PER_SEC.name,
            super::gb_per_sec(swapin_pages as f64 * 4096.0, swap_secs),
        ),
        Figure::new(
            SWAPOUT_GB_PER_SEC.name,
            super::gb_per_sec(swapout_pages as f64 * 4096.0, swap_secs),
        ),
        Figure::new(LATENCY_P50.name, quantile(&o.samples, 0.5)),
        Figure::new(LATENCY_P99.name, quantile(&o.samples, 0.99)),
    ];
    if let (Some(min), Some(max)) = (rates.first(), rates.last()) {
        out.push(Figure::new(THREAD_MIN.name, *min));
        out.push(Figure::new(
            THREAD_MEDIAN.name,
            super::median(&rates).unwrap_or(*min),
        ));
        out.push(Figure::new(THREAD_MAX.name, *max));
    }
    if let Some(l) = locks {
        out.push(Figure::new(SWAP_CACHE_LOCK_PCT.name, l.swap_cache));
        out.push(Figure::new(SWAP_LOCK_PCT.name, l.swap));
        out.push(Figure::new(LRU_LOCK_PCT.name, l.lru));
    }
    out
}

/// A working set in an mmkit `Space` of its own.
pub struct MmkitMem {
    space: Space,
    base: u64,
    len: u64,
}

impl MmkitMem {
    /// A `Space` of `mm` with `len` bytes mapped.
    pub fn new(mm: &Mm, len: usize) -> Result<MmkitMem, mmkit::Error> {
        let space = mm.new_space()?;
        let base = space.mmap(len, mmkit::MapFlags::empty())?;
        // Fill the working set first (pages go out in address order), as the
        // kernel child does, so that the warmup starts from a full device.
        for off in (0..len as u64).step_by(4096) {
            space.write(base + off, &[1])?;
        }
        Ok(MmkitMem {
            space,
            base,
            len: len as u64,
        })
    }
}

impl Memory for MmkitMem {
    fn len(&self) -> u64 {
        self.len
    }
    fn read4(&mut self, off: u64) -> bool {
        let mut b = [0u8; 4];
        self.space.read(self.base + off, &mut b).is_ok()
    }
    fn write4(&mut self, off: u64, v: u32) -> bool {
        self.space.write(self.base + off, &v.to_le_bytes()).is_ok()
    }
}

/// The lock counters of an mmkit variant that `pmbench` reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct SwapLocks {
    pub device: LockStats,
    pub cluster: LockStats,
    pub trunk: LockStats,
    pub lru: LockStats,
}

impl SwapLocks {
    /// The counters of `mm` now.
    pub fn of(mm: &Mm) -> SwapLocks {
        let (device, cluster, trunk) = mm.swap_lock_stats();
        SwapLocks {
            device,
            cluster,
            trunk,
            lru: mm.lru_lock_stats(),
        }
    }

    /// Contention over the interval from `before` to `self`: the swap cache's
    /// lock is the trunk lock (`Trunks`), or with the swap table (no trunk
    /// lock taken) the cluster lock its writes take; the swap locks are the
    /// device and cluster locks together.
    pub fn pcts_since(&self, before: &SwapLocks) -> LockPcts {
        let d = self.device.since(&before.device);
        let c = self.cluster.since(&before.cluster);
        let t = self.trunk.since(&before.trunk);
        let both = LockStats {
            acquisitions: d.acquisitions + c.acquisitions,
            contended: d.contended + c.contended,
            wait_ns: d.wait_ns + c.wait_ns,
        };
        LockPcts {
            swap_cache: if t.acquisitions > 0 {
                t.contended_pct()
            } else {
                c.contended_pct()
            },
            swap: both.contended_pct(),
            lru: self.lru.since(&before.lru).contended_pct(),
        }
    }
}

/// (pswpin, pswpout) of `mm`.
pub fn mm_swap_counters(mm: &Mm) -> (u64, u64) {
    let e = mm.vm_events();
    (e.get(VmEvent::PswpIn), e.get(VmEvent::PswpOut))
}

/// One point on mmkit: a `Space` per thread with its working set, warmed up
/// until `counters()` (pswpin, pswpout) shows steady swapping, then measured.
/// `locks` gives the lock counters (None: not known).
pub fn run_mmkit(
    mm: &Mm,
    threads: usize,
    wss: usize,
    plan: &Plan,
    counters: impl Fn() -> (u64, u64),
    locks: impl Fn() -> Option<SwapLocks>,
) -> Result<Vec<Figure>, String> {
    let mems = (0..threads.max(1))
        .map(|_| MmkitMem::new(mm, wss))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("mapping the working sets: {e}"))?;
    let mut swap = (0, 0, 0.0);
    let mut pcts = None;
    let o = run_loops(mems, 0x5eed, |word| {
        if !warm_up(plan, &counters, || true) {
            eprintln!("note: pmbench mmkit: swapping not steady after the maximum warmup");
        }
        let (c0, l0) = (counters(), locks());
        let e = word.measure_for(plan.duration);
        let (c1, l1) = (counters(), locks());
        swap = (c1.0 - c0.0, c1.1 - c0.1, e.as_secs_f64());
        pcts = l1.zip(l0).map(|(a, b)| a.pcts_since(&b));
        e
    });
    Ok(figures(&o, swap.2, swap.0, swap.1, pcts))
}

pub struct Pmbench;

impl Workload for Pmbench {
    fn name(&self) -> &'static str {
        "pmbench"
    }

    fn description(&self) -> &'static str {
        "pmbench as the swap-slot series ran it: a space per thread, uniformly random 4-byte accesses \
         (80% reads) over working sets 4x the arena (512 MiB; quick: 32 MiB), swap on a RAM \
         device just large enough; warmed up until swapping is steady; an op is one access"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[1, 2, 4, 8, 16]
    }

    fn quick_threads(&self) -> &'static [usize] {
        &[1, 2]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(VARIANTS)
    }

    fn mmkit_arena(&self, config: &Config) -> usize {
        arena(config.timing.quick)
    }

    fn peak_bytes(&self, config: &Config, variants: usize) -> usize {
        // Each mmkit variant's arena, and one swap device (on for a point
        // only, `device.rs`) or the kernel peer's cgroup and tmpfs swap file.
        let a = arena(config.timing.quick);
        variants.max(1) * a + a + swap_bytes(a)
    }

    fn build(&self, variant: &str, config: &Config) -> anyhow::Result<Peer> {
        let Some(info) = VARIANTS.iter().find(|v| v.name == variant) else {
            anyhow::bail!("unknown variant {variant:?} for pmbench");
        };
        match Variant::from_name(variant) {
            Some(v) => device::build_mmkit(variant, v, config),
            None if variant == "mmkit-nbd" && nbd::nbdkit_unavailable().is_none() => {
                device::build_mmkit_nbd(variant, config)
            }
            None => Ok(Peer::Native(info.name)),
        }
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let a = arena(config.timing.quick);
        let mut p = Map::new();
        p.insert("memory_bytes".into(), (a as u64).into());
        p.insert("wss_total_bytes".into(), ((a * WSS_FACTOR) as u64).into());
        p.insert("swap_bytes".into(), (swap_bytes(a) as u64).into());
        p.insert("write_pct".into(), WRITE_PCT.into());
        let dev = match &config.swap_file {
            Some(f) => format!("file:{}", f.display()),
            None => "ram".into(),
        };
        p.insert("swap".into(), dev.into());
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let name = peer.native().unwrap_or("mmkit");
        let plan = Plan::of(timing);
        let a = arena(timing.quick);
        let r = match (peer.mm(), name) {
            (Some(mm), _) => device::with_swap(peer, mm, a, || {
                run_mmkit(
                    mm,
                    threads,
                    wss_per_thread(a, threads),
                    &plan,
                    || mm_swap_counters(mm),
                    || Some(SwapLocks::of(mm)),
                )
            }),
            (None, "kernel") if timing.quick && !crate::host::swap::opted_in() => {
                Err(crate::host::swap::NOT_OPTED_IN.to_string())
            }
            (None, "kernel") => kernel::run_point(threads, a, &plan),
            (None, "mmkit-nbd") => Err(nbd::nbdkit_unavailable().unwrap_or_default()),
            (None, "kernel-nbd") if timing.quick && !crate::host::swap::opted_in() => {
                Err(crate::host::swap::NOT_OPTED_IN.to_string())
            }
            (None, "kernel-nbd") => kernel::run_point_nbd(threads, a, &plan),
            (None, _) => Err(format!("unknown variant {name}")),
        };
        r.unwrap_or_else(|why| {
            eprintln!("note: pmbench {name} at {threads} threads skipped: {why}");
            Vec::new()
        })
    }

    fn repeatable(&self) -> bool {
        // A point's warmup can take many seconds; one round per point.
        false
    }
}

#[cfg(test)]
mod tests;
