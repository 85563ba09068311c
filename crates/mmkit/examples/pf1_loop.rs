//! A page_fault1 loop to profile the fault path with perf (one thread, no lab
//! around it): `perf record -D 1000 target/release/examples/pf1_loop [ROUNDS]`
//! (`-D` skips the kernel prefaulting the arena; ROUNDS of 128 MiB, default 60;
//! `FA=N` sets the fault-around batch, default 16).
use mmkit::*;
const LEN: usize = 128 << 20;
fn main() -> Result<(), Error> {
    let fa: usize = std::env::var("FA")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let mm = Mm::builder()
        .memory(512 << 20)
        .prefault(true)
        .fault_around(fa)
        .build()?;
    let sp = mm.new_space()?;
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    let t = std::time::Instant::now();
    let mut n = 0u64;
    for _ in 0..rounds {
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
