//! Far memory: swap to NBD exports served by real servers that the tests start
//! (nbdkit, nbd-server, qemu-storage-daemon). Page contents against a model,
//! content 4x the arena, exact counts, `check()` at the end; error injection,
//! delays, cut connections and a lost server lose nothing and never return a
//! wrong byte. Tests skip (saying why) where a server is not installed.

mod nbd_servers;

mod common;
use common::{used_swap, Rng};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mmkit::{Error, MapFlags, Mm, NbdBackend, Space, SwapBackend, SwapDevice, SwapKind, PAGE_SIZE};
use nbd_servers::{have, skip, Server};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

/// Reads the word of page `i`, retrying an access that failed with a swap I/O
/// error (injected): the slot stays, so a later try reads the data.
fn read_retry(s: &Space, addr: u64) -> u64 {
    for _ in 0..10_000 {
        let mut b = [0u8; 8];
        match s.read(addr, &mut b) {
            Ok(()) => return u64::from_le_bytes(b),
            Err(Error::SwapIo { .. }) => continue,
            Err(e) => panic!("read {addr:#x}: {e:?}"),
        }
    }
    panic!("read {addr:#x}: failed 10000 times");
}

fn write_retry(s: &Space, addr: u64, v: u64) {
    for _ in 0..10_000 {
        match s.write(addr, &v.to_le_bytes()) {
            Ok(()) => return,
            Err(Error::SwapIo { .. }) => continue,
            Err(e) => panic!("write {addr:#x}: {e:?}"),
        }
    }
    panic!("write {addr:#x}: failed 10000 times");
}

/// `threads` threads, each with a space, `4 * mem` in all, random reads and
/// writes (80% reads) checked against a model, `ops` each; then every page is
/// checked once more. Returns the spaces and models.
fn workload(mm: &Mm, mem: usize, threads: usize, ops: usize) -> Vec<(Space, u64, Vec<u64>)> {
    let per = (4 * mem / threads) as u64 / PAGE;
    let spaces: Vec<(Space, u64)> = (0..threads)
        .map(|_| {
            let s = mm.new_space().unwrap();
            let a = s.mmap((per * PAGE) as usize, MapFlags::empty()).unwrap();
            (s, a)
        })
        .collect();
    let models: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = spaces
            .iter()
            .enumerate()
            .map(|(t, (s, a))| {
                sc.spawn(move || {
                    let mut model = vec![0u64; per as usize];
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                    for (i, m) in model.iter_mut().enumerate() {
                        *m = (t as u64) << 32 | i as u64;
                        write_retry(s, a + i as u64 * PAGE + (i as u64 % 512) * 8, *m);
                    }
                    for _ in 0..ops {
                        let i = rng.below(per) as usize;
                        let addr = a + i as u64 * PAGE + (i as u64 % 512) * 8;
                        if rng.below(5) == 0 {
                            model[i] = rng.next();
                            write_retry(s, addr, model[i]);
                        } else {
                            assert_eq!(read_retry(s, addr), model[i], "thread {t} page {i}");
                        }
                    }
                    model
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    spaces
        .into_iter()
        .zip(models)
        .map(|((s, a), m)| (s, a, m))
        .collect()
}

fn check_all(what: &str, all: &[(Space, u64, Vec<u64>)]) {
    for (s, a, model) in all {
        for (i, m) in model.iter().enumerate() {
            let addr = a + i as u64 * PAGE + (i as u64 % 512) * 8;
            assert_eq!(read_retry(s, addr), *m, "{what}: page {i}");
        }
    }
}

/// swapoff, again while an injected read error fails it (then the device
/// stays on with its remaining pages, and a retry goes on from there).
fn swapoff_retry(mm: &Mm, id: mmkit::SwapId) {
    for _ in 0..1000 {
        match mm.swapoff(id) {
            Ok(()) => return,
            Err(e) if e.to_string().contains("the device stays on") => {
                assert!(mm.swap_info().iter().any(|i| i.id == id));
            }
            Err(e) => panic!("swapoff: {e}"),
        }
    }
    panic!("swapoff failed 1000 times");
}

fn mm(mem: usize) -> Mm {
    Mm::builder().memory(mem).kswapd(true).build().unwrap()
}

/// The whole life of an NBD device: 4x the arena through it; swapoff brings
/// its pages back (into memory and a RAM device of lower priority); nothing
/// leaks.
fn round_trip(mm: &Mm, dev: SwapDevice, bytes: u64, threads: usize, ops: usize) {
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let id = mm.swapon(dev.priority(10)).unwrap();
    let ram = mm.swapon(SwapDevice::ram(96 << 20).priority(1)).unwrap();
    let info = mm.swap_info();
    assert_eq!(info[0].kind, SwapKind::Nbd);
    assert_eq!(info[0].size_pages, bytes / PAGE);
    let all = workload(mm, 16 * MIB, threads, ops);
    let i = &mm.swap_info()[0];
    assert!(i.pswpout > 0 && i.pswpin > 0, "{i:?}");
    assert_eq!(i.checksum_errors, 0);
    check_all("after the run", &all);
    swapoff_retry(mm, id);
    assert_eq!(mm.swap_info().len(), 1);
    check_all("after swapoff", &all);
    drop(all);
    assert_eq!(used_swap(mm), 0);
    mm.swapoff(ram).unwrap();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "pages leaked");
    mm.check().unwrap();
}

#[test]
fn nbdkit_memory_content_4x_arena_and_swapoff() {
    if !have("nbdkit") {
        return skip("nbdkit_memory_content_4x_arena_and_swapoff", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(dir.path(), "mem", &["memory", "128M"]);
    let mm = mm(16 * MIB);
    round_trip(
        &mm,
        SwapDevice::nbd(srv.uri(""), 96 << 20),
        96 << 20,
        8,
        1500,
    );
    mm.check().unwrap();
}

#[test]
fn nbdkit_trims_freed_slots() {
    if !have("nbdkit") {
        return skip("nbdkit_trims_freed_slots", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(dir.path(), "trim", &["memory", "64M"]);
    let mm = mm(16 * MIB);
    let id = mm.swapon(SwapDevice::nbd(srv.uri(""), 32 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(600 * PAGE_SIZE, MapFlags::empty()).unwrap();
    for i in 0..600 {
        s.write(a + i * PAGE, &i.to_le_bytes()).unwrap();
    }
    assert_eq!(mm.reclaim(600), 600);
    assert_eq!(used_swap(&mm), 600);
    s.munmap(a, 600 * PAGE_SIZE).unwrap();
    assert_eq!(used_swap(&mm), 0);
    let t0 = std::time::Instant::now();
    while mm.nbd_stats(id).unwrap().trimmed < 600 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{:?}",
            mm.nbd_stats(id)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(mm.nbd_stats(id).unwrap().trimmed, 600);
    // Trimmed slots are written again and read back intact.
    let a = s.mmap(600 * PAGE_SIZE, MapFlags::empty()).unwrap();
    for i in 0..600 {
        s.write(a + i * PAGE, &(i ^ 0xabc).to_le_bytes()).unwrap();
    }
    assert_eq!(mm.reclaim(600), 600);
    for i in 0..600 {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i ^ 0xabc);
    }
    drop(s);
    mm.swapoff(id).unwrap();
    mm.check().unwrap();
}

#[test]
fn swapon_refusals_change_nothing() {
    let mm = mm(16 * MIB);
    for uri in [
        "nbds://127.0.0.1/swap",
        "nbd+unix:///swap",
        "http://x/y",
        "nbd://127.0.0.1:1/swap",
        "nbd+unix:///swap?socket=/nonexistent/nbd.sock",
    ] {
        let e = mm.swapon(SwapDevice::nbd(uri, 8 << 20)).unwrap_err();
        if uri.starts_with("nbds") {
            assert!(e.to_string().contains("TLS is not supported yet"), "{e}");
        }
    }
    if !have("nbdkit") {
        return skip("swapon_refusals_change_nothing (servers)", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let ro = Server::nbdkit(dir.path(), "ro", &["-r", "memory", "64M"]);
    let e = mm.swapon(SwapDevice::nbd(ro.uri(""), 8 << 20)).unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");
    let small = Server::nbdkit(dir.path(), "small", &["memory", "8M"]);
    let e = mm
        .swapon(SwapDevice::nbd(small.uri(""), 8 << 20))
        .unwrap_err();
    assert!(e.to_string().contains("smaller"), "{e}");
    let big = Server::nbdkit(
        dir.path(),
        "blk",
        &[
            "--filter=blocksize-policy",
            "memory",
            "64M",
            "blocksize-minimum=8192",
            "blocksize-preferred=8192",
        ],
    );
    let e = mm
        .swapon(SwapDevice::nbd(big.uri(""), 8 << 20))
        .unwrap_err();
    assert!(e.to_string().contains("minimum block size"), "{e}");
    let named = Server::nbdkit(dir.path(), "named", &["memory", "64M"]);
    // nbdkit serves any name; a bad size is refused before any connection.
    let e = mm
        .swapon(SwapDevice::nbd(named.uri(""), 8 << 20 | 1))
        .unwrap_err();
    assert!(e.to_string().contains("4096"), "{e}");
    assert!(mm.swap_info().is_empty());
    mm.check().unwrap();
}

#[test]
fn error_filter_fails_requests_and_loses_nothing() {
    if !have("nbdkit") {
        return skip("error_filter_fails_requests_and_loses_nothing", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let (wf, rf) = (
        dir.path().join("fail-writes"),
        dir.path().join("fail-reads"),
    );
    let args = [
        "--filter=error".to_string(),
        "memory".into(),
        "64M".into(),
        "error=EIO".into(),
        "error-pwrite-rate=100%".into(),
        format!("error-pwrite-file={}", wf.display()),
        "error-pread-rate=100%".into(),
        format!("error-pread-file={}", rf.display()),
    ];
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let srv = Server::nbdkit(dir.path(), "err", &args);
    let mm = mm(16 * MIB);
    let id = mm.swapon(SwapDevice::nbd(srv.uri(""), 16 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(64 * PAGE_SIZE, MapFlags::empty()).unwrap();
    for i in 0..64 {
        s.write(a + i * PAGE, &(i * 7).to_le_bytes()).unwrap();
    }
    // Writes fail: nothing goes out, every page stays.
    std::fs::write(&wf, b"").unwrap();
    assert_eq!(mm.reclaim(64), 0);
    assert_eq!(used_swap(&mm), 0);
    assert_eq!(s.stats().rss_pages, 64);
    assert!(mm.swap_info()[0].io_errors > 0);
    std::fs::remove_file(&wf).unwrap();
    assert_eq!(mm.reclaim(64), 64);
    // Reads fail: the access fails, the slot stays; healed, the data is there.
    std::fs::write(&rf, b"").unwrap();
    let mut b = [0u8; 8];
    match s.read(a + 3 * PAGE, &mut b) {
        Err(Error::SwapIo { addr, .. }) => assert_eq!(addr, a + 3 * PAGE),
        r => panic!("{r:?}"),
    }
    assert_eq!(used_swap(&mm), 64);
    std::fs::remove_file(&rf).unwrap();
    for i in 0..64 {
        s.read(a + i * PAGE, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i * 7);
    }
    let st = mm.nbd_stats(id).unwrap();
    assert!(st.error_replies > 0 && !st.lost, "{st:?}");
    drop(s);
    mm.swapoff(id).unwrap();
    mm.check().unwrap();
}

#[test]
fn error_rate_and_delay_lose_nothing() {
    if !have("nbdkit") {
        return skip("error_rate_and_delay_lose_nothing", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(
        dir.path(),
        "rate",
        &[
            "--filter=error",
            "--filter=delay",
            "memory",
            "128M",
            "error=EIO",
            "error-rate=1%",
            "delay-read=1ms",
        ],
    );
    let mm = mm(16 * MIB);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let id = mm.swapon(SwapDevice::nbd(srv.uri(""), 96 << 20)).unwrap();
    // 16 threads check every read against their models (1 ms per read: no
    // serial pass over everything here).
    let all = workload(&mm, 16 * MIB, 16, 200);
    let i = &mm.swap_info()[0];
    assert!(i.io_errors > 0 && i.pswpin > 0, "{i:?}");
    assert_eq!(i.checksum_errors, 0);
    drop(all);
    assert_eq!(used_swap(&mm), 0);
    mm.swapoff(id).unwrap();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "pages leaked");
    mm.check().unwrap();
}

/// Cuts: a proxy in front of a long-lived memory server is restarted while
/// 8 threads swap; reads in flight are re-sent, writes fail and keep their
/// pages, every byte is right.
#[test]
fn cut_connections_lose_nothing() {
    if !have("nbdkit") {
        return skip("cut_connections_lose_nothing", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    // The long-lived server behind the proxy: qemu-storage-daemon where it is
    // installed (nbdkit 1.32's memory server can die of an assertion when the
    // proxy in front of it is killed mid-reply), else nbdkit's memory plugin.
    let (back, export) = if have("qemu-storage-daemon") {
        (Server::qemu(dir.path(), 128 << 20), "export=swap")
    } else {
        let b = Server::nbdkit(dir.path(), "back", &["memory", "128M"]);
        (b, "export=")
    };
    let sock = format!("socket={}", back.sock.display());
    let mut front = Server::nbdkit(dir.path(), "front", &["nbd", &sock, export]);
    let mm = mm(16 * MIB);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let id = mm
        .swapon(SwapDevice::nbd(front.uri(""), 96 << 20).priority(10))
        .unwrap();
    let ram = mm.swapon(SwapDevice::ram(96 << 20).priority(1)).unwrap();
    let done = AtomicBool::new(false);
    // The servers are restarted from this thread: `--exit-with-parent` kills
    // a server when the thread that started it exits.
    let mut cuts = 0;
    let all = std::thread::scope(|sc| {
        let work = sc.spawn(|| {
            let all = workload(&mm, 16 * MIB, 8, 1200);
            done.store(true, Ordering::Release);
            all
        });
        while !done.load(Ordering::Acquire) && cuts < 20 {
            std::thread::sleep(Duration::from_millis(60));
            front.restart();
            cuts += 1;
        }
        work.join().unwrap()
    });
    check_all("after cuts", &all);
    let st = mm.nbd_stats(id).unwrap();
    assert!(st.reconnects >= cuts, "{st:?}");
    swapoff_retry(&mm, id);
    check_all("after swapoff", &all);
    drop(all);
    assert!(cuts > 0);
    assert_eq!(used_swap(&mm), 0);
    mm.swapoff(ram).unwrap();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "pages leaked");
    mm.check().unwrap();
}

/// The page of slot `slot` written in round `round`: every word names both.
fn pattern(slot: u64, round: u64) -> Vec<u8> {
    (0..PAGE / 8)
        .flat_map(|w| (slot << 40 ^ round << 20 ^ w).to_le_bytes())
        .collect()
}

/// Many more callers than cores on one device: whoever waits receives the
/// replies of the others (one holds the receive side at a time, the others
/// sleep and are handed it), and every page read is the one last written.
#[test]
fn many_callers_share_the_receive_side() {
    if !have("nbdkit") {
        return skip("many_callers_share_the_receive_side", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(dir.path(), "mem", &["memory", "64M"]);
    let dev = NbdBackend::connect(&srv.uri(""), 32 << 20).unwrap();
    const THREADS: u64 = 48;
    const OWN: u64 = 64;
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let dev = &dev;
            sc.spawn(move || {
                let mut rng = Rng(t + 1);
                let mut round = vec![0u64; OWN as usize];
                let mut buf = vec![0u8; 4 * PAGE as usize];
                for s in 0..OWN {
                    dev.write((t * OWN + s) * PAGE, &pattern(t * OWN + s, 0))
                        .unwrap();
                }
                for _ in 0..300 {
                    let (first, n) = (rng.next() % (OWN - 4), 1 + rng.next() % 4);
                    let slot = t * OWN + first;
                    if rng.next().is_multiple_of(4) {
                        let mut pages = Vec::new();
                        for k in 0..n {
                            round[(first + k) as usize] += 1;
                            pages.extend(pattern(slot + k, round[(first + k) as usize]));
                        }
                        dev.write(slot * PAGE, &pages).unwrap();
                    } else {
                        let b = &mut buf[..(n * PAGE) as usize];
                        dev.read(slot * PAGE, b).unwrap();
                        for k in 0..n {
                            let want = pattern(slot + k, round[(first + k) as usize]);
                            let got = &b[(k * PAGE) as usize..((k + 1) * PAGE) as usize];
                            assert!(got == want, "slot {}", slot + k);
                        }
                    }
                }
            });
        }
    });
    let st = dev.stats();
    assert_eq!((st.timeouts, st.error_replies, st.reconnects), (0, 0, 0));
}

/// A connection that breaks while nothing is in flight is noticed by its
/// watcher and reconnected without waiting for a request; the data written
/// before reads back.
#[test]
fn idle_connection_cut_reconnects() {
    if !have("nbdkit") {
        return skip("idle_connection_cut_reconnects", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let back = Server::nbdkit(dir.path(), "back", &["memory", "64M"]);
    let sock = format!("socket={}", back.sock.display());
    let mut front = Server::nbdkit(dir.path(), "front", &["nbd", &sock]);
    let dev = NbdBackend::connect(&front.uri(""), 16 << 20).unwrap();
    for s in 0..64 {
        dev.write(s * PAGE, &pattern(s, 7)).unwrap();
    }
    front.restart();
    let t0 = std::time::Instant::now();
    while dev.stats().reconnects < dev.stats().connections as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "no reconnect without a request: {:?}",
            dev.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut b = vec![0u8; PAGE as usize];
    for s in 0..64 {
        dev.read(s * PAGE, &mut b).unwrap();
        assert!(b == pattern(s, 7), "slot {s}");
    }
    let st = dev.stats();
    assert_eq!((st.resent, st.timeouts, st.lost), (0, 0, false), "{st:?}");
}

/// A server that restarts has lost its memory: every slot it held reads as an
/// error, never as data; the pages can be dropped and the device turned off.
#[test]
fn lost_server_reads_as_errors() {
    if !have("nbdkit") {
        return skip("lost_server_reads_as_errors", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::nbdkit(dir.path(), "lost", &["memory", "64M"]);
    let mm = mm(16 * MIB);
    let id = mm.swapon(SwapDevice::nbd(srv.uri(""), 32 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(200 * PAGE_SIZE, MapFlags::empty()).unwrap();
    for i in 0..200 {
        s.write(a + i * PAGE, &(i + 1).to_le_bytes()).unwrap();
    }
    assert_eq!(mm.reclaim(200), 200);
    srv.restart();
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    let mut errors = 0;
    for i in 0..200 {
        match s.read(a + i * PAGE, &mut b) {
            Err(Error::SwapIo { .. }) => errors += 1,
            r => panic!("page {i} of a lost server: {r:?} {b:?}"),
        }
    }
    assert_eq!(errors, 200);
    assert!(t0.elapsed() < Duration::from_secs(5));
    let st = mm.nbd_stats(id).unwrap();
    assert!(st.lost, "{st:?}");
    assert_eq!(mm.swap_info()[0].checksum_errors, 0);
    assert_eq!(used_swap(&mm), 200);
    drop(s);
    assert_eq!(used_swap(&mm), 0);
    mm.swapoff(id).unwrap();
    mm.check().unwrap();
}

#[test]
fn nbd_server_simple_replies() {
    if !have("nbd-server") {
        return skip("nbd_server_simple_replies", "nbd-server");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbd_server(dir.path(), 80 << 20);
    let mm = mm(16 * MIB);
    let id = mm
        .swapon(SwapDevice::nbd(srv.uri("swap"), 64 << 20).nbd_connections(1))
        .unwrap();
    assert!(!mm.nbd_stats(id).unwrap().structured);
    mm.swapoff(id).unwrap();
    drop(srv);
    let srv = Server::nbd_server(dir.path(), 80 << 20);
    let dev = SwapDevice::nbd(srv.uri("swap"), 64 << 20).nbd_connections(1);
    round_trip(&mm, dev, 64 << 20, 4, 800);
}

#[test]
fn qemu_storage_daemon_block_sizes() {
    if !have("qemu-storage-daemon") {
        return skip("qemu_storage_daemon_block_sizes", "qemu-storage-daemon");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::qemu(dir.path(), 80 << 20);
    let mm = mm(16 * MIB);
    let id = mm
        .swapon(SwapDevice::nbd(srv.uri("swap"), 64 << 20))
        .unwrap();
    assert!(mm.nbd_stats(id).unwrap().structured);
    mm.swapoff(id).unwrap();
    round_trip(
        &mm,
        SwapDevice::nbd(srv.uri("swap"), 64 << 20),
        64 << 20,
        4,
        800,
    );
}

/// Every request has a deadline: a server slower than it fails the access
/// (the slot stays), and the device can still be turned off.
#[test]
fn deadline_fails_a_slow_read_and_keeps_the_slot() {
    if !have("nbdkit") {
        return skip("deadline_fails_a_slow_read_and_keeps_the_slot", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(
        dir.path(),
        "slow",
        &["--filter=delay", "memory", "64M", "delay-read=2000ms"],
    );
    let mm = mm(16 * MIB);
    let dev = SwapDevice::nbd(srv.uri(""), 16 << 20)
        .nbd_connections(1)
        .nbd_timeout(Duration::from_millis(300));
    let id = mm.swapon(dev).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(16 * PAGE_SIZE, MapFlags::empty()).unwrap();
    for i in 0..16 {
        s.write(a + i * PAGE, &i.to_le_bytes()).unwrap();
    }
    assert_eq!(mm.reclaim(16), 16);
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    match s.read(a, &mut b) {
        Err(Error::SwapIo { addr, .. }) => assert_eq!(addr, a),
        r => panic!("{r:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    assert!(mm.nbd_stats(id).unwrap().timeouts >= 1);
    assert_eq!(used_swap(&mm), 16);
    drop(s);
    assert_eq!(used_swap(&mm), 0);
    mm.swapoff(id).unwrap();
    mm.check().unwrap();
}
