//! Address spaces: demand faults, huge pages and their fallback, partial and
//! parallel unmaps, refused input, the reverse map, concurrency, and that every
//! page (data and table) goes back to the allocator.
//!
//! Every test ends with `mm.check()` and, where a space is dropped, compares
//! `nr_free_pages()` (after `drain_all_pages()`) with its value before the space
//! existed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;

use mmkit::{Error, Gfp, MapFlags, Mm, Pfn, Pte, Space, SwapEntry, Variant, PMD_SIZE, TASK_SIZE};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;
const HUGE: usize = 2 * MIB;

fn mm_with(variant: Variant, mem: usize) -> Mm {
    Mm::builder()
        .memory(mem)
        .variant(variant)
        .build()
        .unwrap_or_else(|e| panic!("building a {mem}-byte mm ({}): {e}", variant.name()))
}

fn mm(mem: usize) -> Mm {
    mm_with(Variant::Mmkit, mem)
}

/// Fault-around off, for tests that count pages fault by fault.
fn mm_single(mem: usize) -> Mm {
    Mm::builder().memory(mem).fault_around(1).build().unwrap()
}

fn free_now(mm: &Mm) -> u64 {
    mm.drain_all_pages();
    mm.nr_free_pages()
}

fn check(mm: &Mm) {
    if let Err(e) = mm.check() {
        panic!("check(): {e}");
    }
}

/// A byte that depends on the address and a seed.
fn pat(addr: u64, seed: u8) -> u8 {
    let x = addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
    (x as u8) ^ seed
}

fn fill(space: &Space, addr: u64, len: usize, seed: u8) {
    let buf: Vec<u8> = (0..len as u64).map(|i| pat(addr + i, seed)).collect();
    space.write(addr, &buf).expect("write of a mapped range");
}

fn verify(space: &Space, addr: u64, len: usize, seed: u8) {
    let mut buf = vec![0u8; len];
    space.read(addr, &mut buf).expect("read of a mapped range");
    for (i, b) in buf.iter().enumerate() {
        let a = addr + i as u64;
        assert_eq!(*b, pat(a, seed), "byte at {a:#x} (offset {i})");
    }
}

fn is_bad(r: Result<(), Error>) -> bool {
    matches!(r, Err(Error::BadAddress { .. }))
}

#[test]
fn demand_zero() {
    let mm = mm_single(32 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(MIB, MapFlags::empty()).unwrap();
        assert_eq!(a % PAGE as u64, 0);
        assert!(
            s.translate(a).is_none(),
            "nothing is mapped before the first touch"
        );
        let mut buf = vec![0xAAu8; 3 * PAGE + 17];
        s.read(a + 100, &mut buf).unwrap();
        assert!(buf.iter().all(|b| *b == 0), "never-written bytes read 0");
        let t = s.translate(a).expect("mapped after the read fault");
        assert_eq!(t.order, 0);
        // The fault is the page's insertion (the LRU policy counts only a use
        // after it): mapped old and clean; a later access sets A.
        assert!(!t.accessed && !t.dirty, "a read fault sets neither: {t:?}");
        s.touch(a, false).unwrap();
        let t = s.translate(a).unwrap();
        assert!(t.accessed && !t.dirty, "a read sets A, not D: {t:?}");
        s.touch(a + 5 * PAGE as u64, true).unwrap();
        let t = s.translate(a + 5 * PAGE as u64).unwrap();
        assert!(!t.accessed && t.dirty, "a write fault sets D: {t:?}");
        s.touch(a + 5 * PAGE as u64, false).unwrap();
        assert!(s.translate(a + 5 * PAGE as u64).unwrap().accessed);
        let st = s.stats();
        assert_eq!(st.rss_pages, 5, "{st:?}");
        assert_eq!(st.vmas, 1);
        // The last byte of the mapping.
        let mut one = [1u8];
        s.read(a + MIB as u64 - 1, &mut one).unwrap();
        assert_eq!(one[0], 0);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

/// Fault-around batches cleared every way the fault path clears them: sparse
/// first writes (streaming stores, hot lines prefetched), dense ones (`with_page`,
/// page-sized writes: `rep stosb`), and every explicit strategy. The pages are
/// dirtied first and recycled, so a page left uncleared shows up; every byte reads
/// as written or zero.
#[test]
fn fault_around_clears_every_way() {
    use mmkit::ClearStrategy;
    const LEN: usize = 4 * MIB;
    for strategy in ClearStrategy::ALL {
        let mm = Mm::builder()
            .memory(32 * MIB)
            .clear(strategy)
            .build()
            .unwrap();
        assert!(mm.fault_around() > 1);
        let before = free_now(&mm);
        let s = mm.new_space().unwrap();
        // Dirty every page the loops below can get.
        let junk = s.mmap(LEN, MapFlags::empty()).unwrap();
        s.write(junk, &vec![0xEE; LEN]).unwrap();
        s.munmap(junk, LEN).unwrap();
        for round in 0..3u64 {
            let a = s.mmap(LEN, MapFlags::empty()).unwrap();
            let pages = (LEN / PAGE) as u64;
            for p in 0..pages {
                let base = a + p * PAGE as u64;
                // Sparse writes at offsets that move with the page and the round,
                // dense writes on every fifth page.
                let off = (p * 64 + round * 8) % PAGE as u64;
                match p % 5 {
                    0 => s.with_page(base, true, |b| b[off as usize] = 7).unwrap(),
                    1 => s.write(base, &[7u8; PAGE][..PAGE - off as usize]).unwrap(),
                    _ => s.write(base + off, &[7]).unwrap(),
                }
            }
            let mut buf = vec![0u8; LEN];
            s.read(a, &mut buf).unwrap();
            for p in 0..pages as usize {
                let off = ((p as u64 * 64 + round * 8) % PAGE as u64) as usize;
                let page = &buf[p * PAGE..(p + 1) * PAGE];
                for (i, &b) in page.iter().enumerate() {
                    let want = match p % 5 {
                        0 => u8::from(i == off) * 7,
                        1 => u8::from(i < PAGE - off) * 7,
                        _ => u8::from(i == off) * 7,
                    };
                    assert_eq!(b, want, "{strategy}: round {round} page {p} byte {i}");
                }
            }
            s.munmap(a, LEN).unwrap();
        }
        drop(s);
        assert_eq!(free_now(&mm), before, "{strategy}");
        check(&mm);
    }
}

#[test]
fn content_across_pages_and_mappings() {
    let mm = mm(64 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(8 * PAGE, MapFlags::empty()).unwrap();
        let b = s.mmap(8 * PAGE, MapFlags::empty()).unwrap();
        assert_eq!(b, a + 8 * PAGE as u64, "consecutive mappings are adjacent");
        // One write straddling both mappings and many pages.
        fill(&s, a + 3, 16 * PAGE - 6, 7);
        verify(&s, a + 3, 16 * PAGE - 6, 7);
        // Small pieces at page boundaries, then an overlapping rewrite.
        for p in 1..16u64 {
            let at = a + p * PAGE as u64 - 2;
            fill(&s, at, 4, p as u8);
            verify(&s, at, 4, p as u8);
        }
        fill(&s, a, 16 * PAGE, 9);
        verify(&s, a, 16 * PAGE, 9);
        // with_page sees the same bytes and its writes are seen by read.
        let at = a + 9 * PAGE as u64 + 123;
        let seen = s
            .with_page(at, true, |bytes| {
                assert_eq!(bytes.len(), PAGE);
                let v = bytes[123];
                bytes[123] = v.wrapping_add(1);
                v
            })
            .unwrap();
        assert_eq!(seen, pat(at, 9));
        let mut one = [0u8];
        s.read(at, &mut one).unwrap();
        assert_eq!(one[0], pat(at, 9).wrapping_add(1));
        assert_eq!(s.stats().rss_pages, 16);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn racing_first_touches_lose_no_write() {
    const THREADS: usize = 16;
    const PAGES: usize = 64;
    for flags in [MapFlags::empty(), MapFlags::HUGE] {
        let mm = mm(128 * MIB);
        let before = free_now(&mm);
        {
            let s = mm.new_space().unwrap();
            let len = if flags.contains(MapFlags::HUGE) {
                2 * HUGE
            } else {
                PAGES * PAGE
            };
            let a = s.mmap(len, flags).unwrap();
            let pages = len / PAGE;
            for round in 0..3u8 {
                let barrier = Barrier::new(THREADS);
                std::thread::scope(|sc| {
                    for t in 0..THREADS {
                        let (s, barrier) = (&s, &barrier);
                        sc.spawn(move || {
                            barrier.wait();
                            // Thread t owns offsets t, t + THREADS, ... of every page,
                            // in a per-thread page order so first touches collide.
                            for k in 0..pages {
                                let p = (k + t * 7) % pages;
                                let base = a + (p * PAGE) as u64;
                                for off in (t..PAGE).step_by(THREADS * 16) {
                                    let at = base + off as u64;
                                    match (round + t as u8) % 3 {
                                        0 => s.write(at, &[pat(at, round)]).unwrap(),
                                        1 => s
                                            .with_page(at, true, |b| {
                                                b[off] = pat(at, round);
                                            })
                                            .unwrap(),
                                        _ => {
                                            s.touch(at, true).unwrap();
                                            s.write(at, &[pat(at, round)]).unwrap()
                                        }
                                    }
                                }
                            }
                        });
                    }
                });
                for p in 0..pages {
                    let base = a + (p * PAGE) as u64;
                    let mut buf = vec![0u8; PAGE];
                    s.read(base, &mut buf).unwrap();
                    for t in 0..THREADS {
                        for off in (t..PAGE).step_by(THREADS * 16) {
                            let at = base + off as u64;
                            assert_eq!(buf[off], pat(at, round), "lost write at {at:#x}");
                        }
                    }
                }
                let st = s.stats();
                assert_eq!(st.rss_pages, pages as u64, "one page per address: {st:?}");
            }
            if flags.contains(MapFlags::HUGE) {
                assert_eq!(s.stats().huge_pages, 2);
            }
        }
        assert_eq!(free_now(&mm), before, "{flags:?}");
        check(&mm);
    }
}

#[test]
fn huge_pages_when_available() {
    let mm = mm_single(64 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let len = 8 * MIB + 3 * PAGE; // four huge pages and a tail of 4 KiB pages
        let a = s.mmap(len, MapFlags::HUGE).unwrap();
        assert_eq!(a % PMD_SIZE, 0, "HUGE mappings are 2 MiB aligned");
        // Fault each huge page in the middle: the faulting sub-page is cleared last,
        // but the whole page must read zero.
        for h in 0..4u64 {
            let at = a + h * PMD_SIZE + 300 * PAGE as u64 + 5;
            s.write(at, &[0x5A]).unwrap();
            let t = s.translate(at).unwrap();
            assert!(t.huge && t.order == 9, "{t:?}");
            assert_eq!(t.head.get() % 512, 0);
            assert_eq!(t.pfn.get(), t.head.get() + 300);
            assert_eq!(
                mm.rmap_lookup(t.pfn),
                Some((s.id(), at & !(PAGE as u64 - 1))),
                "rmap of an interior sub-page"
            );
            assert_eq!(mm.rmap_lookup(t.head), Some((s.id(), a + h * PMD_SIZE)));
        }
        let mut buf = vec![0xFFu8; 8 * MIB];
        s.read(a, &mut buf).unwrap();
        for (i, b) in buf.iter().enumerate() {
            let expect = if i % (2 * MIB) == 300 * PAGE + 5 {
                0x5A
            } else {
                0
            };
            assert_eq!(*b, expect, "offset {i}");
        }
        // The tail is not 2 MiB: order 0.
        let tail = a + 8 * MIB as u64;
        s.touch(tail + PAGE as u64, true).unwrap();
        let t = s.translate(tail + PAGE as u64).unwrap();
        assert!(!t.huge && t.order == 0, "{t:?}");
        let st = s.stats();
        assert_eq!(st.huge_faults, 4, "{st:?}");
        assert_eq!(st.huge_pages, 4);
        assert_eq!(st.rss_pages, 4 * 512 + 1);
        fill(&s, a, len, 3);
        verify(&s, a, len, 3);
        // populate steps over huge pages.
        let b = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
        s.populate(b, 4 * MIB, false).unwrap();
        assert_eq!(s.stats().huge_pages, 6);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn huge_falls_back_when_fragmented_or_full() {
    for full in [false, true] {
        let mm = mm(32 * MIB);
        let before = free_now(&mm);
        let s = mm.new_space().unwrap();
        let a = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
        // Take every page, then give back every other one (fragmented) or all but
        // a few hundred (full): no order-9 block is left.
        let mut held = Vec::new();
        while let Ok(p) = mm.alloc_pages(Gfp::KERNEL, 0) {
            held.push(p);
        }
        let keep: Vec<Pfn> = if full {
            let give = held.split_off(held.len() - 600);
            for p in give {
                mm.free_pages(p, 0).unwrap();
            }
            held
        } else {
            let mut keep = Vec::new();
            for (i, p) in held.into_iter().enumerate() {
                if i % 2 == 0 {
                    mm.free_pages(p, 0).unwrap();
                } else {
                    keep.push(p);
                }
            }
            keep
        };
        let len = if full { 256 * PAGE } else { 4 * MIB };
        fill(&s, a, len, 11);
        verify(&s, a, len, 11);
        let t = s.translate(a).unwrap();
        assert!(!t.huge && t.order == 0, "fallback to order 0: {t:?}");
        let st = s.stats();
        assert_eq!(st.huge_faults, 0, "{st:?}");
        assert!(st.huge_fallbacks > 0, "{st:?}");
        assert_eq!(st.rss_pages, (len / PAGE) as u64);
        // The fallback pages unmap cleanly, partially too.
        s.munmap(a + 8 * PAGE as u64, 8 * PAGE).unwrap();
        verify(&s, a, 8 * PAGE, 11);
        verify(&s, a + 16 * PAGE as u64, len - 16 * PAGE, 11);
        drop(s);
        for p in keep {
            mm.free_pages(p, 0).unwrap();
        }
        assert_eq!(free_now(&mm), before, "full = {full}");
        check(&mm);
    }
}

#[test]
fn out_of_memory_is_an_error() {
    let mm = mm(32 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(64 * MIB, MapFlags::empty()).unwrap();
        let mut oom = None;
        for p in 0..(64 * MIB / PAGE) as u64 {
            if let Err(e) = s.write(a + p * PAGE as u64, &[1]) {
                oom = Some(e);
                break;
            }
        }
        assert!(
            matches!(oom, Some(Error::NoMemory { .. })),
            "expected NoMemory, got {oom:?}"
        );
        // Still usable after unmapping part of it.
        s.munmap(a, 4 * MIB).unwrap();
        s.write(a + 8 * MIB as u64 + 1, &[2]).unwrap();
        check(&mm);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn partial_munmaps_leave_the_rest_intact() {
    let mm = mm(64 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let p = PAGE as u64;
        let a = s.mmap(16 * PAGE, MapFlags::empty()).unwrap();
        fill(&s, a, 16 * PAGE, 1);
        s.munmap(a, 2 * PAGE).unwrap(); // head
        s.munmap(a + 14 * p, 2 * PAGE).unwrap(); // tail
        s.munmap(a + 6 * p, 2 * PAGE + 1).unwrap(); // middle: split (len rounds up)
        assert_eq!(
            s.mappings(),
            vec![
                (a + 2 * p, a + 6 * p, MapFlags::empty()),
                (a + 9 * p, a + 14 * p, MapFlags::empty())
            ]
        );
        verify(&s, a + 2 * p, 4 * PAGE, 1);
        verify(&s, a + 9 * p, 5 * PAGE, 1);
        assert_eq!(s.stats().rss_pages, 9);
        for gone in [a, a + p, a + 6 * p, a + 8 * p, a + 14 * p, a + 15 * p] {
            let mut b = [0u8];
            assert!(is_bad(s.read(gone, &mut b)), "read of unmapped {gone:#x}");
            assert!(is_bad(s.write(gone, &[1])), "write of unmapped {gone:#x}");
            assert!(is_bad(s.touch(gone, false)));
            assert!(matches!(
                s.with_page(gone, false, |_| ()),
                Err(Error::BadAddress { .. })
            ));
            assert!(s.translate(gone).is_none());
        }
        // A range over a hole is refused as a whole and writes nothing.
        assert!(is_bad(s.write(a + 5 * p, &vec![9u8; 3 * PAGE])));
        verify(&s, a + 2 * p, 4 * PAGE, 1);
        // Unmapping across the hole (and beyond the ends) is fine, as in Linux.
        s.munmap(a, 16 * PAGE).unwrap();
        assert!(s.mappings().is_empty());
        let st = s.stats();
        assert_eq!((st.rss_pages, st.pgtable_pages), (0, 1), "{st:?}");

        // Huge mapping: unmap the middle of a huge page (split), then the rest.
        let h = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
        fill(&s, h, 4 * MIB, 2);
        assert_eq!(s.stats().huge_pages, 2);
        let cut = h + MIB as u64;
        s.munmap(cut, 2 * MIB).unwrap(); // straddles both huge pages
        let st = s.stats();
        assert_eq!(st.huge_pages, 0, "both split: {st:?}");
        assert_eq!(st.rss_pages, 512, "{st:?}");
        verify(&s, h, MIB, 2);
        verify(&s, h + 3 * MIB as u64, MIB, 2);
        assert!(is_bad(s.read(cut, &mut [0u8])));
        // rmap of the split sub-pages: their own address; unmapped ones: none.
        let t = s.translate(h + 5 * p).unwrap();
        assert!(t.order == 9 && !t.huge, "{t:?}");
        assert_eq!(mm.rmap_lookup(t.pfn), Some((s.id(), h + 5 * p)));
        assert_eq!(mm.rmap_lookup(Pfn::new(t.head.get() + 300)), None);
        // Refill the hole with a new fault path mapping? It stays a hole.
        s.munmap(h, MIB).unwrap();
        verify(&s, h + 3 * MIB as u64, MIB, 2);
        s.munmap(h + 3 * MIB as u64, MIB).unwrap();
        let st = s.stats();
        assert_eq!(
            (st.rss_pages, st.pgtable_pages, st.vmas),
            (0, 1, 0),
            "{st:?}"
        );
        check(&mm);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mm = mm(32 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(4 * PAGE, MapFlags::empty()).unwrap();
        fill(&s, a, 4 * PAGE, 4);
        let maps = s.mappings();
        let free = free_now(&mm);
        let stats = s.stats();
        let same = |what: &str| {
            assert_eq!(s.mappings(), maps, "{what}: mappings changed");
            assert_eq!(free_now(&mm), free, "{what}: nr_free_pages changed");
            assert_eq!(s.stats(), stats, "{what}: stats changed");
            verify(&s, a, 4 * PAGE, 4);
            check(&mm);
        };
        assert!(matches!(
            s.mmap(0, MapFlags::empty()),
            Err(Error::BadAddress { .. })
        ));
        same("mmap 0");
        assert!(matches!(
            s.mmap(usize::MAX, MapFlags::empty()),
            Err(Error::AddressSpaceFull { .. })
        ));
        assert!(matches!(
            s.mmap(1 << 47, MapFlags::HUGE),
            Err(Error::AddressSpaceFull { .. })
        ));
        same("mmap too big");
        let p = PAGE as u64;
        for (addr, len, what) in [
            (a, 0, "zero length"),
            (a + 1, PAGE, "unaligned"),
            (a + 2048, 2 * PAGE, "unaligned"),
            (!(p - 1), 2 * PAGE, "wraps"),
            (TASK_SIZE - p, 2 * PAGE, "leaves 2^47"),
            (TASK_SIZE, PAGE, "above 2^47"),
            (a, usize::MAX, "huge length"),
        ] {
            assert!(is_bad(s.munmap(addr, len)), "munmap {what}");
            assert!(
                is_bad(s.munmap_parallel(addr, len, 4)),
                "munmap_parallel {what}"
            );
            same(what);
        }
        let mut buf = [0u8; 8];
        for (addr, what) in [
            (a - p, "before the mapping"),
            (a + 4 * p - 4, "crosses the end"),
            (a + 4 * p, "after the mapping"),
            (0, "null"),
            (u64::MAX - 3, "wraps"),
            (TASK_SIZE - 4, "leaves 2^47"),
            (TASK_SIZE + 8, "above 2^47"),
        ] {
            assert!(is_bad(s.read(addr, &mut buf)), "read {what}");
            assert!(is_bad(s.write(addr, &[7u8; 8])), "write {what}");
            assert!(is_bad(s.populate(addr, 8, true)), "populate {what}");
            same(what);
        }
        for addr in [a + 4 * p, 0, u64::MAX, TASK_SIZE] {
            assert!(is_bad(s.touch(addr, true)));
            assert!(matches!(
                s.with_page(addr, true, |_| ()),
                Err(Error::BadAddress { .. })
            ));
            assert!(s.translate(addr).is_none());
            same("touch");
        }
        // Empty buffers are no-ops, wherever they point.
        s.read(0, &mut []).unwrap();
        s.write(u64::MAX, &[]).unwrap();
        same("empty");
        // Calls from inside with_page are refused, not deadlocked.
        let inner = s
            .with_page(a, true, |_| {
                (
                    s.read(a + p, &mut [0u8]),
                    s.munmap(a, PAGE),
                    s.touch(a, false),
                    s.mmap(PAGE, MapFlags::empty()).map(|_| ()),
                )
            })
            .unwrap();
        assert!(matches!(inner.0, Err(Error::Fault { .. })));
        assert!(matches!(inner.1, Err(Error::Fault { .. })));
        assert!(matches!(inner.2, Err(Error::Fault { .. })));
        assert!(matches!(inner.3, Err(Error::Fault { .. })));
        same("nested");
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn no_page_leaks_for_any_variant() {
    for v in Variant::ALL {
        let mm = mm_with(v, 64 * MIB);
        let before = free_now(&mm);
        for round in 0..2 {
            let s = mm.new_space().unwrap();
            let a = s.mmap(3 * MIB, MapFlags::empty()).unwrap();
            let h = s.mmap(6 * MIB + 5 * PAGE, MapFlags::HUGE).unwrap();
            fill(&s, a, 3 * MIB, round);
            fill(&s, h, 6 * MIB + 5 * PAGE, round);
            s.munmap(a + 8 * PAGE as u64, 16 * PAGE).unwrap();
            s.munmap(h + 3 * MIB as u64, MIB).unwrap();
            // Far apart addresses: separate upper-level tables.
            let far = s.mmap(PAGE, MapFlags::empty()).unwrap();
            s.write(far, &[1]).unwrap();
            verify(&s, a, 8 * PAGE, round);
            verify(&s, h, 3 * MIB, round);
            if round == 1 {
                s.munmap(a, 3 * MIB).unwrap();
            }
            assert!(mm.nr_free_pages() < before);
            drop(s);
            assert_eq!(free_now(&mm), before, "{} round {round}", v.name());
            check(&mm);
        }
        // An empty space, too.
        drop(mm.new_space().unwrap());
        assert_eq!(free_now(&mm), before, "{}", v.name());
        check(&mm);
    }
}

#[test]
fn munmap_parallel_frees_everything() {
    let mm = mm(256 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let len = 64 * MIB;
        let h = s.mmap(len, MapFlags::HUGE).unwrap();
        let n = s.mmap(len, MapFlags::empty()).unwrap();
        s.populate(h, len, true).unwrap();
        s.populate(n, len, true).unwrap();
        fill(&s, h + 5, 3 * PAGE, 6);
        let st = s.stats();
        assert_eq!(st.rss_pages, 2 * (len / PAGE) as u64, "{st:?}");
        // Ends inside huge pages: split first, then zap on 4 threads.
        let (cut_lo, cut_hi) = (h + MIB as u64, h + len as u64 - MIB as u64);
        s.munmap_parallel(cut_lo, (cut_hi - cut_lo) as usize, 4)
            .unwrap();
        verify(&s, h + 5, 3 * PAGE, 6);
        assert_eq!(s.stats().rss_pages, (len / PAGE) as u64 + 512);
        s.munmap_parallel(h, len, 7).unwrap();
        s.munmap_parallel(n, len, 16).unwrap();
        let st = s.stats();
        assert_eq!(
            (st.rss_pages, st.huge_pages, st.pgtable_pages, st.vmas),
            (0, 0, 1, 0),
            "{st:?}"
        );
        // Only the root table is left.
        assert_eq!(free_now(&mm), before - 1);
        // More threads than 2 MiB units, and one thread.
        let a = s.mmap(3 * PAGE, MapFlags::empty()).unwrap();
        fill(&s, a, 3 * PAGE, 1);
        s.munmap_parallel(a, 3 * PAGE, 64).unwrap();
        let b = s.mmap(5 * MIB, MapFlags::HUGE).unwrap();
        fill(&s, b, 5 * MIB, 1);
        s.munmap_parallel(b, 5 * MIB, 1).unwrap();
        assert_eq!(free_now(&mm), before - 1);
        check(&mm);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn reverse_map_follows_fault_and_unmap() {
    let mm = mm(32 * MIB);
    let s1 = mm.new_space().unwrap();
    let s2 = mm.new_space().unwrap();
    assert_ne!(s1.id(), s2.id());
    let a = s1.mmap(4 * PAGE, MapFlags::empty()).unwrap();
    let b = s2.mmap(4 * PAGE, MapFlags::empty()).unwrap();
    s1.touch(a + 2 * PAGE as u64, true).unwrap();
    s2.touch(b, false).unwrap();
    let t1 = s1.translate(a + 2 * PAGE as u64 + 9).unwrap();
    let t2 = s2.translate(b).unwrap();
    assert_eq!(mm.rmap_lookup(t1.pfn), Some((s1.id(), a + 2 * PAGE as u64)));
    assert_eq!(mm.rmap_lookup(t2.pfn), Some((s2.id(), b)));
    // A page allocated directly is not in the reverse map.
    let p = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
    assert_eq!(mm.rmap_lookup(p), None);
    mm.free_pages(p, 0).unwrap();
    s1.munmap(a, 4 * PAGE).unwrap();
    assert_eq!(mm.rmap_lookup(t1.pfn), None);
    drop(s2);
    assert_eq!(mm.rmap_lookup(t2.pfn), None);
    assert_eq!(mm.rmap_lookup(Pfn::new(u64::MAX)), None);
    check(&mm);
}

#[test]
fn with_page_pins_across_a_concurrent_munmap() {
    let mm = mm(32 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let a = s.mmap(4 * PAGE, MapFlags::empty()).unwrap();
        s.write(a, &[3]).unwrap();
        let inside = Barrier::new(2);
        let unmapped = Barrier::new(2);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                s.with_page(a, true, |bytes| {
                    inside.wait();
                    unmapped.wait(); // the range is gone, the page is not
                    assert_eq!(bytes[0], 3);
                    bytes[1] = 4;
                })
                .unwrap();
            });
            inside.wait();
            s.munmap(a, 4 * PAGE).unwrap();
            assert!(s.translate(a).is_none());
            unmapped.wait();
        });
        assert!(s.mappings().is_empty());
    }
    assert_eq!(
        free_now(&mm),
        before,
        "the pinned page is freed by its last put"
    );
    check(&mm);
}

#[test]
fn munmap_concurrent_with_access_elsewhere() {
    let mm = mm(128 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let stable = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
        let victim = s.mmap(4 * MIB, MapFlags::empty()).unwrap();
        fill(&s, stable, 4 * MIB, 5);
        let stop = AtomicBool::new(false);
        let failures = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for t in 0..6u64 {
                let (s, stop, failures) = (&s, &stop, &failures);
                sc.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // The stable range always works.
                        let at = stable + ((i * 4099 + t * 977) % (4 * MIB as u64 - 8));
                        let mut b = [0u8; 8];
                        s.read(at, &mut b).unwrap();
                        for (k, v) in b.iter().enumerate() {
                            assert_eq!(*v, pat(at + k as u64, 5));
                        }
                        // The victim range may be unmapped under us: an error, never
                        // a crash or a write into freed memory.
                        let v = victim + (i * 8191 % (4 * MIB as u64));
                        match s.write(v, &[1, 2, 3]) {
                            Ok(()) | Err(Error::BadAddress { .. }) => {}
                            Err(e) => panic!("unexpected {e:?}"),
                        }
                        if s.touch(v, false).is_err() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        i += 1;
                    }
                });
            }
            for _ in 0..50 {
                s.munmap(victim, 4 * MIB).unwrap();
                std::thread::yield_now();
                // Map it back at the same place (the lowest gap that fits).
                let again = s.mmap(4 * MIB, MapFlags::empty()).unwrap();
                assert_eq!(again, victim);
            }
            s.munmap_parallel(victim, 4 * MIB, 3).unwrap();
            // The accessors now fail on the victim range; wait for one to see it.
            let t0 = std::time::Instant::now();
            while failures.load(Ordering::Relaxed) == 0 && t0.elapsed().as_secs() < 30 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
        });
        verify(&s, stable, 4 * MIB, 5);
        assert!(failures.load(Ordering::Relaxed) > 0);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn pte_encoding_round_trips() {
    // Present leaf.
    let p = Pte::page(Pfn::new(0xABCDE), false).unwrap();
    assert!(p.is_present() && p.is_write() && !p.is_huge() && !p.is_swap() && !p.is_numa_hint());
    assert_eq!(p.pfn(), Pfn::new(0xABCDE));
    assert_eq!(Pte::from_raw(p.raw()), p);
    assert_eq!(p.raw() & 0xfff, 0b11, "present and write bits");
    let largest = Pfn::new((1 << 40) - 1);
    assert_eq!(Pte::page(largest, true).unwrap().pfn(), largest);
    assert!(Pte::page(Pfn::new(1 << 40), false).is_none());
    // Huge leaf: bit 7.
    let h = Pte::page(Pfn::new(512), true).unwrap();
    assert!(h.is_huge() && h.raw() & (1 << 7) != 0);
    // NUMA hint: present cleared, bit 8 set, the pfn and the other bits kept.
    let d = h.with(1 << 6); // dirty
    let n = d.mk_numa_hint();
    assert!(!n.is_present() && n.is_numa_hint() && !n.is_swap() && n.maps_page());
    assert_eq!(n.raw() & 1, 0);
    assert_ne!(n.raw() & (1 << 8), 0);
    assert_eq!(n.pfn(), Pfn::new(512));
    assert!(n.is_huge() && n.is_dirty());
    assert_eq!(n.swap_entry(), None);
    assert_eq!(n.clear_numa_hint(), d);
    assert_eq!(Pte::NONE.mk_numa_hint(), Pte::NONE);
    // Swap entries: non-present, non-hint, non-zero; type in bits 1..6, offset in 12..57.
    for (ty, off) in [
        (0, 0),
        (0, 1),
        (3, 0x1234_5678),
        (SwapEntry::MAX_TYPE, SwapEntry::MAX_OFFSET),
    ] {
        let e = SwapEntry::new(ty, off).unwrap();
        let s = Pte::swap(e);
        assert!(!s.is_none() && s.is_swap() && !s.is_present() && !s.is_numa_hint());
        assert!(!s.maps_page());
        assert_eq!(s.raw() & !((0x1f << 1) | (((1u64 << 45) - 1) << 12)), 0);
        assert_eq!(s.swap_entry(), Some(e), "type {ty} offset {off}");
        assert_eq!(Pte::from_raw(s.raw()).swap_entry(), Some(e));
    }
    assert!(SwapEntry::new(SwapEntry::MAX_TYPE + 1, 0).is_none());
    assert!(SwapEntry::new(0, SwapEntry::MAX_OFFSET + 1).is_none());
    assert_eq!(Pte::NONE.swap_entry(), None);
    assert!(Pte::NONE.is_none() && !Pte::NONE.is_swap());
}

#[test]
fn spaces_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Space>();
    // Many spaces at once and their ids.
    let mm = mm(32 * MIB);
    let before = free_now(&mm);
    let spaces: Vec<Space> = (0..50).map(|_| mm.new_space().unwrap()).collect();
    let mut ids: Vec<u64> = spaces.iter().map(|s| s.id()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 50);
    drop(spaces);
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

/// Anonymous fault-around: one fault populates the following empty entries of the
/// same page table and mapping (never beyond either), every page demand-zero and
/// independently unmappable, and nothing leaks.
#[test]
fn fault_around_populates_within_the_mapping_and_table() {
    let mm = Mm::builder()
        .memory(64 << 20)
        .fault_around(16)
        .build()
        .unwrap();
    mm.drain_all_pages();
    let before = mm.nr_free_pages();
    {
        let s = mm.new_space().unwrap();
        // 5 pages: a fault on the first populates all 5, not more.
        let a = s.mmap(5 * 4096, MapFlags::empty()).unwrap();
        s.write(a + 1, &[7]).unwrap();
        assert_eq!(s.stats().rss_pages, 5);
        for i in 0..5u64 {
            let t = s
                .translate(a + i * 4096)
                .expect("populated by fault-around");
            assert_eq!(t.order, 0);
            let mut b = [1u8; 4096];
            s.read(a + i * 4096, &mut b).unwrap();
            let expect_seven = i == 0;
            assert!(b
                .iter()
                .enumerate()
                .all(|(j, &x)| x == if expect_seven && j == 1 { 7 } else { 0 }));
        }
        // A fault in the middle of a large mapping populates at most 16 pages.
        let big = s.mmap(1 << 20, MapFlags::empty()).unwrap();
        let rss = s.stats().rss_pages;
        s.touch(big + 8 * 4096, true).unwrap();
        assert_eq!(s.stats().rss_pages, rss + 16);
        assert!(
            s.translate(big + 7 * 4096).is_none(),
            "nothing before the fault"
        );
        assert!(s.translate(big + 24 * 4096).is_none(), "at most 16 pages");
        // Pages of a batch unmap one by one.
        s.munmap(big + 10 * 4096, 4096).unwrap();
        assert!(s.translate(big + 9 * 4096).is_some());
        assert!(s.translate(big + 11 * 4096).is_some());
    }
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), before);
    mm.check().unwrap();
}
