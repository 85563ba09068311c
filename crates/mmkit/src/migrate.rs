//! Page migration (Linux's `mm/migrate.c` for anonymous order-0 pages): moves the
//! contents of a mapped page to another frame and remaps it, found through the
//! reverse map (`rmap.rs`). Compaction (`compaction.rs`) is its user.
//!
//! Protocol for one page `src` mapped at `vaddr` in a space, moving to `dst` (a free
//! page the caller isolated, `Alloc` with refcount 1):
//! 1. Under the space's VMA lock (shared, taken with `try_read`: migration never
//!    waits for an address space), the PTE of `vaddr` must be a present order-0
//!    leaf mapping `src`, and `src` must hold only the mapping's reference.
//! 2. `try_lock` the page lock of `src`: held means an access (`read`, `write`,
//!    `with_page`) is using its bytes right now, and the migration fails (counted
//!    as pinned) instead of waiting.
//! 3. Replace the PTE by a migration entry (compare-and-swap, so accessed/dirty
//!    bits set meanwhile are kept). From now on faults on `vaddr` wait, and an
//!    access that walked before re-checks the PTE under the page lock we hold, so
//!    nothing reads or writes `src` after this point.
//! 4. A full fence, then the reference count again: a pin taken meanwhile
//!    (`get_page`) puts the old entry back and fails the migration (pinned).
//! 5. Copy the 4 KiB, check the count once more, give `dst` the reverse map and
//!    store the present PTE to `dst` (Release: the copy is visible before it).
//! 6. Clear `src`'s reverse map. The caller drops the mapping's reference of
//!    `src` (`PageAlloc::put_sources`), which frees it into the buddy lists.
//!
//! Invariants: between 3 and 5 only the migrator touches the entry (unmap needs the
//! exclusive VMA lock, NUMA hinting CASes only present entries); every failure path
//! after 3 stores back exactly the entry it replaced, and `src` keeps its data and
//! reverse map. Huge pages and sub-pages of split huge pages are not migrated.
//!
//! Locking: VMA lock (shared) -> page lock (try) -> nothing else. No zone lock, no
//! allocation, no wait while a migration entry is installed.

use std::sync::atomic::{fence, Ordering};

use crate::pgtable::desc;
use crate::space::{SpaceInner, VmaTree};
use crate::{rmap, Pfn, PAGE_SIZE};

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

/// Migrates `src`, mapped at `vaddr` by `space` (whose VMA lock `held` is held
/// shared), to the isolated free page `dst`. On success `dst` is mapped in its
/// place and `src` has no reverse map; the caller drops `src`'s mapping reference.
/// On failure nothing changed and `dst` is still the caller's.
pub(crate) fn migrate_page(
    space: &SpaceInner,
    held: &VmaTree,
    vaddr: u64,
    src: Pfn,
    dst: Pfn,
) -> Result<(), MigrateError> {
    let mm = space.mm();
    let Some((slot, e, level)) = space.follow_pte(held, vaddr) else {
        return Err(MigrateError::Changed);
    };
    let maps_src =
        |e: crate::Pte| e.is_present() && !e.is_huge() && !e.is_compound() && e.pfn() == src;
    if level != 0 || !maps_src(e) {
        return Err(MigrateError::Changed);
    }
    let d = desc(mm, src);
    if d.refcount().load(Ordering::Acquire) != 1 {
        return Err(MigrateError::Pinned);
    }
    let Some(lock) = space.page_try_lock(src) else {
        return Err(MigrateError::Pinned);
    };
    // 3. The migration entry.
    let mut cur = e;
    loop {
        match slot.compare_exchange(
            cur.raw(),
            cur.mk_migration().raw(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(now) => {
                let now = crate::Pte::from_raw(now);
                if !maps_src(now) {
                    return Err(MigrateError::Changed);
                }
                cur = now; // only the accessed/dirty bits changed
            }
        }
    }
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
    rmap::set(mm, dst, space.id(), vaddr);
    slot.store(mig.migration_done(dst).raw(), Ordering::Release);
    rmap::clear(mm, src);
    drop(lock);
    Ok(())
}
