//! Concurrency stress of the page allocator, for every variant.
//!
//! * `stress_*`: 16 threads (more than the cores) allocate and free random
//!   blocks of order 0..=4 for about a second. Every word of every block is
//!   stamped with a value tied to its pfn and to a per-allocation nonce, and
//!   verified before the block is freed (catches two owners of one page and
//!   allocator metadata written into allocated pages). Threads hand blocks to
//!   each other through a shared exchange, so blocks are freed by a thread
//!   other than the one that allocated them (the cross-CPU free pattern).
//!   One thread drains the per-CPU lists now and then. At the end everything
//!   is freed, `check()` is Ok and `nr_free_pages` is back to its start value.
//! * `double_free_race_*`: many threads race to free the same block; exactly
//!   one free succeeds, every other one gets `Error::NotAllocated`.
//!
//! The random seed is printed (shown when a test fails) and can be fixed with
//! `MMKIT_TEST_SEED=<u64>`.

mod common;

use common::*;
use mmkit::{Error, Gfp, Mm, Pfn, Variant};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const MEM: u64 = 64 * MIB;
const THREADS: usize = 16;
const RUN: Duration = Duration::from_millis(1200);
/// Every thread runs at least this many iterations, however slow it is.
const MIN_ITERS: u64 = 300;
const MAX_ORDER_STRESS: u32 = 4;
const MAX_HELD: usize = 24;
const MAX_EXCHANGE: usize = 128;
const PRIME: u64 = 0x9E37_79B9_7F4A_7C15;

fn seed() -> u64 {
    let s = std::env::var("MMKIT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("MMKIT_TEST_SEED={s}");
    s
}

#[derive(Clone, Copy, Debug)]
struct Block {
    pfn: Pfn,
    order: u32,
    nonce: u64,
    owner: usize,
}

fn word_value(page_pfn: u64, w: usize, nonce: u64) -> u64 {
    page_pfn.wrapping_mul(PRIME).wrapping_add(w as u64) ^ nonce.rotate_left(29)
}

/// Start and length in words of the block `b`.
fn block_words(mm: &Mm, b: &Block) -> (*mut u64, usize) {
    let base = mm.page_address(b.pfn) as *mut u64;
    assert!(!base.is_null());
    (base, (1usize << b.order) * WORDS_PER_PAGE)
}

fn stamp_block(mm: &Mm, b: &Block) {
    let (base, len) = block_words(mm, b);
    // SAFETY: the block (2^order pages) belongs to the calling thread until
    // it is freed; the slice does not outlive this function.
    let words = unsafe { std::slice::from_raw_parts_mut(base, len) };
    for (i, w) in words.iter_mut().enumerate() {
        let page = b.pfn.get() + (i / WORDS_PER_PAGE) as u64;
        *w = word_value(page, i % WORDS_PER_PAGE, b.nonce);
    }
}

fn verify_block(mm: &Mm, b: &Block, seed: u64) {
    let (base, len) = block_words(mm, b);
    // SAFETY: as in `stamp_block`.
    let words = unsafe { std::slice::from_raw_parts(base as *const u64, len) };
    for (i, &w) in words.iter().enumerate() {
        let page = b.pfn.get() + (i / WORDS_PER_PAGE) as u64;
        let want = word_value(page, i % WORDS_PER_PAGE, b.nonce);
        assert_eq!(
            w,
            want,
            "seed {seed}: block {b:?}: word {} of page {page} overwritten while allocated",
            i % WORDS_PER_PAGE
        );
    }
}

fn free_block(mm: &Mm, b: &Block, seed: u64) {
    verify_block(mm, b, seed);
    if let Err(e) = mm.free_pages(b.pfn, b.order) {
        panic!("seed {seed}: free of allocated block {b:?} failed: {e:?}");
    }
}

fn random_gfp(rng: &mut StdRng) -> (Gfp, bool) {
    match rng.gen_range(0..5) {
        0 => (Gfp::KERNEL, false),
        1 => (Gfp::MOVABLE, false),
        2 => (Gfp::ATOMIC, false),
        3 => (Gfp::RECLAIMABLE, false),
        _ => (Gfp::KERNEL | Gfp::ZERO, true),
    }
}

#[derive(Default, Debug)]
struct Counts {
    allocs: u64,
    frees: u64,
    cross_frees: u64,
    no_memory: u64,
}

fn stress_worker(
    mm: Mm,
    tid: usize,
    seed: u64,
    start: Arc<Barrier>,
    exchange: Arc<Mutex<Vec<Block>>>,
    nonces: Arc<AtomicU64>,
) -> Counts {
    let mut rng = StdRng::seed_from_u64(seed ^ (tid as u64).wrapping_mul(PRIME));
    let spanned = nr_spanned(MEM);
    let mut held: Vec<Block> = Vec::new();
    let mut c = Counts::default();
    start.wait();
    let t0 = Instant::now();
    let mut iter = 0u64;
    while iter < MIN_ITERS || t0.elapsed() < RUN {
        iter += 1;
        if tid == 0 && iter & 255 == 0 {
            mm.drain_all_pages();
        }
        let r = rng.gen_range(0..100);
        if r < 50 && held.len() < MAX_HELD {
            let order = rng.gen_range(0..=MAX_ORDER_STRESS);
            let (gfp, zero) = random_gfp(&mut rng);
            match mm.alloc_pages(gfp, order) {
                Ok(pfn) => {
                    let p = pfn.get();
                    assert_eq!(
                        p % (1 << order),
                        0,
                        "seed {seed}: pfn {p} misaligned for order {order}"
                    );
                    assert!(
                        p + (1 << order) <= spanned,
                        "seed {seed}: pfn {p} order {order} outside arena"
                    );
                    if zero {
                        if let Err(msg) = block_is_zero(&mm, pfn, order) {
                            panic!("seed {seed}: {msg}");
                        }
                    }
                    let b = Block {
                        pfn,
                        order,
                        nonce: nonces.fetch_add(1, Ordering::Relaxed),
                        owner: tid,
                    };
                    stamp_block(&mm, &b);
                    held.push(b);
                    c.allocs += 1;
                }
                Err(Error::NoMemory { order: o }) => {
                    assert_eq!(o, order, "seed {seed}: NoMemory with the wrong order");
                    c.no_memory += 1;
                }
                Err(e) => panic!("seed {seed}: alloc order {order} failed with {e:?}"),
            }
        } else if r < 62 && !held.is_empty() {
            // Hand a block to whichever thread takes it next.
            let b = held.swap_remove(rng.gen_range(0..held.len()));
            let mut ex = exchange.lock().unwrap();
            if ex.len() < MAX_EXCHANGE {
                ex.push(b);
            } else {
                drop(ex);
                free_block(&mm, &b, seed);
                c.frees += 1;
            }
        } else if r < 74 {
            let taken = exchange.lock().unwrap().pop();
            if let Some(b) = taken {
                free_block(&mm, &b, seed);
                c.frees += 1;
                if b.owner != tid {
                    c.cross_frees += 1;
                }
            }
        } else if !held.is_empty() {
            let b = held.swap_remove(rng.gen_range(0..held.len()));
            free_block(&mm, &b, seed);
            c.frees += 1;
        }
    }
    for b in held.drain(..) {
        free_block(&mm, &b, seed);
        c.frees += 1;
    }
    c
}

fn stress(variant: Variant) {
    let seed = seed();
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    mm.check().expect("check after build");
    let start = Arc::new(Barrier::new(THREADS));
    let exchange = Arc::new(Mutex::new(Vec::new()));
    let nonces = Arc::new(AtomicU64::new(1));
    let handles: Vec<_> = (0..THREADS)
        .map(|tid| {
            let (mm, start, exchange, nonces) =
                (mm.clone(), start.clone(), exchange.clone(), nonces.clone());
            thread::spawn(move || stress_worker(mm, tid, seed, start, exchange, nonces))
        })
        .collect();
    let mut total = Counts::default();
    for (tid, h) in handles.into_iter().enumerate() {
        let c = h
            .join()
            .unwrap_or_else(|_| panic!("seed {seed}: worker {tid} panicked"));
        assert!(
            c.allocs > 0,
            "seed {seed}: worker {tid} never allocated: {c:?}"
        );
        total.allocs += c.allocs;
        total.frees += c.frees;
        total.cross_frees += c.cross_frees;
        total.no_memory += c.no_memory;
    }
    for b in exchange.lock().unwrap().drain(..) {
        free_block(&mm, &b, seed);
        total.frees += 1;
    }
    eprintln!("{}: {total:?}", variant.name());
    assert_eq!(total.allocs, total.frees, "seed {seed}: bookkeeping");
    assert!(
        total.cross_frees > 0,
        "seed {seed}: no block was freed by another thread"
    );
    if let Err(e) = mm.check() {
        panic!("seed {seed}: check() after the stress run: {e:?}");
    }
    assert_eq!(
        mm.nr_free_pages(),
        free0,
        "seed {seed}: nr_free_pages after freeing everything"
    );
    mm.drain_all_pages();
    assert_eq!(
        mm.nr_free_pages(),
        free0,
        "seed {seed}: nr_free_pages after drain_all_pages"
    );
    if let Err(e) = mm.check() {
        panic!("seed {seed}: check() after drain_all_pages: {e:?}");
    }
    // The allocator is still fully usable: the largest block can be had.
    let pfn = mm
        .alloc_pages(Gfp::KERNEL, TOP_ORDER)
        .unwrap_or_else(|e| panic!("seed {seed}: order-{TOP_ORDER} alloc after stress: {e:?}"));
    mm.free_pages(pfn, TOP_ORDER).unwrap();
    assert_eq!(mm.nr_free_pages(), free0);
}

#[test]
fn stress_mmkit() {
    stress(Variant::Mmkit);
}

#[test]
fn stress_mmkit_eager() {
    stress(Variant::MmkitEager);
}

#[test]
fn stress_mmkit_nopcp() {
    stress(Variant::MmkitNoPcp);
}

const RACERS: usize = 16;
const ROUNDS: usize = 200;

fn double_free_race(variant: Variant) {
    let mm = build(variant, None, 16 * MIB);
    let free0 = mm.nr_free_pages();
    let target = Arc::new(AtomicU64::new(0));
    let order_of = Arc::new(AtomicU64::new(0));
    let oks = Arc::new(AtomicUsize::new(0));
    let not_allocated = Arc::new(AtomicUsize::new(0));
    let others = Arc::new(Mutex::new(Vec::<String>::new()));
    let barrier = Arc::new(Barrier::new(RACERS + 1));

    let handles: Vec<_> = (0..RACERS)
        .map(|_| {
            let (mm, target, order_of, oks, not_allocated, others, barrier) = (
                mm.clone(),
                target.clone(),
                order_of.clone(),
                oks.clone(),
                not_allocated.clone(),
                others.clone(),
                barrier.clone(),
            );
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    barrier.wait();
                    let pfn = Pfn::new(target.load(Ordering::SeqCst));
                    let order = order_of.load(Ordering::SeqCst) as u32;
                    // A panic is recorded rather than propagated, so that the
                    // barrier does not leave the main thread waiting forever.
                    let r = panic::catch_unwind(AssertUnwindSafe(|| mm.free_pages(pfn, order)));
                    let Ok(r) = r else {
                        others
                            .lock()
                            .unwrap()
                            .push(format!("free({}, {order}) panicked", pfn.get()));
                        barrier.wait();
                        continue;
                    };
                    match r {
                        Ok(()) => {
                            oks.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::NotAllocated { pfn: p }) if p == pfn.get() => {
                            not_allocated.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => others
                            .lock()
                            .unwrap()
                            .push(format!("free({}, {order}): {e:?}", pfn.get())),
                    }
                    barrier.wait();
                }
            })
        })
        .collect();

    for round in 0..ROUNDS {
        let order = (round % 4) as u32;
        let gfp = if round % 3 == 1 {
            Gfp::MOVABLE
        } else {
            Gfp::KERNEL
        };
        let pfn = mm.alloc_pages(gfp, order).expect("alloc for the race");
        target.store(pfn.get(), Ordering::SeqCst);
        order_of.store(order as u64, Ordering::SeqCst);
        oks.store(0, Ordering::SeqCst);
        not_allocated.store(0, Ordering::SeqCst);
        barrier.wait(); // racers go
        barrier.wait(); // racers done
        let errs = others.lock().unwrap().clone();
        assert!(
            errs.is_empty(),
            "round {round}: unexpected errors: {errs:?}"
        );
        assert_eq!(
            oks.load(Ordering::SeqCst),
            1,
            "round {round}: pfn {} order {order} freed successfully more or less than once",
            pfn.get()
        );
        assert_eq!(
            not_allocated.load(Ordering::SeqCst),
            RACERS - 1,
            "round {round}"
        );
        assert_eq!(
            mm.nr_free_pages(),
            free0,
            "round {round}: nr_free_pages after the race"
        );
        if round % 50 == 49 {
            mm.check()
                .unwrap_or_else(|e| panic!("round {round}: check() failed: {e:?}"));
        }
    }
    for h in handles {
        h.join().expect("racer panicked");
    }
    mm.check().expect("check() after the races");
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().expect("check() after draining");
}

#[test]
fn double_free_race_mmkit() {
    double_free_race(Variant::Mmkit);
}

#[test]
fn double_free_race_mmkit_eager() {
    double_free_race(Variant::MmkitEager);
}

#[test]
fn double_free_race_mmkit_nopcp() {
    double_free_race(Variant::MmkitNoPcp);
}
