//! Nodes in the page allocator (Linux's `__alloc_pages(gfp, order,
//! preferred_nid, nodemask)`, `__GFP_THISNODE` and `zone_statistics`): the
//! allocation entry points that name a preferred node and a nodemask, the
//! zonelist walk they share with the plain entry points, and the per-node
//! `numa_*` counters.
//!
//! One zone per node, so zone index == node id. A request walks its preferred
//! node's zonelist (nearest first, built by `node::Zonelists`), skipping nodes
//! outside its nodemask; `Gfp::THISNODE` cuts the walk to the preferred node. The
//! plain entry points (`alloc_pages`, `alloc_pages_bulk`) prefer node 0 with no
//! nodemask: with one node that walk is the one-entry slice `[0]`, the same work
//! as a single zone.
//!
//! Counters (Linux's semantics, counted where a request was satisfied, one per
//! allocation or per page of a bulk allocation): on the node that supplied the
//! page, `numa_hit` when it is the preferred node (the first node of the
//! preferred node's zonelist inside the nodemask), else `numa_miss` (and
//! `numa_foreign` on the preferred node); `numa_interleave` when an interleaving
//! request got its node; `numa_local` when the node is the requester's own, else
//! `numa_other`. They are per-CPU atomics folded on read. With one node nothing
//! is counted on the hot path: every allocation is a local hit, so `numa_hit` and
//! `numa_local` read as the `pgalloc` count and the others as 0.
//!
//! Locking: none of its own (relaxed per-CPU atomics).

use core::sync::atomic::{AtomicU64, Ordering};

use super::{AllocError, PageAlloc, SlowPathHooks};
use crate::gfp::{AllocContext, Gfp};
use crate::node::NodeMask;
use crate::page::{Pfn, PG_OWNED};
use crate::platform::Platform;
use crate::stat::VmEvent;

/// Where an allocation should come from (the node arguments of Linux's
/// `__alloc_pages`, plus the requester's own node for `numa_local`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NodeReq {
    /// The node whose zonelist is walked, and which `numa_hit` is counted against.
    pub preferred: usize,
    /// The requesting CPU's or thread's node (`numa_local` / `numa_other`).
    pub local: usize,
    /// Only these nodes (Linux's nodemask, as `MPOL_BIND` makes); `None`: any.
    pub nodemask: Option<NodeMask>,
    /// The preferred node was chosen by interleaving (`numa_interleave`).
    pub interleave: bool,
}

impl NodeReq {
    /// Prefer `node`, from a requester on `local`, any node allowed.
    pub const fn node(node: usize, local: usize) -> NodeReq {
        NodeReq {
            preferred: node,
            local,
            nodemask: None,
            interleave: false,
        }
    }
}

/// The per-node NUMA counters (Linux's `/sys/devices/system/node/nodeN/numastat`).
#[derive(Copy, Clone, Debug)]
#[repr(usize)]
pub enum NumaStat {
    /// Allocated here, and this was the preferred node.
    Hit,
    /// Allocated here, but another node was preferred.
    Miss,
    /// Preferred here, but allocated on another node.
    Foreign,
    /// Interleaving chose this node and the page came from it.
    Interleave,
    /// Allocated here for a requester on this node.
    Local,
    /// Allocated here for a requester on another node.
    Other,
}
const NR_NUMA_STATS: usize = 6;

/// A snapshot of one node's NUMA counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaStats {
    /// `numa_hit`.
    pub numa_hit: u64,
    /// `numa_miss`.
    pub numa_miss: u64,
    /// `numa_foreign`.
    pub numa_foreign: u64,
    /// `numa_interleave`.
    pub interleave_hit: u64,
    /// `numa_local`.
    pub local_node: u64,
    /// `numa_other`.
    pub other_node: u64,
}

/// One CPU's counters for one node, on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
pub(super) struct NumaCounters([AtomicU64; NR_NUMA_STATS]);

impl NumaCounters {
    #[inline]
    fn add(&self, s: NumaStat, n: u64) {
        self.0[s as usize].fetch_add(n, Ordering::Relaxed);
    }
    pub(super) fn reset(&self) {
        for c in &self.0 {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Is node (== zone) `z` inside the request's nodemask?
#[inline(always)]
pub(super) fn node_allowed(ac: &AllocContext, z: usize) -> bool {
    ac.nodemask & (1u64 << z) != 0
}

impl<P: Platform> PageAlloc<P> {
    /// The zones a request walks, nearest first: its preferred node's zonelist,
    /// or only that node under `Gfp::THISNODE` (the nodemask is applied by the
    /// walkers).
    #[inline(always)]
    pub(super) fn zonelist(&self, ac: &AllocContext) -> &[usize] {
        if self.zones.len() == 1 {
            return &[0];
        }
        let zl = self.zonelists.fallback_order(ac.nid);
        if ac.gfp.thisnode() {
            &zl[..zl.len().min(1)]
        } else {
            zl
        }
    }

    /// Counts `n` pages handed out from node `z` for `ac` (Linux's
    /// `zone_statistics`). Nothing with one node.
    #[inline(always)]
    pub(super) fn zone_statistics(&self, ac: &AllocContext, z: usize, n: u64) {
        if !self.numa.is_empty() && n > 0 {
            self.count_numa(ac, z, n);
        }
    }

    #[inline(never)]
    fn count_numa(&self, ac: &AllocContext, z: usize, n: u64) {
        let nn = self.zones.len();
        let base = self.cpu() * nn;
        let row = |node: usize| &self.numa[base + node];
        if z == ac.hit_nid {
            row(z).add(NumaStat::Hit, n);
            if ac.interleave {
                row(z).add(NumaStat::Interleave, n);
            }
        } else {
            row(z).add(NumaStat::Miss, n);
            row(ac.hit_nid).add(NumaStat::Foreign, n);
        }
        if z == ac.local {
            row(z).add(NumaStat::Local, n);
        } else {
            row(z).add(NumaStat::Other, n);
        }
    }

    /// Node `node`'s NUMA counters, folded over CPUs (zeroes for a node that
    /// does not exist).
    pub fn numa_stats(&self, node: usize) -> NumaStats {
        let nn = self.zones.len();
        if node >= nn {
            return NumaStats::default();
        }
        if self.numa.is_empty() {
            let allocs = self.vm_events().get(VmEvent::PgAlloc);
            return NumaStats {
                numa_hit: allocs,
                local_node: allocs,
                ..NumaStats::default()
            };
        }
        let mut v = [0u64; NR_NUMA_STATS];
        for cpu in 0..self.ncpu {
            for (i, c) in self.numa[cpu * nn + node].0.iter().enumerate() {
                v[i] += c.load(Ordering::Relaxed);
            }
        }
        NumaStats {
            numa_hit: v[NumaStat::Hit as usize],
            numa_miss: v[NumaStat::Miss as usize],
            numa_foreign: v[NumaStat::Foreign as usize],
            interleave_hit: v[NumaStat::Interleave as usize],
            local_node: v[NumaStat::Local as usize],
            other_node: v[NumaStat::Other as usize],
        }
    }

    /// The first pfn and the number of frames of node `node`.
    pub fn node_span(&self, node: usize) -> Option<(Pfn, u64)> {
        let z = self.zones.get(node)?;
        Some((
            Pfn::new(z.span.start as u64),
            (z.span.end - z.span.start) as u64,
        ))
    }

    /// The free pages of node `node` (buddy lists and per-CPU lists and caches).
    pub fn node_nr_free_pages(&self, node: usize) -> u64 {
        let Some(z) = self.zones.get(node) else {
            return 0;
        };
        let buddy = z.nr_free_mirror.load(Ordering::Relaxed);
        let pcp: u64 = self
            .pcp
            .iter()
            .skip(node * self.ncpu)
            .take(if self.pcp.is_empty() { 0 } else { self.ncpu })
            .map(|p| p.count_mirror.load(Ordering::Relaxed) as u64)
            .sum();
        let cached = self.caches.as_ref().map_or(0, |c| c.nr_pages(node));
        buddy + pcp + cached
    }

    /// The context of a request on nodes, or `BadNode`.
    fn node_context(&self, gfp: Gfp, req: &NodeReq) -> Result<AllocContext, AllocError> {
        let nn = self.zones.len();
        let all = NodeMask::first_n(nn).bits();
        let mask = req.nodemask.map_or(all, |m| m.bits());
        if req.preferred >= nn || mask & all == 0 {
            return Err(AllocError::BadNode);
        }
        let mut ac = AllocContext::new(gfp);
        ac.nid = req.preferred;
        ac.hit_nid = self
            .zonelists
            .fallback_order_in(req.preferred, NodeMask::from_bits(mask & all))
            .next()
            .unwrap_or(req.preferred);
        ac.local = if req.local < nn {
            req.local
        } else {
            req.preferred
        };
        ac.nodemask = mask;
        ac.interleave = req.interleave;
        Ok(ac)
    }

    /// Allocates 2^order pages from `req.preferred`'s zonelist within
    /// `req.nodemask` (Linux's `__alloc_pages`); `Gfp::THISNODE` allows only the
    /// preferred node. `BadNode` for a node that does not exist or a nodemask
    /// with none of this allocator's nodes.
    #[inline]
    pub fn alloc_pages_nodemask(
        &self,
        gfp: Gfp,
        order: u32,
        req: NodeReq,
        hooks: &impl SlowPathHooks,
    ) -> Result<Pfn, AllocError> {
        let ac = self.node_context(gfp, &req)?;
        self.alloc_pages_ac(&ac, order, hooks, 0, true)
    }

    /// `alloc_pages_nodemask` for the layer above's own use (`PG_OWNED`, see
    /// `alloc_owned_pages`).
    #[inline]
    pub fn alloc_owned_pages_nodemask(
        &self,
        gfp: Gfp,
        order: u32,
        req: NodeReq,
        hooks: &impl SlowPathHooks,
    ) -> Result<Pfn, AllocError> {
        let ac = self.node_context(gfp, &req)?;
        self.alloc_pages_ac(&ac, order, hooks, PG_OWNED, true)
    }

    /// `alloc_owned_pages_bulk` on nodes (fast path only, see
    /// `alloc_pages_bulk`); 0 for a bad request.
    #[inline]
    pub fn alloc_owned_pages_bulk_nodemask(
        &self,
        gfp: Gfp,
        req: NodeReq,
        out: &mut [Pfn],
    ) -> usize {
        match self.node_context(gfp, &req) {
            Ok(ac) => self.alloc_pages_bulk_ac(&ac, out, PG_OWNED),
            Err(_) => 0,
        }
    }
}
