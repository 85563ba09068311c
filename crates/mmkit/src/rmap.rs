//! From a page to its owner (Linux's `mm/rmap.c` for anonymous pages, reduced to
//! one mapping per page since an address space has no fork), the page lock, and
//! the lock order of mmkit and mmkit-core with the letters that annotate what
//! each lock guards.
//!
//! # The reverse map
//!
//! A mapped page's descriptor `mapping` word holds `space_id << 35 | virtual page
//! number` (35 bits of vpn cover `0..2^47`); 0 means "not mapped" (space ids start
//! at 1, see `registry.rs`). Which descriptor holds it:
//! - an order-0 page: its own;
//! - an order-9 page mapped by a huge PMD: the head only (interior `mapping`s are
//!   0); a lookup of an interior pfn adds its offset to the head's address;
//! - an order-9 page whose PMD was split into 512 PTEs: every sub-page its own,
//!   and the first tail page's `Page::nr_pages_mapped` counts the sub-pages still
//!   mapped (non-zero exactly while the page is split and mapped; Linux keeps such
//!   counts in the first tail page too).
//!
//! Page-side code (compaction's and NUMA balancing's migration, reclaim)
//! reaches a page's mapping in one way only: lock the page (`Mm::lock_page` /
//! `Mm::trylock_page`), then `rmap_walk`, which resolves the space through its
//! Mm's registry, takes its VMA lock shared without waiting and calls back with
//! the space, the lock witness and the address. `page_vma_mapped`,
//! `try_to_unmap_one` and `folio_referenced_one` work on that mapping.
//!
//! Invariants: `mapping` is set before the PTE that maps the page is installed and
//! cleared after it is cleared, before the page is freed; a page the allocator hands
//! out to anyone else therefore has `mapping == 0` (table pages clear it anyway).
//!
//! # The page lock
//!
//! A striped table of mutexes on the Mm, indexed by pfn: one stripe per frame up
//! to `MAX_PAGE_LOCK_STRIPES` (a power of two; frames less than that many pages
//! apart never share one, so reclaimers holding a batch of 32 locks each rarely
//! make each other's `trylock_page` fail on a shared stripe). It makes the
//! bytes of a mapped page exclusive to one accessor (`read`/`write` while they
//! copy, `with_page` while its closure runs), and it is what page-side code holds
//! while it changes the page's PTE: an access re-checks the PTE under the lock
//! (`space/mmu.rs`), so a page is never read or written after a migration started
//! copying it (`migrate.rs`).
//!
//! # Lock order (the one place it is written down)
//!
//! Every lock of mmkit and mmkit-core, outermost first, in the manner of
//! Linux's "Lock ordering in mm" (`mm/rmap.c`): a lock may be taken while
//! holding the locks above it on its branch, never the other way round. Each
//! line says where the lock lives and who takes it; the letter is the one the
//! struct comments use (legend below).
//!
//! ```text
//! swapon_mutex                  swapfile/: swapon, swapoff (serialises them)
//!   device table, write (T)     swapfile/: swapon, swapoff (set_allocatable
//!                               takes it holding nothing)
//! NUMA kthread handle           space/task_numa.rs: set_numa_balancing
//!   Kthread control mutex (K)   kthread.rs: start, wake, park, stop (see the
//!                               leaves below: also taken alone)
//!
//! address side (from an address: faults, accesses, mmap/munmap, mbind, the
//! NUMA scan, swapoff's unuse)
//! VMA lock (V)                  space/mod.rs: shared for faults, accesses,
//!                               the NUMA scan, mbind's scan, unuse; exclusive
//!                               for mmap, munmap, mbind's VMA split
//!   page lock (P)               rmap.rs: blocking, at most one at a time: an
//!                               access's copy, with_page, do_swap_page,
//!                               read_swap_cache's new page, unuse,
//!                               try_to_reclaim_swap (zap), the hint fault's
//!                               last_cpupid (task_numa.rs)
//!   [with or without that page lock: the page side's locks from the
//!    device table on, as below (zap's swap_free, lru_cache_add, swap-in)]
//!   policy table                space/mempolicy.rs: a fault's policy lookup,
//!                               mbind/set_mempolicy (leaf)
//!   NUMA scan state (N)         space/task_numa.rs: the hint fault's and the
//!                               pass's bookkeeping, never across a walk, an
//!                               allocation or a migration (leaf)
//!   [direct compaction and reclaim: the page side, try-locks only]
//!
//! page side (from a pfn: migration, compaction, reclaim, NUMA migration)
//! page lock (P)                 try_lock (compaction, reclaim: a batch of
//!                               pages, or the 512 of a huge page it splits),
//!                               or blocking while holding nothing else
//!   registry mutex              registry.rs: resolve an id (leaf)
//!   VMA lock (V), try_read only rmap_walk
//!     PTE                       compare-and-swap, no lock
//!   device table, read (T)      swapfile/: SwapDevices::get (pin a
//!                               device), get_swap_pages, statistics
//!     per-CPU swap cursor       swap_cluster/, PerCpuCluster only: slot
//!                               allocation, drain_percpu
//!       cluster lock (S)
//!         device lock (D)       a cluster used up goes back on a list
//!     device lock (D)           swap_cluster/: list moves; with the two
//!                               cursor policies every allocation
//!       cluster lock (S)        PerCpuCluster: try_lock only (isolate_cluster);
//!                               cursor policies: blocking
//!   cluster lock (S)            swap_duplicate, swapcache_prepare/clear,
//!                               swap_free; the Table swap cache's inserts
//!                               and deletes (swap_state.rs)
//!     device lock (D)           PerCpuCluster: a free that moves the cluster
//!   swap-cache trunk lock       swap_state.rs, Trunks index (leaf)
//!   io_uring ring mutex         page_io/: one submission and its
//!                               completions (leaf)
//!   NBD send lock (link)        nbd/conn.rs: a request's send, the reader's
//!                               reconnect
//!     NBD request slot state    nbd/conn.rs, nbd/reader.rs (also alone)
//!   NBD free list, shut_fd      nbd/conn.rs (leaves)
//!   NBD trim gate               nbd/trim.rs: parks a write behind a trim in
//!                               flight (leaf; the trimmer sends unlocked)
//!   lru_add batch mutex         lru.rs: per CPU; remote only in drain_all
//!     memcg table, read         memcontrol/: an owner id to its group's
//!                               lruvec, released before the shard lock
//!     LRU shard lock (L)        lru.rs: one shard at a time, of the root's
//!                               or a memory cgroup's lruvec
//!   readahead queue             swap_state.rs (leaf: no page lock under it)
//!
//! memory cgroups (from a charge: the fault path under the VMA lock and
//! page lock of a swap-in; from reclaim; from a slot's free under the
//! cluster lock)
//! [memcg charge stock: lock-free (memcontrol/stock.rs): one atomic per
//!  consume or refill; an evicted or drained slot's group is found through
//!  the table's pointers, and a group's free waits for such takers first]
//! memcg table, read/write       memcontrol/: id -> group (read); create,
//!                               free a group (write; the free drains its
//!                               stock slots and waits for takers first)
//!                               (leaf)
//! memcg pressure state          memcontrol/stat.rs: a stall's start and end,
//!                               a read (leaf)
//! [limit, high and proactive reclaim run in the charging thread with none
//!  of these held: the page side, try-locks only, as direct reclaim]
//!
//! leaves taken under any of the above
//! Kthread control mutex (K)     kthread.rs: wake-ups from the slow path
//!                               (kswapd, kcompactd) and the NUMA scanner
//! allocator (mmkit-core)        cache fence lock (pcp_cache.rs, remote sides
//!                               of the per-CPU caches); per-CPU list lock
//!                               (pcp.rs, try_lock by its owner) -> zone
//!                               lock (Z) (zone.rs); nothing of mmkit under
//!                               them: the slow path calls its hooks (direct
//!                               reclaim and compaction, try-locks only) with
//!                               none of them held
//! ```
//!
//! **The cluster and device locks flip between swap allocation policies**
//! (`swap_cluster/`). `PerCpuCluster` (Linux 6.15): per-CPU cursor ->
//! cluster lock -> device lock; allocation and frees take a cluster lock
//! first and the device lock under it only to move the cluster between lists,
//! and the one path that holds the device lock and wants a cluster
//! (`isolate_cluster`) only `try_lock`s it. `SharedCursor` and `PerCpuCursor`
//! (Linux 5.8): device lock -> cluster lock, blocking; allocation runs under
//! the device lock, a reference that does not free its slot is dropped under
//! the cluster lock alone, and a free that does takes the device lock first.
//! A device has one policy for its life, so the two orders never meet on one
//! device, and no path holds the locks of two devices.
//!
//! The two sides take the VMA lock and the page lock in opposite orders; what
//! keeps that deadlock-free is that the page side never *waits* for a VMA lock
//! (an accessor may hold it shared while it waits for this very page lock, and a
//! queued writer would block a new reader), and the address side never takes a
//! page lock while it waits for anything else. `with_page` holds a page lock
//! without the VMA lock while its closure runs, so its closure may not call into
//! any address space (refused with `Error::Fault`). Direct compaction and
//! direct reclaim may run inside a fault, under that fault's shared VMA lock:
//! they only ever try-lock pages and VMA locks, so they cannot deadlock against
//! that fault or an `munmap` queued behind it. A space that a walk resolved is
//! dropped only with the `RmapWalkControl`, after every page lock is released
//! (its drop unmaps the whole space).
//!
//! # Locking letters
//!
//! The struct comments say who writes each field, after FreeBSD's
//! `vm_page.h`; a field read without its lock is a snapshot. This is the one
//! legend; mmkit-core's `Page` and every annotated struct refer to it.
//!
//! - (A) atomic: written with atomic operations under no lock.
//! - (C) compare-and-swap by whoever makes the transition (the freeing or
//!   the allocating CPU, a fault installing an entry), under no lock.
//! - (O) the owner of an allocated block: whoever `alloc_pages` handed it to
//!   (for a mapped data page or a page-table page, the address space that
//!   faulted it in, under its VMA lock); the allocator writes these words
//!   only when it hands the block out or takes it back.
//! - (V) the space's VMA lock, held exclusive (or shared, for a CAS from 0).
//! - (P) the page lock of the frame.
//! - (Z) the zone lock.
//! - (Q) the per-CPU page list lock (`PcpLock`).
//! - (L) the LRU lock of the frame's shard.
//! - (S) the swap cluster lock of the slot.
//! - (D) the swap device lock (`si_lock`).
//! - (T) the swap device table, held for writing.
//! - (N) the space's NUMA scan state mutex.
//! - (K) a kthread's control mutex.

use std::sync::atomic::{AtomicU64, Ordering};

use mmkit_core::PageState;

use crate::pgtable::{desc, Pte, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PTE_ACCESSED};
use crate::registry::SpaceRegistry;
use crate::space::{Space, SpaceInner, VmaTree};
use crate::{Mm, Pfn, PAGE_SIZE};

/// Most stripes of the page-lock table (64 bytes each: 2 MiB at most).
pub(crate) const MAX_PAGE_LOCK_STRIPES: usize = 1 << 15;

const VPN_BITS: u32 = 35;
const VPN_MASK: u64 = (1 << VPN_BITS) - 1;
/// Largest space id that fits the encoding.
pub(crate) const MAX_SPACE_ID: u64 = (1 << (64 - VPN_BITS)) - 1;

/// The `mapping` word for page `vaddr` of space `space_id`.
#[inline]
pub(crate) const fn encode(space_id: u64, vaddr: u64) -> u64 {
    (space_id << VPN_BITS) | ((vaddr >> 12) & VPN_MASK)
}

/// `(space_id, vaddr)` of a `mapping` word, or `None` for 0.
#[inline]
pub(crate) const fn decode(m: u64) -> Option<(u64, u64)> {
    if m == 0 {
        return None;
    }
    Some((m >> VPN_BITS, (m & VPN_MASK) << 12))
}

/// Records that `pfn` is mapped at `vaddr` in space `space_id`.
#[inline]
pub(crate) fn set(mm: &Mm, pfn: Pfn, space_id: u64, vaddr: u64) {
    desc(mm, pfn)
        .mapping
        .store(encode(space_id, vaddr), Ordering::Release);
}

/// Records that `pfn` is no longer mapped.
#[inline]
pub(crate) fn clear(mm: &Mm, pfn: Pfn) {
    desc(mm, pfn).mapping.store(0, Ordering::Release);
}

/// Linux's `folio_mapped` for a page with its own reverse map (an order-0
/// page, the head of a huge page, a sub-page of a split one): is it mapped by
/// some space? A racy snapshot; the walk checks again under the locks.
pub(crate) fn page_mapped(mm: &Mm, pfn: Pfn) -> bool {
    desc(mm, pfn).mapping.load(Ordering::Acquire) != 0
}

impl Mm {
    /// Where the frame `pfn` is mapped: `(space_id, vaddr)` of the 4 KiB page,
    /// or `None` when no address space maps it (free, a table page, allocated
    /// directly with `alloc_pages`, or outside the arena). For a sub-page of a huge
    /// page it is the sub-page's own address.
    pub fn rmap_lookup(&self, pfn: Pfn) -> Option<(u64, u64)> {
        let d = self.page_alloc().page(pfn)?;
        if let Some(r) = decode(d.mapping.load(Ordering::Acquire)) {
            return Some(r);
        }
        // An interior page of a huge page mapped by one PMD.
        let head = Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1));
        if head == pfn {
            return None;
        }
        let h = desc(self, head);
        if h.state() != PageState::Alloc || h.order() != HPAGE_PMD_ORDER {
            return None;
        }
        // Split: every mapped sub-page has its own word, and this one had none.
        if desc(self, Pfn::new(head.get() + 1))
            .nr_pages_mapped()
            .load(Ordering::Acquire)
            != 0
        {
            return None;
        }
        let (id, va) = decode(h.mapping.load(Ordering::Acquire))?;
        Some((id, va + (pfn.get() - head.get()) * PAGE_SIZE as u64))
    }
}

impl Mm {
    /// The spaces of this Mm, by id.
    pub(crate) fn spaces(&self) -> &SpaceRegistry {
        &self.inner.spaces
    }
}

// ---------------------------------------------------------------------------------
// The page lock
// ---------------------------------------------------------------------------------

/// One stripe on a cache line of its own (two CPUs locking neighbouring frames
/// do not share a line).
#[repr(align(64))]
struct Stripe(parking_lot::Mutex<()>);

/// The page locks of one Mm: a striped mutex table indexed by pfn.
pub(crate) struct PageLocks {
    stripes: Box<[Stripe]>,
    mask: usize,
}

impl PageLocks {
    /// A table for an arena of `nr_pages` frames: a stripe per frame, rounded up
    /// to a power of two, at most `MAX_PAGE_LOCK_STRIPES`.
    pub(crate) fn new(nr_pages: u64) -> PageLocks {
        let n = (nr_pages.max(1) as usize)
            .next_power_of_two()
            .min(MAX_PAGE_LOCK_STRIPES);
        PageLocks {
            stripes: (0..n)
                .map(|_| Stripe(parking_lot::Mutex::new(())))
                .collect(),
            mask: n - 1,
        }
    }

    #[inline]
    fn stripe(&self, pfn: Pfn) -> &parking_lot::Mutex<()> {
        &self.stripes[pfn.get() as usize & self.mask].0
    }
}

/// A held page lock (Linux's locked folio), released when dropped. Page-side
/// functions take it as proof that the page is locked.
///
/// Its page's bytes ([`PageGuard::bytes`], [`PageGuard::bytes_mut`]) may be
/// borrowed while the holder keeps the page allocated by a reference of its
/// own: a page it allocated and has not published, an isolated page (reclaim),
/// a pinned one (`with_page`). A guard on a pfn taken from a snapshot (a swap
/// cache lookup) must not borrow them: that page may be freed meanwhile.
pub(crate) struct PageGuard<'a> {
    pfn: Pfn,
    mm: &'a Mm,
    _lock: parking_lot::MutexGuard<'a, ()>,
}

impl PageGuard<'_> {
    /// The locked frame.
    pub(crate) fn pfn(&self) -> Pfn {
        self.pfn
    }

    /// The 4096 bytes of the locked page, to read (see the type's rule).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the frame is a page inside the arena (`page_address` is null
        // only for a pfn outside it, which no allocated page has). The holder
        // keeps it allocated (the type's rule), so nothing frees or reuses it
        // while the borrow lives; every reader and writer of an owned page's
        // bytes (accesses, `with_page`, migration's copy, swap I/O) holds its
        // page lock, which this guard holds, so no one writes it meanwhile.
        unsafe { std::slice::from_raw_parts(self.mm.page_address(self.pfn), PAGE_SIZE) }
    }

    /// The 4096 bytes of the locked page, to write (see the type's rule).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; and the borrow of `self` is unique, so this
        // is the only reference to the bytes made through the page lock.
        unsafe { std::slice::from_raw_parts_mut(self.mm.page_address(self.pfn), PAGE_SIZE) }
    }
}

impl Mm {
    /// Linux's `lock_page`: waits for the page lock of frame `pfn`. See the lock
    /// order above: never while waiting for, or wanting, anything else.
    pub(crate) fn lock_page(&self, pfn: Pfn) -> PageGuard<'_> {
        PageGuard {
            pfn,
            mm: self,
            _lock: self.inner.page_locks.stripe(pfn).lock(),
        }
    }

    /// Linux's `trylock_page`: the page lock of frame `pfn` if it is free (an
    /// access in progress makes a migration of the page fail rather than wait).
    pub(crate) fn trylock_page(&self, pfn: Pfn) -> Option<PageGuard<'_>> {
        let lock = self.inner.page_locks.stripe(pfn).try_lock()?;
        Some(PageGuard {
            pfn,
            mm: self,
            _lock: lock,
        })
    }
}

// ---------------------------------------------------------------------------------
// The walk
// ---------------------------------------------------------------------------------

/// Linux's `rmap_walk_control`, reduced to what a walk of one mapping per page
/// needs: the last space resolved, kept while consecutive pages belong to it
/// (they mostly do). Holding it keeps the spaces it resolved alive: drop it when
/// the batch of pages is done, with no lock held.
#[derive(Default)]
pub(crate) struct RmapWalkControl {
    cur: Option<(u64, Option<Space>)>,
    /// Spaces resolved before `cur`, dropped with the control: the walk runs
    /// under a page lock, and dropping the last reference to a space unmaps all
    /// of it, which is not work to do under a page lock.
    retired: Vec<Space>,
}

impl RmapWalkControl {
    fn space(&mut self, mm: &Mm, id: u64) -> Option<&Space> {
        if !matches!(self.cur, Some((cid, _)) if cid == id) {
            if let Some((_, Some(old))) = self.cur.take() {
                self.retired.push(old);
            }
            self.cur = Some((id, mm.spaces().get(id)));
        }
        self.cur.as_ref().and_then(|(_, s)| s.as_ref())
    }
}

/// One mapping of a page, as the walk hands it to its callback (the arguments of
/// Linux's `rmap_one`): the space, the witness of its shared VMA lock, and the
/// virtual page the reverse map recorded.
pub(crate) struct RmapOne<'a> {
    pub(crate) space: &'a SpaceInner,
    pub(crate) held: &'a VmaTree,
    pub(crate) vaddr: u64,
}

/// Linux's `rmap_walk` for an anonymous page: calls `rmap_one` on the mapping of
/// the locked `page` (its own `mapping` word: an order-0 page, the head of a huge
/// page, or a sub-page of a split one) under the space's shared VMA lock. `None`
/// when the page is not mapped, its space is gone, or the VMA lock is held
/// exclusively right now (an `mmap`/`munmap` in progress): page-side code never
/// waits for it (see the lock order).
pub(crate) fn rmap_walk<R>(
    mm: &Mm,
    page: &PageGuard<'_>,
    rwc: &mut RmapWalkControl,
    rmap_one: impl FnOnce(&RmapOne<'_>) -> R,
) -> Option<R> {
    let (id, vaddr) = decode(desc(mm, page.pfn()).mapping.load(Ordering::Acquire))?;
    let space = rwc.space(mm, id)?.inner();
    let held = space.try_read_lock()?;
    Some(rmap_one(&RmapOne {
        space,
        held: &held,
        vaddr,
    }))
}

/// `rmap_walk` for a huge page (reclaim splitting it): calls `f` under the
/// shared VMA lock (taken without waiting) of the space that maps the locked
/// head `page`, found through the head's reverse map or, its PMD split and its
/// first sub-page unmapped, the first mapped sub-page's. `None` when no
/// sub-page is mapped, the space is gone, or its VMA lock is held exclusively.
pub(crate) fn rmap_walk_huge<R>(
    mm: &Mm,
    page: &PageGuard<'_>,
    rwc: &mut RmapWalkControl,
    f: impl FnOnce(&SpaceInner, &VmaTree) -> R,
) -> Option<R> {
    let head = page.pfn();
    let (id, _) = (0..HPAGE_PMD_NR).find_map(|i| {
        decode(
            desc(mm, Pfn::new(head.get() + i))
                .mapping
                .load(Ordering::Acquire),
        )
    })?;
    let space = rwc.space(mm, id)?.inner();
    let held = space.try_read_lock()?;
    Some(f(space, &held))
}

/// Does `e` map `page` as an order-0 leaf (not huge, not a sub-page of a split
/// huge page), present or NUMA-hinting? A hinting entry still maps its page,
/// as Linux's PROT_NONE entry does: reclaim unmaps it like a present one (a
/// page the scanner marked is not pinned in memory until it is touched).
fn maps_order0(e: Pte, page: Pfn) -> bool {
    e.maps_page() && !e.is_huge() && !e.is_compound() && e.pfn() == page
}

/// `maps_order0`, present only (migration: its entry and the final store stand
/// for a present entry).
fn maps_order0_present(e: Pte, page: Pfn) -> bool {
    e.is_present() && maps_order0(e, page)
}

/// Linux's `page_vma_mapped_walk`, for one order-0 page: the PTE slot at
/// `m.vaddr` and its value, if it maps `page` as an order-0 leaf, present or a
/// NUMA hint. `None` if it does not (unmapped, remapped, a huge or split huge
/// page).
pub(crate) fn page_vma_mapped<'a>(m: &RmapOne<'a>, page: Pfn) -> Option<(&'a AtomicU64, Pte)> {
    match m.space.follow_pte(m.held, m.vaddr)? {
        (slot, e, 0) if maps_order0(e, page) => Some((slot, e)),
        _ => None,
    }
}

/// Linux's `try_to_unmap_one` (reclaim): replaces the order-0 leaf, present or
/// a NUMA hint, that maps the locked `page` at `m.vaddr` by `make(old)` (a swap
/// entry), by CAS: accessed or dirty bits an accessor sets meanwhile (or a
/// hint fault restoring the entry) are kept in the entry `make` sees. Returns
/// the slot and the entry replaced (its bits are the page's last
/// accessed/dirty state); `None`, with nothing done, if the PTE does not map
/// `page` that way. The reverse map and the page's reference are the caller's.
pub(crate) fn try_to_unmap_one<'a>(
    m: &RmapOne<'a>,
    page: &PageGuard<'_>,
    make: impl Fn(Pte) -> Pte,
) -> Option<(&'a AtomicU64, Pte)> {
    replace_leaf(m, page.pfn(), make, maps_order0)
}

/// Linux's `try_to_migrate_one`: `try_to_unmap_one` for a present leaf only
/// (`make` gives the migration entry; a NUMA hint is not migrated here).
pub(crate) fn try_to_migrate_one<'a>(
    m: &RmapOne<'a>,
    page: &PageGuard<'_>,
    make: impl Fn(Pte) -> Pte,
) -> Option<(&'a AtomicU64, Pte)> {
    replace_leaf(m, page.pfn(), make, maps_order0_present)
}

/// The CAS loop of `try_to_unmap_one` and `try_to_migrate_one`: while the leaf
/// at `m.vaddr` maps `page` as `maps` says, replace it by `make` of it.
fn replace_leaf<'a>(
    m: &RmapOne<'a>,
    page: Pfn,
    make: impl Fn(Pte) -> Pte,
    maps: fn(Pte, Pfn) -> bool,
) -> Option<(&'a AtomicU64, Pte)> {
    let (slot, mut cur) = match m.space.follow_pte(m.held, m.vaddr)? {
        (slot, e, 0) if maps(e, page) => (slot, e),
        _ => return None,
    };
    loop {
        match slot.compare_exchange(
            cur.raw(),
            make(cur).raw(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some((slot, cur)),
            Err(now) => {
                let now = Pte::from_raw(now);
                if !maps(now, page) {
                    return None;
                }
                cur = now; // only the accessed/dirty bits (or the hint) changed
            }
        }
    }
}

/// Linux's `folio_referenced_one`: tests and clears the accessed bit of the
/// entry that maps `page` at `m.vaddr` (a present order-0 leaf, or the huge PMD
/// of a huge page whose head is `page`). True if it was set. For LRU aging.
pub(crate) fn folio_referenced_one(m: &RmapOne<'_>, page: Pfn) -> bool {
    let Some((slot, e, level)) = m.space.follow_pte(m.held, m.vaddr) else {
        return false;
    };
    // A PTE maps `page` itself; a huge PMD (level 1) maps it as its head.
    debug_assert!(level <= 1);
    if !e.is_present() || e.pfn() != page {
        return false;
    }
    let old = slot.fetch_and(!PTE_ACCESSED, Ordering::AcqRel);
    // The swap token's holder keeps its pages (`thrash.rs`, as Linux's
    // `page_referenced_one` counted them referenced).
    old & PTE_ACCESSED != 0 || m.space.load().holds_token()
}

/// Linux's `folio_referenced`: was the locked `page` accessed through its mapping
/// since the last call (clearing the accessed bit)? `None` when the mapping could
/// not be reached now (see [`rmap_walk`]).
pub(crate) fn folio_referenced(
    mm: &Mm,
    page: &PageGuard<'_>,
    rwc: &mut RmapWalkControl,
) -> Option<bool> {
    rmap_walk(mm, page, rwc, |m| folio_referenced_one(m, page.pfn()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gfp, MapFlags};

    #[test]
    fn encode_roundtrip() {
        let va = (1u64 << 47) - 4096;
        assert_eq!(decode(encode(MAX_SPACE_ID, va)), Some((MAX_SPACE_ID, va)));
        assert_eq!(decode(encode(1, 0)), Some((1, 0)));
        assert_eq!(decode(0), None);
    }

    /// The walk reaches the mapping of a locked page; `folio_referenced` tests and
    /// clears the accessed bit; `try_to_migrate_one` replaces exactly the entry that
    /// maps the page, and refuses one that does not.
    #[test]
    fn rmap_walk_reaches_the_mapping() {
        let mm = crate::space::tests::mm();
        let s = mm.new_space().unwrap();
        let a = s.mmap(2 * PAGE_SIZE, MapFlags::empty()).unwrap();
        s.write(a + PAGE_SIZE as u64, &[7]).unwrap();
        // The fault is the page's insertion (no accessed bit); a use after it
        // is a reference.
        s.touch(a + PAGE_SIZE as u64, false).unwrap();
        let pfn = s.translate(a + PAGE_SIZE as u64).unwrap().pfn;
        let mut rwc = RmapWalkControl::default();
        {
            let page = mm.trylock_page(pfn).unwrap();
            assert!(mm.trylock_page(pfn).is_none(), "the page lock is held");
            let (id, va) = rmap_walk(&mm, &page, &mut rwc, |m| (m.space.id(), m.vaddr)).unwrap();
            assert_eq!((id, va), (s.id(), a + PAGE_SIZE as u64));
            assert_eq!(folio_referenced(&mm, &page, &mut rwc), Some(true));
            assert_eq!(folio_referenced(&mm, &page, &mut rwc), Some(false));
            // A wrong frame is not unmapped.
            let other = mm.trylock_page(Pfn::new(pfn.get() + 1)).unwrap();
            let r = rmap_walk(&mm, &page, &mut rwc, |m| {
                try_to_migrate_one(m, &other, |e| e.mk_migration()).is_none()
            });
            assert_eq!(r, Some(true));
            drop(other);
            // The right one is, and put back.
            rmap_walk(&mm, &page, &mut rwc, |m| {
                let (slot, old) = try_to_migrate_one(m, &page, |e| e.mk_migration()).unwrap();
                assert!(Pte::from_raw(slot.load(Ordering::Acquire)).is_migration());
                assert!(old.is_present() && old.is_dirty() && !old.is_accessed());
                slot.store(old.raw(), Ordering::Release);
            })
            .unwrap();
        }
        // Touching it again sets the bit the walk cleared.
        s.touch(a + PAGE_SIZE as u64, false).unwrap();
        let page = mm.lock_page(pfn);
        assert_eq!(folio_referenced(&mm, &page, &mut rwc), Some(true));
        drop(page);
        // A page no space maps has no walk.
        let direct = mm.alloc_pages(Gfp::KERNEL, 0).unwrap();
        let locked = mm.lock_page(direct);
        assert_eq!(rmap_walk(&mm, &locked, &mut rwc, |_| ()), None);
        drop((locked, rwc));
        mm.free_pages(direct, 0).unwrap();
        let mut buf = [0u8];
        s.read(a + PAGE_SIZE as u64, &mut buf).unwrap();
        assert_eq!(buf, [7]);
    }
}
