//! The victim of a swap-in exchange at exhaustion (`do_swap_page` in
//! `space/swap.rs` when memory and swap are both full): a cold resident page
//! is written into the incoming page's slot and unmapped, and its frame takes
//! the incoming page, so that every page written stays readable while any
//! resident page can go out.
//!
//! Invariants: the victim is an isolated, locked order-0 page outside the swap
//! cache with no reference but its mapping's and its isolation's; it leaves
//! its mapping only after its bytes are in the slot. A failed write or unmap
//! puts the caller's bytes back into the slot and the victim back on its list.
//!
//! Locking: as reclaim's (`vmscan.rs`): the page lock is only try-locked, the
//! LRU lock is held only inside `isolate`/`putback`.

use std::sync::atomic::Ordering;

use mmkit_core::page::PG_DIRTY;
use mmkit_core::VmEvent;

use crate::lru::LruList;
use crate::pgtable::{desc, SwapEntry};
use crate::rmap::{self, rmap_walk, PageGuard, RmapWalkControl};
use crate::swapfile::SwapInfoStruct;
use crate::vmscan::{put_isolated, try_to_unmap_swap};
use crate::Mm;

/// Candidates `exchange_victim` looks at before it gives up.
const EXCHANGE_TRIES: usize = 16;

/// The victim of a swap-in exchange (`do_swap_page` when memory and swap are
/// both full, `space/swap.rs`): a resident order-0 page, cold first (the
/// inactive tails, then the active ones), taken off the LRU, locked, its
/// content written into `entry`'s slot (which the caller owns: its cache
/// reference is claimed and only the caller's PTE references it) and its
/// mapping replaced by `entry`. Its frame, still holding its mapping's
/// reference and an isolation reference, is the caller's to reuse; with it,
/// the node to end the isolation on and the victim's LRU state (for its
/// shadow). A candidate that cannot go (busy, pinned, in the swap cache, a
/// huge page, a failed write or unmap) goes back; after a failed write or
/// unmap the slot gets `restore` back (the caller's content). `None`: no
/// resident page could go out.
pub(crate) fn exchange_victim<'a>(
    mm: &'a Mm,
    dev: &SwapInfoStruct,
    entry: SwapEntry,
    restore: &[u8],
) -> Option<(PageGuard<'a>, usize, u8)> {
    let lru = mm.lru();
    let mut rwc = RmapWalkControl::default();
    let mut tries = 0;
    let groups = mm.memcg().all();
    let vecs = std::iter::once(lru.root()).chain(groups.iter().map(|g| &g.lruvec));
    for (list, vec) in [LruList::Inactive, LruList::Active]
        .into_iter()
        .flat_map(|l| vecs.clone().map(move |v| (l, v)))
    {
        for nid in 0..mm.nr_nodes() {
            while tries < EXCHANGE_TRIES {
                let mut got = Vec::with_capacity(1);
                lru.isolate(mm, vec, nid, list, 1, &mut got);
                let Some(&p) = got.first() else { break };
                tries += 1;
                let lock = (desc(mm, p).order() == 0)
                    .then(|| mm.trylock_page(p))
                    .flatten()
                    .filter(|l| {
                        desc(mm, p).refcount().load(Ordering::Acquire) == 2
                            && mm.swapcache_entry(l).is_none()
                    });
                let Some(lock) = lock else {
                    lru.putback(mm, &[(p, list)]);
                    put_isolated(mm, nid, &got);
                    continue;
                };
                // Held by its isolation reference and locked by us.
                let unmapped = dev.swap_writepage(entry, lock.bytes()).is_ok()
                    && rmap_walk(mm, &lock, &mut rwc, |m| {
                        try_to_unmap_swap(mm, m, &lock, dev, entry)
                    })
                    .unwrap_or(false);
                if unmapped {
                    rmap::clear(mm, p);
                    // The slot's swap charge becomes the victim's group's,
                    // and its memory charge goes with its mapping, while
                    // `groups` holds that group.
                    crate::memcontrol::move_swap_charge(mm, dev, entry, p);
                    crate::memcontrol::uncharge_batch(mm, &[(p, 0)]);
                    desc(mm, p).clear_flag(PG_DIRTY);
                    mm.page_alloc().count_vm_event(VmEvent::PswpOut, 1);
                    return Some((lock, nid, lru.state(p)));
                }
                // The slot may hold the victim's bytes now: the caller's back.
                if dev.swap_writepage(entry, restore).is_err() {
                    mm.page_alloc().count_vm_event(VmEvent::SwapIoError, 1);
                }
                drop(lock);
                lru.putback(mm, &[(p, list)]);
                put_isolated(mm, nid, &got);
            }
        }
    }
    None
}
