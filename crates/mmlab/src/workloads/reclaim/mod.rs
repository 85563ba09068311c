//! `reclaim`: which pages reclaim keeps. One thread replays a page trace over
//! a space larger than memory, with swap on a RAM device, and the lab counts
//! the swap-device reads it costs. Cases (`trace::Case`): `zipf`, `scan`,
//! `shift`, `loop`; or, with `--trace FILE`, a recorded real program.
//!
//! Peers on the same trace: mmkit's variants (each an arena of the trace's
//! memory and a RAM swap device), `lru-exact` (exact LRU with the resident
//! count measured in mmkit's run of that trace in the same round, `lru_exact`),
//! and `kernel` (the host kernel in a memory cgroup, `kernel`). Every peer runs
//! the one replay loop (`replay`), which also checks content: a read finds
//! what was written last, or zero.
//!
//! State: `TRACE` holds `--trace`/`--memory-fraction` (set once by the command
//! line before the run); `RESIDENT` hands the resident count of mmkit's run to
//! `lru-exact`'s, per case (a lock taken once per point).

pub mod kernel;
pub mod lru_exact;
pub mod record;
pub mod replay;
pub mod trace;

use super::{Figure, Metric, Workload};
use crate::host::cpu::threads_cpu_ns;
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Timing};
use mmkit::{ClearStrategy, Mm, Space, SwapDevice, Variant, VmEvent};
use replay::{replay, settle_faults, Outcome, Snapshot, Target};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use trace::{Case, Spec};

/// Memory of the synthetic cases, full run: 64 MiB.
pub const MEMORY: u64 = 64 << 20;
/// The same with `--quick`: 8 MiB.
pub const QUICK_MEMORY: u64 = 8 << 20;
/// The classic-policy preset's name (Linux 6.18's anon LRU rules).
pub const CLASSIC: &str = "mmkit-lru-classic";

/// `--trace FILE` and `--memory-fraction F`.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceArg {
    pub path: PathBuf,
    pub memory_fraction: f64,
}

static TRACE: OnceLock<TraceArg> = OnceLock::new();
static RESIDENT: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// Replays `arg` instead of the synthetic cases (first call wins).
pub fn set_trace(arg: TraceArg) -> Result<(), String> {
    let h = trace::file_header(&arg.path).map_err(|e| e.to_string())?;
    if !(arg.memory_fraction > 0.0 && arg.memory_fraction <= 1.0) {
        return Err(format!(
            "--memory-fraction {}: expected a fraction in (0, 1]",
            arg.memory_fraction
        ));
    }
    eprintln!(
        "note: reclaim: trace {}: {} records over {} pages ({} MiB)",
        arg.path.display(),
        h.records,
        h.footprint,
        h.footprint >> 8
    );
    TRACE
        .set(arg)
        .map_err(|_| "--trace given twice".to_string())
}

macro_rules! metric {
    ($c:ident, $n:literal, $u:literal, $hib:literal, $mo:literal, $hz:literal, $d:literal) => {
        pub const $c: Metric = Metric {
            name: $n,
            unit: $u,
            description: $d,
            higher_is_better: $hib,
            mmkit_only: $mo,
            hide_if_zero: $hz,
        };
    };
}

metric!(
    READS_PCT,
    "device_reads_pct",
    "%",
    false,
    false,
    false,
    "swap-device reads (pswpin; lru-exact: misses of pages seen before) per measured access"
);
metric!(
    READS_PER_HOT_PAGE,
    "device_reads_per_hot_page",
    "1",
    false,
    false,
    true,
    "scan: swap-device reads per hot page per round, after 2 warm-up rounds"
);
metric!(
    SWAPINS,
    "swapins",
    "pages",
    false,
    false,
    false,
    "swap-device reads over the measured part of the trace"
);
metric!(
    MAJFLT_PCT,
    "major_faults_pct",
    "%",
    false,
    false,
    true,
    "kernel: major faults of the child per measured access"
);
metric!(
    SETTLE,
    "settle_faults_per_memory",
    "x",
    false,
    false,
    true,
    "shift: faults after the hot set moved until a window's miss ratio is within 1 point \
     of the new steady state, in memories (pages / memory pages)"
);
metric!(
    SCAN_PER_STEAL,
    "pgscan_per_pgsteal",
    "x",
    false,
    false,
    true,
    "pages scanned per page reclaimed, kswapd and direct together (kernel: host-wide)"
);
metric!(
    KSWAPD_PCT,
    "kswapd_steal_pct",
    "%",
    true,
    false,
    true,
    "evictions (pgsteal) done by kswapd, the rest by direct reclaim (kernel: host-wide)"
);
metric!(
    KSWAPD_NS,
    "kswapd_cpu_ns_per_page",
    "ns",
    false,
    true,
    true,
    "CPU time of the kswapd threads per page they reclaimed (schedstat)"
);
metric!(
    ACCESSES,
    "accesses_per_sec",
    "1/s",
    true,
    false,
    false,
    "measured accesses per second (one thread; lru-exact: the model's speed)"
);
metric!(
    RESIDENT_M,
    "resident_pages",
    "pages",
    true,
    false,
    false,
    "mean resident pages of the trace while measured (lru-exact: its fixed count)"
);
metric!(
    CORRUPT,
    "corrupt_reads",
    "reads",
    false,
    false,
    true,
    "reads that found neither the last value written nor zero (must be 0)"
);

const METRICS: &[Metric] = &[
    READS_PCT,
    READS_PER_HOT_PAGE,
    SWAPINS,
    MAJFLT_PCT,
    SETTLE,
    SCAN_PER_STEAL,
    KSWAPD_PCT,
    KSWAPD_NS,
    ACCESSES,
    RESIDENT_M,
    CORRUPT,
];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit, default eviction, RAM swap device",
    },
    VariantInfo {
        name: CLASSIC,
        description: "mmkit with Linux 6.18's classic anon LRU rules, RAM swap device",
    },
    VariantInfo {
        name: "lru-exact",
        description: "exact LRU simulated on the trace with mmkit's measured resident count",
    },
    VariantInfo {
        name: "kernel",
        description: "the host kernel: a child replays the trace in a memory cgroup with swap \
                      on a loop device over tmpfs (needs root)",
    },
];

/// Memory of the synthetic cases, in pages.
fn memory_pages(quick: bool) -> u64 {
    (if quick { QUICK_MEMORY } else { MEMORY }) / 4096
}

/// The traces of a run: (case name, spec).
fn cases(quick: bool) -> Vec<(String, Spec)> {
    if let Some(t) = TRACE.get() {
        let fp = trace::file_header(&t.path).map_or(1, |h| h.footprint);
        let memory_pages = ((fp as f64 * t.memory_fraction).ceil() as u64).max(1);
        let name = t
            .path
            .file_stem()
            .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
        return vec![(
            name,
            Spec::File {
                path: t.path.clone(),
                memory_pages,
            },
        )];
    }
    let m = memory_pages(quick);
    Case::ALL
        .iter()
        .map(|&case| {
            (
                case.name().to_string(),
                Spec::Synthetic {
                    case,
                    memory_pages: m,
                },
            )
        })
        .collect()
}

/// (largest footprint, largest memory) of the run's traces, in pages.
fn sizes(quick: bool) -> (u64, u64) {
    let mut fp = 0;
    let mut mem = 0;
    for (_, s) in cases(quick) {
        if let Ok(src) = s.open() {
            fp = fp.max(src.shape().pages);
            mem = mem.max(src.shape().memory_pages);
        }
    }
    (fp, mem)
}

/// The arena of the mmkit variants: the memory, at least mmkit's 2 MiB
/// minimum (one pageblock).
fn arena(quick: bool) -> usize {
    (sizes(quick).1 * 4096).max(2 << 20) as usize
}

/// The swap device: the largest footprint, a sixteenth and 1 MiB, in pages.
fn swap_bytes(quick: bool) -> u64 {
    let b = sizes(quick).0 * 4096;
    (b + b / 16 + (1 << 20)).div_ceil(4096) * 4096
}

/// The kernel peer's swap device: twice mmkit's. The host's swap is every
/// process's: other tasks under pressure (another lab's kernel peer, whose
/// device has the same top priority, so the kernel takes turns) may put
/// pages on it, and with a device of the footprint alone the child's cgroup
/// could find it full and be OOM-killed (seen with `shift`, the largest).
fn kernel_swap_bytes(quick: bool) -> u64 {
    2 * swap_bytes(quick)
}

/// The trace's pages in an mmkit `Space`, one mapping per segment.
struct MmkitTarget<'a> {
    mm: &'a Mm,
    space: Space,
    bases: Vec<u64>,
    seg_pages: u64,
}

impl<'a> MmkitTarget<'a> {
    fn new(mm: &'a Mm, pages: u64, seg_pages: u64) -> Result<MmkitTarget<'a>, mmkit::Error> {
        let space = mm.new_space()?;
        let bases = (0..pages.div_ceil(seg_pages))
            .map(|_| space.mmap((seg_pages * 4096) as usize, mmkit::MapFlags::empty()))
            .collect::<Result<_, _>>()?;
        Ok(MmkitTarget {
            mm,
            space,
            bases,
            seg_pages,
        })
    }
}

impl Target for MmkitTarget<'_> {
    fn access(&mut self, page: u64, write: bool, value: u32) -> Option<u32> {
        let base = *self.bases.get((page / self.seg_pages) as usize)?;
        let addr = base + (page % self.seg_pages) * 4096;
        if write {
            self.space.write(addr, &value.to_le_bytes()).ok()?;
            Some(value)
        } else {
            let mut b = [0u8; 4];
            self.space.read(addr, &mut b).ok()?;
            Some(u32::from_le_bytes(b))
        }
    }

    fn discard(&mut self, n: u64) -> Result<(), String> {
        let len = (self.seg_pages * 4096) as usize;
        let b = self.bases.get_mut(n as usize).ok_or("no such segment")?;
        self.space.munmap(*b, len).map_err(|e| e.to_string())?;
        *b = self
            .space
            .mmap(len, mmkit::MapFlags::empty())
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    fn snapshot(&mut self) -> Snapshot {
        let e = self.mm.vm_events();
        Snapshot {
            reads: e.get(VmEvent::PswpIn),
            majflt: 0,
            pgscan_kswapd: e.get(VmEvent::PgScanKswapd),
            pgscan_direct: e.get(VmEvent::PgScanDirect),
            pgsteal_kswapd: e.get(VmEvent::PgStealKswapd),
            pgsteal_direct: e.get(VmEvent::PgStealDirect),
            kswapd_ns: threads_cpu_ns("mmkit-kswapd"),
        }
    }

    fn resident(&mut self) -> u64 {
        self.space.stats().rss_pages
    }
}

/// The figures of one case's outcome.
fn figures(case: &str, spec: &Spec, o: &Outcome, kernel: bool) -> Vec<Figure> {
    let c = &o.counts;
    let acc = o.accesses.max(1) as f64;
    let mut f = vec![
        Figure::new(READS_PCT.name, c.reads as f64 * 100.0 / acc),
        Figure::new(SWAPINS.name, c.reads as f64),
    ];
    let (per_unit, memory_pages, is_shift) = match spec {
        Spec::Synthetic { case, memory_pages } => (
            if *case == Case::Scan { 2.0 } else { 1.0 },
            *memory_pages,
            *case == Case::Shift,
        ),
        Spec::File { memory_pages, .. } => (1.0, *memory_pages, false),
    };
    if per_unit != 1.0 {
        f.push(Figure::new(
            READS_PER_HOT_PAGE.name,
            c.reads as f64 * per_unit / acc,
        ));
    }
    if kernel {
        f.push(Figure::new(MAJFLT_PCT.name, c.majflt as f64 * 100.0 / acc));
    }
    if is_shift {
        let move_at = trace::shift_phase_accesses(memory_pages);
        // Never settling counts as the whole second phase's faults.
        let settle = settle_faults(&o.series, move_at)
            .unwrap_or(c.reads.saturating_sub(o.series.first().map_or(0, |s| s.1)));
        f.push(Figure::new(
            SETTLE.name,
            settle as f64 / memory_pages.max(1) as f64,
        ));
    }
    // Reclaim cost over the whole measured span (scan: its scans too).
    let c = &o.span;
    let steal = c.pgsteal_kswapd + c.pgsteal_direct;
    if steal > 0 {
        let scan = c.pgscan_kswapd + c.pgscan_direct;
        f.push(Figure::new(SCAN_PER_STEAL.name, scan as f64 / steal as f64));
        f.push(Figure::new(
            KSWAPD_PCT.name,
            c.pgsteal_kswapd as f64 * 100.0 / steal as f64,
        ));
    }
    if c.pgsteal_kswapd > 0 && c.kswapd_ns > 0 {
        f.push(Figure::new(
            KSWAPD_NS.name,
            c.kswapd_ns as f64 / c.pgsteal_kswapd as f64,
        ));
    }
    f.push(Figure::new(
        ACCESSES.name,
        o.accesses as f64 / o.elapsed.as_secs_f64().max(1e-9),
    ));
    f.push(Figure::new(RESIDENT_M.name, o.resident as f64));
    f.push(Figure::new(CORRUPT.name, o.corrupt as f64));
    if o.corrupt > 0 || o.failures > 0 {
        eprintln!(
            "warning: reclaim {case}: {} corrupt reads, {} failed accesses",
            o.corrupt, o.failures
        );
    }
    for x in &mut f {
        x.case = Some(case.to_string());
    }
    f
}

/// One case on an mmkit variant.
fn run_mmkit(mm: &Mm, spec: &Spec) -> Result<Outcome, String> {
    let mut src = spec.open().map_err(|e| e.to_string())?;
    let shape = src.shape().clone();
    let mut t = MmkitTarget::new(mm, shape.pages, shape.segment_pages)
        .map_err(|e| format!("mapping the trace: {e}"))?;
    let o = replay(src.as_mut(), &mut t).map_err(|e| e.to_string());
    drop(t);
    mm.wait_reclaim_idle();
    o
}

/// One case on lru-exact, at the resident count mmkit measured (else the
/// memory's page count, with a note).
fn run_lru(case: &str, spec: &Spec) -> Result<Outcome, String> {
    let mut src = spec.open().map_err(|e| e.to_string())?;
    let shape = src.shape().clone();
    let known = RESIDENT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(case).copied());
    let cap = known.unwrap_or_else(|| {
        eprintln!(
            "note: reclaim lru-exact {case}: no mmkit run measured its resident count; \
             using the memory's {} pages",
            shape.memory_pages
        );
        shape.memory_pages
    });
    let mut t = lru_exact::LruExact::new(shape.pages, shape.segment_pages, cap);
    let mut o = replay(src.as_mut(), &mut t).map_err(|e| e.to_string())?;
    o.resident = cap;
    Ok(o)
}

/// A custom variant (`--set`) is built without a swap device: it gets one.
fn swap_on_if_none(mm: &Mm, quick: bool) -> Result<(), String> {
    if mm.swap_info().is_empty() {
        mm.swapon(SwapDevice::ram(swap_bytes(quick)).populated())
            .map_err(|e| format!("swapon: {e}"))?;
    }
    Ok(())
}

pub struct Reclaim;

impl Workload for Reclaim {
    fn name(&self) -> &'static str {
        "reclaim"
    }

    fn description(&self) -> &'static str {
        "which pages reclaim keeps: one thread replays a page trace (zipf, scan, shift, loop; \
         or --trace FILE) over a space larger than memory (64 MiB; quick: 8 MiB) with a RAM \
         swap device; device reads per access beside exact LRU and the host kernel"
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
        arena(config.timing.quick)
    }

    fn build(&self, variant: &str, config: &Config) -> anyhow::Result<Peer> {
        let Some(info) = VARIANTS.iter().find(|v| v.name == variant) else {
            anyhow::bail!("unknown variant {variant:?} for reclaim");
        };
        let quick = config.timing.quick;
        match Variant::from_name(variant) {
            Some(v) => {
                let peer = Peer::create_mmkit(variant, v, arena(quick), ClearStrategy::Auto)?;
                let mm = peer.mm().expect("an mmkit peer");
                mm.swapon(SwapDevice::ram(swap_bytes(quick)).populated())
                    .map_err(|e| anyhow::anyhow!("reclaim {variant}: swapon: {e}"))?;
                Ok(peer)
            }
            // lru-exact, kernel; or a preset this build lacks (run says so).
            None => Ok(Peer::Native(info.name)),
        }
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let quick = config.timing.quick;
        let mut p = Map::new();
        p.insert("memory_bytes".into(), (sizes(quick).1 * 4096).into());
        p.insert("arena_bytes".into(), (arena(quick) as u64).into());
        p.insert("swap_bytes".into(), swap_bytes(quick).into());
        p.insert("kernel_swap_bytes".into(), kernel_swap_bytes(quick).into());
        p.insert("write_pct".into(), trace::WRITE_PCT.into());
        p.insert("zipf_s".into(), trace::ZIPF_S.into());
        if let Some(t) = TRACE.get() {
            p.insert("trace".into(), t.path.display().to_string().into());
            p.insert("memory_fraction".into(), t.memory_fraction.into());
        }
        p
    }

    fn run(&self, peer: &Peer, _threads: usize, timing: &Timing) -> Vec<Figure> {
        let quick = timing.quick;
        let name = peer.native().unwrap_or("mmkit");
        let mut out = Vec::new();
        for (case, spec) in cases(quick) {
            let r = match (peer.mm(), name) {
                (Some(mm), _) => swap_on_if_none(mm, quick).and_then(|()| {
                    let o = run_mmkit(mm, &spec)?;
                    // The first mmkit column's count is lru-exact's.
                    let mut g = RESIDENT.lock().unwrap_or_else(|e| e.into_inner());
                    g.get_or_insert_with(HashMap::new)
                        .entry(case.clone())
                        .or_insert(o.resident);
                    Ok(o)
                }),
                (None, "lru-exact") => run_lru(&case, &spec),
                (None, "kernel") if quick && !crate::host::swap::opted_in() => {
                    Err(crate::host::swap::NOT_OPTED_IN.to_string())
                }
                (None, "kernel") => {
                    let limit = Duration::from_secs(if quick { 60 } else { 600 });
                    let mem = spec.open().map_or(0, |s| s.shape().memory_pages) * 4096;
                    kernel::run(&spec, mem, kernel_swap_bytes(quick), limit)
                }
                (None, n) => Err(format!("this build of mmkit has no preset {n}")),
            };
            match r {
                Ok(o) => out.extend(figures(&case, &spec, &o, name == "kernel")),
                Err(why) => eprintln!("note: reclaim {name} {case} skipped: {why}"),
            }
        }
        // lru-exact follows the mmkit column of this round only.
        if name == "lru-exact" {
            *RESIDENT.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        out
    }
}

#[cfg(test)]
mod tests;
