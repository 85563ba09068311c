//! page_fault1 at 1 thread against clear-only, interleaved finely (one 128 MiB
//! region each, alternately) so that a noisy machine shifts both alike, in thread
//! CPU time: `target/release/examples/pf1_ratio [PAIRS]` prints the median ratio.
//! `CONFIGS=16:1024,64:2048:multi-page` compares several fault-around batches,
//! arena sizes (MiB) and clearing strategies in the same run, each interleaved with clear-only.
//! `MODE=write` (default: one byte per page, as the lab), `touch` or `fill`.
use mmkit::mmkit_core::clear::clear_page;
use mmkit::*;

const LEN: usize = 128 << 20;

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

fn main() -> Result<(), Error> {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(40);
    let configs = std::env::var("CONFIGS")
        .unwrap_or_else(|_| format!("{}:1024", Variant::Mmkit.fault_around()));
    // What each page gets: `write` (one byte, the lab's loop), `touch` (the fault
    // alone) or `fill` (all 4096 bytes, anon_w_seq's loop).
    let mode = std::env::var("MODE").unwrap_or_else(|_| "write".into());
    let mut spaces = Vec::new();
    for c in configs.split(',') {
        let mut it = c.split(':');
        let fa = it.next().expect("FA");
        let mem = it.next().unwrap_or("1024");
        let clear = it.next().unwrap_or("auto");
        let mm = Mm::builder()
            .clear(clear.parse().expect("a clearing strategy"))
            .memory(mem.parse::<usize>().expect("MiB") << 20)
            .prefault(true)
            .fault_around(fa.parse().expect("pages"))
            .build()?;
        spaces.push((c.to_string(), mm.new_space()?));
    }
    // Like mmlab's clear-only buffer: 2 MiB aligned, advised for huge pages before
    // it is first touched.
    // SAFETY: a fresh anonymous mapping; no pointer is derived unless it succeeded.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN + (2 << 20),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let buf = map.cast::<u8>().wrapping_add(map.align_offset(2 << 20));
    // SAFETY: [buf, buf + LEN) lies inside the mapping.
    unsafe {
        libc::madvise(buf.cast(), LEN, libc::MADV_HUGEPAGE);
        std::ptr::write_bytes(buf, 1, LEN);
    }
    // Regions per turn (1: strict alternation).
    let block: usize = std::env::var("BLOCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut ratios = vec![Vec::new(); spaces.len()];
    let mut tm = vec![0.0; spaces.len()];
    let mut tc = vec![0.0; spaces.len()];
    for i in 0..pairs + 2 {
        for (k, (_, sp)) in spaces.iter().enumerate() {
            let t = cpu_now();
            for _ in 0..block {
                let a = sp.mmap(LEN, MapFlags::empty())?;
                for off in (0..LEN as u64).step_by(4096) {
                    match mode.as_str() {
                        "touch" => sp.touch(a + off, true)?,
                        "fill" => sp.with_page(a + off, true, |p| p.fill(0xa5))?,
                        _ => sp.write(a + off, &[1])?,
                    }
                }
                sp.munmap(a, LEN)?;
            }
            let m = (cpu_now() - t) / block as f64;
            let t = cpu_now();
            for _ in 0..block {
                for off in (0..LEN).step_by(4096) {
                    // SAFETY: a page of our buffer.
                    unsafe { clear_page(buf.add(off)) };
                }
            }
            let c = (cpu_now() - t) / block as f64;
            if i >= 2 {
                ratios[k].push(c / m);
                tm[k] += m;
                tc[k] += c;
            }
        }
    }
    let n = (pairs * (LEN / 4096)) as f64;
    for (k, (name, _)) in spaces.iter().enumerate() {
        let r = &mut ratios[k];
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name}: mmkit {:.2} M/s, clear-only {:.2} M/s, ratio median {:.1}% (q1 {:.1}%, q3 {:.1}%)",
            n / tm[k] / 1e6,
            n / tc[k] / 1e6,
            r[pairs / 2] * 100.0,
            r[pairs / 4] * 100.0,
            r[3 * pairs / 4] * 100.0
        );
    }
    Ok(())
}
