//! Huge pages under memory pressure: a `MapFlags::HUGE` space larger
//! than the arena swaps like any other. Reclaim splits a cold huge page into
//! 512 order-0 pages and swaps them out (Linux's large-folio split in
//! `shrink_folio_list`); every byte survives, accessors racing with the split
//! see their own data, a pinned huge page stays whole, and freeing everything
//! gives back every page and every slot.

mod common;
use common::used_swap;

use mmkit::{Error, MapFlags, Mm, Space, SwapDevice, VmEvent, PAGE_SIZE};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;
const HPAGE: u64 = 2 << 20;

fn ev(mm: &Mm, e: VmEvent) -> u64 {
    mm.vm_events().get(e)
}

/// The value page `i` of a fill tagged `tag` holds, at offset `(i % 512) * 8`.
fn val(tag: u64, i: u64) -> u64 {
    tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i
}

fn fill(s: &Space, a: u64, pages: u64, tag: u64) -> Result<(), Error> {
    for i in 0..pages {
        s.write(a + i * PAGE + (i % 512) * 8, &val(tag, i).to_le_bytes())?;
    }
    Ok(())
}

fn verify(s: &Space, a: u64, pages: u64, tag: u64) {
    for i in 0..pages {
        let mut b = [0u8; 8];
        s.read(a + i * PAGE + (i % 512) * 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), val(tag, i), "page {i}");
    }
}

/// One thread, a huge mapping 3x the arena, with and without kswapd: with
/// direct reclaim only, the faulting thread itself splits huge pages of the
/// space whose VMA lock it holds (shared). No `NoMemory` while swap has room;
/// every byte comes back, twice; nothing leaks.
#[test]
fn huge_mapping_larger_than_memory_swaps() {
    for kswapd in [false, true] {
        let mm = Mm::builder()
            .memory(16 * MIB)
            .kswapd(kswapd)
            .build()
            .unwrap();
        mm.drain_all_pages();
        let free0 = mm.nr_free_pages();
        mm.swapon(SwapDevice::ram(64 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let len = 48 * MIB;
        let pages = len as u64 / PAGE;
        let a = s.mmap(len, MapFlags::HUGE).unwrap();
        assert_eq!(a % HPAGE, 0);
        fill(&s, a, pages, 1).unwrap_or_else(|e| panic!("kswapd {kswapd}: {e}"));
        assert!(s.stats().huge_faults > 0, "no huge page was mapped");
        assert!(
            ev(&mm, VmEvent::ThpSplitPage) > 0,
            "kswapd {kswapd}: no huge page was split for swap"
        );
        assert!(ev(&mm, VmEvent::ThpSplitPmd) >= ev(&mm, VmEvent::ThpSplitPage));
        assert!(ev(&mm, VmEvent::PswpOut) > 0);
        verify(&s, a, pages, 1);
        fill(&s, a, pages, 2).unwrap();
        verify(&s, a, pages, 2);
        assert!(ev(&mm, VmEvent::PswpIn) > 0);
        drop(s);
        mm.wait_reclaim_idle();
        assert_eq!(used_swap(&mm), 0, "kswapd {kswapd}: swap slots leaked");
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), free0, "kswapd {kswapd}: pages leaked");
        mm.check().unwrap();
    }
}

/// Huge pages whose PMD was split by munmap, one with its first sub-page gone
/// (its head unmapped) and one with a hole, are split and swapped like the
/// others; their unmapped sub-pages are freed by the split, not leaked.
#[test]
fn partly_unmapped_huge_pages_swap() {
    let mm = Mm::builder().memory(16 * MIB).build().unwrap();
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    // A device backed up front (`populated`) behaves like a lazy one.
    mm.swapon(SwapDevice::ram(64 << 20).populated()).unwrap();
    let s = mm.new_space().unwrap();
    let len = 8 * MIB;
    let pages = len as u64 / PAGE;
    let a = s.mmap(len, MapFlags::HUGE).unwrap();
    fill(&s, a, pages, 3).unwrap();
    assert_eq!(s.stats().huge_pages, 4);
    // The first huge page loses its head, the second a page in the middle.
    s.munmap(a, PAGE_SIZE).unwrap();
    s.munmap(a + HPAGE + 100 * PAGE, PAGE_SIZE).unwrap();
    assert_eq!(s.stats().huge_pages, 2);
    // Pressure from a second space: 4x the arena.
    let t = mm.new_space().unwrap();
    let b = t.mmap(64 * MIB, MapFlags::empty()).unwrap();
    fill(&t, b, (64 * MIB) as u64 / PAGE, 4).unwrap();
    assert!(
        ev(&mm, VmEvent::ThpSplitPage) >= 2,
        "the partly unmapped pages were not split"
    );
    for i in 0..pages {
        if i == 0 || i == 512 + 100 {
            continue;
        }
        let mut v = [0u8; 8];
        s.read(a + i * PAGE + (i % 512) * 8, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), val(3, i), "page {i}");
    }
    verify(&t, b, (64 * MIB) as u64 / PAGE, 4);
    drop((s, t));
    mm.wait_reclaim_idle();
    assert_eq!(used_swap(&mm), 0);
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

/// A huge page pinned by `pin_page` on one of its sub-pages is never split nor
/// swapped: the pinned frame stays mapped at its address, with its content,
/// however much the rest of the arena swaps.
#[test]
fn pinned_huge_page_stays_whole() {
    let mm = Mm::builder().memory(16 * MIB).build().unwrap();
    mm.swapon(SwapDevice::ram(96 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let a = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
    fill(&s, a, 1024, 5).unwrap();
    let pin = s.pin_page(a + 7 * PAGE, false).unwrap();
    let t0 = pin.translation();
    assert!(t0.huge);
    let b = s.mmap(64 * MIB, MapFlags::empty()).unwrap();
    fill(&s, b, (64 * MIB) as u64 / PAGE, 6).unwrap();
    let t1 = s.translate(a + 7 * PAGE).unwrap();
    assert_eq!((t1.pfn, t1.head, t1.huge), (t0.pfn, t0.head, true));
    drop(pin);
    verify(&s, a, 1024, 5);
    drop(s);
    mm.wait_reclaim_idle();
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}

/// 4 huge spaces, 3 threads each (12 threads on 2 CPUs), 3x the arena
/// together, filled one after the other (so huge pages are split), then
/// accessed at random. The threads of a space share its huge pages (page `i`
/// belongs to thread `i % 3`), so reclaim splits pages that other threads are
/// reading, writing, pinning and holding with `with_page` right then. Each thread
/// checks every read against its own model; then everything is checked again
/// and freed exactly.
#[test]
fn huge_split_races_with_accessors() {
    race(true);
}

/// The same from fresh spaces: the threads of a space race to fault its huge
/// pages in while reclaim splits the ones already there.
#[test]
fn huge_faults_race_with_splits() {
    race(false);
}

fn race(fill_first: bool) {
    const SPACES: usize = 4;
    const PER: u64 = 3;
    let mm = Mm::builder().memory(16 * MIB).kswapd(true).build().unwrap();
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    mm.swapon(SwapDevice::ram(80 << 20)).unwrap();
    let pages = (12 * MIB) as u64 / PAGE; // per space
    let spaces: Vec<(Space, u64)> = (0..SPACES)
        .map(|_| {
            let s = mm.new_space().unwrap();
            let a = s.mmap((pages * PAGE) as usize, MapFlags::HUGE).unwrap();
            (s, a)
        })
        .collect();
    // Filled one after the other: the first spaces' huge pages are cold when
    // the last ones fill, and are split and swapped.
    if fill_first {
        for (k, (s, a)) in spaces.iter().enumerate() {
            fill(s, *a, pages, k as u64).unwrap();
        }
        assert!(
            ev(&mm, VmEvent::ThpSplitPage) > 0,
            "no huge page was split by the fill"
        );
    }
    let models: Vec<Vec<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..SPACES * PER as usize)
            .map(|t| {
                let (s, a) = (&spaces[t / PER as usize].0, spaces[t / PER as usize].1);
                sc.spawn(move || {
                    let me = t as u64 % PER;
                    let mine: Vec<u64> = (0..pages).filter(|i| i % PER == me).collect();
                    let mut model: Vec<u64> = mine
                        .iter()
                        .map(|&i| match fill_first {
                            true => val((t / PER as usize) as u64, i),
                            false => 0,
                        })
                        .collect();
                    let mut x = 0x1234_5678_9abc_def1u64 ^ (t as u64 * 0x9E37_79B9);
                    for round in 0..12_000u64 {
                        x ^= x >> 12;
                        x ^= x << 25;
                        x ^= x >> 27;
                        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
                        let k = (r >> 8) as usize % mine.len();
                        let addr = a + mine[k] * PAGE + (mine[k] % 512) * 8;
                        match r % 10 {
                            0..=3 => {
                                let v = r ^ round;
                                s.write(addr, &v.to_le_bytes()).unwrap();
                                model[k] = v;
                            }
                            4 => {
                                let v = !r;
                                let off = (addr % PAGE) as usize;
                                s.with_page(addr, true, |p| {
                                    p[off..off + 8].copy_from_slice(&v.to_le_bytes())
                                })
                                .unwrap();
                                model[k] = v;
                            }
                            5 => {
                                let pin = s.pin_page(addr, false).unwrap();
                                let mut b = [0u8; 8];
                                s.read(addr, &mut b).unwrap();
                                assert_eq!(u64::from_le_bytes(b), model[k]);
                                assert_eq!(s.translate(addr).unwrap().pfn, pin.pfn());
                            }
                            _ => {
                                let mut b = [0u8; 8];
                                s.read(addr, &mut b).unwrap();
                                assert_eq!(u64::from_le_bytes(b), model[k], "thread {t}");
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ev(&mm, VmEvent::PswpOut) > 0 && ev(&mm, VmEvent::PswpIn) > 0);
    for (t, model) in models.iter().enumerate() {
        let (s, a) = &spaces[t / PER as usize];
        let me = t as u64 % PER;
        let mine = (0..pages).filter(|i| i % PER == me);
        for (m, i) in model.iter().zip(mine) {
            let mut b = [0u8; 8];
            s.read(a + i * PAGE + (i % 512) * 8, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), *m, "thread {t} page {i}");
        }
    }
    drop(spaces);
    mm.wait_reclaim_idle();
    assert_eq!(used_swap(&mm), 0, "swap slots leaked");
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0, "pages leaked");
    mm.check().unwrap();
}

/// Memory and swap both exhausted by a huge mapping: the access returns
/// `NoMemory` only then (after the device filled), nothing panics, and
/// unmapping makes the next access succeed with every byte before it intact.
#[test]
fn huge_exhaustion_returns_no_memory() {
    let mm = Mm::builder().memory(16 * MIB).build().unwrap();
    mm.swapon(SwapDevice::ram(8 << 20)).unwrap();
    let s = mm.new_space().unwrap();
    let len = 64 * MIB;
    let a = s.mmap(len, MapFlags::HUGE).unwrap();
    let mut failed_at = None;
    for i in 0..(len as u64 / PAGE) {
        match s.write(a + i * PAGE, &i.to_le_bytes()) {
            Ok(()) => {}
            Err(Error::NoMemory { .. }) => {
                failed_at = Some(i);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let i = failed_at.expect("24 MiB of memory and swap hold no 64 MiB");
    assert!(
        i > (16 * MIB) as u64 / PAGE,
        "swap was used before failing ({i} pages)"
    );
    assert_eq!(used_swap(&mm), 2048, "the device is full");
    assert!(ev(&mm, VmEvent::ThpSplitPage) > 0);
    // Freeing makes room; what was written is still there.
    s.munmap(a, 8 * MIB).unwrap();
    s.write(a + i * PAGE, &i.to_le_bytes()).unwrap();
    for j in (8 * MIB) as u64 / PAGE..=i {
        let mut b = [0u8; 8];
        s.read(a + j * PAGE, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), j, "page {j}");
    }
    drop(s);
    mm.wait_reclaim_idle();
    assert_eq!(used_swap(&mm), 0);
    mm.check().unwrap();
}
