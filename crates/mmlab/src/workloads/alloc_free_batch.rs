//! `alloc_free_batch`: the batched order-0 loop. Each thread allocates a batch
//! of 512 pages (kept in a thread-local Vec), writing one byte to each, then
//! frees them all in allocation order; the per-CPU lists overflow and refill, so
//! this is where the zone lock is taken. An op is one alloc+free pair.

use super::batch_loop::BatchLoop;
use super::{standard_figures, Figure, Workload};
use crate::peers::Peer;
use crate::runner::{run_workers, Timing};
use serde_json::{Map, Value};

/// Pages per batch (8 threads hold 16 MiB at most).
pub const BATCH: usize = 512;

pub struct AllocFreeBatch;

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
