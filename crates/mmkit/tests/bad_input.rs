//! Refused operations and exhaustion, for every variant.
//!
//! Every refused free (never-allocated pfn, double free, wrong order bigger and
//! smaller, interior page of a block, pfn outside the arena, misaligned pfn,
//! order above MAX_ORDER) must return the right `Error` variant and change
//! nothing: `nr_free_pages` and `check()` are unchanged and the real block can
//! still be freed afterwards. Invalid orders are refused by `alloc_pages` too.
//!
//! Exhaustion (for each variant and merge policy): order-0 allocations end in
//! `NoMemory` without a panic, the count is the same on a second round, and
//! after freeing everything the free count is back and an order-10 block can
//! be allocated. `ATOMIC` may take at least as many pages as `KERNEL` but
//! still ends in `NoMemory`. An order-10 allocation in a fragmented arena
//! (every other page held) fails with `NoMemory` and succeeds after freeing.

#[macro_use]
mod common;

use common::*;
use mmkit::{Error, Gfp, MergePolicy, Mm, Pfn, Variant};
use std::collections::HashSet;

const MEM: u64 = 32 * MIB;

/// Free `pfn`/`order`, expect a refusal matching `expected`, and check that
/// nothing changed.
fn assert_refused(mm: &Mm, pfn: u64, order: u32, what: &str, expected: impl Fn(&Error) -> bool) {
    let before = mm.nr_free_pages();
    match mm.free_pages(Pfn::new(pfn), order) {
        Ok(()) => panic!("{what}: free_pages({pfn}, {order}) succeeded"),
        Err(e) => assert!(
            expected(&e),
            "{what}: free_pages({pfn}, {order}) returned the wrong error {e:?}"
        ),
    }
    assert_eq!(
        mm.nr_free_pages(),
        before,
        "{what}: refused free_pages({pfn}, {order}) changed nr_free_pages"
    );
    if let Err(e) = mm.check() {
        panic!("{what}: check() after refused free_pages({pfn}, {order}): {e:?}");
    }
}

fn not_allocated(pfn: u64) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::NotAllocated { pfn: p } if *p == pfn)
}

fn alloc(mm: &Mm, gfp: Gfp, order: u32) -> Pfn {
    mm.alloc_pages(gfp, order)
        .unwrap_or_else(|e| panic!("alloc order {order} failed: {e:?}"))
}

fn free(mm: &Mm, pfn: Pfn, order: u32) {
    mm.free_pages(pfn, order).unwrap_or_else(|e| {
        panic!(
            "free of allocated pfn {} order {order} failed: {e:?}",
            pfn.get()
        )
    });
}

fn free_never_allocated(variant: Variant) {
    let mm = build(variant, None, MEM);
    let spanned = nr_spanned(MEM);
    // Some state: a few live blocks, and a few freed ones (on per-CPU lists).
    let live: Vec<Pfn> = (0..8).map(|_| alloc(&mm, Gfp::KERNEL, 0)).collect();
    let gone: Vec<Pfn> = (0..8).map(|_| alloc(&mm, Gfp::KERNEL, 0)).collect();
    for &p in &gone {
        free(&mm, p, 0);
    }
    let live_set: HashSet<u64> = live.iter().map(|p| p.get()).collect();
    for pfn in [spanned / 2, spanned / 2 + 1, spanned - 1, 1, 0, 4097] {
        if !live_set.contains(&pfn) {
            assert_refused(&mm, pfn, 0, "never allocated", not_allocated(pfn));
        }
    }
    for &p in &live {
        free(&mm, p, 0);
    }
    mm.check().unwrap();
}

fn double_free(variant: Variant) {
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    for order in 0..=3 {
        // Straight after the first free (the block may sit on a per-CPU list).
        let p = alloc(&mm, Gfp::KERNEL, order);
        free(&mm, p, order);
        assert_refused(&mm, p.get(), order, "double free", not_allocated(p.get()));
        // After draining (the block is on the buddy lists, maybe merged).
        let p = alloc(&mm, Gfp::MOVABLE, order);
        free(&mm, p, order);
        mm.drain_all_pages();
        assert_refused(
            &mm,
            p.get(),
            order,
            "double free after drain",
            not_allocated(p.get()),
        );
        // Freed while a neighbour is still held.
        let a = alloc(&mm, Gfp::KERNEL, order);
        let b = alloc(&mm, Gfp::KERNEL, order);
        free(&mm, a, order);
        assert_refused(
            &mm,
            a.get(),
            order,
            "double free next to a held block",
            not_allocated(a.get()),
        );
        free(&mm, b, order);
        assert_refused(
            &mm,
            b.get(),
            order,
            "double free of the second block",
            not_allocated(b.get()),
        );
    }
    assert_eq!(mm.nr_free_pages(), free0);
    // The allocator still hands out pages normally.
    let p = alloc(&mm, Gfp::KERNEL, 0);
    free(&mm, p, 0);
    assert_eq!(mm.nr_free_pages(), free0);
}

fn wrong_order(variant: Variant) {
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    // An order-2 block that is also aligned to order 3, so that freeing it as
    // order 3 is well aligned and only the order is wrong.
    let mut others = Vec::new();
    let p = loop {
        let p = alloc(&mm, Gfp::KERNEL, 2);
        if p.get() & 7 == 0 {
            break p;
        }
        others.push(p);
        assert!(
            others.len() < 64,
            "no order-3 aligned order-2 block in 64 tries"
        );
    };
    let pfn = p.get();
    for given in [3u32, 1, 0] {
        assert_refused(
            &mm,
            pfn,
            given,
            "wrong order",
            |e| matches!(e, Error::WrongOrder { pfn: q, allocated: 2, given: g } if *q == pfn && *g == given),
        );
    }
    free(&mm, p, 2);
    for q in others {
        free(&mm, q, 2);
    }
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

fn interior_page(variant: Variant) {
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    let p = alloc(&mm, Gfp::KERNEL, 3);
    let base = p.get();
    for (off, order) in [(1u64, 0u32), (4, 2), (7, 0), (2, 1), (6, 1)] {
        let pfn = base + off;
        assert_refused(
            &mm,
            pfn,
            order,
            "interior page of an order-3 block",
            not_allocated(pfn),
        );
    }
    free(&mm, p, 3);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

fn out_of_range(variant: Variant) {
    let mm = build(variant, None, MEM);
    let spanned = nr_spanned(MEM);
    let held = alloc(&mm, Gfp::KERNEL, 0);
    for (pfn, order) in [
        (spanned, 0u32),
        (spanned + 1, 0),
        (spanned, 3),
        (spanned + 1024, 10),
        (spanned * 2, 0),
        (1 << 40, 0),
        (u64::MAX, 0),
        (u64::MAX - 1023, 0),
    ] {
        assert_refused(
            &mm,
            pfn,
            order,
            "outside the arena",
            |e| matches!(e, Error::OutOfRange { pfn: q } if *q == pfn),
        );
    }
    free(&mm, held, 0);
    mm.check().unwrap();
}

fn misaligned(variant: Variant) {
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    let p = alloc(&mm, Gfp::KERNEL, 3);
    let base = p.get();
    for (pfn, order) in [
        (base + 1, 1u32),
        (base + 2, 2),
        (base + 2, 3),
        (base + 4, 3),
        (base + 1, 3),
        (1, 10),
        (512, 10),
        (1, 1),
    ] {
        assert_refused(
            &mm,
            pfn,
            order,
            "misaligned",
            |e| matches!(e, Error::Misaligned { pfn: q, order: o } if *q == pfn && *o == order),
        );
    }
    free(&mm, p, 3);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

fn invalid_order(variant: Variant) {
    let mm = build(variant, None, MEM);
    let free0 = mm.nr_free_pages();
    for order in [TOP_ORDER + 1, TOP_ORDER + 2, 31, 32, 63, 64, u32::MAX] {
        for gfp in [Gfp::KERNEL, Gfp::ATOMIC, Gfp::KERNEL | Gfp::ZERO] {
            match mm.alloc_pages(gfp, order) {
                Err(Error::InvalidOrder { order: o }) => assert_eq!(o, order),
                other => panic!("alloc_pages(_, {order}) returned {other:?}, want InvalidOrder"),
            }
            assert_eq!(mm.nr_free_pages(), free0, "refused alloc of order {order}");
        }
        assert_refused(
            &mm,
            0,
            order,
            "invalid order",
            |e| matches!(e, Error::InvalidOrder { order: o } if *o == order),
        );
    }
    // Invalid order on an allocated block: refused, and the block survives.
    let p = alloc(&mm, Gfp::KERNEL, TOP_ORDER);
    assert_refused(
        &mm,
        p.get(),
        TOP_ORDER + 1,
        "invalid order on a held block",
        |e| matches!(e, Error::InvalidOrder { order: o } if *o == TOP_ORDER + 1),
    );
    free(&mm, p, TOP_ORDER);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

per_variant! {
    free_never_allocated,
    double_free,
    wrong_order,
    interior_page,
    out_of_range,
    misaligned,
    invalid_order,
}

/// Allocate order-0 pages with `gfp` until `NoMemory`; the pages are distinct.
fn exhaust(mm: &Mm, gfp: Gfp, what: &str) -> Vec<Pfn> {
    let spanned = nr_spanned(MEM);
    let mut got = Vec::new();
    let mut seen = HashSet::new();
    loop {
        match mm.alloc_pages(gfp, 0) {
            Ok(p) => {
                assert!(
                    p.get() < spanned,
                    "{what}: pfn {} outside the arena",
                    p.get()
                );
                assert!(
                    seen.insert(p.get()),
                    "{what}: pfn {} handed out twice",
                    p.get()
                );
                got.push(p);
                assert!(
                    got.len() as u64 <= spanned,
                    "{what}: more order-0 pages than the arena has"
                );
            }
            Err(Error::NoMemory { order: 0 }) => return got,
            Err(e) => panic!("{what}: order-0 alloc after {} pages: {e:?}", got.len()),
        }
    }
}

fn free_all(mm: &Mm, pages: Vec<Pfn>) {
    for p in pages {
        free(mm, p, 0);
    }
}

fn exhaustion(variant: Variant, merge: MergePolicy) {
    pin_to_current_cpu();
    let mm = build(variant, Some(merge), MEM);
    let free0 = mm.nr_free_pages();
    let first = exhaust(&mm, Gfp::KERNEL, "first round");
    assert!(
        first.len() as u64 > free0 / 2,
        "only {} of {free0} free pages could be allocated",
        first.len()
    );
    assert!(first.len() as u64 <= free0);
    mm.check().expect("check() while exhausted");
    // Still refused when asked again, and a bigger order is refused too.
    assert!(matches!(
        mm.alloc_pages(Gfp::KERNEL, 0),
        Err(Error::NoMemory { order: 0 })
    ));
    assert!(matches!(
        mm.alloc_pages(Gfp::KERNEL, 3),
        Err(Error::NoMemory { order: 3 })
    ));
    let n = first.len();
    free_all(&mm, first);
    assert_eq!(
        mm.nr_free_pages(),
        free0,
        "nr_free_pages after freeing the first round"
    );
    mm.check().expect("check() after the first round");
    // No drain: the count does not depend on what the per-CPU lists hold
    // (the zone's free count is checked before a list is touched, and the
    // slow path drains every list before it fails).

    let second = exhaust(&mm, Gfp::KERNEL, "second round");
    assert_eq!(
        second.len(),
        n,
        "second exhaustion got a different number of pages"
    );
    free_all(&mm, second);
    assert_eq!(
        mm.nr_free_pages(),
        free0,
        "nr_free_pages after freeing the second round"
    );
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().expect("check() after the second round");

    let big = mm
        .alloc_pages(Gfp::KERNEL, TOP_ORDER)
        .unwrap_or_else(|e| panic!("order-{TOP_ORDER} alloc after freeing everything: {e:?}"));
    free(&mm, big, TOP_ORDER);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

fn atomic_exhaustion(variant: Variant, merge: MergePolicy) {
    pin_to_current_cpu();
    let mm = build(variant, Some(merge), MEM);
    let free0 = mm.nr_free_pages();
    let kernel = exhaust(&mm, Gfp::KERNEL, "KERNEL");
    let k = kernel.len();
    free_all(&mm, kernel);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.drain_all_pages();

    let atomic = exhaust(&mm, Gfp::ATOMIC, "ATOMIC");
    let a = atomic.len();
    assert!(a >= k, "ATOMIC got {a} pages, fewer than KERNEL's {k}");
    assert!(
        a as u64 <= free0,
        "ATOMIC got {a} pages, more than the {free0} free"
    );
    mm.check().expect("check() while exhausted by ATOMIC");
    // What ATOMIC left is below KERNEL's watermark.
    assert!(matches!(
        mm.alloc_pages(Gfp::KERNEL, 0),
        Err(Error::NoMemory { order: 0 })
    ));
    free_all(&mm, atomic);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
    mm.drain_all_pages();

    // KERNEL after the ATOMIC dip: usable and unchanged.
    let again = exhaust(&mm, Gfp::KERNEL, "KERNEL after ATOMIC");
    assert_eq!(
        again.len(),
        k,
        "KERNEL count changed after an ATOMIC exhaustion"
    );
    free_all(&mm, again);
    assert_eq!(mm.nr_free_pages(), free0);
    let big = alloc(&mm, Gfp::KERNEL, TOP_ORDER);
    free(&mm, big, TOP_ORDER);
    mm.check().unwrap();
}

fn fragmented_order10(variant: Variant, merge: MergePolicy) {
    let mm = build(variant, Some(merge), MEM);
    let free0 = mm.nr_free_pages();
    let mut pages = exhaust(&mm, Gfp::KERNEL, "KERNEL");
    pages.extend(exhaust(&mm, Gfp::ATOMIC, "ATOMIC"));
    // Free every odd pfn: every other page stays held.
    let (odd, even): (Vec<Pfn>, Vec<Pfn>) = pages.into_iter().partition(|p| p.get() % 2 == 1);
    assert!(odd.len() as u64 > free0 / 4 && even.len() as u64 > free0 / 4);
    let n_odd = odd.len() as u64;
    let before = mm.nr_free_pages();
    free_all(&mm, odd);
    assert_eq!(mm.nr_free_pages(), before + n_odd);
    mm.check().expect("check() in the fragmented state");

    for gfp in [Gfp::KERNEL, Gfp::MOVABLE, Gfp::ATOMIC] {
        match mm.alloc_pages(gfp, TOP_ORDER) {
            Err(Error::NoMemory { order }) => assert_eq!(order, TOP_ORDER),
            other => {
                panic!("order-{TOP_ORDER} alloc with every other page held returned {other:?}")
            }
        }
    }
    assert_eq!(
        mm.nr_free_pages(),
        before + n_odd,
        "failed allocations changed nr_free_pages"
    );
    mm.check()
        .expect("check() after the failed order-10 allocations");

    free_all(&mm, even);
    assert_eq!(mm.nr_free_pages(), free0);
    let big = mm
        .alloc_pages(Gfp::KERNEL, TOP_ORDER)
        .unwrap_or_else(|e| panic!("order-{TOP_ORDER} alloc after defragmenting: {e:?}"));
    assert_eq!(big.get() % (1 << TOP_ORDER), 0);
    free(&mm, big, TOP_ORDER);
    assert_eq!(mm.nr_free_pages(), free0);
    mm.check().unwrap();
}

per_variant_and_merge! {
    exhaustion,
    atomic_exhaustion,
    fragmented_order10,
}
