//! Refault detection (Linux's `mm/workingset.c`, for anonymous pages): each
//! node keeps a non-resident age (`nonresident_age`), a clock that ticks once
//! per eviction and once per activation. Evicting a page leaves a shadow in its
//! freed swap-table slot (the swap cache's entry for the slot, `swap_state.rs`):
//! the clock's value, the node, and whether the page was in the working set
//! (`LRU_WORKINGSET`). When the page faults back in, the refault distance (the
//! clock now minus the shadow's) is the number of evictions and activations
//! that came between: had the lists been that much longer, the page would have
//! stayed. The policy (`LruPolicy::refault_recent`) decides whether that fits
//! (Classic: the active list, as Linux; Protected: what the protected list may
//! hold, free pages included); a recent refault is linked on the active list
//! at once.
//!
//! Events: `workingset_refault_anon` per swap-in that found a shadow,
//! `workingset_activate_anon` for those activated, `workingset_restore_anon`
//! for those activated that were in the working set before.
//!
//! Invariants: a shadow is only ever stored in a slot that a PTE still
//! references (the evicted page's), and taken when the slot is cached again
//! (swap-in or readahead) or freed; the clock only grows.
//!
//! Locking: the clocks and the refault snapshot are relaxed atomics per node.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::lru_policy::{LRU_ACTIVATE, LRU_WORKINGSET};
use mmkit_core::VmEvent;

use crate::Mm;

/// A shadow entry's tag in a swap-cache slot word (pfn + 1 values stay below).
pub(crate) const SHADOW_TAG: u32 = 1 << 31;
const SHADOW_WORKINGSET: u32 = 1 << 30;
const NODE_BITS: u32 = 4;
const EVICTION_BITS: u32 = 30 - NODE_BITS;
const EVICTION_MASK: u64 = (1 << EVICTION_BITS) - 1;

/// Per node: the non-resident age and the activations seen at the end of the
/// last reclaim (Linux's `lruvec->nonresident_age`, `refaults[]`).
pub(crate) struct NodeAges {
    age: Box<[CachePadded<AtomicU64>]>,
    activations: Box<[CachePadded<AtomicU64>]>,
    snapshot: Box<[CachePadded<AtomicU64>]>,
}

impl NodeAges {
    pub(crate) fn new(nr_nodes: usize) -> NodeAges {
        let v = || {
            (0..nr_nodes.max(1))
                .map(|_| CachePadded::default())
                .collect()
        };
        NodeAges {
            age: v(),
            activations: v(),
            snapshot: v(),
        }
    }

    fn node(&self, nid: usize) -> usize {
        nid.min(self.age.len() - 1)
    }
}

/// A shadow: the node's clock at eviction, the node, the workingset bit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shadow {
    pub(crate) nid: usize,
    pub(crate) eviction: u64,
    pub(crate) workingset: bool,
}

impl Shadow {
    /// The slot word for this shadow (`SHADOW_TAG` set).
    pub(crate) fn pack(self) -> u32 {
        let nid = (self.nid as u32) & ((1 << NODE_BITS) - 1);
        SHADOW_TAG
            | if self.workingset {
                SHADOW_WORKINGSET
            } else {
                0
            }
            | (nid << EVICTION_BITS)
            | (self.eviction & EVICTION_MASK) as u32
    }

    /// The shadow a slot word holds, if it holds one.
    pub(crate) fn unpack(word: u32) -> Option<Shadow> {
        (word & SHADOW_TAG != 0).then(|| Shadow {
            nid: ((word >> EVICTION_BITS) & ((1 << NODE_BITS) - 1)) as usize,
            eviction: u64::from(word) & EVICTION_MASK,
            workingset: word & SHADOW_WORKINGSET != 0,
        })
    }
}

/// `n` activations on node `nid` (Linux's `workingset_age_nonresident`): they
/// shorten the inactive list as evictions do.
pub(crate) fn age_nonresident(mm: &Mm, nid: usize, n: u64) {
    if n > 0 {
        let w = &mm.lru().workingset;
        w.age[w.node(nid)].fetch_add(n, Ordering::Relaxed);
    }
}

/// Linux's `workingset_eviction`: the shadow for a page of node `nid` with LRU
/// state `state` evicted now; ticks the clock.
pub(crate) fn workingset_eviction(mm: &Mm, nid: usize, state: u8) -> Shadow {
    let w = &mm.lru().workingset;
    let eviction = w.age[w.node(nid)].fetch_add(1, Ordering::Relaxed);
    Shadow {
        nid: w.node(nid),
        eviction,
        workingset: state & LRU_WORKINGSET != 0,
    }
}

/// Linux's `workingset_refault`: a page swapped back in whose slot held
/// `shadow`. Returns the LRU state it starts with: `LRU_ACTIVATE` (and
/// `LRU_WORKINGSET` back) when the distance passes the policy's test.
pub(crate) fn workingset_refault(mm: &Mm, shadow: Shadow, base: u8) -> u8 {
    let lru = mm.lru();
    let w = &lru.workingset;
    let nid = w.node(shadow.nid);
    let now = w.age[nid].load(Ordering::Relaxed);
    let distance = now.wrapping_sub(shadow.eviction) & EVICTION_MASK;
    let pa = mm.page_alloc();
    pa.count_vm_event(VmEvent::WorkingsetRefaultAnon, 1);
    let (active, inactive) = lru.nr_pages(mm, nid);
    let free = mm.node_nr_free_pages(nid);
    let swap_free = mm.swap().nr_free_allocatable() > 0;
    if !lru
        .policy
        .refault_recent(distance, active, inactive, free, swap_free)
    {
        return base;
    }
    pa.count_vm_event(VmEvent::WorkingsetActivateAnon, 1);
    w.activations[nid].fetch_add(1, Ordering::Relaxed);
    w.age[nid].fetch_add(1, Ordering::Relaxed);
    if shadow.workingset {
        pa.count_vm_event(VmEvent::WorkingsetRestoreAnon, 1);
        base | LRU_ACTIVATE | LRU_WORKINGSET
    } else {
        base | LRU_ACTIVATE
    }
}

/// Were refaults activated on node `nid` since the last reclaim ended (Linux's
/// `prepare_scan_control` test that lets `shrink_active_list` deactivate)?
pub(crate) fn refaults_since_snapshot(mm: &Mm, nid: usize) -> bool {
    let w = &mm.lru().workingset;
    let n = w.node(nid);
    w.activations[n].load(Ordering::Relaxed) != w.snapshot[n].load(Ordering::Relaxed)
}

/// Linux's `snapshot_refaults`, at the end of a reclaim run on node `nid`.
pub(crate) fn snapshot_refaults(mm: &Mm, nid: usize) {
    let w = &mm.lru().workingset;
    let n = w.node(nid);
    w.snapshot[n].store(w.activations[n].load(Ordering::Relaxed), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_pack_roundtrip() {
        for (nid, eviction, workingset) in
            [(0, 0, false), (3, 12345, true), (15, EVICTION_MASK, true)]
        {
            let s = Shadow {
                nid,
                eviction,
                workingset,
            };
            let w = s.pack();
            assert_ne!(w & SHADOW_TAG, 0);
            assert_eq!(Shadow::unpack(w), Some(s));
        }
        assert_eq!(Shadow::unpack(12345), None);
    }
}
