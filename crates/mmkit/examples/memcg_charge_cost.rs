//! The charge cost of memory cgroups: page_fault1 (mmap 128 MiB, touch every
//! page, munmap) with each thread's space in the root (never charged) and in
//! a child group (charged through the per-CPU stock), at 1 and 2 threads.
//! Rounds alternate root / child so that a noisy machine hits both alike;
//! the median of each is reported, faults and munmap separately.
//!
//! `cargo run --release --example memcg_charge_cost [ROUNDS] [THREADS...]`
//! (ROUNDS of 128 MiB per thread, default 20; threads default `1 2`).
//! `MODE=root|child` runs one side only (for `valgrind --tool=callgrind`).
use mmkit::*;
use std::time::{Duration, Instant};

const LEN: usize = 128 << 20;

/// One page_fault1 round on `threads` threads: (fault time, munmap time),
/// the slowest thread's.
fn round(spaces: &[Space]) -> (Duration, Duration) {
    let times: Vec<(Duration, Duration)> = std::thread::scope(|sc| {
        let hs: Vec<_> = spaces
            .iter()
            .map(|sp| {
                sc.spawn(move || {
                    let a = sp.mmap(LEN, MapFlags::empty()).unwrap();
                    let t = Instant::now();
                    for off in (0..LEN).step_by(4096) {
                        sp.touch(a + off as u64, true).unwrap();
                    }
                    let f = t.elapsed();
                    let t = Instant::now();
                    sp.munmap(a, LEN).unwrap();
                    (f, t.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (
        times.iter().map(|t| t.0).max().unwrap(),
        times.iter().map(|t| t.1).max().unwrap(),
    )
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
            let (rf, cf) = (median(rf), median(cf));
            let (ru, cu) = (median(ru), median(cu));
            println!(
                "threads {t}: faults root {:.2} M/s, child {:.2} M/s (child/root {:.3}); munmap root {:.1} ms, child {:.1} ms (child/root {:.3})",
                faults / rf.as_secs_f64() / 1e6,
                faults / cf.as_secs_f64() / 1e6,
                rf.as_secs_f64() / cf.as_secs_f64(),
                ru.as_secs_f64() * 1e3,
                cu.as_secs_f64() * 1e3,
                ru.as_secs_f64() / cu.as_secs_f64(),
            );
        }
        mm.check()?;
        // Only the stocks' pages ahead stay charged.
        assert!(g.current() / PAGE_SIZE as u64 <= 64 * mm.config().nr_cpus as u64);
    }
    Ok(())
}
