//! Page-clearing kernels: zeroing 4 KiB pages, multi-page extents and huge pages.
//!
//! Every page handed out with `Gfp::ZERO`, and every page installed by a demand fault,
//! is cleared first; for huge pages (2 MiB, 1 GiB) clearing is most of the fault's
//! cost. This module holds the kernels and the policies around them, after the Linux
//! series "x86/clear_huge_page: multi-page clearing" (docs/upstream.md):
//!
//! - [`ClearStrategy::PageAtATime`]: one `rep stosb` (or `rep stosq` without ERMS) per
//!   4 KiB page, the way Linux's `clear_huge_page()` called `clear_page()` in a loop
//!   before the series. Kept as the "before" baseline; for huge pages it also keeps
//!   Linux's `process_huge_page()` order (the far end first, then left-right
//!   narrowing towards the faulting sub-page).
//! - [`ClearStrategy::MultiPage`]: one `rep stosb` over the whole extent. A string
//!   instruction tells the CPU the size of the region up front, which amortises the
//!   microcoded start-up cost and lets some microarchitectures (AMD Zen) elide
//!   cache-line allocation for regions larger than the LLC.
//! - [`ClearStrategy::NonTemporal`]: streaming stores (`vmovntdq`/`movntdq`, widest
//!   the CPU and OS support) and an `sfence`. They bypass the caches, so clearing an
//!   extent larger than the LLC does not evict the working set, and they do not
//!   depend on the CPU recognising the region size (which chunked `rep stosb` loses).
//! - [`ClearStrategy::Auto`]: `MultiPage` up to the LLC size, `NonTemporal` above it
//!   (the size is the whole operation's, not one chunk's).
//!
//! For the fault path, [`clear_page_batch`] clears a fault-around batch of 4 KiB
//! pages; with streaming stores it fences once per batch, not per page, and then
//! prefetches for writing the lines where the next accesses are expected (the
//! "hot" bytes: the faulting access's offset in every page). A huge page cleared
//! with streaming stores prefetches its sub-pages' hot lines the same way
//! ([`ChunkedClear::with_hot`]).
//!
//! Around the kernels: clearing in chunks with a call-back between chunks, so that a
//! 1 GiB clear has a ceiling on the time between preemption points ([`ChunkedClear`],
//! [`clear_chunked_timed`]; the series did this with `TIF_ALLOW_RESCHED`), and the
//! huge page order ([`ChunkedClear::clear_huge_page`]) that clears a small window
//! around the faulting sub-page last, with temporal stores, so it is in cache when
//! the access resumes.
//!
//! Files, one job each:
//! - `mod.rs`: the strategies ([`ClearStrategy`]) and the one-shot entry points
//!   ([`clear_page`], [`clear_pages_with`], [`clear_page_batch`], [`clear_pages_nt`]);
//! - `cpu.rs`: CPU features (ERMS, FSRM, AVX2, AVX-512F with OS support via XGETBV,
//!   the LLC size) from CPUID, once, cached in one atomic word ([`cpu_clear_caps`]);
//! - `kernels.rs`: the kernels themselves (`rep stosb`, `rep stosq`, streaming
//!   stores) and the dispatch from a strategy to one of them;
//! - `huge.rs`: chunked clearing with yield points and the huge-page clearing order;
//! - `plan.rs`: what `Auto` runs for huge pages, 1 GiB extents and fault-around
//!   batches, as data ([`ClearPlan`]): the environment measures (mmkit's std crate
//!   calibrates on the running host), the core only applies the decision.
//!
//! On architectures other than x86_64 every kernel is `core::ptr::write_bytes`.
//!
//! Invariants: a kernel writes zeros to exactly `[p, p + len)` and nothing else, for
//! any alignment and length (heads and tails that the wide kernels cannot cover are
//! written with plain stores); a zero length is a no-op; after a non-temporal kernel
//! returns, its stores are ordered before later stores (`sfence`). There is no shared
//! state apart from the detection cache (idempotent, racing initialisations write the
//! same value), so no lock protects anything here: the caller owns the memory.

mod cpu;
mod huge;
mod kernels;
mod plan;

use core::fmt;
use core::ops::Range;

pub use cpu::{cpu_clear_caps, ClearCaps, NtKind, DEFAULT_LLC_BYTES};
pub use huge::{
    clear_chunked_timed, ChunkedClear, ChunkedClearStats, DEFAULT_CLEAR_CHUNK, FAULT_WINDOW_PAGES,
    HOT_PREFETCH_PAGES,
};

pub use plan::{BadClearPlan, ClearPlan, PlanSource, GIGANTIC_BYTES};

use crate::page::PAGE_SIZE;
use kernels::{clear_nt, clear_one_page, Kernel};

// ---------------------------------------------------------------------------------
// Strategy names
// ---------------------------------------------------------------------------------

/// How an extent is cleared. A value, not a feature, so the lab compares all of them
/// in one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ClearStrategy {
    /// One string instruction per 4 KiB page (Linux before multi-page clearing).
    PageAtATime,
    /// One `rep stosb` over the whole extent.
    MultiPage,
    /// Streaming (cache-bypassing) stores and an `sfence`.
    NonTemporal,
    /// What a [`ClearPlan`] says for the size of the operation: cached stores up
    /// to its `cached_upto`, its `huge` or `gigantic` kernel above, its `batch`
    /// kernel for the fault-around batch of a sparse first touch. mmkit's `Mm`
    /// applies the plan its build calibrated on the running host (see
    /// `mmkit::clear_calibration`); [`resolve`](Self::resolve), without a plan,
    /// applies [`ClearPlan::from_cpuid`]: `MultiPage` up to the LLC size CPUID
    /// reports, `NonTemporal` above it.
    #[default]
    Auto,
}

impl ClearStrategy {
    /// Every strategy, in the order the lab prints them.
    pub const ALL: [ClearStrategy; 4] = [
        ClearStrategy::PageAtATime,
        ClearStrategy::MultiPage,
        ClearStrategy::NonTemporal,
        ClearStrategy::Auto,
    ];

    /// The stable name used by the lab and in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            ClearStrategy::PageAtATime => "page-at-a-time",
            ClearStrategy::MultiPage => "multi-page",
            ClearStrategy::NonTemporal => "non-temporal",
            ClearStrategy::Auto => "auto",
        }
    }

    /// The strategy with this name (as [`name`](Self::name) gives it; ASCII case is
    /// ignored), or `None`.
    pub fn from_name(name: &str) -> Option<ClearStrategy> {
        ClearStrategy::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// What this strategy does for an operation of `len` bytes on this CPU under
    /// the fixed CPUID rule ([`ClearPlan::from_cpuid`]): `Auto` becomes
    /// `MultiPage` or `NonTemporal`, the others stay as they are. An `Mm`
    /// resolves through its own plan instead ([`ClearPlan::resolve`]).
    pub fn resolve(self, len: usize) -> ClearStrategy {
        match self {
            ClearStrategy::Auto if len > cpu_clear_caps().llc_bytes => ClearStrategy::NonTemporal,
            ClearStrategy::Auto => ClearStrategy::MultiPage,
            s => s,
        }
    }
}

impl fmt::Display for ClearStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`ClearStrategy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownClearStrategy;

impl fmt::Display for UnknownClearStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "unknown clearing strategy; use page-at-a-time, multi-page, non-temporal or auto",
        )
    }
}

impl core::str::FromStr for ClearStrategy {
    type Err = UnknownClearStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ClearStrategy::from_name(s).ok_or(UnknownClearStrategy)
    }
}

// ---------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------

/// Zero one 4 KiB page (`rep stosb` with ERMS, else `rep stosq`).
///
/// # Safety
/// `p` must be valid for writes of 4096 bytes (no alignment needed, a page-aligned
/// `p` is fastest), and no reference to those bytes may be live during the call.
#[inline]
pub unsafe fn clear_page(p: *mut u8) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_one_page(p) }
}

/// Zero `len` bytes at `p` with `strategy`, in one go (no yield points). `len` is
/// in bytes and need not be a multiple of 4096.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes and no reference to those bytes may
/// be live during the call. Any alignment; with `len == 0` nothing is accessed and
/// `p` may be any value.
pub unsafe fn clear_pages_with(p: *mut u8, len: usize, strategy: ClearStrategy) {
    // SAFETY: forwarded from the caller.
    unsafe { Kernel::for_strategy(strategy, len).run(p, len) }
}

/// Zero a batch of 4 KiB pages (the pages of one fault-around batch) with
/// `strategy` as it resolves for one page.
///
/// With [`ClearStrategy::NonTemporal`] the whole batch is cleared with streaming
/// stores behind a single `sfence`: fencing each page waits for its stores to
/// reach memory before the next page starts, which made 4 KiB streaming clears
/// 2-3x slower than `rep stosb` here, while one fence per batch made them 1.5-2x
/// faster. After the fence, the cache lines covering the byte offsets `hot` in
/// every page are prefetched for writing (`prefetchw`), for the access expected
/// there next: it then finds its line in cache instead of waiting on memory,
/// and the prefetches, unlike cached stores of those lines, neither hold up the
/// clearing nor sit in the store buffer for the next locked instruction to wait
/// on. Other strategies ignore `hot` (their stores leave every line cached).
///
/// # Safety
/// Every pointer must be valid for writes of 4096 bytes, the pages must not
/// overlap, and no reference to their bytes may be live during the call.
pub unsafe fn clear_page_batch<I>(pages: I, strategy: ClearStrategy, hot: Range<usize>)
where
    I: IntoIterator<Item = *mut u8>,
    I::IntoIter: Clone,
{
    match Kernel::for_strategy(strategy, PAGE_SIZE) {
        // `for_strategy` gives the detected kind, so the CPU supports it.
        #[cfg(target_arch = "x86_64")]
        Kernel::Nt(kind) if kind != NtKind::Plain => {
            // SAFETY: forwarded from the caller; `kind` is supported and not
            // `Plain`.
            unsafe { kernels::clear_page_batch_nt(pages.into_iter(), kind, hot) }
        }
        kernel => {
            let _ = hot; // cached stores leave every line cached
            for p in pages {
                // SAFETY: forwarded from the caller.
                unsafe { kernel.run(p, PAGE_SIZE) };
            }
        }
    }
}

/// Zero `len` bytes at `p` with the streaming-store kernel `kind` (lowered to the
/// widest one the CPU supports), for the lab's raw comparisons.
///
/// # Safety
/// As [`clear_pages_with`].
pub unsafe fn clear_pages_nt(p: *mut u8, len: usize, kind: NtKind) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_nt(p, len, kind) }
}

/// Write back and evict the cache lines covering `[p, p + len)` from every
/// level (`clflushopt`, else `clflush`; nothing off x86_64): for measurements
/// of clearing that must start from cold lines and pay for the write-back of
/// what they leave dirty. The bytes do not change.
///
/// # Safety
/// `[p, p + len)` must be mapped (readable); with `len == 0` nothing is accessed.
pub unsafe fn flush_cache_range(p: *const u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { kernels::flush_cache_range(p, len) }
}

#[cfg(test)]
pub(super) mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    const LENS: [usize; 11] = [
        0,
        1,
        7,
        63,
        64,
        65,
        4095,
        4096,
        4097,
        3 * 4096 + 13,
        (1 << 20) + 5,
    ];

    /// A buffer aligned to 4096 so that offsets are offsets from a page boundary.
    pub(super) struct Aligned {
        v: Vec<u8>,
        start: usize,
        len: usize,
    }

    impl Aligned {
        pub(super) fn new(len: usize, fill: u8) -> Self {
            let v = vec![fill; len + PAGE_SIZE];
            let start = v.as_ptr().align_offset(PAGE_SIZE);
            Aligned { v, start, len }
        }
        pub(super) fn buf(&mut self) -> &mut [u8] {
            &mut self.v[self.start..self.start + self.len]
        }
    }

    /// Every byte of [off, off + len) zero, every other byte 0xAA.
    pub(super) fn check_exact(buf: &[u8], off: usize, len: usize, what: &str) {
        let zero_ok = buf[off..off + len].iter().all(|&b| b == 0);
        let before_ok = buf[..off].iter().all(|&b| b == 0xAA);
        let after_ok = buf[off + len..].iter().all(|&b| b == 0xAA);
        assert!(zero_ok, "{what}: not all of [{off}, {}) zeroed", off + len);
        assert!(before_ok, "{what}: bytes before offset {off} touched");
        assert!(after_ok, "{what}: bytes after {} touched", off + len);
    }

    /// Run `clear` on every (offset, length) pair and check the result exactly.
    pub(super) fn exact_range(name: &str, clear: &dyn Fn(&mut [u8])) {
        const GUARD: usize = 256;
        let mut a = Aligned::new(GUARD + 64 + (1 << 20) + 5 + GUARD, 0xAA);
        for &len in &LENS {
            for off in 0..=64usize {
                // A 1 MiB case at every offset is slow and adds nothing: sample it.
                if len > 65536 && !matches!(off, 0 | 1 | 13 | 63 | 64) {
                    continue;
                }
                let buf = a.buf();
                let total = GUARD + off + len + GUARD;
                buf[..total].fill(0xAA);
                clear(&mut buf[GUARD + off..GUARD + off + len]);
                check_exact(
                    &buf[..total],
                    GUARD + off,
                    len,
                    &std::format!("{name} off={off} len={len}"),
                );
            }
        }
    }

    #[test]
    fn clear_every_strategy_exact_range() {
        for s in ClearStrategy::ALL {
            exact_range(s.name(), &|b| {
                // SAFETY: an exclusive slice is writable for its length.
                unsafe { clear_pages_with(b.as_mut_ptr(), b.len(), s) }
            });
        }
    }

    #[test]
    fn clear_every_nt_kind_exact_range() {
        for k in NtKind::ALL {
            exact_range(k.name(), &|b| {
                // SAFETY: an exclusive slice is writable for its length.
                unsafe { clear_pages_nt(b.as_mut_ptr(), b.len(), k) }
            });
        }
    }

    #[test]
    fn zero_length_touches_nothing() {
        let null = core::ptr::null_mut::<u8>();
        let mut n = 0;
        // SAFETY: with a zero length (or zero sub-pages) nothing is accessed, so
        // even a null pointer is fine.
        unsafe {
            for s in ClearStrategy::ALL {
                clear_pages_with(null, 0, s);
                let st = clear_chunked_timed(null, 0, s, 1, &mut || n += 1, || 0);
                assert_eq!(st.yields, 0);
                let c = ChunkedClear::new(s);
                assert_eq!(c.clear_huge_page(null, 0, 0, &mut || n += 1), 0);
            }
            for k in NtKind::ALL {
                clear_pages_nt(null, 0, k);
            }
        }
        assert_eq!(n, 0);
    }

    /// A batch of pages, some adjacent, some apart, aligned and not, under every
    /// strategy and hot range (empty, inside, clipped at the page end, past it):
    /// each page zeroed exactly, the gaps and guards untouched.
    #[test]
    fn clear_page_batch_exact() {
        let hots = [
            0..0,
            0..1,
            0..4096,
            100..300,
            4000..4096,
            4090..9000,
            5000..6000,
        ];
        for off in [0usize, 64, 1, 8] {
            for s in ClearStrategy::ALL {
                for hot in hots.clone() {
                    let mut a = Aligned::new(10 * PAGE_SIZE, 0xAA);
                    let buf = a.buf();
                    buf.fill(0xAA);
                    // Pages 1, 2 (adjacent), 5 and 7 of the buffer, shifted by `off`.
                    let starts = [1usize, 2, 5, 7].map(|i| i * PAGE_SIZE + off);
                    let base = buf.as_mut_ptr();
                    // SAFETY: each start + 4096 <= 8 * 4096 + 8, inside the 10-page
                    // buffer; the pages do not overlap; no reference is live.
                    unsafe {
                        clear_page_batch(starts.iter().map(|&o| base.add(o)), s, hot.clone())
                    };
                    for (i, &b) in buf.iter().enumerate() {
                        let inside = starts.iter().any(|&o| (o..o + PAGE_SIZE).contains(&i));
                        let want = if inside { 0 } else { 0xAA };
                        assert_eq!(b, want, "{s} off={off} hot={hot:?} byte {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn flush_changes_no_byte() {
        let mut a = Aligned::new(3 * PAGE_SIZE, 0);
        let buf = a.buf();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // SAFETY: every range lies inside the buffer; a zero length is a no-op.
        unsafe {
            flush_cache_range(buf.as_ptr().add(5), 2 * PAGE_SIZE + 100);
            flush_cache_range(buf.as_ptr(), 0);
            flush_cache_range(buf.as_ptr().add(63), 2);
        }
        assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }

    #[test]
    fn clear_page_single() {
        for off in [0usize, 1, 8, 64] {
            let mut a = Aligned::new(3 * PAGE_SIZE, 0xAA);
            let buf = a.buf();
            // SAFETY: off + 4096 <= 3 * 4096, inside the buffer.
            unsafe { clear_page(buf.as_mut_ptr().add(PAGE_SIZE + off)) };
            check_exact(buf, PAGE_SIZE + off, PAGE_SIZE, "clear_page");
        }
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in ClearStrategy::ALL {
            assert_eq!(ClearStrategy::from_name(s.name()), Some(s));
            assert_eq!(s.name().parse::<ClearStrategy>(), Ok(s));
            assert_eq!(std::format!("{s}"), s.name());
        }
        assert_eq!(
            ClearStrategy::from_name("Multi-Page"),
            Some(ClearStrategy::MultiPage)
        );
        assert_eq!(ClearStrategy::from_name("rep"), None);
        assert!("x".parse::<ClearStrategy>().is_err());
        assert_eq!(ClearStrategy::default(), ClearStrategy::Auto);
    }

    #[test]
    fn auto_resolves_on_llc_size() {
        let llc = cpu_clear_caps().llc_bytes;
        assert_eq!(ClearStrategy::Auto.resolve(0), ClearStrategy::MultiPage);
        assert_eq!(ClearStrategy::Auto.resolve(llc), ClearStrategy::MultiPage);
        assert_eq!(
            ClearStrategy::Auto.resolve(llc + 1),
            ClearStrategy::NonTemporal
        );
        assert_eq!(
            ClearStrategy::PageAtATime.resolve(usize::MAX),
            ClearStrategy::PageAtATime
        );
    }
}
