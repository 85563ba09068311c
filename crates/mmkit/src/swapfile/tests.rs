//! Tests of the device set: swapon validation, priorities, entries end to end
//! (map, cache, I/O), fault injection, real swap files, swapoff.

use std::path::{Path, PathBuf};

use super::*;
use crate::page_io::tests::Flaky;
use crate::page_io::{SwapBackend, SwapIoError};
use crate::swap_cluster::MapError;
use std::sync::atomic::Ordering;

const MB: u64 = 1 << 20;

fn devices(alloc: SwapAllocPolicy, index: SwapCacheIndex) -> SwapDevices {
    SwapDevices::new(
        alloc,
        index,
        SwapFreePolicy::HalfFull,
        SwapReadahead::Off,
        4,
    )
}

/// Allocates up to `n` slots; how many it got.
fn get_slots(d: &SwapDevices, cpu: usize, n: usize, e: &mut Vec<SwapEntry>) -> usize {
    let before = e.len();
    let dev = d.get_swap_pages(cpu, n, e);
    assert_eq!(dev.is_some(), e.len() > before);
    e.len() - before
}

/// The device of an entry that names one.
fn pin(d: &SwapDevices, x: SwapEntry) -> DeviceRef {
    d.get(x).expect("the entry names a device that is on")
}

fn page(tag: u8) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8).wrapping_add(tag))
        .collect()
}

#[test]
fn swapon_reports_devices_like_proc_swaps() {
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    let a = d.swapon(SwapDevice::ram(4 * MB)).unwrap();
    let b = d.swapon(SwapDevice::ram(2 * MB)).unwrap();
    let c = d.swapon(SwapDevice::ram(2 * MB).priority(7)).unwrap();
    assert_eq!((a.swap_type(), b.swap_type(), c.swap_type()), (0, 1, 2));
    let info = d.swap_info();
    assert_eq!(info.len(), 3);
    assert_eq!(
        (info[0].id, info[0].size_pages, info[0].used_pages),
        (a, 1024, 0)
    );
    assert_eq!(
        info.iter().map(|i| i.priority).collect::<Vec<_>>(),
        vec![-2, -3, 7]
    );
    assert_eq!(info[0].kind, SwapKind::Ram);
    assert_eq!(d.nr_swap_pages(), (2048, 2048));
    let text = d.proc_swaps();
    assert!(text.starts_with("Filename"), "{text}");
    assert!(text.contains("[ram]") && text.contains("4096"), "{text}");
    assert_eq!(text.lines().count(), 4);
}

#[test]
fn swapon_refuses_bad_input_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    let on = d
        .swapon(SwapDevice::file(dir.path().join("on.swap"), 2 * MB))
        .unwrap();
    let before = d.swap_info();
    let other = dir.path().join("other");
    std::fs::write(&other, b"precious").unwrap();
    let bad = [
        (SwapDevice::ram(2 * MB + 1), "BadSize"),
        (SwapDevice::ram(0), "BadSize"),
        (SwapDevice::ram(MB), "BadSize"),
        (SwapDevice::ram(1 << 46), "BadSize"),
        (SwapDevice::ram(2 * MB).priority(-5), "BadPriority"),
        (SwapDevice::ram(2 * MB).priority(40000), "BadPriority"),
        (SwapDevice::file("", 2 * MB), "BadPath"),
        (SwapDevice::file(dir.path(), 2 * MB), "BadPath"),
        (SwapDevice::file("/dev/null", 2 * MB), "BadPath"),
        (
            SwapDevice::file(dir.path().join("no/such/dir/f"), 2 * MB),
            "BadPath",
        ),
        (SwapDevice::file(&other, 2 * MB), "BadPath"),
        (
            SwapDevice::file(dir.path().join("on.swap"), 2 * MB),
            "DuplicateFile",
        ),
        (
            SwapDevice::file(dir.path().join(".").join("on.swap"), 2 * MB),
            "DuplicateFile",
        ),
    ];
    for (dev, want) in bad {
        let what = format!("{dev:?}");
        let e = d.swapon(dev).unwrap_err();
        assert!(format!("{e:?}").starts_with(want), "{what}: {e:?}");
        assert!(!e.to_string().is_empty());
        assert_eq!(d.swap_info(), before, "{what} changed the devices");
    }
    assert_eq!(std::fs::read(&other).unwrap(), b"precious");
    assert!(!dir.path().join("no").exists());
    // swapoff of ids that name nothing.
    assert_eq!(
        d.swapoff(SwapId { ty: 9, gen: 1 }),
        Err(SwapError::NoSuchDevice {
            id: SwapId { ty: 9, gen: 1 }
        })
    );
    let stale = SwapId {
        ty: on.ty,
        gen: on.gen + 1,
    };
    assert_eq!(d.swapoff(stale), Err(SwapError::NoSuchDevice { id: stale }));
    // A device with a slot in use stays on.
    let mut e = Vec::new();
    assert_eq!(get_slots(&d, 0, 1, &mut e), 1);
    assert_eq!(
        d.swapoff(on),
        Err(SwapError::Busy {
            id: on,
            used_pages: 1
        })
    );
    assert_eq!(d.swap_info().len(), 1);
    assert_eq!(pin(&d, e[0]).swapcache_clear(e[0]), Ok(0));
    d.swapoff(on).unwrap();
    assert!(d.swap_info().is_empty());
    assert_eq!(d.swapoff(on), Err(SwapError::NoSuchDevice { id: on }));
    // The file stays and can go on again; the old id does not name the new device.
    let again = d
        .swapon(SwapDevice::file(dir.path().join("on.swap"), 2 * MB))
        .unwrap();
    assert_eq!(again.swap_type(), on.swap_type());
    assert_ne!(again, on);
    assert_eq!(d.swapoff(on), Err(SwapError::NoSuchDevice { id: on }));
}

#[test]
fn swapon_refuses_a_32nd_device() {
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    for _ in 0..MAX_SWAPFILES {
        d.swapon(SwapDevice::ram(2 * MB)).unwrap();
    }
    assert_eq!(
        d.swapon(SwapDevice::ram(2 * MB)),
        Err(SwapError::TooManyDevices)
    );
    assert_eq!(d.swap_info().len(), MAX_SWAPFILES);
}

#[test]
fn slots_come_by_priority_then_round_robin() {
    let d = devices(SwapAllocPolicy::PerCpuCluster, SwapCacheIndex::Table);
    let low = d.swapon(SwapDevice::ram(2 * MB).priority(1)).unwrap();
    let hi1 = d.swapon(SwapDevice::ram(2 * MB).priority(5)).unwrap();
    let hi2 = d.swapon(SwapDevice::ram(2 * MB).priority(5)).unwrap();
    let mut e = Vec::new();
    for _ in 0..100 {
        assert_eq!(get_slots(&d, 0, 1, &mut e), 1);
    }
    let on = |e: &Vec<SwapEntry>, id: SwapId| e.iter().filter(|x| x.ty() == id.swap_type()).count();
    assert_eq!((on(&e, hi1), on(&e, hi2), on(&e, low)), (50, 50, 0));
    // Fill both high devices: the rest comes from the low one.
    while get_slots(&d, 1, 64, &mut e) > 0 {}
    assert_eq!((on(&e, hi1), on(&e, hi2), on(&e, low)), (512, 512, 512));
    d.check().unwrap();
    for x in &e {
        assert_eq!(pin(&d, *x).swapcache_clear(*x), Ok(0));
    }
    assert_eq!(d.nr_swap_pages(), (1536, 1536));
}

#[test]
fn entries_round_trip_through_map_cache_and_io() {
    for (alloc, index) in [
        (SwapAllocPolicy::SharedCursor, SwapCacheIndex::Trunks),
        (SwapAllocPolicy::PerCpuCursor, SwapCacheIndex::Trunks),
        (SwapAllocPolicy::PerCpuCluster, SwapCacheIndex::Table),
    ] {
        let d = devices(alloc, index);
        d.swapon(SwapDevice::ram(2 * MB)).unwrap();
        let mut e = Vec::new();
        get_slots(&d, 1, 3, &mut e);
        // Swap-out: cache, write, the PTE's reference, leave the cache.
        for (i, &x) in e.iter().enumerate() {
            let v = pin(&d, x);
            v.add_to_swap_cache(x, 100 + i as u32).unwrap();
            v.swap_writepage(x, &page(i as u8)).unwrap();
            v.swap_duplicate(x).unwrap();
            assert!(v.delete_from_swap_cache(x, 100 + i as u32, 0));
            assert_eq!(v.swapcache_clear(x), Ok(1));
        }
        assert_eq!(d.swap_info()[0].used_pages, 3);
        // Swap-in: claim the cache, read, map, free the slot.
        let mut buf = vec![0u8; PAGE_SIZE];
        for (i, &x) in e.iter().enumerate() {
            let v = pin(&d, x);
            v.swapcache_prepare(x).unwrap();
            assert!(matches!(
                v.swapcache_prepare(x),
                Err(SwapError::Map(MapError::CacheBusy(_)))
            ));
            v.add_to_swap_cache(x, 200).unwrap();
            assert_eq!(v.lookup_swap_cache(x), Some(200));
            v.swap_readpage(x, &mut buf).unwrap();
            assert_eq!(buf, page(i as u8));
            assert!(v.delete_from_swap_cache(x, 200, 0));
            assert_eq!(v.swapcache_clear(x), Ok(1));
            assert_eq!(v.swap_free(x), Ok(0));
            // The freed slot's checksum is forgotten.
            assert!(matches!(
                v.swap_readpage(x, &mut buf),
                Err(SwapError::Io(SwapIoError::NotWritten { .. }))
            ));
        }
        let i = &d.swap_info()[0];
        assert_eq!(
            (i.used_pages, i.cached_pages, i.pswpin, i.pswpout),
            (0, 0, 3, 3)
        );
        let (_, cluster, trunk) = d.lock_stats();
        match index {
            SwapCacheIndex::Trunks => assert!(trunk.acquisitions >= 9),
            SwapCacheIndex::Table => assert_eq!(trunk.acquisitions, 0),
        }
        assert!(cluster.acquisitions > 0);
        d.check().unwrap();
        // An entry naming no device, or past the end of one, names none; a
        // device refuses an entry past its end, or another device's.
        let none = SwapEntry::new(5, 0).unwrap();
        let past = SwapEntry::new(0, 512).unwrap();
        assert!(d.get(none).is_none() && d.get(past).is_none());
        let d0 = pin(&d, e[0]);
        for bad in [none, past] {
            assert_eq!(d0.swap_free(bad), Err(SwapError::BadEntry { entry: bad }));
            assert_eq!(
                d0.swap_duplicate(bad),
                Err(SwapError::BadEntry { entry: bad })
            );
            assert_eq!(d0.lookup_swap_cache(bad), None);
        }
    }
}

#[test]
fn backend_fault_injection_end_to_end() {
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    let flaky = Arc::new(Flaky::new(2 * MB));
    d.swapon(SwapDevice::backend(flaky.clone(), 2 * MB))
        .unwrap();
    let mut e = Vec::new();
    get_slots(&d, 0, 2, &mut e);
    let (x, y) = (e[0], e[1]);
    let mut buf = vec![0u8; PAGE_SIZE];
    // Write error: reported, the slot holds nothing readable; a retry succeeds.
    flaky.fail_write.store(true, Ordering::Relaxed);
    assert!(matches!(
        pin(&d, x).swap_writepage(x, &page(1)),
        Err(SwapError::Io(SwapIoError::Io { .. }))
    ));
    assert!(matches!(
        pin(&d, x).swap_readpage(x, &mut buf),
        Err(SwapError::Io(SwapIoError::NotWritten { .. }))
    ));
    flaky.fail_write.store(false, Ordering::Relaxed);
    pin(&d, x).swap_writepage(x, &page(1)).unwrap();
    // Read error, then the device heals.
    flaky.fail_read.store(true, Ordering::Relaxed);
    assert!(matches!(
        pin(&d, x).swap_readpage(x, &mut buf),
        Err(SwapError::Io(SwapIoError::Io { .. }))
    ));
    flaky.fail_read.store(false, Ordering::Relaxed);
    pin(&d, x).swap_readpage(x, &mut buf).unwrap();
    assert_eq!(buf, page(1));
    // A corrupted slot is an error, never data.
    pin(&d, y).swap_writepage(y, &page(2)).unwrap();
    let mut bad = page(2);
    bad[4095] ^= 0x80;
    flaky
        .ram
        .write(y.offset() * PAGE_SIZE as u64, &bad)
        .unwrap();
    assert!(matches!(
        pin(&d, y).swap_readpage(y, &mut buf),
        Err(SwapError::Io(SwapIoError::Corrupt { .. }))
    ));
    let i = &d.swap_info()[0];
    assert_eq!(
        (i.io_errors, i.checksum_errors, i.pswpin, i.pswpout),
        (2, 1, 1, 2)
    );
}

fn swap_file_round_trip(dir: &Path, dev: impl Fn(PathBuf) -> SwapDevice) -> SwapInfo {
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    let path = dir.join("mm.swap");
    let id = d.swapon(dev(path.clone())).unwrap();
    let mut e = Vec::new();
    assert_eq!(get_slots(&d, 0, 8, &mut e), 8);
    // Contiguous slots from one cluster: one batched write.
    assert!(e.windows(2).all(|w| w[1].offset() == w[0].offset() + 1));
    let pages: Vec<Vec<u8>> = (0..8).map(page).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    pin(&d, e[0]).swap_writepages(e[0], &refs).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    for (x, p) in e.iter().zip(&pages) {
        pin(&d, *x).swap_readpage(*x, &mut buf).unwrap();
        assert_eq!(&buf, p);
        assert_eq!(pin(&d, *x).swapcache_clear(*x), Ok(0));
    }
    let info = d.swap_info().remove(0);
    assert_eq!(
        (info.kind, info.filename.clone()),
        (SwapKind::File, path.display().to_string())
    );
    d.swapoff(id).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MB);
    info
}

#[test]
fn real_swap_file_with_and_without_o_direct() {
    let dir = tempfile::tempdir().unwrap();
    swap_file_round_trip(dir.path(), |p| SwapDevice::file(p, 4 * MB));
    let i = swap_file_round_trip(dir.path(), |p| {
        SwapDevice::file(p, 4 * MB).buffered_io().sync_io()
    });
    assert!(!i.direct_io && !i.io_uring);
    // A tmpfs where the tester names one (see page_io_tests.rs).
    if let Some(tmpfs) = std::env::var_os("MMKIT_TEST_TMPFS") {
        let shm = tempfile::tempdir_in(tmpfs).unwrap();
        swap_file_round_trip(shm.path(), |p| SwapDevice::file(p, 4 * MB));
        swap_file_round_trip(shm.path(), |p| SwapDevice::file(p, 4 * MB).buffered_io());
    }
}

/// 16 threads swap pages out and back in through the whole set (slots, swap
/// cache, I/O with checksums) on two devices of one priority, in each variant:
/// every page reads back as written, and nothing is left in use afterwards.
#[test]
fn swap_out_and_in_from_16_threads() {
    for (alloc, index) in [
        (SwapAllocPolicy::SharedCursor, SwapCacheIndex::Trunks),
        (SwapAllocPolicy::PerCpuCursor, SwapCacheIndex::Trunks),
        (SwapAllocPolicy::PerCpuCluster, SwapCacheIndex::Table),
    ] {
        let d = Arc::new(SwapDevices::new(
            alloc,
            index,
            SwapFreePolicy::HalfFull,
            SwapReadahead::Off,
            16,
        ));
        d.swapon(SwapDevice::ram(2 * MB).priority(1)).unwrap();
        d.swapon(SwapDevice::ram(2 * MB).priority(1)).unwrap();
        let handles: Vec<_> = (0..16u32)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; PAGE_SIZE];
                    let mut out = 0u64;
                    for round in 0..20u32 {
                        let mut e = Vec::new();
                        let n = get_slots(&d, t as usize, 4, &mut e);
                        out += n as u64;
                        let pfn = |i: usize| t * 1000 + round * 10 + i as u32;
                        for (i, &x) in e.iter().enumerate() {
                            let v = pin(&d, x);
                            v.add_to_swap_cache(x, pfn(i)).unwrap();
                            v.swap_writepage(x, &page((t * 7 + round + i as u32) as u8))
                                .unwrap();
                            v.swap_duplicate(x).unwrap();
                            assert!(v.delete_from_swap_cache(x, pfn(i), 0));
                            assert_eq!(v.swapcache_clear(x), Ok(1));
                        }
                        for (i, &x) in e.iter().enumerate() {
                            let v = pin(&d, x);
                            v.swapcache_prepare(x).unwrap();
                            v.swap_readpage(x, &mut buf).unwrap();
                            assert_eq!(buf, page((t * 7 + round + i as u32) as u8));
                            assert_eq!(v.swapcache_clear(x), Ok(1));
                            assert_eq!(v.swap_free(x), Ok(0));
                        }
                    }
                    out
                })
            })
            .collect();
        let out: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(out, 16 * 20 * 4, "{alloc:?}");
        let info = d.swap_info();
        assert_eq!(info.iter().map(|i| i.used_pages).sum::<u64>(), 0);
        assert_eq!(info.iter().map(|i| i.pswpout).sum::<u64>(), out);
        assert_eq!(info.iter().map(|i| i.pswpin).sum::<u64>(), out);
        assert_eq!(info.iter().map(|i| i.cached_pages).sum::<u64>(), 0);
        // Round robin: both devices took part.
        assert!(info.iter().all(|i| i.pswpout > 0), "{info:?}");
        d.check().unwrap();
    }
}

/// Device-table reads per page swapped (out by reclaim, or in by a fault):
/// a pass that only swaps out (a range 3x the arena written), then passes that
/// read it back (each swap-in makes reclaim swap another page out), with each
/// readahead policy. Printed (`--nocapture`) and bounded.
#[test]
fn device_table_reads_per_swapped_page() {
    use crate::{MapFlags, Mm, VmEvent};
    for ra in [
        SwapReadahead::Off,
        SwapReadahead::Vma,
        SwapReadahead::Cluster,
    ] {
        let mm = Mm::builder()
            .memory(16 * MB as usize)
            .kswapd(false)
            .swap_readahead(ra)
            .build()
            .unwrap();
        mm.swapon(SwapDevice::ram(64 * MB)).unwrap();
        let swapped = |mm: &Mm| {
            let ev = mm.vm_events();
            ev.get(VmEvent::PgStealDirect)
                + ev.get(VmEvent::PgStealKswapd)
                + ev.get(VmEvent::PswpIn)
        };
        let s = mm.new_space().unwrap();
        let pages = 3 * 16 * MB / PAGE_SIZE as u64;
        let a = s
            .mmap((pages * PAGE_SIZE as u64) as usize, MapFlags::empty())
            .unwrap();
        let (r0, p0) = (mm.swap().table_reads(), swapped(&mm));
        for i in 0..pages {
            s.write(a + i * PAGE_SIZE as u64, &i.to_le_bytes()).unwrap();
        }
        let (r1, p1) = (mm.swap().table_reads(), swapped(&mm));
        for i in 0..pages {
            let mut b = [0u8; 8];
            s.read(a + i * PAGE_SIZE as u64, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), i);
        }
        let (r2, p2) = (mm.swap().table_reads(), swapped(&mm));
        let out = (r1 - r0) as f64 / (p1 - p0) as f64;
        let both = (r2 - r1) as f64 / (p2 - p1) as f64;
        println!(
            "{ra:?}: swap-out pass {} reads / {} pages = {out:.2}; read-back pass {} reads / {} pages = {both:.2}",
            r1 - r0,
            p1 - p0,
            r2 - r1,
            p2 - p1
        );
        assert!(p1 > p0 && p2 > p1);
        // A device lookup per batch and per swap-in at most.
        assert!(out <= 1.0 && both <= 1.0, "{ra:?}: {out:.2}, {both:.2}");
    }
}

/// A pinned device stays usable after `swapoff` took it out of the table (its
/// map, cache and backend live while pinned), and says it is off; its entries
/// name no device any more, and the totals follow swapon and swapoff.
#[test]
fn a_pinned_device_outlives_swapoff() {
    let d = devices(SwapAllocPolicy::default(), SwapCacheIndex::default());
    let id = d.swapon(SwapDevice::ram(2 * MB)).unwrap();
    let mut e = Vec::new();
    assert_eq!(get_slots(&d, 0, 1, &mut e), 1);
    let x = e[0];
    let dev = pin(&d, x);
    assert!(dev.is_on() && dev.writeok());
    dev.swap_writepage(x, &page(3)).unwrap();
    dev.add_to_swap_cache(x, 7).unwrap();
    assert_eq!(d.nr_cached(), 1);
    d.check().unwrap();
    assert_eq!(d.nr_free_allocatable(), 511);
    assert_eq!(d.set_allocatable(id, false), Ok(1));
    assert!(!dev.writeok());
    assert_eq!(d.nr_free_allocatable(), 0);
    d.check().unwrap();
    assert!(
        d.should_free_swap(&dev, 0),
        "a device going off frees on swap-in"
    );
    assert!(dev.delete_from_swap_cache(x, 7, 0));
    assert_eq!(dev.swapcache_clear(x), Ok(0));
    d.check().unwrap();
    d.swapoff(id).unwrap();
    assert!(!dev.is_on() && d.get(x).is_none());
    assert_eq!(d.nr_swap_pages(), (0, 0));
    assert_eq!(d.nr_cached(), 0);
    d.check().unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    assert!(matches!(
        dev.swap_readpage(x, &mut buf),
        Err(SwapError::Io(SwapIoError::NotWritten { .. }))
    ));
    let slot = x.offset() as u32;
    assert_eq!(
        dev.swap_free(x),
        Err(SwapError::Map(MapError::NotInUse(slot)))
    );
}

/// Evicted pages leave shadows in their slots; freeing the slots (the
/// mapping dropped) clears them, so a later owner of a slot reads none.
#[test]
fn freed_slot_keeps_no_shadow() {
    for kind in [SwapCacheIndex::Trunks, SwapCacheIndex::Table] {
        let mm = crate::Mm::builder()
            .memory(8 << 20)
            .fault_around(1)
            .kswapd(false)
            .swap_cache(kind)
            .build()
            .unwrap();
        mm.swapon(crate::SwapDevice::ram(8 << 20)).unwrap();
        let s = mm.new_space().unwrap();
        let n = 256u64;
        let a = s
            .mmap((n * 4096) as usize, crate::MapFlags::empty())
            .unwrap();
        for i in 0..n {
            s.write(a + i * 4096, &[i as u8 | 1]).unwrap();
        }
        assert_eq!(mm.reclaim(64), 64);
        let dev = mm.swap().get(SwapEntry::new(0, 0).unwrap()).unwrap();
        let nr = dev.map.nr_slots();
        let shadows = || {
            (0..nr)
                .filter(|&x| dev.cache.swap_shadow(x).is_some())
                .count()
        };
        assert_eq!(shadows(), 64, "{kind:?}");
        // Half of them back (a page replaces its shadow), the other half
        // dropped with the mapping, shadows still in their slots.
        let gone: Vec<u64> = (0..n)
            .filter(|&i| s.translate(a + i * 4096).is_none())
            .collect();
        assert_eq!(gone.len(), 64);
        for &i in gone.iter().step_by(2) {
            let mut b = [0u8];
            s.read(a + i * 4096, &mut b).unwrap();
            assert_eq!(b[0], i as u8 | 1);
        }
        assert_eq!(shadows(), 32, "{kind:?}");
        s.munmap(a, (n * 4096) as usize).unwrap();
        mm.wait_reclaim_idle();
        assert_eq!(dev.map.inuse(), 0);
        assert_eq!(shadows(), 0, "{kind:?}: a freed slot kept its shadow");
        if let Some(left) = dev.cache.nr_trunk_entries() {
            assert_eq!(left, 0, "trunk entries left");
        }
        drop(dev);
        drop(s);
        mm.check().unwrap();
    }
}
