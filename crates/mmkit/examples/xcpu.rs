//! Which policy knob decides the cross-CPU free rate (the lab's `cross_cpu_free`
//! compares whole variants): one allocating thread on CPU 0 hands pages in
//! batches of 32 to one freeing thread on CPU 1, under `mmkit` with one knob
//! changed at a time (per-CPU `high`, merging, refill, the lock-free per-CPU
//! caches), beside `mmkit-eager`. `ONLY=NAME` runs one line, `EVENTS=1` prints
//! the vmstat events. `cargo run --release -p mmkit --example xcpu`
use mmkit::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pin(cpu: usize) {
    // SAFETY: plain libc calls on a zeroed cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn run(name: &str, b: MmBuilder) {
    if let Ok(only) = std::env::var("ONLY") {
        if only != name {
            return;
        }
    }
    let mm = b.memory(1 << 30).prefault(true).build().unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Pfn>>(64);
    let stop = Arc::new(AtomicBool::new(false));
    let freed = Arc::new(AtomicU64::new(0));
    let (m1, s1) = (mm.clone(), stop.clone());
    let prod = std::thread::spawn(move || {
        pin(0);
        while !s1.load(Ordering::Relaxed) {
            let mut v = Vec::with_capacity(32);
            for _ in 0..32 {
                let p = m1.alloc_pages(Gfp::KERNEL, 0).unwrap();
                // SAFETY: `p` is our allocated page: 4096 writable bytes in the arena.
                unsafe { m1.page_address(p).write_volatile(1) };
                v.push(p);
            }
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let (m2, f2) = (mm.clone(), freed.clone());
    let cons = std::thread::spawn(move || {
        pin(1);
        for v in rx {
            for p in v {
                m2.free_pages(p, 0).unwrap();
            }
            f2.fetch_add(32, Ordering::Relaxed);
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let (f0, t0, l0) = (
        freed.load(Ordering::Relaxed),
        Instant::now(),
        mm.zone_lock_stats(),
    );
    std::thread::sleep(Duration::from_millis(1000));
    let n = freed.load(Ordering::Relaxed) - f0;
    let dt = t0.elapsed().as_secs_f64();
    let l = mm.zone_lock_stats().since(&l0);
    stop.store(true, Ordering::Relaxed);
    prod.join().unwrap();
    cons.join().unwrap();
    let info = &mm.zone_info()[0];
    if std::env::var("EVENTS").is_ok() {
        for (k, x) in mm.vm_events().iter() {
            if x > 0 {
                print!("{k}={x} ");
            }
        }
        println!("unmerged={}", info.nr_unmerged);
        print!("{}", mm.buddyinfo());
    }
    println!(
        "{name:40} {:6.2} M/s  lock/kop {:5.1} contended {:5.2}%  pcp(high,count) {:?}",
        n as f64 / dt / 1e6,
        l.acquisitions as f64 * 1000.0 / n as f64,
        l.contended_pct(),
        info.pcp_high
    );
}

fn main() {
    for _ in 0..2 {
        run("mmkit", Mm::builder().variant(Variant::Mmkit));
        run(
            "mmkit fixed high",
            Mm::builder()
                .variant(Variant::Mmkit)
                .pcp_high(PcpHighPolicy::Fixed),
        );
        run(
            "mmkit eager merge",
            Mm::builder()
                .variant(Variant::Mmkit)
                .merge(MergePolicy::Eager),
        );
        run(
            "mmkit page-by-page",
            Mm::builder()
                .variant(Variant::Mmkit)
                .refill(RefillPolicy::PageByPage),
        );
        run(
            "mmkit no per-CPU caches",
            Mm::builder().variant(Variant::Mmkit).pcp_cache(false),
        );
        run("mmkit-eager", Mm::builder().variant(Variant::MmkitEager));
    }
}
