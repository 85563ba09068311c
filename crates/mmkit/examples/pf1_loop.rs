//! page_fault1 loop for profiling: `perf record target/release/examples/pf1_loop`.
use mmkit::*;
const LEN: usize = 128 << 20;
fn main() -> Result<(), Error> {
    let mm = Mm::builder().memory(512 << 20).prefault(true).build()?;
    let sp = mm.new_space()?;
    let t = std::time::Instant::now();
    let mut n = 0u64;
    for _ in 0..60 {
        let a = sp.mmap(LEN, MapFlags::empty())?;
        for off in (0..LEN).step_by(4096) {
            sp.touch(a + off as u64, true)?;
            n += 1;
        }
        sp.munmap(a, LEN)?;
    }
    println!(
        "{:.2} M faults/s",
        n as f64 / t.elapsed().as_secs_f64() / 1e6
    );
    Ok(())
}
