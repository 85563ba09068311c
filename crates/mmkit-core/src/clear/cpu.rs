//! What the clearing kernels need to know about the CPU: ERMS and FSRM (fast string
//! instructions), AVX2 and AVX-512F with the OS's support for their register state
//! (XGETBV), the streaming-store kernel that follows ([`NtKind`]), and the size of
//! the last-level cache (CPUID leaf 4 on Intel, 0x8000_001D or 0x8000_0006 on AMD
//! and Hygon), which decides where `ClearStrategy::Auto` switches to streaming
//! stores.
//!
//! Invariants: detection runs at most a few times (racing first calls) and always
//! computes the same value; the result is cached in one atomic word, so a reader
//! sees either nothing (and detects) or the whole result. No lock: the word is the
//! only shared state. On architectures other than x86_64 nothing is detected and
//! every kernel is `core::ptr::write_bytes`.

use core::fmt;
#[cfg(target_arch = "x86_64")]
use core::sync::atomic::{AtomicU64, Ordering};

/// The last-level cache size assumed when CPUID does not report one.
pub const DEFAULT_LLC_BYTES: usize = 32 << 20;

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

/// Enhanced `rep stosb` (else the page kernel uses `rep stosq`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn has_erms() -> bool {
    cpu_clear_caps().erms
}

/// `clflushopt` (`CPUID.7.0:EBX[23]`); not cached (CPUID again on each call:
/// callers flush whole buffers, not lines).
#[cfg(target_arch = "x86_64")]
pub(super) fn has_clflushopt() -> bool {
    x86::cpuid(0, 0).eax >= 7 && x86::cpuid(7, 0).ebx & (1 << 23) != 0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ClearCaps, NtKind, DEFAULT_LLC_BYTES};
    use core::arch::asm;
    use core::arch::x86_64::{__cpuid_count, CpuidResult};

    pub(super) fn cpuid(leaf: u32, sub: u32) -> CpuidResult {
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
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

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
