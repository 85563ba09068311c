//! page_fault1 sanity outside the lab: map 128 MiB, write one byte per page, unmap,
//! for clearing strategies side by side, beside the kernel and clearing alone.
//! `cargo run --release -p mmkit --example pf1`
use mmkit::*;
use std::time::Instant;

const LEN: usize = 128 << 20;

fn main() -> Result<(), Error> {
    let strategies = [
        ClearStrategy::Auto,
        ClearStrategy::MultiPage,
        ClearStrategy::NonTemporal,
    ];
    let mms: Vec<Mm> = strategies
        .iter()
        .map(|&s| {
            Mm::builder()
                .memory(1 << 30)
                .clear(s)
                .prefault(true)
                .build()
        })
        .collect::<Result<_, _>>()?;
    for _ in 0..3 {
        for (mm, s) in mms.iter().zip(strategies) {
            let sp = mm.new_space()?;
            let t = Instant::now();
            let mut n = 0;
            for _ in 0..8 {
                let a = sp.mmap(LEN, MapFlags::empty())?;
                for off in (0..LEN).step_by(4096) {
                    sp.touch(a + off as u64, true)?;
                    n += 1;
                }
                sp.munmap(a, LEN)?;
            }
            println!(
                "mmkit {:14} {:.2} M faults/s",
                s.name(),
                n as f64 / t.elapsed().as_secs_f64() / 1e6
            );
        }
        let mm = &mms[0];
        let bufs: Vec<Pfn> = (0..LEN >> 22)
            .map(|_| mm.alloc_pages(Gfp::KERNEL, 10))
            .collect::<Result<_, _>>()?;
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..8 {
            for off in (0..LEN).step_by(4096) {
                let p = mm.page_address(bufs[off >> 22]);
                // SAFETY: the 32 order-10 blocks are ours; off & (4 MiB - 1) stays inside one.
                unsafe { mmkit::mmkit_core::clear::clear_page(p.add(off & ((4 << 20) - 1))) };
                n += 1;
            }
        }
        println!(
            "clear-only (128 MiB)  {:.2} M pages/s",
            n as f64 / t.elapsed().as_secs_f64() / 1e6
        );
        for b in bufs {
            mm.free_pages(b, 10)?;
        }
    }
    Ok(())
}
