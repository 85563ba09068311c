//! The eviction policies of the anonymous LRU as pure decisions: what reclaim
//! does with a page it finds at the tail of the inactive list or scans on the
//! active list, given the page's LRU state and whether its accessed bit was set
//! (the only signal an OS reclaimer has: `folio_referenced` as reclaim finds it),
//! how the lists are sized, and whether a refault is activated. The std crate
//! applies them under its locks (`vmscan.rs`, `workingset.rs`).
//!
//! Two policies ([`LruPolicy`]):
//! - `Protected` (mmkit's): the inactive list is a small probation FIFO (5% of
//!   the lists, at least 64 pages) feeding the active list, a protected CLOCK
//!   with a 2-bit use counter per page (2Q / S3-FIFO / CLOCK-Pro family). The
//!   faulting access is the insertion, not a reuse (a page prefaulted by
//!   fault-around is mapped so that its first access is: `PTE_PREFAULT` in
//!   the std crate); a page mapped young before anyone used it (a huge page)
//!   carries `LRU_FRESH`, and its first sighting of the accessed bit only
//!   clears that. A probation page is
//!   promoted when seen referenced at two consecutive tail visits
//!   (`LRU_REFERENCED` marks the first), or at one if it was in the working
//!   set before (`LRU_WORKINGSET`: demoted from the protected list, or
//!   restored by a refault); one not seen is evicted. Looking twice keeps an
//!   accessed bit set long ago, before the working set moved, from promoting
//!   a page no one uses any more. The clock hand counts a referenced
//!   protected page up (to 3) and an unreferenced one down; at 0 it is
//!   demoted to the probation head, not out (a second chance: one reference
//!   there promotes it again). A refault whose distance fits what the
//!   protected list may hold (the lists and the node's free pages, less the
//!   probation target) goes straight to it. A one-pass scan never touches a
//!   page twice, so it never reaches the protected list and cannot flush it.
//! - `Classic` (Linux 6.18, MGLRU off): new pages start inactive; a page is
//!   activated only when seen young at two consecutive inactive-tail visits
//!   (`PG_referenced`, `folio_check_references`); `shrink_active_list`
//!   deactivates every anon page it scans (setting `PG_workingset`); the active
//!   list is held to `inactive_ratio` times the inactive one; a refault is
//!   activated when its distance is at most the active anon list
//!   (`workingset_test_recent`).
//!
//! Invariants: the state byte is the LRU's per-frame word ([`crate::lru::LruLinks`]),
//! written by whoever owns the page's place on the lists (the LRU lock, or the
//! isolator while the page is isolated, or the fault before it queues the page).

/// Which eviction policy the anonymous LRU follows (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum LruPolicy {
    /// Probation FIFO feeding a protected CLOCK, shadow admission (mmkit's).
    #[default]
    Protected,
    /// Linux 6.18's classic active/inactive anon rules.
    Classic,
}

/// (Protected) Mapped young before any access was seen: the first accessed bit
/// found is the insertion's, not a reuse.
pub const LRU_FRESH: u8 = 1 << 0;
/// Linux's `PG_referenced`: seen young at the last inactive-tail visit.
pub const LRU_REFERENCED: u8 = 1 << 1;
/// Linux's `PG_workingset`: the page was active once (deactivated, or restored
/// by a refault); evictions record it in the shadow.
pub const LRU_WORKINGSET: u8 = 1 << 2;
/// A placement hint for the `lru_add` batch: link on the active list (a refault
/// that passed the distance test). Cleared when linked.
pub const LRU_ACTIVATE: u8 = 1 << 3;
const LRU_USE_SHIFT: u8 = 4;
/// (Protected) The use counter of the protected clock, 0..=3.
pub const LRU_USE_MASK: u8 = 3 << LRU_USE_SHIFT;
/// The highest use count.
pub const LRU_USE_MAX: u8 = 3;

/// The protected clock's use counter of a state byte.
pub const fn use_count(state: u8) -> u8 {
    (state & LRU_USE_MASK) >> LRU_USE_SHIFT
}

const fn with_use(state: u8, n: u8) -> u8 {
    (state & !LRU_USE_MASK) | (n << LRU_USE_SHIFT)
}

/// What reclaim does with a page from the inactive tail (Linux's
/// `folio_references`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TailVerdict {
    /// Swap it out.
    Reclaim,
    /// Back to the inactive head (looked at again later).
    Keep,
    /// To the active (protected) list.
    Activate,
}

/// What a scan of the active list does with a page.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ActiveVerdict {
    /// Back to the active head.
    Rotate,
    /// To the inactive head.
    Deactivate,
}

impl LruPolicy {
    /// The state a page newly mapped by a fault starts with: `young_unused` when
    /// its PTE was made young before any access (fault-around, a huge page) or
    /// when the faulting access set the accessed bit (Classic maps young).
    pub const fn new_page_state(self, young_unused: bool) -> u8 {
        match self {
            LruPolicy::Protected if young_unused => LRU_FRESH,
            _ => 0,
        }
    }

    /// Does the faulting access of this policy set the accessed bit? Classic
    /// maps young as x86 Linux does; Protected counts the fault as insertion.
    pub const fn fault_sets_young(self) -> bool {
        matches!(self, LruPolicy::Classic)
    }

    /// The verdict for a page at the inactive tail whose accessed bit was
    /// `referenced` (tested and cleared), and its new state.
    pub const fn inactive_tail(self, state: u8, referenced: bool) -> (TailVerdict, u8) {
        match self {
            LruPolicy::Protected => {
                let was = state & (LRU_REFERENCED | LRU_WORKINGSET) != 0;
                let state = state & !LRU_REFERENCED;
                if !referenced {
                    (TailVerdict::Reclaim, state & !LRU_FRESH)
                } else if state & LRU_FRESH != 0 {
                    (TailVerdict::Keep, state & !LRU_FRESH)
                } else if was {
                    (TailVerdict::Activate, with_use(state, 0))
                } else {
                    (TailVerdict::Keep, state | LRU_REFERENCED)
                }
            }
            LruPolicy::Classic => {
                let was = state & LRU_REFERENCED != 0;
                let state = state & !LRU_REFERENCED;
                if !referenced {
                    (TailVerdict::Reclaim, state)
                } else if was {
                    (TailVerdict::Activate, state | LRU_REFERENCED)
                } else {
                    (TailVerdict::Keep, state | LRU_REFERENCED)
                }
            }
        }
    }

    /// The verdict for a page scanned on the active list whose accessed bit was
    /// `referenced` (tested and cleared), and its new state. `force`: nothing
    /// could be reclaimed, every page goes down.
    pub const fn active_scan(
        self,
        state: u8,
        referenced: bool,
        force: bool,
    ) -> (ActiveVerdict, u8) {
        let demoted = (state & !LRU_FRESH & !LRU_USE_MASK) | LRU_WORKINGSET;
        match self {
            LruPolicy::Classic => (ActiveVerdict::Deactivate, demoted),
            LruPolicy::Protected => {
                let n = use_count(state);
                if force {
                    (ActiveVerdict::Deactivate, demoted)
                } else if referenced {
                    let n = if n < LRU_USE_MAX { n + 1 } else { n };
                    (ActiveVerdict::Rotate, with_use(state, n))
                } else if n > 0 {
                    (ActiveVerdict::Rotate, with_use(state, n - 1))
                } else {
                    (ActiveVerdict::Deactivate, demoted)
                }
            }
        }
    }

    /// Pages the inactive list should hold at least, of `active + inactive`
    /// (Protected: the probation target; Classic: the share `inactive_ratio`
    /// leaves it).
    pub fn inactive_target(self, active: u64, inactive: u64) -> u64 {
        let total = active + inactive;
        match self {
            LruPolicy::Protected => (total / 20).max(PROBATION_MIN),
            LruPolicy::Classic => total / (inactive_ratio(total) + 1),
        }
    }

    /// Linux's `inactive_is_low` (Classic), or the probation list under its
    /// target (Protected).
    pub fn inactive_is_low(self, active: u64, inactive: u64) -> bool {
        match self {
            LruPolicy::Classic => inactive * inactive_ratio(active + inactive) < active,
            LruPolicy::Protected => inactive < self.inactive_target(active, inactive),
        }
    }

    /// Is a refault `distance` evictions and activations after its eviction
    /// recent enough to activate (Linux's `workingset_test_recent`)?
    /// `active`/`inactive`: the node's lists now; `free`: the node's free
    /// pages (the lists may grow into them); `swap_free`: free swap slots
    /// exist (Linux counts anon in the workingset only then).
    pub fn refault_recent(
        self,
        distance: u64,
        active: u64,
        inactive: u64,
        free: u64,
        swap_free: bool,
    ) -> bool {
        match self {
            LruPolicy::Classic => swap_free && distance <= active,
            // Fits what the protected list may hold: the lists, grown into
            // the free pages, less the probation target. (After a large
            // unmap the lists are short, but a page that refaults within
            // a memory's worth of evictions is still the working set.)
            LruPolicy::Protected => {
                let room = active + inactive + free;
                distance <= room.saturating_sub(self.inactive_target(active + free, inactive))
            }
        }
    }
}

/// The smallest probation target (two reclaim batches).
pub const PROBATION_MIN: u64 = 64;

/// Linux's `inactive_ratio` for an LRU of `pages` 4 KiB pages: `int_sqrt(10 *
/// GiB)`, 1 below 1 GiB.
pub fn inactive_ratio(pages: u64) -> u64 {
    let gb = pages >> (30 - 12);
    if gb == 0 {
        1
    } else {
        int_sqrt(10 * gb)
    }
}

/// The integer square root (Linux's `int_sqrt`).
pub fn int_sqrt(x: u64) -> u64 {
    if x < 2 {
        return x;
    }
    // Newton's method from an over-estimate.
    let mut r = 1u64 << (64 - x.leading_zeros()).div_ceil(2);
    loop {
        let next = (r + x / r) / 2;
        if next >= r {
            return r;
        }
        r = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: LruPolicy = LruPolicy::Protected;
    const C: LruPolicy = LruPolicy::Classic;

    /// A page used once (the fault, then never again) never reaches the
    /// protected list, under either way of mapping it: a fault-mapped page
    /// whose accessed bit is the insertion's is reclaimed at its first tail
    /// visit; a fresh (fault-around) one is looked at twice, then reclaimed.
    #[test]
    fn used_once_never_protected() {
        let s = P.new_page_state(false);
        assert_eq!(P.inactive_tail(s, false).0, TailVerdict::Reclaim);
        let s = P.new_page_state(true);
        let (v, s) = P.inactive_tail(s, true); // the insertion's bit
        assert_eq!(v, TailVerdict::Keep);
        assert_eq!(P.inactive_tail(s, false).0, TailVerdict::Reclaim);
        // Classic too: a fault-mapped young page is kept once, then reclaimed.
        let s = C.new_page_state(false);
        let (v, s) = C.inactive_tail(s, true);
        assert_eq!(v, TailVerdict::Keep);
        assert_eq!(C.inactive_tail(s, false).0, TailVerdict::Reclaim);
    }

    /// A page used again after its fault is promoted when seen young at two
    /// tail visits in a row (a fresh page's first sighting is its
    /// insertion's and does not count); one that was in the working set at
    /// the first. Classic needs two young sightings in a row.
    #[test]
    fn reuse_promotes() {
        let (v, s) = P.inactive_tail(0, true);
        assert_eq!((v, s & LRU_REFERENCED), (TailVerdict::Keep, LRU_REFERENCED));
        let (v, s) = P.inactive_tail(s, true);
        assert_eq!((v, s & LRU_REFERENCED), (TailVerdict::Activate, 0));
        let (v, s) = P.inactive_tail(LRU_FRESH, true);
        assert_eq!((v, s), (TailVerdict::Keep, 0));
        let (v, s) = P.inactive_tail(s, true);
        assert_eq!(v, TailVerdict::Keep);
        assert_eq!(P.inactive_tail(s, true).0, TailVerdict::Activate);
        // A bit set long ago (the page's users moved on) promotes nothing:
        // young once, then not, and the page goes.
        let (_, s) = P.inactive_tail(0, true);
        let (v, s) = P.inactive_tail(s, false);
        assert_eq!((v, s & LRU_REFERENCED), (TailVerdict::Reclaim, 0));
        assert_eq!(
            P.inactive_tail(LRU_WORKINGSET, true).0,
            TailVerdict::Activate
        );
        let (v, s) = C.inactive_tail(0, true);
        assert_eq!((v, s & LRU_REFERENCED), (TailVerdict::Keep, LRU_REFERENCED));
        let (v, s) = C.inactive_tail(s, true);
        assert_eq!(v, TailVerdict::Activate);
        assert_ne!(s & LRU_REFERENCED, 0, "Linux keeps the mark on activation");
        // Not seen in between: the mark is gone, start over.
        let (v, s) = C.inactive_tail(LRU_REFERENCED, false);
        assert_eq!((v, s & LRU_REFERENCED), (TailVerdict::Reclaim, 0));
    }

    /// The protected clock counts up to 3 and down to 0 before it demotes; a
    /// demoted page lands in probation with the workingset bit and no fresh
    /// mark, so one reference there promotes it again: a second chance.
    #[test]
    fn demotion_gives_second_chance() {
        let (v, mut s) = P.inactive_tail(LRU_REFERENCED, true);
        assert_eq!(v, TailVerdict::Activate);
        for _ in 0..5 {
            let (v, n) = P.active_scan(s, true, false);
            assert_eq!(v, ActiveVerdict::Rotate);
            s = n;
        }
        assert_eq!(use_count(s), LRU_USE_MAX);
        for left in (0..LRU_USE_MAX).rev() {
            let (v, n) = P.active_scan(s, false, false);
            assert_eq!((v, use_count(n)), (ActiveVerdict::Rotate, left));
            s = n;
        }
        let (v, s) = P.active_scan(s, false, false);
        assert_eq!(v, ActiveVerdict::Deactivate);
        assert_ne!(s & LRU_WORKINGSET, 0);
        assert_eq!(P.inactive_tail(s, true).0, TailVerdict::Activate);
        // Forced, even a hot page goes down.
        let hot = with_use(0, 3);
        assert_eq!(P.active_scan(hot, true, true).0, ActiveVerdict::Deactivate);
        // Classic deactivates every anon page it scans.
        assert_eq!(C.active_scan(0, true, false).0, ActiveVerdict::Deactivate);
    }

    #[test]
    fn sizing_and_refault_tests() {
        // 64 MiB: ratio 1, active held at most to inactive.
        assert_eq!(inactive_ratio(16384), 1);
        assert_eq!(inactive_ratio(10 << 18), 10);
        assert_eq!(inactive_ratio(1 << 18), 3);
        assert!(C.inactive_is_low(9000, 7000));
        assert!(!C.inactive_is_low(7000, 9000));
        assert_eq!(P.inactive_target(14000, 2000), 800);
        assert_eq!(P.inactive_target(10, 10), PROBATION_MIN);
        assert!(P.inactive_is_low(15500, 500));
        assert!(!P.inactive_is_low(15000, 1000));
        // Refault tests.
        assert!(C.refault_recent(100, 100, 5000, 0, true));
        assert!(!C.refault_recent(101, 100, 5000, 0, true));
        assert!(!C.refault_recent(101, 100, 5000, 9000, true));
        assert!(!C.refault_recent(0, 100, 5000, 0, false));
        assert!(P.refault_recent(15200, 14000, 2000, 0, true));
        assert!(!P.refault_recent(15201, 14000, 2000, 0, true));
        // Short lists after an unmap: what they may grow into counts.
        assert!(P.refault_recent(15200, 1000, 1000, 14000, true));
        assert!(!P.refault_recent(15201, 1000, 1000, 14000, true));
        for x in [0u64, 1, 2, 3, 4, 15, 16, 17, 99, 100, 1 << 40, u64::MAX] {
            let r = int_sqrt(x);
            assert!(r * r <= x && (r + 1).checked_mul(r + 1).is_none_or(|y| y > x));
        }
    }
}
