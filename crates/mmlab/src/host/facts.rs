//! Facts about the host a run is measured on: its CPU model, CPU count, memory,
//! kernel, THP mode and NUMA nodes, and the git commit of the lab (into every
//! record's `params.host`, `params.commit`, and onto the report page); and the
//! host's own counters the workloads read around a measured interval
//! (/proc/vmstat's swap counts).
//!
//! Every reader is total: a file that cannot be read leaves its fact out (or
//! reads as zero/"unknown"), it never fails a run.

use serde_json::{Map, Value};
use std::fs;

/// The first value of `key` in a `key : value` file such as /proc/cpuinfo.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// The bracketed choice of a sysfs mode file: `"always [madvise] never"` -> `"madvise"`.
pub fn bracketed(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// The host facts, as a JSON object (keys missing where unknown):
/// `cpu`, `cpus`, `memory_bytes`, `kernel`, `thp`, `numa_nodes`.
pub fn host() -> Map<String, Value> {
    let mut m = Map::new();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if let Some(cpu) = field(&cpuinfo, "model name").or_else(|| field(&cpuinfo, "Model")) {
        m.insert("cpu".into(), cpu.into());
    }
    if let Ok(n) = std::thread::available_parallelism() {
        m.insert("cpus".into(), n.get().into());
    }
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if let Some(kb) = field(&meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        m.insert("memory_bytes".into(), (kb * 1024).into());
    }
    if let Ok(k) = fs::read_to_string("/proc/sys/kernel/osrelease") {
        m.insert("kernel".into(), k.trim().into());
    }
    if let Some(t) = fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| bracketed(&t))
    {
        m.insert("thp".into(), t.into());
    }
    if let Ok(dir) = fs::read_dir("/sys/devices/system/node") {
        let nodes = dir
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.strip_prefix("node")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .count();
        if nodes > 0 {
            m.insert("numa_nodes".into(), nodes.into());
        }
    }
    m
}

/// The lab's git commit: `$MMLAB_COMMIT`, else `$GITHUB_SHA`, else
/// `git rev-parse HEAD` in the current directory or else the executable's (with
/// " (dirty)" when the work tree has changes); `None` when none of these answers.
pub fn commit() -> Option<String> {
    for var in ["MMLAB_COMMIT", "GITHUB_SHA"] {
        if let Ok(v) = std::env::var(var) {
            if !v.trim().is_empty() {
                return Some(v.trim().to_string());
            }
        }
    }
    // The current directory first, then the executable's (target/release of a
    // checkout, wherever the lab is run from).
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()));
    let dirs = [Some(std::path::PathBuf::from(".")), exe_dir];
    dirs.iter().flatten().find_map(|dir| {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(args)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let head = git(&["rev-parse", "HEAD"]).filter(|h| !h.is_empty())?;
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        Some(if dirty {
            format!("{head} (dirty)")
        } else {
            head
        })
    })
}

/// One line per fact, for the page and the compare header: "cpu: ...".
pub fn describe(host: &Map<String, Value>) -> Vec<(String, String)> {
    host.iter()
        .map(|(k, v)| {
            let text = match (k.as_str(), v) {
                ("memory_bytes", Value::Number(n)) => n
                    .as_u64()
                    .map_or_else(|| n.to_string(), |b| format!("{} MiB", b >> 20)),
                (_, Value::String(s)) => s.clone(),
                (_, other) => other.to_string(),
            };
            let key = k.strip_suffix("_bytes").unwrap_or(k);
            (key.to_string(), text)
        })
        .collect()
}

/// The transparent huge page mode of the host ("always", "madvise", "never"), for
/// the records; "unknown" when it cannot be read.
pub fn thp_mode() -> String {
    fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|t| bracketed(&t))
        .unwrap_or_else(|| "unknown".into())
}

/// `pswpin` and `pswpout` of /proc/vmstat (pages), or zeros if unreadable.
pub fn vmstat_swap() -> (u64, u64) {
    let s = fs::read_to_string("/proc/vmstat").unwrap_or_default();
    parse_vmstat_swap(&s)
}

/// `pswpin` and `pswpout` of a /proc/vmstat text.
pub fn parse_vmstat_swap(s: &str) -> (u64, u64) {
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("pswpin"), get("pswpout"))
}

/// The named counters of a /proc/vmstat text (0 for a missing one).
pub fn parse_vmstat<const N: usize>(s: &str, keys: [&str; N]) -> [u64; N] {
    keys.map(|k| {
        s.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// The named counters of /proc/vmstat (zeros if unreadable).
pub fn vmstat<const N: usize>(keys: [&str; N]) -> [u64; N] {
    parse_vmstat(
        &fs::read_to_string("/proc/vmstat").unwrap_or_default(),
        keys,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_and_sysfs_formats() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\nflags\t: fpu\n";
        assert_eq!(
            field(cpuinfo, "model name").as_deref(),
            Some("Example CPU @ 2.0GHz")
        );
        assert_eq!(field(cpuinfo, "missing"), None);
        assert_eq!(
            bracketed("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(bracketed("none"), None);
        assert_eq!(
            parse_vmstat_swap("pgfault 5\npswpin 12\npswpout 34\nx 1\n"),
            (12, 34)
        );
        assert_eq!(
            parse_vmstat(
                "pswpin 12\npgscan_kswapd 7\n",
                ["pgscan_kswapd", "pswpin", "nope"]
            ),
            [7, 12, 0]
        );
    }

    #[test]
    fn this_host_has_cpus_and_memory() {
        let h = host();
        assert!(h["cpus"].as_u64().unwrap() >= 1);
        assert!(h.get("memory_bytes").is_some());
        let lines = describe(&h);
        assert!(lines
            .iter()
            .any(|(k, v)| k == "memory" && v.ends_with("MiB")));
        assert!(!thp_mode().is_empty());
    }
}
