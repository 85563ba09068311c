//! What starts a space's automatic NUMA scan pass (Linux's `task_tick_numa`,
//! which names the file, and the `numa_next_scan` gate of `task_numa_work`),
//! for the progress-driven triggers [`ScanTrigger::TaskCpu`] and
//! [`ScanTrigger::Accesses`]. The pass itself is `task_numa.rs`.
//!
//! Each space with balancing on keeps a clock of its own, `clock_ns`: the CPU
//! time its threads spent (TaskCpu) or a fixed cost per page accessed
//! (Accesses), and the clock value at which the next pass is due,
//! `next_scan_ns`. The public access calls (`read`, `write`, `touch`,
//! `populate`, `with_page`, `pin_page`) end, once the VMA lock is dropped, with
//! [`SpaceInner::task_tick_numa`] (Linux's return to user space): it advances the
//! clock by this call's share and, when the clock has reached `next_scan_ns`,
//! the one thread whose compare-exchange claims the due time runs
//! `task_numa_work` itself, which sets the next due time to the clock value
//! that claimed it plus the new period.
//! Scan passes so follow the work done by the space's threads, not the wall
//! clock, whatever else runs on the host.
//!
//! TaskCpu samples the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`, a system
//! call) only every `TICK_PAGES` pages a thread accesses in one space; the time
//! since its previous sample in that space is added to the space's clock. A
//! thread that moves to another space starts over there (the time in between is
//! charged to neither). Spaces are told apart by address, so a new space at a
//! dropped one's address may be charged a thread's time since its last sample
//! there: one early pass at worst. Under `Adaptive`, a thread at a sample point also checks
//! whether a node the scanner avoids as full has room again, and if so scans at
//! once (recovery does not wait out a backed-off period); that check reads the
//! nodes' free counts without a lock.
//!
//! Invariants: `next_scan_ns` is `u64::MAX` only while a claimed pass runs; the
//! clock only grows. Locking: none of its own; both values are atomics, and
//! the compare-exchange on `next_scan_ns` lets one thread scan per due time (as
//! Linux's `cmpxchg` on `mm->numa_next_scan`). The tick runs with no VMA or
//! page lock held.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use mmkit_core::node::NodeMask;

use super::task_numa::{still_full, thread_cpu_ns};
use super::SpaceInner;
use crate::numa_balancing::ScanTrigger;

/// TaskCpu: pages a thread accesses in a space between two samples of its CPU
/// clock (a sample is a system call of some 100 ns; a page access is several).
pub(crate) const TICK_PAGES: u64 = 32;

/// One thread's sampling state (Linux keeps `node_stamp` per task).
#[derive(Copy, Clone)]
struct Tick {
    /// The space sampled last (its `SpaceNumab`'s address; 0: none).
    space: usize,
    /// The thread's CPU time at that sample.
    last_ns: u64,
    /// Pages left until the next sample.
    left: u64,
}

thread_local! {
    static TICK: Cell<Tick> = const {
        Cell::new(Tick {
            space: 0,
            last_ns: 0,
            left: 0,
        })
    };
}

/// TaskCpu: the CPU time this thread spent since its previous sample in
/// `space`, when `pages` more page accesses make a sample due (None
/// otherwise). 0 on the first sample in a space.
fn sample_cpu(space: usize, pages: u64) -> Option<u64> {
    TICK.with(|t| {
        let mut k = t.get();
        if k.space == space && k.left > pages {
            k.left -= pages;
            t.set(k);
            return None;
        }
        let now = thread_cpu_ns();
        let delta = if k.space == space {
            now.saturating_sub(k.last_ns)
        } else {
            0
        };
        t.set(Tick {
            space,
            last_ns: now,
            left: TICK_PAGES,
        });
        Some(delta)
    })
}

impl SpaceInner {
    /// The end of an access call of `pages` pages: advances the space's scan
    /// clock and runs a due scan pass in this thread (see the header). One
    /// atomic load when balancing is off.
    #[inline]
    pub(super) fn task_tick_numa(&self, pages: u64) {
        if !self.numab.enabled.load(Ordering::Relaxed) {
            return;
        }
        self.task_tick_numa_slow(pages);
    }

    #[inline(never)]
    fn task_tick_numa_slow(&self, pages: u64) {
        let (now, sampled) = match self.mm.inner.numab.trigger {
            ScanTrigger::TaskCpu => {
                let me = &self.numab as *const _ as usize;
                let Some(delta) = sample_cpu(me, pages) else {
                    return;
                };
                (
                    self.numab.clock_ns.fetch_add(delta, Ordering::Relaxed) + delta,
                    true,
                )
            }
            ScanTrigger::Accesses { ns } => {
                let d = ns.saturating_mul(pages);
                (
                    self.numab.clock_ns.fetch_add(d, Ordering::Relaxed) + d,
                    false,
                )
            }
            ScanTrigger::Manual | ScanTrigger::Wall => return,
        };
        let next = self.numab.next_scan_ns.load(Ordering::Acquire);
        if next == u64::MAX {
            return; // a pass is running
        }
        let due = now >= next || (sampled && self.avoided_node_has_room());
        if due
            && self
                .numab
                .next_scan_ns
                .compare_exchange(next, u64::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.task_numa_work(Some(now));
        }
    }

    /// Adaptive: does a node the scanner avoids as full have free pages above
    /// its high watermark again? (A few atomic loads, not timed.)
    fn avoided_node_has_room(&self) -> bool {
        let avoid = NodeMask::from_bits(self.numab.avoid_bits.load(Ordering::Relaxed));
        !avoid.is_empty() && still_full(&self.mm, avoid) != avoid
    }
}
