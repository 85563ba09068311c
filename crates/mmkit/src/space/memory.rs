//! The fault path (Linux's `mm/memory.c`): `handle_mm_fault` allocates the
//! missing tables of the walk and hands a PMD to `huge_memory.rs`, then
//! `handle_pte_fault` is the ONE place that dispatches on the kind of PTE found:
//! none -> `do_anonymous_page`, migration entry -> wait for it (`migrate.rs`),
//! NUMA hint -> `do_numa_page`, swap entry -> `do_swap_page` (`swap.rs`), present -> nothing
//! (a racing fault installed it). Reclaim, swap-in and NUMA migration hook in here.
//!
//! Invariants: an entry goes from none to something only by `compare_exchange`
//! from 0; the loser of a race frees what it allocated (an unpublished table page
//! or data page), so every access goes through the installed page and no write
//! is lost. A data page's reverse map is set before its PTE is installed and
//! cleared if the install loses. A table page's used count (`Page::pt_used`) is
//! raised after a successful install.
//!
//! Locking: the whole fault runs under the space's shared VMA lock, which keeps
//! every table page it reaches alive; it takes no page lock. Allocations may enter
//! the allocator's slow path (direct compaction), which never waits for any
//! address-space lock (`rmap.rs`, the lock order).

use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::clear::{clear_page_batch, ClearStrategy};

use super::mmap::{Vma, VmaTree};
use super::{leaf, SpaceInner, Stat, PAGE, SPARSE_TOUCH_BYTES};
use crate::memcontrol::MemCgInner;
use crate::migrate::wait_migration;
use crate::pgtable::{
    alloc_table, pt_index, used, Pte, Table, PMD_SIZE, PTE_ACCESSED, PTE_DIRTY, PTE_PREFAULT,
    PTRS_PER_TABLE,
};
use crate::{rmap, Error, Gfp, Pfn, PAGE_SIZE};

/// One fault (Linux's `struct vm_fault`): the VMA, the faulting address, whether
/// the access writes, and how many bytes of the page from `addr` it covers (the
/// hint that fault-around's clearing follows, see `do_anonymous_page`).
#[derive(Copy, Clone)]
pub(super) struct VmFault<'a> {
    pub(super) vma: &'a Vma,
    pub(super) addr: u64,
    pub(super) write: bool,
    pub(super) len: usize,
}

impl VmFault<'_> {
    /// The bits a new leaf for this fault starts with: accessed, and dirty for a
    /// write (mapped young, as the access that follows would set them anyway).
    pub(super) fn young_bits(&self) -> u64 {
        PTE_ACCESSED | if self.write { PTE_DIRTY } else { 0 }
    }
}

impl SpaceInner {
    /// The bits the leaf installed for the faulting address starts with:
    /// [`VmFault::young_bits`] where the LRU policy counts the fault as a
    /// reference (Classic, as x86 Linux maps young); without the accessed bit
    /// otherwise, and the access that faulted does not set it (`access` in
    /// `mmu.rs`): the fault is the page's insertion, only a later use is a
    /// reference.
    pub(super) fn fault_bits(&self, vmf: &VmFault<'_>) -> u64 {
        if self.mm.lru().policy.fault_sets_young() {
            vmf.young_bits()
        } else {
            vmf.young_bits() & !PTE_ACCESSED
        }
    }

    /// Makes `slot` (an entry of the table at `parent`) point to a table, allocating
    /// one if it is empty (Linux's `__pte_alloc`/`__pmd_alloc`). `Ok(None)` when
    /// the slot holds a huge leaf (possibly installed by a racing fault).
    pub(super) fn table_alloc(
        &self,
        slot: &AtomicU64,
        parent: Pfn,
        addr: u64,
    ) -> Result<Option<Pfn>, Error> {
        let e = Pte::from_raw(slot.load(Ordering::Acquire));
        if e.is_huge() {
            return Ok(None);
        }
        if e.is_present() {
            return Ok(Some(e.pfn()));
        }
        if !e.is_none() {
            return Err(Error::Fault {
                addr,
                reason: "unexpected non-present entry in an upper-level table",
            });
        }
        let new = alloc_table(&self.mm)?;
        match slot.compare_exchange(
            0,
            Pte::table(new).raw(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                used(&self.mm, parent).fetch_add(1, Ordering::Relaxed);
                self.stats.add(Stat::PgTables, 1);
                Ok(Some(new))
            }
            Err(cur) => {
                // Lost the race: the winner's table (or huge page) is there.
                self.mm
                    .free_owned_pages(new, 0)
                    .expect("freeing our own unpublished table page");
                let cur = Pte::from_raw(cur);
                Ok((!cur.is_huge()).then(|| cur.pfn()))
            }
        }
    }

    /// Linux's `handle_mm_fault` for an anonymous VMA: installs what `addr` needs
    /// (tables, then a huge page or a page), or restores a NUMA-hinting entry.
    /// Returns once the caller can retry the access. Kept out of line so that the
    /// access path that finds its entry present stays small.
    #[inline(never)]
    pub(super) fn handle_mm_fault(&self, held: &VmaTree, vmf: &VmFault<'_>) -> Result<(), Error> {
        let addr = vmf.addr;
        self.stats.add(Stat::Faults, 1);
        let pgd = self.tbl(held, self.pgd);
        let pud_pfn = self
            .table_alloc(&pgd[pt_index(addr, 3)], self.pgd, addr)?
            .expect("no huge entries above PMD level");
        let pud = self.tbl(held, pud_pfn);
        let pmd_pfn = self
            .table_alloc(&pud[pt_index(addr, 2)], pud_pfn, addr)?
            .expect("no huge entries above PMD level");
        let pmd = self.tbl(held, pmd_pfn);
        let pmd_slot = &pmd[pt_index(addr, 1)];
        let pte_pfn = loop {
            let e = Pte::from_raw(pmd_slot.load(Ordering::Acquire));
            if e.is_huge() {
                if e.is_numa_hint() {
                    self.do_huge_pmd_numa_page(vmf, pmd_slot, e);
                }
                return Ok(());
            }
            if e.is_none() && vmf.vma.huge_eligible(addr) {
                if self.do_huge_pmd_anonymous_page(vmf, pmd_slot, pmd_pfn) {
                    return Ok(());
                }
                self.stats.add(Stat::HugeFallbacks, 1);
            }
            if let Some(p) = self.table_alloc(pmd_slot, pmd_pfn, addr)? {
                break p;
            }
        };
        self.cache_pte_table(held, addr & !(PMD_SIZE - 1), pte_pfn);
        let pt = self.tbl(held, pte_pfn);
        self.handle_pte_fault(vmf, pt, pte_pfn)
    }

    /// Linux's `handle_pte_fault`: what the PTE for the address in the table `pt` (at
    /// `pt_pfn`) needs, by its kind. The one dispatch point of the fault path.
    fn handle_pte_fault(&self, vmf: &VmFault<'_>, pt: &Table, pt_pfn: Pfn) -> Result<(), Error> {
        let addr = vmf.addr;
        let slot = &pt[pt_index(addr, 0)];
        let e = Pte::from_raw(slot.load(Ordering::Acquire));
        if e.is_none() {
            return self.do_anonymous_page(vmf, pt, pt_pfn);
        }
        if e.is_migration() {
            wait_migration(slot, e);
            return Ok(());
        }
        if e.is_numa_hint() {
            self.do_numa_page(vmf, slot, e); // task_numa.rs
            return Ok(());
        }
        if e.is_swap() {
            return self.do_swap_page(vmf, pt, slot, e);
        }
        Ok(()) // present: a racing fault installed it
    }

    /// Linux's `do_anonymous_page`: a cleared order-0 page at `addr`, and, with
    /// anonymous fault-around (`Mm::fault_around`, an mTHP-like batch of
    /// independent order-0 pages), cleared pages for the empty entries that follow
    /// it in the same page table and mapping. The batch is allocated under one
    /// per-CPU lock hold (`alloc_pages_bulk`), cleared back to back, then installed:
    /// the store-buffer drain that the first `compare_exchange` forces after
    /// clearing is paid once per batch instead of once per page. Each page is an
    /// ordinary movable order-0 page with its own reverse map, unmapped and
    /// migrated one by one, like the PTE-mapped pages of an anonymous mTHP folio.
    /// The batch size is `MmBuilder::fault_around` (16 pages for the mmkit
    /// policies, 1 = off for the Linux baselines).
    ///
    /// This is the one description of the fault-around clearing protocol; the
    /// other places (docs/architecture.md, `SPARSE_TOUCH_BYTES`) link here.
    ///
    /// Clearing, with [`ClearStrategy::Auto`]: `rep stosb` when the faulting
    /// access covers more than [`SPARSE_TOUCH_BYTES`] of its page (a loop that
    /// fills each page, like anon_w_seq, reads its zeroes back at once, so cached
    /// stores pay their read for ownership once). When it is sparse (page_fault1:
    /// a byte per page), the `batch` kernel of the `Mm`'s calibrated plan
    /// (`calibrate.rs`), on the hosts measured so far streaming stores, with one
    /// `sfence` for the batch: they
    /// skip the read for ownership of every line, which makes a 4 KiB clear
    /// 1.5-2x cheaper here, and the zeroes a sparse loop never reads would only
    /// evict its working set. After the fence, the cache lines the faulting access
    /// covers, at the same offset in every page of the batch, are prefetched for
    /// writing: the access resumes on them, and a loop that strides by pages
    /// touches the other pages at that offset too, so its stores hit the cache
    /// instead of waiting on memory at the locked instruction that follows them.
    /// One fence per batch matters: fencing each page instead made streaming
    /// clears 2-3x slower than `rep stosb` (the fence waits for the page's stores
    /// to reach memory). Explicit strategies apply to the whole batch.
    fn do_anonymous_page(&self, vmf: &VmFault<'_>, pt: &Table, pt_pfn: Pfn) -> Result<(), Error> {
        let VmFault { vma, addr, len, .. } = *vmf;
        const MAX_AROUND: usize = 64;
        let mm = &self.mm;
        let idx = pt_index(addr, 0);
        let va = addr & !(PAGE - 1);
        let mut want = 1;
        let around = mm.fault_around().min(MAX_AROUND);
        if around > 1 {
            let limit = around
                .min(PTRS_PER_TABLE - idx)
                .min(((vma.end - va) / PAGE) as usize);
            while want < limit && pt[idx + want].load(Ordering::Relaxed) == 0 {
                want += 1;
            }
        }
        let mut pfns = [Pfn::new(0); MAX_AROUND];
        // On the nodes the memory policy picks for each address (`mempolicy.rs`).
        let mut n = self.alloc_fault_pages_bulk(vma, va, &mut pfns[..want]);
        if n == 0 {
            // The lists and the zone's fast path are empty: the faulting page
            // through the slow path (reclaim, compaction, the error).
            pfns[0] = self.alloc_fault_pages(vma, va, Gfp::MOVABLE, 0)?;
            n = 1;
        }
        let memcg = self.memcg().map(|g| &**g);
        if let Some(g) = memcg {
            n = self.charge_fault_pages(g, &pfns[..n])?;
        }
        let off = (addr % PAGE) as usize;
        let sparse = len <= SPARSE_TOUCH_BYTES;
        let strategy = mm.clear_plan().resolve_batch(mm.clear_strategy(), sparse);
        let hot = match mm.clear_strategy() {
            ClearStrategy::Auto if sparse => off..(off + len).min(PAGE_SIZE),
            _ => 0..0,
        };
        // SAFETY: each page is ours (just allocated, not yet mapped): 4096 writable
        // bytes inside the arena that nothing else references; the pfns differ.
        unsafe {
            clear_page_batch(pfns[..n].iter().map(|p| mm.page_address(*p)), strategy, hot);
        }
        // The faulting page is mapped young only where the policy counts the
        // fault as a reference (Classic); otherwise its accessed bit means a
        // use after the fault. The other pages of the batch: under Classic,
        // young, as Linux maps the pages of an anonymous large folio (their
        // LRU state says the first bit seen is their insertion's,
        // `LRU_FRESH`); otherwise prefaulted (`PTE_PREFAULT`): their first
        // access is their insertion, and a later one sets the accessed bit.
        let policy = mm.lru().policy;
        let bits = if policy.fault_sets_young() {
            vmf.young_bits()
        } else {
            (vmf.young_bits() & !PTE_ACCESSED) | PTE_PREFAULT
        };
        let first_bits = self.fault_bits(vmf);
        let fault_pfn = pfns[0];
        let mut installed = 0;
        let owners = mm.memcg();
        for i in 0..n {
            let pfn = pfns[i];
            rmap::set(mm, pfn, self.id, va + (i as u64) * PAGE);
            if let Some(g) = memcg {
                owners.set_owner(pfn.get(), g.id);
            }
            let pte = leaf(pfn, false).with(if i == 0 { first_bits } else { bits });
            match pt[idx + i].compare_exchange(0, pte.raw(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    pfns[installed] = pfn;
                    installed += 1;
                }
                Err(_) => {
                    // A racing fault installed its own page here.
                    rmap::clear(mm, pfn);
                    crate::memcontrol::uncharge_batch(mm, &[(pfn, 0)]);
                    mm.free_owned_pages(pfn, 0)
                        .expect("freeing our own unpublished page");
                }
            }
        }
        if installed > 0 {
            used(mm, pt_pfn).fetch_add(installed as u64, Ordering::Relaxed);
            self.stats.add(Stat::Rss, installed as i64);
            // Onto the LRU through this CPU's batch (`lru.rs`).
            let young = policy.fault_sets_young();
            let first = policy.new_page_state(young || pfns[0] != fault_pfn);
            mm.lru().lru_cache_add(
                mm,
                &pfns[..installed],
                first,
                policy.new_page_state(young),
                memcg,
            );
        }
        Ok(())
    }

    /// Charges the pages of a fault batch to `g`; when the whole batch
    /// cannot be charged, the pages after the faulting one are freed and
    /// only it is charged. Returns how many of `pfns` stay (from the first);
    /// `Err` (all freed) when not even the faulting page could be charged.
    fn charge_fault_pages(&self, g: &MemCgInner, pfns: &[Pfn]) -> Result<usize, Error> {
        let mm = &self.mm;
        let n = pfns.len();
        if crate::memcontrol::try_charge(g, n as u64, 0).is_ok() {
            return Ok(n);
        }
        for &p in &pfns[1..] {
            mm.free_owned_pages(p, 0)
                .expect("freeing our own unpublished page");
        }
        if n > 1 && crate::memcontrol::try_charge(g, 1, 0).is_ok() {
            return Ok(1);
        }
        mm.free_owned_pages(pfns[0], 0)
            .expect("freeing our own unpublished page");
        Err(Error::NoMemory { order: 0 })
    }
}
