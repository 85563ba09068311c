//! Page migration (Linux's `mm/migrate.c` for anonymous order-0 pages): moves the
//! contents of a mapped page to another frame and remaps it, reached from the
//! page through the reverse map (`rmap.rs`). Its users: compaction
//! (`compaction.rs`), NUMA balancing's hint faults (`space/task_numa.rs`)
//! and `mbind`'s `MOVE` (`space/mempolicy.rs`).
//!
//! # The migration-entry protocol (the one place it is described)
//!
//! For one page `src`, mapped at `vaddr` in some space, moving to `dst` (a free
//! page the caller isolated, `Alloc` with refcount 1):
//! 1. `src` must be mapped (its reverse map set); then `Mm::trylock_page(src)`:
//!    held means an access (`read`, `write`, `with_page`) is using its bytes
//!    right now, and the migration fails (counted as pinned) instead of waiting.
//! 2. `rmap_walk` reaches the mapping: the space from the Mm's registry, its VMA
//!    lock shared with `try_read` (migration never waits for an address space).
//!    The PTE of `vaddr` must be a present order-0 leaf mapping `src`
//!    (`page_vma_mapped`), and `src` must hold only the mapping's reference.
//! 3. `try_to_migrate_one` replaces the PTE by a migration entry (compare-and-swap,
//!    so accessed/dirty bits set meanwhile are kept). From now on faults on
//!    `vaddr` wait for it (`wait_migration`, Linux's `migration_entry_wait`),
//!    and an access that walked before re-checks the PTE under the page lock we
//!    hold (`space/mmu.rs`, `still_maps`), so nothing reads or writes `src` after
//!    this point.
//! 4. A full fence, then the reference count again: a pin taken meanwhile
//!    (`get_page`) puts the old entry back and fails the migration (pinned).
//! 5. Copy the 4 KiB, check the count once more, clear `src`'s reverse map (so
//!    that no putback or `lru_add` drain links it again), give `dst` the
//!    reverse map and `src`'s place on the LRU (`Lru::replace`), then store the
//!    present PTE to
//!    `dst` (Release: the copy is visible before it) (Linux's
//!    `remove_migration_ptes`). From that store on `dst` is an ordinary mapped
//!    page that anyone, another migrator included, may take: nothing after it
//!    touches `dst`.
//! 6. Unlock `src`. The caller drops the mapping's
//!    reference of `src` (`PageAlloc::put_sources`), which frees it into the buddy
//!    lists.
//!
//! Invariants: between 3 and 5 only the migrator touches the entry (unmap needs the
//! exclusive VMA lock, NUMA hinting CASes only present entries); every failure path
//! after 3 stores back exactly the entry it replaced, and `src` keeps its data and
//! reverse map. Huge pages and sub-pages of split huge pages are not migrated.
//!
//! Locking: page lock (try) -> registry mutex (leaf) -> VMA lock (shared, try),
//! as the page side of the lock order in `rmap.rs`. No zone lock, no allocation,
//! no wait while a migration entry is installed but for the LRU locks of `src`
//! and `dst` (leaves, held for a list update).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::pgtable::{desc, Pte};
use crate::rmap::RmapWalkControl;
use crate::rmap::{self, page_vma_mapped, rmap_walk, try_to_migrate_one, PageGuard, RmapOne};
use crate::{Mm, Pfn, PAGE_SIZE};

/// Why a page was not migrated.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum MigrateError {
    /// The PTE no longer maps the page as a present order-0 leaf (unmapped,
    /// remapped, a NUMA hint, a huge or split huge page): nothing was done.
    Changed,
    /// An extra reference pins the page, or an access holds its page lock: the
    /// page stays where it is.
    Pinned,
}

/// Migrates the mapped page `src` to the isolated free page `dst`, reaching its
/// mapping through `rwc`. On success `dst` is mapped in its place and `src` has
/// no reverse map; the caller drops `src`'s mapping reference. On failure nothing
/// changed and `dst` is still the caller's.
pub(crate) fn migrate_page(
    mm: &Mm,
    rwc: &mut RmapWalkControl,
    src: Pfn,
    dst: Pfn,
) -> Result<(), MigrateError> {
    migrate_page_hooked(mm, rwc, src, dst, |_| {})
}

/// [`migrate_page`], calling `published(dst)` the moment the PTE maps `dst`
/// (where another migrator, finding `dst` by its reverse map, may take it).
fn migrate_page_hooked(
    mm: &Mm,
    rwc: &mut RmapWalkControl,
    src: Pfn,
    dst: Pfn,
    published: impl FnOnce(Pfn),
) -> Result<(), MigrateError> {
    // 1. Mapped, then the page lock.
    if !rmap::page_mapped(mm, src) {
        return Err(MigrateError::Changed);
    }
    let Some(page) = mm.trylock_page(src) else {
        return Err(MigrateError::Pinned);
    };
    // 2. The mapping.
    rmap_walk(mm, &page, rwc, |m| {
        migrate_one(mm, m, &page, dst, published)
    })
    .unwrap_or(Err(MigrateError::Changed))
}

/// Steps 2 to 6 on the mapping `m` of the locked page.
fn migrate_one(
    mm: &Mm,
    m: &RmapOne<'_>,
    page: &PageGuard<'_>,
    dst: Pfn,
    published: impl FnOnce(Pfn),
) -> Result<(), MigrateError> {
    let src = page.pfn();
    if !page_vma_mapped(m, src).is_some_and(|(_, e)| e.is_present()) {
        return Err(MigrateError::Changed);
    }
    let d = desc(mm, src);
    if d.refcount().load(Ordering::Acquire) != 1 {
        return Err(MigrateError::Pinned);
    }
    // A page kept in the swap cache leaves it (its slot is freed): the copy
    // is mapped without one, dirty for swap.
    mm.swapcache_drop_page(page);
    // 3. The migration entry.
    let Some((slot, cur)) = try_to_migrate_one(m, page, Pte::mk_migration) else {
        return Err(MigrateError::Changed);
    };
    let mig = cur.mk_migration();
    // 4. A pin taken before the entry went in is seen here (SeqCst on both sides
    // of the race: pinners increment, then look at the PTE).
    fence(Ordering::SeqCst);
    if d.refcount().load(Ordering::SeqCst) != 1 {
        slot.store(cur.raw(), Ordering::Release);
        return Err(MigrateError::Pinned);
    }
    // 5. Copy.
    // SAFETY: `src` is a mapped page of this Mm whose only other user could be an
    // accessor holding its page lock, which we hold; its PTE is our migration entry,
    // so no new access reaches it. `dst` is an isolated free page the caller owns.
    // Both are 4096 bytes inside the arena and distinct frames.
    unsafe { std::ptr::copy_nonoverlapping(mm.page_address(src), mm.page_address(dst), PAGE_SIZE) };
    fence(Ordering::SeqCst);
    if d.refcount().load(Ordering::SeqCst) != 1 {
        slot.store(cur.raw(), Ordering::Release);
        return Err(MigrateError::Pinned);
    }
    // The page flags of the layers above (dirty, ...) travel with the data.
    for bit in [mmkit_core::page::PG_DIRTY] {
        if d.test_flag(bit) {
            desc(mm, dst).set_flag(bit);
        }
    }
    rmap::set(mm, dst, m.space.id(), m.vaddr);
    // The charge moves with the data (Linux's `mem_cgroup_migrate`): the
    // group's counter is unchanged. `src` keeps its owner (which names its
    // group's LRU) until `replace` has taken it off.
    let owner = mm.memcg().owner(src.get());
    if owner != 0 {
        mm.memcg().set_owner(dst.get(), owner);
    }
    // `dst` takes `src`'s place on the LRU (`lru.rs`) before its PTE is
    // visible, as Linux adds the new folio to the LRU before
    // `remove_migration_ptes`. From the store on, another migrator may find
    // `dst` (compaction's scanner by its reverse map, a NUMA hint fault by its
    // PTE), move it on and free it while this one still runs: linked after
    // the store, the freed frame would go on a list, a free page on the LRU
    // whose entry counts whatever order the buddy gives it next (the list's
    // page count drifts once the frame comes back as an order-0 page and is
    // taken off). Linked before, that migrator's `replace` takes it off.
    //
    // 6. `src` has no user left: its reverse map goes before it leaves the
    // LRU, so that nothing links it again. A reclaimer that isolated it after
    // the last reference check puts it back, and an `lru_add` entry still
    // queued for it drains, both under the lock `replace` takes, and both
    // link only a page that is still mapped (`linkable`): with the reverse
    // map still set, `src` went back on a list after `replace` and was freed
    // there. Page-side walkers take the page lock we hold, so none sees the
    // gap.
    rmap::clear(mm, src);
    mm.lru().replace(mm, src, dst);
    mm.memcg().take_owner(src.get());
    slot.store(mig.migration_done(dst).raw(), Ordering::Release);
    published(dst);
    Ok(())
}

/// Waits until `slot` no longer holds the migration entry `e` (Linux's
/// `migration_entry_wait`). The migrator holds no lock anyone else waits for and
/// never blocks while its entry is installed, so this is about one page copy long.
pub(crate) fn wait_migration(slot: &AtomicU64, e: Pte) {
    let mut spins = 0u32;
    while slot.load(Ordering::Acquire) == e.raw() {
        if spins < 128 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        spins += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::{Gfp, MapFlags};
    use mmkit_core::page::PG_LRU;

    /// The moment a migrated page's PTE maps it, another migrator may find it
    /// (compaction's scanner, by its reverse map), move it on and free it,
    /// while the first one still holds the old page's lock. The first one
    /// must not then link the freed frame: the LRU would hold a free page,
    /// counted with whatever order the buddy gives it next.
    #[test]
    fn page_migrated_again_at_once_is_not_linked_when_freed() {
        let mm = crate::space::tests::mm();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        {
            let s = mm.new_space().unwrap();
            let a = s.mmap(PAGE_SIZE, MapFlags::empty()).unwrap();
            s.write(a, &[7; 64]).unwrap();
            mm.lru().drain_all(&mm);
            let src = s.translate(a).unwrap().pfn;
            assert!(desc(&mm, src).test_flag(PG_LRU));
            let dst = mm.alloc_owned_pages(Gfp::MOVABLE, 0).unwrap();
            let dst2 = mm.alloc_owned_pages(Gfp::MOVABLE, 0).unwrap();
            let mut rwc = RmapWalkControl::default();
            migrate_page_hooked(&mm, &mut rwc, src, dst, |p| {
                assert_eq!(p, dst);
                let mut rwc2 = RmapWalkControl::default();
                migrate_page(&mm, &mut rwc2, dst, dst2).expect("the second migration");
                drop(rwc2);
                assert!(mm.unpin_page(dst), "dst was freed");
            })
            .unwrap();
            drop(rwc);
            assert!(mm.unpin_page(src), "src was freed");
            assert_eq!(s.translate(a).unwrap().pfn, dst2);
            let mut buf = [0u8; 64];
            s.read(a, &mut buf).unwrap();
            assert_eq!(buf, [7; 64]);
            assert!(desc(&mm, dst2).test_flag(PG_LRU), "dst2 is on the LRU");
            mm.check().unwrap();
        }
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
        mm.check().unwrap();
    }

    /// Through the page lock on the Mm and the reverse-map walk: a page whose
    /// lock an accessor holds (`with_page` in another thread) or that a pin holds
    /// is not migrated; free of both, it is, and keeps its bytes.
    #[test]
    fn pages_in_use_are_not_migrated() {
        let mm = crate::space::tests::mm();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        {
            let s = mm.new_space().unwrap();
            let a = s.mmap(2 * PAGE_SIZE, MapFlags::empty()).unwrap();
            s.write(a, &[1, 2, 3]).unwrap();
            let src = s.translate(a).unwrap().pfn;
            // An isolated target, as compaction's free scanner hands them out.
            let dst = mm.alloc_owned_pages(Gfp::MOVABLE, 0).unwrap();
            let mut rwc = RmapWalkControl::default();
            let (inside_tx, inside_rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let s_ref = &s;
            std::thread::scope(|sc| {
                sc.spawn(move || {
                    s_ref
                        .with_page(a, true, |p| {
                            inside_tx.send(()).unwrap();
                            done_rx.recv().unwrap();
                            p[3] = 4;
                        })
                        .unwrap()
                });
                inside_rx.recv().unwrap();
                let r = migrate_page(&mm, &mut rwc, src, dst);
                done_tx.send(()).unwrap();
                assert_eq!(r, Err(MigrateError::Pinned), "a page in use moved");
            });
            mm.pin_page(src);
            let r = migrate_page(&mm, &mut rwc, src, dst);
            mm.unpin_page(src);
            assert_eq!(r, Err(MigrateError::Pinned), "a pinned page moved");
            assert_eq!(s.translate(a).unwrap().pfn, src);
            migrate_page(&mm, &mut rwc, src, dst).unwrap();
            drop(rwc);
            assert_eq!(s.translate(a).unwrap().pfn, dst);
            assert_eq!(mm.rmap_lookup(src), None);
            assert!(mm.unpin_page(src), "the mapping's reference was the last");
            let mut buf = [0u8; 4];
            s.read(a, &mut buf).unwrap();
            assert_eq!(buf, [1, 2, 3, 4]);
        }
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
        mm.check().unwrap();
    }
}
