//! The clearing kernels: what actually writes the zeros.
//!
//! - page at a time: one `rep stosb` (with ERMS, else `rep stosq`) per 4 KiB page,
//!   Linux's `clear_page()`;
//! - multi-page: one `rep stosb` over the whole range;
//! - non-temporal: streaming stores (`movntdq`, `vmovntdq` ymm or zmm, the widest
//!   the CPU and OS support) over the 64-byte aligned body, plain stores for the head
//!   and tail, then `sfence`; a batch of pages may share one `sfence`.
//!
//! [`Kernel`] is a strategy with everything decided (what one chunk runs), so the
//! entry points (`mod.rs`) and the chunked huge-page clear (`huge.rs`) dispatch
//! through it. Off x86_64 every kernel is `core::ptr::write_bytes`.
//!
//! Invariants: a kernel writes zeros to exactly `[p, p + len)` and nothing else, for
//! any alignment and length; a zero length touches nothing (`p` may be null); after
//! a fenced non-temporal kernel returns, its stores are ordered before later stores.
//! No shared state and no lock: the caller owns the memory.

#[cfg(target_arch = "x86_64")]
use core::ops::Range;

use super::cpu::cpu_clear_caps;
#[cfg(target_arch = "x86_64")]
use super::cpu::has_erms;
use super::{ClearStrategy, NtKind};
use crate::page::PAGE_SIZE;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::asm;

    /// `rep stosb`: zero `len` bytes at `p`.
    ///
    /// # Safety
    /// `p` must be valid for writes of `len` bytes.
    #[inline]
    pub(super) unsafe fn rep_stosb(p: *mut u8, len: usize) {
        // SAFETY: the caller guarantees [p, p + len) is writable. `rep stosb` writes
        // exactly RCX bytes from RDI upwards (DF is clear per the ABI) and changes no
        // flags; RCX and RDI are declared clobbered.
        unsafe {
            asm!("rep stosb", inout("rcx") len => _, inout("rdi") p => _, in("al") 0u8,
                 options(nostack, preserves_flags));
        }
    }

    /// `rep stosq`: zero `qwords * 8` bytes at `p`.
    ///
    /// # Safety
    /// `p` must be valid for writes of `qwords * 8` bytes.
    #[inline]
    pub(super) unsafe fn rep_stosq(p: *mut u8, qwords: usize) {
        // SAFETY: as for `rep_stosb`, with RCX quadwords written.
        unsafe {
            asm!("rep stosq", inout("rcx") qwords => _, inout("rdi") p => _, in("rax") 0u64,
                 options(nostack, preserves_flags));
        }
    }

    /// Store fence: orders the preceding streaming stores before later stores.
    #[inline]
    pub(super) fn sfence() {
        // SAFETY: SFENCE has no operands and only orders stores; it is part of the
        // x86_64 baseline. Not `nomem`: it must act as a compiler barrier too.
        unsafe { asm!("sfence", options(nostack, preserves_flags)) }
    }

    /// Prefetch the cache line at `p` with intent to write (`prefetchw`; a hint:
    /// any address is allowed, and CPUs without the instruction treat it as a
    /// NOP).
    #[inline]
    pub(super) fn prefetchw(p: *const u8) {
        // SAFETY: PREFETCHW only hints the cache; it never faults, whatever the
        // address, and changes no register or flag.
        unsafe { asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly)) }
    }

    /// Write back and evict the cache lines covering `[p, p + len)`
    /// (`clflushopt` when `opt`, else `clflush`), then `sfence`.
    ///
    /// # Safety
    /// `[p, p + len)` must be mapped (a flush of an unmapped address faults); with
    /// `opt` the CPU must have `clflushopt`.
    pub(super) unsafe fn flush_lines(p: *const u8, len: usize, opt: bool) {
        let start = (p as usize) & !63;
        let end = p as usize + len;
        let mut a = start;
        while a < end {
            // SAFETY: the line at `a` overlaps [p, p + len), which the caller
            // says is mapped; a flush changes no data, only where it lives.
            unsafe {
                if opt {
                    asm!("clflushopt [{}]", in(reg) a, options(nostack, preserves_flags));
                } else {
                    asm!("clflush [{}]", in(reg) a, options(nostack, preserves_flags));
                }
            }
            a += 64;
        }
        sfence();
    }

    /// SSE2 streaming stores over `[p, p + len)`.
    ///
    /// # Safety
    /// `p` must be 64-byte aligned and valid for writes of `len` bytes; `len` a
    /// multiple of 64.
    pub(super) unsafe fn nt_sse2(p: *mut u8, len: usize) {
        use core::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_stream_si128};
        // SAFETY: SSE2 is baseline on x86_64. Each store is 16 bytes at a 16-byte
        // aligned address (p is 64-aligned, offsets are multiples of 16) inside
        // [p, p + len) because len is a multiple of 64.
        unsafe {
            let z = _mm_setzero_si128();
            let mut q = p;
            let end = p.add(len);
            while q < end {
                _mm_stream_si128(q as *mut __m128i, z);
                _mm_stream_si128(q.add(16) as *mut __m128i, z);
                _mm_stream_si128(q.add(32) as *mut __m128i, z);
                _mm_stream_si128(q.add(48) as *mut __m128i, z);
                q = q.add(64);
            }
        }
    }

    /// AVX2-width streaming stores (`vmovntdq ymm`) over `[p, p + len)`.
    ///
    /// # Safety
    /// As [`nt_sse2`], and the CPU and OS must support AVX2 ([`ClearCaps::avx2`]).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn nt_avx2(p: *mut u8, len: usize) {
        use core::arch::x86_64::{__m256i, _mm256_setzero_si256, _mm256_stream_si256};
        // SAFETY: the caller checked AVX2 support. Each store is 32 bytes at a
        // 32-byte aligned address inside [p, p + len) (p 64-aligned, len a multiple
        // of 64).
        unsafe {
            let z = _mm256_setzero_si256();
            let mut q = p;
            let end = p.add(len);
            while q < end {
                _mm256_stream_si256(q as *mut __m256i, z);
                _mm256_stream_si256(q.add(32) as *mut __m256i, z);
                q = q.add(64);
            }
        }
    }

    /// AVX-512 streaming stores (`vmovntdq zmm`) over `[p, p + len)`.
    ///
    /// Written in inline assembly rather than as a `#[target_feature(enable =
    /// "avx512f")]` function with `_mm512_stream_si512`: both became stable only in
    /// Rust 1.89, after the workspace's MSRV. The assembler takes the instructions
    /// regardless of enabled features; the block clobbers every vector register
    /// (`clobber_abi("C")`), which makes its closing `vzeroupper` sound.
    ///
    /// # Safety
    /// As [`nt_sse2`], and the CPU and OS must support AVX-512F
    /// ([`ClearCaps::avx512f`]).
    pub(super) unsafe fn nt_avx512(p: *mut u8, len: usize) {
        let blocks4 = len / 256;
        let blocks1 = (len % 256) / 64;
        // SAFETY: the caller checked AVX-512F support (CPUID and XCR0). The loops
        // store 64 bytes at 64-byte aligned addresses: 4 * blocks4 + blocks1 stores
        // = len / 64, all inside [p, p + len). Registers used are declared; the
        // flags are clobbered (no preserves_flags); memory is written (no nomem).
        unsafe {
            asm!(
                "vpxord zmm0, zmm0, zmm0",
                "test rcx, rcx",
                "jz 3f",
                "2:",
                "vmovntdq zmmword ptr [rdi], zmm0",
                "vmovntdq zmmword ptr [rdi + 64], zmm0",
                "vmovntdq zmmword ptr [rdi + 128], zmm0",
                "vmovntdq zmmword ptr [rdi + 192], zmm0",
                "add rdi, 256",
                "dec rcx",
                "jnz 2b",
                "3:",
                "test rdx, rdx",
                "jz 5f",
                "4:",
                "vmovntdq zmmword ptr [rdi], zmm0",
                "add rdi, 64",
                "dec rdx",
                "jnz 4b",
                "5:",
                "vzeroupper",
                inout("rdi") p => _,
                inout("rcx") blocks4 => _,
                inout("rdx") blocks1 => _,
                clobber_abi("C"),
                options(nostack),
            );
        }
    }
}

/// A strategy with everything decided: what one chunk of work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    Pages,
    Multi,
    Nt(NtKind),
}

impl Kernel {
    /// `strategy` for an operation of `total` bytes.
    pub(super) fn for_strategy(strategy: ClearStrategy, total: usize) -> Kernel {
        match strategy.resolve(total) {
            ClearStrategy::PageAtATime => Kernel::Pages,
            ClearStrategy::NonTemporal => Kernel::Nt(cpu_clear_caps().nt_kind),
            _ => Kernel::Multi,
        }
    }

    /// The temporal kernel of the same family (for the window that must stay cached).
    pub(super) fn temporal(self) -> Kernel {
        match self {
            Kernel::Pages => Kernel::Pages,
            _ => Kernel::Multi,
        }
    }

    /// # Safety
    /// `p` must be valid for writes of `len` bytes.
    #[inline]
    pub(super) unsafe fn run(self, p: *mut u8, len: usize) {
        if len == 0 {
            return; // `p` may then be anything, even null
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Kernel::Pages => clear_page_at_a_time(p, len),
                Kernel::Multi => clear_multi(p, len),
                Kernel::Nt(kind) => clear_nt(p, len, kind),
            }
        }
    }
}

/// One 4 KiB page, the page-at-a-time kernel.
///
/// # Safety
/// `p` must be valid for writes of 4096 bytes.
#[inline]
pub(super) unsafe fn clear_one_page(p: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees [p, p + 4096) is writable; 512 quadwords are
    // 4096 bytes.
    unsafe {
        if has_erms() {
            x86::rep_stosb(p, PAGE_SIZE);
        } else {
            x86::rep_stosq(p, PAGE_SIZE / 8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller guarantees [p, p + 4096) is writable.
    unsafe {
        core::ptr::write_bytes(p, 0, PAGE_SIZE);
    }
}

/// Page-at-a-time over any range: 4 KiB pieces from `p`, the remainder with plain
/// stores.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes.
unsafe fn clear_page_at_a_time(p: *mut u8, len: usize) {
    let full = len / PAGE_SIZE;
    // SAFETY: page i covers [p + i*4096, p + (i+1)*4096) and i < full, so it lies in
    // [p, p + len); the tail [p + full*4096, p + len) does too.
    unsafe {
        for i in 0..full {
            clear_one_page(p.add(i * PAGE_SIZE));
        }
        core::ptr::write_bytes(p.add(full * PAGE_SIZE), 0, len - full * PAGE_SIZE);
    }
}

/// One `rep stosb` over the range (`write_bytes` off x86_64).
///
/// # Safety
/// `p` must be valid for writes of `len` bytes.
#[inline]
unsafe fn clear_multi(p: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        x86::rep_stosb(p, len);
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        core::ptr::write_bytes(p, 0, len);
    }
}

/// Streaming stores over the 64-byte aligned body, plain stores for head and tail,
/// then `sfence`. `kind` is lowered to what the CPU supports.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes.
pub(super) unsafe fn clear_nt(p: *mut u8, len: usize, kind: NtKind) {
    if len == 0 {
        return; // `p` may then be anything, even null
    }
    let kind = kind.min(cpu_clear_caps().nt_kind);
    if kind == NtKind::Plain {
        // SAFETY: forwarded from the caller.
        unsafe { clear_multi(p, len) }
    } else {
        // SAFETY: forwarded from the caller; `kind` is supported (lowered above).
        unsafe { clear_nt_streaming(p, len, kind) }
    }
}

/// # Safety
/// `p` must be valid for writes of `len` bytes; `kind` at most the detected
/// `nt_kind` and not `Plain`.
#[cfg(target_arch = "x86_64")]
unsafe fn clear_nt_streaming(p: *mut u8, len: usize, kind: NtKind) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_nt_unfenced(p, len, kind) };
    x86::sfence();
}

/// Streaming stores over the aligned body of `[p, p + len)`, plain stores for head
/// and tail, and no fence: the streaming stores stay weakly ordered until the
/// caller's `sfence`.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes; `kind` at most the detected
/// `nt_kind` and not `Plain`.
#[cfg(target_arch = "x86_64")]
unsafe fn clear_nt_unfenced(p: *mut u8, len: usize, kind: NtKind) {
    let head = p.align_offset(64).min(len);
    let body = (len - head) & !63;
    let tail = len - head - body;
    // SAFETY: head, body and tail partition [p, p + len). The body starts at a
    // 64-byte aligned address and its length is a multiple of 64, as the
    // streaming kernels require; `kind` is at most the detected `nt_kind`, so
    // the CPU and OS support its instructions.
    unsafe {
        // Checked, not called with 0: a page-aligned page (the fault path's
        // case) then makes no call besides its streaming loop.
        if head != 0 {
            core::ptr::write_bytes(p, 0, head);
        }
        let b = p.add(head);
        match kind {
            NtKind::Avx512 => x86::nt_avx512(b, body),
            NtKind::Avx2 => x86::nt_avx2(b, body),
            _ => x86::nt_sse2(b, body),
        }
        if tail != 0 {
            core::ptr::write_bytes(b.add(body), 0, tail);
        }
    }
}

/// Never reached (the detected `nt_kind` is `Plain` here); plain stores.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clear_nt_streaming(p: *mut u8, len: usize, _kind: NtKind) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_multi(p, len) }
}

/// Writes back and evicts from every cache level the lines covering
/// `[p, p + len)` (for measurements that need cold lines; nothing off x86_64).
///
/// # Safety
/// `[p, p + len)` must be mapped.
pub(super) unsafe fn flush_cache_range(p: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller; `clflushopt` only where CPUID has it.
    unsafe {
        x86::flush_lines(p, len, super::cpu::has_clflushopt())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The cache lines of a 4 KiB page that cover its bytes `[offset, offset +
/// len)` (clipped to the page), as the line-aligned byte range `first..end` of
/// the page (empty when nothing of it is inside the page).
#[inline]
pub(super) fn hot_lines(offset: usize, len: usize) -> Range<usize> {
    let first = offset.min(PAGE_SIZE) & !63;
    let end = offset.saturating_add(len).min(PAGE_SIZE);
    first..end.max(first)
}

/// Prefetches for writing the cache lines at `page + lines.start` up to
/// `page + lines.end`, one per 64 bytes (`lines` from [`hot_lines`]). A
/// prefetch is a hint that never faults, so `page` may be any address;
/// elsewhere than on x86_64, nothing is done.
#[inline(always)]
pub(super) fn prefetch_lines(page: *mut u8, lines: &Range<usize>) {
    let mut off = lines.start;
    while off < lines.end {
        prefetch_line(page.wrapping_add(off));
        off += 64;
    }
}

/// `prefetchw` of the line at `p` (nothing elsewhere than on x86_64).
#[inline(always)]
fn prefetch_line(p: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetchw(p);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`prefetch_lines`] for `n` consecutive 4 KiB pages: from `page` upwards, or
/// when `down` from the page below `page` downwards. Plain pointer loops, one
/// prefetch per page for a single hot line: this runs for up to 512 sub-pages
/// of every huge-page fault, where an iterator's set-up per page would cost
/// more than the prefetch.
#[inline]
pub(super) fn prefetch_pages(page: *mut u8, n: usize, down: bool, lines: &Range<usize>) {
    let single = lines.end.saturating_sub(lines.start) <= 64;
    let mut p = page;
    match (single, down) {
        (true, false) => {
            let mut q = p.wrapping_add(lines.start);
            for _ in 0..n {
                prefetch_line(q);
                q = q.wrapping_add(PAGE_SIZE);
            }
        }
        (true, true) => {
            let mut q = p.wrapping_add(lines.start);
            for _ in 0..n {
                q = q.wrapping_sub(PAGE_SIZE);
                prefetch_line(q);
            }
        }
        (false, false) => {
            for _ in 0..n {
                prefetch_lines(p, lines);
                p = p.wrapping_add(PAGE_SIZE);
            }
        }
        (false, true) => {
            for _ in 0..n {
                p = p.wrapping_sub(PAGE_SIZE);
                prefetch_lines(p, lines);
            }
        }
    }
}

/// Streaming stores over every 4 KiB page of `pages`, one `sfence` for the batch,
/// then the cache lines covering the byte offsets `hot` of every page prefetched
/// for writing (see `clear_page_batch`).
///
/// # Safety
/// Every pointer must be valid for writes of 4096 bytes, the pages must not
/// overlap; `kind` at most the detected `nt_kind` and not `Plain`.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn clear_page_batch_nt<I>(pages: I, kind: NtKind, hot: Range<usize>)
where
    I: Iterator<Item = *mut u8> + Clone,
{
    for p in pages.clone() {
        // SAFETY: forwarded from the caller.
        unsafe { clear_nt_unfenced(p, PAGE_SIZE, kind) };
    }
    x86::sfence();
    let lines = hot_lines(hot.start, hot.end.saturating_sub(hot.start));
    for p in pages {
        prefetch_lines(p, &lines);
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn hot_lines_cover_the_bytes_clipped_to_the_page() {
        assert_eq!(hot_lines(0, 1), 0..1);
        assert_eq!(hot_lines(100, 1), 64..101);
        assert_eq!(hot_lines(4095, 10), 4032..4096);
        assert_eq!(hot_lines(60, 10), 0..70);
        assert!(hot_lines(0, 0).is_empty());
        assert!(hot_lines(5000, 1).is_empty());
        assert!(hot_lines(usize::MAX, usize::MAX).is_empty());
    }

    #[test]
    fn prefetching_pages_changes_no_byte() {
        // Prefetches are hints: whatever the direction and lines, the bytes stay.
        let mut buf = std::vec![0xa5u8; 8 * PAGE_SIZE];
        let base = buf.as_mut_ptr();
        for lines in [
            hot_lines(0, 1),
            hot_lines(100, 300),
            hot_lines(0, PAGE_SIZE),
        ] {
            prefetch_pages(base, 8, false, &lines);
            prefetch_pages(base.wrapping_add(8 * PAGE_SIZE), 8, true, &lines);
            prefetch_pages(base, 0, true, &lines);
        }
        assert!(buf.iter().all(|&b| b == 0xa5));
    }
}
