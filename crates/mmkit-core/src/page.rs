//! Page descriptors ("memmap"): one `Page` per 4 KiB frame.
//!
//! Invariants:
//! - A descriptor is at most 32 bytes (checked at compile time), so two share a
//!   cache line and the memmap costs 0.78% of the memory it describes.
//! - Descriptors link to each other by `u32` index into the memmap (`NIL` ends a
//!   list), never by pointer.
//! - `flags` holds the page state; only the *head* of a block carries a state other
//!   than `PageState::None`: a free block on a buddy list is `Buddy` at its head, an
//!   allocated block is `Alloc` at its head, a page the allocator never hands out is
//!   `Reserved`. Interior pages of a block, and pages sitting on a per-CPU list, are
//!   `None`. `free_pages` relies on this: it claims a block by one compare-and-swap
//!   of the head from `Alloc` to `None`, which refuses interior pages, double frees
//!   and wrong orders without taking any lock.
//!
//! Locking: `next`/`prev` and the state of `Buddy` pages are written only under the
//! owning zone's lock. The `Alloc` -> `None` transition happens by CAS by whoever
//! frees the block; `None` -> `Alloc` by the allocating CPU, which owns the page after
//! taking it off a list. `private` and `mapping` belong to the owner of the allocated
//! page (swap-cache entry and reverse map in later layers).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// log2 of the base page size.
pub const PAGE_SHIFT: u32 = 12;
/// Base page size in bytes.
pub const PAGE_SIZE: usize = 1 << PAGE_SHIFT;
/// Largest buddy order (order-10 blocks are 4 MiB), as Linux's `MAX_ORDER` (now `MAX_PAGE_ORDER`).
pub const MAX_ORDER: u32 = 10;
/// Number of buddy orders, 0..=MAX_ORDER.
pub const NR_ORDERS: usize = MAX_ORDER as usize + 1;
/// Pageblock order: the granularity at which a migratetype is recorded.
pub const PAGEBLOCK_ORDER: u32 = 9;
/// Pages per pageblock.
pub const PAGEBLOCK_NR_PAGES: usize = 1 << PAGEBLOCK_ORDER;
/// The list terminator for descriptor links.
pub const NIL: u32 = u32::MAX;

/// A page frame number, relative to the start of the memory an allocator manages.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Pfn(u64);

impl Pfn {
    /// Wraps a raw frame number.
    #[inline]
    pub const fn new(pfn: u64) -> Self {
        Pfn(pfn)
    }
    /// The raw frame number.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// State of a page descriptor (bits 8..11 of `flags`).
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum PageState {
    /// Interior page of a block, or a page on a per-CPU list.
    None = 0,
    /// Head of a free block on a buddy free list.
    Buddy = 1,
    /// Head of an allocated block.
    Alloc = 2,
    /// Never handed out (a hole, or memory set aside).
    Reserved = 3,
}

// flags layout
pub(crate) const FL_ORDER_MASK: u32 = 0xf; // bits 0..4: order
pub(crate) const FL_MT_SHIFT: u32 = 4; // bits 4..7: migratetype
pub(crate) const FL_MT_MASK: u32 = 0x7 << FL_MT_SHIFT;
pub(crate) const FL_STATE_SHIFT: u32 = 8; // bits 8..11: PageState
pub(crate) const FL_STATE_MASK: u32 = 0x7 << FL_STATE_SHIFT;
/// Order-0 buddy page freed without trying to merge (lazy merging).
pub(crate) const PG_MERGE_SKIPPED: u32 = 1 << 11;
/// At an allocated head: the block belongs to the layer above (an address
/// space's data or table page, a swap-cache page), allocated with
/// `alloc_owned_pages`; `free_pages` refuses it (`Claim::User`).
pub const PG_OWNED: u32 = 1 << 12;
/// Bits 16.. are for the layers above (LRU, swap cache, dirty, ...).
pub const PG_LRU: u32 = 1 << 16;
/// The page is in the swap cache; `private` holds its swap entry.
pub const PG_SWAPCACHE: u32 = 1 << 17;
/// The page has been written since it was last cleaned.
pub const PG_DIRTY: u32 = 1 << 18;

#[inline]
pub(crate) const fn mk_flags(state: PageState, order: u32, mt: u32) -> u32 {
    ((state as u32) << FL_STATE_SHIFT) | (mt << FL_MT_SHIFT) | order
}
#[inline]
pub(crate) const fn fl_state(f: u32) -> u32 {
    (f & FL_STATE_MASK) >> FL_STATE_SHIFT
}
#[inline]
pub(crate) const fn fl_order(f: u32) -> u32 {
    f & FL_ORDER_MASK
}
#[inline]
pub(crate) const fn fl_mt(f: u32) -> usize {
    ((f & FL_MT_MASK) >> FL_MT_SHIFT) as usize
}

/// One page descriptor (Linux's `struct page`), 32 bytes.
#[repr(C, align(32))]
#[derive(Default)]
pub struct Page {
    /// State, order, migratetype and page flags (see the `FL_*`/`PG_*` layout).
    pub(crate) flags: AtomicU32,
    /// Reference count of an allocated head (1 after allocation).
    pub(crate) refcount: AtomicU32,
    /// Next descriptor on a buddy (later: LRU) list.
    pub(crate) next: AtomicU32,
    /// Previous descriptor on a buddy (later: LRU) list.
    pub(crate) prev: AtomicU32,
    /// Owner's word: the swap entry of a swap-cache page.
    pub private: AtomicU64,
    /// Owner's word: the reverse map (address-space id and virtual page).
    pub mapping: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<Page>() <= 32);

impl Page {
    /// A descriptor for a reserved frame.
    pub fn reserved() -> Self {
        let p = Page::default();
        p.flags
            .store(mk_flags(PageState::Reserved, 0, 0), Ordering::Relaxed);
        p
    }
    /// The state of this descriptor.
    #[inline]
    pub fn state(&self) -> PageState {
        match fl_state(self.flags.load(Ordering::Relaxed)) {
            1 => PageState::Buddy,
            2 => PageState::Alloc,
            3 => PageState::Reserved,
            _ => PageState::None,
        }
    }
    /// Order recorded in the descriptor (meaningful for `Buddy` and `Alloc` heads).
    #[inline]
    pub fn order(&self) -> u32 {
        fl_order(self.flags.load(Ordering::Relaxed))
    }
    /// Reference count.
    #[inline]
    pub fn refcount(&self) -> &AtomicU32 {
        &self.refcount
    }
    /// Sets page flag bits (`PG_*` above bit 16) on an allocated page.
    #[inline]
    pub fn set_flag(&self, bit: u32) {
        debug_assert!(bit >= PG_LRU);
        self.flags.fetch_or(bit, Ordering::AcqRel);
    }
    /// Clears page flag bits (`PG_*` above bit 16) on an allocated page.
    #[inline]
    pub fn clear_flag(&self, bit: u32) {
        debug_assert!(bit >= PG_LRU);
        self.flags.fetch_and(!bit, Ordering::AcqRel);
    }
    /// Tests page flag bits.
    #[inline]
    pub fn test_flag(&self, bit: u32) -> bool {
        self.flags.load(Ordering::Acquire) & bit != 0
    }
    #[inline]
    pub(crate) fn next(&self) -> u32 {
        self.next.load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn prev(&self) -> u32 {
        self.prev.load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn set_next(&self, v: u32) {
        self.next.store(v, Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn set_prev(&self, v: u32) {
        self.prev.store(v, Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn raw_flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }
    #[inline]
    pub(crate) fn set_raw_flags(&self, f: u32) {
        self.flags.store(f, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_is_32_bytes() {
        assert_eq!(core::mem::size_of::<Page>(), 32);
    }

    #[test]
    fn flags_roundtrip() {
        let f = mk_flags(PageState::Alloc, 7, 2);
        assert_eq!(fl_state(f), PageState::Alloc as u32);
        assert_eq!(fl_order(f), 7);
        assert_eq!(fl_mt(f), 2);
    }
}
