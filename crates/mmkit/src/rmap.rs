//! The reverse map: from a page frame back to the address space and virtual page
//! that map it (Linux's anon rmap, reduced to one mapping per page, since an
//! address space has no fork), and the registry of address-space ids.
//!
//! Encoding: a mapped page's descriptor `mapping` word holds
//! `space_id << 35 | virtual page number` (35 bits of vpn cover `0..2^47`); 0 means
//! "not mapped" (space ids start at 1). Which descriptor holds it:
//! - an order-0 page: its own;
//! - an order-9 page mapped by a huge PMD: the head only (interior `mapping`s are
//!   0); a lookup of an interior pfn adds its offset to the head's address;
//! - an order-9 page whose PMD was split into 512 PTEs: every sub-page its own,
//!   and the first tail page's `private` word counts the sub-pages still mapped
//!   (non-zero exactly while the page is split and mapped; Linux keeps such
//!   counts in the first tail page too).
//!
//! Invariants: `mapping` is set before the PTE that maps the page is installed and
//! cleared after it is cleared, before the page is freed; a page the allocator hands
//! out to anyone else therefore has `mapping == 0` (table pages clear it anyway).
//!
//! Locking: the words are atomics written by the fault path (before the page is
//! visible) and by unmap (under the address space's exclusive VMA lock); a lookup
//! is a racy snapshot, exact while the caller keeps the page from being unmapped.
//! The id registry is a mutex-protected slot table of weak references, taken only
//! when an address space is created or dropped, or resolved from an id.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use mmkit_core::PageState;

use crate::pgtable::{desc, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use crate::space::{Space, SpaceInner};
use crate::{Error, Mm, Pfn, PAGE_SIZE};

const VPN_BITS: u32 = 35;
const VPN_MASK: u64 = (1 << VPN_BITS) - 1;
/// Largest space id that fits the encoding.
const MAX_SPACE_ID: u64 = (1 << (64 - VPN_BITS)) - 1;

/// The `mapping` word for page `vaddr` of space `space_id`.
#[inline]
pub(crate) const fn encode(space_id: u64, vaddr: u64) -> u64 {
    (space_id << VPN_BITS) | ((vaddr >> 12) & VPN_MASK)
}

/// `(space_id, vaddr)` of a `mapping` word, or `None` for 0.
#[inline]
pub(crate) const fn decode(m: u64) -> Option<(u64, u64)> {
    if m == 0 {
        return None;
    }
    Some((m >> VPN_BITS, (m & VPN_MASK) << 12))
}

/// Records that `pfn` is mapped at `vaddr` in space `space_id`.
#[inline]
pub(crate) fn set(mm: &Mm, pfn: Pfn, space_id: u64, vaddr: u64) {
    desc(mm, pfn)
        .mapping
        .store(encode(space_id, vaddr), Ordering::Release);
}

/// Records that `pfn` is no longer mapped.
#[inline]
pub(crate) fn clear(mm: &Mm, pfn: Pfn) {
    desc(mm, pfn).mapping.store(0, Ordering::Release);
}

impl Mm {
    /// Where the frame `pfn` is mapped: `(space_id, vaddr)` of the 4 KiB page,
    /// or `None` when no address space maps it (free, a table page, allocated
    /// directly with `alloc_pages`, or outside the arena). For a sub-page of a huge
    /// page it is the sub-page's own address.
    pub fn rmap_lookup(&self, pfn: Pfn) -> Option<(u64, u64)> {
        let d = self.page_alloc().page(pfn)?;
        if let Some(r) = decode(d.mapping.load(Ordering::Acquire)) {
            return Some(r);
        }
        // An interior page of a huge page mapped by one PMD.
        let head = Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1));
        if head == pfn {
            return None;
        }
        let h = desc(self, head);
        if h.state() != PageState::Alloc || h.order() != HPAGE_PMD_ORDER {
            return None;
        }
        // Split: every mapped sub-page has its own word, and this one had none.
        if desc(self, Pfn::new(head.get() + 1))
            .private
            .load(Ordering::Acquire)
            != 0
        {
            return None;
        }
        let (id, va) = decode(h.mapping.load(Ordering::Acquire))?;
        Some((id, va + (pfn.get() - head.get()) * PAGE_SIZE as u64))
    }
}

struct Registry {
    slots: Vec<Option<Weak<SpaceInner>>>,
    free: Vec<u64>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: Vec::new(),
    free: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reserves a space id (ids are reused after the space is dropped).
pub(crate) fn reserve_id() -> Result<u64, Error> {
    let mut r = registry();
    if let Some(id) = r.free.pop() {
        return Ok(id);
    }
    let id = r.slots.len() as u64 + 1;
    if id > MAX_SPACE_ID {
        return Err(Error::Config(format!(
            "too many address spaces alive (at most {MAX_SPACE_ID}); drop some first"
        )));
    }
    r.slots.push(None);
    Ok(id)
}

/// Publishes the space behind a reserved id.
pub(crate) fn publish(id: u64, space: &Arc<SpaceInner>) {
    let mut r = registry();
    r.slots[id as usize - 1] = Some(Arc::downgrade(space));
}

/// Gives an id back (the space is being dropped, or was never built).
pub(crate) fn release_id(id: u64) {
    let mut r = registry();
    r.slots[id as usize - 1] = None;
    r.free.push(id);
}

/// The live space with this id (for compaction and reclaim, which start from a
/// frame's reverse map).
pub(crate) fn space_by_id(id: u64) -> Option<Space> {
    let r = registry();
    let w = r.slots.get(id.checked_sub(1)? as usize)?.as_ref()?;
    w.upgrade().map(Space::from_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_roundtrip() {
        let va = (1u64 << 47) - 4096;
        assert_eq!(decode(encode(MAX_SPACE_ID, va)), Some((MAX_SPACE_ID, va)));
        assert_eq!(decode(encode(1, 0)), Some((1, 0)));
        assert_eq!(decode(0), None);
    }
}
