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
//! page. Each field of [`Page`] says who may write it and under which lock.

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
/// Bits 16.. are for the layers above (LRU, swap cache, dirty, ...), each
/// with who writes it (locking letters: see [`Page`]); every one is read
/// without a lock too (a snapshot), and a free clears them all.
///
/// `PG_LRU`: (L) set and cleared with the page's link, under its shard's LRU
/// lock (mmkit's `lru.rs`).
pub const PG_LRU: u32 = 1 << 16;
/// The page is in the swap cache; `private` holds its swap entry. (P)
pub const PG_SWAPCACHE: u32 = 1 << 17;
/// The page has been written since it was last cleaned. (P), (O) while the
/// page is unmapped and its owner's alone (migration's new page).
pub const PG_DIRTY: u32 = 1 << 18;
/// A page read ahead into the swap cache and not yet mapped by a fault
/// (Linux's `PG_readahead` as swap uses it: its first fault is a `swap_ra_hit`).
/// (P)
pub const PG_READAHEAD: u32 = 1 << 19;
/// The page is queued on a per-CPU `lru_add` batch (set when queued, cleared
/// when the batch drains). A free clears it with every flag, so an entry left
/// in a batch after its page was freed (migrated, unmapped) never links the
/// page's next incarnation (Linux's batches hold a reference instead). Set
/// (O) by the faulting owner as it queues the page, cleared (L) by the drain.
pub const PG_LRU_ADD: u32 = 1 << 20;
/// Bits 22..32 of `flags` of a mapped data page (the head of a huge one): its
/// last accessor for NUMA balancing (Linux's `last_cpupid` in the page flags),
/// packed by mmkit's `numa_balancing::Cpupid::to_page_bits` (valid, node mod 8,
/// the low 6 bits of the thread id). Written by the hint fault with
/// [`Page::xchg_last_cpupid`] (CAS on the whole word, so the other bits are
/// kept): (C) under (P), while the page is still mapped, since a write after
/// the page was freed would leave these bits on a free frame.
pub const LAST_CPUPID_SHIFT: u32 = 22;
/// Width of the last-accessor field.
pub const LAST_CPUPID_BITS: u32 = 10;
const LAST_CPUPID_MASK: u32 = ((1 << LAST_CPUPID_BITS) - 1) << LAST_CPUPID_SHIFT;

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
///
/// Who may write each field, and under which lock, in the locking letters
/// whose one legend is in the header of mmkit's `rmap.rs` (after FreeBSD's
/// `vm_page.h`): here (A) atomic, (C) compare-and-swap, (O) the block's
/// owner, (Z) the zone lock, (P) the page lock, (L) the LRU lock; the other
/// structs of this crate also use (Q), the per-CPU list lock.
///
/// The `private` word has one meaning per kind of owner, each with a named
/// accessor that every site uses: [`pt_used`](Page::pt_used) (a page-table
/// page), [`nr_pages_mapped`](Page::nr_pages_mapped) (the first tail page of a
/// split huge page), [`swap_entry`](Page::swap_entry) (a swap-cache page).
#[repr(C, align(32))]
#[derive(Default)]
pub struct Page {
    /// (A; state bits Z/C) State, order, migratetype and page flags (see the
    /// `FL_*`/`PG_*` layout). State, order, migratetype and `PG_OWNED`: (Z) for
    /// `Buddy` heads, (C) for `Alloc` <-> `None` (`PG_OWNED` is written with the
    /// state when an owned block is handed out). The `PG_*` bits from 16 up and
    /// the last-cpupid field: as each constant says.
    pub(crate) flags: AtomicU32,
    /// (A) Reference count of an allocated head (1 after allocation): get/put by
    /// anyone holding a reference; set by the allocator when it hands out.
    pub(crate) refcount: AtomicU32,
    /// (Z) Next descriptor on a buddy free list. (The LRU lists of allocated
    /// pages keep their links in arrays of their own, `lru::LruLinks`.)
    pub(crate) next: AtomicU32,
    /// (Z) Previous descriptor on a buddy free list.
    pub(crate) prev: AtomicU32,
    /// (O) The owner's word; see the accessors for its meanings.
    pub(crate) private: AtomicU64,
    /// (O; read A) The reverse map of a mapped page (address-space id and
    /// virtual page, mmkit's `rmap.rs`): set by the fault path before the page
    /// is mapped, cleared by unmap (exclusive VMA lock) or by migration (P) after
    /// it is unmapped; read by page-side code without a lock.
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
    /// Replaces the last-accessor field (bits 22..32 of `flags`, see
    /// [`LAST_CPUPID_SHIFT`]) by the low [`LAST_CPUPID_BITS`] of `v`; returns the
    /// previous field. (P): a hint fault, under the page lock while its entry
    /// still maps the page (mmkit's `space/task_numa.rs`); (O): a migration's
    /// new page before it is mapped.
    #[inline]
    pub fn xchg_last_cpupid(&self, v: u32) -> u32 {
        let new = (v << LAST_CPUPID_SHIFT) & LAST_CPUPID_MASK;
        let old = self
            .flags
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                Some((f & !LAST_CPUPID_MASK) | new)
            })
            .unwrap_or_else(|f| f);
        (old & LAST_CPUPID_MASK) >> LAST_CPUPID_SHIFT
    }
    /// `private` of a page-table page: its used-entry count, the number of
    /// non-zero entries (Linux keeps this in `struct ptdesc`). (O): raised by CAS
    /// installers under the space's shared VMA lock, lowered and reset under its
    /// exclusive lock.
    #[inline]
    pub fn pt_used(&self) -> &AtomicU64 {
        &self.private
    }
    /// `private` of the first tail page of an order-9 page whose PMD was split:
    /// how many of its 512 sub-pages are still mapped (Linux's
    /// `_nr_pages_mapped`), 0 while the page is mapped whole by one PMD. (O):
    /// set by the huge fault and the split, lowered by unmap (exclusive VMA lock);
    /// the block is freed when it reaches 0.
    #[inline]
    pub fn nr_pages_mapped(&self) -> &AtomicU64 {
        &self.private
    }
    /// `private` of the second tail page (head + 2) of an order-9 page mapped
    /// by one PMD: the pfn of the PTE table deposited for its split plus one
    /// (Linux's `pgtable_trans_huge_deposit`), 0 when none. (O): set by the huge fault
    /// before the PMD is published, taken back by the split or the zap of that
    /// PMD (exclusive VMA lock).
    #[inline]
    pub fn pmd_huge_pte(&self) -> &AtomicU64 {
        &self.private
    }
    /// `private` of a swap-cache page (`PG_SWAPCACHE` set): its swap entry, raw
    /// (Linux's `folio->swap`). (P): set and cleared with `PG_SWAPCACHE`
    /// under the page lock (mmkit's `swapcache_add`/`swapcache_drop`).
    #[inline]
    pub fn swap_entry(&self) -> &AtomicU64 {
        &self.private
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
