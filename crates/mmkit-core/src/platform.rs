//! The boundary to the environment: what the core needs from whoever embeds it.
//!
//! The core has no threads, no clock and no notion of "the current CPU". A kernel,
//! a hypervisor or the std runtime (`mmkit`) supplies them by implementing
//! [`Platform`]: the current CPU id, a monotonic clock for lock statistics, a
//! pause hint for spinning, and the raw lock type used for zone locks (a kernel
//! plugs in its spinlock; the std runtime a spin-then-park mutex).
//!
//! The per-CPU list lock ([`crate::pcp::PcpLock`]) lives beside the lists it
//! protects.

/// What the environment provides to the core.
pub trait Platform: 'static {
    /// The raw lock protecting a zone's free lists.
    type ZoneLock: lock_api::RawMutex + Send + Sync;
    /// The CPU the caller runs on now (any value; the core reduces it modulo the
    /// number of per-CPU slots). A thread may migrate right after reading it; the
    /// per-CPU lists are protected by their own lock, so this only affects locality.
    fn cpu_id() -> usize;
    /// Monotonic nanoseconds, for lock wait statistics (only read on contention).
    fn now_ns() -> u64;
    /// Called while spinning for a per-CPU list held by another thread.
    fn relax() {
        core::hint::spin_loop()
    }
    /// True when the restartable per-CPU operations below work here (asked once,
    /// when an allocator is built). Without them the per-CPU caches are off and
    /// every order-0 call takes its per-CPU list's lock.
    fn cache_ops_available() -> bool {
        false
    }
    /// Pops the top entry of the current CPU's cache list: `row[cpu]` where `cpu`
    /// is the CPU the operation commits on, as one restartable sequence (see
    /// [`crate::pcp_cache`] for the layout and the commit protocol). None when
    /// the list is empty or fenced, or `cpu >= nr`.
    ///
    /// # Safety
    /// `row` points to `nr` consecutive [`crate::pcp_cache::PcpCacheList`]s that
    /// outlive the call, and [`Platform::cache_ops_available`] returned true.
    #[inline]
    unsafe fn cache_pop(_row: *const crate::pcp_cache::PcpCacheList, _nr: usize) -> Option<u32> {
        None
    }
    /// Pushes `idx` onto the current CPU's cache list as one restartable
    /// sequence; false when the list is full or fenced, or `cpu >= nr`.
    ///
    /// # Safety
    /// As for [`Platform::cache_pop`].
    #[inline]
    unsafe fn cache_push(
        _row: *const crate::pcp_cache::PcpCacheList,
        _nr: usize,
        _idx: u32,
    ) -> bool {
        false
    }
    /// Pops up to `out.len()` entries (top first) from the current CPU's cache
    /// list in one restartable sequence; returns how many (0: empty, fenced, or
    /// `cpu >= nr`). The default pops one at a time.
    ///
    /// # Safety
    /// As for [`Platform::cache_pop`].
    #[inline]
    unsafe fn cache_pop_many(
        row: *const crate::pcp_cache::PcpCacheList,
        nr: usize,
        out: &mut [u32],
    ) -> usize {
        let mut n = 0;
        while n < out.len() {
            // SAFETY: forwarded from the caller.
            match unsafe { Self::cache_pop(row, nr) } {
                Some(v) => out[n] = v,
                None => break,
            }
            n += 1;
        }
        n
    }
    /// Pushes as many of `src` as fit (`src[0]` first, so the last pushed ends on
    /// top) onto the current CPU's cache list in one restartable sequence; returns
    /// how many. The default pushes one at a time.
    ///
    /// # Safety
    /// As for [`Platform::cache_pop`].
    #[inline]
    unsafe fn cache_push_many(
        row: *const crate::pcp_cache::PcpCacheList,
        nr: usize,
        src: &[u32],
    ) -> usize {
        let mut n = 0;
        // SAFETY: forwarded from the caller.
        while n < src.len() && unsafe { Self::cache_push(row, nr, src[n]) } {
            n += 1;
        }
        n
    }
    /// Restarts every restartable sequence now running on any CPU and returns once
    /// none that began before the call can still commit (Linux's
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`). Called after setting
    /// `fenced` on cache lists, so that later sequences see it.
    fn cache_fence() {}
}
