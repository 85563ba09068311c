//! `clear_huge` ("x86/clear_huge_page: multi-page clearing", docs/upstream.md): demand-fault huge
//! pages and measure the bytes faulted in per second, which is mostly the speed
//! of clearing them, per clearing strategy, beside raw clearing loops and the
//! kernel's own huge page faults. One thread.
//!
//! Cases (`case` in the records):
//! - `2MiB`: a pass maps a 256 MiB (`--quick`: 64 MiB) region and faults it
//!   in, 128 (32) huge pages;
//! - `1GiB`: a pass maps 1 GiB and faults it in. mmkit has no order-18 pages,
//!   so that is 512 faults of 2 MiB pages in one 1 GiB mapping; the raw loops
//!   clear the 1 GiB in one call, as a 1 GiB page fault would. `--quick` makes
//!   the pass 256 MiB (still larger than the LLC), to keep the run's memory
//!   small.
//!
//! Variants:
//! - `mmkit`, `mmkit-page-at-a-time`, `mmkit-multi-page`, `mmkit-non-temporal`:
//!   an mmkit `Space` built with that `ClearStrategy` (`mmkit` is `Auto`, which
//!   follows the clearing plan mmkit calibrated on this host: `clear_plan` in
//!   the records' params, with the calibration's figures); a
//!   `MapFlags::HUGE` mapping, one `touch(addr, true)` per 2 MiB (timed: the
//!   touches only, not mmap/munmap). `huge_pct` is the share of those faults
//!   that installed a huge page (`space.stats()`); the bytes counted are those
//!   mapped after the touches (a fault that fell back to 4 KiB counts 4 KiB).
//!   `max_yield_gap_us`: the longest stretch without a yield point when
//!   `clear_chunked_timed` clears one page of the case's size (2 MiB or 1 GiB;
//!   `--quick` 256 MiB) with the variant's strategy and the default chunk, in a
//!   prefaulted buffer (the median of `GAP_REPS` clears).
//! - `raw-memset` (`std::ptr::write_bytes`, i.e. memset), `raw-stosb`
//!   (`clear_pages_with(.., MultiPage)`), `raw-nt` (`clear_pages_nt` with the
//!   widest streaming store the CPU has): the pass clears a prefaulted buffer of
//!   the pass's size, one call per page of the case's size.
//! - `kernel`: the host's transparent huge pages: `mmap` the pass's size (2 MiB
//!   aligned), `madvise(MADV_HUGEPAGE)`, one volatile byte store per 4 KiB
//!   (timed), `munmap`. `huge_pct` is `AnonHugePages` of the mapping (smaps)
//!   over its size.
//! - `kernel-hugetlb`: `mmap(MAP_HUGETLB | MAP_HUGE_2MB)`, one byte store per
//!   2 MiB (timed), `munmap`, with /proc/sys/vm/nr_hugepages raised for the case
//!   and restored after it; skipped with a note when that is refused.
//!
//! A case runs untimed passes for the warmup, then timed passes for the duration
//! (at least `MIN_PASSES`); `gb_per_sec` is the median of the passes. The point
//! is repeated `--rounds` times with the variants interleaved and the median of
//! the rounds reported, as for the other workloads: a variant's passes last
//! about half a second, and on a shared host a burst of other work that long
//! lowered whichever variant it fell on (the first in a run, more often than
//! not) by up to half, against the others' medians.

use super::{
    arena_for, gb_per_sec, median, Figure, Metric, Workload, ALLOC_FAILURES, GB_PER_SEC, HUGE_PCT,
};
use crate::host::facts::thp_mode;
use crate::host::mem::{
    anon_huge_bytes, mmap_anon, HostMap, HugetlbReservation, HUGE, MAP_HUGE_2MB, PAGE,
};
use crate::host::now_ns;
use crate::peers::{Peer, VariantInfo};
use crate::runner::{Config, Timing};
use anyhow::{bail, Result};
use mmkit::mmkit_core::clear::{
    clear_chunked_timed, clear_pages_nt, clear_pages_with, cpu_clear_caps,
};
use mmkit::{ClearStrategy, MapFlags, Mm, Variant};
use serde_json::{Map, Value};
use std::time::Instant;

/// The cases: name and the size of the page being faulted.
pub const CASES: [(&str, usize); 2] = [("2MiB", 2 << 20), ("1GiB", 1 << 30)];
/// Bytes per pass of the 2MiB case.
pub const PASS_2M: usize = 256 << 20;
/// The same with `--quick`.
pub const QUICK_PASS_2M: usize = 64 << 20;
/// Bytes per pass of the 1GiB case with `--quick` (a full run: 1 GiB).
pub const QUICK_PASS_1G: usize = 256 << 20;
/// Timed passes per case at least.
pub const MIN_PASSES: usize = 3;
/// Repetitions of the yield-gap measurement (the median is reported).
pub const GAP_REPS: usize = 5;

pub const MAX_YIELD_GAP_US: Metric = Metric {
    name: "max_yield_gap_us",
    unit: "us",
    description: "longest time between two yield points (or the start or end) while \
                  clear_chunked_timed clears one page of the case's size with the variant's \
                  strategy (median of 5)",
    higher_is_better: false,
    mmkit_only: true,
    hide_if_zero: false,
};

const METRICS: &[Metric] = &[GB_PER_SEC, HUGE_PCT, MAX_YIELD_GAP_US, ALLOC_FAILURES];

const VARIANTS: &[VariantInfo] = &[
    VariantInfo {
        name: "mmkit",
        description: "mmkit huge faults, clearing auto (the kernel measured fastest on this \
                      host at the first Mm build; params clear_plan)",
    },
    VariantInfo {
        name: "mmkit-page-at-a-time",
        description: "mmkit huge faults, clear_page per 4 KiB in process_huge_page() order",
    },
    VariantInfo {
        name: "mmkit-multi-page",
        description: "mmkit huge faults, one rep stosb per extent",
    },
    VariantInfo {
        name: "mmkit-non-temporal",
        description: "mmkit huge faults, streaming stores",
    },
    VariantInfo {
        name: "raw-memset",
        description: "std::ptr::write_bytes (memset) over a prefaulted buffer, per page",
    },
    VariantInfo {
        name: "raw-stosb",
        description: "clear_pages_with(.., MultiPage) over a prefaulted buffer, per page",
    },
    VariantInfo {
        name: "raw-nt",
        description: "clear_pages_nt with the widest streaming store, over a prefaulted \
                      buffer, per page",
    },
    VariantInfo {
        name: "kernel",
        description: "host THP faults: mmap, madvise(MADV_HUGEPAGE), a byte per 4 KiB, munmap",
    },
    VariantInfo {
        name: "kernel-hugetlb",
        description: "host hugetlb faults: mmap(MAP_HUGETLB|MAP_HUGE_2MB), a byte per 2 MiB, \
                      munmap (needs root to reserve pages; skipped otherwise)",
    },
];

pub struct ClearHuge;

/// Records what `ClearStrategy::Auto` follows in this process: `clear_plan`
/// (the plan's text: kernels for huge pages, 1 GiB extents and fault-around
/// batches, the cached-store crossover, and where it came from) and
/// `clear_calibration` (what the calibration measured), for the workloads whose
/// figures depend on it.
pub fn clear_plan_params(p: &mut Map<String, Value>) {
    let plan = match mmkit::clear_plan() {
        Ok(plan) => plan.to_string(),
        Err(e) => format!("error: {e}"),
    };
    p.insert("clear_plan".into(), plan.into());
    if let Some(c) = mmkit::clear_calibration() {
        p.insert("clear_calibration".into(), c.to_string().into());
    }
}

/// The clearing strategy of an mmkit variant.
fn strategy(name: &str) -> Option<ClearStrategy> {
    match name {
        "mmkit" => Some(ClearStrategy::Auto),
        "mmkit-page-at-a-time" => Some(ClearStrategy::PageAtATime),
        "mmkit-multi-page" => Some(ClearStrategy::MultiPage),
        "mmkit-non-temporal" => Some(ClearStrategy::NonTemporal),
        _ => None,
    }
}

/// Bytes per pass of a case: 256 MiB of 2 MiB pages, or one 1 GiB page; with
/// `--quick` 64 MiB and 256 MiB (still larger than the LLC, so the strategies
/// choose as they would for 1 GiB).
fn pass_len(page: usize, quick: bool) -> usize {
    match (page > PASS_2M, quick) {
        (true, false) => page,
        (true, true) => QUICK_PASS_1G,
        (false, false) => PASS_2M,
        (false, true) => QUICK_PASS_2M,
    }
}

/// Bytes one raw call (and one yield-gap measurement) clears: a page of the
/// case's size, or the whole pass if that is smaller (`--quick` 1GiB).
fn extent(page: usize, quick: bool) -> usize {
    page.min(pass_len(page, quick))
}

/// One timed pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Pass {
    secs: f64,
    /// Bytes faulted in (or cleared).
    bytes: f64,
    /// Bytes of the region mapped (or cleared).
    region: f64,
    /// Bytes of it that huge pages mapped.
    huge_bytes: f64,
}

/// Runs `pass` for the warmup (untimed) and then for the duration, at least
/// `MIN_PASSES` times; a `None` pass is a failure. Returns the timed passes and
/// the failures.
fn passes(timing: &Timing, mut pass: impl FnMut() -> Option<Pass>) -> (Vec<Pass>, u64) {
    let mut failures = 0;
    let t0 = Instant::now();
    while t0.elapsed() < timing.warmup {
        if pass().is_none() {
            failures += 1;
        }
    }
    let (mut out, t0) = (Vec::new(), Instant::now());
    let mut tries = 0;
    while (t0.elapsed() < timing.duration || out.len() < MIN_PASSES) && tries < 1000 {
        tries += 1;
        match pass() {
            Some(p) => out.push(p),
            None => {
                failures += 1;
                if out.is_empty() && tries >= MIN_PASSES {
                    break; // it never works: give up on this case
                }
            }
        }
    }
    (out, failures)
}

/// The figures of one case from its passes.
fn figures(case: &str, passes: &[Pass], failures: u64, huge: bool) -> Vec<Figure> {
    let mut out = Vec::new();
    let rates: Vec<f64> = passes.iter().map(|p| gb_per_sec(p.bytes, p.secs)).collect();
    if let Some(m) = median(&rates) {
        out.push(Figure::new(GB_PER_SEC.name, m));
        let region: f64 = passes.iter().map(|p| p.region).sum();
        let hb: f64 = passes.iter().map(|p| p.huge_bytes).sum();
        if huge && region > 0.0 {
            out.push(Figure::new(HUGE_PCT.name, hb * 100.0 / region));
        }
    }
    out.push(Figure::new(ALLOC_FAILURES.name, failures as f64));
    for f in &mut out {
        f.case = Some(case.to_string());
    }
    out
}

/// An mmkit pass: map `len` HUGE, touch each 2 MiB (timed), unmap.
fn pass_mmkit(space: &mmkit::Space, len: usize) -> Option<Pass> {
    let a = space.mmap(len, MapFlags::HUGE).ok()?;
    let before = space.stats();
    let t0 = Instant::now();
    let mut ok = true;
    for off in (0..len).step_by(HUGE) {
        if space.touch(a + off as u64, true).is_err() {
            ok = false;
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = space.stats();
    let unmapped = space.munmap(a, len).is_ok();
    if !(ok && unmapped) {
        return None;
    }
    // Each 2 MiB unit was faulted once: a huge page, or 4 KiB after a fallback.
    let huge = after.huge_pages.saturating_sub(before.huge_pages) as f64;
    let bytes = after.rss_pages.saturating_sub(before.rss_pages) as f64 * PAGE as f64;
    Some(Pass {
        secs,
        bytes,
        region: len as f64,
        huge_bytes: huge * HUGE as f64,
    })
}

/// The median longest stretch without a yield point, in microseconds, for one
/// clear of `page` bytes with `strategy` (None without memory for the buffer).
fn yield_gap_us(page: usize, strategy: ClearStrategy) -> Option<f64> {
    let buf = HostMap::huge_aligned(page, true).ok()?;
    let gaps: Vec<f64> = (0..GAP_REPS)
        .map(|_| {
            // SAFETY: the buffer is ours and `page` bytes long; the yield function
            // touches nothing.
            let st = unsafe {
                clear_chunked_timed(
                    buf.ptr(),
                    page,
                    strategy,
                    0,
                    &mut std::thread::yield_now,
                    now_ns,
                )
            };
            st.max_gap_ns as f64 / 1000.0
        })
        .collect();
    median(&gaps)
}

fn run_mmkit(mm: &Mm, case: &str, page: usize, timing: &Timing) -> Vec<Figure> {
    let len = pass_len(page, timing.quick);
    let (ps, failures) = match mm.new_space() {
        Ok(space) => passes(timing, || pass_mmkit(&space, len)),
        Err(_) => (Vec::new(), 1),
    };
    let mut out = figures(case, &ps, failures, true);
    let ext = extent(page, timing.quick);
    // The strategy a fault in this case's mapping resolves to (the pass's size).
    let s = mm.clear_plan().resolve(mm.clear_strategy(), len);
    if let Some(g) = yield_gap_us(ext, s) {
        let mut f = Figure::new(MAX_YIELD_GAP_US.name, g);
        f.case = Some(case.to_string());
        out.push(f);
    }
    out
}

fn run_raw(name: &str, case: &str, page: usize, timing: &Timing) -> Vec<Figure> {
    let len = pass_len(page, timing.quick);
    let Ok(buf) = HostMap::huge_aligned(len, true) else {
        return figures(case, &[], 1, false);
    };
    let nt = cpu_clear_caps().nt_kind;
    let ext = extent(page, timing.quick);
    let (ps, failures) = passes(timing, || {
        let t0 = Instant::now();
        for off in (0..len).step_by(ext) {
            // SAFETY: off + ext <= len (len is a multiple of ext); the buffer
            // is ours and nothing refers into it.
            unsafe {
                let p = buf.ptr().add(off);
                match name {
                    "raw-memset" => std::ptr::write_bytes(p, 0, ext),
                    "raw-stosb" => clear_pages_with(p, ext, ClearStrategy::MultiPage),
                    _ => clear_pages_nt(p, ext, nt),
                }
            }
        }
        std::hint::black_box(buf.ptr());
        Some(Pass {
            secs: t0.elapsed().as_secs_f64(),
            bytes: len as f64,
            region: len as f64,
            huge_bytes: 0.0,
        })
    });
    figures(case, &ps, failures, false)
}

/// A kernel THP pass: mmap (2 MiB aligned), madvise, a byte per 4 KiB (timed).
fn pass_kernel(len: usize) -> Option<Pass> {
    let m = HostMap::huge_aligned(len, false).ok()?;
    let p = m.ptr();
    let t0 = Instant::now();
    for off in (0..len).step_by(PAGE) {
        // SAFETY: off < len, inside our fresh private read/write mapping.
        unsafe { p.add(off).write_volatile(1) };
    }
    let secs = t0.elapsed().as_secs_f64();
    let huge = anon_huge_bytes(p as usize).unwrap_or(0) as f64;
    Some(Pass {
        secs,
        bytes: len as f64,
        region: len as f64,
        huge_bytes: huge.min(len as f64),
    })
}

/// A kernel hugetlb pass: mmap(MAP_HUGETLB), a byte per 2 MiB (timed), munmap.
fn pass_hugetlb(len: usize) -> Option<Pass> {
    let p = mmap_anon(len, libc::MAP_HUGETLB | MAP_HUGE_2MB)
        .ok()?
        .as_ptr();
    let t0 = Instant::now();
    for off in (0..len).step_by(HUGE) {
        // SAFETY: off < len, inside our fresh hugetlb mapping.
        unsafe { p.add(off).write_volatile(1) };
    }
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: exactly the mapping made above; no reference into it remains.
    unsafe { libc::munmap(p.cast(), len) };
    Some(Pass {
        secs,
        bytes: len as f64,
        region: len as f64,
        huge_bytes: len as f64,
    })
}

fn run_hugetlb(case: &str, page: usize, timing: &Timing) -> Vec<Figure> {
    let len = pass_len(page, timing.quick);
    let _r = match HugetlbReservation::reserve(len / HUGE) {
        Ok(r) => r,
        Err(why) => {
            eprintln!("note: clear_huge ({case}) kernel-hugetlb skipped: {why}");
            return Vec::new();
        }
    };
    // A probe first, so that a refused mapping is a note, not failures.
    match mmap_anon(HUGE, libc::MAP_HUGETLB | MAP_HUGE_2MB) {
        // SAFETY: exactly the probe mapping just made, never touched.
        Ok(p) => unsafe {
            libc::munmap(p.as_ptr().cast(), HUGE);
        },
        Err(e) => {
            eprintln!("note: clear_huge ({case}) kernel-hugetlb skipped: mmap(MAP_HUGETLB): {e}");
            return Vec::new();
        }
    }
    let (ps, failures) = passes(timing, || pass_hugetlb(len));
    figures(case, &ps, failures, true)
}

impl ClearHuge {
    fn arena(&self, config: &Config) -> usize {
        let biggest = CASES
            .iter()
            .map(|&(_, page)| pass_len(page, config.timing.quick))
            .max()
            .unwrap_or(PASS_2M);
        arena_for(biggest).max(config.memory)
    }
}

impl Workload for ClearHuge {
    fn name(&self) -> &'static str {
        "clear_huge"
    }

    fn description(&self) -> &'static str {
        "demand-fault huge pages, cases 2MiB (256 MiB passes; quick 64 MiB) and 1GiB (1 GiB \
         passes, quick 256 MiB; mmkit: 2 MiB faults), per clearing strategy, beside raw \
         clearing loops and the kernel's THP and hugetlb faults; gb_per_sec counts bytes \
         faulted in (one thread)"
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
        self.arena(config)
    }

    fn build(&self, variant: &str, config: &Config) -> Result<Peer> {
        let Some(info) = VARIANTS.iter().find(|v| v.name == variant) else {
            bail!("unknown variant {variant:?} for clear_huge");
        };
        match strategy(variant) {
            Some(s) => Peer::create_mmkit(variant, Variant::Mmkit, self.arena(config), s),
            None => Ok(Peer::Native(info.name)),
        }
    }

    fn params_for(&self, config: &Config) -> Map<String, Value> {
        let mut p = Map::new();
        let caps = cpu_clear_caps();
        p.insert(
            "pass_bytes_2m".into(),
            (pass_len(2 << 20, config.timing.quick) as u64).into(),
        );
        p.insert(
            "pass_bytes_1g".into(),
            (pass_len(1 << 30, config.timing.quick) as u64).into(),
        );
        p.insert("min_passes".into(), MIN_PASSES.into());
        p.insert("memory_bytes".into(), (self.arena(config) as u64).into());
        p.insert("host_thp".into(), thp_mode().into());
        p.insert("nt_kind".into(), caps.nt_kind.name().into());
        p.insert("llc_bytes".into(), (caps.llc_bytes as u64).into());
        clear_plan_params(&mut p);
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        if threads != 1 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (case, page) in CASES {
            peer.settle();
            let len = pass_len(page, timing.quick);
            out.extend(match (peer.mm(), peer.native()) {
                (Some(mm), _) => run_mmkit(mm, case, page, timing),
                (None, Some("kernel")) => {
                    let (ps, failures) = passes(timing, || pass_kernel(len));
                    figures(case, &ps, failures, true)
                }
                (None, Some("kernel-hugetlb")) => run_hugetlb(case, page, timing),
                (None, Some(name)) => run_raw(name, case, page, timing),
                (None, None) => Vec::new(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::page_fault1::PageFault1;

    /// The lab records the plan that the mmkit variants' `Mm`s follow.
    #[test]
    fn params_record_the_clear_plan() {
        let config = Config {
            threads: None,
            variants: None,
            timing: Timing {
                warmup: std::time::Duration::from_millis(5),
                duration: std::time::Duration::from_millis(20),
                quick: true,
            },
            memory: 64 << 20,
            progress: false,
            rounds: 1,
            settings: Vec::new(),
            params: Map::new(),
            swap_file: None,
            sizes: Vec::new(),
        };
        let peer = ClearHuge.build("mmkit", &config).unwrap();
        let want = peer.mm().unwrap().clear_plan().to_string();
        assert_eq!(want, mmkit::clear_plan().unwrap().to_string());
        assert!(want.contains("huge=") && want.contains("source="), "{want}");
        let pf: &dyn Workload = &PageFault1;
        for params in [ClearHuge.params_for(&config), pf.params_for(&config)] {
            assert_eq!(params["clear_plan"], Value::from(want.clone()));
            assert!(params["clear_calibration"]
                .as_str()
                .unwrap()
                .starts_with(&want));
        }
    }
}
