//! Far memory, batched: many requests of one caller in flight on an NBD
//! device served by nbdkit. Windows of reads (`NbdBackend::read_pages`) under
//! error injection and cut connections return exactly the bytes written or
//! an error, never a wrong byte; swap readahead on an NBD device (its reads
//! in flight with the fault's) maps the right pages; reclaim's batched write
//! runs under injected errors keep every page. Tests skip (saying why) where
//! nbdkit is not installed.

mod nbd_servers;

mod common;
use common::{used_swap, Rng};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mmkit::{
    MapFlags, Mm, NbdBackend, SwapBackend, SwapDevice, SwapReadahead, VmEvent, NBD_READ_DEPTH_MAX,
    PAGE_SIZE,
};
use nbd_servers::{have, skip, Server};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;
const SLOTS: u64 = 4096;

/// The page of slot `slot`: every word names it.
fn pattern(slot: u64) -> Vec<u8> {
    (0..PAGE / 8)
        .flat_map(|w| (slot << 32 ^ w ^ 0x5eed).to_le_bytes())
        .collect()
}

fn fill(dev: &NbdBackend) {
    for first in (0..SLOTS).step_by(64) {
        let pages: Vec<u8> = (first..first + 64).flat_map(pattern).collect();
        dev.write(first * PAGE, &pages).unwrap();
    }
}

/// `threads` threads, each `rounds` windows of 256 random reads at depths
/// from 1 to the most; every window that succeeds holds exactly the pages
/// written. Returns the windows that failed.
fn read_windows(dev: &NbdBackend, threads: u64, rounds: usize) -> u64 {
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mut rng = Rng(t + 11);
                    let mut buf = vec![0u8; 256 * PAGE as usize];
                    let mut failed = 0;
                    for r in 0..rounds {
                        let n = 1 + rng.below(256) as usize;
                        let offs: Vec<u64> = (0..n).map(|_| rng.below(SLOTS) * PAGE).collect();
                        let depth = [1, 2, 7, 16, 64, NBD_READ_DEPTH_MAX][r % 6];
                        let b = &mut buf[..n * PAGE as usize];
                        b.fill(0xee);
                        if let Err(e) = dev.read_pages(&offs, b, depth) {
                            if failed == 0 {
                                eprintln!("thread {t}: first failed window: {e}");
                            }
                            failed += 1;
                            continue;
                        }
                        for (k, off) in offs.iter().enumerate() {
                            let got = &b[k * PAGE as usize..(k + 1) * PAGE as usize];
                            assert!(
                                got == pattern(off / PAGE),
                                "slot {} at depth {depth}",
                                off / PAGE
                            );
                        }
                    }
                    failed
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Windows of reads on a healthy server all succeed with the right bytes;
/// bad arguments are refused with nothing read.
#[test]
fn read_pages_windows_read_what_was_written() {
    if !have("nbdkit") {
        return skip("read_pages_windows_read_what_was_written", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::nbdkit(dir.path(), "mem", &["memory", "32M"]);
    let dev = NbdBackend::connect(&srv.uri(""), SLOTS * PAGE).unwrap();
    fill(&dev);
    assert_eq!(read_windows(&dev, 6, 60), 0);
    let mut buf = vec![0u8; 2 * PAGE as usize];
    // One buffer page short; an offset outside; an unaligned offset.
    assert!(dev.read_pages(&[0, PAGE, 2 * PAGE], &mut buf, 4).is_err());
    assert!(dev.read_pages(&[0, SLOTS * PAGE], &mut buf, 4).is_err());
    assert!(dev.read_pages(&[0, 100], &mut buf, 4).is_err());
    let st = dev.stats();
    assert_eq!((st.timeouts, st.error_replies, st.reconnects), (0, 0, 0));
}

/// Error replies (`error-rate`) fail whole windows, and the windows that
/// succeed hold exactly the pages written.
#[test]
fn read_pages_error_replies_never_return_wrong_bytes() {
    if !have("nbdkit") {
        return skip(
            "read_pages_error_replies_never_return_wrong_bytes",
            "nbdkit",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("errors-on");
    let srv = Server::nbdkit(
        dir.path(),
        "err",
        &[
            "--filter=error",
            "memory",
            "32M",
            "error-pread-rate=2%",
            &format!("error-file={}", file.display()),
        ],
    );
    let dev = NbdBackend::connect(&srv.uri(""), SLOTS * PAGE).unwrap();
    fill(&dev);
    std::fs::write(&file, b"").unwrap();
    let failed = read_windows(&dev, 4, 60);
    std::fs::remove_file(&file).unwrap();
    assert!(failed > 0, "no window failed at a 2% error rate");
    assert!(dev.stats().error_replies > 0);
    // The errors are gone: every window succeeds again.
    assert_eq!(read_windows(&dev, 2, 12), 0);
}

/// Cut connections (a restarted `nbdkit nbd` proxy) while windows of reads
/// are in flight: reads are re-sent, and every byte is right.
#[test]
fn read_pages_survive_cut_connections() {
    if !have("nbdkit") {
        return skip("read_pages_survive_cut_connections", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    // The long-lived server behind the proxy: qemu-storage-daemon where it is
    // installed (nbdkit's memory server can die of an assertion when the
    // proxy in front of it is killed mid-reply), else nbdkit's memory plugin.
    let (back, export) = if have("qemu-storage-daemon") {
        (Server::qemu(dir.path(), 32 << 20), "export=swap")
    } else {
        let b = Server::nbdkit(dir.path(), "back", &["memory", "32M"]);
        (b, "export=")
    };
    let sock = format!("socket={}", back.sock.display());
    let mut front = Server::nbdkit(dir.path(), "front", &["nbd", &sock, export]);
    let dev = NbdBackend::connect(&front.uri(""), SLOTS * PAGE).unwrap();
    fill(&dev);
    let done = AtomicBool::new(false);
    let mut cuts = 0;
    let failed = std::thread::scope(|sc| {
        let work = sc.spawn(|| {
            let f = read_windows(&dev, 4, 150);
            done.store(true, Ordering::Release);
            f
        });
        while !done.load(Ordering::Acquire) && cuts < 10 {
            std::thread::sleep(Duration::from_millis(40));
            front.restart();
            cuts += 1;
        }
        work.join().unwrap()
    });
    assert_eq!(failed, 0, "a window failed across a reconnect");
    let st = dev.stats();
    assert!(cuts > 0 && st.reconnects >= cuts, "{cuts} cuts: {st:?}");
}

fn ev(mm: &Mm, e: VmEvent) -> u64 {
    mm.vm_events().get(e)
}

/// Swap readahead on an NBD device, both policies: a sequential pass over a
/// swapped-out range has its read-ahead reads in flight with the faults'
/// own, later faults map those pages, every byte is right; then random
/// writes under injected write and read errors (reclaim's write runs sent
/// together, some failing) lose nothing; nothing leaks.
#[test]
fn readahead_and_write_runs_on_nbd() {
    if !have("nbdkit") {
        return skip("readahead_and_write_runs_on_nbd", "nbdkit");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("errors-on");
    let srv = Server::nbdkit(
        dir.path(),
        "ra",
        &[
            "--filter=error",
            "memory",
            "129M",
            "error-rate=3%",
            &format!("error-file={}", file.display()),
        ],
    );
    let pages = (48 * MIB) as u64 / PAGE;
    for ra in [SwapReadahead::Cluster, SwapReadahead::Vma] {
        let mm = Mm::builder()
            .memory(16 * MIB)
            .swap_readahead(ra)
            .build()
            .unwrap();
        mm.drain_all_pages();
        let free0 = mm.nr_free_pages();
        let id = mm.swapon(SwapDevice::nbd(srv.uri(""), 128 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let a = s
            .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
            .unwrap();
        let word = |i: u64| a + i * PAGE + (i % 512) * 8;
        for i in 0..pages {
            s.write(word(i), &(i ^ 0xa5).to_le_bytes()).unwrap();
        }
        let (ra0, hit0) = (ev(&mm, VmEvent::SwapRa), ev(&mm, VmEvent::SwapRaHit));
        for i in 0..pages {
            let mut b = [0u8; 8];
            s.read(word(i), &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), i ^ 0xa5, "{ra:?}: page {i}");
        }
        let (ras, hits) = (
            ev(&mm, VmEvent::SwapRa) - ra0,
            ev(&mm, VmEvent::SwapRaHit) - hit0,
        );
        assert!(hits > pages / 4, "{ra:?}: {hits} hits, {ras} read ahead");
        assert!(hits <= ras, "{ra:?}: {hits} hits of {ras} read ahead");
        // Random writes and reads with 3% of requests failing.
        std::fs::write(&file, b"").unwrap();
        let mut model: Vec<u64> = (0..pages).map(|i| i ^ 0xa5).collect();
        let mut rng = Rng(5);
        for _ in 0..20_000 {
            let i = rng.below(pages);
            if rng.below(3) == 0 {
                let v = rng.next();
                if s.write(word(i), &v.to_le_bytes()).is_ok() {
                    model[i as usize] = v;
                }
            } else {
                let mut b = [0u8; 8];
                if s.read(word(i), &mut b).is_ok() {
                    assert_eq!(u64::from_le_bytes(b), model[i as usize], "{ra:?}: page {i}");
                }
            }
        }
        std::fs::remove_file(&file).unwrap();
        let st = mm.nbd_stats(id).unwrap();
        assert!(st.error_replies > 0, "{ra:?}: {st:?}");
        for (i, m) in model.iter().enumerate() {
            let mut b = [0u8; 8];
            s.read(word(i as u64), &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), *m, "{ra:?}: page {i} at the end");
        }
        drop(s);
        mm.wait_reclaim_idle();
        assert_eq!(used_swap(&mm), 0, "{ra:?}: slots leaked");
        assert_eq!(mm.swap_info()[0].cached_pages, 0, "{ra:?}: cache leaked");
        mm.swapoff(id).unwrap();
        mm.check().unwrap();
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), free0, "{ra:?}: pages leaked");
    }
}
