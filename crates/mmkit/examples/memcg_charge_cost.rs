//! The charge cost of memory cgroups: page_fault1 (mmap 128 MiB, touch every
//! page, munmap) with each thread's space in the root (never charged) and in
//! a child group (charged through the per-CPU stock), at 1 and 2 threads.
//! Rounds alternate root / child so that a noisy machine hits both alike;
//! the median of each is reported, faults and munmap separately, as wall
//! time (the slowest thread's) and as CPU time (the threads' own CPU clocks,
//! summed: on a loaded machine the time a thread waits for a CPU is not in
//! it, so it is the steadier of the two).
//!
//! `cargo run --release --example memcg_charge_cost [ROUNDS] [THREADS...]`
//! (ROUNDS of 128 MiB per thread, default 20; threads default `1 2`).
//! `MODE=root|child` runs one side only (for `valgrind --tool=callgrind`).
use mmkit::*;
use std::time::{Duration, Instant};

const LEN: usize = 128 << 20;

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Times of one phase: the slowest thread's wall time, the threads' CPU time.
#[derive(Clone, Copy, Default)]
struct Times {
    wall: Duration,
    cpu: Duration,
}

/// Which time of a phase.
type Pick = fn(&Times) -> Duration;

/// One page_fault1 round on `threads` threads: (faults, munmap).
fn round(spaces: &[Space]) -> (Times, Times) {
    let times: Vec<[(Duration, Duration); 2]> = std::thread::scope(|sc| {
        let hs: Vec<_> = spaces
            .iter()
            .map(|sp| {
                sc.spawn(move || {
                    let a = sp.mmap(LEN, MapFlags::empty()).unwrap();
                    let (t, c) = (Instant::now(), thread_cpu());
                    for off in (0..LEN).step_by(4096) {
                        sp.touch(a + off as u64, true).unwrap();
                    }
                    let f = (t.elapsed(), thread_cpu() - c);
                    let (t, c) = (Instant::now(), thread_cpu());
                    sp.munmap(a, LEN).unwrap();
                    [f, (t.elapsed(), thread_cpu() - c)]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let phase = |i: usize| Times {
        wall: times.iter().map(|t| t[i].0).max().unwrap(),
        cpu: times.iter().map(|t| t[i].1).sum(),
    };
    (phase(0), phase(1))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(20);
    let threads: Vec<usize> = if args.len() > 1 {
        args[1..].iter().filter_map(|a| a.parse().ok()).collect()
    } else {
        vec![1, 2]
    };
    let mode = std::env::var("MODE").unwrap_or_default();
    for &t in &threads {
        let mm = Mm::builder()
            .memory((t + 1) * LEN + (64 << 20))
            .prefault(true)
            .build()?;
        let g = mm.new_group()?;
        let root: Vec<Space> = (0..t).map(|_| mm.new_space()).collect::<Result<_, _>>()?;
        let child: Vec<Space> = (0..t)
            .map(|_| mm.new_space_in(&g))
            .collect::<Result<_, _>>()?;
        let (mut rf, mut ru, mut cf, mut cu) = (vec![], vec![], vec![], vec![]);
        // One warm-up round each.
        for r in 0..=rounds {
            if mode != "child" {
                let (f, u) = round(&root);
                if r > 0 {
                    rf.push(f);
                    ru.push(u);
                }
            }
            if mode != "root" {
                let (f, u) = round(&child);
                if r > 0 {
                    cf.push(f);
                    cu.push(u);
                }
            }
        }
        if mode.is_empty() {
            let faults = (LEN / 4096 * t) as f64;
            let m = |v: &[Times], f: fn(&Times) -> Duration| median(v.iter().map(f).collect());
            let (wall, cpu): (Pick, Pick) = (|x| x.wall, |x| x.cpu);
            let rate = |d: Duration| faults / d.as_secs_f64() / 1e6;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let ratio = |r: Duration, c: Duration| r.as_secs_f64() / c.as_secs_f64();
            let (rfw, cfw, rfc, cfc) = (m(&rf, wall), m(&cf, wall), m(&rf, cpu), m(&cf, cpu));
            let (ruw, cuw, ruc, cuc) = (m(&ru, wall), m(&cu, wall), m(&ru, cpu), m(&cu, cpu));
            println!(
                "threads {t}: faults wall root {:.2} M/s, child {:.2} M/s (child/root {:.3}); \
                 CPU root {:.2} M/s, child {:.2} M/s (child/root {:.3})",
                rate(rfw),
                rate(cfw),
                ratio(rfw, cfw),
                rate(rfc),
                rate(cfc),
                ratio(rfc, cfc),
            );
            println!(
                "threads {t}: munmap wall root {:.2} ms, child {:.2} ms (child/root {:.3}); \
                 CPU root {:.2} ms, child {:.2} ms (child/root {:.3})",
                ms(ruw),
                ms(cuw),
                ratio(ruw, cuw),
                ms(ruc),
                ms(cuc),
                ratio(ruc, cuc),
            );
        }
        mm.check()?;
        // Only the stocks' pages ahead stay charged.
        assert!(g.current() / PAGE_SIZE as u64 <= 64 * mm.config().nr_cpus as u64);
    }
    Ok(())
}
