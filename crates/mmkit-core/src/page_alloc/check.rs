//! The invariant walk behind `check()`: every free list, per-CPU list, cache
//! and page descriptor. No block on two lists, buddies of the right order and
//! alignment, counters equal to what the lists hold, every page free, allocated
//! or reserved exactly once.
//!
//! Locking: every per-CPU lock of a zone, then its zone lock, with the caches
//! fenced for the whole walk; meant for a quiescent allocator.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::PageAlloc;
use crate::config::MergePolicy;
use crate::gfp::{MIGRATE_PCPTYPES, MIGRATE_TYPES};
use crate::page::{fl_mt, fl_order, fl_state, PageState, MAX_ORDER, NR_ORDERS, PG_MERGE_SKIPPED};
use crate::pcp::{PcpGuard, PCP_ORDERS};
use crate::pcp_cache::FencedCaches;
use crate::platform::Platform;
use crate::zone::{MemMap, Zone, ZoneGuard};

impl<P: Platform> PageAlloc<P> {
    /// Walks every list and descriptor and verifies the invariants (see `zone`).
    pub fn check(&self) -> Result<(), String> {
        match &self.caches {
            Some(c) => c.with_fenced::<P, _>(|f| self.check_fenced(Some(f))),
            None => self.check_fenced(None),
        }
    }

    pub(super) fn check_fenced(&self, caches: Option<&FencedCaches<'_>>) -> Result<(), String> {
        let mut cover = vec![0u8; self.nr_pages as usize];
        for (zi, z) in self.zones.iter().enumerate() {
            let pcps: Vec<PcpGuard<'_>> = (0..if self.pcp.is_empty() { 0 } else { self.ncpu })
                .map(|cpu| self.pcp_of(zi, cpu).lock(P::relax))
                .collect();
            let g = z.lock();
            self.check_free_area(z, &g, &mut cover)?;
            for (cpu, pg) in pcps.iter().enumerate() {
                self.check_pcp(zi, z, cpu, pg, caches, &mut cover)?;
            }
            drop(g);
            drop(pcps);
        }
        self.check_covered(&mut cover)
    }

    /// The buddy free lists of zone `z` (locked: `g`) and its counters.
    fn check_free_area(
        &self,
        z: &Zone<P>,
        g: &ZoneGuard<'_, P>,
        cover: &mut [u8],
    ) -> Result<(), String> {
        let mem = &self.mem;
        let mut total = 0u64;
        let mut unmerged = 0u64;
        for o in 0..NR_ORDERS {
            for mt in 0..MIGRATE_TYPES {
                let l = &g.free_area[o][mt];
                let (mut i, mut prev, mut n) = (l.head, crate::page::NIL, 0u64);
                while i != crate::page::NIL {
                    if i < z.span.start || i >= z.span.end {
                        return Err(format!("free list order {o} {mt}: index {i} outside zone"));
                    }
                    let p = mem.page(i);
                    let f = p.raw_flags();
                    if fl_state(f) != PageState::Buddy as u32
                        || fl_order(f) as usize != o
                        || fl_mt(f) != mt
                    {
                        return Err(format!(
                            "pfn {i} on free list order {o} type {mt} has flags {f:#x}"
                        ));
                    }
                    if p.prev() != prev {
                        return Err(format!(
                            "pfn {i}: broken prev link on list order {o} type {mt}"
                        ));
                    }
                    if i & ((1 << o) - 1) != 0 || i + (1 << o) > z.span.end {
                        return Err(format!(
                            "pfn {i}: misaligned or overhanging order-{o} free block"
                        ));
                    }
                    if f & PG_MERGE_SKIPPED != 0 {
                        unmerged += 1;
                    }
                    cover_block(cover, mem, i, o as u32, "free block")?;
                    if self.cfg.merge == MergePolicy::Eager && (o as u32) < MAX_ORDER {
                        let b = i ^ (1 << o);
                        if b >= z.span.start && b + (1 << o) <= z.span.end {
                            let bf = mem.page(b).raw_flags();
                            if fl_state(bf) == PageState::Buddy as u32 && fl_order(bf) as usize == o
                            {
                                return Err(format!("pfn {i} and its buddy {b} are both free at order {o} under eager merging"));
                            }
                        }
                    }
                    n += 1;
                    total += 1 << o;
                    prev = i;
                    i = p.next();
                    if n > self.nr_pages {
                        return Err(format!("free list order {o} type {mt} has a cycle"));
                    }
                }
                if n != l.nr {
                    return Err(format!(
                        "free list order {o} type {mt}: counted {n}, recorded {}",
                        l.nr
                    ));
                }
                if l.tail != prev {
                    return Err(format!("free list order {o} type {mt}: tail mismatch"));
                }
            }
        }
        if total != g.nr_free {
            return Err(format!(
                "zone {}: lists hold {total} pages, nr_free says {}",
                z.name, g.nr_free
            ));
        }
        if unmerged != g.nr_unmerged {
            return Err(format!(
                "zone {}: {unmerged} merge-skipped pages, nr_unmerged says {}",
                z.name, g.nr_unmerged
            ));
        }
        Ok(())
    }

    /// One CPU's per-CPU lists (locked: `pg`) and cache of zone `z`.
    fn check_pcp(
        &self,
        zi: usize,
        z: &Zone<P>,
        cpu: usize,
        pg: &PcpGuard<'_>,
        caches: Option<&FencedCaches<'_>>,
        cover: &mut [u8],
    ) -> Result<(), String> {
        let mem = &self.mem;
        let mut count = 0u32;
        for o in 0..PCP_ORDERS {
            for mt in 0..MIGRATE_PCPTYPES {
                for i in pg.lists[o][mt].iter() {
                    if i < z.span.start || i >= z.span.end || i & ((1 << o) - 1) != 0 {
                        return Err(format!("cpu {cpu} list order {o}: bad entry {i}"));
                    }
                    if mem.page(i).raw_flags() != 0 {
                        return Err(format!(
                            "cpu {cpu} list order {o}: pfn {i} has flags {:#x}",
                            mem.page(i).raw_flags()
                        ));
                    }
                    cover_block(cover, mem, i, o as u32, "per-CPU entry")?;
                    count += 1 << o;
                }
            }
        }
        if count != pg.count {
            return Err(format!(
                "cpu {cpu}: lists hold {count} pages, count says {}",
                pg.count
            ));
        }
        if let Some(f) = caches {
            for mt in 0..MIGRATE_PCPTYPES {
                for i in f.entries(zi, mt, cpu) {
                    if i < z.span.start || i >= z.span.end {
                        return Err(format!("cpu {cpu} cache type {mt}: bad entry {i}"));
                    }
                    if mem.page(i).raw_flags() != 0 {
                        return Err(format!(
                            "cpu {cpu} cache type {mt}: pfn {i} has flags {:#x}",
                            mem.page(i).raw_flags()
                        ));
                    }
                    cover_block(cover, mem, i, 0, "per-CPU cache entry")?;
                }
            }
        }
        if pg.high < pg.high_min || pg.high > pg.high_max {
            return Err(format!(
                "cpu {cpu}: high {} outside [{}, {}]",
                pg.high, pg.high_min, pg.high_max
            ));
        }
        Ok(())
    }

    /// Allocated and reserved pages: with the lists, every page exactly once.
    fn check_covered(&self, cover: &mut [u8]) -> Result<(), String> {
        let mem = &self.mem;
        let mut i = 0u32;
        while (i as u64) < self.nr_pages {
            let f = mem.page(i).raw_flags();
            match fl_state(f) {
                s if s == PageState::Alloc as u32 => {
                    let o = fl_order(f);
                    if i & ((1 << o) - 1) != 0 {
                        return Err(format!("allocated pfn {i} misaligned for order {o}"));
                    }
                    cover_block(cover, mem, i, o, "allocated block")?;
                    i += 1 << o;
                    continue;
                }
                s if s == PageState::Reserved as u32 => {
                    if cover[i as usize] != 0 {
                        return Err(format!("reserved pfn {i} also on a list"));
                    }
                    cover[i as usize] = 1;
                }
                _ => {}
            }
            i += 1;
        }
        if let Some(p) = cover.iter().position(|&c| c != 1) {
            return Err(format!(
                "pfn {p} is neither free, allocated nor reserved (flags {:#x})",
                mem.page(p as u32).raw_flags()
            ));
        }
        Ok(())
    }
}

/// Marks the pages of a block as covered; its interior descriptors must be `None`.
fn cover_block(
    cover: &mut [u8],
    mem: &MemMap,
    i: u32,
    order: u32,
    what: &str,
) -> Result<(), String> {
    let end = i as usize + (1usize << order);
    if end > cover.len() {
        return Err(format!(
            "{what} at pfn {i} order {order} overhangs the memmap"
        ));
    }
    for (j, c) in cover[i as usize..end].iter_mut().enumerate() {
        if *c != 0 {
            return Err(format!(
                "pfn {} covered twice ({what} at {i} order {order})",
                i as usize + j
            ));
        }
        *c = 1;
        if j > 0 {
            let f = mem.page(i + j as u32).raw_flags();
            if f & 0xffff != 0 {
                return Err(format!(
                    "interior pfn {} of {what} at {i} has flags {f:#x}",
                    i as usize + j
                ));
            }
        }
    }
    Ok(())
}
