//! `cross_cpu_free`: the network-receive pattern. Threads come in pairs: the
//! even thread of a pair only allocates (order 0, one byte written per page) and
//! sends the blocks, 32 at a time, through a bounded channel to its partner, the
//! odd thread, which only frees what it receives. Thread i is pinned to the i-th
//! CPU, so pages are allocated on one CPU and freed on another. A lone thread
//! (1 thread, or the last of an odd count) does both: allocate 32, free them.
//! An op is one freed page.
//!
//! Blocks travel in batches so that the channel's cost (a cache line moving
//! between CPUs per message) is spread over 32 pages and the allocators' cost
//! dominates; the batches are arrays sent by value, so no heap allocation is
//! involved.

use super::{standard_figures, Figure, Workload};
use crate::peers::{Block, Peer};
use crate::runner::{run_workers, Timing, Worker};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use serde_json::{Map, Value};

/// Pages per message (and per batch of the lone thread).
pub const BATCH: usize = 32;
/// Capacity of each pair's channel, in messages (16 x 32 = 512 pages in flight).
pub const QUEUE: usize = 16;

pub struct CrossCpuFree;

/// Up to `BATCH` order-0 blocks. Not `Copy`: a batch is moved from `fill`
/// through the channel to `free_batch`, so its blocks are freed once.
struct Batch {
    len: usize,
    blocks: [Block; BATCH],
}

impl Batch {
    const EMPTY: Batch = Batch {
        len: 0,
        blocks: [Block::NULL; BATCH],
    };

    fn blocks(&self) -> &[Block] {
        &self.blocks[..self.len]
    }
}

enum Role {
    Producer(Sender<Batch>),
    Consumer(Receiver<Batch>),
    Lone,
}

struct CrossWorker<'a> {
    peer: &'a Peer,
    role: Role,
    /// A producer's full batch that the channel had no room for.
    pending: Option<Batch>,
    failures: u64,
}

/// Allocates up to a batch of order-0 pages, touching each; stops early (and
/// counts a failure) when out of memory.
fn fill(peer: &Peer, failures: &mut u64) -> Batch {
    let mut b = Batch::EMPTY;
    while b.len < BATCH {
        match peer.alloc(0) {
            Some(x) => {
                // SAFETY: x was just allocated with order 0.
                unsafe { peer.touch(x, 0) };
                b.blocks[b.len] = x;
                b.len += 1;
            }
            None => {
                *failures += 1;
                break;
            }
        }
    }
    b
}

/// Frees every block of `b`; returns how many. A batch is moved (never copied)
/// from `fill` through the channel to here, so each block is freed once.
fn free_batch(peer: &Peer, b: Batch) -> u64 {
    for &x in b.blocks() {
        // SAFETY: the blocks of a batch are live order-0 blocks from `fill`,
        // and each batch reaches free_batch once (see above).
        unsafe { peer.free(x, 0) };
    }
    b.len as u64
}

impl Worker for CrossWorker<'_> {
    fn step(&mut self) -> u64 {
        let CrossWorker {
            peer,
            role,
            pending,
            failures,
        } = self;
        match role {
            Role::Producer(tx) => {
                let b = match pending.take() {
                    Some(b) => b,
                    None => fill(peer, failures),
                };
                if b.len == 0 {
                    std::thread::yield_now();
                    return 0;
                }
                match tx.try_send(b) {
                    Ok(()) => {}
                    Err(TrySendError::Full(b)) => {
                        *pending = Some(b);
                        std::thread::yield_now();
                    }
                    Err(TrySendError::Disconnected(b)) => {
                        free_batch(peer, b);
                    }
                }
                0
            }
            Role::Consumer(rx) => match rx.try_recv() {
                Ok(b) => free_batch(peer, b),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    std::thread::yield_now();
                    0
                }
            },
            Role::Lone => {
                let b = fill(peer, failures);
                free_batch(peer, b)
            }
        }
    }

    fn finish(&mut self) {
        // Every worker has left its loop (runner's second barrier), so nothing is
        // sent after a consumer drains its channel.
        if let Some(b) = self.pending.take() {
            free_batch(self.peer, b);
        }
        if let Role::Consumer(rx) = &self.role {
            while let Ok(b) = rx.try_recv() {
                free_batch(self.peer, b);
            }
        }
    }

    fn failures(&self) -> u64 {
        self.failures
    }
}

impl Workload for CrossCpuFree {
    fn name(&self) -> &'static str {
        "cross_cpu_free"
    }

    fn description(&self) -> &'static str {
        "threads in pairs on different CPUs: one allocates order-0 pages (one byte \
         written) and sends them, 32 per message, through a bounded channel; the other \
         frees them. A lone thread (1 thread, or the last of an odd count) allocates 32 \
         and frees them. ops_per_sec counts freed pages"
    }

    fn params(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("batch".into(), BATCH.into());
        p.insert("queue".into(), QUEUE.into());
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let channels: Vec<(Sender<Batch>, Receiver<Batch>)> =
            (0..threads / 2).map(|_| bounded(QUEUE)).collect();
        let m = run_workers(peer, threads, timing, |tid| {
            let role = match channels.get(tid / 2) {
                Some((tx, _)) if tid % 2 == 0 => Role::Producer(tx.clone()),
                Some((_, rx)) => Role::Consumer(rx.clone()),
                None => Role::Lone,
            };
            CrossWorker {
                peer,
                role,
                pending: None,
                failures: 0,
            }
        });
        standard_figures(&m)
    }
}
