//! Changing the protection of present entries (Linux's `mm/mprotect.c`):
//! `change_prot_numa`, which turns present leaves into NUMA-hinting entries
//! (the NUMA scanner's one walk), and the two entry changes the scanner and
//! hint faults use (`set_numa_hint`, `clear_numa_hint`). The hinting fault that
//! restores them is `do_numa_page` / `do_huge_pmd_numa_page` (`memory.rs`,
//! `huge_memory.rs`).
//!
//! `change_prot_numa` walks with `walk_page_range` (`pagewalk.rs`) under the
//! limits of a [`ProtNuma`]: the scanner's page budget and virtual budget
//! (Linux's `pages` and `virtpages` in `task_numa_work`), checked before each
//! entry, and its filter of which present pages to arm. A hole (a missing
//! table) counts towards the virtual budget page by page, in steps that end
//! at PMD boundaries, so a pass may stop inside a hole, at a PMD boundary.
//!
//! Invariants: only present leaves change, by CAS (an entry that changed meanwhile
//! is skipped); a hinting entry keeps its pfn and bits, so the page stays mapped,
//! in the reverse map and in the RSS. The counts are exact: `marked` counts the
//! pages of the entries this walk changed (512 for a huge PMD).
//!
//! Locking: the shared VMA lock only; no page lock.

use std::sync::atomic::{AtomicU64, Ordering};

use super::mmap::VmaTree;
use super::pagewalk::{ControlFlow, MmWalk, MmWalkOps};
use super::{SpaceInner, PAGE};
use crate::pgtable::{Pte, HPAGE_PMD_NR, PMD_SIZE};
use crate::Pfn;

/// Turns the present leaf `e` in `slot` into a NUMA-hinting entry; false when
/// the entry changed meanwhile.
pub(super) fn set_numa_hint(slot: &AtomicU64, e: Pte) -> bool {
    let hint = e.mk_numa_hint();
    slot.compare_exchange(e.raw(), hint.raw(), Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Makes the NUMA-hinting entry `e` in `slot` present again (the hint fault's
/// first step); false when the entry changed meanwhile.
pub(super) fn clear_numa_hint(slot: &AtomicU64, e: Pte) -> bool {
    let present = e.clear_numa_hint();
    slot.compare_exchange(e.raw(), present.raw(), Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// The limits and the filter of one `change_prot_numa` walk, and what it did.
pub(super) struct ProtNuma<F> {
    /// Stop before the next entry once this many pages are marked.
    pub(super) max_marked: u64,
    /// Stop before the next entry once this many pages of the range were
    /// looked at (holes and entries of any kind).
    pub(super) max_seen: u64,
    /// Whether to arm the present page `pfn` mapped at `addr`.
    pub(super) filter: F,
    /// Pages whose entries were made NUMA-hinting.
    pub(super) marked: u64,
    /// Of those entries, huge PMDs.
    pub(super) huge: u64,
    /// Pages of the range looked at.
    pub(super) seen: u64,
}

impl<F: FnMut(u64, Pfn) -> bool> ProtNuma<F> {
    /// No marks yet, within the given limits.
    pub(super) fn new(max_marked: u64, max_seen: u64, filter: F) -> ProtNuma<F> {
        ProtNuma {
            max_marked,
            max_seen,
            filter,
            marked: 0,
            huge: 0,
            seen: 0,
        }
    }

    fn exhausted(&self) -> bool {
        self.marked >= self.max_marked || self.seen >= self.max_seen
    }

    /// One leaf of `pages` pages at `addr`: looked at, and armed if present
    /// and the filter wants it.
    fn leaf(&mut self, slot: &AtomicU64, e: Pte, addr: u64, pages: u64) -> ControlFlow<u64> {
        if self.exhausted() {
            return ControlFlow::Break(addr);
        }
        self.seen += pages;
        if e.is_present() && (self.filter)(addr, e.pfn()) && set_numa_hint(slot, e) {
            self.marked += pages;
            self.huge += u64::from(pages > 1);
        }
        ControlFlow::Continue(())
    }
}

impl<F: FnMut(u64, Pfn) -> bool> MmWalkOps for ProtNuma<F> {
    /// Where the walk stopped on a limit.
    type Break = u64;

    fn pmd_entry(
        &mut self,
        _: &MmWalk<'_>,
        slot: &AtomicU64,
        e: Pte,
        addr: u64,
        _: u64,
    ) -> ControlFlow<u64> {
        self.leaf(slot, e, addr, HPAGE_PMD_NR)
    }

    #[inline]
    fn pte_entry(
        &mut self,
        _: &MmWalk<'_>,
        slot: &AtomicU64,
        e: Pte,
        addr: u64,
    ) -> ControlFlow<u64> {
        self.leaf(slot, e, addr, 1)
    }

    /// Counts the hole's pages in steps ending at PMD boundaries (see the
    /// header): stops at the first such boundary inside the hole where the
    /// virtual budget is spent.
    fn pte_hole(&mut self, _: &MmWalk<'_>, addr: u64, next: u64, _: u32) -> ControlFlow<u64> {
        if self.exhausted() {
            return ControlFlow::Break(addr);
        }
        let pages = (next - addr) / PAGE;
        let need = self.max_seen - self.seen;
        if need < pages {
            let at = ((addr + need * PAGE) + PMD_SIZE - 1) & !(PMD_SIZE - 1);
            if at < next {
                self.seen += (at - addr) / PAGE;
                return ControlFlow::Break(at);
            }
        }
        self.seen += pages;
        ControlFlow::Continue(())
    }
}

impl SpaceInner {
    /// Linux's `change_prot_numa`: turns the present leaves mapping
    /// `[start, end)` (page aligned) into NUMA-hinting entries, so that the
    /// next access of each faults, within the limits and filter of `scan`,
    /// which counts what was done. Returns where a limit stopped it, `None`
    /// when it reached `end`. Needs only the shared VMA lock (`held`).
    pub(super) fn change_prot_numa<F: FnMut(u64, Pfn) -> bool>(
        &self,
        held: &VmaTree,
        start: u64,
        end: u64,
        scan: &mut ProtNuma<F>,
    ) -> Option<u64> {
        self.walk_page_range(held, start, end, scan).break_value()
    }
}

#[cfg(test)]
impl super::Space {
    /// `change_prot_numa` over `[addr, addr + len)` with no limits: the pages
    /// marked.
    pub(crate) fn change_prot_numa(&self, addr: u64, len: u64) -> u64 {
        let end = addr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
        let g = self.inner.read_lock();
        let mut scan = ProtNuma::new(u64::MAX, u64::MAX, |_, _| true);
        self.inner
            .change_prot_numa(&g, addr & !(PAGE - 1), end, &mut scan);
        scan.marked
    }
}
