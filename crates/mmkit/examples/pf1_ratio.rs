//! page_fault1 at 1 thread against clear-only, interleaved finely (one 128 MiB
//! region each, alternately) so that a noisy machine shifts both alike, in thread CPU time:
//! `target/release/examples/pf1_ratio [PAIRS]` prints the median ratio.
use mmkit::mmkit_core::clear::clear_page;
use mmkit::*;

/// This thread's CPU time in seconds (so that time spent descheduled on a busy
/// machine does not count).
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
const LEN: usize = 128 << 20;
fn main() -> Result<(), Error> {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(40);
    let fa: usize = std::env::var("FA")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(Variant::Mmkit.fault_around());
    let mm = Mm::builder()
        .memory(1 << 30)
        .prefault(true)
        .fault_around(fa)
        .build()?;
    let sp = mm.new_space()?;
    let layout = std::alloc::Layout::from_size_align(LEN, 2 << 20).unwrap();
    // SAFETY: a non-zero size.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buf.is_null());
    // SAFETY: our allocation; like mmlab's clear-only buffer, huge-page backed.
    unsafe {
        libc::madvise(buf.cast(), LEN, libc::MADV_HUGEPAGE);
        std::ptr::write_bytes(buf, 1, LEN);
    }
    let mut ratios = Vec::new();
    let (mut tm, mut tc) = (0.0, 0.0);
    for i in 0..pairs + 2 {
        let t = cpu_now();
        let a = sp.mmap(LEN, MapFlags::empty())?;
        for off in (0..LEN).step_by(4096) {
            sp.touch(a + off as u64, true)?;
        }
        sp.munmap(a, LEN)?;
        let m = cpu_now() - t;
        let t = cpu_now();
        for off in (0..LEN).step_by(4096) {
            // SAFETY: a page of our buffer.
            unsafe { clear_page(buf.add(off)) };
        }
        let c = cpu_now() - t;
        if i >= 2 {
            ratios.push(c / m);
            tm += m;
            tc += c;
        }
    }
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = (pairs * (LEN / 4096)) as f64;
    println!(
        "mmkit {:.2} M/s, clear-only {:.2} M/s, ratio median {:.1}% (q1 {:.1}%, q3 {:.1}%)",
        n / tm / 1e6,
        n / tc / 1e6,
        ratios[pairs / 2] * 100.0,
        ratios[pairs / 4] * 100.0,
        ratios[3 * pairs / 4] * 100.0
    );
    Ok(())
}
