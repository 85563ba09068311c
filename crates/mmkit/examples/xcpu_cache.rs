//! Producer/consumer order-0 pattern (one thread on CPU 0 allocates and touches
//! pages and hands them over in batches of 32 to a thread on CPU 1 that frees
//! them) with and without the lock-free per-CPU caches, interleaved in one
//! process: `cargo run --release -p mmkit --example xcpu_cache [on|off]`.
use mmkit::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
fn pin(cpu: usize) {
    // SAFETY: plain libc calls on a zeroed cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
fn run(mm: &Mm) -> f64 {
    let (tx, rx) = mpsc::sync_channel::<Vec<Pfn>>(16);
    let stop = Arc::new(AtomicBool::new(false));
    let n = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        let st = stop.clone();
        s.spawn(move || {
            pin(0);
            while !st.load(Ordering::Relaxed) {
                let v: Vec<Pfn> = (0..32)
                    .map(|_| {
                        let p = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
                        unsafe { mm.page_address(p).write_volatile(1) };
                        p
                    })
                    .collect();
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let n2 = n.clone();
        s.spawn(move || {
            pin(1);
            while let Ok(v) = rx.recv() {
                for p in v {
                    mm.free_pages(p, 0).unwrap();
                }
                n2.fetch_add(32, Ordering::Relaxed);
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(800));
        let t = std::time::Instant::now();
        let a = n.load(Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let r = (n.load(Ordering::Relaxed) - a) as f64 / t.elapsed().as_secs_f64() / 1e6;
        stop.store(true, Ordering::Relaxed);
        r
    })
}
fn main() {
    if let Some(a) = std::env::args().nth(1) {
        let mm = Mm::builder()
            .memory(1 << 30)
            .pcp_cache(a == "on")
            .prefault(true)
            .build()
            .unwrap();
        for _ in 0..3 {
            println!("cache {a} {:.1} M/s", run(&mm));
        }
        return;
    }
    let on = Mm::builder()
        .memory(1 << 30)
        .pcp_cache(true)
        .prefault(true)
        .build()
        .unwrap();
    let off = Mm::builder()
        .memory(1 << 30)
        .pcp_cache(false)
        .prefault(true)
        .build()
        .unwrap();
    for _ in 0..4 {
        println!("cache on {:.1} M/s   off {:.1} M/s", run(&on), run(&off));
    }
}
