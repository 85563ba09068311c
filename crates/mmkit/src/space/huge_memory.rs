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
//! Reclaim splits a cold huge page into 512 order-0 pages to swap them out
//! (`split_huge_page`, Linux's large-folio split in `shrink_folio_list`).
//!
//! Locking: faults run under the shared VMA lock and install the PMD by CAS from
//! 0; munmap's split and the zap run under the exclusive VMA lock. Reclaim's
//! split runs under the shared VMA lock holding the page lock of all 512
//! sub-pages, and changes every entry by CAS or atomic AND, since accessors
//! set accessed and dirty bits meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::clear::{ChunkedClear, ClearStrategy};
use mmkit_core::{PageState, VmEvent};

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
/// extent being populated, the mapping, not by the one 2 MiB page, through the
/// `Mm`'s calibrated plan (`calibrate.rs`): a mapping up to the plan's
/// `cached_upto` is cleared with `rep stosb`, a larger one with the kernel the
/// host measured fastest for huge pages (or for 1 GiB extents, from 1 GiB):
/// on the hosts measured so far, streaming stores, which neither evict the
/// working set nor pay for allocating lines that are evicted before they are
/// read. The window around the faulting sub-page is still cleared last with
/// cached stores (see `clear_huge_page`).
fn huge_clear_strategy(mm: &Mm, vma: &Vma) -> ClearStrategy {
    mm.clear_plan()
        .resolve(mm.clear_strategy(), (vma.end - vma.start) as usize)
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
        // A huge page its group cannot be charged for: order 0 instead.
        if let Some(g) = self.memcg() {
            if crate::memcontrol::try_charge(g, HPAGE_PMD_NR, HPAGE_PMD_ORDER).is_err() {
                mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                    .expect("freeing our own unpublished huge page");
                return false;
            }
        }
        // The table a later split will need, taken now (without it, no huge page).
        let Ok(pgtable) = alloc_table(mm) else {
            if let Some(g) = self.memcg() {
                g.memory.uncharge(HPAGE_PMD_NR);
            }
            mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                .expect("freeing our own unpublished huge page");
            return false;
        };
        let haddr = addr & !(PMD_SIZE - 1);
        let fault_index = ((addr - haddr) / PAGE) as usize;
        // A sparse first touch predicts sparse accesses at the same offset of the
        // other sub-pages: their lines are prefetched after a streaming clear,
        // and only the faulting sub-page is cleared last with cached stores (a
        // window of neighbours, 32 KiB of reads for ownership, is for a dense
        // touch, which goes on into them).
        let sparse = len <= SPARSE_TOUCH_BYTES;
        let mut clear = ChunkedClear::new(huge_clear_strategy(mm, vmf.vma));
        if sparse {
            clear = clear
                .with_hot((addr % PAGE) as usize, len)
                .with_window_pages(1);
        }
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
        if let Some(g) = self.memcg() {
            mm.memcg().set_owner(pfn.get(), g.id);
        }
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
                // One LRU entry for the 512 pages (reclaim splits it).
                // Mapped young before its sub-pages were used: the first
                // accessed bit found is the insertion's.
                let st = mm.lru().policy.new_page_state(true);
                mm.lru()
                    .lru_cache_add(mm, &[pfn], st, st, self.memcg().map(|g| &**g));
            }
            Err(_) => {
                let pt = pgtable_trans_huge_withdraw(mm, pfn);
                mm.free_owned_pages(pt, 0)
                    .expect("freeing our own unpublished table");
                rmap::clear(mm, pfn);
                crate::memcontrol::uncharge_batch(mm, &[(pfn, HPAGE_PMD_ORDER)]);
                mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                    .expect("freeing our own unpublished huge page");
            }
        }
        true
    }

    /// Linux's `do_huge_pmd_numa_page`: a NUMA-hinting fault on the huge PMD
    /// `slot` (which held `e`): the PMD is made present again (unless something
    /// else changed it meanwhile) and the fault recorded (`task_numa.rs`);
    /// huge pages are not migrated.
    pub(super) fn do_huge_pmd_numa_page(&self, vmf: &VmFault<'_>, slot: &AtomicU64, e: Pte) {
        if super::mprotect::clear_numa_hint(slot, e) {
            self.numa_huge_hint_fault(vmf, slot, e.pfn());
        }
    }

    /// Linux's `split_huge_pmd`: replaces the huge PMD covering `addr` (if any) by
    /// the PTE table deposited with it, mapping its 512 sub-pages. Needs no
    /// memory, so it cannot fail. Exclusive VMA lock held.
    pub(super) fn split_huge_pmd(&self, held: &VmaTree, addr: u64) {
        if let Some((slot, e, 1)) = self.follow_pte(held, addr) {
            let done = self.split_huge_pmd_at(held, slot, e, addr & !(PMD_SIZE - 1));
            debug_assert!(done, "nothing else writes a PMD under the exclusive lock");
        }
    }

    /// Replaces the huge PMD `slot` at `haddr`, seen holding `e`, by its
    /// deposited table mapping the 512 sub-pages with `e`'s bits, published by
    /// CAS: an accessor that sets the accessed or dirty bit meanwhile (under
    /// the shared VMA lock) makes the split build the table again with its
    /// bits. False, nothing changed, when the PMD stops mapping the page.
    fn split_huge_pmd_at(&self, held: &VmaTree, slot: &AtomicU64, mut e: Pte, haddr: u64) -> bool {
        let mm = &self.mm;
        let head = e.pfn();
        let pt = pgtable_trans_huge_deposited(mm, head);
        let t = self.tbl(held, pt);
        for i in 1..HPAGE_PMD_NR {
            rmap::set(mm, Pfn::new(head.get() + i), self.id, haddr + i * PAGE);
        }
        used(mm, pt).store(HPAGE_PMD_NR, Ordering::Relaxed);
        desc(mm, Pfn::new(head.get() + 1))
            .nr_pages_mapped()
            .store(HPAGE_PMD_NR, Ordering::Release);
        loop {
            let bits = e.raw() & (PTE_WRITE | PTE_ACCESSED | PTE_DIRTY);
            for (i, s) in t.iter().enumerate() {
                let mut p = leaf(Pfn::new(head.get() + i as u64), false).with(bits | PTE_COMPOUND);
                if e.is_numa_hint() {
                    p = p.mk_numa_hint();
                }
                s.store(p.raw(), Ordering::Relaxed);
            }
            match slot.compare_exchange(
                e.raw(),
                Pte::table(pt).raw(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) if Pte::from_raw(now).is_huge() && Pte::from_raw(now).pfn() == head => {
                    e = Pte::from_raw(now);
                }
                Err(_) => {
                    // Unmapped meanwhile: the PMD maps it whole no more, and
                    // the table stays deposited for whoever zapped it.
                    for i in 1..HPAGE_PMD_NR {
                        rmap::clear(mm, Pfn::new(head.get() + i));
                    }
                    desc(mm, Pfn::new(head.get() + 1))
                        .nr_pages_mapped()
                        .store(0, Ordering::Release);
                    return false;
                }
            }
        }
        pgtable_trans_huge_withdraw(mm, head);
        self.stats.add(Stat::HugePages, -1);
        mm.page_alloc().count_vm_event(VmEvent::ThpSplitPmd, 1);
        true
    }

    /// Linux's `split_huge_page` as reclaim uses it (`shrink_folio_list`
    /// splits a large folio it cannot swap whole): the huge page headed by
    /// `head`, which this space maps by its PMD or, PMD split, by PTEs, becomes
    /// 512 order-0 pages. The PMD is split (`split_huge_pmd_at`); each mapped
    /// sub-page's PTE loses `PTE_COMPOUND` and the page gets its own reference
    /// (its mapping's; the head keeps the block's); sub-pages no longer mapped
    /// are freed, the head dropping the mapping's reference if it is one.
    ///
    /// With `keep_if_referenced`, a page accessed since the last look (the
    /// accessed bit of its PMD or of any PTE, cleared here) is left whole:
    /// [`HugeSplit::Referenced`]. [`HugeSplit::Busy`], nothing changed, when
    /// the entries do not map the page as its reverse maps say.
    ///
    /// Held: the shared VMA lock (`held`: no zap), the page lock of each of the
    /// 512 sub-pages (no access touches their bytes, and no pin is taken: pins
    /// are taken under the page lock of the page accessed), and the caller
    /// checked that the page has no reference but the mapping's and its own.
    /// Accessors may still set accessed and dirty bits: every entry is
    /// changed by CAS or an atomic AND. An accessor that walked before the
    /// split finds a different translation under its page lock and walks
    /// again (`still_maps` in `mmu.rs`).
    pub(crate) fn split_huge_page(
        &self,
        held: &VmaTree,
        head: Pfn,
        keep_if_referenced: bool,
    ) -> HugeSplit {
        let mm = &self.mm;
        let d = desc(mm, head);
        if d.state() != PageState::Alloc || d.order() != HPAGE_PMD_ORDER {
            return HugeSplit::Busy;
        }
        let mapcount = desc(mm, Pfn::new(head.get() + 1)).nr_pages_mapped();
        if mapcount.load(Ordering::Acquire) == 0 {
            // Mapped whole by its PMD, at the head's address.
            let Some((id, haddr)) = rmap::decode(d.mapping.load(Ordering::Acquire)) else {
                return HugeSplit::Busy;
            };
            let Some((slot, e, 1)) = self.follow_pte(held, haddr) else {
                return HugeSplit::Busy;
            };
            if id != self.id || !e.is_huge() || e.pfn() != head {
                return HugeSplit::Busy;
            }
            if keep_if_referenced
                && (slot.fetch_and(!PTE_ACCESSED, Ordering::AcqRel) & PTE_ACCESSED != 0
                    || self.load().holds_token())
            {
                return HugeSplit::Referenced;
            }
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if !self.split_huge_pmd_at(held, slot, e, haddr) {
                return HugeSplit::Busy;
            }
        }
        // Every mapped sub-page's PTE, as its reverse map says.
        let mut ptes = Vec::with_capacity(HPAGE_PMD_NR as usize);
        for i in 0..HPAGE_PMD_NR {
            let sub = Pfn::new(head.get() + i);
            let Some((id, va)) = rmap::decode(desc(mm, sub).mapping.load(Ordering::Acquire)) else {
                continue;
            };
            match self.follow_pte(held, va) {
                Some((slot, e, 0)) if id == self.id && e.is_compound() && e.pfn() == sub => {
                    ptes.push((i, slot))
                }
                _ => return HugeSplit::Busy,
            }
        }
        if ptes.len() as u64 != mapcount.load(Ordering::Acquire) {
            return HugeSplit::Busy;
        }
        if keep_if_referenced {
            let mut referenced = false;
            for (_, slot) in &ptes {
                referenced |= slot.fetch_and(!PTE_ACCESSED, Ordering::AcqRel) & PTE_ACCESSED != 0;
            }
            if referenced || self.load().holds_token() {
                return HugeSplit::Referenced;
            }
        }
        for (_, slot) in &ptes {
            slot.fetch_and(!PTE_COMPOUND, Ordering::AcqRel);
        }
        mapcount.store(0, Ordering::Release);
        mm.page_alloc()
            .split_page(head, HPAGE_PMD_ORDER)
            .expect("an allocated order-9 head");
        // The 512 pages charged for the head are each sub-page's now.
        let owner = mm.memcg().owner(head.get());
        if owner != 0 {
            for i in 1..HPAGE_PMD_NR {
                mm.memcg().set_owner(head.get() + i, owner);
            }
        }
        // Each mapped sub-page keeps the reference split_page gave it (its
        // mapping's); the unmapped ones drop theirs.
        let mut mapped = ptes.iter().map(|&(i, _)| i).peekable();
        let mut unmapped = Vec::new();
        let mut subpages = Vec::with_capacity(ptes.len());
        for i in 0..HPAGE_PMD_NR {
            let sub = Pfn::new(head.get() + i);
            if mapped.next_if_eq(&i).is_none() {
                unmapped.push((sub, 0));
            } else if i > 0 {
                subpages.push(sub);
            }
        }
        crate::memcontrol::uncharge_batch(mm, &unmapped);
        mm.put_pages_bulk(&unmapped);
        mm.page_alloc().count_vm_event(VmEvent::ThpSplitPage, 1);
        HugeSplit::Split(subpages)
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

/// What `split_huge_page` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HugeSplit {
    /// Split; the mapped sub-pages other than the head, each with its
    /// mapping's reference.
    Split(Vec<Pfn>),
    /// Accessed since the last look: left whole (its accessed bits cleared).
    Referenced,
    /// Not mapped here as its reverse maps say: nothing changed.
    Busy,
}

/// Linux's `pgtable_trans_huge_deposit`: keeps the (zeroed) table `pt` with the
/// huge page `head` until its PMD is split or zapped. The slot holds `pt + 1`
/// (pfn 0 is a frame like any other), 0 when empty.
fn pgtable_trans_huge_deposit(mm: &Mm, head: Pfn, pt: Pfn) {
    let slot = desc(mm, Pfn::new(head.get() + 2)).pmd_huge_pte();
    debug_assert_eq!(slot.load(Ordering::Relaxed), 0);
    slot.store(pt.get() + 1, Ordering::Relaxed);
}

/// The table deposited with the huge page `head`, left in place. Every huge
/// PMD has one (see the module header).
fn pgtable_trans_huge_deposited(mm: &Mm, head: Pfn) -> Pfn {
    let v = desc(mm, Pfn::new(head.get() + 2))
        .pmd_huge_pte()
        .load(Ordering::Relaxed);
    deposited_pfn(head, v)
}

/// Linux's `pgtable_trans_huge_withdraw`: takes back the table deposited with
/// the huge page `head`.
fn pgtable_trans_huge_withdraw(mm: &Mm, head: Pfn) -> Pfn {
    let v = desc(mm, Pfn::new(head.get() + 2))
        .pmd_huge_pte()
        .swap(0, Ordering::Relaxed);
    deposited_pfn(head, v)
}

/// The table of a deposit slot's value `v` (`pt + 1`).
fn deposited_pfn(head: Pfn, v: u64) -> Pfn {
    assert!(
        v != 0,
        "huge page at pfn {} has no deposited table",
        head.get()
    );
    Pfn::new(v - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frame 0 is a frame like any other: a table there is deposited and
    /// withdrawn like one anywhere else (the slot holds `pt + 1`).
    #[test]
    fn deposit_of_frame_zero() {
        let mm = super::super::tests::mm();
        let head = mm.alloc_owned_pages(Gfp::MOVABLE, HPAGE_PMD_ORDER).unwrap();
        for pt in [Pfn::new(0), Pfn::new(7)] {
            pgtable_trans_huge_deposit(&mm, head, pt);
            assert_eq!(pgtable_trans_huge_deposited(&mm, head), pt);
            assert_eq!(pgtable_trans_huge_withdraw(&mm, head), pt);
        }
        mm.free_owned_pages(head, HPAGE_PMD_ORDER).unwrap();
    }
}
