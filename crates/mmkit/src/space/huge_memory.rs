//! Huge pages (Linux's `mm/huge_memory.c`): order-9 faults under one PMD, the
//! NUMA-hinting fault on a huge PMD, splitting a huge PMD into a PTE table, and
//! zapping a huge PMD.
//!
//! Invariants: a huge PMD maps an order-9 block whose head carries the reverse map
//! and whose first tail page's `Page::nr_pages_mapped` is 0 (not split). Every
//! huge PMD has a PTE table deposited with it (Linux's
//! `pgtable_trans_huge_deposit`, kept in the second tail page's
//! `Page::pmd_huge_pte` and counted in the space's table pages): a split takes
//! that table instead of allocating one, so unmapping part of a huge page never
//! needs memory and `munmap` cannot fail half way; the zap of the PMD frees it. After a
//! split, each sub-page has its own reverse map and a compound PTE, and
//! `nr_pages_mapped` counts the sub-pages still mapped; the block is freed with
//! the last of them (`zap.rs`).
//!
//! Locking: faults run under the shared VMA lock and install the PMD by CAS from
//! 0; split and zap run under the exclusive VMA lock, where nothing else writes
//! the PMD or the new PTE table.

use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::clear::{ChunkedClear, ClearStrategy};

use super::memory::VmFault;
use super::mmap::{MapFlags, Vma, VmaTree};
use super::zap::MmuGather;
use super::{leaf, SpaceInner, Stat, PAGE, SPARSE_TOUCH_BYTES};
use crate::pgtable::{
    alloc_table, desc, used, Pte, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE, PTE_ACCESSED,
    PTE_COMPOUND, PTE_DIRTY, PTE_WRITE,
};
use crate::{rmap, Gfp, Mm, Pfn};

/// The clearing strategy for a huge-page fault in `vma`. `Auto` decides by the
/// extent being populated, the mapping, not by the one 2 MiB page: faults that
/// stream through more than the last-level cache clear with non-temporal stores,
/// so they neither evict the working set nor pay for allocating lines that will be
/// evicted before they are read (the window around the faulting sub-page is still
/// cleared last with cached stores, see `clear_huge_page`); a huge mapping that fits
/// in the cache is cleared with `rep stosb`.
fn huge_clear_strategy(s: ClearStrategy, vma: &Vma) -> ClearStrategy {
    s.resolve((vma.end - vma.start) as usize)
}

impl Vma {
    /// Can the fault at `addr` take an order-9 page: a HUGE VMA containing the
    /// whole 2 MiB-aligned range around `addr`.
    pub(super) fn huge_eligible(&self, addr: u64) -> bool {
        let haddr = addr & !(PMD_SIZE - 1);
        self.flags.contains(MapFlags::HUGE) && haddr >= self.start && haddr + PMD_SIZE <= self.end
    }
}

impl SpaceInner {
    /// Linux's `do_huge_pmd_anonymous_page`: a cleared order-9 page under the PMD
    /// `slot`. False when no order-9 block could be had (the caller falls back to
    /// order 0); true when the PMD is now populated (by us or a racing fault).
    pub(super) fn do_huge_pmd_anonymous_page(
        &self,
        vmf: &VmFault<'_>,
        slot: &AtomicU64,
        pmd_pfn: Pfn,
    ) -> bool {
        let (addr, len) = (vmf.addr, vmf.len);
        let mm = &self.mm;
        let gfp = Gfp::MOVABLE | Gfp::NOWARN;
        let head = addr & !(PMD_SIZE - 1);
        let Ok(pfn) = self.alloc_fault_pages(vmf.vma, head, gfp, HPAGE_PMD_ORDER) else {
            return false;
        };
        // The table a later split will need, taken now (without it, no huge page).
        let Ok(pgtable) = alloc_table(mm) else {
            mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                .expect("freeing our own unpublished huge page");
            return false;
        };
        let haddr = addr & !(PMD_SIZE - 1);
        let fault_index = ((addr - haddr) / PAGE) as usize;
        // A sparse first touch predicts sparse accesses at the same offset of the
        // other sub-pages: their lines are prefetched after a streaming clear.
        let hot = if len <= SPARSE_TOUCH_BYTES { len } else { 0 };
        let clear = ChunkedClear::new(huge_clear_strategy(mm.clear_strategy(), vmf.vma))
            .with_hot((addr % PAGE) as usize, hot);
        // SAFETY: the block is ours (just allocated, not yet mapped): 512 * 4096
        // writable bytes inside the arena that nothing else references; the yield
        // function touches nothing.
        unsafe {
            clear.clear_huge_page(
                mm.page_address(pfn),
                HPAGE_PMD_NR as usize,
                fault_index,
                &mut || {},
            )
        };
        rmap::set(mm, pfn, self.id, haddr);
        // Not split: no sub-page map count.
        desc(mm, Pfn::new(pfn.get() + 1))
            .nr_pages_mapped()
            .store(0, Ordering::Relaxed);
        pgtable_trans_huge_deposit(mm, pfn, pgtable);
        let pmd = leaf(pfn, true).with(vmf.young_bits());
        match slot.compare_exchange(0, pmd.raw(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                used(mm, pmd_pfn).fetch_add(1, Ordering::Relaxed);
                self.stats.add(Stat::HugeFaults, 1);
                self.stats.add(Stat::HugePages, 1);
                self.stats.add(Stat::PgTables, 1);
                self.stats.add(Stat::Rss, HPAGE_PMD_NR as i64);
            }
            Err(_) => {
                let pt = pgtable_trans_huge_withdraw(mm, pfn);
                mm.free_owned_pages(pt, 0)
                    .expect("freeing our own unpublished table");
                rmap::clear(mm, pfn);
                mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                    .expect("freeing our own unpublished huge page");
            }
        }
        true
    }

    /// Linux's `do_huge_pmd_numa_page`: a NUMA-hinting fault on the huge PMD
    /// `slot` (which held `e`): the PMD is made present again (unless something
    /// else changed it meanwhile) and the fault recorded (`numa_balance.rs`);
    /// huge pages are not migrated.
    pub(super) fn do_huge_pmd_numa_page(&self, vmf: &VmFault<'_>, slot: &AtomicU64, e: Pte) {
        if super::mprotect::clear_numa_hint(slot, e) {
            self.numa_huge_hint_fault(vmf, e.pfn());
        }
    }

    /// Linux's `split_huge_pmd`: replaces the huge PMD covering `addr` (if any) by
    /// the PTE table deposited with it, mapping its 512 sub-pages. Needs no
    /// memory, so it cannot fail. Exclusive VMA lock held.
    pub(super) fn split_huge_pmd(&self, held: &VmaTree, addr: u64) {
        let Some((slot, e, 1)) = self.follow_pte(held, addr) else {
            return;
        };
        let mm = &self.mm;
        let pt = pgtable_trans_huge_withdraw(mm, e.pfn());
        let t = self.tbl(held, pt);
        let head = e.pfn();
        let haddr = addr & !(PMD_SIZE - 1);
        let bits = e.raw() & (PTE_WRITE | PTE_ACCESSED | PTE_DIRTY);
        for (i, s) in t.iter().enumerate() {
            let sub = Pfn::new(head.get() + i as u64);
            let mut p = leaf(sub, false).with(bits | PTE_COMPOUND);
            if e.is_numa_hint() {
                p = p.mk_numa_hint();
            }
            s.store(p.raw(), Ordering::Relaxed);
            if i > 0 {
                rmap::set(mm, sub, self.id, haddr + i as u64 * PAGE);
            }
        }
        used(mm, pt).store(HPAGE_PMD_NR, Ordering::Relaxed);
        desc(mm, Pfn::new(head.get() + 1))
            .nr_pages_mapped()
            .store(HPAGE_PMD_NR, Ordering::Release);
        slot.store(Pte::table(pt).raw(), Ordering::Release);
        self.stats.add(Stat::HugePages, -1);
    }

    /// Linux's `zap_huge_pmd`.
    pub(super) fn zap_huge_pmd(&self, slot: &AtomicU64, table_pfn: Pfn, tlb: &mut MmuGather<'_>) {
        let mm = &self.mm;
        let e = Pte::from_raw(slot.swap(0, Ordering::AcqRel));
        used(mm, table_pfn).fetch_sub(1, Ordering::Relaxed);
        let head = e.pfn();
        let pt = pgtable_trans_huge_withdraw(mm, head);
        rmap::clear(mm, head);
        self.stats.add(Stat::Rss, -(HPAGE_PMD_NR as i64));
        self.stats.add(Stat::HugePages, -1);
        self.stats.add(Stat::PgTables, -1);
        tlb.remove_page(head, HPAGE_PMD_ORDER);
        tlb.remove_table(pt);
    }
}

/// Linux's `pgtable_trans_huge_deposit`: keeps the (zeroed) table `pt` with the
/// huge page `head` until its PMD is split or zapped.
fn pgtable_trans_huge_deposit(mm: &Mm, head: Pfn, pt: Pfn) {
    let slot = desc(mm, Pfn::new(head.get() + 2)).pmd_huge_pte();
    debug_assert_eq!(slot.load(Ordering::Relaxed), 0);
    slot.store(pt.get(), Ordering::Relaxed);
}

/// Linux's `pgtable_trans_huge_withdraw`: takes back the table deposited with
/// the huge page `head`. Every huge PMD has one (see the module header).
fn pgtable_trans_huge_withdraw(mm: &Mm, head: Pfn) -> Pfn {
    let pt = desc(mm, Pfn::new(head.get() + 2))
        .pmd_huge_pte()
        .swap(0, Ordering::Relaxed);
    assert!(
        pt != 0,
        "huge page at pfn {} has no deposited table",
        head.get()
    );
    Pfn::new(pt)
}
