//! The emulated MMU: the access path of a space (Linux's `follow_page` and the
//! fault-retry loop of the CPU), and the byte-level accessors built on it:
//! `read`, `write`, `touch`, `populate`, `with_page`, with page pins.
//!
//! An access walks to the leaf entry (through the walk cache) and, if it is
//! present, sets its accessed bit (and dirty bit for a write) by CAS, as the CPU
//! does; a missing, NUMA-hinting, migration or swap entry takes the fault path
//! (`memory.rs`) and retries.
//!
//! Invariants: no byte of a page is read or written by `read`/`write`/`with_page`
//! unless its page lock is held and the PTE was seen to map that very frame after
//! the lock was taken (`still_maps`), so nothing touches a page whose copy by a
//! migration has started (the protocol is in `migrate.rs`). A `&mut [u8]` lent
//! by `with_page` is never aliased.
//!
//! Locking: the shared VMA lock for every walk; then the page lock of one frame
//! (`Mm::lock_page`, blocking; one at a time), as the lock order in `rmap.rs`
//! says. `with_page` keeps the page lock *without* the VMA lock while its closure
//! runs (the page is pinned by a reference instead), so the closure must not call
//! back into any address space: such calls are refused with [`Error::Fault`]
//! rather than risk a deadlock (`not_in_page`).

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::memory::VmFault;
use super::mmap::{bad, check_range, Vma, VmaTree};
use super::{Space, SpaceInner, Translation, PAGE};
use crate::pgtable::{Pte, PMD_SIZE, PTE_ACCESSED, PTE_DIRTY, PTE_PREFAULT};
use crate::{Error, Mm, Pfn, PAGE_SIZE};

thread_local! {
    /// Set while this thread runs a `with_page` closure (holding a page lock).
    static IN_PAGE: Cell<bool> = const { Cell::new(false) };
}

/// Refuses an address-space call from inside a `with_page` closure.
pub(super) fn not_in_page(addr: u64) -> Result<(), Error> {
    if IN_PAGE.with(|c| c.get()) {
        return Err(Error::Fault {
            addr,
            reason: "address-space call from inside a with_page closure (would deadlock)",
        });
    }
    Ok(())
}

/// Marks this thread as inside a `with_page` closure until dropped.
struct InPage;

impl InPage {
    fn enter() -> InPage {
        IN_PAGE.with(|c| c.set(true));
        InPage
    }
}

impl Drop for InPage {
    fn drop(&mut self) {
        IN_PAGE.with(|c| c.set(false));
    }
}

/// A reference on a block, dropped with the guard.
struct PagePin<'a> {
    mm: &'a Mm,
    head: Pfn,
}

impl Drop for PagePin<'_> {
    fn drop(&mut self) {
        self.mm.unpin_page(self.head);
    }
}

/// A page of an address space pinned by [`Space::pin_page`] (Linux's
/// `pin_user_pages`, as for DMA): while this guard lives the frame stays
/// allocated (even if the range is unmapped meanwhile), and migration and reclaim
/// leave it where it is. Dropping the guard drops the reference.
pub struct PinnedPage {
    mm: Mm,
    t: Translation,
}

impl PinnedPage {
    /// The pinned 4 KiB frame.
    pub fn pfn(&self) -> Pfn {
        self.t.pfn
    }
    /// What the address mapped when it was pinned.
    pub fn translation(&self) -> Translation {
        self.t
    }
}

impl Drop for PinnedPage {
    fn drop(&mut self) {
        self.mm.unpin_page(self.t.head);
    }
}

impl std::fmt::Debug for PinnedPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPage").field("t", &self.t).finish()
    }
}

impl Space {
    /// Copies `buf.len()` bytes from `addr` (across pages and adjacent mappings),
    /// faulting pages in on first touch (never-written memory reads 0). The whole
    /// range must be mapped, else nothing is read. An empty `buf` is a no-op.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let dst = buf.as_mut_ptr();
        let r = self.inner.copy(addr, buf.len(), false, |frame, done, n| {
            // SAFETY: `frame` points at `n` readable bytes of a mapped page whose
            // page lock we hold; `done + n <= buf.len()`, and `buf` is exclusively
            // ours, so the ranges are valid and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(frame, dst.add(done), n) }
        });
        self.inner.task_tick_numa(pages_spanned(addr, buf.len()));
        r
    }

    /// Copies `buf` to `addr` (across pages and adjacent mappings), faulting pages
    /// in on first touch. The whole range must be mapped, else nothing is written.
    /// Out of memory during a fault returns [`Error::NoMemory`] (the pages before
    /// it were written). An empty `buf` is a no-op.
    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let src = buf.as_ptr();
        let r = self.inner.copy(addr, buf.len(), true, |frame, done, n| {
            // SAFETY: `frame` points at `n` writable bytes of a mapped page whose
            // page lock we hold (no other reference to them exists);
            // `done + n <= buf.len()`; a page never overlaps the caller's slice.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), frame, n) }
        });
        self.inner.task_tick_numa(pages_spanned(addr, buf.len()));
        r
    }

    /// Faults in the page at `addr` (as a write if `write`) without copying
    /// anything: the access of a hot loop.
    pub fn touch(&self, addr: u64, write: bool) -> Result<(), Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        self.inner.throttle();
        {
            let g = self.inner.read_lock();
            let vma = g
                .find_cached(addr)
                .ok_or_else(|| bad(addr, 1, "address is not mapped"))?;
            self.inner.access(&g, &vma, addr, write, 1)?;
        }
        self.inner.task_tick_numa(1);
        Ok(())
    }

    /// Faults in every page of `[addr, addr + len)` (Linux's `MADV_POPULATE_READ`/
    /// `_WRITE`) under one lock hold. The whole range must be mapped.
    pub fn populate(&self, addr: u64, len: usize, write: bool) -> Result<(), Error> {
        not_in_page(addr)?;
        let end = check_range(addr, len as u64)?;
        {
            let g = self.inner.read_lock();
            if !g.covers(addr, end) {
                return Err(bad(addr, len as u64, "range is not entirely mapped"));
            }
            let mut a = addr & !(PAGE - 1);
            let mut vma = *g.find(a).expect("range is covered");
            while a < end {
                if a >= vma.end {
                    vma = *g.find(a).expect("range is covered");
                }
                let t = self.inner.access(&g, &vma, a, write, 1)?;
                a = if t.huge {
                    (a & !(PMD_SIZE - 1)) + PMD_SIZE
                } else {
                    a + PAGE
                };
            }
        }
        self.inner.task_tick_numa(pages_spanned(addr, len));
        Ok(())
    }

    /// Faults in the page at `addr` (as a write if `write`) and pins it with a
    /// reference until the returned guard is dropped (Linux's `pin_user_pages`):
    /// the frame is neither freed, migrated nor reclaimed meanwhile. Accesses go
    /// on as usual (`read`, `write`, `with_page`).
    pub fn pin_page(&self, addr: u64, write: bool) -> Result<PinnedPage, Error> {
        let t = self.inner.lock_mapped_page(addr, write, 1)?.0;
        self.inner.task_tick_numa(1);
        Ok(PinnedPage {
            mm: self.inner.mm.clone(),
            t,
        })
    }

    /// Runs `f` on the bytes of the 4 KiB page containing `addr` (the whole page,
    /// page aligned; `addr % 4096` is the offset of `addr` in it), faulting it in
    /// first (as a write if `write`; write through the slice only with `write` set,
    /// or the dirty bit misses it). The page is pinned by a reference
    /// (`get_page`/`put_page`) while `f` runs, so it cannot be freed or moved even if
    /// the range is unmapped meanwhile (then writes land in the unmapped page), and
    /// its page lock is held, so no other access of the page runs at the same time.
    /// `f` must not call into an address space: such calls return [`Error::Fault`].
    pub fn with_page<R>(
        &self,
        addr: u64,
        write: bool,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        let mm = &self.inner.mm;
        let (t, mut lock) = self.inner.lock_mapped_page(addr, write, PAGE_SIZE)?;
        // Our reference keeps the page allocated while its bytes are borrowed;
        // its page lock (held until after `f` returns) keeps every other
        // accessor, migration included, off them.
        let _pin = PagePin { mm, head: t.head };
        let _in = InPage::enter();
        let r = f(lock.bytes_mut());
        drop((_in, _pin, lock));
        self.inner.task_tick_numa(1);
        Ok(r)
    }
}

/// The entry an access makes of `e` (`want`: `e` with the access's bits):
/// the first access of a prefaulted page only clears `PTE_PREFAULT`, it sets
/// no accessed bit (see `PTE_PREFAULT`).
#[inline]
fn first_touch(e: Pte, want: Pte) -> Pte {
    if e.raw() & PTE_PREFAULT == 0 {
        return want;
    }
    let keep = e.raw() & PTE_ACCESSED;
    Pte::from_raw((want.raw() & !(PTE_PREFAULT | PTE_ACCESSED)) | keep)
}

impl SpaceInner {
    /// Faults in the page at `addr` for an access of `len` bytes, takes its page
    /// lock, checks that the PTE still maps that frame (a migration may have moved
    /// it after the walk: then walk again), and takes a reference on its block
    /// while the VMA lock still keeps unmap away. Returns the translation and the
    /// held page lock; the caller drops the reference (`Mm::unpin_page`).
    fn lock_mapped_page(
        &self,
        addr: u64,
        write: bool,
        len: usize,
    ) -> Result<(Translation, crate::rmap::PageGuard<'_>), Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        let mm = &self.mm;
        loop {
            let g = self.read_lock();
            let vma = g
                .find_cached(addr)
                .ok_or_else(|| bad(addr, 1, "address is not mapped"))?;
            let t = self.access(&g, &vma, addr, write, len)?;
            let lock = mm.lock_page(t.pfn);
            if !self.still_maps(&g, addr, &t) {
                continue;
            }
            mm.pin_page(t.head);
            return Ok((t, lock));
        }
    }

    /// Does `addr` still map the frame of `t` through a present entry, as part
    /// of the same block? Checked under the page lock of `t.pfn` before touching
    /// its bytes: a migration that started after `t` was taken has replaced the
    /// entry, a huge page split by reclaim has a new head. Only under the shared
    /// VMA lock (through the walk cache).
    fn still_maps(&self, held: &VmaTree, addr: u64, t: &Translation) -> bool {
        match self.follow_pte_cached(held, addr) {
            Some((_, e, level)) if e.is_present() => {
                // The same frame, in the same block: reclaim may have split
                // the huge page since the walk (a pin must go to the block).
                let now = Self::translation(e, level, addr);
                now.pfn == t.pfn && now.head == t.head
            }
            _ => false,
        }
    }

    /// The access path (Linux's `follow_page` + `handle_mm_fault` retry loop):
    /// the frame mapped at `addr`, faulting it in if needed, with the accessed bit
    /// (and the dirty bit for a write) set. The access covers `len` bytes from
    /// `addr` (within its page): the hint that fault-around's clearing follows.
    pub(super) fn access(
        &self,
        held: &VmaTree,
        vma: &Vma,
        addr: u64,
        write: bool,
        len: usize,
    ) -> Result<Translation, Error> {
        let mut want = PTE_ACCESSED | if write { PTE_DIRTY } else { 0 };
        loop {
            if let Some((slot, e, level)) = self.follow_pte_cached(held, addr) {
                if e.is_present() {
                    let e2 = first_touch(e, e.with(want));
                    if e2 == e
                        || slot
                            .compare_exchange(
                                e.raw(),
                                e2.raw(),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_ok()
                    {
                        let t = Self::translation(e2, level, addr);
                        if self.mm.nr_nodes() > 1 {
                            self.count_access(t.pfn);
                        }
                        return Ok(t);
                    }
                    continue;
                }
            }
            self.handle_mm_fault(
                held,
                &VmFault {
                    vma,
                    addr,
                    write,
                    len,
                },
            )?;
            // The fault was this access's: it set what the LRU policy counts
            // (`fault_bits`); the retry does not add a reference. (A racing
            // fault's page found on the retry misses this one access's bit.)
            if !self.mm.lru().policy.fault_sets_young() {
                want &= !PTE_ACCESSED;
            }
        }
    }

    /// Runs `op(frame, done, n)` for each piece of `[addr, addr + len)` within one
    /// 4 KiB frame, under the shared VMA lock and the frame's page lock, faulting
    /// frames in as needed. Refuses (doing nothing) a range not entirely mapped.
    fn copy(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        mut op: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), Error> {
        not_in_page(addr)?;
        let end = check_range(addr, len as u64)?;
        self.throttle();
        let mut done = 0usize;
        let mut oom_retries = 0;
        'relock: loop {
            let g = self.read_lock();
            let from = addr + done as u64;
            let mut vma = match g.find_cached(from) {
                Some(v) if end <= v.end || g.covers(v.end, end) => v,
                _ => {
                    return Err(bad(
                        from,
                        (len - done) as u64,
                        "range is not entirely mapped",
                    ))
                }
            };
            while done < len {
                let a = addr + done as u64;
                if a >= vma.end {
                    vma = g.find_cached(a).expect("range is covered");
                }
                let off = (a % PAGE) as usize;
                let n = (PAGE_SIZE - off).min(len - done);
                let t = match self.access(&g, &vma, a, write, n) {
                    Err(Error::NoMemory { .. }) if oom_retries < FAULT_OOM_RETRIES => {
                        // Let go of the VMA lock before trying again: a
                        // writer queued behind it (mmap, munmap, mbind)
                        // keeps every new reader out, reclaim's reverse-map
                        // walks included (they never wait for a VMA lock),
                        // so while this fault held it none of this space's
                        // pages could be reclaimed, by anyone.
                        oom_retries += 1;
                        drop(g);
                        std::thread::sleep(std::time::Duration::from_millis(oom_retries));
                        continue 'relock;
                    }
                    r => r?,
                };
                let _pl = self.mm.lock_page(t.pfn);
                if !self.still_maps(&g, a, &t) {
                    // Migrated (or being migrated) since the walk: walk again.
                    continue;
                }
                // SAFETY: off < 4096, so the pointer stays inside the frame, which is
                // mapped and cannot be freed while we hold the shared VMA lock; its page
                // lock is held and the PTE still maps it, so no migration copies it now.
                let frame = unsafe { self.mm.page_address(t.pfn).add(off) };
                op(frame, done, n);
                done += n;
            }
            return Ok(());
        }
    }
}

/// Times an access whose fault found no memory lets go of the VMA lock and
/// tries again (as Linux's fault path retries after dropping `mmap_lock`),
/// waiting 1, 2, ... ms in between.
const FAULT_OOM_RETRIES: u64 = 4;

/// Pages of `[addr, addr + len)`, for the NUMA scan clock (`task_tick_numa.rs`).
fn pages_spanned(addr: u64, len: usize) -> u64 {
    let end = addr.saturating_add(len as u64);
    (end.div_ceil(PAGE)).saturating_sub(addr / PAGE).max(1)
}
