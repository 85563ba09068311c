//! Memory cgroups end to end: charging at fault, swap-in and huge fault,
//! uncharging at unmap; limits (`max`, `high`, `swap.max`), protection,
//! proactive reclaim; exact counts after everything is dropped; bad input
//! refused unchanged. Real threads, more than cores.

mod common;
use common::used_swap;

use mmkit::{Error, MapFlags, MemCgroup, Mm, Space, SwapDevice, PAGE_SIZE};

const MIB: u64 = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

fn mm(mem: u64) -> Mm {
    Mm::builder()
        .memory(mem as usize)
        .kswapd(false)
        .build()
        .unwrap()
}

/// Writes `tag ^ i` into page `i` of `[a, a + pages)`.
fn fill(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        s.write(a + i * PAGE + (i % 64) * 8, &(tag ^ i).to_le_bytes())
            .unwrap();
    }
}

fn verify(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE + (i % 64) * 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), tag ^ i, "page {i}");
    }
}

/// Stocked pages (charged ahead) per CPU at most.
const STOCK: u64 = 64;

fn nr_cpus(mm: &Mm) -> u64 {
    mm.config().nr_cpus as u64
}

/// current = resident pages of the group's spaces + what the stocks hold.
fn assert_current(g: &MemCgroup, resident_pages: u64, mm: &Mm) {
    let cur = g.current() / PAGE;
    assert!(
        cur >= resident_pages && cur <= resident_pages + STOCK * nr_cpus(mm),
        "current {cur} pages, resident {resident_pages}"
    );
    assert_eq!(g.stat().anon / PAGE, resident_pages, "anon = resident");
}

#[test]
fn charge_at_fault_uncharge_at_unmap() {
    let mm = mm(64 * MIB);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let g = mm.new_group().unwrap();
    let h = g.new_child().unwrap();
    let s = mm.new_space_in(&h).unwrap();
    let a = s.mmap((1000 * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, 1000, 7);
    assert_current(&h, 1000, &mm);
    assert_eq!(g.current(), h.current(), "hierarchical");
    assert_eq!(s.stats().rss_pages, 1000);
    // Huge pages are charged 512 at a time.
    let b = s.mmap((4 * MIB) as usize, MapFlags::HUGE).unwrap();
    fill(&s, b, 1024, 9);
    let huge = s.stats().huge_pages;
    assert_current(&h, 1000 + 1024, &mm);
    s.munmap(a, (1000 * PAGE) as usize).unwrap();
    assert_current(&h, 1024, &mm);
    verify(&s, b, 1024, 9);
    drop(s);
    assert_current(&h, 0, &mm);
    assert!(huge > 0 || mm.config().nr_cpus > 0);
    mm.check().unwrap();
    drop((g, h));
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "every page back");
    mm.check().unwrap();
}

#[test]
fn bad_input_is_refused_unchanged() {
    let mm = mm(32 * MIB);
    let other = self::mm(32 * MIB);
    let g = mm.new_group().unwrap();
    let foreign = other.new_group().unwrap();
    assert!(matches!(
        mm.new_space_in(&foreign),
        Err(Error::ForeignGroup { .. })
    ));
    let s = mm.new_space_in(&g).unwrap();
    let c = g.new_child().unwrap();
    match g.remove() {
        Err(Error::GroupBusy {
            spaces, children, ..
        }) => assert_eq!((spaces, children), (1, 1)),
        r => panic!("{r:?}"),
    }
    g.set_max(10 * MIB).unwrap();
    assert_eq!(g.limits().0, 10 * MIB);
    // Not a whole page: rounded down, as Linux.
    g.set_high(10 * MIB + 5).unwrap();
    assert_eq!(g.limits().1, 10 * MIB);
    assert!(matches!(g.reclaim(100), Err(Error::BadGroupValue { .. })));
    drop(s);
    drop(c);
    g.remove().unwrap();
    assert!(matches!(g.set_max(MIB), Err(Error::GroupRemoved { .. })));
    assert!(matches!(g.new_child(), Err(Error::GroupRemoved { .. })));
    assert!(matches!(
        mm.new_space_in(&g),
        Err(Error::GroupRemoved { .. })
    ));
    assert_eq!(g.limits().0, 10 * MIB, "unchanged");
    mm.check().unwrap();
}

#[test]
fn swap_is_charged_per_slot() {
    let mm = mm(32 * MIB);
    mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
    let g = mm.new_group().unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 2048;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, pages, 3);
    let got = mm.reclaim(1024);
    assert!(got > 0);
    assert_eq!(g.swap_current() / PAGE, used_swap(&mm), "every slot is g's");
    assert_current(&g, s.stats().rss_pages, &mm);
    verify(&s, a, pages, 3);
    assert_eq!(g.swap_current() / PAGE, used_swap(&mm));
    drop(s);
    assert_eq!((g.swap_current(), used_swap(&mm)), (0, 0));
    mm.check().unwrap();
}

fn swap_mm(mem: u64, swap: u64) -> Mm {
    let mm = mm(mem);
    mm.swapon(SwapDevice::ram(swap)).unwrap();
    mm
}

/// Writes go on past `max`: the group's own pages are swapped out in the
/// faulting thread; a sampler never sees `current` above `max`; every byte
/// comes back.
#[test]
fn max_is_held_by_reclaiming_the_group() {
    let mm = swap_mm(64 * MIB, 128 * MIB);
    let g = mm.new_group().unwrap();
    g.set_max(8 * MIB).unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 32 * MIB / PAGE;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(g.current() <= 8 * MIB, "current {} over max", g.current());
            }
        });
        fill(&s, a, pages, 11);
        verify(&s, a, pages, 11);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(g.current() <= 8 * MIB);
    let (st, ev) = (g.stat(), g.events());
    assert!(
        ev.max > 0 && st.pgsteal > 0 && st.pswpout > 0,
        "{st:?} {ev:?}"
    );
    assert_eq!(ev.oom, 0);
    assert_eq!(g.swap_current() / PAGE, used_swap(&mm));
    drop(s);
    assert_eq!((g.swap_current(), used_swap(&mm)), (0, 0));
    mm.check().unwrap();
}

/// At `max` with nothing reclaimable (no swap): the fault fails with
/// `NoMemory`, nothing leaks, and the group stays usable.
#[test]
fn at_max_with_nothing_reclaimable_the_fault_fails() {
    let mm = mm(64 * MIB);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let g = mm.new_group().unwrap();
    g.set_max(4 * MIB).unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 8 * MIB / PAGE;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    let mut failed_at = None;
    for i in 0..pages {
        match s.write(a + i * PAGE, &[1]) {
            Ok(()) => {}
            Err(Error::NoMemory { .. }) => {
                failed_at = Some(i);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let i = failed_at.expect("the limit stopped the writes");
    assert!(
        i <= 4 * MIB / PAGE,
        "{i} pages written under a 1024-page max"
    );
    assert!(g.current() <= 4 * MIB);
    assert_eq!(s.stats().rss_pages, i);
    assert!(g.events().oom >= 1);
    mm.check().unwrap();
    // Room again after an unmap.
    s.munmap(a, (PAGE * 16) as usize).unwrap();
    s.write(a + (pages - 1) * PAGE, &[2]).unwrap();
    drop(s);
    drop(g);
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "nothing leaked");
    mm.check().unwrap();
}

/// `swap.max = 0`: nothing of the group goes to swap, even under global
/// pressure from a neighbour; the group's pages stay resident.
#[test]
fn swap_max_zero_writes_nothing_to_swap() {
    let mm = swap_mm(32 * MIB, 128 * MIB);
    let g = mm.new_group().unwrap();
    g.set_swap_max(0).unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 8 * MIB / PAGE;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, pages, 5);
    // A neighbour in the root streams through twice the arena.
    let n = mm.new_space().unwrap();
    let np = 64 * MIB / PAGE;
    let b = n.mmap((np * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&n, b, np, 6);
    assert_eq!(g.swap_current(), 0);
    assert_eq!(g.stat().pswpout, 0, "nothing of g written");
    assert!(g.events().swap_max > 0, "refusals counted");
    assert_eq!(s.stats().rss_pages, pages, "g stays resident");
    verify(&s, a, pages, 5);
    verify(&n, b, np, 6);
    drop((s, n));
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// `high`: a steady grower stays near `high` (at most 1.1x) while reclaim
/// progresses, never fails, and `events.high` counts.
#[test]
fn high_reclaims_and_throttles_without_failing() {
    let mm = swap_mm(64 * MIB, 128 * MIB);
    let g = mm.new_group().unwrap();
    g.set_high(8 * MIB).unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 24 * MIB / PAGE;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    let mut peak = 0;
    for i in 0..pages {
        s.write(a + i * PAGE, &i.to_le_bytes()).unwrap();
        peak = peak.max(g.current());
    }
    assert!(peak <= 8 * MIB * 11 / 10, "peak {peak} over 1.1x high");
    assert!(g.events().high > 0);
    assert_eq!(g.events().oom, 0);
    for i in 0..pages {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i);
    }
    assert!(g.pressure().some_total_us > 0, "reclaim is a stall");
    drop(s);
    mm.check().unwrap();
}

/// Lowering `max` below the usage reclaims toward it; without swap it cannot
/// get there and the old limit stays.
#[test]
fn lowering_max_reclaims_or_keeps_the_old_limit() {
    let mm = swap_mm(64 * MIB, 64 * MIB);
    let g = mm.new_group().unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let pages = 16 * MIB / PAGE;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, pages, 1);
    g.set_max(4 * MIB).unwrap();
    assert!(g.current() <= 4 * MIB);
    assert_eq!(g.limits().0, 4 * MIB);
    verify(&s, a, pages, 1);
    drop(s);
    // No swap: 8 MiB resident cannot go under 2 MiB.
    let mm = self::mm(64 * MIB);
    let g = mm.new_group().unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let a = s.mmap((8 * MIB) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, 8 * MIB / PAGE, 2);
    match g.set_max(2 * MIB) {
        Err(Error::LimitBelowUsage { usage, .. }) => assert!(usage >= 8 * MIB),
        r => panic!("{r:?}"),
    }
    assert_eq!(g.limits().0, u64::MAX, "the old limit stays");
    verify(&s, a, 8 * MIB / PAGE, 2);
    drop(s);
    mm.check().unwrap();
}

/// `memory.reclaim` takes from the group only.
#[test]
fn proactive_reclaim_takes_from_the_group_only() {
    let mm = swap_mm(64 * MIB, 64 * MIB);
    let g = mm.new_group().unwrap();
    let h = mm.new_group().unwrap();
    let (sg, sh) = (mm.new_space_in(&g).unwrap(), mm.new_space_in(&h).unwrap());
    let pages = 4 * MIB / PAGE;
    let a = sg.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    let b = sh.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&sg, a, pages, 1);
    fill(&sh, b, pages, 2);
    let got = g.reclaim(2 * MIB).unwrap();
    assert!(got >= 2 * MIB, "reclaimed {got}");
    assert_eq!(sh.stats().rss_pages, pages, "h untouched");
    assert!(sg.stats().rss_pages <= pages - 2 * MIB / PAGE + STOCK);
    assert_eq!(h.stat().pgsteal, 0);
    verify(&sg, a, pages, 1);
    drop((sg, sh));
    mm.check().unwrap();
}

/// A protected group keeps its working set while a neighbour streams through
/// several times the arena; the same without protection loses it.
#[test]
fn low_protects_a_working_set_from_a_streaming_neighbour() {
    let run = |low: u64| {
        let mm = Mm::builder()
            .memory((32 * MIB) as usize)
            .kswapd(true)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(256 << 20)).unwrap();
        let (a, b) = (mm.new_group().unwrap(), mm.new_group().unwrap());
        a.set_low(low).unwrap();
        let (sa, sb) = (mm.new_space_in(&a).unwrap(), mm.new_space_in(&b).unwrap());
        let hot = 8 * MIB / PAGE;
        let x = sa.mmap((hot * PAGE) as usize, MapFlags::empty()).unwrap();
        fill(&sa, x, hot, 1);
        let stream = 96 * MIB / PAGE;
        let y = sb
            .mmap((stream * PAGE) as usize, MapFlags::empty())
            .unwrap();
        std::thread::scope(|sc| {
            sc.spawn(|| fill(&sb, y, stream, 2));
            // A keeps reading its hot set meanwhile.
            for _ in 0..4 {
                verify(&sa, x, hot, 1);
            }
        });
        verify(&sa, x, hot, 1);
        let (st, ev) = (a.stat(), a.events());
        drop((sa, sb));
        mm.check().unwrap();
        (st, ev)
    };
    let (protected, pev) = run(12 * MIB);
    assert_eq!(protected.pswpout, 0, "protected: {protected:?}");
    assert_eq!(protected.pswpin, 0);
    assert_eq!(pev.low, 0);
    let (open, _) = run(0);
    assert!(open.pswpout > 0, "unprotected, A loses pages: {open:?}");
}

/// Many threads (more than cores) in three groups with limits, swap and
/// kswapd: every byte survives, `current` never passes `max`, and after
/// everything is dropped the free pages and swap slots come back exactly.
#[test]
fn threads_in_groups_keep_every_byte_and_count_exactly() {
    const THREADS: u64 = 12;
    let mm = Mm::builder()
        .memory((48 * MIB) as usize)
        .kswapd(true)
        .build()
        .unwrap();
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    mm.swapon(SwapDevice::ram(256 << 20)).unwrap();
    let top = mm.new_group().unwrap();
    top.set_max(24 * MIB).unwrap();
    let groups = [
        top.new_child().unwrap(),
        top.new_child().unwrap(),
        mm.new_group().unwrap(),
    ];
    groups[0].set_max(8 * MIB).unwrap();
    groups[1].set_high(6 * MIB).unwrap();
    groups[2].set_max(12 * MIB).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(top.current() <= 24 * MIB);
                assert!(groups[0].current() <= 8 * MIB);
                assert!(groups[2].current() <= 12 * MIB);
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let g = groups[(t % 3) as usize].clone();
                let mm = mm.clone();
                sc.spawn(move || {
                    let s = mm.new_space_in(&g).unwrap();
                    let pages = 6 * MIB / PAGE;
                    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
                    fill(&s, a, pages, t);
                    for r in 0..2 {
                        verify(&s, a, pages, t ^ r);
                        fill(&s, a, pages, t ^ (r + 1));
                    }
                    verify(&s, a, pages, t ^ 2);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    mm.wait_reclaim_idle();
    for g in &groups {
        assert_eq!(g.swap_current(), 0);
        assert_eq!(g.stat().anon, 0);
    }
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
    drop(groups);
    drop(top);
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

/// Migration keeps the owner: pages moved to another node stay charged to
/// their group, on its lists (`check()` verifies both), `current` unchanged.
#[test]
fn migration_keeps_the_charge() {
    use mmkit::{MbindFlags, MemPolicy, NodeMask, Topology};
    let mm = Mm::builder()
        .memory((32 * MIB) as usize)
        .topology(Topology::emulated(2))
        .kcompactd(false)
        .build()
        .unwrap();
    let g = mm.new_group().unwrap();
    let s = mm.new_space_in(&g).unwrap();
    s.set_mempolicy(MemPolicy::Bind(NodeMask::from_nodes(&[0])))
        .unwrap();
    let pages = 64;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, pages, 4);
    mm.check().unwrap();
    let before = g.current();
    let r = s
        .mbind(
            a,
            (pages * PAGE) as usize,
            MemPolicy::Bind(NodeMask::from_nodes(&[1])),
            MbindFlags::MOVE,
        )
        .unwrap();
    assert_eq!(r.moved, pages);
    assert_eq!(g.current(), before);
    assert_eq!(g.stat().anon / PAGE, pages);
    mm.check().unwrap();
    verify(&s, a, pages, 4);
    drop(s);
    assert_eq!(g.stat().anon, 0);
    mm.check().unwrap();
}

/// A huge fault its group cannot be charged for falls back to order 0.
#[test]
fn huge_fault_over_the_limit_falls_back_to_order_0() {
    let mm = mm(64 * MIB);
    let g = mm.new_group().unwrap();
    g.set_max(3 * MIB).unwrap();
    let s = mm.new_space_in(&g).unwrap();
    let a = s.mmap((4 * MIB) as usize, MapFlags::HUGE).unwrap();
    s.write(a, &[1]).unwrap();
    assert_eq!(s.stats().huge_pages, 1, "the first 2 MiB fits");
    s.write(a + 2 * MIB, &[2]).unwrap();
    let st = s.stats();
    assert_eq!(st.huge_pages, 1, "the second does not: {st:?}");
    assert!(st.huge_fallbacks >= 1);
    assert!(g.current() <= 3 * MIB);
    assert_eq!(g.stat().anon / PAGE, st.rss_pages);
    drop(s);
    mm.check().unwrap();
}

/// `memory.stat`'s pgfault counts each fault of the group's spaces once,
/// live or gone, and a parent's includes its children's.
#[test]
fn pgfault_counts_each_fault_once() {
    let mm = mm(32 * MIB);
    let g = mm.new_group().unwrap();
    let h = g.new_child().unwrap();
    let s = mm.new_space_in(&h).unwrap();
    let a = s.mmap((300 * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&s, a, 300, 3);
    let faults = s.stats().faults;
    assert!(faults > 0);
    assert_eq!(h.stat().pgfault, faults);
    assert_eq!(g.stat().pgfault, faults);
    let t = mm.new_space_in(&g).unwrap();
    let b = t.mmap((40 * PAGE) as usize, MapFlags::empty()).unwrap();
    fill(&t, b, 40, 4);
    let both = faults + t.stats().faults;
    drop(s);
    assert_eq!(h.stat().pgfault, faults, "kept after the space is gone");
    assert_eq!(g.stat().pgfault, both);
    drop(t);
    assert_eq!(g.stat().pgfault, both);
    mm.check().unwrap();
}

/// Groups come and go while threads charge more groups than a CPU's stock
/// has slots (so slots are evicted, and groups die with pages stocked):
/// every count stays exact (`check()` compares each group's usage with its
/// pages plus its stocks), and the parent ends with its stocks alone.
#[test]
fn groups_come_and_go_under_charging_threads_count_exactly() {
    const THREADS: u64 = 8;
    let mm = mm(64 * MIB);
    let parent = mm.new_group().unwrap();
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let (mm, parent) = (mm.clone(), parent.clone());
            sc.spawn(move || {
                for r in 0..40 {
                    let g = parent.new_child().unwrap();
                    let s = mm.new_space_in(&g).unwrap();
                    let pages = 20 + (t * 7 + r) % 50;
                    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
                    fill(&s, a, pages, t ^ r);
                    verify(&s, a, pages, t ^ r);
                    if r % 3 == 0 {
                        s.munmap(a, (pages * PAGE) as usize).unwrap();
                    }
                    drop(s);
                    assert!(g.current() / PAGE <= STOCK * nr_cpus(&mm));
                    drop(g);
                }
            });
        }
    });
    mm.check().unwrap();
    assert!(parent.current() / PAGE <= STOCK * nr_cpus(&mm));
    assert_eq!(parent.stat().anon, 0);
    drop(parent);
    mm.check().unwrap();
    assert_eq!(mm.root_current(), 0);
}

/// Allocator-paid reclaim: a group streaming through memory beside a
/// protected one reclaims its own pages as it charges, so (without kswapd)
/// its allocations never stall in global direct reclaim, and the protected
/// group keeps every page; the root's spaces (no group) get no such help.
#[test]
fn a_streaming_group_pays_for_its_own_reclaim() {
    let run = |grouped: bool| {
        let mm = Mm::builder()
            .memory((32 * MIB) as usize)
            .kswapd(false)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(256 << 20)).unwrap();
        let a = mm.new_group().unwrap();
        a.set_low(12 * MIB).unwrap();
        let sa = mm.new_space_in(&a).unwrap();
        let b = mm.new_group().unwrap();
        let sb = if grouped {
            mm.new_space_in(&b).unwrap()
        } else {
            mm.new_space().unwrap()
        };
        let hot = 8 * MIB / PAGE;
        let x = sa.mmap((hot * PAGE) as usize, MapFlags::empty()).unwrap();
        fill(&sa, x, hot, 1);
        let stream = 96 * MIB / PAGE;
        let y = sb
            .mmap((stream * PAGE) as usize, MapFlags::empty())
            .unwrap();
        fill(&sb, y, stream, 2);
        verify(&sa, x, hot, 1);
        verify(&sb, y, stream, 2);
        let stalls = mm.vm_events().get(mmkit::VmEvent::AllocStall);
        let (sta, stb) = (a.stat(), b.stat());
        drop((sa, sb));
        mm.check().unwrap();
        (stalls, sta, stb)
    };
    let (grouped, a, b) = run(true);
    assert!(
        b.pgsteal > 0 && b.pswpout > 0,
        "B reclaimed its own pages: {b:?}"
    );
    assert_eq!(a.pswpout, 0, "A kept its pages: {a:?}");
    let (ungrouped, _, _) = run(false);
    // Single-threaded, B's charges keep free memory above the watermarks and
    // no allocation stalls (0 on a quiet machine). A thread moved between CPUs
    // under load can find the free pages on the other CPU's lists and stall
    // once or twice; without a group, B stalls hundreds of times.
    assert!(
        ungrouped > 0 && grouped * 20 <= ungrouped,
        "B's charges kept free memory up: {grouped} stalls in a group, {ungrouped} without: {b:?}"
    );
}
