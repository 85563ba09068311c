//! Reclaim (Linux's `mm/vmscan.c` for anonymous pages): aging the LRU lists
//! (`age_active` -> `shrink_active_list`), swapping out cold pages
//! (`shrink_inactive_list` -> `shrink_page_list`), the node-level loop
//! (`shrink_node`) that kswapd and direct reclaim share, and `Mm::reclaim`
//! (the victim of a swap-in exchange is `swap_exchange.rs`'s). What a
//! page's accessed bit means is the LRU policy's (`mmkit_core::lru_policy`:
//! mmkit's probation/protected clock, or Linux 6.18's classic rules); an
//! eviction leaves a shadow in the slot (`workingset.rs`).
//!
//! Swap-out of one isolated page (it holds an isolation reference):
//! 1. `trylock_page` (held: an access is using it, skip); only the mapping's and
//!    the isolation's references (more: a pin or `with_page`, skip); the accessed
//!    bit tested and cleared through the reverse map (`folio_referenced`), and
//!    the policy's verdict (`inactive_tail`): reclaim, keep on the inactive
//!    list, or activate.
//! 2. Slots for the batch (`get_swap_pages`), each page added to the swap cache.
//!    The batch's devices are pinned once each (`SwapPins`: the device
//!    `get_swap_pages` took the slots from, and those of pages still in the
//!    swap cache) and serve steps 1 to 5.
//! 3. Write, contiguous slots in one request (`swap_writepages`). With the page
//!    lock held no accessor reads or writes the page's bytes (`space/mmu.rs`), so
//!    the copy written is the page's content; a failed write drops the slot and
//!    the page stays mapped, untouched: nothing to restore.
//! 4. Unmap (`try_to_unmap_one`): the PTE gets the swap entry, whose slot gains
//!    the PTE's reference (`swap_duplicate`); RSS drops. An access that walked
//!    before re-checks the PTE under the page lock and faults (`do_swap_page`),
//!    finding the page in the swap cache and waiting for the page lock.
//! 5. Out of the swap cache, its slot entry replaced by the page's shadow;
//!    the slot keeps only the PTE's reference; the page's references are
//!    dropped and it is freed.
//!
//! Linux unmaps before writing; here the order is reversed because the page lock
//! already keeps the bytes stable, and it makes a write error trivially safe.
//!
//! A huge page is on the lists as one entry, its head (Linux's large folio);
//! a cold one is split into 512 order-0 pages that join the batch
//! (`split_huge_isolated`), as Linux splits a large folio it cannot swap whole.
//!
//! Invariants: a page is freed only after its PTE holds a swap entry whose slot
//! holds a verified copy (written with its checksum).
//!
//! Concurrency: any number of reclaimers per node (kswapd and every direct
//! reclaimer, as in Linux: this is where the swap locks of the swap-slot series contend (docs/upstream.md)),
//! each on its own isolated batch; a direct reclaimer waits while the node has
//! more pages isolated than inactive (`too_many_isolated`). A reclaimer never
//! waits for a lock: page locks are only try-locked, so concurrent batches at
//! worst skip each other's pages.
//!
//! Locking: the page side of the lock order in `rmap.rs`: page locks (try) ->
//! registry -> VMA lock (try_read). The LRU lock (`lru.rs`) and the swap locks
//! are taken with no page lock wait inside them. Nothing here allocates arena
//! pages, so direct reclaim may run inside any allocation.

use std::sync::atomic::Ordering;

use mmkit_core::lru_policy::{ActiveVerdict, TailVerdict};
use mmkit_core::page::PG_DIRTY;
use mmkit_core::{LruPolicy, Platform, VmEvent};

use crate::lru::{LruList, Lruvec};
use crate::memcontrol::MemCgInner;
use crate::pgtable::{desc, Pte, SwapEntry, HPAGE_PMD_NR};
use crate::rmap::{
    self, folio_referenced, folio_referenced_one, page_vma_mapped, rmap_walk, rmap_walk_huge,
    try_to_unmap_one, PageGuard, RmapOne, RmapWalkControl,
};
use crate::space::HugeSplit;
use crate::swap_cluster::MapError;
use crate::swapfile::{SwapError, SwapInfoStruct, SwapPins};
use crate::{workingset, Mm, Pfn, StdPlatform};

/// Pages isolated per scan (Linux's `SWAP_CLUSTER_MAX`).
pub(crate) const SWAP_CLUSTER_MAX: usize = 32;

/// Who reclaims (for the statistics).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reclaimer {
    Kswapd,
    Direct,
}

/// A page on its way out, locked.
struct Victim<'a> {
    pfn: Pfn,
    lock: PageGuard<'a>,
    entry: Option<SwapEntry>,
    /// Its content must be written (no slot yet, or dirty since the slot's copy).
    write: bool,
}

impl Mm {
    /// Waits until no reclaimer (kswapd, a direct reclaimer) is inside
    /// `shrink_node` or holds pages isolated: the pages of a batch in flight,
    /// or a read-ahead page being dropped, are neither free nor on a list
    /// until it ends. `check()` calls it; a caller that wants
    /// `nr_free_pages()` exact after dropping its spaces calls it first
    /// (bounded: 10 s).
    pub fn wait_reclaim_idle(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let lru = self.lru();
        while (lru.active_reclaimers.load(Ordering::Acquire) > 0
            || (0..self.nr_nodes()).any(|nid| lru.nr_isolated(nid) > 0))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Reclaims up to `pages` pages now (swapping out cold anonymous pages) and
    /// returns how many were freed. 0 without a swap device with free slots.
    pub fn reclaim(&self, pages: u64) -> u64 {
        reclaim_rounds(self, pages, 0, |nid, want| {
            shrink_node(self, nid, want, Reclaimer::Direct)
        })
    }
}

/// Reclaim in the calling thread toward `goal` pages, `done` of them freed
/// already: rounds over every node, a batch of at most [`SWAP_CLUSTER_MAX`]
/// each (`shrink(nid, want)`), until the goal is met or a round frees nothing.
/// Returns the pages freed in all (`done` included).
pub(crate) fn reclaim_rounds(
    mm: &Mm,
    goal: u64,
    mut done: u64,
    mut shrink: impl FnMut(usize, usize) -> u64,
) -> u64 {
    while done < goal {
        let mut round = 0;
        for nid in 0..mm.nr_nodes() {
            // A batch may free more than it was asked for (a huge page
            // split into 512 is swapped out whole): never below zero.
            let want = goal
                .saturating_sub(done + round)
                .min(SWAP_CLUSTER_MAX as u64);
            if want == 0 {
                break;
            }
            round += shrink(nid, want as usize);
        }
        if round == 0 {
            break;
        }
        done += round;
    }
    done
}

/// Batches of 32 one direct reclaim runs at most: until free memory is above
/// the high watermark (other tasks allocate what one batch frees meanwhile, and
/// the slow path retries only a few times), or a batch frees nothing.
const DIRECT_RECLAIM_BATCHES: usize = 8;

/// Times a direct reclaimer that freed nothing waits for concurrent reclaimers
/// before it reports no progress (Linux's `MAX_RECLAIM_RETRIES`).
const NO_PROGRESS_WAITS: usize = 16;

/// The allocator's `direct_reclaim` hook: batches of 32 from each node, then
/// the per-CPU lists drained so that the retry finds the pages.
pub(crate) fn direct_reclaim(mm: &Mm) -> u64 {
    if !mm.can_swap_out() {
        return 0;
    }
    mm.page_alloc().count_vm_event(VmEvent::AllocStall, 1);
    let mut freed = 0;
    for stalled in 0..=NO_PROGRESS_WAITS {
        for _ in 0..DIRECT_RECLAIM_BATCHES {
            let round: u64 = (0..mm.nr_nodes())
                .map(|nid| shrink_node(mm, nid, SWAP_CLUSTER_MAX, Reclaimer::Direct))
                .sum();
            freed += round;
            if round == 0 || mm.nr_free_pages() >= mm.total_wmark_high() {
                break;
            }
        }
        // No progress while other reclaimers hold pages isolated: they took
        // the tail of the lists this one would have scanned, and what they do
        // not free returns to the lists (Linux's `should_reclaim_retry` keeps
        // retrying while reclaimable pages remain). Wait for them, a bounded
        // number of times; with nothing isolated, nothing is in flight.
        let busy = (0..mm.nr_nodes()).any(|nid| mm.lru().nr_isolated(nid) > 0);
        if freed > 0 || !busy || stalled == NO_PROGRESS_WAITS {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    for nid in 0..mm.nr_nodes() {
        workingset::snapshot_refaults(mm, nid);
    }
    if freed > 0 {
        // The pages went to per-CPU lists, which the slow path's retry does not
        // look at (Linux's `__alloc_pages_direct_reclaim` drains too).
        mm.drain_all_pages();
    }
    freed
}

/// Linux's `shrink_node` for one node's anonymous lists: ages the active list
/// when the inactive one is the smaller, then reclaims from the inactive one.
/// Batches the policy only sorted (kept or activated every page) are followed
/// by the next, up to one pass over the inactive list; when that freed
/// nothing, it tries once more ignoring the accessed bits (Linux gets there by
/// raising the scan priority): under pressure, pages are freed rather than an
/// allocation failing.
pub(crate) fn shrink_node(mm: &Mm, nid: usize, nr: usize, who: Reclaimer) -> u64 {
    if !mm.can_swap_out() {
        return 0;
    }
    let lru = mm.lru();
    let _active = ActiveReclaimer::enter(mm);
    if who == Reclaimer::Direct {
        // Linux's `reclaim_throttle(VMSCAN_THROTTLE_ISOLATED)`: the batches in
        // flight end within microseconds; wait for them (bounded), then go on.
        for _ in 0..100 {
            if !lru.too_many_isolated(mm, nid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    // Linux's `lru_add_drain`: this CPU's pending pages; every CPU's only
    // when a first pass found nothing (a small arena's pages may all sit in
    // the per-CPU batches, and failing then would be a false out-of-memory).
    lru.drain_local(mm);
    // Pages read ahead that no fault used yet are the coldest of all.
    let ra = mm.shrink_readahead(nr) as usize;
    if ra >= nr {
        return ra as u64;
    }
    let nr = nr - ra;
    let groups = mm.memcg().in_use();
    for force in [false, true] {
        if force {
            lru.drain_all(mm);
        }
        // With memory cgroups, the walk over their lists (Linux's
        // `shrink_node_memcgs`); without, the root's lists alone.
        let r = if groups {
            crate::memcontrol::shrink_node_memcgs(mm, nid, nr, who, None, force)
        } else {
            shrink_lruvec(mm, Target::root(mm), nid, nr, who, force)
        };
        if r > 0 || ra > 0 {
            return r + ra as u64;
        }
    }
    0
}

/// Counts a reclaimer in `active_reclaimers` until it is dropped.
pub(crate) struct ActiveReclaimer<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> ActiveReclaimer<'a> {
    pub(crate) fn enter(mm: &'a Mm) -> Self {
        let a = &mm.lru().active_reclaimers;
        a.fetch_add(1, Ordering::Acquire);
        ActiveReclaimer(a)
    }
}

impl Drop for ActiveReclaimer<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// The lists one reclaim pass works on: one lruvec (the root's, or a memory
/// cgroup's) and its group, charged with the pass's statistics.
#[derive(Copy, Clone)]
pub(crate) struct Target<'a> {
    pub(crate) vec: &'a Lruvec,
    pub(crate) group: Option<&'a MemCgInner>,
}

impl<'a> Target<'a> {
    fn root(mm: &'a Mm) -> Self {
        Target {
            vec: mm.lru().root(),
            group: None,
        }
    }

    fn count(&self, e: crate::memcontrol::Event, n: u64) {
        if let Some(g) = self.group {
            g.stats.add(e, n);
        }
    }
}

/// One lruvec's part of Linux's `shrink_node` (`shrink_lruvec`): ages its
/// active list when the inactive one is the smaller, then reclaims up to `nr`
/// pages from its inactive list; `force` ignores the accessed bits.
///
/// A batch that freed nothing because the policy sorted it (kept pages seen
/// young once, activated referenced ones) is followed by the next, up to one
/// pass over the inactive list, before the caller forces: Linux raises the
/// scan priority until it has scanned the whole list. A batch of freshly
/// faulted pages (young at their first visit) or of hot ones is no reason to
/// strip the active list.
pub(crate) fn shrink_lruvec(
    mm: &Mm,
    t: Target<'_>,
    nid: usize,
    nr: usize,
    who: Reclaimer,
    force: bool,
) -> u64 {
    let mut budget = t.vec.nr_pages(mm.lru(), nid).1;
    loop {
        age_active(mm, t, nid, nr, force);
        let (r, sorted) = shrink_inactive_list(mm, t, nid, nr, who, force);
        if r > 0 || force || sorted == 0 || budget < sorted {
            return r;
        }
        budget -= sorted;
    }
}

/// Batches of the active list one `age_active` scans at most (the protected
/// clock may pass hot pages whose counters are still above 0).
const MAX_AGE_BATCHES: usize = 4;

/// The active-list half of Linux's `shrink_lruvec`, by policy, before `nr`
/// pages are taken from the inactive tail:
/// - Protected: the clock hand moves over the protected list while probation
///   is under its target (or shorter than the batch), a batch at a time;
/// - Classic: when the inactive list is low (`inactive_is_low`) or refaults
///   were activated since the last reclaim ended (`may_deactivate`), the
///   active list is scanned in proportion to its size, as `get_scan_count`
///   scans both; then, if still low, one batch more.
///
/// `force` (nothing reclaimable found): one batch, every page deactivated.
fn age_active(mm: &Mm, t: Target<'_>, nid: usize, nr: usize, force: bool) {
    let lru = mm.lru();
    let policy = lru.policy;
    let (active, inactive) = t.vec.nr_pages(lru, nid);
    if active == 0 {
        return;
    }
    if force {
        shrink_active_list(mm, t, nid, SWAP_CLUSTER_MAX.max(nr), true);
        return;
    }
    match policy {
        LruPolicy::Protected => {
            for _ in 0..MAX_AGE_BATCHES {
                let (active, inactive) = t.vec.nr_pages(lru, nid);
                if active == 0
                    || !(policy.inactive_is_low(active, inactive) || inactive < nr as u64)
                {
                    break;
                }
                shrink_active_list(mm, t, nid, SWAP_CLUSTER_MAX.max(nr), false);
            }
        }
        LruPolicy::Classic => {
            let low = policy.inactive_is_low(active, inactive);
            if low || workingset::refaults_since_snapshot(mm, nid) || inactive < nr as u64 {
                let share = (nr as u64 * active).div_ceil(inactive.max(1));
                shrink_active_list(mm, t, nid, share.clamp(1, active) as usize, false);
            }
            let (active, inactive) = t.vec.nr_pages(lru, nid);
            if policy.inactive_is_low(active, inactive) {
                shrink_active_list(mm, t, nid, SWAP_CLUSTER_MAX, false);
            }
        }
    }
}

/// Linux's `shrink_active_list`: up to `n` pages from the tail of the active
/// list, each one's accessed bit tested and cleared, then the policy decides
/// (`LruPolicy::active_scan`): back to the active head, or down to the
/// inactive head (`pgdeactivate`). A page whose lock is held (an access in
/// progress) counts as referenced.
fn shrink_active_list(mm: &Mm, t: Target<'_>, nid: usize, n: usize, force: bool) {
    let lru = mm.lru();
    let mut pages = Vec::with_capacity(n);
    lru.isolate(mm, t.vec, nid, LruList::Active, n, &mut pages);
    let mut rwc = RmapWalkControl::default();
    let mut back = Vec::with_capacity(pages.len());
    let mut deact = 0;
    for &p in &pages {
        let referenced = match mm.trylock_page(p) {
            Some(g) => folio_referenced(mm, &g, &mut rwc).unwrap_or(true),
            None => true,
        };
        let (verdict, state) = lru.policy.active_scan(lru.state(p), referenced, force);
        lru.set_state(p, state);
        match verdict {
            ActiveVerdict::Rotate => back.push((p, LruList::Active)),
            ActiveVerdict::Deactivate => {
                deact += 1;
                back.push((p, LruList::Inactive));
            }
        }
    }
    lru.putback(mm, &back);
    drop(rwc);
    put_isolated(mm, nid, &pages);
    mm.page_alloc().count_vm_event(VmEvent::PgDeactivate, deact);
    t.count(crate::memcontrol::Event::PgDeactivate, deact);
}

/// Drops the isolation references of pages of node `nid` (the last one frees a
/// page unmapped meanwhile) and ends their isolation.
pub(crate) fn put_isolated(mm: &Mm, nid: usize, pages: &[Pfn]) {
    // A huge page's head is a block of order 9 unless it was split: only its
    // isolator splits it, so the order recorded now is the block's.
    let blocks: Vec<(Pfn, u32)> = pages.iter().map(|&p| (p, desc(mm, p).order())).collect();
    mm.put_pages_bulk(&blocks);
    mm.lru().end_isolation(nid, pages.len());
}

/// Linux's `shrink_inactive_list`: isolates up to `nr` pages from the inactive
/// tail and reclaims what it can; returns the pages freed and those the
/// policy sorted (kept on the inactive list or activated).
fn shrink_inactive_list(
    mm: &Mm,
    t: Target<'_>,
    nid: usize,
    nr: usize,
    who: Reclaimer,
    force: bool,
) -> (u64, u64) {
    let lru = mm.lru();
    let mut pages = Vec::with_capacity(nr);
    lru.isolate(mm, t.vec, nid, LruList::Inactive, nr, &mut pages);
    if pages.is_empty() {
        return (0, 0);
    }
    let (scan, steal) = match who {
        Reclaimer::Kswapd => (VmEvent::PgScanKswapd, VmEvent::PgStealKswapd),
        Reclaimer::Direct => (VmEvent::PgScanDirect, VmEvent::PgStealDirect),
    };
    let mut back = Vec::new();
    let split = split_huge_isolated(mm, nid, &mut pages, force, &mut back);
    mm.page_alloc().count_vm_event(scan, pages.len() as u64);
    t.count(crate::memcontrol::Event::PgScan, pages.len() as u64);
    let list = split.as_deref().unwrap_or(&pages);
    let (freed, sorted) = shrink_page_list(mm, t, list, force, &mut back);
    lru.putback(mm, &back);
    put_isolated(mm, nid, &pages);
    mm.page_alloc().count_vm_event(steal, freed);
    t.count(crate::memcontrol::Event::PgSteal, freed);
    (freed, sorted)
}

/// Linux's `split_folio_to_list` in `shrink_folio_list`: each huge page of
/// the batch that is cold (or `force`) and has no reference but its mapping's
/// and the isolation's is split into 512 order-0 pages (`split_huge_page`,
/// holding the page lock of each, all taken without waiting), and its mapped
/// sub-pages join the batch, isolated: it swaps out as order-0 pages, on
/// neighbouring slots of this CPU's cluster, so mostly in one write. A
/// referenced huge page goes back to the active list whole, a busy one to the
/// inactive list. Returns the batch's order-0 pages, `None` when they are
/// all of `pages` (no huge page among them); `pages` gains the sub-pages
/// (their isolation references are the caller's to drop).
fn split_huge_isolated(
    mm: &Mm,
    nid: usize,
    pages: &mut Vec<Pfn>,
    force: bool,
    back: &mut Vec<(Pfn, LruList)>,
) -> Option<Vec<Pfn>> {
    if pages.iter().all(|&p| desc(mm, p).order() == 0) {
        return None;
    }
    let mut rwc = RmapWalkControl::default();
    let mut order0 = Vec::with_capacity(pages.len());
    let mut added = Vec::new();
    let mut activated = 0;
    for &head in pages.iter() {
        if desc(mm, head).order() == 0 {
            order0.push(head);
            continue;
        }
        let locks: Option<Vec<PageGuard<'_>>> = (0..HPAGE_PMD_NR)
            .map(|i| mm.trylock_page(Pfn::new(head.get() + i)))
            .collect();
        let Some(locks) = locks else {
            back.push((head, LruList::Inactive)); // an access in progress
            continue;
        };
        let split = rmap_walk_huge(mm, &locks[0], &mut rwc, |space, held| {
            if desc(mm, head).refcount().load(Ordering::Acquire) != 2 {
                return HugeSplit::Busy; // pinned
            }
            let split = space.split_huge_page(held, head, !force);
            if let HugeSplit::Split(subpages) = &split {
                // The isolation references, while the page locks and the VMA
                // lock still keep migration and unmap away.
                for &p in subpages {
                    mm.pin_page(p);
                }
            }
            split
        });
        drop(locks);
        match split {
            Some(HugeSplit::Split(subpages)) => {
                mm.lru().add_isolated(nid, subpages.len());
                if rmap::page_mapped(mm, head) {
                    order0.push(head);
                }
                order0.extend_from_slice(&subpages);
                added.extend(subpages);
            }
            Some(HugeSplit::Referenced) => {
                let lru = mm.lru();
                let (verdict, state) = lru.policy.inactive_tail(lru.state(head), true);
                lru.set_state(head, state);
                if verdict == TailVerdict::Activate {
                    activated += 1;
                    back.push((head, LruList::Active));
                } else {
                    back.push((head, LruList::Inactive));
                }
            }
            Some(HugeSplit::Busy) | None => back.push((head, LruList::Inactive)),
        }
    }
    pages.extend(added);
    mm.page_alloc()
        .count_vm_event(VmEvent::PgActivate, activated);
    workingset::age_nonresident(mm, nid, activated);
    Some(order0)
}

/// Linux's `shrink_page_list` over isolated pages (steps 1 to 5 of the module
/// header). Pages kept go to `back` with the list they return to. Returns the
/// number of pages swapped out (their mapping reference dropped; the isolation
/// reference, the last, is the caller's) and of those the policy sorted (a
/// `Keep` or `Activate` verdict).
fn shrink_page_list<'a>(
    mm: &'a Mm,
    t: Target<'_>,
    pages: &[Pfn],
    force: bool,
    back: &mut Vec<(Pfn, LruList)>,
) -> (u64, u64) {
    let mut rwc = RmapWalkControl::default();
    let swap = mm.swap();
    // The devices of the batch's slots, each looked up once for the batch.
    let mut pins = SwapPins::default();
    let mut victims: Vec<Victim<'a>> = Vec::with_capacity(pages.len());
    let mut activated = 0;
    let mut sorted = 0;
    // 1. Locked, unpinned, unreferenced; and does it need writing?
    for &pfn in pages {
        let Some(lock) = mm.trylock_page(pfn) else {
            back.push((pfn, LruList::Inactive));
            continue;
        };
        if desc(mm, pfn).refcount().load(Ordering::Acquire) != 2 {
            back.push((pfn, LruList::Active));
            continue;
        }
        let seen = rmap_walk(mm, &lock, &mut rwc, |m| {
            let dirty = page_vma_mapped(m, pfn).map(|(_, e)| e.is_dirty());
            (folio_referenced_one(m, pfn), dirty)
        });
        let lru = mm.lru();
        let verdict = match seen {
            Some((referenced, Some(_))) if !force => {
                let (verdict, state) = lru.policy.inactive_tail(lru.state(pfn), referenced);
                lru.set_state(pfn, state);
                verdict
            }
            _ => TailVerdict::Reclaim,
        };
        match (seen, verdict) {
            (None | Some((_, None)), _) => back.push((pfn, LruList::Inactive)),
            (_, TailVerdict::Keep) => {
                sorted += 1;
                back.push((pfn, LruList::Inactive));
            }
            (_, TailVerdict::Activate) => {
                activated += 1;
                sorted += 1;
                back.push((pfn, LruList::Active));
            }
            (Some((_, Some(dirty))), TailVerdict::Reclaim) => {
                // A page still in the swap cache from its swap-in, and clean
                // since, has its copy on the slot already.
                let mut entry = mm.swapcache_entry(&lock);
                if let Some(e) = entry {
                    let Some(dev) = pins.get(swap, e) else {
                        mm.swap_bad_entry(e, &"a cached page names no device");
                        back.push((pfn, LruList::Inactive));
                        continue;
                    };
                    if !dev.writeok() {
                        // Its device is going away (swapoff): a new slot elsewhere.
                        mm.swapcache_drop(dev, &lock);
                        entry = None;
                    }
                }
                let write = entry.is_none() || dirty || desc(mm, pfn).test_flag(PG_DIRTY);
                victims.push(Victim {
                    pfn,
                    lock,
                    entry,
                    write,
                })
            }
        }
    }
    mm.page_alloc()
        .count_vm_event(VmEvent::PgActivate, activated);
    t.count(crate::memcontrol::Event::PgActivate, activated);
    if let Some(&p) = pages.first() {
        workingset::age_nonresident(mm, mm.node_of(p), activated);
    }
    // 2. Slots for the pages that have none, and the swap cache.
    add_to_swap(mm, &mut pins, &mut victims);
    // 3. Write what needs it, runs of contiguous slots at once.
    let written = pageout(mm, &mut pins, &victims);
    let nr_written = victims.iter().zip(&written).filter(|(v, &w)| v.write && w);
    t.count(crate::memcontrol::Event::PswpOut, nr_written.count() as u64);
    // 4, 5. Unmap and free, or undo.
    let mut freed = 0;
    for (v, ok) in victims.into_iter().zip(written) {
        let Some(entry) = v.entry else {
            back.push((v.pfn, LruList::Inactive)); // no slot left
            continue;
        };
        let dev = pins.get(swap, entry).expect("pinned in step 1 or 2");
        let unmapped = ok
            && rmap_walk(mm, &v.lock, &mut rwc, |m| {
                try_to_unmap_swap(mm, m, &v.lock, dev, entry)
            })
            .unwrap_or(false);
        if unmapped {
            rmap::clear(mm, v.pfn);
            // Its charge goes with its mapping (the slot is charged now).
            crate::memcontrol::uncharge_batch(mm, &[(v.pfn, 0)]);
            // Evicted: the slot keeps a shadow for the refault.
            let state = mm.lru().state(v.pfn);
            let shadow = workingset::workingset_eviction(mm, mm.node_of(v.pfn), state);
            mm.swapcache_evict(dev, &v.lock, shadow.pack());
        } else {
            // Out of the cache; this frees the slot (no PTE reference): a page
            // that stays is dirty for swap again.
            mm.swapcache_drop(dev, &v.lock);
        }
        desc(mm, v.pfn).clear_flag(PG_DIRTY);
        drop(v.lock);
        if unmapped {
            mm.unpin_page(v.pfn); // the mapping's reference; the isolation's is last
            freed += 1;
        } else {
            back.push((
                v.pfn,
                if ok {
                    LruList::Inactive
                } else {
                    LruList::Active
                },
            ));
        }
    }
    (freed, sorted)
}

/// Step 2 (Linux's `folio_alloc_swap`): slots for the victims that have none,
/// from one device or more (each pinned into `pins`), and each such page into
/// the swap cache. Victims left without a slot keep `entry == None`.
fn add_to_swap(mm: &Mm, pins: &mut SwapPins, victims: &mut [Victim<'_>]) {
    let swap = mm.swap();
    // Each slot is charged to the page's memory cgroup first (Linux's
    // `mem_cgroup_try_charge_swap`); a group at its `swap.max` keeps the
    // page resident (`owners[i] == None`: no slot).
    let owners: Vec<Option<u16>> = victims
        .iter()
        .map(|v| match v.entry {
            Some(_) => None,
            None => crate::memcontrol::try_charge_swap(mm, v.pfn).ok(),
        })
        .collect();
    let need = owners.iter().flatten().count();
    let mut entries = Vec::with_capacity(need);
    let cpu = StdPlatform::cpu_id();
    while entries.len() < need {
        match swap.get_swap_pages(cpu, need - entries.len(), &mut entries) {
            Some(dev) => pins.add(dev),
            None => break,
        }
    }
    let mut fresh = entries.into_iter();
    for (v, owner) in victims.iter_mut().zip(owners) {
        let Some(id) = owner else { continue };
        let Some(e) = fresh.next() else {
            // No slot left for it: its swap charge goes back.
            crate::memcontrol::uncharge_swap(mm.memcg(), id);
            continue;
        };
        let dev = pins.get(swap, e).expect("pinned by get_swap_pages");
        if id != 0 {
            dev.set_swap_owner(e, id);
        }
        mm.swapcache_add(dev, &v.lock, e);
        v.entry = Some(e);
    }
}

/// Step 3 (Linux's `pageout`): writes the victims that need it, runs of
/// contiguous slots in one request each, every run of a device sent before
/// any is waited for (`swap_writepages_batch`); which victims' slots hold
/// their content now.
fn pageout(mm: &Mm, pins: &mut SwapPins, victims: &[Victim<'_>]) -> Vec<bool> {
    let swap = mm.swap();
    let mut written: Vec<bool> = victims.iter().map(|v| !v.write).collect();
    // (first entry, victims i..j) of each run.
    let mut runs: Vec<(SwapEntry, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < victims.len() {
        let Some(first) = victims[i].entry.filter(|_| victims[i].write) else {
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < victims.len()
            && victims[j].write
            && matches!(victims[j].entry, Some(e) if e.ty() == first.ty()
                && e.offset() == first.offset() + (j - i) as u64)
        {
            j += 1;
        }
        runs.push((first, i, j));
        i = j;
    }
    // Each page is held by its isolation reference and locked by us.
    let bufs: Vec<&[u8]> = victims.iter().map(|v| v.lock.bytes()).collect();
    let mut k = 0;
    while k < runs.len() {
        // The runs of one device, together.
        let ty = runs[k].0.ty();
        let end = k + runs[k..].iter().take_while(|r| r.0.ty() == ty).count();
        let dev = pins.get(swap, runs[k].0).expect("pinned in step 1 or 2");
        let io: Vec<(SwapEntry, &[&[u8]])> = runs[k..end]
            .iter()
            .map(|&(e, i, j)| (e, &bufs[i..j]))
            .collect();
        let mut ok = vec![false; io.len()];
        dev.swap_writepages_batch(&io, &mut ok);
        for (&(_, i, j), ok) in runs[k..end].iter().zip(ok) {
            if ok {
                written[i..j].iter_mut().for_each(|w| *w = true);
                mm.page_alloc()
                    .count_vm_event(VmEvent::PswpOut, (j - i) as u64);
            } else {
                mm.page_alloc().count_vm_event(VmEvent::SwapIoError, 1);
            }
        }
        k = end;
    }
    written
}

/// Step 4 on the mapping `m` of the locked page (Linux's `try_to_unmap_one`
/// for an anonymous page in the swap cache): the PTE gets the swap entry of
/// the pinned `dev`, whose slot gains the PTE's reference. False (nothing
/// changed) when the PTE changed or the slot's count is full.
pub(crate) fn try_to_unmap_swap(
    mm: &Mm,
    m: &RmapOne<'_>,
    lock: &PageGuard<'_>,
    dev: &SwapInfoStruct,
    entry: SwapEntry,
) -> bool {
    if let Err(err) = dev.swap_duplicate(entry) {
        // The cache's reference keeps the slot in use: only a
        // full count (`SWAP_MAP_MAX`) may refuse.
        if !matches!(err, SwapError::Map(MapError::TooManyRefs(_))) {
            mm.swap_bad_entry(entry, &err);
        }
        return false;
    }
    match try_to_unmap_one(m, lock, |_| Pte::swap(entry)) {
        Some(_) => {
            m.space.sub_rss(1);
            true
        }
        None => {
            // The reference just added: the slot must take it back.
            if let Err(err) = dev.swap_free(entry) {
                mm.swap_bad_entry(entry, &err);
            }
            false
        }
    }
}
