//! page_fault1 sanity: map 128 MiB, write one byte per page, unmap; mmkit vs kernel
//! vs clearing alone. `cargo run --release -p mmkit --example pf1`
use mmkit::*;
use std::time::Instant;

const LEN: usize = 128 << 20;

fn main() -> Result<(), Error> {
    let mm = Mm::builder().memory(1 << 30).prefault(true).build()?;
    let sp = mm.new_space()?;
    let only_mmkit = std::env::args().nth(1).as_deref() == Some("mmkit");
    for _ in 0..if only_mmkit { 8 } else { 2 } {
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
            "mmkit     {:.2} M faults/s",
            n as f64 / t.elapsed().as_secs_f64() / 1e6
        );
        if only_mmkit {
            continue;
        }
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..8 {
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                ) as *mut u8;
                for off in (0..LEN).step_by(4096) {
                    p.add(off).write_volatile(1);
                    n += 1;
                }
                libc::munmap(p as *mut _, LEN);
            }
        }
        println!(
            "kernel    {:.2} M faults/s",
            n as f64 / t.elapsed().as_secs_f64() / 1e6
        );
        let buf = mm.alloc_pages(Gfp::KERNEL, 10)?;
        let p = mm.page_address(buf);
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..8 {
            for off in (0..LEN).step_by(4096) {
                unsafe { mmkit::mmkit_core::clear::clear_page(p.add(off % (4 << 20))) };
                n += 1;
            }
        }
        println!(
            "clear-only {:.2} M pages/s",
            n as f64 / t.elapsed().as_secs_f64() / 1e6
        );
        mm.free_pages(buf, 10)?;
    }
    Ok(())
}
