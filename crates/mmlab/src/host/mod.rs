//! The host side of the lab: everything that reads or changes the machine the
//! lab runs on, as opposed to the workloads, which measure. One file per job:
//!
//! - `cpu`: the CPUs this process may run on, and pinning threads to them;
//! - `facts`: host facts for the records (CPU, memory, kernel, THP mode, NUMA
//!   nodes, git commit) and host counters (/proc/vmstat);
//! - `mem`: host memory of this process (aligned anonymous mappings, their THP
//!   share from smaps, hugetlb reservations);
//! - `cgroup`: memory cgroups (v1 and v2) of ours, limited, removed on drop;
//! - `swap`: a RAM-backed swap device (tmpfs file, loop device, swapon) with its
//!   cgroup, torn down after use, and the cleanup of a crashed run's leftovers;
//! - `nbd`: an nbdkit server (memory plugin) on a Unix socket, and the kernel's
//!   swap to one through a loop device over an nbdfuse file, torn down after
//!   use, and the cleanup of a crashed run's servers, mounts and directories;
//! - `child`: running a child process (this binary again) under a line
//!   protocol, with every wait bounded.
//!
//! Setup that can be refused (root, loop devices, cgroups) says why in a
//! `String` that reads after "skipped: " (`swap::HostSwap::unavailable`), and
//! tears down whatever it made when it fails part way.
//!
//! Names: every object the lab creates on the host (files, mount points, loop
//! backing files, cgroups) is named `mmlab-pmbench-<pid>-<n>` by `fresh_name`,
//! where `<pid>` is the lab process that made it: a later run removes the
//! objects whose owner is gone (`is_leftover`) and never a live run's.

pub mod cgroup;
pub mod child;
pub mod cpu;
pub mod facts;
pub mod mem;
pub mod nbd;
pub mod swap;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The prefix of every host object's name.
pub const PREFIX: &str = "mmlab-pmbench-";

/// A fresh name for this process's host objects.
pub fn fresh_name() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{PREFIX}{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid in an object name `mmlab-pmbench-<pid>-<n>[.swap]`.
pub fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether the object called `name` is ours and its owner is gone.
pub fn is_leftover(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Monotonic clock in ns (CLOCK_MONOTONIC).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner() {
        let n = fresh_name();
        assert_ne!(n, fresh_name());
        assert_eq!(owner_pid(&n), Some(std::process::id()));
        assert_eq!(owner_pid("mmlab-pmbench-42-7.swap"), Some(42));
        assert_eq!(owner_pid("other-42-7"), None);
        assert!(!is_leftover(&n), "our own objects are not leftovers");
        // Above the default pid_max: never alive.
        assert!(is_leftover("mmlab-pmbench-4194303-0"));
        assert!(!is_leftover("other-4194303-0"));
        let t0 = now_ns();
        assert!(now_ns() >= t0);
    }
}
