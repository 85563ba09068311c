//! The allocation slow path (Linux's `__alloc_pages_slowpath`): wake kswapd
//! (hook), retry at the min watermark (atomic requests may go lower: half of min
//! for `__GFP_HIGH`, a further quarter when they cannot sleep), merge what lazy
//! merging skipped (merge on demand; not under `LazyNoMerge`) after draining
//! every CPU's lists and caches for orders up to 3, try compaction (hooks; a
//! block the compaction captured is returned at once) and reclaim, and compact
//! again at a higher priority while `should_compact_retry` says a retry can help
//! (bounded). A costly order (above 3) drains the lists only then, as Linux
//! drains after reclaim failed (a drain of every list is thousands of pages
//! under auto-tuned `high`, and the faulting CPUs refill them at once). Then give
//! back high-atomic reserves, and only then report out of memory: every path to
//! `NoMemory` has drained every CPU's lists and caches and retried.
//!
//! Locking: none of its own; the hooks run with no allocator lock held.

use super::numa::node_allowed;
use super::{AllocError, Claim, PageAlloc, SlowPathHooks, PAGE_ALLOC_COSTLY_ORDER};
use crate::compaction::{should_compact_retry, CompactPriority, CompactResult};
use crate::gfp::{AllocContext, MigrateType};
use crate::page::Pfn;
use crate::platform::Platform;
use crate::stat::VmEvent;

/// Slow-path rounds a costly request gets because direct reclaim made progress
/// (bounded; reclaim is a hook of the layer above).
const MAX_RECLAIM_RETRIES: u32 = 3;

/// Consecutive rounds without reclaim progress after which a small request
/// fails (Linux's `MAX_RECLAIM_RETRIES` in `should_reclaim_retry`). A round
/// with progress starts the count again: under many concurrent allocators the
/// pages one task frees are often taken by others before its own retry, and
/// that is no reason to fail while reclaim still frees memory.
const MAX_NO_PROGRESS_LOOPS: u32 = 16;

impl<P: Platform> PageAlloc<P> {
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_slowpath(
        &self,
        order: u32,
        ac: &AllocContext,
        hooks: &impl SlowPathHooks,
        pg: u32,
    ) -> Result<Pfn, AllocError> {
        let cpu = self.cpu();
        self.events[cpu].inc(VmEvent::AllocSlowpath);
        if ac.gfp.can_wake_kswapd() {
            hooks.wake_kswapd(order);
            if order > 0 {
                hooks.wake_kcompactd(order);
            }
        }
        let flags = ac.slow_flags;
        let attempt = |this: &Self| this.get_page_from_freelist(order, flags, ac);
        if let Some(idx) = attempt(self) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        // Lazily freed pages count as free: merge them before going further (the
        // cheap first step). So do pages held on per-CPU lists, but draining every
        // CPU's lists is not cheap (thousands of pages under auto-tuned `high`,
        // each a cache miss and a zone-lock hold per chunk) and empties the lists
        // of CPUs that are busy faulting: as Linux does, a costly order tries
        // direct compaction first and drains only when that failed (Linux drains
        // after reclaim made no progress), while small orders drain at once.
        let costly = order > PAGE_ALLOC_COSTLY_ORDER;
        if !costly {
            self.drain_all_pages();
        }
        // Lazily freed pages are counted free and sit on the order-0 lists
        // already: merging them helps only a higher order.
        if order > 0 && self.cfg.merge.merges_on_demand() {
            self.merge_all();
        }
        if let Some(idx) = attempt(self) {
            return Ok(self.prep_new_page(idx, order, ac.mt, pg));
        }
        if ac.gfp.can_direct_reclaim() {
            // Linux's retry loop: compact at rising priority while compaction
            // failed or withdrew without having seen the whole zone, or while it
            // succeeded but another task took the block (`should_compact_retry`,
            // bounded); reclaim progress also earns a bounded retry.
            let mut prio = CompactPriority::INIT;
            let mut compact_retries = 0;
            let mut reclaim_retries = 0;
            let mut no_progress_loops = 0;
            loop {
                let result = if order > 0 {
                    hooks.direct_compact(order, MigrateType::from_index(ac.mt), prio)
                } else {
                    CompactResult::Skipped
                };
                if result == CompactResult::Success {
                    if let Some(pfn) = hooks.take_captured(order) {
                        // Compaction works on every zone: a block captured on a
                        // node this request may not use goes back (then the
                        // retry below looks at the request's own zones).
                        let nid = self.pfn_to_nid(pfn);
                        if self.zonelist(ac).contains(&nid) && node_allowed(ac, nid) {
                            self.zone_statistics(ac, nid, 1);
                            return Ok(self.prep_new_page(pfn.get() as u32, order, ac.mt, pg));
                        }
                        let _ = self.free_pages_claim(pfn, order, Claim::Owner);
                    }
                }
                let reclaimed = hooks.direct_reclaim(order) > 0;
                // Try again even without progress of our own: concurrent
                // reclaimers may have freed what this one could not find.
                if let Some(idx) = attempt(self) {
                    return Ok(self.prep_new_page(idx, order, ac.mt, pg));
                }
                if !costly && hooks.can_reclaim() {
                    no_progress_loops = if reclaimed { 0 } else { no_progress_loops + 1 };
                    if no_progress_loops <= MAX_NO_PROGRESS_LOOPS {
                        continue;
                    }
                } else if reclaimed && reclaim_retries < MAX_RECLAIM_RETRIES {
                    reclaim_retries += 1;
                    continue;
                }
                if !should_compact_retry(order, result, &mut prio, &mut compact_retries) {
                    break;
                }
            }
        }
        if costly {
            // Compaction could not build the block: the per-CPU lists are the
            // free memory left to try.
            self.drain_all_pages();
            if self.cfg.merge.merges_on_demand() {
                self.merge_all();
            }
            if let Some(idx) = attempt(self) {
                return Ok(self.prep_new_page(idx, order, ac.mt, pg));
            }
        }
        let mut unreserved = false;
        for z in self.zones.iter() {
            unreserved |= z.lock().unreserve_highatomic(&self.mem, z.span, ac.mt);
        }
        if unreserved {
            if let Some(idx) = attempt(self) {
                return Ok(self.prep_new_page(idx, order, ac.mt, pg));
            }
        }
        self.events[self.cpu()].inc(VmEvent::AllocFail);
        Err(AllocError::NoMemory)
    }
}
