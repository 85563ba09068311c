//! Where a huge-page fault's time goes beyond the clearing itself: the lab's
//! `clear_huge` gives mmkit's GB/s beside a raw streaming loop; this takes the
//! difference apart, interleaving in each round (per 2 MiB page, over a 256 MiB
//! pass, as `clear_huge` does):
//!
//! - `raw-nt`: `clear_pages_nt` over a prefaulted buffer;
//! - `order-nt`: the fault's clearing order (`ChunkedClear::clear_huge_page`,
//!   streaming stores, the window around the faulting sub-page last with
//!   `rep stosb`) on the same buffer, without and with the hot-line prefetch
//!   (`order-nt-hot`) a sparse first touch asks for, and with that prefetch and
//!   a window of the faulting sub-page alone (`order-sparse`, what a sparse
//!   first touch gets);
//! - `fault-nt`, `fault-auto`: mmkit huge faults (`touch` of each 2 MiB of a
//!   HUGE mapping), explicit streaming stores and `Auto` (the calibrated plan).
//!
//! - `stosb-whole`: one `rep stosb` over the whole pass (what `raw-memset`
//!   and `raw-stosb` of `clear_huge`'s 1GiB case do), per 2 MiB for comparison.
//!
//! `PASS_MB=1024` makes the pass 1 GiB (the 1GiB case); default 256.
//!
//! `cargo run --release -p mmkit --example huge_fault_cost -- [ROUNDS]`; with
//! `FAULTS_ONLY=N` it only runs N passes of `fault-nt` (for
//! `valgrind --tool=callgrind`, to count instructions per fault).
use mmkit::mmkit_core::clear::{clear_pages_nt, clear_pages_with, cpu_clear_caps, ChunkedClear};
use mmkit::*;
use std::time::Instant;

/// Bytes per pass (`PASS_MB`, default 256 MiB).
fn pass_len() -> usize {
    std::env::var("PASS_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(256)
        << 20
}
const HPAGE: usize = 2 << 20;

fn buffer(len: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + HPAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p.cast::<u8>();
    let p = p.wrapping_add(p.align_offset(HPAGE));
    // SAFETY: inside the mapping; a hint.
    unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
    // SAFETY: inside the mapping, ours.
    unsafe { std::ptr::write_bytes(p, 1, len) };
    p
}

/// Seconds of one pass of `f` over each 2 MiB of the pass.
fn pass_raw(buf: *mut u8, f: &dyn Fn(*mut u8)) -> f64 {
    let t0 = Instant::now();
    for off in (0..pass_len()).step_by(HPAGE) {
        f(buf.wrapping_add(off));
    }
    t0.elapsed().as_secs_f64()
}

fn pass_fault(space: &Space) -> f64 {
    let a = space.mmap(pass_len(), MapFlags::HUGE).unwrap();
    let t0 = Instant::now();
    for off in (0..pass_len() as u64).step_by(HPAGE) {
        space.touch(a + off, true).unwrap();
    }
    let s = t0.elapsed().as_secs_f64();
    space.munmap(a, pass_len()).unwrap();
    s
}

fn mm(clear: ClearStrategy) -> Mm {
    Mm::builder()
        .memory(pass_len() + (64 << 20))
        .clear(clear)
        .prefault(true)
        .build()
        .unwrap()
}

fn main() {
    if let Some(n) = std::env::var("FAULTS_ONLY")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let m = mm(ClearStrategy::NonTemporal);
        let space = m.new_space().unwrap();
        for _ in 0..n {
            pass_fault(&space);
        }
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let nt = cpu_clear_caps().nt_kind;
    let buf = buffer(pass_len());
    let (m_nt, m_auto) = (mm(ClearStrategy::NonTemporal), mm(ClearStrategy::Auto));
    eprintln!("plan: {:?}", m_auto);
    let (s_nt, s_auto) = (m_nt.new_space().unwrap(), m_auto.new_space().unwrap());
    let order = ChunkedClear::new(ClearStrategy::NonTemporal);
    let names = [
        "raw-nt",
        "order-nt",
        "order-nt-hot",
        "order-sparse",
        "fault-nt",
        "fault-auto",
        "stosb-whole",
    ];
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let sparse = order.with_hot(0, 1).with_window_pages(1);
    let kinds: [&dyn Fn(*mut u8); 4] = [
        // SAFETY: `pass_raw` gives each call the 2 MiB at p, inside the
        // buffer, which is ours and nothing refers into (all four).
        &|p| unsafe { clear_pages_nt(p, HPAGE, nt) },
        // SAFETY: as above.
        &|p| unsafe {
            order.clear_huge_page(p, 512, 0, &mut || {});
        },
        // SAFETY: as above.
        &|p| unsafe {
            order.with_hot(0, 1).clear_huge_page(p, 512, 0, &mut || {});
        },
        // SAFETY: as above.
        &|p| unsafe {
            sparse.clear_huge_page(p, 512, 0, &mut || {});
        },
    ];
    for _ in 0..rounds {
        for (i, k) in kinds.iter().enumerate() {
            t[i].push(pass_raw(buf, *k));
        }
        t[4].push(pass_fault(&s_nt));
        t[5].push(pass_fault(&s_auto));
        let t0 = Instant::now();
        // SAFETY: the whole buffer, ours, nothing refers into it.
        unsafe { clear_pages_with(buf, pass_len(), ClearStrategy::MultiPage) };
        t[6].push(t0.elapsed().as_secs_f64());
    }
    let per = (pass_len() / HPAGE) as f64;
    for (name, v) in names.iter().zip(&mut t) {
        v.sort_by(f64::total_cmp);
        let us = |s: f64| s * 1e6 / per;
        println!(
            "{name:>13}: min {:7.2} us  median {:7.2} us per 2 MiB ({:.1} GB/s at the min)",
            us(v[0]),
            us(v[v.len() / 2]),
            pass_len() as f64 / v[0] / 1e9
        );
    }
}
