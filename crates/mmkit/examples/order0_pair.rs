//! The order-0 alloc+free pair of `mmlab run alloc_free`, alone, to count its
//! instructions: `valgrind --tool=callgrind target/release/examples/order0_pair N`
//! for two values of N, then (Ir(N2) - Ir(N1)) / (N2 - N1) is the cost of one
//! pair. Each pair allocates a page with `Gfp::KERNEL`, writes one byte to it
//! and frees it (same as the lab's hot loop). `THREADS=T` runs T such loops.
//! Valgrind does not register rseq, so under it the per-CPU caches are off and
//! the pair takes the per-CPU lists; the line printed says which path ran.
//! `FAKE_RSEQ=1` (one thread, under valgrind only) makes the caches' path
//! countable too: it marks glibc's rseq area as registered on CPU 0, so the
//! real restartable sequences run. Valgrind runs the thread without the
//! kernel's rseq, so nothing ever restarts them; where rseq is really
//! registered it is refused.
use mmkit::*;

extern "C" {
    static __rseq_offset: isize;
    static __rseq_size: u32;
}

/// Sets glibc's rseq size as if registration had succeeded (see the header).
fn fake_rseq_size() {
    // SAFETY: glibc's exported constant sits in RELRO, so its page is made
    // writable first; nothing reads it concurrently (one thread so far).
    unsafe {
        let sz = std::ptr::addr_of!(__rseq_size) as *mut u32;
        if sz.read_volatile() != 0 {
            eprintln!("FAKE_RSEQ: rseq really registered here; refused");
            std::process::exit(2);
        }
        let page = (sz as usize) & !4095;
        assert_eq!(
            libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_WRITE),
            0
        );
        sz.write_volatile(32);
    }
}

/// Puts this thread on CPU 0 in its rseq area. After the `Mm` has started its
/// threads: glibc registers a new thread's rseq when its parent's `cpu_id` is
/// valid, and stops it when that fails.
fn fake_rseq_cpu() {
    // SAFETY: the area at tp + __rseq_offset is this thread's `struct rseq` in
    // its TCB; `cpu_id_start` and `cpu_id` are at 0 and 4.
    unsafe {
        let tp: usize;
        std::arch::asm!("mov {}, fs:0", out(reg) tp);
        let area = (tp as isize + __rseq_offset) as *mut u32;
        area.write_volatile(0);
        area.add(1).write_volatile(0);
    }
}

fn pairs(mm: &Mm, n: u64) -> Result<(), Error> {
    for _ in 0..n {
        let pfn = mm.alloc_pages(Gfp::KERNEL, 0)?;
        // SAFETY: the page was just allocated, is ours until freed below.
        unsafe { mm.page_address(pfn).write_volatile(1) };
        mm.free_pages(pfn, 0)?;
    }
    Ok(())
}

fn main() -> Result<(), Error> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    if std::env::var_os("FAKE_RSEQ").is_some() {
        assert_eq!(threads, 1, "FAKE_RSEQ: one thread only");
        fake_rseq_size();
    }
    let mm = Mm::builder().memory(64 << 20).prefault(true).build()?;
    if std::env::var_os("FAKE_RSEQ").is_some() {
        fake_rseq_cpu();
    }
    let t = std::time::Instant::now();
    if threads == 1 {
        // On this thread: its rseq area is the one `FAKE_RSEQ` marks.
        pairs(&mm, n)?;
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(|| pairs(&mm, n))).collect();
            hs.into_iter().try_for_each(|h| h.join().unwrap())
        })?;
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "pcp caches: {}; {} pairs x {} threads: {:.2} ns/pair/thread",
        mm.has_pcp_caches(),
        n,
        threads,
        dt * 1e9 / n as f64
    );
    Ok(())
}
