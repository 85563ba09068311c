//! mmkit in use, as a smoke test: build an `Mm` in every variant, allocate and free
//! blocks of orders 0-3 and 10 with invariant checks, print a single-thread
//! alloc/free rate and the buddyinfo view. `cargo run --release -p mmkit --example smoke`
use mmkit::{Gfp, Mm, Variant};
use std::time::Instant;

fn main() -> Result<(), mmkit::Error> {
    for v in Variant::ALL {
        let mm = Mm::builder()
            .memory(256 << 20)
            .variant(v)
            .prefault(true)
            .build()?;
        let free0 = mm.nr_free_pages();
        let mut held = Vec::new();
        for i in 0..10000u32 {
            held.push((mm.alloc_pages(Gfp::MOVABLE, i % 4)?, i % 4));
        }
        mm.check()?;
        for (p, o) in held.drain(..) {
            mm.free_pages(p, o)?;
        }
        mm.check()?;
        let big = mm.alloc_pages(Gfp::KERNEL, 10)?;
        mm.free_pages(big, 10)?;
        mm.drain_all_pages();
        mm.check()?;
        assert_eq!(mm.nr_free_pages(), free0);
        let n = 20_000_000u64;
        let t = Instant::now();
        for _ in 0..n {
            let p = mm.alloc_pages(Gfp::KERNEL, 0)?;
            // SAFETY: `p` is our allocated page: 4096 writable bytes in the arena.
            unsafe { mm.page_address(p).write_volatile(1) };
            mm.free_pages(p, 0)?;
        }
        let dt = t.elapsed();
        println!(
            "{:12} alloc_free 1 thread: {:.1} ns/pair",
            v.name(),
            dt.as_nanos() as f64 / n as f64
        );
        if v == Variant::Mmkit {
            print!("{}", mm.buddyinfo());
        }
    }
    Ok(())
}
