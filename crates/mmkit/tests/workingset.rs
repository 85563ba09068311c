//! Which pages reclaim keeps (mmkit's probation/protected policy beside Linux
//! 6.18's classic rules): pages used once never reach the protected list, a
//! one-pass scan does not flush a hot set, refaults within the distance are
//! activated; the workingset counters are exact where the trace makes them so.

use mmkit::{LruPolicy, MapFlags, Mm, Space, SwapDevice, VmEvent, PAGE_SIZE};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

fn mm(policy: LruPolicy, fault_around: usize) -> Mm {
    let mm = Mm::builder()
        .memory(16 * MIB)
        .kswapd(false)
        .fault_around(fault_around)
        .lru_policy(policy)
        .build()
        .unwrap();
    mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
    mm.drain_all_pages();
    mm
}

/// After every space is dropped: every page free again, no slot in use.
fn all_back(mm: &Mm, free0: u64) {
    mm.wait_reclaim_idle();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    assert_eq!(mm.swap_info().iter().map(|i| i.used_pages).sum::<u64>(), 0);
    mm.check().unwrap();
}

fn ev(mm: &Mm, e: VmEvent) -> u64 {
    mm.vm_events().get(e)
}

fn write_pass(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        s.write(a + i * PAGE + 8, &(tag ^ i).to_le_bytes()).unwrap();
    }
}

fn verify(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE + 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), tag ^ i, "page {i}");
    }
}

/// A page used once (written by one pass, never again) never reaches the
/// protected list: two passes over three times the arena, the second swapping
/// every page back in (a refault distance of about twice the lists, too long to
/// activate), activate nothing, with or without fault-around.
#[test]
fn used_once_never_protected() {
    for around in [1, 16] {
        let mm = mm(LruPolicy::Protected, around);
        let free0 = mm.nr_free_pages();
        let s = mm.new_space().unwrap();
        let pages = 3 * (16 * MIB) as u64 / PAGE;
        let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
        write_pass(&s, a, pages, 1);
        write_pass(&s, a, pages, 2);
        assert_eq!(ev(&mm, VmEvent::PgActivate), 0, "fault_around {around}");
        assert_eq!(ev(&mm, VmEvent::WorkingsetActivateAnon), 0);
        assert!(ev(&mm, VmEvent::PswpIn) > 0);
        verify(&s, a, pages, 2);
        drop(s);
        all_back(&mm, free0);
    }
}

/// The scan trace, small: a hot set of an eighth of the arena touched twice
/// per round, a one-pass write scan of 1.25x the arena between rounds. After
/// two warm-up rounds mmkit's policy keeps the hot set (no hot page read back
/// from swap); the classic rules lose it every round, as Linux does.
#[test]
fn scan_does_not_flush_the_hot_set() {
    let frames = (16 * MIB) as u64 / PAGE;
    let hot = frames / 8;
    let scan = frames * 5 / 4;
    let mut reads = Vec::new();
    for policy in [LruPolicy::Protected, LruPolicy::Classic] {
        let mm = mm(policy, 16);
        let free0 = mm.nr_free_pages();
        let s = mm.new_space().unwrap();
        let total = hot + 3 * scan;
        let a = s.mmap((total * PAGE) as usize, MapFlags::empty()).unwrap();
        let mut cursor = hot;
        let mut per_round = Vec::new();
        for round in 0..6u64 {
            let before = ev(&mm, VmEvent::PswpIn);
            for _ in 0..2 {
                write_pass(&s, a, hot, round);
            }
            per_round.push(ev(&mm, VmEvent::PswpIn) - before);
            for _ in 0..scan {
                s.write(a + cursor * PAGE, &[1]).unwrap();
                cursor = if cursor + 1 == total { hot } else { cursor + 1 };
            }
        }
        verify(&s, a, hot, 5);
        drop(s);
        all_back(&mm, free0);
        reads.push(per_round);
    }
    let hot_reads = |r: &[u64]| r[3..].iter().sum::<u64>();
    assert!(
        hot_reads(&reads[0]) <= 3 * hot / 20,
        "protected read back {:?} of {hot} hot pages per round",
        reads[0]
    );
    assert!(
        hot_reads(&reads[1]) >= 3 * hot / 2,
        "classic read back {:?} of {hot} hot pages per round",
        reads[1]
    );
}

/// A refault within the distance goes straight to the protected list: pages
/// evicted and read back while far fewer evictions came between than the
/// protected list may hold are all activated (`workingset_activate_anon`),
/// none of them a restore (they were never active); they stay when reclaim
/// runs again. The classic test (the distance against the active list, empty
/// here) activates none.
#[test]
fn refault_within_distance_is_activated() {
    for policy in [LruPolicy::Protected, LruPolicy::Classic] {
        let mm = mm(policy, 1);
        let free0 = mm.nr_free_pages();
        let s = mm.new_space().unwrap();
        let n = 1024;
        let a = s.mmap((n * PAGE) as usize, MapFlags::empty()).unwrap();
        write_pass(&s, a, n, 7);
        assert_eq!(mm.reclaim(64), 64);
        let gone: Vec<u64> = (0..n)
            .filter(|&i| s.translate(a + i * PAGE).is_none())
            .collect();
        assert_eq!(gone.len(), 64);
        for &i in &gone {
            let mut b = [0u8; 8];
            s.read(a + i * PAGE + 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), 7 ^ i);
        }
        assert_eq!(ev(&mm, VmEvent::WorkingsetRefaultAnon), 64, "{policy:?}");
        assert_eq!(ev(&mm, VmEvent::WorkingsetRestoreAnon), 0);
        if policy == LruPolicy::Protected {
            assert_eq!(ev(&mm, VmEvent::WorkingsetActivateAnon), 64);
            assert_eq!(mm.reclaim(64), 64);
            for &i in &gone {
                assert!(s.translate(a + i * PAGE).is_some(), "page {i} protected");
            }
        } else {
            assert_eq!(ev(&mm, VmEvent::WorkingsetActivateAnon), 0);
        }
        verify(&s, a, n, 7);
        drop(s);
        all_back(&mm, free0);
    }
}

/// Load control under thrashing: 8 threads (more than the cores), each over a
/// space of its own whose working set is a quarter of the arena, write and
/// read back their pages at random for 3 s (together twice the arena, so
/// they thrash). With working-set load control the spaces take turns
/// (accesses wait: `loadctl_wait`); with the swap token one keeps its set
/// and the others pause after their swap-ins (`loadctl_wait` too); either
/// way every thread progresses within every 5 s window. Without it nothing
/// waits. Every read finds what its thread wrote last; everything is freed
/// after.
#[test]
fn load_control_takes_turns_without_starving() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    for lc in [
        mmkit::LoadControl::WorkingSet,
        mmkit::LoadControl::SwapToken,
        mmkit::LoadControl::Off,
    ] {
        let mm = Mm::builder()
            .memory(16 * MIB)
            .fault_around(1)
            .load_control(lc)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
        mm.drain_all_pages();
        let free0 = mm.nr_free_pages();
        let pages = (4 * MIB) as u64 / PAGE;
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (mm, stop) = (mm.clone(), stop.clone());
                std::thread::spawn(move || {
                    let s = mm.new_space().unwrap();
                    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
                    let mut model = vec![0u64; pages as usize];
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    let (mut last, mut max_gap) = (Instant::now(), Duration::ZERO);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let p = x % pages;
                        let addr = a + p * PAGE + 8;
                        if x & 4 == 0 {
                            n += 1;
                            s.write(addr, &n.to_le_bytes()).unwrap();
                            model[p as usize] = n;
                        } else {
                            let mut b = [0u8; 8];
                            s.read(addr, &mut b).unwrap();
                            assert_eq!(u64::from_le_bytes(b), model[p as usize], "page {p}");
                        }
                        let now = Instant::now();
                        max_gap = max_gap.max(now - last);
                        last = now;
                    }
                    max_gap
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        let gaps: Vec<Duration> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(start.elapsed() < Duration::from_secs(10));
        for g in &gaps {
            assert!(
                *g < Duration::from_secs(5),
                "{lc:?}: a thread stalled {g:?}"
            );
        }
        let waits = ev(&mm, VmEvent::LoadControlWait);
        match lc {
            mmkit::LoadControl::WorkingSet => assert!(waits > 0, "never took turns"),
            mmkit::LoadControl::SwapToken => assert!(waits > 0, "no space paused"),
            mmkit::LoadControl::Off => assert_eq!(waits, 0),
        }
        assert!(ev(&mm, VmEvent::PswpIn) > 0);
        all_back(&mm, free0);
    }
}
