//! Unit tests of the address-space internals that the integration tests
//! (`crates/mmkit/tests/space.rs`) cannot reach: the walk cache across unmaps and
//! spaces, the range walker (`pagewalk.rs`) and the NUMA scanner's budget over
//! holes (`mprotect.rs`), NUMA-hinting entries (`mprotect.rs` ->
//! `do_numa_page`), and faults on swap entries (`memory.rs` -> `do_swap_page`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::mmap::{Vma, VmaTree};
use super::mprotect::ProtNuma;
use super::pagewalk::{ControlFlow, MmWalk, MmWalkOps};
use super::{MapFlags, PAGE};
use crate::pgtable::{level_shift, pt_index, used, Pte, SwapEntry, PMD_SIZE};
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
        assert_eq!(s.change_prot_numa(a, 4 << 20), 512); // one huge PMD
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

/// A hint fault records its thread as the page's last accessor only while the
/// restored entry still maps that page: once another thread's hint fault or
/// reclaim has unmapped and freed it, the write would put last-cpupid bits
/// on a free frame (which `Mm::check` reports as corrupt). The stale case is
/// played here deterministically: the entry maps another page than the one
/// the fault found, a frame that is free now.
#[test]
fn hint_fault_records_its_accessor_only_on_a_page_still_mapped() {
    use crate::numa_balancing::Cpupid;
    use crate::Gfp;
    let mm = mm();
    let s = mm.new_space().unwrap();
    let a = s.mmap(PAGE_SIZE, MapFlags::empty()).unwrap();
    s.write(a, &[7]).unwrap();
    let mapped = s.translate(a).unwrap().pfn;
    let freed = mm.alloc_owned_pages(Gfp::MOVABLE, 0).unwrap();
    mm.free_owned_pages(freed, 0).unwrap();
    let this = Cpupid::from_page_bits(Cpupid::new(0, 5).to_page_bits());
    let inner = &s.inner;
    let g = inner.read_lock();
    let (slot, _, level) = inner.follow_pte(&g, a).unwrap();
    assert_eq!(level, 0);
    assert_eq!(inner.xchg_last_cpupid_mapped(slot, freed, this), None);
    let last = inner.xchg_last_cpupid_mapped(slot, mapped, this);
    assert!(last.is_some_and(Cpupid::is_unset), "{last:?}");
    assert_eq!(
        inner.xchg_last_cpupid_mapped(slot, mapped, this),
        Some(this)
    );
    drop(g);
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

/// Every callback of a walk, in order; breaks at the PTE of `stop_at`.
#[derive(Default)]
struct Record {
    ptes: Vec<(u64, Pte)>,
    pmds: Vec<(u64, u64)>,
    holes: Vec<(u64, u64, u32)>,
    stop_at: Option<u64>,
}

impl MmWalkOps for Record {
    type Break = u64;

    fn pmd_entry(
        &mut self,
        _: &MmWalk<'_>,
        _: &AtomicU64,
        e: Pte,
        addr: u64,
        next: u64,
    ) -> ControlFlow<u64> {
        assert!(e.is_huge());
        self.pmds.push((addr, next));
        ControlFlow::Continue(())
    }

    fn pte_entry(&mut self, _: &MmWalk<'_>, _: &AtomicU64, e: Pte, addr: u64) -> ControlFlow<u64> {
        self.ptes.push((addr, e));
        match self.stop_at {
            Some(at) if at == addr => ControlFlow::Break(addr),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pte_hole(&mut self, _: &MmWalk<'_>, addr: u64, next: u64, level: u32) -> ControlFlow<u64> {
        self.holes.push((addr, next, level));
        ControlFlow::Continue(())
    }
}

impl Record {
    /// The callbacks tile `[start, end)` in address order, each hole spans
    /// the rest of its missing table's range (so a missing upper table is
    /// skipped in one step).
    fn check_tiles(&self, start: u64, end: u64) {
        let mut spans: Vec<(u64, u64)> = self.ptes.iter().map(|&(a, _)| (a, a + PAGE)).collect();
        spans.extend(&self.pmds);
        spans.extend(self.holes.iter().map(|&(a, n, _)| (a, n)));
        spans.sort_unstable();
        let mut at = start;
        for (a, n) in spans {
            assert_eq!(a, at, "a gap or an overlap at {a:#x}");
            at = n;
        }
        assert_eq!(at, end);
        for &(a, n, level) in &self.holes {
            let span = 1u64 << level_shift(level);
            assert_eq!(n, ((a | (span - 1)) + 1).min(end), "hole {a:#x}..{n:#x}");
        }
    }
}

#[test]
fn walk_page_range_hands_over_leaves_and_skips_holes() {
    let mm = mm();
    let s = mm.new_space().unwrap();
    let h = s.mmap(4 << 20, MapFlags::HUGE).unwrap();
    s.write(h + 5, &[1]).unwrap();
    let b = s.mmap(3 << 30, MapFlags::empty()).unwrap();
    s.touch(b + 3 * PAGE, true).unwrap();
    let inner = &s.inner;
    let g = inner.read_lock();
    // A huge PMD, whole and from inside it; the empty second PMD is one hole.
    for from in [h, h + PAGE] {
        let mut r = Record::default();
        assert!(inner
            .walk_page_range(&g, from, h + (4 << 20), &mut r)
            .is_continue());
        assert_eq!(r.pmds, vec![(from, h + (2 << 20))]);
        assert_eq!(r.holes, vec![(h + (2 << 20), h + (4 << 20), 1)]);
        assert!(r.ptes.is_empty());
    }
    // 3 GiB with one PTE table: its PTEs, then holes; at least one missing
    // upper table of 1 GiB is one callback.
    let end = b + (3 << 30);
    let mut r = Record::default();
    assert!(inner.walk_page_range(&g, b, end, &mut r).is_continue());
    r.check_tiles(b, end);
    let present: Vec<u64> = r
        .ptes
        .iter()
        .filter(|(_, e)| !e.is_none())
        .map(|&(a, _)| a)
        .collect();
    assert_eq!(present, vec![b + 3 * PAGE]);
    assert!(r.holes.iter().any(|&(a, n, l)| l == 2 && n - a == 1 << 30));
    assert!(r.holes.len() < 2 * 512, "{} holes", r.holes.len());
    // Both VMAs in one walk (the gap between them is not reported), and a
    // range that meets no VMA.
    let (lo, hi) = (h.min(b), (h + (4 << 20)).max(end));
    let mut r = Record::default();
    assert!(inner.walk_page_range(&g, lo, hi, &mut r).is_continue());
    assert_eq!(r.pmds.len(), 1);
    assert_eq!(r.ptes.iter().filter(|(_, e)| !e.is_none()).count(), 1);
    let mut r = Record::default();
    assert!(inner
        .walk_page_range(&g, hi, hi + (1 << 30), &mut r)
        .is_continue());
    assert!(r.ptes.is_empty() && r.pmds.is_empty() && r.holes.is_empty());
}

#[test]
fn walk_page_range_stops_at_the_first_break() {
    let mm = mm();
    let s = mm.new_space().unwrap();
    let b = s.mmap(8 << 20, MapFlags::empty()).unwrap();
    s.touch(b + 3 * PAGE, true).unwrap();
    s.touch(b + (6 << 20), true).unwrap();
    let inner = &s.inner;
    let g = inner.read_lock();
    let mut r = Record {
        stop_at: Some(b + 3 * PAGE),
        ..Record::default()
    };
    let end = b + (8 << 20);
    assert_eq!(
        inner.walk_page_range(&g, b, end, &mut r),
        ControlFlow::Break(b + 3 * PAGE)
    );
    assert_eq!(r.ptes.last().unwrap().0, b + 3 * PAGE);
    assert!(r.holes.iter().all(|&(_, n, _)| n <= b + 3 * PAGE));
    assert!(r.pmds.is_empty());
}

/// The NUMA scanner's virtual budget over a hole counts as its old
/// PMD-by-PMD loop did: the same stop address and the same count, for holes
/// starting anywhere, of any length, at any budget left.
#[test]
fn prot_numa_counts_a_hole_as_pmd_steps() {
    fn pmd_steps(addr: u64, next: u64, mut seen: u64, max: u64) -> (Option<u64>, u64) {
        let mut a = addr;
        while a < next {
            if seen >= max {
                return (Some(a), seen);
            }
            let n = ((a | (PMD_SIZE - 1)) + 1).min(next);
            seen += (n - a) / PAGE;
            a = n;
        }
        (None, seen)
    }
    let tree = VmaTree::new(0, 1);
    let vma = Vma {
        start: 0,
        end: 1 << 40,
        flags: MapFlags::empty(),
        pol: 0,
        pgoff: 0,
    };
    let walk = MmWalk {
        held: &tree,
        vma: &vma,
    };
    let base = 1u64 << 30;
    for off in [
        0,
        PAGE,
        17 * PAGE,
        PMD_SIZE - PAGE,
        PMD_SIZE,
        3 * PMD_SIZE + 5 * PAGE,
    ] {
        for len in [PAGE, 300 * PAGE, PMD_SIZE, 5 * PMD_SIZE + 9 * PAGE, 1 << 30] {
            for seen in [0, 100, 511, 512, 2000] {
                for max in [1, 100, 512, 513, 1024, 2048, 3000, 1 << 20] {
                    let (addr, next) = (base + off, base + off + len);
                    let mut scan = ProtNuma::new(u64::MAX, max, |_, _| true);
                    scan.seen = seen;
                    let got = match scan.pte_hole(&walk, addr, next, 1) {
                        ControlFlow::Break(at) => Some(at),
                        ControlFlow::Continue(()) => None,
                    };
                    let want = pmd_steps(addr, next, seen, max);
                    assert_eq!((got, scan.seen), want, "{off:#x} {len:#x} {seen} {max}");
                }
            }
        }
    }
}

/// The scanner's walk (`change_prot_numa` with its budgets and filter) arms
/// exactly what a page-by-page model arms (one `follow_pte` per address, a
/// missing table stepped over to the end of its PMD: the scan loop
/// `task_numa_work` had before the range walker), stops at the same address
/// and counts the same pages, over VMAs with huge PMDs, sparse and dense PTE
/// tables and large holes, from many start points and budgets.
#[test]
fn change_prot_numa_matches_a_page_by_page_model() {
    let mm = mm();
    let s = mm.new_space().unwrap();
    let h = s.mmap(6 << 20, MapFlags::HUGE).unwrap();
    s.write(h, &[1]).unwrap();
    s.write(h + (4 << 20) + 9 * PAGE, &[2]).unwrap();
    let sparse = s.mmap(3 << 30, MapFlags::empty()).unwrap();
    let dense = s.mmap(3 << 20, MapFlags::empty()).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for _ in 0..200 {
        s.touch(sparse + rnd(3 << 18) * PAGE, true).unwrap();
    }
    for i in 0..700 {
        s.touch(dense + i * PAGE, false).unwrap();
    }
    let filter = |a: u64| !(a / PAGE).is_multiple_of(3);
    let model = |start: u64, max_marked: u64, max_seen: u64| {
        let inner = &s.inner;
        let g = inner.read_lock();
        let (mut marked, mut seen, mut armed) = (0, 0, Vec::new());
        for vma in g.map.values().filter(|v| v.end > start) {
            let mut a = vma.start.max(start);
            while a < vma.end {
                if marked >= max_marked || seen >= max_seen {
                    return (Some(a), marked, seen, armed);
                }
                let Some((_, e, level)) = inner.follow_pte(&g, a) else {
                    let n = ((a | (PMD_SIZE - 1)) + 1).min(vma.end);
                    seen += (n - a) / PAGE;
                    a = n;
                    continue;
                };
                let pages = if level == 1 { 512 } else { 1 };
                seen += pages;
                if e.is_present() && filter(a) {
                    marked += pages;
                    armed.push(a);
                }
                a = if level == 1 {
                    (a & !(PMD_SIZE - 1)) + PMD_SIZE
                } else {
                    a + PAGE
                };
            }
        }
        (None, marked, seen, armed)
    };
    let lo = h.min(sparse).min(dense);
    let mut starts = vec![0, lo, h + PAGE, sparse, dense + 5 * PAGE];
    starts.extend((0..6).map(|_| sparse + rnd(3 << 18) * PAGE));
    let mut runs = 0;
    for &start in &starts {
        for max_marked in [1, 7, 256, 513, 1500, u64::MAX] {
            for max_seen in [1, 100, 600, 2048, 70_000, u64::MAX] {
                let want = model(start, max_marked, max_seen);
                let inner = &s.inner;
                let mut scan = ProtNuma::new(max_marked, max_seen, |a, _| filter(a));
                let stop = {
                    let g = inner.read_lock();
                    inner.change_prot_numa(&g, start, crate::pgtable::TASK_SIZE, &mut scan)
                };
                let ctx = format!("start {start:#x} marked<{max_marked} seen<{max_seen}");
                assert_eq!(
                    (stop, scan.marked, scan.seen),
                    (want.0, want.1, want.2),
                    "{ctx}"
                );
                for &a in &want.3 {
                    assert!(s.translate(a).unwrap().numa_hint, "{a:#x} {ctx}");
                    // The hint fault restores it for the next run.
                    s.touch(a, false).unwrap();
                }
                runs += usize::from(!want.3.is_empty());
            }
        }
    }
    assert!(runs > 100, "only {runs} runs armed anything");
}
