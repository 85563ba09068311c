//! Calibrating page clearing on the running host: which kernel
//! [`ClearStrategy::Auto`](crate::ClearStrategy::Auto) runs for huge pages, 1 GiB
//! extents and fault-around batches, and up to which size cached stores are kept.
//!
//! Why measure rather than read CPUID: the fixed rule (streaming stores above the
//! last-level cache size CPUID reports, `rep stosb` below) was tuned on one AMD
//! EPYC host. On an Intel Xeon KVM guest (2 vCPUs, AVX-512) whose CPUID reports a
//! 480 MiB L3 (the whole host's, not what the guest gets), `mmlab run clear_huge
//! page_fault1` gave:
//!
//! | figure | Intel guest | AMD host |
//! |---|---|---|
//! | clear_huge 2 MiB, mmkit (rule picks `rep stosb`: 256 MiB "fits" the LLC) | 10.9 GB/s | 77 GB/s |
//! | clear_huge 2 MiB, streaming stores | 22.3 GB/s | 82 GB/s |
//! | clear_huge 2 MiB, raw streaming loop (the bound) | 26.0 GB/s | 84 GB/s |
//! | clear_huge 2 MiB, kernel THP | 9.3 GB/s | 12 GB/s |
//! | mmkit / kernel, 2 MiB | 1.17x | 6.4x |
//! | mmkit / raw streaming, 1 GiB | 0.85 | 0.99 |
//!
//! The rule was wrong by 2x there, and no CPUID field says so; a few
//! milliseconds of clearing say it directly. The calibration runs once per
//! process (the first `Mm` build, or the first call of [`clear_calibration`];
//! the process's CPU model does not change under it, so the one result is the
//! per-model cache), on a buffer of its own: one huge page, a second one only
//! if the 1 GiB extents need their own measurement. Each pair of kernels runs
//! once; a pair whose loser is within `DECISIVE` (1.25x) of its winner runs
//! once more and the faster of the two runs of each counts (the machine may be
//! busy). It clears and writes back 12 MiB when every pair is decided at once,
//! 40 MiB at most: about 1.5 ms of CPU time on a 2-CPU AMD EPYC guest (median
//! of 15 start-ups; the fixed-size calibration it replaced took 4.2 ms there),
//! `cpu_us` in [`ClearCalibration`]:
//!
//! - `huge`: `rep stosb` against streaming stores clearing 2 MiB in one call,
//!   timed from cold lines through the write-back of what it left dirty
//!   (`clflushopt` over the buffer, inside the timing): the cost of a huge page
//!   whose zeroes leave the cache before they are used, as in a fault stream
//!   larger than the cache;
//! - `gigantic`: the same in one 4 MiB call (a chunk of a 1 GiB clear; a string
//!   instruction may change protocol with the size it is given), measured only
//!   when `huge` was not decisive: when one kernel clearly wins 2 MiB calls, it
//!   takes the 1 GiB extents too;
//! - `batch`: 16-page fault-around batches of a sparse first touch over 2 MiB,
//!   one byte written per page after the clear, as `page_fault1` does, through
//!   the write-back: `clear_page_batch` with streaming stores (one `sfence`, the
//!   touched lines prefetched) against `rep stosb` per page;
//! - `cached_upto`: 2 MiB cleared then written line by line (the use that cached
//!   zeroes are for), from cold lines: when `rep stosb` wins, mappings up to 2 MiB
//!   keep cached stores; when it loses, none do. The calibration does not reach
//!   further (a larger buffer costs more milliseconds), and CPUID's size is not
//!   trusted beyond what was measured.
//!
//! The choices that do not depend on the host stay: the window around the
//! faulting sub-page of a huge page is cleared last with cached stores, and a
//! dense first touch clears its fault-around batch with cached stores.
//!
//! Overrides, strongest first: [`MmBuilder::clear_plan`](crate::MmBuilder::clear_plan);
//! the environment variable [`CLEAR_PLAN_ENV`] (`MMKIT_CLEAR_PLAN`, in the text
//! form of [`ClearPlan::parse`]: `huge=multi-page,batch=non-temporal,...` over the
//! measured plan, or `cpuid` for the fixed rule without measuring); an explicit
//! `ClearStrategy` other than `Auto` ignores the plan altogether.
//!
//! Invariants: the measured plan is valid (concrete kernels) whatever the timings
//! were; without a buffer (mmap refused) the plan is the CPUID rule. Locking: the
//! result lives in a `OnceLock`; racing first callers wait for one calibration.

use std::sync::OnceLock;
use std::time::Instant;

use mmkit_core::clear::{
    clear_page_batch, clear_pages_with, flush_cache_range, ClearPlan, ClearStrategy, PlanSource,
};
use mmkit_core::PAGE_SIZE;

use crate::Error;

/// The environment variable that overrides the measured plan (see the module
/// header).
pub const CLEAR_PLAN_ENV: &str = "MMKIT_CLEAR_PLAN";

/// A huge page: the bytes of each measurement but the 1 GiB extents'.
const HUGE_BYTES: usize = 2 << 20;
/// The 1 GiB extents' measurement: one call of this many bytes.
const GIGANTIC_CALL: usize = 4 << 20;
/// Pages per fault-around batch measured (mmkit's default fault-around).
const BATCH_PAGES: usize = 16;
/// A pair is decided on one run when the slower kernel takes at least this
/// many times the faster one's time.
const DECISIVE: f64 = 1.25;
/// Runs of each kernel of an undecided pair (the fastest counts).
const MAX_REPS: usize = 2;

/// What the calibration measured and what it chose.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClearCalibration {
    /// The choice.
    pub plan: ClearPlan,
    /// Huge pages: GB/s of `rep stosb` and of streaming stores (2 MiB calls,
    /// through the write-back).
    pub huge_gbs: [f64; 2],
    /// 1 GiB extents: the same in one 4 MiB call; `None` when `huge` was
    /// decisive and its kernel was taken without measuring.
    pub gigantic_gbs: Option<[f64; 2]>,
    /// Sparse fault-around batches: ns per page with `rep stosb` and with
    /// streaming stores.
    pub batch_ns: [f64; 2],
    /// 2 MiB cleared then written line by line: us with `rep stosb` and with
    /// streaming stores.
    pub reuse_us: [f64; 2],
    /// Time the whole calibration took (buffer set-up included), us: wall
    /// clock, and the calibrating thread's CPU time (what it costs on a host
    /// busy with other work, where the wall clock also counts waiting).
    pub elapsed_us: u64,
    /// See `elapsed_us`.
    pub cpu_us: u64,
    /// Timed clears the calibration ran (each a kernel over one buffer).
    pub runs: u32,
}

impl std::fmt::Display for ClearCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (stosb/nt: huge {:.1}/{:.1} GB/s, ",
            self.plan, self.huge_gbs[0], self.huge_gbs[1],
        )?;
        match self.gigantic_gbs {
            Some(g) => write!(f, "gigantic {:.1}/{:.1} GB/s, ", g[0], g[1])?,
            None => write!(f, "gigantic as huge, ")?,
        }
        write!(
            f,
            "batch {:.0}/{:.0} ns/page, reuse {:.0}/{:.0} us; {} runs, {} us, cpu {} us)",
            self.batch_ns[0],
            self.batch_ns[1],
            self.reuse_us[0],
            self.reuse_us[1],
            self.runs,
            self.elapsed_us,
            self.cpu_us
        )
    }
}

static CALIBRATION: OnceLock<Option<ClearCalibration>> = OnceLock::new();

/// The calibration of this process: measured on the first call, then cached.
/// `None` when it could not run (no memory for its buffer); the plan is then
/// [`ClearPlan::from_cpuid`].
pub fn clear_calibration() -> Option<ClearCalibration> {
    *CALIBRATION.get_or_init(calibrate)
}

/// The plan an `Mm` built now gets without [`MmBuilder::clear_plan`]: the
/// environment's override ([`CLEAR_PLAN_ENV`]) over the measured plan, or the
/// measured plan. An override that does not parse is an error
/// ([`Error::Config`]) naming the variable.
///
/// [`MmBuilder::clear_plan`]: crate::MmBuilder::clear_plan
pub fn clear_plan() -> Result<ClearPlan, Error> {
    let env = std::env::var(CLEAR_PLAN_ENV).ok();
    plan_from(env.as_deref(), || {
        clear_calibration().map_or_else(ClearPlan::from_cpuid, |c| c.plan)
    })
}

/// `text` (the environment's value, if any) over the plan `measured` gives;
/// `cpuid` does not measure.
fn plan_from(text: Option<&str>, measured: impl FnOnce() -> ClearPlan) -> Result<ClearPlan, Error> {
    match text.map(str::trim) {
        None | Some("") => Ok(measured()),
        Some(t) if t.eq_ignore_ascii_case("cpuid") => Ok(ClearPlan::from_cpuid()),
        Some(t) => ClearPlan::parse(measured(), t)
            .map_err(|e| Error::Config(format!("{CLEAR_PLAN_ENV}={t:?}: {e}"))),
    }
}

/// A buffer for the calibration: anonymous, 2 MiB aligned, THP advised, room
/// for `GIGANTIC_CALL` bytes of which the first `ready` are faulted in.
struct Buf {
    map: *mut u8,
    map_len: usize,
    p: *mut u8,
    ready: usize,
}

impl Buf {
    fn new() -> Option<Buf> {
        let map_len = GIGANTIC_CALL + HUGE_BYTES;
        // SAFETY: a fresh private anonymous mapping; no address hint.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let map = map.cast::<u8>();
        let p = map.wrapping_add(map.align_offset(HUGE_BYTES));
        // SAFETY: [p, p + GIGANTIC_CALL) lies inside the mapping (the extra
        // 2 MiB covers the alignment); madvise is a hint, its failure changes
        // nothing.
        unsafe { libc::madvise(p.cast(), GIGANTIC_CALL, libc::MADV_HUGEPAGE) };
        let mut buf = Buf {
            map,
            map_len,
            p,
            ready: 0,
        };
        buf.fault_in(HUGE_BYTES);
        Some(buf)
    }

    /// Faults in the first `len` bytes (untimed), leaving no line cached.
    fn fault_in(&mut self, len: usize) {
        if len > self.ready {
            // SAFETY: [p + ready, p + len) lies inside the mapping (len is at
            // most GIGANTIC_CALL); nothing refers into it.
            unsafe {
                clear_pages_with(
                    self.p.add(self.ready),
                    len - self.ready,
                    ClearStrategy::NonTemporal,
                )
            };
            self.ready = len;
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`; no reference into it remains.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// ns that `f` took.
fn timed(f: impl FnOnce()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_nanos() as f64
}

/// Whether one of two times (ns) clearly wins: the other is at least
/// `DECISIVE` times as long (a time that is not a positive number decides
/// nothing).
fn decisive(ns: [f64; 2]) -> bool {
    let (lo, hi) = (ns[0].min(ns[1]), ns[0].max(ns[1]));
    lo > 0.0 && hi.is_finite() && hi >= lo * DECISIVE
}

/// `rep stosb` and streaming stores through `f` (ns per run, each leaving the
/// buffer's lines written back and uncached, so the next run starts cold): once
/// each, and again while the pair is not decisive, up to `MAX_REPS`; the
/// fastest run of each kernel. Counts the runs in `runs`.
fn pair(runs: &mut u32, mut f: impl FnMut(ClearStrategy) -> f64) -> [f64; 2] {
    let mut best = [f64::INFINITY; 2];
    for rep in 0..MAX_REPS {
        if rep > 0 && decisive(best) {
            break;
        }
        for (i, s) in [ClearStrategy::MultiPage, ClearStrategy::NonTemporal]
            .into_iter()
            .enumerate()
        {
            best[i] = best[i].min(f(s));
            *runs += 1;
        }
    }
    best
}

/// Clears the first `len` bytes with `s` in one call, then writes back what
/// is dirty.
fn stream(buf: &Buf, s: ClearStrategy, len: usize) {
    debug_assert!(len <= buf.ready);
    // SAFETY: len <= buf.ready, faulted in and ours.
    unsafe {
        clear_pages_with(buf.p, len, s);
        flush_cache_range(buf.p, len);
    }
}

/// Sparse first touches in fault-around batches over `HUGE_BYTES`, cleared
/// with `s`.
fn batches(buf: &Buf, s: ClearStrategy) {
    let pages = HUGE_BYTES / PAGE_SIZE;
    for first in (0..pages).step_by(BATCH_PAGES) {
        let at = |i: usize| buf.p.wrapping_add(i * PAGE_SIZE);
        // SAFETY: the pages first..first + BATCH_PAGES are inside the buffer
        // (pages is a multiple of BATCH_PAGES) and do not overlap.
        unsafe { clear_page_batch((first..first + BATCH_PAGES).map(at), s, 0..1) };
        for i in first..first + BATCH_PAGES {
            // SAFETY: inside the buffer; a volatile store, as the touch is.
            unsafe { at(i).write_volatile(1) };
        }
    }
    // SAFETY: the buffer is faulted in for HUGE_BYTES.
    unsafe { flush_cache_range(buf.p, HUGE_BYTES) };
}

/// `HUGE_BYTES` cleared with `s`, then one store per cache line: ns (the
/// write-back afterwards is not timed: cached zeroes are meant to be used in
/// the cache).
fn reuse(buf: &Buf, s: ClearStrategy) -> f64 {
    let ns = timed(|| {
        // SAFETY: HUGE_BYTES <= buf.ready; the buffer is ours.
        unsafe { clear_pages_with(buf.p, HUGE_BYTES, s) };
        for off in (0..HUGE_BYTES).step_by(64) {
            // SAFETY: inside the buffer.
            unsafe { buf.p.add(off).write_volatile(1) };
        }
    });
    // SAFETY: the buffer is faulted in for HUGE_BYTES.
    unsafe { flush_cache_range(buf.p, HUGE_BYTES) };
    ns
}

/// CPU time of the calling thread, us.
fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

fn calibrate() -> Option<ClearCalibration> {
    let (t0, cpu0) = (Instant::now(), thread_cpu_us());
    let mut buf = Buf::new()?;
    let mut runs = 0;
    let rate = |len: usize, ns: [f64; 2]| ns.map(|ns| len as f64 / ns);
    let huge_ns = pair(&mut runs, |s| timed(|| stream(&buf, s, HUGE_BYTES)));
    let gigantic = if decisive(huge_ns) {
        None
    } else {
        buf.fault_in(GIGANTIC_CALL);
        let ns = pair(&mut runs, |s| timed(|| stream(&buf, s, GIGANTIC_CALL)));
        Some(rate(GIGANTIC_CALL, ns))
    };
    let per_page = (HUGE_BYTES / PAGE_SIZE) as f64;
    let batch = pair(&mut runs, |s| timed(|| batches(&buf, s))).map(|ns| ns / per_page);
    let reuse = pair(&mut runs, |s| reuse(&buf, s)).map(|ns| ns / 1000.0);
    drop(buf);
    let mut c = choose(
        rate(HUGE_BYTES, huge_ns),
        gigantic,
        batch,
        reuse,
        t0.elapsed().as_micros() as u64,
    );
    c.cpu_us = thread_cpu_us().saturating_sub(cpu0);
    c.runs = runs;
    Some(c)
}

/// The plan from the figures: the faster kernel of each pair (rates: higher
/// wins; times: lower wins; a tie or a figure that is not a number keeps
/// `rep stosb`, the kernel without a fence); 1 GiB extents without figures of
/// their own take the huge pages' kernel.
fn choose(
    huge_gbs: [f64; 2],
    gigantic_gbs: Option<[f64; 2]>,
    batch_ns: [f64; 2],
    reuse_us: [f64; 2],
    elapsed_us: u64,
) -> ClearCalibration {
    let pick = |stosb_worse: bool| {
        if stosb_worse {
            ClearStrategy::NonTemporal
        } else {
            ClearStrategy::MultiPage
        }
    };
    let plan = ClearPlan {
        huge: pick(huge_gbs[1] > huge_gbs[0]),
        gigantic: pick(gigantic_gbs.map_or(huge_gbs[1] > huge_gbs[0], |g| g[1] > g[0])),
        batch: pick(batch_ns[1] < batch_ns[0]),
        cached_upto: if reuse_us[1] < reuse_us[0] {
            0
        } else {
            HUGE_BYTES
        },
        source: PlanSource::Measured,
    };
    ClearCalibration {
        plan,
        huge_gbs,
        gigantic_gbs,
        batch_ns,
        reuse_us,
        elapsed_us,
        cpu_us: 0,
        runs: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_yields_a_valid_plan_once() {
        let c = clear_calibration().expect("a 6 MiB buffer");
        // One run of each kernel of the three pairs at least, at most
        // MAX_REPS of each of the four.
        assert!((6..=8 * MAX_REPS as u32).contains(&c.runs), "{c}");
        assert_eq!(
            c.gigantic_gbs.is_none(),
            decisive(c.huge_gbs.map(|g| 1.0 / g)),
            "{c}"
        );
        assert!(c.plan.is_valid(), "{c}");
        assert_eq!(c.plan.source, PlanSource::Measured);
        assert!(matches!(c.plan.cached_upto, 0 | HUGE_BYTES), "{c}");
        for s in [c.plan.huge, c.plan.gigantic, c.plan.batch] {
            assert!(matches!(
                s,
                ClearStrategy::MultiPage | ClearStrategy::NonTemporal
            ));
        }
        // Cached: the same figures again, not a second measurement.
        assert_eq!(clear_calibration(), Some(c));
        eprintln!("clear calibration: {c}");
    }

    #[test]
    fn any_figures_give_a_valid_plan() {
        let odd = [0.0, f64::NAN, f64::INFINITY, 1.0, -1.0];
        for &a in &odd {
            for &b in &odd {
                for g in [Some([b, a]), None] {
                    let c = choose([a, b], g, [a, b], [b, a], 0);
                    assert!(c.plan.is_valid());
                    assert_eq!(c.plan.source, PlanSource::Measured);
                }
                // Odd times decide nothing on their own.
                if !(a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()) {
                    assert!(!decisive([a, b]), "{a} {b}");
                }
            }
        }
        let c = choose(
            [10.9, 22.3],
            Some([10.0, 20.0]),
            [300.0, 150.0],
            [90.0, 200.0],
            1,
        );
        assert_eq!(c.plan.huge, ClearStrategy::NonTemporal);
        assert_eq!(c.plan.gigantic, ClearStrategy::NonTemporal);
        assert_eq!(c.plan.batch, ClearStrategy::NonTemporal);
        assert_eq!(c.plan.cached_upto, HUGE_BYTES);
        let c = choose(
            [30.0, 20.0],
            Some([30.0, 20.0]),
            [100.0, 150.0],
            [300.0, 200.0],
            1,
        );
        assert_eq!(c.plan.huge, ClearStrategy::MultiPage);
        assert_eq!(c.plan.gigantic, ClearStrategy::MultiPage);
        assert_eq!(c.plan.batch, ClearStrategy::MultiPage);
        assert_eq!(c.plan.cached_upto, 0);
        // Without figures of their own, 1 GiB extents follow huge pages.
        let c = choose([10.9, 22.3], None, [1.0, 2.0], [1.0, 2.0], 1);
        assert_eq!(c.plan.gigantic, ClearStrategy::NonTemporal);
        let c = choose([30.0, 20.0], None, [1.0, 2.0], [1.0, 2.0], 1);
        assert_eq!(c.plan.gigantic, ClearStrategy::MultiPage);
        assert!(c.to_string().contains("gigantic as huge"), "{c}");
    }

    #[test]
    fn a_pair_runs_again_only_while_undecided() {
        let mut runs = 0;
        // 2x apart: decided on the first run of each.
        let t = pair(&mut runs, |s| {
            if s == ClearStrategy::MultiPage {
                200.0
            } else {
                100.0
            }
        });
        assert_eq!((t, runs), ([200.0, 100.0], 2));
        // 10% apart: run again, the fastest of each counts.
        let mut runs = 0;
        let mut seq = [120.0, 100.0, 90.0, 130.0].into_iter();
        let t = pair(&mut runs, |_| seq.next().unwrap());
        assert_eq!((t, runs), ([90.0, 100.0], 4));
        assert!(decisive([100.0, 125.0]) && decisive([125.0, 100.0]));
        assert!(!decisive([100.0, 124.0]));
    }

    #[test]
    fn builder_override_wins_and_bad_plans_are_refused() {
        let want = ClearPlan {
            huge: ClearStrategy::MultiPage,
            gigantic: ClearStrategy::PageAtATime,
            batch: ClearStrategy::MultiPage,
            cached_upto: 12345,
            source: PlanSource::Measured,
        };
        let mm = crate::Mm::builder()
            .memory(8 << 20)
            .clear_plan(want)
            .build()
            .unwrap();
        let got = mm.clear_plan();
        assert_eq!(got.source, PlanSource::Override);
        assert_eq!(
            ClearPlan {
                source: PlanSource::Measured,
                ..got
            },
            want
        );
        assert_eq!(
            got.resolve(ClearStrategy::Auto, 1 << 30),
            ClearStrategy::PageAtATime
        );
        let dbg = format!("{mm:?}");
        assert!(
            dbg.contains("huge=multi-page") && dbg.contains("source=override"),
            "{dbg}"
        );
        let bad = ClearPlan {
            huge: ClearStrategy::Auto,
            ..want
        };
        let e = crate::Mm::builder()
            .memory(8 << 20)
            .clear_plan(bad)
            .build()
            .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
    }

    #[test]
    fn environment_override_wins() {
        let measured = || ClearPlan {
            huge: ClearStrategy::NonTemporal,
            gigantic: ClearStrategy::NonTemporal,
            batch: ClearStrategy::NonTemporal,
            cached_upto: 0,
            source: PlanSource::Measured,
        };
        assert_eq!(plan_from(None, measured).unwrap(), measured());
        assert_eq!(plan_from(Some(" "), measured).unwrap(), measured());
        let p = plan_from(Some("huge=multi-page,cached_upto=1M"), measured).unwrap();
        assert_eq!(p.huge, ClearStrategy::MultiPage);
        assert_eq!(p.gigantic, ClearStrategy::NonTemporal);
        assert_eq!(p.cached_upto, 1 << 20);
        assert_eq!(p.source, PlanSource::Override);
        // `cpuid` does not measure.
        let p = plan_from(Some("cpuid"), || panic!("measured")).unwrap();
        assert_eq!(p, ClearPlan::from_cpuid());
        let e = plan_from(Some("huge=auto"), measured).unwrap_err();
        assert!(e.to_string().contains(CLEAR_PLAN_ENV), "{e}");
    }
}
