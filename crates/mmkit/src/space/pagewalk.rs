//! Walking the page table without allocating (Linux's `mm/pagewalk.c` and
//! `follow_pte`): the one range walker, the single-address lookup, the
//! per-thread walk cache, and `translate`.
//!
//! [`SpaceInner::walk_page_range`] (Linux's `walk_page_range` with
//! `mm_walk_ops`) visits the VMAs that meet a range, in address order, and
//! within each the page table: a huge PMD goes to [`MmWalkOps::pmd_entry`],
//! every entry of a PTE table (empty ones included) to
//! [`MmWalkOps::pte_entry`], and a missing table at any level to
//! [`MmWalkOps::pte_hole`] once, for the whole span it would cover (a missing
//! PGD entry skips 512 GiB in one step). Each callback returns a
//! [`ControlFlow`]; `Break` ends the walk at once and is handed back to the
//! caller. Gaps between VMAs are not reported. Every range walk of the space
//! side goes through it: `change_prot_numa` (and so the NUMA scanner), the
//! scan of `mbind` and swapoff's `unuse`.
//!
//! Invariants: a walk returns references into table pages that borrow from the
//! `&VmaTree` of a live VMA-lock guard, so they cannot outlive it; a table page is
//! freed only under the exclusive lock. A walk-cache entry is used only while the
//! tree's epoch is the one it was filled in (see [`WalkCache`]). An entry handed
//! to a callback was read once (Acquire); under the shared lock it may have
//! changed since, so a callback that writes it does so by compare-and-swap.
//!
//! Locking: every walk runs under the space's VMA lock, shared or exclusive; the
//! cached walks (`find_cached`, `follow_pte_cached`) only under the shared lock.
//! Entries are read with Acquire loads; nothing here writes an entry.

use std::cell::Cell;
pub(super) use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};

use super::mmap::{MapFlags, Vma, VmaTree};
use super::mmu::not_in_page;
use super::{Space, SpaceInner, Translation, PAGE};
use crate::migrate::wait_migration;
use crate::pgtable::{
    level_shift, pt_index, Pte, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE, TASK_SIZE,
};
use crate::Pfn;

/// Where the upper levels of a page-table walk end (`walk_upper`).
enum Upper<'a> {
    /// The PTE table's page.
    Table(Pfn),
    /// A huge PMD: its slot and value.
    Huge(&'a AtomicU64, Pte),
}

/// What a range walk hands its callbacks besides the entry (Linux's
/// `struct mm_walk`): the VMA-lock witness the entries borrow from, and the
/// VMA being walked.
pub(super) struct MmWalk<'a> {
    pub(super) held: &'a VmaTree,
    pub(super) vma: &'a Vma,
}

/// The callbacks of [`SpaceInner::walk_page_range`] (Linux's
/// `struct mm_walk_ops`). `addr` and `next` are clamped to the walked range
/// and VMA: a huge PMD met where the range starts inside it is handed over
/// with `addr` inside it.
pub(super) trait MmWalkOps {
    /// What a callback ends the walk with.
    type Break;

    /// A huge PMD `e` in `slot` mapping `[addr, next)` of the range. Not walked
    /// further. Ignored by default.
    fn pmd_entry(
        &mut self,
        walk: &MmWalk<'_>,
        slot: &AtomicU64,
        e: Pte,
        addr: u64,
        next: u64,
    ) -> ControlFlow<Self::Break> {
        let _ = (walk, slot, e, addr, next);
        ControlFlow::Continue(())
    }

    /// The PTE `e` in `slot` for the page at `addr`, empty entries included.
    fn pte_entry(
        &mut self,
        walk: &MmWalk<'_>,
        slot: &AtomicU64,
        e: Pte,
        addr: u64,
    ) -> ControlFlow<Self::Break>;

    /// `[addr, next)` has no table: the entry at `level` (3: PGD .. 1: PMD)
    /// is not present. Ignored by default.
    fn pte_hole(
        &mut self,
        walk: &MmWalk<'_>,
        addr: u64,
        next: u64,
        level: u32,
    ) -> ControlFlow<Self::Break> {
        let _ = (walk, addr, next, level);
        ControlFlow::Continue(())
    }
}

/// A new, never used walk-cache epoch (0 is never handed out).
pub(super) fn next_gen() -> u64 {
    static NEXT_GEN: AtomicU64 = AtomicU64::new(1);
    NEXT_GEN.fetch_add(1, Ordering::Relaxed)
}

/// The last VMA and the last PTE table this thread found under a shared VMA lock
/// (a software TLB of one entry each, like Linux's old per-thread `vmacache`), so
/// that the accesses of a hot loop skip the VMA tree and the three upper levels
/// of the walk.
///
/// An entry is valid while the tree's epoch (`VmaTree::gen`) is the one it was
/// filled in: VMAs change, and table pages are freed or replaced, only under the
/// exclusive VMA lock, which takes a fresh epoch. So under a shared lock whose
/// epoch matches, no exclusive section ran since the fill: the VMA is still in
/// the tree unchanged and the PMD entry still points to the cached PTE table,
/// which is live. Epochs are unique across spaces, so an entry of another (or a
/// dropped) space never matches. Filled and used only under the shared lock.
#[derive(Copy, Clone)]
struct WalkCache {
    vma_gen: u64,
    vma: Vma,
    pt_gen: u64,
    /// The 2 MiB-aligned range `[pt_base, pt_base + PMD_SIZE)` mapped by `pt`.
    pt_base: u64,
    pt: Pfn,
}

thread_local! {
    static WALK_CACHE: Cell<WalkCache> = const {
        Cell::new(WalkCache {
            vma_gen: 0,
            vma: Vma { start: 0, end: 0, flags: MapFlags::empty(), pol: 0, pgoff: 0 },
            pt_gen: 0,
            // Not 2 MiB aligned: never matches.
            pt_base: u64::MAX,
            pt: Pfn::new(0),
        })
    };
}

impl VmaTree {
    /// The VMA containing `addr`, through this thread's [`WalkCache`]. Only under
    /// the shared VMA lock.
    #[inline]
    pub(super) fn find_cached(&self, addr: u64) -> Option<Vma> {
        let c = WALK_CACHE.with(Cell::get);
        if c.vma_gen == self.gen && c.vma.start <= addr && addr < c.vma.end {
            return Some(c.vma);
        }
        let vma = *self.find(addr)?;
        WALK_CACHE.with(|cell| {
            cell.set(WalkCache {
                vma_gen: self.gen,
                vma,
                ..cell.get()
            })
        });
        Some(vma)
    }
}

impl Space {
    /// What `addr` maps to now, without faulting or touching the accessed bit;
    /// `None` if nothing is mapped there (never touched, or not in a mapping).
    pub fn translate(&self, addr: u64) -> Option<Translation> {
        not_in_page(addr).ok()?;
        if addr >= TASK_SIZE {
            return None;
        }
        let g = self.inner.read_lock();
        loop {
            let (slot, e, level) = self.inner.follow_pte(&g, addr)?;
            if e.is_migration() {
                wait_migration(slot, e);
                continue;
            }
            return e
                .maps_page()
                .then(|| SpaceInner::translation(e, level, addr));
        }
    }
}

impl SpaceInner {
    /// Walks to the leaf entry for `addr` without allocating: the slot and value of
    /// the PTE (level 0) or of a huge PMD (level 1). `None` if a table is missing.
    pub(crate) fn follow_pte<'a>(
        &'a self,
        held: &'a VmaTree,
        addr: u64,
    ) -> Option<(&'a AtomicU64, Pte, u32)> {
        match self.walk_upper(held, addr)? {
            Upper::Huge(slot, e) => Some((slot, e, 1)),
            Upper::Table(pt) => Some(self.pte_of(held, pt, addr)),
        }
    }

    /// Linux's `walk_page_range`: walks `[start, end)` (page aligned) through
    /// `ops`, VMA by VMA in address order (see the module header). Returns the
    /// `Break` of the callback that ended the walk early.
    pub(super) fn walk_page_range<O: MmWalkOps>(
        &self,
        held: &VmaTree,
        start: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        let end = end.min(TASK_SIZE);
        if start >= end {
            return ControlFlow::Continue(());
        }
        // The VMA containing `start`, if any, then those starting before `end`.
        let first = held
            .map
            .range(..=start)
            .next_back()
            .filter(|(_, v)| v.end > start)
            .map_or(start, |(k, _)| *k);
        for vma in held.map.range(first..end).map(|(_, v)| v) {
            let walk = MmWalk { held, vma };
            let (a, b) = (vma.start.max(start), vma.end.min(end));
            self.walk_upper_range(&walk, self.pgd, 3, a, b, ops)?;
        }
        ControlFlow::Continue(())
    }

    /// `[start, end)` through the level-`level` table `table` (3: PGD .. 1:
    /// PMD): Linux's `walk_pgd_range` .. `walk_pmd_range` in one.
    fn walk_upper_range<O: MmWalkOps>(
        &self,
        walk: &MmWalk<'_>,
        table: Pfn,
        level: u32,
        start: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        let t = self.tbl(walk.held, table);
        let mask = (1u64 << level_shift(level)) - 1;
        let mut a = start;
        while a < end {
            let next = ((a | mask) + 1).min(end);
            let slot = &t[pt_index(a, level)];
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if level == 1 && e.is_huge() {
                ops.pmd_entry(walk, slot, e, a, next)?;
            } else if !e.is_present() {
                ops.pte_hole(walk, a, next, level)?;
            } else if level == 1 {
                self.walk_pte_range(walk, e.pfn(), a, next, ops)?;
            } else {
                self.walk_upper_range(walk, e.pfn(), level - 1, a, next, ops)?;
            }
            a = next;
        }
        ControlFlow::Continue(())
    }

    /// Every PTE of `[start, end)` in the PTE table `pt` (Linux's
    /// `walk_pte_range`).
    #[inline]
    fn walk_pte_range<O: MmWalkOps>(
        &self,
        walk: &MmWalk<'_>,
        pt: Pfn,
        start: u64,
        end: u64,
        ops: &mut O,
    ) -> ControlFlow<O::Break> {
        let t = self.tbl(walk.held, pt);
        for a in (start..end).step_by(PAGE as usize) {
            let slot = &t[pt_index(a, 0)];
            ops.pte_entry(walk, slot, Pte::from_raw(slot.load(Ordering::Acquire)), a)?;
        }
        ControlFlow::Continue(())
    }

    /// `follow_pte` through this thread's [`WalkCache`], which it fills when the
    /// walk reaches a PTE table. Only under the shared VMA lock.
    #[inline]
    pub(super) fn follow_pte_cached<'a>(
        &'a self,
        held: &'a VmaTree,
        addr: u64,
    ) -> Option<(&'a AtomicU64, Pte, u32)> {
        let c = WALK_CACHE.with(Cell::get);
        let base = addr & !(PMD_SIZE - 1);
        let pt = if c.pt_gen == held.gen && c.pt_base == base {
            c.pt
        } else {
            match self.walk_upper(held, addr)? {
                Upper::Huge(slot, e) => return Some((slot, e, 1)),
                Upper::Table(pt) => {
                    self.cache_pte_table(held, base, pt);
                    pt
                }
            }
        };
        Some(self.pte_of(held, pt, addr))
    }

    /// The upper three levels of the walk for `addr`: the PTE table, or a huge
    /// PMD; `None` if a table is missing.
    fn walk_upper<'a>(&'a self, held: &'a VmaTree, addr: u64) -> Option<Upper<'a>> {
        let mut t = self.tbl(held, self.pgd);
        let mut pfn = self.pgd;
        for level in [3, 2, 1] {
            let slot = &t[pt_index(addr, level)];
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if level == 1 && e.is_huge() {
                return Some(Upper::Huge(slot, e));
            }
            if !e.is_present() {
                return None;
            }
            pfn = e.pfn();
            t = self.tbl(held, pfn);
        }
        Some(Upper::Table(pfn))
    }

    /// The PTE slot for `addr` in the PTE table `pt`, and its value.
    #[inline]
    fn pte_of<'a>(&'a self, held: &'a VmaTree, pt: Pfn, addr: u64) -> (&'a AtomicU64, Pte, u32) {
        let slot = &self.tbl(held, pt)[pt_index(addr, 0)];
        (slot, Pte::from_raw(slot.load(Ordering::Acquire)), 0)
    }

    /// Remembers that the PMD entry for `base` points to the PTE table `pt` (read
    /// under the shared VMA lock `held`).
    #[inline]
    pub(super) fn cache_pte_table(&self, held: &VmaTree, base: u64, pt: Pfn) {
        WALK_CACHE.with(|cell| {
            cell.set(WalkCache {
                pt_gen: held.gen,
                pt_base: base,
                pt,
                ..cell.get()
            })
        });
    }

    /// What the leaf `e` (at `level`) maps at `addr`.
    pub(super) fn translation(e: Pte, level: u32, addr: u64) -> Translation {
        let sub = (addr >> 12) & (HPAGE_PMD_NR - 1);
        let (pfn, head, order) = if level == 1 {
            let head = e.pfn();
            (Pfn::new(head.get() + sub), head, HPAGE_PMD_ORDER)
        } else if e.is_compound() {
            let pfn = e.pfn();
            (
                pfn,
                Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1)),
                HPAGE_PMD_ORDER,
            )
        } else {
            (e.pfn(), e.pfn(), 0)
        };
        Translation {
            pfn,
            head,
            order,
            huge: level == 1,
            accessed: e.is_accessed(),
            dirty: e.is_dirty(),
            numa_hint: e.is_numa_hint(),
        }
    }
}
