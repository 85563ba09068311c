//! Nodes on the std side: the arena split per node (and bound to it with `mbind`
//! on a real multi-node host), the calling thread's node (`set_thread_node`,
//! `thread_node`), `alloc_pages_node`, the per-node access counters that the
//! access path feeds, and the `numastat` view.
//!
//! The thread's node: an explicit binding made with [`Mm::set_thread_node`]
//! (kept per thread and per Mm, as a thread-local list), else the node of the CPU
//! the thread runs on (`sched_getcpu`, looked up in the topology). On a real
//! topology `set_thread_node` also sets the thread's CPU affinity to the node's
//! CPUs. With one node everything is node 0 and nothing is looked up.
//!
//! Invariants: the nodes of an Mm are `0..nr_nodes()`, node `i`'s frames are a
//! contiguous pfn range right after node `i - 1`'s; every node but the last is a
//! whole number of MAX_ORDER blocks.
//!
//! Locking: none. The bindings are thread-local; the access counters are per-CPU
//! atomics folded on read.

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use mmkit_core::{NodeReq, NumaStats, Platform, MAX_ORDER};

use crate::page_alloc_hooks::AllocHooks;
use crate::topology::Topology;
use crate::{Error, Gfp, Mm, Pfn, StdPlatform, PAGE_SIZE};

thread_local! {
    /// `(Mm id, node)` bindings of this thread (`Mm::set_thread_node`).
    static BINDINGS: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Local and remote accesses of one node's pages, counted by the access path.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAccesses {
    /// Accesses by threads on this node.
    pub local: u64,
    /// Accesses by threads on other nodes.
    pub remote: u64,
}

/// Per-CPU `[local, remote]` access counters per node, `[cpu * nr_nodes + node]`
/// (empty with one node: nothing is counted).
pub(crate) struct AccessCounters {
    slots: Box<[CachePadded<[AtomicU64; 2]>]>,
    nr_nodes: usize,
    nr_cpus: usize,
}

impl AccessCounters {
    pub(crate) fn new(nr_nodes: usize, nr_cpus: usize) -> AccessCounters {
        let n = if nr_nodes > 1 { nr_nodes * nr_cpus } else { 0 };
        AccessCounters {
            slots: (0..n).map(|_| CachePadded::default()).collect(),
            nr_nodes,
            nr_cpus: nr_cpus.max(1),
        }
    }

    #[inline]
    fn add(&self, node: usize, remote: bool) {
        let cpu = StdPlatform::cpu_id() % self.nr_cpus;
        if let Some(s) = self.slots.get(cpu * self.nr_nodes + node) {
            s[remote as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn get(&self, node: usize) -> NodeAccesses {
        let mut a = NodeAccesses::default();
        if node >= self.nr_nodes {
            return a;
        }
        for cpu in 0..self.nr_cpus {
            if let Some(s) = self.slots.get(cpu * self.nr_nodes + node) {
                a.local += s[0].load(Ordering::Relaxed);
                a.remote += s[1].load(Ordering::Relaxed);
            }
        }
        a
    }
}

/// The pages of each node when `nr_pages` are split over `topo`'s nodes: equal
/// shares of whole MAX_ORDER blocks (the first nodes take one more block each
/// when they do not divide evenly), the last node also takes the tail.
pub(crate) fn node_pages(topo: &Topology, nr_pages: u64) -> Result<Vec<u64>, Error> {
    let n = topo.nr_nodes() as u64;
    if topo.nr_node_ids() != topo.nr_nodes() {
        return Err(Error::Config(format!(
            "node ids must be 0..{n} without holes (online: {})",
            topo.online()
        )));
    }
    let block = 1u64 << MAX_ORDER;
    let blocks = nr_pages / block;
    if blocks < n {
        return Err(Error::Config(format!(
            "memory of {} bytes is too small for {n} nodes: each node needs at least one 4 MiB block",
            nr_pages * PAGE_SIZE as u64
        )));
    }
    let mut v: Vec<u64> = (0..n)
        .map(|i| (blocks / n + u64::from(i < blocks % n)) * block)
        .collect();
    *v.last_mut().expect("at least one node") += nr_pages % block;
    Ok(v)
}

/// Binds `len` bytes at `addr` to `node` (Linux's `mbind(MPOL_BIND)`).
pub(crate) fn mbind_range(addr: *mut u8, len: usize, node: usize) -> std::io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    let mut mask = [0u64; mmkit_core::MAX_NUMNODES / 64];
    mask[node / 64] |= 1 << (node % 64);
    // SAFETY: mbind only changes the policy of our own mapping `[addr, addr+len)`;
    // the mask is a valid array of `MAX_NUMNODES` bits that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            mmkit_core::MAX_NUMNODES as libc::c_ulong + 1,
            0 as libc::c_uint,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Mm {
    /// The topology this Mm was built with.
    pub fn topology(&self) -> &Topology {
        &self.inner.topology
    }

    /// Why the arena's parts are not bound to their nodes (a real multi-node
    /// host that refused `mbind`); `None` when bound or emulated.
    pub fn numa_note(&self) -> Option<&str> {
        self.inner.numa_note.as_deref()
    }

    fn check_node(&self, node: usize) -> Result<(), Error> {
        let nr_nodes = self.nr_nodes();
        if node < nr_nodes {
            Ok(())
        } else {
            Err(Error::BadNode { node, nr_nodes })
        }
    }

    /// Allocates 2^order pages on `node`, falling back along its zonelist (by
    /// distance) when it is short, unless `gfp` has [`Gfp::THISNODE`]
    /// (Linux's `alloc_pages_node`). [`Error::BadNode`] for a node this Mm does
    /// not have.
    pub fn alloc_pages_node(&self, node: usize, gfp: Gfp, order: u32) -> Result<Pfn, Error> {
        self.check_node(node)?;
        let req = NodeReq::node(node, self.thread_node());
        let r = self
            .inner
            .alloc
            .alloc_pages_nodemask(gfp, order, req, &AllocHooks::new(self));
        self.finish_alloc(r, gfp, order)
    }

    /// Runs the calling thread on `node` for this Mm: an explicit binding that
    /// [`thread_node`](Self::thread_node) returns from now on; on a real
    /// multi-node topology the thread's CPU affinity is also set to the node's
    /// CPUs. [`Error::BadNode`] (and no change) for a node this Mm does not have.
    pub fn set_thread_node(&self, node: usize) -> Result<(), Error> {
        self.check_node(node)?;
        let topo = &self.inner.topology;
        if !topo.is_emulated() && topo.nr_nodes() > 1 {
            let cpus = topo.node(node).map(|n| n.cpus.clone()).unwrap_or_default();
            if !cpus.is_empty() {
                // SAFETY: a zeroed cpu_set_t filled with CPU_SET, then a plain
                // sched_setaffinity on the calling thread.
                let r = unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    for c in cpus {
                        libc::CPU_SET(c, &mut set);
                    }
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                };
                if r != 0 {
                    return Err(Error::Config(format!(
                        "sched_setaffinity to node {node}'s CPUs failed: {}",
                        std::io::Error::last_os_error()
                    )));
                }
            }
        }
        let id = self.inner.id;
        BINDINGS.with(|b| {
            let mut b = b.borrow_mut();
            match b.iter_mut().find(|(m, _)| *m == id) {
                Some(e) => e.1 = node,
                None => b.push((id, node)),
            }
        });
        Ok(())
    }

    /// The calling thread's node: its binding ([`set_thread_node`](Self::set_thread_node)),
    /// else the node of the CPU it runs on; 0 with one node.
    #[inline]
    pub fn thread_node(&self) -> usize {
        if self.nr_nodes() == 1 {
            return 0;
        }
        self.thread_node_slow()
    }

    #[inline(never)]
    fn thread_node_slow(&self) -> usize {
        let id = self.inner.id;
        if let Some(n) = BINDINGS.with(|b| b.borrow().iter().find(|(m, _)| *m == id).map(|e| e.1)) {
            return n;
        }
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let cpu = unsafe { libc::sched_getcpu() };
        let node = usize::try_from(cpu)
            .ok()
            .and_then(|c| self.inner.topology.cpu_to_node(c))
            .unwrap_or(0);
        node.min(self.nr_nodes() - 1)
    }

    /// Counts one access of `pfn` by the calling thread (the access path).
    #[inline]
    pub(crate) fn count_access(&self, pfn: Pfn) -> bool {
        let node = self.node_of(pfn);
        let remote = node != self.thread_node();
        self.inner.node_access.add(node, remote);
        remote
    }

    /// Accesses of node `node`'s pages through address spaces, local and remote
    /// (counted with more than one node only).
    pub fn node_accesses(&self, node: usize) -> NodeAccesses {
        self.inner.node_access.get(node)
    }

    /// Node `node`'s `numa_*` counters.
    pub fn numa_stats(&self, node: usize) -> NumaStats {
        self.inner.alloc.numa_stats(node)
    }

    /// The free pages of node `node`.
    pub fn node_nr_free_pages(&self, node: usize) -> u64 {
        self.inner.alloc.node_nr_free_pages(node)
    }

    /// The first pfn and the frames of node `node`.
    pub fn node_span(&self, node: usize) -> Option<(Pfn, u64)> {
        self.inner.alloc.node_span(node)
    }

    /// Every node's counters, as `/sys/devices/system/node/nodeN/numastat`
    /// (a `nodeN` header per node), with the access path's local and remote
    /// accesses after them.
    pub fn numastat(&self) -> String {
        let mut s = String::new();
        for node in 0..self.nr_nodes() {
            let n = self.numa_stats(node);
            let a = self.node_accesses(node);
            let _ = writeln!(s, "node{node}");
            let _ = writeln!(s, "numa_hit {}", n.numa_hit);
            let _ = writeln!(s, "numa_miss {}", n.numa_miss);
            let _ = writeln!(s, "numa_foreign {}", n.numa_foreign);
            let _ = writeln!(s, "interleave_hit {}", n.interleave_hit);
            let _ = writeln!(s, "local_node {}", n.local_node);
            let _ = writeln!(s, "other_node {}", n.other_node);
            let _ = writeln!(s, "local_accesses {}", a.local);
            let _ = writeln!(s, "remote_accesses {}", a.remote);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_pages_are_whole_blocks_and_the_last_takes_the_tail() {
        let t = Topology::emulated(3);
        let v = node_pages(&t, 10 * 1024 + 7).unwrap();
        assert_eq!(v, vec![4 * 1024, 3 * 1024, 3 * 1024 + 7]);
        assert!(
            node_pages(&t, 2 * 1024 + 1023).is_err(),
            "fewer blocks than nodes"
        );
    }

    #[test]
    fn mbind_range_binds_to_node_0_and_refuses_a_missing_node() {
        let len = 2 << 20;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let r0 = mbind_range(p as *mut u8, len, 0);
        let r63 = mbind_range(p as *mut u8, len, 63);
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(p, len) };
        match r0 {
            Ok(()) => assert!(r63.is_err(), "node 63 does not exist here"),
            // Sandboxes without the syscall: refused as a whole, never half done.
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
                "{e}"
            ),
        }
    }
}
