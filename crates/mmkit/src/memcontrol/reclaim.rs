//! The reclaim walk over memory cgroups (Linux's `shrink_node_memcgs` with
//! `mem_cgroup_calculate_protection` and `get_scan_count`'s proportional
//! protection): global reclaim (kswapd, direct reclaim, `Mm::reclaim`) walks
//! the root's lists and every group's; limit, `high` and proactive reclaim
//! walk the target group's subtree.
//!
//! One walk, for one node and `nr` pages:
//! 1. effective protection computed top-down from the target (the target
//!    itself, and the root, are unprotected);
//! 2. each group with pages on the node's lists: below its effective `min`,
//!    skipped; below its effective `low`, skipped on the first pass (the
//!    second pass, the last resort, runs only in reclaim's forced round when
//!    the first freed nothing and skipped a group; it reclaims such a group
//!    and counts `events.low`); otherwise its scan size is its
//!    lists less their protected share (`proportional_scan`, at least 32);
//! 3. `nr` is split among the eligible groups in proportion to their scan
//!    sizes, and the groups are visited from the node's cursor (which moves
//!    on one group per walk, so that partial walks take turns), each reclaimed
//!    with `shrink_lruvec` for its share, until `nr` pages are freed.
//!
//! Allocator-paid reclaim (an mmkit addition; Linux gets a similar effect
//! from direct reclaim once kswapd falls behind, and from `memory.high`):
//! while some node is below its high watermark (kswapd's target, so reclaim
//! is wanted), a charge through the slow path (a stock refill: every
//! [`CHARGE_BATCH`](super::charge::CHARGE_BATCH) pages) of a group whose
//! usage is above its protection reclaims as many pages from that group's
//! own lists, in the charging thread, before it returns (`reclaim_own`),
//! and up to four batches more while free memory is below the high
//! watermarks (so it climbs back before the allocator wakes kswapd). A
//! tenant that streams through memory so pays for the memory it takes with
//! its own pages and its own CPU time: kswapd stays mostly asleep, so it
//! neither takes a CPU from the other tenants nor walks their lists on the
//! streamer's behalf. A group at or under its protection (`low`, `min`, or
//! their effective values), or whose swap (or an ancestor's) is at its
//! `swap.max`, never reclaims for its own charges this way, and without
//! groups nothing changes (the root is never charged).
//!
//! Invariants: a group below its effective `min` loses no page to this walk;
//! protection values are recomputed on every walk (they are racy hints, as
//! Linux's).
//!
//! Locking: the group table's read lock to list the groups (dropped before
//! reclaiming); the rest is `vmscan.rs`'s.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mmkit_core::page_counter::proportional_scan;

use super::stat::Event;
use super::MemCgInner;
use crate::lru::VecRef;
use crate::vmscan::{shrink_lruvec, ActiveReclaimer, Reclaimer, Target, SWAP_CLUSTER_MAX};
use crate::Mm;

/// Depth of a group below the root (1 for a child of the root).
fn depth(g: &MemCgInner) -> usize {
    let mut d = 0;
    let mut x = Some(g);
    while let Some(c) = x {
        d += 1;
        x = c.parent().map(|p| &**p);
    }
    d
}

/// Linux's `shrink_node_memcgs` for node `nid`: up to `nr` pages from the
/// lists of `target`'s subtree (`None`: the root and every group). Returns
/// the pages freed.
pub(crate) fn shrink_node_memcgs(
    mm: &Mm,
    nid: usize,
    nr: usize,
    who: Reclaimer,
    target: Option<&MemCgInner>,
    force: bool,
) -> u64 {
    let table = mm.memcg();
    let lru = mm.lru();
    let mut groups: Vec<Arc<MemCgInner>> = table
        .all()
        .into_iter()
        .filter(|g| target.is_none_or(|t| g.is_descendant(t)))
        .collect();
    // Parents before children: effective protection flows down.
    groups.sort_by_key(|g| depth(g));
    let root = match target {
        Some(t) => &t.memory,
        None => &table.root_memory,
    };
    if let Some(t) = target {
        t.memory.clear_protection();
    }
    for g in &groups {
        g.memory.calculate_protection(root, false);
    }
    let mut freed = 0;
    for low_pass in [false, true] {
        let mut skipped = false;
        // (lists, scan size)
        let mut eligible: Vec<(VecRef<'_>, u64)> = Vec::with_capacity(groups.len() + 1);
        if target.is_none() {
            let (a, i) = lru.root().nr_pages(lru, nid);
            if a + i > 0 {
                eligible.push((VecRef::Root, a + i));
            }
        }
        for g in &groups {
            let (a, i) = g.lruvec.nr_pages(lru, nid);
            let size = a + i;
            if size == 0 {
                continue;
            }
            let unprotected = target.is_some_and(|t| std::ptr::eq(t, &**g));
            let usage = g.memory.usage();
            let (emin, elow) = if unprotected {
                (0, 0)
            } else {
                (g.memory.emin(), g.memory.elow())
            };
            if usage <= emin && emin > 0 {
                continue; // Linux's `mem_cgroup_below_min`
            }
            if usage <= elow && elow > 0 {
                if !low_pass {
                    skipped = true;
                    continue;
                }
                g.stats.event(Event::Low);
            }
            let protection = if !low_pass && elow > emin { elow } else { emin };
            eligible.push((VecRef::Group(g), proportional_scan(size, usage, protection)));
        }
        freed += walk(mm, nid, nr, who, force, &eligible);
        // The low pass is the last resort (Linux runs it only after every
        // priority freed nothing): only in the forced round, when the first
        // pass freed nothing and skipped a protected group.
        if freed > 0 || !skipped || !force {
            break;
        }
    }
    freed
}

/// Step 3 of the module header over `eligible` (lists, scan size).
fn walk(
    mm: &Mm,
    nid: usize,
    nr: usize,
    who: Reclaimer,
    force: bool,
    eligible: &[(VecRef<'_>, u64)],
) -> u64 {
    let total: u64 = eligible.iter().map(|e| e.1).sum();
    if total == 0 {
        return 0;
    }
    let table = mm.memcg();
    let start = table.cursors[nid.min(table.cursors.len() - 1)].fetch_add(1, Ordering::Relaxed);
    let lru = mm.lru();
    let mut freed = 0;
    for k in 0..eligible.len() {
        if freed >= nr as u64 {
            break;
        }
        let (vec, scan) = &eligible[(start + k) % eligible.len()];
        let share = ((nr as u64 * scan).div_ceil(total)).clamp(1, nr as u64 - freed);
        let t = Target {
            vec: vec.get(lru),
            group: vec.group(),
        };
        freed += shrink_lruvec(mm, t, nid, share as usize, who, force);
    }
    freed
}

/// Linux's `try_to_free_mem_cgroup_pages`: reclaims up to `nr` pages (at
/// least a batch of [`SWAP_CLUSTER_MAX`]) from `target`'s subtree in the
/// calling thread, every node, walking its groups as `shrink_node_memcgs`
/// does (limit, `high` and proactive reclaim). Returns the pages freed.
pub(crate) fn try_to_free_mem_cgroup_pages(mm: &Mm, target: &MemCgInner, nr: u64) -> u64 {
    if !mm.can_swap_out() {
        return 0;
    }
    let lru = mm.lru();
    let _active = ActiveReclaimer::enter(mm);
    lru.drain_local(mm);
    let goal = nr.max(SWAP_CLUSTER_MAX as u64);
    let mut done = 0;
    for force in [false, true] {
        if force {
            lru.drain_all(mm);
        }
        done = crate::vmscan::reclaim_rounds(mm, goal, done, |nid, want| {
            shrink_node_memcgs(mm, nid, want, Reclaimer::Direct, Some(target), force)
        });
        if done > 0 {
            break;
        }
    }
    done
}

/// Allocator-paid reclaim (see the module header): after a charge of `nr`
/// pages of `g` through the slow path, under global pressure, `nr` pages
/// from `g`'s subtree when `g` is above its protection; the pages freed.
pub(crate) fn reclaim_own(g: &MemCgInner, nr: u64) -> u64 {
    let mm = &g.mm;
    if !mm.below_high_wmark() || !mm.can_swap_out() {
        return 0;
    }
    let m = &g.memory;
    let protection = m.low().max(m.min()).max(m.elow()).max(m.emin());
    if m.usage() <= protection {
        return 0;
    }
    // Nothing of it could go to swap: its pages stay resident (`swap.max`).
    let mut x = Some(g);
    while let Some(c) = x {
        if c.swap.usage() >= c.swap.max() {
            return 0;
        }
        x = c.parent().map(|p| &**p);
    }
    // Also what the nodes lack below their high watermarks (at most 4 more
    // charges' worth), so that free memory climbs back to where kswapd
    // would take it and is not woken by the next allocations.
    let short = mm.total_wmark_high().saturating_sub(mm.nr_free_pages());
    let _stall = super::Stall::enter(g);
    super::reclaim_pages(g, nr + short.min(4 * nr))
}
