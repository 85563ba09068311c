//! NBD swap device figures against nbdkit's memory plugin on a Unix socket:
//! 4 KiB reads with 1 and 16 requests in flight, 64 in flight with
//! `delay-read=1ms`, latency percentiles; then a swap loop through an `Mm`
//! with `error-rate=1%` and connection cuts (a restarted `nbdkit nbd` proxy),
//! counting lost pages and wrong bytes.
//!
//! "N in flight" is measured two ways: N threads each doing one read at a
//! time (`SwapBackend::read`), and one thread keeping N reads in flight
//! (`NbdBackend::read_pages`, the way nbdcopy keeps `--requests` on its
//! thread).
//!
//! Each raw figure comes with the CPU time per read of the client and of the
//! server, and, where libnbd's `nbdcopy` is installed, nbdcopy's rate on the
//! same server with as many requests in flight (a ratio taken in one run).
//!
//! `cargo run --release -p mmkit --example nbd_bench [-- raw|nodelay|delay|chaos|all] [OPS CUTS]`

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mmkit::{Error, MapFlags, Mm, NbdBackend, SwapBackend, SwapDevice};

const PAGE: usize = 4096;
/// The device of the raw figures (nbdcopy reads the whole export each round).
const BYTES: u64 = 32 << 20;

struct Srv(Child, PathBuf);
impl Srv {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Srv {
        let sock = dir.join(format!("{name}.sock"));
        let pid = dir.join(format!("{name}.pid"));
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(&pid);
        let c = Command::new("nbdkit")
            .args(["-f", "--exit-with-parent", "-P", pid.to_str().unwrap()])
            .args(["-U", sock.to_str().unwrap()])
            .args(args)
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .expect("nbdkit (apt-get install nbdkit)");
        while !pid.exists() {
            std::thread::sleep(Duration::from_millis(2));
        }
        Srv(c, sock)
    }
    fn qsd(dir: &Path, bytes: u64) -> Srv {
        let img = Path::new("/dev/shm").join(format!("mmkit-nbd-bench-{}.img", std::process::id()));
        std::fs::File::create(&img).unwrap().set_len(bytes).unwrap();
        let sock = dir.join("qsd.sock");
        let pid = dir.join("qsd.pid");
        let c = Command::new("qemu-storage-daemon")
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=f,filename={}",
                img.display()
            ))
            .arg("--nbd-server")
            .arg(format!("addr.type=unix,addr.path={}", sock.display()))
            .args([
                "--export",
                "type=nbd,id=e,node-name=f,name=swap,writable=on",
            ])
            .arg("--pidfile")
            .arg(&pid)
            .spawn()
            .expect("qemu-storage-daemon (apt-get install qemu-utils)");
        while !pid.exists() || !sock.exists() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = std::fs::remove_file(&img); // unlinked: gone with the daemon
        Srv(c, sock)
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.1.display())
    }
}
impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)] as f64 / 1000.0
}

/// CPU time (us) this process and `server` (a pid) used so far, and this
/// process's voluntary context switches.
#[derive(Copy, Clone)]
struct Cpu {
    client_us: f64,
    server_us: f64,
    vcsw: f64,
    server_cs: f64,
}

fn cpu(server: u32) -> Cpu {
    // SAFETY: getrusage fills the zeroed struct we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Cpu {
        client_us: tv(ru.ru_utime) + tv(ru.ru_stime),
        server_us: proc_cpu_us(server),
        vcsw: ru.ru_nvcsw as f64,
        server_cs: proc_switches(server),
    }
}

/// Context switches of all threads of `pid` so far (their threads come and
/// go less often than they switch, so the sum over the live ones is close).
fn proc_switches(pid: u32) -> f64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    dir.flatten()
        .map(|t| {
            let s = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            s.lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

/// utime + stime of `pid` from /proc (clock ticks: 10 ms resolution).
fn proc_cpu_us(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks * 1e6 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// One phase's figures.
struct Fig {
    ops_per_s: f64,
    mean_us: f64,
    p99_us: f64,
    client_us_per_op: f64,
    server_us_per_op: f64,
    vcsw_per_op: f64,
    server_cs_per_op: f64,
}

impl std::fmt::Display for Fig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} reads/s, mean {:.1} us, p99 {:.1} us, CPU/op client {:.1} us server {:.1} us, \
             voluntary switches/op {:.2}, server switches/op {:.2}",
            self.ops_per_s,
            self.mean_us,
            self.p99_us,
            self.client_us_per_op,
            self.server_us_per_op,
            self.vcsw_per_op,
            self.server_cs_per_op
        )
    }
}

/// `threads` threads each doing `n` random 4 KiB reads.
fn reads(dev: &NbdBackend, server: u32, threads: usize, n: usize) -> Fig {
    let c0 = cpu(server);
    let t0 = Instant::now();
    let mut lat: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut buf = vec![0u8; PAGE];
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let off = (x % (BYTES / PAGE as u64)) * PAGE as u64;
                        let t = Instant::now();
                        dev.read(off, &mut buf).unwrap();
                        lat.push(t.elapsed().as_nanos() as u64);
                    }
                    lat
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let c1 = cpu(server);
    let ops = lat.len() as f64;
    let mean = lat.iter().sum::<u64>() as f64 / ops / 1000.0;
    Fig {
        ops_per_s: ops / secs,
        mean_us: mean,
        p99_us: pct(&mut lat, 0.99),
        client_us_per_op: (c1.client_us - c0.client_us) / ops,
        server_us_per_op: (c1.server_us - c0.server_us) / ops,
        vcsw_per_op: (c1.vcsw - c0.vcsw) / ops,
        server_cs_per_op: (c1.server_cs - c0.server_cs) / ops,
    }
}

/// One thread doing `n` random 4 KiB reads with `depth` in flight
/// (`NbdBackend::read_pages`, as nbdcopy keeps `--requests` in flight on its
/// one thread per connection). Latency is not seen per read: the mean is
/// Little's law's (`depth` / rate), p99 is not measured.
fn reads_window(dev: &NbdBackend, server: u32, depth: usize, n: usize) -> Fig {
    const CHUNK: usize = 1024;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let offs: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (BYTES / PAGE as u64)) * PAGE as u64
        })
        .collect();
    let mut buf = vec![0u8; CHUNK * PAGE];
    let c0 = cpu(server);
    let t0 = Instant::now();
    for o in offs.chunks(CHUNK) {
        dev.read_pages(o, &mut buf[..o.len() * PAGE], depth)
            .unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let c1 = cpu(server);
    assert!(
        buf.iter().all(|&b| b == 0x5a),
        "read_pages returned wrong bytes"
    );
    let ops = n as f64;
    Fig {
        ops_per_s: ops / secs,
        mean_us: depth as f64 * 1e6 * secs / ops,
        p99_us: f64::NAN,
        client_us_per_op: (c1.client_us - c0.client_us) / ops,
        server_us_per_op: (c1.server_us - c0.server_us) / ops,
        vcsw_per_op: (c1.vcsw - c0.vcsw) / ops,
        server_cs_per_op: (c1.server_cs - c0.server_cs) / ops,
    }
}

/// libnbd's nbdcopy reading the whole export with `requests` in flight on
/// one connection, 4 KiB each: (reads/s, its CPU us/op, the server's).
fn nbdcopy(srv: &Srv, requests: usize) -> Option<(f64, f64, f64)> {
    let s0 = proc_cpu_us(srv.0.id());
    let t0 = Instant::now();
    let child = Command::new("nbdcopy")
        .args(["--connections=1", "--request-size=4096"])
        .arg(format!("--requests={requests}"))
        .arg(srv.uri())
        .arg("null:")
        .spawn()
        .ok()?;
    let mut status = 0;
    // SAFETY: rusage for our own child, reaped here.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::wait4(child.id() as i32, &mut status, 0, &mut ru);
        ru
    };
    let secs = t0.elapsed().as_secs_f64();
    let ops = ((BYTES + PAGE as u64) / PAGE as u64) as f64;
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    let s1 = proc_cpu_us(srv.0.id());
    (status == 0).then(|| {
        (
            ops / secs,
            (tv(ru.ru_utime) + tv(ru.ru_stime)) / ops,
            (s1 - s0) / ops,
        )
    })
}

fn fill(dev: &NbdBackend) {
    let chunk = vec![0x5au8; 64 * PAGE];
    for off in (0..BYTES).step_by(chunk.len()) {
        dev.write(off, &chunk).unwrap();
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The raw device figures, each next to nbdcopy's on the same server:
/// without delay (`nodelay`), with `delay-read=1ms` (`delay`), or both.
fn raw(dir: &Path, which: &str) {
    let have_copy = Command::new("nbdcopy")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let size = format!("{}", BYTES + PAGE as u64);
    println!("load before: {}", load());
    if which != "delay" {
        raw_nodelay(dir, &size, have_copy);
    }
    if which != "nodelay" {
        raw_delay(dir, &size, have_copy);
    }
    println!("load after: {}", load());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `rounds` rounds of `threads` x `n` random reads by mmkit, each followed
/// by nbdcopy reading the export with `threads` requests in flight; every
/// round printed, then the medians and the median of the rounds' ratios.
/// `window`: one thread keeps `threads` reads in flight (`reads_window`)
/// instead of `threads` threads doing one read each at a time.
fn compare(
    srv: &Srv,
    dev: &NbdBackend,
    (threads, window): (usize, bool),
    n: usize,
    rounds: usize,
    copy: bool,
) {
    let (mut ours, mut theirs, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let f = match window {
            false => reads(dev, srv.0.id(), threads, n),
            true => reads_window(dev, srv.0.id(), threads, n * threads),
        };
        println!("  round {r}: mmkit {f}");
        ours.push(f.ops_per_s);
        if let Some((rate, cc, sc)) = copy.then(|| nbdcopy(srv, threads)).flatten() {
            println!(
                "  round {r}: nbdcopy {rate:.0} reads/s, CPU/op nbdcopy {cc:.1} us server {sc:.1} us"
            );
            theirs.push(rate);
            ratio.push(f.ops_per_s / rate);
        }
    }
    let mean_us = |rate: f64| threads as f64 * 1e6 / rate;
    let m = median(ours);
    let how = match window {
        false => format!("{threads} threads"),
        true => "one thread".to_string(),
    };
    print!(
        "{threads} in flight ({how}): mmkit {m:.0} reads/s ({:.1} us per read)",
        mean_us(m)
    );
    if theirs.is_empty() {
        println!(", nbdcopy not installed (apt-get install libnbd-bin)");
    } else {
        let t = median(theirs);
        println!(
            ", nbdcopy {t:.0} reads/s ({:.1} us); mmkit/nbdcopy {:.2} (median of {rounds} rounds)",
            mean_us(t),
            median(ratio)
        );
    }
}

fn raw_nodelay(dir: &Path, size: &str, have_copy: bool) {
    let srv = Srv::start(dir, "mem", &["--filter=noextents", "memory", size]);
    let dev = NbdBackend::connect(&srv.uri(), BYTES).unwrap();
    fill(&dev);
    let _ = reads(&dev, srv.0.id(), 1, 2000);
    let pages = (BYTES / PAGE as u64) as usize;
    compare(&srv, &dev, (1, false), pages, 5, have_copy);
    compare(&srv, &dev, (16, false), pages / 16, 5, have_copy);
    compare(&srv, &dev, (16, true), pages / 16, 5, have_copy);
    println!("{:?}", dev.stats());
}

fn raw_delay(dir: &Path, size: &str, have_copy: bool) {
    let srv = Srv::start(
        dir,
        "delay",
        &[
            "-t",
            "64",
            "--filter=noextents",
            "--filter=delay",
            "memory",
            size,
            "delay-read=1ms",
        ],
    );
    let dev = NbdBackend::connect(&srv.uri(), BYTES).unwrap();
    fill(&dev);
    let pages = (BYTES / PAGE as u64) as usize;
    println!("delay-read=1ms:");
    compare(&srv, &dev, (64, false), pages / 64, 3, have_copy);
    compare(&srv, &dev, (64, true), pages / 64, 3, have_copy);
}

fn chaos(dir: &Path, ops: u64, cuts: u32) {
    // Behind the proxy: qemu-storage-daemon on a file in /dev/shm (nbdkit
    // 1.32's own server can die of an assertion when the proxy is killed
    // mid-reply).
    let back = Srv::qsd(dir, 640 << 20);
    let sock = format!("socket={}", back.1.display());
    let front_args = [
        "--filter=error",
        "nbd",
        &sock,
        "export=swap",
        "error=EIO",
        "error-rate=1%",
    ];
    let mut front = Some(Srv::start(dir, "front", &front_args));
    let mm = Mm::builder().memory(32 << 20).build().unwrap();
    let uri = front.as_ref().unwrap().uri();
    let id = mm.swapon(SwapDevice::nbd(uri, 512 << 20)).unwrap();
    let threads = 8u64;
    let per = (128u64 << 20) / PAGE as u64 / threads;
    let done = AtomicBool::new(false);
    let (wrong, lost, retries) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let t0 = Instant::now();
    let mut heal = Vec::new();
    std::thread::scope(|sc| {
        let work: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, wrong, lost, retries) = (&mm, &wrong, &lost, &retries);
                sc.spawn(move || {
                    let s = mm.new_space().unwrap();
                    let a = s.mmap((per as usize) * PAGE, MapFlags::empty()).unwrap();
                    let mut model = vec![0u64; per as usize];
                    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                    for i in 0..ops / threads {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let p = (x % per) as usize;
                        let addr = a + (p * PAGE) as u64;
                        let mut b = [0u8; 8];
                        let mut tries = 0;
                        loop {
                            let r = if i % 4 == 0 {
                                s.write(addr, &(x | 1).to_le_bytes())
                            } else {
                                s.read(addr, &mut b)
                            };
                            match r {
                                Ok(()) => break,
                                Err(Error::SwapIo { .. }) if tries < 100_000 => {
                                    retries.fetch_add(1, Ordering::Relaxed);
                                    tries += 1;
                                }
                                Err(_) => {
                                    lost.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                            }
                        }
                        if i % 4 == 0 {
                            model[p] = x | 1;
                        } else if u64::from_le_bytes(b) != model[p] {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let mut n = 0;
        while n < cuts && !work.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            let r0 = mm.nbd_stats(id).unwrap().reconnects;
            drop(front.take());
            front = Some(Srv::start(dir, "front", &front_args));
            let t = Instant::now();
            while mm.nbd_stats(id).unwrap().reconnects == r0 && t.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            heal.push(t.elapsed().as_micros() as u64);
            n += 1;
        }
        done.store(true, Ordering::Release);
    });
    let st = mm.nbd_stats(id).unwrap();
    let info = &mm.swap_info()[0];
    let heal_max = heal.iter().max().copied().unwrap_or(0) as f64 / 1000.0;
    println!(
        "chaos: {ops} swap-loop accesses in {:.1} s, {} cuts (max time from the proxy's restart to the reconnect {heal_max:.1} ms), \
         pswpout {} pswpin {}, io_errors {}, retried accesses {}, lost {}, wrong {}, checksum errors {}, {st:?}",
        t0.elapsed().as_secs_f64(),
        heal.len(),
        info.pswpout,
        info.pswpin,
        info.io_errors,
        retries.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
        info.checksum_errors,
    );
}

fn main() {
    let mut mode = "all".to_string();
    let mut nums = Vec::new();
    for a in std::env::args().skip(1) {
        match a.parse::<u64>() {
            Ok(n) => nums.push(n),
            Err(_) => mode = a,
        }
    }
    let ops = nums.first().copied().unwrap_or(200_000);
    let cuts = nums.get(1).copied().unwrap_or(20) as u32;
    let dir = tempfile_dir();
    if ["raw", "nodelay", "delay", "all"].contains(&mode.as_str()) {
        raw(&dir, &mode);
    }
    if mode == "chaos" || mode == "all" {
        chaos(&dir, ops, cuts);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mmkit-nbd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
