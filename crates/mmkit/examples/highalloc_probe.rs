//! Why an order-9 request is slow (the lab's `highalloc` gives the rates and the
//! latency percentiles, not the causes): highalloc taken apart, outside the lab:
//! the lab's fill, scatter, background page_fault1 threads and paced order-9
//! requests, with each request's latency put beside what it did (merge on demand,
//! slow path, direct compaction), so that a latency tail can be put on its cause.
//! The vmstat events are process-wide: a request's deltas also count what the
//! background threads and kcompactd did while it ran (merges above all), so read
//! the classes, not the exact counts.
//!
//! `cargo run --release -p mmkit --example highalloc_probe -- [THREADS] [ROUNDS] [VARIANT...]`
use mmkit::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PAGE: u64 = PAGE_SIZE as u64;
/// A class of requests: its name, and whether a request's event deltas put it there.
type Kind = (&'static str, fn(&[u64]) -> bool);
const REGION: usize = 32 << 20;
const MEMORY: usize = 1 << 30;
const DURATION: Duration = Duration::from_millis(500);

fn bg(s: Space, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(a) = s.mmap(REGION, MapFlags::empty()) else {
            continue;
        };
        for off in (0..REGION as u64).step_by(PAGE_SIZE) {
            if s.touch(a + off, true).is_err() {
                break;
            }
        }
        let _ = s.munmap(a, REGION);
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let variants: Vec<Variant> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|n| Variant::from_name(n).expect("a variant name: mmkit, mmkit-eager, ..."))
            .collect()
    } else {
        vec![Variant::Mmkit, Variant::MmkitEager]
    };
    let events = [
        VmEvent::MergeOnDemand,
        VmEvent::AllocSlowpath,
        VmEvent::CompactStall,
        VmEvent::DrainAll,
        VmEvent::MergeDone,
        VmEvent::WmarkLowFail,
    ];
    for _ in 0..rounds {
        for &v in &variants {
            let mm = Mm::builder()
                .memory(MEMORY)
                .variant(v)
                .clear(ClearStrategy::Auto)
                .prefault(true)
                .build()?;
            // Fill 90% and free every other page, as the lab does.
            let filler = mm.new_space()?;
            mm.drain_all_pages();
            let pages = mm.nr_free_pages() * 90 / 100 * 512 / 513;
            let a = filler.mmap((pages * PAGE) as usize, MapFlags::empty())?;
            for i in 0..pages {
                filler.touch(a + i * PAGE, true)?;
            }
            for i in (0..pages).step_by(2) {
                filler.munmap(a + i * PAGE, PAGE_SIZE)?;
            }
            mm.drain_all_pages();
            let spare = mm
                .nr_free_pages()
                .saturating_sub((threads * REGION / PAGE_SIZE) as u64);
            let nr_req = (spare * 90 / 100 / 512).max(4) as usize;
            let interval = DURATION / nr_req as u32;
            let stop = AtomicBool::new(false);
            let mut rows: Vec<(f64, bool, Vec<u64>)> = Vec::new();
            let mut held = Vec::new();
            std::thread::scope(|sc| -> Result<(), Error> {
                for _ in 0..threads {
                    let s = mm.new_space()?;
                    let stop = &stop;
                    sc.spawn(move || bg(s, stop));
                }
                std::thread::sleep(DURATION / 5);
                let t0 = Instant::now();
                for k in 0..nr_req {
                    let due = t0 + interval * k as u32;
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    let e0 = mm.vm_events();
                    let t = Instant::now();
                    let r = mm.alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9);
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    let e1 = mm.vm_events();
                    let d: Vec<u64> = events.iter().map(|&e| e1.get(e) - e0.get(e)).collect();
                    rows.push((us, r.is_ok(), d));
                    if let Ok(p) = r {
                        held.push(p);
                    }
                }
                stop.store(true, Ordering::Relaxed);
                Ok(())
            })?;
            for p in held.drain(..) {
                mm.free_pages(p, 9)?;
            }
            let ok = rows.iter().filter(|r| r.1).count();
            let mut lat: Vec<f64> = rows.iter().map(|r| r.0).collect();
            lat.sort_by(|a, b| a.total_cmp(b));
            let pct = |p: f64| {
                lat[((p / 100.0 * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1]
            };
            println!(
                "{:14} {} requests, {} ok; latency us p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
                v.name(),
                rows.len(),
                ok,
                pct(50.0),
                pct(90.0),
                pct(99.0),
                lat[lat.len() - 1]
            );
            // Count, median and longest latency by what the request did.
            let kinds: [Kind; 4] = [
                ("fast path", |d| d[1] == 0 && d[0] == 0),
                ("merge on demand only", |d| d[1] == 0 && d[0] > 0),
                ("slow path, no compaction", |d| d[1] > 0 && d[2] == 0),
                ("direct compaction", |d| d[2] > 0),
            ];
            for (name, f) in kinds {
                let sel: Vec<&(f64, bool, Vec<u64>)> = rows.iter().filter(|r| f(&r.2)).collect();
                if sel.is_empty() {
                    continue;
                }
                let mut l: Vec<f64> = sel.iter().map(|r| r.0).collect();
                l.sort_by(|a, b| a.total_cmp(b));
                let avg =
                    |i: usize| sel.iter().map(|r| r.2[i]).sum::<u64>() as f64 / sel.len() as f64;
                println!(
                    "  {:24} {:4} requests, median {:8.1} us, max {:8.1} us; per request: \
                     {:.2} drains of all per-CPU lists, {:.0} merges, {:.2} low-watermark refusals",
                    name,
                    sel.len(),
                    l[l.len() / 2],
                    l[l.len() - 1],
                    avg(3),
                    avg(4),
                    avg(5),
                );
            }
            drop(filler);
            mm.wait_compaction_idle();
        }
    }
    Ok(())
}
