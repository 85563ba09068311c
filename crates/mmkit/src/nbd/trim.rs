//! Discard of freed swap slots on the server (`NBD_CMD_TRIM`, Linux's
//! `discard_swap_cluster`): a freed slot sets a bit; a background thread takes
//! the bits a word (64 slots) at a time and trims runs of them, so the free
//! path costs one atomic OR and the server (nbdkit's memory plugin, a sparse
//! file) gives the memory back.
//!
//! Invariant: a trim never lands after a later write to its slot. A write
//! first clears its slots' pending bits (a trim not yet taken is dropped),
//! then waits while any of its slots is in a word being trimmed (one word's
//! trims, never a whole pass). The trimmer marks a word in flight *before* it
//! takes the word's pending bits, and only trims the bits it took: a write
//! that cleared a bit first is not trimmed; one that cleared it later finds
//! the word in flight and waits for the trim's reply.
//!
//! Locking: bitmaps are atomics; `gate` (with `cv`) only parks writers that
//! must wait for a trim in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

const PERIOD: Duration = Duration::from_millis(20);

pub(crate) struct TrimState {
    pending: Box<[AtomicU64]>,
    inflight: Box<[AtomicU64]>,
    gate: Mutex<()>,
    cv: Condvar,
    stop: AtomicBool,
    pub(crate) trimmed: AtomicU64,
}

impl TrimState {
    pub(crate) fn new(nr_slots: u32) -> TrimState {
        let words = (nr_slots as usize).div_ceil(64);
        TrimState {
            pending: (0..words).map(|_| AtomicU64::new(0)).collect(),
            inflight: (0..words).map(|_| AtomicU64::new(0)).collect(),
            gate: Mutex::new(()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            trimmed: AtomicU64::new(0),
        }
    }

    /// Slot `slot` was freed.
    pub(crate) fn mark(&self, slot: u32) {
        self.pending[slot as usize / 64].fetch_or(1 << (slot % 64), Ordering::SeqCst);
    }

    fn words(first: u32, n: u32) -> impl Iterator<Item = (usize, u64)> {
        let (first, end) = (first as u64, first as u64 + n as u64);
        (first / 64..end.div_ceil(64)).map(move |w| {
            let lo = (w * 64).max(first) - w * 64;
            let hi = ((w + 1) * 64).min(end) - w * 64;
            let mask = if hi - lo == 64 {
                !0
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            (w as usize, mask)
        })
    }

    /// Slots `first..first + n` are about to be written.
    pub(crate) fn before_write(&self, first: u32, n: u32) {
        for (w, mask) in Self::words(first, n) {
            if self.pending[w].load(Ordering::SeqCst) & mask != 0 {
                self.pending[w].fetch_and(!mask, Ordering::SeqCst);
            }
            if self.inflight[w].load(Ordering::SeqCst) & mask != 0 {
                let mut g = self.gate.lock();
                while self.inflight[w].load(Ordering::SeqCst) & mask != 0 {
                    self.cv.wait_for(&mut g, PERIOD);
                }
            }
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _g = self.gate.lock();
        self.cv.notify_all();
    }

    /// The trimmer thread: every period, trims what was freed.
    /// `trim(first_slot, nr_slots)` sends one trim and waits for its reply.
    pub(crate) fn run(&self, trim: impl Fn(u32, u32)) {
        while !self.stop.load(Ordering::Acquire) {
            {
                let mut g = self.gate.lock();
                self.cv.wait_for(&mut g, PERIOD);
            }
            for w in 0..self.pending.len() {
                let t = self.pending[w].load(Ordering::SeqCst);
                if t == 0 {
                    continue;
                }
                self.inflight[w].fetch_or(t, Ordering::SeqCst);
                let old = self.pending[w].fetch_and(!t, Ordering::SeqCst);
                self.trim_word(w, old & t, &trim);
                // A writer waits for this word's trims only, not a batch's.
                self.inflight[w].fetch_and(!t, Ordering::SeqCst);
                {
                    let _g = self.gate.lock();
                    self.cv.notify_all();
                }
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
            }
        }
    }

    fn trim_word(&self, w: usize, mut bits: u64, trim: &impl Fn(u32, u32)) {
        while bits != 0 {
            let lo = bits.trailing_zeros();
            let run = (bits >> lo).trailing_ones();
            trim(w as u32 * 64 + lo, run);
            self.trimmed.fetch_add(run as u64, Ordering::Relaxed);
            bits &= if lo + run == 64 {
                0
            } else {
                !0u64 << (lo + run)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_cover_ranges() {
        let v: Vec<_> = TrimState::words(60, 70).collect();
        assert_eq!(v, vec![(0, 0xf << 60), (1, !0), (2, 0b11)]);
        let v: Vec<_> = TrimState::words(64, 64).collect();
        assert_eq!(v, vec![(1, !0)]);
        let v: Vec<_> = TrimState::words(3, 1).collect();
        assert_eq!(v, vec![(0, 1 << 3)]);
    }

    #[test]
    fn runs_and_cancelled_bits() {
        let t = TrimState::new(256);
        for s in [0, 1, 2, 10, 63, 64, 65, 200] {
            t.mark(s);
        }
        t.before_write(10, 1); // cancels slot 10's trim
        let got = Mutex::new(Vec::new());
        t.stop.store(false, Ordering::Release);
        // One pass by hand: take and trim every word.
        for w in 0..t.pending.len() {
            let bits = t.pending[w].swap(0, Ordering::SeqCst);
            t.trim_word(w, bits, &|a, n| got.lock().push((a, n)));
        }
        assert_eq!(*got.lock(), vec![(0, 3), (63, 1), (64, 2), (200, 1)]);
        assert_eq!(t.trimmed.load(Ordering::Relaxed), 7);
    }
}
