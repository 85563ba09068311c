//! The lock-free per-CPU caches (restartable sequences) under real threads.
//!
//! * `hot_loop_takes_no_lock`: once warm, an order-0 alloc/free loop is served by
//!   the cache alone (no per-CPU list refill or drain, no zone lock), and
//!   `pgalloc`/`pgfree` still count every call exactly.
//! * `preempted_signalled_and_drained`: 32 threads on this 2-core machine allocate
//!   and free runs of 1..=90 order-0 pages (so caches fill, spill and refill),
//!   stamping three words of every page with a value tied to its pfn and a nonce
//!   and verifying them before the free, while one thread drains every cache
//!   (`drain_all_pages`, the membarrier fence), and another
//!   signals the workers all the time so that sequences are interrupted. It runs
//!   until sequences were seen aborting (and retried). At the end the counts are
//!   exact, `check()` is clean and every page is back.
//!
//! Skipped (with a message) where rseq or membarrier is not available.

mod common;

use common::*;
use mmkit::{rseq_aborts, Gfp, LockStats, Mm, Pfn, Variant, VmEvent};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

fn build_cached() -> Option<Mm> {
    let mm = build(Variant::Mmkit, None, 64 * MIB);
    if !mm.has_pcp_caches() {
        eprintln!("rseq or membarrier not available here: per-CPU caches off, test skipped");
        return None;
    }
    Some(mm)
}

#[test]
fn hot_loop_takes_no_lock() {
    let Some(mm) = build_cached() else { return };
    // Warm: the first allocation misses and fills the cache.
    for _ in 0..4 {
        let p = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
        mm.free_pages(p, 0).unwrap();
    }
    let ev0 = mm.vm_events();
    let lock0: LockStats = mm.zone_lock_stats();
    const N: u64 = 100_000;
    for _ in 0..N {
        let p = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
        mm.free_pages(p, 0).unwrap();
    }
    let ev = mm.vm_events();
    let d = |e| ev.get(e) - ev0.get(e);
    // A migration to another CPU in between costs at most a refill or two.
    assert!(d(VmEvent::PcpRefill) + d(VmEvent::PcpDrain) <= 4, "{ev:?}");
    assert!(mm.zone_lock_stats().since(&lock0).acquisitions <= 4);
    assert_eq!(d(VmEvent::PgAlloc), N);
    assert_eq!(d(VmEvent::PgFree), N);
    mm.check().unwrap();
}

const THREADS: usize = 32;
const PRIME: u64 = 0x9E37_79B9_7F4A_7C15;

fn stamp(pfn: Pfn, nonce: u64) -> u64 {
    pfn.get().wrapping_mul(PRIME) ^ nonce
}

const WORDS: [usize; 3] = [0, WORDS_PER_PAGE / 2, WORDS_PER_PAGE - 1];

extern "C" fn on_sigusr1(_: libc::c_int) {}

#[test]
fn preempted_signalled_and_drained() {
    let Some(mm) = build_cached() else { return };
    // SAFETY: installs a handler that does nothing, for SIGUSR1, which nothing
    // else in this test binary uses; SA_RESTART keeps syscalls going.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr1 as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let ev0 = mm.vm_events();
    let aborts0 = rseq_aborts();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let nonces = Arc::new(AtomicU64::new(1));
    let workers: Vec<_> = (0..THREADS)
        .map(|tid| {
            let (mm, stop, start, nonces) =
                (mm.clone(), stop.clone(), start.clone(), nonces.clone());
            thread::spawn(move || {
                let mut held: Vec<(Pfn, u64)> = Vec::with_capacity(96);
                let (mut allocs, mut frees) = (0u64, 0u64);
                let mut run = tid as u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    run = run
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = 1 + (run >> 33) % 90;
                    for _ in 0..k {
                        let p = mm.alloc_pages(Gfp::KERNEL, 0).expect("order-0 allocation");
                        allocs += 1;
                        let nonce = nonces.fetch_add(1, Ordering::Relaxed);
                        for w in WORDS {
                            write_word(&mm, p, 0, w, stamp(p, nonce));
                        }
                        held.push((p, nonce));
                    }
                    for (p, nonce) in held.drain(..) {
                        for w in WORDS {
                            assert_eq!(
                                read_word(&mm, p, 0, w),
                                stamp(p, nonce),
                                "pfn {p:?}: word {w} changed while allocated"
                            );
                        }
                        mm.free_pages(p, 0).expect("free of an allocated page");
                        frees += 1;
                    }
                }
                (allocs, frees)
            })
        })
        .collect();
    let pthreads: Vec<libc::pthread_t> = workers.iter().map(|h| h.as_pthread_t()).collect();
    let drainer = {
        let (mm, stop) = (mm.clone(), stop.clone());
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                mm.drain_all_pages();
                n += 1;
                thread::sleep(Duration::from_micros(300));
            }
            n
        })
    };
    start.wait();
    let t0 = Instant::now();
    let mut signals = 0u64;
    // At least 1 s, then until sequences have been seen aborting (at most 20 s).
    while t0.elapsed() < Duration::from_secs(1)
        || (rseq_aborts() == aborts0 && t0.elapsed() < Duration::from_secs(20))
    {
        for &t in &pthreads {
            // SAFETY: the workers are still running (they stop only after `stop`).
            unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
            signals += 1;
        }
        thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    let (mut allocs, mut frees) = (0u64, 0u64);
    for h in workers {
        let (a, f) = h.join().expect("worker panicked");
        assert!(a > 0);
        allocs += a;
        frees += f;
    }
    let drains = drainer.join().expect("drainer panicked");
    let aborts = rseq_aborts() - aborts0;
    eprintln!(
        "{allocs} allocs, {drains} drains, {signals} signals, {aborts} sequences aborted and retried"
    );
    assert!(aborts > 0, "no restartable sequence was ever interrupted");
    assert_eq!(allocs, frees);
    let ev = mm.vm_events();
    assert_eq!(ev.get(VmEvent::PgAlloc) - ev0.get(VmEvent::PgAlloc), allocs);
    assert_eq!(ev.get(VmEvent::PgFree) - ev0.get(VmEvent::PgFree), frees);
    assert!(ev.get(VmEvent::PcpCacheDrain) > ev0.get(VmEvent::PcpCacheDrain));
    mm.check().unwrap();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.drain_all_pages();
    assert_eq!(mm.zone_info()[0].nr_pcp, 0);
    mm.check().unwrap();
    let top = mm.alloc_pages(Gfp::KERNEL, TOP_ORDER).unwrap();
    mm.free_pages(top, TOP_ORDER).unwrap();
    assert_eq!(mm.nr_free_pages(), free0);
}
