//! NBD on this host for `pmbench`'s NBD variants: an nbdkit server (memory
//! plugin) on a Unix socket, and for the kernel peer a swap device that reaches
//! it through a loop device over a file that nbdfuse (libnbd) exposes in a FUSE
//! mount (the host kernel has no nbd driver).
//!
//! - `Nbdkit`: `nbdkit -f --exit-with-parent -P DIR/nbdkit.pid` with
//!   `-U DIR/nbdkit.sock memory size=BYTES`, in a directory of its own
//!   (`TMP/mmlab-pmbench-PID-N`); stopped by its pid, socket and directory
//!   removed on drop;
//! - `NbdHostSwap`: such a server, `nbdfuse -P DIR/nbdfuse.pid` with
//!   `DIR/fuse/NAME.swap --unix DIR/nbdkit.sock`, a swap header written
//!   through the FUSE file, a loop device over it (`super::swap`'s, autoclear),
//!   `swapon(2)` at the highest priority, and a memory cgroup. `teardown` (or
//!   drop) goes in reverse: cgroup, swapoff, loop detach, FUSE unmount, nbdfuse,
//!   nbdkit, directory.
//!
//! Invariants: every directory is named by `super::fresh_name`, so that
//! `clean_leftovers` (run at each start) kills the servers, unmounts the FUSE
//! mounts and removes the directories of a crashed run (owner pid gone), and
//! never a live run's; the loop device and its swap are `super::swap`'s
//! leftovers (the FUSE file's name carries the prefix) and go first. A server
//! is killed only if its pid file names a live process whose command is the
//! expected one (`nbdkit`, `nbdfuse`).
//! Locking: none (one owner each).

use super::cgroup::{Cgroup, CgroupRoot};
use super::swap::{self, swap_header};
use super::{fresh_name, is_leftover, PREFIX};
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to show its socket or file.
const START_LIMIT: Duration = Duration::from_secs(10);

/// Is `prog` on the PATH?
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(prog);
            f.is_file()
        })
    })
}

/// Why the mmkit NBD variant cannot run here, if it cannot.
pub fn nbdkit_unavailable() -> Option<String> {
    (!have("nbdkit")).then(|| "nbdkit is not installed (apt-get install nbdkit)".to_string())
}

fn wait_for(p: &Path, what: &str, child: &mut Child) -> Result<(), String> {
    let t0 = Instant::now();
    while !p.exists() {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!(
                "{what} exited ({st}) before {} appeared",
                p.display()
            ));
        }
        if t0.elapsed() > START_LIMIT {
            return Err(format!("{what}: {} did not appear in 10 s", p.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn kill_child(c: &mut Child) {
    // SAFETY: kill(2) on our own child's pid, not reaped yet (waited below).
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
}

/// An nbdkit memory server in a directory of its own.
pub struct Nbdkit {
    pub dir: PathBuf,
    pub sock: PathBuf,
    child: Option<Child>,
}

impl Nbdkit {
    /// Starts `nbdkit memory size=<bytes>` on `<dir>/nbdkit.sock`, `dir` made
    /// here (removed again if the start fails).
    pub fn start_in(dir: PathBuf, bytes: u64) -> Result<Nbdkit, String> {
        if let Some(why) = nbdkit_unavailable() {
            return Err(why);
        }
        fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let sock = dir.join("nbdkit.sock");
        let pid = dir.join("nbdkit.pid");
        let mut s = Nbdkit {
            dir,
            sock,
            child: None,
        };
        let mut child = Command::new("nbdkit")
            .arg("-f")
            .arg("--exit-with-parent")
            .arg("-P")
            .arg(&pid)
            .arg("-U")
            .arg(&s.sock)
            .arg("memory")
            .arg(format!("size={bytes}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting nbdkit: {e}"))?;
        let r = wait_for(&pid, "nbdkit", &mut child)
            .and_then(|()| wait_for(&s.sock, "nbdkit", &mut child));
        s.child = Some(child);
        r.map(|()| s)
    }

    /// `start_in` a fresh directory under the temporary directory, after
    /// cleaning up a crashed run's leftovers.
    pub fn start(bytes: u64) -> Result<Nbdkit, String> {
        for c in clean_leftovers() {
            eprintln!("note: nbd: cleaned up a crashed run's {c}");
        }
        Nbdkit::start_in(std::env::temp_dir().join(fresh_name()), bytes)
    }

    /// The export's URI (nbdkit serves one export under any name).
    pub fn uri(&self) -> String {
        format!("nbd+unix:///swap?socket={}", self.sock.display())
    }

    /// Stops the server by its pid, removes its socket and directory.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_child(&mut c);
        }
        let _ = fs::remove_file(&self.sock);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why the kernel's NBD swap cannot be set up here, if it cannot.
pub fn host_nbd_swap_unavailable() -> Option<String> {
    if let Some(why) = swap::HostSwap::unavailable() {
        return Some(why);
    }
    if let Some(why) = nbdkit_unavailable() {
        return Some(why);
    }
    if !have("nbdfuse") {
        return Some("nbdfuse is not installed (apt-get install libnbd-bin)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse (FUSE)".into());
    }
    None
}

/// The kernel's swap to nbdkit: loop -> nbdfuse -> nbdkit, and a cgroup.
pub struct NbdHostSwap {
    pub name: String,
    server: Option<Nbdkit>,
    fuse: Option<(PathBuf, Child)>,
    loop_nr: Option<u32>,
    swap_on: bool,
    pub cgroup: Option<Cgroup>,
}

impl NbdHostSwap {
    /// A swap device of `swap_bytes` on nbdkit and a cgroup limited to `limit`
    /// bytes. Cleans up leftovers first; on error, whatever was made is torn
    /// down.
    pub fn create(swap_bytes: u64, limit: u64) -> Result<NbdHostSwap, String> {
        for c in swap::clean_leftovers().into_iter().chain(clean_leftovers()) {
            eprintln!("note: nbd host swap: cleaned up a crashed run's {c}");
        }
        let root = CgroupRoot::find()?;
        let name = fresh_name();
        let pages = swap_bytes.div_ceil(4096).max(16);
        let dir = std::env::temp_dir().join(&name);
        let mut hs = NbdHostSwap {
            name: name.clone(),
            server: Some(Nbdkit::start_in(dir.clone(), pages * 4096)?),
            fuse: None,
            loop_nr: None,
            swap_on: false,
            cgroup: None,
        };
        let mnt = dir.join("fuse");
        fs::create_dir(&mnt).map_err(|e| format!("creating {}: {e}", mnt.display()))?;
        let file = mnt.join(format!("{name}.swap"));
        let sock = hs
            .server
            .as_ref()
            .map(|s| s.sock.clone())
            .unwrap_or_default();
        let mut child = Command::new("nbdfuse")
            .arg("-P")
            .arg(dir.join("nbdfuse.pid"))
            .arg(&file)
            .arg("--unix")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting nbdfuse: {e}"))?;
        let r = wait_for(&file, "nbdfuse", &mut child);
        hs.fuse = Some((mnt, child));
        r?;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .map_err(|e| format!("opening {}: {e}", file.display()))?;
        f.write_all_at(&swap_header(pages, "mmlab-pmbench"), 0)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("writing the swap header through nbdfuse: {e}"))?;
        let (n, dev) = swap::attach_loop(&f, &file.to_string_lossy())?;
        hs.loop_nr = Some(n);
        drop(f);
        swap::swapon_top(n)?;
        hs.swap_on = true;
        drop(dev);
        hs.cgroup = Some(Cgroup::create(&root, &name, limit)?);
        Ok(hs)
    }

    /// Tears everything down; the first error.
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
            if swap::loop_stuck(n) {
                // Leave it all: killing the server would lose the pages, and
                // swapoff would hang; the next start reports it.
                std::mem::forget(self.server.take());
                std::mem::forget(self.fuse.take());
                return Err(format!(
                    "/dev/loop{n} (over nbdfuse) has I/O that does not complete: left on"
                ));
            }
            if self.swap_on {
                note(swap::swapoff_loop(n));
                self.swap_on = false;
            }
            note(swap::wait_detached(n));
        }
        if let Some((mnt, mut child)) = self.fuse.take() {
            note(swap::unmount_dir(&mnt));
            kill_child(&mut child);
        }
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for NbdHostSwap {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("warning: nbd host swap teardown of {}: {e}", self.name);
        }
    }
}

/// Kills the process named in `pidfile` if it is alive and runs `comm`.
fn kill_by_pidfile(pidfile: &Path, comm: &str) -> bool {
    let Some(pid) = fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return false;
    };
    let c = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if c.trim() != comm {
        return false;
    }
    // SAFETY: kill(2) on a pid checked just above to run `comm`.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

/// Removes what a crashed run left under the temporary directory: FUSE mounts,
/// nbdfuse and nbdkit processes, directories. Returns what it removed.
pub fn clean_leftovers() -> Vec<String> {
    let mut done = Vec::new();
    let Ok(dir) = fs::read_dir(std::env::temp_dir()) else {
        return done;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with(PREFIX) || !is_leftover(&name) {
            continue;
        }
        let d = e.path();
        let mnt = d.join("fuse");
        if (mnt.is_dir() || is_mounted(&mnt)) && swap::unmount_dir(&mnt).is_ok() {
            done.push(format!("FUSE mount {}", mnt.display()));
        }
        for (pidfile, comm) in [("nbdfuse.pid", "nbdfuse"), ("nbdkit.pid", "nbdkit")] {
            if kill_by_pidfile(&d.join(pidfile), comm) {
                done.push(format!("{comm} of {}", d.display()));
            }
        }
        if fs::remove_dir_all(&d).is_ok() {
            done.push(format!("directory {}", d.display()));
        }
    }
    done
}

fn is_mounted(p: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = p.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&*p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server starts, serves a socket, and leaves nothing when dropped; a
    /// crashed run's directory is cleaned up.
    #[test]
    fn nbdkit_starts_and_stops() {
        if let Some(why) = nbdkit_unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
        let s = Nbdkit::start(4 << 20).unwrap();
        assert!(s.sock.exists());
        let dir = s.dir.clone();
        drop(s);
        assert!(!dir.exists());
        // A crashed run's directory: pid 4194303 is never alive.
        let dead = std::env::temp_dir().join(format!("{PREFIX}4194303-{}", std::process::id()));
        let mut s = Nbdkit::start_in(dead.clone(), 4 << 20).unwrap();
        let c = s.child.take();
        let cleaned = clean_leftovers();
        assert!(!dead.exists(), "{cleaned:?}");
        assert!(
            cleaned.iter().any(|c| c.starts_with("nbdkit")),
            "{cleaned:?}"
        );
        if let Some(mut c) = c {
            let _ = c.wait();
        }
    }
}
