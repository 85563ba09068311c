//! NUMA placement, tried from outside on emulated
//! topologies over small arenas:
//!
//! - the arena split per node, `node_of`, `alloc_pages_node` on every node and
//!   `BadNode`; exhaustion of a node falls back along its zonelist, and
//!   `Gfp::THISNODE` does not (exact counts: free pages above the node's min);
//! - the `numa_*` counters add up (hit, miss, foreign, interleave, local, other);
//! - placement of faulted pages by every policy: bind exact, interleave exact
//!   round robin by page offset, weighted interleave exact, preferred falling
//!   back when its node is full, preferred-many, local, huge pages;
//! - `mbind` with `MOVE` moves every page to the policy's nodes with its
//!   content, pinned pages stay and are reported; `STRICT` alone refuses;
//! - `set_thread_node` / `thread_node`, local and remote access counts;
//! - bad input refused with nothing changed; a one-node Mm as before.
//!
//! Every test ends with `check()`.

use mmkit::{
    Distances, Error, Gfp, MapFlags, MbindFlags, MemPolicy, Mm, NodeMask, Pfn, Topology, PMD_SIZE,
};

const MIB: usize = 1 << 20;
const PAGE: u64 = 4096;

fn mm_nodes(topo: Topology, mem: usize) -> Mm {
    Mm::builder()
        .memory(mem)
        .topology(topo)
        .kcompactd(false)
        .build()
        .expect("building an emulated NUMA mm")
}

fn mm_n(n: usize, mem: usize) -> Mm {
    mm_nodes(Topology::emulated(n), mem)
}

fn check(mm: &Mm) {
    mm.check().unwrap_or_else(|e| panic!("check: {e}"));
}

fn mask(nodes: &[usize]) -> NodeMask {
    NodeMask::from_nodes(nodes)
}

/// Order-0 pages from `node` with `gfp` until `NoMemory`.
fn exhaust_node(mm: &Mm, node: usize, gfp: Gfp) -> Vec<Pfn> {
    let mut got = Vec::new();
    loop {
        match mm.alloc_pages_node(node, gfp, 0) {
            Ok(p) => got.push(p),
            Err(Error::NoMemory { .. }) => return got,
            Err(e) => panic!("alloc on node {node} after {} pages: {e:?}", got.len()),
        }
    }
}

/// What `KERNEL` may take of node `node` when idle: its free pages above min.
fn node_allowance(mm: &Mm, node: usize) -> u64 {
    mm.drain_all_pages();
    let z = &mm.zone_info()[node];
    assert_eq!(z.node, node);
    z.nr_free.saturating_sub(z.wmark[0])
}

#[test]
fn arena_split_per_node_and_node_of() {
    let mm = mm_n(4, 32 * MIB);
    assert_eq!(mm.nr_nodes(), 4);
    let mut next = 0u64;
    for node in 0..4 {
        let (start, pages) = mm.node_span(node).unwrap();
        assert_eq!(start.get(), next, "nodes are consecutive");
        assert_eq!(pages, 2048, "equal shares of 4 MiB blocks");
        assert_eq!(mm.node_of(start), node);
        assert_eq!(mm.node_of(Pfn::new(start.get() + pages - 1)), node);
        next += pages;
    }
    assert_eq!(next, mm.nr_managed_pages());
    assert!(mm.node_span(4).is_none());
    let info = mm.zone_info();
    assert_eq!(info.len(), 4);
    assert!(info.iter().enumerate().all(|(i, z)| z.node == i));
    assert!(mm.buddyinfo().contains("Node 3, zone   Normal"));
    check(&mm);
}

#[test]
fn alloc_pages_node_on_each_node_and_bad_node() {
    let mm = mm_n(4, 32 * MIB);
    let mut all = Vec::new();
    for node in 0..4 {
        for order in [0u32, 3, 9] {
            let p = mm.alloc_pages_node(node, Gfp::KERNEL, order).unwrap();
            assert_eq!(mm.node_of(p), node, "order {order} on node {node}");
            all.push((p, order));
        }
    }
    match mm.alloc_pages_node(4, Gfp::KERNEL, 0) {
        Err(Error::BadNode {
            node: 4,
            nr_nodes: 4,
        }) => {}
        other => panic!("node 4 of 4: {other:?}"),
    }
    for (p, o) in all {
        mm.free_pages(p, o).unwrap();
    }
    check(&mm);
}

#[test]
fn node_exhaustion_falls_back_along_the_zonelist_and_thisnode_does_not() {
    // 0 -> 1 at 20, 0 -> 2 at 30: node 0's zonelist is [0, 1, 2].
    let d = Distances::from_rows(&[[10u8, 20, 30], [20, 10, 20], [30, 20, 10]]).unwrap();
    let mm = mm_nodes(Topology::emulated_with(d, 2), 24 * MIB);
    assert_eq!(mm.topology().zonelists().fallback_order(0), &[0, 1, 2]);
    mm.set_thread_node(0).unwrap();
    mm.reset_stats();
    let want0 = node_allowance(&mm, 0);
    let own = exhaust_node(&mm, 0, Gfp::KERNEL | Gfp::THISNODE);
    assert_eq!(
        own.len() as u64,
        want0,
        "THISNODE takes exactly node 0's pages above min"
    );
    assert!(own.iter().all(|&p| mm.node_of(p) == 0));
    // Without THISNODE: node 1 next, then node 2.
    let want1 = node_allowance(&mm, 1);
    let want2 = node_allowance(&mm, 2);
    let rest = exhaust_node(&mm, 0, Gfp::KERNEL);
    assert_eq!(rest.len() as u64, want1 + want2);
    let (on1, on2): (Vec<Pfn>, Vec<Pfn>) = rest.iter().partition(|&&p| mm.node_of(p) == 1);
    assert_eq!(on1.len() as u64, want1);
    assert_eq!(on2.len() as u64, want2);
    assert!(on2.iter().all(|&p| mm.node_of(p) == 2));
    // Node 1's pages came before node 2's (nearest first).
    let first2 = rest.iter().position(|&p| mm.node_of(p) == 2).unwrap();
    assert!(rest[..first2].iter().all(|&p| mm.node_of(p) == 1));
    // The counters: node 0 hits, the fallbacks are misses on 1 and 2 and
    // foreign on 0; all of it for a thread on node 0.
    let s: Vec<_> = (0..3).map(|n| mm.numa_stats(n)).collect();
    assert_eq!(s[0].numa_hit, want0);
    assert_eq!(s[0].numa_foreign, want1 + want2);
    assert_eq!(s[1].numa_miss, want1);
    assert_eq!(s[2].numa_miss, want2);
    assert_eq!(s[0].local_node, want0);
    assert_eq!(s[1].other_node + s[2].other_node, want1 + want2);
    for p in own.iter().chain(&rest) {
        mm.free_pages(*p, 0).unwrap();
    }
    check(&mm);
}

#[test]
fn numa_counters_add_up() {
    let mm = mm_n(2, 16 * MIB);
    mm.set_thread_node(0).unwrap();
    mm.reset_stats();
    let mut pages = Vec::new();
    for _ in 0..10 {
        pages.push(mm.alloc_pages_node(0, Gfp::KERNEL, 0).unwrap());
    }
    for _ in 0..5 {
        pages.push(mm.alloc_pages_node(1, Gfp::KERNEL, 1).unwrap());
    }
    for _ in 0..3 {
        pages.push(mm.alloc_pages(Gfp::KERNEL, 0).unwrap()); // the thread's node
    }
    let (s0, s1) = (mm.numa_stats(0), mm.numa_stats(1));
    assert_eq!(s0.numa_hit, 13);
    assert_eq!(s0.local_node, 13);
    assert_eq!(s1.numa_hit, 5);
    assert_eq!(s1.other_node, 5);
    assert_eq!(s0.numa_miss + s1.numa_miss, 0);
    assert_eq!(s0.numa_foreign + s1.numa_foreign, 0);
    assert_eq!(s0.other_node + s1.local_node, 0);
    let text = mm.numastat();
    assert!(text.starts_with("node0\nnuma_hit 13\n"), "{text}");
    assert!(text.contains("node1\nnuma_hit 5\n"), "{text}");
    for (i, p) in pages.iter().enumerate() {
        let order = if (10..15).contains(&i) { 1 } else { 0 };
        mm.free_pages(*p, order).unwrap();
    }
    // Interleaved faults: every data page is an interleave hit on its node.
    let space = mm.new_space().unwrap();
    let addr = space.mmap(64 * PAGE as usize, MapFlags::empty()).unwrap();
    space
        .set_mempolicy(MemPolicy::Interleave(mask(&[0, 1])))
        .unwrap();
    mm.reset_stats();
    space.populate(addr, 64 * PAGE as usize, true).unwrap();
    let (s0, s1) = (mm.numa_stats(0), mm.numa_stats(1));
    assert_eq!(s0.interleave_hit, 32);
    assert_eq!(s1.interleave_hit, 32);
    // Table pages are allocated on the thread's node, not interleaved.
    let tables = space.stats().pgtable_pages - 1;
    assert_eq!(s0.numa_hit + s1.numa_hit, 64 + tables);
    assert_eq!(s1.other_node, 32);
    finish(&mm, space);
}

/// An emulated `n`-node Mm over `mem` bytes, the calling thread on `node`, and
/// a space on it with `pages` pages mapped (at the returned address).
fn setup(n: usize, mem: usize, node: usize, pages: u64) -> (Mm, mmkit::Space, u64) {
    let mm = mm_n(n, mem);
    mm.set_thread_node(node).unwrap();
    let (space, addr) = space_with(&mm, pages);
    (mm, space, addr)
}

/// Drops the space and checks the allocator.
fn finish(mm: &Mm, space: mmkit::Space) {
    drop(space);
    check(mm);
}

fn free_all(mm: &Mm, pages: Vec<Pfn>) {
    for p in pages {
        mm.free_pages(p, 0).unwrap();
    }
}

/// A space on `mm` with `pages` pages mapped; returns it and the address.
fn space_with(mm: &Mm, pages: u64) -> (mmkit::Space, u64) {
    let s = mm.new_space().unwrap();
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    (s, a)
}

fn nodes_of(space: &mmkit::Space, addr: u64, pages: u64) -> Vec<usize> {
    (0..pages)
        .map(|i| space.node_of(addr + i * PAGE).expect("resident"))
        .collect()
}

#[test]
fn bind_places_exactly_on_the_mask_nearest_first() {
    let (mm, space, addr) = setup(4, 32 * MIB, 3, 48);
    space.set_mempolicy(MemPolicy::Bind(mask(&[2]))).unwrap();
    space.populate(addr, 48 * PAGE as usize, true).unwrap();
    assert!(nodes_of(&space, addr, 48).iter().all(|&n| n == 2));
    // Bind to {1, 3} from a thread on node 3: node 3.
    let (s2, a2) = space_with(&mm, 20);
    s2.set_mempolicy(MemPolicy::Bind(mask(&[1, 3]))).unwrap();
    s2.populate(a2, 20 * PAGE as usize, false).unwrap();
    assert!(nodes_of(&s2, a2, 20).iter().all(|&n| n == 3));
    assert_eq!(
        s2.get_mempolicy(a2).unwrap(),
        MemPolicy::Bind(mask(&[1, 3]))
    );
    drop((space, s2));
    check(&mm);
}

#[test]
fn bind_never_leaves_the_mask_when_its_node_is_full() {
    let mm = mm_n(2, 16 * MIB);
    mm.set_thread_node(0).unwrap();
    let hog = exhaust_node(&mm, 1, Gfp::KERNEL | Gfp::THISNODE);
    let (space, addr) = space_with(&mm, 4);
    space.set_mempolicy(MemPolicy::Bind(mask(&[1]))).unwrap();
    match space.touch(addr, true) {
        Err(Error::NoMemory { .. }) => {}
        other => panic!("bind to a full node: {other:?}"),
    }
    assert_eq!(space.node_of(addr), None);
    free_all(&mm, hog);
    space.touch(addr, true).unwrap();
    assert_eq!(space.node_of(addr), Some(1));
    finish(&mm, space);
}

#[test]
fn interleave_is_exact_round_robin_by_offset_in_the_range() {
    let (mm, space, addr) = setup(4, 32 * MIB, 0, 128);
    // The range starts 5 pages into the mapping: offsets count from its start.
    let start = addr + 5 * PAGE;
    let m = mask(&[0, 1, 3]);
    space
        .mbind(
            start,
            90 * PAGE as usize,
            MemPolicy::Interleave(m),
            MbindFlags::empty(),
        )
        .unwrap();
    assert_eq!(space.mappings().len(), 3, "split at both ends of the range");
    space.populate(addr, 128 * PAGE as usize, true).unwrap();
    let got = nodes_of(&space, start, 90);
    let want: Vec<usize> = (0..90).map(|i| [0, 1, 3][i % 3]).collect();
    assert_eq!(got, want);
    // Outside the range: the space's default policy, the thread's node.
    assert!(nodes_of(&space, addr, 5).iter().all(|&n| n == 0));
    assert!(nodes_of(&space, start + 90 * PAGE, 33)
        .iter()
        .all(|&n| n == 0));
    assert_eq!(
        space.get_mempolicy(start + 7 * PAGE).unwrap(),
        MemPolicy::Interleave(m)
    );
    assert_eq!(space.get_mempolicy(addr).unwrap(), MemPolicy::Default);
    finish(&mm, space);
}

#[test]
fn weighted_interleave_is_exact() {
    let mm = mm_n(4, 32 * MIB);
    let (space, addr) = space_with(&mm, 64);
    let w = vec![(2, 1), (0, 3)];
    space
        .set_mempolicy(MemPolicy::WeightedInterleave(w))
        .unwrap();
    space.populate(addr, 64 * PAGE as usize, true).unwrap();
    let want: Vec<usize> = (0..64).map(|i| if i % 4 < 3 { 0 } else { 2 }).collect();
    assert_eq!(nodes_of(&space, addr, 64), want);
    finish(&mm, space);
}

#[test]
fn preferred_falls_back_when_its_node_is_full() {
    let (mm, space, addr) = setup(2, 16 * MIB, 0, 64);
    space.set_mempolicy(MemPolicy::Preferred(1)).unwrap();
    space.populate(addr, 16 * PAGE as usize, true).unwrap();
    assert!(nodes_of(&space, addr, 16).iter().all(|&n| n == 1));
    let hog = exhaust_node(&mm, 1, Gfp::KERNEL | Gfp::THISNODE);
    let a2 = addr + 16 * PAGE;
    space.populate(a2, 48 * PAGE as usize, true).unwrap();
    assert!(nodes_of(&space, a2, 48).iter().all(|&n| n == 0));
    free_all(&mm, hog);
    finish(&mm, space);
}

#[test]
fn preferred_many_local_and_huge_placement() {
    let mm = mm_n(4, 48 * MIB);
    mm.set_thread_node(0).unwrap();
    let m = mask(&[1, 2]);
    let first = mm
        .topology()
        .zonelists()
        .fallback_order_in(0, m)
        .next()
        .unwrap();
    let (space, addr) = space_with(&mm, 32);
    space.set_mempolicy(MemPolicy::PreferredMany(m)).unwrap();
    space.populate(addr, 32 * PAGE as usize, true).unwrap();
    assert!(nodes_of(&space, addr, 32).iter().all(|&n| n == first));
    // Local: the thread's node.
    mm.set_thread_node(3).unwrap();
    let (s2, a2) = space_with(&mm, 8);
    s2.set_mempolicy(MemPolicy::Local).unwrap();
    s2.populate(a2, 8 * PAGE as usize, true).unwrap();
    assert!(nodes_of(&s2, a2, 8).iter().all(|&n| n == 3));
    // Huge pages interleave by huge-page index.
    let s3 = mm.new_space().unwrap();
    let h = s3.mmap(2 * PMD_SIZE as usize, MapFlags::HUGE).unwrap();
    s3.set_mempolicy(MemPolicy::Interleave(mask(&[1, 2])))
        .unwrap();
    s3.populate(h, 2 * PMD_SIZE as usize, true).unwrap();
    for (i, want) in [1usize, 2].into_iter().enumerate() {
        let t = s3.translate(h + i as u64 * PMD_SIZE).unwrap();
        assert!(t.huge);
        assert_eq!(mm.node_of(t.pfn), want);
    }
    drop((space, s2, s3));
    check(&mm);
}

#[test]
fn mbind_move_moves_every_page_with_its_content_and_pinned_pages_stay() {
    let (mm, space, addr) = setup(2, 16 * MIB, 0, 32);
    for i in 0..32u64 {
        space
            .write(addr + i * PAGE + 8, &(i * 7 + 1).to_le_bytes())
            .unwrap();
    }
    assert!(nodes_of(&space, addr, 32).iter().all(|&n| n == 0));
    let pinned_at = addr + 5 * PAGE;
    let pin = space.pin_page(pinned_at, false).unwrap();
    let free_before = {
        mm.drain_all_pages();
        mm.nr_free_pages()
    };
    let move_all = || {
        let bind1 = MemPolicy::Bind(mask(&[1]));
        space.mbind(addr, 32 * PAGE as usize, bind1, MbindFlags::MOVE)
    };
    let r = move_all().unwrap();
    assert_eq!(r.moved, 31);
    assert_eq!(r.not_moved, vec![pinned_at]);
    for i in 0..32u64 {
        let want = if addr + i * PAGE == pinned_at { 0 } else { 1 };
        assert_eq!(space.node_of(addr + i * PAGE), Some(want), "page {i}");
        let mut b = [0u8; 8];
        space.read(addr + i * PAGE + 8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i * 7 + 1, "content of page {i}");
    }
    mm.drain_all_pages();
    assert_eq!(
        mm.nr_free_pages(),
        free_before,
        "each move freed its old page"
    );
    drop(pin);
    // Unpinned now: a second MOVE takes it.
    let r = move_all().unwrap();
    assert_eq!((r.moved, r.not_moved.len()), (1, 0));
    assert_eq!(space.node_of(pinned_at), Some(1));
    finish(&mm, space);
}

#[test]
fn mbind_strict_refuses_misplaced_pages_and_changes_nothing() {
    let (mm, space, addr) = setup(2, 16 * MIB, 0, 16);
    space.populate(addr, 16 * PAGE as usize, true).unwrap();
    let maps = space.mappings();
    let r = space.mbind(
        addr + PAGE,
        4 * PAGE as usize,
        MemPolicy::Bind(mask(&[1])),
        MbindFlags::STRICT,
    );
    match r {
        Err(Error::Misplaced { count: 4, first }) if first == addr + PAGE => {}
        other => panic!("strict mbind over misplaced pages: {other:?}"),
    }
    assert_eq!(space.mappings(), maps);
    assert_eq!(
        space.get_mempolicy(addr + PAGE).unwrap(),
        MemPolicy::Default
    );
    assert!(nodes_of(&space, addr, 16).iter().all(|&n| n == 0));
    finish(&mm, space);
}

#[test]
fn bad_input_is_refused_with_no_change() {
    let mm = mm_n(4, 32 * MIB);
    let (space, addr) = space_with(&mm, 16);
    space.set_mempolicy(MemPolicy::Preferred(2)).unwrap();
    let maps = space.mappings();
    let bad_policies = [
        MemPolicy::Bind(NodeMask::empty()),
        MemPolicy::Bind(mask(&[5])),
        MemPolicy::Interleave(mask(&[1, 7])),
        MemPolicy::Preferred(9),
        MemPolicy::WeightedInterleave(vec![(0, 0)]),
        MemPolicy::WeightedInterleave(vec![]),
    ];
    for p in &bad_policies {
        assert!(
            matches!(space.set_mempolicy(p.clone()), Err(Error::Policy(_))),
            "set_mempolicy({p:?})"
        );
        assert!(
            matches!(
                space.mbind(addr, PAGE as usize, p.clone(), MbindFlags::MOVE),
                Err(Error::Policy(_))
            ),
            "mbind({p:?})"
        );
    }
    let good = MemPolicy::Bind(mask(&[1]));
    for (a, len, what) in [
        (addr + 1, PAGE as usize, "unaligned"),
        (addr, 0, "zero length"),
        (addr + 8 * PAGE, 16 * PAGE as usize, "partly unmapped"),
        (addr + 64 * PAGE, PAGE as usize, "unmapped"),
    ] {
        assert!(
            matches!(
                space.mbind(a, len, good.clone(), MbindFlags::empty()),
                Err(Error::BadAddress { .. })
            ),
            "{what}"
        );
    }
    assert!(space.get_mempolicy(addr + 64 * PAGE).is_err());
    assert_eq!(space.mappings(), maps);
    assert_eq!(space.get_mempolicy(addr).unwrap(), MemPolicy::Preferred(2));
    assert!(matches!(
        mm.set_thread_node(4),
        Err(Error::BadNode {
            node: 4,
            nr_nodes: 4
        })
    ));
    finish(&mm, space);
}

#[test]
fn set_thread_node_is_per_thread_and_per_mm() {
    let a = mm_n(4, 16 * MIB);
    let b = mm_n(2, 16 * MIB);
    a.set_thread_node(2).unwrap();
    b.set_thread_node(1).unwrap();
    assert_eq!(a.thread_node(), 2);
    assert_eq!(b.thread_node(), 1);
    assert!(a.set_thread_node(7).is_err());
    assert_eq!(a.thread_node(), 2, "a refused binding changes nothing");
    let a2 = a.clone();
    std::thread::spawn(move || {
        a2.set_thread_node(3).unwrap();
        assert_eq!(a2.thread_node(), 3);
        let p = a2.alloc_pages(Gfp::KERNEL, 0).unwrap();
        assert_eq!(a2.node_of(p), 3, "alloc_pages prefers the thread's node");
        a2.free_pages(p, 0).unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(a.thread_node(), 2);
    check(&a);
    check(&b);
}

#[test]
fn local_and_remote_accesses_are_counted() {
    let (mm, space, addr) = setup(2, 16 * MIB, 0, 8);
    space.set_mempolicy(MemPolicy::Bind(mask(&[1]))).unwrap();
    for i in 0..8 {
        space.touch(addr + i * PAGE, true).unwrap();
    }
    let s = space.stats();
    assert_eq!((s.local_accesses, s.remote_accesses), (0, 8));
    mm.set_thread_node(1).unwrap();
    for i in 0..8 {
        space.touch(addr + i * PAGE, false).unwrap();
    }
    let s = space.stats();
    assert_eq!((s.local_accesses, s.remote_accesses), (8, 8));
    let n1 = mm.node_accesses(1);
    assert_eq!((n1.local, n1.remote), (8, 8));
    assert_eq!(mm.node_accesses(0), Default::default());
    finish(&mm, space);
}

#[test]
fn one_node_mm_is_as_before() {
    let mm = Mm::builder()
        .memory(16 * MIB)
        .topology(Topology::single_node(2, None))
        .build()
        .unwrap();
    assert_eq!(mm.nr_nodes(), 1);
    assert_eq!(mm.thread_node(), 0);
    mm.set_thread_node(0).unwrap();
    assert!(matches!(mm.set_thread_node(1), Err(Error::BadNode { .. })));
    assert!(matches!(
        mm.alloc_pages_node(1, Gfp::KERNEL, 0),
        Err(Error::BadNode { .. })
    ));
    mm.reset_stats();
    let p = mm.alloc_pages_node(0, Gfp::KERNEL, 0).unwrap();
    let q = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
    let s = mm.numa_stats(0);
    assert_eq!((s.numa_hit, s.local_node, s.numa_miss), (2, 2, 0));
    assert!(mm.numastat().starts_with("node0\nnuma_hit 2\n"));
    assert!(!mm.numastat().contains("node1"));
    let (space, addr) = space_with(&mm, 4);
    space.set_mempolicy(MemPolicy::Bind(mask(&[0]))).unwrap();
    space.populate(addr, 4 * PAGE as usize, true).unwrap();
    assert_eq!(space.node_of(addr), Some(0));
    assert_eq!(space.stats().local_accesses, 0, "not counted with one node");
    mm.free_pages(p, 0).unwrap();
    mm.free_pages(q, 0).unwrap();
    finish(&mm, space);
    // The host's topology is the default.
    let host = Mm::builder().memory(8 * MIB).build().unwrap();
    assert_eq!(host.nr_nodes(), Topology::host().nr_nodes());
}

#[test]
fn too_small_an_arena_for_the_nodes_is_refused() {
    let r = Mm::builder()
        .memory(8 * MIB)
        .topology(Topology::emulated(4))
        .build();
    assert!(matches!(r, Err(Error::Config(_))), "{:?}", r.err());
}
