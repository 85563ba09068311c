//! Model-based property test of the page allocator.
//!
//! Random sequences of operations (allocate order 0..=10 with a random GFP
//! mask, free a random held block, drain the per-CPU lists) run against every
//! variant and both merge policies, checked against a reference model (a map
//! of held blocks pfn -> order): returned blocks are aligned, inside the arena,
//! disjoint from every held block, zeroed when `Gfp::ZERO` was asked for, and
//! a pattern written into each block survives until it is freed.
//! `nr_free_pages` moves by exactly 2^order per allocation/free, `check()`
//! holds throughout, and after freeing everything the free count returns to
//! its initial value and an order-10 block can be allocated again.

mod common;

use common::*;
use mmkit::{Error, Gfp, MergePolicy, Pfn, Variant};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MEM: u64 = 16 * MIB;
const MAX_OPS: usize = 300;
const CASES: u32 = 256;

#[derive(Clone, Copy, Debug)]
enum GfpKind {
    Kernel,
    Movable,
    Atomic,
    Reclaimable,
    KernelZero,
}

impl GfpKind {
    fn gfp(self) -> Gfp {
        match self {
            GfpKind::Kernel => Gfp::KERNEL,
            GfpKind::Movable => Gfp::MOVABLE,
            GfpKind::Atomic => Gfp::ATOMIC,
            GfpKind::Reclaimable => Gfp::RECLAIMABLE,
            GfpKind::KernelZero => Gfp::KERNEL | Gfp::ZERO,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc {
        order: u32,
        gfp: GfpKind,
    },
    /// Free the held block at index `pick % held.len()` (in pfn order).
    Free {
        pick: usize,
    },
    Drain,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let order = prop_oneof![4 => 0u32..=3, 1 => 4u32..=TOP_ORDER];
    let gfp = prop_oneof![
        Just(GfpKind::Kernel),
        Just(GfpKind::Movable),
        Just(GfpKind::Atomic),
        Just(GfpKind::Reclaimable),
        Just(GfpKind::KernelZero),
    ];
    prop_oneof![
        10 => (order, gfp).prop_map(|(order, gfp)| Op::Alloc { order, gfp }),
        8 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::Drain),
    ]
}

/// Pattern for page `page` of the block at `pfn`, allocation number `seq`.
fn stamp_value(pfn: u64, page: u64, seq: u64) -> u64 {
    (pfn ^ page) ^ (seq << 32) ^ 0x5a5a_0000_0000_0000
}

fn stamp(mm: &mmkit::Mm, pfn: u64, order: u32, seq: u64) {
    for page in 0..1u64 << order {
        let v = stamp_value(pfn, page, seq);
        write_word(mm, Pfn::new(pfn), page, 0, v);
        write_word(mm, Pfn::new(pfn), page, WORDS_PER_PAGE - 1, !v);
    }
}

fn verify(mm: &mmkit::Mm, pfn: u64, order: u32, seq: u64) -> Result<(), TestCaseError> {
    for page in 0..1u64 << order {
        let v = stamp_value(pfn, page, seq);
        let first = read_word(mm, Pfn::new(pfn), page, 0);
        let last = read_word(mm, Pfn::new(pfn), page, WORDS_PER_PAGE - 1);
        prop_assert_eq!(
            first,
            v,
            "block pfn {} order {}: first word of page {} overwritten while held",
            pfn,
            order,
            page
        );
        prop_assert_eq!(
            last,
            !v,
            "block pfn {} order {}: last word of page {} overwritten while held",
            pfn,
            order,
            page
        );
    }
    Ok(())
}

fn check_ok(mm: &mmkit::Mm, when: &str) -> Result<(), TestCaseError> {
    if let Err(e) = mm.check() {
        return Err(TestCaseError::fail(format!("check() failed {when}: {e:?}")));
    }
    Ok(())
}

fn run_model(variant: Variant, merge: MergePolicy, ops: &[Op]) -> Result<(), TestCaseError> {
    let mm = build(variant, Some(merge), MEM);
    let spanned = nr_spanned(MEM);
    let managed = mm.nr_managed_pages();
    let free0 = mm.nr_free_pages();
    prop_assert!(
        managed <= spanned,
        "managed {} > spanned {}",
        managed,
        spanned
    );
    prop_assert!(free0 <= managed, "free {} > managed {}", free0, managed);
    prop_assert!(
        free0 > spanned / 2,
        "only {} of {} pages free",
        free0,
        spanned
    );
    check_ok(&mm, "right after build")?;

    // pfn -> (order, allocation sequence number)
    let mut held: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    let mut held_pages = 0u64;
    let mut seq = 0u64;

    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { order, gfp } => {
                let n = 1u64 << order;
                let before = mm.nr_free_pages();
                match mm.alloc_pages(gfp.gfp(), order) {
                    Ok(pfn) => {
                        let p = pfn.get();
                        prop_assert_eq!(
                            p % n,
                            0,
                            "op {}: pfn {} not aligned to order {}",
                            i,
                            p,
                            order
                        );
                        prop_assert!(
                            p + n <= spanned,
                            "op {}: block pfn {} order {} outside the arena ({} pages)",
                            i,
                            p,
                            order,
                            spanned
                        );
                        if let Some((&q, &(qo, _))) = held.range(..p + n).next_back() {
                            prop_assert!(
                                q + (1u64 << qo) <= p,
                                "op {}: block pfn {} order {} overlaps held block pfn {} order {}",
                                i,
                                p,
                                order,
                                q,
                                qo
                            );
                        }
                        prop_assert_eq!(
                            mm.nr_free_pages(),
                            before - n,
                            "op {}: nr_free_pages after allocating order {}",
                            i,
                            order
                        );
                        if matches!(gfp, GfpKind::KernelZero) {
                            block_is_zero(&mm, pfn, order).map_err(TestCaseError::fail)?;
                        }
                        seq += 1;
                        stamp(&mm, p, order, seq);
                        held.insert(p, (order, seq));
                        held_pages += n;
                    }
                    Err(Error::NoMemory { order: o }) => {
                        prop_assert_eq!(o, order, "op {}: NoMemory reports the wrong order", i);
                        // With at most a quarter of the memory held (by at most
                        // MAX_OPS blocks) there are plenty of free, aligned
                        // order-3 regions: small allocations must not fail.
                        prop_assert!(
                            !(order <= 3 && held_pages * 4 < managed),
                            "op {}: order {} {:?} failed with NoMemory while only {} of {} pages are held",
                            i,
                            order,
                            gfp,
                            held_pages,
                            managed
                        );
                        prop_assert_eq!(
                            mm.nr_free_pages(),
                            before,
                            "op {}: failed alloc changed nr_free_pages",
                            i
                        );
                    }
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "op {i}: alloc order {order} {gfp:?} returned unexpected {e:?}"
                        )))
                    }
                }
            }
            Op::Free { pick } => {
                if held.is_empty() {
                    continue;
                }
                let (&p, &(order, s)) = held.iter().nth(pick % held.len()).unwrap();
                verify(&mm, p, order, s)?;
                let before = mm.nr_free_pages();
                if let Err(e) = mm.free_pages(Pfn::new(p), order) {
                    return Err(TestCaseError::fail(format!(
                        "op {i}: free of held block pfn {p} order {order} failed: {e:?}"
                    )));
                }
                prop_assert_eq!(
                    mm.nr_free_pages(),
                    before + (1u64 << order),
                    "op {}: nr_free_pages after freeing order {}",
                    i,
                    order
                );
                held.remove(&p);
                held_pages -= 1u64 << order;
            }
            Op::Drain => {
                let before = mm.nr_free_pages();
                mm.drain_all_pages();
                prop_assert_eq!(
                    mm.nr_free_pages(),
                    before,
                    "op {}: drain_all_pages changed nr_free_pages",
                    i
                );
            }
        }
        if i % 25 == 24 {
            check_ok(&mm, &format!("after op {i}"))?;
        }
        prop_assert_eq!(
            mm.nr_free_pages() + held_pages,
            free0,
            "op {}: free + held != initial free",
            i
        );
    }

    check_ok(&mm, "at the end of the sequence")?;
    for (&p, &(order, s)) in &held {
        verify(&mm, p, order, s)?;
        if let Err(e) = mm.free_pages(Pfn::new(p), order) {
            return Err(TestCaseError::fail(format!(
                "final free of pfn {p} order {order} failed: {e:?}"
            )));
        }
    }
    held.clear();
    check_ok(&mm, "after freeing everything")?;
    prop_assert_eq!(
        mm.nr_free_pages(),
        free0,
        "nr_free_pages after freeing everything"
    );
    mm.drain_all_pages();
    prop_assert_eq!(
        mm.nr_free_pages(),
        free0,
        "nr_free_pages after freeing everything and draining"
    );
    check_ok(&mm, "after freeing everything and draining")?;

    // Everything is free again: the largest order must be allocatable.
    let top = TOP_ORDER;
    match mm.alloc_pages(Gfp::KERNEL, top) {
        Ok(pfn) => {
            prop_assert_eq!(pfn.get() % (1u64 << top), 0);
            mm.free_pages(pfn, top).map_err(|e| {
                TestCaseError::fail(format!("freeing the order-{top} block: {e:?}"))
            })?;
        }
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "order-{top} allocation after freeing everything failed: {e:?}"
            )))
        }
    }
    prop_assert_eq!(mm.nr_free_pages(), free0);
    check_ok(&mm, "after the final order-10 round trip")?;
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op_strategy(), 1..=MAX_OPS)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn model_mmkit_merge_eager(ops in ops()) {
        run_model(Variant::Mmkit, MergePolicy::Eager, &ops)?;
    }

    #[test]
    fn model_mmkit_merge_lazy(ops in ops()) {
        run_model(Variant::Mmkit, MergePolicy::Lazy, &ops)?;
    }

    #[test]
    fn model_mmkit_eager_merge_eager(ops in ops()) {
        run_model(Variant::MmkitEager, MergePolicy::Eager, &ops)?;
    }

    #[test]
    fn model_mmkit_eager_merge_lazy(ops in ops()) {
        run_model(Variant::MmkitEager, MergePolicy::Lazy, &ops)?;
    }

    #[test]
    fn model_mmkit_nopcp_merge_eager(ops in ops()) {
        run_model(Variant::MmkitNoPcp, MergePolicy::Eager, &ops)?;
    }

    #[test]
    fn model_mmkit_nopcp_merge_lazy(ops in ops()) {
        run_model(Variant::MmkitNoPcp, MergePolicy::Lazy, &ops)?;
    }
}
