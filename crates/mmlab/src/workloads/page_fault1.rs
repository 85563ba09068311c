//! `page_fault1` (will-it-scale's page_fault1): each thread maps 128 MiB of
//! anonymous memory (`--quick`: 16 MiB), writes one byte to each 4 KiB page (a
//! page fault each), unmaps it, and loops. Two cases: `shared` (all threads in
//! one mmkit `Space`, so mmap/munmap take its VMA lock exclusively against the
//! others' faults) and `per-thread` (one `Space` per thread, will-it-scale's
//! process mode). An op is one page written (one fault).
//!
//! Variants: mmkit with its default clearing (`Auto`); `mmkit-eager` and
//! `mmkit-nopcp` (the "before" policy presets, also with page-at-a-time
//! clearing); `kernel`, the same loop on this process's own `mmap`/`munmap`
//! (threads of one process in both cases); and `clear-only`, just `clear_page`
//! over a prefaulted buffer of the region's size per thread: the bound the issue
//! sets, clearing as Linux's fault path does (`rep stosb`). mmkit clears the
//! fault-around batch of a sparse first touch with streaming stores instead,
//! which skip the read for ownership and beat it; `clear-only-nt` is the same
//! buffer cleared that way, the bound of that method.

use super::presets::build_fault_preset;
use super::space_loop::{region_params, run_case, Access};
use super::{
    arena_for, max_threads, Figure, Metric, Workload, ALLOC_FAILURES, FAULTS_PER_SEC,
    ZONE_LOCK_CONTENDED_PCT,
};
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Measured, Timing};
use anyhow::Result;
use serde_json::{Map, Value};

/// Bytes each thread maps per iteration.
pub const REGION: usize = 128 << 20;
/// The same with `--quick`.
pub const QUICK_REGION: usize = 16 << 20;

/// The cases, in table order.
pub const CASES: [&str; 2] = ["shared", "per-thread"];

const METRICS: &[Metric] = &[FAULTS_PER_SEC, ZONE_LOCK_CONTENDED_PCT, ALLOC_FAILURES];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit Space faults, default policies and clearing (auto)",
    },
    VariantInfo {
        name: "mmkit-eager",
        description: "mmkit Space faults, the eager (pre zone-lock work) policies, \
                      page-at-a-time clearing",
    },
    VariantInfo {
        name: "mmkit-nopcp",
        description: "mmkit Space faults without per-CPU lists, page-at-a-time clearing",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: libc mmap(MAP_PRIVATE|MAP_ANONYMOUS), one volatile \
                      byte store per 4 KiB, munmap; threads of this process",
    },
    VariantInfo {
        name: "clear-only",
        description: "clear_page on each 4 KiB of a prefaulted buffer of the region's size \
                      per thread: the bound",
    },
    VariantInfo {
        name: "clear-only-nt",
        description: "the same with the streaming stores mmkit clears a sparse first touch's \
                      fault-around batch with (16 pages per sfence): the bound of that method",
    },
];

pub struct PageFault1;

fn region(quick: bool) -> usize {
    if quick {
        QUICK_REGION
    } else {
        REGION
    }
}

impl PageFault1 {
    fn arena(&self, config: &Config) -> usize {
        arena_for(max_threads(self, config) * region(config.timing.quick)).max(config.memory)
    }
}

/// The figures of one case.
fn case_figures(m: &Measured, case: &str) -> Vec<Figure> {
    let mut out = vec![Figure::new(FAULTS_PER_SEC.name, m.ops_per_sec())];
    if let Some(l) = &m.lock {
        let pct = if l.acquisitions == 0 {
            0.0
        } else {
            l.contended as f64 * 100.0 / l.acquisitions as f64
        };
        out.push(Figure::new(ZONE_LOCK_CONTENDED_PCT.name, pct));
    }
    out.push(Figure::new(ALLOC_FAILURES.name, m.failures as f64));
    for f in &mut out {
        f.case = Some(case.to_string());
    }
    out
}

impl Workload for PageFault1 {
    fn name(&self) -> &'static str {
        "page_fault1"
    }

    fn description(&self) -> &'static str {
        "will-it-scale page_fault1: each thread maps 128 MiB (quick: 16 MiB), writes one byte \
         per 4 KiB page, unmaps, loops; cases shared (one Space) and per-thread (a Space each); \
         faults_per_sec counts pages written"
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
        let mut p = region_params(region(config.timing.quick), self.arena(config));
        super::clear_huge::clear_plan_params(&mut p);
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let len = region(timing.quick);
        let mut out = Vec::new();
        for case in CASES {
            peer.settle();
            let m = run_case(peer, threads, timing, len, Access::Touch, case == "shared");
            out.extend(case_figures(&m, case));
        }
        out
    }
}
