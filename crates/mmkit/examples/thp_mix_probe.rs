//! Where the huge half of `order0_thp_mix` spends its time (the lab gives the
//! scores only): order0_thp_mix taken apart, outside the lab: two threads fault
//! plain mappings on CPU 0, two fault `MapFlags::HUGE` mappings on CPU 1 (128 MiB
//! regions, one byte written per 4 KiB, unmap, loop), after faulting 97% of the
//! arena as order-0 pages and dropping it, as the lab's workload does. For the huge
//! half it times the huge faults (first touch of each 2 MiB: allocation and
//! clearing; wall and thread CPU time, as the two huge threads share a CPU), the
//! other touches, and the unmaps separately, so that a difference between variants
//! can be put on the huge half's own path or on the other half's interference.
//!
//! `cargo run --release -p mmkit --example thp_mix_probe -- [CAP] [SECS] [ROUNDS] [VARIANT...]`
//!
//! - `CAP`: pages per second each plain thread may fault (0: as fast as it can),
//!   to compare the huge half of two variants under the same order-0 load;
//! - `PLAIN_THREADS=0` in the environment: the huge half alone;
//! - `VMSTAT=1`: the slow-path, drain, merge, compaction and per-CPU cache
//!   counters of each point;
//! - variants default to `mmkit mmkit-eager`, interleaved, a fresh `Mm` each.
use mmkit::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const REGION: usize = 128 << 20;
const PAGE: u64 = PAGE_SIZE as u64;
const HPAGE: u64 = 2 << 20;

/// Restricts the calling thread to `cpu` (best effort).
fn pin(cpu: usize) {
    // SAFETY: the set is plain data built with CPU_ZERO/CPU_SET on an index below
    // CPU_SETSIZE; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[derive(Default)]
struct Totals {
    plain_pages: AtomicU64,
    huge_pages: AtomicU64,
    huge_faults: AtomicU64,
    fault_ns: AtomicU64,
    fault_cpu_ns: AtomicU64,
    touch_ns: AtomicU64,
    unmap_ns: AtomicU64,
}

fn plain_thread(s: Space, cap: f64, measure: &AtomicBool, stop: &AtomicBool, t: &Totals) {
    pin(0);
    let (t0, mut done, mut n) = (Instant::now(), 0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let Ok(a) = s.mmap(REGION, MapFlags::empty()) else {
            break;
        };
        let mut off = 0;
        while off < REGION as u64 && !stop.load(Ordering::Relaxed) {
            if s.touch(a + off, true).is_err() {
                break;
            }
            off += PAGE;
            done += 1;
            n += measure.load(Ordering::Relaxed) as u64;
            if cap > 0.0 && done % 64 == 0 {
                let due = Duration::from_secs_f64(done as f64 / cap);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        let _ = s.munmap(a, REGION);
    }
    t.plain_pages.fetch_add(n, Ordering::Relaxed);
}

/// CPU time of the calling thread, in ns (wall time counts the other huge
/// thread's turns on the shared CPU too).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn huge_thread(s: Space, measure: &AtomicBool, stop: &AtomicBool, t: &Totals) {
    pin(1);
    let (mut n, mut nf, mut f, mut o, mut u) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut fc = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(a) = s.mmap(REGION, MapFlags::HUGE) else {
            break;
        };
        let mut off = 0;
        while off < REGION as u64 && !stop.load(Ordering::Relaxed) {
            let first = off % HPAGE == 0;
            let c0 = if first { thread_cpu_ns() } else { 0 };
            let t0 = Instant::now();
            if s.touch(a + off, true).is_err() {
                break;
            }
            let d = t0.elapsed().as_nanos() as u64;
            if measure.load(Ordering::Relaxed) {
                n += 1;
                if first {
                    (f, nf) = (f + d, nf + 1);
                    fc += thread_cpu_ns() - c0;
                } else {
                    o += d;
                }
            }
            off += PAGE;
        }
        let t0 = Instant::now();
        let _ = s.munmap(a, REGION);
        if measure.load(Ordering::Relaxed) {
            u += t0.elapsed().as_nanos() as u64;
        }
    }
    t.huge_pages.fetch_add(n, Ordering::Relaxed);
    t.huge_faults.fetch_add(nf, Ordering::Relaxed);
    t.fault_ns.fetch_add(f, Ordering::Relaxed);
    t.fault_cpu_ns.fetch_add(fc, Ordering::Relaxed);
    t.touch_ns.fetch_add(o, Ordering::Relaxed);
    t.unmap_ns.fetch_add(u, Ordering::Relaxed);
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let cap: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let variants: Vec<Variant> = if args.len() > 4 {
        args[4..]
            .iter()
            .map(|v| Variant::from_name(v).expect("a variant name: mmkit, mmkit-eager, ..."))
            .collect()
    } else {
        vec![Variant::Mmkit, Variant::MmkitEager]
    };
    let plain_threads: usize = std::env::var("PLAIN_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    // As the lab's arena_for(4 * REGION).
    let mem = (4 * REGION + 4 * REGION / 256 + (64 << 20)).div_ceil(4 << 20) * (4 << 20);
    println!(
        "variant        order0 M/s  thp M/s | per huge fault us (cpu) | other touch ns | unmap per 2 MiB us"
    );
    for _ in 0..rounds {
        for &v in &variants {
            let mm = Mm::builder()
                .memory(mem)
                .variant(v)
                .clear(ClearStrategy::Auto)
                .prefault(true)
                .build()?;
            {
                // Break every high-order block, as the lab does.
                let s = mm.new_space()?;
                mm.drain_all_pages();
                let pages = mm.nr_free_pages() * 97 / 100 * 512 / 513;
                let a = s.mmap((pages * PAGE) as usize, MapFlags::empty())?;
                for i in 0..pages {
                    if s.touch(a + i * PAGE, true).is_err() {
                        break;
                    }
                }
            }
            mm.drain_all_pages();
            let (measure, stop, t) = (
                AtomicBool::new(false),
                AtomicBool::new(false),
                Totals::default(),
            );
            let mut elapsed = Duration::ZERO;
            std::thread::scope(|sc| -> Result<(), Error> {
                for _ in 0..plain_threads {
                    let s = mm.new_space()?;
                    let (measure, stop, t) = (&measure, &stop, &t);
                    sc.spawn(move || plain_thread(s, cap, measure, stop, t));
                }
                for _ in 0..2 {
                    let s = mm.new_space()?;
                    let (measure, stop, t) = (&measure, &stop, &t);
                    sc.spawn(move || huge_thread(s, measure, stop, t));
                }
                std::thread::sleep(Duration::from_millis(150));
                let t0 = Instant::now();
                measure.store(true, Ordering::Relaxed);
                std::thread::sleep(Duration::from_secs_f64(secs));
                measure.store(false, Ordering::Relaxed);
                elapsed = t0.elapsed();
                stop.store(true, Ordering::Relaxed);
                Ok(())
            })?;
            if std::env::var_os("VMSTAT").is_some() {
                let vs = mm.vmstat();
                for l in vs.lines().filter(|l| {
                    ["slowpath", "drain", "merge", "compact", "pcp_cache"]
                        .iter()
                        .any(|k| l.contains(k))
                }) {
                    println!("  {l}");
                }
            }
            let s = elapsed.as_secs_f64();
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
            let nf = g(&t.huge_faults).max(1.0);
            println!(
                "{:14} {:10.2} {:8.2} | {:15.1} ({:4.1}) | {:14.0} | {:18.1}",
                v.name(),
                g(&t.plain_pages) / s / 1e6,
                g(&t.huge_pages) / s / 1e6,
                g(&t.fault_ns) / nf / 1e3,
                g(&t.fault_cpu_ns) / nf / 1e3,
                g(&t.touch_ns) / (g(&t.huge_pages) - nf).max(1.0),
                g(&t.unmap_ns) / nf / 1e3,
            );
        }
    }
    Ok(())
}
