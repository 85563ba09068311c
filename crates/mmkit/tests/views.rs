//! The /proc-like views and statistics, for every variant.
//!
//! * `buddyinfo()`: a "Node 0, zone" line with 11 counts whose sum of
//!   count_k * 2^k equals `nr_free_pages` once the per-CPU lists are drained
//!   (fresh, fragmented, after an order-10 allocation), for both merge policies.
//! * `vmstat()`: `pgalloc N` / `pgfree N` grow by exactly the number of
//!   allocations / frees made (order 0, so pages and calls agree), and agree
//!   with `vm_events().get(VmEvent::PgAlloc)`.
//! * `pagetypeinfo()` names the Unmovable and Movable migrate types.
//! * `zone_lock_stats()`: acquisitions grow with every allocation and free
//!   when there are no per-CPU lists (MmkitNoPcp).
//! * The constants, `Variant` names and the auto traits of the contract.

#[macro_use]
mod common;

use common::*;
use mmkit::{Gfp, MergePolicy, Mm, Pfn, Variant, VmEvent};

const MEM: u64 = 32 * MIB;

/// The counts of every "Node 0, zone" line of buddyinfo.
fn buddyinfo_counts(mm: &Mm) -> Vec<[u64; 11]> {
    let text = mm.buddyinfo();
    let mut zones = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("Node 0, zone") else {
            continue;
        };
        let toks: Vec<&str> = rest.split_whitespace().collect();
        assert_eq!(
            toks.len(),
            12,
            "buddyinfo line {line:?}: want a zone name and 11 counts"
        );
        let mut counts = [0u64; 11];
        for (k, t) in toks[1..].iter().enumerate() {
            counts[k] = t
                .parse()
                .unwrap_or_else(|_| panic!("buddyinfo line {line:?}: count {t:?} is not a number"));
        }
        zones.push(counts);
    }
    assert!(
        !zones.is_empty(),
        "buddyinfo has no \"Node 0, zone\" line:\n{text}"
    );
    zones
}

fn buddyinfo_pages(mm: &Mm) -> u64 {
    buddyinfo_counts(mm)
        .iter()
        .flat_map(|c| c.iter().enumerate().map(|(k, &n)| n << k))
        .sum()
}

fn order10_blocks(mm: &Mm) -> u64 {
    buddyinfo_counts(mm).iter().map(|c| c[10]).sum()
}

fn buddyinfo_sums_to_free_pages(variant: Variant, merge: MergePolicy) {
    let mm = build(variant, Some(merge), MEM);
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    assert_eq!(
        buddyinfo_pages(&mm),
        free0,
        "fresh arena:\n{}",
        mm.buddyinfo()
    );
    assert!(
        order10_blocks(&mm) > 0,
        "fresh arena has no order-10 block:\n{}",
        mm.buddyinfo()
    );

    // Fragment: a mix of orders, free every third block.
    let mut held: Vec<(Pfn, u32)> = Vec::new();
    for i in 0..150u32 {
        let order = [0, 0, 1, 0, 2, 0, 3, 5][i as usize % 8];
        let gfp = if i & 1 == 0 {
            Gfp::KERNEL
        } else {
            Gfp::MOVABLE
        };
        held.push((mm.alloc_pages(gfp, order).expect("alloc"), order));
    }
    let mut kept = Vec::new();
    for (i, (p, o)) in held.into_iter().enumerate() {
        if i % 3 == 2 {
            mm.free_pages(p, o).expect("free");
        } else {
            kept.push((p, o));
        }
    }
    let held_pages: u64 = kept.iter().map(|&(_, o)| 1u64 << o).sum();
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0 - held_pages);
    assert_eq!(
        buddyinfo_pages(&mm),
        mm.nr_free_pages(),
        "fragmented arena:\n{}",
        mm.buddyinfo()
    );

    // An order-10 allocation takes exactly one order-10 block off the lists.
    let before = order10_blocks(&mm);
    let big = mm
        .alloc_pages(Gfp::KERNEL, TOP_ORDER)
        .expect("order-10 alloc");
    mm.drain_all_pages();
    assert_eq!(order10_blocks(&mm), before - 1, "{}", mm.buddyinfo());
    assert_eq!(buddyinfo_pages(&mm), mm.nr_free_pages());
    mm.free_pages(big, TOP_ORDER).unwrap();

    for (p, o) in kept {
        mm.free_pages(p, o).expect("free");
    }
    mm.drain_all_pages();
    assert_eq!(mm.nr_free_pages(), free0);
    assert_eq!(
        buddyinfo_pages(&mm),
        free0,
        "after freeing everything:\n{}",
        mm.buddyinfo()
    );
    mm.check().unwrap();
}

per_variant_and_merge! {
    buddyinfo_sums_to_free_pages,
}

/// The value of the `name N` line of vmstat (exactly one such line).
fn vmstat_value(text: &str, name: &str) -> u64 {
    let values: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            match (t.next(), t.next(), t.next()) {
                (Some(n), Some(v), None) if n == name => Some(
                    v.parse()
                        .unwrap_or_else(|_| panic!("vmstat line {l:?} has no number")),
                ),
                _ => None,
            }
        })
        .collect();
    assert_eq!(
        values.len(),
        1,
        "want exactly one `{name} N` line in vmstat:\n{text}"
    );
    values[0]
}

fn vmstat_counts_allocs_and_frees(variant: Variant) {
    let mm = build(variant, None, MEM);
    let v0 = mm.vmstat();
    let (alloc0, free0) = (vmstat_value(&v0, "pgalloc"), vmstat_value(&v0, "pgfree"));
    let ev0 = mm.vm_events().get(VmEvent::PgAlloc);

    let gfps = [Gfp::KERNEL, Gfp::MOVABLE, Gfp::ATOMIC, Gfp::RECLAIMABLE];
    let pages: Vec<Pfn> = (0..37)
        .map(|i| mm.alloc_pages(gfps[i % 4], 0).expect("alloc"))
        .collect();
    // A refused allocation and a refused free are not counted.
    assert!(mm.alloc_pages(Gfp::KERNEL, TOP_ORDER + 1).is_err());
    assert!(mm.free_pages(pages[0], 1).is_err());
    let (first, rest) = pages.split_at(23);
    for &p in first {
        mm.free_pages(p, 0).expect("free");
    }
    let v1 = mm.vmstat();
    assert_eq!(
        vmstat_value(&v1, "pgalloc") - alloc0,
        37,
        "pgalloc delta:\n{v1}"
    );
    assert_eq!(
        vmstat_value(&v1, "pgfree") - free0,
        23,
        "pgfree delta:\n{v1}"
    );
    assert_eq!(
        mm.vm_events().get(VmEvent::PgAlloc) - ev0,
        37,
        "VmEvent::PgAlloc delta"
    );

    for &p in rest {
        mm.free_pages(p, 0).expect("free");
    }
    // Draining moves pages between lists; it is neither an allocation nor a free.
    mm.drain_all_pages();
    let v2 = mm.vmstat();
    assert_eq!(
        vmstat_value(&v2, "pgalloc") - alloc0,
        37,
        "pgalloc delta:\n{v2}"
    );
    assert_eq!(
        vmstat_value(&v2, "pgfree") - free0,
        37,
        "pgfree delta:\n{v2}"
    );
    assert_eq!(
        mm.vm_events().get(VmEvent::PgAlloc),
        vmstat_value(&v2, "pgalloc") - alloc0 + ev0,
        "vm_events and vmstat disagree"
    );
}

fn pagetypeinfo_names_migratetypes(variant: Variant) {
    let mm = build(variant, None, MEM);
    let p = mm.alloc_pages(Gfp::MOVABLE, 0).unwrap();
    let text = mm.pagetypeinfo();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    for name in ["Unmovable", "Movable"] {
        assert!(
            words.contains(&name),
            "pagetypeinfo does not mention {name}:\n{text}"
        );
    }
    mm.free_pages(p, 0).unwrap();
}

fn zone_lock_taken_for_buddy_allocations(variant: Variant) {
    let mm = build(variant, None, MEM);
    let s0 = mm.zone_lock_stats();
    // Order 10 is never served from per-CPU lists: the zone lock is taken.
    let big = mm.alloc_pages(Gfp::KERNEL, TOP_ORDER).unwrap();
    let s1 = mm.zone_lock_stats();
    assert!(
        s1.since(&s0).acquisitions >= 1,
        "order-10 allocation did not take the zone lock"
    );
    mm.free_pages(big, TOP_ORDER).unwrap();
    let s2 = mm.zone_lock_stats();
    assert!(
        s2.acquisitions > s1.acquisitions,
        "order-10 free did not take the zone lock"
    );
    let d = s2.since(&s0);
    assert!(d.contended <= d.acquisitions);
    let pct = d.contended_pct();
    assert!((0.0..=100.0).contains(&pct), "contended_pct {pct}");
}

#[test]
fn zone_lock_stats_grow_with_nopcp() {
    let mm = build(Variant::MmkitNoPcp, None, MEM);
    let s0 = mm.zone_lock_stats();
    let pages: Vec<Pfn> = (0..50)
        .map(|_| mm.alloc_pages(Gfp::KERNEL, 0).unwrap())
        .collect();
    let s1 = mm.zone_lock_stats();
    let d = s1.since(&s0);
    assert!(
        d.acquisitions >= 50,
        "50 allocations without pcp took the zone lock {} times",
        d.acquisitions
    );
    for p in pages {
        mm.free_pages(p, 0).unwrap();
    }
    let d = mm.zone_lock_stats().since(&s1);
    assert!(
        d.acquisitions >= 50,
        "50 frees without pcp took the zone lock {} times",
        d.acquisitions
    );
    assert!(d.contended <= d.acquisitions);
}

per_variant! {
    vmstat_counts_allocs_and_frees,
    pagetypeinfo_names_migratetypes,
    zone_lock_taken_for_buddy_allocations,
}

#[test]
fn constants_match_contract() {
    assert_eq!(mmkit::PAGE_SIZE, 4096);
    assert_eq!(mmkit::MAX_ORDER, 10);
    assert_eq!(mmkit::PAGEBLOCK_ORDER, 9);
}

#[test]
fn variant_names_round_trip() {
    assert_eq!(Variant::Mmkit.name(), "mmkit");
    assert_eq!(Variant::MmkitEager.name(), "mmkit-eager");
    assert_eq!(Variant::MmkitNoPcp.name(), "mmkit-nopcp");
    assert_eq!(Variant::MmkitNoMerge.name(), "mmkit-nomerge");
    assert_eq!(Variant::MmkitSwap618.name(), "mmkit-swap-6.18");
    assert_eq!(Variant::ALL.len(), 7);
    for v in Variant::ALL {
        assert!(
            Variant::from_name(v.name()) == Some(v),
            "from_name({})",
            v.name()
        );
    }
    assert!(Variant::from_name("mmkit-eager") == Some(Variant::MmkitEager));
    assert!(Variant::from_name("linux").is_none());
    assert!(Variant::from_name("").is_none());
}

#[test]
fn api_auto_traits() {
    fn shared<T: Clone + Send + Sync + 'static>() {}
    fn key<T: Copy + Eq + Ord + std::hash::Hash + std::fmt::Debug>() {}
    shared::<Mm>();
    key::<Pfn>();
    assert_eq!(Pfn::new(12345).get(), 12345);
    assert!(Pfn::new(1) < Pfn::new(2));
}

#[test]
fn clones_share_one_allocator() {
    for v in Variant::ALL {
        let mm = build(v, None, MEM);
        let other = mm.clone();
        let free0 = mm.nr_free_pages();
        let p = other.alloc_pages(Gfp::KERNEL, 2).unwrap();
        assert_eq!(mm.nr_free_pages(), free0 - 4, "{}", v.name());
        mm.free_pages(p, 2).unwrap();
        assert_eq!(other.nr_free_pages(), free0, "{}", v.name());
        other.check().unwrap();
    }
}
