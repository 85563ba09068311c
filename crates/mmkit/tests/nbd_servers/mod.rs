//! Real NBD servers for the tests: nbdkit (memory plugin, error and delay
//! filters, an `nbd` proxy), nbd-server and qemu-storage-daemon, each on a
//! Unix socket in a temporary directory, started in the foreground (nbdkit
//! with `-P pidfile --exit-with-parent`), stopped by pid, socket removed.
//! A server that is not installed makes `None`, and the test says it skips.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Is `prog` on the PATH?
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Prints why a test skips.
pub fn skip(test: &str, prog: &str) {
    eprintln!(
        "{test}: SKIPPED: {prog} is not installed (apt-get install nbdkit nbd-server qemu-utils)"
    );
}

/// One server process.
pub struct Server {
    child: Option<Child>,
    pub sock: PathBuf,
    pidfile: Option<PathBuf>,
    cmd: Vec<String>,
}

fn wait_for(p: &Path, what: &str) {
    let t0 = Instant::now();
    while !p.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: {} did not appear",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `sock` is listening. Its file appears at bind(2), before
/// listen(2), so a swapon racing the server's start could be refused; a probe
/// connection is no way to ask, as nbd-server without forking serves only one
/// client. /proc/net/unix shows the listening flag (`__SO_ACCEPTCON`).
fn wait_listening(sock: &Path, what: &str) {
    let path = sock.to_str().unwrap();
    let t0 = Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        let listening = table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[7] == path && f[3] == "00010000"
        });
        if listening || !Path::new("/proc/net/unix").exists() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: {path} is not listening"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl Server {
    /// nbdkit with `args` (filters, plugin, parameters) on `dir/name.sock`.
    pub fn nbdkit(dir: &Path, name: &str, args: &[&str]) -> Server {
        let sock = dir.join(format!("{name}.sock"));
        let pid = dir.join(format!("{name}.pid"));
        let mut cmd: Vec<String> = [
            "nbdkit",
            "-f",
            "--exit-with-parent",
            "-P",
            pid.to_str().unwrap(),
            "-U",
            sock.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cmd.extend(args.iter().map(|s| s.to_string()));
        let mut s = Server {
            child: None,
            sock,
            pidfile: Some(pid),
            cmd,
        };
        s.start();
        s
    }

    /// nbd-server serving a `bytes`-long file in `dir` as export `swap`.
    pub fn nbd_server(dir: &Path, bytes: u64) -> Server {
        let img = dir.join("nbd-server.img");
        std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
        let sock = dir.join("nbd-server.sock");
        let conf = dir.join("nbd-server.conf");
        std::fs::write(
            &conf,
            format!(
                "[generic]\n    unixsock = {}\n[swap]\n    exportname = {}\n    filesize = {bytes}\n",
                sock.display(),
                img.display()
            ),
        )
        .unwrap();
        // -d: no daemon; it serves one connection, which is all a test needs.
        let cmd = ["nbd-server", "-C", conf.to_str().unwrap(), "-d"];
        let mut s = Server {
            child: None,
            sock,
            pidfile: None,
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
        };
        s.start();
        s
    }

    /// qemu-storage-daemon exporting a `bytes`-long raw file as `swap`.
    pub fn qemu(dir: &Path, bytes: u64) -> Server {
        let img = dir.join("qsd.img");
        std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
        let sock = dir.join("qsd.sock");
        let pid = dir.join("qsd.pid");
        let cmd = vec![
            "qemu-storage-daemon".to_string(),
            "--blockdev".into(),
            format!("driver=file,node-name=f,filename={}", img.display()),
            "--nbd-server".into(),
            format!("addr.type=unix,addr.path={}", sock.display()),
            "--export".into(),
            "type=nbd,id=e,node-name=f,name=swap,writable=on".into(),
            "--pidfile".into(),
            pid.display().to_string(),
        ];
        let mut s = Server {
            child: None,
            sock,
            pidfile: Some(pid),
            cmd,
        };
        s.start();
        s
    }

    /// The URI of export `export`.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    pub fn start(&mut self) {
        assert!(self.child.is_none());
        let _ = std::fs::remove_file(&self.sock);
        if let Some(p) = &self.pidfile {
            let _ = std::fs::remove_file(p);
        }
        let child = Command::new(&self.cmd[0])
            .args(&self.cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.cmd[0]));
        self.child = Some(child);
        match &self.pidfile {
            Some(p) => wait_for(p, &self.cmd[0]),
            None => wait_for(&self.sock, &self.cmd[0]),
        }
        wait_for(&self.sock, &self.cmd[0]);
        wait_listening(&self.sock, &self.cmd[0]);
    }

    /// Stops the server by its pid and removes its socket.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid, which it still holds
            // (not reaped before the wait below).
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.sock);
    }

    pub fn restart(&mut self) {
        self.stop();
        self.start();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
