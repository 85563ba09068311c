//! Unit tests of the address-space internals that the integration tests
//! (`crates/mmkit/tests/space.rs`) cannot reach: the walk cache across unmaps and
//! spaces, NUMA-hinting entries (`mprotect.rs` -> `do_numa_page`), and faults on
//! swap entries (`memory.rs` -> `do_swap_page`).

use std::sync::atomic::Ordering;

use super::{MapFlags, PAGE};
use crate::pgtable::{pt_index, used, Pte, SwapEntry};
use crate::{Error, Mm, PAGE_SIZE};

/// Fault-around off: these tests place entries page by page (also used by the
/// unit tests of `rmap.rs`).
pub(crate) fn mm() -> Mm {
    Mm::builder()
        .memory(32 << 20)
        .fault_around(1)
        .build()
        .unwrap()
}

/// The per-thread walk cache never outlives an unmap, and never serves one
/// space's tables to another (both spaces map the same addresses).
#[test]
fn walk_cache_follows_unmap_and_other_spaces() {
    let mm = mm();
    mm.drain_all_pages();
    let before = mm.nr_free_pages();
    {
        let s1 = mm.new_space().unwrap();
        let s2 = mm.new_space().unwrap();
        let a = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
        s1.write(a + PAGE, &[1]).unwrap();
        s1.touch(a + 2 * PAGE, true).unwrap();
        s1.munmap(a, 4 << 20).unwrap();
        assert_eq!(s1.stats().pgtable_pages, 1, "tables freed with the range");
        let b = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
        assert_eq!(a, b, "the same range again, under new tables");
        let mut byte = [9u8];
        s1.read(b + PAGE, &mut byte).unwrap();
        assert_eq!(byte, [0], "a new mapping reads zero");
        s1.write(b + PAGE, &[2]).unwrap();
        let c = s2.mmap(4 << 20, MapFlags::empty()).unwrap();
        assert_eq!(c, a, "each space starts at MMAP_BASE");
        s2.write(c + PAGE, &[3]).unwrap();
        s1.read(b + PAGE, &mut byte).unwrap();
        assert_eq!(byte, [2]);
        s2.read(c + PAGE, &mut byte).unwrap();
        assert_eq!(byte, [3]);
        assert_ne!(
            s1.translate(b + PAGE).unwrap().pfn,
            s2.translate(c + PAGE).unwrap().pfn
        );
        assert_eq!(s1.stats().rss_pages, 1);
        assert_eq!(s2.stats().rss_pages, 1);
        // Another thread unmaps the range this thread has cached.
        std::thread::scope(|sc| {
            sc.spawn(|| s1.munmap(b, 4 << 20).unwrap());
        });
        assert!(s1.touch(b + PAGE, true).is_err());
        drop(s2);
        let d = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
        s1.touch(d + PAGE, false).unwrap();
        assert_eq!(s1.stats().rss_pages, 1);
    }
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), before);
    mm.check().unwrap();
}

#[test]
fn numa_hint_faults_restore_the_entry() {
    let mm = mm();
    mm.drain_all_pages();
    let before = mm.nr_free_pages();
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(4 << 20, MapFlags::HUGE).unwrap();
        let b = s.mmap(4 * PAGE_SIZE, MapFlags::empty()).unwrap();
        s.write(a + 5, &[1, 2, 3]).unwrap();
        s.write(b + 4093, &[4, 5, 6, 7, 8, 9]).unwrap();
        assert_eq!(s.change_prot_numa(a, 4 << 20), 1); // one huge PMD
        assert_eq!(s.change_prot_numa(b, 4 * PAGE), 2);
        assert!(s.translate(a).unwrap().numa_hint);
        assert!(s.translate(b + PAGE).unwrap().numa_hint);
        let rss = s.stats().rss_pages;
        let mut buf = [0u8; 6];
        s.read(b + 4093, &mut buf).unwrap();
        assert_eq!(buf, [4, 5, 6, 7, 8, 9]);
        s.read(a + 5, &mut buf[..3]).unwrap();
        assert_eq!(buf[..3], [1, 2, 3]);
        for at in [a, b, b + PAGE] {
            let t = s.translate(at).unwrap();
            assert!(!t.numa_hint, "{t:?}");
        }
        assert_eq!(
            s.stats().rss_pages,
            rss,
            "a hinting fault allocates nothing"
        );
        // Hinting entries are still mapped pages: split and unmap them cleanly.
        s.change_prot_numa(a, 4 << 20);
        s.munmap(a + (1 << 20), 1 << 20).unwrap();
        let t = s.translate(a + 5).unwrap();
        assert!(t.numa_hint && t.order == 9 && !t.huge, "{t:?}");
        s.read(a + 5, &mut buf[..3]).unwrap();
        assert_eq!(buf[..3], [1, 2, 3]);
    }
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), before);
    mm.check().unwrap();
}

/// Writes `pte` into the PTE of `addr` (which must be mapped down to its PTE
/// table) and adds `used` to the table's count of entries.
fn set_pte(s: &crate::Space, addr: u64, pte: Pte, used_delta: i64) {
    let inner = &s.inner;
    let g = inner.read_lock();
    let (slot, _, level) = inner.follow_pte(&g, addr).unwrap();
    assert_eq!(level, 0);
    slot.store(pte.raw(), Ordering::Release);
    let mut t = inner.pgd;
    for level in [3, 2, 1] {
        t = Pte::from_raw(inner.tbl(&g, t)[pt_index(addr, level)].load(Ordering::Acquire)).pfn();
    }
    used(&inner.mm, t).fetch_add(used_delta as u64, Ordering::Relaxed);
}

/// A swap entry that names no device is a bad entry: the access fails (a
/// debug build stops at it) and it is counted, once per use (`swap_bad_entry`).
#[test]
fn swap_entries_fault_with_an_error_and_unmap() {
    let mm = mm();
    mm.drain_all_pages();
    let before = mm.nr_free_pages();
    let bad = |mm: &Mm| mm.vm_events().get(crate::VmEvent::SwapBadEntry);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(2 * PAGE_SIZE, MapFlags::empty()).unwrap();
        s.touch(a, true).unwrap();
        let swp = a + PAGE;
        assert!(s.translate(swp).is_none());
        set_pte(&s, swp, Pte::swap(SwapEntry::new(1, 42).unwrap()), 1);
        let touched =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.touch(swp, false)));
        assert_eq!(bad(&mm), 1);
        if cfg!(debug_assertions) {
            assert!(touched.is_err(), "a debug build stops at a bad entry");
            // The munmap below would stop too: take the entry out.
            set_pte(&s, swp, Pte::NONE, -1);
        } else {
            assert!(matches!(touched.unwrap(), Err(Error::Fault { .. })));
        }
        assert!(s.translate(swp).is_none());
        s.munmap(a, 2 * PAGE_SIZE).unwrap();
        assert_eq!(bad(&mm), if cfg!(debug_assertions) { 1 } else { 2 });
        assert_eq!(s.stats().pgtable_pages, 1);
    }
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), before);
    mm.check().unwrap();
}
