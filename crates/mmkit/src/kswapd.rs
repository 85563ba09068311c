//! kswapd (Linux's `balance_pgdat` loop in `mm/vmscan.c`): one background thread
//! per node, woken by the allocator's slow path (`wake_kswapd`, called when an
//! allocation found free memory below the low watermark), reclaiming in batches
//! of 32 until free memory is above the high watermark or no progress is made.
//!
//! Invariants: the thread holds the `Mm` only weakly between runs (`kthread.rs`);
//! a run stops at the high watermark, at the first batch that frees nothing, or
//! after `MAX_BATCHES_PER_RUN` batches (the next wake-up or period resumes).
//!
//! Locking: none of its own; the pending work is the kthread's `bool` flag.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::kthread::Kthread;
use crate::vmscan::{shrink_node, Reclaimer, SWAP_CLUSTER_MAX};
use crate::{Mm, MmInner};

/// How often kswapd looks without being woken.
const KSWAPD_PERIOD: Duration = Duration::from_millis(200);
/// Batches one run reclaims at most before it parks again.
const MAX_BATCHES_PER_RUN: usize = 4096;

impl Mm {
    /// Is node `nid`'s free memory at or above its high watermark (Linux's
    /// `pgdat_balanced`)?
    fn node_balanced(&self, nid: usize) -> bool {
        self.node_nr_free_pages(nid) >= self.inner.wmark_high[nid]
    }

    /// Is some node's free memory below its high watermark (kswapd's target:
    /// reclaim is wanted)? Cheap when memory is plentiful: the buddy lists'
    /// counts alone (one word per zone) above every high watermark answer
    /// no without reading every CPU's list counts.
    pub(crate) fn below_high_wmark(&self) -> bool {
        let pa = self.page_alloc();
        let buddy: u64 = (0..pa.nr_zones()).map(|z| pa.zone_nr_free(z)).sum();
        if buddy >= self.total_wmark_high() && self.inner.wmark_high.len() == 1 {
            return false;
        }
        (0..self.inner.wmark_high.len()).any(|nid| !self.node_balanced(nid))
    }

    /// The high watermarks of all nodes together.
    pub(crate) fn total_wmark_high(&self) -> u64 {
        self.inner.wmark_high.iter().sum()
    }

    /// The allocator's `wake_kswapd` hook: wakes the kswapd of each node that is
    /// below its high watermark, when there is swap to reclaim to.
    pub(crate) fn wakeup_kswapd(&self) {
        if !self.can_swap_out() {
            return;
        }
        for (nid, k) in self.inner.kswapd.iter().enumerate() {
            if !self.node_balanced(nid) {
                k.wake(|pending| !std::mem::replace(pending, true));
            }
        }
    }
}

/// Starts one kswapd per node on the handles in `inner.kswapd`.
pub(crate) fn start_kswapd(inner: &Arc<MmInner>) {
    for (nid, k) in inner.kswapd.iter().enumerate() {
        start_one(inner, k, nid);
    }
}

fn start_one(inner: &Arc<MmInner>, k: &Kthread<bool>, nid: usize) {
    let weak: Weak<MmInner> = Arc::downgrade(inner);
    k.start(
        &format!("mmkit-kswapd{nid}"),
        KSWAPD_PERIOD,
        move |_woken| {
            let Some(inner) = weak.upgrade() else {
                return false;
            };
            let mm = Mm { inner };
            balance_node(&mm, nid);
            true
        },
    );
}

/// Linux's `balance_pgdat`: reclaims on node `nid` until it is balanced.
/// Ends with Linux's `snapshot_refaults` (the Classic policy deactivates
/// while refaults are activated between two runs).
fn balance_node(mm: &Mm, nid: usize) {
    for _ in 0..MAX_BATCHES_PER_RUN {
        if mm.node_balanced(nid)
            || !mm.can_swap_out()
            || shrink_node(mm, nid, SWAP_CLUSTER_MAX, Reclaimer::Kswapd) == 0
        {
            break;
        }
    }
    crate::workingset::snapshot_refaults(mm, nid);
}
