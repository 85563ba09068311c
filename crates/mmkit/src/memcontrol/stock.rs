//! The per-CPU charge stock (Linux's `memcg_stock_pcp` with `consume_stock`,
//! `refill_stock` and `drain_stock`), lock-free: each CPU has
//! [`NR_STOCK`] slots, each one word packing a group id (the high 16 bits)
//! and the pages charged ahead for that group on this CPU (the low 48 bits;
//! a word with no pages is a free slot whatever its id). Every change of a
//! slot is one compare-and-swap or swap, so a charge served from the stock
//! costs one uncontended atomic on this CPU's cache line and no lock.
//!
//! Where Linux disables preemption (a local lock), a thread here may be
//! migrated between reading its CPU number and its atomic: it then works on
//! another CPU's slots, which is merely slower (the line moves), never
//! wrong, because the slots are atomics and not CPU-private.
//!
//! Invariants:
//! - every page a slot holds is charged to its group's counter, and moves
//!   out of the slot exactly once: to a fault (`consume`), or back to the
//!   counter (a slot over [`CHARGE_BATCH`](super::charge::CHARGE_BATCH), an
//!   eviction, a drain), always by the atomic operation that removes it
//!   from the word; so `usage == pages owned + pages stocked` holds exactly;
//! - only a holder of a group (a charger) adds pages for it, so once a
//!   dying group's slots are drained (`drain_id`), none gets pages again;
//! - a thread that took a slot it did not charge for (an eviction, a drain
//!   of every slot) is counted in `takers` from before its swap until it has
//!   uncharged the group it took: a dying group waits for `takers` to reach
//!   0 after draining its own slots (`wait_takers`), so a taker's group,
//!   looked up by id, stays alive until the taker is done with it.
//!   (Release sequence: all writes to a slot are read-modify-writes, so the
//!   drain's acquire load of a slot synchronises with the taker's swap that
//!   emptied it, and so sees the taker's increment; it then waits.)
//!
//! Locking: none. Takers use the group table's id-to-group pointers under
//! the protocol above rather than its lock.

use std::sync::atomic::Ordering;

use crossbeam_utils::CachePadded;

use crate::sync::{relax, AtomicU64, AtomicU8};

/// Groups one CPU's stock serves at once (Linux's `NR_MEMCG_STOCK`).
#[cfg(not(loom))]
pub(crate) const NR_STOCK: usize = 4;
/// Slots per CPU under loom: two, enough to evict and to share.
#[cfg(loom)]
pub(crate) const NR_STOCK: usize = 2;

const PAGES_BITS: u32 = 48;
const PAGES_MASK: u64 = (1 << PAGES_BITS) - 1;

#[inline]
fn word(id: u16, pages: u64) -> u64 {
    (u64::from(id) << PAGES_BITS) | pages
}

#[inline]
fn id_of(w: u64) -> u16 {
    (w >> PAGES_BITS) as u16
}

#[inline]
fn pages_of(w: u64) -> u64 {
    w & PAGES_MASK
}

/// One CPU's slots.
#[derive(Default)]
struct StockCpu {
    slots: [AtomicU64; NR_STOCK],
    /// The slot the next eviction takes (a hint: racing evictors may pick
    /// the same one; each swap still takes what it replaced exactly).
    next: AtomicU8,
}

/// Every CPU's stock, and the count of threads holding pages they took from
/// a slot of another group.
pub(crate) struct Stocks {
    cpus: Box<[CachePadded<StockCpu>]>,
    takers: AtomicU64,
}

/// What [`Stocks::refill`] did with the pages.
pub(crate) enum Refilled<'a> {
    /// They are in a slot.
    Kept,
    /// The group's slot would exceed the batch: these pages (the slot's and
    /// the new ones) left the stock and must be uncharged from the group.
    Overflow(u64),
    /// They took a slot from another group, whose pages must be uncharged.
    Evicted(Taken<'a>),
}

/// Pages taken out of slots not of the taker's own group; dropping it ends
/// the take (`takers`), so uncharge every group first.
pub(crate) struct Taken<'a> {
    /// (group id, pages), pages > 0.
    pub(crate) pages: Vec<(u16, u64)>,
    stocks: &'a Stocks,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        // Release: the uncharges done under the take happen before a dying
        // group's `wait_takers` sees the count fall.
        self.stocks.takers.fetch_sub(1, Ordering::Release);
    }
}

impl Stocks {
    pub(crate) fn new(nr_cpus: usize) -> Stocks {
        Stocks {
            cpus: (0..nr_cpus.max(1))
                .map(|_| CachePadded::new(StockCpu::default()))
                .collect(),
            takers: AtomicU64::new(0),
        }
    }

    fn cpu(&self, cpu: usize) -> &StockCpu {
        &self.cpus[cpu % self.cpus.len()]
    }

    /// Takes `nr` pages stocked for group `id` on `cpu`; false when no slot
    /// of it holds that many.
    #[inline]
    pub(crate) fn consume(&self, cpu: usize, id: u16, nr: u64) -> bool {
        for s in &self.cpu(cpu).slots {
            let mut w = s.load(Ordering::Relaxed);
            while id_of(w) == id && pages_of(w) >= nr {
                match s.compare_exchange_weak(w, w - nr, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return true,
                    Err(x) => w = x,
                }
            }
        }
        false
    }

    /// Keeps `nr` pages charged to group `id` in `cpu`'s stock, at most
    /// `batch` in the group's slot; a full stock evicts a slot.
    pub(crate) fn refill(&self, cpu: usize, id: u16, nr: u64, batch: u64) -> Refilled<'_> {
        let c = self.cpu(cpu);
        for s in &c.slots {
            let mut w = s.load(Ordering::Relaxed);
            while id_of(w) == id {
                let total = pages_of(w) + nr;
                let (new, over) = if total > batch {
                    (word(id, 0), total)
                } else {
                    (word(id, total), 0)
                };
                match s.compare_exchange_weak(w, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) if over > 0 => return Refilled::Overflow(over),
                    Ok(_) => return Refilled::Kept,
                    Err(x) => w = x,
                }
            }
        }
        for s in &c.slots {
            let mut w = s.load(Ordering::Relaxed);
            while pages_of(w) == 0 {
                match s.compare_exchange_weak(w, word(id, nr), Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return Refilled::Kept,
                    Err(x) => w = x,
                }
            }
        }
        // Every slot holds pages of another group: evict one.
        self.takers.fetch_add(1, Ordering::Relaxed);
        let k = usize::from(c.next.load(Ordering::Relaxed)) % NR_STOCK;
        c.next.store(((k + 1) % NR_STOCK) as u8, Ordering::Relaxed);
        // AcqRel: the increment above is sequenced before this release.
        let old = c.slots[k].swap(word(id, nr), Ordering::AcqRel);
        let mut t = Taken {
            pages: Vec::new(),
            stocks: self,
        };
        if pages_of(old) > 0 {
            t.pages.push((id_of(old), pages_of(old)));
        }
        Refilled::Evicted(t)
    }

    /// Empties every slot of every CPU (Linux's `drain_all_stock`, which
    /// the callers use for one subtree; all slots are taken here, and the
    /// other groups' pages go back to their counters too).
    pub(crate) fn take_all(&self) -> Taken<'_> {
        self.takers.fetch_add(1, Ordering::Relaxed);
        let mut t = Taken {
            pages: Vec::new(),
            stocks: self,
        };
        for c in self.cpus.iter() {
            for s in &c.slots {
                if pages_of(s.load(Ordering::Relaxed)) == 0 {
                    continue;
                }
                let old = s.swap(0, Ordering::AcqRel);
                if pages_of(old) > 0 {
                    t.pages.push((id_of(old), pages_of(old)));
                }
            }
        }
        t
    }

    /// Empties group `id`'s slots on every CPU; the pages taken (the caller
    /// uncharges them). For a group being freed, follow with
    /// [`wait_takers`](Self::wait_takers).
    pub(crate) fn drain_id(&self, id: u16) -> u64 {
        let mut taken = 0;
        for c in self.cpus.iter() {
            for s in &c.slots {
                // Acquire: see the module header (a taker's swap).
                let mut w = s.load(Ordering::Acquire);
                while id_of(w) == id && pages_of(w) > 0 {
                    match s.compare_exchange_weak(w, 0, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            taken += pages_of(w);
                            break;
                        }
                        Err(x) => w = x,
                    }
                }
            }
        }
        taken
    }

    /// Waits until no thread holds pages taken from another group's slot
    /// (after `drain_id` of a dying group: then none can hold its pages).
    pub(crate) fn wait_takers(&self) {
        while self.takers.load(Ordering::Acquire) != 0 {
            relax();
        }
    }

    /// Pages stocked for group `id` now (a snapshot).
    pub(crate) fn stocked(&self, id: u16) -> u64 {
        self.cpus
            .iter()
            .flat_map(|c| c.slots.iter())
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&w| id_of(w) == id)
            .map(pages_of)
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn consume_refill_evict_and_drain_are_exact() {
        let s = Stocks::new(2);
        assert!(!s.consume(0, 1, 1));
        assert!(matches!(s.refill(0, 1, 60, 64), Refilled::Kept));
        assert!(s.consume(0, 1, 16));
        assert!(!s.consume(1, 1, 1));
        assert_eq!(s.stocked(1), 44);
        // Over the batch: the slot and the new pages go back.
        assert!(matches!(s.refill(0, 1, 30, 64), Refilled::Overflow(74)));
        assert_eq!(s.stocked(1), 0);
        for id in 1..=NR_STOCK as u16 {
            assert!(matches!(s.refill(0, id, 5, 64), Refilled::Kept));
        }
        let Refilled::Evicted(t) = s.refill(0, 99, 7, 64) else {
            panic!("a full stock evicts");
        };
        assert_eq!(t.pages.len(), 1);
        assert_eq!(t.pages[0].1, 5);
        drop(t);
        assert_eq!(s.stocked(99), 7);
        assert_eq!(s.drain_id(99), 7);
        assert_eq!(s.stocked(99), 0);
        let t = s.take_all();
        assert_eq!(
            t.pages.iter().map(|x| x.1).sum::<u64>(),
            5 * (NR_STOCK as u64 - 1)
        );
        drop(t);
        s.wait_takers();
        assert_eq!((1..=100).map(|id| s.stocked(id)).sum::<u64>(), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom models of the stock protocol: a charger that refills and
    //! consumes, racing a drain of its group (limit change) or a dying
    //! group's drain and wait; the counts are exact afterwards, and a taker
    //! never touches a group after it is freed (loom's `UnsafeCell` flags
    //! that as a race).
    //!
    //! Run: `RUSTFLAGS="--cfg loom" cargo test -p mmkit --lib --release memcontrol::stock::loom`
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64 as Counter;
    use loom::sync::Arc;
    use loom::thread;

    /// A charger stocks and consumes for group 1 while another thread
    /// drains every slot: usage (charged) == consumed + stocked at the end.
    #[test]
    fn loom_stock_consume_races_take_all() {
        loom::model(|| {
            let s = Arc::new(Stocks::new(1));
            let usage = Arc::new(Counter::new(0));
            let (s2, u2) = (s.clone(), usage.clone());
            let charger = thread::spawn(move || {
                let mut used = 0;
                // A charge of 1 page with a batch of 4: 3 stocked.
                u2.fetch_add(4, Ordering::Relaxed);
                used += 1;
                match s2.refill(0, 1, 3, 4) {
                    Refilled::Kept => {}
                    Refilled::Overflow(n) => {
                        u2.fetch_sub(n, Ordering::Relaxed);
                    }
                    Refilled::Evicted(_) => unreachable!("one group"),
                }
                if s2.consume(0, 1, 2) {
                    used += 2;
                }
                used
            });
            let t = s.take_all();
            for &(id, n) in &t.pages {
                assert_eq!(id, 1);
                usage.fetch_sub(n, Ordering::Relaxed);
            }
            drop(t);
            let used = charger.join().unwrap();
            assert_eq!(usage.load(Ordering::Relaxed), used + s.stocked(1));
        });
    }

    /// Group 2 is dying (its last handle dropped): it drains its slots,
    /// waits for takers, then is freed; meanwhile group 1's charger evicts
    /// group 2's slot and uncharges group 2. The eviction's use of group 2
    /// (a read of its memory) must happen before the free (a write), and
    /// group 2's counter ends at exactly 0.
    #[test]
    fn loom_stock_eviction_races_dying_group() {
        loom::model(|| {
            let s = Arc::new(Stocks::new(1));
            // Group 2: its counter, and its memory (freed by its drop).
            let usage = Arc::new(Counter::new(0));
            let memory = Arc::new(UnsafeCell::new(true));
            // Fill both slots: group 3's and group 2's, 1 page each.
            for id in [3, 2] {
                usage.fetch_add(u64::from(id == 2), Ordering::Relaxed);
                assert!(matches!(s.refill(0, id, 1, 4), Refilled::Kept));
            }
            let (s2, u2, m2) = (s.clone(), usage.clone(), memory.clone());
            let evictor = thread::spawn(move || {
                // Evicts slot 0 (group 3) for group 1, then slot 1 (group
                // 2, unless drained meanwhile) for group 4.
                for id in [1, 4] {
                    if let Refilled::Evicted(t) = s2.refill(0, id, 1, 4) {
                        for &(id, n) in &t.pages {
                            if id == 2 {
                                // SAFETY: the take keeps group 2 alive (the
                                // model checks it against the free below).
                                m2.with(|alive| assert!(unsafe { *alive }));
                                u2.fetch_sub(n, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
            let n = s.drain_id(2);
            usage.fetch_sub(n, Ordering::Relaxed);
            s.wait_takers();
            assert_eq!(usage.load(Ordering::Relaxed), 0);
            // SAFETY: group 2's free, under the protocol.
            memory.with_mut(|alive| unsafe { *alive = false });
            evictor.join().unwrap();
        });
    }
}
