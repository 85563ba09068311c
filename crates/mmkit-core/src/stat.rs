//! vmstat-style event counters and lock statistics.
//!
//! Counters live where they are cheapest to bump: per CPU inside the per-CPU page
//! set (written only under that set's lock, so a plain add), per zone (written only
//! under the zone lock), and a lock-free per-CPU array for events that happen under
//! neither lock (refused frees, allocation failures). A read folds all of them, as
//! Linux folds its per-CPU vmstat differentials.

use core::sync::atomic::{AtomicU64, Ordering};

macro_rules! vm_events {
    ($( $(#[$m:meta])* $v:ident = $name:literal ),* $(,)?) => {
        /// One vmstat event counter.
        #[derive(Copy, Clone, PartialEq, Eq, Debug, Hash)]
        #[repr(usize)]
        pub enum VmEvent { $( $(#[$m])* $v ),* }
        impl VmEvent {
            /// Every event in display order.
            pub const ALL: &'static [VmEvent] = &[$(VmEvent::$v),*];
            /// The name shown in the vmstat view.
            pub const fn name(self) -> &'static str {
                match self { $(VmEvent::$v => $name),* }
            }
        }
    };
}

vm_events! {
    /// Blocks allocated (any order).
    PgAlloc = "pgalloc",
    /// Blocks freed (any order).
    PgFree = "pgfree",
    /// Allocations served from a per-CPU list.
    PcpAllocHit = "pcp_alloc_hit",
    /// Per-CPU list refills from the buddy lists (one per zone-lock hold).
    PcpRefill = "pcp_refill",
    /// Pages moved into per-CPU lists by refills.
    PcpRefillPages = "pcp_refill_pages",
    /// Per-CPU list drains to the buddy lists (one per zone-lock hold).
    PcpDrain = "pcp_drain",
    /// Pages moved from per-CPU lists to the buddy lists.
    PcpDrainPages = "pcp_drain_pages",
    /// Per-CPU lock found taken (thread preempted or remote drain): zone used directly.
    PcpTrylockFail = "pcp_trylock_fail",
    /// Pages moved from per-CPU lists into the lock-free per-CPU caches after a miss.
    PcpCacheFill = "pcp_cache_fill",
    /// Pages moved from full per-CPU caches to the per-CPU lists.
    PcpCacheSpill = "pcp_cache_spill",
    /// Pages taken out of the per-CPU caches by remote drains.
    PcpCacheDrain = "pcp_cache_drain",
    /// Buddy merges done on free.
    MergeDone = "merge_done",
    /// Order-0 frees that skipped the merge (lazy merging).
    MergeSkipped = "merge_skipped",
    /// Merge-on-demand passes over lazily freed pages.
    MergeOnDemand = "merge_on_demand",
    /// Allocations that fell back to another migratetype.
    AllocFallback = "alloc_fallback",
    /// Fallbacks that stole a whole pageblock.
    AllocSteal = "alloc_steal",
    /// Pageblocks reserved for high-order atomic allocations.
    HighAtomicReserve = "highatomic_reserve",
    /// High-atomic pageblocks given back in the slow path.
    HighAtomicUnreserve = "highatomic_unreserve",
    /// Fast-path attempts refused by the low watermark.
    WmarkLowFail = "wmark_low_fail",
    /// Slow-path attempts refused by the min watermark.
    WmarkMinFail = "wmark_min_fail",
    /// Entries into the allocation slow path.
    AllocSlowpath = "alloc_slowpath",
    /// Drains of every CPU's lists from the slow path.
    DrainAll = "drain_all_pages",
    /// Allocations that failed with no memory.
    AllocFail = "alloc_fail",
    /// Frees refused as bad input.
    FreeInvalid = "free_invalid",
    /// Per-CPU `high` raised by auto-tuning.
    PcpHighGrow = "pcp_high_grow",
    /// Per-CPU `high` lowered by auto-tuning (decay or zone pressure).
    PcpHighShrink = "pcp_high_shrink",
    /// Direct compactions run by an allocating task (compaction stalls); each
    /// ends in exactly one `compact_success` or `compact_fail`.
    CompactStall = "compact_stall",
    /// Direct compactions that left a free block of the requested order.
    CompactSuccess = "compact_success",
    /// Direct compactions that did not.
    CompactFail = "compact_fail",
    /// Direct compactions skipped because compaction of that order was deferred.
    CompactDeferred = "compact_deferred",
    /// Pages looked at by the migrate scanner.
    CompactMigrateScanned = "compact_migrate_scanned",
    /// Pages looked at by the free scanner.
    CompactFreeScanned = "compact_free_scanned",
    /// Pages isolated for migration (each ends in `pgmigrate_success` or
    /// `pgmigrate_fail`).
    CompactIsolated = "compact_isolated",
    /// Free pages isolated as migration targets.
    CompactFreeIsolated = "compact_free_isolated",
    /// Wake-ups of the background compaction thread (kcompactd) that found work.
    CompactDaemonWake = "compact_daemon_wake",
    /// Proactive compaction passes of kcompactd (fragmentation score too high).
    CompactProactive = "compact_proactive",
    /// Pages migrated.
    PgMigrateSuccess = "pgmigrate_success",
    /// Pages whose migration failed (pinned, busy, or changed meanwhile).
    PgMigrateFail = "pgmigrate_fail",
    /// Of `pgmigrate_fail`: pages pinned by an extra reference or an access in
    /// progress, left where they are.
    PgMigratePinned = "pgmigrate_fail_pinned",
    /// Pages read back from swap and verified (`pswpin`).
    PswpIn = "pswpin",
    /// Pages written to swap (`pswpout`).
    PswpOut = "pswpout",
    /// Inactive pages scanned by kswapd.
    PgScanKswapd = "pgscan_kswapd",
    /// Inactive pages scanned by direct reclaim.
    PgScanDirect = "pgscan_direct",
    /// Pages reclaimed by kswapd.
    PgStealKswapd = "pgsteal_kswapd",
    /// Pages reclaimed by direct reclaim.
    PgStealDirect = "pgsteal_direct",
    /// Pages moved to the active list (referenced at the inactive tail, or a
    /// refault activated).
    PgActivate = "pgactivate",
    /// Active pages moved to the inactive list.
    PgDeactivate = "pgdeactivate",
    /// Swap-ins that found a shadow of their eviction (Linux's
    /// `workingset_refault_anon`).
    WorkingsetRefaultAnon = "workingset_refault_anon",
    /// Of those, refaults recent enough to be activated at once.
    WorkingsetActivateAnon = "workingset_activate_anon",
    /// Of those, pages that were in the working set (active) before their
    /// eviction.
    WorkingsetRestoreAnon = "workingset_restore_anon",
    /// Allocations that entered direct reclaim.
    AllocStall = "allocstall",
    /// Pages read ahead from swap.
    SwapRa = "swap_ra",
    /// Swap faults served by a page read ahead.
    SwapRaHit = "swap_ra_hit",
    /// Swap-ins with memory and swap full that exchanged with a resident
    /// page: it went out into the incoming page's slot (mmkit's own).
    SwapExchange = "swap_exchange",
    /// Accesses that waited for their address space's turn under load
    /// control (mmkit's own; Linux's swap token kept no such count).
    LoadControlWait = "loadctl_wait",
    /// Swap-ins refused for a checksum mismatch (mmkit's own).
    SwapChecksumFail = "swap_checksum_fail",
    /// Swap reads and writes the device refused (mmkit's own).
    SwapIoError = "swap_io_error",
    /// Swap entries that named no device, or a slot that refused what the
    /// entry's references allow: a broken invariant (mmkit's own).
    SwapBadEntry = "swap_bad_entry",
    /// Huge PMDs replaced by a table of 512 PTEs (munmap, mprotect, reclaim).
    ThpSplitPmd = "thp_split_pmd",
    /// Huge pages split into 512 order-0 pages (reclaim, to swap them out).
    ThpSplitPage = "thp_split_page",
}

/// Number of vmstat events.
pub const NR_VM_EVENTS: usize = VmEvent::ALL.len();

/// Folded event counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmEvents(pub [u64; NR_VM_EVENTS]);

impl Default for VmEvents {
    fn default() -> Self {
        VmEvents([0; NR_VM_EVENTS])
    }
}

impl VmEvents {
    /// The value of one event.
    pub fn get(&self, e: VmEvent) -> u64 {
        self.0[e as usize]
    }
    /// (name, value) pairs in display order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        VmEvent::ALL.iter().map(|e| (e.name(), self.0[*e as usize]))
    }
    pub(crate) fn add(&mut self, other: &[u64; NR_VM_EVENTS]) {
        for (a, b) in self.0.iter_mut().zip(other) {
            *a += *b;
        }
    }
}

/// Lock-free per-CPU counters, for events outside any lock. Cache-line padded.
#[repr(align(128))]
pub(crate) struct AtomicEvents(pub [AtomicU64; NR_VM_EVENTS]);

impl AtomicEvents {
    pub(crate) fn new() -> Self {
        AtomicEvents(core::array::from_fn(|_| AtomicU64::new(0)))
    }
    #[inline]
    pub(crate) fn inc(&self, e: VmEvent) {
        self.0[e as usize].fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn add(&self, e: VmEvent, n: u64) {
        if n != 0 {
            self.0[e as usize].fetch_add(n, Ordering::Relaxed);
        }
    }
    pub(crate) fn fold_into(&self, out: &mut VmEvents) {
        for (a, b) in out.0.iter_mut().zip(self.0.iter()) {
            *a += b.load(Ordering::Relaxed);
        }
    }
    pub(crate) fn reset(&self) {
        for c in self.0.iter() {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Statistics of one lock: how often it was taken, how often the taker found it
/// held, and how long takers waited in total.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that found the lock held and had to wait.
    pub contended: u64,
    /// Total time spent waiting, in nanoseconds.
    pub wait_ns: u64,
}

impl LockStats {
    /// The change from an `earlier` snapshot to this one.
    pub fn since(&self, earlier: &LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions.saturating_sub(earlier.acquisitions),
            contended: self.contended.saturating_sub(earlier.contended),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
        }
    }
    /// Contended acquisitions in percent of all acquisitions (0 when none).
    pub fn contended_pct(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.contended as f64 * 100.0 / self.acquisitions as f64
        }
    }
    pub(crate) fn add(&mut self, o: &LockStats) {
        self.acquisitions += o.acquisitions;
        self.contended += o.contended;
        self.wait_ns += o.wait_ns;
    }
}
