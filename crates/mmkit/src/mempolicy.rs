//! Memory policies (Linux's `mm/mempolicy.c`): which nodes a page faulted in a
//! space or range should come from, and the order in which to try them.
//!
//! [`MemPolicy`] is the policy value a space or a range holds; [`MbindFlags`] are
//! `mbind`'s flags; [`MemPolicy::validate`] refuses a policy that names a node the
//! topology does not have, an empty mask or a zero weight; [`MemPolicy::placement`]
//! turns a policy, the faulting thread's node and the page's offset in its range
//! into a [`Placement`]: the nodes to try, nearest first, and whether the
//! allocation may fall back beyond the policy's nodes.
//!
//! Semantics (as Linux, with the range offset as the interleave index):
//! - `Default` and `Local`: the thread's node, then its zonelist (`Default` on a
//!   range means "the space's policy"; the caller resolves that first).
//! - `Bind(mask)`: the thread's zonelist restricted to `mask`; never outside it.
//! - `Preferred(n)`: `n`, then `n`'s zonelist (fallback in distance order).
//! - `PreferredMany(mask)`: the thread's zonelist within `mask`, then the rest of it.
//! - `Interleave(mask)`: the page at offset `i` goes to the `(i mod n)`-th node of
//!   the mask, falling back along that node's zonelist.
//! - `WeightedInterleave(w)`: nodes in ascending order, node `k` taking `w[k]`
//!   consecutive offsets of every period of `sum(w)` offsets.
//!
//! Invariants: a validated policy only names online nodes; a `Placement`'s `nodes`
//! holds each node at most once and starts with the policy's own nodes.
//! Locking: none; policies are values. A space holds them in its policy table
//! (`space/mempolicy.rs`), under a lock of its own (see the lock order in
//! `rmap.rs`).

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use mmkit_core::node::NodeMask;

use crate::topology::Topology;

/// A memory policy (Linux's `MPOL_*` modes).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemPolicy {
    /// The default: for a space, allocate on the faulting thread's node; for a
    /// range, use the space's policy.
    #[default]
    Default,
    /// Allocate on the faulting thread's node (`MPOL_LOCAL`).
    Local,
    /// Only from these nodes, nearest to the thread first (`MPOL_BIND`).
    Bind(NodeMask),
    /// From this node first, then any node by distance (`MPOL_PREFERRED`).
    Preferred(usize),
    /// From these nodes first (nearest to the thread), then any node
    /// (`MPOL_PREFERRED_MANY`).
    PreferredMany(NodeMask),
    /// Round robin over these nodes by page offset (`MPOL_INTERLEAVE`).
    Interleave(NodeMask),
    /// Round robin weighted per node: `(node, weight)` (`MPOL_WEIGHTED_INTERLEAVE`).
    WeightedInterleave(Vec<(usize, u32)>),
}

/// Why a memory policy was refused. A refused call changes nothing.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MempolicyError {
    /// The policy names a node that is not online.
    #[error("node {node} does not exist (online nodes: {online}); name online nodes only")]
    BadNode {
        /// The node given.
        node: usize,
        /// The online nodes, as a node list.
        online: String,
    },
    /// The policy's node mask or weight list is empty.
    #[error("{mode} needs at least one node; give a non-empty node mask")]
    EmptyMask {
        /// The policy mode.
        mode: &'static str,
    },
    /// None of the policy's nodes has memory.
    #[error("{mode}: none of nodes {mask} has memory; name a node with memory")]
    NoMemory {
        /// The policy mode.
        mode: &'static str,
        /// The mask given.
        mask: String,
    },
    /// A weighted-interleave weight is zero.
    #[error("weighted interleave: node {node} has weight 0; give weights of at least 1 or leave the node out")]
    ZeroWeight {
        /// The node with weight 0.
        node: usize,
    },
    /// A node appears twice in a weighted-interleave list.
    #[error("weighted interleave: node {node} is listed twice; list each node once")]
    DuplicateNode {
        /// The repeated node.
        node: usize,
    },
}

/// Where a page should come from: the nodes to try, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The nodes to try, in order; each at most once.
    pub nodes: Vec<usize>,
    /// How many leading entries of `nodes` are the policy's own nodes; the rest
    /// is fallback.
    pub policy_nodes: usize,
    /// True when the allocation may go beyond the policy's nodes (everything but
    /// `Bind`).
    pub fallback: bool,
    /// The node the policy wants (Linux counts `numa_hit` when the page lands on
    /// it, `numa_miss` / `numa_foreign` otherwise).
    pub preferred: usize,
    /// True when interleaving chose the node (Linux's `numa_interleave`).
    pub interleaved: bool,
}

impl MemPolicy {
    /// The policy's name, as `numactl` and `/proc/PID/numa_maps` print it.
    pub fn mode_name(&self) -> &'static str {
        match self {
            MemPolicy::Default => "default",
            MemPolicy::Local => "local",
            MemPolicy::Bind(_) => "bind",
            MemPolicy::Preferred(_) => "prefer",
            MemPolicy::PreferredMany(_) => "prefer (many)",
            MemPolicy::Interleave(_) => "interleave",
            MemPolicy::WeightedInterleave(_) => "weighted interleave",
        }
    }

    /// Checks the policy against `topo`: every node online, masks and weight lists
    /// not empty and holding a node with memory, weights at least 1, no node
    /// listed twice.
    pub fn validate(&self, topo: &Topology) -> Result<(), MempolicyError> {
        let mode = self.mode_name();
        let bad_node = |node| MempolicyError::BadNode {
            node,
            online: topo.online().to_string(),
        };
        let check_mask = |mask: &NodeMask| -> Result<(), MempolicyError> {
            if let Some(node) = mask.invalid_node() {
                return Err(bad_node(node));
            }
            if mask.is_empty() {
                return Err(MempolicyError::EmptyMask { mode });
            }
            if let Some(node) = mask.iter().find(|&n| !topo.is_online(n)) {
                return Err(bad_node(node));
            }
            if mask.and(topo.node_states().memory).is_empty() {
                return Err(MempolicyError::NoMemory {
                    mode,
                    mask: mask.to_string(),
                });
            }
            Ok(())
        };
        match self {
            MemPolicy::Default | MemPolicy::Local => Ok(()),
            MemPolicy::Preferred(node) => {
                if topo.is_online(*node) {
                    Ok(())
                } else {
                    Err(bad_node(*node))
                }
            }
            MemPolicy::Bind(m) | MemPolicy::PreferredMany(m) | MemPolicy::Interleave(m) => {
                check_mask(m)
            }
            MemPolicy::WeightedInterleave(weights) => {
                let mut seen = NodeMask::empty();
                for &(node, weight) in weights {
                    if !topo.is_online(node) {
                        return Err(bad_node(node));
                    }
                    if weight == 0 {
                        return Err(MempolicyError::ZeroWeight { node });
                    }
                    if seen.contains(node) {
                        return Err(MempolicyError::DuplicateNode { node });
                    }
                    seen.insert(node);
                }
                check_mask(&seen)
            }
        }
    }

    /// Where the page at offset `pgoff` (in pages, from the start of the range the
    /// policy covers) faulted by a thread on `thread_node` should come from. The
    /// policy must have passed [`validate`](Self::validate) against `topo`; a
    /// thread node outside the topology counts as the first online node.
    pub fn placement(&self, topo: &Topology, thread_node: usize, pgoff: u64) -> Placement {
        let zl = topo.zonelists();
        let local = if zl.fallback_order(thread_node).is_empty() {
            topo.nodes()[0].id
        } else {
            thread_node
        };
        match self {
            MemPolicy::Default | MemPolicy::Local => from_zonelist(topo, local, 1, false),
            MemPolicy::Preferred(node) => from_zonelist(topo, *node, 1, false),
            MemPolicy::Bind(mask) => {
                let nodes: Vec<usize> = zl.fallback_order_in(local, *mask).collect();
                Placement {
                    policy_nodes: nodes.len(),
                    fallback: false,
                    preferred: nodes.first().copied().unwrap_or(local),
                    interleaved: false,
                    nodes,
                }
            }
            MemPolicy::PreferredMany(mask) => {
                let mut nodes: Vec<usize> = zl.fallback_order_in(local, *mask).collect();
                let policy_nodes = nodes.len();
                let rest = zl
                    .fallback_order(local)
                    .iter()
                    .filter(|&&n| !mask.contains(n));
                nodes.extend(rest);
                Placement {
                    policy_nodes,
                    fallback: true,
                    preferred: nodes.first().copied().unwrap_or(local),
                    interleaved: false,
                    nodes,
                }
            }
            MemPolicy::Interleave(mask) => {
                let n = mask.weight().max(1) as u64;
                let target = mask.nth((pgoff % n) as usize).unwrap_or(local);
                from_zonelist(topo, target, 1, true)
            }
            MemPolicy::WeightedInterleave(weights) => {
                let target = weighted_interleave_nid(weights, pgoff).unwrap_or(local);
                from_zonelist(topo, target, 1, true)
            }
        }
    }
}

/// The node of offset `pgoff` under weighted interleave: nodes in ascending order,
/// each taking as many consecutive offsets as its weight (Linux's
/// `weighted_interleave_nid`). `None` when the weights sum to zero.
pub fn weighted_interleave_nid(weights: &[(usize, u32)], pgoff: u64) -> Option<usize> {
    let mut sorted: Vec<(usize, u32)> = weights.to_vec();
    sorted.sort_unstable_by_key(|&(n, _)| n);
    let total: u64 = sorted.iter().map(|&(_, w)| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut target = pgoff % total;
    for (node, w) in sorted {
        if target < u64::from(w) {
            return Some(node);
        }
        target -= u64::from(w);
    }
    None
}

/// A placement that starts at `start` and falls back along `start`'s zonelist.
fn from_zonelist(
    topo: &Topology,
    start: usize,
    policy_nodes: usize,
    interleaved: bool,
) -> Placement {
    let nodes = topo.zonelists().fallback_order(start).to_vec();
    Placement {
        policy_nodes: policy_nodes.min(nodes.len()),
        fallback: true,
        preferred: nodes.first().copied().unwrap_or(start),
        interleaved,
        nodes,
    }
}

impl fmt::Display for MemPolicy {
    /// `numactl`'s style: `interleave:0-1`, `prefer:2`, `weighted interleave:0*3,1*1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mode_name())?;
        match self {
            MemPolicy::Default | MemPolicy::Local => Ok(()),
            MemPolicy::Preferred(n) => write!(f, ":{n}"),
            MemPolicy::Bind(m) | MemPolicy::PreferredMany(m) | MemPolicy::Interleave(m) => {
                write!(f, ":{m}")
            }
            MemPolicy::WeightedInterleave(w) => {
                for (i, (node, weight)) in w.iter().enumerate() {
                    let sep = if i == 0 { ":" } else { "," };
                    write!(f, "{sep}{node}*{weight}")?;
                }
                Ok(())
            }
        }
    }
}

/// Flags of `mbind` (Linux's `MPOL_MF_*`, same bit values).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct MbindFlags(u32);

impl MbindFlags {
    /// Fail (and change nothing) when a page already in the range is not on the
    /// policy's nodes and is not moved (`MPOL_MF_STRICT`).
    pub const STRICT: MbindFlags = MbindFlags(1 << 0);
    /// Migrate the pages already in the range to the policy's nodes
    /// (`MPOL_MF_MOVE`); pinned pages stay and are reported.
    pub const MOVE: MbindFlags = MbindFlags(1 << 1);
    const ALL: u32 = Self::STRICT.0 | Self::MOVE.0;

    /// No flags.
    pub const fn empty() -> MbindFlags {
        MbindFlags(0)
    }
    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Flags from raw bits, `None` if an unknown bit is set.
    pub const fn from_bits(bits: u32) -> Option<MbindFlags> {
        if bits & !Self::ALL != 0 {
            None
        } else {
            Some(MbindFlags(bits))
        }
    }
    /// True when every flag of `other` is set.
    pub const fn contains(self, other: MbindFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// True when no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for MbindFlags {
    type Output = MbindFlags;
    fn bitor(self, rhs: MbindFlags) -> MbindFlags {
        MbindFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for MbindFlags {
    fn bitor_assign(&mut self, rhs: MbindFlags) {
        self.0 |= rhs.0
    }
}

impl fmt::Debug for MbindFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(MbindFlags::STRICT) {
            names.push("STRICT");
        }
        if self.contains(MbindFlags::MOVE) {
            names.push("MOVE");
        }
        if names.is_empty() {
            names.push("empty");
        }
        write!(f, "MbindFlags({})", names.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmkit_core::node::Distances;

    fn uniform(n: usize) -> Topology {
        Topology::emulated_with(Distances::uniform(n), n)
    }

    /// Four sockets in a ring: neighbours at 21, the opposite socket at 31.
    fn ring() -> Topology {
        let rows: Vec<Vec<u8>> = (0..4usize)
            .map(|i| {
                (0..4usize)
                    .map(|j| match (i + 4 - j) % 4 {
                        0 => 10,
                        2 => 31,
                        _ => 21,
                    })
                    .collect()
            })
            .collect();
        Topology::emulated_with(Distances::from_rows(&rows).unwrap(), 4)
    }

    #[test]
    fn bind_exact_and_never_outside() {
        let t = uniform(4);
        let p = MemPolicy::Bind(NodeMask::from_nodes(&[1, 3]));
        p.validate(&t).unwrap();
        for pgoff in 0..8 {
            let pl = p.placement(&t, 0, pgoff);
            assert_eq!(pl.nodes, vec![1, 3]);
            assert!(!pl.fallback);
            assert_eq!(pl.policy_nodes, 2);
        }
        // From node 2 the mask is walked in node 2's order.
        assert_eq!(p.placement(&t, 2, 0).nodes, vec![3, 1]);
        // The thread's own node first when it is in the mask.
        assert_eq!(p.placement(&t, 3, 0).nodes, vec![3, 1]);
    }

    #[test]
    fn interleave_exact_round_robin() {
        let t = uniform(4);
        let p = MemPolicy::Interleave(NodeMask::from_nodes(&[0, 2, 3]));
        p.validate(&t).unwrap();
        let got: Vec<usize> = (0..9).map(|i| p.placement(&t, 1, i).preferred).collect();
        assert_eq!(got, vec![0, 2, 3, 0, 2, 3, 0, 2, 3]);
        let pl = p.placement(&t, 1, 4);
        assert!(pl.interleaved && pl.fallback);
        assert_eq!(pl.nodes, vec![2, 3, 0, 1]);
        // The thread's node plays no part.
        assert_eq!(p.placement(&t, 3, 7).preferred, 2);
    }

    #[test]
    fn weighted_interleave_exact_proportions() {
        let t = uniform(3);
        let p = MemPolicy::WeightedInterleave(vec![(2, 1), (0, 3)]);
        p.validate(&t).unwrap();
        let first: Vec<usize> = (0..8).map(|i| p.placement(&t, 1, i).preferred).collect();
        assert_eq!(first, vec![0, 0, 0, 2, 0, 0, 0, 2]);
        let mut count = [0u64; 3];
        for i in 0..400 {
            count[p.placement(&t, 1, i).preferred] += 1;
        }
        assert_eq!(count, [300, 0, 100]);
        assert_eq!(weighted_interleave_nid(&[], 5), None);
    }

    #[test]
    fn preferred_falls_back_in_distance_order() {
        let t = ring();
        let p = MemPolicy::Preferred(2);
        p.validate(&t).unwrap();
        let pl = p.placement(&t, 0, 0);
        assert_eq!(pl.nodes, vec![2, 3, 1, 0]);
        assert_eq!((pl.preferred, pl.policy_nodes, pl.fallback), (2, 1, true));
        for w in pl.nodes.windows(2) {
            assert!(t.distance(2, w[0]) <= t.distance(2, w[1]));
        }
    }

    #[test]
    fn preferred_many_then_the_rest() {
        let t = ring();
        let p = MemPolicy::PreferredMany(NodeMask::from_nodes(&[2, 3]));
        p.validate(&t).unwrap();
        let pl = p.placement(&t, 0, 0);
        assert_eq!(pl.nodes, vec![3, 2, 0, 1]);
        assert_eq!((pl.policy_nodes, pl.fallback, pl.preferred), (2, true, 3));
    }

    #[test]
    fn default_and_local_follow_the_thread() {
        let t = ring();
        for p in [MemPolicy::Default, MemPolicy::Local] {
            p.validate(&t).unwrap();
            assert_eq!(p.placement(&t, 1, 0).nodes, vec![1, 2, 0, 3]);
            assert_eq!(p.placement(&t, 3, 0).preferred, 3);
            // A thread node outside the topology counts as the first node.
            assert_eq!(p.placement(&t, 9, 0).preferred, 0);
        }
    }

    #[test]
    fn bad_policies_are_refused() {
        let t = uniform(4);
        let bad = |p: MemPolicy| p.validate(&t).unwrap_err();
        assert!(matches!(
            bad(MemPolicy::Bind(NodeMask::from_nodes(&[1, 4]))),
            MempolicyError::BadNode { node: 4, .. }
        ));
        assert!(matches!(
            bad(MemPolicy::Interleave(NodeMask::from_nodes(&[70]))),
            MempolicyError::BadNode { node: 70, .. }
        ));
        assert!(matches!(
            bad(MemPolicy::Preferred(5)),
            MempolicyError::BadNode { node: 5, .. }
        ));
        assert!(matches!(
            bad(MemPolicy::PreferredMany(NodeMask::empty())),
            MempolicyError::EmptyMask { .. }
        ));
        assert!(matches!(
            bad(MemPolicy::WeightedInterleave(vec![])),
            MempolicyError::EmptyMask { .. }
        ));
        assert!(matches!(
            bad(MemPolicy::WeightedInterleave(vec![(0, 1), (1, 0)])),
            MempolicyError::ZeroWeight { node: 1 }
        ));
        assert!(matches!(
            bad(MemPolicy::WeightedInterleave(vec![(0, 1), (0, 2)])),
            MempolicyError::DuplicateNode { node: 0 }
        ));
        assert!(matches!(
            bad(MemPolicy::WeightedInterleave(vec![(6, 1)])),
            MempolicyError::BadNode { node: 6, .. }
        ));
        let msg = bad(MemPolicy::Bind(NodeMask::from_nodes(&[7]))).to_string();
        assert!(msg.contains("node 7") && msg.contains("0-3"), "{msg}");
    }

    #[test]
    fn mbind_flags_and_display() {
        let f = MbindFlags::MOVE | MbindFlags::STRICT;
        assert!(f.contains(MbindFlags::MOVE) && f.contains(MbindFlags::STRICT));
        assert_eq!(f.bits(), 3);
        assert_eq!(MbindFlags::from_bits(4), None);
        assert_eq!(MbindFlags::from_bits(2), Some(MbindFlags::MOVE));
        assert!(MbindFlags::empty().is_empty());
        assert_eq!(format!("{f:?}"), "MbindFlags(STRICT | MOVE)");
        let p = MemPolicy::Interleave(NodeMask::from_nodes(&[0, 1, 3]));
        assert_eq!(p.to_string(), "interleave:0-1,3");
        let w = MemPolicy::WeightedInterleave(vec![(0, 3), (1, 1)]);
        assert_eq!(w.to_string(), "weighted interleave:0*3,1*1");
    }
}
