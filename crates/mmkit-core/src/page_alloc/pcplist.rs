//! The per-CPU page lists and their lock-free caches (Linux's pcp side of
//! `mm/page_alloc.c`): the order-0 cache hit on one zone (`alloc_page_cached`,
//! with `alloc_pages_uncached` for the rest of the allocation), refill from the zone (`rmqueue_bulk`, or a cluster cut
//! from as few buddy blocks as possible), the cache's fill / spill / drain, the
//! free side (`free_unref_page_commit`, `free_pcppages_bulk`), `drain_all_pages`
//! and the auto-tuning of `high` (Linux 6.7's `nr_pcp_alloc` / `nr_pcp_high`).
//!
//! Invariants: a page on a list or a cache is free with flags 0 and counts in
//! `nr_free_pages`, not in the zone's `nr_free`; a refill never takes the zone
//! below the request's watermark (bounded by the headroom under the zone lock).
//!
//! Locking: the CPU's list lock (a trylock from the CPU itself, a lock from a
//! remote drain), then the zone lock. Caches change only in restartable
//! sequences, or under the fence of `PcpCacheTable::with_fenced`.

use alloc::vec::Vec;

use super::{wmark_fail_event, AllocError, PageAlloc, SlowPathHooks};
use crate::config::{PcpHighPolicy, RefillPolicy};
use crate::gfp::{AllocContext, Gfp, ALLOC_WMARK_LOW, MIGRATE_PCPTYPES};
use crate::page::{Pfn, MAX_ORDER, PAGEBLOCK_ORDER};
use crate::pcp::{PcpGuard, PcpList, PCP_BATCH_SCALE_MAX, PCP_MAX_ORDER, PCP_ORDERS};
use crate::pcp_cache::PCP_CACHE_SLOTS;
use crate::platform::Platform;
use crate::stat::VmEvent;
use crate::zone::{Span, ZoneGuard};

/// Cluster refills of at least this many pages merge lazily freed pages first.
const PCP_CLUSTER_MERGE_PAGES: u32 = 256;

/// Pages a cache miss moves from the per-CPU list into the cache: half of it, so
/// that a CPU alternating between allocating and freeing does not bounce at
/// either end (a free into a full cache moves the whole cache back).
const PCP_CACHE_BATCH: usize = PCP_CACHE_SLOTS / 2;

impl<P: Platform> PageAlloc<P> {
    /// The first half of [`Self::alloc_pages`]: an order-0 page from this
    /// CPU's cache when there is one zone (no hooks needed), else `None`.
    /// A caller that gets `None` goes on with [`Self::alloc_pages_uncached`],
    /// which does not try the cache again; together they are `alloc_pages`.
    /// Split so that the caller builds its slow-path hooks only after a miss.
    #[inline(always)]
    pub fn alloc_page_cached(&self, gfp: Gfp, order: u32) -> Option<Pfn> {
        if order == 0 && self.zones.len() == 1 {
            let mt = gfp.migratetype() as usize;
            if let Some(idx) = self.cache_pop_first_zone(mt) {
                return Some(self.prep_new_page(idx, 0, mt, 0));
            }
        }
        None
    }

    /// The rest of [`Self::alloc_pages`] after [`Self::alloc_page_cached`]
    /// returned `None`.
    #[inline]
    pub fn alloc_pages_uncached(
        &self,
        gfp: Gfp,
        order: u32,
        hooks: &impl SlowPathHooks,
    ) -> Result<Pfn, AllocError> {
        let one_zone = order == 0 && self.zones.len() == 1;
        self.alloc_pages_ac(&AllocContext::new(gfp), order, hooks, 0, !one_zone)
    }

    /// An order-0 page of `mt` from the first zone's cache on this CPU, if the
    /// zone is above its low mark (as `alloc_pages_ac` checks it).
    #[inline(always)]
    pub(super) fn cache_pop_first_zone(&self, mt: usize) -> Option<u32> {
        let c = self.caches.as_ref()?;
        if mt >= MIGRATE_PCPTYPES || !self.zones[0].watermark_ok(0, ALLOC_WMARK_LOW) {
            return None;
        }
        c.pop::<P>(0, mt)
    }

    /// After a cache miss served by the per-CPU list: moves up to
    /// `PCP_CACHE_BATCH` more of its hot pages into the current CPU's cache, so
    /// the next allocations take no lock. Pages the cache no longer has room for
    /// (another thread on this CPU filled it meanwhile, or a drain fenced it) go
    /// back to the per-CPU list.
    #[cold]
    pub(super) fn fill_cache(&self, z: usize, mut g: PcpGuard<'_>, mt: usize) {
        let Some(c) = &self.caches else { return };
        let mut buf = [0u32; PCP_CACHE_BATCH];
        let mut n = 0;
        while n < PCP_CACHE_BATCH {
            match g.lists[0][mt].pop() {
                Some(idx) => buf[n] = idx,
                None => break,
            }
            n += 1;
        }
        g.count -= n as u32;
        drop(g);
        // Hottest last, so it ends on top of the cache.
        buf[..n].reverse();
        let pushed = c.push_many::<P>(z, mt, &buf[..n]);
        self.events[self.cpu()].add(VmEvent::PcpCacheFill, pushed as u64);
        if pushed < n {
            // The hottest did not fit: hottest first for `return_to_pcp`.
            buf[pushed..n].reverse();
            self.return_to_pcp(z, mt, &buf[pushed..n]);
        }
    }

    /// Puts free order-0 pages (hottest first) back on a per-CPU list, or on the
    /// buddy lists when no per-CPU list can be had.
    #[cold]
    pub(super) fn return_to_pcp(&self, z: usize, mt: usize, pages: &[u32]) {
        if let Some(mut g) = self.pcp_trylock(z) {
            for &idx in pages.iter().rev() {
                self.free_unref_page_commit(z, &mut g, idx, 0, mt);
            }
            return;
        }
        let zone = &self.zones[z];
        let mut zg = zone.lock();
        for &idx in pages {
            zg.free_one(&self.mem, zone.span, idx, 0, !self.cfg.merge.skips_merge());
        }
    }

    /// A free found the current CPU's cache full: moves the whole cache to the
    /// per-CPU list, bottom (oldest) first, so that the list (whose drains free
    /// sorted clusters from its cold end) sees runs of neighbouring pages whole
    /// and in the order they were freed.
    #[cold]
    pub(super) fn spill_cache(&self, z: usize, g: &mut PcpGuard<'_>, mt: usize) {
        let Some(c) = &self.caches else { return };
        let mut buf = [0u32; PCP_CACHE_SLOTS];
        let n = c.pop_many::<P>(z, mt, &mut buf);
        // Oldest first onto the list, so its hot end gets the cache's top.
        for &idx in buf[..n].iter().rev() {
            self.free_unref_page_commit(z, g, idx, 0, mt);
        }
        g.events[VmEvent::PcpCacheSpill as usize] += n as u64;
    }

    /// Empties every CPU's cache onto that CPU's per-CPU lists (the first step of
    /// `drain_all_pages`, whose list drain then frees them in sorted clusters).
    pub(super) fn drain_caches(&self) {
        let Some(c) = &self.caches else { return };
        // Nothing to take: spare every CPU the fence's interrupt. (A page pushed
        // right after this look is no different from one freed right after the
        // drain.)
        if c.lists().iter().all(|l| l.is_empty()) {
            return;
        }
        let mut taken: Vec<(usize, usize, usize, u32)> = Vec::new();
        let mut pages = Vec::new();
        c.with_fenced::<P, _>(|f| {
            for z in 0..self.zones.len() {
                for mt in 0..MIGRATE_PCPTYPES {
                    for cpu in 0..self.ncpu {
                        pages.clear();
                        f.take_all(z, mt, cpu, &mut pages);
                        taken.extend(pages.iter().map(|&p| (z, cpu, mt, p)));
                    }
                }
            }
        });
        if taken.is_empty() {
            return;
        }
        self.events[self.cpu()].add(VmEvent::PcpCacheDrain, taken.len() as u64);
        taken.sort_by_key(|t| (t.0, t.1));
        for group in taken.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (z, cpu) = (group[0].0, group[0].1);
            let mut g = self.pcp_of(z, cpu).lock(P::relax);
            for &(_, _, mt, idx) in group {
                self.free_unref_page_commit(z, &mut g, idx, 0, mt);
            }
        }
    }

    /// Takes the current CPU's list set. The kernel takes it with preemption
    /// disabled, so a failed trylock means a remote drain; here a thread can be
    /// preempted while holding it, and every other thread scheduled on that CPU
    /// would then miss its lists for a whole time slice. So on failure yield once
    /// (letting the holder run) and retry on whatever CPU we are then on, before
    /// falling back to the zone.
    #[inline]
    pub(super) fn pcp_trylock(&self, z: usize) -> Option<PcpGuard<'_>> {
        let cpu = self.cpu();
        if let Some(g) = self.pcp_of(z, cpu).try_lock() {
            return Some(g);
        }
        self.pcp_trylock_slow(z, cpu)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn pcp_trylock_slow(&self, z: usize, cpu: usize) -> Option<PcpGuard<'_>> {
        self.events[cpu].inc(VmEvent::PcpTrylockFail);
        for _ in 0..2 {
            P::relax();
            let cpu = self.cpu();
            if let Some(g) = self.pcp_of(z, cpu).try_lock() {
                return Some(g);
            }
        }
        None
    }

    #[inline]
    pub(super) fn rmqueue_pcplist(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        order: u32,
        mt: usize,
        alloc_flags: u32,
    ) -> Option<u32> {
        // The zone's free count decides, not what the list holds (Linux checks
        // the watermark before `rmqueue`): pages parked on per-CPU lists are
        // not handed out below the mark; the slow path drains them instead.
        if !self.zones[z].watermark_ok(order, alloc_flags) {
            g.events[wmark_fail_event(alloc_flags) as usize] += 1;
            return None;
        }
        let o = order as usize;
        if g.lists[o][mt].len() == 0 && !self.pcp_refill(z, g, order, mt, alloc_flags) {
            return None;
        }
        let idx = g.lists[o][mt].pop()?;
        g.count -= 1 << order;
        g.free_count >>= 1;
        g.events[VmEvent::PgAlloc as usize] += 1;
        g.events[VmEvent::PcpAllocHit as usize] += 1;
        Some(idx)
    }

    /// Refills one per-CPU list with a batch (Linux's `rmqueue_bulk`).
    #[cold]
    pub(super) fn pcp_refill(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        order: u32,
        mt: usize,
        alloc_flags: u32,
    ) -> bool {
        let zone = &self.zones[z];
        let entries = self.nr_pcp_alloc(z, g, order);
        let g = &mut **g;
        let list = &mut g.lists[order as usize][mt];
        let mut zg = zone.lock();
        // A batch never takes the zone below the request's watermark: bound it
        // by the headroom, read exactly under the lock.
        let room = zone.headroom(zg.nr_free, zg.nr_reserved_highatomic, alloc_flags) >> order;
        let entries = entries.min(room.min(u32::MAX as u64) as u32);
        if entries == 0 {
            drop(zg);
            g.events[wmark_fail_event(alloc_flags) as usize] += 1;
            return false;
        }
        let n = match self.cfg.refill {
            RefillPolicy::PageByPage => {
                let mut n = 0;
                while n < entries {
                    match zg.rmqueue(&self.mem, zone.span, order, mt, alloc_flags) {
                        Some(idx) => list.push(idx),
                        None => break,
                    }
                    n += 1;
                }
                n
            }
            RefillPolicy::Cluster => {
                self.rmqueue_cluster(&mut zg, zone.span, order, mt, entries, list)
            }
        };
        drop(zg);
        g.count += n << order;
        g.events[VmEvent::PcpRefill as usize] += 1;
        g.events[VmEvent::PcpRefillPages as usize] += (n as u64) << order;
        n > 0
    }

    /// Entries to refill (Linux 6.7's `nr_pcp_alloc`). Under auto-tuning a CPU that
    /// keeps allocating without freeing doubles its order-0 refill each time (up to
    /// batch << 5) and raises `high` to make room, so it goes to the zone less often.
    #[inline]
    pub(super) fn nr_pcp_alloc(&self, z: usize, g: &mut PcpGuard<'_>, order: u32) -> u32 {
        let base = g.batch;
        if self.cfg.pcp_high != PcpHighPolicy::Auto {
            return (base >> order).max(2);
        }
        let mut batch = if order == 0 {
            base << g.alloc_factor
        } else {
            base
        };
        if !self.zones[z].below_high() {
            let new = (g.high + batch).min(g.high_max);
            if new > g.high {
                g.events[VmEvent::PcpHighGrow as usize] += 1;
            }
            g.high = new;
        }
        if order == 0 {
            let max_nr_alloc = g.high.saturating_sub(g.count + base).max(base);
            if batch <= max_nr_alloc && g.alloc_factor < PCP_BATCH_SCALE_MAX {
                g.alloc_factor += 1;
            }
            batch = batch.min(max_nr_alloc);
        }
        (batch >> order).max(2)
    }

    /// Cluster refill: takes `entries` blocks of `order` as contiguous runs cut
    /// from as few buddy blocks as possible, writing only the heads of the blocks it
    /// takes apart, never the descriptors of the pages it hands to the CPU.
    pub(super) fn rmqueue_cluster(
        &self,
        zg: &mut ZoneGuard<'_, P>,
        span: Span,
        order: u32,
        mt: usize,
        entries: u32,
        list: &mut PcpList,
    ) -> u32 {
        let mem = &self.mem;
        // A refill of a whole run is a high-order request in disguise: merge the
        // order-0 pages that lazy merging left behind first (merge on demand), so
        // the run comes from a few recently freed blocks rather than from many
        // fragments or from a cold, never-split block. Not below the high
        // watermark: reclaim is running then, every page it frees is taken again
        // at once as an order-0 page, and merging it only to split it again is
        // a cache miss per buddy for nothing (the order-0 list serves the run).
        if zg.nr_unmerged > 0
            && zg.merge_on_demand
            && entries << order >= PCP_CLUSTER_MERGE_PAGES
            && zg.nr_free >= zg.zone().wmark[2]
        {
            zg.merge_all(mem, span);
        }
        let mut got = 0u32;
        while got < entries {
            let need_pages = (entries - got) << order;
            let want = (32 - (need_pages - 1).leading_zeros()).clamp(order, MAX_ORDER);
            // Blocks smaller than the rest first, largest first: they are the most
            // recently freed (cache-warm) and the fragments, and using them up keeps
            // large blocks whole for high-order requests. Only then split the
            // smallest block that covers the rest. Fragments are blocks below a
            // pageblock: a large refill (auto-tuned batches reach 2016 pages) must
            // not take whole free pageblocks, which huge pages need, while smaller
            // blocks are free.
            let small = want.min(PAGEBLOCK_ORDER).max(order);
            let mut pick = None;
            for o in (order..small).rev() {
                if zg.free_area[o as usize][mt].nr > 0 {
                    pick = Some(o);
                    break;
                }
            }
            if pick.is_none() {
                for o in small..=MAX_ORDER {
                    if zg.free_area[o as usize][mt].nr > 0 {
                        pick = Some(o);
                        break;
                    }
                }
            }
            match pick {
                Some(o) => {
                    let head = zg.free_area[o as usize][mt].head;
                    zg.del_free(mem, head);
                    let take = ((1u32 << o) >> order).min(entries - got);
                    for j in (0..take).rev() {
                        list.push(head + (j << order));
                    }
                    let used = take << order;
                    if used < (1 << o) {
                        zg.free_range_unmerged(mem, head + used, head + (1 << o), mt);
                    }
                    got += take;
                }
                None => {
                    // Nothing of this migratetype: the one-block path merges on
                    // demand and falls back / steals; then runs resume.
                    match zg.rmqueue(mem, span, order, mt, 0) {
                        Some(idx) => {
                            list.push(idx);
                            got += 1;
                        }
                        None => break,
                    }
                }
            }
        }
        got
    }

    /// Frees a claimed block: an order-0 page of a per-CPU migratetype onto its
    /// CPU's cache (caches exist only in front of per-CPU lists), anything else
    /// or a full cache out of line.
    #[inline(always)]
    pub(super) fn free_claimed(&self, idx: u32, order: u32, mt: usize) {
        if order == 0 && mt < MIGRATE_PCPTYPES {
            if let Some(c) = &self.caches {
                if c.push::<P>(self.zone_of(idx), mt, idx) {
                    return;
                }
            }
        }
        self.free_claimed_slow(idx, order, mt)
    }

    /// `free_claimed` past the cache: the per-CPU list (spilling a full cache
    /// first), or the zone.
    #[inline(never)]
    pub(super) fn free_claimed_slow(&self, idx: u32, order: u32, mt: usize) {
        let z = self.zone_of(idx);
        let cached = order == 0 && mt < MIGRATE_PCPTYPES && self.caches.is_some();
        if !self.pcp.is_empty() && order <= PCP_MAX_ORDER && mt < MIGRATE_PCPTYPES {
            if let Some(mut g) = self.pcp_trylock(z) {
                // The cache's pages go first: they were freed before this one, and
                // the list keeps free order so that its drains see runs in order.
                if cached {
                    self.spill_cache(z, &mut g, mt);
                }
                self.free_unref_page_commit(z, &mut g, idx, order, mt);
                g.events[VmEvent::PgFree as usize] += 1;
                return;
            }
        }
        let zone = &self.zones[z];
        let mut zg = zone.lock();
        let merge = !(order == 0 && self.cfg.merge.skips_merge());
        zg.free_one(&self.mem, zone.span, idx, order, merge);
        zg.events[VmEvent::PgFree as usize] += 1;
    }

    #[inline(always)]
    pub(super) fn free_unref_page_commit(
        &self,
        z: usize,
        g: &mut PcpGuard<'_>,
        idx: u32,
        order: u32,
        mt: usize,
    ) {
        let o = order as usize;
        if g.lists[o][mt].is_full() {
            let b = g.batch;
            self.free_pcppages_bulk(z, g, b);
        }
        g.lists[o][mt].push(idx);
        g.count += 1 << order;
        g.free_count = g.free_count.saturating_add(1 << order);
        g.alloc_factor >>= 1;
        if g.count >= g.high {
            let high = self.nr_pcp_high(z, g);
            if g.count >= high {
                let to_free = (g.count - high + g.batch).min(g.count);
                self.free_pcppages_bulk(z, g, to_free);
            }
        }
    }

    /// The `high` to enforce now; auto-tuning adjusts it (Linux 6.7's `nr_pcp_high`).
    #[inline]
    pub(super) fn nr_pcp_high(&self, z: usize, g: &mut PcpGuard<'_>) -> u32 {
        if self.cfg.pcp_high == PcpHighPolicy::Fixed {
            return g.high;
        }
        if self.zones[z].below_high() {
            let new = g.high.saturating_sub(g.batch).max(g.high_min);
            if new < g.high {
                g.events[VmEvent::PcpHighShrink as usize] += 1;
            }
            g.high = new;
        } else if g.free_count >= g.batch {
            let new = (g.high + g.batch).min(g.high_max);
            if new > g.high {
                g.events[VmEvent::PcpHighGrow as usize] += 1;
            }
            g.high = new;
        }
        g.high
    }

    /// Frees `to_free` pages from the cold ends of a CPU's lists to the zone
    /// (Linux's `free_pcppages_bulk`), in chunks of up to 128 entries, one zone
    /// lock hold per chunk.
    pub(super) fn free_pcppages_bulk(&self, z: usize, g: &mut PcpGuard<'_>, to_free: u32) {
        const CHUNK: usize = 128;
        let zone = &self.zones[z];
        let mut left = to_free.min(g.count);
        let nlists = (PCP_ORDERS * MIGRATE_PCPTYPES) as u32;
        while left > 0 {
            // Gather a chunk of one (order, migratetype) list, round robin.
            let mut buf = [0u32; CHUNK];
            let mut n = 0usize;
            let mut order = 0;
            for step in 0..nlists {
                let li = (g.drain_rr + step) % nlists;
                let (o, mt) = (
                    (li as usize) / MIGRATE_PCPTYPES,
                    (li as usize) % MIGRATE_PCPTYPES,
                );
                if g.lists[o][mt].len() == 0 {
                    continue;
                }
                order = o as u32;
                let g = &mut **g;
                let list = &mut g.lists[o][mt];
                while n < CHUNK && left > 0 {
                    match list.pop_cold() {
                        Some(idx) => {
                            buf[n] = idx;
                            n += 1;
                            left = left.saturating_sub(1 << o);
                            g.count -= 1 << o;
                        }
                        None => break,
                    }
                }
                g.drain_rr = li + 1;
                break;
            }
            if n == 0 {
                break;
            }
            let chunk = &mut buf[..n];
            let cluster = self.cfg.refill == RefillPolicy::Cluster;
            if cluster {
                chunk.sort_unstable();
            }
            let lazy0 = order == 0 && self.cfg.merge.skips_merge();
            let mut zg = zone.lock();
            if cluster {
                // Free aligned contiguous runs as whole blocks: one head written per run.
                let mut i = 0;
                while i < n {
                    let x = chunk[i];
                    let mut k = order;
                    while k < MAX_ORDER
                        && x & ((2 << k) - 1) == 0
                        && i + ((2usize << k) >> order) <= n
                        && chunk[i + ((2usize << k) >> order) - 1] == x + (2 << k) - (1 << order)
                    {
                        k += 1;
                    }
                    zg.free_one(&self.mem, zone.span, x, k, !(lazy0 && k == 0));
                    i += (1usize << k) >> order;
                }
            } else {
                for &x in chunk.iter() {
                    zg.free_one(&self.mem, zone.span, x, order, !lazy0);
                }
            }
            drop(zg);
            g.events[VmEvent::PcpDrain as usize] += 1;
            g.events[VmEvent::PcpDrainPages as usize] += (n as u64) << order;
        }
    }

    /// Flushes every CPU's lists to the buddy lists (Linux's `drain_all_pages`).
    pub fn drain_all_pages(&self) {
        if self.pcp.is_empty() {
            return;
        }
        self.events[self.cpu()].inc(VmEvent::DrainAll);
        self.drain_caches();
        for z in 0..self.zones.len() {
            for cpu in 0..self.ncpu {
                let mut g = self.pcp_of(z, cpu).lock(P::relax);
                let c = g.count;
                self.free_pcppages_bulk(z, &mut g, c);
            }
        }
    }

    /// Merges every lazily freed order-0 page (merge on demand).
    pub fn merge_all(&self) {
        for z in self.zones.iter() {
            let mut g = z.lock();
            if g.nr_unmerged > 0 {
                g.merge_all(&self.mem, z.span);
            }
        }
    }

    /// Auto-tuning decay, run about once a second by the environment (Linux's
    /// `decay_pcp_high` from the vmstat worker): lowers `high` by 1/8 towards
    /// `high_min` and frees what is above it.
    pub fn decay_pcp_high(&self) {
        if let Some(c) = &self.caches {
            c.fold::<P>();
        }
        if self.cfg.pcp_high != PcpHighPolicy::Auto {
            return;
        }
        for z in 0..self.zones.len() {
            for cpu in 0..self.ncpu {
                let Some(mut g) = self.pcp_of(z, cpu).try_lock() else {
                    continue;
                };
                if g.high > g.high_min {
                    let new = g
                        .count
                        .saturating_sub(g.batch << 5)
                        .max(g.high - g.high / 8)
                        .max(g.high_min);
                    if new < g.high {
                        g.events[VmEvent::PcpHighShrink as usize] += 1;
                    }
                    g.high = new;
                }
                if g.count > g.high {
                    let n = g.count - g.high;
                    self.free_pcppages_bulk(z, &mut g, n);
                }
                g.free_count = 0;
            }
        }
    }
}
