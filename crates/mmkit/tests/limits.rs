//! Exact limits, tried from outside as a user would.
//!
//! - The count of order-0 `Gfp::KERNEL` pages that can be had before
//!   `NoMemory` is exactly "free pages minus the min watermark", whatever the
//!   per-CPU lists and caches hold when the loop starts: after address spaces
//!   faulted from many threads, after random allocations and frees, and with
//!   many threads exhausting at once. A `KERNEL` allocation never takes the
//!   pages below min (an `ATOMIC` one still gets some after it), and fails only
//!   after every CPU's lists and caches were drained (they hold nothing then).
//! - Pages an address space owns (data pages, huge pages, table pages) cannot
//!   be freed, pinned or released through `free_pages` / `get_page` /
//!   `put_page`: the call is refused with `Error::OwnedBySpace` and changes
//!   nothing, so no other space ever sees their data.
//! - `munmap` needs no memory: splitting a huge page at the edge of the range
//!   uses the table deposited when it was mapped, so with memory exhausted it
//!   still succeeds, and what stays mapped keeps its content.

#[macro_use]
mod common;

use common::*;
use mmkit::{Error, Gfp, MapFlags, Mm, Pfn, Space, Variant, PMD_SIZE};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Allocates order-0 pages with `gfp` until `NoMemory`.
fn exhaust(mm: &Mm, gfp: Gfp) -> Vec<Pfn> {
    let mut got = Vec::new();
    loop {
        match mm.alloc_pages(gfp, 0) {
            Ok(p) => got.push(p),
            Err(Error::NoMemory { order: 0 }) => return got,
            Err(e) => panic!("order-0 alloc after {} pages: {e:?}", got.len()),
        }
    }
}

fn free_all(mm: &Mm, pages: &[Pfn]) {
    for &p in pages {
        mm.free_pages(p, 0).expect("free of an allocated page");
    }
}

/// What `KERNEL` may take of an idle allocator: every free page but the min
/// watermark of each zone.
fn kernel_allowance(mm: &Mm) -> u64 {
    mm.drain_all_pages();
    mm.zone_info()
        .iter()
        .map(|z| z.nr_free.saturating_sub(z.wmark[0]))
        .sum()
}

/// Exhausts with `KERNEL`, checks what is left is exactly the min reserve and
/// that an `ATOMIC` allocation can still dip into it; frees everything.
/// Returns the count.
fn exhaustion_count(mm: &Mm, what: &str) -> usize {
    let pages = exhaust(mm, Gfp::KERNEL);
    // Nothing was left on any per-CPU list or cache: the failure came after a
    // full drain, and the buddy lists are exactly at the min watermark.
    for z in mm.zone_info() {
        assert_eq!(z.nr_pcp, 0, "{what}: pages left on per-CPU lists");
        assert_eq!(
            z.nr_free, z.wmark[0],
            "{what}: KERNEL stopped away from the min watermark"
        );
    }
    let atomic = mm
        .alloc_pages(Gfp::ATOMIC, 0)
        .unwrap_or_else(|e| panic!("{what}: ATOMIC found no reserve below min: {e:?}"));
    mm.free_pages(atomic, 0).unwrap();
    free_all(mm, &pages);
    mm.check().unwrap();
    pages.len()
}

fn fault_from_threads(mm: &Mm, len: usize, threads: usize) {
    let space = Arc::new(mm.new_space().unwrap());
    let base = space.mmap(len, MapFlags::empty()).unwrap();
    let part = len / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            let space = &space;
            s.spawn(move || {
                let start = base + (t * part) as u64;
                for off in (0..part).step_by(PAGE) {
                    space.write(start + off as u64, &[t as u8 + 1]).unwrap();
                }
            });
        }
    });
    space.munmap(base, len).unwrap();
}

fn count_stable_after_faults(variant: Variant) {
    let mm = build(variant, None, 96 * MIB);
    let free0 = mm.nr_free_pages();
    let allowance = kernel_allowance(&mm);
    let fresh = exhaustion_count(&mm, "fresh");
    assert_eq!(fresh as u64, allowance, "KERNEL count is not free - min");
    for round in 0..3 {
        fault_from_threads(&mm, 40 << 20, 8);
        mm.wait_compaction_idle();
        assert_eq!(mm.nr_free_pages(), free0, "round {round}: pages leaked");
        // No drain: the per-CPU lists hold what the faulting threads left.
        let n = exhaustion_count(&mm, "after faults");
        assert_eq!(n, fresh, "round {round}: exhaustion count moved");
    }
    assert_eq!(mm.nr_free_pages(), free0);
}

per_variant! { count_stable_after_faults }

fn count_stable_after_random_churn(variant: Variant) {
    let mm = build(variant, None, 64 * MIB);
    let free0 = mm.nr_free_pages();
    let fresh = exhaustion_count(&mm, "fresh");
    std::thread::scope(|s| {
        for t in 0..16u64 {
            let mm = &mm;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut held: Vec<(Pfn, u32)> = Vec::new();
                for _ in 0..3000 {
                    if held.len() < 64 && rng.gen_bool(0.55) {
                        let order = rng.gen_range(0..=3);
                        if let Ok(p) = mm.alloc_pages(Gfp::KERNEL, order) {
                            held.push((p, order));
                        }
                    } else if !held.is_empty() {
                        let i = rng.gen_range(0..held.len());
                        let (p, o) = held.swap_remove(i);
                        mm.free_pages(p, o).unwrap();
                    }
                }
                for (p, o) in held {
                    mm.free_pages(p, o).unwrap();
                }
            });
        }
    });
    assert_eq!(mm.nr_free_pages(), free0);
    let n = exhaustion_count(&mm, "after churn");
    assert_eq!(n, fresh, "exhaustion count moved after random churn");
}

per_variant! { count_stable_after_random_churn }

/// Sixteen threads on two cores exhaust at once: together they get exactly the
/// allowance, each stops only after a full drain, and nothing is left behind.
fn concurrent_exhaustion_is_exact(variant: Variant) {
    let mm = build(variant, None, 64 * MIB);
    let free0 = mm.nr_free_pages();
    let allowance = kernel_allowance(&mm);
    for round in 0..2 {
        let got: Vec<Vec<Pfn>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|_| s.spawn(|| exhaust(&mm, Gfp::KERNEL)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let total: usize = got.iter().map(Vec::len).sum();
        assert_eq!(
            total as u64, allowance,
            "round {round}: threads got {total}"
        );
        for z in mm.zone_info() {
            assert_eq!(z.nr_pcp, 0, "round {round}: pages left on per-CPU lists");
            assert_eq!(z.nr_free, z.wmark[0], "round {round}: not at min");
        }
        let mut all: Vec<u64> = got.iter().flatten().map(|p| p.get()).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), total, "round {round}: a page handed out twice");
        for v in &got {
            free_all(&mm, v);
        }
        assert_eq!(mm.nr_free_pages(), free0);
        mm.check().unwrap();
    }
}

per_variant! { concurrent_exhaustion_is_exact }

/// Writes `tag` followed by the address into every 4 KiB page of the range.
fn stamp(space: &Space, base: u64, len: usize, tag: u8) {
    for off in (0..len).step_by(PAGE) {
        let va = base + off as u64;
        let mut b = [tag; 16];
        b[8..].copy_from_slice(&va.to_le_bytes());
        space.write(va, &b).unwrap();
    }
}

fn verify(space: &Space, base: u64, len: usize, tag: u8) {
    for off in (0..len).step_by(PAGE) {
        let va = base + off as u64;
        let mut b = [0u8; 16];
        space.read(va, &mut b).unwrap();
        let mut want = [tag; 16];
        want[8..].copy_from_slice(&va.to_le_bytes());
        assert_eq!(b, want, "page at {va:#x} changed");
    }
}

fn owned_pages_are_refused(variant: Variant) {
    let mm = build(variant, None, 64 * MIB);
    let free0 = mm.nr_free_pages();
    let a = mm.new_space().unwrap();
    let small = a.mmap(4 << 20, MapFlags::empty()).unwrap();
    let huge = a.mmap(4 << 20, MapFlags::HUGE).unwrap();
    stamp(&a, small, 4 << 20, 0xa1);
    stamp(&a, huge, 4 << 20, 0xa2);
    let mine = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
    let used = mm.nr_free_pages();
    // Every frame of the arena: nothing but `mine` may be freed, pinned or
    // released by a caller; the space's pages are refused as owned.
    let mut owned = 0;
    for pfn in 0..nr_spanned(64 * MIB) {
        let p = Pfn::new(pfn);
        if p == mine {
            continue;
        }
        for order in [0, 9] {
            match mm.free_pages(p, order) {
                Ok(()) => panic!("free_pages({pfn}, {order}) of a space's page succeeded"),
                Err(Error::OwnedBySpace { pfn: q }) => {
                    assert_eq!(q, pfn);
                    owned += 1;
                }
                Err(_) => {}
            }
        }
        assert!(mm.get_page(p).is_err(), "get_page({pfn}) succeeded");
        assert!(mm.put_page(p).is_err(), "put_page({pfn}) succeeded");
    }
    // 1024 data pages, 2 huge pages, at least the 4 tables of the path.
    assert!(owned >= 1024 + 2 + 4, "only {owned} owned blocks refused");
    let t = a.translate(small).unwrap();
    assert!(matches!(
        mm.free_pages(t.pfn, 0),
        Err(Error::OwnedBySpace { .. })
    ));
    let h = a.translate(huge).unwrap();
    assert!(matches!(
        mm.free_pages(h.head, 9),
        Err(Error::OwnedBySpace { .. })
    ));
    assert_eq!(mm.nr_free_pages(), used, "a refused call changed the count");
    mm.check().unwrap();
    // Another space's faults never get A's frames: A's data is intact and B
    // reads only zeros and what it wrote.
    let b = mm.new_space().unwrap();
    let bb = b.mmap(8 << 20, MapFlags::empty()).unwrap();
    let mut buf = [0u8; 16];
    for off in (0..8 << 20).step_by(PAGE) {
        b.read(bb + off as u64, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 16], "B saw data it did not write");
    }
    verify(&a, small, 4 << 20, 0xa1);
    verify(&a, huge, 4 << 20, 0xa2);
    // The caller's own page is still the caller's.
    mm.get_page(mine).unwrap();
    assert!(!mm.put_page(mine).unwrap());
    assert!(mm.put_page(mine).unwrap());
    drop(a);
    drop(b);
    mm.wait_compaction_idle();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

per_variant! { owned_pages_are_refused }

fn munmap_needs_no_memory(variant: Variant) {
    let mm = build(variant, None, 32 * MIB);
    let free0 = mm.nr_free_pages();
    let s = mm.new_space().unwrap();
    let len = 4 * PMD_SIZE as usize;
    let h = s.mmap(len, MapFlags::HUGE).unwrap();
    stamp(&s, h, len, 0x5a);
    let st = s.stats();
    if st.huge_pages < 2 {
        // No order-9 block at all: nothing to split.
        eprintln!("skipped: only {} huge pages were mapped", st.huge_pages);
        return;
    }
    // Take every page there is, the reserves included.
    let mut held = exhaust(&mm, Gfp::KERNEL);
    held.extend(exhaust(&mm, Gfp::ATOMIC));
    let before = s.stats();
    // Both ends of the range fall inside huge pages: two splits.
    let (lo, hi) = (h + (1 << 20), h + (3 << 20));
    s.munmap(lo, 2 << 20)
        .expect("munmap with memory exhausted must not fail");
    let after = s.stats();
    assert_eq!(after.rss_pages, before.rss_pages - 512);
    assert!(after.huge_pages < before.huge_pages);
    verify(&s, h, 1 << 20, 0x5a);
    verify(&s, hi, len - (3 << 20), 0x5a);
    let mut b = [0u8; 1];
    assert!(s.read(lo, &mut b).is_err(), "an unmapped page was readable");
    // A refused munmap changes nothing either.
    assert!(s.munmap(h + 4096 + 1, 4096).is_err());
    assert_eq!(s.stats(), after);
    free_all(&mm, &held);
    drop(s);
    mm.wait_compaction_idle();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

per_variant! { munmap_needs_no_memory }
