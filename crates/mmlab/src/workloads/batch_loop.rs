//! The batched allocation loop of `alloc_free_batch` and `alloc_free_orders`:
//! a thread allocates a batch of blocks (orders from a closure), writes one
//! byte to each, then frees them all in allocation order. An op is one block
//! allocated and freed; an allocation that fails (out of memory) ends the batch
//! early and is counted.

use crate::peers::{Block, Peer};
use crate::runner::Worker;

/// A thread allocating `batch` blocks of the orders `order_of` picks, then
/// freeing them.
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
