//! `autonuma`: the autonuma benchmark (pholasek/autonuma-benchmark) scaled to this
//! machine, on an emulated 2-node topology, for automatic NUMA balancing and the
//! scan slow-down experiment of Mel Gorman's "mm: numa: Slow PTE scan rate if
//! migration failures occur" (docs/upstream.md).
//!
//! Each case builds a fresh Mm (2 emulated nodes, the variant's scan policy,
//! the lab's scan settings `lab_scan_params`, the scan period measured in the
//! CPU time of each space's threads: `ScanTrigger::TaskCpu`), lays out its buffers with first
//! touch on the node where they do *not* belong, turns balancing on, and runs
//! its threads (each bound to a node with `set_thread_node`) over their
//! buffers, writing whole 4 KiB pages (`Space::write`), for a number of passes
//! in two halves:
//! - `numa01`: two spaces ("processes"), half the threads each, one buffer per
//!   space; every thread writes its group's whole buffer. Group *g* runs on node
//!   *g*; its buffer is first touched from the other node.
//! - `numa01_THREAD_ALLOC`: as numa01, each thread writes only its own slice of
//!   its group's buffer (first touched from the other node).
//! - `numa02`: one space, one buffer first touched from node 0; thread *t* (on
//!   node *t* mod 2) writes slice *t*.
//! - `numa02_SMT`: as numa02 with half the threads (at least 2).
//!
//! Each also as `NAME-full`: after the layout another space fills both nodes to
//! their limit (`Bind` ranges written until the node refuses), so migrations
//! fail for lack of memory as in the seed; and `NAME-recover`: as `-full`, the
//! filler released between the two halves. Every thread writes the same number
//! of pages in every case (numa01's `passes` x buffer).
//!
//! Figures per case (the JSON `"case"`): `system_ms` (CPU time of scanning, hint
//! faults and migration copies, `NumabStats::system_ns`), `scan_passes`, `elapsed_ms`,
//! `modelled_ms` (elapsed plus a declared cost per remote page access, see
//! `REMOTE_NS`), `pte_updates`, `hint_faults`, `hint_local_pct`,
//! `pages_migrated`, `migrate_fail`, `local_access_pct` (all accesses),
//! `local_access_pct_after` (second half). Variants: `mmkit` (Adaptive),
//! `mmkit-numab-linux` (FailBackoff), `mmkit-numab-4.0` (NoFailBackoff),
//! `mmkit-numab-off`, and `kernel`, which needs a multi-node host and is skipped
//! with a message here.

use std::sync::Once;
use std::time::Instant;

use anyhow::{bail, Result};
use mmkit::{
    MapFlags, MbindFlags, MemPolicy, Mm, NodeMask, ScanParams, ScanTrigger, Space, Topology,
    Variant,
};
use serde_json::{Map, Value};

use super::{Figure, Metric, Workload};
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Timing};

const PAGE: u64 = 4096;
/// The declared remote-access model: each access of a remote 4 KiB page costs
/// this much more than a local one (distance 20 vs 10: about a 4 KiB copy at
/// remote rather than local bandwidth).
pub const REMOTE_NS: f64 = 500.0;
const MODEL: &str = "elapsed + 500 ns per remote 4 KiB page access (distance 20 vs 10)";

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit, NUMA balancing with the Adaptive scan policy",
    },
    VariantInfo {
        name: "mmkit-numab-linux",
        description:
            "mmkit, NUMA balancing with Linux's scan policy (FailBackoff, Linux 4.0 onwards)",
    },
    VariantInfo {
        name: "mmkit-numab-4.0",
        description: "mmkit, NUMA balancing with Linux 4.0-rc1's scan policy (NoFailBackoff)",
    },
    VariantInfo {
        name: "mmkit-numab-off",
        description: "mmkit, NUMA balancing off",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel's own NUMA balancing (needs a multi-node host)",
    },
];

const fn metric(
    name: &'static str,
    unit: &'static str,
    description: &'static str,
    hib: bool,
) -> Metric {
    Metric {
        name,
        unit,
        description,
        higher_is_better: hib,
        mmkit_only: false,
        hide_if_zero: false,
    }
}

const METRICS: &[Metric] = &[
    metric("elapsed_ms", "ms", "wall time of the two halves", false),
    metric(
        "system_ms",
        "ms",
        "CPU time of NUMA balancing: scans, hint faults, migration copies",
        false,
    ),
    metric(
        "modelled_ms",
        "ms",
        "elapsed plus the declared remote-access cost (REMOTE_NS)",
        false,
    ),
    metric(
        "scan_passes",
        "count",
        "scanner passes (task_numa_work runs), all spaces of the case",
        false,
    ),
    metric(
        "pte_updates",
        "count",
        "pages the scanner armed (numa_pte_updates)",
        false,
    ),
    metric(
        "hint_faults",
        "count",
        "NUMA hint faults (numa_hint_faults)",
        false,
    ),
    metric(
        "hint_local_pct",
        "%",
        "hint faults on a local (or just migrated) page",
        true,
    ),
    metric(
        "pages_migrated",
        "count",
        "pages migrated (numa_pages_migrated)",
        false,
    ),
    metric(
        "migrate_fail",
        "count",
        "failed migrations, all causes (pgmigrate_fail)",
        false,
    ),
    metric(
        "local_access_pct",
        "%",
        "page accesses that were local, whole run",
        true,
    ),
    metric(
        "local_access_pct_after",
        "%",
        "page accesses that were local, second half",
        true,
    ),
];

/// The four benchmarks.
const BASES: [&str; 4] = ["numa01", "numa01_THREAD_ALLOC", "numa02", "numa02_SMT"];

/// The scan settings of the lab: Linux's shape (max = 64 x min) at a scale
/// where a case sees tens of periods at the fastest rate. The period is
/// measured in the CPU time of the space's threads (`ScanTrigger::TaskCpu`, as
/// Linux), about half a second per space and case here, so that the slow-down
/// from the fastest to the slowest period (63 x min) spans the first half of a
/// case. A pass covers the whole 32 MiB buffer (`scan_size_mb`), and the
/// fastest period is Linux's 2560 MiB/s scan floor for 32 MiB (12 ms).
pub fn lab_scan_params() -> ScanParams {
    ScanParams {
        period_min_ms: 12,
        period_max_ms: 768,
        scan_size_mb: 32,
        scan_delay_ms: 0,
    }
}

/// Sizes: the buffer of a numa01 group and the passes over it.
fn sizes(quick: bool) -> (u64, u64) {
    if quick {
        (4 << 20, 8)
    } else {
        (32 << 20, 40)
    }
}

pub struct Autonuma;

/// One thread's job: which space, its node, its range, and where in the range
/// each pass starts: at part `(pass + phase) % parts` of `parts` equal parts,
/// wrapping around (numa01's threads of a group start at different parts, and
/// rotate, so which of them touches a page first changes from pass to pass and
/// the hint faults are shared, as with the benchmark's many threads).
struct Job {
    space: usize,
    node: usize,
    addr: u64,
    pages: u64,
    phase: u64,
    parts: u64,
}

/// A case's layout: spaces with buffers first touched, and the jobs.
struct Layout {
    spaces: Vec<Space>,
    jobs: Vec<Job>,
}

/// Writes `pages` pages from `addr` from a thread bound to `node`.
fn touch_from(mm: &Mm, s: &Space, addr: u64, pages: u64, node: usize) {
    std::thread::scope(|sc| {
        sc.spawn(|| {
            mm.set_thread_node(node).ok();
            let buf = [1u8; PAGE as usize];
            for i in 0..pages {
                s.write(addr + i * PAGE, &buf).ok();
            }
        });
    });
}

fn layout(mm: &Mm, base: &str, threads: usize, buf: u64) -> Result<Layout> {
    let threads = threads.max(2);
    let mut spaces = Vec::new();
    let mut jobs = Vec::new();
    match base {
        "numa01" | "numa01_THREAD_ALLOC" => {
            let per = threads / 2;
            let pages = buf / PAGE;
            for g in 0..2 {
                let s = mm.new_space()?;
                let a = s.mmap(buf as usize, MapFlags::empty())?;
                touch_from(mm, &s, a, pages, 1 - g);
                for t in 0..per {
                    let (addr, n, parts) = if base == "numa01" {
                        (a, pages, per as u64)
                    } else {
                        let n = pages / per as u64;
                        (a + t as u64 * n * PAGE, n, 1)
                    };
                    jobs.push(Job {
                        space: g,
                        node: g,
                        addr,
                        pages: n,
                        phase: t as u64,
                        parts: parts.max(1),
                    });
                }
                spaces.push(s);
            }
        }
        _ => {
            let n_threads = if base == "numa02_SMT" {
                (threads / 2).max(2)
            } else {
                threads
            };
            let s = mm.new_space()?;
            let a = s.mmap(buf as usize, MapFlags::empty())?;
            let pages = buf / PAGE;
            touch_from(mm, &s, a, pages, 0);
            let n = pages / n_threads as u64;
            for t in 0..n_threads {
                jobs.push(Job {
                    space: 0,
                    node: t % 2,
                    addr: a + t as u64 * n * PAGE,
                    pages: n,
                    phase: 0,
                    parts: 1,
                });
            }
            spaces.push(s);
        }
    }
    Ok(Layout { spaces, jobs })
}

/// Fills both nodes from a new space (a `Bind` range per node, written until
/// the node refuses).
fn fill_nodes(mm: &Mm) -> Result<Space> {
    let hog = mm.new_space()?;
    mm.drain_all_pages();
    for z in mm.zone_info() {
        let pages = z.nr_free;
        let a = hog.mmap((pages * PAGE) as usize, MapFlags::empty())?;
        hog.mbind(
            a,
            (pages * PAGE) as usize,
            MemPolicy::Bind(NodeMask::from_nodes(&[z.node])),
            MbindFlags::empty(),
        )?;
        let node = z.node;
        std::thread::scope(|sc| {
            sc.spawn(|| {
                mm.set_thread_node(node).ok();
                let mut i = 0;
                while i < pages && hog.touch(a + i * PAGE, true).is_ok() {
                    i += 1;
                }
            });
        });
    }
    Ok(hog)
}

/// Runs every job for passes `first..first + passes` over its range.
fn half(mm: &Mm, l: &Layout, first: u64, passes: u64) {
    std::thread::scope(|sc| {
        for j in &l.jobs {
            let s = &l.spaces[j.space];
            sc.spawn(move || {
                mm.set_thread_node(j.node).ok();
                let buf = [7u8; PAGE as usize];
                for p in first..first + passes {
                    let start = (p + j.phase) % j.parts * (j.pages / j.parts);
                    for i in 0..j.pages {
                        let page = (start + i) % j.pages;
                        s.write(j.addr + page * PAGE, &buf).ok();
                    }
                }
            });
        }
    });
}

fn accesses(l: &Layout) -> (u64, u64) {
    l.spaces.iter().fold((0, 0), |(a, b), s| {
        let st = s.stats();
        (a + st.local_accesses, b + st.remote_accesses)
    })
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// One case on a fresh Mm of variant `v`.
fn run_case(v: Variant, threads: usize, quick: bool, case: &str) -> Result<Vec<Figure>> {
    let (buf, passes) = sizes(quick);
    let base = case.split('-').next().unwrap_or(case);
    let full = case.ends_with("-full") || case.ends_with("-recover");
    let recover = case.ends_with("-recover");
    // Room for both groups' buffers on either node, and the tables.
    let arena = (4 * buf as usize + (16 << 20)).next_multiple_of(4 << 20);
    let mm = Mm::builder()
        .memory(arena)
        .topology(Topology::emulated(2))
        .variant(v)
        .numa_scan_params(lab_scan_params())
        .numa_scan_trigger(ScanTrigger::TaskCpu)
        .kcompactd(false)
        .build()?;
    let l = layout(&mm, base, threads, buf)?;
    let mut hog = if full { Some(fill_nodes(&mm)?) } else { None };
    let on = v.numa_balancing().is_some() && v != Variant::MmkitNumabOff;
    for s in &l.spaces {
        s.set_numa_balancing(on);
    }
    let (l0, r0) = accesses(&l);
    // Every thread writes numa01's passes x buffer pages.
    let job_passes = |j: &Job| (passes * (buf / PAGE)).div_ceil(j.pages.max(1));
    let passes_of = job_passes(&l.jobs[0]);
    let t0 = Instant::now();
    half(&mm, &l, 0, passes_of / 2);
    let (l1, r1) = accesses(&l);
    if recover {
        hog = None;
    }
    half(&mm, &l, passes_of / 2, passes_of - passes_of / 2);
    let elapsed = t0.elapsed().as_secs_f64() * 1e3;
    for s in &l.spaces {
        s.set_numa_balancing(false);
    }
    drop(hog);
    let (l2, r2) = accesses(&l);
    let st = l.spaces.iter().map(|s| s.numa_balancing_stats()).fold(
        mmkit::NumabStats::default(),
        |mut a, b| {
            a.system_ns += b.system_ns;
            a.numa_pte_updates += b.numa_pte_updates;
            a.numa_hint_faults += b.numa_hint_faults;
            a.numa_hint_faults_local += b.numa_hint_faults_local;
            a.numa_pages_migrated += b.numa_pages_migrated;
            a.pgmigrate_fail += b.pgmigrate_fail;
            a.scan_passes += b.scan_passes;
            a
        },
    );
    let remote = r2 - r0;
    let figs = [
        ("system_ms", st.system_ns as f64 / 1e6),
        ("elapsed_ms", elapsed),
        ("modelled_ms", elapsed + remote as f64 * REMOTE_NS / 1e6),
        ("scan_passes", st.scan_passes as f64),
        ("pte_updates", st.numa_pte_updates as f64),
        ("hint_faults", st.numa_hint_faults as f64),
        (
            "hint_local_pct",
            pct(st.numa_hint_faults_local, st.numa_hint_faults),
        ),
        ("pages_migrated", st.numa_pages_migrated as f64),
        ("migrate_fail", st.pgmigrate_fail as f64),
        ("local_access_pct", pct(l2 - l0, l2 - l0 + remote)),
        ("local_access_pct_after", pct(l2 - l1, l2 - l1 + r2 - r1)),
    ];
    Ok(figs
        .into_iter()
        .map(|(m, v)| Figure {
            metric: m,
            value: v,
            case: Some(case.to_string()),
        })
        .collect())
}

/// Every case name, in run order.
pub fn cases() -> Vec<String> {
    BASES
        .iter()
        .flat_map(|b| [b.to_string(), format!("{b}-full"), format!("{b}-recover")])
        .collect()
}

static KERNEL_NOTE: Once = Once::new();

impl Workload for Autonuma {
    fn name(&self) -> &'static str {
        "autonuma"
    }

    fn description(&self) -> &'static str {
        "autonuma-benchmark on 2 emulated nodes: numa01, numa01_THREAD_ALLOC, numa02, \
         numa02_SMT, each also -full (both nodes filled by another space: migrations fail) \
         and -recover (that memory released halfway); NUMA balancing counters, its CPU \
         time (system_ms) and the share of local accesses"
    }

    fn metrics(&self) -> &'static [Metric] {
        METRICS
    }

    fn default_threads(&self) -> &'static [usize] {
        &[4]
    }

    fn own_variants(&self) -> Option<&'static [VariantInfo]> {
        Some(VARIANTS)
    }

    fn build(&self, variant: &str, _config: &Config) -> Result<Peer> {
        match VARIANTS.iter().find(|v| v.name == variant) {
            Some(info) => Ok(Peer::Native(info.name)),
            None => bail!("unknown variant {variant:?} for autonuma"),
        }
    }

    fn peak_bytes(&self, config: &Config, _variants: usize) -> usize {
        // One case at a time, each on an arena of its own (`run_case`).
        let (buf, _) = sizes(config.timing.quick);
        (4 * buf as usize + (16 << 20)).next_multiple_of(4 << 20)
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let (buf, passes) = sizes(config.timing.quick);
        let p = lab_scan_params();
        let mut m = Map::new();
        m.insert("nodes".into(), 2.into());
        m.insert("numa01_buffer_bytes".into(), buf.into());
        m.insert("numa01_passes".into(), passes.into());
        m.insert("scan_period_min_ms".into(), p.period_min_ms.into());
        m.insert("scan_period_max_ms".into(), p.period_max_ms.into());
        m.insert("scan_size_mb".into(), p.scan_size_mb.into());
        m.insert("scan_clock".into(), "task_cpu".into());
        m.insert("remote_model".into(), MODEL.into());
        m
    }

    fn repeatable(&self) -> bool {
        false
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let name = peer.native().unwrap_or("mmkit");
        let Some(v) = Variant::from_name(name) else {
            KERNEL_NOTE.call_once(|| {
                let nodes = Topology::host().nr_nodes();
                eprintln!(
                    "autonuma: variant kernel skipped: it needs a host with more than one \
                     NUMA node (this one has {nodes}), and is not implemented yet"
                );
            });
            return Vec::new();
        };
        let mut out = Vec::new();
        for case in cases() {
            match run_case(v, threads, timing.quick, &case) {
                Ok(f) => out.extend(f),
                Err(e) => eprintln!("autonuma: {name} {case}: {e:#}"),
            }
        }
        out
    }
}
