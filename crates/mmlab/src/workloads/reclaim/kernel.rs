//! `reclaim`'s `kernel` peer: the same trace replayed by a child process (this
//! binary again, hidden subcommand `reclaim-child`) in a memory cgroup limited
//! to the trace's memory, swapping to a loop device over tmpfs
//! (`host::swap::HostSwap`, cgroup v1 or v2), as pmbench's kernel peer does.
//!
//! Protocol (one line per message, `host::child`): the child, once in its
//! cgroup (limited loosely), sets itself up (the trace's generator or file
//! reader, its buffers, the mappings) and says `ready`; the parent reads what
//! the cgroup is charged now (the child's own heap and stack) and limits it to
//! that plus the trace's memory, so that the trace gets all of its memory and
//! the child's own needs do not push it over (a limit of the memory alone
//! OOM-killed a child whose heap took part of it); parent -> child `start`;
//! child -> parent `result <accesses> <failures>
//! <corrupt> <elapsed_ns> <pswpin> <majflt> <pgscan_kswapd> <pgscan_direct>
//! <pgsteal_kswapd> <pgsteal_direct> <resident>` (the reclaim counters over
//! the whole measured span, `Outcome::span`), `series <acc>:<reads> ...`,
//! `done`. The child reads /proc/vmstat (host-wide) and its own major faults
//! (`getrusage`) at each measure edge and sample. Teardown (child, cgroup,
//! swapoff, loop device, tmpfs) is `HostSwap`'s, on every path.

use super::replay::{replay, Outcome, Snapshot, Target};
use super::trace::Spec;
use crate::host::child::{child_exe, child_setup, send_line, ChildProc};
use crate::host::facts::{parse_vmstat, vmstat};
use crate::host::mem::{mmap_anon, PAGE};
use crate::host::swap::HostSwap;
use std::io::BufRead;
use std::time::Duration;

/// The hidden subcommand that runs the child.
pub const CHILD_COMMAND: &str = "reclaim-child";
const LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// The cgroup's room for the child's setup (generator tables, buffers)
/// before its limit is set to what the setup took plus the trace's memory.
const SETUP_SLACK: u64 = 64 << 20;

/// The trace's pages in host memory: one anonymous mapping per segment.
struct HostTarget {
    segs: Vec<*mut u8>,
    seg_pages: u64,
    rss0: u64,
    /// This process's cgroup v2 `memory.stat` (its reclaim counters), if any.
    memcg_stat: Option<std::path::PathBuf>,
}

/// The `memory.stat` of this process's cgroup on a v2 hierarchy (v1's has no
/// reclaim counters).
fn memcg_stat() -> Option<std::path::PathBuf> {
    let crate::host::cgroup::CgroupRoot::V2(root) = crate::host::cgroup::CgroupRoot::find().ok()?
    else {
        return None;
    };
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let stat = root.join(path.trim_start_matches('/')).join("memory.stat");
    stat.exists().then_some(stat)
}

fn rss_anon_pages() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb / 4)
}

impl HostTarget {
    fn new(pages: u64, seg_pages: u64) -> std::io::Result<HostTarget> {
        let rss0 = rss_anon_pages();
        let n = pages.div_ceil(seg_pages);
        let len = (seg_pages * PAGE as u64) as usize;
        let mut segs = Vec::new();
        for _ in 0..n {
            let p = mmap_anon(len, libc::MAP_NORESERVE)?;
            // SAFETY: advice on our fresh mapping: 4 KiB pages, as mmkit's.
            unsafe { libc::madvise(p.as_ptr().cast(), len, libc::MADV_NOHUGEPAGE) };
            segs.push(p.as_ptr());
        }
        Ok(HostTarget {
            segs,
            seg_pages,
            rss0,
            memcg_stat: memcg_stat(),
        })
    }

    fn seg_len(&self) -> usize {
        (self.seg_pages * PAGE as u64) as usize
    }
}

impl Drop for HostTarget {
    fn drop(&mut self) {
        for &p in &self.segs {
            // SAFETY: exactly the mappings made in `new`; no reference remains.
            unsafe { libc::munmap(p.cast(), self.seg_len()) };
        }
    }
}

impl Target for HostTarget {
    fn access(&mut self, page: u64, write: bool, value: u32) -> Option<u32> {
        let seg = *self.segs.get((page / self.seg_pages) as usize)?;
        // SAFETY: the offset is inside segment `page / seg_pages`, a live
        // read/write mapping of seg_pages pages; 4-aligned.
        let p = unsafe { seg.add(((page % self.seg_pages) * PAGE as u64) as usize) }.cast::<u32>();
        if write {
            // SAFETY: as above.
            unsafe { p.write_volatile(value) };
            Some(value)
        } else {
            // SAFETY: as above.
            Some(unsafe { p.read_volatile() })
        }
    }

    fn discard(&mut self, n: u64) -> Result<(), String> {
        let p = *self.segs.get(n as usize).ok_or("no such segment")?;
        // SAFETY: MADV_DONTNEED on exactly one of our private anonymous
        // mappings: its pages (and swap entries) are dropped, reads see zeros.
        if unsafe { libc::madvise(p.cast(), self.seg_len(), libc::MADV_DONTNEED) } != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Snapshot {
        let keys = [
            "pgscan_kswapd",
            "pgscan_direct",
            "pgsteal_kswapd",
            "pgsteal_direct",
        ];
        let [reads] = vmstat(["pswpin"]);
        // Limit reclaim is counted in the cgroup's memory.stat (v2), not in
        // the host's /proc/vmstat (global reclaim only).
        let [sk, sd, tk, td] = match &self.memcg_stat {
            Some(p) => parse_vmstat(&std::fs::read_to_string(p).unwrap_or_default(), keys),
            None => vmstat(keys),
        };
        // SAFETY: getrusage writes one rusage struct we own.
        let majflt = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut ru);
            ru.ru_majflt as u64
        };
        Snapshot {
            reads,
            majflt,
            pgscan_kswapd: sk,
            pgscan_direct: sd,
            pgsteal_kswapd: tk,
            pgsteal_direct: td,
            kswapd_ns: 0,
        }
    }

    fn resident(&mut self) -> u64 {
        rss_anon_pages().saturating_sub(self.rss0)
    }
}

/// The child: replays the trace of `spec` after `start`; exits by itself after
/// `deadline_ms`.
pub fn child_main(deadline_ms: u64, spec: &[String]) -> anyhow::Result<()> {
    child_setup(CHILD_COMMAND, Duration::from_millis(deadline_ms));
    let spec = Spec::from_args(spec).ok_or_else(|| anyhow::anyhow!("bad trace spec {spec:?}"))?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim() != "setup" {
        anyhow::bail!("reclaim-child: expected `setup`");
    }
    let mut src = spec.open()?;
    let shape = src.shape().clone();
    let mut t = HostTarget::new(shape.pages, shape.segment_pages)?;
    let mut out = std::io::stdout().lock();
    send_line(&mut out, "ready")?;
    line.clear();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim() != "start" {
        anyhow::bail!("reclaim-child: expected `start`");
    }
    let o = replay(src.as_mut(), &mut t)?;
    drop(t);
    let c = &o.counts;
    send_line(
        &mut out,
        &format!(
            "result {} {} {} {} {} {} {} {} {} {} {}",
            o.accesses,
            o.failures,
            o.corrupt,
            o.elapsed.as_nanos(),
            c.reads,
            c.majflt,
            o.span.pgscan_kswapd,
            o.span.pgscan_direct,
            o.span.pgsteal_kswapd,
            o.span.pgsteal_direct,
            o.resident
        ),
    )?;
    let mut s = String::from("series");
    for (a, r) in &o.series {
        s += &format!(" {a}:{r}");
    }
    send_line(&mut out, &s)?;
    send_line(&mut out, "done")?;
    Ok(())
}

/// Parses the `result` and `series` lines.
pub fn parse(result: &str, series: &str) -> Option<Outcome> {
    let v: Vec<u64> = result
        .strip_prefix("result ")?
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let [accesses, failures, corrupt, ns, reads, majflt, sk, sd, tk, td, resident] = v[..] else {
        return None;
    };
    let series = series
        .strip_prefix("series")?
        .split_whitespace()
        .map(|p| {
            let (a, r) = p.split_once(':')?;
            Some((a.parse().ok()?, r.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Outcome {
        accesses,
        failures,
        corrupt,
        elapsed: Duration::from_nanos(ns),
        counts: Snapshot {
            reads,
            majflt,
            ..Snapshot::default()
        },
        span: Snapshot {
            pgscan_kswapd: sk,
            pgscan_direct: sd,
            pgsteal_kswapd: tk,
            pgsteal_direct: td,
            ..Snapshot::default()
        },
        series,
        resident,
    })
}

/// Replays `spec` in a child in a memory cgroup of `memory` bytes with a
/// swap device of `swap` bytes. Err says why it was not measured (then
/// nothing of it is left on the host).
pub fn run(spec: &Spec, memory: u64, swap: u64, limit: Duration) -> Result<Outcome, String> {
    if let Some(why) = HostSwap::unavailable() {
        return Err(why);
    }
    let exe = child_exe()?;
    // Loose until the child is set up (`run`'s protocol): its own needs on
    // top of the trace's memory.
    let mut hs = HostSwap::create(swap, memory + SETUP_SLACK)?;
    let r = (|| {
        let mut args = vec![
            CHILD_COMMAND.to_string(),
            (limit + 2 * LINE_TIMEOUT).as_millis().to_string(),
        ];
        args.extend(spec.to_args());
        let mut c = ChildProc::spawn(&exe, &args, "reclaim kernel")?;
        let cg = hs.cgroup.as_ref().ok_or("no cgroup")?;
        cg.add(c.id())?;
        c.tell("setup")?;
        c.expect("ready", LINE_TIMEOUT)?;
        cg.set_limit(cg.usage()? + memory)?;
        c.tell("start")?;
        let res = c.expect("result", limit + LINE_TIMEOUT)?;
        let ser = c.expect("series", LINE_TIMEOUT)?;
        c.expect("done", LINE_TIMEOUT)?;
        c.close_stdin();
        c.finish(LINE_TIMEOUT);
        parse(&res, &ser).ok_or_else(|| format!("bad result {res:?}"))
    })();
    let t = hs.teardown();
    let o = r?;
    t.map_err(|e| format!("teardown: {e}"))?;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lines_parse() {
        let o = parse("result 10 0 0 1000 3 2 4 5 6 7 99", "series 5:1 10:3").unwrap();
        assert_eq!((o.accesses, o.counts.reads, o.counts.majflt), (10, 3, 2));
        assert_eq!(o.span.pgsteal_direct, 7);
        assert_eq!(o.resident, 99);
        assert_eq!(o.series, vec![(5, 1), (10, 3)]);
        assert!(parse("result 1 2", "series").is_none());
        assert!(parse("result 10 0 0 1000 3 2 4 5 6 7 99", "series x").is_none());
    }

    /// The host target replays a small trace: content intact, dropped
    /// segments read as zeros.
    #[test]
    fn host_target_keeps_content() {
        let mut t = HostTarget::new(8, 4).unwrap();
        let _ = t.snapshot();
        for p in 0..8 {
            assert_eq!(t.access(p, true, p as u32 + 1), Some(p as u32 + 1));
        }
        for p in 0..8 {
            assert_eq!(t.access(p, false, 0), Some(p as u32 + 1));
        }
        t.discard(1).unwrap();
        assert_eq!(t.access(5, false, 0), Some(0));
        assert_eq!(t.access(1, false, 0), Some(2));
        assert!(t.access(8, false, 0).is_none());
    }
}
