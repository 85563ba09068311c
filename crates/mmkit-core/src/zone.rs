//! Zones and their buddy free lists (Linux's `struct zone` and the buddy half of
//! `mm/page_alloc.c`).
//!
//! A zone manages a contiguous span of the memmap. Free memory sits on
//! `free_area[order][migratetype]` lists as aligned blocks of 2^order pages; a
//! block's head descriptor is in state `Buddy` with its order and list migratetype
//! in its flags. Pageblocks (order 9) carry a migratetype each; allocations fall
//! back to other migratetypes and steal whole pageblocks the way Linux does, so
//! unmovable allocations cluster in few pageblocks (anti-fragmentation).
//!
//! Merging: a freed block merges with its buddy while the buddy is a free block of
//! the same order (eager). Under lazy merging an order-0 page is put on the order-0
//! list without looking at its buddy and marked `PG_MERGE_SKIPPED`; `merge_all`
//! later merges every such page (merge on demand), which yields exactly the free
//! lists eager merging would have, since a fully merged buddy state is determined
//! by the set of free pages alone.
//! Under `LazyNoMerge` (`merge_on_demand` false) nothing merges on demand: lazily
//! freed pages merge only with blocks freed next to them later.
//!
//! Invariants (checked by `PageAlloc::check`): every page of the span is covered
//! exactly once by a free block, an allocated block, a per-CPU list entry or a
//! reserved page; `nr_free` equals the pages on the lists; `nr_unmerged` equals the
//! `PG_MERGE_SKIPPED` pages.
//!
//! Locking: everything in `ZoneInner` is protected by the zone lock, taken through
//! `Zone::lock`, which also keeps the lock's statistics. `nr_free_mirror` is a copy
//! of `nr_free` published on unlock for lockless watermark checks.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use lock_api::RawMutex;

use crate::compaction::CompactState;
use crate::gfp::{
    MigrateType, ALLOC_HARDER, ALLOC_HIGH, ALLOC_WMARK_HIGH, ALLOC_WMARK_MASK, FALLBACKS,
    MIGRATE_PCPTYPES, MIGRATE_TYPES,
};
use crate::page::{
    fl_mt, fl_order, fl_state, mk_flags, Page, PageState, MAX_ORDER, NIL, NR_ORDERS,
    PAGEBLOCK_NR_PAGES, PAGEBLOCK_ORDER, PG_MERGE_SKIPPED,
};
use crate::platform::Platform;
use crate::stat::{LockStats, VmEvent, NR_VM_EVENTS};

/// The memmap and the pageblock migratetype bitmap, shared by all zones.
pub(crate) struct MemMap {
    pub pages: alloc::boxed::Box<[Page]>,
    pub pageblock_mt: alloc::boxed::Box<[AtomicU8]>,
}

impl MemMap {
    #[inline]
    pub fn page(&self, idx: u32) -> &Page {
        &self.pages[idx as usize]
    }
    #[inline]
    pub fn pageblock_mt(&self, idx: u32) -> usize {
        self.pageblock_mt[(idx >> PAGEBLOCK_ORDER) as usize].load(Ordering::Relaxed) as usize
    }
    #[inline]
    pub fn set_pageblock_mt(&self, idx: u32, mt: usize) {
        self.pageblock_mt[(idx >> PAGEBLOCK_ORDER) as usize].store(mt as u8, Ordering::Relaxed)
    }
}

/// A doubly linked list of block heads, linked through the descriptors.
#[derive(Copy, Clone, Debug)]
pub(crate) struct FreeList {
    pub head: u32,
    pub tail: u32,
    pub nr: u64,
}

impl FreeList {
    const EMPTY: FreeList = FreeList {
        head: NIL,
        tail: NIL,
        nr: 0,
    };
}

/// The lock-protected part of a zone.
pub(crate) struct ZoneInner {
    pub free_area: [[FreeList; MIGRATE_TYPES]; NR_ORDERS],
    /// Pages on the buddy lists.
    pub nr_free: u64,
    /// Order-0 pages freed without merging.
    pub nr_unmerged: u64,
    /// Pages in pageblocks reserved for high-order atomic allocations.
    pub nr_reserved_highatomic: u64,
    /// Events counted under the zone lock.
    pub events: [u64; NR_VM_EVENTS],
    /// Statistics of this zone's lock.
    pub lock_stats: LockStats,
    /// Merge lazily freed pages on demand (false only under `LazyNoMerge`).
    pub merge_on_demand: bool,
}

/// The span of a zone inside the memmap, for buddy arithmetic.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Span {
    pub start: u32,
    pub end: u32,
}

/// A memory zone.
pub struct Zone<P: Platform> {
    pub(crate) name: &'static str,
    pub(crate) span: Span,
    pub(crate) managed: u64,
    /// min, low, high watermarks in pages.
    pub(crate) wmark: [u64; 3],
    /// (Z) `nr_free` as of the last unlock, for lockless watermark checks
    /// (locking letters: see `Page`).
    pub(crate) nr_free_mirror: AtomicU64,
    /// (Z) The high-atomic reserve's size, published the same way.
    pub(crate) nr_highatomic_mirror: AtomicU64,
    /// Compaction's per-zone state: deferral, cached scanner positions, counters
    /// by order (atomics, see `compaction/`).
    pub(crate) compact: CompactState,
    raw: P::ZoneLock,
    inner: UnsafeCell<ZoneInner>,
}

// SAFETY: `inner` is only reached through `ZoneGuard`, which exists only while `raw`
// is held, so at most one thread accesses it at a time; every other field is
// immutable after construction or atomic.
unsafe impl<P: Platform> Sync for Zone<P> {}
// SAFETY: the zone owns its data; the raw lock is Send.
unsafe impl<P: Platform> Send for Zone<P> {}

/// Exclusive access to a zone's lists while its lock is held.
pub(crate) struct ZoneGuard<'a, P: Platform> {
    zone: &'a Zone<P>,
}

impl<'a, P: Platform> ZoneGuard<'a, P> {
    /// The zone whose lock this is (its immutable fields: span, watermarks).
    #[inline]
    pub(crate) fn zone(&self) -> &'a Zone<P> {
        self.zone
    }
}

impl<P: Platform> Deref for ZoneGuard<'_, P> {
    type Target = ZoneInner;
    fn deref(&self) -> &ZoneInner {
        // SAFETY: the guard exists only while the zone lock is held (see `Zone::lock`).
        unsafe { &*self.zone.inner.get() }
    }
}

impl<P: Platform> DerefMut for ZoneGuard<'_, P> {
    fn deref_mut(&mut self) -> &mut ZoneInner {
        // SAFETY: as in `deref`; `&mut self` makes the borrow unique.
        unsafe { &mut *self.zone.inner.get() }
    }
}

impl<P: Platform> Drop for ZoneGuard<'_, P> {
    fn drop(&mut self) {
        let (free, ha) = (self.nr_free, self.nr_reserved_highatomic);
        self.zone.nr_free_mirror.store(free, Ordering::Relaxed);
        self.zone.nr_highatomic_mirror.store(ha, Ordering::Relaxed);
        // SAFETY: this guard was created by `Zone::lock`, which took the lock.
        unsafe { self.zone.raw.unlock() }
    }
}

impl<P: Platform> Zone<P> {
    /// A zone of `managed` pages out of `total` managed by all zones: Linux's
    /// `min_free_kbytes` is computed from the total and each zone's min is its
    /// share of it, in proportion to its size (`__setup_per_zone_wmarks`).
    pub(crate) fn new(name: &'static str, span: Span, managed: u64, total: u64) -> Self {
        // Linux: min_free_kbytes = sqrt(lowmem_kbytes * 16), clamped to [128, 262144].
        let total = total.max(managed).max(1);
        let kb = total * 4;
        let min_kb = isqrt(kb * 16).clamp(128, 262_144);
        let min_total = (min_kb / 4).min(total / 4);
        let min = (min_total * managed / total).max(1);
        // watermark_scale_factor = 10 (0.1% of the zone).
        let gap = (min / 4).max(managed / 1000);
        Zone {
            name,
            span,
            managed,
            wmark: [min, min + gap, min + 2 * gap],
            nr_free_mirror: AtomicU64::new(0),
            nr_highatomic_mirror: AtomicU64::new(0),
            compact: CompactState::new(span.start, span.end),
            raw: P::ZoneLock::INIT,
            inner: UnsafeCell::new(ZoneInner {
                free_area: [[FreeList::EMPTY; MIGRATE_TYPES]; NR_ORDERS],
                nr_free: 0,
                nr_unmerged: 0,
                nr_reserved_highatomic: 0,
                events: [0; NR_VM_EVENTS],
                lock_stats: LockStats::default(),
                merge_on_demand: true,
            }),
        }
    }

    /// Takes the zone lock, counting contention.
    #[inline]
    pub(crate) fn lock(&self) -> ZoneGuard<'_, P> {
        let mut waited = None;
        if !self.raw.try_lock() {
            let t0 = P::now_ns();
            self.raw.lock();
            waited = Some(P::now_ns().saturating_sub(t0));
        }
        let mut g = ZoneGuard { zone: self };
        g.lock_stats.acquisitions += 1;
        if let Some(w) = waited {
            g.lock_stats.contended += 1;
            g.lock_stats.wait_ns += w;
        }
        g
    }

    /// Is the zone below its high watermark (PCP auto-tuning shrinks `high` then)?
    #[inline]
    pub(crate) fn below_high(&self) -> bool {
        self.nr_free_mirror.load(Ordering::Relaxed) < self.wmark[ALLOC_WMARK_HIGH as usize]
    }

    /// Linux's `__zone_watermark_ok` on the page count (the per-order part is left
    /// to `rmqueue`, which merges lazily freed pages on demand), read from the
    /// mirror without the lock: may a request of `order` take its pages?
    #[inline]
    pub(crate) fn watermark_ok(&self, order: u32, alloc_flags: u32) -> bool {
        let free = self.nr_free_mirror.load(Ordering::Relaxed);
        let ha = self.nr_highatomic_mirror.load(Ordering::Relaxed);
        self.headroom(free, ha, alloc_flags) >> order != 0
    }

    /// Pages a request with `alloc_flags` may take in all from a zone holding
    /// `free` pages on its buddy lists (`ha` of them in the high-atomic reserve)
    /// and still leave it at or above its watermark: Linux's
    /// `free - (2^order - 1) > mark` is `headroom >= 2^order`. Per-CPU refills
    /// take at most this many under the zone lock, so no path (per-CPU lists and
    /// caches included) takes the zone below the mark of the request.
    #[inline]
    pub(crate) fn headroom(&self, free: u64, ha: u64, alloc_flags: u32) -> u64 {
        let mut min = self.wmark[(alloc_flags & ALLOC_WMARK_MASK) as usize];
        if alloc_flags & ALLOC_HIGH != 0 {
            min -= min / 2;
        }
        let usable = if alloc_flags & ALLOC_HARDER != 0 {
            min -= min / 4;
            free
        } else {
            free.saturating_sub(ha)
        };
        usable.saturating_sub(min)
    }
}

fn isqrt(x: u64) -> u64 {
    if x < 2 {
        return x;
    }
    // Newton's iteration from above.
    let mut r = x;
    let mut y = r.div_ceil(2);
    while y < r {
        r = y;
        y = (r + x / r) / 2;
    }
    r
}

/// Can a fallback of this order take over the whole pageblock (Linux's `can_steal_fallback`)?
fn can_steal_fallback(order: u32, start_mt: usize) -> bool {
    order >= PAGEBLOCK_ORDER
        || order >= PAGEBLOCK_ORDER / 2
        || start_mt == MigrateType::Reclaimable as usize
        || start_mt == MigrateType::Unmovable as usize
}

impl ZoneInner {
    #[inline]
    fn list_add(&mut self, mm: &MemMap, idx: u32, order: u32, mt: usize, tail: bool) {
        let l = &mut self.free_area[order as usize][mt];
        let p = mm.page(idx);
        if tail {
            p.set_next(NIL);
            p.set_prev(l.tail);
            if l.tail != NIL {
                mm.page(l.tail).set_next(idx);
            } else {
                l.head = idx;
            }
            l.tail = idx;
        } else {
            p.set_prev(NIL);
            p.set_next(l.head);
            if l.head != NIL {
                mm.page(l.head).set_prev(idx);
            } else {
                l.tail = idx;
            }
            l.head = idx;
        }
        l.nr += 1;
    }

    #[inline]
    fn list_del(&mut self, mm: &MemMap, idx: u32, order: u32, mt: usize) {
        let l = &mut self.free_area[order as usize][mt];
        let p = mm.page(idx);
        let (next, prev) = (p.next(), p.prev());
        if prev != NIL {
            mm.page(prev).set_next(next);
        } else {
            l.head = next;
        }
        if next != NIL {
            mm.page(next).set_prev(prev);
        } else {
            l.tail = prev;
        }
        l.nr -= 1;
    }

    /// Puts a free block on `free_area[order][mt]` (Linux's `add_to_free_list`).
    #[inline]
    pub(crate) fn add_free(&mut self, mm: &MemMap, idx: u32, order: u32, mt: usize, extra: u32) {
        mm.page(idx)
            .set_raw_flags(mk_flags(PageState::Buddy, order, mt as u32) | extra);
        self.list_add(mm, idx, order, mt, false);
        self.nr_free += 1 << order;
    }

    /// Takes a free block off its list; its head becomes `None`. Returns its order.
    #[inline]
    pub(crate) fn del_free(&mut self, mm: &MemMap, idx: u32) -> u32 {
        let f = mm.page(idx).raw_flags();
        debug_assert_eq!(fl_state(f), PageState::Buddy as u32);
        let order = fl_order(f);
        self.list_del(mm, idx, order, fl_mt(f));
        if f & PG_MERGE_SKIPPED != 0 {
            self.nr_unmerged -= 1;
        }
        mm.page(idx).set_raw_flags(0);
        self.nr_free -= 1 << order;
        order
    }

    /// Moves a free block to another migratetype's list, keeping its order.
    fn move_free(&mut self, mm: &MemMap, idx: u32, mt: usize) {
        let f = mm.page(idx).raw_flags();
        let order = fl_order(f);
        self.list_del(mm, idx, order, fl_mt(f));
        mm.page(idx)
            .set_raw_flags(mk_flags(PageState::Buddy, order, mt as u32) | (f & PG_MERGE_SKIPPED));
        self.list_add(mm, idx, order, mt, false);
    }

    /// Gives the upper halves of a split block back to the lists (Linux's `expand`).
    #[inline]
    pub(crate) fn expand(&mut self, mm: &MemMap, idx: u32, low: u32, mut high: u32, mt: usize) {
        while high > low {
            high -= 1;
            self.add_free(mm, idx + (1 << high), high, mt, 0);
        }
    }

    /// Frees the range [from, to) as the largest aligned blocks that fit. Callers
    /// pass ranges whose pieces cannot merge with free neighbours (the tail of a
    /// block they just took), so no merge is attempted.
    pub(crate) fn free_range_unmerged(&mut self, mm: &MemMap, mut from: u32, to: u32, mt: usize) {
        while from < to {
            let mut k = (from.trailing_zeros()).min(MAX_ORDER);
            while from + (1 << k) > to {
                k -= 1;
            }
            self.add_free(mm, from, k, mt, 0);
            from += 1 << k;
        }
    }

    /// Takes the smallest block of at least `order` from `mt`'s lists and splits it.
    #[inline]
    pub(crate) fn rmqueue_smallest(&mut self, mm: &MemMap, order: u32, mt: usize) -> Option<u32> {
        for o in order..=MAX_ORDER {
            let head = self.free_area[o as usize][mt].head;
            if head != NIL {
                self.del_free(mm, head);
                self.expand(mm, head, order, o, mt);
                return Some(head);
            }
        }
        None
    }

    /// Linux's `__free_one_page`: puts a block back, merging with free buddies unless
    /// `merge` is false (lazy order-0 free). Returns the head and order of the free
    /// block it ended up in (compaction's capture looks at it).
    pub(crate) fn free_one(
        &mut self,
        mm: &MemMap,
        span: Span,
        mut idx: u32,
        mut order: u32,
        merge: bool,
    ) -> (u32, u32) {
        if !merge {
            debug_assert_eq!(order, 0);
            let mt = mm.pageblock_mt(idx);
            self.add_free(mm, idx, 0, mt, PG_MERGE_SKIPPED);
            self.nr_unmerged += 1;
            self.events[VmEvent::MergeSkipped as usize] += 1;
            return (idx, 0);
        }
        while order < MAX_ORDER {
            let buddy = idx ^ (1 << order);
            if buddy < span.start || buddy + (1 << order) > span.end {
                break;
            }
            let bf = mm.page(buddy).raw_flags();
            if fl_state(bf) != PageState::Buddy as u32 || fl_order(bf) != order {
                break;
            }
            self.del_free(mm, buddy);
            self.events[VmEvent::MergeDone as usize] += 1;
            idx &= buddy;
            order += 1;
        }
        let mt = mm.pageblock_mt(idx);
        // Linux's buddy_merge_likely: if the next-larger buddy is free, this block
        // is likely to merge soon; put it at the tail so it is allocated last.
        let tail = order < MAX_ORDER - 1 && {
            let higher = (idx & !(1 << order)) ^ (1 << (order + 1));
            higher >= span.start
                && higher + (1 << (order + 1)) <= span.end
                && fl_state(mm.page(higher).raw_flags()) == PageState::Buddy as u32
        };
        mm.page(idx)
            .set_raw_flags(mk_flags(PageState::Buddy, order, mt as u32));
        self.list_add(mm, idx, order, mt, tail);
        self.nr_free += 1 << order;
        (idx, order)
    }

    /// Merge on demand: merges every order-0 page that lazy merging left unmerged.
    /// Afterwards the lists are exactly what eager merging would have produced.
    pub(crate) fn merge_all(&mut self, mm: &MemMap, span: Span) {
        if self.nr_unmerged == 0 {
            return;
        }
        self.events[VmEvent::MergeOnDemand as usize] += 1;
        for mt in 0..MIGRATE_TYPES {
            // Detach the whole order-0 list; mark every page as not-free first so
            // that a merge never tries to unlink a page from the detached chain.
            let l = core::mem::replace(&mut self.free_area[0][mt], FreeList::EMPTY);
            let mut i = l.head;
            while i != NIL {
                let p = mm.page(i);
                if p.raw_flags() & PG_MERGE_SKIPPED != 0 {
                    self.nr_unmerged -= 1;
                }
                p.set_raw_flags(0);
                i = p.next();
            }
            self.nr_free -= l.nr;
            let mut i = l.head;
            while i != NIL {
                let next = mm.page(i).next();
                self.free_one(mm, span, i, 0, true);
                i = next;
            }
        }
        debug_assert_eq!(self.nr_unmerged, 0);
    }

    fn find_suitable_fallback(&self, order: u32, start_mt: usize) -> Option<usize> {
        FALLBACKS[start_mt]
            .iter()
            .copied()
            .find(|&mt| self.free_area[order as usize][mt].nr > 0)
    }

    /// Moves the free blocks of `idx`'s pageblock to `mt` and, if enough of the
    /// pageblock is free or already of that type, changes the pageblock's type
    /// (Linux's `steal_suitable_fallback`).
    fn steal_suitable_fallback(
        &mut self,
        mm: &MemMap,
        span: Span,
        idx: u32,
        order: u32,
        start_mt: usize,
        whole_block: bool,
    ) {
        if order >= PAGEBLOCK_ORDER {
            let mut pb = idx;
            while pb < idx + (1 << order) {
                mm.set_pageblock_mt(pb, start_mt);
                pb += PAGEBLOCK_NR_PAGES as u32;
            }
            self.move_free(mm, idx, start_mt);
            self.events[VmEvent::AllocSteal as usize] += 1;
            return;
        }
        if !whole_block {
            self.move_free(mm, idx, start_mt);
            return;
        }
        let pb_start = (idx & !(PAGEBLOCK_NR_PAGES as u32 - 1)).max(span.start);
        let pb_end = (pb_start + PAGEBLOCK_NR_PAGES as u32).min(span.end);
        let (mut free, mut movable) = (0u32, 0u32);
        let mut i = pb_start;
        while i < pb_end {
            let f = mm.page(i).raw_flags();
            let st = fl_state(f);
            if st == PageState::Buddy as u32 {
                let o = fl_order(f);
                self.move_free(mm, i, start_mt);
                free += 1 << o;
                i += 1 << o;
            } else if st == PageState::Alloc as u32 {
                let o = fl_order(f);
                if fl_mt(f) == MigrateType::Movable as usize {
                    movable += 1 << o;
                }
                i += 1 << o;
            } else {
                i += 1;
            }
        }
        let alike = if start_mt == MigrateType::Movable as usize {
            movable
        } else {
            (pb_end - pb_start).saturating_sub(free + movable)
        };
        if free + alike >= (PAGEBLOCK_NR_PAGES as u32) / 2 {
            mm.set_pageblock_mt(pb_start, start_mt);
            self.events[VmEvent::AllocSteal as usize] += 1;
        }
    }

    /// Linux's `__rmqueue_fallback`: takes a block of another migratetype, largest
    /// first so that a whole pageblock changes hands, smallest first for movable
    /// requests that could not steal. Returns true if `start_mt`'s lists gained a
    /// block of at least `order`.
    fn rmqueue_fallback(&mut self, mm: &MemMap, span: Span, order: u32, start_mt: usize) -> bool {
        if start_mt >= MIGRATE_PCPTYPES {
            return false;
        }
        let mut found = None;
        for co in (order..=MAX_ORDER).rev() {
            if let Some(fmt) = self.find_suitable_fallback(co, start_mt) {
                let can_steal = can_steal_fallback(co, start_mt);
                if !can_steal && start_mt == MigrateType::Movable as usize && co > order {
                    for co2 in order..=MAX_ORDER {
                        if let Some(f2) = self.find_suitable_fallback(co2, start_mt) {
                            found = Some((co2, f2, can_steal_fallback(co2, start_mt)));
                            break;
                        }
                    }
                } else {
                    found = Some((co, fmt, can_steal));
                }
                break;
            }
        }
        let Some((co, fmt, can_steal)) = found else {
            return false;
        };
        let idx = self.free_area[co as usize][fmt].head;
        self.steal_suitable_fallback(mm, span, idx, co, start_mt, can_steal);
        self.events[VmEvent::AllocFallback as usize] += 1;
        true
    }

    /// Linux's `__rmqueue`: the buddy allocation of one block, with merge on demand
    /// (lazy merging) and migratetype fallback.
    pub(crate) fn rmqueue(
        &mut self,
        mm: &MemMap,
        span: Span,
        order: u32,
        mt: usize,
        alloc_flags: u32,
    ) -> Option<u32> {
        if order > 0 && alloc_flags & ALLOC_HARDER != 0 {
            if let Some(i) = self.rmqueue_smallest(mm, order, MigrateType::HighAtomic as usize) {
                return Some(i);
            }
        }
        loop {
            if let Some(i) = self.rmqueue_smallest(mm, order, mt) {
                return Some(i);
            }
            // Merge what lazy merging skipped before a high-order request gives up
            // on this migratetype or anti-fragmentation is forced to fall back.
            if self.nr_unmerged > 0 && self.merge_on_demand {
                self.merge_all(mm, span);
                continue;
            }
            if self.rmqueue_fallback(mm, span, order, mt) {
                continue;
            }
            return None;
        }
    }

    /// Reserves the pageblock of a successful high-order atomic allocation for
    /// later ones (Linux's `reserve_highatomic_pageblock`), up to 1% of the zone.
    pub(crate) fn reserve_highatomic(&mut self, mm: &MemMap, span: Span, managed: u64, idx: u32) {
        let max = managed / 100 + PAGEBLOCK_NR_PAGES as u64;
        if self.nr_reserved_highatomic >= max {
            return;
        }
        let pb_start = idx & !(PAGEBLOCK_NR_PAGES as u32 - 1);
        if pb_start < span.start || pb_start + PAGEBLOCK_NR_PAGES as u32 > span.end {
            return;
        }
        let old = mm.pageblock_mt(pb_start);
        if old == MigrateType::HighAtomic as usize {
            return;
        }
        mm.set_pageblock_mt(pb_start, MigrateType::HighAtomic as usize);
        self.nr_reserved_highatomic += PAGEBLOCK_NR_PAGES as u64;
        self.move_pageblock_free(mm, pb_start, MigrateType::HighAtomic as usize);
        self.events[VmEvent::HighAtomicReserve as usize] += 1;
    }

    fn move_pageblock_free(&mut self, mm: &MemMap, pb_start: u32, mt: usize) {
        let mut i = pb_start;
        let end = pb_start + PAGEBLOCK_NR_PAGES as u32;
        while i < end {
            let f = mm.page(i).raw_flags();
            let st = fl_state(f);
            if st == PageState::Buddy as u32 || st == PageState::Alloc as u32 {
                if st == PageState::Buddy as u32 && fl_mt(f) != mt {
                    self.move_free(mm, i, mt);
                }
                i += 1 << fl_order(f);
            } else {
                i += 1;
            }
        }
    }

    /// Gives every high-atomic pageblock back to `mt` (Linux's
    /// `unreserve_highatomic_pageblock`, done in the slow path before failing).
    pub(crate) fn unreserve_highatomic(&mut self, mm: &MemMap, span: Span, mt: usize) -> bool {
        if self.nr_reserved_highatomic == 0 {
            return false;
        }
        let mut pb = span.start;
        while pb + PAGEBLOCK_NR_PAGES as u32 <= span.end {
            if mm.pageblock_mt(pb) == MigrateType::HighAtomic as usize {
                mm.set_pageblock_mt(pb, mt);
                self.move_pageblock_free(mm, pb, mt);
                self.nr_reserved_highatomic -= PAGEBLOCK_NR_PAGES as u64;
                self.events[VmEvent::HighAtomicUnreserve as usize] += 1;
            }
            pb += PAGEBLOCK_NR_PAGES as u32;
        }
        true
    }
}
