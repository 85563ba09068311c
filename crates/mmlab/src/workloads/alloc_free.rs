//! `alloc_free`: the hot (LIFO) order-0 loop. Each thread allocates one page,
//! writes one byte to it and frees it, again and again; with per-CPU lists the
//! same page comes straight back. An op is one alloc+free pair.

use super::{standard_figures, Figure, Workload};
use crate::peers::Peer;
use crate::runner::{run_workers, Timing, Worker};

pub struct AllocFree;

struct HotLoop<'a> {
    peer: &'a Peer,
    failures: u64,
}

impl Worker for HotLoop<'_> {
    #[inline]
    fn step(&mut self) -> u64 {
        match self.peer.alloc(0) {
            Some(b) => {
                // SAFETY: b was just allocated with order 0 and is freed once.
                unsafe {
                    self.peer.touch(b, 0);
                    self.peer.free(b, 0);
                }
                1
            }
            None => {
                self.failures += 1;
                std::thread::yield_now();
                0
            }
        }
    }

    fn failures(&self) -> u64 {
        self.failures
    }
}

impl Workload for AllocFree {
    fn name(&self) -> &'static str {
        "alloc_free"
    }

    fn description(&self) -> &'static str {
        "each thread loops: allocate an order-0 page, write one byte to it, free it \
         (hot, LIFO); ops_per_sec counts alloc+free pairs"
    }

    fn run(&self, peer: &Peer, threads: usize, timing: &Timing) -> Vec<Figure> {
        let m = run_workers(peer, threads, timing, |_| HotLoop { peer, failures: 0 });
        standard_figures(&m)
    }
}
