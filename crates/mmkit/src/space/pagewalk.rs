//! Walking the page table without allocating (Linux's `mm/pagewalk.c` and
//! `follow_pte`), the per-thread walk cache, and `translate`.
//!
//! Invariants: a walk returns references into table pages that borrow from the
//! `&VmaTree` of a live VMA-lock guard, so they cannot outlive it; a table page is
//! freed only under the exclusive lock. A walk-cache entry is used only while the
//! tree's epoch is the one it was filled in (see [`WalkCache`]).
//!
//! Locking: every walk runs under the space's VMA lock, shared or exclusive; the
//! cached walks (`find_cached`, `follow_pte_cached`) only under the shared lock.
//! Entries are read with Acquire loads; nothing here writes an entry.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::mmap::{MapFlags, Vma, VmaTree};
use super::mmu::not_in_page;
use super::{Space, SpaceInner, Translation};
use crate::migrate::wait_migration;
use crate::pgtable::{pt_index, Pte, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE, TASK_SIZE};
use crate::Pfn;

/// Where the upper levels of a page-table walk end (`walk_upper`).
enum Upper<'a> {
    /// The PTE table's page.
    Table(Pfn),
    /// A huge PMD: its slot and value.
    Huge(&'a AtomicU64, Pte),
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
