//! `anon_w_seq` (vm-scalability's case-anon-w-seq): each thread maps a large
//! anonymous region (256 MiB; `--quick`: 16 MiB), writes every byte of it in
//! address order, a 4 KiB memset per page (the first write of each page is a
//! fault), unmaps it, and loops. Each mmkit thread has its own `Space`, as each
//! usemem task is a process; the kernel's threads share this process. An op is
//! one page written; the figure is bytes written per second.

use super::presets::build_fault_preset;
use super::space_loop::{region_params, run_case, Access};
use super::{
    arena_for, gb_per_sec, max_threads, Figure, Metric, Workload, ALLOC_FAILURES, GB_PER_SEC,
};
use crate::host::mem::PAGE;
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Timing};
use anyhow::Result;
use serde_json::{Map, Value};

/// Bytes each thread maps per iteration.
pub const REGION: usize = 256 << 20;
/// The same with `--quick`.
pub const QUICK_REGION: usize = 16 << 20;

const METRICS: &[Metric] = &[GB_PER_SEC, ALLOC_FAILURES];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "a Space per thread, with_page(addr, true) and a memset of the page; \
                      default policies and clearing (auto)",
    },
    VariantInfo {
        name: "mmkit-eager",
        description: "as mmkit with the eager (pre zone-lock work) policies and \
                      page-at-a-time clearing",
    },
    VariantInfo {
        name: "mmkit-nopcp",
        description: "as mmkit without per-CPU lists, page-at-a-time clearing",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: libc mmap(MAP_PRIVATE|MAP_ANONYMOUS), a memset per \
                      4 KiB page, munmap; threads of this process",
    },
];

pub struct AnonWSeq;

fn region(quick: bool) -> usize {
    if quick {
        QUICK_REGION
    } else {
        REGION
    }
}

impl AnonWSeq {
    fn arena(&self, config: &Config) -> usize {
        arena_for(max_threads(self, config) * region(config.timing.quick)).max(config.memory)
    }
}

impl Workload for AnonWSeq {
    fn name(&self) -> &'static str {
        "anon_w_seq"
    }

    fn description(&self) -> &'static str {
        "vm-scalability case-anon-w-seq: each thread maps 256 MiB (quick: 16 MiB), writes every \
         byte in order (a 4 KiB memset per page), unmaps, loops; gb_per_sec counts bytes written"
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
        region_params(region(config.timing.quick), self.arena(config))
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let m = run_case(
            peer,
            threads,
            timing,
            region(timing.quick),
            Access::Fill,
            false,
        );
        vec![
            Figure::new(
                GB_PER_SEC.name,
                gb_per_sec((m.ops * PAGE as u64) as f64, m.elapsed.as_secs_f64()),
            ),
            Figure::new(ALLOC_FAILURES.name, m.failures as f64),
        ]
    }
}
