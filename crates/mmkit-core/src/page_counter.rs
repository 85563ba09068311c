//! The hierarchical page counter of memory cgroups (Linux's `mm/page_counter.c`):
//! usage in pages, the limits `max` and `high`, the protections `min` and `low`,
//! and the effective protection (`emin`, `elow`) that reclaim computes top-down.
//!
//! A counter has a parent (none for the root); a charge is added at every level
//! from the counter up to the root, and fails at the first level that would go
//! over its `max`, naming it, with the levels below it cancelled: nothing is
//! left charged on failure. Protected usage (`min(usage, min)` and
//! `min(usage, low)`) is propagated to the parent's `children_min_usage` /
//! `children_low_usage` on every change, so that effective protection can split
//! an overcommitted parent's protection among its children in proportion to
//! what they use below their own settings ([`effective_protection`]).
//!
//! Invariants:
//! - `usage` of a counter never exceeds its `max` through [`PageCounter::try_charge`]
//!   (the limit is checked by compare-and-swap, not add-then-check, so a
//!   reader never sees usage above a fixed `max`); [`PageCounter::charge`]
//!   (forced) may go over, as Linux's `page_counter_charge`;
//! - a parent outlives its children (the owner of the counters guarantees it:
//!   memory cgroups hold a reference on their parent);
//! - `children_*_usage` of a counter equals the sum of its children's
//!   `*_usage` whenever no charge is in flight.
//!
//! Locking: none; every field is an atomic. `usage` sits on a cache line of its
//! own (the hot field of the fault path, Linux's layout fix). `emin`/`elow` are
//! written by reclaim without synchronisation, as Linux's ("intentionally
//! racy": protection is best effort, and each reclaim pass recomputes them).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::page::PAGE_SIZE;

/// "No limit", in pages (Linux's `PAGE_COUNTER_MAX`): any byte count converts
/// to pages without overflow.
pub const PAGE_COUNTER_MAX: u64 = u64::MAX / PAGE_SIZE as u64;

/// A value on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Line(AtomicU64);

/// One level of a hierarchical page counter (Linux's `struct page_counter`).
pub struct PageCounter {
    usage: Line,
    max: AtomicU64,
    high: AtomicU64,
    low: AtomicU64,
    min: AtomicU64,
    /// `min(usage, min)` as last propagated to the parent.
    min_usage: AtomicU64,
    /// `min(usage, low)` as last propagated to the parent.
    low_usage: AtomicU64,
    /// Sum of the children's `min_usage`.
    children_min_usage: AtomicU64,
    /// Sum of the children's `low_usage`.
    children_low_usage: AtomicU64,
    /// Effective `min` and `low`, as the last reclaim computed them.
    emin: AtomicU64,
    elow: AtomicU64,
    /// Highest usage seen (Linux's `watermark`, `memory.peak`).
    watermark: AtomicU64,
    /// Charges refused at this level.
    failcnt: AtomicU64,
    /// Whether protected usage is tracked (the memory counter; not swap's).
    protection: bool,
    parent: *const PageCounter,
}

// SAFETY: every field but `parent` is an atomic; `parent` points to a counter
// that outlives this one (the contract of `new_child`) and is only read
// through `&`, whose methods are all thread-safe.
unsafe impl Send for PageCounter {}
// SAFETY: as for `Send`: shared access only goes through atomics.
unsafe impl Sync for PageCounter {}

impl PageCounter {
    /// A root counter (no parent) with no limits. `protection`: track the
    /// protected usage of its children (memory; Linux does not for swap).
    pub fn new_root(protection: bool) -> Self {
        Self::with_parent(core::ptr::null(), protection)
    }

    /// A counter below `parent`, with no limits and no protection.
    ///
    /// # Safety
    /// `parent` must stay at its address and outlive the counter returned
    /// (memory cgroups keep their parent alive, in an `Arc`, for as long as
    /// any child exists).
    pub unsafe fn new_child(parent: &PageCounter, protection: bool) -> Self {
        Self::with_parent(parent as *const PageCounter, protection)
    }

    fn with_parent(parent: *const PageCounter, protection: bool) -> Self {
        PageCounter {
            usage: Line::default(),
            max: AtomicU64::new(PAGE_COUNTER_MAX),
            high: AtomicU64::new(PAGE_COUNTER_MAX),
            low: AtomicU64::new(0),
            min: AtomicU64::new(0),
            min_usage: AtomicU64::new(0),
            low_usage: AtomicU64::new(0),
            children_min_usage: AtomicU64::new(0),
            children_low_usage: AtomicU64::new(0),
            emin: AtomicU64::new(0),
            elow: AtomicU64::new(0),
            watermark: AtomicU64::new(0),
            failcnt: AtomicU64::new(0),
            protection,
            parent,
        }
    }

    /// The parent counter; `None` for a root.
    #[inline]
    pub fn parent(&self) -> Option<&PageCounter> {
        // SAFETY: a non-null parent outlives this counter (`new_child`).
        unsafe { self.parent.as_ref() }
    }

    /// Pages charged (this level: itself and all its descendants).
    #[inline]
    pub fn usage(&self) -> u64 {
        self.usage.0.load(Ordering::Relaxed)
    }
    /// The hard limit, in pages.
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }
    /// The throttling limit, in pages.
    pub fn high(&self) -> u64 {
        self.high.load(Ordering::Relaxed)
    }
    /// The best-effort protection, in pages.
    pub fn low(&self) -> u64 {
        self.low.load(Ordering::Relaxed)
    }
    /// The hard protection, in pages.
    pub fn min(&self) -> u64 {
        self.min.load(Ordering::Relaxed)
    }
    /// Effective `min` as the last protection calculation left it.
    pub fn emin(&self) -> u64 {
        self.emin.load(Ordering::Relaxed)
    }
    /// Effective `low` as the last protection calculation left it.
    pub fn elow(&self) -> u64 {
        self.elow.load(Ordering::Relaxed)
    }
    /// Highest usage seen.
    pub fn watermark(&self) -> u64 {
        self.watermark.load(Ordering::Relaxed)
    }
    /// Charges refused at this level because of its `max`.
    pub fn failcnt(&self) -> u64 {
        self.failcnt.load(Ordering::Relaxed)
    }
    /// The sum of the children's protected usage below `min` and `low`.
    pub fn children_protected_usage(&self) -> (u64, u64) {
        (
            self.children_min_usage.load(Ordering::Relaxed),
            self.children_low_usage.load(Ordering::Relaxed),
        )
    }

    /// Linux's `propagate_protected_usage`: publishes `min(usage, min)` and
    /// `min(usage, low)` of this level to its parent's children sums.
    fn propagate_protected_usage(&self, usage: u64) {
        let Some(parent) = self.parent() else { return };
        if !self.protection {
            return;
        }
        for (setting, mine, theirs) in [
            (&self.min, &self.min_usage, &parent.children_min_usage),
            (&self.low, &self.low_usage, &parent.children_low_usage),
        ] {
            let protected = usage.min(setting.load(Ordering::Relaxed));
            if mine.load(Ordering::Relaxed) != protected {
                let old = mine.swap(protected, Ordering::Relaxed);
                // Wrapping: a racing update may publish its delta first.
                theirs.fetch_add(protected.wrapping_sub(old), Ordering::Relaxed);
            }
        }
    }

    /// Linux's `page_counter_cancel`: takes `nr` off this level only.
    fn cancel(&self, nr: u64) {
        let new = self.usage.0.fetch_sub(nr, Ordering::AcqRel) - nr;
        self.propagate_protected_usage(new);
    }

    fn raise_watermark(&self, new: u64) {
        // A plain load first: most charges do not set a new peak.
        if new > self.watermark.load(Ordering::Relaxed) {
            self.watermark.fetch_max(new, Ordering::Relaxed);
        }
    }

    /// Linux's `page_counter_charge`: adds `nr` at every level, ignoring the
    /// limits (a forced charge).
    pub fn charge(&self, nr: u64) {
        let mut c = Some(self);
        while let Some(l) = c {
            let new = l.usage.0.fetch_add(nr, Ordering::AcqRel) + nr;
            l.propagate_protected_usage(new);
            l.raise_watermark(new);
            c = l.parent();
        }
    }

    /// Linux's `page_counter_try_charge`: adds `nr` at every level up to the
    /// root; if a level would go over its `max`, nothing stays charged and
    /// that level is returned (its `failcnt` counts the refusal).
    pub fn try_charge(&self, nr: u64) -> Result<(), &PageCounter> {
        let mut c = Some(self);
        while let Some(l) = c {
            if let Err(()) = l.try_charge_one(nr) {
                l.failcnt.fetch_add(1, Ordering::Relaxed);
                let mut u = Some(self);
                while let Some(b) = u {
                    if core::ptr::eq(b, l) {
                        break;
                    }
                    b.cancel(nr);
                    u = b.parent();
                }
                return Err(l);
            }
            c = l.parent();
        }
        Ok(())
    }

    /// One level of `try_charge`: compare-and-swap below `max`, then a
    /// re-check against a `max` lowered meanwhile (`set_max` publishes the
    /// limit before it reads the usage, so one of the two sees the other).
    fn try_charge_one(&self, nr: u64) -> Result<(), ()> {
        let mut old = self.usage.0.load(Ordering::Relaxed);
        loop {
            let new = old.checked_add(nr).ok_or(())?;
            if new > self.max.load(Ordering::SeqCst) {
                return Err(());
            }
            match self
                .usage
                .0
                .compare_exchange_weak(old, new, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => {
                    if new > self.max.load(Ordering::SeqCst) {
                        self.cancel(nr);
                        return Err(());
                    }
                    self.propagate_protected_usage(new);
                    self.raise_watermark(new);
                    return Ok(());
                }
                Err(cur) => old = cur,
            }
        }
    }

    /// Linux's `page_counter_uncharge`: takes `nr` off every level.
    pub fn uncharge(&self, nr: u64) {
        let mut c = Some(self);
        while let Some(l) = c {
            debug_assert!(l.usage() >= nr, "page counter uncharged below zero");
            l.cancel(nr);
            c = l.parent();
        }
    }

    /// Linux's `page_counter_set_max`: sets the hard limit to `nr` pages, or
    /// returns the usage that is above it (the limit unchanged).
    pub fn set_max(&self, nr: u64) -> Result<(), u64> {
        loop {
            let usage = self.usage.0.load(Ordering::SeqCst);
            if usage > nr {
                return Err(usage);
            }
            let old = self.max.swap(nr, Ordering::SeqCst);
            if self.usage.0.load(Ordering::SeqCst) <= nr {
                return Ok(());
            }
            // A charge got in between: put the old limit back, try again.
            self.max.store(old, Ordering::SeqCst);
        }
    }

    /// Sets `high` (no check: usage may be above it, reclaim brings it down).
    pub fn set_high(&self, nr: u64) {
        self.high.store(nr, Ordering::Relaxed);
    }

    /// Sets `min` and publishes the protected usage it implies.
    pub fn set_min(&self, nr: u64) {
        self.min.store(nr, Ordering::Relaxed);
        self.propagate_protected_usage(self.usage());
    }

    /// Sets `low` and publishes the protected usage it implies.
    pub fn set_low(&self, nr: u64) {
        self.low.store(nr, Ordering::Relaxed);
        self.propagate_protected_usage(self.usage());
    }

    /// Linux's `page_counter_calculate_protection`: the effective `min` and
    /// `low` of `self` for a reclaim whose target is `root`, from its parent's
    /// effective values (computed first: callers walk the tree top-down). The
    /// target itself and a counter with no usage are left alone (their values
    /// are not used); a direct child of the target takes its own settings.
    pub fn calculate_protection(&self, root: &PageCounter, recursive: bool) {
        if core::ptr::eq(self, root) {
            return;
        }
        let usage = self.usage();
        if usage == 0 {
            return;
        }
        let Some(parent) = self.parent() else { return };
        if core::ptr::eq(parent, root) {
            self.emin.store(self.min(), Ordering::Relaxed);
            self.elow.store(self.low(), Ordering::Relaxed);
            return;
        }
        let parent_usage = parent.usage();
        let (cmin, clow) = parent.children_protected_usage();
        self.emin.store(
            effective_protection(
                usage,
                parent_usage,
                self.min(),
                parent.emin(),
                cmin,
                recursive,
            ),
            Ordering::Relaxed,
        );
        self.elow.store(
            effective_protection(
                usage,
                parent_usage,
                self.low(),
                parent.elow(),
                clow,
                recursive,
            ),
            Ordering::Relaxed,
        );
    }

    /// Sets the effective values directly (a counter that is its own reclaim
    /// target, or the root: unprotected).
    pub fn clear_protection(&self) {
        self.emin.store(0, Ordering::Relaxed);
        self.elow.store(0, Ordering::Relaxed);
    }
}

/// Linux's `effective_protection`: how much of `usage` is protected, given the
/// counter's `setting` (min or low), its parent's effective protection, and
/// the protected usage of all the parent's children (`siblings_protected`,
/// this one's included).
///
/// - The protected part is `min(usage, setting)`.
/// - If the siblings together claim more than the parent has, each gets the
///   parent's protection in proportion to its claim.
/// - Otherwise each keeps its claim and, with `recursive` (the
///   `memory_recursiveprot` mount option), the protection nobody claimed is
///   shared in proportion to the usage above the claims.
pub fn effective_protection(
    usage: u64,
    parent_usage: u64,
    setting: u64,
    parent_effective: u64,
    siblings_protected: u64,
    recursive: bool,
) -> u64 {
    let protected = usage.min(setting);
    if siblings_protected > parent_effective {
        return mul_div(protected, parent_effective, siblings_protected);
    }
    let mut ep = protected;
    if recursive && parent_effective > siblings_protected && usage > protected {
        let unclaimed = parent_effective - siblings_protected;
        let over = parent_usage.saturating_sub(siblings_protected);
        if over > 0 {
            ep += mul_div(unclaimed, usage - protected, over);
        }
    }
    ep
}

/// `a * b / c` without overflow (`c > 0`).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    ((a as u128 * b as u128) / c as u128) as u64
}

/// Linux's `apply_proportional_protection` (from `get_scan_count`): of a list
/// of `size` pages in a group of `usage` pages with `protection` pages
/// effectively protected, how many to scan: the list minus its protected
/// share, at least [`SWAP_CLUSTER_MAX`](SCAN_FLOOR) (32) pages, and never
/// more than the list. Reclaim of a group above its protection thus scans in
/// proportion to its excess.
pub fn proportional_scan(size: u64, usage: u64, protection: u64) -> u64 {
    if protection == 0 {
        return size;
    }
    let scan = size - mul_div(size, protection.min(usage), usage + 1);
    scan.max(SCAN_FLOOR).min(size)
}

/// The smallest scan of a group above its protection (`SWAP_CLUSTER_MAX`).
pub const SCAN_FLOOR: u64 = 32;

impl core::fmt::Debug for PageCounter {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageCounter")
            .field("usage", &self.usage())
            .field("max", &self.max())
            .field("high", &self.high())
            .field("low", &self.low())
            .field("min", &self.min())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
