//! Swap-in (Linux's `do_swap_page` in `mm/memory.c`) and swapoff's walk over a
//! space (Linux's `unuse_mm`, through `walk_page_range` in `pagewalk.rs`).
//!
//! A fault on a swap PTE pins the entry's device once (`SwapDevices::get`;
//! none, with the PTE unchanged, is a bad entry) and uses it throughout, for
//! readahead too. Steps 1 to 3 are `Mm::read_swap_cache_start` and `_end`
//! (`swap_state.rs`), the routine the readaheads use as well:
//! 1. If the entry's page is in the swap cache, it was read ahead (map it), or
//!    reclaim is writing it out or another fault is reading it in: wait for
//!    that page's lock, then retry (the PTE has changed, or the page left the
//!    cache).
//! 2. A new page (owned, movable; the slow path may reclaim), then
//!    `swapcache_prepare`: of concurrent faults on one entry exactly one wins and
//!    reads; the others find the winner's page in the cache (step 1) or retry.
//!    With memory and swap both full (no page even after reclaim), the fault
//!    exchanges instead (`swapin_exchange`): a cold resident page is written
//!    into this entry's slot and unmapped to it, and its frame becomes the
//!    incoming page, so a page written before stays readable.
//!    The slot's shadow (`workingset.rs`) is read before the page replaces it:
//!    a refault recent enough joins the active (protected) list at once.
//! 3. The winner locks its page, publishes it in the swap cache and starts
//!    the slot's read; then readahead, as the `SwapReadahead` policy says
//!    (`swap_readahead.rs`): the next slots or the next PTEs' entries are
//!    read into the swap cache, unmapped, their reads started behind the
//!    fault's (all in flight together on an NBD device). The fault's read
//!    is waited for first (CRC32C verified), then the read-ahead ones; a
//!    later fault on one of those finds it in the cache (step 1) and maps
//!    it. A failed read or a checksum mismatch undoes 3 and 2 and fails the
//!    access with [`Error::SwapIo`] / [`Error::SwapCorrupt`]; the PTE keeps
//!    the swap entry, so a later access retries.
//! 4. The PTE goes from the swap entry to the page (compare-and-swap) and the
//!    slot loses the PTE's reference. A read fault keeps the page in the swap
//!    cache (the slot keeps its copy: reclaim drops the page again without a
//!    write while its PTE stays clean) as the `SwapFreePolicy` allows: Linux's
//!    while the devices are at most half full, mmkit's while the free slots
//!    cover every resident page without one; a write fault, or a policy that
//!    says no, takes it out, which frees the slot.
//!
//! Invariants: the PTE leaves the swap entry only by that compare-and-swap, after
//! the page holds the verified data; a page's reverse map is set before it is
//! mapped.
//!
//! Locking: under the shared VMA lock of the fault; then one page lock at a time
//! (the address side of the lock order in `rmap.rs`), except while reads are
//! in flight: the fault's new page and its read-ahead pages are locked
//! together then, all new pages that nothing reaches but a swap-cache lookup
//! (which waits for them), and no other page lock is taken until every one
//! of those reads ended. The swap locks are leaves.

use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::page::PG_READAHEAD;
use mmkit_core::VmEvent;

use super::memory::VmFault;
use super::pagewalk::{ControlFlow, MmWalk, MmWalkOps};
use super::{leaf, SpaceInner, Stat, PAGE};
use crate::page_io::SwapIoError;
use crate::pgtable::{desc, pt_index, Pte, SwapEntry, Table, PMD_SIZE, TASK_SIZE};
use crate::rmap::PageGuard;
use crate::swap_cluster::{MapError, SWAPFILE_CLUSTER};
use crate::swap_readahead::{RaBatch, SwapReadahead};
use crate::swap_state::{SwapCacheRead, SwapCacheStart, SwapInFail};
use crate::swapfile::{SwapError, SwapInfoStruct};
use crate::{rmap, Error, Gfp, PAGE_SIZE};

/// Yields the CPU a little more each time (waiting for another fault's read).
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The error an access returns for a failed swap read.
fn read_err(addr: u64, entry: SwapEntry, e: SwapError) -> Error {
    match e {
        SwapError::Io(SwapIoError::Corrupt {
            expected, found, ..
        }) => Error::SwapCorrupt {
            addr,
            swap_type: entry.ty(),
            offset: entry.offset(),
            expected,
            found,
        },
        other => Error::SwapIo {
            addr,
            swap_type: entry.ty(),
            offset: entry.offset(),
            reason: other.to_string(),
        },
    }
}

impl SpaceInner {
    /// Linux's `do_swap_page`: a fault on the swap entry `e` in `slot` (see the
    /// module header). The entry's device is pinned once, for the whole fault.
    pub(super) fn do_swap_page(
        &self,
        vmf: &VmFault<'_>,
        pt: &Table,
        slot: &AtomicU64,
        e: Pte,
    ) -> Result<(), Error> {
        let mm = &self.mm;
        let addr = vmf.addr;
        let Some(entry) = e.swap_entry() else {
            return Err(Error::Fault {
                addr,
                reason: "malformed swap entry",
            });
        };
        let changed = || slot.load(Ordering::Acquire) != e.raw();
        let bad = |why: &dyn std::fmt::Display| {
            mm.swap_bad_entry(entry, why);
            Err(Error::Fault {
                addr,
                reason: "swap entry names no swap slot in use",
            })
        };
        let Some(dev) = mm.swap().get(entry) else {
            // The PTE changed since the walk (swapoff brought the page back
            // and took the device away), or it is bad.
            return if changed() { Ok(()) } else { bad(&"no device") };
        };
        let mut spins = 0;
        // A swap-in is a stall of the space's group (its pressure).
        let _stall = self.memcg().map(|g| crate::memcontrol::Stall::enter(g));
        // 1, 2, 3.
        let (lock, ra) = loop {
            if changed() {
                return Ok(());
            }
            let mut ra = None;
            let read = match mm.read_swap_cache_start(&dev, entry, Gfp::MOVABLE, true) {
                Ok(SwapCacheStart::Started(p)) => {
                    // The read-ahead reads go out behind this one, which is
                    // waited for first.
                    ra = Some(self.swapin_readahead(vmf, pt, &dev, entry));
                    mm.read_swap_cache_end(&dev, p).map(SwapCacheRead::Read)
                }
                Ok(SwapCacheStart::Cached(pfn)) => Ok(SwapCacheRead::Cached(pfn)),
                Ok(SwapCacheStart::Busy) => Ok(SwapCacheRead::Busy),
                Err(e) => Err(e),
            };
            match read {
                Ok(SwapCacheRead::Read(lock)) => break (lock, ra),
                Ok(SwapCacheRead::Cached(pfn)) => {
                    let cached = mm.lock_page(pfn);
                    if !changed()
                        && mm.swapcache_entry(&cached) == Some(entry)
                        && desc(mm, cached.pfn()).test_flag(PG_READAHEAD)
                    {
                        return self.map_readahead_page(vmf, slot, e, &dev, entry, cached);
                    }
                }
                Ok(SwapCacheRead::Busy) => {}
                Err(SwapInFail::NoMemory(err)) => {
                    return self.swapin_exchange(vmf, slot, e, &dev, entry, err)
                }
                Err(SwapInFail::Slot(err)) => {
                    return if changed() { Ok(()) } else { bad(&err) };
                }
                Err(SwapInFail::Read(err)) => {
                    let ev = match err {
                        SwapError::Io(SwapIoError::Corrupt { .. }) => VmEvent::SwapChecksumFail,
                        _ => VmEvent::SwapIoError,
                    };
                    mm.page_alloc().count_vm_event(ev, 1);
                    return Err(read_err(addr, entry, err));
                }
            }
            backoff(&mut spins);
        };
        // The read-ahead pages' reads end (no other page lock is held while
        // this one maps).
        drop(ra);
        // 4.
        let page = lock.pfn();
        if let Some(g) = self.memcg() {
            if let Err(err) = crate::memcontrol::try_charge(g, 1, 0) {
                mm.swapin_undo(&dev, lock);
                return Err(err);
            }
            mm.memcg().set_owner(page.get(), g.id);
        }
        let va = addr & !(PAGE - 1);
        rmap::set(mm, page, self.id, va);
        let pte = leaf(page, false).with(self.fault_bits(vmf));
        let mapped = slot
            .compare_exchange(e.raw(), pte.raw(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !mapped {
            rmap::clear(mm, page);
            crate::memcontrol::uncharge_batch(mm, &[(page, 0)]);
            mm.swapin_undo(&dev, lock);
            return Ok(());
        }
        self.swapin_mapped(vmf, &dev, entry, lock);
        mm.page_alloc().count_vm_event(VmEvent::PswpIn, 1);
        mm.thrash().note_major_fault(mm, self.id, self.load());
        Ok(())
    }

    /// Step 4's end, for a page read now or read ahead: the slot loses the
    /// PTE's reference, the page leaves the swap cache as the policy says, and
    /// joins the LRU.
    fn swapin_mapped(
        &self,
        vmf: &VmFault<'_>,
        dev: &SwapInfoStruct,
        entry: SwapEntry,
        lock: PageGuard<'_>,
    ) {
        let mm = &self.mm;
        let page = lock.pfn();
        // The PTE held a reference: the slot must take it back.
        if let Err(err) = dev.swap_free(entry) {
            mm.swap_bad_entry(entry, &err);
        }
        let resident = mm.nr_managed_pages().saturating_sub(mm.nr_free_pages());
        if vmf.write || mm.swap().should_free_swap(dev, resident) {
            mm.swapcache_drop(dev, &lock);
        }
        drop(lock);
        self.stats.add(Stat::Rss, 1);
        if let Some(g) = self.memcg() {
            g.stats.add(crate::memcontrol::Event::PswpIn, 1);
        }
        // The state `swapin_refault` gave it when it was read.
        let st = mm.lru().state(page);
        mm.lru()
            .lru_cache_add(mm, &[page], st, st, self.memcg().map(|g| &**g));
    }

    /// Step 2 when no page is free even after reclaim (memory and swap both
    /// full): the swap-in exchanges with a cold resident page. The slot is
    /// claimed (`swapcache_prepare`; a slot another task is reading or
    /// writing is left to it, and the access retries) and read into a buffer;
    /// then a victim (`swap_exchange::exchange_victim`) is written into this very
    /// slot and unmapped to its entry, and its frame takes the buffer's
    /// content and is mapped here: the incoming page's slot is freed and the
    /// cold page written into it, so every page written stays readable.
    /// `no_memory` (the allocation's error) only when the slot holds other
    /// references than this PTE's or no resident page can go out.
    fn swapin_exchange(
        &self,
        vmf: &VmFault<'_>,
        slot: &AtomicU64,
        e: Pte,
        dev: &SwapInfoStruct,
        entry: SwapEntry,
        no_memory: Error,
    ) -> Result<(), Error> {
        let mm = &self.mm;
        let changed = || slot.load(Ordering::Acquire) != e.raw();
        match dev.swapcache_prepare(entry) {
            Ok(()) => {}
            Err(SwapError::Map(MapError::CacheBusy(_))) => {
                // Another task reads or writes the slot: retry after it.
                std::thread::yield_now();
                return Ok(());
            }
            Err(_) if changed() => return Ok(()),
            Err(_) => return Err(no_memory),
        }
        let memcg = self.memcg().map(|g| &**g);
        let charged = |ok: bool| {
            if let (Some(g), false) = (memcg, ok) {
                g.memory.uncharge(1);
            }
        };
        let release = || {
            if let Err(err) = dev.swapcache_clear(entry) {
                mm.swap_bad_entry(entry, &err);
            }
        };
        if let Some(g) = memcg {
            if let Err(err) = crate::memcontrol::try_charge(g, 1, 0) {
                release();
                return Err(err);
            }
        }
        // The slot is about to hold another page's content: only this PTE may
        // reference it.
        if changed() || dev.swap_count(entry).ok() != Some(1) {
            charged(false);
            release();
            return if changed() { Ok(()) } else { Err(no_memory) };
        }
        let shadow = dev.swap_shadow(entry);
        let mut buf = vec![0u8; PAGE_SIZE];
        if let Err(err) = dev.swap_readpage(entry, &mut buf) {
            charged(false);
            release();
            return Err(read_err(vmf.addr, entry, err));
        }
        let Some((mut lock, nid, victim_state)) =
            crate::swap_exchange::exchange_victim(mm, dev, entry, &buf)
        else {
            charged(false);
            release();
            return Err(no_memory);
        };
        let page = lock.pfn();
        // `exchange_victim` moved the victim's charges; the frame is this
        // space's now.
        if let Some(g) = memcg {
            mm.memcg().set_owner(page.get(), g.id);
        }
        // The victim's shadow replaces this page's in the slot.
        let sh = crate::workingset::workingset_eviction(mm, nid, victim_state);
        dev.set_swap_shadow(entry, sh.pack());
        lock.bytes_mut().copy_from_slice(&buf);
        mm.swapin_refault(page, shadow, dev.swap_owner(entry));
        rmap::set(mm, page, self.id, vmf.addr & !(PAGE - 1));
        let pte = leaf(page, false).with(self.fault_bits(vmf));
        let mapped = slot
            .compare_exchange(e.raw(), pte.raw(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if mapped {
            // This PTE's reference; the victim's PTE holds the slot now.
            if let Err(err) = dev.swap_free(entry) {
                mm.swap_bad_entry(entry, &err);
            }
        } else {
            // Unmapped meanwhile (its slot reference went with the PTE): the
            // frame is nobody's.
            rmap::clear(mm, page);
            crate::memcontrol::uncharge_batch(mm, &[(page, 0)]);
            mm.unpin_page(page);
        }
        release();
        drop(lock);
        if mapped {
            self.stats.add(Stat::Rss, 1);
            let st = mm.lru().state(page);
            mm.lru()
                .lru_cache_add(mm, &[page], st, st, self.memcg().map(|g| &**g));
            let pa = mm.page_alloc();
            pa.count_vm_event(VmEvent::PswpIn, 1);
            pa.count_vm_event(VmEvent::SwapExchange, 1);
        }
        // The isolation reference (the last, for a frame nobody maps).
        mm.unpin_page(page);
        mm.lru().end_isolation(nid, 1);
        Ok(())
    }

    /// A fault found its entry's page read ahead (locked, in the cache, not
    /// mapped: `PG_READAHEAD` is cleared only when it is mapped or dropped,
    /// both under its lock): maps it, a `swap_ra_hit`.
    fn map_readahead_page(
        &self,
        vmf: &VmFault<'_>,
        slot: &AtomicU64,
        e: Pte,
        dev: &SwapInfoStruct,
        entry: SwapEntry,
        lock: PageGuard<'_>,
    ) -> Result<(), Error> {
        let mm = &self.mm;
        let page = lock.pfn();
        let va = vmf.addr & !(PAGE - 1);
        // Read ahead uncharged: charged when a fault maps it.
        if let Some(g) = self.memcg() {
            crate::memcontrol::try_charge(g, 1, 0)?;
            mm.memcg().set_owner(page.get(), g.id);
        }
        rmap::set(mm, page, self.id, va);
        let pte = leaf(page, false).with(self.fault_bits(vmf));
        if slot
            .compare_exchange(e.raw(), pte.raw(), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // The PTE changed meanwhile: the page stays read ahead.
            rmap::clear(mm, page);
            crate::memcontrol::uncharge_batch(mm, &[(page, 0)]);
            return Ok(());
        }
        desc(mm, page).clear_flag(PG_READAHEAD);
        mm.swap().ra().hit();
        mm.page_alloc().count_vm_event(VmEvent::SwapRaHit, 1);
        self.swapin_mapped(vmf, dev, entry, lock);
        Ok(())
    }

    /// Linux's `swapin_readahead`, started once the fault's own read is in
    /// flight: with `Cluster`, the slots after `entry` in its cluster; with
    /// `Vma`, the swap entries of the PTEs after the fault's, in the same VMA
    /// and page table. Each is read into the swap cache unmapped, the ones on
    /// the fault's pinned device together (`RaBatch`); the batch's drop
    /// waits for them.
    fn swapin_readahead<'a>(
        &'a self,
        vmf: &VmFault<'_>,
        pt: &Table,
        dev: &'a SwapInfoStruct,
        entry: SwapEntry,
    ) -> RaBatch<'a> {
        let mm = &self.mm;
        let ra = mm.swap().ra();
        let va = vmf.addr & !(PAGE - 1);
        let mut batch = RaBatch::new(mm, dev);
        match ra.policy {
            SwapReadahead::Off => {}
            SwapReadahead::Cluster => {
                let w = ra.window(entry.offset());
                let end = (entry.offset() | (u64::from(SWAPFILE_CLUSTER) - 1)) + 1;
                for off in entry.offset() + 1..(entry.offset() + w).min(end) {
                    if let Some(next) = SwapEntry::new(entry.ty(), off) {
                        batch.add(next);
                    }
                }
            }
            SwapReadahead::Vma => {
                let w = ra.window(va / PAGE);
                let table_end = (va | (PMD_SIZE - 1)) + 1;
                let end = (va + w * PAGE).min(vmf.vma.end).min(table_end);
                // The fault's PTE table stays while its shared VMA lock is held.
                for a in (va + PAGE..end).step_by(PAGE as usize) {
                    let pte = Pte::from_raw(pt[pt_index(a, 0)].load(Ordering::Acquire));
                    if let Some(ra_entry) = pte.swap_entry() {
                        batch.add(ra_entry);
                    }
                }
            }
        }
        batch
    }

    /// Swapoff's walk (Linux's `unuse_mm`): faults back in every page of this
    /// space that sits on swap device `ty`. Returns how many it brought back.
    pub(crate) fn unuse(&self, ty: u32) -> Result<u64, Error> {
        let g = self.read_lock();
        let mut walk = Unuse {
            space: self,
            ty,
            n: 0,
        };
        match self.walk_page_range(&g, 0, TASK_SIZE, &mut walk) {
            ControlFlow::Break(e) => Err(e),
            ControlFlow::Continue(()) => Ok(walk.n),
        }
    }

    /// One page fewer resident (reclaim unmapped it).
    pub(crate) fn sub_rss(&self, pages: i64) {
        self.stats.add(Stat::Rss, -pages);
    }
}

/// Swapoff's callbacks for `walk_page_range` (Linux's `unuse_pte_range`).
struct Unuse<'a> {
    space: &'a SpaceInner,
    ty: u32,
    /// Pages brought back.
    n: u64,
}

impl MmWalkOps for Unuse<'_> {
    type Break = Error;

    fn pte_entry(
        &mut self,
        walk: &MmWalk<'_>,
        _: &AtomicU64,
        e: Pte,
        addr: u64,
    ) -> ControlFlow<Error> {
        let s = self.space;
        let mm = &s.mm;
        if e.swap_entry().is_some_and(|x| x.ty() == self.ty) {
            if let Err(err) = s.access(walk.held, walk.vma, addr, false, 1) {
                return ControlFlow::Break(err);
            }
            self.n += 1;
        } else if e.is_present() {
            // A page kept in the swap cache holds its slot too.
            let page = mm.lock_page(e.pfn());
            if mm.swapcache_entry(&page).is_some_and(|x| x.ty() == self.ty) {
                mm.swapcache_drop_page(&page);
            }
        }
        ControlFlow::Continue(())
    }
}
