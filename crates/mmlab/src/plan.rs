//! The run's memory plan: how much memory `mmlab run` may hold at once, and the
//! sizes that fit in it.
//!
//! The budget is `--memory`, or else half of the host's MemAvailable
//! (/proc/meminfo) when the run starts: the other half stays for the rest of
//! the host. Inside a memory cgroup with a limit whose headroom (limit minus
//! usage; the least of the run's own cgroup and its ancestors: v1
//! `memory.limit_in_bytes` and `memory.usage_in_bytes`, v2 `memory.max` and
//! `memory.current`) is below MemAvailable, the budget is three quarters of
//! that headroom instead: the limit is the run's own, and the last quarter is
//! for what the estimate does not count (page cache and kernel memory charged
//! to the cgroup). So a run started under `systemd-run -p MemoryMax=4G` plans
//! for 3 GiB, not for the host. A workload's peak is estimated by its `peak_bytes`
//! (every variant of a workload is built, its arena prefaulted, before its
//! first point; the workloads run one after another, so the run's peak is the
//! largest of them)
//! plus `OVERHEAD` for the process itself; each workload is planned alone
//! (`mmlab run` calls `choose` once per workload). The planner tries the sizes from the
//! largest down: the full data sizes with a 1 GiB, 512 MiB, then 256 MiB arena,
//! then the small (`--quick`) data sizes with 256, 128, then 64 MiB; the first
//! that fits is the plan, and any but the first is "scaled". If none fits, the
//! run is refused before it starts.

use anyhow::{bail, Context, Result};

/// The process itself: code, thread stacks, records, the report.
pub const OVERHEAD: u64 = 64 << 20;

/// Sizes tried, largest first: (small data sizes, arena bytes).
const FULL_STEPS: &[(bool, usize)] = &[
    (false, 1 << 30),
    (false, 512 << 20),
    (false, 256 << 20),
    (true, 256 << 20),
    (true, 128 << 20),
    (true, 64 << 20),
];

/// Where the budget came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Half of this MemAvailable, in bytes.
    MemAvailable(u64),
    /// Three quarters of this headroom of the run's memory cgroup (below
    /// MemAvailable), in bytes.
    Cgroup(u64),
    /// `--memory`.
    Flag,
}

/// The chosen sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bytes the run may hold at once.
    pub budget: u64,
    pub source: Source,
    /// Use the small (`--quick`) data sizes.
    pub small: bool,
    /// The mmkit arena (and the buddy peer's buffer) of the allocator workloads.
    pub arena: usize,
    /// Estimated peak of the run, `OVERHEAD` included.
    pub peak: u64,
    /// Smaller than what the run would use with memory to spare.
    pub scaled: bool,
}

/// MemAvailable from the text of /proc/meminfo, in bytes.
pub fn mem_available(meminfo: &str) -> Result<u64> {
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .context("/proc/meminfo has no MemAvailable line")?;
    let mut it = line["MemAvailable:".len()..].split_whitespace();
    let kb: u64 = it
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unreadable MemAvailable line {line:?}"))?;
    if it.next() != Some("kB") {
        bail!("MemAvailable line {line:?} is not in kB");
    }
    kb.checked_mul(1024).context("MemAvailable too large")
}

/// The budget: `flag` if given, else half of the `available` bytes, or three
/// quarters where a cgroup's headroom set them (what `available` returns: the
/// bytes and whether a cgroup's headroom they are).
pub fn budget(
    flag: Option<u64>,
    available: impl FnOnce() -> Result<(u64, bool)>,
) -> Result<(u64, Source)> {
    match flag {
        Some(0) => bail!("--memory must be more than 0 bytes"),
        Some(b) => Ok((b, Source::Flag)),
        None => {
            let (a, cgroup) = available()?;
            if a == 0 {
                bail!(
                    "{} is 0: no memory to plan a run in (use --memory to set a budget)",
                    if cgroup {
                        "the memory cgroup's headroom"
                    } else {
                        "MemAvailable"
                    }
                );
            }
            Ok(if cgroup {
                (a / 4 * 3, Source::Cgroup(a))
            } else {
                (a / 2, Source::MemAvailable(a))
            })
        }
    }
}

/// The memory controller's path of this process from the text of
/// /proc/self/cgroup: the v1 line naming `memory`, else the v2 line (`0::`).
pub fn own_cgroup(proc_self_cgroup: &str) -> Option<String> {
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        if ctl.split(',').any(|c| c == "memory") {
            return Some(path.to_string());
        }
        if ctl.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    v2
}

/// A cgroup's headroom from its limit and usage files' text: `None` when
/// unlimited (`max`, or v1's huge "no limit" value) or unreadable.
pub fn headroom(limit: &str, usage: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    // v1 writes "no limit" as the largest page-aligned i64.
    if limit >= (i64::MAX as u64) & !4095 {
        return None;
    }
    let usage: u64 = usage.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

/// The least headroom of the run's memory cgroup and its ancestors on this
/// host; `None` without a memory controller or a limit.
pub fn cgroup_headroom() -> Option<u64> {
    use crate::host::cgroup::CgroupRoot;
    let root = CgroupRoot::find().ok()?;
    let own = own_cgroup(&std::fs::read_to_string("/proc/self/cgroup").ok()?)?;
    let (limit, usage) = match root {
        CgroupRoot::V1(_) => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        CgroupRoot::V2(_) => ("memory.max", "memory.current"),
    };
    let mut dir = root.dir().join(own.trim_start_matches('/'));
    let mut least: Option<u64> = None;
    while dir.starts_with(root.dir()) {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let (Some(l), Some(u)) = (read(limit), read(usage)) {
            if let Some(h) = headroom(&l, &u) {
                least = Some(least.map_or(h, |x| x.min(h)));
            }
        }
        if !dir.pop() {
            break;
        }
    }
    least
}

/// What the run may use: MemAvailable, or the cgroup's headroom where that is
/// less (true in the second field).
pub fn available(meminfo: &str, cgroup: Option<u64>) -> Result<(u64, bool)> {
    let a = mem_available(meminfo)?;
    Ok(match cgroup {
        Some(h) if h < a => (h, true),
        _ => (a, false),
    })
}

/// The largest sizes whose estimated peak fits `budget`. `quick` starts at the
/// small sizes; `estimate(small, arena)` is the workloads' peak for those sizes.
pub fn choose(
    budget: u64,
    source: Source,
    quick: bool,
    mut estimate: impl FnMut(bool, usize) -> u64,
) -> Result<Plan> {
    let steps: Vec<(bool, usize)> = FULL_STEPS
        .iter()
        .copied()
        .filter(|&(small, _)| small || !quick)
        .collect();
    let mut smallest = u64::MAX;
    for (i, &(small, arena)) in steps.iter().enumerate() {
        let peak = estimate(small, arena).saturating_add(OVERHEAD);
        smallest = smallest.min(peak);
        if peak <= budget {
            return Ok(Plan {
                budget,
                source,
                small,
                arena,
                peak,
                scaled: i > 0,
            });
        }
    }
    bail!(
        "a memory budget of {} MiB is too small for these workloads: their smallest sizes need \
         about {} MiB{}",
        budget >> 20,
        smallest.div_ceil(1 << 20),
        match source {
            Source::MemAvailable(_) => " (half of MemAvailable; --memory sets the budget)",
            Source::Cgroup(_) => " (3/4 of the memory cgroup's headroom; --memory sets the budget)",
            Source::Flag => "",
        }
    )
}

/// The budget and where it came from, for the run's header.
pub fn describe_budget(budget: u64, source: Source) -> String {
    let from = match source {
        Source::MemAvailable(a) => format!("half of MemAvailable {} MiB", a >> 20),
        Source::Cgroup(a) => format!("3/4 of the memory cgroup's headroom {} MiB", a >> 20),
        Source::Flag => "--memory".to_string(),
    };
    format!("memory budget {} MiB ({from})", budget >> 20)
}

impl Plan {
    /// Its sizes, e.g. "small data sizes, 256 MiB arena".
    pub fn sizes(&self) -> String {
        format!(
            "{} data sizes, {} MiB arena",
            if self.small { "small" } else { "full" },
            self.arena >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24684096 kB\nMemFree:         2601932 kB\n\
                           MemAvailable:   22347688 kB\nBuffers:          123 kB\n";

    /// A run whose peak is 10 arenas, plus 2 GiB of data with the full sizes.
    fn est(small: bool, arena: usize) -> u64 {
        10 * arena as u64 + if small { 0 } else { 2 << 30 }
    }

    #[test]
    fn budget_is_half_of_mem_available() {
        assert_eq!(mem_available(MEMINFO).unwrap(), 22347688 * 1024);
        let (b, s) = budget(None, || available(MEMINFO, None)).unwrap();
        assert_eq!(b, 22347688 * 1024 / 2);
        assert_eq!(s, Source::MemAvailable(22347688 * 1024));
        assert!(mem_available("MemTotal: 1 kB\n").is_err());
        assert!(mem_available("MemAvailable: lots kB\n").is_err());
        assert!(mem_available("MemAvailable: 12 MB\n").is_err());
    }

    #[test]
    fn a_cgroup_limit_below_mem_available_sets_the_budget() {
        let four = 4u64 << 30;
        let (b, s) = budget(None, || available(MEMINFO, Some(four))).unwrap();
        assert_eq!((b, s), (3 << 30, Source::Cgroup(four)));
        assert!(describe_budget(b, s).contains("3/4 of the memory cgroup's headroom 4096 MiB"));
        // A cgroup limit above MemAvailable changes nothing.
        let (b, s) = budget(None, || available(MEMINFO, Some(1 << 40))).unwrap();
        assert_eq!(
            (b, s),
            (22347688 * 1024 / 2, Source::MemAvailable(22347688 * 1024))
        );
        // v1 and v2 files.
        assert_eq!(headroom("4294967296\n", "1073741824\n"), Some(3 << 30));
        assert_eq!(headroom("max\n", "1073741824\n"), None);
        assert_eq!(headroom("9223372036854771712\n", "5\n"), None);
        assert_eq!(headroom("4096\n", "8192\n"), Some(0));
        assert_eq!(headroom("", "1"), None);
        let v1 = "9:name=systemd:/\n4:memory:/user/run-1.scope\n0::/\n";
        assert_eq!(own_cgroup(v1).as_deref(), Some("/user/run-1.scope"));
        let v1_joint = "5:cpu,memory:/a\n";
        assert_eq!(own_cgroup(v1_joint).as_deref(), Some("/a"));
        let v2 = "0::/system.slice/run-u7.scope\n";
        assert_eq!(
            own_cgroup(v2).as_deref(),
            Some("/system.slice/run-u7.scope")
        );
        assert_eq!(own_cgroup(""), None);
    }

    #[test]
    fn the_flag_overrides_and_nonsense_is_refused() {
        let (b, s) = budget(Some(4 << 30), || panic!("not read")).unwrap();
        assert_eq!((b, s), (4 << 30, Source::Flag));
        assert!(budget(Some(0), || Ok((1 << 30, false))).is_err());
        assert!(budget(None, || Ok((0, false))).is_err());
        assert!(budget(None, || Ok((0, true))).is_err());
        assert!(budget(None, || bail!("no /proc")).is_err());
    }

    #[test]
    fn full_sizes_when_they_fit() {
        let p = choose(16 << 30, Source::Flag, false, est).unwrap();
        assert_eq!((p.small, p.arena, p.scaled), (false, 1 << 30, false));
        assert_eq!(p.peak, (12 << 30) + OVERHEAD);
        // Exactly enough is enough.
        let p = choose((12 << 30) + OVERHEAD, Source::Flag, false, est).unwrap();
        assert!(!p.scaled);
    }

    #[test]
    fn scales_down_step_by_step() {
        // 7 GiB + overhead fits 10 x 512 MiB + 2 GiB.
        let p = choose(8 << 30, Source::Flag, false, est).unwrap();
        assert_eq!((p.small, p.arena, p.scaled), (false, 512 << 20, true));
        assert!(p.peak <= p.budget);
        // 4 GiB: the full data sizes do not fit with any arena (2.5 GiB + 2 GiB).
        let p = choose(4 << 30, Source::Flag, false, est).unwrap();
        assert_eq!((p.small, p.arena, p.scaled), (true, 256 << 20, true));
        let p = choose(1 << 30, Source::Flag, false, est).unwrap();
        assert_eq!((p.small, p.arena), (true, 64 << 20));
        assert_eq!(p.peak, 640 * (1 << 20) + OVERHEAD);
        assert_eq!(p.sizes(), "small data sizes, 64 MiB arena");
        assert!(describe_budget(1 << 30, Source::MemAvailable(2 << 30))
            .contains("MemAvailable 2048 MiB"));
    }

    #[test]
    fn quick_starts_small_and_is_not_scaled_when_it_fits() {
        let p = choose(16 << 30, Source::Flag, true, est).unwrap();
        assert_eq!((p.small, p.arena, p.scaled), (true, 256 << 20, false));
        let p = choose(1 << 30, Source::Flag, true, est).unwrap();
        assert_eq!((p.small, p.arena, p.scaled), (true, 64 << 20, true));
    }

    #[test]
    fn too_small_a_budget_is_refused() {
        let e = choose(256 << 20, Source::Flag, false, est).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        let e = choose(256 << 20, Source::MemAvailable(512 << 20), false, est).unwrap_err();
        assert!(e.to_string().contains("--memory"), "{e}");
    }
}
