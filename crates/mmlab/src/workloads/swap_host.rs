//! The host side of `pmbench`'s `kernel` variant: a RAM-backed swap device and a
//! memory cgroup on this machine, set up for one point and torn down after it.
//!
//! - a file on a tmpfs of its own, mounted for the point at `/run/<name>` (with
//!   `noswap` where the kernel has it; never the shared `/dev/shm`, whose
//!   directory lock a stuck device would take hostage), allocated in full up front (so that swap-out
//!   never allocates tmpfs pages, and they are charged to the lab, not to the
//!   cgroup) and mlocked through a shared mapping for as long as it is a swap
//!   device, with a swap header written here (no `mkswap` needed). The mlock is
//!   essential: tmpfs pages are swappable, and a page of the device's own file
//!   swapped out to the device deadlocks the loop worker that must write it
//!   (it waits for the page's writeback, which is queued behind itself);
//! - a loop device over it (the `LOOP_CTL_GET_FREE` / `LOOP_SET_FD` ioctls, with
//!   autoclear, so it detaches when its last user closes it);
//! - `swapon(2)` on the loop device at the highest priority;
//! - a memory cgroup limited to the arena's size: v1 (`memory.limit_in_bytes`,
//!   swap left unlimited) or v2 (`memory.max`, `memory.swap.max = max`).
//!
//! Invariants: every object is named `mmlab-pmbench-<pid>-<n>` (file, loop
//! backing file, cgroup), where `<pid>` is the lab process that made it, so that
//! `clean_leftovers` can remove what a crashed run left behind (objects whose
//! pid is no longer alive) without touching a concurrent run's. `HostSwap::drop`
//! tears down in reverse order: cgroup, swapoff, loop detach, unlock, file. A
//! loop device whose I/O no longer completes is never swapped off (that would
//! hang in the kernel for good): it is left with a message instead.

use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The prefix of every object's name.
pub const PREFIX: &str = "mmlab-pmbench-";
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

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Removes the (empty) cgroup, waiting up to a second for exiting tasks.
    pub fn remove(&self) -> Result<(), String> {
        remove_cgroup_dir(&self.dir)
    }
}

fn remove_cgroup_dir(dir: &Path) -> Result<(), String> {
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
            eprintln!("warning: pmbench kernel: {e}");
        }
    }
}

/// A fresh name for this process's objects.
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
fn is_leftover(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// The swap header of a device of `pages` pages (what `mkswap` writes): the
/// first page, with version 1, the last page and the `SWAPSPACE2` signature.
pub fn swap_header(pages: u64, label: &str) -> Vec<u8> {
    let mut h = vec![0u8; PAGE as usize];
    h[1024..1028].copy_from_slice(&1u32.to_le_bytes());
    let last = u32::try_from(pages - 1).unwrap_or(u32::MAX);
    h[1028..1032].copy_from_slice(&last.to_le_bytes());
    // nr_badpages (1032..1036) stays 0; a uuid from the clock and the pid.
    let seed = super::host::now_ns() ^ u64::from(std::process::id()) << 32;
    let mut rng = super::XorShift::new(seed);
    for chunk in h[1036..1052].chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
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
fn attach_loop(file: &fs::File, name: &str) -> Result<(u32, fs::File), String> {
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
fn unmount_dir(dir: &Path) -> Result<(), String> {
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
    /// Why the kernel variant cannot run here, if it cannot (checked before any
    /// object is made).
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
        let path = loop_path(n);
        let flags = SWAP_FLAG_PREFER | SWAP_PRIO;
        // SAFETY: NUL-terminated device path; swapon only reads it.
        if unsafe { libc::swapon(c_path(&path).as_ptr(), flags) } != 0 {
            return Err(os_err(&format!("swapon {path}")));
        }
        hs.swap_on = true;
        drop(dev); // swap holds the device now; autoclear after swapoff
        hs.cgroup = Some(Cgroup::create(&root, name, limit)?);
        Ok(hs)
    }

    /// `create_named` with a fresh name, after cleaning up leftovers.
    pub fn create(swap_bytes: u64, limit: u64) -> Result<HostSwap, String> {
        for c in clean_leftovers() {
            eprintln!("note: pmbench kernel: cleaned up a crashed run's {c}");
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
fn wait_detached(n: u32) -> Result<(), String> {
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
            eprintln!("warning: pmbench kernel teardown of {}: {e}", self.name);
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
            eprintln!("warning: pmbench kernel: a crashed run's {}", stuck_msg(n));
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

/// Writes one line to `w` and flushes it (the child protocol).
pub fn send_line(w: &mut impl Write, line: &str) -> io::Result<()> {
    w.write_all(line.as_bytes())?;
    w.write_all(b"\n")?;
    w.flush()
}

/// Whether host-changing swap runs outside a full lab run were asked for
/// (`MMLAB_HOST_SWAP=1`): the quick run (CI) and the tests that set up a swap
/// device on the host run only then. A swap device on the host is shared with
/// everything else it runs, and a wedged one cannot be taken down without a
/// reboot, so nothing turns one on unless a person asked for it.
pub fn host_swap_opted_in() -> bool {
    std::env::var_os("MMLAB_HOST_SWAP").is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_headers() {
        let n = fresh_name();
        assert_eq!(owner_pid(&n), Some(std::process::id()));
        assert_eq!(owner_pid("mmlab-pmbench-42-7.swap"), Some(42));
        assert_eq!(owner_pid("other-42-7"), None);
        assert!(!is_leftover(&n), "our own objects are not leftovers");
        let h = swap_header(100, "mmlab-pmbench");
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_le_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(h[1028..1032].try_into().unwrap()), 99);
        assert_eq!(
            parse_vmstat_swap("pgfault 5\npswpin 12\npswpout 34\nx 1\n"),
            (12, 34)
        );
    }

    fn cgroup_dirs(name: &str) -> bool {
        CgroupRoot::find().is_ok_and(|r| r.dir().join(name).exists())
    }

    /// Sets up and tears down a small device and cgroup, then simulates a
    /// crash (objects of a dead pid, never torn down) and cleans them up.
    #[test]
    fn setup_teardown_and_leftovers() {
        if !super::host_swap_opted_in() {
            eprintln!("skipped: set MMLAB_HOST_SWAP=1 to set up swap on this host");
            return;
        }
        if let Some(why) = HostSwap::unavailable() {
            eprintln!("skipped: pmbench kernel resources unavailable: {why}");
            return;
        }
        let mut hs = HostSwap::create_named(&fresh_name(), 4 << 20, 8 << 20).unwrap();
        let dev = hs.device().unwrap();
        assert!(swap_active(&dev), "{dev} not in /proc/swaps");
        assert!(hs.file.exists());
        assert!(cgroup_dirs(&hs.name));
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
        assert!(!cgroup_dirs(&name));
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
        assert!(!cgroup_dirs(&dead), "{cleaned:?}");
        assert!(our_loops().iter().all(|(_, f)| !f.contains(&dead)));
    }
}
