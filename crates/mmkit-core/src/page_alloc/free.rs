//! Frees and reference counts: validation of a free by one compare-and-swap of
//! the head descriptor, ownership (`Claim`: a caller may free only what
//! `alloc_pages` handed out, never a block carrying `PG_OWNED`), `get_page` /
//! `put_page`, and the batched put of an mmu_gather (`put_pages_bulk`).
//! `put_page_testzero` is the one place a reference count reaches zero.
//!
//! Free validation: `free_pages` claims the block by one compare-and-swap of its
//! head descriptor from `Alloc` (with the caller's order) to `None`. Anything
//! else (a free page, an interior page, a double free racing with itself, a wrong
//! order, an owned block freed by a user) is refused before any list is touched.
//!
//! Locking: the claim takes no lock; the freed block then goes through the
//! per-CPU path (`pcplist.rs`) or the zone lock.

use core::sync::atomic::Ordering;

use super::{Claim, FreeError, PageAlloc};
use crate::gfp::MIGRATE_PCPTYPES;
use crate::page::{
    fl_mt, fl_order, fl_state, mk_flags, PageState, Pfn, FL_ORDER_MASK, FL_STATE_MASK, MAX_ORDER,
    PG_OWNED,
};
use crate::pcp::{PcpGuard, PCP_MAX_ORDER};
use crate::platform::Platform;
use crate::stat::VmEvent;

impl<P: Platform> PageAlloc<P> {
    /// Frees a block allocated with `order` by a caller of `alloc_pages`
    /// ([`Claim::User`]: a block of the layer above is refused). Refuses bad
    /// input without changing anything.
    #[inline(always)]
    pub fn free_pages(&self, pfn: Pfn, order: u32) -> Result<(), FreeError> {
        self.free_pages_as(pfn, order, Claim::User)
    }

    /// Frees a block as `who`: the layer above frees its own blocks (allocated
    /// with [`Self::alloc_owned_pages`]) with [`Claim::Owner`].
    #[inline]
    pub fn free_pages_claim(&self, pfn: Pfn, order: u32, who: Claim) -> Result<(), FreeError> {
        self.free_pages_as(pfn, order, who)
    }

    /// The free proper: inlined whole into the callers (the claim and the
    /// cache push are the order-0 fast path; the rest is out of line).
    #[inline(always)]
    fn free_pages_as(&self, pfn: Pfn, order: u32, who: Claim) -> Result<(), FreeError> {
        match self.claim_for_free(pfn, order, who) {
            Ok(mt) => {
                self.free_claimed(pfn.get() as u32, order, mt);
                Ok(())
            }
            Err(e) => Err(self.free_invalid(e)),
        }
    }

    /// Counts a refused free.
    #[cold]
    #[inline(never)]
    fn free_invalid(&self, e: FreeError) -> FreeError {
        self.events[self.cpu()].inc(VmEvent::FreeInvalid);
        e
    }

    /// Validates a free and takes ownership of the block; returns its migratetype.
    #[inline(always)]
    pub(crate) fn claim_for_free(
        &self,
        pfn: Pfn,
        order: u32,
        who: Claim,
    ) -> Result<usize, FreeError> {
        if order > MAX_ORDER {
            return Err(FreeError::InvalidOrder);
        }
        let idx = pfn.get();
        // The descriptor array holds exactly `nr_pages` entries: its bounds
        // check is the range check.
        let Some(page) = self.mem.pages.get(idx as usize) else {
            return Err(FreeError::OutOfRange);
        };
        if idx & ((1 << order) - 1) != 0 {
            return Err(FreeError::Misaligned);
        }
        // State, order and (for a user) `PG_OWNED` in one compare: an
        // allocated head of `order` that the claimant may free. Anything else
        // is classified out of line.
        let mask = FL_STATE_MASK | FL_ORDER_MASK | if who == Claim::User { PG_OWNED } else { 0 };
        let want = mk_flags(PageState::Alloc, order, 0);
        let mut f = page.flags.load(Ordering::Relaxed);
        loop {
            if f & mask != want {
                return Err(refused_claim(f, who));
            }
            // Whoever unmaps a page for good takes it off the LRU first.
            debug_assert!(
                f & crate::page::PG_LRU == 0,
                "freeing pfn {idx}, still on an LRU list"
            );
            match page
                .flags
                .compare_exchange_weak(f, 0, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => f = now,
            }
        }
        page.refcount.store(0, Ordering::Relaxed);
        Ok(fl_mt(f))
    }

    /// The order of the allocated block headed by `pfn` if a caller of
    /// `alloc_pages` may hold a reference on it: in range, the head of an
    /// allocated block with a reference, not a block of the layer above.
    pub fn user_block_order(&self, pfn: Pfn) -> Result<u32, FreeError> {
        let p = self.page(pfn).ok_or(FreeError::OutOfRange)?;
        let f = p.flags.load(Ordering::Acquire);
        if fl_state(f) != PageState::Alloc as u32 || p.refcount.load(Ordering::Relaxed) == 0 {
            return Err(FreeError::NotAllocated);
        }
        if f & PG_OWNED != 0 {
            return Err(FreeError::Owned);
        }
        Ok(fl_order(f))
    }

    /// Linux's `split_page`: turns the allocated block of `order` headed by
    /// `pfn` into 2^order allocated order-0 pages. The head keeps its flags
    /// and reference count; every other page becomes the head of its own
    /// order-0 block with one reference, the head's migratetype and its
    /// `PG_OWNED`. Only the block's owner calls it, holding every reference
    /// (nothing else may put or free the block meanwhile). Refused, changing
    /// nothing, for anything but the head of an allocated block of `order`.
    pub fn split_page(&self, pfn: Pfn, order: u32) -> Result<(), FreeError> {
        if order > MAX_ORDER {
            return Err(FreeError::InvalidOrder);
        }
        if pfn.get() & ((1 << order) - 1) != 0 {
            return Err(FreeError::Misaligned);
        }
        let page = self.page(pfn).ok_or(FreeError::OutOfRange)?;
        let f = page.flags.load(Ordering::Acquire);
        if fl_state(f) != PageState::Alloc as u32 {
            return Err(FreeError::NotAllocated);
        }
        if fl_order(f) != order {
            return Err(FreeError::WrongOrder {
                allocated: fl_order(f),
            });
        }
        let tail = mk_flags(PageState::Alloc, 0, fl_mt(f) as u32) | (f & PG_OWNED);
        for i in 1..(1u64 << order) {
            let p = self.mem.page((pfn.get() + i) as u32);
            p.refcount.store(1, Ordering::Relaxed);
            p.flags.store(tail, Ordering::Release);
        }
        // The owner's flag bits may change meanwhile (atomic updates by the
        // owner's own paths): only the order is replaced.
        page.flags.fetch_and(!FL_ORDER_MASK, Ordering::AcqRel);
        Ok(())
    }

    /// Takes a reference on an allocated block (Linux's `get_page`): the block
    /// is not freed until a matching `put_page`. Used to pin a page during an access.
    #[inline]
    pub fn get_page(&self, pfn: Pfn) {
        if let Some(p) = self.mem.pages.get(pfn.get() as usize) {
            p.refcount.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops a reference on an allocated head (Linux's `put_page_testzero`); if
    /// it was the last, claims the block for freeing, whoever owns it, with
    /// `order` (`None`: the order its head records) and returns the order and
    /// migratetype. The one place a reference count reaches zero.
    #[inline]
    pub(crate) fn put_page_testzero(&self, pfn: Pfn, order: Option<u32>) -> Option<(u32, usize)> {
        let p = self.mem.pages.get(pfn.get() as usize)?;
        if p.refcount.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        let order = order.unwrap_or_else(|| fl_order(p.flags.load(Ordering::Relaxed)));
        // A refused claim (not an allocated head) leaves the count as it was.
        p.refcount.fetch_add(1, Ordering::Relaxed);
        let mt = self.claim_for_free(pfn, order, Claim::Owner).ok()?;
        Some((order, mt))
    }

    /// Drops a reference (Linux's `put_page`); the last one frees the block.
    /// Returns true if the block was freed.
    #[inline]
    pub fn put_page(&self, pfn: Pfn) -> bool {
        match self.put_page_testzero(pfn, None) {
            Some((order, mt)) => {
                self.free_claimed(pfn.get() as u32, order, mt);
                true
            }
            None => false,
        }
    }

    /// Drops one reference on each block and frees those whose count reached
    /// zero, taking the per-CPU lock (or the zone lock) once for the whole batch
    /// (the allocator side of an mmu_gather). Returns the number of blocks freed.
    pub fn put_pages_bulk(&self, blocks: &[(Pfn, u32)]) -> usize {
        let mut freed = 0;
        let mut pcp: Option<(usize, PcpGuard<'_>)> = None;
        for &(pfn, order) in blocks.iter().rev() {
            let Some((_, mt)) = self.put_page_testzero(pfn, Some(order)) else {
                continue;
            };
            freed += 1;
            let idx = pfn.get() as u32;
            let z = self.zone_of(idx);
            if !self.pcp.is_empty() && order <= PCP_MAX_ORDER && mt < MIGRATE_PCPTYPES {
                if !matches!(pcp, Some((pz, _)) if pz == z) {
                    drop(pcp.take());
                    pcp = self.pcp_trylock(z).map(|g| (z, g));
                }
                if let Some((_, g)) = pcp.as_mut() {
                    self.free_unref_page_commit(z, g, idx, order, mt);
                    g.events[VmEvent::PgFree as usize] += 1;
                    continue;
                }
            }
            self.free_claimed(idx, order, mt);
        }
        freed
    }
}

/// Why a claim of the head whose flags are `f` is refused: it is not an
/// allocated head, `who` may not free it, or its order is not the one asked
/// for (`claim_for_free`'s one compare found one of these).
#[cold]
#[inline(never)]
fn refused_claim(f: u32, who: Claim) -> FreeError {
    if fl_state(f) != PageState::Alloc as u32 {
        FreeError::NotAllocated
    } else if who == Claim::User && f & PG_OWNED != 0 {
        FreeError::Owned
    } else {
        FreeError::WrongOrder {
            allocated: fl_order(f),
        }
    }
}
