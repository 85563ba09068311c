//! The space side of memory policies (Linux's `mm/mempolicy.c` system calls):
//! the policies of a space and its ranges (`set_mempolicy`, `mbind`,
//! `get_mempolicy`, `move_pages` with no target), the node a fault allocates on,
//! and the local/remote count of the access path. The policy values and their
//! placement arithmetic are the top-level `mempolicy.rs`.
//!
//! A space holds a table of the policies it was given (`Policies`); a VMA names
//! one by index (`Vma::pol`, 0 = none: the space's policy applies) and carries
//! the address its page offsets count from (`Vma::pgoff`: the mapping's start,
//! or the `mbind` range's start; splits keep it), so interleaving puts the page
//! at offset `i` of the range on the `(i mod n)`-th node of the mask, a huge
//! page by its huge-page index. `mbind` splits VMAs at the range's ends (and a
//! huge PMD straddling an end) as Linux's `mbind_range` does; adjacent VMAs with
//! the same policy are not merged back. `mbind`'s scan for misplaced pages walks
//! the range with `walk_page_range` (`pagewalk.rs`).
//!
//! A fault allocates with [`MemPolicy::placement`] for its address and the
//! faulting thread's node. With one node none of this runs: the fault path
//! allocates as it always did.
//!
//! Invariants: a policy in the table was validated against the Mm's topology;
//! the table only grows (indices stay valid). Bad input (unaligned or unmapped
//! range, a node that does not exist, an empty mask) changes nothing.
//!
//! Locking: the table has its own reader-writer lock (a leaf: nothing is taken
//! under it); VMA policies change under the exclusive VMA lock. `mbind`'s moves
//! run after that lock is dropped, through `migrate.rs` (page side).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use mmkit_core::node::NodeMask;
use mmkit_core::NodeReq;

use super::mmap::{bad, check_range, page_range, Vma};
use super::mmu::not_in_page;
use super::pagewalk::{ControlFlow, MmWalk, MmWalkOps};
use super::{Space, SpaceInner, Stat, PAGE};
use crate::mempolicy::{MbindFlags, MemPolicy, Placement};
use crate::migrate::{migrate_page, MigrateError};
use crate::pgtable::{Pte, HPAGE_PMD_ORDER, PMD_SIZE};
use crate::rmap::RmapWalkControl;
use crate::{Error, Gfp, Pfn};

/// The policies a space was given: index 0 is `Default`; `space` is the index
/// of the space's own policy.
pub(super) struct Policies {
    table: RwLock<Vec<Arc<MemPolicy>>>,
    space: AtomicU32,
}

impl Default for Policies {
    fn default() -> Policies {
        Policies {
            table: RwLock::new(vec![Arc::new(MemPolicy::Default)]),
            space: AtomicU32::new(0),
        }
    }
}

impl Policies {
    /// The index of `p`, added if new.
    fn intern(&self, p: MemPolicy) -> u32 {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = t.iter().position(|q| **q == p) {
            return i as u32;
        }
        t.push(Arc::new(p));
        (t.len() - 1) as u32
    }

    fn get(&self, idx: u32) -> Arc<MemPolicy> {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        t.get(idx as usize).cloned().unwrap_or_else(|| t[0].clone())
    }

    /// The policy in force for `vma`: its range policy, else the space's.
    pub(super) fn effective(&self, vma: &Vma) -> Arc<MemPolicy> {
        let idx = if vma.pol != 0 {
            vma.pol
        } else {
            self.space.load(Ordering::Acquire)
        };
        self.get(idx)
    }
}

/// What `mbind` with [`MbindFlags::MOVE`] did with the pages already in the range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MbindReport {
    /// Pages migrated to the policy's nodes.
    pub moved: u64,
    /// Addresses of resident pages not on the policy's nodes that stayed where
    /// they are: pinned or busy, huge, or no free page on the policy's nodes.
    pub not_moved: Vec<u64>,
}

/// Does interleaving choose the node per page offset?
fn interleaves(p: &MemPolicy) -> bool {
    matches!(
        p,
        MemPolicy::Interleave(_) | MemPolicy::WeightedInterleave(_)
    )
}

/// The nodes a page under `p` may stay on (`mbind`'s MOVE moves the others);
/// `None`: anywhere (`Default`).
pub(super) fn allowed_nodes(p: &MemPolicy, thread_node: usize) -> Option<NodeMask> {
    match p {
        MemPolicy::Default => None,
        MemPolicy::Local => Some(NodeMask::from_nodes(&[thread_node])),
        MemPolicy::Preferred(n) => Some(NodeMask::from_nodes(&[*n])),
        MemPolicy::Bind(m) | MemPolicy::PreferredMany(m) | MemPolicy::Interleave(m) => Some(*m),
        MemPolicy::WeightedInterleave(w) => Some(w.iter().map(|&(n, _)| n).collect()),
    }
}

/// The allocator request of a placement: its preferred node's zonelist, within
/// the policy's nodes when it may not fall back (`Bind`: the thread's zonelist
/// restricted to the mask, as Linux walks it).
fn node_req(pl: &Placement, local: usize) -> NodeReq {
    if pl.fallback {
        NodeReq {
            preferred: pl.preferred,
            local,
            nodemask: None,
            interleave: pl.interleaved,
        }
    } else {
        NodeReq {
            preferred: local,
            local,
            nodemask: Some(pl.nodes.iter().copied().collect()),
            interleave: false,
        }
    }
}

/// The first try of a `PreferredMany` placement: only the policy's own nodes.
fn preferred_many_req(p: &MemPolicy, pl: &Placement, local: usize) -> Option<NodeReq> {
    matches!(p, MemPolicy::PreferredMany(_)).then(|| NodeReq {
        preferred: pl.preferred,
        local,
        nodemask: Some(pl.nodes[..pl.policy_nodes].iter().copied().collect()),
        interleave: false,
    })
}

/// `mbind`'s scan: the resident pages of the range not on `mask`'s nodes, as
/// (address, pfn, huge PMD) in address order.
struct Misplaced<'a> {
    mm: &'a crate::Mm,
    mask: NodeMask,
    found: &'a mut Vec<(u64, Pfn, bool)>,
}

impl Misplaced<'_> {
    fn leaf(&mut self, e: Pte, addr: u64, huge: bool) {
        if e.is_present() && !self.mask.contains(self.mm.node_of(e.pfn())) {
            self.found.push((addr, e.pfn(), huge));
        }
    }
}

impl MmWalkOps for Misplaced<'_> {
    type Break = Infallible;

    fn pmd_entry(
        &mut self,
        _: &MmWalk<'_>,
        _: &AtomicU64,
        e: Pte,
        addr: u64,
        _: u64,
    ) -> ControlFlow<Infallible> {
        self.leaf(e, addr, true);
        ControlFlow::Continue(())
    }

    fn pte_entry(
        &mut self,
        _: &MmWalk<'_>,
        _: &AtomicU64,
        e: Pte,
        addr: u64,
    ) -> ControlFlow<Infallible> {
        self.leaf(e, addr, false);
        ControlFlow::Continue(())
    }
}

impl SpaceInner {
    /// The placement of the page at `va` (order `order`) under `vma`'s policy,
    /// for the calling thread.
    fn fault_placement(&self, vma: &Vma, va: u64, order: u32) -> (Arc<MemPolicy>, Placement) {
        let p = self.policies.effective(vma);
        let pgoff = (va.saturating_sub(vma.pgoff) / PAGE) >> order;
        let pl = p.placement(self.mm.topology(), self.mm.thread_node(), pgoff);
        (p, pl)
    }

    /// Up to `out.len()` order-0 pages for the addresses from `va` on (the
    /// fault-around batch), fast path only, each on the node its policy picks.
    pub(super) fn alloc_fault_pages_bulk(&self, vma: &Vma, va: u64, out: &mut [Pfn]) -> usize {
        let mm = &self.mm;
        if mm.nr_nodes() == 1 {
            return mm.alloc_owned_pages_bulk(Gfp::MOVABLE, out);
        }
        let local = mm.thread_node();
        let (p, pl) = self.fault_placement(vma, va, 0);
        if !interleaves(&p) {
            if let Some(req) = preferred_many_req(&p, &pl, local) {
                let n = mm.alloc_owned_pages_bulk_req(Gfp::MOVABLE, req, out);
                if n > 0 {
                    return n;
                }
            }
            return mm.alloc_owned_pages_bulk_req(Gfp::MOVABLE, node_req(&pl, local), out);
        }
        // Interleaved: each page on its own offset's node.
        for i in 0..out.len() {
            let (_, pl) = self.fault_placement(vma, va + i as u64 * PAGE, 0);
            let req = node_req(&pl, local);
            if mm.alloc_owned_pages_bulk_req(Gfp::MOVABLE, req, &mut out[i..i + 1]) == 0 {
                return i;
            }
        }
        out.len()
    }

    /// One block of 2^order pages for `va` (slow path allowed) on the node its
    /// policy picks.
    pub(super) fn alloc_fault_pages(
        &self,
        vma: &Vma,
        va: u64,
        gfp: Gfp,
        order: u32,
    ) -> Result<Pfn, Error> {
        let mm = &self.mm;
        if mm.nr_nodes() == 1 {
            return mm.alloc_owned_pages(gfp, order);
        }
        let local = mm.thread_node();
        let (p, pl) = self.fault_placement(vma, va, order);
        if let Some(req) = preferred_many_req(&p, &pl, local) {
            if let Ok(pfn) = mm.alloc_owned_pages_req(gfp | Gfp::NOWARN, order, req) {
                return Ok(pfn);
            }
        }
        mm.alloc_owned_pages_req(gfp, order, node_req(&pl, local))
    }

    /// Counts an access of `pfn` as local or remote (more than one node only).
    #[inline(never)]
    pub(super) fn count_access(&self, pfn: Pfn) {
        let remote = self.mm.count_access(pfn);
        let s = if remote {
            Stat::RemoteAccesses
        } else {
            Stat::LocalAccesses
        };
        self.stats.add(s, 1);
    }
}

impl Space {
    /// Sets the space's memory policy, for pages faulted from now on where no
    /// range policy ([`mbind`](Self::mbind)) applies (Linux's `set_mempolicy`).
    /// A policy naming a node that does not exist, an empty mask or a zero
    /// weight is refused ([`Error::Policy`]) and nothing changes.
    pub fn set_mempolicy(&self, policy: MemPolicy) -> Result<(), Error> {
        policy.validate(self.mm().topology())?;
        let pols = &self.inner.policies;
        let idx = pols.intern(policy);
        pols.space.store(idx, Ordering::Release);
        Ok(())
    }

    /// The policy in force at `addr`: the range's (`mbind`), else the space's
    /// (Linux returns `default` there; the effective policy is more useful).
    /// An unmapped address is refused.
    pub fn get_mempolicy(&self, addr: u64) -> Result<MemPolicy, Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        let g = self.inner.read_lock();
        let vma = g
            .find(addr)
            .ok_or_else(|| bad(addr, 1, "address is not mapped"))?;
        Ok((*self.inner.policies.effective(vma)).clone())
    }

    /// The node of the page resident at `addr` (Linux's `move_pages` with no
    /// target); `None` when nothing is resident there.
    pub fn node_of(&self, addr: u64) -> Option<usize> {
        self.translate(addr).map(|t| self.mm().node_of(t.pfn))
    }

    /// Sets the memory policy of `[addr, addr + len)` (`addr` page aligned, `len`
    /// rounded up to 4 KiB, the range entirely mapped) for pages faulted there
    /// from now on, splitting mappings at the range's ends (Linux's `mbind`).
    /// `Default` gives the range back to the space's policy. With
    /// [`MbindFlags::MOVE`] the pages already resident in the range that are not
    /// on the policy's nodes are migrated there (each to the node the policy
    /// picks for its offset); pinned or busy pages, huge pages and pages for
    /// which the policy's nodes have no free page stay, and are listed in the
    /// report. With [`MbindFlags::STRICT`] alone, a misplaced resident page makes
    /// the call fail with [`Error::Misplaced`] and nothing changes; with `MOVE`
    /// too, pages that could not be moved make it fail after the policy was set
    /// and the others were moved (as Linux's `-EIO`).
    ///
    /// Refused, with nothing changed: an unaligned or unmapped range, a zero
    /// length, a policy naming a node that does not exist or an empty mask.
    pub fn mbind(
        &self,
        addr: u64,
        len: usize,
        policy: MemPolicy,
        flags: MbindFlags,
    ) -> Result<MbindReport, Error> {
        not_in_page(addr)?;
        let len = len as u64;
        let end = page_range(addr, len, "mbind address is not page aligned")?;
        let mm = self.mm().clone();
        policy.validate(mm.topology())?;
        let thread_node = mm.thread_node();
        let allowed = allowed_nodes(&policy, thread_node);
        let inner = &self.inner;
        let misplaced: Vec<(u64, Pfn, bool)>;
        {
            let mut g = inner.write_lock();
            if !g.covers(addr, end) {
                return Err(bad(addr, len, "range is not entirely mapped"));
            }
            // The resident pages not on the policy's nodes (before any change).
            let mut found = Vec::new();
            if let Some(mask) = allowed {
                let mut scan = Misplaced {
                    mm: &mm,
                    mask,
                    found: &mut found,
                };
                let _ = inner.walk_page_range(&g, addr, end, &mut scan);
            }
            if flags.contains(MbindFlags::STRICT) && !flags.contains(MbindFlags::MOVE) {
                if let Some(&(first, _, _)) = found.first() {
                    return Err(Error::Misplaced {
                        count: found.len() as u64,
                        first,
                    });
                }
            }
            let idx = if policy == MemPolicy::Default {
                0
            } else {
                inner.policies.intern(policy.clone())
            };
            for b in [addr, end] {
                if b & (PMD_SIZE - 1) != 0 {
                    inner.split_huge_pmd(&g, b);
                }
                g.split_at(b);
            }
            let starts: Vec<u64> = g.map.range(addr..end).map(|(k, _)| *k).collect();
            for s in starts {
                if let Some(v) = g.map.get_mut(&s) {
                    v.pol = idx;
                    v.pgoff = addr;
                }
            }
            inner.nr_vmas.store(g.map.len() as u64, Ordering::Relaxed);
            misplaced = found;
        }
        let mut report = MbindReport::default();
        if flags.contains(MbindFlags::MOVE) {
            let mut rwc = RmapWalkControl::default();
            for &(a, src, huge) in &misplaced {
                if huge || !self.move_page(&mut rwc, &policy, a, addr, src, thread_node) {
                    report.not_moved.push(a);
                } else {
                    report.moved += 1;
                }
            }
        } else {
            report.not_moved = misplaced.iter().map(|m| m.0).collect();
        }
        if flags.contains(MbindFlags::STRICT) && !report.not_moved.is_empty() {
            return Err(Error::Misplaced {
                count: report.not_moved.len() as u64,
                first: report.not_moved[0],
            });
        }
        Ok(report)
    }

    /// Migrates the page `src` mapped at `a` (offset from `base` under `policy`)
    /// to the node the policy picks, within its nodes. False when it stayed.
    fn move_page(
        &self,
        rwc: &mut RmapWalkControl,
        policy: &MemPolicy,
        a: u64,
        base: u64,
        src: Pfn,
        thread_node: usize,
    ) -> bool {
        let mm = self.mm();
        let pl = policy.placement(mm.topology(), thread_node, (a - base) / PAGE);
        let mask = allowed_nodes(policy, thread_node);
        let preferred = if mask.is_some_and(|m| m.contains(pl.preferred)) {
            pl.preferred
        } else {
            mask.and_then(|m| m.first()).unwrap_or(pl.preferred)
        };
        let req = NodeReq {
            preferred,
            local: thread_node,
            nodemask: mask,
            interleave: false,
        };
        let Ok(dst) = mm.alloc_owned_pages_req(Gfp::MOVABLE | Gfp::NOWARN, 0, req) else {
            return false;
        };
        match migrate_page(mm, rwc, src, dst) {
            Ok(()) => {
                // The mapping's reference of the old page: the last one frees it.
                mm.unpin_page(src);
                true
            }
            Err(MigrateError::Pinned | MigrateError::Changed) => {
                mm.free_owned_pages(dst, 0)
                    .expect("freeing our own unpublished page");
                false
            }
        }
    }
}

// Huge pages are interleaved by their huge-page index.
const _: () = assert!(HPAGE_PMD_ORDER == 9);
