//! Clearing in bounded chunks, and the order in which a huge page is cleared.
//!
//! [`ChunkedClear`] clears in chunks of at most `chunk_bytes` with a call-back (a
//! preemption point) between chunks, so that clearing a 1 GiB page has a ceiling on
//! the time between two yields; the byte budget is shared by all the pieces of one
//! operation. [`ChunkedClear::clear_huge_page`] clears a huge page for a fault on
//! one of its sub-pages: the sub-pages away from the fault first (with the
//! strategy's kernel, streaming stores for a large page under `Auto`), a small
//! window around the faulting sub-page last with temporal stores, so that it is in
//! cache when the access resumes; under `PageAtATime` the order is Linux's
//! `process_huge_page()` exactly. [`clear_chunked_timed`] is the lab's probe of the
//! longest stretch between yields.
//!
//! Invariants: every byte of the range is cleared exactly once; the yield function
//! runs between chunks only (never before the first or after the last), so a clear
//! of `len` bytes yields `ceil(len / chunk) - 1` times. No shared state and no lock:
//! the caller owns the memory, and the yield function must not touch it.

use super::kernels::{hot_lines, prefetch_pages, Kernel};
use super::ClearStrategy;
use crate::page::PAGE_SIZE;

/// Default bytes cleared between two yield points: the largest power of two that
/// stays under 1 ms on the reference machine (AMD EPYC, Zen 3/4 class): 8 MiB took
/// about 0.6 ms with temporal stores (chunked `rep stosb`, ~13 GB/s) and 0.3 ms with
/// streaming stores (~28 GB/s); 16 MiB took about 1.4 ms. A 1 GiB page yields 127
/// times.
pub const DEFAULT_CLEAR_CHUNK: usize = 8 << 20;

/// Sub-pages around the faulting one that [`ChunkedClear::clear_huge_page`] clears
/// last
/// (8 x 4 KiB = 32 KiB, an L1 data cache).
pub const FAULT_WINDOW_PAGES: usize = 8;

/// What a chunked clear did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkedClearStats {
    /// Bytes cleared.
    pub bytes: usize,
    /// Chunks cleared (stretches between yield points): `yields + 1`, or 0 when
    /// nothing was cleared.
    pub chunks: usize,
    /// Calls of the yield function.
    pub yields: usize,
    /// Longest time spent clearing without a yield point (from the start or the
    /// return of a yield to the next yield or the end), in ns; 0 without a clock.
    pub max_gap_ns: u64,
    /// Time of the whole call including the yields, in ns; 0 without a clock.
    pub total_ns: u64,
}

/// Clearing in chunks of at most `chunk_bytes`, calling a yield function between
/// chunks (never before the first or after the last), so that the time between
/// preemption points has a ceiling. Yield points are counted across the pieces of
/// one operation: a huge page cleared in three pieces still yields every
/// `chunk_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedClear {
    /// The kernel; `Auto` decides on the size of the whole operation.
    pub strategy: ClearStrategy,
    /// Bytes between yield points; 0 means [`DEFAULT_CLEAR_CHUNK`].
    pub chunk_bytes: usize,
    /// Sub-pages around the faulting one that a huge page clear does last
    /// (see [`clear_huge_page`](Self::clear_huge_page)); 0 counts as 1.
    pub window_pages: usize,
    /// Bytes `[hot_offset, hot_offset + hot_len)` of every sub-page: where the
    /// accesses after a huge page fault are expected (the faulting access's
    /// offset, for a loop striding by pages). When the huge page is cleared with
    /// streaming stores, those cache lines are prefetched for writing in up to
    /// [`HOT_PREFETCH_PAGES`] sub-pages outside the window, so that the accesses
    /// find them in cache instead of each waiting on memory. 0 bytes: none.
    pub hot_offset: usize,
    /// See `hot_offset`.
    pub hot_len: usize,
}

/// The most sub-pages of one huge page whose hot lines are prefetched after a
/// streaming clear (512: a 2 MiB page's; 32 KiB of lines at one line each).
pub const HOT_PREFETCH_PAGES: usize = 512;

impl Default for ChunkedClear {
    fn default() -> Self {
        ChunkedClear::new(ClearStrategy::Auto)
    }
}

impl ChunkedClear {
    /// `strategy` with [`DEFAULT_CLEAR_CHUNK`] and [`FAULT_WINDOW_PAGES`].
    pub const fn new(strategy: ClearStrategy) -> Self {
        ChunkedClear {
            strategy,
            chunk_bytes: DEFAULT_CLEAR_CHUNK,
            window_pages: FAULT_WINDOW_PAGES,
            hot_offset: 0,
            hot_len: 0,
        }
    }

    /// The same with the hot bytes `[offset, offset + len)` of each sub-page
    /// (see `hot_offset`).
    pub const fn with_hot(mut self, offset: usize, len: usize) -> Self {
        self.hot_offset = offset;
        self.hot_len = len;
        self
    }

    /// The same with another window (sub-pages cleared last with temporal
    /// stores; 0 counts as 1).
    pub const fn with_window_pages(mut self, window_pages: usize) -> Self {
        self.window_pages = window_pages;
        self
    }

    /// The same with another chunk size (0: the default).
    pub const fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    fn chunk(&self) -> usize {
        if self.chunk_bytes == 0 {
            DEFAULT_CLEAR_CHUNK
        } else {
            self.chunk_bytes
        }
    }

    /// Zero the huge page of `nr_pages` 4 KiB sub-pages at `base` for a fault on
    /// sub-page `fault_index` (clamped to the last sub-page), with yield points
    /// every `chunk_bytes`. Returns the number of yields.
    ///
    /// Order: the sub-pages before the fault window (forwards), those after it (from
    /// the far end back), then the window of `window_pages` sub-pages around
    /// `fault_index` with temporal stores, so that the faulting sub-page and its
    /// neighbours are in cache when the access resumes. This keeps the point of
    /// Linux's left-right narrowing while clearing in multi-page extents. With
    /// [`ClearStrategy::PageAtATime`] the order is Linux's `process_huge_page()`
    /// exactly. `Auto` decides on the size of the whole huge page (a 1 GiB page
    /// streams, a 2 MiB one uses `rep stosb`).
    ///
    /// # Safety
    /// `base` must be valid for writes of `nr_pages * 4096` bytes, with no live
    /// reference to them; `yield_fn` must not touch the range.
    pub unsafe fn clear_huge_page(
        &self,
        base: *mut u8,
        nr_pages: usize,
        fault_index: usize,
        yield_fn: &mut dyn FnMut(),
    ) -> usize {
        let mut r = Runner::new(self.chunk(), yield_fn, None);
        // SAFETY: forwarded from the caller.
        unsafe { self.huge(&mut r, base, nr_pages, fault_index) };
        r.finish().yields
    }

    /// # Safety
    /// As [`clear_huge_page`](Self::clear_huge_page).
    unsafe fn huge(&self, r: &mut Runner<'_>, base: *mut u8, nr_pages: usize, fault_index: usize) {
        if nr_pages == 0 {
            return;
        }
        let kernel = Kernel::for_strategy(self.strategy, nr_pages * PAGE_SIZE);
        if kernel == Kernel::Pages {
            // Linux's process_huge_page() order, one sub-page at a time.
            for i in LegacyOrder::new(nr_pages, fault_index) {
                // SAFETY: i < nr_pages, so the sub-page lies inside the huge page.
                unsafe { r.forward(base.add(i * PAGE_SIZE), PAGE_SIZE, Kernel::Pages) };
            }
            return;
        }
        let f = fault_index.min(nr_pages - 1);
        let (lo, hi) = fault_window(nr_pages, f, self.window_pages);
        let near = kernel.temporal();
        let at = |i: usize| base.wrapping_add(i * PAGE_SIZE);
        // SAFETY: [0, lo), [hi, nr), [lo, f), [f + 1, hi) and [f, f + 1) partition
        // the sub-pages (lo <= f < hi <= nr), all inside [base, base + nr * 4096).
        unsafe {
            // Behind the fault first, forwards: what is next to the window is last.
            r.forward(base, lo * PAGE_SIZE, kernel);
            // Ahead of the fault, from the far end back: the sub-pages right after
            // the window, which a sequential access reaches next, are cleared last.
            r.backward(at(hi), (nr_pages - hi) * PAGE_SIZE, kernel);
            if matches!(kernel, Kernel::Nt(_)) {
                self.prefetch_hot(base, nr_pages, lo, hi);
            }
            // The window with temporal stores, so it is cached when the access
            // resumes; the faulting sub-page itself last of all.
            r.forward(at(lo), (f - lo) * PAGE_SIZE, near);
            r.forward(at(f + 1), (hi - f - 1) * PAGE_SIZE, near);
            r.forward(at(f), PAGE_SIZE, near);
        }
    }
}

impl ChunkedClear {
    /// Prefetches for writing the hot lines of the sub-pages outside the window
    /// `[lo, hi)`: those after it first (a sequential access goes there next), then
    /// those before it, [`HOT_PREFETCH_PAGES`] at most. Only addresses inside the
    /// huge page are computed; a prefetch is a hint and never faults.
    fn prefetch_hot(&self, base: *mut u8, nr_pages: usize, lo: usize, hi: usize) {
        let lines = hot_lines(self.hot_offset, self.hot_len);
        if lines.is_empty() {
            return;
        }
        let after = nr_pages.min(hi + HOT_PREFETCH_PAGES).saturating_sub(hi);
        let before = lo.min(HOT_PREFETCH_PAGES - after);
        // The lines computed once, a plain loop per side (see `prefetch_pages`).
        prefetch_pages(base.wrapping_add(hi * PAGE_SIZE), after, false, &lines);
        prefetch_pages(base.wrapping_add(lo * PAGE_SIZE), before, true, &lines);
    }
}

/// Zero `len` bytes at `p` with `strategy` in chunks of `chunk_bytes` (0:
/// [`DEFAULT_CLEAR_CHUNK`]), calling `yield_fn` between chunks; each chunk is timed
/// with `now_ns` (monotonic nanoseconds) and the longest stretch without a yield
/// point is reported. `Auto` decides on the whole `len`.
///
/// # Safety
/// As [`clear_pages_with`](super::clear_pages_with); `yield_fn` must not touch the
/// range.
pub unsafe fn clear_chunked_timed(
    p: *mut u8,
    len: usize,
    strategy: ClearStrategy,
    chunk_bytes: usize,
    yield_fn: &mut dyn FnMut(),
    now_ns: fn() -> u64,
) -> ChunkedClearStats {
    let c = ChunkedClear::new(strategy).with_chunk_bytes(chunk_bytes);
    let mut r = Runner::new(c.chunk(), yield_fn, Some(now_ns));
    // SAFETY: forwarded from the caller.
    unsafe { r.forward(p, len, Kernel::for_strategy(strategy, len)) };
    r.finish()
}

/// The window of sub-pages `[lo, hi)` that a huge page clear leaves for last: up to
/// `window_pages` (at least 1) sub-pages with `fault_index` (clamped to the last
/// sub-page) inside, a little more after it than before, shifted inwards at the ends.
fn fault_window(nr_pages: usize, fault_index: usize, window_pages: usize) -> (usize, usize) {
    if nr_pages == 0 {
        return (0, 0);
    }
    let f = fault_index.min(nr_pages - 1);
    let w = window_pages.clamp(1, nr_pages);
    let lo = f.saturating_sub((w - 1) / 2).min(nr_pages - w);
    (lo, lo + w)
}

/// Linux's `process_huge_page()` visiting order: if the target is in the first half,
/// the sub-pages from the end down to `2 * n`, else those from the start up to the
/// symmetric base; then the rest left, right, left, right, converging on the target,
/// which comes last.
struct LegacyOrder {
    nr: usize,
    base: usize,
    l: usize,
    /// Position in the whole sequence.
    k: usize,
    /// Length of the first (one-sided) part.
    first: usize,
    target_low: bool,
}

impl LegacyOrder {
    fn new(nr: usize, target: usize) -> Self {
        let n = target.min(nr.saturating_sub(1));
        if 2 * n <= nr {
            LegacyOrder {
                nr,
                base: 0,
                l: n,
                k: 0,
                first: nr - 2 * n,
                target_low: true,
            }
        } else {
            let base = nr - 2 * (nr - n);
            LegacyOrder {
                nr,
                base,
                l: nr - n,
                k: 0,
                first: base,
                target_low: false,
            }
        }
    }
}

impl Iterator for LegacyOrder {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let k = self.k;
        if k >= self.first + 2 * self.l {
            return None;
        }
        self.k += 1;
        if k < self.first {
            return Some(if self.target_low { self.nr - 1 - k } else { k });
        }
        let j = k - self.first;
        let i = j / 2;
        Some(if j & 1 == 0 {
            self.base + i
        } else {
            self.base + 2 * self.l - 1 - i
        })
    }
}

/// Drives chunked clearing: a byte budget until the next yield point, shared by all
/// pieces of one operation, and the optional timing of each stretch.
struct Runner<'a> {
    chunk: usize,
    budget: usize,
    yield_fn: &'a mut dyn FnMut(),
    now_ns: Option<fn() -> u64>,
    start: u64,
    seg_start: u64,
    stats: ChunkedClearStats,
}

impl<'a> Runner<'a> {
    fn new(chunk: usize, yield_fn: &'a mut dyn FnMut(), now_ns: Option<fn() -> u64>) -> Self {
        let start = now_ns.map_or(0, |f| f());
        Runner {
            chunk,
            budget: chunk,
            yield_fn,
            now_ns,
            start,
            seg_start: start,
            stats: ChunkedClearStats::default(),
        }
    }

    fn yield_point(&mut self) {
        if let Some(now) = self.now_ns {
            let gap = now().saturating_sub(self.seg_start);
            self.stats.max_gap_ns = self.stats.max_gap_ns.max(gap);
        }
        (self.yield_fn)();
        self.stats.yields += 1;
        if let Some(now) = self.now_ns {
            self.seg_start = now();
        }
        self.budget = self.chunk;
    }

    /// Clear `[p, p + len)` front to back.
    ///
    /// # Safety
    /// `p` must be valid for writes of `len` bytes.
    unsafe fn forward(&mut self, p: *mut u8, len: usize, kernel: Kernel) {
        let mut off = 0;
        while off < len {
            if self.budget == 0 {
                self.yield_point();
            }
            let n = (len - off).min(self.budget);
            // SAFETY: off + n <= len, so [p + off, p + off + n) is inside the range.
            unsafe { kernel.run(p.add(off), n) };
            off += n;
            self.budget -= n;
            self.stats.bytes += n;
        }
    }

    /// Clear `[p, p + len)` in chunks taken from the end towards the start.
    ///
    /// # Safety
    /// `p` must be valid for writes of `len` bytes.
    unsafe fn backward(&mut self, p: *mut u8, len: usize, kernel: Kernel) {
        let mut end = len;
        while end > 0 {
            if self.budget == 0 {
                self.yield_point();
            }
            let n = end.min(self.budget);
            // SAFETY: n <= end <= len, so [p + end - n, p + end) is inside the range.
            unsafe { kernel.run(p.add(end - n), n) };
            end -= n;
            self.budget -= n;
            self.stats.bytes += n;
        }
    }

    fn finish(mut self) -> ChunkedClearStats {
        if self.stats.bytes > 0 {
            self.stats.chunks = self.stats.yields + 1;
        }
        if let Some(now) = self.now_ns {
            let t = now();
            if self.stats.bytes > 0 {
                self.stats.max_gap_ns = self.stats.max_gap_ns.max(t.saturating_sub(self.seg_start));
            }
            self.stats.total_ns = t.saturating_sub(self.start);
        }
        self.stats
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::super::tests::{check_exact, exact_range, Aligned};
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// `clear_chunked_timed` without a clock: the number of yields.
    ///
    /// # Safety
    /// As `clear_chunked_timed`.
    unsafe fn clear_chunked(
        p: *mut u8,
        len: usize,
        s: ClearStrategy,
        chunk: usize,
        yield_fn: &mut dyn FnMut(),
    ) -> usize {
        // SAFETY: forwarded from the caller.
        unsafe { clear_chunked_timed(p, len, s, chunk, yield_fn, || 0).yields }
    }

    #[test]
    fn clear_chunked_exact_range() {
        for s in ClearStrategy::ALL {
            for chunk in [1, 64, 100, 4096] {
                exact_range(s.name(), &|b| {
                    // SAFETY: an exclusive slice is writable for its length.
                    unsafe { clear_chunked(b.as_mut_ptr(), b.len(), s, chunk, &mut || {}) };
                });
            }
        }
    }

    #[test]
    fn clear_chunked_yield_counts() {
        let mut a = Aligned::new(1 << 20, 0xAA);
        for s in ClearStrategy::ALL {
            for (len, chunk, want) in [
                (0usize, 4096usize, 0usize),
                (1, 4096, 0),
                (4096, 4096, 0),
                (4097, 4096, 1),
                (1 << 20, 4096, 255),
                (1 << 20, 1 << 16, 15),
                ((1 << 20) - 1, 1 << 16, 15),
                (1000, 1, 999),
                (1 << 20, 3000, (1 << 20) / 3000),
            ] {
                let buf = &mut a.buf()[..len];
                buf.fill(0xAA);
                let mut n = 0;
                // SAFETY: the slice is valid for writes of len bytes.
                let yields =
                    unsafe { clear_chunked(buf.as_mut_ptr(), len, s, chunk, &mut || n += 1) };
                assert_eq!((yields, n), (want, want), "{s} len={len} chunk={chunk}");
                assert!(buf.iter().all(|&b| b == 0));
            }
        }
    }

    static FAKE_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    fn fake_now() -> u64 {
        // Every reading advances the clock by 10 ns.
        FAKE_NS.fetch_add(10, std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn clear_chunked_timed_reports_gaps() {
        let mut v = vec![0xAAu8; 10 * 4096];
        let mut n = 0;
        // SAFETY: v is writable for its length.
        let st = unsafe {
            clear_chunked_timed(
                v.as_mut_ptr(),
                v.len(),
                ClearStrategy::MultiPage,
                4096,
                &mut || n += 1,
                fake_now,
            )
        };
        assert_eq!((st.bytes, st.chunks, st.yields, n), (10 * 4096, 10, 9, 9));
        // Each stretch is bracketed by two consecutive clock readings: 10 ns.
        assert_eq!(st.max_gap_ns, 10);
        // Readings: start, 2 per yield, end: (1 + 18 + 1) readings, 19 steps.
        assert_eq!(st.total_ns, 190);
        assert!(v.iter().all(|&b| b == 0));
        // A clock that stands still.
        // SAFETY: v is writable for its length.
        let st = unsafe {
            clear_chunked_timed(
                v.as_mut_ptr(),
                v.len(),
                ClearStrategy::Auto,
                0,
                &mut || {},
                || 5,
            )
        };
        assert_eq!(
            (st.chunks, st.yields, st.max_gap_ns, st.total_ns),
            (1, 0, 0, 0)
        );
        // SAFETY: nothing is accessed with a zero length.
        let st = unsafe {
            clear_chunked_timed(
                v.as_mut_ptr(),
                0,
                ClearStrategy::Auto,
                0,
                &mut || {},
                fake_now,
            )
        };
        assert_eq!(
            (st.bytes, st.chunks, st.yields, st.max_gap_ns),
            (0, 0, 0, 0)
        );
    }

    #[test]
    fn clear_huge_page_all_subpages() {
        const NR: usize = 512;
        let mut a = Aligned::new(NR * PAGE_SIZE + 2 * PAGE_SIZE, 0xAA);
        for s in ClearStrategy::ALL {
            for fault in [0usize, 511, 200, 256, 255, 3, 509, 10_000] {
                for (chunk, hot) in [
                    (0usize, 0..0),
                    (4096, 0..1),
                    (12345, 4000..9000),
                    (1 << 20, 100..300),
                ] {
                    let buf = a.buf();
                    buf.fill(0xAA);
                    let mut n = 0;
                    // Hot lines (prefetched after streaming stores) change nothing.
                    let c = ChunkedClear::new(s)
                        .with_chunk_bytes(chunk)
                        .with_window_pages(fault % 9)
                        .with_hot(hot.start, hot.len());
                    // SAFETY: NR sub-pages starting one page in lie inside the buffer.
                    let yields = unsafe {
                        c.clear_huge_page(buf.as_mut_ptr().add(PAGE_SIZE), NR, fault, &mut || {
                            n += 1
                        })
                    };
                    check_exact(
                        buf,
                        PAGE_SIZE,
                        NR * PAGE_SIZE,
                        &std::format!("{s} fault={fault}"),
                    );
                    let chunk = if chunk == 0 {
                        DEFAULT_CLEAR_CHUNK
                    } else {
                        chunk
                    };
                    assert_eq!(
                        yields,
                        (NR * PAGE_SIZE).div_ceil(chunk) - 1,
                        "{s} chunk={chunk}"
                    );
                    assert_eq!(n, yields);
                }
            }
        }
        // The default clear, 1 GiB-style geometry in miniature, and nr_pages = 0.
        for fault in [0usize, 511, 200] {
            let buf = a.buf();
            buf.fill(0xAA);
            // SAFETY: one page in is inside the buffer.
            let p = unsafe { buf.as_mut_ptr().add(PAGE_SIZE) };
            // SAFETY: 512 sub-pages starting one page in lie inside the buffer.
            unsafe { ChunkedClear::default().clear_huge_page(p, NR, fault, &mut || {}) };
            check_exact(buf, PAGE_SIZE, NR * PAGE_SIZE, "clear_huge_page");
            // SAFETY: zero sub-pages: nothing is written.
            unsafe { ChunkedClear::default().clear_huge_page(p, 0, fault, &mut || {}) };
        }
    }

    #[test]
    fn clear_huge_page_window_is_cleared_last() {
        // Track the order through the yield function: with 4 KiB chunks, after the
        // k-th yield exactly k + 1 sub-pages are cleared.
        const NR: usize = 64;
        for s in [
            ClearStrategy::MultiPage,
            ClearStrategy::NonTemporal,
            ClearStrategy::PageAtATime,
        ] {
            for fault in [0usize, 63, 20] {
                let mut v = vec![0xAAu8; NR * PAGE_SIZE];
                let p = v.as_mut_ptr();
                let mut order = Vec::new();
                let mut seen = [false; NR];
                let mut record = || {
                    for (i, s) in seen.iter_mut().enumerate() {
                        // SAFETY: reads the first byte of sub-page i of v while the
                        // clear is paused between chunks; no reference to v is live.
                        if !*s && unsafe { p.add(i * PAGE_SIZE).read() } == 0 {
                            *s = true;
                            order.push(i);
                        }
                    }
                };
                // SAFETY: v holds NR sub-pages.
                unsafe {
                    ChunkedClear::new(s)
                        .with_chunk_bytes(PAGE_SIZE)
                        .clear_huge_page(p, NR, fault, &mut record)
                };
                record();
                assert_eq!(order.len(), NR, "{s} fault={fault}");
                assert_eq!(
                    *order.last().unwrap(),
                    fault,
                    "{s} fault={fault}: {order:?}"
                );
                if s != ClearStrategy::PageAtATime {
                    let (lo, hi) = fault_window(NR, fault, FAULT_WINDOW_PAGES);
                    let tail: Vec<usize> = order[NR - (hi - lo)..].to_vec();
                    let want: Vec<usize> =
                        (lo..hi).filter(|&i| i != fault).chain([fault]).collect();
                    assert_eq!(tail, want, "{s} fault={fault}");
                    // Just before the window: the sub-page next to it on the right
                    // (or on the left when the window is at the right end).
                    let before = order[NR - (hi - lo) - 1];
                    assert_eq!(
                        before,
                        if hi < NR { hi } else { lo - 1 },
                        "{s} fault={fault}"
                    );
                }
            }
        }
    }

    #[test]
    fn fault_window_at_the_ends() {
        assert_eq!(fault_window(512, 0, 8), (0, 8));
        assert_eq!(fault_window(512, 511, 8), (504, 512));
        assert_eq!(fault_window(512, 200, 8), (197, 205));
        assert_eq!(fault_window(512, 9999, 8), (504, 512));
        assert_eq!(fault_window(4, 2, 8), (0, 4));
        assert_eq!(fault_window(512, 7, 0), (7, 8));
        assert_eq!(fault_window(0, 0, 8), (0, 0));
    }

    #[test]
    fn legacy_order_matches_process_huge_page() {
        // Reference: Linux's loops, transcribed literally.
        fn reference(nr: usize, n: usize) -> Vec<usize> {
            let mut out = Vec::new();
            let (base, l);
            if 2 * n <= nr {
                base = 0;
                l = n;
                let mut i = nr as isize - 1;
                while i >= (2 * n) as isize {
                    out.push(i as usize);
                    i -= 1;
                }
            } else {
                base = nr - 2 * (nr - n);
                l = nr - n;
                out.extend(0..base);
            }
            for i in 0..l {
                out.push(base + i);
                out.push(base + 2 * l - 1 - i);
            }
            out
        }
        for nr in [1usize, 2, 3, 8, 512] {
            for n in 0..nr {
                let got: Vec<usize> = LegacyOrder::new(nr, n).collect();
                assert_eq!(got, reference(nr, n), "nr={nr} n={n}");
                let mut sorted = got.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..nr).collect::<Vec<_>>());
                assert_eq!(*got.last().unwrap(), n);
            }
        }
    }
}
