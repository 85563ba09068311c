extern crate std;
use super::*;
use crate::config::{MergePolicy, RefillPolicy};
use crate::node::{Distances, NodeMask, NodeStates, Zonelists};
use crate::pcp::PcpList;
use core::sync::atomic::AtomicBool;

/// A test spinlock; the core takes any `lock_api::RawMutex`.
struct Spin(AtomicBool);
// SAFETY: a test-and-set lock: `lock` returns only after winning the swap.
unsafe impl lock_api::RawMutex for Spin {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Spin = Spin(AtomicBool::new(false));
    type GuardMarker = lock_api::GuardSend;
    fn lock(&self) {
        while !self.try_lock() {
            std::thread::yield_now();
        }
    }
    fn try_lock(&self) -> bool {
        !self.0.swap(true, Ordering::Acquire)
    }
    unsafe fn unlock(&self) {
        self.0.store(false, Ordering::Release)
    }
}
struct TestPlatform;
impl Platform for TestPlatform {
    type ZoneLock = Spin;
    fn cpu_id() -> usize {
        0
    }
    fn now_ns() -> u64 {
        0
    }
}

fn pa(
    pcp: PcpPolicy,
    merge: MergePolicy,
    refill: RefillPolicy,
    pages: u64,
) -> PageAlloc<TestPlatform> {
    let cfg = Config {
        pcp,
        merge,
        refill,
        pcp_high: PcpHighPolicy::Fixed,
        nr_cpus: 2,
        pcp_batch: None,
        pcp_cache: false,
    };
    PageAlloc::new(cfg, pages).unwrap()
}

std::thread_local! {
    static EMU_CPU: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}
/// Serialises the emulated restartable operations (one at a time, as if no
/// thread were ever preempted inside one).
static EMU_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A platform whose restartable per-CPU cache operations are emulated in Rust
/// with the layout's semantics, and whose CPU id the test sets, so the core's
/// cache accounting is tested without the std runtime's assembly.
struct EmuPlatform;
impl Platform for EmuPlatform {
    type ZoneLock = Spin;
    fn cpu_id() -> usize {
        EMU_CPU.with(|c| c.get())
    }
    fn now_ns() -> u64 {
        0
    }
    fn cache_ops_available() -> bool {
        true
    }
    unsafe fn cache_pop(row: *const crate::pcp_cache::PcpCacheList, nr: usize) -> Option<u32> {
        let _g = EMU_LOCK.lock().unwrap();
        let cpu = Self::cpu_id();
        if cpu >= nr {
            return None;
        }
        // SAFETY: the caller passes `nr` lists.
        let l = unsafe { &*row.add(cpu) };
        let len = l.len();
        if l.fenced.load(Ordering::Relaxed) != 0 || len == 0 {
            return None;
        }
        let v = l.slots[len as usize - 1].load(Ordering::Relaxed);
        l.pops.fetch_add(1, Ordering::Relaxed);
        Some(v)
    }
    unsafe fn cache_push(row: *const crate::pcp_cache::PcpCacheList, nr: usize, idx: u32) -> bool {
        let _g = EMU_LOCK.lock().unwrap();
        let cpu = Self::cpu_id();
        if cpu >= nr {
            return false;
        }
        // SAFETY: the caller passes `nr` lists.
        let l = unsafe { &*row.add(cpu) };
        let len = l.len() as usize;
        if l.fenced.load(Ordering::Relaxed) != 0 || len == PCP_CACHE_SLOTS {
            return false;
        }
        l.slots[len].store(idx, Ordering::Relaxed);
        l.pushes.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[test]
fn pcp_cache_accounting_drain_and_check() {
    let cfg = Config {
        nr_cpus: 2,
        pcp_batch: Some(15),
        ..Config::default()
    };
    let a = PageAlloc::<EmuPlatform>::new(cfg, 8192).unwrap();
    assert!(a.has_pcp_caches());
    let free0 = a.nr_free_pages();
    let ev0 = a.vm_events();
    let mut held = std::vec::Vec::new();
    let (mut allocs, mut frees) = (0u64, 0u64);
    // Allocate and free on alternating CPUs, in runs long enough to fill,
    // spill and refill the caches.
    for round in 0..20usize {
        EMU_CPU.with(|c| c.set(round % 2));
        for _ in 0..(37 * (round % 5) + 3) {
            held.push(a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap());
            allocs += 1;
        }
        a.check().unwrap();
        EMU_CPU.with(|c| c.set((round + 1) % 2));
        let keep = held.len() / 3;
        for p in held.drain(keep..) {
            a.free_pages(p, 0).unwrap();
            frees += 1;
        }
        a.check().unwrap();
        assert_eq!(a.nr_free_pages(), free0 - held.len() as u64);
    }
    // Refused frees go nowhere near the caches.
    assert_eq!(
        a.free_pages(held[0], 1),
        Err(FreeError::WrongOrder { allocated: 0 })
    );
    for p in held.drain(..) {
        a.free_pages(p, 0).unwrap();
        frees += 1;
    }
    let ev = a.vm_events();
    assert!(ev.get(VmEvent::PcpCacheFill) > 0 && ev.get(VmEvent::PcpCacheSpill) > 0);
    assert_eq!(ev.get(VmEvent::PgAlloc) - ev0.get(VmEvent::PgAlloc), allocs);
    assert_eq!(ev.get(VmEvent::PgFree) - ev0.get(VmEvent::PgFree), frees);
    assert!(a.zone_info()[0].nr_pcp > 0);
    assert_eq!(a.nr_free_pages(), free0);
    a.drain_all_pages();
    assert_eq!(a.zone_info()[0].nr_pcp, 0);
    assert!(a.vm_events().get(VmEvent::PcpCacheDrain) > 0);
    // Draining is not freeing: the counts stay exact.
    assert_eq!(
        a.vm_events().get(VmEvent::PgFree) - ev0.get(VmEvent::PgFree),
        frees
    );
    a.check().unwrap();
    assert_eq!(a.nr_free_pages(), free0);
    // Everything merges back (lazy merging, merge on demand).
    let big = a.alloc_pages(Gfp::MOVABLE, MAX_ORDER, &NoHooks).unwrap();
    a.free_pages(big, MAX_ORDER).unwrap();
    a.reset_stats();
    assert_eq!(a.vm_events().get(VmEvent::PgAlloc), 0);
}

/// Records what the per-CPU lists held when the slow path asked for direct
/// compaction, and compacts nothing.
struct SeeLists<'a> {
    a: &'a PageAlloc<TestPlatform>,
    calls: core::cell::Cell<u32>,
    pcp_at_first_call: core::cell::Cell<u64>,
}
impl SlowPathHooks for SeeLists<'_> {
    fn direct_compact(&self, _: u32, _: MigrateType, _: CompactPriority) -> CompactResult {
        if self.calls.get() == 0 {
            self.pcp_at_first_call.set(self.a.zone_info()[0].nr_pcp);
        }
        self.calls.set(self.calls.get() + 1);
        CompactResult::Complete
    }
}

/// A compaction run's goal counts blocks of its order, a larger free block as
/// the blocks it splits into.
#[test]
fn compaction_goal_counts_blocks_of_the_order() {
    let a = pa(
        PcpPolicy::On,
        MergePolicy::Lazy,
        RefillPolicy::Cluster,
        4096,
    );
    let free_order9 = a.zone_info()[0]
        .free_blocks
        .iter()
        .enumerate()
        .skip(9)
        .map(|(o, b)| b.iter().sum::<u64>() << (o - 9))
        .sum::<u64>();
    assert!(free_order9 >= 4, "{free_order9}");
    let mut cc = a.compact_control(
        0,
        Some(9),
        MigrateType::Movable,
        crate::CompactMode::Background,
    );
    for (goal, done) in [
        (1, true),
        (free_order9 as u32, true),
        (free_order9 as u32 + 1, false),
    ] {
        cc.goal_blocks = goal;
        assert_eq!(a.compaction_done(&cc), done, "goal {goal}");
    }
    // One block taken: one fewer.
    let p = a.alloc_pages(Gfp::MOVABLE, 9, &NoHooks).unwrap();
    cc.goal_blocks = free_order9 as u32;
    assert!(!a.compaction_done(&cc));
    a.free_pages(p, 9).unwrap();
    assert!(a.compaction_done(&cc));
}

/// An allocator with every page allocated as order 0 except the aligned
/// block of `1 << order` pages at `at`, freed page by page (so that its last
/// pages sit on a per-CPU list), and the pages still held.
fn all_but_one_block(
    merge: MergePolicy,
    order: u32,
    at: u64,
) -> (PageAlloc<TestPlatform>, Vec<Pfn>) {
    let a = pa(PcpPolicy::On, merge, RefillPolicy::Cluster, 4096);
    let mut held = Vec::new();
    while let Ok(p) = a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks) {
        held.push(p);
    }
    // What is left is the reserve below the min watermark: less than a block.
    assert!(a.nr_free_pages() < 1 << order);
    held.sort_unstable_by_key(|p| p.get());
    let i = held.iter().position(|p| p.get() == at).unwrap();
    for p in held.drain(i..i + (1 << order)) {
        assert!(p.get() < at + (1 << order));
        a.free_pages(p, 0).unwrap();
    }
    (a, held)
}

/// The only free pageblock, partly on a per-CPU list: a costly order asks
/// for compaction before draining the lists (as Linux does), and still gets
/// the block from the drain when compaction could not build it.
#[test]
fn slowpath_costly_order_compacts_before_draining_lists() {
    for merge in [MergePolicy::Eager, MergePolicy::Lazy] {
        let (a, held) = all_but_one_block(merge, 9, 2048);
        let on_lists = a.zone_info()[0].nr_pcp;
        assert!(on_lists > 0 && on_lists < 512, "{on_lists}");
        let drains0 = a.vm_events().get(VmEvent::DrainAll);
        let hooks = SeeLists {
            a: &a,
            calls: core::cell::Cell::new(0),
            pcp_at_first_call: core::cell::Cell::new(0),
        };
        let big = a.alloc_pages(Gfp::MOVABLE, 9, &hooks).unwrap();
        assert_eq!(big.get(), 2048, "{merge:?}");
        assert!(hooks.calls.get() > 0, "{merge:?}: compaction was not tried");
        assert_eq!(
            hooks.pcp_at_first_call.get(),
            on_lists,
            "{merge:?}: the lists were drained before compaction"
        );
        assert_eq!(a.vm_events().get(VmEvent::DrainAll), drains0 + 1);
        a.free_pages(big, 9).unwrap();
        for p in held {
            a.free_pages(p, 0).unwrap();
        }
        a.check().unwrap();
    }
}

fn order10_blocks(a: &PageAlloc<TestPlatform>) -> u64 {
    a.zone_info()[0].free_blocks[MAX_ORDER as usize]
        .iter()
        .sum()
}

#[test]
fn batch_size_follows_linux() {
    assert_eq!(zone_batchsize(262_144), 63); // 1 GiB
    assert_eq!(zone_batchsize(16_384), 3); // 64 MiB
}

#[test]
fn starts_with_all_memory_in_max_order_blocks() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Eager,
        RefillPolicy::PageByPage,
        4096,
    );
    assert_eq!(a.nr_free_pages(), 4096);
    assert_eq!(order10_blocks(&a), 4);
    a.check().unwrap();
}

#[test]
fn odd_sized_zone_is_covered_by_aligned_blocks() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Eager,
        RefillPolicy::PageByPage,
        1024 + 512 + 3,
    );
    assert_eq!(a.nr_free_pages(), 1539);
    a.check().unwrap();
}

#[test]
fn eager_free_merges_back_to_max_order() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Eager,
        RefillPolicy::PageByPage,
        2048,
    );
    let pfns: std::vec::Vec<Pfn> = (0..100)
        .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
        .collect();
    assert!(order10_blocks(&a) < 2);
    for p in pfns {
        a.free_pages(p, 0).unwrap();
    }
    assert_eq!(order10_blocks(&a), 2);
    a.check().unwrap();
}

#[test]
fn lazy_free_skips_merge_until_needed() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Lazy,
        RefillPolicy::PageByPage,
        4096,
    );
    let pfns: std::vec::Vec<Pfn> = (0..2048)
        .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
        .collect();
    for p in pfns {
        a.free_pages(p, 0).unwrap();
    }
    let zi = &a.zone_info()[0];
    assert_eq!(zi.nr_unmerged, 2048);
    assert_eq!(order10_blocks(&a), 2);
    a.check().unwrap();
    // Three order-10 requests: two blocks are whole, the third must come from merging.
    let x: std::vec::Vec<Pfn> = (0..3)
        .map(|_| a.alloc_pages(Gfp::MOVABLE, 10, &NoHooks).unwrap())
        .collect();
    assert!(x[0] != x[1] && x[1] != x[2]);
    assert_eq!(a.zone_info()[0].nr_unmerged, 0);
    assert!(a.vm_events().get(VmEvent::MergeOnDemand) >= 1);
    a.check().unwrap();
}

#[test]
fn unmovable_fallback_steals_a_pageblock() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Eager,
        RefillPolicy::PageByPage,
        2048,
    );
    assert_eq!(
        a.zone_info()[0].pageblocks[MigrateType::Unmovable as usize],
        0
    );
    let p = a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).unwrap();
    let zi = &a.zone_info()[0];
    // The fallback found an order-10 block and took both its pageblocks.
    assert_eq!(
        zi.pageblocks[MigrateType::Unmovable as usize],
        2,
        "whole block stolen"
    );
    assert!(a.vm_events().get(VmEvent::AllocFallback) >= 1);
    // The next unmovable allocation comes from the stolen pageblock, without fallback.
    let before = a.vm_events().get(VmEvent::AllocFallback);
    let q = a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).unwrap();
    assert_eq!(a.vm_events().get(VmEvent::AllocFallback), before);
    assert_eq!(p.get() >> PAGEBLOCK_ORDER, q.get() >> PAGEBLOCK_ORDER);
    a.check().unwrap();
}

#[test]
fn kernel_stops_at_min_watermark_atomic_dips_below_boundedly() {
    let a = pa(
        PcpPolicy::Off,
        MergePolicy::Eager,
        RefillPolicy::PageByPage,
        4096,
    );
    let min = a.zone_info()[0].wmark[0];
    let mut n = 0;
    while a.alloc_pages(Gfp::KERNEL, 0, &NoHooks).is_ok() {
        n += 1;
    }
    let left = a.nr_free_pages();
    assert!(left >= min, "KERNEL went below min: {left} < {min}");
    let mut extra = 0;
    while a.alloc_pages(Gfp::ATOMIC, 0, &NoHooks).is_ok() {
        extra += 1;
    }
    assert!(extra > 0, "ATOMIC got nothing below min");
    assert!(a.nr_free_pages() > 0, "ATOMIC emptied the reserve");
    assert!(n > 0);
    a.check().unwrap();
}

#[test]
fn refused_frees_change_nothing() {
    let a = pa(
        PcpPolicy::On,
        MergePolicy::Lazy,
        RefillPolicy::Cluster,
        4096,
    );
    let p = a.alloc_pages(Gfp::KERNEL, 3, &NoHooks).unwrap();
    let free = a.nr_free_pages();
    assert_eq!(
        a.free_pages(p, 2),
        Err(FreeError::WrongOrder { allocated: 3 })
    );
    let r = a.free_pages(p, 4);
    assert!(
        matches!(
            r,
            Err(FreeError::Misaligned) | Err(FreeError::WrongOrder { allocated: 3 })
        ),
        "{r:?}"
    );
    assert_eq!(
        a.free_pages(Pfn::new(p.get() + 1), 0),
        Err(FreeError::NotAllocated)
    );
    assert_eq!(a.free_pages(Pfn::new(4096), 0), Err(FreeError::OutOfRange));
    assert_eq!(a.free_pages(p, 11), Err(FreeError::InvalidOrder));
    assert_eq!(a.nr_free_pages(), free);
    a.check().unwrap();
    a.free_pages(p, 3).unwrap();
    assert_eq!(a.free_pages(p, 3), Err(FreeError::NotAllocated));
    a.check().unwrap();
}

#[test]
fn owned_blocks_are_refused_to_users_and_freed_by_their_owner() {
    let a = pa(
        PcpPolicy::On,
        MergePolicy::Lazy,
        RefillPolicy::Cluster,
        4096,
    );
    let free0 = a.nr_free_pages();
    let p = a.alloc_owned_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap();
    let h = a.alloc_owned_pages(Gfp::MOVABLE, 2, &NoHooks).unwrap();
    let mut bulk = [Pfn::new(0); 8];
    let n = a.alloc_owned_pages_bulk(Gfp::MOVABLE, &mut bulk);
    assert!(n > 0);
    let free = a.nr_free_pages();
    for (q, o) in [(p, 0), (h, 2)]
        .into_iter()
        .chain(bulk[..n].iter().map(|&q| (q, 0)))
    {
        assert_eq!(a.free_pages(q, o), Err(FreeError::Owned));
        assert_eq!(a.user_block_order(q), Err(FreeError::Owned));
    }
    assert_eq!(a.nr_free_pages(), free);
    a.check().unwrap();
    a.free_pages_claim(p, 0, Claim::Owner).unwrap();
    assert!(a.put_page(h));
    for &q in &bulk[..n] {
        a.free_pages_claim(q, 0, Claim::Owner).unwrap();
    }
    // A user's block is the user's, for both kinds of claim.
    let u = a.alloc_pages(Gfp::KERNEL, 1, &NoHooks).unwrap();
    assert_eq!(a.user_block_order(u), Ok(1));
    a.free_pages(u, 1).unwrap();
    assert_eq!(a.nr_free_pages(), free0);
    a.check().unwrap();
}

#[test]
fn kernel_count_is_exact_whatever_the_lists_hold() {
    for refill in [RefillPolicy::PageByPage, RefillPolicy::Cluster] {
        let a = pa(PcpPolicy::On, MergePolicy::Lazy, refill, 4096);
        let take = |a: &PageAlloc<TestPlatform>| {
            let mut v = std::vec::Vec::new();
            while let Ok(p) = a.alloc_pages(Gfp::KERNEL, 0, &NoHooks) {
                v.push(p);
            }
            v
        };
        let first = take(&a);
        let min = a.zones[0].wmark[0];
        assert_eq!(a.zone_info()[0].nr_free, min, "{refill:?}: stopped off min");
        // Park pages on the per-CPU lists, then exhaust again: same count.
        for p in &first {
            a.free_pages(*p, 0).unwrap();
        }
        assert!(a.zone_info()[0].nr_pcp > 0);
        let second = take(&a);
        assert_eq!(second.len(), first.len(), "{refill:?}");
        assert_eq!(a.zone_info()[0].nr_pcp, 0);
        for p in second {
            a.free_pages(p, 0).unwrap();
        }
        a.check().unwrap();
    }
}

#[test]
fn cluster_refill_and_free_keep_blocks_whole() {
    let cfg = Config {
        pcp_batch: Some(63),
        ..Config::default()
    };
    let a = PageAlloc::<TestPlatform>::new(cfg, 4096).unwrap();
    let pfns: std::vec::Vec<Pfn> = (0..500)
        .map(|_| a.alloc_pages(Gfp::MOVABLE, 0, &NoHooks).unwrap())
        .collect();
    for p in &pfns {
        a.free_pages(*p, 0).unwrap();
    }
    a.drain_all_pages();
    a.check().unwrap();
    // Runs went back as aligned blocks, so little is left unmerged.
    assert!(
        a.zone_info()[0].nr_unmerged < 64,
        "{}",
        a.zone_info()[0].nr_unmerged
    );
    assert_eq!(a.nr_free_pages(), 4096);
}

#[test]
fn pcp_ring_is_lifo_at_the_hot_end_fifo_at_the_cold_end() {
    let mut l = PcpList::new(4);
    for i in 0..4 {
        l.push(i);
    }
    assert!(l.is_full());
    assert_eq!(l.pop(), Some(3));
    assert_eq!(l.pop_cold(), Some(0));
    l.push(9);
    l.push(10);
    assert_eq!(l.iter().collect::<std::vec::Vec<_>>(), [1, 2, 9, 10]);
}

// ---------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------

fn pa_nodes(node_pages: &[u64], rows: &[[u8; 3]]) -> PageAlloc<TestPlatform> {
    let n = node_pages.len();
    let d = Distances::from_rows(&rows[..n].iter().map(|r| &r[..n]).collect::<Vec<_>>()).unwrap();
    let states = NodeStates {
        memory: NodeMask::first_n(n),
        cpu: NodeMask::first_n(n),
    };
    let cfg = Config {
        pcp: PcpPolicy::On,
        merge: MergePolicy::Eager,
        refill: RefillPolicy::Cluster,
        pcp_high: PcpHighPolicy::Fixed,
        nr_cpus: 2,
        pcp_batch: None,
        pcp_cache: false,
    };
    PageAlloc::with_nodes(cfg, node_pages, Zonelists::build(&d, &states)).unwrap()
}

const ROWS: [[u8; 3]; 3] = [[10, 20, 30], [20, 10, 20], [30, 20, 10]];

#[test]
fn nodes_are_consecutive_zones_and_pfn_to_nid_finds_them() {
    let a = pa_nodes(&[2048, 1024, 1536], &ROWS);
    assert_eq!(a.nr_nodes(), 3);
    assert_eq!(a.node_span(1), Some((Pfn::new(2048), 1024)));
    assert_eq!(a.node_span(2), Some((Pfn::new(3072), 1536)));
    for (pfn, nid) in [
        (0, 0),
        (2047, 0),
        (2048, 1),
        (3071, 1),
        (3072, 2),
        (4607, 2),
    ] {
        assert_eq!(a.pfn_to_nid(Pfn::new(pfn)), nid, "pfn {pfn}");
    }
    // Each zone's min is its share of the min of the whole memory.
    let one = PageAlloc::<TestPlatform>::new(a.cfg.clone(), 4608).unwrap();
    let sum: u64 = a.zones.iter().map(|z| z.wmark[0]).sum();
    let whole = one.zones[0].wmark[0];
    assert!(sum <= whole && sum + 3 > whole, "{sum} vs {whole}");
    a.check().unwrap();
}

#[test]
fn nodemask_thisnode_and_fallback_order() {
    let a = pa_nodes(&[1024, 1024, 1024], &ROWS);
    let req = |preferred, mask: Option<&[usize]>| NodeReq {
        preferred,
        local: 0,
        nodemask: mask.map(NodeMask::from_nodes),
        interleave: false,
    };
    let p = a
        .alloc_pages_nodemask(Gfp::KERNEL, 0, req(2, None), &NoHooks)
        .unwrap();
    assert_eq!(a.pfn_to_nid(p), 2);
    let p = a
        .alloc_pages_nodemask(Gfp::KERNEL, 2, req(2, Some(&[0])), &NoHooks)
        .unwrap();
    assert_eq!(
        a.pfn_to_nid(p),
        0,
        "the nodemask wins over the preferred node"
    );
    assert_eq!(
        a.alloc_pages_nodemask(Gfp::KERNEL, 0, req(3, None), &NoHooks),
        Err(AllocError::BadNode)
    );
    assert_eq!(
        a.alloc_pages_nodemask(Gfp::KERNEL, 0, req(0, Some(&[5])), &NoHooks),
        Err(AllocError::BadNode)
    );
    // THISNODE on node 0 takes exactly its free pages above min, then fails.
    a.drain_all_pages();
    let room = {
        let g = a.zones[0].lock();
        g.nr_free - a.zones[0].wmark[0]
    };
    let mut got = 0u64;
    while a
        .alloc_pages_nodemask(Gfp::KERNEL | Gfp::THISNODE, 0, req(0, None), &NoHooks)
        .is_ok()
    {
        got += 1;
    }
    assert_eq!(got, room);
    // Without it: node 1 (distance 20) before node 2 (30).
    let p = a
        .alloc_pages_nodemask(Gfp::KERNEL, 0, req(0, None), &NoHooks)
        .unwrap();
    assert_eq!(a.pfn_to_nid(p), 1);
    let s0 = a.numa_stats(0);
    let s1 = a.numa_stats(1);
    assert_eq!(
        s0.numa_hit,
        room + 1,
        "the masked order-2 block was a hit on node 0"
    );
    assert_eq!((s0.numa_foreign, s1.numa_miss, s1.other_node), (1, 1, 1));
    a.check().unwrap();
}

#[test]
fn with_nodes_refuses_bad_layouts() {
    let cfg = pa(
        PcpPolicy::On,
        MergePolicy::Eager,
        RefillPolicy::Cluster,
        1024,
    )
    .cfg
    .clone();
    let d = Distances::uniform(2);
    let st = NodeStates {
        memory: NodeMask::first_n(2),
        cpu: NodeMask::first_n(2),
    };
    let zl = Zonelists::build(&d, &st);
    let mk = |pages: &[u64], zl: Zonelists| {
        PageAlloc::<TestPlatform>::with_nodes(cfg.clone(), pages, zl).err()
    };
    assert!(
        mk(&[1536, 1024], zl.clone()).is_some(),
        "node 0 not whole MAX_ORDER blocks"
    );
    assert!(
        mk(&[1024, 256], zl.clone()).is_some(),
        "node 1 below a pageblock"
    );
    assert!(
        mk(&[1024], zl.clone()).is_some(),
        "zonelists of another node count"
    );
    assert!(mk(&[], zl.clone()).is_some());
    assert!(mk(&[1024, 1536], zl).is_none());
}

/// `split_page` turns an order-9 block into 512 order-0 blocks with one
/// reference each: each frees alone, the count comes back exactly, and the
/// walk is clean; bad input is refused and changes nothing.
#[test]
fn split_page_makes_order0_blocks() {
    let a = pa(
        PcpPolicy::On,
        MergePolicy::Lazy,
        RefillPolicy::Cluster,
        4096,
    );
    let free0 = a.nr_free_pages();
    let head = a.alloc_owned_pages(Gfp::MOVABLE, 9, &NoHooks).unwrap();
    a.get_page(head);
    assert_eq!(
        a.split_page(head, 3),
        Err(FreeError::WrongOrder { allocated: 9 })
    );
    assert_eq!(
        a.split_page(Pfn::new(head.get() + 1), 0),
        Err(FreeError::NotAllocated)
    );
    assert_eq!(
        a.split_page(Pfn::new(head.get() + 1), 1),
        Err(FreeError::Misaligned)
    );
    a.check().unwrap();
    a.split_page(head, 9).unwrap();
    a.check().unwrap();
    for i in 1..512 {
        let p = a.page(Pfn::new(head.get() + i)).unwrap();
        assert_eq!((p.state(), p.order()), (PageState::Alloc, 0));
        assert_eq!(p.refcount().load(Ordering::Relaxed), 1);
        assert!(p.test_flag(PG_OWNED));
        // Owned: a user free is refused; the last reference frees it.
        assert_eq!(
            a.free_pages(Pfn::new(head.get() + i), 0),
            Err(FreeError::Owned)
        );
        assert!(a.put_page(Pfn::new(head.get() + i)));
    }
    // The head kept both of its references.
    assert!(!a.put_page(head));
    assert!(a.put_page(head));
    a.drain_all_pages();
    assert_eq!(a.nr_free_pages(), free0);
    a.check().unwrap();
}
