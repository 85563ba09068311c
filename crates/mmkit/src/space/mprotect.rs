//! Changing the protection of present entries (Linux's `mm/mprotect.c`):
//! `change_prot_numa`, which turns present leaves into NUMA-hinting entries, and
//! the two entry changes the NUMA balancing scanner and hint faults use
//! (`set_numa_hint`, `clear_numa_hint`). The hinting fault that restores them is
//! `do_numa_page` / `do_huge_pmd_numa_page` (`memory.rs`, `huge_memory.rs`).
//!
//! Invariants: only present leaves change, by CAS (an entry that changed meanwhile
//! is skipped); a hinting entry keeps its pfn and bits, so the page stays mapped,
//! in the reverse map and in the RSS.
//!
//! Locking: the shared VMA lock only; no page lock.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Space, PAGE};
use crate::pgtable::{Pte, PMD_SIZE, TASK_SIZE};

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

impl Space {
    /// Linux's `change_prot_numa`: turns the present leaves mapping
    /// `[addr, addr + len)` into NUMA-hinting entries, so that the next access of
    /// each faults (and, for now, simply restores it). Returns the entries changed.
    /// For the NUMA balancing scanner; needs only the shared VMA lock.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn change_prot_numa(&self, addr: u64, len: u64) -> u64 {
        let Some(end) = addr.checked_add(len).filter(|e| *e <= TASK_SIZE) else {
            return 0;
        };
        let inner = &self.inner;
        let g = inner.read_lock();
        let mut changed = 0;
        let mut a = addr & !(PAGE - 1);
        while a < end {
            let mut step = PAGE;
            if let Some((slot, e, level)) = inner.follow_pte(&g, a) {
                if level == 1 {
                    step = (a & !(PMD_SIZE - 1)) + PMD_SIZE - a;
                }
                if e.is_present() && set_numa_hint(slot, e) {
                    changed += 1;
                }
            }
            a += step;
        }
        changed
    }
}
