//! Mappings (Linux's `mm/mmap.c` and the VMA tree): [`MapFlags`], the VMAs of a
//! space, finding room for a new one, and `mmap` / `munmap`.
//!
//! Invariants: the VMAs of a tree never overlap, are page aligned and lie inside
//! `[MMAP_BASE, TASK_SIZE)`; a [`MapFlags::HUGE`] VMA starts 2 MiB aligned. `munmap`
//! changes nothing when it fails: the one step that can fail (splitting a huge PMD
//! that straddles an end, `huge_memory.rs`) runs before anything is detached.
//!
//! Locking: the tree is the data of the space's VMA lock (`mod.rs`): read under the
//! shared lock, changed only under the exclusive one, which `mmap` and `munmap`
//! take (the zap of `zap.rs` runs under that same hold).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::sync::atomic::Ordering;

use super::mmu::not_in_page;
use super::zap::{MmuGather, FREE_UPPER};
use super::{Space, SpaceInner, MMAP_BASE, PAGE};
use crate::pgtable::{PMD_SIZE, TASK_SIZE};
use crate::Error;

/// Flags of a mapping.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct MapFlags(u32);

impl MapFlags {
    /// Eligible for order-9 (2 MiB) pages, with fallback to order 0. The mapping
    /// is 2 MiB aligned.
    pub const HUGE: MapFlags = MapFlags(1 << 0);
    const ALL: u32 = Self::HUGE.0;

    /// No flags.
    pub const fn empty() -> MapFlags {
        MapFlags(0)
    }
    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Flags from raw bits, `None` if an unknown bit is set.
    pub const fn from_bits(bits: u32) -> Option<MapFlags> {
        if bits & !Self::ALL != 0 {
            None
        } else {
            Some(MapFlags(bits))
        }
    }
    /// True when every flag of `other` is set.
    pub const fn contains(self, other: MapFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// True when no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for MapFlags {
    type Output = MapFlags;
    fn bitor(self, rhs: MapFlags) -> MapFlags {
        MapFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for MapFlags {
    fn bitor_assign(&mut self, rhs: MapFlags) {
        self.0 |= rhs.0
    }
}

impl fmt::Debug for MapFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.contains(MapFlags::HUGE) {
            f.write_str("MapFlags(HUGE)")
        } else {
            f.write_str("MapFlags(empty)")
        }
    }
}

// ---------------------------------------------------------------------------------
// VMAs
// ---------------------------------------------------------------------------------

/// One mapping, `[start, end)`, page aligned (Linux's `vm_area_struct`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) struct Vma {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) flags: MapFlags,
    /// The range's memory policy: an index into the space's policy table
    /// (`mempolicy.rs`); 0 = none, the space's policy applies.
    pub(super) pol: u32,
    /// The address page offsets of the policy count from (interleave): the
    /// mapping's start, or the start of the `mbind` range. Kept by splits.
    pub(super) pgoff: u64,
}

/// The VMAs of a space, by start address, and where the next search for room
/// starts (Linux's old `free_area_cache`).
#[derive(Default)]
pub(crate) struct VmaTree {
    pub(super) map: BTreeMap<u64, Vma>,
    hint: u64,
    /// The epoch of the tree and of the table pages above the leaves: a value
    /// from `pagewalk::next_gen`, unique among all spaces, replaced each time the
    /// VMA lock is taken exclusively (see `pagewalk.rs`, `WalkCache`).
    pub(super) gen: u64,
}

impl VmaTree {
    /// An empty tree whose searches for room start at `hint`, in epoch `gen`.
    pub(super) fn new(hint: u64, gen: u64) -> VmaTree {
        VmaTree {
            map: BTreeMap::new(),
            hint,
            gen,
        }
    }

    /// The VMA containing `addr`.
    pub(super) fn find(&self, addr: u64) -> Option<&Vma> {
        self.map
            .range(..=addr)
            .next_back()
            .map(|(_, v)| v)
            .filter(|v| addr < v.end)
    }

    /// Is every byte of `[start, end)` inside some VMA?
    pub(super) fn covers(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            match self.find(at) {
                Some(v) => at = v.end,
                None => return false,
            }
        }
        true
    }

    /// First `align`-aligned gap of `len` bytes at or above `from`.
    fn find_gap(&self, from: u64, len: u64, align: u64) -> Option<u64> {
        let mut cand = align_up(from.max(MMAP_BASE), align)?;
        let first = self
            .map
            .range(..=cand)
            .next_back()
            .map_or(cand, |(k, _)| *k);
        for v in self.map.range(first..).map(|(_, v)| v) {
            if v.end <= cand {
                continue;
            }
            if cand.checked_add(len)? <= v.start {
                return Some(cand);
            }
            cand = align_up(v.end, align)?;
        }
        (cand.checked_add(len)? <= TASK_SIZE).then_some(cand)
    }

    /// Linux's `get_unmapped_area`: from the hint, then from the bottom.
    pub(super) fn get_unmapped_area(&self, len: u64, align: u64) -> Option<u64> {
        self.find_gap(self.hint, len, align)
            .or_else(|| self.find_gap(MMAP_BASE, len, align))
    }

    /// Splits the VMA containing `addr` into `[start, addr)` and `[addr, end)`
    /// (Linux's `split_vma`); nothing when `addr` starts a VMA or is unmapped.
    pub(super) fn split_at(&mut self, addr: u64) {
        let Some(v) = self.find(addr).copied().filter(|v| v.start < addr) else {
            return;
        };
        self.map.insert(v.start, Vma { end: addr, ..v });
        self.map.insert(addr, Vma { start: addr, ..v });
    }

    /// Removes `[start, end)` from the VMAs, splitting those that straddle an end.
    pub(super) fn detach(&mut self, start: u64, end: u64) {
        let hit: Vec<Vma> = self
            .map
            .range(..end)
            .rev()
            .map(|(_, v)| *v)
            .take_while(|v| v.end > start)
            .collect();
        for v in hit {
            self.map.remove(&v.start);
            if v.start < start {
                self.map.insert(v.start, Vma { end: start, ..v });
            }
            if v.end > end {
                self.map.insert(end, Vma { start: end, ..v });
            }
        }
        self.hint = self.hint.min(start);
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), `None` on overflow.
pub(super) const fn align_up(x: u64, align: u64) -> Option<u64> {
    match x.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

/// `[addr, addr + len)` is a non-empty range inside `0..2^47`; returns its end.
pub(super) fn check_range(addr: u64, len: u64) -> Result<u64, Error> {
    if len == 0 {
        return Err(bad(addr, len, "zero length"));
    }
    match addr.checked_add(len) {
        Some(end) if end <= TASK_SIZE => Ok(end),
        Some(_) => Err(bad(
            addr,
            len,
            "range leaves the user address space (0..2^47)",
        )),
        None => Err(bad(addr, len, "range wraps around the address space")),
    }
}

/// A range given to `munmap` or `mbind`: `addr` page aligned (else refused with
/// `unaligned` as the reason), `len` non-zero and rounded up to 4 KiB, the whole
/// inside `0..2^47`; returns its end.
pub(super) fn page_range(addr: u64, len: u64, unaligned: &'static str) -> Result<u64, Error> {
    if addr & (PAGE - 1) != 0 {
        return Err(bad(addr, len, unaligned));
    }
    if len == 0 {
        return Err(bad(addr, len, "zero length"));
    }
    align_up(len, PAGE)
        .ok_or_else(|| bad(addr, len, "range wraps around the address space"))
        .and_then(|l| check_range(addr, l))
}

pub(super) fn bad(addr: u64, len: u64, reason: &'static str) -> Error {
    Error::BadAddress { addr, len, reason }
}

impl Space {
    /// Maps `len` bytes (rounded up to 4 KiB) of anonymous, zero-filled memory and
    /// returns its address (page aligned; 2 MiB aligned with [`MapFlags::HUGE`]).
    /// Nothing is allocated until the pages are touched.
    pub fn mmap(&self, len: usize, flags: MapFlags) -> Result<u64, Error> {
        not_in_page(0)?;
        let len = len as u64;
        if len == 0 {
            return Err(bad(0, 0, "zero length"));
        }
        let Some(len_r) = align_up(len, PAGE).filter(|l| *l <= TASK_SIZE - MMAP_BASE) else {
            return Err(Error::AddressSpaceFull { len });
        };
        let align = if flags.contains(MapFlags::HUGE) {
            PMD_SIZE
        } else {
            PAGE
        };
        let mut g = self.inner.write_lock();
        let addr = g
            .get_unmapped_area(len_r, align)
            .ok_or(Error::AddressSpaceFull { len })?;
        g.map.insert(
            addr,
            Vma {
                start: addr,
                end: addr + len_r,
                flags,
                pol: 0,
                pgoff: addr,
            },
        );
        g.hint = addr + len_r;
        self.inner
            .nr_vmas
            .store(g.map.len() as u64, Ordering::Relaxed);
        Ok(addr)
    }

    /// Unmaps `[addr, addr + len)` (`addr` page aligned, `len` rounded up to 4 KiB):
    /// any part of one or more mappings, which are split as needed; holes in the
    /// range are fine. The pages are freed in batches and table pages that became
    /// empty with them. Refused (changing nothing) for a zero length, an unaligned
    /// address, a range that wraps or leaves `0..2^47`, or no memory for splitting
    /// a huge page that straddles an end of the range.
    pub fn munmap(&self, addr: u64, len: usize) -> Result<(), Error> {
        self.munmap_parallel(addr, len, 1)
    }

    /// As [`munmap`](Self::munmap), zapping the range on `threads` threads (parts
    /// split at 2 MiB boundaries, each thread freeing its pages and PTE tables in its
    /// own batches), then freeing the upper-level tables on this thread.
    pub fn munmap_parallel(&self, addr: u64, len: usize, threads: usize) -> Result<(), Error> {
        not_in_page(addr)?;
        let end = page_range(addr, len as u64, "munmap address is not page aligned")?;
        let mut g = self.inner.write_lock();
        self.inner.do_munmap(&mut g, addr, end, threads.max(1))
    }

    /// The mappings, `(start, end, flags)` in address order (like `/proc/pid/maps`).
    pub fn mappings(&self) -> Vec<(u64, u64, MapFlags)> {
        if not_in_page(0).is_err() {
            return Vec::new();
        }
        let g = self.inner.read_lock();
        g.map.values().map(|v| (v.start, v.end, v.flags)).collect()
    }
}

impl SpaceInner {
    /// Linux's `do_munmap` with the VMA lock held exclusively.
    pub(super) fn do_munmap(
        &self,
        g: &mut VmaTree,
        start: u64,
        end: u64,
        threads: usize,
    ) -> Result<(), Error> {
        // Split huge pages straddling an end first. A split takes the table
        // deposited with the huge page, so nothing here needs memory: once the
        // range is validated, munmap cannot fail half way.
        for b in [start, end] {
            if b & (PMD_SIZE - 1) != 0 && b < TASK_SIZE {
                self.split_huge_pmd(g, b);
            }
        }
        g.detach(start, end);
        self.nr_vmas.store(g.map.len() as u64, Ordering::Relaxed);
        let held: &VmaTree = g;
        if threads > 1 {
            self.zap_parallel(held, start, end, threads);
            self.free_pgtables(held, start, end);
        } else {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(held, start, end, FREE_UPPER, &mut tlb);
        }
        Ok(())
    }
}
