//! Compaction and migration: every byte survives repeated compactions while other
//! threads read and write the pages; pinned pages and pages in use never move; a
//! zone fragmented every other page gives order-9 blocks; direct compaction,
//! deferral and kcompactd; `check()` after every compaction; the statistics add
//! up; the `mmkit-nomerge` policy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mmkit::{
    CompactResult, Gfp, MapFlags, MergePolicy, MigrateType, Mm, PcpPolicy, Pfn, Space, Variant,
    VmEvent, PAGE_SIZE,
};

const MIB: usize = 1 << 20;
const PAGE: u64 = PAGE_SIZE as u64;

fn build(variant: Variant, mem: usize) -> Mm {
    Mm::builder()
        .memory(mem)
        .variant(variant)
        .kcompactd(false)
        .build()
        .unwrap_or_else(|e| panic!("building {} ({mem} bytes): {e}", variant.name()))
}

fn check(mm: &Mm) {
    if let Err(e) = mm.check() {
        panic!("check(): {e}");
    }
}

fn free_now(mm: &Mm) -> u64 {
    mm.drain_all_pages();
    mm.nr_free_pages()
}

/// Free blocks of at least order 9, over all zones and migratetypes.
fn huge_free_blocks(mm: &Mm) -> u64 {
    mm.zone_info()
        .iter()
        .map(|z| {
            (9..z.free_blocks.len())
                .map(|o| z.free_blocks[o].iter().sum::<u64>() << (o - 9))
                .sum::<u64>()
        })
        .sum()
}

/// The statistics add up.
fn assert_stats(mm: &Mm) {
    let ev = mm.vm_events();
    let cs = mm.compaction_stats();
    let g = |e| ev.get(e);
    assert_eq!(
        g(VmEvent::CompactStall),
        g(VmEvent::CompactSuccess) + g(VmEvent::CompactFail),
        "stall = success + fail"
    );
    assert_eq!(cs.success.iter().sum::<u64>(), g(VmEvent::CompactSuccess));
    assert_eq!(cs.fail.iter().sum::<u64>(), g(VmEvent::CompactFail));
    assert_eq!(cs.deferred.iter().sum::<u64>(), g(VmEvent::CompactDeferred));
    assert_eq!(
        g(VmEvent::CompactIsolated),
        g(VmEvent::PgMigrateSuccess) + g(VmEvent::PgMigrateFail),
        "isolated = migrated + failed"
    );
    assert!(g(VmEvent::PgMigratePinned) <= g(VmEvent::PgMigrateFail));
    assert!(g(VmEvent::PgMigrateSuccess) <= g(VmEvent::CompactFreeIsolated));
    assert!(g(VmEvent::CompactIsolated) <= g(VmEvent::CompactMigrateScanned));
}

/// The 8-byte word `w` of page `vpn` at version `v`.
fn word(vpn: u64, v: u64, w: usize) -> u64 {
    (vpn.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (v << 32) ^ w as u64).rotate_left(17)
}

fn page_bytes(vpn: u64, v: u64) -> Vec<u8> {
    (0..PAGE_SIZE / 8)
        .flat_map(|w| word(vpn, v, w).to_le_bytes())
        .collect()
}

/// The version a page holds, if every word agrees with it.
fn page_version(vpn: u64, bytes: &[u8]) -> Option<u64> {
    let w0 = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    // word() is invertible in v for w = 0: undo the rotate and the xor.
    let v = (w0.rotate_right(17) ^ vpn.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 32;
    bytes
        .chunks_exact(8)
        .enumerate()
        .all(|(w, b)| u64::from_le_bytes(b.try_into().unwrap()) == word(vpn, v, w))
        .then_some(v)
}

/// Maps and faults as much order-0 memory as fits (leaving `slack` pages), writes
/// version 0 of every page, and returns (address, pages).
fn fill_most(mm: &Mm, s: &Space, slack: u64) -> (u64, u64) {
    let free = free_now(mm);
    // A PTE table per 512 pages, and a few upper-level tables.
    let pages = (free - slack) * 512 / 513 - 8;
    let a = s.mmap((pages * PAGE) as usize, MapFlags::empty()).unwrap();
    for i in 0..pages {
        s.write(a + i * PAGE, &page_bytes(i, 0)).unwrap();
    }
    (a, pages)
}

/// Takes every free block of order 9 there is (without compaction, without
/// waking kcompactd), so that the next order-9 request needs compaction.
fn take_free_huge(mm: &Mm) -> Vec<Pfn> {
    let mut v = Vec::new();
    while let Ok(p) = mm.alloc_pages(Gfp::NOWARN, 9) {
        v.push(p);
    }
    v
}

fn give_back(mm: &Mm, blocks: Vec<Pfn>) {
    for p in blocks {
        mm.free_pages(p, 9).unwrap();
    }
}

/// The `n` kept (odd) pages of a filled region with the lowest frames: the ones
/// the migrate scanner reaches first.
fn lowest_kept(s: &Space, a: u64, pages: u64, n: usize) -> Vec<(u64, Pfn)> {
    let mut v: Vec<(u64, Pfn)> = (1..pages)
        .step_by(2)
        .map(|i| (a + i * PAGE, s.translate(a + i * PAGE).unwrap().pfn))
        .collect();
    v.sort_by_key(|x| x.1);
    v.truncate(n);
    v
}

fn verify_all(s: &Space, a: u64, pages: u64, live: impl Fn(u64) -> bool, v: impl Fn(u64) -> u64) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in (0..pages).filter(|i| live(*i)) {
        s.read(a + i * PAGE, &mut buf).unwrap();
        assert_eq!(
            page_version(i, &buf),
            Some(v(i)),
            "page {i} at {:#x}",
            a + i * PAGE
        );
    }
}

fn every_other_page_yields_order9_blocks(variant: Variant) {
    let mm = build(variant, 32 * MIB);
    let before = free_now(&mm);
    {
        let s = mm.new_space().unwrap();
        let (a, pages) = fill_most(&mm, &s, 1200);
        for i in (0..pages).step_by(2) {
            s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
        }
        mm.drain_all_pages();
        mm.page_alloc().merge_all();
        let h0 = huge_free_blocks(&mm);
        assert!(
            h0 <= 1,
            "not fragmented: {h0} order-9 blocks\n{}",
            mm.buddyinfo()
        );
        let sum = mm.compact_memory();
        check(&mm);
        assert!(sum.migrated > 1000, "{sum:?}");
        assert_eq!(sum.failed, 0, "{sum:?}");
        let h1 = huge_free_blocks(&mm);
        assert!(
            h1 >= h0 + 4,
            "{} order-9 blocks before, {h1} after compaction\n{}",
            h0,
            mm.buddyinfo()
        );
        verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
        // And they can be allocated.
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(mm.alloc_pages(Gfp::MOVABLE, 9).unwrap());
        }
        for p in got {
            mm.free_pages(p, 9).unwrap();
        }
        assert_stats(&mm);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn every_other_page_yields_order9_blocks_mmkit() {
    every_other_page_yields_order9_blocks(Variant::Mmkit)
}
#[test]
fn every_other_page_yields_order9_blocks_eager() {
    every_other_page_yields_order9_blocks(Variant::MmkitEager)
}
#[test]
fn every_other_page_yields_order9_blocks_nopcp() {
    every_other_page_yields_order9_blocks(Variant::MmkitNoPcp)
}
#[test]
fn every_other_page_yields_order9_blocks_nomerge() {
    every_other_page_yields_order9_blocks(Variant::MmkitNoMerge)
}

/// Threads read and write the pages of one space (each page whole and
/// self-consistent, writers owning disjoint pages), while the main thread
/// scatters free memory and compacts again and again.
fn migration_keeps_every_byte(variant: Variant) {
    let mm = build(variant, 48 * MIB);
    let before = free_now(&mm);
    let data_pages = 2048u64;
    {
        // The first pages handed out are the highest frames; keep the data below
        // them, where the migrate scanner starts.
        let top = mm.new_space().unwrap();
        let t = top.mmap(24 * MIB, MapFlags::empty()).unwrap();
        top.populate(t, 24 * MIB, true).unwrap();
        let s = Arc::new(mm.new_space().unwrap());
        let a = s
            .mmap((data_pages * PAGE) as usize, MapFlags::empty())
            .unwrap();
        for i in 0..data_pages {
            s.write(a + i * PAGE, &page_bytes(i, 0)).unwrap();
        }
        drop(top);
        let versions: Arc<Vec<AtomicU64>> =
            Arc::new((0..data_pages).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let writers = 2u64;
        let mut hs = Vec::new();
        for t in 0..writers {
            let (s, versions, stop) = (s.clone(), versions.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                let mut n = 0u64;
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let addr = a + i * PAGE;
                    let v = versions[i as usize].load(Ordering::Relaxed);
                    if n.is_multiple_of(2) {
                        s.with_page(addr, true, |p| {
                            assert_eq!(page_version(i, p), Some(v), "page {i} before write");
                            p.copy_from_slice(&page_bytes(i, v + 1));
                        })
                        .unwrap();
                    } else {
                        let mut buf = vec![0u8; PAGE_SIZE];
                        s.read(addr, &mut buf).unwrap();
                        assert_eq!(page_version(i, &buf), Some(v), "page {i} before write");
                        s.write(addr, &page_bytes(i, v + 1)).unwrap();
                    }
                    versions[i as usize].store(v + 1, Ordering::Relaxed);
                    n += 1;
                    i += writers;
                    if i >= data_pages {
                        i = t;
                    }
                }
                n
            }));
        }
        // A reader checking that every page it sees is whole.
        {
            let (s, stop) = (s.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                let mut n = 0u64;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    s.read(a + i * PAGE, &mut buf).unwrap();
                    assert!(page_version(i, &buf).is_some(), "page {i} torn");
                    i = (i * 7 + 13) % data_pages;
                    n += 1;
                }
                n
            }));
        }
        let mut moved = 0u64;
        for round in 0..8 {
            // Scatter free memory: fault most of it in a second space, free every
            // other page of that, compact.
            let churn = mm.new_space().unwrap();
            let free = free_now(&mm);
            let n = (free.saturating_sub(1500)) * 512 / 513;
            let c = churn.mmap((n * PAGE) as usize, MapFlags::empty()).unwrap();
            churn.populate(c, (n * PAGE) as usize, true).unwrap();
            for i in (0..n).step_by(2) {
                churn.munmap(c + i * PAGE, PAGE_SIZE).unwrap();
            }
            let pfns: Vec<Pfn> = (0..data_pages)
                .map(|i| s.translate(a + i * PAGE).unwrap().pfn)
                .collect();
            let sum = mm.compact_memory();
            check(&mm);
            moved += (0..data_pages)
                .filter(|&i| s.translate(a + i * PAGE).unwrap().pfn != pfns[i as usize])
                .count() as u64;
            assert!(sum.migrated > 0, "round {round}: {sum:?}");
            drop(churn);
        }
        stop.store(true, Ordering::Relaxed);
        let ops: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(ops.iter().all(|n| *n > 0), "{ops:?}");
        eprintln!(
            "moved {moved} ops {ops:?} {}",
            mm.vm_events().get(VmEvent::PgMigrateSuccess)
        );
        assert!(moved > data_pages / 4, "only {moved} data-page moves");
        verify_all(
            &s,
            a,
            data_pages,
            |_| true,
            |i| versions[i as usize].load(Ordering::Relaxed),
        );
        assert_stats(&mm);
        assert!(mm.vm_events().get(VmEvent::PgMigrateSuccess) > 0);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn migration_keeps_every_byte_mmkit() {
    migration_keeps_every_byte(Variant::Mmkit)
}
#[test]
fn migration_keeps_every_byte_eager() {
    migration_keeps_every_byte(Variant::MmkitEager)
}
#[test]
fn migration_keeps_every_byte_nomerge() {
    migration_keeps_every_byte(Variant::MmkitNoMerge)
}

#[test]
fn pinned_pages_and_pages_in_use_never_move() {
    let mm = build(Variant::Mmkit, 32 * MIB);
    let before = free_now(&mm);
    {
        let s = Arc::new(mm.new_space().unwrap());
        let (a, pages) = fill_most(&mm, &s, 1200);
        for i in (0..pages).step_by(2) {
            s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
        }
        // Low frames are the ones the migrate scanner moves first.
        let low = lowest_kept(&s, a, pages, 3);
        let (pinned_va, pinned) = low[0];
        let (busy_va, busy) = low[1];
        let (other_va, other) = low[2];
        // Pinned as for DMA (a reference, no page lock).
        let pin = s.pin_page(pinned_va, false).unwrap();
        assert_eq!(pin.pfn(), pinned);
        // A caller cannot take or drop a reference on a space's page itself.
        assert!(matches!(
            mm.get_page(pinned),
            Err(mmkit::Error::OwnedBySpace { .. })
        ));
        // A thread inside with_page on `busy` for the whole compaction.
        let (started_tx, started_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            s2.with_page(busy_va, true, |p| {
                started_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                p[..8].copy_from_slice(&0xfeed_u64.to_le_bytes());
            })
            .unwrap();
        });
        started_rx.recv().unwrap();
        let sum = mm.compact_memory();
        check(&mm);
        done_tx.send(()).unwrap();
        h.join().unwrap();
        assert_eq!(
            s.translate(pinned_va).unwrap().pfn,
            pinned,
            "a pinned page moved"
        );
        assert_eq!(
            s.translate(busy_va).unwrap().pfn,
            busy,
            "a page in use moved"
        );
        assert_ne!(
            s.translate(other_va).unwrap().pfn,
            other,
            "nothing moved at all"
        );
        assert!(sum.failed >= 2, "{sum:?}");
        assert!(mm.vm_events().get(VmEvent::PgMigratePinned) >= 2);
        // The write made through with_page during the compaction is there.
        let mut buf = [0u8; 8];
        s.read(busy_va, &mut buf).unwrap();
        assert_eq!(u64::from_le_bytes(buf), 0xfeed);
        let mut page = vec![0u8; PAGE_SIZE];
        s.read(pinned_va, &mut page).unwrap();
        assert_eq!(page_version((pinned_va - a) / PAGE, &page), Some(0));
        drop(pin);
        // Unpinned, it moves.
        mm.compact_memory();
        check(&mm);
        assert_stats(&mm);
    }
    assert_eq!(free_now(&mm), before);
    check(&mm);
}

#[test]
fn page_tables_and_kernel_pages_never_move() {
    let mm = build(Variant::Mmkit, 32 * MIB);
    let s = mm.new_space().unwrap();
    let (a, pages) = fill_most(&mm, &s, 4000);
    let kernel: Vec<Pfn> = (0..512)
        .map(|_| mm.alloc_pages(Gfp::KERNEL, 0).unwrap())
        .collect();
    for &p in &kernel {
        // SAFETY: our own page.
        unsafe { mm.page_address(p).write(0x5a) };
    }
    for i in (0..pages).step_by(2) {
        s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
    }
    let tables = s.stats().pgtable_pages;
    mm.compact_memory();
    check(&mm);
    for &p in &kernel {
        // SAFETY: still our own page: compaction only moves mapped pages.
        assert_eq!(unsafe { mm.page_address(p).read() }, 0x5a);
        assert!(mm.rmap_lookup(p).is_none());
    }
    assert_eq!(s.stats().pgtable_pages, tables);
    verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
    for p in kernel {
        mm.free_pages(p, 0).unwrap();
    }
}

#[test]
fn direct_compaction_serves_order9_and_huge_faults() {
    for variant in [Variant::Mmkit, Variant::MmkitEager] {
        let mm = build(variant, 32 * MIB);
        let s = mm.new_space().unwrap();
        let (a, pages) = fill_most(&mm, &s, 1200);
        for i in (0..pages).step_by(2) {
            s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
        }
        let huge = take_free_huge(&mm);
        mm.reset_stats();
        let p = mm
            .alloc_pages(Gfp::MOVABLE, 9)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", variant.name(), mm.vmstat()));
        let ev = mm.vm_events();
        assert!(ev.get(VmEvent::CompactStall) >= 1, "{}", mm.vmstat());
        assert!(ev.get(VmEvent::CompactSuccess) >= 1, "{}", mm.vmstat());
        assert!(mm.compaction_stats().success[9] >= 1);
        check(&mm);
        // A huge fault compacts for itself too.
        let h = s.mmap(4 * MIB, MapFlags::HUGE).unwrap();
        s.write(h, &[7]).unwrap();
        assert!(s.translate(h).unwrap().huge, "{}", mm.vmstat());
        assert_eq!(s.stats().huge_faults, 1);
        verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
        mm.free_pages(p, 9).unwrap();
        give_back(&mm, huge);
        assert_stats(&mm);
        check(&mm);
    }
}

#[test]
fn failed_compaction_is_deferred() {
    let mm = build(Variant::MmkitEager, 16 * MIB);
    // Unmovable pages every other page: compaction cannot help.
    let mut held = Vec::new();
    while let Ok(p) = mm.alloc_pages(Gfp::KERNEL, 0) {
        held.push(p);
    }
    let mut keep = Vec::new();
    for (i, p) in held.into_iter().enumerate() {
        if i % 2 == 0 {
            mm.free_pages(p, 0).unwrap();
        } else {
            keep.push(p);
        }
    }
    mm.reset_stats();
    let mut results = Vec::new();
    for _ in 0..40 {
        assert!(mm.alloc_pages(Gfp::MOVABLE, 9).is_err());
        results.push(mm.compact(9));
    }
    let cs = mm.compaction_stats();
    let ev = mm.vm_events();
    assert!(cs.defer_shift >= 2, "{cs:?}");
    assert!(ev.get(VmEvent::CompactDeferred) > 20, "{}", mm.vmstat());
    assert!(results.contains(&CompactResult::Deferred), "{results:?}");
    assert_eq!(ev.get(VmEvent::CompactSuccess), 0);
    assert!(ev.get(VmEvent::CompactFail) >= 1);
    assert!(mm.vmstat().contains("compact_deferred_order9 "));
    assert_stats(&mm);
    check(&mm);
    // Once memory is back, compaction is tried again (after the deferral) and a
    // success resets it.
    for p in keep {
        mm.free_pages(p, 0).unwrap();
    }
    let p = mm.alloc_pages(Gfp::MOVABLE, 9).unwrap();
    mm.free_pages(p, 9).unwrap();
    check(&mm);
}

/// Makes the next direct compaction go on from cached scanner positions where
/// the two scanners meet at once without migrating anything: the free scanner at
/// `held` (a pageblock that is one allocated order-9 block, so it has no free
/// page to migrate to), the migrate scanner the pageblock below it.
fn park_scanners_below(mm: &Mm, held: Pfn) {
    use mmkit::mmkit_core::CompactMode;
    let pa = mm.page_alloc();
    let mut cc = pa.compact_control(0, Some(9), MigrateType::Movable, CompactMode::Direct);
    cc.migrate_pfn = held.get() as u32 - 512;
    cc.free_pfn = held.get() as u32;
    pa.compact_finish(&cc);
}

/// A held order-9 block with a pageblock below it.
fn parking_block(huge: &[Pfn]) -> Pfn {
    *huge
        .iter()
        .find(|p| p.get() >= 512)
        .expect("an order-9 block above the first pageblock")
}

#[test]
fn partial_compaction_is_retried_from_the_zone_ends_and_not_deferred() {
    for variant in [Variant::Mmkit, Variant::MmkitEager] {
        let mm = build(variant, 32 * MIB);
        let s = mm.new_space().unwrap();
        let (a, pages) = fill_most(&mm, &s, 1200);
        for i in (0..pages).step_by(2) {
            s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
        }
        let huge = take_free_huge(&mm);
        assert!(!huge.is_empty(), "{}", mm.buddyinfo());
        let blocked = parking_block(&huge);
        mm.reset_stats();

        // One run from positions where the scanners meet at once: no verdict on
        // the zone, so nothing is deferred, and the positions are reset.
        park_scanners_below(&mm, blocked);
        assert_eq!(mm.compact(9), CompactResult::PartialSkipped);
        let cs = mm.compaction_stats();
        assert_eq!(cs.defer_shift, 0, "{cs:?}");
        assert_eq!(cs.fail[9], 1, "{cs:?}");
        // The next run starts from the zone's ends and finds a block.
        assert_eq!(mm.compact(9), CompactResult::Success, "{}", mm.vmstat());

        // The slow path: its first (async) run is the partial one; it compacts
        // again at the next priority, from the zone's ends, instead of failing.
        let more = take_free_huge(&mm);
        park_scanners_below(&mm, blocked);
        mm.reset_stats();
        let p = mm
            .alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", variant.name(), mm.vmstat()));
        let cs = mm.compaction_stats();
        assert_eq!((cs.fail[9], cs.success[9]), (1, 1), "{}", mm.vmstat());
        assert_eq!(cs.defer_shift, 0, "{cs:?}");
        assert_eq!(mm.vm_events().get(VmEvent::CompactStall), 2);
        check(&mm);
        verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
        mm.free_pages(p, 9).unwrap();
        give_back(&mm, more);
        give_back(&mm, huge);
        assert_stats(&mm);
        check(&mm);
    }
}

#[test]
fn costly_order_stops_after_a_whole_zone_failure() {
    // Unmovable pages every other page: compaction cannot help. The async run
    // goes through the whole zone and defers; the retry at the next priority is
    // then skipped by the deferral, and the request fails after one run.
    let mm = build(Variant::MmkitEager, 16 * MIB);
    let mut held = Vec::new();
    while let Ok(p) = mm.alloc_pages(Gfp::KERNEL, 0) {
        held.push(p);
    }
    let mut keep = Vec::new();
    for (i, p) in held.into_iter().enumerate() {
        if i % 2 == 0 {
            mm.free_pages(p, 0).unwrap();
        } else {
            keep.push(p);
        }
    }
    mm.reset_stats();
    assert!(mm.alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9).is_err());
    let ev = mm.vm_events();
    assert_eq!(ev.get(VmEvent::CompactStall), 1, "{}", mm.vmstat());
    assert_eq!(ev.get(VmEvent::CompactFail), 1, "{}", mm.vmstat());
    assert_eq!(ev.get(VmEvent::CompactDeferred), 1, "{}", mm.vmstat());
    assert_eq!(mm.compaction_stats().defer_shift, 1, "{}", mm.vmstat());
    assert_stats(&mm);
    for p in keep {
        mm.free_pages(p, 0).unwrap();
    }
    check(&mm);
}

#[test]
fn kcompactd_compacts_in_the_background() {
    let mm = Mm::builder()
        .memory(32 * MIB)
        .variant(Variant::Mmkit)
        .compaction(false)
        .kcompactd(true)
        .compaction_proactiveness(0)
        .build()
        .unwrap();
    let s = mm.new_space().unwrap();
    let (a, pages) = fill_most(&mm, &s, 1200);
    for i in (0..pages).step_by(2) {
        s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
    }
    let huge = take_free_huge(&mm);
    // Without direct compaction the request fails (unless kcompactd, which it
    // wakes, is quicker than its slow path) until kcompactd made a block.
    let t0 = Instant::now();
    let p = loop {
        if let Ok(p) = mm.alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9) {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "kcompactd did nothing\n{}",
            mm.vmstat()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // kcompactd counts a batch's migrations after it has freed the sources, so
    // the block can be taken before the count is in: read it once the run ended.
    mm.wait_compaction_idle();
    let ev = mm.vm_events();
    assert!(ev.get(VmEvent::CompactDaemonWake) >= 1);
    assert!(ev.get(VmEvent::PgMigrateSuccess) > 0, "{}", mm.vmstat());
    assert_eq!(ev.get(VmEvent::CompactStall), 0, "no direct compaction");
    // It builds blocks ahead of the next requests, not just the one taken (up to
    // KCOMPACTD_GOAL_BLOCKS; here the scanners meet after 6, where a goal of one
    // block leaves 1).
    let built = huge_free_blocks(&mm) + 1;
    assert!(
        built >= 4,
        "kcompactd built {built} blocks\n{}",
        mm.vmstat()
    );
    // Its scanners met short of the goal, with blocks built: no deferral.
    assert_eq!(mm.compaction_stats().defer_shift, 0, "{}", mm.vmstat());
    mm.free_pages(p, 9).unwrap();
    give_back(&mm, huge);
    verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
    check(&mm);
}

#[test]
fn proactive_compaction_lowers_the_score() {
    let mm = Mm::builder()
        .memory(32 * MIB)
        .variant(Variant::MmkitEager)
        .compaction(false)
        .kcompactd(true)
        .compaction_proactiveness(50)
        .build()
        .unwrap();
    let s = mm.new_space().unwrap();
    let (a, pages) = fill_most(&mm, &s, 1200);
    for i in (0..pages).step_by(2) {
        s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
    }
    let t0 = Instant::now();
    while mm.fragmentation_score() > 50 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "score {} after 20 s\n{}",
            mm.fragmentation_score(),
            mm.vmstat()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(mm.vm_events().get(VmEvent::CompactProactive) >= 1);
    verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
    check(&mm);
}

#[test]
fn fragmentation_index_and_pagetypeinfo() {
    let mm = build(Variant::MmkitEager, 16 * MIB);
    assert_eq!(
        mm.fragmentation_index(9),
        -1000,
        "a free order-9 block exists"
    );
    assert_eq!(mm.fragmentation_score(), 0);
    let text = mm.pagetypeinfo();
    let row = text
        .lines()
        .skip_while(|l| !l.starts_with("Number of blocks type"))
        .nth(1)
        .unwrap();
    let blocks: u64 = row
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok())
        .skip(1) // "Node 0"
        .sum();
    assert_eq!(blocks, (16 * MIB / (2 * MIB)) as u64, "{text}");
    // Every other page taken: free memory is all order 0.
    let mut held = Vec::new();
    while let Ok(p) = mm.alloc_pages(Gfp::MOVABLE, 0) {
        held.push(p);
    }
    for p in held.iter().step_by(2) {
        mm.free_pages(*p, 0).unwrap();
    }
    mm.drain_all_pages();
    assert!(
        mm.fragmentation_index(9) > 900,
        "{}",
        mm.fragmentation_index(9)
    );
    assert_eq!(mm.fragmentation_score(), 100);
    assert!(mm.vmstat().contains("fragmentation_score 100"));
    for p in held.iter().skip(1).step_by(2) {
        mm.free_pages(*p, 0).unwrap();
    }
    check(&mm);
}

#[test]
fn nomerge_policy_never_merges_on_demand() {
    for (merge, order9_ok) in [(MergePolicy::Lazy, true), (MergePolicy::LazyNoMerge, false)] {
        let mm = Mm::builder()
            .memory(8 * MIB)
            .pcp(PcpPolicy::Off)
            .merge(merge)
            .kcompactd(false)
            .build()
            .unwrap();
        let mut held = Vec::new();
        while let Ok(p) = mm.alloc_pages(Gfp::KERNEL, 0) {
            held.push(p);
        }
        for p in held {
            mm.free_pages(p, 0).unwrap();
        }
        assert!(mm.zone_info()[0].nr_unmerged > 1000);
        let r = mm.alloc_pages(Gfp::KERNEL, 9);
        assert_eq!(r.is_ok(), order9_ok, "{merge:?}: {r:?}");
        if let Ok(p) = r {
            mm.free_pages(p, 9).unwrap();
            assert_eq!(mm.zone_info()[0].nr_unmerged, 0);
        } else {
            assert!(mm.zone_info()[0].nr_unmerged > 1000);
        }
        check(&mm);
    }
    assert_eq!(
        Variant::from_name("mmkit-nomerge"),
        Some(Variant::MmkitNoMerge)
    );
    let mm = build(Variant::MmkitNoMerge, 8 * MIB);
    assert_eq!(mm.config().merge, MergePolicy::LazyNoMerge);
}

/// Order-9 requests with direct compaction until none can be had: the last runs
/// end with the scanners meeting, also right after capturing a block, and every
/// page comes back.
#[test]
fn compaction_until_exhausted_loses_no_page() {
    for variant in [Variant::Mmkit, Variant::MmkitEager, Variant::MmkitNoMerge] {
        let mm = build(variant, 32 * MIB);
        let before = free_now(&mm);
        {
            let s = mm.new_space().unwrap();
            let (a, pages) = fill_most(&mm, &s, 1200);
            for i in (0..pages).step_by(2) {
                s.munmap(a + i * PAGE, PAGE_SIZE).unwrap();
            }
            let mut got = Vec::new();
            while let Ok(p) = mm.alloc_pages(Gfp::MOVABLE | Gfp::NOWARN, 9) {
                got.push(p);
            }
            check(&mm);
            assert!(got.len() >= 4, "{}: {} blocks", variant.name(), got.len());
            verify_all(&s, a, pages, |i| i % 2 == 1, |_| 0);
            give_back(&mm, got);
            assert_stats(&mm);
        }
        assert_eq!(free_now(&mm), before, "{}", variant.name());
        check(&mm);
    }
}
