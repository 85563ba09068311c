//! `order0_thp_mix` (the mixed test of Aaron Lu's zone->lock series, docs/upstream.md): order-0 faults and huge-page
//! faults at the same time, after every high-order block was broken up: the case
//! where skipping the merge of order-0 pages cost huge pages dearly (-69% THP
//! score in the seed, -8.8% with its cluster allocation).
//!
//! A point, on one mmkit variant:
//! 1. break all high-order blocks: one `Space` faults 97% of the free memory as
//!    order-0 pages and is dropped (under eager merging the frees merge it all
//!    back; under lazy merging most of it stays unmerged until something needs
//!    it);
//! 2. `threads` threads run `page_fault1` for the warmup and the measured
//!    interval, each in its own `Space`, mapping `REGION` bytes (`--quick`:
//!    `QUICK_REGION`), writing one byte per 4 KiB page (`write(addr, &[1])`) and
//!    unmapping: the first `ceil(threads / 2)` with plain mappings (order-0
//!    faults), the others with `MapFlags::HUGE` mappings (an order-9 fault per 2 MiB, falling
//!    back to order 0 when no block can be had, direct compaction included).
//!
//! Figures: `order0_score` and `thp_score`, the pages written per second by each
//! half (will-it-scale's score); `huge_pct`, the share of the huge half's faults
//! that got an order-9 page (over the measured interval); the allocations that
//! failed; a half without threads (1 thread: no huge half) reports nothing.
//! Variants: the merge presets (`presets`), as `highalloc`'s. The arena holds every thread's region plus
//! 64 MiB (`arena_for`), as `page_fault1`'s does.
//!
//! CPUs: with at least as many allowed CPUs as threads, thread *i* runs on the
//! *i*-th; with fewer, each half gets its own share of the CPUs (the plain half the
//! first `max(1, n/2)`, the huge half the rest), so that the halves never
//! time-share a CPU and a score measures its half's path, not how much CPU the
//! other half left it (a half whose threads park on the zone lock would otherwise
//! lend its CPU to the other half).

use super::presets::{build_merge_preset, MERGE_VARIANTS};
use super::space_loop::{fill, Access, MapAccessLoop, MmkitTarget, Target};
use super::{arena_for, max_threads, Figure, Metric, Workload, ALLOC_FAILURES, HUGE_PCT};
use crate::host::cpu::allowed_cpus;
use crate::peers::{Peer, VariantInfo};
use crate::phase::{self, PhaseWord, Placement};
use crate::runner::{Config, Timing, Worker};
use anyhow::Result;
use mmkit::{MapFlags, Space};
use serde_json::{Map, Value};

/// Region each thread maps per iteration (will-it-scale's page_fault1 size).
pub const REGION: usize = 128 << 20;
/// The same with `--quick`.
pub const QUICK_REGION: usize = 8 << 20;
/// Share of the free memory faulted to break the high-order blocks, in percent.
pub const BREAK_PCT: u64 = 97;

pub const ORDER0_SCORE: Metric = Metric {
    name: "order0_score",
    unit: "1/s",
    description: "pages written per second by the threads faulting plain (order-0) mappings",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

pub const THP_SCORE: Metric = Metric {
    name: "thp_score",
    unit: "1/s",
    description: "pages written per second by the threads faulting MapFlags::HUGE mappings",
    higher_is_better: true,
    mmkit_only: false,
    hide_if_zero: false,
};

const METRICS: &[Metric] = &[ORDER0_SCORE, THP_SCORE, HUGE_PCT, ALLOC_FAILURES];

pub struct Order0ThpMix;

fn region(quick: bool) -> usize {
    if quick {
        QUICK_REGION
    } else {
        REGION
    }
}

impl Order0ThpMix {
    fn arena(&self, config: &Config) -> usize {
        arena_for(max_threads(self, config).max(2) * region(config.timing.quick))
    }
}

/// An address space whose mappings are `MapFlags::HUGE`.
struct HugeTarget<'a>(&'a Space);

impl Target for HugeTarget<'_> {
    fn map(&mut self, len: usize) -> Option<u64> {
        self.0.mmap(len, MapFlags::HUGE).ok()
    }

    unsafe fn access(&mut self, addr: u64, _how: Access) -> bool {
        self.0.write(addr, &[1]).is_ok()
    }

    unsafe fn unmap(&mut self, addr: u64, len: usize) -> bool {
        self.0.munmap(addr, len).is_ok()
    }
}

/// The CPUs thread `tid` of `threads` (the first `n0` plain) may run on.
fn cpus_for(cpus: &[usize], tid: usize, threads: usize, n0: usize) -> Vec<usize> {
    if cpus.is_empty() {
        return Vec::new();
    }
    if cpus.len() >= threads {
        return vec![cpus[tid]];
    }
    if n0 == 0 || n0 == threads || cpus.len() < 2 {
        return cpus.to_vec();
    }
    let split = (cpus.len() / 2).max(1);
    if tid < n0 {
        cpus[..split].to_vec()
    } else {
        cpus[split..].to_vec()
    }
}

/// Runs `w` until the phase says stop, then lets it release what it holds;
/// returns (ops counted while measuring, failed allocations).
fn run_loop(mut w: impl Worker, word: &PhaseWord) -> (u64, u64) {
    let ops = phase::step_until_stop(&mut w, word);
    w.finish();
    (ops, w.failures())
}

/// (faults that got an order-9 page, faults that fell back) of the huge spaces.
fn huge_counts(spaces: &[Space]) -> (u64, u64) {
    spaces.iter().fold((0, 0), |(h, f), s| {
        let st = s.stats();
        (h + st.huge_faults, f + st.huge_fallbacks)
    })
}

impl Workload for Order0ThpMix {
    fn name(&self) -> &'static str {
        "order0_thp_mix"
    }

    fn description(&self) -> &'static str {
        "after breaking every high-order block (fault 97% of memory as order 0, release it), \
         half the threads run page_fault1 on plain mappings, half on MapFlags::HUGE mappings \
         (128 MiB each, quick: 8 MiB); pages written per second by each half"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[4]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(MERGE_VARIANTS)
    }

    fn mmkit_arena(&self, config: &Config) -> usize {
        self.arena(config)
    }

    fn build(&self, variant: &str, config: &Config) -> Result<Peer> {
        build_merge_preset(variant, self.arena(config))
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("memory_bytes".into(), (self.arena(config) as u64).into());
        p.insert(
            "region_bytes".into(),
            (region(config.timing.quick) as u64).into(),
        );
        p.insert("break_pct".into(), BREAK_PCT.into());
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let Some(mm) = peer.mm() else {
            return Vec::new();
        };
        let len = region(timing.quick);
        let threads = threads.max(1);
        let n0 = threads.div_ceil(2);
        // 1. Break the high-order blocks.
        if let Ok(s) = mm.new_space() {
            fill(mm, &s, BREAK_PCT);
        }
        mm.drain_all_pages();
        // 2. The two halves, each thread in its own space.
        let spaces: Vec<Space> = (0..threads).filter_map(|_| mm.new_space().ok()).collect();
        let (plain, huge) = spaces.split_at(n0.min(spaces.len()));
        let cpus = allowed_cpus();
        let nthreads = plain.len() + huge.len();
        let ((elapsed, h0, h1), per_thread) = phase::drive(
            vec![(); nthreads],
            |tid| Placement {
                cpus: cpus_for(&cpus, tid, nthreads, plain.len()),
                name: Some(if tid < plain.len() {
                    "mix-order0"
                } else {
                    "mix-thp"
                }),
            },
            |tid, (), word| match plain.get(tid) {
                Some(s) => run_loop(
                    MapAccessLoop::new(MmkitTarget::Shared(s), len, Access::Touch),
                    word,
                ),
                None => run_loop(
                    MapAccessLoop::new(HugeTarget(&huge[tid - plain.len()]), len, Access::Touch),
                    word,
                ),
            },
            |word| {
                std::thread::sleep(timing.warmup);
                let h0 = huge_counts(huge);
                let elapsed = word.measure_for(timing.duration);
                (elapsed, h0, huge_counts(huge))
            },
        );
        let (plain_runs, huge_runs) = per_thread.split_at(plain.len());
        let ops0: u64 = plain_runs.iter().map(|r| r.0).sum();
        let ops_h: u64 = huge_runs.iter().map(|r| r.0).sum();
        let failures: u64 = per_thread.iter().map(|r| r.1).sum();
        drop(spaces);
        mm.wait_compaction_idle();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let (hf, fb) = (h1.0 - h0.0, h1.1 - h0.1);
        let huge_pct = if hf + fb == 0 {
            0.0
        } else {
            hf as f64 * 100.0 / (hf + fb) as f64
        };
        let mut out = Vec::new();
        if n0 > 0 {
            let score = ops0 as f64 / secs;
            out.push(Figure::new(ORDER0_SCORE.name, score));
        }
        if threads > n0 {
            let score = ops_h as f64 / secs;
            out.push(Figure::new(THP_SCORE.name, score));
            out.push(Figure::new(HUGE_PCT.name, huge_pct));
        }
        out.push(Figure::new(ALLOC_FAILURES.name, failures as f64));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_get_their_own_cpus_when_short() {
        let two = [0, 1];
        assert_eq!(cpus_for(&two, 0, 4, 2), vec![0]);
        assert_eq!(cpus_for(&two, 1, 4, 2), vec![0]);
        assert_eq!(cpus_for(&two, 2, 4, 2), vec![1]);
        assert_eq!(cpus_for(&two, 3, 4, 2), vec![1]);
        let eight: Vec<usize> = (0..8).collect();
        assert_eq!(cpus_for(&eight, 3, 4, 2), vec![3]);
        assert_eq!(cpus_for(&[5], 3, 4, 2), vec![5]);
        assert!(cpus_for(&[], 0, 4, 2).is_empty());
    }
}
