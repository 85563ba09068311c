//! NUMA nodes: node masks, the distance matrix and zonelists by distance (Linux's
//! `nodemask_t`, `node_distance()` and the node ordering of `build_zonelists` /
//! `find_next_best_node` in `mm/page_alloc.c`).
//!
//! A node is a small integer below [`MAX_NUMNODES`]. A [`NodeMask`] is a set of
//! nodes; [`Distances`] is the SLIT-style matrix (10 local, larger remote);
//! [`Zonelists`] holds, for every node, the order in which an allocation that
//! starts on that node falls back to the other nodes' memory.
//!
//! Invariants: a `Distances` is square, its diagonal is [`LOCAL_DISTANCE`] and every
//! other entry is larger (checked when it is built, never after). A zonelist holds
//! each node with memory exactly once, the start node first when it has memory.
//!
//! Locking: none. All of these are plain values, built once when an `Mm` is built
//! and read-only afterwards.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// Nodes are numbered `0..MAX_NUMNODES` (a [`NodeMask`] is one 64-bit word).
pub const MAX_NUMNODES: usize = 64;
/// The distance of a node to itself (ACPI SLIT and Linux's `LOCAL_DISTANCE`).
pub const LOCAL_DISTANCE: u8 = 10;
/// The default distance between two different nodes (Linux's `REMOTE_DISTANCE`).
pub const REMOTE_DISTANCE: u8 = 20;
/// A node that cannot be reached (SLIT's 0xff); used for nodes that are not online.
pub const UNREACHABLE_DISTANCE: u8 = 255;

// ---------------------------------------------------------------------------------
// NodeMask
// ---------------------------------------------------------------------------------

/// A set of nodes (Linux's `nodemask_t`, here up to [`MAX_NUMNODES`] nodes).
///
/// A node at or above `MAX_NUMNODES` given to [`NodeMask::from_nodes`] or
/// [`NodeMask::insert`] is not stored; the mask remembers the first such node
/// ([`NodeMask::invalid_node`]) so that validation against a topology refuses it
/// with a clear error instead of silently dropping it.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeMask {
    bits: u64,
    /// First out-of-range node given, plus one (0: none).
    invalid: u32,
}

impl NodeMask {
    /// The empty mask.
    pub const fn empty() -> NodeMask {
        NodeMask {
            bits: 0,
            invalid: 0,
        }
    }

    /// Nodes `0..n` (capped at `MAX_NUMNODES`).
    pub const fn first_n(n: usize) -> NodeMask {
        let bits = if n >= MAX_NUMNODES {
            u64::MAX
        } else {
            (1u64 << n) - 1
        };
        NodeMask { bits, invalid: 0 }
    }

    /// The mask of the given nodes (duplicates are fine).
    pub fn from_nodes(nodes: &[usize]) -> NodeMask {
        let mut m = NodeMask::empty();
        for &n in nodes {
            m.insert(n);
        }
        m
    }

    /// The mask with the given bits (bit `n` is node `n`).
    pub const fn from_bits(bits: u64) -> NodeMask {
        NodeMask { bits, invalid: 0 }
    }

    /// The raw bits (bit `n` is node `n`).
    pub const fn bits(self) -> u64 {
        self.bits
    }

    /// Adds `node`; false (and remembered as [`invalid_node`](Self::invalid_node))
    /// when `node >= MAX_NUMNODES`.
    pub fn insert(&mut self, node: usize) -> bool {
        if node >= MAX_NUMNODES {
            if self.invalid == 0 {
                self.invalid = u32::try_from(node).unwrap_or(u32::MAX - 1) + 1;
            }
            return false;
        }
        self.bits |= 1 << node;
        true
    }

    /// Removes `node` (no-op when absent).
    pub fn remove(&mut self, node: usize) {
        if node < MAX_NUMNODES {
            self.bits &= !(1 << node);
        }
    }

    /// True when `node` is in the mask.
    pub const fn contains(self, node: usize) -> bool {
        node < MAX_NUMNODES && self.bits & (1 << node) != 0
    }

    /// The first node at or above `MAX_NUMNODES` that was given to this mask.
    pub const fn invalid_node(self) -> Option<usize> {
        if self.invalid == 0 {
            None
        } else {
            Some(self.invalid as usize - 1)
        }
    }

    /// Number of nodes in the mask (Linux's `nodes_weight`).
    pub const fn weight(self) -> usize {
        self.bits.count_ones() as usize
    }

    /// True when no node is set.
    pub const fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// The lowest node (Linux's `first_node`).
    pub const fn first(self) -> Option<usize> {
        if self.bits == 0 {
            None
        } else {
            Some(self.bits.trailing_zeros() as usize)
        }
    }

    /// The lowest node above `node` (Linux's `next_node`).
    pub const fn next_after(self, node: usize) -> Option<usize> {
        if node + 1 >= MAX_NUMNODES {
            return None;
        }
        let rest = self.bits & !((1u64 << (node + 1)) - 1);
        if rest == 0 {
            None
        } else {
            Some(rest.trailing_zeros() as usize)
        }
    }

    /// The next node after `node`, wrapping to the first (Linux's `next_node_in`,
    /// the interleave step).
    pub const fn next_in(self, node: usize) -> Option<usize> {
        match self.next_after(node) {
            Some(n) => Some(n),
            None => self.first(),
        }
    }

    /// The `i`-th node of the mask in ascending order (0-based).
    pub fn nth(self, i: usize) -> Option<usize> {
        self.iter().nth(i)
    }

    /// The nodes in both masks.
    pub const fn and(self, other: NodeMask) -> NodeMask {
        NodeMask::from_bits(self.bits & other.bits)
    }

    /// The nodes in either mask.
    pub const fn or(self, other: NodeMask) -> NodeMask {
        NodeMask::from_bits(self.bits | other.bits)
    }

    /// True when every node of `self` is in `other`.
    pub const fn is_subset(self, other: NodeMask) -> bool {
        self.bits & !other.bits == 0
    }

    /// The nodes in ascending order.
    pub fn iter(self) -> NodeMaskIter {
        NodeMaskIter { bits: self.bits }
    }
}

/// Iterator over the nodes of a [`NodeMask`], ascending.
#[derive(Clone, Debug)]
pub struct NodeMaskIter {
    bits: u64,
}

impl Iterator for NodeMaskIter {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.bits == 0 {
            return None;
        }
        let n = self.bits.trailing_zeros() as usize;
        self.bits &= self.bits - 1;
        Some(n)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.bits.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for NodeMaskIter {}

impl IntoIterator for NodeMask {
    type Item = usize;
    type IntoIter = NodeMaskIter;
    fn into_iter(self) -> NodeMaskIter {
        self.iter()
    }
}

impl FromIterator<usize> for NodeMask {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> NodeMask {
        let mut m = NodeMask::empty();
        for n in iter {
            m.insert(n);
        }
        m
    }
}

/// Linux's node-list format: `0-2,5`.
impl fmt::Display for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.iter().peekable();
        let mut first = true;
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for NodeMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeMask({self})")?;
        if let Some(n) = self.invalid_node() {
            write!(f, "[invalid node {n}]")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Distances
// ---------------------------------------------------------------------------------

/// Why a distance matrix was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DistanceError {
    /// No nodes, or more than [`MAX_NUMNODES`].
    BadNodeCount {
        /// The number of rows given.
        nodes: usize,
    },
    /// A row does not have one entry per node.
    NotSquare {
        /// The row (node) with the wrong length.
        row: usize,
        /// Its length.
        len: usize,
        /// The number of nodes.
        nodes: usize,
    },
    /// A node's distance to itself is not [`LOCAL_DISTANCE`].
    BadLocal {
        /// The node.
        node: usize,
        /// The distance given.
        distance: u8,
    },
    /// A distance between two different nodes is not above [`LOCAL_DISTANCE`].
    BadRemote {
        /// From this node.
        from: usize,
        /// To this node.
        to: usize,
        /// The distance given.
        distance: u8,
    },
}

impl fmt::Display for DistanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DistanceError::BadNodeCount { nodes } => write!(
                f,
                "distance matrix with {nodes} nodes: give between 1 and {MAX_NUMNODES} rows"
            ),
            DistanceError::NotSquare { row, len, nodes } => write!(
                f,
                "distance matrix is not square: row {row} has {len} entries, expected {nodes}"
            ),
            DistanceError::BadLocal { node, distance } => write!(
                f,
                "distance of node {node} to itself is {distance}, must be {LOCAL_DISTANCE}"
            ),
            DistanceError::BadRemote { from, to, distance } => write!(
                f,
                "distance from node {from} to node {to} is {distance}, must be above {LOCAL_DISTANCE}"
            ),
        }
    }
}

/// The node distance matrix (Linux's `node_distance(from, to)`, ACPI's SLIT).
/// Rows need not be symmetric: `get(a, b)` may differ from `get(b, a)`.
#[derive(Clone, PartialEq, Eq)]
pub struct Distances {
    nodes: usize,
    d: Vec<u8>,
}

impl Distances {
    /// `n` nodes, 10 local and 20 remote (what `numa=fake` and an emulated
    /// topology use unless given a matrix). `n` is clamped to `1..=MAX_NUMNODES`.
    pub fn uniform(n: usize) -> Distances {
        let n = n.clamp(1, MAX_NUMNODES);
        let mut d = vec![REMOTE_DISTANCE; n * n];
        for i in 0..n {
            d[i * n + i] = LOCAL_DISTANCE;
        }
        Distances { nodes: n, d }
    }

    /// A matrix from its rows (row `i` holds the distances from node `i`),
    /// validated: square, 10 on the diagonal, above 10 elsewhere.
    pub fn from_rows<R: AsRef<[u8]>>(rows: &[R]) -> Result<Distances, DistanceError> {
        let n = rows.len();
        if n == 0 || n > MAX_NUMNODES {
            return Err(DistanceError::BadNodeCount { nodes: n });
        }
        let mut d = Vec::with_capacity(n * n);
        for (from, row) in rows.iter().enumerate() {
            let row = row.as_ref();
            if row.len() != n {
                return Err(DistanceError::NotSquare {
                    row: from,
                    len: row.len(),
                    nodes: n,
                });
            }
            for (to, &distance) in row.iter().enumerate() {
                if from == to && distance != LOCAL_DISTANCE {
                    return Err(DistanceError::BadLocal {
                        node: from,
                        distance,
                    });
                }
                if from != to && distance <= LOCAL_DISTANCE {
                    return Err(DistanceError::BadRemote { from, to, distance });
                }
                d.push(distance);
            }
        }
        Ok(Distances { nodes: n, d })
    }

    /// Number of nodes (rows).
    pub fn nr_nodes(&self) -> usize {
        self.nodes
    }

    /// Distance from `from` to `to` ([`UNREACHABLE_DISTANCE`] outside the matrix).
    pub fn get(&self, from: usize, to: usize) -> u8 {
        if from < self.nodes && to < self.nodes {
            self.d[from * self.nodes + to]
        } else {
            UNREACHABLE_DISTANCE
        }
    }

    /// The distances from `from` (one per node), empty outside the matrix.
    pub fn row(&self, from: usize) -> &[u8] {
        if from < self.nodes {
            &self.d[from * self.nodes..(from + 1) * self.nodes]
        } else {
            &[]
        }
    }
}

impl fmt::Debug for Distances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries((0..self.nodes).map(|i| self.row(i)))
            .finish()
    }
}

// ---------------------------------------------------------------------------------
// Zonelists
// ---------------------------------------------------------------------------------

/// The nodes a zonelist is built from: which nodes have memory (only those appear
/// in zonelists) and which have CPUs (Linux prefers headless nodes on ties).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NodeStates {
    /// Nodes with memory (Linux's `N_MEMORY`).
    pub memory: NodeMask,
    /// Nodes with CPUs (Linux's `N_CPU`).
    pub cpu: NodeMask,
}

/// Linux's `find_next_best_node`: the next node for `node`'s fallback order, not
/// yet in `used` (which it is then added to), or `None` when every node with memory
/// is used.
///
/// The start node itself comes first when it has memory. Otherwise the nearest
/// node wins; ties are broken, in this order, by a penalty of one for nodes below
/// `node` ("prefer the next node"), a penalty of one for nodes with CPUs (headless
/// nodes are preferred), then the lower `node_load` (which `build_zonelists` raises
/// on the first node of each distance group, so that nodes at equal distance take
/// turns being first), then the lower node number.
pub fn find_next_best_node(
    node: usize,
    used: &mut NodeMask,
    distances: &Distances,
    states: &NodeStates,
    node_load: &[u32],
) -> Option<usize> {
    if !used.contains(node) && states.memory.contains(node) {
        used.insert(node);
        return Some(node);
    }
    let mut best: Option<(u32, u32, usize)> = None;
    for n in states.memory.iter() {
        if used.contains(n) {
            continue;
        }
        let mut val = u32::from(distances.get(node, n));
        val += u32::from(n < node);
        val += u32::from(states.cpu.contains(n));
        let load = node_load.get(n).copied().unwrap_or(0);
        // Linux folds the load into the low digits (val * MAX_NUMNODES + load);
        // a (val, load) pair compares the same way, and the strict `<` keeps the
        // lowest node on a full tie.
        if best.is_none_or(|(bv, bl, _)| (val, load) < (bv, bl)) {
            best = Some((val, load, n));
        }
    }
    let (_, _, n) = best?;
    used.insert(n);
    Some(n)
}

/// The fallback order of every node (Linux's node zonelists, one zone per node
/// here), built the way `__build_all_zonelists` does: nodes in ascending order,
/// each with `build_zonelists`, sharing one `node_load` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zonelists {
    orders: Vec<Vec<usize>>,
}

impl Zonelists {
    /// Builds the fallback order of nodes `0..distances.nr_nodes()`.
    pub fn build(distances: &Distances, states: &NodeStates) -> Zonelists {
        let n = distances.nr_nodes();
        let mut node_load = vec![0u32; n];
        let orders = (0..n)
            .map(|local| build_node_order(local, distances, states, &mut node_load))
            .collect();
        Zonelists { orders }
    }

    /// Number of nodes.
    pub fn nr_nodes(&self) -> usize {
        self.orders.len()
    }

    /// The nodes an allocation starting on `node` tries, in order (nearest
    /// first). Empty for a node outside the topology.
    pub fn fallback_order(&self, node: usize) -> &[usize] {
        self.orders.get(node).map_or(&[], |v| v.as_slice())
    }

    /// The fallback order of `node` restricted to `mask` (an allocation with a
    /// nodemask, as `MPOL_BIND` makes).
    pub fn fallback_order_in(
        &self,
        node: usize,
        mask: NodeMask,
    ) -> impl Iterator<Item = usize> + '_ {
        self.fallback_order(node)
            .iter()
            .copied()
            .filter(move |&n| mask.contains(n))
    }
}

/// Linux's `build_zonelists` for one node: repeated `find_next_best_node`, raising
/// the load of the first node of each new distance group.
fn build_node_order(
    local: usize,
    distances: &Distances,
    states: &NodeStates,
    node_load: &mut [u32],
) -> Vec<usize> {
    let mut used = NodeMask::empty();
    let mut order = Vec::with_capacity(states.memory.weight());
    let mut prev = local;
    while let Some(node) = find_next_best_node(local, &mut used, distances, states, node_load) {
        if distances.get(local, node) != distances.get(local, prev) {
            node_load[node] += 1;
        }
        order.push(node);
        prev = node;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    fn all(n: usize) -> NodeStates {
        NodeStates {
            memory: NodeMask::first_n(n),
            cpu: NodeMask::first_n(n),
        }
    }

    #[test]
    fn nodemask_basics() {
        let m = NodeMask::from_nodes(&[0, 2, 5, 2]);
        assert_eq!(m.weight(), 3);
        assert_eq!(m.first(), Some(0));
        assert_eq!(m.next_after(0), Some(2));
        assert_eq!(m.next_after(2), Some(5));
        assert_eq!(m.next_after(5), None);
        assert_eq!(m.next_in(5), Some(0));
        assert_eq!(m.nth(2), Some(5));
        assert_eq!(m.nth(3), None);
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 2, 5]);
        assert!(m.contains(5) && !m.contains(1) && !m.contains(1000));
        assert!(!m.is_empty() && NodeMask::empty().is_empty());
        assert_eq!(NodeMask::empty().first(), None);
        assert_eq!(NodeMask::empty().next_in(3), None);
        assert_eq!(
            format!("{}", NodeMask::from_nodes(&[0, 1, 2, 5, 7, 8])),
            "0-2,5,7-8"
        );
        assert!(NodeMask::from_nodes(&[2]).is_subset(m));
        assert_eq!(
            m.and(NodeMask::from_nodes(&[2, 3])),
            NodeMask::from_nodes(&[2])
        );
        assert_eq!(NodeMask::first_n(64).weight(), 64);
        assert_eq!(NodeMask::from_nodes(&[63]).next_after(63), None);
    }

    #[test]
    fn nodemask_remembers_out_of_range_node() {
        let m = NodeMask::from_nodes(&[1, 64, 99]);
        assert_eq!(m.weight(), 1);
        assert_eq!(m.invalid_node(), Some(64));
        assert_eq!(NodeMask::from_nodes(&[1]).invalid_node(), None);
    }

    #[test]
    fn distances_validation() {
        assert!(Distances::from_rows(&[[10u8, 20], [20, 10]]).is_ok());
        let r: &[[u8; 2]] = &[];
        assert_eq!(
            Distances::from_rows(r),
            Err(DistanceError::BadNodeCount { nodes: 0 })
        );
        let rows: Vec<Vec<u8>> = vec![vec![10, 20], vec![20]];
        assert_eq!(
            Distances::from_rows(&rows),
            Err(DistanceError::NotSquare {
                row: 1,
                len: 1,
                nodes: 2
            })
        );
        assert_eq!(
            Distances::from_rows(&[[10u8, 20], [20, 11]]),
            Err(DistanceError::BadLocal {
                node: 1,
                distance: 11
            })
        );
        assert_eq!(
            Distances::from_rows(&[[10u8, 10], [20, 10]]),
            Err(DistanceError::BadRemote {
                from: 0,
                to: 1,
                distance: 10
            })
        );
        let d = Distances::uniform(3);
        assert_eq!(d.get(1, 1), 10);
        assert_eq!(d.get(1, 2), 20);
        assert_eq!(d.get(1, 7), UNREACHABLE_DISTANCE);
        assert_eq!(d.row(2), &[20, 20, 10]);
    }

    #[test]
    fn zonelists_uniform_rotate_equal_distance_groups() {
        // Nodes at equal distance take turns being first (node_load), and nodes
        // above the local one are preferred on ties.
        let z = Zonelists::build(&Distances::uniform(4), &all(4));
        assert_eq!(z.fallback_order(0), &[0, 1, 2, 3]);
        assert_eq!(z.fallback_order(1), &[1, 2, 3, 0]);
        assert_eq!(z.fallback_order(2), &[2, 3, 0, 1]);
        assert_eq!(z.fallback_order(3), &[3, 0, 1, 2]);
        assert_eq!(z.fallback_order(4), &[] as &[usize]);
    }

    #[test]
    fn zonelists_ring_nearest_first() {
        // A 4-socket ring: each node has two neighbours at 21 and one at 31.
        let d = Distances::from_rows(&[
            [10u8, 21, 31, 21],
            [21, 10, 21, 31],
            [31, 21, 10, 21],
            [21, 31, 21, 10],
        ])
        .unwrap();
        let z = Zonelists::build(&d, &all(4));
        assert_eq!(z.fallback_order(0), &[0, 1, 3, 2]);
        assert_eq!(z.fallback_order(1), &[1, 2, 0, 3]);
        assert_eq!(z.fallback_order(2), &[2, 3, 1, 0]);
        assert_eq!(z.fallback_order(3), &[3, 0, 2, 1]);
        for node in 0..4 {
            let o = z.fallback_order(node);
            for w in o.windows(2) {
                assert!(d.get(node, w[0]) <= d.get(node, w[1]), "node {node}: {o:?}");
            }
        }
        let bound: Vec<usize> = z
            .fallback_order_in(0, NodeMask::from_nodes(&[2, 3]))
            .collect();
        assert_eq!(bound, vec![3, 2]);
    }

    #[test]
    fn zonelists_asymmetric_distances() {
        // Node 1 sees node 2 as nearer than node 0, node 0 sees the opposite.
        let d = Distances::from_rows(&[[10u8, 15, 30], [40, 10, 12], [25, 20, 10]]).unwrap();
        let z = Zonelists::build(&d, &all(3));
        assert_eq!(z.fallback_order(0), &[0, 1, 2]);
        assert_eq!(z.fallback_order(1), &[1, 2, 0]);
        assert_eq!(z.fallback_order(2), &[2, 1, 0]);
    }

    #[test]
    fn zonelists_headless_and_memoryless_nodes() {
        // Node 2 has memory but no CPUs: preferred over node 1 at equal distance.
        // Node 3 has CPUs but no memory: it never appears, and its own list
        // starts with the nearest node that has memory. Nodes 0 and 1 tie for
        // node 3 (32 each); node 0 carries load 1 from node 2's list, so 1 wins.
        let d = Distances::from_rows(&[
            [10u8, 20, 20, 30],
            [20, 10, 20, 30],
            [20, 20, 10, 30],
            [30, 30, 12, 10],
        ])
        .unwrap();
        let states = NodeStates {
            memory: NodeMask::from_nodes(&[0, 1, 2]),
            cpu: NodeMask::from_nodes(&[0, 1, 3]),
        };
        let z = Zonelists::build(&d, &states);
        assert_eq!(z.fallback_order(0), &[0, 2, 1]);
        assert_eq!(z.fallback_order(3), &[2, 1, 0]);
        for node in 0..4 {
            assert!(!z.fallback_order(node).contains(&3));
            assert_eq!(z.fallback_order(node).len(), 3);
        }
    }
}
