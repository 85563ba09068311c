//! The page-sized alloc+free pair of `mmlab run alloc_free`'s allocator peers,
//! alone, to count its instructions beside mmkit's (`mmkit`'s
//! `examples/order0_pair.rs`): `valgrind --tool=callgrind
//! target/release/examples/peer_pair jemalloc N` for two values of N, then
//! (Ir(N2) - Ir(N1)) / (N2 - N1) is one pair. A pair is what the lab's peers
//! run: `mallocx(4096, MALLOCX_ALIGN(4096))`, a one-byte write, `sdallocx`
//! (jemalloc); `mi_malloc_aligned(4096, 4096)`, a one-byte write, `mi_free`
//! (mimalloc). `jemalloc-unaligned` and `mimalloc-unaligned` drop the
//! alignment (`mallocx(4096, 0)`, `mi_malloc(4096)`), for comparison.
use std::time::Instant;

const PAGE: usize = 4096;

fn jemalloc(n: u64, flags: libc::c_int) {
    for _ in 0..n {
        // SAFETY: a page-sized, page-aligned block, written once and freed with
        // the same size and flags.
        unsafe {
            let p = tikv_jemalloc_sys::mallocx(PAGE, flags).cast::<u8>();
            assert!(!p.is_null());
            p.write_volatile(1);
            tikv_jemalloc_sys::sdallocx(p.cast(), PAGE, flags);
        }
    }
}

fn mimalloc(n: u64, align: usize) {
    for _ in 0..n {
        // SAFETY: as above, mimalloc's (aligned) allocation and its free.
        unsafe {
            let p = if align > 1 {
                libmimalloc_sys::mi_malloc_aligned(PAGE, align)
            } else {
                libmimalloc_sys::mi_malloc(PAGE)
            }
            .cast::<u8>();
            assert!(!p.is_null());
            p.write_volatile(1);
            libmimalloc_sys::mi_free(p.cast());
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "jemalloc".into());
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let t = Instant::now();
    match which.as_str() {
        "jemalloc" => jemalloc(n, tikv_jemalloc_sys::MALLOCX_ALIGN(PAGE)),
        "mimalloc" => mimalloc(n, PAGE),
        // The same 4 KiB without the alignment, for comparison.
        "jemalloc-unaligned" => jemalloc(n, 0),
        "mimalloc-unaligned" => mimalloc(n, 1),
        other => {
            eprintln!("unknown allocator {other:?}: jemalloc, mimalloc or *-unaligned");
            std::process::exit(2);
        }
    }
    println!(
        "{which}: {n} pairs: {:.2} ns/pair",
        t.elapsed().as_secs_f64() * 1e9 / n as f64
    );
}
