//! The NUMA topology an `Mm` places memory on: which nodes exist, their CPUs,
//! their memory and the distances between them, read from the host's
//! `/sys/devices/system/node` or emulated on a host with one node.
//!
//! Node ids are the host's (they may be sparse, as `0,2`): the distance matrix is
//! indexed by node id, and the rows of ids that are not online hold
//! `UNREACHABLE_DISTANCE`, so no zonelist ever reaches them.
//!
//! Emulated topologies assign CPUs to nodes in contiguous blocks (node 0 gets the
//! first `nr_cpus / n` CPUs, and so on), as most multi-socket machines number them;
//! with fewer CPUs than nodes, node `k` shares CPU `k % nr_cpus`. On an emulated
//! topology a thread's node comes from an explicit binding, not from its CPU, so
//! the CPU lists only matter for the zonelist tie-break and for views.
//!
//! Invariants: at least one node is online; every online node has a row in the
//! distance matrix; the zonelists are built once from the matrix and never change.
//! Locking: none; a `Topology` is immutable once built and shared by reference.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mmkit_core::node::{
    DistanceError, Distances, NodeMask, NodeStates, Zonelists, LOCAL_DISTANCE, MAX_NUMNODES,
    UNREACHABLE_DISTANCE,
};

/// Where Linux describes its nodes.
pub const SYSFS_NODE_ROOT: &str = "/sys/devices/system/node";

/// Largest CPU number a cpulist may name (Linux's `NR_CPUS` limit is 8192; this
/// leaves room and bounds what a malformed range can make us allocate).
pub const MAX_CPUS: usize = 1 << 16;

/// Why a topology could not be read or built.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopologyError {
    /// The sysfs node directory does not exist (a kernel without NUMA): use one
    /// node, as [`Topology::host`] does.
    #[error(
        "{path} does not exist (no NUMA support); use Topology::host() or Topology::emulated(n)"
    )]
    Missing {
        /// The directory looked at.
        path: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// A CPU or node list (`0-3,8-11`) is malformed.
    #[error("bad cpu/node list {text:?}: {reason} (expected a list such as \"0-3,8-11\")")]
    BadList {
        /// The text given.
        text: String,
        /// What was wrong.
        reason: &'static str,
    },
    /// A sysfs file has unexpected contents.
    #[error("{path}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The distance matrix is not valid.
    #[error("distance matrix: {0}")]
    Distances(DistanceError),
    /// No node is online, or a node id is at or above `MAX_NUMNODES`.
    #[error("bad node set: {0}")]
    Nodes(String),
}

/// One node of a topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id.
    pub id: usize,
    /// Its CPUs, ascending.
    pub cpus: Vec<usize>,
    /// Its memory in bytes (`MemTotal` of the node's meminfo), or `None` when not
    /// known (emulated nodes: the arena is split among them).
    pub memory_bytes: Option<u64>,
}

/// The NUMA topology: online nodes, their CPUs and memory, the distances, and the
/// zonelists built from them.
#[derive(Clone, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<NodeInfo>,
    distances: Distances,
    zonelists: Zonelists,
    emulated: bool,
}

impl Topology {
    /// The host's topology from `/sys/devices/system/node`; one node holding every
    /// CPU when that directory is missing or cannot be parsed (use
    /// [`Topology::try_host`] to see why).
    pub fn host() -> Topology {
        Topology::try_host().unwrap_or_else(|_| Topology::single_node(host_cpus(), None))
    }

    /// The host's topology; one node when the sysfs directory is missing, an error
    /// when it exists but cannot be read or parsed.
    pub fn try_host() -> Result<Topology, TopologyError> {
        match Topology::from_sysfs(SYSFS_NODE_ROOT) {
            Err(TopologyError::Missing { .. }) => Ok(Topology::single_node(host_cpus(), None)),
            r => r,
        }
    }

    /// The topology described by a sysfs node directory at `root` (the layout of
    /// `/sys/devices/system/node`: `online`, and per node `nodeN/cpulist`,
    /// `nodeN/distance`, optionally `nodeN/meminfo`).
    pub fn from_sysfs(root: impl AsRef<Path>) -> Result<Topology, TopologyError> {
        let root = root.as_ref();
        if !root.is_dir() {
            return Err(TopologyError::Missing {
                path: root.to_path_buf(),
            });
        }
        let online = read_online(root)?;
        if online.is_empty() {
            return Err(TopologyError::Nodes(format!(
                "no node online under {}",
                root.display()
            )));
        }
        let nr_ids = online.last().map_or(0, |&n| n + 1);
        let mut rows = vec![vec![UNREACHABLE_DISTANCE; nr_ids]; nr_ids];
        let mut nodes = Vec::with_capacity(online.len());
        for (i, row) in rows.iter_mut().enumerate() {
            row[i] = LOCAL_DISTANCE;
        }
        for &id in &online {
            let dir = root.join(format!("node{id}"));
            let cpus = parse_cpulist(&read(&dir.join("cpulist"))?)?;
            let dpath = dir.join("distance");
            let dist = parse_distance_row(&read(&dpath)?, online.len(), &dpath)?;
            for (&to, &d) in online.iter().zip(&dist) {
                rows[id][to] = d;
            }
            let mpath = dir.join("meminfo");
            let memory_bytes = match fs::read_to_string(&mpath) {
                Ok(text) => Some(parse_meminfo_total(&text, &mpath)?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(io_error(&mpath, &e)),
            };
            nodes.push(NodeInfo {
                id,
                cpus,
                memory_bytes,
            });
        }
        let distances = Distances::from_rows(&rows).map_err(TopologyError::Distances)?;
        Ok(Topology::assemble(nodes, distances, false))
    }

    /// `n` emulated nodes (clamped to `1..=MAX_NUMNODES`), 10 local and 20 remote,
    /// over the host's CPUs in blocks.
    pub fn emulated(n: usize) -> Topology {
        Topology::emulated_with(Distances::uniform(n), host_cpus())
    }

    /// Emulated nodes with the given distances and `nr_cpus` CPUs assigned in
    /// blocks (see the module header).
    pub fn emulated_with(distances: Distances, nr_cpus: usize) -> Topology {
        let n = distances.nr_nodes();
        let nr_cpus = nr_cpus.max(1);
        let nodes = (0..n)
            .map(|id| {
                let cpus = if nr_cpus >= n {
                    (id * nr_cpus / n..(id + 1) * nr_cpus / n).collect()
                } else {
                    vec![id % nr_cpus]
                };
                NodeInfo {
                    id,
                    cpus,
                    memory_bytes: None,
                }
            })
            .collect();
        Topology::assemble(nodes, distances, true)
    }

    /// One node with CPUs `0..nr_cpus`.
    pub fn single_node(nr_cpus: usize, memory_bytes: Option<u64>) -> Topology {
        let node = NodeInfo {
            id: 0,
            cpus: (0..nr_cpus.max(1)).collect(),
            memory_bytes,
        };
        Topology::assemble(vec![node], Distances::uniform(1), false)
    }

    fn assemble(nodes: Vec<NodeInfo>, distances: Distances, emulated: bool) -> Topology {
        let zonelists = Zonelists::build(&distances, &node_states_of(&nodes));
        Topology {
            nodes,
            distances,
            zonelists,
            emulated,
        }
    }

    /// Number of online nodes.
    pub fn nr_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// One more than the highest node id (the size of per-node tables).
    pub fn nr_node_ids(&self) -> usize {
        self.distances.nr_nodes()
    }

    /// The online nodes.
    pub fn online(&self) -> NodeMask {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The online nodes, ascending by id.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// The node `id`, when online.
    pub fn node(&self, id: usize) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// True when `id` is an online node.
    pub fn is_online(&self, id: usize) -> bool {
        self.node(id).is_some()
    }

    /// The distance matrix (indexed by node id).
    pub fn distances(&self) -> &Distances {
        &self.distances
    }

    /// `node_distance(from, to)`.
    pub fn distance(&self, from: usize, to: usize) -> u8 {
        self.distances.get(from, to)
    }

    /// True for an emulated topology (threads are bound to nodes explicitly).
    pub fn is_emulated(&self) -> bool {
        self.emulated
    }

    /// The node of a CPU (the first node listing it), `None` for an unknown CPU.
    pub fn cpu_to_node(&self, cpu: usize) -> Option<usize> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// Which nodes have memory and which have CPUs. A node whose memory size is
    /// not known (emulated) counts as having memory.
    pub fn node_states(&self) -> NodeStates {
        node_states_of(&self.nodes)
    }

    /// The fallback order of every node, by distance.
    pub fn zonelists(&self) -> &Zonelists {
        &self.zonelists
    }
}

impl Default for Topology {
    fn default() -> Topology {
        Topology::host()
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("emulated", &self.emulated)
            .field("nodes", &self.nodes)
            .field("distances", &self.distances)
            .finish()
    }
}

fn node_states_of(nodes: &[NodeInfo]) -> NodeStates {
    NodeStates {
        memory: nodes
            .iter()
            .filter(|n| n.memory_bytes != Some(0))
            .map(|n| n.id)
            .collect(),
        cpu: nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.id)
            .collect(),
    }
}

/// The CPUs of the host as seen by this process.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn io_error(path: &Path, e: &io::Error) -> TopologyError {
    TopologyError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path).map_err(|e| io_error(path, &e))
}

/// The online node ids: from `online`, or from the `nodeN` directories.
fn read_online(root: &Path) -> Result<Vec<usize>, TopologyError> {
    let path = root.join("online");
    let ids = match fs::read_to_string(&path) {
        Ok(text) => parse_cpulist(&text)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut ids = Vec::new();
            for entry in fs::read_dir(root).map_err(|e| io_error(root, &e))? {
                let entry = entry.map_err(|e| io_error(root, &e))?;
                let name = entry.file_name();
                let id = name
                    .to_str()
                    .and_then(|s| s.strip_prefix("node"))
                    .and_then(|s| s.parse::<usize>().ok());
                if let Some(id) = id {
                    ids.push(id);
                }
            }
            ids.sort_unstable();
            ids
        }
        Err(e) => return Err(io_error(&path, &e)),
    };
    if let Some(&bad) = ids.iter().find(|&&id| id >= MAX_NUMNODES) {
        return Err(TopologyError::Nodes(format!(
            "node {bad} is at or above the limit of {MAX_NUMNODES} nodes"
        )));
    }
    Ok(ids)
}

/// Parses a Linux CPU or node list (`0-3,8-11`, `5`, or empty for none) into
/// ascending, distinct numbers. Surrounding whitespace is ignored.
pub fn parse_cpulist(text: &str) -> Result<Vec<usize>, TopologyError> {
    let bad = |reason| TopologyError::BadList {
        text: text.to_string(),
        reason,
    };
    let trimmed = text.trim();
    let mut out = Vec::new();
    if trimmed.is_empty() {
        return Ok(out);
    }
    let num = |s: &str| -> Result<usize, TopologyError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("an element is not a number or a range A-B"));
        }
        match s.parse::<usize>() {
            Ok(n) if n < MAX_CPUS => Ok(n),
            _ => Err(bad("a number is too large")),
        }
    };
    for part in trimmed.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(bad("a range ends below its start"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// One node's `distance` file: one distance per online node, ascending.
fn parse_distance_row(text: &str, nr_online: usize, path: &Path) -> Result<Vec<u8>, TopologyError> {
    let malformed = |reason: String| TopologyError::Malformed {
        path: path.to_path_buf(),
        reason,
    };
    let row = text
        .split_whitespace()
        .map(|w| {
            w.parse::<u8>()
                .map_err(|_| malformed(format!("distance {w:?} is not a number in 0..=255")))
        })
        .collect::<Result<Vec<u8>, _>>()?;
    if row.len() != nr_online {
        return Err(malformed(format!(
            "{} distances for {nr_online} online nodes",
            row.len()
        )));
    }
    Ok(row)
}

/// `MemTotal` of a node's meminfo (`Node 0 MemTotal:  16318208 kB`), in bytes.
fn parse_meminfo_total(text: &str, path: &Path) -> Result<u64, TopologyError> {
    let malformed = |reason: &str| TopologyError::Malformed {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    for line in text.lines() {
        let Some(pos) = line.find("MemTotal:") else {
            continue;
        };
        let mut words = line[pos + "MemTotal:".len()..].split_whitespace();
        let kb = words
            .next()
            .and_then(|w| w.parse::<u64>().ok())
            .ok_or_else(|| malformed("MemTotal is not a number"))?;
        return kb
            .checked_mul(1024)
            .ok_or_else(|| malformed("MemTotal overflows"));
    }
    Err(malformed("no MemTotal line"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fake `/sys/devices/system/node` in a temporary directory, removed on drop.
    struct FakeSysfs {
        root: PathBuf,
    }

    impl FakeSysfs {
        fn new() -> FakeSysfs {
            static SEQ: AtomicUsize = AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "mmkit-fake-sysfs-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            FakeSysfs { root }
        }
        fn file(&self, rel: &str, text: &str) -> &Self {
            let p = self.root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
            self
        }
        fn node(&self, id: usize, cpulist: &str, distance: &str, mem_kb: Option<u64>) -> &Self {
            self.file(&format!("node{id}/cpulist"), &format!("{cpulist}\n"));
            self.file(&format!("node{id}/distance"), &format!("{distance}\n"));
            if let Some(kb) = mem_kb {
                let text = format!(
                    "Node {id} MemTotal:       {kb} kB\nNode {id} MemFree:        1000 kB\n"
                );
                self.file(&format!("node{id}/meminfo"), &text);
            }
            self
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    #[test]
    fn cpulist_parsing() {
        assert_eq!(
            parse_cpulist("0-3,8-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 9, 10, 11]
        );
        assert_eq!(parse_cpulist("5").unwrap(), vec![5]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("3,1-2,2").unwrap(), vec![1, 2, 3]);
        for bad in [
            "3-1", "a", "1,,2", "1-", "-1", "1-2-3", "0x3", "1 2", "99999999",
        ] {
            let e = parse_cpulist(bad).unwrap_err();
            assert!(matches!(e, TopologyError::BadList { .. }), "{bad}: {e}");
        }
        let msg = parse_cpulist("4-2").unwrap_err().to_string();
        assert!(
            msg.contains("4-2") && msg.contains("below its start"),
            "{msg}"
        );
    }

    #[test]
    fn two_nodes_from_fake_sysfs() {
        let fs = FakeSysfs::new();
        fs.file("online", "0-1\n")
            .node(0, "0-3,8-11", "10 21", Some(4 << 20))
            .node(1, "4-7,12-15", "21 10", Some(2 << 20));
        let t = Topology::from_sysfs(&fs.root).unwrap();
        assert_eq!(t.nr_nodes(), 2);
        assert!(!t.is_emulated());
        assert_eq!(t.online(), NodeMask::from_nodes(&[0, 1]));
        assert_eq!(t.node(0).unwrap().cpus, vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(t.node(1).unwrap().memory_bytes, Some(2 << 30));
        assert_eq!(t.distance(0, 1), 21);
        assert_eq!(t.cpu_to_node(12), Some(1));
        assert_eq!(t.cpu_to_node(16), None);
        assert_eq!(t.zonelists().fallback_order(1), &[1, 0]);
    }

    #[test]
    fn four_nodes_asymmetric_from_fake_sysfs() {
        let fs = FakeSysfs::new();
        fs.file("online", "0-3")
            .node(0, "0-1", "10 16 32 32", Some(1 << 20))
            .node(1, "2-3", "18 10 32 32", Some(1 << 20))
            .node(2, "4-5", "32 32 10 16", Some(1 << 20))
            .node(3, "", "30 30 16 10", Some(0));
        let t = Topology::from_sysfs(&fs.root).unwrap();
        assert_eq!(t.nr_nodes(), 4);
        assert_eq!(t.distance(0, 1), 16);
        assert_eq!(t.distance(1, 0), 18);
        // Node 3 has CPUs nowhere and no memory: never a fallback target.
        let states = t.node_states();
        assert_eq!(states.memory, NodeMask::from_nodes(&[0, 1, 2]));
        assert_eq!(states.cpu, NodeMask::from_nodes(&[0, 1, 2]));
        assert_eq!(t.zonelists().fallback_order(0), &[0, 1, 2]);
        // Memoryless node 3: nearest memory first; 0 and 1 tie at 32 and node 0
        // carries more node_load from the lists built before.
        assert_eq!(t.zonelists().fallback_order(3), &[2, 1, 0]);
    }

    #[test]
    fn sparse_node_ids_and_no_online_file() {
        let fs = FakeSysfs::new();
        fs.node(0, "0-1", "10 20", None)
            .node(2, "2-3", "20 10", None);
        fs.file("possible", "0-3");
        let t = Topology::from_sysfs(&fs.root).unwrap();
        assert_eq!(t.online(), NodeMask::from_nodes(&[0, 2]));
        assert_eq!(t.nr_node_ids(), 3);
        assert_eq!(t.distance(0, 2), 20);
        assert_eq!(t.distance(0, 1), UNREACHABLE_DISTANCE);
        assert!(!t.is_online(1));
        assert_eq!(t.zonelists().fallback_order(2), &[2, 0]);
    }

    #[test]
    fn malformed_sysfs_is_refused() {
        let fs = FakeSysfs::new();
        fs.file("online", "0-1")
            .node(0, "0", "10 20", None)
            .node(1, "1", "20", None);
        let e = Topology::from_sysfs(&fs.root).unwrap_err();
        assert!(matches!(e, TopologyError::Malformed { .. }), "{e}");

        let fs = FakeSysfs::new();
        fs.file("online", "0-1")
            .node(0, "0", "10 20", None)
            .node(1, "1", "20 12", None);
        let e = Topology::from_sysfs(&fs.root).unwrap_err();
        assert!(
            matches!(e, TopologyError::Distances(DistanceError::BadLocal { .. })),
            "{e}"
        );

        let fs = FakeSysfs::new();
        fs.file("online", "0").node(0, "0-x", "10", None);
        assert!(matches!(
            Topology::from_sysfs(&fs.root),
            Err(TopologyError::BadList { .. })
        ));

        let fs = FakeSysfs::new();
        fs.file("online", "0")
            .node(0, "0", "10", None)
            .file("node0/meminfo", "garbage\n");
        assert!(matches!(
            Topology::from_sysfs(&fs.root),
            Err(TopologyError::Malformed { .. })
        ));
    }

    #[test]
    fn missing_directory_means_one_node() {
        let missing = std::env::temp_dir().join("mmkit-no-such-sysfs-dir");
        let e = Topology::from_sysfs(&missing).unwrap_err();
        assert!(matches!(e, TopologyError::Missing { .. }));
        let host = Topology::host();
        assert!(host.nr_nodes() >= 1);
        assert!(!host
            .zonelists()
            .fallback_order(host.nodes()[0].id)
            .is_empty());
    }

    #[test]
    fn emulated_blocks_of_cpus() {
        let t = Topology::emulated_with(Distances::uniform(2), 8);
        assert!(t.is_emulated());
        assert_eq!(t.node(0).unwrap().cpus, vec![0, 1, 2, 3]);
        assert_eq!(t.node(1).unwrap().cpus, vec![4, 5, 6, 7]);
        assert_eq!(t.distance(0, 1), 20);
        let t = Topology::emulated_with(Distances::uniform(4), 2);
        assert_eq!(t.node(3).unwrap().cpus, vec![1]);
        assert_eq!(t.zonelists().fallback_order(2), &[2, 3, 0, 1]);
        assert_eq!(Topology::emulated(3).nr_nodes(), 3);
    }
}
