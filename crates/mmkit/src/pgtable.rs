//! Page-table entries and the 4-level radix page table of an address space.
//!
//! The table is x86-64's: four levels of 512 eight-byte entries (9 bits per level),
//! 4 KiB pages, 48-bit addresses, of which the lower half (`0..2^47`) is usable.
//! Levels are numbered from the leaves: 0 = PTE table, 1 = PMD, 2 = PUD, 3 = PGD
//! (the root). Every table page is an order-0 unmovable page from the address
//! space's own allocator (`Gfp::KERNEL | Gfp::ZERO`), read and written only as
//! `[AtomicU64; 512]` through `Mm::page_address`.
//!
//! # Entry layout (one `u64`, [`Pte`])
//!
//! ```text
//!  bit  0      present
//!  bit  1      write
//!  bits 2..5   (free)
//!  bit  5      accessed (set by the access path, like the CPU's A bit)
//!  bit  6      dirty    (set by a write access, like the CPU's D bit)
//!  bit  7      huge: a leaf at PMD level mapping an order-9 (2 MiB) page
//!  bit  8      NUMA hint: with present = 0, the entry still maps its pfn, but the
//!              next access faults (Linux's PROT_NONE-style NUMA hinting fault)
//!  bit  9      compound (software): a PTE mapping one 4 KiB sub-page of an order-9
//!              page whose PMD was split (the block is freed with its last sub-page)
//!  bit 10      migration (software): with present = 0, the page is being migrated
//!  bits 12..52 pfn (40 bits)
//! ```
//!
//! An entry is one of:
//! - **none**: 0.
//! - **present**: bit 0 set. At levels 1..=3 without the huge bit it points to the
//!   next-level table (`present | write | accessed | dirty | pfn`, Linux's
//!   `_PAGE_TABLE`); at level 0, or at level 1 with the huge bit, it maps a page.
//! - **NUMA hint**: bit 0 clear, bit 8 set; the pfn and the other bits are kept, so
//!   the page is still mapped (the reverse map and unmap treat it as present), and
//!   restoring it is clearing bit 8 and setting bit 0 again.
//! - **migration entry**: bit 0 and bit 8 clear, bit 10 set; the pfn and the write,
//!   accessed and dirty bits of the present entry it replaced are kept. Installed
//!   by page migration while it copies the page; an access that finds it waits
//!   until the migrator puts a present entry back. The protocol is described once,
//!   in `migrate.rs`. Only a leaf (level 0) entry ever holds one.
//! - **swap entry**: any other non-zero value (bit 0, bit 8 and bit 10 clear). The swap type
//!   plus one is in bits 1..6 (so types `0..=30` and the entry is never 0), the
//!   offset in bits 12..57; bits 6..12 are 0. Reclaim installs one when it
//!   swaps a page out (`vmscan.rs`); a fault on one swaps the page back in
//!   (`do_swap_page` in `space/swap.rs`).
//!
//! # Invariants
//! - An entry changes from none to something only by `compare_exchange` from 0
//!   (the loser of a race frees what it allocated), and back to none only under
//!   the address space's exclusive VMA lock (see `space/mod.rs`), where nothing else
//!   writes it.
//! - A present leaf becomes a migration entry only by `compare_exchange`, under the
//!   shared VMA lock and the page lock of its frame, and only the migrator that
//!   installed it replaces it (by a present entry to the old or the new frame)
//!   before it releases either lock.
//! - A table page's used count (`Page::pt_used`, its descriptor's `private` word)
//!   counts its non-zero entries; a table whose count drops to 0 is freed by unmap.
//! - A table page is freed only while no walker can reach it: unmap holds the VMA
//!   lock exclusively, and walkers hold it shared for as long as they use a
//!   reference to a table.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::Page;

use crate::{Error, Gfp, Mm, Pfn};

/// Entries per table page (9 bits per level).
pub const PTRS_PER_TABLE: usize = 512;
/// log2 of the span of one PMD entry (2 MiB).
pub const PMD_SHIFT: u32 = 21;
/// Bytes mapped by one PMD entry, the size of a huge page.
pub const PMD_SIZE: u64 = 1 << PMD_SHIFT;
/// Order of a huge page (2 MiB = 512 base pages).
pub const HPAGE_PMD_ORDER: u32 = 9;
/// Base pages in a huge page.
pub const HPAGE_PMD_NR: u64 = 1 << HPAGE_PMD_ORDER;
/// End of the usable (lower-half) virtual address space: `2^47`.
pub const TASK_SIZE: u64 = 1 << 47;

/// Present.
pub const PTE_PRESENT: u64 = 1 << 0;
/// Writable.
pub const PTE_WRITE: u64 = 1 << 1;
/// Accessed since the bit was last cleared.
pub const PTE_ACCESSED: u64 = 1 << 5;
/// Written since the bit was last cleared.
pub const PTE_DIRTY: u64 = 1 << 6;
/// PMD-level leaf mapping an order-9 page.
pub const PTE_HUGE: u64 = 1 << 7;
/// NUMA hinting state (only with `PTE_PRESENT` clear).
pub const PTE_NUMA: u64 = 1 << 8;
/// Software bit: maps a sub-page of a split order-9 page.
pub const PTE_COMPOUND: u64 = 1 << 9;
/// Software bit (with `PTE_PRESENT` and `PTE_NUMA` clear): a migration entry.
pub const PTE_MIGRATION: u64 = 1 << 10;
/// Software bit (with `PTE_PRESENT`): mapped ahead of use by fault-around and
/// not accessed since. The first access clears it instead of setting
/// `PTE_ACCESSED`: that access is the page's insertion, as the faulting
/// access is for the page it faults in (Linux maps prefaulted PTEs old,
/// `arch_wants_old_prefaulted_pte`; here the first access is also not a
/// reuse, so a page touched once is reclaimed at its first look).
pub const PTE_PREFAULT: u64 = 1 << 11;
/// First bit of the pfn.
pub const PTE_PFN_SHIFT: u32 = 12;
/// The pfn bits, 12..52.
pub const PTE_PFN_MASK: u64 = ((1u64 << 40) - 1) << PTE_PFN_SHIFT;

const SWP_TYPE_SHIFT: u32 = 1;
const SWP_TYPE_BITS: u32 = 5;
const SWP_TYPE_MASK: u64 = ((1 << SWP_TYPE_BITS) - 1) << SWP_TYPE_SHIFT;
const SWP_OFFSET_SHIFT: u32 = 12;
const SWP_OFFSET_BITS: u32 = 45;
const SWP_OFFSET_MASK: u64 = ((1u64 << SWP_OFFSET_BITS) - 1) << SWP_OFFSET_SHIFT;

/// A swap entry: which swap device (`ty`) and which slot on it (`offset`).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct SwapEntry {
    ty: u32,
    offset: u64,
}

impl SwapEntry {
    /// Largest swap type (the type is stored plus one in 5 bits).
    pub const MAX_TYPE: u32 = (1 << SWP_TYPE_BITS) - 2;
    /// Largest offset (45 bits).
    pub const MAX_OFFSET: u64 = (1 << SWP_OFFSET_BITS) - 1;

    /// A swap entry, or `None` when `ty > MAX_TYPE` or `offset > MAX_OFFSET`.
    pub const fn new(ty: u32, offset: u64) -> Option<SwapEntry> {
        if ty > Self::MAX_TYPE || offset > Self::MAX_OFFSET {
            return None;
        }
        Some(SwapEntry { ty, offset })
    }
    /// The swap device.
    pub const fn ty(self) -> u32 {
        self.ty
    }
    /// The slot on the device.
    pub const fn offset(self) -> u64 {
        self.offset
    }
}

/// A page-table entry value (see the module header for the layout).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Pte(u64);

impl Pte {
    /// The empty entry.
    pub const NONE: Pte = Pte(0);

    /// From a raw word.
    #[inline]
    pub const fn from_raw(raw: u64) -> Pte {
        Pte(raw)
    }
    /// The raw word.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }
    /// An entry pointing to a next-level table (Linux's `_PAGE_TABLE`).
    #[inline]
    pub const fn table(pfn: Pfn) -> Pte {
        Pte(PTE_PRESENT | PTE_WRITE | PTE_ACCESSED | PTE_DIRTY | (pfn.get() << PTE_PFN_SHIFT))
    }
    /// A present, writable leaf mapping `pfn`; `huge` for a PMD-level order-9 leaf.
    /// Returns `None` if the pfn does not fit in 40 bits.
    #[inline]
    pub const fn page(pfn: Pfn, huge: bool) -> Option<Pte> {
        if pfn.get() >= 1 << 40 {
            return None;
        }
        let h = if huge { PTE_HUGE } else { 0 };
        Some(Pte(PTE_PRESENT
            | PTE_WRITE
            | h
            | (pfn.get() << PTE_PFN_SHIFT)))
    }
    /// A non-present entry holding a swap entry.
    #[inline]
    pub const fn swap(e: SwapEntry) -> Pte {
        Pte((((e.ty + 1) as u64) << SWP_TYPE_SHIFT) | (e.offset << SWP_OFFSET_SHIFT))
    }
    /// The same entry with `bits` set.
    #[inline]
    pub const fn with(self, bits: u64) -> Pte {
        Pte(self.0 | bits)
    }
    /// The same entry with `bits` cleared.
    #[inline]
    pub const fn without(self, bits: u64) -> Pte {
        Pte(self.0 & !bits)
    }
    /// True for the empty entry.
    #[inline]
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
    /// Present bit.
    #[inline]
    pub const fn is_present(self) -> bool {
        self.0 & PTE_PRESENT != 0
    }
    /// Writable.
    #[inline]
    pub const fn is_write(self) -> bool {
        self.0 & PTE_WRITE != 0
    }
    /// Accessed bit.
    #[inline]
    pub const fn is_accessed(self) -> bool {
        self.0 & PTE_ACCESSED != 0
    }
    /// Dirty bit.
    #[inline]
    pub const fn is_dirty(self) -> bool {
        self.0 & PTE_DIRTY != 0
    }
    /// A PMD-level leaf mapping an order-9 page (present or NUMA-hinting).
    #[inline]
    pub const fn is_huge(self) -> bool {
        self.maps_page() && self.0 & PTE_HUGE != 0
    }
    /// Maps a sub-page of a split order-9 page.
    #[inline]
    pub const fn is_compound(self) -> bool {
        self.maps_page() && self.0 & PTE_COMPOUND != 0
    }
    /// The NUMA-hinting state: not present, but still mapping its pfn.
    #[inline]
    pub const fn is_numa_hint(self) -> bool {
        self.0 & (PTE_PRESENT | PTE_NUMA) == PTE_NUMA
    }
    /// Present or NUMA-hinting: the entry maps (or points to) a frame.
    #[inline]
    pub const fn maps_page(self) -> bool {
        self.0 & (PTE_PRESENT | PTE_NUMA) != 0
    }
    /// A swap entry: not none, not present, not a NUMA hint, not a migration entry.
    #[inline]
    pub const fn is_swap(self) -> bool {
        self.0 != 0 && !self.maps_page() && !self.is_migration()
    }
    /// A migration entry: the page (still at [`pfn`](Self::pfn)) is being moved;
    /// accesses wait for the entry to be replaced.
    #[inline]
    pub const fn is_migration(self) -> bool {
        self.0 & (PTE_PRESENT | PTE_NUMA | PTE_MIGRATION) == PTE_MIGRATION
    }
    /// The migration entry replacing a present entry (present cleared, migration
    /// set, the pfn and the other bits kept). Other entries are returned unchanged.
    #[inline]
    pub const fn mk_migration(self) -> Pte {
        if !self.is_present() {
            return self;
        }
        Pte((self.0 & !PTE_PRESENT) | PTE_MIGRATION)
    }
    /// The present entry a migration entry stood for, now mapping `pfn` (the
    /// migrator's final store). Other entries are returned unchanged.
    #[inline]
    pub const fn migration_done(self, pfn: Pfn) -> Pte {
        if !self.is_migration() || pfn.get() >= 1 << 40 {
            return self;
        }
        Pte((self.0 & !(PTE_MIGRATION | PTE_PFN_MASK)) | PTE_PRESENT | (pfn.get() << PTE_PFN_SHIFT))
    }
    /// The frame (meaningful when [`maps_page`](Self::maps_page)).
    #[inline]
    pub const fn pfn(self) -> Pfn {
        Pfn::new((self.0 & PTE_PFN_MASK) >> PTE_PFN_SHIFT)
    }
    /// The swap entry of a swap PTE.
    #[inline]
    pub const fn swap_entry(self) -> Option<SwapEntry> {
        if !self.is_swap() || self.0 & !(SWP_TYPE_MASK | SWP_OFFSET_MASK) != 0 {
            return None;
        }
        let ty = ((self.0 & SWP_TYPE_MASK) >> SWP_TYPE_SHIFT) as u32;
        if ty == 0 {
            return None;
        }
        Some(SwapEntry {
            ty: ty - 1,
            offset: (self.0 & SWP_OFFSET_MASK) >> SWP_OFFSET_SHIFT,
        })
    }
    /// The NUMA-hinting form of a present entry (present cleared, hint set, the
    /// pfn and the other bits kept). Other entries are returned unchanged.
    #[inline]
    pub const fn mk_numa_hint(self) -> Pte {
        if !self.is_present() {
            return self;
        }
        Pte((self.0 & !PTE_PRESENT) | PTE_NUMA)
    }
    /// The present form of a NUMA-hinting entry (what the hinting fault installs).
    /// Other entries are returned unchanged.
    #[inline]
    pub const fn clear_numa_hint(self) -> Pte {
        if !self.is_numa_hint() {
            return self;
        }
        Pte((self.0 & !PTE_NUMA) | PTE_PRESENT)
    }
}

impl fmt::Debug for Pte {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("Pte(none)");
        }
        if let Some(e) = self.swap_entry() {
            return write!(f, "Pte(swap type {} offset {})", e.ty, e.offset);
        }
        if self.is_swap() {
            return write!(f, "Pte(bad {:#x})", self.0);
        }
        write!(f, "Pte(pfn {}", self.pfn().get())?;
        for (bit, name) in [
            (PTE_PRESENT, " P"),
            (PTE_WRITE, " W"),
            (PTE_ACCESSED, " A"),
            (PTE_DIRTY, " D"),
            (PTE_HUGE, " HUGE"),
            (PTE_NUMA, " NUMA"),
            (PTE_COMPOUND, " COMPOUND"),
            (PTE_MIGRATION, " MIGRATION"),
            (PTE_PREFAULT, " PREFAULT"),
        ] {
            if self.0 & bit != 0 {
                f.write_str(name)?;
            }
        }
        f.write_str(")")
    }
}

/// One table page seen as entries.
pub(crate) type Table = [AtomicU64; PTRS_PER_TABLE];

/// log2 of the span of one entry of a level-`level` table.
#[inline]
pub(crate) const fn level_shift(level: u32) -> u32 {
    12 + 9 * level
}

/// Index of `addr` in a level-`level` table.
#[inline]
pub(crate) const fn pt_index(addr: u64, level: u32) -> usize {
    ((addr >> level_shift(level)) & (PTRS_PER_TABLE as u64 - 1)) as usize
}

/// The table page at `pfn`.
///
/// # Safety
/// `pfn` must be a table page of an address space of `mm` (allocated by
/// [`alloc_table`]), and it must stay one for as long as the reference is used:
/// the caller holds the address space's VMA lock (shared or exclusive) or owns the
/// address space outright.
#[inline]
pub(crate) unsafe fn table(mm: &Mm, pfn: Pfn) -> &Table {
    let p = mm.page_address(pfn) as *const Table;
    debug_assert!(!p.is_null());
    // SAFETY: the caller guarantees that the page is a live table page: 4096 bytes
    // inside the arena, page aligned (so aligned for AtomicU64), written only
    // through atomics while it is a table page.
    unsafe { &*p }
}

/// The descriptor of a frame of `mm` (every pfn this module handles is in range).
#[inline]
pub(crate) fn desc(mm: &Mm, pfn: Pfn) -> &Page {
    mm.page_alloc()
        .page(pfn)
        .expect("pfn from a page table lies inside the arena")
}

/// The used-entry count of a table page ([`Page::pt_used`]).
#[inline]
pub(crate) fn used(mm: &Mm, table_pfn: Pfn) -> &AtomicU64 {
    desc(mm, table_pfn).pt_used()
}

/// Allocates a zeroed table page with a used-entry count of 0.
pub(crate) fn alloc_table(mm: &Mm) -> Result<Pfn, Error> {
    let pfn = mm.alloc_owned_pages(Gfp::KERNEL | Gfp::ZERO, 0)?;
    let d = desc(mm, pfn);
    d.pt_used().store(0, Ordering::Relaxed);
    d.mapping.store(0, Ordering::Relaxed);
    Ok(pfn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_roundtrip() {
        let p = Pte::page(Pfn::new(0x12345), false).unwrap();
        assert!(p.is_present() && p.is_write() && !p.is_huge() && !p.is_swap());
        assert_eq!(p.pfn(), Pfn::new(0x12345));
        let h = Pte::page(Pfn::new((1 << 40) - 1), true).unwrap();
        assert!(h.is_huge());
        assert_eq!(h.pfn().get(), (1 << 40) - 1);
        assert!(Pte::page(Pfn::new(1 << 40), false).is_none());
    }

    #[test]
    fn numa_hint_roundtrip() {
        let p = Pte::page(Pfn::new(77), true)
            .unwrap()
            .with(PTE_DIRTY | PTE_ACCESSED);
        let h = p.mk_numa_hint();
        assert!(h.is_numa_hint() && !h.is_present() && !h.is_swap() && h.maps_page());
        assert!(h.is_huge() && h.is_dirty());
        assert_eq!(h.pfn(), Pfn::new(77));
        assert_eq!(h.swap_entry(), None);
        assert_eq!(h.clear_numa_hint(), p);
    }

    #[test]
    fn migration_roundtrip() {
        let p = Pte::page(Pfn::new(123), false)
            .unwrap()
            .with(PTE_DIRTY | PTE_ACCESSED);
        let m = p.mk_migration();
        assert!(m.is_migration() && !m.is_present() && !m.is_swap() && !m.maps_page());
        assert!(!m.is_numa_hint() && m.swap_entry().is_none());
        assert_eq!(m.pfn(), Pfn::new(123));
        let d = m.migration_done(Pfn::new(456));
        assert!(d.is_present() && d.is_dirty() && d.is_accessed() && d.is_write());
        assert!(!d.is_migration());
        assert_eq!(d.pfn(), Pfn::new(456));
        assert_eq!(m.migration_done(Pfn::new(123)), p);
        // Swap entries never read as migration entries.
        let s = Pte::swap(SwapEntry::new(SwapEntry::MAX_TYPE, SwapEntry::MAX_OFFSET).unwrap());
        assert!(!s.is_migration() && s.is_swap());
    }

    #[test]
    fn swap_roundtrip() {
        for (ty, off) in [
            (0, 0),
            (0, 1),
            (SwapEntry::MAX_TYPE, SwapEntry::MAX_OFFSET),
            (5, 12345),
        ] {
            let e = SwapEntry::new(ty, off).unwrap();
            let p = Pte::swap(e);
            assert!(!p.is_none() && p.is_swap() && !p.is_present() && !p.is_numa_hint());
            assert_eq!(p.swap_entry(), Some(e));
        }
        assert!(SwapEntry::new(SwapEntry::MAX_TYPE + 1, 0).is_none());
        assert!(SwapEntry::new(0, SwapEntry::MAX_OFFSET + 1).is_none());
    }

    #[test]
    fn indices() {
        let a = (3u64 << 39) | (5 << 30) | (7 << 21) | (9 << 12) | 0x123;
        assert_eq!(pt_index(a, 3), 3);
        assert_eq!(pt_index(a, 2), 5);
        assert_eq!(pt_index(a, 1), 7);
        assert_eq!(pt_index(a, 0), 9);
    }
}
