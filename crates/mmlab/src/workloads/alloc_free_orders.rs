//! `alloc_free_orders`: small batches of mixed orders. Each thread allocates 32
//! blocks whose orders (0..=3) come from a per-thread xorshift PRNG seeded the
//! same way in every variant, writes one byte per page, then frees the batch in
//! allocation order. Exercises the per-order PCP lists, splitting and merging.
//! An op is one alloc+free pair (of a block of any order).

use super::batch_loop::BatchLoop;
use super::{standard_figures, Figure, Workload, XorShift};
use crate::peers::Peer;
use crate::runner::{run_workers, Timing};
use serde_json::{Map, Value};

/// Blocks per batch.
pub const BATCH: usize = 32;
/// Orders are drawn uniformly from 0..=MAX_ORDER.
pub const MAX_ORDER: u32 = 3;
/// Base PRNG seed; thread i uses SEED + i in every variant.
pub const SEED: u64 = 0x006d_6d6c_6162;

pub struct AllocFreeOrders;

impl Workload for AllocFreeOrders {
    fn name(&self) -> &'static str {
        "alloc_free_orders"
    }

    fn description(&self) -> &'static str {
        "each thread loops: allocate 32 blocks of orders 0..=3 drawn from a per-thread \
         PRNG (same seed in every variant), writing one byte per page, then free them in \
         allocation order; ops_per_sec counts alloc+free pairs"
    }

    fn params(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("batch".into(), BATCH.into());
        p.insert("orders".into(), format!("0..={MAX_ORDER}").into());
        p.insert("seed".into(), SEED.into());
        p
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let m = run_workers(peer, threads, timing, |tid| {
            let mut rng = XorShift::new(SEED + tid as u64);
            BatchLoop::new(peer, BATCH, move || {
                (rng.next_u64() % (MAX_ORDER as u64 + 1)) as u32
            })
        });
        standard_figures(&m)
    }
}
