//! `pmbench`'s `kernel` variant: the access loop in a child process (this binary
//! again, hidden subcommand `pmbench-child`) inside a memory cgroup, swapping to a
//! loop device over tmpfs (`swap_host`).
//!
//! The protocol, one text line per message:
//! - parent -> child (stdin): `start` (the child is in its cgroup: map and run),
//!   `measure`, `stop`; end of input counts as `stop`;
//! - child -> parent (stdout): `ready` (threads running, in warmup), then
//!   `result <accesses> <reads> <writes> <failures> <elapsed_ns>` and
//!   `samples <ns> <ns> ...` (the timed accesses), then `done`.
//!
//! Everything is bounded: the parent waits for each line with a timeout and kills
//! the child on any failure; the child dies with the parent (`PR_SET_PDEATHSIG`)
//! and exits on its own at its deadline. The parent takes the swap rates from the
//! host's /proc/vmstat over the measured interval, and tears the device and the
//! cgroup down after the child is gone (`HostSwap`'s drop, also on error).

use super::host::{mmap_anon, PAGE};
use super::pmbench::{
    drive, figures, swap_bytes, warm_up, wss_per_thread, Memory, Plan, MEASURE, STOP,
};
use super::swap_host::{send_line, vmstat_swap, HostSwap};
use super::Figure;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::Ordering;
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
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; no memory involved.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(deadline_ms));
        eprintln!("pmbench-child: deadline of {deadline_ms} ms reached, exiting");
        std::process::exit(3);
    });
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
    let o = drive(mems, u64::from(std::process::id()), |phase| {
        let _ = send_line(&mut out, "ready");
        let mut t0 = None;
        loop {
            match next().trim() {
                "measure" => {
                    t0 = Some(Instant::now());
                    phase.store(MEASURE, Ordering::Relaxed);
                }
                _ => {
                    phase.store(STOP, Ordering::Relaxed);
                    return t0.map_or(Duration::ZERO, |t| t.elapsed());
                }
            }
        }
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
    send_line(&mut out, "done")?;
    Ok(())
}

/// The mmlab binary to run the child from: this executable, or (under `cargo
/// test`, whose executable is the test harness) the `mmlab` binary beside it.
fn child_exe() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    if !cfg!(test) {
        return Ok(me);
    }
    let bin = me
        .parent()
        .and_then(|deps| deps.parent())
        .map(|d| d.join("mmlab"))
        .filter(|p| p.exists());
    bin.ok_or_else(|| "the mmlab binary is not built (cargo build -p mmlab)".into())
}

/// A child that is killed and reaped when dropped. Every wait is bounded: a
/// child with a thread stuck in the kernel (D state) cannot be reaped, and is
/// left behind with a warning rather than hanging the lab.
struct ChildGuard {
    child: Child,
    reaped: bool,
}

/// How long a killed child may take to be reaped.
const REAP_LIMIT: Duration = Duration::from_secs(5);

impl ChildGuard {
    /// Polls for the child's exit for up to `limit`; true once reaped.
    fn reap(&mut self, limit: Duration) -> bool {
        let t0 = Instant::now();
        while !self.reaped {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => self.reaped = true,
                Ok(None) if t0.elapsed() >= limit => break,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        self.reaped
    }

    /// Waits up to `limit` for the child to exit, then kills it.
    fn finish(&mut self, limit: Duration) {
        if !self.reap(limit) {
            let _ = self.child.kill();
            if !self.reap(REAP_LIMIT) {
                eprintln!(
                    "warning: pmbench kernel: child {} does not exit (stuck in the kernel); left",
                    self.child.id()
                );
            }
        }
    }

    fn alive(&mut self) -> bool {
        !self.reap(Duration::ZERO)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.finish(Duration::ZERO);
    }
}

/// The child's stdout as a channel of lines (a reader thread that ends with it).
fn line_channel(child: &mut Child) -> Result<Receiver<String>, String> {
    let out = child.stdout.take().ok_or("the child has no stdout pipe")?;
    let (tx, rx) = unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// The next line from the child, within `limit`.
fn expect_line(rx: &Receiver<String>, prefix: &str, limit: Duration) -> Result<String, String> {
    match rx.recv_timeout(limit) {
        Ok(l) if l.starts_with(prefix) => Ok(l),
        Ok(l) => Err(format!("the child said {l:?}, expected {prefix:?}")),
        Err(RecvTimeoutError::Timeout) => Err(format!(
            "no {prefix:?} from the child within {} s",
            limit.as_secs()
        )),
        Err(RecvTimeoutError::Disconnected) => Err(format!(
            "the child exited before {prefix:?} (killed by the OOM killer?)"
        )),
    }
}

fn tell(stdin: &mut ChildStdin, line: &str) -> Result<(), String> {
    send_line(stdin, line).map_err(|e| format!("writing {line:?} to the child: {e}"))
}

/// Parses `result <accesses> <reads> <writes> <failures> <elapsed_ns>`.
pub fn parse_result(line: &str) -> Option<super::pmbench::Outcome> {
    let v: Vec<u64> = line
        .strip_prefix("result ")?
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let [accesses, reads, writes, failures, ns] = v[..] else {
        return None;
    };
    Some(super::pmbench::Outcome {
        accesses,
        reads,
        writes,
        failures,
        elapsed: Duration::from_nanos(ns),
        samples: Vec::new(),
    })
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
    let r = measure(&exe, &hs, threads, wss, plan);
    // The child is gone (measure's guard reaped it): tear down now, so that an
    // error here is reported with the point.
    let t = hs.teardown();
    let f = r?;
    t.map_err(|e| format!("teardown: {e}"))?;
    Ok(f)
}

fn measure(
    exe: &std::path::Path,
    hs: &HostSwap,
    threads: usize,
    wss: usize,
    plan: &Plan,
) -> Result<Vec<Figure>, String> {
    let fill = Duration::from_secs((threads * wss) as u64 / (64 << 20));
    let deadline = fill + plan.max_warmup + plan.duration + 3 * LINE_TIMEOUT;
    let child = Command::new(exe)
        .arg(CHILD_COMMAND)
        .arg(threads.to_string())
        .arg(wss.to_string())
        .arg(deadline.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))?;
    let mut g = ChildGuard {
        child,
        reaped: false,
    };
    let rx = line_channel(&mut g.child)?;
    let mut stdin = g.child.stdin.take().ok_or("the child has no stdin pipe")?;
    let cg = hs.cgroup.as_ref().ok_or("no cgroup")?;
    cg.add(g.child.id())?;
    tell(&mut stdin, "start")?;
    // Filling the working sets swaps them out once: at least 64 MiB/s.
    let fill = Duration::from_secs((threads * wss) as u64 / (64 << 20));
    expect_line(&rx, "ready", LINE_TIMEOUT + fill)?;
    let steady = warm_up(plan, vmstat_swap, || !rx.is_empty() || g.alive());
    if !g.alive() {
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
    tell(&mut stdin, "measure")?;
    std::thread::sleep(plan.duration);
    tell(&mut stdin, "stop")?;
    let secs = t0.elapsed().as_secs_f64();
    let v1 = vmstat_swap();
    let res = expect_line(&rx, "result", LINE_TIMEOUT)?;
    let mut o = parse_result(&res).ok_or_else(|| format!("bad result line {res:?}"))?;
    let s = expect_line(&rx, "samples", LINE_TIMEOUT)?;
    o.samples = parse_samples(&s).ok_or("bad samples line")?;
    expect_line(&rx, "done", LINE_TIMEOUT)?;
    drop(stdin);
    g.finish(LINE_TIMEOUT);
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
    }

    /// Nothing named after this process is on the host.
    fn nothing_of_ours_left() {
        let me = format!("{}{}-", super::super::swap_host::PREFIX, std::process::id());
        // No loop device (so no swap device) over a file of ours.
        let loops = super::super::swap_host::our_loops();
        assert!(loops.iter().all(|(_, f)| !f.contains(&me)), "{loops:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&me), "a tmpfs of ours is still mounted");
        let run = std::fs::read_dir(super::super::swap_host::MOUNT_BASE).unwrap();
        assert!(run
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(&me)));
    }

    /// A small kernel point: it measures (or says why not) and leaves nothing.
    #[test]
    fn kernel_point_measures_and_tears_down() {
        if !super::super::swap_host::host_swap_opted_in() {
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
