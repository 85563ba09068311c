//! alloc_free_batch with many threads, printing the allocator's events.
//! `cargo run --release -p mmkit --example batch -- 8`
use mmkit::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    for v in [Variant::Mmkit, Variant::MmkitEager] {
        let mm = Mm::builder()
            .memory(1 << 30)
            .variant(v)
            .prefault(true)
            .build()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (mm, stop, ops) = (mm.clone(), stop.clone(), ops.clone());
                std::thread::spawn(move || {
                    let mut held = Vec::with_capacity(512);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..512 {
                            let p = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
                            unsafe { mm.page_address(p).write_volatile(1) };
                            held.push(p);
                        }
                        for p in held.drain(..) {
                            mm.free_pages(p, 0).unwrap();
                        }
                        ops.fetch_add(512, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        mm.reset_stats();
        let (o0, t0) = (ops.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(Duration::from_millis(1000));
        let n = ops.load(Ordering::Relaxed) - o0;
        let dt = t0.elapsed().as_secs_f64();
        let ev = mm.vm_events();
        let l = mm.zone_lock_stats();
        stop.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        println!(
            "{}: {:.2} M/s lock/kop {:.1} contended {:.2}% pcp {:?}",
            v.name(),
            n as f64 / dt / 1e6,
            l.acquisitions as f64 * 1000.0 / n as f64,
            l.contended_pct(),
            mm.zone_info()[0].pcp_high
        );
        for (k, x) in ev.iter() {
            if x > 0 {
                print!("{k}={x} ");
            }
        }
        println!();
    }
}
