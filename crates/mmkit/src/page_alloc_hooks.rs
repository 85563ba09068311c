//! The allocation slow path's hooks into the std runtime (Linux's
//! `wake_all_kswapds`, `__alloc_pages_direct_reclaim` and
//! `__alloc_pages_direct_compact`, which sit in `mm/page_alloc.c` beside
//! `__alloc_pages_slowpath`). The slow path itself is mmkit-core's
//! (`page_alloc/slowpath.rs`); it calls back through [`SlowPathHooks`] for
//! what the core cannot do alone: wake kswapd (`kswapd.rs`) and kcompactd,
//! reclaim (`vmscan.rs`) and compact (`compaction.rs`). Its callers are the
//! `Mm`'s allocation entry points (`lib.rs`, `numa.rs`), each of which makes
//! one [`AllocHooks`] per call; the file is named for the allocator it
//! serves, not for any one of the mechanisms it wakes.
//!
//! Invariants: a block that direct compaction captured belongs to the one
//! call whose hooks captured it: the slow path takes it, or the hooks free it
//! (a later capture of another order, or the drop).
//!
//! Locking: none of its own; the slow path calls the hooks with no allocator
//! lock held, and a fault may call them under its shared VMA lock (see the
//! lock order in `rmap.rs`: reclaim and compaction only try-lock).

use std::cell::Cell;

use mmkit_core::{CompactPriority, CompactResult, SlowPathHooks};

use crate::compaction::try_to_compact_pages;
use crate::{MigrateType, Mm, Pfn};

/// The allocator's slow-path hooks of one `Mm::alloc_pages` call: kswapd's
/// and kcompactd's wake-ups, direct reclaim, and direct compaction with the
/// captured block kept until the slow path takes it (or freed if it does not).
pub(crate) struct AllocHooks<'a> {
    mm: &'a Mm,
    captured: Cell<Option<(Pfn, u32)>>,
}

impl<'a> AllocHooks<'a> {
    #[inline]
    pub(crate) fn new(mm: &'a Mm) -> Self {
        AllocHooks {
            mm,
            captured: Cell::new(None),
        }
    }
}

impl SlowPathHooks for AllocHooks<'_> {
    fn wake_kswapd(&self, _order: u32) {
        self.mm.wakeup_kswapd();
    }

    fn direct_reclaim(&self, _order: u32) -> u64 {
        crate::vmscan::direct_reclaim(self.mm)
    }

    fn can_reclaim(&self) -> bool {
        self.mm.can_swap_out()
    }

    fn wake_kcompactd(&self, order: u32) {
        self.mm.wakeup_kcompactd(order);
    }

    fn direct_compact(&self, order: u32, mt: MigrateType, prio: CompactPriority) -> CompactResult {
        if !self.mm.inner.compact.direct {
            return CompactResult::Skipped;
        }
        let (r, captured) = try_to_compact_pages(self.mm, order, mt, prio);
        if let Some(p) = captured {
            if let Some((old, o)) = self.captured.replace(Some((p, order))) {
                let _ = self.mm.free_pages(old, o);
            }
        }
        r
    }

    fn take_captured(&self, order: u32) -> Option<Pfn> {
        match self.captured.take() {
            Some((p, o)) if o == order => Some(p),
            Some((p, o)) => {
                let _ = self.mm.free_pages(p, o);
                None
            }
            None => None,
        }
    }
}

impl AllocHooks<'_> {
    /// Frees a captured block the allocation did not use.
    #[cold]
    #[inline(never)]
    fn release_captured(&self, p: Pfn, o: u32) {
        let _ = self.mm.free_pages(p, o);
    }
}

impl Drop for AllocHooks<'_> {
    // Inline, the release out of line: every allocation drops its hooks, and
    // only one that compacted has captured a block.
    #[inline(always)]
    fn drop(&mut self) {
        if let Some((p, o)) = self.captured.take() {
            self.release_captured(p, o);
        }
    }
}
