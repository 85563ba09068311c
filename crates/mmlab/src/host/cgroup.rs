//! Memory cgroups of the lab on this host: the memory controller's hierarchy
//! (v1, a `cgroup` mount with the `memory` option; or v2, a `cgroup2` mount
//! whose `cgroup.controllers` offers `memory`), and a cgroup of ours limited to
//! a number of bytes of memory with swap unlimited, into which a process is
//! moved; children of one of ours are made by passing its directory as the
//! root (`CgroupRoot::V1(dir)` or `V2(dir)`).
//!
//! Invariants: a `Cgroup` is removed when dropped, with any cgroups made below
//! it (after their tasks exited, waiting up to a second for them); cgroups are named as every host object of
//! the lab is (`super::fresh_name`), so that `clean_leftovers` removes those a
//! crashed run left (owner pid gone) and never a concurrent run's.
//! Errors are strings that say which file or step failed.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The memory cgroup hierarchy of this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupRoot {
    V1(PathBuf),
    V2(PathBuf),
}

impl CgroupRoot {
    /// The memory controller's hierarchy from /proc/self/mountinfo: a v1 mount
    /// with the `memory` option, else a v2 mount offering `memory`.
    pub fn find() -> Result<CgroupRoot, String> {
        let info = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
        let mut v2 = None;
        for line in info.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mnt) = pre.split(' ').nth(4) else {
                continue;
            };
            let mut post = post.split(' ');
            let fstype = post.next().unwrap_or("");
            let superopts = post.nth(1).unwrap_or("");
            if fstype == "cgroup" && superopts.split(',').any(|o| o == "memory") {
                return Ok(CgroupRoot::V1(PathBuf::from(mnt)));
            }
            if fstype == "cgroup2" && v2.is_none() {
                let ctl = fs::read_to_string(Path::new(mnt).join("cgroup.controllers"));
                if ctl.is_ok_and(|c| c.split_whitespace().any(|x| x == "memory")) {
                    v2 = Some(CgroupRoot::V2(PathBuf::from(mnt)));
                }
            }
        }
        v2.ok_or_else(|| "no memory cgroup controller mounted (v1 or v2)".to_string())
    }

    pub fn dir(&self) -> &Path {
        match self {
            CgroupRoot::V1(p) | CgroupRoot::V2(p) => p,
        }
    }
}

/// A memory cgroup of ours, removed on drop.
pub struct Cgroup {
    pub dir: PathBuf,
}

fn write_file(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

impl Cgroup {
    /// Creates cgroup `name` limited to `limit` bytes of memory, swap unlimited.
    pub fn create(root: &CgroupRoot, name: &str, limit: u64) -> Result<Cgroup, String> {
        if let CgroupRoot::V2(r) = root {
            let sub = fs::read_to_string(r.join("cgroup.subtree_control")).unwrap_or_default();
            if !sub.split_whitespace().any(|c| c == "memory") {
                write_file(&r.join("cgroup.subtree_control"), "+memory")?;
            }
        }
        let dir = root.dir().join(name);
        fs::create_dir(&dir).map_err(|e| format!("creating cgroup {}: {e}", dir.display()))?;
        let cg = Cgroup { dir };
        match root {
            CgroupRoot::V1(_) => {
                write_file(&cg.dir.join("memory.limit_in_bytes"), &limit.to_string())?;
                // Inherited from the parent, which may say 0 (no anon swap).
                let _ = fs::write(cg.dir.join("memory.swappiness"), "60");
            }
            CgroupRoot::V2(_) => {
                write_file(&cg.dir.join("memory.max"), &limit.to_string())?;
                if cg.dir.join("memory.swap.max").exists() {
                    write_file(&cg.dir.join("memory.swap.max"), "max")?;
                }
            }
        }
        Ok(cg)
    }

    /// Is this a v1 memory cgroup (`memory.limit_in_bytes`), else v2?
    fn v1(&self) -> bool {
        self.dir.join("memory.limit_in_bytes").exists()
    }

    /// Bytes charged to the cgroup now (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`).
    pub fn usage(&self) -> Result<u64, String> {
        let f = self.dir.join(if self.v1() {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        });
        let s = fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        s.trim()
            .parse()
            .map_err(|e| format!("{}: {s:?}: {e}", f.display()))
    }

    /// Sets the memory limit to `limit` bytes (v1 `memory.limit_in_bytes`, v2
    /// `memory.max`).
    pub fn set_limit(&self, limit: u64) -> Result<(), String> {
        let f = if self.v1() {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        write_file(&self.dir.join(f), &limit.to_string())
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Removes the cgroup and any below it (their tasks gone), waiting up to a
    /// second each for exiting tasks.
    pub fn remove(&self) -> Result<(), String> {
        remove_cgroup_dir(&self.dir)
    }
}

/// Removes cgroup `dir` and the cgroups below it (children first: a cgroup
/// with children cannot go), waiting up to a second each for exiting tasks.
fn remove_cgroup_dir(dir: &Path) -> Result<(), String> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_dir(&e.path())?;
            }
        }
    }
    let t0 = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if t0.elapsed() > Duration::from_secs(1) => {
                return Err(format!("removing cgroup {}: {e}", dir.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("warning: {e}");
        }
    }
}

/// Removes the cgroups of ours for which `dead(name)` holds (their owner is
/// gone); returns what it removed, e.g. `["cgroup /sys/fs/cgroup/mmlab-pmbench-12-0"]`.
pub fn clean_leftovers(dead: impl Fn(&str) -> bool) -> Vec<String> {
    let mut done = Vec::new();
    if let Ok(root) = CgroupRoot::find() {
        if let Ok(dir) = fs::read_dir(root.dir()) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if dead(&name) && remove_cgroup_dir(&e.path()).is_ok() {
                    done.push(format!("cgroup {}", e.path().display()));
                }
            }
        }
    }
    done
}

/// Whether a cgroup called `name` exists under the memory hierarchy.
#[cfg(test)]
pub fn exists(name: &str) -> bool {
    CgroupRoot::find().is_ok_and(|r| r.dir().join(name).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_finds_a_memory_hierarchy_or_says_why_not() {
        match CgroupRoot::find() {
            Ok(root) => assert!(root.dir().is_dir(), "{root:?}"),
            Err(why) => assert!(why.contains("memory") || why.contains("mountinfo"), "{why}"),
        }
    }
}
