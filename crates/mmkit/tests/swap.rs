//! Reclaim and swap end to end: address spaces larger than the
//! arena keep every byte through swap-out and swap-in, under kswapd and direct
//! reclaim; nothing leaks; pinned pages stay; failed I/O loses nothing; bad
//! swapon/swapoff input changes nothing.

mod common;
use common::{pin_to_current_cpu, used_swap, Rng};

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mmkit::{Error, MapFlags, Mm, Space, SwapBackend, SwapDevice, SwapId, VmEvent, PAGE_SIZE};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

fn mm(mem: usize, kswapd: bool) -> Mm {
    Mm::builder().memory(mem).kswapd(kswapd).build().unwrap()
}

fn ev(mm: &Mm, e: VmEvent) -> u64 {
    mm.vm_events().get(e)
}

/// Writes `tag` into every page of `[a, a + pages)`, at an offset that varies.
fn fill(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        let v = tag ^ i;
        s.write(a + i * PAGE + (i % 512) * 8, &v.to_le_bytes())
            .unwrap();
    }
}

fn verify(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE + (i % 512) * 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), tag ^ i, "page {i}");
    }
}

/// 16 threads, each with its own space, 4x the arena together, random 8-byte
/// reads and writes checked against a model; kswapd and direct reclaim both run.
/// Then one of the two devices goes off and every byte is checked again; then
/// everything is unmapped: no slot, no page left behind.
#[test]
fn content_survives_swapping_16_threads_and_swapoff() {
    const THREADS: usize = 16;
    let mem = 16 * MIB;
    let per = (4 * mem / THREADS) as u64 / PAGE; // pages per space
    let mm = mm(mem, true);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let a_dev = mm.swapon(SwapDevice::ram(48 << 20).priority(10)).unwrap();
    let b_dev = mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
    let spaces: Vec<(Space, u64)> = (0..THREADS)
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
                    // Touch everything once, then random accesses, 80% reads.
                    for (i, m) in model.iter_mut().enumerate() {
                        *m = (t as u64) << 32 | i as u64;
                        s.write(a + i as u64 * PAGE, &m.to_le_bytes()).unwrap();
                    }
                    for _ in 0..1500 {
                        let i = rng.below(per) as usize;
                        let addr = a + i as u64 * PAGE;
                        if rng.below(5) == 0 {
                            model[i] = rng.next();
                            s.write(addr, &model[i].to_le_bytes()).unwrap();
                        } else {
                            let mut b = [0u8; 8];
                            s.read(addr, &mut b).unwrap();
                            assert_eq!(u64::from_le_bytes(b), model[i], "thread {t} page {i}");
                        }
                    }
                    model
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ev(&mm, VmEvent::PswpOut) > 0 && ev(&mm, VmEvent::PswpIn) > 0);
    assert!(
        ev(&mm, VmEvent::PgScanKswapd) > 0,
        "kswapd reclaimed nothing"
    );
    assert!(ev(&mm, VmEvent::PgScanDirect) > 0, "no direct reclaim");
    assert!(ev(&mm, VmEvent::AllocStall) > 0);
    let steal = ev(&mm, VmEvent::PgStealKswapd) + ev(&mm, VmEvent::PgStealDirect);
    println!(
        "16 threads: {} pages reclaimed, LRU lock acquisitions (faults, unmaps and reclaim) per reclaimed page {:.3}, contended {:.2}%",
        steal,
        mm.lru_lock_stats().acquisitions as f64 / steal as f64,
        mm.lru_lock_stats().contended_pct()
    );
    let check_all = |what: &str| {
        for ((s, a), model) in spaces.iter().zip(&models) {
            for (i, m) in model.iter().enumerate() {
                let mut b = [0u8; 8];
                s.read(a + i as u64 * PAGE, &mut b).unwrap();
                assert_eq!(u64::from_le_bytes(b), *m, "{what}: page {i}");
            }
        }
    };
    check_all("after the run");
    mm.swapoff(a_dev).unwrap();
    assert_eq!(mm.swap_info().len(), 1);
    check_all("after swapoff");
    drop(spaces);
    // A batch kswapd is writing out may still hold pages and slots of the
    // spaces just dropped.
    mm.wait_reclaim_idle();
    assert_eq!(used_swap(&mm), 0, "swap slots leaked");
    mm.swapoff(b_dev).unwrap();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "pages leaked");
    mm.check().unwrap();
}

/// A page is never read back stale: write, swap out, read, write again, swap
/// out again, read. Reclaim counts what it freed; meminfo shows swap use.
#[test]
fn never_read_back_stale() {
    let mm = mm(16 * MIB, false);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let pages = 256;
    let a = s
        .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
        .unwrap();
    fill(&s, a, pages, 1);
    let before = mm.lru_lock_stats().acquisitions;
    assert_eq!(mm.reclaim(pages), pages);
    let acq = mm.lru_lock_stats().acquisitions - before;
    println!(
        "LRU lock acquisitions per reclaimed page: {:.3}",
        acq as f64 / pages as f64
    );
    assert!(
        acq * 4 <= pages,
        "{acq} LRU lock acquisitions for {pages} pages"
    );
    assert_eq!(s.stats().rss_pages, 0);
    assert_eq!(used_swap(&mm), pages);
    assert!(s.translate(a).is_none(), "swapped out");
    let info = mm.meminfo();
    assert!(
        info.contains(&format!("SwapFree:       {:>10} kB", (2048 - pages) * 4)),
        "{info}"
    );
    verify(&s, a, pages, 1);
    // Read faults on a device less than half full keep the pages in the swap
    // cache: the next reclaim drops them without writing.
    assert_eq!(used_swap(&mm), pages);
    let info = mm.meminfo();
    assert!(
        info.contains(&format!("SwapCached:     {:>10} kB", pages * 4)),
        "{info}"
    );
    assert_eq!(mm.reclaim(pages), pages);
    assert_eq!(
        ev(&mm, VmEvent::PswpOut),
        pages,
        "clean pages are not written again"
    );
    verify(&s, a, pages, 1);
    fill(&s, a, pages, 2);
    assert_eq!(mm.reclaim(pages), pages);
    assert_eq!(ev(&mm, VmEvent::PswpOut), 2 * pages, "dirty pages are");
    verify(&s, a, pages, 2);
    assert_eq!(ev(&mm, VmEvent::PswpIn), 3 * pages);
    assert_eq!(ev(&mm, VmEvent::PgStealDirect), 3 * pages);
    // A write fault takes the page out of the swap cache, freeing the slot.
    assert_eq!(mm.reclaim(pages), pages);
    fill(&s, a, pages, 3);
    assert_eq!(used_swap(&mm), 0);
    // Unmapping swapped-out pages frees their slots.
    assert_eq!(mm.reclaim(pages), pages);
    s.munmap(a, pages as usize * PAGE_SIZE).unwrap();
    assert_eq!(used_swap(&mm), 0);
    drop(s);
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

/// mmkit's policy: the fault is a page's insertion, not a reuse. Pages used
/// again after their fault are kept at their first inactive-tail visit (looked
/// at once, marked) and activated when seen used again at the next; pages
/// used only once are the ones reclaimed. (One list per node: the tail is
/// the oldest page of all, so one pass over the list looks at each once.)
#[test]
fn reused_pages_are_activated_used_once_reclaimed() {
    // Reclaim drains only its own CPU's lru_add batch first (Linux's
    // lru_add_drain): a thread moved mid-fill would leave pages on another
    // CPU's batch, and the one pass counted here would take referenced pages
    // in their place.
    pin_to_current_cpu();
    let mm = Mm::builder()
        .memory(16 * MIB)
        .kswapd(false)
        .fault_around(1)
        .lru_sharded(false)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let n = 1024;
    let a = s.mmap(n as usize * PAGE_SIZE, MapFlags::empty()).unwrap();
    fill(&s, a, n, 3);
    let touch_even = || {
        for i in (0..n).step_by(2) {
            s.touch(a + i * PAGE, false).unwrap();
        }
    };
    touch_even();
    // Every page looked at once: the used-once half goes, the reused half is
    // kept and marked, none activated yet.
    assert_eq!(mm.reclaim(n / 2), n / 2);
    for i in 0..n {
        assert_eq!(s.translate(a + i * PAGE).is_some(), i % 2 == 0, "page {i}");
    }
    assert_eq!(ev(&mm, VmEvent::PgActivate), 0);
    assert_eq!(ev(&mm, VmEvent::PgStealDirect), n / 2);
    // Used again: seen young at the second visit in a row, activated.
    touch_even();
    assert_eq!(mm.reclaim(32), 32);
    let act = ev(&mm, VmEvent::PgActivate);
    assert!(act > 0 && act <= n / 2, "{act}");
    assert_eq!(ev(&mm, VmEvent::PgStealDirect), n / 2 + 32);
    verify(&s, a, n, 3);
    mm.check().unwrap();
}

/// Fault-around's pages (`PTE_PREFAULT`): the first access of a prefaulted
/// page is its insertion, as the fault is the faulting page's, so one pass
/// over the list reclaims every page used once, prefaulted or not, and keeps
/// those used again: each page is looked at exactly once.
#[test]
fn prefaulted_pages_used_once_go_at_first_look() {
    // Reclaim drains only its own CPU's lru_add batch first (Linux's
    // lru_add_drain): a thread moved mid-fill would leave pages on another
    // CPU's batch, and the one pass counted here would take referenced pages
    // in their place.
    pin_to_current_cpu();
    let mm = Mm::builder()
        .memory(16 * MIB)
        .kswapd(false)
        .fault_around(16)
        .lru_sharded(false)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let n = 1024;
    let a = s.mmap(n as usize * PAGE_SIZE, MapFlags::empty()).unwrap();
    fill(&s, a, n, 5);
    for i in (0..n).step_by(2) {
        s.touch(a + i * PAGE, false).unwrap();
    }
    assert_eq!(mm.reclaim(n / 2), n / 2);
    for i in 0..n {
        assert_eq!(s.translate(a + i * PAGE).is_some(), i % 2 == 0, "page {i}");
    }
    assert_eq!(ev(&mm, VmEvent::PgScanDirect), n);
    assert_eq!(ev(&mm, VmEvent::PgStealDirect), n / 2);
    assert_eq!(ev(&mm, VmEvent::PgActivate), 0);
    verify(&s, a, n, 5);
    drop(s);
    mm.check().unwrap();
}

/// Linux's classic rules: faults map pages young, so a first look only marks
/// them (PG_referenced); under pressure they still go.
#[test]
fn classic_faults_map_young_then_reclaimed() {
    let mm = Mm::builder()
        .memory(16 * MIB)
        .kswapd(false)
        .variant(mmkit::Variant::MmkitLruClassic)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(64 * PAGE_SIZE, MapFlags::empty()).unwrap();
    fill(&s, a, 64, 3);
    assert_eq!(mm.reclaim(64), 64, "second pass ignores the bits");
    verify(&s, a, 64, 3);
    mm.check().unwrap();
}

/// Pages in use are never swapped out: one held by `with_page` in another
/// thread, one pinned with `pin_page`.
#[test]
fn pinned_pages_are_not_swapped_out() {
    let mm = mm(16 * MIB, false);
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(32 * PAGE_SIZE, MapFlags::empty()).unwrap();
    fill(&s, a, 32, 4);
    let pin = s.pin_page(a + 3 * PAGE, true).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|sc| {
        let s = &s;
        sc.spawn(move || {
            s.with_page(a + 5 * PAGE, true, |p| {
                tx.send(()).unwrap();
                done_rx.recv().unwrap();
                p[100] = 9;
            })
            .unwrap();
        });
        rx.recv().unwrap();
        assert_eq!(mm.reclaim(32), 30);
        done_tx.send(()).unwrap();
    });
    assert_eq!(s.translate(a + 3 * PAGE).unwrap().pfn, pin.pfn());
    assert!(s.translate(a + 5 * PAGE).is_some());
    assert!(s.translate(a).is_none());
    drop(pin);
    assert_eq!(mm.reclaim(32), 2);
    verify(&s, a, 32, 4);
    let mut b = [0u8];
    s.read(a + 5 * PAGE + 100, &mut b).unwrap();
    assert_eq!(b, [9]);
    mm.check().unwrap();
}

/// Memory and swap exhausted: the access fails with NoMemory, nothing panics,
/// and after an unmap the next access succeeds.
#[test]
fn exhaustion_returns_no_memory() {
    let mm = mm(16 * MIB, true);
    mm.swapon(SwapDevice::ram(4 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let len = 64 * MIB;
    let a = s.mmap(len, MapFlags::empty()).unwrap();
    let mut failed_at = None;
    for i in 0..(len as u64 / PAGE) {
        match s.write(a + i * PAGE, &[1]) {
            Ok(()) => {}
            Err(Error::NoMemory { .. }) => {
                failed_at = Some(i);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let i = failed_at.expect("20 MiB of memory and swap hold no 64 MiB");
    assert!(
        i > 16 * MIB as u64 / PAGE,
        "swap was used before failing ({i} pages)"
    );
    assert_eq!(used_swap(&mm), 1024, "the device is full");
    // The allocator stays usable, and freeing makes room.
    s.munmap(a, 8 * MIB).unwrap();
    s.write(a + i * PAGE, &[2]).unwrap();
    let mut b = [0u8];
    s.read(a + (i - 1) * PAGE, &mut b).unwrap();
    assert_eq!(b, [1]);
    drop(s);
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// At exhaustion every page written stays readable: once memory and swap are
/// both full (a write failed with `NoMemory`), every page written before reads
/// back intact, in order and in reverse, and can be written again: each
/// swap-in exchanges with a resident page, written into the incoming page's
/// slot. The device stays full; after drop every page and slot is free.
#[test]
fn exhaustion_exchange_keeps_every_page_readable() {
    for kswapd in [false, true] {
        let mm = mm(16 * MIB, kswapd);
        mm.swapon(SwapDevice::ram(4 << 20)).unwrap();
        mm.drain_all_pages();
        let free0 = mm.nr_free_pages();
        let s = mm.new_space().unwrap();
        let len = 64 * MIB;
        let a = s.mmap(len, MapFlags::empty()).unwrap();
        let mut n = 0;
        loop {
            let v = 1 ^ n;
            match s.write(a + n * PAGE + (n % 512) * 8, &v.to_le_bytes()) {
                Ok(()) => n += 1,
                Err(Error::NoMemory { .. }) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(n < len as u64 / PAGE, "20 MiB hold no 64 MiB");
        }
        assert!(n > 16 * MIB as u64 / PAGE, "swap was used ({n} pages)");
        assert_eq!(used_swap(&mm), 1024, "the device is full");
        verify(&s, a, n, 1);
        for i in (0..n).rev() {
            let mut b = [0u8; 8];
            s.read(a + i * PAGE + (i % 512) * 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), 1 ^ i, "page {i}");
        }
        assert!(ev(&mm, VmEvent::SwapExchange) > 0);
        fill(&s, a, n, 2);
        verify(&s, a, n, 2);
        assert_eq!(used_swap(&mm), 1024);
        mm.check().unwrap();
        drop(s);
        mm.wait_reclaim_idle();
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), free0);
        assert_eq!(used_swap(&mm), 0);
        mm.check().unwrap();
    }
}

/// The exchange under concurrency: 12 threads (more than cores), each with
/// its own space, write until memory and swap are full, then read their pages
/// back in random order at once, each swap-in taking a victim from any space:
/// every byte is right, and counts are exact after drop.
#[test]
fn exhaustion_exchange_threads() {
    const THREADS: u64 = 12;
    let mm = mm(16 * MIB, true);
    mm.swapon(SwapDevice::ram(4 << 20)).unwrap();
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let per = 32 * MIB as u64 / THREADS / PAGE;
    let spaces: Vec<(Space, u64)> = (0..THREADS)
        .map(|_| {
            let s = mm.new_space().unwrap();
            let a = s.mmap((per * PAGE) as usize, MapFlags::empty()).unwrap();
            (s, a)
        })
        .collect();
    let barrier = std::sync::Barrier::new(THREADS as usize);
    std::thread::scope(|sc| {
        for (t, (s, a)) in spaces.iter().enumerate() {
            let barrier = &barrier;
            sc.spawn(move || {
                let tag = (t as u64) << 32;
                let mut n = 0;
                while n < per {
                    match s.write(a + n * PAGE, &(tag ^ n).to_le_bytes()) {
                        Ok(()) => n += 1,
                        Err(Error::NoMemory { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                barrier.wait();
                let mut rng = Rng(t as u64 + 1);
                for _ in 0..4 * n {
                    let i = rng.below(n.max(1));
                    if n == 0 {
                        break;
                    }
                    let mut b = [0u8; 8];
                    s.read(a + i * PAGE, &mut b).unwrap();
                    assert_eq!(u64::from_le_bytes(b), tag ^ i, "thread {t} page {i}");
                }
                for i in 0..n {
                    let mut b = [0u8; 8];
                    s.read(a + i * PAGE, &mut b).unwrap();
                    assert_eq!(u64::from_le_bytes(b), tag ^ i, "thread {t} page {i}");
                }
            });
        }
    });
    assert!(ev(&mm, VmEvent::SwapExchange) > 0);
    mm.check().unwrap();
    drop(spaces);
    mm.wait_reclaim_idle();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// A user backend that fails or corrupts on demand.
#[derive(Default)]
struct Flaky {
    data: Mutex<Vec<u8>>,
    fail_writes: AtomicBool,
    fail_reads: AtomicBool,
    writes: AtomicUsize,
}

impl SwapBackend for Flaky {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected read error"));
        }
        let d = self.data.lock().unwrap();
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected write error"));
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        let mut d = self.data.lock().unwrap();
        let o = offset as usize;
        if d.len() < o + buf.len() {
            d.resize(o + buf.len(), 0);
        }
        d[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
}

/// Write errors lose nothing; read errors fail the access and a later access
/// succeeds once the device heals; a corrupted slot is `SwapCorrupt`.
#[test]
fn injected_faults_lose_nothing() {
    let mm = mm(16 * MIB, false);
    let flaky = Arc::new(Flaky::default());
    mm.swapon(SwapDevice::backend(flaky.clone(), 4 << 20))
        .unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(64 * PAGE_SIZE, MapFlags::empty()).unwrap();
    fill(&s, a, 64, 5);
    // Writes fail: nothing is reclaimed, every page stays mapped and intact.
    flaky.fail_writes.store(true, Ordering::SeqCst);
    assert_eq!(mm.reclaim(64), 0);
    assert_eq!(used_swap(&mm), 0);
    assert_eq!(s.stats().rss_pages, 64);
    assert!(ev(&mm, VmEvent::SwapIoError) > 0);
    verify(&s, a, 64, 5);
    flaky.fail_writes.store(false, Ordering::SeqCst);
    assert_eq!(mm.reclaim(64), 64);
    // Reads fail: the access fails, the entry stays; healed, it succeeds.
    flaky.fail_reads.store(true, Ordering::SeqCst);
    let mut b = [0u8; 8];
    match s.read(a, &mut b) {
        Err(Error::SwapIo { addr, .. }) => assert_eq!(addr, a),
        r => panic!("{r:?}"),
    }
    assert!(s.translate(a).is_none());
    assert_eq!(used_swap(&mm), 64);
    flaky.fail_reads.store(false, Ordering::SeqCst);
    verify(&s, a, 1, 5);
    // A flipped byte in a slot: SwapCorrupt, counted, and the entry stays.
    {
        let mut d = flaky.data.lock().unwrap();
        for x in d.iter_mut() {
            *x ^= 0x40;
        }
    }
    let mut b = [0u8; 8];
    match s.read(a + PAGE, &mut b) {
        Err(Error::SwapCorrupt { addr, .. }) => assert_eq!(addr, a + PAGE),
        r => panic!("{r:?}"),
    }
    assert_eq!(ev(&mm, VmEvent::SwapChecksumFail), 1);
    drop(s);
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// A real swap file in the test's temporary directory, with O_DIRECT where the
/// file system has it and buffered I/O explicitly.
#[test]
fn real_swap_file() {
    let dir = tempfile::tempdir().unwrap();
    for (name, buffered) in [("direct.swap", false), ("buffered.swap", true)] {
        let mm = mm(16 * MIB, false);
        let path = dir.path().join(name);
        let mut dev = SwapDevice::file(&path, 8 << 20).priority(3);
        if buffered {
            dev = dev.buffered_io();
        }
        let id = mm.swapon(dev).unwrap();
        assert!(path.exists());
        let s = mm.new_space().unwrap();
        let a = s.mmap(300 * PAGE_SIZE, MapFlags::empty()).unwrap();
        fill(&s, a, 300, 6);
        assert_eq!(mm.reclaim(300), 300);
        let i = &mm.swap_info()[0];
        assert_eq!((i.id, i.priority, i.used_pages), (id, 3, 300));
        verify(&s, a, 300, 6);
        drop(s);
        mm.swapoff(id).unwrap();
        mm.check().unwrap();
    }
}

/// Bad swapon and swapoff input is refused with a clear error and changes nothing.
#[test]
fn bad_swap_input_changes_nothing() {
    let mm = mm(16 * MIB, false);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.swap");
    let id = mm.swapon(SwapDevice::file(&path, 4 << 20)).unwrap();
    let before = mm.swap_info();
    let refused = |r: Result<SwapId, Error>, what: &str| match r {
        Err(Error::Swap(msg)) => assert!(!msg.is_empty(), "{what}"),
        r => panic!("{what}: {r:?}"),
    };
    refused(mm.swapon(SwapDevice::ram(0)), "size 0");
    refused(mm.swapon(SwapDevice::ram(4096)), "below one cluster");
    refused(mm.swapon(SwapDevice::ram((4 << 20) + 1)), "unaligned");
    refused(mm.swapon(SwapDevice::ram(4 << 20).priority(-7)), "priority");
    refused(
        mm.swapon(SwapDevice::file(&path, 4 << 20)),
        "duplicate file",
    );
    refused(
        mm.swapon(SwapDevice::file(dir.path().join("no/such/dir/x"), 4 << 20)),
        "bad path",
    );
    assert_eq!(mm.swap_info(), before);
    mm.swapoff(id).unwrap();
    assert!(
        matches!(mm.swapoff(id), Err(Error::Swap(_))),
        "swapoff twice"
    );
    // Too much on the device to bring back: refused, and the pages stay.
    let id = mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let pages = (20 * MIB / PAGE_SIZE) as u64;
    let a = s
        .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
        .unwrap();
    fill(&s, a, pages, 7);
    let used = used_swap(&mm);
    assert!(used > 0);
    assert!(matches!(mm.swapoff(id), Err(Error::Swap(_))));
    assert_eq!(used_swap(&mm), used);
    verify(&s, a, pages, 7);
    mm.check().unwrap();
}

/// Every swap variant (the slot allocators and swap-cache indexes the lab
/// compares) swaps out and back in, with the same counts.
#[test]
fn every_swap_variant_round_trips() {
    for v in [
        mmkit::Variant::MmkitSwap2019,
        mmkit::Variant::MmkitSwap2020,
        mmkit::Variant::MmkitSwap618,
        mmkit::Variant::Mmkit,
    ] {
        let mm = Mm::builder()
            .memory(16 * MIB)
            .variant(v)
            .kswapd(false)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let a = s.mmap(128 * PAGE_SIZE, MapFlags::empty()).unwrap();
        fill(&s, a, 128, 8);
        assert_eq!(mm.reclaim(128), 128, "{}", v.name());
        verify(&s, a, 128, 8);
        assert_eq!(ev(&mm, VmEvent::PswpIn), 128, "{}", v.name());
        let (_dev, _cluster, trunk) = mm.swap_lock_stats();
        let trunks = v != mmkit::Variant::MmkitSwap618 && v != mmkit::Variant::Mmkit;
        assert_eq!(trunk.acquisitions > 0, trunks, "{}", v.name());
        drop(s);
        assert_eq!(used_swap(&mm), 0);
        mm.check().unwrap();
    }
}

/// On an emulated two-node topology each node's LRU is reclaimed: a space
/// larger than the arena keeps its content with kswapd per node and direct
/// reclaim.
#[test]
fn two_nodes_swap_per_node() {
    let mm = Mm::builder()
        .memory(32 * MIB)
        .topology(mmkit::Topology::emulated(2))
        .build()
        .unwrap();
    assert_eq!(mm.nr_nodes(), 2);
    mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let pages = (48 * MIB / PAGE_SIZE) as u64;
    let a = s
        .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
        .unwrap();
    fill(&s, a, pages, 9);
    verify(&s, a, pages, 9);
    assert!(used_swap(&mm) > 0);
    drop(s);
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// The slot a page keeps after a read fault (`SwapFreePolicy`), on a device far
/// more than half full: under Linux's `HalfFull` every swap-in frees its slot,
/// so every page that goes out again is written again; under mmkit's
/// `KeepWhileRoom` a page that was only read keeps its slot and goes out again
/// without a write. A write after such a swap-in is never lost, and everything
/// freed gives every slot back.
#[test]
fn read_faults_keep_their_slot_while_there_is_room() {
    let arena_pages = (16 * MIB / PAGE_SIZE) as u64;
    let pages = 4 * arena_pages; // 64 MiB on a 80 MiB device: 80% full
    let mut outs = Vec::new();
    for policy in [
        mmkit::SwapFreePolicy::HalfFull,
        mmkit::SwapFreePolicy::KeepWhileRoom,
    ] {
        // Readahead off: its reads and unused pages would blur the count of
        // writes per swap-in that this test compares.
        let mm = Mm::builder()
            .memory(16 * MIB)
            .swap_free(policy)
            .swap_readahead(mmkit::SwapReadahead::Off)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(80 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let a = s
            .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
            .unwrap();
        fill(&s, a, pages, 3);
        let (in0, out0) = (ev(&mm, VmEvent::PswpIn), ev(&mm, VmEvent::PswpOut));
        // Two read-only passes: every page comes back and goes out again.
        verify(&s, a, pages, 3);
        verify(&s, a, pages, 3);
        let (ins, outs_) = (
            ev(&mm, VmEvent::PswpIn) - in0,
            ev(&mm, VmEvent::PswpOut) - out0,
        );
        assert!(
            ins >= pages,
            "{policy:?}: {ins} swap-ins for {pages} pages read twice"
        );
        outs.push((policy, ins, outs_));
        // Writes after those swap-ins reach the next swap-out; then a read of
        // every page finds them.
        fill(&s, a, pages, 5);
        verify(&s, a, pages, 5);
        drop(s);
        mm.wait_reclaim_idle();
        assert_eq!(used_swap(&mm), 0, "{policy:?}: slots leaked");
        mm.check().unwrap();
    }
    let (_, half_in, half_out) = outs[0];
    let (_, keep_in, keep_out) = outs[1];
    // HalfFull: a write for (nearly) every page that went out again.
    assert!(
        half_out * 10 >= half_in * 9,
        "HalfFull: {half_out} writes for {half_in} swap-ins"
    );
    // KeepWhileRoom: only the pages resident (dirty) when the passes began
    // were written; the pages read back went out for free.
    assert!(
        keep_out <= arena_pages,
        "KeepWhileRoom: {keep_out} writes for {keep_in} swap-ins (at most {arena_pages} expected)"
    );
}

/// Swap readahead (`SwapReadahead`): a sequential read of a swapped-out range
/// reads ahead (the next slots, or the next PTEs' entries) and later faults
/// find those pages in the swap cache; every byte is right; random reads keep
/// the window shut; unused read-ahead pages go with their slot when the space
/// is dropped, so every page and slot comes back.
#[test]
fn readahead_policies() {
    use mmkit::SwapReadahead;
    let pages = (48 * MIB / PAGE_SIZE) as u64;
    for ra in [
        SwapReadahead::Off,
        SwapReadahead::Cluster,
        SwapReadahead::Vma,
    ] {
        let mm = Mm::builder()
            .memory(16 * MIB)
            .swap_readahead(ra)
            .build()
            .unwrap();
        let free0 = mm.nr_free_pages();
        mm.swapon(SwapDevice::ram(128 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let a = s
            .mmap(pages as usize * PAGE_SIZE, MapFlags::empty())
            .unwrap();
        fill(&s, a, pages, 11);
        let (ra0, hit0) = (ev(&mm, VmEvent::SwapRa), ev(&mm, VmEvent::SwapRaHit));
        verify(&s, a, pages, 11);
        let (ras, hits) = (
            ev(&mm, VmEvent::SwapRa) - ra0,
            ev(&mm, VmEvent::SwapRaHit) - hit0,
        );
        match ra {
            SwapReadahead::Off => assert_eq!((ras, hits), (0, 0)),
            _ => {
                // Pages go out in address order and come back in it: most
                // swap-ins of the sequential pass are hits.
                assert!(hits > pages / 4, "{ra:?}: {hits} hits, {ras} read ahead");
                assert!(hits <= ras, "{ra:?}: {hits} hits of {ras} pages read ahead");
            }
        }
        // Random single-page reads: the window closes (no hits, no sequence).
        let mut rng = Rng(7);
        let ra1 = ev(&mm, VmEvent::SwapRa);
        let in1 = ev(&mm, VmEvent::PswpIn);
        for _ in 0..4000 {
            let i = rng.below(pages);
            let mut b = [0u8; 8];
            s.read(a + i * PAGE + (i % 512) * 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), 11 ^ i, "{ra:?}: page {i}");
        }
        let (ras, ins) = (
            ev(&mm, VmEvent::SwapRa) - ra1,
            ev(&mm, VmEvent::PswpIn) - in1,
        );
        assert!(
            ras * 4 <= ins,
            "{ra:?}: {ras} read ahead in {ins} random swap-ins"
        );
        // Writes after readahead, then everything read back.
        fill(&s, a, pages, 12);
        verify(&s, a, pages, 12);
        drop(s);
        mm.wait_reclaim_idle();
        assert_eq!(used_swap(&mm), 0, "{ra:?}: slots leaked");
        assert_eq!(mm.swap_info()[0].cached_pages, 0, "{ra:?}: cache leaked");
        mm.check().unwrap();
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), free0, "{ra:?}: pages leaked");
    }
}
