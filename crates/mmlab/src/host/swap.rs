//! A RAM-backed swap device on this host, with the memory cgroup that makes a
//! process swap to it, set up for one measurement and torn down after it:
//!
//! - a file on a tmpfs of its own, mounted at `/run/<name>` (with `noswap`
//!   where the kernel has it; never the shared `/dev/shm`, whose directory lock
//!   a stuck device would take hostage), allocated in full up front (so that
//!   swap-out never allocates tmpfs pages, and they are charged to the lab, not
//!   to the cgroup) and mlocked through a shared mapping for as long as it is a
//!   swap device, with a swap header written here (no `mkswap` needed). The
//!   mlock is essential: tmpfs pages are swappable, and a page of the device's
//!   own file swapped out to the device deadlocks the loop worker that must
//!   write it (it waits for the page's writeback, which is queued behind
//!   itself);
//! - a loop device over it (the `LOOP_CTL_GET_FREE` / `LOOP_SET_FD` ioctls, with
//!   autoclear, so it detaches when its last user closes it);
//! - `swapon(2)` on the loop device at the highest priority;
//! - a memory cgroup limited to the caller's size (`super::cgroup`).
//!
//! Use: `HostSwap::unavailable()` says why this host cannot (not root, no loop
//! devices, a stuck swap device, no memory cgroup) before anything is made;
//! `HostSwap::create` cleans up a crashed run's leftovers and makes a fresh
//! device and cgroup; `teardown` (or drop) removes them. Nothing turns swap on
//! outside a full run unless `opted_in()` (`MMLAB_HOST_SWAP=1`).
//!
//! Invariants: every object is named by `super::fresh_name` (file, loop backing
//! file, mount point, cgroup), so that `clean_leftovers` removes what a crashed
//! run left behind (owner pid no longer alive) without touching a concurrent
//! run's. `HostSwap::teardown` goes in reverse order: cgroup, swapoff, loop
//! detach, unlock, file, tmpfs. A loop device whose I/O no longer completes is
//! never swapped off (that would hang in the kernel for good): it is left with a
//! message instead, and so is everything of its name.

use super::cgroup::{self, Cgroup, CgroupRoot};
use super::{fresh_name, is_leftover, PREFIX};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where each point's tmpfs is mounted (`/run/<name>`).
pub const MOUNT_BASE: &str = "/run";

const PAGE: u64 = 4096;
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
/// The highest swap priority: ours is used before any other device.
const SWAP_PRIO: libc::c_int = 0x7fff;

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The swap header of a device of `pages` pages (what `mkswap` writes): the
/// first page, with version 1, the last page and the `SWAPSPACE2` signature.
pub fn swap_header(pages: u64, label: &str) -> Vec<u8> {
    let mut h = vec![0u8; PAGE as usize];
    h[1024..1028].copy_from_slice(&1u32.to_le_bytes());
    let last = u32::try_from(pages - 1).unwrap_or(u32::MAX);
    h[1028..1032].copy_from_slice(&last.to_le_bytes());
    // nr_badpages (1032..1036) stays 0; then a random uuid.
    h[1036..1052].copy_from_slice(&rand::random::<[u8; 16]>());
    let l = label.as_bytes();
    let n = l.len().min(15);
    h[1052..1052 + n].copy_from_slice(&l[..n]);
    h[PAGE as usize - 10..].copy_from_slice(b"SWAPSPACE2");
    h
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// The loop devices whose backing file is one of ours: (number, backing file).
pub fn our_loops() -> Vec<(u32, String)> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("loop")?.parse().ok()?;
            let f = fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let f = f.trim().to_string();
            let base = Path::new(f.split(" (deleted)").next()?).file_name()?;
            base.to_str()?.starts_with(PREFIX).then_some((n, f))
        })
        .collect()
}

fn loop_path(n: u32) -> String {
    format!("/dev/loop{n}")
}

/// Detaches loop device `n` (`LOOP_CLR_FD`); fine if it is already detached.
fn detach_loop(n: u32) -> Result<(), String> {
    let f = match fs::OpenOptions::new().read(true).open(loop_path(n)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("opening {}: {e}", loop_path(n))),
    };
    // SAFETY: LOOP_CLR_FD takes no argument; `f` is an open loop device.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_CLR_FD, 0) };
    let e = io::Error::last_os_error();
    if r != 0 && e.raw_os_error() != Some(libc::ENXIO) {
        return Err(format!("LOOP_CLR_FD on {}: {e}", loop_path(n)));
    }
    Ok(())
}

/// Attaches `file` to a free loop device with autoclear; returns its number and
/// the open device (autoclear detaches it once every opener has closed it).
pub(super) fn attach_loop(file: &fs::File, name: &str) -> Result<(u32, fs::File), String> {
    let ctl = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| format!("opening /dev/loop-control (loop devices): {e}"))?;
    for _ in 0..8 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(os_err("LOOP_CTL_GET_FREE"));
        }
        let n = n as u32;
        let dev = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(loop_path(n))
            .map_err(|e| format!("opening {}: {e}", loop_path(n)))?;
        // SAFETY: LOOP_SET_FD takes the backing file's descriptor, open here.
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD, file.as_raw_fd()) } != 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY) {
                continue; // taken by someone else meanwhile
            }
            return Err(os_err(&format!("LOOP_SET_FD on {}", loop_path(n))));
        }
        // SAFETY: all-zero is a valid loop_info64 (plain integers and bytes).
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        info.lo_flags = LO_FLAGS_AUTOCLEAR;
        let b = name.as_bytes();
        info.lo_file_name[..b.len().min(63)].copy_from_slice(&b[..b.len().min(63)]);
        // SAFETY: `info` is a valid loop_info64 the kernel only reads.
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64, &info) } != 0 {
            let e = os_err("LOOP_SET_STATUS64");
            let _ = detach_loop(n);
            return Err(e);
        }
        return Ok((n, dev));
    }
    Err("no free loop device after 8 tries".into())
}

fn c_path(p: &str) -> CString {
    CString::new(p).expect("device paths have no NUL")
}

fn swapoff(path: &str) -> Result<(), String> {
    // SAFETY: a NUL-terminated path; swapoff only reads it.
    if unsafe { libc::swapoff(c_path(path).as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(format!("swapoff {path}: {e}"));
        }
    }
    Ok(())
}

/// `swapon(2)` on loop device `n` at the highest priority.
pub(super) fn swapon_top(n: u32) -> Result<(), String> {
    let path = loop_path(n);
    let flags = SWAP_FLAG_PREFER | SWAP_PRIO;
    // SAFETY: NUL-terminated device path; swapon only reads it.
    if unsafe { libc::swapon(c_path(&path).as_ptr(), flags) } != 0 {
        return Err(os_err(&format!("swapon {path}")));
    }
    Ok(())
}

/// `swapoff` of loop device `n`.
pub(super) fn swapoff_loop(n: u32) -> Result<(), String> {
    swapoff(&loop_path(n))
}

/// Whether `/proc/swaps` lists `path`.
fn swap_active(path: &str) -> bool {
    fs::read_to_string("/proc/swaps")
        .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().next() == Some(path)))
}

/// The swap device and cgroup of one point.
pub struct HostSwap {
    pub name: String,
    pub file: PathBuf,
    pub loop_nr: Option<u32>,
    pub swap_on: bool,
    pub cgroup: Option<Cgroup>,
    /// The file's pages, mapped shared and mlocked (address, length).
    locked: Option<(usize, usize)>,
    /// The tmpfs mounted for the file.
    mount: Option<PathBuf>,
}

/// Mounts a tmpfs of `bytes` at `/run/<name>` (created): `noswap` where the
/// kernel knows it (6.4+), else without.
fn mount_tmpfs(name: &str, bytes: u64) -> Result<PathBuf, String> {
    let dir = Path::new(MOUNT_BASE).join(name);
    fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let target = c_path(&dir.to_string_lossy());
    let fstype = c_path("tmpfs");
    for opts in [
        format!("size={bytes},mode=0700,noswap"),
        format!("size={bytes},mode=0700"),
    ] {
        let data = c_path(&opts);
        // SAFETY: NUL-terminated strings that the kernel only reads.
        let r = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if r == 0 {
            return Ok(dir);
        }
    }
    let e = os_err(&format!("mounting a tmpfs at {}", dir.display()));
    let _ = fs::remove_dir(&dir);
    Err(e)
}

/// Unmounts (lazily) and removes a mount point of ours.
pub(super) fn unmount_dir(dir: &Path) -> Result<(), String> {
    let target = c_path(&dir.to_string_lossy());
    // SAFETY: a NUL-terminated path the kernel only reads.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
            return Err(format!("unmounting {}: {e}", dir.display()));
        }
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// The mount points of ours in /proc/self/mountinfo.
fn our_mounts() -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| {
            p.parent() == Some(Path::new(MOUNT_BASE))
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(PREFIX))
        })
        .collect()
}

/// Maps `len` bytes of `f` shared and mlocks them (unevictable while mapped).
fn lock_file(f: &fs::File, len: usize) -> Result<(usize, usize), String> {
    // SAFETY: a shared mapping of our open file at a kernel-chosen address; the
    // result is checked against MAP_FAILED. Nothing reads or writes through it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mapping the swap file to lock it"));
    }
    // SAFETY: exactly the mapping just made.
    if unsafe { libc::mlock(p, len) } != 0 {
        let e = os_err("mlock of the swap file (its pages must never be swapped)");
        // SAFETY: exactly the mapping just made; no reference into it.
        unsafe { libc::munmap(p, len) };
        return Err(e);
    }
    Ok((p as usize, len))
}

/// Whether loop device `n` has I/O in flight that does not complete (0.3 s).
pub fn loop_stuck(n: u32) -> bool {
    let read = |f: &str| fs::read_to_string(format!("/sys/block/loop{n}/{f}")).unwrap_or_default();
    let nums = |s: String| -> Vec<u64> {
        s.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let busy = || nums(read("inflight")).iter().sum::<u64>() > 0;
    // Completed reads and writes (fields 1 and 5 of the stat file).
    let done = || {
        let v = nums(read("stat"));
        v.first().copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0)
    };
    if !busy() {
        return false;
    }
    let d0 = done();
    std::thread::sleep(Duration::from_millis(300));
    busy() && done() == d0
}

fn stuck_msg(n: u32) -> String {
    format!(
        "{} has I/O that does not complete: left on (swapoff would hang); a reboot clears it",
        loop_path(n)
    )
}

impl HostSwap {
    /// Why a swap device and cgroup cannot be set up on this host, if they
    /// cannot (checked before any object is made): a line for a "skipped:"
    /// message.
    pub fn unavailable() -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("needs root (swapon, loop devices, cgroups)".into());
        }
        if !Path::new("/dev/loop-control").exists() {
            return Some("no /dev/loop-control (no loop devices)".into());
        }
        if !Path::new(MOUNT_BASE).is_dir() {
            return Some(format!("no {MOUNT_BASE} to mount a tmpfs on"));
        }
        // A swap device whose I/O never completes takes whatever is swapped to
        // it hostage (ours would share its priority): refuse to add to that.
        let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
        for dev in swaps
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
        {
            if let Some(n) = dev.strip_prefix("/dev/loop").and_then(|n| n.parse().ok()) {
                if loop_stuck(n) {
                    return Some(format!(
                        "swap device {dev} is stuck (I/O does not complete; a reboot clears \
                         it): swapping now would hang"
                    ));
                }
            }
        }
        CgroupRoot::find().err()
    }

    /// A swap device of `swap_bytes` on tmpfs and a cgroup limited to `limit`
    /// bytes, named `name`. On error, whatever was made is torn down.
    pub fn create_named(name: &str, swap_bytes: u64, limit: u64) -> Result<HostSwap, String> {
        let root = CgroupRoot::find()?;
        let pages = swap_bytes.div_ceil(PAGE).max(16);
        let dir = mount_tmpfs(name, pages * PAGE + (1 << 20))?;
        let file = dir.join(format!("{name}.swap"));
        let mut hs = HostSwap {
            name: name.to_string(),
            file,
            loop_nr: None,
            swap_on: false,
            cgroup: None,
            locked: None,
            mount: Some(dir),
        };
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&hs.file)
            .map_err(|e| format!("creating {}: {e}", hs.file.display()))?;
        let len = i64::try_from(pages * PAGE).map_err(|_| "swap size too large".to_string())?;
        // SAFETY: an open regular file; fallocate allocates its pages in tmpfs.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } != 0 {
            return Err(os_err(&format!("allocating {} MiB on tmpfs", len >> 20)));
        }
        f.write_all_at(&swap_header(pages, "mmlab-pmbench"), 0)
            .map_err(|e| format!("writing the swap header: {e}"))?;
        hs.locked = Some(lock_file(&f, len as usize)?);
        let (n, dev) = attach_loop(&f, &hs.file.to_string_lossy())?;
        hs.loop_nr = Some(n);
        drop(f);
        swapon_top(n)?;
        hs.swap_on = true;
        drop(dev); // swap holds the device now; autoclear after swapoff
        hs.cgroup = Some(Cgroup::create(&root, name, limit)?);
        Ok(hs)
    }

    /// `create_named` with a fresh name, after cleaning up leftovers.
    pub fn create(swap_bytes: u64, limit: u64) -> Result<HostSwap, String> {
        for c in clean_leftovers() {
            eprintln!("note: host swap: cleaned up a crashed run's {c}");
        }
        HostSwap::create_named(&fresh_name(), swap_bytes, limit)
    }

    /// The loop device's path.
    #[cfg(test)]
    pub fn device(&self) -> Option<String> {
        self.loop_nr.map(loop_path)
    }

    /// Tears everything down (cgroup, swapoff, loop, file); the first error.
    pub fn teardown(&mut self) -> Result<(), String> {
        let mut first = None;
        let mut note = |r: Result<(), String>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        if let Some(cg) = self.cgroup.take() {
            note(cg.remove());
            std::mem::forget(cg);
        }
        if let Some(n) = self.loop_nr.take() {
            if loop_stuck(n) {
                // Leave all of it (the file's pages stay locked too): the
                // next start reports it as a leftover it cannot remove.
                self.locked = None; // the mapping is leaked: its pages stay locked
                return Err(stuck_msg(n));
            }
            if self.swap_on {
                note(swapoff(&loop_path(n)));
                self.swap_on = false;
            }
            note(wait_detached(n));
        }
        if let Some((p, len)) = self.locked.take() {
            // SAFETY: exactly the mapping made by `lock_file`; nothing points
            // into it.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
        match fs::remove_file(&self.file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                note(Err(format!("removing {}: {e}", self.file.display())))
            }
            _ => {}
        }
        if let Some(dir) = self.mount.take() {
            note(unmount_dir(&dir));
        }
        first.map_or(Ok(()), Err)
    }
}

/// Waits (up to a second) for autoclear to detach loop `n`, then detaches it.
pub(super) fn wait_detached(n: u32) -> Result<(), String> {
    let t0 = Instant::now();
    let backing = format!("/sys/block/loop{n}/loop/backing_file");
    while Path::new(&backing).exists() && t0.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if Path::new(&backing).exists() {
        detach_loop(n)?;
    }
    Ok(())
}

impl Drop for HostSwap {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("warning: host swap teardown of {}: {e}", self.name);
        }
    }
}

/// Removes what a crashed run left: swap on our loop devices, the loop devices,
/// the tmpfs files and the cgroups whose owner pid is gone. Returns what it
/// removed, e.g. `["swap /dev/loop3", "file /dev/shm/mmlab-pmbench-12-0.swap"]`.
pub fn clean_leftovers() -> Vec<String> {
    let mut done = Vec::new();
    // Names whose loop device is stuck: everything of theirs is left alone
    // (touching the file would block on its inode lock for good).
    let mut stuck: Vec<String> = Vec::new();
    for (n, backing) in our_loops() {
        let base = Path::new(backing.split(" (deleted)").next().unwrap_or(""))
            .file_stem()
            .and_then(|b| b.to_str())
            .unwrap_or("")
            .to_string();
        if !is_leftover(&base) {
            continue;
        }
        let path = loop_path(n);
        if loop_stuck(n) {
            eprintln!("warning: host swap: a crashed run's {}", stuck_msg(n));
            stuck.push(base);
            continue;
        }
        if swap_active(&path) && swapoff(&path).is_ok() {
            done.push(format!("swap {path}"));
        }
        if wait_detached(n).is_ok() {
            done.push(format!("loop {path}"));
        }
    }
    let dead = |name: &str| is_leftover(name) && !stuck.iter().any(|s| s == name);
    for m in our_mounts() {
        let name = m.file_name().map(|n| n.to_string_lossy().to_string());
        if name.as_deref().is_some_and(dead) && unmount_dir(&m).is_ok() {
            done.push(format!("tmpfs {}", m.display()));
        }
    }
    // Mount points whose tmpfs is gone already.
    if let Ok(dir) = fs::read_dir(MOUNT_BASE) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if dead(&name) && fs::remove_dir(e.path()).is_ok() {
                done.push(format!("directory {}", e.path().display()));
            }
        }
    }
    done.extend(cgroup::clean_leftovers(dead));
    done
}

/// Why a kernel peer that needs host swap did not run (`opted_in` false).
pub const NOT_OPTED_IN: &str = "at quick sizes (--quick, or scaled down to fit the memory \
     budget) it would turn swap on for the whole host for a short run (set MMLAB_HOST_SWAP=1 to run it)";

/// Whether host-changing swap runs outside a full lab run were asked for
/// (`MMLAB_HOST_SWAP=1`): the quick run (CI) and the tests that set up a swap
/// device on the host run only then. A swap device on the host is shared with
/// everything else it runs, and a wedged one cannot be taken down without a
/// reboot, so nothing turns one on unless a person asked for it.
pub fn opted_in() -> bool {
    std::env::var_os("MMLAB_HOST_SWAP").is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_header_is_mkswaps() {
        let h = swap_header(100, "mmlab-pmbench");
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_le_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(h[1028..1032].try_into().unwrap()), 99);
    }

    /// Sets up and tears down a small device and cgroup, then simulates a
    /// crash (objects of a dead pid, never torn down) and cleans them up.
    #[test]
    fn setup_teardown_and_leftovers() {
        if !opted_in() {
            eprintln!("skipped: set MMLAB_HOST_SWAP=1 to set up swap on this host");
            return;
        }
        if let Some(why) = HostSwap::unavailable() {
            eprintln!("skipped: host swap unavailable: {why}");
            return;
        }
        let mut hs = HostSwap::create_named(&fresh_name(), 4 << 20, 8 << 20).unwrap();
        let dev = hs.device().unwrap();
        assert!(swap_active(&dev), "{dev} not in /proc/swaps");
        assert!(hs.file.exists());
        assert!(cgroup::exists(&hs.name));
        // A short-lived process moved in, then gone before the cgroup goes.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        hs.cgroup.as_ref().unwrap().add(sleeper.id()).unwrap();
        let procs = fs::read_to_string(hs.cgroup.as_ref().unwrap().dir.join("cgroup.procs"));
        assert!(procs.unwrap().contains(&sleeper.id().to_string()));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        let name = hs.name.clone();
        hs.teardown().unwrap();
        assert!(!swap_active(&dev));
        assert!(!hs.file.exists());
        assert!(!cgroup::exists(&name));
        assert!(our_loops().iter().all(|(_, f)| !f.contains(&name)));

        // A "crashed" run: pid 4194303 (above the default pid_max) is not alive.
        let dead = format!("{PREFIX}4194303-{}", std::process::id());
        let mut crashed = HostSwap::create_named(&dead, 4 << 20, 8 << 20).unwrap();
        let dev = crashed.device().unwrap();
        let file = crashed.file.clone();
        // Forget it without teardown, as a crash would.
        if let Some(cg) = crashed.cgroup.take() {
            std::mem::forget(cg);
        }
        std::mem::forget(crashed);
        let cleaned = clean_leftovers();
        assert!(cleaned.contains(&format!("swap {dev}")), "{cleaned:?}");
        assert!(!swap_active(&dev));
        assert!(!file.exists(), "{cleaned:?}");
        assert!(!cgroup::exists(&dead), "{cleaned:?}");
        assert!(our_loops().iter().all(|(_, f)| !f.contains(&dead)));
    }
}
