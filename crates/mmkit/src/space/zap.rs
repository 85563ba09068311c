//! Unmap (Linux's `unmap_page_range`, `free_pgtables` and `mmu_gather`): clearing
//! the entries of a range, dropping their reverse maps, gathering the pages to free
//! them in batches, freeing the table pages that became empty, and zapping a large
//! range on several threads.
//!
//! Invariants: a page is gathered only after its entry is cleared and its reverse
//! map dropped, and leaves the LRU (`lru.rs`) in the flush before it is freed; a
//! swap entry's slot reference is dropped (`swap_free`, on its device pinned
//! once per PTE table) when it is cleared; a split huge page is gathered with its last mapped sub-page
//! (`Page::nr_pages_mapped` reaching 0); a table page is freed only once its used
//! count (`Page::pt_used`) is 0 and its parent entry is cleared. The root table
//! goes only with the space (`Drop for SpaceInner`).
//!
//! Locking: everything here runs under the space's exclusive VMA lock (or in
//! `drop`, where no other reference exists), so nothing else writes the entries:
//! each is read and cleared by plain atomic stores. The threads of the parallel
//! zap run under the caller's guard on disjoint 2 MiB-aligned parts and free only
//! PTE tables; the upper levels are freed after they joined.

use std::sync::atomic::Ordering;

use super::mmap::VmaTree;
use super::{SpaceInner, Stat};
use crate::pgtable::{
    desc, level_shift, pt_index, used, Pte, Table, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE,
};
use crate::{rmap, Mm, Pfn};
use mmkit_core::page::PG_SWAPCACHE;

use crate::swap_cluster::SWAP_HAS_CACHE;
use crate::swapfile::SwapPins;

/// Pages an [`MmuGather`] collects before freeing them in one batch.
pub const MMU_GATHER_BATCH: usize = 512;
/// Highest level of table page that `munmap` frees (the root, level 3, only goes
/// with the address space).
pub(super) const FREE_UPPER: u32 = 2;
/// What the threads of `munmap_parallel` free: PTE tables only.
const FREE_PTE_TABLES: u32 = 0;

/// Pages and table pages unmapped but not yet freed (Linux's `mmu_gather`): freed
/// in batches of up to [`MMU_GATHER_BATCH`] through `Mm::put_pages_bulk`, which
/// takes the per-CPU (or zone) lock once per batch. Dropping it frees the rest.
pub(crate) struct MmuGather<'a> {
    mm: &'a Mm,
    batch: Vec<(Pfn, u32)>,
    /// The data pages of `batch` (order-0 pages and huge heads, which may be
    /// on a list and charged to a group; table pages are neither).
    lru: Vec<u32>,
    /// Whether `lru` holds a huge page.
    huge: bool,
}

impl<'a> MmuGather<'a> {
    pub(super) fn new(mm: &'a Mm) -> Self {
        MmuGather {
            mm,
            batch: Vec::with_capacity(MMU_GATHER_BATCH),
            lru: Vec::with_capacity(MMU_GATHER_BATCH),
            huge: false,
        }
    }
    /// Drops the mapping's reference on a data page (the reverse map is cleared).
    pub(super) fn remove_page(&mut self, pfn: Pfn, order: u32) {
        self.lru.push(pfn.get() as u32);
        self.huge |= order > 0;
        self.push(pfn, order);
    }
    /// Frees a table page (Linux's `tlb_remove_table`).
    pub(super) fn remove_table(&mut self, pfn: Pfn) {
        used(self.mm, pfn).store(0, Ordering::Relaxed);
        self.push(pfn, 0);
    }
    fn push(&mut self, pfn: Pfn, order: u32) {
        self.batch.push((pfn, order));
        if self.batch.len() >= MMU_GATHER_BATCH {
            self.flush();
        }
    }
    /// Takes the batch's data pages off the LRU (one LRU lock hold per list
    /// set, their reverse maps already cleared) and uncharges them as they
    /// go, one counter update per group (Linux's `uncharge_batch` in
    /// `folios_put_refs`), then drops the batch's references.
    fn flush(&mut self) {
        if !self.batch.is_empty() {
            let mut uncharge = crate::memcontrol::UnchargeGather::new(self.mm, self.huge);
            self.mm
                .lru()
                .remove_batch(self.mm, &self.lru, &mut uncharge);
            uncharge.finish();
            self.mm.put_pages_bulk(&self.batch);
            self.batch.clear();
            self.lru.clear();
            self.huge = false;
        }
    }
}

impl Drop for MmuGather<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

impl SpaceInner {
    /// Linux's `free_pgtables` after a parallel zap: the same walk over the (now
    /// empty) range frees the PMD and PUD tables that became empty.
    pub(super) fn free_pgtables(&self, held: &VmaTree, start: u64, end: u64) {
        let mut tlb = MmuGather::new(&self.mm);
        self.zap_range(held, start, end, FREE_UPPER, &mut tlb);
    }

    /// Zaps `[start, end)` in 2 MiB-aligned parts on `threads` scoped threads.
    pub(super) fn zap_parallel(&self, held: &VmaTree, start: u64, end: u64, threads: usize) {
        let lo = start & !(PMD_SIZE - 1);
        let units = (end - lo).div_ceil(PMD_SIZE);
        let n = (threads as u64).min(units).max(1);
        let per = units.div_ceil(n) * PMD_SIZE;
        let parts: Vec<(u64, u64)> = (0..n)
            .map(|k| (start.max(lo + k * per), end.min(lo + (k + 1) * per)))
            .filter(|(s, e)| s < e)
            .collect();
        let zap = |s: u64, e: u64| {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(held, s, e, FREE_PTE_TABLES, &mut tlb);
        };
        std::thread::scope(|sc| {
            for &(s, e) in parts.iter().skip(1) {
                let spawned = std::thread::Builder::new()
                    .name("mmkit-zap".into())
                    .spawn_scoped(sc, move || zap(s, e));
                if spawned.is_err() {
                    zap(s, e);
                }
            }
            if let Some(&(s, e)) = parts.first() {
                zap(s, e);
            }
        });
    }

    /// Linux's `unmap_page_range` + `free_pgtables`: clears every entry in
    /// `[start, end)`, gathers the pages, and frees table pages of levels up to
    /// `free_max` that became empty. Huge PMDs straddling an end must have been
    /// split. Exclusive VMA lock held (the parallel zap's threads run under the
    /// caller's guard on disjoint 2 MiB-aligned parts, with `free_max` 0).
    pub(super) fn zap_range(
        &self,
        held: &VmaTree,
        start: u64,
        end: u64,
        free_max: u32,
        tlb: &mut MmuGather<'_>,
    ) {
        self.zap_level(held, self.pgd, 3, start, end, free_max, tlb);
    }

    /// One level of the walk (Linux's `zap_p4d_range` .. `zap_pte_range`): the
    /// entries of the level-`level` table at `table_pfn` that cover `[start, end)`.
    #[allow(clippy::too_many_arguments)]
    fn zap_level(
        &self,
        held: &VmaTree,
        table_pfn: Pfn,
        level: u32,
        start: u64,
        end: u64,
        free_max: u32,
        tlb: &mut MmuGather<'_>,
    ) {
        let t = self.tbl(held, table_pfn);
        if level == 0 {
            self.zap_pte_range(t, table_pfn, start, end, tlb);
            return;
        }
        let shift = level_shift(level);
        let mut addr = start;
        while addr < end {
            let next = (((addr >> shift) + 1) << shift).min(end);
            let slot = &t[pt_index(addr, level)];
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if e.is_none() {
                addr = next;
                continue;
            }
            if level == 1 && e.is_huge() {
                if addr & (PMD_SIZE - 1) == 0 && next - addr == PMD_SIZE {
                    self.zap_huge_pmd(slot, table_pfn, tlb);
                } else {
                    debug_assert!(false, "huge PMD straddling a zap boundary was not split");
                }
            } else if e.is_present() {
                let child = e.pfn();
                self.zap_level(held, child, level - 1, addr, next, free_max, tlb);
                if level - 1 <= free_max && used(&self.mm, child).load(Ordering::Relaxed) == 0 {
                    slot.store(0, Ordering::Release);
                    used(&self.mm, table_pfn).fetch_sub(1, Ordering::Relaxed);
                    tlb.remove_table(child);
                    self.stats.add(Stat::PgTables, -1);
                }
            }
            addr = next;
        }
    }

    /// Linux's `zap_pte_range`: clears the entries of the PTE table `t` (at
    /// `table_pfn`) that cover `[start, end)`, drops their reverse maps and gathers
    /// their pages (a split huge page with its last mapped sub-page). The table's
    /// used count and the RSS counter are updated once for the whole range. Under
    /// the exclusive VMA lock nothing else writes these entries (the parallel
    /// zap's threads own disjoint tables), so each is read and then cleared by a
    /// plain atomic store, without a locked read-modify-write.
    fn zap_pte_range(
        &self,
        t: &Table,
        table_pfn: Pfn,
        start: u64,
        end: u64,
        tlb: &mut MmuGather<'_>,
    ) {
        let mm = &self.mm;
        debug_assert!(start < end && (end - 1) / PMD_SIZE == start / PMD_SIZE);
        let first = pt_index(start, 0);
        let last = pt_index(end - 1, 0) + 1;
        let (mut cleared, mut rss) = (0u64, 0i64);
        // The devices of the table's swap entries, each looked up once.
        let mut pins = SwapPins::default();
        for slot in &t[first..last] {
            let e = Pte::from_raw(slot.load(Ordering::Relaxed));
            if e.is_none() {
                continue;
            }
            slot.store(0, Ordering::Relaxed);
            cleared += 1;
            if !e.maps_page() {
                if let Some(entry) = e.swap_entry() {
                    // The PTE's reference on its slot (Linux's `free_swap_and_cache`):
                    // a page read ahead for it, unused, goes with it.
                    let Some(dev) = pins.get(mm.swap(), entry) else {
                        mm.swap_bad_entry(entry, &"a PTE's entry names no device");
                        continue;
                    };
                    match dev.swap_free(entry) {
                        Ok(SWAP_HAS_CACHE) => _ = mm.try_to_reclaim_swap(dev, entry),
                        Ok(_) => {}
                        Err(err) => mm.swap_bad_entry(entry, &err),
                    }
                }
                continue;
            }
            let pfn = e.pfn();
            if !e.is_compound() && desc(mm, pfn).test_flag(PG_SWAPCACHE) {
                // Kept in the swap cache since its swap-in: free the slot too.
                let page = mm.lock_page(pfn);
                if let Some(entry) = mm.swapcache_entry(&page) {
                    match pins.get(mm.swap(), entry) {
                        Some(dev) => _ = mm.swapcache_drop(dev, &page),
                        None => mm.swap_bad_entry(entry, &"a cached page names no device"),
                    }
                }
            }
            rmap::clear(mm, pfn);
            rss += 1;
            if e.is_compound() {
                let head = Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1));
                let mapcount = desc(mm, Pfn::new(head.get() + 1)).nr_pages_mapped();
                if mapcount.fetch_sub(1, Ordering::AcqRel) == 1 {
                    tlb.remove_page(head, HPAGE_PMD_ORDER);
                }
            } else {
                tlb.remove_page(pfn, 0);
            }
        }
        if cleared > 0 {
            used(mm, table_pfn).fetch_sub(cleared, Ordering::Relaxed);
        }
        if rss > 0 {
            self.stats.add(Stat::Rss, -rss);
        }
    }
}
