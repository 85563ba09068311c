//! Per-CPU order-0 page caches driven by restartable sequences: the lock-free
//! front of the per-CPU lists.
//!
//! Linux protects `this_cpu` page lists by disabling preemption, which costs it
//! nothing. A user-space thread cannot do that; the per-CPU lists behind
//! [`crate::pcp`] therefore take a trylock (an atomic read-modify-write) on every
//! call. In front of them, each CPU has a small stack of order-0 pages per
//! migratetype ([`PcpCacheList`]) that is only ever changed by *restartable
//! sequences* (Linux's rseq, as tcmalloc's per-CPU caches use it): a short run of
//! plain loads and stores that reads the current CPU, works on that CPU's stack and
//! ends in one committing store; the kernel restarts it from the beginning if the
//! thread is preempted, migrated or signalled before the commit. So an order-0
//! allocation or free that hits the cache takes no lock and does no atomic
//! read-modify-write; only the free's validating compare-and-swap on the page
//! descriptor remains.
//!
//! Layout (shared with the assembly of the platform, see [`Platform::cache_pop`]):
//! a list is 256 bytes: `pops: u32` at 0, `pushes: u32` at 4, `fenced: u32` at 8,
//! then [`PCP_CACHE_SLOTS`] page indices from byte 16. The stack's length is
//! `pushes - pops` (mod 2^32). A pop reads `slots[len - 1]` and commits by storing
//! `pops + 1`; a push writes `slots[len]` and commits by storing `pushes + 1`. The two
//! counters are therefore also the event counts (folded like vmstat's per-CPU
//! differentials; they must be folded more often than every 2^32 operations of one
//! list, which the once-a-second `decay_pcp_high` does). The table holds one list
//! per (zone, migratetype, CPU), CPU fastest.
//!
//! Invariants: a page on a cache list is free with flags 0, exactly as on the
//! per-CPU lists, and counts as a per-CPU page in `nr_free_pages`. Pages move
//! between a cache list and the locked per-CPU lists only through the restartable
//! operations (refill after a miss, spill when full), so a list's owner never
//! waits.
//!
//! Remote access (drain, check, statistics that must be exact): the remote side
//! sets `fenced` on the lists, then calls [`Platform::cache_fence`]
//! (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)`), which restarts every
//! sequence in progress; any sequence started later sees `fenced` and misses, so
//! the remote side owns the lists until it clears `fenced`. Remote sides serialise
//! on `PcpCacheTable::fence_lock`.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::gfp::MIGRATE_PCPTYPES;
use crate::pcp::PcpLock;
use crate::platform::Platform;

/// Page indices one cache list holds.
pub const PCP_CACHE_SLOTS: usize = 60;
/// Bytes per list (the assembly's stride: `cpu << PCP_CACHE_LIST_SHIFT`).
pub const PCP_CACHE_LIST_SHIFT: u32 = 8;
/// Byte offset of `pops` in a list.
pub const PCP_CACHE_POPS: usize = 0;
/// Byte offset of `pushes` in a list.
pub const PCP_CACHE_PUSHES: usize = 4;
/// Byte offset of `fenced` in a list.
pub const PCP_CACHE_FENCED: usize = 8;
/// Byte offset of the first slot in a list.
pub const PCP_CACHE_SLOTS_OFF: usize = 16;

/// One CPU's cache of order-0 pages of one migratetype (see the module header for
/// the layout the assembly relies on).
#[repr(C, align(256))]
pub struct PcpCacheList {
    /// Pops ever committed (mod 2^32).
    pub pops: AtomicU32,
    /// Pushes ever committed (mod 2^32).
    pub pushes: AtomicU32,
    /// Nonzero while a remote side owns the list: every sequence misses.
    pub fenced: AtomicU32,
    _pad: u32,
    /// The stack; entries `0..len` are valid, `len - 1` is the hot top.
    pub slots: [AtomicU32; PCP_CACHE_SLOTS],
}

const _: () = assert!(core::mem::size_of::<PcpCacheList>() == 1 << PCP_CACHE_LIST_SHIFT);
const _: () = assert!(core::mem::offset_of!(PcpCacheList, pops) == PCP_CACHE_POPS);
const _: () = assert!(core::mem::offset_of!(PcpCacheList, pushes) == PCP_CACHE_PUSHES);
const _: () = assert!(core::mem::offset_of!(PcpCacheList, fenced) == PCP_CACHE_FENCED);
const _: () = assert!(core::mem::offset_of!(PcpCacheList, slots) == PCP_CACHE_SLOTS_OFF);

impl PcpCacheList {
    fn new() -> Self {
        PcpCacheList {
            pops: AtomicU32::new(0),
            pushes: AtomicU32::new(0),
            fenced: AtomicU32::new(0),
            _pad: 0,
            slots: core::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Entries on the list (exact only while fenced or quiescent).
    #[inline]
    pub fn len(&self) -> u32 {
        let pushes = self.pushes.load(Ordering::Relaxed);
        let pops = self.pops.load(Ordering::Relaxed);
        pushes.wrapping_sub(pops).min(PCP_CACHE_SLOTS as u32)
    }

    /// True when the list holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Folding state of one list: the raw counter values seen at the last fold.
#[derive(Default, Clone, Copy)]
struct Folded {
    last_pops: u32,
    last_pushes: u32,
}

/// The caches of every zone: a list per (zone, migratetype, CPU).
pub struct PcpCacheTable {
    lists: Box<[PcpCacheList]>,
    nr_cpus: usize,
    nr_zones: usize,
    /// Serialises remote sides (fence holders) and folds.
    pub(crate) fence_lock: PcpLock,
    /// Folding state, under `fence_lock`.
    folded: core::cell::UnsafeCell<Vec<Folded>>,
    /// Pops and pushes folded so far (all lists).
    pub(crate) total_pops: AtomicU64,
    pub(crate) total_pushes: AtomicU64,
}

// SAFETY: `folded` is only touched under `fence_lock`; everything else is atomic.
unsafe impl Sync for PcpCacheTable {}
// SAFETY: owns its data.
unsafe impl Send for PcpCacheTable {}

impl PcpCacheTable {
    /// Empty lists for `nr_zones` zones of `nr_cpus` CPUs.
    pub fn new(nr_zones: usize, nr_cpus: usize) -> Self {
        let n = nr_zones * MIGRATE_PCPTYPES * nr_cpus;
        PcpCacheTable {
            lists: (0..n).map(|_| PcpCacheList::new()).collect(),
            nr_cpus,
            nr_zones,
            fence_lock: PcpLock::new(),
            folded: core::cell::UnsafeCell::new(alloc::vec![Folded::default(); n]),
            total_pops: AtomicU64::new(0),
            total_pushes: AtomicU64::new(0),
        }
    }

    /// CPUs with a list (the assembly misses on a CPU id at or above this).
    #[inline]
    pub fn nr_cpus(&self) -> usize {
        self.nr_cpus
    }

    #[inline]
    fn index(&self, z: usize, mt: usize, cpu: usize) -> usize {
        (z * MIGRATE_PCPTYPES + mt) * self.nr_cpus + cpu
    }

    /// The first list of a (zone, migratetype) row (`row[cpu]` is that CPU's list).
    #[inline]
    pub fn row(&self, z: usize, mt: usize) -> *const PcpCacheList {
        self.lists[self.index(z, mt, 0)..].as_ptr()
    }

    /// Every list.
    pub fn lists(&self) -> &[PcpCacheList] {
        &self.lists
    }

    /// Pages on every list of zone `z` (exact when quiescent).
    pub fn nr_pages(&self, z: usize) -> u64 {
        let per_zone = MIGRATE_PCPTYPES * self.nr_cpus;
        self.lists[z * per_zone..(z + 1) * per_zone]
            .iter()
            .map(|l| l.len() as u64)
            .sum()
    }

    /// Zones covered.
    pub fn nr_zones(&self) -> usize {
        self.nr_zones
    }

    /// Pops one page from the current CPU's list of (`z`, `mt`).
    #[inline]
    pub(crate) fn pop<P: Platform>(&self, z: usize, mt: usize) -> Option<u32> {
        // SAFETY: `row` starts `nr_cpus` lists laid out as the platform expects, and
        // a table exists only where `cache_ops_available()` was true.
        unsafe { P::cache_pop(self.row(z, mt), self.nr_cpus) }
    }

    /// Pushes a page onto the current CPU's list of (`z`, `mt`); false if full or fenced.
    #[inline]
    pub(crate) fn push<P: Platform>(&self, z: usize, mt: usize, idx: u32) -> bool {
        // SAFETY: as in `pop`; `idx` is a free page the caller owns.
        unsafe { P::cache_push(self.row(z, mt), self.nr_cpus, idx) }
    }

    /// Pops up to `out.len()` pages (top first) from the current CPU's list of
    /// (`z`, `mt`) in one sequence; returns how many.
    #[inline]
    pub(crate) fn pop_many<P: Platform>(&self, z: usize, mt: usize, out: &mut [u32]) -> usize {
        // SAFETY: as in `pop`.
        unsafe { P::cache_pop_many(self.row(z, mt), self.nr_cpus, out) }
    }

    /// Pushes as many of `src` as fit (`src[0]` first) onto the current CPU's list
    /// of (`z`, `mt`) in one sequence; returns how many.
    #[inline]
    pub(crate) fn push_many<P: Platform>(&self, z: usize, mt: usize, src: &[u32]) -> usize {
        // SAFETY: as in `push`; the pages are free and the caller's.
        unsafe { P::cache_push_many(self.row(z, mt), self.nr_cpus, src) }
    }

    /// Adds the raw counters' progress since the last fold to the totals. Caller
    /// holds `fence_lock`.
    fn fold_locked(&self) {
        // SAFETY: the caller holds `fence_lock`, which guards `folded`.
        let folded = unsafe { &mut *self.folded.get() };
        let (mut pops, mut pushes) = (0u64, 0u64);
        for (l, f) in self.lists.iter().zip(folded.iter_mut()) {
            let p = l.pops.load(Ordering::Relaxed);
            let q = l.pushes.load(Ordering::Relaxed);
            pops += p.wrapping_sub(f.last_pops) as u64;
            pushes += q.wrapping_sub(f.last_pushes) as u64;
            f.last_pops = p;
            f.last_pushes = q;
        }
        self.total_pops.fetch_add(pops, Ordering::Relaxed);
        self.total_pushes.fetch_add(pushes, Ordering::Relaxed);
    }

    /// Folds the raw counters (see the module header: at least every 2^32
    /// operations of a list).
    pub(crate) fn fold<P: Platform>(&self) {
        self.fence_lock.lock(P::relax);
        self.fold_locked();
        self.fence_lock.unlock();
    }

    /// Clears the folded totals.
    pub(crate) fn reset_totals<P: Platform>(&self) {
        self.fence_lock.lock(P::relax);
        self.fold_locked();
        self.total_pops.store(0, Ordering::Relaxed);
        self.total_pushes.store(0, Ordering::Relaxed);
        self.fence_lock.unlock();
    }

    /// Takes every list away from the restartable sequences, calls `f` with the
    /// table while the lists are exclusively the caller's, and gives them back.
    pub(crate) fn with_fenced<P: Platform, R>(&self, f: impl FnOnce(&FencedCaches<'_>) -> R) -> R {
        self.fence_lock.lock(P::relax);
        for l in self.lists.iter() {
            l.fenced.store(1, Ordering::SeqCst);
        }
        P::cache_fence();
        let r = f(&FencedCaches { table: self });
        self.fold_locked();
        for l in self.lists.iter() {
            l.fenced.store(0, Ordering::Release);
        }
        self.fence_lock.unlock();
        r
    }
}

/// The caches while a remote side owns them (see [`PcpCacheTable::with_fenced`]).
pub(crate) struct FencedCaches<'a> {
    table: &'a PcpCacheTable,
}

impl FencedCaches<'_> {
    /// The entries of list (`z`, `mt`, `cpu`), bottom first.
    pub(crate) fn entries(
        &self,
        z: usize,
        mt: usize,
        cpu: usize,
    ) -> impl Iterator<Item = u32> + '_ {
        let l = &self.table.lists[self.table.index(z, mt, cpu)];
        (0..l.len() as usize).map(move |i| l.slots[i].load(Ordering::Relaxed))
    }

    /// Empties list (`z`, `mt`, `cpu`) into `out`; returns the number taken. The
    /// removal is recorded as pops, which the caller accounts as drained.
    pub(crate) fn take_all(&self, z: usize, mt: usize, cpu: usize, out: &mut Vec<u32>) -> u32 {
        let l = &self.table.lists[self.table.index(z, mt, cpu)];
        let n = l.len();
        for i in 0..n as usize {
            out.push(l.slots[i].load(Ordering::Relaxed));
        }
        l.pops.store(
            l.pops.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
        n
    }
}
