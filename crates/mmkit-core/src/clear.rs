//! Page-clearing kernels: zeroing 4 KiB pages, multi-page extents and huge pages.
//!
//! Every page handed out with `Gfp::ZERO`, and every page installed by a demand fault,
//! is cleared first; for huge pages (2 MiB, 1 GiB) clearing is most of the fault's
//! cost. This module holds the kernels and the policies around them, after the Linux
//! series "x86/clear_huge_page: multi-page clearing" (seeds/001):
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
//! [`clear_chunked`]; the series did this with `TIF_ALLOW_RESCHED`), and the huge
//! page order ([`clear_huge_page`]) that clears a small window around the faulting
//! sub-page last, with temporal stores, so it is in cache when the access resumes.
//!
//! CPU features (ERMS, FSRM, AVX2, AVX-512F with OS support via XGETBV, the LLC size)
//! come from CPUID once and are cached in one atomic word ([`cpu_clear_caps`]). On
//! architectures other than x86_64 every kernel is `core::ptr::write_bytes`.
//!
//! Invariants: a kernel writes zeros to exactly `[p, p + len)` and nothing else, for
//! any alignment and length (heads and tails that the wide kernels cannot cover are
//! written with plain stores); a zero length is a no-op; after a non-temporal kernel
//! returns, its stores are ordered before later stores (`sfence`). There is no shared
//! state apart from the detection cache (idempotent, racing initialisations write the
//! same value), so no lock protects anything here: the caller owns the memory.

use core::fmt;
use core::ops::Range;

#[cfg(target_arch = "x86_64")]
use core::sync::atomic::{AtomicU64, Ordering};

/// Size of the page that [`clear_page`] clears and of a huge page's sub-page
/// (the crate's `PAGE_SIZE`).
pub const CLEAR_PAGE_SIZE: usize = 4096;
const PAGE_SIZE: usize = CLEAR_PAGE_SIZE;

/// Default bytes cleared between two yield points: the largest power of two that
/// stays under 1 ms on the reference machine (AMD EPYC, Zen 3/4 class): 8 MiB took
/// about 0.6 ms with temporal stores (chunked `rep stosb`, ~13 GB/s) and 0.3 ms with
/// streaming stores (~28 GB/s); 16 MiB took about 1.4 ms. A 1 GiB page yields 127
/// times.
pub const DEFAULT_CLEAR_CHUNK: usize = 8 << 20;

/// The last-level cache size assumed when CPUID does not report one.
pub const DEFAULT_LLC_BYTES: usize = 32 << 20;

/// Sub-pages around the faulting one that [`clear_huge_page`] clears last
/// (8 x 4 KiB = 32 KiB, an L1 data cache).
pub const FAULT_WINDOW_PAGES: usize = 8;

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
    /// `MultiPage` up to the LLC size, `NonTemporal` above it. (mmkit's fault
    /// path also clears the fault-around batch of a sparse first touch with
    /// `NonTemporal`, through [`clear_page_batch`].)
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

    /// What this strategy does for an operation of `len` bytes on this CPU: `Auto`
    /// becomes `MultiPage` or `NonTemporal`, the others stay as they are.
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

/// Which streaming-store kernel the non-temporal path uses (ordered by width).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NtKind {
    /// No streaming stores (not x86_64): plain stores.
    Plain,
    /// SSE2 `movntdq`, 16 bytes per store.
    Sse2,
    /// AVX2 `vmovntdq`, 32 bytes per store.
    Avx2,
    /// AVX-512F `vmovntdq`, 64 bytes per store.
    Avx512,
}

impl NtKind {
    /// Every kind, narrowest first.
    pub const ALL: [NtKind; 4] = [NtKind::Plain, NtKind::Sse2, NtKind::Avx2, NtKind::Avx512];

    /// Stable name: "plain", "sse2", "avx2", "avx512".
    pub const fn name(self) -> &'static str {
        match self {
            NtKind::Plain => "plain",
            NtKind::Sse2 => "sse2",
            NtKind::Avx2 => "avx2",
            NtKind::Avx512 => "avx512",
        }
    }

    #[cfg(target_arch = "x86_64")]
    const fn bits(self) -> u64 {
        match self {
            NtKind::Plain => 0,
            NtKind::Sse2 => 1,
            NtKind::Avx2 => 2,
            NtKind::Avx512 => 3,
        }
    }

    #[cfg(target_arch = "x86_64")]
    const fn from_bits(b: u64) -> NtKind {
        match b & 3 {
            0 => NtKind::Plain,
            1 => NtKind::Sse2,
            2 => NtKind::Avx2,
            _ => NtKind::Avx512,
        }
    }
}

impl fmt::Display for NtKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// ---------------------------------------------------------------------------------
// CPU detection
// ---------------------------------------------------------------------------------

/// What the clearing kernels found out about the CPU (for the lab to print).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClearCaps {
    /// Enhanced `rep movsb/stosb` (`CPUID.7.0:EBX[9]`).
    pub erms: bool,
    /// Fast short `rep movsb` (`CPUID.7.0:EDX[4]`).
    pub fsrm: bool,
    /// AVX2 present and its register state enabled by the OS (XCR0).
    pub avx2: bool,
    /// AVX-512F present and its register state enabled by the OS (XCR0).
    pub avx512f: bool,
    /// Size of the last-level cache as seen by one core, in bytes.
    pub llc_bytes: usize,
    /// `llc_bytes` came from CPUID (false: [`DEFAULT_LLC_BYTES`]).
    pub llc_detected: bool,
    /// The streaming-store kernel `NonTemporal` uses.
    pub nt_kind: NtKind,
}

impl fmt::Display for ClearCaps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yn = |b: bool| if b { "yes" } else { "no" };
        write!(
            f,
            "erms={} fsrm={} avx2={} avx512f={} llc={} KiB ({}) nt={}",
            yn(self.erms),
            yn(self.fsrm),
            yn(self.avx2),
            yn(self.avx512f),
            self.llc_bytes >> 10,
            if self.llc_detected {
                "cpuid"
            } else {
                "default"
            },
            self.nt_kind.name()
        )
    }
}

/// The CPU's clearing capabilities, detected on first use and cached.
#[cfg(target_arch = "x86_64")]
pub fn cpu_clear_caps() -> ClearCaps {
    // Relaxed is enough: the whole result lives in one word, and every thread that
    // detects computes the same value.
    let word = CAPS_WORD.load(Ordering::Relaxed);
    if word & CAPS_VALID != 0 {
        return decode_caps(word);
    }
    let caps = x86::detect();
    CAPS_WORD.store(encode_caps(&caps), Ordering::Relaxed);
    caps
}

/// The CPU's clearing capabilities (no detection on this architecture).
#[cfg(not(target_arch = "x86_64"))]
pub fn cpu_clear_caps() -> ClearCaps {
    ClearCaps {
        erms: false,
        fsrm: false,
        avx2: false,
        avx512f: false,
        llc_bytes: DEFAULT_LLC_BYTES,
        llc_detected: false,
        nt_kind: NtKind::Plain,
    }
}

// Cache word layout: bits 0..48 llc_bytes, 48 erms, 49 fsrm, 50 avx2, 51 avx512f,
// 52..54 nt_kind, 54 llc_detected, 63 valid.
#[cfg(target_arch = "x86_64")]
static CAPS_WORD: AtomicU64 = AtomicU64::new(0);
#[cfg(target_arch = "x86_64")]
const CAPS_VALID: u64 = 1 << 63;
#[cfg(target_arch = "x86_64")]
const LLC_MASK: u64 = (1 << 48) - 1;

#[cfg(target_arch = "x86_64")]
fn encode_caps(c: &ClearCaps) -> u64 {
    (c.llc_bytes as u64).min(LLC_MASK)
        | (c.erms as u64) << 48
        | (c.fsrm as u64) << 49
        | (c.avx2 as u64) << 50
        | (c.avx512f as u64) << 51
        | c.nt_kind.bits() << 52
        | (c.llc_detected as u64) << 54
        | CAPS_VALID
}

#[cfg(target_arch = "x86_64")]
fn decode_caps(w: u64) -> ClearCaps {
    ClearCaps {
        llc_bytes: (w & LLC_MASK) as usize,
        erms: w & (1 << 48) != 0,
        fsrm: w & (1 << 49) != 0,
        avx2: w & (1 << 50) != 0,
        avx512f: w & (1 << 51) != 0,
        nt_kind: NtKind::from_bits(w >> 52),
        llc_detected: w & (1 << 54) != 0,
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_erms() -> bool {
    cpu_clear_caps().erms
}

// ---------------------------------------------------------------------------------
// x86_64 kernels and detection
// ---------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ClearCaps, NtKind, DEFAULT_LLC_BYTES};
    use core::arch::asm;
    use core::arch::x86_64::{__cpuid_count, CpuidResult};

    fn cpuid(leaf: u32, sub: u32) -> CpuidResult {
        // `__cpuid_count` is an unsafe fn before Rust 1.87 (the workspace's MSRV is
        // older) and a safe one after; the block serves the older compilers.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86_64 CPU and only reads identification
        // registers; it has no memory effects.
        let r = unsafe { __cpuid_count(leaf, sub) };
        r
    }

    /// XCR0, the register-state components the OS saves and restores.
    fn xcr0() -> u64 {
        let (lo, hi): (u32, u32);
        // SAFETY: only called when CPUID.1:ECX.OSXSAVE[27] is set, so XGETBV is
        // enabled; ECX = 0 selects XCR0, which always exists. No memory is touched.
        unsafe {
            asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
                 options(nomem, nostack, preserves_flags));
        }
        (u64::from(hi) << 32) | u64::from(lo)
    }

    pub(super) fn detect() -> ClearCaps {
        let l0 = cpuid(0, 0);
        let max_leaf = l0.eax;
        let amd_like = (l0.ebx, l0.edx, l0.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163) // AuthenticAMD
            || (l0.ebx, l0.edx, l0.ecx) == (0x6f67_7948, 0x6e65_476e, 0x656e_6975); // HygonGenuine

        let (mut osxsave, mut avx) = (false, false);
        if max_leaf >= 1 {
            let l1 = cpuid(1, 0);
            osxsave = l1.ecx & (1 << 27) != 0;
            avx = l1.ecx & (1 << 28) != 0;
        }
        let (mut erms, mut fsrm, mut avx2, mut avx512f) = (false, false, false, false);
        if max_leaf >= 7 {
            let l7 = cpuid(7, 0);
            avx2 = l7.ebx & (1 << 5) != 0;
            erms = l7.ebx & (1 << 9) != 0;
            avx512f = l7.ebx & (1 << 16) != 0;
            fsrm = l7.edx & (1 << 4) != 0;
        }
        let xcr0 = if osxsave { xcr0() } else { 0 };
        // SSE (bit 1) and AVX (bit 2) state; AVX-512 adds opmask, ZMM_Hi256, Hi16_ZMM.
        let os_avx = xcr0 & 0b110 == 0b110;
        let os_avx512 = os_avx && xcr0 & 0b1110_0000 == 0b1110_0000;
        let avx2 = avx && avx2 && os_avx;
        let avx512f = avx512f && os_avx512;
        let nt_kind = if avx512f {
            NtKind::Avx512
        } else if avx2 {
            NtKind::Avx2
        } else {
            NtKind::Sse2 // SSE2 is part of the x86_64 baseline
        };

        let llc = if amd_like {
            llc_amd().or_else(|| llc_leaf(4, max_leaf >= 4))
        } else {
            llc_leaf(4, max_leaf >= 4).or_else(llc_amd)
        };
        ClearCaps {
            erms,
            fsrm,
            avx2,
            avx512f,
            llc_bytes: llc.unwrap_or(DEFAULT_LLC_BYTES),
            llc_detected: llc.is_some(),
            nt_kind,
        }
    }

    /// Largest data or unified cache described by a "deterministic cache
    /// parameters" leaf (Intel leaf 4, AMD leaf 0x8000_001D share the encoding).
    fn llc_leaf(leaf: u32, available: bool) -> Option<usize> {
        if !available {
            return None;
        }
        let mut best: Option<(u32, usize)> = None;
        for sub in 0..16 {
            let r = cpuid(leaf, sub);
            let kind = r.eax & 0x1f; // 0 none, 1 data, 2 instruction, 3 unified
            if kind == 0 {
                break;
            }
            if kind == 2 {
                continue;
            }
            let level = (r.eax >> 5) & 0x7;
            let line = (r.ebx & 0xfff) as usize + 1;
            let parts = ((r.ebx >> 12) & 0x3ff) as usize + 1;
            let ways = ((r.ebx >> 22) & 0x3ff) as usize + 1;
            let sets = r.ecx as usize + 1;
            let size = ways * parts * line * sets;
            let better = match best {
                None => true,
                Some((l, s)) => level > l || (level == l && size > s),
            };
            if better {
                best = Some((level, size));
            }
        }
        best.map(|(_, s)| s).filter(|&s| s > 0)
    }

    /// AMD: leaf 0x8000_001D when TOPOEXT is present, else the legacy L3/L2 fields
    /// of leaf 0x8000_0006.
    fn llc_amd() -> Option<usize> {
        let ext_max = cpuid(0x8000_0000, 0).eax;
        if (0x8000_001d..0x9000_0000).contains(&ext_max) {
            let topoext = cpuid(0x8000_0001, 0).ecx & (1 << 22) != 0;
            if let Some(s) = llc_leaf(0x8000_001d, topoext) {
                return Some(s);
            }
        }
        if (0x8000_0006..0x9000_0000).contains(&ext_max) {
            let r = cpuid(0x8000_0006, 0);
            let l3 = (r.edx >> 18) as usize * (512 << 10);
            let l2 = (r.ecx >> 16) as usize * 1024;
            return [l3, l2].into_iter().find(|&s| s > 0);
        }
        None
    }

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

// ---------------------------------------------------------------------------------
// The kernels (dispatch)
// ---------------------------------------------------------------------------------

/// A strategy with everything decided: what one chunk of work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Pages,
    Multi,
    Nt(NtKind),
}

impl Kernel {
    /// `strategy` for an operation of `total` bytes.
    fn for_strategy(strategy: ClearStrategy, total: usize) -> Kernel {
        match strategy.resolve(total) {
            ClearStrategy::PageAtATime => Kernel::Pages,
            ClearStrategy::NonTemporal => Kernel::Nt(cpu_clear_caps().nt_kind),
            _ => Kernel::Multi,
        }
    }

    /// The temporal kernel of the same family (for the window that must stay cached).
    fn temporal(self) -> Kernel {
        match self {
            Kernel::Pages => Kernel::Pages,
            _ => Kernel::Multi,
        }
    }

    /// # Safety
    /// `p` must be valid for writes of `len` bytes.
    #[inline]
    unsafe fn run(self, p: *mut u8, len: usize) {
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
unsafe fn clear_one_page(p: *mut u8) {
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
unsafe fn clear_nt(p: *mut u8, len: usize, kind: NtKind) {
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

// ---------------------------------------------------------------------------------
// Public one-shot API
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

/// Zero `len` bytes at `p` with [`ClearStrategy::Auto`] (the fault path's default):
/// `rep stosb` up to the LLC size, streaming stores above it. `len` is in bytes and
/// need not be a multiple of 4096.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes and no reference to those bytes may
/// be live during the call. Any alignment; with `len == 0` nothing is accessed and
/// `p` may be any value.
#[inline]
pub unsafe fn clear_pages(p: *mut u8, len: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_pages_with(p, len, ClearStrategy::Auto) }
}

/// Zero `len` bytes at `p` with `strategy`, in one go (no yield points).
///
/// # Safety
/// As [`clear_pages`].
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
            let pages = pages.into_iter();
            for p in pages.clone() {
                // SAFETY: forwarded from the caller; `kind` is supported and not
                // `Plain`.
                unsafe { clear_nt_unfenced(p, PAGE_SIZE, kind) };
            }
            x86::sfence();
            for p in pages {
                prefetch_hot_lines(p, hot.start, hot.end.saturating_sub(hot.start));
            }
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

/// Prefetches for writing the cache lines of the 4 KiB page at `page` that cover
/// its bytes `[offset, offset + len)` (clipped to the page). A prefetch is a hint
/// that never faults, so `page` may be any address; elsewhere than on x86_64,
/// nothing is done.
#[inline]
fn prefetch_hot_lines(page: *mut u8, offset: usize, len: usize) {
    let first = offset.min(PAGE_SIZE) & !63;
    let end = offset.saturating_add(len).min(PAGE_SIZE);
    for off in (first..end).step_by(64) {
        #[cfg(target_arch = "x86_64")]
        x86::prefetchw(page.wrapping_add(off));
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (page, off);
    }
}

/// Zero `len` bytes at `p` with the streaming-store kernel `kind` (lowered to the
/// widest one the CPU supports), for the lab's raw comparisons.
///
/// # Safety
/// As [`clear_pages`].
pub unsafe fn clear_pages_nt(p: *mut u8, len: usize, kind: NtKind) {
    // SAFETY: forwarded from the caller.
    unsafe { clear_nt(p, len, kind) }
}

/// Zero `buf` with `strategy`.
pub fn clear_bytes(buf: &mut [u8], strategy: ClearStrategy) {
    // SAFETY: an exclusive slice is valid for writes of its length and nothing else
    // refers to it while we hold it.
    unsafe { clear_pages_with(buf.as_mut_ptr(), buf.len(), strategy) }
}

/// Zero `buf` with the streaming-store kernel `kind` (lowered to what the CPU has).
pub fn clear_bytes_nt(buf: &mut [u8], kind: NtKind) {
    // SAFETY: as in `clear_bytes`.
    unsafe { clear_nt(buf.as_mut_ptr(), buf.len(), kind) }
}

// ---------------------------------------------------------------------------------
// Chunked clearing with yield points
// ---------------------------------------------------------------------------------

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
    /// (see [`clear_huge_page`]); 0 counts as 1.
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

    /// The same with another chunk size (0: the default).
    pub const fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    /// The same with another fault window (in 4 KiB sub-pages).
    pub const fn with_window_pages(mut self, window_pages: usize) -> Self {
        self.window_pages = window_pages;
        self
    }

    fn chunk(&self) -> usize {
        if self.chunk_bytes == 0 {
            DEFAULT_CLEAR_CHUNK
        } else {
            self.chunk_bytes
        }
    }

    /// Zero `buf`, calling `yield_fn` between chunks. Returns the number of yields.
    pub fn clear(&self, buf: &mut [u8], yield_fn: &mut dyn FnMut()) -> usize {
        // SAFETY: an exclusive slice is valid for writes of its length.
        unsafe { self.clear_raw(buf.as_mut_ptr(), buf.len(), yield_fn) }
    }

    /// As [`clear`](Self::clear), timing each chunk with `now_ns`.
    pub fn clear_timed(
        &self,
        buf: &mut [u8],
        yield_fn: &mut dyn FnMut(),
        now_ns: fn() -> u64,
    ) -> ChunkedClearStats {
        // SAFETY: an exclusive slice is valid for writes of its length.
        unsafe { self.clear_raw_timed(buf.as_mut_ptr(), buf.len(), yield_fn, now_ns) }
    }

    /// Zero `len` bytes at `p`, calling `yield_fn` between chunks. Returns the
    /// number of yields (`ceil(len / chunk) - 1`, or 0 for `len == 0`).
    ///
    /// # Safety
    /// As [`clear_pages`]; `yield_fn` must not touch the range.
    pub unsafe fn clear_raw(&self, p: *mut u8, len: usize, yield_fn: &mut dyn FnMut()) -> usize {
        let mut r = Runner::new(self.chunk(), yield_fn, None);
        // SAFETY: forwarded from the caller.
        unsafe { r.forward(p, len, Kernel::for_strategy(self.strategy, len)) };
        r.finish().yields
    }

    /// As [`clear_raw`](Self::clear_raw), timing each chunk with `now_ns`.
    ///
    /// # Safety
    /// As [`clear_raw`](Self::clear_raw).
    pub unsafe fn clear_raw_timed(
        &self,
        p: *mut u8,
        len: usize,
        yield_fn: &mut dyn FnMut(),
        now_ns: fn() -> u64,
    ) -> ChunkedClearStats {
        let mut r = Runner::new(self.chunk(), yield_fn, Some(now_ns));
        // SAFETY: forwarded from the caller.
        unsafe { r.forward(p, len, Kernel::for_strategy(self.strategy, len)) };
        r.finish()
    }

    /// Zero the huge page of `nr_pages` 4 KiB sub-pages at `base` for a fault on
    /// sub-page `fault_index`, in the order described at [`clear_huge_page`], with
    /// yield points every `chunk_bytes`. Returns the number of yields.
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

    /// As [`clear_huge_page`](Self::clear_huge_page), timing each chunk.
    ///
    /// # Safety
    /// As [`clear_huge_page`](Self::clear_huge_page).
    pub unsafe fn clear_huge_page_timed(
        &self,
        base: *mut u8,
        nr_pages: usize,
        fault_index: usize,
        yield_fn: &mut dyn FnMut(),
        now_ns: fn() -> u64,
    ) -> ChunkedClearStats {
        let mut r = Runner::new(self.chunk(), yield_fn, Some(now_ns));
        // SAFETY: forwarded from the caller.
        unsafe { self.huge(&mut r, base, nr_pages, fault_index) };
        r.finish()
    }

    /// Zero `buf` as a huge page (its length must be a multiple of 4096) for a
    /// fault on sub-page `fault_index`. Returns the number of yields.
    ///
    /// # Panics
    /// If `buf.len()` is not a multiple of 4096.
    pub fn clear_huge(
        &self,
        buf: &mut [u8],
        fault_index: usize,
        yield_fn: &mut dyn FnMut(),
    ) -> usize {
        assert!(
            buf.len() & (PAGE_SIZE - 1) == 0,
            "huge page length {} is not a multiple of 4096",
            buf.len()
        );
        // SAFETY: an exclusive slice is valid for writes of its length, which is
        // nr_pages * 4096.
        unsafe {
            self.clear_huge_page(
                buf.as_mut_ptr(),
                buf.len() / PAGE_SIZE,
                fault_index,
                yield_fn,
            )
        }
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
        if self.hot_len == 0 {
            return;
        }
        let after = hi..nr_pages.min(hi + HOT_PREFETCH_PAGES);
        let left = HOT_PREFETCH_PAGES - after.len();
        let before = lo.saturating_sub(left)..lo;
        for i in after.chain(before.rev()) {
            prefetch_hot_lines(
                base.wrapping_add(i * PAGE_SIZE),
                self.hot_offset,
                self.hot_len,
            );
        }
    }
}

/// Zero `len` bytes at `p` in chunks of `chunk_bytes` (0: [`DEFAULT_CLEAR_CHUNK`]),
/// calling `yield_fn` between chunks. Returns the number of yields.
///
/// # Safety
/// As [`clear_pages`]; `yield_fn` must not touch the range.
pub unsafe fn clear_chunked(
    p: *mut u8,
    len: usize,
    strategy: ClearStrategy,
    chunk_bytes: usize,
    yield_fn: &mut dyn FnMut(),
) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe {
        ChunkedClear::new(strategy)
            .with_chunk_bytes(chunk_bytes)
            .clear_raw(p, len, yield_fn)
    }
}

/// As [`clear_chunked`], timing each chunk with `now_ns` (monotonic nanoseconds),
/// and reporting the longest stretch without a yield point.
///
/// # Safety
/// As [`clear_chunked`].
pub unsafe fn clear_chunked_timed(
    p: *mut u8,
    len: usize,
    strategy: ClearStrategy,
    chunk_bytes: usize,
    yield_fn: &mut dyn FnMut(),
    now_ns: fn() -> u64,
) -> ChunkedClearStats {
    // SAFETY: forwarded from the caller.
    unsafe {
        ChunkedClear::new(strategy)
            .with_chunk_bytes(chunk_bytes)
            .clear_raw_timed(p, len, yield_fn, now_ns)
    }
}

/// Zero a huge page of `nr_pages` 4 KiB sub-pages at `base` after a fault on
/// sub-page `fault_index` (clamped to the last sub-page), with [`DEFAULT_CLEAR_CHUNK`]
/// between yields. Returns the number of yields.
///
/// Order: the sub-pages before the fault window (forwards), those after it (from
/// the far end back), then the window of [`FAULT_WINDOW_PAGES`] sub-pages around
/// `fault_index` with temporal stores, so that the faulting sub-page and its
/// neighbours are in cache when the access resumes. This keeps the point of Linux's
/// left-right narrowing while clearing in multi-page extents. With
/// [`ClearStrategy::PageAtATime`] the order is Linux's `process_huge_page()` exactly.
/// `Auto` decides on the size of the whole huge page (a 1 GiB page streams, a 2 MiB
/// one uses `rep stosb`).
///
/// # Safety
/// As [`ChunkedClear::clear_huge_page`].
pub unsafe fn clear_huge_page(
    base: *mut u8,
    nr_pages: usize,
    fault_index: usize,
    strategy: ClearStrategy,
    yield_fn: &mut dyn FnMut(),
) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { ChunkedClear::new(strategy).clear_huge_page(base, nr_pages, fault_index, yield_fn) }
}

/// The window of sub-pages `[lo, hi)` that a huge page clear leaves for last: up to
/// `window_pages` (at least 1) sub-pages with `fault_index` (clamped to the last
/// sub-page) inside, a little more after it than before, shifted inwards at the ends.
pub fn fault_window(nr_pages: usize, fault_index: usize, window_pages: usize) -> (usize, usize) {
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
    struct Aligned {
        v: Vec<u8>,
        start: usize,
        len: usize,
    }

    impl Aligned {
        fn new(len: usize, fill: u8) -> Self {
            let v = vec![fill; len + PAGE_SIZE];
            let start = v.as_ptr().align_offset(PAGE_SIZE);
            Aligned { v, start, len }
        }
        fn buf(&mut self) -> &mut [u8] {
            &mut self.v[self.start..self.start + self.len]
        }
    }

    /// Every byte of [off, off + len) zero, every other byte 0xAA.
    fn check_exact(buf: &[u8], off: usize, len: usize, what: &str) {
        let zero_ok = buf[off..off + len].iter().all(|&b| b == 0);
        let before_ok = buf[..off].iter().all(|&b| b == 0xAA);
        let after_ok = buf[off + len..].iter().all(|&b| b == 0xAA);
        assert!(zero_ok, "{what}: not all of [{off}, {}) zeroed", off + len);
        assert!(before_ok, "{what}: bytes before offset {off} touched");
        assert!(after_ok, "{what}: bytes after {} touched", off + len);
    }

    /// Run `clear` on every (offset, length) pair and check the result exactly.
    fn exact_range(name: &str, clear: &dyn Fn(&mut [u8])) {
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
            exact_range(s.name(), &|b| clear_bytes(b, s));
        }
    }

    #[test]
    fn clear_every_nt_kind_exact_range() {
        for k in NtKind::ALL {
            exact_range(k.name(), &|b| clear_bytes_nt(b, k));
        }
    }

    #[test]
    fn clear_raw_pointer_api_exact_range() {
        // SAFETY (both closures): an exclusive slice is writable for its length.
        exact_range("clear_pages", &|b| {
            // SAFETY: see above.
            unsafe { clear_pages(b.as_mut_ptr(), b.len()) }
        });
        for s in ClearStrategy::ALL {
            exact_range(s.name(), &|b| {
                // SAFETY: see above.
                unsafe { clear_pages_with(b.as_mut_ptr(), b.len(), s) }
            });
        }
    }

    #[test]
    fn clear_chunked_exact_range() {
        for s in ClearStrategy::ALL {
            for chunk in [1, 64, 100, 4096] {
                let c = ChunkedClear::new(s).with_chunk_bytes(chunk);
                exact_range(s.name(), &|b| {
                    c.clear(b, &mut || {});
                });
            }
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
                assert_eq!(clear_chunked(null, 0, s, 1, &mut || n += 1), 0);
                assert_eq!(clear_huge_page(null, 0, 0, s, &mut || n += 1), 0);
            }
            for k in NtKind::ALL {
                clear_pages_nt(null, 0, k);
            }
            clear_pages(null, 0);
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
        let st = ChunkedClear::new(ClearStrategy::MultiPage)
            .with_chunk_bytes(4096)
            .clear_timed(&mut v, &mut || n += 1, fake_now);
        assert_eq!((st.bytes, st.chunks, st.yields, n), (10 * 4096, 10, 9, 9));
        // Each stretch is bracketed by two consecutive clock readings: 10 ns.
        assert_eq!(st.max_gap_ns, 10);
        // Readings: start, 2 per yield, end: (1 + 18 + 1) readings, 19 steps.
        assert_eq!(st.total_ns, 190);
        assert!(v.iter().all(|&b| b == 0));
        // A clock that stands still, through the free function.
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
        let st = ChunkedClear::default().clear_timed(&mut [], &mut || {}, fake_now);
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
                        .with_hot(hot.start, hot.len());
                    let yields = c.clear_huge(
                        &mut buf[PAGE_SIZE..(NR + 1) * PAGE_SIZE],
                        fault,
                        &mut || n += 1,
                    );
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
        // The free function, 1 GiB-style geometry in miniature, and nr_pages = 0.
        for fault in [0usize, 511, 200] {
            let buf = a.buf();
            buf.fill(0xAA);
            // SAFETY: one page in is inside the buffer.
            let p = unsafe { buf.as_mut_ptr().add(PAGE_SIZE) };
            // SAFETY: 512 sub-pages starting one page in lie inside the buffer.
            unsafe { clear_huge_page(p, NR, fault, ClearStrategy::Auto, &mut || {}) };
            check_exact(buf, PAGE_SIZE, NR * PAGE_SIZE, "clear_huge_page");
            // SAFETY: zero sub-pages: nothing is written.
            unsafe { clear_huge_page(p, 0, fault, ClearStrategy::Auto, &mut || {}) };
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

    #[test]
    fn caps_are_consistent_and_cached() {
        let c = cpu_clear_caps();
        assert_eq!(c, cpu_clear_caps());
        assert!(c.llc_bytes > 0);
        assert!(!c.avx512f || c.nt_kind == NtKind::Avx512);
        #[cfg(target_arch = "x86_64")]
        {
            assert!(c.nt_kind >= NtKind::Sse2);
            assert_eq!(decode_caps(encode_caps(&c)), c);
            // Agrees with std's own detection.
            assert_eq!(c.avx2, std::is_x86_feature_detected!("avx2"));
            assert_eq!(c.avx512f, std::is_x86_feature_detected!("avx512f"));
            assert_eq!(c.erms, std::is_x86_feature_detected!("ermsb"));
        }
        std::println!("clear caps: {c}");
    }
}
