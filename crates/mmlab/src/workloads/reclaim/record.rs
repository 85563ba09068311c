//! `mmlab trace record [--out FILE] -- PROGRAM ARGS...`: runs a program under
//! valgrind's lackey (`--tool=lackey --trace-mem=yes`) and turns its data
//! references into a trace file (`trace`'s format): page-granular, pages
//! numbered densely in first-touch order, one record per run of consecutive
//! references to one page (a write if any of them stored).
//!
//! Lackey's log goes through a FIFO (`--log-file`), so the program's own
//! stdout and stderr stay its own, and is parsed as it streams: the trace is
//! never held in memory, only the page-number map (16 bytes per page).
//! Instruction fetches (`I` lines) are left out: code is file-backed, and
//! anonymous reclaim is what `reclaim` replays. A reference that crosses a page
//! boundary touches both pages.

use super::trace::{Header, TraceWriter};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Exit status of `trace record` when it skips (valgrind missing): the
/// test-suite convention for "skipped".
pub const SKIPPED: i32 = 77;

/// Turns lackey's log lines into trace records.
pub struct LackeyParser {
    pages: HashMap<u64, u64>,
    last: Option<(u64, bool)>,
    pub lines: u64,
    pub refs: u64,
}

impl Default for LackeyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl LackeyParser {
    pub fn new() -> LackeyParser {
        LackeyParser {
            pages: HashMap::new(),
            last: None,
            lines: 0,
            refs: 0,
        }
    }

    fn dense(&mut self, vpn: u64) -> u64 {
        let n = self.pages.len() as u64;
        *self.pages.entry(vpn).or_insert(n)
    }

    fn touch(&mut self, vpn: u64, write: bool, w: &mut TraceWriter) -> std::io::Result<()> {
        let page = self.dense(vpn);
        match &mut self.last {
            Some((p, wr)) if *p == page => *wr |= write,
            last => {
                if let Some((p, wr)) = last.take() {
                    w.push(p, wr)?;
                }
                *last = Some((page, write));
            }
        }
        Ok(())
    }

    /// One line of lackey's log: ` L addr,size`, ` S ...`, ` M ...` are data
    /// references; anything else (instructions, valgrind's messages) is skipped.
    pub fn line(&mut self, l: &str, w: &mut TraceWriter) -> std::io::Result<()> {
        self.lines += 1;
        let b = l.as_bytes();
        if b.len() < 4 || b[0] != b' ' || b[2] != b' ' {
            return Ok(());
        }
        let write = match b[1] {
            b'L' => false,
            b'S' | b'M' => true,
            _ => return Ok(()),
        };
        let Some((addr, size)) = l[3..].trim().split_once(',') else {
            return Ok(());
        };
        let (Ok(addr), Ok(size)) = (u64::from_str_radix(addr, 16), size.parse::<u64>()) else {
            return Ok(());
        };
        self.refs += 1;
        let first = addr >> 12;
        let last = (addr + size.max(1) - 1) >> 12;
        for vpn in first..=last.min(first + 1) {
            self.touch(vpn, write, w)?;
        }
        Ok(())
    }

    /// Writes the pending record.
    pub fn flush(&mut self, w: &mut TraceWriter) -> std::io::Result<()> {
        if let Some((p, wr)) = self.last.take() {
            w.push(p, wr)?;
        }
        Ok(())
    }
}

/// Whether valgrind can be run, and why not.
pub fn valgrind_missing() -> Option<String> {
    match Command::new("valgrind").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!("`valgrind --version` failed ({})", o.status)),
        Err(e) => Some(format!(
            "valgrind cannot be run ({e}); on Debian: apt-get install valgrind"
        )),
    }
}

/// Records `program args` into `out`; returns the header written.
pub fn record(out: &Path, program: &[String]) -> anyhow::Result<Header> {
    let dir = std::env::temp_dir().join(format!("mmlab-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let fifo = dir.join("lackey.fifo");
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes())?;
    // SAFETY: a NUL-terminated path the kernel only reads.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        let e = std::io::Error::last_os_error();
        let _ = std::fs::remove_dir(&dir);
        anyhow::bail!("mkfifo {}: {e}", fifo.display());
    }
    let r = record_through(&fifo, out, program);
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_dir(&dir);
    r
}

fn record_through(fifo: &PathBuf, out: &Path, program: &[String]) -> anyhow::Result<Header> {
    let mut child = Command::new("valgrind")
        .arg("--tool=lackey")
        .arg("--trace-mem=yes")
        .arg(format!("--log-file={}", fifo.display()))
        .args(program)
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting valgrind: {e}"))?;
    // Opening the FIFO waits for valgrind to open its end; if valgrind dies
    // first, that open would wait for good: a watcher opens it for writing.
    let f = {
        let p = fifo.clone();
        let pid = child.id();
        std::thread::spawn(move || {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            // Unblocks a reader still waiting in open (gives it EOF).
            let _ = std::fs::OpenOptions::new().write(true).open(&p);
        });
        std::fs::File::open(fifo)?
    };
    let mut w = TraceWriter::create(out)?;
    let mut p = LackeyParser::new();
    for line in BufReader::with_capacity(1 << 20, f).lines() {
        p.line(&line?, &mut w)?;
    }
    p.flush(&mut w)?;
    let status = child.wait()?;
    let h = w.finish()?;
    if !status.success() {
        anyhow::bail!("the program under valgrind exited with {status}");
    }
    eprintln!(
        "trace record: {} lackey lines, {} data references -> {} records over {} pages \
         ({} MiB) in {}",
        p.lines,
        p.refs,
        h.records,
        h.footprint,
        h.footprint >> 8,
        out.display()
    );
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::super::trace::{FileSource, Source};
    use super::*;

    #[test]
    fn lackey_lines_become_dense_page_runs() {
        let dir = std::env::temp_dir().join(format!("mmlab-lackey-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.mmtrace");
        let mut w = TraceWriter::create(&path).unwrap();
        let mut p = LackeyParser::new();
        let log = "==1== Lackey\nI  0401ab70,3\n L 7000,8\n S 7008,8\n L 3000,4\n \
                   M 3ffe,4\nnot a line\n L zz,4\n L 7000,8\n";
        for l in log.lines() {
            p.line(l, &mut w).unwrap();
        }
        p.flush(&mut w).unwrap();
        let h = w.finish().unwrap();
        // Pages: 0x7 -> 0, 0x3 -> 1, 0x4 -> 2. Records: 0(w: a store in the
        // run), 1 (the M at 3ffe starts in page 3: same run, write), 2 (w),
        // 0 (r).
        assert_eq!(p.refs, 5);
        assert_eq!((h.footprint, h.records), (3, 4));
        let mut src = FileSource::open(&path, 2).unwrap();
        let mut buf = Vec::new();
        src.fill(&mut buf, 100).unwrap();
        use super::super::trace::Event::*;
        assert_eq!(
            buf,
            vec![
                Measure(true),
                Touch {
                    page: 0,
                    write: true
                },
                Touch {
                    page: 1,
                    write: true
                },
                Touch {
                    page: 2,
                    write: true
                },
                Touch {
                    page: 0,
                    write: false
                },
                Measure(false),
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn records_a_real_program_or_says_why_not() {
        if let Some(why) = valgrind_missing() {
            eprintln!("skipped: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!("mmlab-rec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("true.mmtrace");
        let h = record(&out, &["/bin/true".to_string()]).unwrap();
        assert!(h.records > 0 && h.footprint > 0, "{h:?}");
        assert_eq!(
            super::super::trace::file_header(&out).unwrap(),
            h,
            "the header on disk"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
