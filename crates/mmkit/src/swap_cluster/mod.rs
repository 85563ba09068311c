//! The swap map of one device and its slot allocator (Linux's `mm/swapfile.c`,
//! the `swap_map` / `swap_cluster_info` half).
//!
//! Every slot has a byte in `swap_map`: the number of references to it (page-table
//! entries, `swap_duplicate`), up to [`SWAP_MAP_MAX`], plus [`SWAP_HAS_CACHE`] while
//! a page for it is (or is being put) in the swap cache. A slot is free when its
//! byte is 0. Slots are grouped into clusters of [`SWAPFILE_CLUSTER`] (2 MiB of
//! device); each cluster not owned by a CPU sits on exactly one list of the
//! device: `free` (no slot in use), `nonfull`, `frag` (a CPU gave it up with holes
//! left) or `full`.
//!
//! Allocation policies ([`SwapAllocPolicy`]):
//! - `SharedCursor` (Linux before 5.8): under the device lock, a CPU allocates from
//!   its per-CPU cluster taken from the free list; once no free cluster is left,
//!   every CPU scans `swap_map` from one shared `cluster_next` cursor, so adjacent
//!   slots go to different CPUs.
//! - `PerCpuCursor` (the seed, 5.8): the same, but each CPU scans from its own
//!   cursor, which jumps to the start of a random 64 MiB trunk when it leaves one.
//! - `PerCpuCluster` (6.15): each CPU owns a cluster and allocates from it under
//!   the cluster lock alone; the device lock is taken only to move a cluster
//!   between lists (take a new one, give a used-up one back, or a free that
//!   changes its list).
//!
//! Invariants (checked by [`SwapMap::check`]):
//! - a cluster's `count` is the number of its slots with a non-zero map byte, and
//!   `inuse` is the sum of the counts;
//! - a cluster not owned by a CPU is on `free` iff its count is 0, on `full` iff
//!   every slot is used, else on `nonfull` or `frag`; list lengths match.
//!
//! Locking: the map bytes and the cluster's state are written under the cluster
//! lock (the bytes are atomics so that scans and statistics may read them without
//! it); the lists under the device lock `si_lock`. Lock order: with
//! `PerCpuCluster`, per-CPU cursor -> cluster lock -> device lock, and a holder of
//! the device lock only ever `try_lock`s a cluster; with the two cursor policies
//! (as in Linux 5.8) device lock -> cluster lock, and a cluster lock alone is held
//! only to drop a reference that does not free the slot.

use std::sync::atomic::Ordering;

use crossbeam_utils::CachePadded;
use mmkit_core::LockStats;

use crate::sync::{relax, AtomicU64, AtomicU8, Guard, LockClassStats, StatLock};

/// Slots per cluster (2 MiB of 4 KiB pages, Linux's `SWAPFILE_CLUSTER`).
#[cfg(not(loom))]
pub(crate) const SWAPFILE_CLUSTER: u32 = 512;
/// Slots per cluster: small, so that a loom model explores every interleaving.
#[cfg(loom)]
pub(crate) const SWAPFILE_CLUSTER: u32 = 2;
/// Slots per swap-cache trunk (64 MiB, Linux's `SWAP_ADDRESS_SPACE_PAGES`).
pub(crate) const SWAP_ADDRESS_SPACE_PAGES: u32 = 1 << 14;
/// Largest reference count in a map byte (Linux continues in extra pages beyond;
/// here `swap_duplicate` refuses).
pub(crate) const SWAP_MAP_MAX: u8 = 0x3e;
/// The map byte's flag: a page for this slot is in the swap cache.
pub(crate) const SWAP_HAS_CACHE: u8 = 0x40;

const NIL: u32 = u32::MAX;

/// How slots are handed to CPUs (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SwapAllocPolicy {
    /// Linux before the seed: one shared scan cursor once no free cluster is left.
    SharedCursor,
    /// The seed (Linux 5.8): per-CPU scan cursors jumping to random 64 MiB trunks.
    PerCpuCursor,
    /// Linux 6.15: each CPU owns a cluster; the device lock only moves clusters.
    #[default]
    PerCpuCluster,
}

/// Where a cluster is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClusterList {
    Free = 0,
    Nonfull = 1,
    Frag = 2,
    Full = 3,
    /// On no list: a CPU allocates from it.
    Owned = 4,
}

const NR_LISTS: usize = 4;

/// A cluster's state, under its lock.
pub(crate) struct ClusterState {
    /// Slots in use.
    count: u32,
    list: ClusterList,
}

/// Why a map operation was refused (nothing changed).
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MapError {
    #[error("swap slot {0} is outside the device")]
    OutOfRange(u32),
    #[error("swap slot {0} is not in use")]
    NotInUse(u32),
    #[error("swap slot {0} already has a swap-cache page")]
    CacheBusy(u32),
    #[error("swap slot {0} has no swap-cache reference to drop")]
    NoCache(u32),
    #[error("swap slot {0} has {max} references already", max = SWAP_MAP_MAX)]
    TooManyRefs(u32),
}

/// Cluster lists, linked through two arrays (Linux's `list_head`s by index).
struct Lists {
    head: [u32; NR_LISTS],
    len: [u32; NR_LISTS],
    next: Vec<u32>,
    prev: Vec<u32>,
}

impl Lists {
    fn push_tail(&mut self, l: ClusterList, c: u32) {
        let l = l as usize;
        let h = self.head[l];
        if h == NIL {
            self.head[l] = c;
            self.next[c as usize] = c;
            self.prev[c as usize] = c;
        } else {
            let t = self.prev[h as usize];
            self.next[t as usize] = c;
            self.prev[c as usize] = t;
            self.next[c as usize] = h;
            self.prev[h as usize] = c;
        }
        self.len[l] += 1;
    }

    fn remove(&mut self, l: ClusterList, c: u32) {
        let l = l as usize;
        let (n, p) = (self.next[c as usize], self.prev[c as usize]);
        if n == c {
            self.head[l] = NIL;
        } else {
            self.next[p as usize] = n;
            self.prev[n as usize] = p;
            if self.head[l] == c {
                self.head[l] = n;
            }
        }
        self.len[l] -= 1;
    }

    fn iter(&self, l: ClusterList) -> impl Iterator<Item = u32> + '_ {
        let h = self.head[l as usize];
        let mut c = h;
        let mut first = true;
        std::iter::from_fn(move || {
            if c == NIL || (!first && c == h) {
                return None;
            }
            first = false;
            let out = c;
            c = self.next[c as usize];
            Some(out)
        })
    }
}

/// What `isolate_cluster` found.
enum Isolated {
    Got(u32),
    /// Every listed cluster was locked by a free waiting for the device lock.
    Busy,
    Empty,
}

/// A per-CPU cursor: the cluster a CPU allocates from and the next slot to try.
#[derive(Copy, Clone)]
struct PcpCursor {
    cluster: u32,
    next: u32,
}

const NO_CURSOR: PcpCursor = PcpCursor {
    cluster: NIL,
    next: 0,
};

/// What the device lock protects.
struct SiState {
    lists: Lists,
    /// The cursor policies' per-CPU clusters (Linux 5.8's `percpu_cluster`).
    percpu_cluster: Vec<PcpCursor>,
    /// `SharedCursor`'s scan base.
    cluster_next: u32,
    /// `PerCpuCursor`'s scan bases.
    cluster_next_cpu: Vec<u32>,
    rng: u64,
}

/// The swap map and slot allocator of one device. Fields read without their
/// lock carry a locking letter (legend in `rmap.rs`).
pub(crate) struct SwapMap {
    policy: SwapAllocPolicy,
    nr_slots: u32,
    /// (S) A byte per slot (see the module header): written under the
    /// slot's cluster lock, read without it by scans and statistics.
    swap_map: Box<[AtomicU8]>,
    clusters: Box<[CachePadded<StatLock<ClusterState>>]>,
    si_lock: StatLock<SiState>,
    /// `PerCpuCluster`'s per-CPU cursors (Linux's `percpu_swap_cluster`).
    pcp: Box<[CachePadded<StatLock<PcpCursor>>]>,
    /// (S) Slots in use (Linux's `inuse_pages`): changed under the cluster
    /// lock of the slot that changed, read without a lock.
    inuse: AtomicU64,
    pub(crate) cluster_lock_stats: LockClassStats,
    pub(crate) si_lock_stats: LockClassStats,
    /// The per-CPU cursors' locks (Linux's `local_lock`; contended only when
    /// threads outnumber CPUs or migrate).
    pcp_lock_stats: LockClassStats,
}

impl SwapMap {
    /// A map of `nr_slots` free slots (at least one) for `nr_cpus` CPUs.
    pub(crate) fn new(
        nr_slots: u32,
        policy: SwapAllocPolicy,
        nr_cpus: usize,
        seed: u64,
    ) -> SwapMap {
        assert!(nr_slots > 0);
        let nr_clusters = nr_slots.div_ceil(SWAPFILE_CLUSTER);
        let nr_cpus = nr_cpus.max(1);
        let mut lists = Lists {
            head: [NIL; NR_LISTS],
            len: [0; NR_LISTS],
            next: vec![NIL; nr_clusters as usize],
            prev: vec![NIL; nr_clusters as usize],
        };
        for c in 0..nr_clusters {
            lists.push_tail(ClusterList::Free, c);
        }
        SwapMap {
            policy,
            nr_slots,
            swap_map: (0..nr_slots).map(|_| AtomicU8::new(0)).collect(),
            clusters: (0..nr_clusters)
                .map(|_| {
                    CachePadded::new(StatLock::new(ClusterState {
                        count: 0,
                        list: ClusterList::Free,
                    }))
                })
                .collect(),
            si_lock: StatLock::new(SiState {
                lists,
                percpu_cluster: vec![NO_CURSOR; nr_cpus],
                cluster_next: 0,
                cluster_next_cpu: (0..nr_cpus as u64)
                    .map(|i| ((i * 0x9e37_79b9) % nr_slots as u64) as u32)
                    .collect(),
                rng: seed | 1,
            }),
            pcp: (0..nr_cpus)
                .map(|_| CachePadded::new(StatLock::new(NO_CURSOR)))
                .collect(),
            inuse: AtomicU64::new(0),
            cluster_lock_stats: LockClassStats::new(),
            si_lock_stats: LockClassStats::new(),
            pcp_lock_stats: LockClassStats::new(),
        }
    }

    pub(crate) fn nr_slots(&self) -> u32 {
        self.nr_slots
    }
    /// Slots in use (`inuse_pages`).
    pub(crate) fn inuse(&self) -> u64 {
        self.inuse.load(Ordering::Relaxed)
    }
    /// The map byte of a slot (a racy snapshot).
    pub(crate) fn map_count(&self, slot: u32) -> u8 {
        self.swap_map[slot as usize].load(Ordering::Relaxed)
    }
    pub(crate) fn device_lock_stats(&self) -> LockStats {
        self.si_lock_stats.snapshot()
    }
    pub(crate) fn cluster_lock_stats(&self) -> LockStats {
        self.cluster_lock_stats.snapshot()
    }

    fn cluster_len(&self, c: u32) -> u32 {
        (self.nr_slots - c * SWAPFILE_CLUSTER).min(SWAPFILE_CLUSTER)
    }

    /// Takes the lock of the cluster holding `slot` (the swap table is written
    /// under it).
    pub(crate) fn lock_cluster(&self, slot: u32) -> Guard<'_, ClusterState> {
        self.clusters[(slot / SWAPFILE_CLUSTER) as usize].lock(&self.cluster_lock_stats)
    }

    /// The list a cluster of `count` used slots belongs on, coming from `list`.
    fn target_list(&self, c: u32, count: u32, list: ClusterList) -> ClusterList {
        match list {
            ClusterList::Owned => ClusterList::Owned,
            _ if count == 0 => ClusterList::Free,
            _ if count == self.cluster_len(c) => ClusterList::Full,
            ClusterList::Free | ClusterList::Full => ClusterList::Nonfull,
            l => l,
        }
    }

    /// Moves cluster `c` to `to` (both locks held).
    fn move_cluster(si: &mut SiState, c: u32, ci: &mut ClusterState, to: ClusterList) {
        if ci.list == to {
            return;
        }
        if ci.list != ClusterList::Owned {
            si.lists.remove(ci.list, c);
        }
        if to != ClusterList::Owned {
            si.lists.push_tail(to, c);
        }
        ci.list = to;
    }

    /// Allocates free slots of cluster `c` from `from` on, up to `n - out.len()`
    /// (cluster lock held); returns where the scan stopped.
    fn take_from_cluster(
        &self,
        c: u32,
        ci: &mut ClusterState,
        from: u32,
        n: usize,
        out: &mut Vec<u32>,
    ) -> u32 {
        let end = c * SWAPFILE_CLUSTER + self.cluster_len(c);
        let mut s = from.max(c * SWAPFILE_CLUSTER);
        while s < end && out.len() < n {
            let m = &self.swap_map[s as usize];
            if m.load(Ordering::Relaxed) == 0 {
                m.store(SWAP_HAS_CACHE, Ordering::Relaxed);
                ci.count += 1;
                self.inuse.fetch_add(1, Ordering::Relaxed);
                out.push(s);
            }
            s += 1;
        }
        s
    }

    /// Allocates up to `n` free slots for CPU `cpu` (Linux's `get_swap_pages`),
    /// appending them to `out` with their map byte set to [`SWAP_HAS_CACHE`].
    /// Returns how many it found: fewer than `n` only when the device is full.
    pub(crate) fn get_swap_pages(&self, cpu: usize, n: usize, out: &mut Vec<u32>) -> usize {
        let start = out.len();
        let n = start + n;
        if self.inuse() >= self.nr_slots as u64 {
            return 0;
        }
        match self.policy {
            SwapAllocPolicy::PerCpuCluster => {
                self.alloc_percpu_cluster(cpu % self.pcp.len(), n, out)
            }
            _ => self.scan_swap_map_slots(cpu, n, out),
        }
        out.len() - start
    }

    /// `PerCpuCluster`: the CPU's own cluster first, then a new one from the
    /// nonfull, free or frag list, then (device nearly full) free slots in
    /// clusters other CPUs own.
    fn alloc_percpu_cluster(&self, cpu: usize, n: usize, out: &mut Vec<u32>) {
        let mut pc = self.pcp[cpu].lock(&self.pcp_lock_stats);
        while out.len() < n {
            if pc.cluster != NIL {
                let c = pc.cluster;
                let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
                pc.next = self.take_from_cluster(c, &mut ci, pc.next, n, out);
                if out.len() == n {
                    return;
                }
                // Used up: back on a list (cluster lock -> device lock).
                let to = match ci.count {
                    0 => ClusterList::Free,
                    k if k == self.cluster_len(c) => ClusterList::Full,
                    _ => ClusterList::Frag,
                };
                let mut si = self.si_lock.lock(&self.si_lock_stats);
                Self::move_cluster(&mut si, c, &mut ci, to);
                *pc = NO_CURSOR;
            }
            match self.isolate_cluster() {
                Isolated::Got(c) => {
                    *pc = PcpCursor {
                        cluster: c,
                        next: c * SWAPFILE_CLUSTER,
                    }
                }
                Isolated::Busy => relax(),
                Isolated::Empty => break,
            }
        }
        if out.len() < n {
            self.steal_owned(n, out);
        }
    }

    /// Takes a cluster off the nonfull, free or frag list (in that order, as
    /// Linux prefers partly used clusters) and marks it owned. The device lock
    /// only `try_lock`s clusters (lock order); `Busy` asks the caller to retry.
    fn isolate_cluster(&self) -> Isolated {
        let mut si = self.si_lock.lock(&self.si_lock_stats);
        let mut busy = false;
        for l in [ClusterList::Nonfull, ClusterList::Free, ClusterList::Frag] {
            let mut found = None;
            for c in si.lists.iter(l) {
                if let Some(g) = self.clusters[c as usize].try_lock(&self.cluster_lock_stats) {
                    found = Some((c, g));
                    break;
                }
                busy = true;
            }
            if let Some((c, mut ci)) = found {
                Self::move_cluster(&mut si, c, &mut ci, ClusterList::Owned);
                return Isolated::Got(c);
            }
        }
        if busy {
            Isolated::Busy
        } else {
            Isolated::Empty
        }
    }

    /// Last resort: free slots in clusters that other CPUs own.
    fn steal_owned(&self, n: usize, out: &mut Vec<u32>) {
        for c in 0..self.clusters.len() as u32 {
            if out.len() == n || self.inuse() >= self.nr_slots as u64 {
                return;
            }
            let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
            if ci.list == ClusterList::Owned && ci.count < self.cluster_len(c) {
                self.take_from_cluster(c, &mut ci, 0, n, out);
            }
        }
    }

    /// The cursor policies (Linux 5.8's `scan_swap_map_slots`), all under the
    /// device lock: the CPU's cluster from the free list while there is one, then
    /// a linear scan of the map from the shared or per-CPU cursor.
    fn scan_swap_map_slots(&self, cpu: usize, n: usize, out: &mut Vec<u32>) {
        let mut si = self.si_lock.lock(&self.si_lock_stats);
        let cpu = cpu % si.percpu_cluster.len();
        while out.len() < n {
            let mut pc = si.percpu_cluster[cpu];
            if pc.cluster == NIL {
                let Some(c) = si.lists.iter(ClusterList::Free).next() else {
                    break;
                };
                let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
                Self::move_cluster(&mut si, c, &mut ci, ClusterList::Owned);
                pc = PcpCursor {
                    cluster: c,
                    next: c * SWAPFILE_CLUSTER,
                };
            }
            let c = pc.cluster;
            let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
            pc.next = self.take_from_cluster(c, &mut ci, pc.next, n, out);
            if out.len() < n {
                let to = self.target_list(c, ci.count, ClusterList::Frag);
                Self::move_cluster(&mut si, c, &mut ci, to);
                pc = NO_CURSOR;
            }
            si.percpu_cluster[cpu] = pc;
        }
        // No free cluster left: scan from the cursor, wrapping once.
        let mut scanned = 0u64;
        let mut s = match self.policy {
            SwapAllocPolicy::SharedCursor => si.cluster_next,
            _ => si.cluster_next_cpu[cpu],
        };
        while out.len() < n && scanned < self.nr_slots as u64 && self.inuse() < self.nr_slots as u64
        {
            if s >= self.nr_slots {
                s = 0;
            }
            scanned += 1;
            if self.swap_map[s as usize].load(Ordering::Relaxed) == 0 {
                let c = s / SWAPFILE_CLUSTER;
                let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
                let before = out.len();
                self.take_from_cluster(c, &mut ci, s, before + 1, out);
                if out.len() > before {
                    let to = self.target_list(c, ci.count, ci.list);
                    Self::move_cluster(&mut si, c, &mut ci, to);
                }
                drop(ci);
                self.set_cluster_next(&mut si, cpu, s + 1);
            }
            s += 1;
        }
    }

    /// Moves the scan cursor to `next` (Linux's `set_cluster_next`): with
    /// `PerCpuCursor`, leaving a 64 MiB trunk jumps to a random trunk's start.
    fn set_cluster_next(&self, si: &mut SiState, cpu: usize, next: u32) {
        if self.policy == SwapAllocPolicy::SharedCursor {
            si.cluster_next = next;
            return;
        }
        let prev = si.cluster_next_cpu[cpu];
        let mut next = next;
        if prev / SWAP_ADDRESS_SPACE_PAGES != next / SWAP_ADDRESS_SPACE_PAGES
            || next >= self.nr_slots
        {
            si.rng ^= si.rng << 13;
            si.rng ^= si.rng >> 7;
            si.rng ^= si.rng << 17;
            next = (si.rng % self.nr_slots as u64) as u32;
            next -= next % SWAP_ADDRESS_SPACE_PAGES;
        }
        si.cluster_next_cpu[cpu] = next;
    }

    /// Adds a reference to an in-use slot (Linux's `swap_duplicate`, for a page-
    /// table entry that will hold it).
    pub(crate) fn swap_duplicate(&self, slot: u32) -> Result<(), MapError> {
        self.update_in_use(slot, |v| {
            if v & !SWAP_HAS_CACHE >= SWAP_MAP_MAX {
                return Err(MapError::TooManyRefs(slot));
            }
            Ok(v + 1)
        })
    }

    /// Under the cluster lock, replaces the map byte `v` of an in-use slot by
    /// `f(v)`, or leaves it when `f` refuses.
    fn update_in_use(
        &self,
        slot: u32,
        f: impl FnOnce(u8) -> Result<u8, MapError>,
    ) -> Result<(), MapError> {
        if slot >= self.nr_slots {
            return Err(MapError::OutOfRange(slot));
        }
        let _ci = self.lock_cluster(slot);
        let m = &self.swap_map[slot as usize];
        let v = m.load(Ordering::Relaxed);
        if v == 0 {
            return Err(MapError::NotInUse(slot));
        }
        m.store(f(v)?, Ordering::Relaxed);
        Ok(())
    }

    /// Marks an in-use slot as having a swap-cache page (Linux's
    /// `swapcache_prepare`): of concurrent callers, one wins and reads the slot,
    /// the others find the page in the cache or wait.
    pub(crate) fn swapcache_prepare(&self, slot: u32) -> Result<(), MapError> {
        self.update_in_use(slot, |v| {
            if v & SWAP_HAS_CACHE != 0 {
                return Err(MapError::CacheBusy(slot));
            }
            Ok(v | SWAP_HAS_CACHE)
        })
    }

    /// Drops one reference (Linux's `swap_free`); `on_free` runs, under the
    /// cluster lock, for a slot that became free. Returns the map byte left.
    pub(crate) fn swap_free(
        &self,
        slot: u32,
        on_free: &mut dyn FnMut(u32),
    ) -> Result<u8, MapError> {
        self.put(slot, 1, on_free)
    }

    /// Drops the swap-cache reference (Linux's `put_swap_folio` /
    /// `swapcache_clear`).
    pub(crate) fn swapcache_clear(
        &self,
        slot: u32,
        on_free: &mut dyn FnMut(u32),
    ) -> Result<u8, MapError> {
        self.put(slot, SWAP_HAS_CACHE, on_free)
    }

    /// The map byte after dropping `what` from `v`, or why it cannot be dropped.
    fn dropped(slot: u32, v: u8, what: u8) -> Result<u8, MapError> {
        if what == SWAP_HAS_CACHE {
            if v & SWAP_HAS_CACHE == 0 {
                return Err(MapError::NoCache(slot));
            }
            Ok(v & !SWAP_HAS_CACHE)
        } else if v & !SWAP_HAS_CACHE == 0 {
            Err(MapError::NotInUse(slot))
        } else {
            Ok(v - 1)
        }
    }

    fn put(&self, slot: u32, what: u8, on_free: &mut dyn FnMut(u32)) -> Result<u8, MapError> {
        if slot >= self.nr_slots {
            return Err(MapError::OutOfRange(slot));
        }
        let c = slot / SWAPFILE_CLUSTER;
        let m = &self.swap_map[slot as usize];
        let mut si = None;
        if self.policy != SwapAllocPolicy::PerCpuCluster {
            // Linux 5.8: a reference that does not free the slot is dropped under
            // the cluster lock alone; freeing takes the device lock first.
            let ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
            let v = Self::dropped(slot, m.load(Ordering::Relaxed), what)?;
            if v != 0 {
                m.store(v, Ordering::Relaxed);
                return Ok(v);
            }
            drop(ci);
            si = Some(self.si_lock.lock(&self.si_lock_stats));
        }
        let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
        let v = Self::dropped(slot, m.load(Ordering::Relaxed), what)?;
        if v != 0 {
            m.store(v, Ordering::Relaxed);
            return Ok(v);
        }
        on_free(slot);
        m.store(0, Ordering::Relaxed);
        ci.count -= 1;
        self.inuse.fetch_sub(1, Ordering::Relaxed);
        let to = self.target_list(c, ci.count, ci.list);
        if to != ci.list {
            let mut si = si.unwrap_or_else(|| self.si_lock.lock(&self.si_lock_stats));
            Self::move_cluster(&mut si, c, &mut ci, to);
        }
        Ok(0)
    }

    /// Gives every CPU's cluster back to its list (before `swapoff`, or to
    /// check the lists in a quiet state).
    #[cfg_attr(not(test), expect(dead_code))] // used by the unit and loom tests
    pub(crate) fn drain_percpu(&self) {
        for pc in self.pcp.iter() {
            let mut pc = pc.lock(&self.pcp_lock_stats);
            if pc.cluster != NIL {
                let c = pc.cluster;
                let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
                let to = self.target_list(c, ci.count, ClusterList::Frag);
                let mut si = self.si_lock.lock(&self.si_lock_stats);
                Self::move_cluster(&mut si, c, &mut ci, to);
                *pc = NO_CURSOR;
            }
        }
        let mut si = self.si_lock.lock(&self.si_lock_stats);
        for cpu in 0..si.percpu_cluster.len() {
            let c = si.percpu_cluster[cpu].cluster;
            if c != NIL {
                let mut ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
                let to = self.target_list(c, ci.count, ClusterList::Frag);
                Self::move_cluster(&mut si, c, &mut ci, to);
                si.percpu_cluster[cpu] = NO_CURSOR;
            }
        }
    }

    /// Clusters per list: `[free, nonfull, frag, full, owned]`.
    #[cfg_attr(not(test), expect(dead_code))] // used by the unit and loom tests
    pub(crate) fn list_counts(&self) -> [u32; 5] {
        let si = self.si_lock.lock(&self.si_lock_stats);
        let l = si.lists.len;
        let owned = self.clusters.len() as u32 - l.iter().sum::<u32>();
        [l[0], l[1], l[2], l[3], owned]
    }

    /// Verifies the invariants of the module header. Call it quiet (no
    /// allocation or free in flight).
    pub(crate) fn check(&self) -> Result<(), String> {
        let si = self.si_lock.lock(&self.si_lock_stats);
        let mut total = 0u64;
        let mut on = vec![None; self.clusters.len()];
        for l in [
            ClusterList::Free,
            ClusterList::Nonfull,
            ClusterList::Frag,
            ClusterList::Full,
        ] {
            let mut n = 0;
            for c in si.lists.iter(l) {
                if on[c as usize].replace(l).is_some() {
                    return Err(format!("cluster {c} is on two lists"));
                }
                n += 1;
            }
            if n != si.lists.len[l as usize] {
                return Err(format!(
                    "{l:?} list holds {n} clusters, its length says {}",
                    si.lists.len[l as usize]
                ));
            }
        }
        for c in 0..self.clusters.len() as u32 {
            let ci = self.clusters[c as usize].lock(&self.cluster_lock_stats);
            let base = c * SWAPFILE_CLUSTER;
            let used = (base..base + self.cluster_len(c))
                .filter(|&s| self.swap_map[s as usize].load(Ordering::Relaxed) != 0)
                .count() as u32;
            if used != ci.count {
                return Err(format!(
                    "cluster {c}: {used} slots in use, count says {}",
                    ci.count
                ));
            }
            total += used as u64;
            let listed = on[c as usize].unwrap_or(ClusterList::Owned);
            if listed != ci.list {
                return Err(format!(
                    "cluster {c} is on {listed:?}, its state says {:?}",
                    ci.list
                ));
            }
            if ci.list != ClusterList::Owned && self.target_list(c, ci.count, ci.list) != ci.list {
                return Err(format!(
                    "cluster {c} with {} slots in use is on {:?}",
                    ci.count, ci.list
                ));
            }
        }
        if total != self.inuse() {
            return Err(format!("{total} slots in use, inuse says {}", self.inuse()));
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
