//! NBD swap device figures against nbdkit's memory plugin on a Unix socket:
//! 4 KiB reads with 1 and 16 requests in flight, 64 in flight with
//! `delay-read=1ms`, latency percentiles; then a swap loop through an `Mm`
//! with `error-rate=1%` and connection cuts (a restarted `nbdkit nbd` proxy),
//! counting lost pages and wrong bytes.
//!
//! `cargo run --release -p mmkit --example nbd_bench [-- OPS CUTS]`

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mmkit::{Error, MapFlags, Mm, NbdBackend, SwapBackend, SwapDevice};

const PAGE: usize = 4096;
const BYTES: u64 = 256 << 20;

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

/// `threads` threads each doing `n` random 4 KiB reads: (ops/s, mean us, p99 us).
fn reads(dev: &NbdBackend, threads: usize, n: usize) -> (f64, f64, f64) {
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
    let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0;
    let p99 = pct(&mut lat, 0.99);
    (lat.len() as f64 / secs, mean, p99)
}

fn fill(dev: &NbdBackend) {
    let chunk = vec![0x5au8; 64 * PAGE];
    for off in (0..BYTES).step_by(chunk.len()) {
        dev.write(off, &chunk).unwrap();
    }
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
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ops = args.first().copied().unwrap_or(200_000);
    let cuts = args.get(1).copied().unwrap_or(20) as u32;
    let dir = tempfile_dir();
    if std::env::var_os("CHAOS_ONLY").is_some() {
        chaos(&dir, ops, cuts);
        return;
    }
    {
        let srv = Srv::start(&dir, "mem", &["memory", "1G"]);
        let dev = NbdBackend::connect(&srv.uri(), BYTES).unwrap();
        fill(&dev);
        let _ = reads(&dev, 1, 2000);
        let (r, mean, p99) = reads(&dev, 1, 20_000);
        println!("1 in flight: {r:.0} reads/s, mean {mean:.1} us, p99 {p99:.1} us");
        let (r, mean, p99) = reads(&dev, 16, 10_000);
        println!("16 in flight: {r:.0} reads/s, mean {mean:.1} us, p99 {p99:.1} us");
        println!("{:?}", dev.stats());
    }
    {
        let srv = Srv::start(
            &dir,
            "delay",
            &[
                "-t",
                "64",
                "--filter=delay",
                "memory",
                "1G",
                "delay-read=1ms",
            ],
        );
        let dev = NbdBackend::connect(&srv.uri(), BYTES).unwrap();
        fill(&dev);
        let (r, mean, p99) = reads(&dev, 64, 1000);
        println!(
            "delay-read=1ms, 64 in flight: {r:.0} reads/s, mean {mean:.1} us, p99 {p99:.1} us"
        );
    }
    chaos(&dir, ops, cuts);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("mmkit-nbd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
