//! The clearing plan: what [`ClearStrategy::Auto`] runs where, as data.
//!
//! The core does not measure anything (it has no clock); an environment decides
//! the plan (mmkit's std crate calibrates on the running host once per process)
//! and hands it over as a [`ClearPlan`]. Three decisions, after the places where
//! clearing is most of the cost:
//!
//! - `huge`: the kernel for huge pages (2 MiB) faulted in a mapping larger than
//!   `cached_upto`;
//! - `gigantic`: the kernel for extents of [`GIGANTIC_BYTES`] and more (a 1 GiB
//!   page, or the 2 MiB pages of a 1 GiB mapping);
//! - `batch`: the kernel for the fault-around batch of a sparse first touch
//!   (a dense first touch always uses cached stores: its zeroes are read back at
//!   once, so the read for ownership is paid once either way);
//! - `cached_upto`: mappings and extents up to this size are cleared with cached
//!   stores (`rep stosb`), whatever the kernels above say: their zeroes are
//!   expected to be used while still in cache.
//!
//! What does not change with the plan: the window around the faulting sub-page
//! of a huge page is cleared last with cached stores, and the faulting sub-page
//! last of all (`huge.rs`).
//!
//! [`ClearPlan::from_cpuid`] is the fixed rule that came before calibration:
//! streaming stores above the last-level cache size that CPUID reports. It is
//! kept as the plan of environments that cannot measure, and as what
//! [`ClearStrategy::resolve`] applies.
//!
//! Invariants: a plan's three kernels are concrete strategies (`MultiPage`,
//! `NonTemporal` or `PageAtATime`, never `Auto`; [`ClearPlan::is_valid`]);
//! resolving `Auto` through a valid plan always gives a concrete strategy, and
//! resolving any other strategy gives it back unchanged. Plain data, no lock.

use core::fmt;

use super::{cpu_clear_caps, ClearStrategy};

/// Extents of this size and more take the plan's `gigantic` kernel (1 GiB).
pub const GIGANTIC_BYTES: usize = 1 << 30;

/// Where a plan came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanSource {
    /// The fixed rule from CPUID's last-level cache size ([`ClearPlan::from_cpuid`]).
    Cpuid,
    /// Measured on the running host.
    Measured,
    /// Given by the user (a builder option or the environment).
    Override,
}

impl PlanSource {
    /// Stable name: "cpuid", "measured", "override".
    pub const fn name(self) -> &'static str {
        match self {
            PlanSource::Cpuid => "cpuid",
            PlanSource::Measured => "measured",
            PlanSource::Override => "override",
        }
    }
}

/// What [`ClearStrategy::Auto`] runs for huge pages, 1 GiB extents and
/// fault-around batches (see the module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClearPlan {
    /// Huge pages in mappings larger than `cached_upto`.
    pub huge: ClearStrategy,
    /// Extents of [`GIGANTIC_BYTES`] and more (when larger than `cached_upto`).
    pub gigantic: ClearStrategy,
    /// The fault-around batch of a sparse first touch.
    pub batch: ClearStrategy,
    /// Mappings and extents up to this many bytes: cached stores (`MultiPage`).
    pub cached_upto: usize,
    /// Where the plan came from.
    pub source: PlanSource,
}

impl Default for ClearPlan {
    fn default() -> Self {
        ClearPlan::from_cpuid()
    }
}

impl ClearPlan {
    /// The fixed rule: streaming stores above the LLC size CPUID reports,
    /// `rep stosb` up to it, streaming stores for sparse fault-around batches.
    pub fn from_cpuid() -> ClearPlan {
        ClearPlan {
            huge: ClearStrategy::NonTemporal,
            gigantic: ClearStrategy::NonTemporal,
            batch: ClearStrategy::NonTemporal,
            cached_upto: cpu_clear_caps().llc_bytes,
            source: PlanSource::Cpuid,
        }
    }

    /// The kernels are concrete strategies (none is `Auto`).
    pub fn is_valid(&self) -> bool {
        [self.huge, self.gigantic, self.batch]
            .iter()
            .all(|&s| s != ClearStrategy::Auto)
    }

    /// What `strategy` runs for an extent (or a huge page of a mapping) of
    /// `len` bytes: `Auto` becomes cached stores up to `cached_upto`, then
    /// `gigantic` from [`GIGANTIC_BYTES`], `huge` in between; the others stay.
    /// An `Auto` left in an invalid plan resolves as `MultiPage`.
    pub fn resolve(&self, strategy: ClearStrategy, len: usize) -> ClearStrategy {
        let s = match strategy {
            ClearStrategy::Auto if len <= self.cached_upto => ClearStrategy::MultiPage,
            ClearStrategy::Auto if len >= GIGANTIC_BYTES => self.gigantic,
            ClearStrategy::Auto => self.huge,
            s => return s,
        };
        if s == ClearStrategy::Auto {
            ClearStrategy::MultiPage
        } else {
            s
        }
    }

    /// What `strategy` runs for a fault-around batch: under `Auto`, the plan's
    /// `batch` kernel for a sparse first touch and cached stores for a dense
    /// one; the others stay.
    pub fn resolve_batch(&self, strategy: ClearStrategy, sparse: bool) -> ClearStrategy {
        match strategy {
            ClearStrategy::Auto if sparse && self.batch != ClearStrategy::Auto => self.batch,
            ClearStrategy::Auto => ClearStrategy::MultiPage,
            s => s,
        }
    }
}

impl fmt::Display for ClearPlan {
    /// `huge=non-temporal gigantic=non-temporal batch=non-temporal
    /// cached_upto=4194304 source=measured`: the form [`ClearPlan::parse`] takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "huge={} gigantic={} batch={} cached_upto={} source={}",
            self.huge,
            self.gigantic,
            self.batch,
            self.cached_upto,
            self.source.name()
        )
    }
}

/// Why a plan's text was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadClearPlan {
    /// A word that is not `key=value`, or a key that is not a plan's.
    UnknownKey,
    /// A kernel that is not a strategy name, or is `auto`.
    BadKernel,
    /// A `cached_upto` that is not a byte count (digits, optional K/M/G).
    BadSize,
}

impl fmt::Display for BadClearPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadClearPlan::UnknownKey => {
                "unknown clearing plan key; use huge=, gigantic=, batch=, cached_upto= \
                 (comma or space separated), or cpuid"
            }
            BadClearPlan::BadKernel => {
                "bad clearing kernel; use page-at-a-time, multi-page or non-temporal"
            }
            BadClearPlan::BadSize => "bad cached_upto; use bytes, optionally with K, M or G",
        })
    }
}

impl ClearPlan {
    /// `base` changed by the text `s`: `key=value` words separated by commas or
    /// spaces (keys `huge`, `gigantic`, `batch` take a strategy name other than
    /// `auto`; `cached_upto` takes bytes with an optional K, M or G suffix;
    /// `source` is accepted and ignored), or the single word `cpuid` for
    /// [`from_cpuid`](Self::from_cpuid). The result's source is
    /// [`PlanSource::Override`] unless it is the `cpuid` rule. Bad text: an
    /// error, nothing returned.
    pub fn parse(base: ClearPlan, s: &str) -> Result<ClearPlan, BadClearPlan> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("cpuid") {
            return Ok(ClearPlan::from_cpuid());
        }
        let mut p = base;
        for word in s.split([',', ' ']).filter(|w| !w.is_empty()) {
            let (k, v) = word.split_once('=').ok_or(BadClearPlan::UnknownKey)?;
            let kernel = || match ClearStrategy::from_name(v) {
                Some(ClearStrategy::Auto) | None => Err(BadClearPlan::BadKernel),
                Some(s) => Ok(s),
            };
            match k {
                "huge" => p.huge = kernel()?,
                "gigantic" => p.gigantic = kernel()?,
                "batch" => p.batch = kernel()?,
                "cached_upto" => p.cached_upto = parse_bytes(v).ok_or(BadClearPlan::BadSize)?,
                "source" => {}
                _ => return Err(BadClearPlan::UnknownKey),
            }
        }
        p.source = PlanSource::Override;
        Ok(p)
    }
}

/// Digits with an optional K, M or G (binary) suffix.
fn parse_bytes(v: &str) -> Option<usize> {
    let (digits, shift) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 10),
        b'M' | b'm' => (&v[..v.len() - 1], 20),
        b'G' | b'g' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1usize << shift)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn cpuid_plan_is_the_old_rule() {
        let p = ClearPlan::from_cpuid();
        assert!(p.is_valid());
        for len in [0, 4096, 2 << 20, 64 << 20, 1 << 30, usize::MAX] {
            for s in ClearStrategy::ALL {
                assert_eq!(p.resolve(s, len), s.resolve(len), "{s} {len}");
            }
        }
    }

    #[test]
    fn resolve_by_size() {
        let p = ClearPlan {
            huge: ClearStrategy::NonTemporal,
            gigantic: ClearStrategy::PageAtATime,
            batch: ClearStrategy::MultiPage,
            cached_upto: 4 << 20,
            source: PlanSource::Override,
        };
        let a = ClearStrategy::Auto;
        assert_eq!(p.resolve(a, 4 << 20), ClearStrategy::MultiPage);
        assert_eq!(p.resolve(a, (4 << 20) + 1), ClearStrategy::NonTemporal);
        assert_eq!(p.resolve(a, 1 << 30), ClearStrategy::PageAtATime);
        assert_eq!(
            p.resolve(ClearStrategy::NonTemporal, 0),
            ClearStrategy::NonTemporal
        );
        assert_eq!(p.resolve_batch(a, true), ClearStrategy::MultiPage);
        assert_eq!(p.resolve_batch(a, false), ClearStrategy::MultiPage);
        let q = ClearPlan {
            batch: ClearStrategy::NonTemporal,
            ..p
        };
        assert_eq!(q.resolve_batch(a, true), ClearStrategy::NonTemporal);
        assert_eq!(q.resolve_batch(a, false), ClearStrategy::MultiPage);
        assert_eq!(
            q.resolve_batch(ClearStrategy::PageAtATime, true),
            ClearStrategy::PageAtATime
        );
        // An invalid plan still resolves to something concrete.
        let bad = ClearPlan {
            huge: a,
            gigantic: a,
            batch: a,
            ..p
        };
        assert!(!bad.is_valid());
        for len in [0, 8 << 20, 1 << 30] {
            assert_ne!(bad.resolve(a, len), a);
        }
        assert_ne!(bad.resolve_batch(a, true), a);
    }

    #[test]
    fn parse_round_trips_and_refuses_bad_text() {
        let base = ClearPlan::from_cpuid();
        let p =
            ClearPlan::parse(base, "huge=multi-page, batch=non-temporal cached_upto=8M").unwrap();
        assert_eq!(p.huge, ClearStrategy::MultiPage);
        assert_eq!(p.gigantic, base.gigantic);
        assert_eq!(p.batch, ClearStrategy::NonTemporal);
        assert_eq!(p.cached_upto, 8 << 20);
        assert_eq!(p.source, PlanSource::Override);
        let again = ClearPlan::parse(base, &p.to_string()).unwrap();
        assert_eq!(again, p);
        assert_eq!(ClearPlan::parse(p, "CPUID").unwrap(), base);
        assert_eq!(
            ClearPlan::parse(base, "huge=auto"),
            Err(BadClearPlan::BadKernel)
        );
        assert_eq!(
            ClearPlan::parse(base, "huge=fast"),
            Err(BadClearPlan::BadKernel)
        );
        assert_eq!(
            ClearPlan::parse(base, "window=3"),
            Err(BadClearPlan::UnknownKey)
        );
        assert_eq!(
            ClearPlan::parse(base, "huge"),
            Err(BadClearPlan::UnknownKey)
        );
        assert_eq!(
            ClearPlan::parse(base, "cached_upto=lots"),
            Err(BadClearPlan::BadSize)
        );
        assert_eq!(
            ClearPlan::parse(base, "cached_upto=99999999999999999999G"),
            Err(BadClearPlan::BadSize)
        );
        assert_eq!(parse_bytes("1G"), Some(1 << 30));
        assert_eq!(parse_bytes("12"), Some(12));
        assert_eq!(parse_bytes(""), None);
    }
}
