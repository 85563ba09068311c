//! A child process of the lab (this binary again, under a hidden subcommand)
//! driven by one text line per message: the parent writes lines to the child's
//! stdin, the child answers on its stdout. The messages themselves belong to the
//! workload; this file is the plumbing both sides share.
//!
//! Everything is bounded: the parent waits for each line with a timeout
//! (`ChildProc::expect`) and kills the child when dropped; a child that cannot
//! be reaped (a thread stuck in the kernel, D state) is left with a warning
//! rather than hanging the lab. The child dies with the parent
//! (`PR_SET_PDEATHSIG`) and exits on its own at its deadline (`child_setup`).

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a killed child may take to be reaped.
const REAP_LIMIT: Duration = Duration::from_secs(5);

/// Writes one line to `w` and flushes it.
pub fn send_line(w: &mut impl Write, line: &str) -> io::Result<()> {
    w.write_all(line.as_bytes())?;
    w.write_all(b"\n")?;
    w.flush()
}

/// The child's side, first thing in its `main`: die with the parent
/// (`PR_SET_PDEATHSIG`), and exit (status 3) once `deadline` has passed,
/// whatever it is doing. `name` is for its message.
pub fn child_setup(name: &'static str, deadline: Duration) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; no memory involved.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        eprintln!(
            "{name}: deadline of {} ms reached, exiting",
            deadline.as_millis()
        );
        std::process::exit(3);
    });
}

/// The mmlab binary to run a child from: this executable, or (under `cargo
/// test`, whose executable is the test harness) the `mmlab` binary beside it.
pub fn child_exe() -> Result<PathBuf, String> {
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

/// A running child with piped stdin and stdout; killed and reaped (within
/// bounds) when dropped.
pub struct ChildProc {
    child: Child,
    reaped: bool,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Who runs it, for messages ("pmbench kernel").
    label: &'static str,
}

impl ChildProc {
    /// Starts `exe args..` with piped stdin and stdout (stderr inherited).
    pub fn spawn(exe: &Path, args: &[String], label: &'static str) -> Result<ChildProc, String> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        let stdin = child.stdin.take();
        let out = child.stdout.take();
        let mut p = ChildProc {
            child,
            reaped: false,
            stdin,
            lines: unbounded().1,
            label,
        };
        let out = out.ok_or("the child has no stdout pipe")?;
        if p.stdin.is_none() {
            return Err("the child has no stdin pipe".into());
        }
        // The child's stdout as a channel of lines (a reader thread that ends
        // with it).
        let (tx, rx) = unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        p.lines = rx;
        Ok(p)
    }

    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` to the child.
    pub fn tell(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("the child's stdin is closed")?;
        send_line(stdin, line).map_err(|e| format!("writing {line:?} to the child: {e}"))
    }

    /// Closes the child's stdin (end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next line from the child, which must start with `prefix`, within
    /// `limit`.
    pub fn expect(&self, prefix: &str, limit: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(limit) {
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

    /// Whether the child wrote a line not read yet.
    pub fn has_output(&self) -> bool {
        !self.lines.is_empty()
    }

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
    pub fn finish(&mut self, limit: Duration) {
        if !self.reap(limit) {
            let _ = self.child.kill();
            if !self.reap(REAP_LIMIT) {
                eprintln!(
                    "warning: {}: child {} does not exit (stuck in the kernel); left",
                    self.label,
                    self.child.id()
                );
            }
        }
    }

    /// Whether the child is still running.
    pub fn alive(&mut self) -> bool {
        !self.reap(Duration::ZERO)
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.finish(Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cat` echoes the protocol back: lines go both ways, end of input ends
    /// it, and every wait is bounded.
    #[test]
    fn lines_both_ways_and_bounded_waits() {
        let Ok(mut c) = ChildProc::spawn(Path::new("cat"), &[], "test") else {
            eprintln!("skipped: no cat");
            return;
        };
        assert!(c.alive());
        c.tell("ready 1").unwrap();
        assert_eq!(
            c.expect("ready", Duration::from_secs(5)).unwrap(),
            "ready 1"
        );
        c.tell("other").unwrap();
        let e = c.expect("ready", Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("expected"), "{e}");
        let e = c.expect("x", Duration::from_millis(20)).unwrap_err();
        assert!(e.contains("within"), "{e}");
        c.close_stdin();
        assert!(c.tell("late").is_err());
        c.finish(Duration::from_secs(5));
        assert!(!c.alive());
        let e = c.expect("x", Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("exited"), "{e}");
    }
}
