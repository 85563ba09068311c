//! mm's lock types and the loom switch: the counting lock [`StatLock`] that the
//! swap layer (device lock `si->lock`, cluster locks `ci->lock`, swap-cache trunk
//! locks) and the LRU (its shard locks) are built from, and, under `--cfg loom`,
//! loom's lock, atomics and `relax` in their place, so that `swap_cluster/` runs
//! unchanged in a model. Each lock class has one [`LockClassStats`] shared by all
//! of its locks; every lock of the class records into it when taken. Where each
//! lock sits in mm's lock order: `rmap.rs`'s header.
//!
//! Invariants: an acquisition is counted once, after the lock is held; it is
//! "contended" when a first `try_lock` failed, and then the time spent waiting is
//! added to `wait_ns`. A successful `try_lock` counts as an uncontended acquisition;
//! a failed one counts nothing (the caller did not take the lock).
//!
//! Locking: the counters are per-CPU shards of relaxed atomics (Linux's per-CPU
//! statistics), folded on read, so counting never adds a shared cache line to the
//! lock it measures. A snapshot taken while locks are in use is a racy sum.

use crossbeam_utils::CachePadded;
use mmkit_core::{LockStats, Platform};

use crate::platform::StdPlatform;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicU8};
#[cfg(loom)]
use loom_lock::{Guard as MutexGuard, Mutex};
#[cfg(not(loom))]
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::Ordering;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicU8};

/// A held [`StatLock`].
pub(crate) type Guard<'a, T> = MutexGuard<'a, T>;

/// The lock under loom: a test-and-set word on loom's atomics, with the data in
/// loom's `UnsafeCell`, which flags any access outside the lock. (loom's own
/// `Mutex` treats a thread whose `try_lock` failed as waiting for the lock, and so
/// reports deadlocks a `try_lock` protocol cannot have.)
#[cfg(loom)]
mod loom_lock {
    use loom::cell::{MutPtr, UnsafeCell};
    use loom::sync::atomic::{AtomicBool, Ordering};

    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        data: UnsafeCell<T>,
    }

    // SAFETY: the data is only reached through a Guard, which exists only while
    // `locked` is held by its thread.
    unsafe impl<T: Send> Sync for Mutex<T> {}

    pub(crate) struct Guard<'a, T> {
        lock: &'a Mutex<T>,
        ptr: Option<MutPtr<T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Mutex<T> {
            Mutex {
                locked: AtomicBool::new(false),
                data: UnsafeCell::new(v),
            }
        }
        pub(crate) fn try_lock(&self) -> Option<Guard<'_, T>> {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            Some(Guard {
                lock: self,
                ptr: Some(self.data.get_mut()),
            })
        }
        pub(crate) fn lock(&self) -> Guard<'_, T> {
            loop {
                if let Some(g) = self.try_lock() {
                    return g;
                }
                loom::thread::yield_now();
            }
        }
    }

    impl<T> std::ops::Deref for Guard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the guard holds the lock, so no other reference to the data
            // exists; loom's cell checks that claim.
            unsafe { self.ptr.as_ref().unwrap().deref() }
        }
    }

    impl<T> std::ops::DerefMut for Guard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as for `deref`, and `&mut self` makes this borrow unique.
            unsafe { self.ptr.as_ref().unwrap().deref() }
        }
    }

    impl<T> Drop for Guard<'_, T> {
        fn drop(&mut self) {
            self.ptr = None;
            self.lock.locked.store(false, Ordering::Release);
        }
    }
}

/// Called while waiting for another thread to make progress.
pub(crate) fn relax() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Shards of a lock class's counters (a power of two; CPUs beyond share shards).
const STAT_SHARDS: usize = 64;

/// Counters of one lock class: acquisitions, contended acquisitions, wait time.
pub(crate) struct LockClassStats {
    shards: Box<[CachePadded<[std::sync::atomic::AtomicU64; 3]>]>,
}

impl LockClassStats {
    pub(crate) fn new() -> LockClassStats {
        LockClassStats {
            shards: (0..STAT_SHARDS)
                .map(|_| CachePadded::new(Default::default()))
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
    pub(crate) fn new(v: T) -> StatLock<T> {
        StatLock {
            inner: Mutex::new(v),
        }
    }

    #[cfg(not(loom))]
    #[inline]
    fn raw_try_lock(&self) -> Option<Guard<'_, T>> {
        self.inner.try_lock()
    }
    #[cfg(loom)]
    fn raw_try_lock(&self) -> Option<Guard<'_, T>> {
        self.inner.try_lock()
    }
    #[cfg(not(loom))]
    #[inline]
    fn raw_lock(&self) -> Guard<'_, T> {
        self.inner.lock()
    }
    #[cfg(loom)]
    fn raw_lock(&self) -> Guard<'_, T> {
        self.inner.lock()
    }

    /// Takes the lock, counting the acquisition (and the wait, when it was held).
    #[inline]
    pub(crate) fn lock<'a>(&'a self, stats: &LockClassStats) -> Guard<'a, T> {
        if let Some(g) = self.raw_try_lock() {
            stats.record(None);
            return g;
        }
        let t0 = StdPlatform::now_ns();
        let g = self.raw_lock();
        stats.record(Some(StdPlatform::now_ns().saturating_sub(t0)));
        g
    }

    /// Takes the lock only if it is free (counted as uncontended when it is).
    #[inline]
    pub(crate) fn try_lock<'a>(&'a self, stats: &LockClassStats) -> Option<Guard<'a, T>> {
        let g = self.raw_try_lock()?;
        stats.record(None);
        Some(g)
    }
}

#[cfg(all(test, not(loom)))]
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
