//! `alloc_free_batch`: the batched order-0 loop. Each thread allocates a batch
//! of 512 pages (kept in a thread-local Vec), writing one byte to each, then
//! frees them all in allocation order; the per-CPU lists overflow and refill, so
//! this is where the zone lock is taken. An op is one alloc+free pair.

use super::{standard_figures, Figure, Workload};
use crate::peers::{Block, Peer};
use crate::runner::{run_workers, Timing, Worker};
use serde_json::{Map, Value};

/// Pages per batch (8 threads hold 16 MiB at most).
pub const BATCH: usize = 512;

pub struct AllocFreeBatch;

/// A thread allocating `batch` blocks of the orders `order_of` picks, then
/// freeing them; shared with `alloc_free_orders`.
pub struct BatchLoop<'a, F: FnMut() -> u32> {
    pub peer: &'a Peer,
    pub batch: usize,
    pub order_of: F,
    pub held: Vec<(Block, u32)>,
    pub failures: u64,
}

impl<'a, F: FnMut() -> u32> BatchLoop<'a, F> {
    pub fn new(peer: &'a Peer, batch: usize, order_of: F) -> Self {
        BatchLoop {
            peer,
            batch,
            order_of,
            held: Vec::with_capacity(batch),
            failures: 0,
        }
    }
}

impl<F: FnMut() -> u32> Worker for BatchLoop<'_, F> {
    fn step(&mut self) -> u64 {
        for _ in 0..self.batch {
            let order = (self.order_of)();
            match self.peer.alloc(order) {
                Some(b) => {
                    // SAFETY: b was just allocated with this order.
                    unsafe { self.peer.touch(b, order) };
                    self.held.push((b, order));
                }
                None => {
                    // Out of memory: free what we hold and count it.
                    self.failures += 1;
                    break;
                }
            }
        }
        let n = self.held.len() as u64;
        self.finish();
        n
    }

    fn finish(&mut self) {
        for (b, order) in self.held.drain(..) {
            // SAFETY: `held` has live blocks with their orders; drain frees each once.
            unsafe { self.peer.free(b, order) };
        }
    }

    fn failures(&self) -> u64 {
        self.failures
    }
}

impl Workload for AllocFreeBatch {
    fn name(&self) -> &'static str {
        "alloc_free_batch"
    }

    fn description(&self) -> &'static str {
        "each thread loops: allocate 512 order-0 pages (writing one byte to each), then \
         free them all in allocation order; ops_per_sec counts alloc+free pairs"
    }

    fn params(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("batch".into(), BATCH.into());
        p.insert("order".into(), 0.into());
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let m = run_workers(peer, threads, timing, |_| BatchLoop::new(peer, BATCH, || 0));
        standard_figures(&m)
    }
}
