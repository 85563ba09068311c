//! The shape of a zone's free memory (Linux's `fill_contig_page_info` and
//! `__fragmentation_index` in `mm/vmstat.c`): how many free blocks and pages its
//! buddy lists hold, and the fragmentation index that compaction's suitability
//! test and the vmstat views read.
//!
//! Locking: each call takes the zone lock once, for one pass over its free-area
//! counters (`FreeList::nr`); nothing is written.

use super::PageAlloc;
use crate::platform::Platform;

impl<P: Platform> PageAlloc<P> {
    /// (free pages, free blocks, free blocks of at least `order`, pages in them)
    /// on the buddy lists of a zone.
    pub(crate) fn contig_page_info(&self, zone: usize, order: u32) -> (u64, u64, u64, u64) {
        let g = self.zones[zone].lock();
        let (mut pages, mut blocks, mut suitable, mut suitable_pages) = (0u64, 0u64, 0u64, 0u64);
        for (o, row) in g.free_area.iter().enumerate() {
            let n: u64 = row.iter().map(|l| l.nr).sum();
            blocks += n;
            pages += n << o;
            if o as u32 >= order {
                suitable += n << (o as u32 - order);
                suitable_pages += n << o;
            }
        }
        (pages, blocks, suitable, suitable_pages)
    }

    /// Linux's fragmentation index of `order` in a zone: -1000 when a free block of
    /// that order exists; otherwise from 0 (an allocation would fail for lack of
    /// memory) to 1000 (it fails for fragmentation only). Lazily freed, unmerged
    /// pages count as order-0 blocks, so they read as fragmentation (merge on
    /// demand fixes that cheaply).
    pub fn fragmentation_index(&self, zone: usize, order: u32) -> i32 {
        let (pages, blocks, suitable, _) = self.contig_page_info(zone, order);
        if blocks == 0 {
            return 0;
        }
        if suitable > 0 {
            return -1000;
        }
        let requested = 1u64 << order;
        (1000 - ((1000 + pages * 1000 / requested) / blocks) as i64).clamp(0, 1000) as i32
    }
}
