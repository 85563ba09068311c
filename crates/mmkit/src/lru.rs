//! The LRU lists of anonymous pages (Linux's `lruvec` and the folio batches of
//! `mm/swap.c`): per node an active and an inactive list, and per CPU an
//! `lru_add` batch through which newly mapped pages reach them, so that the LRU
//! lock is taken once per batch instead of once per fault.
//!
//! The list mechanics (intrusive lists with links indexed by pfn) are the core's
//! ([`mmkit_core::lru`]); this file adds the LRU locks, the per-CPU batches,
//! and `PG_LRU` on the page descriptor, kept equal to "on a list" as Linux's
//! flag is.
//!
//! Beyond Linux, each node's lists are split into shards (one per CPU, up to
//! [`MAX_LRU_SHARDS`]), each a pair of lists under a lock of its own; a page's
//! shard follows from its pfn (its 2 MiB block), so every operation on a page
//! knows which lock to take, and the pages of one batch (mostly from one
//! per-CPU refill) share a few shards. Reclaimers take their batches from the
//! shards in turn (a per-node cursor), so concurrent reclaimers and faults
//! spread over the locks where Linux's single `lru_lock` serialises them (the
//! next contention point of the swap-slot series (docs/upstream.md) once the swap cache's was gone). Ageing is
//! per shard: the tail of a shard is the oldest of that shard.
//!
//! With memory cgroups, each group has lists of its own on every node (an
//! [`Lruvec`], Linux's lruvec per memcg and node), with the same shards; the
//! root's are this struct's. A frame's lists are its owner's
//! (`memcontrol::MemCgTable::owner`), which is set before the frame is
//! mapped and cleared only after it left the lists, so every operation on a
//! page finds the same lists. Without groups, no owner is looked up.
//!
//! Invariants (all under the LRU lock of the frame's shard):
//! - a frame is on a list only if it is an allocated order-0 page mapped by some
//!   space (`mapping != 0`), or the head of a mapped huge page (Linux's large
//!   folio: one entry for 512 pages, split by reclaim), at the moment it is
//!   linked; whoever unmaps it for good (unmap through the mmu_gather,
//!   migration) takes it off with that same lock (`remove_batch`, `replace`)
//!   before the page is freed;
//! - an isolated page (`isolate`) is off the lists with `PG_LRU` clear and holds
//!   an extra reference taken under the lock, so it cannot be freed until its
//!   isolator drops that reference after `putback`;
//! - a frame pending in a per-CPU batch holds nothing but `PG_LRU_ADD`, which
//!   every free clears: the batch re-checks both under the lock when it
//!   drains (a page unmapped meanwhile is skipped; one freed since, perhaps
//!   reallocated and not yet mapped by its new owner, has lost the flag and is
//!   skipped; `PG_LRU` stops a second link).
//!   A stale entry (its page migrated or freed before the drain) may link a
//!   reallocated page whose reverse map a fault has set but whose entry it has
//!   not installed yet; a fault that then loses its race unlinks the page and
//!   drops it by reference (`drop_unpublished` in `space/memory.rs`), so a
//!   reclaimer that isolated it meanwhile frees it.
//!
//! Locking: per-CPU batch mutex (uncontended but for remote drains) -> one
//! shard's LRU lock at a time ([`StatLock`], acquisitions and waits of all
//! shards counted together like the zone lock's). The link arrays are atomics
//! written only under the owning shard's lock, read only under it.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::lru::{LruLinks, LruLists};
use mmkit_core::lru_policy::LRU_ACTIVATE;
use mmkit_core::page::{PG_LRU, PG_LRU_ADD};
use mmkit_core::{LockStats, LruPolicy, PageState, Platform};

pub(crate) use mmkit_core::lru::LruList;

use crate::pgtable::{desc, HPAGE_PMD_ORDER};
use crate::sync::{Guard, LockClassStats, StatLock};
use crate::{Mm, Pfn, StdPlatform};

/// Pages a per-CPU `lru_add` batch holds before it drains (Linux's folio batch).
pub(crate) const LRU_ADD_BATCH: usize = 31;
/// Most LRU shards per node.
pub(crate) const MAX_LRU_SHARDS: usize = 16;
/// A shard holds whole blocks of this order (2 MiB).
const SHARD_BLOCK_ORDER: u32 = 9;

/// How a batch operation finds the group of each frame's owner id.
#[derive(Clone, Copy)]
enum Owners<'g> {
    /// Each frame is one its owner's spaces still hold (the unmap's flush):
    /// the lock-free lookup serves.
    Held,
    /// The frames may be stale entries (an `lru_add` batch): their owners'
    /// groups are looked up with a reference held, except the one given,
    /// which the caller holds (ids are unique among live groups, and the
    /// entry's owner is checked again under the lock).
    Stale(Option<&'g crate::memcontrol::MemCgInner>),
}

/// The lists of one memory cgroup (or the root) on every node: Linux's
/// lruvecs of one memcg, each split into the LRU's shards.
pub(crate) struct Lruvec {
    /// Per node, `shards` shards: index `nid * shards + shard`.
    sets: Box<[CachePadded<StatLock<SetLists>>]>,
    /// Per node: the shard the next isolation starts from.
    cursor: Box<[CachePadded<std::sync::atomic::AtomicUsize>]>,
    /// (L) Per shard: (active, inactive) lengths as of the last unlock, so that
    /// reclaim's sizing decisions never take a lock (Linux's lruvec sizes):
    /// written under the shard's lock, read without it.
    lens: Box<[CachePadded<[AtomicU64; 2]>]>,
}

impl Lruvec {
    fn new(nr_nodes: usize, shards: usize) -> Lruvec {
        Lruvec {
            sets: (0..nr_nodes * shards)
                .map(|_| CachePadded::new(StatLock::new(SetLists::default())))
                .collect(),
            cursor: (0..nr_nodes)
                .map(|_| CachePadded::new(std::sync::atomic::AtomicUsize::new(0)))
                .collect(),
            lens: (0..nr_nodes * shards)
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
        }
    }

    /// `(active, inactive)` pages on node `nid`'s lists of this lruvec.
    pub(crate) fn nr_pages(&self, lru: &Lru, nid: usize) -> (u64, u64) {
        let first = lru.node(nid) * lru.shards;
        self.lens[first..first + lru.shards]
            .iter()
            .fold((0, 0), |(a, i), l| {
                (
                    a + l[0].load(Ordering::Relaxed),
                    i + l[1].load(Ordering::Relaxed),
                )
            })
    }
}

/// The lruvec of a frame: the root's, or its group's.
#[derive(Copy, Clone)]
pub(crate) enum VecRef<'g> {
    Root,
    Group(&'g crate::memcontrol::MemCgInner),
}

impl<'g> VecRef<'g> {
    pub(crate) fn get<'a>(&self, lru: &'a Lru) -> &'a Lruvec
    where
        'g: 'a,
    {
        match self {
            VecRef::Root => &lru.root,
            VecRef::Group(g) => &g.lruvec,
        }
    }

    /// The group (`None` for the root).
    pub(crate) fn group(&self) -> Option<&'g crate::memcontrol::MemCgInner> {
        match self {
            VecRef::Root => None,
            VecRef::Group(g) => Some(g),
        }
    }
}

/// The anonymous LRU of one Mm: per-node lists (the root's, and each memory
/// cgroup's `Lruvec`), per-CPU add batches. Fields read without their lock
/// carry a locking letter (legend in `rmap.rs`).
pub(crate) struct Lru {
    links: LruLinks,
    /// The root's lists (every page when there are no groups).
    root: Lruvec,
    shards: usize,
    nr_nodes: usize,
    lock_stats: LockClassStats,
    batches: Box<[CachePadded<parking_lot::Mutex<Vec<u32>>>]>,
    /// (A) Per node: pages isolated from its lists by reclaimers now (Linux's
    /// `NR_ISOLATED_ANON`), for `too_many_isolated`; counted after the LRU
    /// lock is dropped, read without it.
    isolated: Box<[CachePadded<AtomicU64>]>,
    /// Reclaimers inside `shrink_node` now (kswapd and direct), for
    /// `Mm::wait_reclaim_idle`.
    pub(crate) active_reclaimers: AtomicU64,
    /// The eviction policy (`mmkit_core::lru_policy`).
    pub(crate) policy: LruPolicy,
    /// Per node: the refault clocks (`workingset.rs`).
    pub(crate) workingset: crate::workingset::NodeAges,
}

/// One list set: the lists, and the pages their huge entries stand for
/// beyond one each (Linux counts an LRU in pages, `folio_nr_pages`).
#[derive(Default)]
struct SetLists {
    lists: LruLists,
    /// Per list (inactive, active): 511 per huge head linked.
    huge_extra: [u64; 2],
}

/// Pages an entry for `pfn` stands for beyond one: 511 for a huge head. Its
/// order does not change while it is linked (only its isolator splits it).
fn extra_pages(mm: &Mm, pfn: u32) -> u64 {
    (1u64 << desc(mm, Pfn::new(pfn as u64)).order()) - 1
}

/// A held node LRU lock and the links it guards.
struct Locked<'a> {
    links: &'a LruLinks,
    mm: &'a Mm,
    g: Guard<'a, SetLists>,
    /// The node's list lengths for lock-free readers, published on unlock.
    lens: &'a [AtomicU64; 2],
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.lens[0].store(self.nr_pages(LruList::Active), Ordering::Relaxed);
        self.lens[1].store(self.nr_pages(LruList::Inactive), Ordering::Relaxed);
    }
}

impl Locked<'_> {
    fn on_lru(&self, pfn: u32) -> bool {
        self.links.which(pfn).is_some()
    }
    fn nr_pages(&self, list: LruList) -> u64 {
        self.g.lists.len(list) + self.g.huge_extra[list as usize]
    }
    fn add(&mut self, pfn: u32, list: LruList) {
        self.g.lists.add_head(self.links, pfn, list);
        self.g.huge_extra[list as usize] += extra_pages(self.mm, pfn);
    }
    fn del(&mut self, pfn: u32) -> Option<LruList> {
        let list = self.g.lists.del(self.links, pfn)?;
        self.g.huge_extra[list as usize] -= extra_pages(self.mm, pfn);
        Some(list)
    }
}

/// May `pfn` go on a list: an allocated order-0 page some space maps, or the
/// head of a huge page mapped by its PMD or (split PMD) by some of its PTEs?
fn linkable(mm: &Mm, pfn: u32) -> bool {
    let p = Pfn::new(pfn as u64);
    let d = desc(mm, p);
    if d.state() != PageState::Alloc {
        return false;
    }
    match d.order() {
        0 => d.mapping.load(Ordering::Acquire) != 0,
        HPAGE_PMD_ORDER => {
            d.mapping.load(Ordering::Acquire) != 0
                || desc(mm, Pfn::new(p.get() + 1))
                    .nr_pages_mapped()
                    .load(Ordering::Acquire)
                    != 0
        }
        _ => false,
    }
}

impl Lru {
    /// The lists of `nr_pages` frames on `nr_nodes` nodes; `sharded`: a
    /// shard per CPU (mmkit), else one pair of lists per node (Linux).
    pub(crate) fn new(
        nr_pages: u64,
        nr_nodes: usize,
        nr_cpus: usize,
        sharded: bool,
        policy: LruPolicy,
    ) -> Lru {
        let nr_nodes = nr_nodes.max(1);
        let shards = if sharded {
            nr_cpus.clamp(1, MAX_LRU_SHARDS).next_power_of_two()
        } else {
            1
        };
        Lru {
            links: LruLinks::new(nr_pages as usize),
            root: Lruvec::new(nr_nodes, shards),
            shards,
            nr_nodes,
            active_reclaimers: AtomicU64::new(0),
            lock_stats: LockClassStats::new(),
            batches: (0..nr_cpus.max(1))
                .map(|_| CachePadded::new(parking_lot::Mutex::new(Vec::new())))
                .collect(),
            isolated: (0..nr_nodes)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            policy,
            workingset: crate::workingset::NodeAges::new(nr_nodes),
        }
    }

    /// The policy state of `pfn` (`lru_policy::LRU_*`): for its isolator, or
    /// the fault that maps it before queueing it.
    pub(crate) fn state(&self, pfn: Pfn) -> u8 {
        self.links.state(pfn.get() as u32)
    }

    /// Sets the policy state of `pfn` (same owners as [`state`](Self::state)).
    pub(crate) fn set_state(&self, pfn: Pfn, v: u8) {
        self.links.set_state(pfn.get() as u32, v);
    }

    /// Locks list set `i` (`nid * shards + shard`) of `vec`.
    fn lock<'a>(&'a self, mm: &'a Mm, vec: &'a Lruvec, i: usize) -> Locked<'a> {
        Locked {
            links: &self.links,
            mm,
            g: vec.sets[i].lock(&self.lock_stats),
            lens: &vec.lens[i],
        }
    }

    fn nr_nodes(&self) -> usize {
        self.nr_nodes
    }

    /// Empty lists for a new memory cgroup.
    pub(crate) fn new_lruvec(&self) -> Lruvec {
        Lruvec::new(self.nr_nodes, self.shards)
    }

    /// The root's lists.
    pub(crate) fn root(&self) -> &Lruvec {
        &self.root
    }

    /// The lruvec of the group with id `owner` (0: the root's), for a frame
    /// it owns: a group that owns a frame is alive (its spaces hold it), so
    /// the group table's lock-free reference serves (no lock, no reference
    /// count on the fast paths).
    fn vec_of_owner<'a>(&self, mm: &'a Mm, owner: u16) -> VecRef<'a> {
        if owner == 0 {
            return VecRef::Root;
        }
        // SAFETY: `owner` is the owner of a frame this call works on (linked,
        // being linked, or isolated), so the group is alive until the frame
        // is uncharged, which happens after it left the lists and not during
        // this call.
        match unsafe { mm.memcg().owning_group(owner) } {
            Some(g) => VecRef::Group(g),
            None => {
                debug_assert!(false, "a page owned by memory cgroup {owner}, gone");
                VecRef::Root
            }
        }
    }

    /// The owner of frame `pfn` (0 without groups).
    #[inline]
    fn owner_of(mm: &Mm, pfn: u32) -> u16 {
        let t = mm.memcg();
        if t.in_use() {
            t.owner(pfn.into())
        } else {
            0
        }
    }

    fn node(&self, nid: usize) -> usize {
        nid.min(self.nr_nodes() - 1)
    }

    /// The list set of frame `pfn` in its lruvec: its node's, the shard of
    /// its 2 MiB block.
    fn set_of(&self, mm: &Mm, pfn: u32) -> usize {
        let nid = self.node(mm.node_of(Pfn::new(pfn as u64)));
        nid * self.shards + ((pfn >> SHARD_BLOCK_ORDER) as usize & (self.shards - 1))
    }

    /// Linux's `too_many_isolated`: reclaimers of node `nid` hold more pages
    /// isolated than its inactive list has left, so another direct reclaimer
    /// would find little to do but make the others' batches smaller (kswapd is
    /// never throttled).
    pub(crate) fn too_many_isolated(&self, mm: &Mm, nid: usize) -> bool {
        let isolated = self.nr_isolated(nid);
        isolated > 0 && isolated > self.nr_pages(mm, nid).1
    }

    /// Pages of node `nid` isolated by reclaimers now.
    pub(crate) fn nr_isolated(&self, nid: usize) -> u64 {
        self.isolated[self.node(nid)].load(Ordering::Relaxed)
    }

    /// `n` more pages of node `nid` are isolated: the sub-pages of a huge page
    /// its isolator split (they count as isolated until `end_isolation`).
    pub(crate) fn add_isolated(&self, nid: usize, n: usize) {
        self.isolated[self.node(nid)].fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The isolation of `n` pages of node `nid` has ended (the caller put them
    /// back and dropped their references).
    pub(crate) fn end_isolation(&self, nid: usize, n: usize) {
        self.isolated[self.node(nid)].fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// LRU lock statistics, summed over nodes.
    pub(crate) fn lock_stats(&self) -> LockStats {
        self.lock_stats.snapshot()
    }

    /// `(active, inactive)` pages on node `nid`'s lists, every group's.
    pub(crate) fn nr_pages(&self, mm: &Mm, nid: usize) -> (u64, u64) {
        let mut n = self.root.nr_pages(self, nid);
        if mm.memcg().in_use() {
            for g in mm.memcg().all() {
                let (a, i) = g.lruvec.nr_pages(self, nid);
                n = (n.0 + a, n.1 + i);
            }
        }
        n
    }

    /// Linux's `lru_add_drain`: this CPU's batch to the lists.
    pub(crate) fn drain_local(&self, mm: &Mm) {
        let cpu = StdPlatform::cpu_id() % self.batches.len();
        let mut b = self.batches[cpu].lock();
        if !b.is_empty() {
            self.add_batch(mm, &b, None);
            b.clear();
        }
    }

    /// Linux's `folio_add_lru`: queues newly mapped pages on this CPU's batch,
    /// draining it to the lists (one LRU lock hold) when it is full. The first
    /// page starts with the policy state `first`, the others with `rest`
    /// (`lru_policy::LRU_*`; `LRU_ACTIVATE` links it on the active list).
    /// `held`: the group the caller charged the pages to (it holds a
    /// reference), whose lists a drain then finds without a lookup.
    pub(crate) fn lru_cache_add(
        &self,
        mm: &Mm,
        pfns: &[Pfn],
        first: u8,
        rest: u8,
        held: Option<&crate::memcontrol::MemCgInner>,
    ) {
        for (i, &p) in pfns.iter().enumerate() {
            // Before the flag: a drain that sees the flag sees the state.
            self.links
                .set_state(p.get() as u32, if i == 0 { first } else { rest });
            desc(mm, p).set_flag(PG_LRU_ADD);
        }
        let cpu = StdPlatform::cpu_id() % self.batches.len();
        let mut b = self.batches[cpu].lock();
        b.extend(pfns.iter().map(|p| p.get() as u32));
        if b.len() >= LRU_ADD_BATCH {
            self.add_batch(mm, &b, held);
            b.clear();
        }
    }

    /// Linux's `lru_add_drain_all`: every CPU's batch to the lists.
    pub(crate) fn drain_all(&self, mm: &Mm) {
        for b in self.batches.iter() {
            let mut b = b.lock();
            if !b.is_empty() {
                self.add_batch(mm, &b, None);
                b.clear();
            }
        }
    }

    /// Links the pages of a batch that are still mapped and not yet on a list to
    /// the head of their node's inactive list (the active one for a page
    /// queued with `LRU_ACTIVATE`), one lock hold per node.
    fn add_batch(&self, mm: &Mm, pfns: &[u32], held: Option<&crate::memcontrol::MemCgInner>) {
        let link = |l: &mut Locked<'_>, pfn: u32, owner: u16| {
            let d = desc(mm, Pfn::new(pfn as u64));
            // Still queued: not freed (and perhaps reallocated) since; and
            // the lists locked are its owner's (a stale entry of a frame
            // reallocated to another group leaves it to that group's entry).
            if !d.test_flag(PG_LRU_ADD) || Self::owner_of(mm, pfn) != owner {
                return;
            }
            d.clear_flag(PG_LRU_ADD);
            if !l.on_lru(pfn) && linkable(mm, pfn) {
                let st = l.links.state(pfn);
                let list = if st & LRU_ACTIVATE != 0 {
                    l.links.set_state(pfn, st & !LRU_ACTIVATE);
                    LruList::Active
                } else {
                    LruList::Inactive
                };
                l.add(pfn, list);
                d.set_flag(PG_LRU);
            }
        };
        self.per_set(mm, pfns, Owners::Stale(held), |l, run, owner| {
            for &(_, pfn) in run {
                link(l, pfn, owner);
            }
        });
    }

    /// Runs `f` on each run of pfns of one owner and list set (as `(key,
    /// pfn)` pairs) under that set's lock, taking each lock once (the pfns of
    /// one batch share a few sets). `owners` says how to find a run's group
    /// (see [`Owners`]). `f` gets the owner the run was keyed by.
    fn per_set(
        &self,
        mm: &Mm,
        pfns: &[u32],
        owners: Owners<'_>,
        mut f: impl FnMut(&mut Locked<'_>, &[(u64, u32)], u16),
    ) {
        // One word per key (owner above the set), as cheap to sort as the
        // set alone.
        let mut keyed: Vec<(u64, u32)> = pfns
            .iter()
            .map(|&p| {
                let owner = u64::from(Self::owner_of(mm, p));
                ((owner << 32) | self.set_of(mm, p) as u64, p)
            })
            .collect();
        keyed.sort_unstable_by_key(|&(k, _)| k);
        for run in keyed.chunk_by(|a, b| a.0 == b.0) {
            let (owner, set) = ((run[0].0 >> 32) as u16, run[0].0 as u32 as usize);
            let looked_up;
            let vec = match owners {
                Owners::Stale(Some(h)) if h.id == owner => VecRef::Group(h),
                Owners::Stale(_) if owner != 0 => match mm.memcg().get(owner) {
                    Some(g) => {
                        looked_up = g;
                        VecRef::Group(&looked_up)
                    }
                    None => continue, // its group is gone: nothing of it is linkable
                },
                _ => self.vec_of_owner(mm, owner),
            };
            let mut l = self.lock(mm, vec.get(self), set);
            f(&mut l, run, owner);
        }
    }

    /// Takes pages that are being freed off the lists (the mmu_gather's flush,
    /// Linux's `__folio_put` -> `lruvec_del_folio`), one lock hold per list
    /// set; each run of one owner is then uncharged under that lock
    /// (`uncharge`, the flush's). Their reverse maps are already cleared.
    pub(crate) fn remove_batch(
        &self,
        mm: &Mm,
        pfns: &[u32],
        uncharge: &mut crate::memcontrol::UnchargeGather<'_>,
    ) {
        self.per_set(mm, pfns, Owners::Held, |l, run, owner| {
            for &(_, pfn) in run {
                if l.del(pfn).is_some() {
                    desc(mm, Pfn::new(pfn as u64)).clear_flag(PG_LRU);
                }
            }
            uncharge.add_run(owner, run.iter().map(|x| x.1));
        });
    }

    /// Migration moved `old` to `new` (whose reverse map is set): `new` takes
    /// `old`'s place and policy state (or goes on the inactive list when `old`
    /// was pending in a batch). Called before the PTE maps `new` (`migrate.rs`):
    /// until then no one else can unmap or free `new`, so it is still linkable
    /// here.
    pub(crate) fn replace(&self, mm: &Mm, old: Pfn, new: Pfn) {
        debug_assert!(
            linkable(mm, new.get() as u32),
            "replace by a page not mapped"
        );
        let vec = self.vec_of_owner(mm, Self::owner_of(mm, old.get() as u32));
        let mut l = self.lock(mm, vec.get(self), self.set_of(mm, old.get() as u32));
        let list = l.del(old.get() as u32).unwrap_or(LruList::Inactive);
        let st = l.links.state(old.get() as u32) & !LRU_ACTIVATE;
        desc(mm, old).clear_flag(PG_LRU);
        drop(l);
        let vec = self.vec_of_owner(mm, Self::owner_of(mm, new.get() as u32));
        let mut l = self.lock(mm, vec.get(self), self.set_of(mm, new.get() as u32));
        if !l.on_lru(new.get() as u32) {
            l.links.set_state(new.get() as u32, st);
            l.add(new.get() as u32, list);
            desc(mm, new).set_flag(PG_LRU);
        }
    }

    /// Linux's `isolate_lru_folios`: up to `n` pages (at least one entry; a
    /// huge entry counts its 512) from the tail of `list` on
    /// node `nid`, taken off the list with `PG_LRU` cleared and a reference each
    /// (dropped by the caller after `putback`, then `end_isolation`), appended
    /// to `out`.
    /// The shards are taken in turn from the node's cursor: a call takes from
    /// one shard, and from the next ones only while it still wants pages.
    pub(crate) fn isolate(
        &self,
        mm: &Mm,
        vec: &Lruvec,
        nid: usize,
        list: LruList,
        n: usize,
        out: &mut Vec<Pfn>,
    ) {
        let nid = self.node(nid);
        let start = vec.cursor[nid].fetch_add(1, Ordering::Relaxed);
        // Pages taken (a huge entry counts 512, as Linux's `nr_taken`), and
        // entries (what `end_isolation` will count).
        let (mut got, mut entries) = (0, 0);
        for k in 0..self.shards {
            if got == n {
                break;
            }
            let set = nid * self.shards + (start + k) % self.shards;
            let len = &vec.lens[set][usize::from(list == LruList::Inactive)];
            if len.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut l = self.lock(mm, vec, set);
            while got < n {
                let Some(pfn) = l.g.lists.tail(list) else {
                    break;
                };
                got += 1 + extra_pages(mm, pfn) as usize;
                l.del(pfn);
                let p = Pfn::new(pfn as u64);
                desc(mm, p).clear_flag(PG_LRU);
                // Linked means allocated and not yet through the gather's
                // flush, which needs this lock: the reference is safe to take.
                mm.pin_page(p);
                out.push(p);
                entries += 1;
            }
        }
        self.isolated[nid].fetch_add(entries, Ordering::Relaxed);
    }

    /// Linux's `move_folios_to_lru`: puts isolated pages back at the head of
    /// the list given, those still mapped; the caller then drops the isolation
    /// references.
    pub(crate) fn putback(&self, mm: &Mm, pages: &[(Pfn, LruList)]) {
        let mut keyed: Vec<((u16, usize), Pfn, LruList)> = pages
            .iter()
            .map(|&(p, list)| {
                let pfn = p.get() as u32;
                ((Self::owner_of(mm, pfn), self.set_of(mm, pfn)), p, list)
            })
            .collect();
        keyed.sort_by_key(|&(k, _, _)| k);
        for run in keyed.chunk_by(|a, b| a.0 == b.0) {
            let vec = self.vec_of_owner(mm, run[0].0 .0);
            let mut l = self.lock(mm, vec.get(self), run[0].0 .1);
            for &(_, p, list) in run {
                let pfn = p.get() as u32;
                if !l.on_lru(pfn) && linkable(mm, pfn) {
                    l.add(pfn, list);
                    desc(mm, p).set_flag(PG_LRU);
                }
            }
        }
    }

    /// Walks every list and checks the links, the lengths, `PG_LRU`, that every
    /// frame on a list is allocated (order 0 or a huge head), and the pages the
    /// huge entries stand for (quiescent).
    pub(crate) fn check(&self, mm: &Mm) -> Result<(), String> {
        self.check_lruvec(mm, 0, &self.root)?;
        for g in mm.memcg().all() {
            self.check_lruvec(mm, g.id, &g.lruvec)?;
        }
        Ok(())
    }

    /// `check` of one lruvec, whose pages must all be owned by group `id`.
    fn check_lruvec(&self, mm: &Mm, id: u16, vec: &Lruvec) -> Result<(), String> {
        for set in 0..vec.sets.len() {
            let nid = set / self.shards;
            let l = self.lock(mm, vec, set);
            for list in [LruList::Inactive, LruList::Active] {
                let mut extra = 0;
                l.g.lists
                    .check(l.links, list, |p| {
                        let d = desc(mm, Pfn::new(p as u64));
                        if !d.test_flag(PG_LRU) {
                            return Err("on a list without PG_LRU");
                        }
                        if d.state() != PageState::Alloc {
                            return Err("on a list but not allocated");
                        }
                        if !matches!(d.order(), 0 | HPAGE_PMD_ORDER) {
                            return Err("on a list but neither order 0 nor a huge head");
                        }
                        if l.links.state(p) & LRU_ACTIVATE != 0 {
                            return Err("linked with its lru_add placement hint left");
                        }
                        if Self::owner_of(mm, p) != id {
                            return Err("on the lists of another memory cgroup than its owner");
                        }
                        extra += extra_pages(mm, p);
                        Ok(())
                    })
                    .map_err(|(p, e)| {
                        format!("LRU of group {id}, node {nid}, {list:?} list: pfn {p}: {e}")
                    })?;
                if extra != l.g.huge_extra[list as usize] {
                    return Err(format!(
                        "LRU of node {nid}, {list:?} list: huge entries stand for {extra} \
                         extra pages, counted {}",
                        l.g.huge_extra[list as usize]
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{rmap, Gfp, MapFlags, PAGE_SIZE};

    /// An `lru_add` entry left behind by a page freed before its batch drained
    /// never links the frame's next incarnation, even one that already has a
    /// reverse map (a fault that has not installed it yet, and may lose its
    /// race and free it): the free cleared `PG_LRU_ADD`.
    #[test]
    fn stale_batch_entry_links_nothing() {
        let mm = crate::space::tests::mm();
        let s = mm.new_space().unwrap();
        let a = s.mmap(PAGE_SIZE, MapFlags::empty()).unwrap();
        s.write(a, &[1]).unwrap();
        let pfn = s.translate(a).unwrap().pfn;
        assert!(desc(&mm, pfn).test_flag(PG_LRU_ADD), "queued, not drained");
        s.munmap(a, PAGE_SIZE).unwrap();
        // The frame comes back (taking free pages until it does), "being
        // faulted".
        mm.drain_all_pages();
        let mut held = Vec::new();
        let again = loop {
            let p = mm
                .alloc_pages(Gfp::KERNEL | Gfp::HIGH, 0)
                .unwrap_or_else(|e| panic!("pfn {} never came back: {e}", pfn.get()));
            if p == pfn {
                break p;
            }
            held.push(p);
        };
        rmap::set(&mm, again, s.id(), a);
        mm.lru().drain_all(&mm);
        let d = desc(&mm, again);
        assert!(!d.test_flag(PG_LRU) && !d.test_flag(PG_LRU_ADD));
        assert_eq!(mm.lru().nr_pages(&mm, 0), (0, 0));
        rmap::clear(&mm, again);
        mm.free_pages(again, 0).unwrap();
        for p in held {
            mm.free_pages(p, 0).unwrap();
        }
        mm.check().unwrap();
    }
}
