//! `highalloc` (mmtests' stress-highalloc, the high-order test of Aaron Lu's
//! zone->lock series, docs/upstream.md): how many order-9 blocks can still be
//! had, and how fast, from memory that order-0 pages have fragmented, while
//! page faults keep going.
//!
//! The arena is the run's planned arena (1 GiB where the memory budget allows;
//! `--quick`: at most 128 MiB). A
//! point, on one mmkit variant:
//! 1. fill: one `Space` maps `FILL_PCT`% of the free memory and writes every page
//!    of it (movable order-0 pages with a reverse map);
//! 2. scatter: every other page of the fill is unmapped, so that half of it is
//!    free but no two free pages are neighbours;
//! 3. the `threads` background threads run `page_fault1` (each maps a region of
//!    `REGION` bytes, `--quick`: `QUICK_REGION`, writes a byte per page, unmaps,
//!    loops, each in its own `Space`) for the warmup and the measured interval;
//! 4. during the measured interval the main thread requests `nr_req` order-9
//!    blocks (`Gfp::MOVABLE | Gfp::NOWARN`, so the slow path may compact) at a set
//!    rate, evenly spaced over the interval, and keeps those it gets (as
//!    stress-highalloc does). `nr_req` is `DEMAND_PCT`% of the order-9 blocks
//!    the free memory would make after the scatter, less the background threads'
//!    regions: within what perfect compaction could give, so that a failure is
//!    a block the policy could not build, not memory running out.
//!
//! Figures: `success_pct` (blocks got / requested), the latency of a request
//! (successful or not) at the median and the 99th percentile, the background
//! threads' `faults_per_sec`, and the allocations they could not get.
//!
//! Variants: the merge presets (`presets`): `mmkit` (lazy merging with merge on
//! demand), `mmkit-eager` (merge on every free), `mmkit-nomerge` (lazy merging,
//! no merge on demand). All three have the same compaction (direct and
//! kcompactd) and clear pages the same way (auto), so the columns differ in the
//! merging policy and its per-CPU list policies only.

use super::presets::{build_merge_preset, MERGE_VARIANTS};
use super::space_loop::{fill, Access, MapAccessLoop, MmkitTarget};
use super::{Figure, Metric, Workload, ALLOC_FAILURES, FAULTS_PER_SEC};
use crate::peers::{Peer, VariantInfo};
use crate::phase::{self, Placement};
use crate::runner::{Config, Timing, Worker};
use anyhow::Result;
use mmkit::{Gfp, Pfn, PAGE_SIZE};
use serde_json::{Map, Value};
use std::time::Instant;

/// Largest arena with `--quick` (a full run uses the planned arena, 1 GiB where it fits).
pub const QUICK_ARENA: usize = 128 << 20;
/// Share of the free memory the fill faults in, in percent.
pub const FILL_PCT: u64 = 90;
/// Order-9 requests, in percent of the blocks the free memory would make after
/// the scatter (less the background threads' regions).
pub const DEMAND_PCT: u64 = 90;
/// Region each background thread maps per iteration.
pub const REGION: usize = 32 << 20;
/// The same with `--quick`.
pub const QUICK_REGION: usize = 4 << 20;

const PAGE: u64 = PAGE_SIZE as u64;

pub const SUCCESS_PCT: Metric = Metric {
    name: "success_pct",
    unit: "%",
    description: "order-9 requests that got a block, in percent of the requests",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

pub const ALLOC_LATENCY_P50_US: Metric = Metric {
    name: "alloc_latency_p50_us",
    unit: "us",
    description: "median time of one order-9 request (successful or not), direct \
                  compaction included",
    higher_is_better: false,
    mmkit_only: false,
    hide_if_zero: false,
};

pub const ALLOC_LATENCY_P99_US: Metric = Metric {
    name: "alloc_latency_p99_us",
    unit: "us",
    description: "99th percentile of the time of one order-9 request",
    higher_is_better: false,
    mmkit_only: false,
    hide_if_zero: false,
};

const METRICS: &[Metric] = &[
    SUCCESS_PCT,
    ALLOC_LATENCY_P50_US,
    ALLOC_LATENCY_P99_US,
    FAULTS_PER_SEC,
    ALLOC_FAILURES,
];

/// Percentile `p` (0..=100) of sorted values (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub struct HighAlloc;

fn region(quick: bool) -> usize {
    if quick {
        QUICK_REGION
    } else {
        REGION
    }
}

fn arena(config: &Config) -> usize {
    if config.timing.quick {
        config.memory.min(QUICK_ARENA)
    } else {
        config.memory
    }
}

impl Workload for HighAlloc {
    fn name(&self) -> &'static str {
        "highalloc"
    }

    fn description(&self) -> &'static str {
        "stress-highalloc: fill 90% of free memory with faulted order-0 pages, unmap every \
         other one, then request order-9 blocks at a set rate (as many as the free memory \
         would make) while page_fault1 threads keep faulting; success rate and latency"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[2]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(MERGE_VARIANTS)
    }

    fn mmkit_arena(&self, config: &Config) -> usize {
        arena(config)
    }

    fn build(&self, variant: &str, config: &Config) -> Result<Peer> {
        build_merge_preset(variant, arena(config))
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("memory_bytes".into(), (arena(config) as u64).into());
        p.insert("fill_pct".into(), FILL_PCT.into());
        p.insert("demand_pct".into(), DEMAND_PCT.into());
        p.insert(
            "region_bytes".into(),
            (region(config.timing.quick) as u64).into(),
        );
        p.insert("gfp".into(), "MOVABLE|NOWARN".into());
        p
    }

    fn repeatable(&self) -> bool {
        false
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let Some(mm) = peer.mm() else {
            return Vec::new();
        };
        let region = region(timing.quick);
        let filler = mm.new_space().ok();
        let filled = filler.as_ref().and_then(|s| fill(mm, s, FILL_PCT));
        if let (Some(s), Some((a, pages))) = (&filler, filled) {
            for i in (0..pages).step_by(2) {
                let _ = s.munmap(a + i * PAGE, PAGE_SIZE);
            }
        }
        mm.drain_all_pages();
        let spare = mm
            .nr_free_pages()
            .saturating_sub((threads * region / PAGE_SIZE) as u64);
        let nr_req = (spare * DEMAND_PCT / 100 / 512).max(4) as usize;
        let interval = timing.duration / nr_req as u32;

        let mut lat_us: Vec<f64> = Vec::with_capacity(nr_req);
        let mut held: Vec<Pfn> = Vec::new();
        let (elapsed, bg) = phase::drive(
            vec![(); threads],
            |_| Placement::anywhere(),
            |_, (), word| {
                let t = mm.new_space().map_or(MmkitTarget::None, MmkitTarget::Own);
                let mut w = MapAccessLoop::new(t, region, Access::Touch);
                let ops = phase::step_until_stop(&mut w, word);
                w.finish();
                (ops, w.failures())
            },
            |word| {
                std::thread::sleep(timing.warmup);
                word.measure(|t0| {
                    for k in 0..nr_req {
                        let due = t0 + interval * k as u32;
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        let t = Instant::now();
                        let r = mm.alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9);
                        lat_us.push(t.elapsed().as_secs_f64() * 1e6);
                        if let Ok(p) = r {
                            held.push(p);
                        }
                    }
                    let end = t0 + timing.duration;
                    let now = Instant::now();
                    if end > now {
                        std::thread::sleep(end - now);
                    }
                })
            },
        );
        let bg_ops: u64 = bg.iter().map(|r| r.0).sum();
        let bg_failures: u64 = bg.iter().map(|r| r.1).sum();
        let got = held.len();
        for p in held {
            let _ = mm.free_pages(p, 9);
        }
        drop(filler);
        mm.wait_compaction_idle();
        lat_us.sort_by(|a, b| a.total_cmp(b));
        vec![
            Figure::new(SUCCESS_PCT.name, got as f64 * 100.0 / nr_req as f64),
            Figure::new(ALLOC_LATENCY_P50_US.name, percentile(&lat_us, 50.0)),
            Figure::new(ALLOC_LATENCY_P99_US.name, percentile(&lat_us, 99.0)),
            Figure::new(
                FAULTS_PER_SEC.name,
                bg_ops as f64 / elapsed.as_secs_f64().max(1e-9),
            ),
            Figure::new(ALLOC_FAILURES.name, bg_failures as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
