//! `pmbench`'s `kernel` variant: the access loop in a child process (this binary
//! again, hidden subcommand `pmbench-child`, run by `host::child`) inside a
//! memory cgroup, swapping to a loop device over tmpfs (`host::swap`).
//!
//! The protocol, one text line per message:
//! - parent -> child (stdin): `start` (the child is in its cgroup: map and run),
//!   `measure`, `stop`; end of input counts as `stop`;
//! - child -> parent (stdout): `ready` (threads running, in warmup), then
//!   `result <accesses> <reads> <writes> <failures> <elapsed_ns>` and
//!   `samples <ns> <ns> ...` (the timed accesses), `threads <accesses> ...`
//!   (each thread's accesses while measuring), then `done`.
//!
//! Everything is bounded (`host::child`): the parent waits for each line with a
//! timeout and kills the child on any failure; the child dies with the parent
//! (`PR_SET_PDEATHSIG`) and exits on its own at its deadline. The parent takes the swap rates from the
//! host's /proc/vmstat over the measured interval, and tears the device and the
//! cgroup down after the child is gone (`HostSwap`'s drop, also on error).

use super::{figures, run_loops, swap_bytes, warm_up, wss_per_thread, Memory, Outcome, Plan};
use crate::host::cgroup::Cgroup;
use crate::host::child::{child_exe, child_setup, send_line, ChildProc};
use crate::host::facts::vmstat_swap;
use crate::host::mem::{mmap_anon, PAGE};
use crate::host::nbd::{host_nbd_swap_unavailable, NbdHostSwap};
use crate::host::swap::HostSwap;
use crate::workloads::Figure;
use std::io::BufRead;
use std::time::{Duration, Instant};

/// The hidden subcommand that runs the child.
pub const CHILD_COMMAND: &str = "pmbench-child";
/// Longest wait for one line of the child outside the timed phases.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// A working set of the child: an anonymous private mapping of its own.
struct HostMem {
    p: *mut u8,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone; one thread uses it.
unsafe impl Send for HostMem {}

impl Memory for HostMem {
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn read4(&mut self, off: u64) -> bool {
        debug_assert!(off as usize + 4 <= self.len);
        // SAFETY: off is 4-aligned and below len - 4 (the loop's contract), in
        // our live read/write mapping.
        unsafe { std::ptr::read_volatile(self.p.add(off as usize).cast::<u32>()) };
        true
    }
    fn write4(&mut self, off: u64, v: u32) -> bool {
        // SAFETY: as in `read4`.
        unsafe { std::ptr::write_volatile(self.p.add(off as usize).cast::<u32>(), v) };
        true
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `child_main`; no reference remains.
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

/// The child: `threads` working sets of `wss` bytes, driven by the parent's
/// lines; exits by itself after `deadline_ms`.
pub fn child_main(threads: usize, wss: usize, deadline_ms: u64) -> anyhow::Result<()> {
    child_setup(CHILD_COMMAND, Duration::from_millis(deadline_ms));
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = move || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    if next().trim() != "start" {
        anyhow::bail!("pmbench-child: expected `start`");
    }
    let mems = (0..threads.max(1))
        .map(|_| {
            let p = mmap_anon(wss, libc::MAP_NORESERVE)?;
            // No huge pages: pmbench swaps 4 KiB pages.
            // SAFETY: advice on our fresh mapping.
            unsafe { libc::madvise(p.as_ptr().cast(), wss, libc::MADV_NOHUGEPAGE) };
            // Fill it (pages go out in address order), so that the warmup
            // starts from a full device instead of first touches.
            for off in (0..wss).step_by(PAGE) {
                // SAFETY: off < wss, inside our fresh read/write mapping.
                unsafe { p.as_ptr().add(off).write_volatile(1) };
            }
            Ok(HostMem {
                p: p.as_ptr(),
                len: wss / PAGE * PAGE,
            })
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut out = std::io::stdout().lock();
    let o = run_loops(mems, u64::from(std::process::id()), |word| {
        let _ = send_line(&mut out, "ready");
        if next().trim() != "measure" {
            return Duration::ZERO; // `stop` or end of input before measuring
        }
        // Measured until `stop` (or anything else, or end of input).
        word.measure(|_| while next().trim() == "measure" {})
    });
    send_line(
        &mut out,
        &format!(
            "result {} {} {} {} {}",
            o.accesses,
            o.reads,
            o.writes,
            o.failures,
            o.elapsed.as_nanos()
        ),
    )?;
    let mut s = String::with_capacity(o.samples.len() * 6 + 8);
    s.push_str("samples");
    for x in &o.samples {
        s.push(' ');
        s.push_str(&x.to_string());
    }
    send_line(&mut out, &s)?;
    let per: Vec<String> = o.per_thread.iter().map(u64::to_string).collect();
    send_line(&mut out, &format!("threads {}", per.join(" ")))?;
    send_line(&mut out, "done")?;
    Ok(())
}

/// Parses `result <accesses> <reads> <writes> <failures> <elapsed_ns>`.
pub fn parse_result(line: &str) -> Option<Outcome> {
    let v: Vec<u64> = line
        .strip_prefix("result ")?
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let [accesses, reads, writes, failures, ns] = v[..] else {
        return None;
    };
    Some(Outcome {
        accesses,
        reads,
        writes,
        failures,
        elapsed: Duration::from_nanos(ns),
        samples: Vec::new(),
        per_thread: Vec::new(),
    })
}

/// Parses `threads <accesses> ...` (each thread's accesses while measuring).
pub fn parse_threads(line: &str) -> Option<Vec<u64>> {
    let rest = line.strip_prefix("threads")?;
    rest.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// Parses `samples <ns> ...`.
pub fn parse_samples(line: &str) -> Option<Vec<u32>> {
    let rest = line.strip_prefix("samples")?;
    rest.split_whitespace().map(|x| x.parse().ok()).collect()
}

/// One point of the kernel variant: `threads` working sets together
/// `WSS_FACTOR` x `arena`, the cgroup limited to `arena`. Err says why it
/// was not measured (then nothing of it is left on the host).
pub fn run_point(threads: usize, arena: usize, plan: &Plan) -> Result<Vec<Figure>, String> {
    if let Some(why) = HostSwap::unavailable() {
        return Err(why);
    }
    let exe = child_exe()?;
    let wss = wss_per_thread(arena, threads);
    let mut hs = HostSwap::create(swap_bytes(arena) as u64, arena as u64)?;
    let cg = hs.cgroup.as_ref().ok_or("no cgroup")?;
    let r = measure(&exe, cg, threads, wss, plan);
    // The child is gone (measure's guard reaped it): tear down now, so that an
    // error here is reported with the point.
    let t = hs.teardown();
    let f = r?;
    t.map_err(|e| format!("teardown: {e}"))?;
    Ok(f)
}

/// One point of the `kernel-nbd` variant: as `run_point`, swapping to nbdkit
/// through a loop device over an nbdfuse file (`NbdHostSwap`).
pub fn run_point_nbd(threads: usize, arena: usize, plan: &Plan) -> Result<Vec<Figure>, String> {
    if let Some(why) = host_nbd_swap_unavailable() {
        return Err(why);
    }
    let exe = child_exe()?;
    let wss = wss_per_thread(arena, threads);
    let mut hs = NbdHostSwap::create(swap_bytes(arena) as u64, arena as u64)?;
    let cg = hs.cgroup.as_ref().ok_or("no cgroup")?;
    let r = measure(&exe, cg, threads, wss, plan);
    let t = hs.teardown();
    let f = r?;
    t.map_err(|e| format!("teardown: {e}"))?;
    Ok(f)
}

fn measure(
    exe: &std::path::Path,
    cg: &Cgroup,
    threads: usize,
    wss: usize,
    plan: &Plan,
) -> Result<Vec<Figure>, String> {
    // Filling the working sets swaps them out once: at least 64 MiB/s.
    let fill = Duration::from_secs((threads * wss) as u64 / (64 << 20));
    let deadline = fill + plan.max_warmup + plan.duration + 3 * LINE_TIMEOUT;
    let args = [
        CHILD_COMMAND.to_string(),
        threads.to_string(),
        wss.to_string(),
        deadline.as_millis().to_string(),
    ];
    let mut c = ChildProc::spawn(exe, &args, "pmbench kernel")?;
    cg.add(c.id())?;
    c.tell("start")?;
    c.expect("ready", LINE_TIMEOUT + fill)?;
    let steady = warm_up(plan, vmstat_swap, || c.has_output() || c.alive());
    if !c.alive() {
        return Err("the child died during the warmup (killed by the OOM killer?)".into());
    }
    if !steady {
        eprintln!(
            "note: pmbench kernel at {threads} threads: swapping not steady after {} ms; \
             measured anyway",
            plan.max_warmup.as_millis()
        );
    }
    let v0 = vmstat_swap();
    let t0 = Instant::now();
    c.tell("measure")?;
    std::thread::sleep(plan.duration);
    c.tell("stop")?;
    let secs = t0.elapsed().as_secs_f64();
    let v1 = vmstat_swap();
    let res = c.expect("result", LINE_TIMEOUT)?;
    let mut o = parse_result(&res).ok_or_else(|| format!("bad result line {res:?}"))?;
    let s = c.expect("samples", LINE_TIMEOUT)?;
    o.samples = parse_samples(&s).ok_or("bad samples line")?;
    let t = c.expect("threads", LINE_TIMEOUT)?;
    o.per_thread = parse_threads(&t).ok_or("bad threads line")?;
    c.expect("done", LINE_TIMEOUT)?;
    c.close_stdin();
    c.finish(LINE_TIMEOUT);
    if o.accesses == 0 {
        return Err("the child made no access while measuring".into());
    }
    Ok(figures(&o, secs, v1.0 - v0.0, v1.1 - v0.1, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lines_parse() {
        let o = parse_result("result 10 8 2 0 1000").unwrap();
        assert_eq!((o.accesses, o.reads, o.writes), (10, 8, 2));
        assert_eq!(o.elapsed, Duration::from_nanos(1000));
        assert!(parse_result("result 1 2").is_none());
        assert!(parse_result("ready").is_none());
        assert_eq!(parse_samples("samples 5 6 7"), Some(vec![5, 6, 7]));
        assert_eq!(parse_samples("samples"), Some(vec![]));
        assert!(parse_samples("samples x").is_none());
        assert_eq!(parse_threads("threads 3 9"), Some(vec![3, 9]));
        assert!(parse_threads("threads 3 x").is_none());
    }

    /// Nothing named after this process is on the host.
    fn nothing_of_ours_left() {
        let me = format!("{}{}-", crate::host::PREFIX, std::process::id());
        // No loop device (so no swap device) over a file of ours.
        let loops = crate::host::swap::our_loops();
        assert!(loops.iter().all(|(_, f)| !f.contains(&me)), "{loops:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&me), "a tmpfs of ours is still mounted");
        let run = std::fs::read_dir(crate::host::swap::MOUNT_BASE).unwrap();
        assert!(run
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(&me)));
    }

    /// A small kernel point: it measures (or says why not) and leaves nothing.
    #[test]
    fn kernel_point_measures_and_tears_down() {
        if !crate::host::swap::opted_in() {
            eprintln!("skipped: set MMLAB_HOST_SWAP=1 to set up swap on this host");
            return;
        }
        let plan = Plan {
            min_warmup: Duration::from_millis(50),
            max_warmup: Duration::from_millis(500),
            interval: Duration::from_millis(25),
            duration: Duration::from_millis(100),
        };
        let t0 = Instant::now();
        match run_point(1, 8 << 20, &plan) {
            Ok(f) => {
                let get = |n: &str| f.iter().find(|x| x.metric == n).unwrap().value;
                assert!(get("accesses_per_sec") > 0.0, "{f:?}");
                assert!(get("access_latency_p99_ns") >= get("access_latency_p50_ns"));
            }
            Err(why) => eprintln!("skipped: pmbench kernel point: {why}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
        nothing_of_ours_left();
    }
}
