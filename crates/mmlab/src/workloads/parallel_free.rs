//! `parallel_free` (the "parallel free" of Aaron Lu's zone->lock series, docs/upstream.md): fault a large anonymous
//! region in (1 GiB; `--quick`: 64 MiB), 4 KiB pages, then time its unmap. mmkit
//! frees it with `munmap_parallel(addr, len, n)`, n being the point's thread
//! count (n = 1 is a plain `munmap`); `kernel` maps the same size with libc,
//! writes one byte per 4 KiB, and times one `munmap` (thread count 1 only). A
//! point is several repetitions (5; `--quick`: 3, after one untimed warmup
//! repetition in a full run); the figure is their median.

use super::presets::build_fault_preset;
use super::{arena_for, gb_per_sec, median, Figure, Metric, Workload, ALLOC_FAILURES};
use crate::host::facts::thp_mode;
use crate::host::mem::{mmap_anon, PAGE};
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Timing};
use anyhow::Result;
use mmkit::{MapFlags, Mm};
use serde_json::{Map, Value};
use std::time::{Duration, Instant};

/// Bytes faulted in and freed per repetition.
pub const REGION: usize = 1 << 30;
/// The same with `--quick`.
pub const QUICK_REGION: usize = 64 << 20;
/// Timed repetitions per point.
pub const REPS: usize = 5;
/// The same with `--quick`.
pub const QUICK_REPS: usize = 3;

pub const FREE_GB_PER_SEC: Metric = Metric {
    name: "free_gb_per_sec",
    unit: "GB/s",
    description: "bytes unmapped (and their pages freed) per second, in 10^9 bytes; the median \
                  of the repetitions",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

const METRICS: &[Metric] = &[FREE_GB_PER_SEC, ALLOC_FAILURES];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "Space::munmap_parallel(addr, len, threads), default policies",
    },
    VariantInfo {
        name: "mmkit-eager",
        description: "the same with the eager (pre zone-lock work) policies",
    },
    VariantInfo {
        name: "mmkit-nopcp",
        description: "the same without per-CPU lists",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: libc mmap, a byte written per 4 KiB, one timed munmap \
                      (thread count 1 only)",
    },
];

pub struct ParallelFree;

fn region(quick: bool) -> usize {
    if quick {
        QUICK_REGION
    } else {
        REGION
    }
}

fn reps(quick: bool) -> usize {
    if quick {
        QUICK_REPS
    } else {
        REPS
    }
}

/// One mmkit repetition: map, populate (write faults), time the unmap. `None` if
/// something was refused (out of memory).
fn rep_mmkit(mm: &Mm, len: usize, threads: usize) -> Option<Duration> {
    let space = mm.new_space().ok()?;
    let a = space.mmap(len, MapFlags::empty()).ok()?;
    space.populate(a, len, true).ok()?;
    let t0 = Instant::now();
    space.munmap_parallel(a, len, threads).ok()?;
    Some(t0.elapsed())
}

/// One kernel repetition: mmap, a byte per 4 KiB, time the munmap.
fn rep_kernel(len: usize) -> Option<Duration> {
    let p = mmap_anon(len, 0).ok()?.as_ptr();
    for off in (0..len).step_by(PAGE) {
        // SAFETY: off < len, inside our fresh private read/write mapping.
        unsafe { p.add(off).write_volatile(1) };
    }
    let t0 = Instant::now();
    // SAFETY: exactly the mapping made above; no reference into it remains.
    let rc = unsafe { libc::munmap(p.cast(), len) };
    let dt = t0.elapsed();
    (rc == 0).then_some(dt)
}

impl Workload for ParallelFree {
    fn name(&self) -> &'static str {
        "parallel_free"
    }

    fn description(&self) -> &'static str {
        "fault 1 GiB (quick: 64 MiB) of 4 KiB pages into one Space, then time \
         munmap_parallel with the point's thread count (kernel: one munmap); \
         free_gb_per_sec is the median of 5 (quick: 3) repetitions"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[1, 2, 4]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(VARIANTS)
    }

    fn mmkit_arena(&self, config: &Config) -> usize {
        self.arena(config)
    }

    fn build(&self, variant: &str, config: &Config) -> Result<Peer> {
        build_fault_preset(VARIANTS, variant, self.arena(config))
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let mut p = Map::new();
        let q = config.timing.quick;
        p.insert("region_bytes".into(), (region(q) as u64).into());
        p.insert("reps".into(), reps(q).into());
        p.insert("memory_bytes".into(), (self.arena(config) as u64).into());
        p.insert("host_thp".into(), thp_mode().into());
        p
    }

    fn repeatable(&self) -> bool {
        false
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let len = region(timing.quick);
        let rep = || match peer.mm() {
            Some(mm) => rep_mmkit(mm, len, threads),
            None => rep_kernel(len),
        };
        if peer.mm().is_none() && threads != 1 {
            return Vec::new();
        }
        if !timing.quick {
            rep();
        }
        let mut rates = Vec::new();
        let mut failures = 0u64;
        for _ in 0..reps(timing.quick) {
            peer.settle();
            match rep() {
                Some(dt) => rates.push(gb_per_sec(len as f64, dt.as_secs_f64())),
                None => failures += 1,
            }
        }
        let mut out = Vec::new();
        if let Some(m) = median(&rates) {
            out.push(Figure::new(FREE_GB_PER_SEC.name, m));
        }
        out.push(Figure::new(ALLOC_FAILURES.name, failures as f64));
        out
    }
}

impl ParallelFree {
    fn arena(&self, config: &Config) -> usize {
        // A quarter more than the region: the per-CPU lists of the previous
        // repetition are drained, but the margin keeps a stray one harmless.
        arena_for(region(config.timing.quick) / 4 * 5).max(config.memory)
    }
}
