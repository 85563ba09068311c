//! `memcg`'s `kernel` peer: A and B as child processes (this binary again,
//! hidden subcommand `memcg-child`, run by `host::child`) in two memory
//! cgroups under a parent limited to the arena, swapping to a loop device over
//! tmpfs (`host::swap`, whose cgroup is the parent).
//!
//! Protection: cgroup v1 has no `memory.low`, so on v1 A is protected by
//! limits alone: B's `memory.limit_in_bytes` is what A's protection leaves (as
//! `mmkit-max`); on v2 B's `memory.max` is the same and A's `memory.low` is
//! set too. `protection()` says which, for the records and a note.
//!
//! A point: A starts and writes its hot set, is measured alone, then B starts
//! and streams; once B has filled memory and streamed one more memory, both
//! are measured while the parent samples the two cgroups' usage.
//!
//! The protocol, one text line per message:
//! - parent -> child (stdin): `start` (the child is in its cgroup: map, write
//!   A's hot set, run), `mark` (report now), `stop`; end of input counts as
//!   `stop`;
//! - child -> parent (stdout): `ready` (its threads run), then per `mark`:
//!   `mark <ops> <failures> <minflt> <majflt> <cpu_ns> <ns>` (cumulative:
//!   accesses or pages written, failed ones, the process's faults and CPU
//!   time from getrusage, and CLOCK_MONOTONIC), and `done` after `stop`.
//!
//! Everything is bounded (`host::child`); the cgroups and the device are torn
//! down after the children are gone (on error too).

use super::{read_loop, stream_loop, Case, GroupReport, Outcome, Pages, Picker, Plan, Progress};
use super::{Sampled, Sizes};
use crate::host::cgroup::{Cgroup, CgroupRoot};
use crate::host::child::{child_exe, child_setup, send_line, ChildProc};
use crate::host::mem::{mmap_anon, PAGE};
use crate::host::swap::HostSwap;
use crate::host::{cpu, now_ns};
use crate::phase::{self, Placement};
use std::io::BufRead;
use std::path::Path;
use std::time::{Duration, Instant};

/// The hidden subcommand that runs a child.
pub const CHILD_COMMAND: &str = "memcg-child";
/// Longest wait for one line of a child outside the timed phases.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// An anonymous mapping of the child, unmapped on drop.
struct Mapping {
    p: *mut u8,
    pages: u64,
}

impl Mapping {
    fn new(pages: u64) -> std::io::Result<Mapping> {
        let len = (pages as usize) * PAGE;
        let p = mmap_anon(len, libc::MAP_NORESERVE)?;
        // 4 KiB pages, as mmkit's spaces here.
        // SAFETY: advice on our fresh mapping.
        unsafe { libc::madvise(p.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE) };
        Ok(Mapping {
            p: p.as_ptr(),
            pages,
        })
    }

    fn view(&self) -> View {
        View {
            p: self.p,
            pages: self.pages,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`; the views are gone (the
        // threads using them were joined).
        unsafe { libc::munmap(self.p.cast(), self.pages as usize * PAGE) };
    }
}

/// A loop's handle on a `Mapping` that outlives it.
#[derive(Clone, Copy)]
struct View {
    p: *mut u8,
    pages: u64,
}

// SAFETY: a view points into a live mapping for as long as its thread runs
// (`child_main` joins the threads before the mappings go); reads of a shared
// mapping race only with other reads, and each B thread writes its own.
unsafe impl Send for View {}

impl Pages for View {
    fn pages(&self) -> u64 {
        self.pages
    }
    #[inline]
    fn read(&mut self, page: u64) -> bool {
        debug_assert!(page < self.pages);
        let off = page as usize * PAGE + (page as usize % 1024) * 4;
        // SAFETY: page < pages, so off + 4 lies inside the live mapping.
        unsafe { std::ptr::read_volatile(self.p.add(off).cast::<u32>()) };
        true
    }
    #[inline]
    fn write(&mut self, page: u64) -> bool {
        // SAFETY: as in `read`.
        unsafe { self.p.add(page as usize * PAGE).write_volatile(1) };
        true
    }
    fn recycle(&mut self) -> bool {
        // SAFETY: the live mapping; MADV_DONTNEED drops its pages and swap
        // entries, and it reads as zeroes afterwards.
        unsafe {
            libc::madvise(
                self.p.cast(),
                self.pages as usize * PAGE,
                libc::MADV_DONTNEED,
            ) == 0
        }
    }
}

/// This process's (minor faults, major faults, CPU time in ns).
fn usage() -> (u64, u64, u64) {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (
        ru.ru_minflt as u64,
        ru.ru_majflt as u64,
        ns(ru.ru_utime) + ns(ru.ru_stime),
    )
}

/// A child's report at one `mark`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub ops: u64,
    pub failures: u64,
    pub minflt: u64,
    pub majflt: u64,
    /// The process's CPU time (user + system).
    pub cpu_ns: u64,
    pub ns: u64,
}

impl Mark {
    pub fn line(&self) -> String {
        format!(
            "mark {} {} {} {} {} {}",
            self.ops, self.failures, self.minflt, self.majflt, self.cpu_ns, self.ns
        )
    }

    /// Parses `mark <ops> <failures> <minflt> <majflt> <cpu_ns> <ns>`.
    pub fn parse(line: &str) -> Option<Mark> {
        let v: Vec<u64> = line
            .strip_prefix("mark ")?
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let [ops, failures, minflt, majflt, cpu_ns, ns] = v[..] else {
            return None;
        };
        Some(Mark {
            ops,
            failures,
            minflt,
            majflt,
            cpu_ns,
            ns,
        })
    }
}

/// The child: role `a` (reads `bytes` of hot set as `case` says) or `b`
/// (streams through `bytes`), on `threads` threads, driven by the parent's
/// lines; exits by itself after `deadline_ms`.
pub fn child_main(
    role: &str,
    case: &str,
    bytes: u64,
    threads: usize,
    deadline_ms: u64,
) -> anyhow::Result<()> {
    child_setup(CHILD_COMMAND, Duration::from_millis(deadline_ms));
    let is_a = match role {
        "a" => true,
        "b" => false,
        _ => anyhow::bail!("memcg-child: role {role:?}: expected a or b"),
    };
    let case = Case::from_name(case)
        .ok_or_else(|| anyhow::anyhow!("memcg-child: unknown case {case:?}"))?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = move || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    if next().trim() != "start" {
        anyhow::bail!("memcg-child: expected `start`");
    }
    let threads = threads.max(1);
    let pages = bytes / PAGE as u64;
    let maps: Vec<Mapping> = if is_a {
        vec![Mapping::new(pages)?]
    } else {
        (0..threads)
            .map(|_| Mapping::new((pages / threads as u64).max(1)))
            .collect::<std::io::Result<_>>()?
    };
    let views: Vec<View> = if is_a {
        let v = maps[0].view();
        for p in 0..pages {
            // SAFETY: p < pages, inside the fresh read/write mapping.
            unsafe { v.p.add(p as usize * PAGE).write_volatile(1) };
        }
        // Every A thread reads the one hot set.
        vec![v; threads]
    } else {
        maps.iter().map(Mapping::view).collect()
    };
    let picker = Picker::new(case, pages);
    let progress = Progress::default();
    let cpus = cpu::allowed_cpus();
    let mut out = std::io::stdout().lock();
    phase::drive(
        views,
        |i| Placement::on(cpu::round_robin(&cpus, i)),
        |i, mut v, word| {
            if is_a {
                read_loop(&mut v, &picker, now_ns() ^ i as u64, &progress, word);
            } else {
                stream_loop(&mut v, &progress, word);
            }
        },
        |_| {
            let _ = send_line(&mut out, "ready");
            while next().trim() == "mark" {
                let (minflt, majflt, cpu_ns) = usage();
                let m = Mark {
                    ops: progress.ops(),
                    failures: progress.failures(),
                    minflt,
                    majflt,
                    cpu_ns,
                    ns: now_ns(),
                };
                let _ = send_line(&mut out, &m.line());
            }
        },
    );
    drop(maps);
    send_line(&mut out, "done")?;
    Ok(())
}

/// How the peer protects A on this host's hierarchy.
pub fn protection(root: &CgroupRoot) -> &'static str {
    match root {
        CgroupRoot::V1(_) => {
            "cgroup v1: limits alone (B's memory.limit_in_bytes; v1 has no memory.low)"
        }
        CgroupRoot::V2(_) => "cgroup v2: A's memory.low and B's memory.max",
    }
}

/// A number from a cgroup file (`max` is `u64::MAX`).
fn read_u64(dir: &Path, file: &str) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join(file)).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// The value of `key` in a flat-keyed cgroup file (`memory.stat`,
/// `memory.events`).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_keyed(dir: &Path, file: &str, key: &str) -> Option<u64> {
    keyed(&std::fs::read_to_string(dir.join(file)).ok()?, key)
}

/// One cgroup's files, by hierarchy.
struct Files<'a> {
    dir: &'a Path,
    v2: bool,
}

impl Files<'_> {
    /// (memory usage, swap usage) in bytes.
    fn usage(&self) -> (u64, u64) {
        if self.v2 {
            (
                read_u64(self.dir, "memory.current").unwrap_or(0),
                read_u64(self.dir, "memory.swap.current").unwrap_or(0),
            )
        } else {
            let mem = read_u64(self.dir, "memory.usage_in_bytes").unwrap_or(0);
            let memsw = read_u64(self.dir, "memory.memsw.usage_in_bytes").unwrap_or(mem);
            (mem, memsw.saturating_sub(mem))
        }
    }

    fn peak(&self) -> Option<u64> {
        read_u64(
            self.dir,
            if self.v2 {
                "memory.peak"
            } else {
                "memory.max_usage_in_bytes"
            },
        )
    }

    /// (pgscan, pgsteal, events low): v2 only.
    fn counters(&self) -> Option<(u64, u64, u64)> {
        if !self.v2 {
            return None;
        }
        Some((
            read_keyed(self.dir, "memory.stat", "pgscan")?,
            read_keyed(self.dir, "memory.stat", "pgsteal")?,
            read_keyed(self.dir, "memory.events", "low")?,
        ))
    }

    /// The report from the samples and the counters at both ends.
    fn report(&self, sampled: Sampled, c0: Option<(u64, u64, u64)>) -> GroupReport {
        let d = c0.zip(self.counters()).map(|(a, b)| {
            (
                b.0.saturating_sub(a.0),
                b.1.saturating_sub(a.1),
                b.2.saturating_sub(a.2),
            )
        });
        GroupReport {
            sampled,
            peak: self.peak(),
            pgscan: d.map(|d| d.0),
            pgsteal: d.map(|d| d.1),
            events_low: d.map(|d| d.2),
        }
    }
}

/// A child of `role` in `cg`, started and ready.
fn start_child(
    exe: &Path,
    cg: &Cgroup,
    role: &str,
    case: Case,
    bytes: u64,
    threads: usize,
    deadline: Duration,
) -> Result<ChildProc, String> {
    let args = [
        CHILD_COMMAND.to_string(),
        role.to_string(),
        case.name().to_string(),
        bytes.to_string(),
        threads.to_string(),
        deadline.as_millis().to_string(),
    ];
    let mut c = ChildProc::spawn(exe, &args, "memcg kernel")?;
    cg.add(c.id())?;
    c.tell("start")?;
    // Writing A's hot set: at least 64 MiB/s.
    let fill = Duration::from_secs(bytes / (64 << 20));
    c.expect("ready", LINE_TIMEOUT + fill)?;
    Ok(c)
}

fn mark(c: &mut ChildProc) -> Result<Mark, String> {
    c.tell("mark")?;
    let l = c.expect("mark", LINE_TIMEOUT)?;
    Mark::parse(&l).ok_or_else(|| format!("bad mark line {l:?}"))
}

/// One point of one case. Err says why it was not measured (then nothing of
/// it is left on the host).
pub fn run_point(
    case: Case,
    sizes: &Sizes,
    threads: usize,
    plan: &Plan,
) -> Result<Outcome, String> {
    if let Some(why) = HostSwap::unavailable() {
        return Err(why);
    }
    let exe = child_exe()?;
    let root = CgroupRoot::find()?;
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| eprintln!("note: memcg kernel: {}", protection(&root)));
    let mut hs = HostSwap::create(sizes.swap, sizes.memory)?;
    let parent = hs.cgroup.as_ref().ok_or("no cgroup")?.dir.clone();
    let r = (|| {
        let v2 = matches!(root, CgroupRoot::V2(_));
        let sub = if v2 {
            CgroupRoot::V2(parent.clone())
        } else {
            CgroupRoot::V1(parent.clone())
        };
        let ga = Cgroup::create(&sub, "a", u64::MAX)?;
        let gb = Cgroup::create(&sub, "b", sizes.b_max(sizes.memory))?;
        if v2 {
            std::fs::write(ga.dir.join("memory.low"), sizes.low.to_string())
                .map_err(|e| format!("writing memory.low: {e}"))?;
        }
        measure(&exe, &ga, &gb, v2, case, sizes, threads, plan)
    })();
    let t = hs.teardown();
    let o = r?;
    t.map_err(|e| format!("teardown: {e}"))?;
    Ok(o)
}

#[allow(clippy::too_many_arguments)]
fn measure(
    exe: &Path,
    ga: &Cgroup,
    gb: &Cgroup,
    v2: bool,
    case: Case,
    sizes: &Sizes,
    threads: usize,
    plan: &Plan,
) -> Result<Outcome, String> {
    let deadline = 2 * plan.max_warmup + 2 * plan.duration + 6 * LINE_TIMEOUT;
    let mut a = start_child(exe, ga, "a", case, sizes.hot, threads, deadline)?;
    // A alone.
    std::thread::sleep(plan.warmup);
    let m0 = mark(&mut a)?;
    std::thread::sleep(plan.duration);
    let m1 = mark(&mut a)?;
    let alone = Outcome {
        secs: (m1.ns - m0.ns) as f64 / 1e9,
        a_accesses: m1.ops - m0.ops,
        a_cpu_ns: m1.cpu_ns - m0.cpu_ns,
        ..Outcome::default()
    }
    .as_alone();
    // With B.
    let mut b = start_child(exe, gb, "b", case, sizes.region, threads, deadline)?;
    // B, at its limit, reclaims its own pages: it is steady once it has
    // filled its limit and streamed half as much again.
    let warm = sizes
        .warm_pages()
        .min(sizes.b_max(sizes.memory) * 3 / 2 / 4096);
    let t0 = Instant::now();
    while mark(&mut b)?.ops < warm {
        if t0.elapsed() >= plan.max_warmup {
            eprintln!("note: memcg kernel: B not warm after the maximum warmup; measured anyway");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(plan.warmup);
    let (fa, fb) = (Files { dir: &ga.dir, v2 }, Files { dir: &gb.dir, v2 });
    let (ca, cb) = (fa.counters(), fb.counters());
    let mut sa = Sampled::new(None);
    let mut sb = Sampled::new(read_u64(
        &gb.dir,
        if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        },
    ));
    let (a0, b0) = (mark(&mut a)?, mark(&mut b)?);
    let t = Instant::now();
    loop {
        let (m, s) = fa.usage();
        sa.sample(m, s);
        let (m, s) = fb.usage();
        sb.sample(m, s);
        if t.elapsed() >= plan.duration {
            break;
        }
        std::thread::sleep(plan.sample);
    }
    let (a1, b1) = (mark(&mut a)?, mark(&mut b)?);
    let (ra, rb) = (fa.report(sa, ca), fb.report(sb, cb));
    for c in [&mut a, &mut b] {
        c.tell("stop")?;
        c.expect("done", LINE_TIMEOUT)?;
        c.close_stdin();
        c.finish(LINE_TIMEOUT);
    }
    if a1.ops == a0.ops {
        return Err("A made no access while measuring".into());
    }
    Ok(Outcome {
        secs: (a1.ns - a0.ns) as f64 / 1e9,
        a_accesses: a1.ops - a0.ops,
        a_misses: (a1.minflt + a1.majflt) - (a0.minflt + a0.majflt),
        b_pages: b1.ops - b0.ops,
        failures: a1.failures + b1.failures,
        a_cpu_ns: a1.cpu_ns - a0.cpu_ns,
        alone: Some(alone),
        a: Some(ra),
        b: Some(rb),
    })
}
