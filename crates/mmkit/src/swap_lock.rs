//! The locks of the swap layer, and how they count their own contention.
//!
//! Purpose: the lab reports contention for three classes of swap locks (the device
//! lock `si->lock`, the cluster locks `ci->lock`, the swap-cache trunk locks); each
//! class has one [`LockClassStats`] shared by all of its locks, and every lock of the
//! class is a [`StatLock`] that records into it when taken.
//!
//! Invariants: an acquisition is counted once, after the lock is held; it is
//! "contended" when a first `try_lock` failed, and then the time spent waiting is
//! added to `wait_ns`. A successful `try_lock` counts as an uncontended acquisition;
//! a failed one counts nothing (the caller did not take the lock).
//!
//! Locking: the counters are per-CPU shards of relaxed atomics (Linux's per-CPU
//! statistics), folded on read, so counting never adds a shared cache line to the
//! lock it measures. A snapshot taken while locks are in use is a racy sum.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::{LockStats, Platform};
use parking_lot::{Mutex, MutexGuard};

use crate::platform::StdPlatform;

/// Shards of a lock class's counters (a power of two; CPUs beyond share shards).
const STAT_SHARDS: usize = 64;

/// Counters of one lock class: acquisitions, contended acquisitions, wait time.
pub(crate) struct LockClassStats {
    shards: Box<[CachePadded<[AtomicU64; 3]>]>,
}

impl LockClassStats {
    pub(crate) fn new() -> LockClassStats {
        LockClassStats {
            shards: (0..STAT_SHARDS)
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
        }
    }

    #[inline]
    fn record(&self, waited_ns: Option<u64>) {
        let s = &self.shards[StdPlatform::cpu_id() & (STAT_SHARDS - 1)];
        s[0].fetch_add(1, Ordering::Relaxed);
        if let Some(w) = waited_ns {
            s[1].fetch_add(1, Ordering::Relaxed);
            s[2].fetch_add(w, Ordering::Relaxed);
        }
    }

    /// The folded counters.
    pub(crate) fn snapshot(&self) -> LockStats {
        let mut out = LockStats::default();
        for s in self.shards.iter() {
            out.acquisitions += s[0].load(Ordering::Relaxed);
            out.contended += s[1].load(Ordering::Relaxed);
            out.wait_ns += s[2].load(Ordering::Relaxed);
        }
        out
    }
}

/// A mutex that records its acquisitions into the [`LockClassStats`] it is given.
pub(crate) struct StatLock<T> {
    inner: Mutex<T>,
}

impl<T> StatLock<T> {
    pub(crate) const fn new(v: T) -> StatLock<T> {
        StatLock {
            inner: Mutex::new(v),
        }
    }

    /// Takes the lock, counting the acquisition (and the wait, when it was held).
    #[inline]
    pub(crate) fn lock<'a>(&'a self, stats: &LockClassStats) -> MutexGuard<'a, T> {
        if let Some(g) = self.inner.try_lock() {
            stats.record(None);
            return g;
        }
        let t0 = StdPlatform::now_ns();
        let g = self.inner.lock();
        stats.record(Some(StdPlatform::now_ns().saturating_sub(t0)));
        g
    }

    /// Takes the lock only if it is free (counted as uncontended when it is).
    #[inline]
    pub(crate) fn try_lock<'a>(&'a self, stats: &LockClassStats) -> Option<MutexGuard<'a, T>> {
        let g = self.inner.try_lock()?;
        stats.record(None);
        Some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_lock_counts_acquisitions_and_contention() {
        let stats = LockClassStats::new();
        let l = StatLock::new(0u32);
        for _ in 0..10 {
            *l.lock(&stats) += 1;
        }
        let g = l.lock(&stats);
        assert!(l.try_lock(&stats).is_none());
        drop(g);
        let s = stats.snapshot();
        assert_eq!(s.acquisitions, 11);
        assert_eq!(s.contended, 0);

        let stats = std::sync::Arc::new(stats);
        let l = std::sync::Arc::new(l);
        let g = l.lock(&stats);
        let (l2, s2) = (l.clone(), stats.clone());
        let t = std::thread::spawn(move || {
            *l2.lock(&s2) += 1;
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(g);
        t.join().unwrap();
        let s = stats.snapshot();
        assert_eq!(s.acquisitions, 13);
        assert_eq!(s.contended, 1);
        assert!(s.wait_ns > 0);
        assert_eq!(*l.lock(&stats), 11);
    }
}
