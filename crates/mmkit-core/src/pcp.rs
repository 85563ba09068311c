//! Per-CPU page lists (Linux's `struct per_cpu_pages`).
//!
//! Each CPU has, per zone, one stack of page indices per (order 0..=3,
//! migratetype), so the common allocation and free touch only CPU-local memory and
//! the page's own descriptor. Lists are fixed-capacity rings: allocation and free
//! use the hot end (LIFO, cache-warm pages), draining to the zone takes from the
//! cold end.
//!
//! `count` (pages on all lists) is kept at or below `high` by freeing `batch`-sized
//! groups back to the zone; an empty list is refilled with one batch. Under
//! auto-tuning (Linux 6.7) `high` grows by `batch` while a CPU keeps freeing more than
//! it allocates (up to `high_max`), grows with the refill size while a CPU keeps
//! allocating (refills double, up to batch << 5), shrinks when the zone is below its
//! high watermark, and decays by 1/8 a second when the lists sit idle.
//!
//! Locking: a `PcpLock` per set. The owner takes it with `try_lock`; on failure (a
//! thread preempted while holding it, or a remote drain in progress) the caller
//! goes to the zone directly, so nothing ever waits on a per-CPU lock except a
//! remote drain. A thread that migrates between reading its CPU id and taking the
//! lock only loses locality, never correctness. Lock order: per-CPU lock, then zone
//! lock; never the reverse.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

#[cfg(not(loom))]
use core::sync::atomic::AtomicBool;
#[cfg(not(loom))]
use core::sync::atomic::Ordering as LockOrdering;
#[cfg(loom)]
use loom::sync::atomic::AtomicBool;
#[cfg(loom)]
use loom::sync::atomic::Ordering as LockOrdering;

use alloc::boxed::Box;
use alloc::vec;

use crate::gfp::MIGRATE_PCPTYPES;
use crate::stat::NR_VM_EVENTS;

/// Highest order kept on per-CPU lists (Linux's PAGE_ALLOC_COSTLY_ORDER).
pub const PCP_MAX_ORDER: u32 = 3;
/// Largest shift of the batch for auto-tuned refills (Linux's CONFIG_PCP_BATCH_SCALE_MAX).
pub const PCP_BATCH_SCALE_MAX: u32 = 5;
/// Number of orders with per-CPU lists.
pub const PCP_ORDERS: usize = PCP_MAX_ORDER as usize + 1;

/// A fixed-capacity ring of page indices: push/pop at the hot end, drain from the cold end.
pub(crate) struct PcpList {
    buf: Box<[u32]>,
    head: u32,
    len: u32,
    mask: u32,
}

impl PcpList {
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.next_power_of_two();
        PcpList {
            buf: vec![0u32; cap].into_boxed_slice(),
            head: 0,
            len: 0,
            mask: cap as u32 - 1,
        }
    }
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len > self.mask
    }
    #[inline]
    pub fn push(&mut self, idx: u32) {
        debug_assert!(!self.is_full());
        let slot = (self.head.wrapping_add(self.len) & self.mask) as usize;
        self.buf[slot] = idx;
        self.len += 1;
    }
    #[inline]
    pub fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.buf[(self.head.wrapping_add(self.len) & self.mask) as usize])
    }
    #[inline]
    pub fn pop_cold(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let v = self.buf[self.head as usize];
        self.head = (self.head + 1) & self.mask;
        self.len -= 1;
        Some(v)
    }
    /// The entries, cold end first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).map(move |i| self.buf[(self.head.wrapping_add(i) & self.mask) as usize])
    }
}

/// The lock-protected part of a per-CPU page set.
pub(crate) struct PcpInner {
    /// Pages (not entries) on all lists.
    pub count: u32,
    pub high: u32,
    pub high_min: u32,
    pub high_max: u32,
    pub batch: u32,
    /// Pages freed since allocations last outweighed frees (auto-tuning).
    pub free_count: u32,
    /// Refill scale: doubles while the CPU allocates without freeing.
    pub alloc_factor: u32,
    /// Round-robin start for draining.
    pub drain_rr: u32,
    pub lists: [[PcpList; MIGRATE_PCPTYPES]; PCP_ORDERS],
    pub events: [u64; NR_VM_EVENTS],
}

/// One CPU's page lists for one zone.
#[repr(align(128))]
pub struct PerCpuPages {
    pub(crate) lock: PcpLock,
    /// (Q) `count` as of the last unlock, for lockless statistics (locking
    /// letters: see `Page`).
    pub(crate) count_mirror: AtomicU32,
    inner: UnsafeCell<PcpInner>,
}

// SAFETY: `inner` is only reached through `PcpGuard`, which exists only while `lock`
// is held; everything else is atomic.
unsafe impl Sync for PerCpuPages {}
// SAFETY: owns its data.
unsafe impl Send for PerCpuPages {}

pub(crate) struct PcpGuard<'a> {
    pcp: &'a PerCpuPages,
}

impl Deref for PcpGuard<'_> {
    type Target = PcpInner;
    fn deref(&self) -> &PcpInner {
        // SAFETY: the guard exists only while the per-CPU lock is held.
        unsafe { &*self.pcp.inner.get() }
    }
}

impl DerefMut for PcpGuard<'_> {
    fn deref_mut(&mut self) -> &mut PcpInner {
        // SAFETY: as in `deref`; `&mut self` makes the borrow unique.
        unsafe { &mut *self.pcp.inner.get() }
    }
}

impl Drop for PcpGuard<'_> {
    fn drop(&mut self) {
        let c = self.count;
        self.pcp.count_mirror.store(c, Ordering::Relaxed);
        self.pcp.lock.unlock();
    }
}

impl PerCpuPages {
    pub(crate) fn new(batch: u32, high_min: u32, high_max: u32) -> Self {
        // A list never holds more than high_max + one refill (+ the page being freed).
        let cap = (high_max + 2 * batch + 2) as usize;
        PerCpuPages {
            lock: PcpLock::new(),
            count_mirror: AtomicU32::new(0),
            inner: UnsafeCell::new(PcpInner {
                count: 0,
                high: high_min,
                high_min,
                high_max,
                batch,
                free_count: 0,
                alloc_factor: 0,
                drain_rr: 0,
                lists: core::array::from_fn(|_| core::array::from_fn(|_| PcpList::new(cap))),
                events: [0; NR_VM_EVENTS],
            }),
        }
    }

    /// Takes the lock if free (the owner's path).
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<PcpGuard<'_>> {
        if self.lock.try_lock() {
            Some(PcpGuard { pcp: self })
        } else {
            None
        }
    }

    /// Takes the lock, spinning (a remote drain or a check).
    pub(crate) fn lock(&self, relax: impl Fn()) -> PcpGuard<'_> {
        self.lock.lock(relax);
        PcpGuard { pcp: self }
    }
}

/// Lock of one per-CPU page list set: a test-and-set word that the owner takes
/// with `try_lock` (never waits: on failure the caller goes to the zone
/// directly, as Linux's `pcp_spin_trylock` does) and a remote drainer takes by
/// spinning. Under `--cfg loom` its atomics are loom's, for the model in
/// `tests/loom_pcp.rs`.
pub struct PcpLock {
    locked: AtomicBool,
}

impl Default for PcpLock {
    fn default() -> Self {
        Self::new()
    }
}

impl PcpLock {
    /// An unlocked lock.
    pub fn new() -> Self {
        PcpLock {
            locked: AtomicBool::new(false),
        }
    }
    /// Takes the lock if free.
    #[inline]
    pub fn try_lock(&self) -> bool {
        self.locked
            .compare_exchange(false, true, LockOrdering::Acquire, LockOrdering::Relaxed)
            .is_ok()
    }
    /// Takes the lock, calling `relax` while another holder has it.
    #[inline]
    pub fn lock(&self, relax: impl Fn()) {
        while !self.try_lock() {
            while self.locked.load(LockOrdering::Relaxed) {
                relax();
            }
        }
    }
    /// Releases the lock.
    #[inline]
    pub fn unlock(&self) {
        self.locked.store(false, LockOrdering::Release);
    }
}
