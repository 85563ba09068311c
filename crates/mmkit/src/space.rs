//! Address spaces: mappings (VMAs), the demand-fault path, unmap with batched
//! freeing, and parallel freeing of large mappings.
//!
//! A [`Space`] is one process's anonymous memory, Linux's `mm_struct` without
//! files or fork: a tree of VMAs (`[start, end)` ranges with flags), a 4-level
//! page table (`pgtable.rs`) whose table pages come from the [`Mm`] itself, and
//! data pages faulted in on first touch.
//!
//! - Fault (`handle_mm_fault`): find the VMA, walk the table allocating missing
//!   table pages (installed by `compare_exchange` from 0; the loser frees its page),
//!   then either `do_huge_pmd_anonymous_page` (an order-9 page under one PMD, for a
//!   [`MapFlags::HUGE`] VMA whose 2 MiB-aligned range around the address lies inside
//!   it; falls back to order 0 when the allocation fails) or `do_anonymous_page`
//!   (an order-0 page, with anonymous fault-around a batch of them). The data
//!   page is `Gfp::MOVABLE`, cleared with the Mm's clearing strategy (a huge page
//!   with `clear_huge_page`, the faulting sub-page last; under `Auto` a sparse
//!   first touch, at most [`SPARSE_TOUCH_BYTES`], has its batch cleared with
//!   streaming stores and the cache lines at its offset prefetched in every page),
//!   gets its reverse map, and is installed with `compare_exchange` from 0:
//!   of two racing faults exactly one page is installed and the other is freed, so
//!   every access goes through the installed page and no write is lost.
//! - Unmap (`munmap`): split huge PMDs straddling the ends of the range, detach the
//!   VMAs (splitting them as Linux's `__split_vma`), then `zap_pte_range`: clear the
//!   entries, clear the reverse map and gather the pages in an [`MmuGather`] that
//!   frees up to 512 of them at a time through `Mm::put_pages_bulk`, and free the
//!   table pages that became empty (`free_pgtables`). `munmap_parallel` zaps 2 MiB-
//!   aligned parts of the range on scoped threads (each with its own gather), then
//!   frees the upper-level tables on the calling thread.
//! - Access (`read`, `write`, `touch`, `populate`, `with_page`): the walk of the
//!   fast path sets the accessed (and on writes the dirty) bit like the MMU; a
//!   missing or NUMA-hinting entry takes the fault path and retries.
//! - Migration (`migrate.rs`, for compaction): under the shared VMA lock the
//!   migrator takes the frame's page lock with `try_lock`, replaces the PTE by a
//!   migration entry, copies the page and installs a PTE to the copy. A fault that
//!   finds a migration entry waits for it to go (the migrator never blocks while it
//!   is installed, so the wait is one page copy long) and retries. `read`/`write`
//!   and `with_page` take the page lock of the frame they found and then check,
//!   still under the VMA lock, that the PTE maps that frame; if a migration moved
//!   it meanwhile they retry, so no byte is read from or written to a page after
//!   its copy started.
//!
//! Invariants:
//! - No entry maps a page outside a VMA; a huge PMD lies entirely inside one.
//! - A mapped data page holds one reference for its mapping (a huge page one for
//!   all its sub-pages); `with_page` holds one more while the closure runs.
//! - Each table page's descriptor `private` counts its non-zero entries.
//!
//! Locking (outermost first):
//! 1. `vmas` (a sharded reader-writer lock): shared for every access and fault,
//!    exclusive for `mmap`/`munmap`. Entries go from 0 to non-zero only under the
//!    shared lock (by CAS), and back to 0, and table pages are freed, only under the
//!    exclusive lock; a reference to a table page is never used after the guard
//!    that protected the walk is dropped (the walkers take the guard's `&VmaTree`
//!    as a witness, and the returned references borrow from it). Each exclusive
//!    hold starts a new epoch of the tree, which voids the per-thread caches of
//!    the last VMA and PTE table found under the shared lock (`WalkCache`).
//! 2. Page locks: a striped mutex per 4 KiB frame, held while bytes of the frame are
//!    copied by `read`/`write` or lent out by `with_page`, so a `&mut [u8]` to a
//!    page is never aliased. `with_page` holds it *without* the VMA lock (the page
//!    is pinned by a reference instead), so its closure must not call back into any
//!    address space: such calls are refused with [`Error::Fault`] rather than risk
//!    a deadlock. A page lock is taken only under the VMA lock (shared), never the
//!    other way round; migration only ever `try_lock`s it.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use crossbeam_utils::CachePadded;
use mmkit_core::clear::{clear_page_batch, ChunkedClear, ClearStrategy};
use mmkit_core::Platform;

use crate::pgtable::{
    alloc_table, desc, level_shift, pt_index, table, used, Pte, Table, HPAGE_PMD_NR,
    HPAGE_PMD_ORDER, PMD_SIZE, PTE_ACCESSED, PTE_COMPOUND, PTE_DIRTY, PTE_WRITE, PTRS_PER_TABLE,
    TASK_SIZE,
};
use crate::{rmap, Error, Gfp, Mm, Pfn, StdPlatform, PAGE_SIZE};

/// Lowest address `mmap` hands out.
pub const MMAP_BASE: u64 = 0x1000_0000_0000;
const PAGE: u64 = PAGE_SIZE as u64;
/// Pages an [`MmuGather`] collects before freeing them in one batch.
pub const MMU_GATHER_BATCH: usize = 512;
const PAGE_LOCK_STRIPES: usize = 256;
/// A first access of at most this many bytes of a page is sparse (four cache
/// lines): under [`ClearStrategy::Auto`] its fault-around batch is cleared with
/// streaming stores and the lines it covers are prefetched in every page of the
/// batch (see `do_anonymous_page`). `touch` and `populate` are sparse,
/// `with_page` is dense, `read`/`write` go by the bytes they copy.
pub const SPARSE_TOUCH_BYTES: usize = 256;
/// Highest level of table page that `munmap` frees (the root, level 3, only goes
/// with the address space).
const FREE_UPPER: u32 = 2;
/// What the threads of `munmap_parallel` free: PTE tables only.
const FREE_PTE_TABLES: u32 = 0;

// ---------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------

/// Flags of a mapping.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct MapFlags(u32);

impl MapFlags {
    /// Eligible for order-9 (2 MiB) pages, with fallback to order 0. The mapping
    /// is 2 MiB aligned.
    pub const HUGE: MapFlags = MapFlags(1 << 0);
    const ALL: u32 = Self::HUGE.0;

    /// No flags.
    pub const fn empty() -> MapFlags {
        MapFlags(0)
    }
    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Flags from raw bits, `None` if an unknown bit is set.
    pub const fn from_bits(bits: u32) -> Option<MapFlags> {
        if bits & !Self::ALL != 0 {
            None
        } else {
            Some(MapFlags(bits))
        }
    }
    /// True when every flag of `other` is set.
    pub const fn contains(self, other: MapFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// True when no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for MapFlags {
    type Output = MapFlags;
    fn bitor(self, rhs: MapFlags) -> MapFlags {
        MapFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for MapFlags {
    fn bitor_assign(&mut self, rhs: MapFlags) {
        self.0 |= rhs.0
    }
}

impl fmt::Debug for MapFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.contains(MapFlags::HUGE) {
            f.write_str("MapFlags(HUGE)")
        } else {
            f.write_str("MapFlags(empty)")
        }
    }
}

// ---------------------------------------------------------------------------------
// VMAs
// ---------------------------------------------------------------------------------

/// One mapping, `[start, end)`, page aligned (Linux's `vm_area_struct`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Vma {
    start: u64,
    end: u64,
    flags: MapFlags,
}

/// The clearing strategy for a huge-page fault in `vma`. `Auto` decides by the
/// extent being populated, the mapping, not by the one 2 MiB page: faults that
/// stream through more than the last-level cache clear with non-temporal stores,
/// so they neither evict the working set nor pay for allocating lines that will be
/// evicted before they are read (the window around the faulting sub-page is still
/// cleared last with cached stores, see `clear_huge_page`); a huge mapping that fits
/// in the cache is cleared with `rep stosb`.
fn huge_clear_strategy(s: ClearStrategy, vma: &Vma) -> ClearStrategy {
    s.resolve((vma.end - vma.start) as usize)
}

impl Vma {
    /// Can the fault at `addr` take an order-9 page: a HUGE VMA containing the
    /// whole 2 MiB-aligned range around `addr`.
    fn huge_eligible(&self, addr: u64) -> bool {
        let haddr = addr & !(PMD_SIZE - 1);
        self.flags.contains(MapFlags::HUGE) && haddr >= self.start && haddr + PMD_SIZE <= self.end
    }
}

/// Where the upper levels of a page-table walk end (`walk_upper`).
enum Upper<'a> {
    /// The PTE table's page.
    Table(Pfn),
    /// A huge PMD: its slot and value.
    Huge(&'a AtomicU64, Pte),
}

/// The VMAs of a space, by start address, and where the next search for room
/// starts (Linux's old `free_area_cache`).
#[derive(Default)]
pub(crate) struct VmaTree {
    map: BTreeMap<u64, Vma>,
    hint: u64,
    /// The epoch of the tree and of the table pages above the leaves: a value
    /// from [`next_gen`], unique among all spaces, replaced each time the VMA
    /// lock is taken exclusively (see [`WalkCache`]).
    gen: u64,
}

/// A new, never used walk-cache epoch (0 is never handed out).
fn next_gen() -> u64 {
    static NEXT_GEN: AtomicU64 = AtomicU64::new(1);
    NEXT_GEN.fetch_add(1, Ordering::Relaxed)
}

/// The last VMA and the last PTE table this thread found under a shared VMA lock
/// (a software TLB of one entry each, like Linux's old per-thread `vmacache`), so
/// that the accesses of a hot loop skip the VMA tree and the three upper levels
/// of the walk.
///
/// An entry is valid while the tree's epoch (`VmaTree::gen`) is the one it was
/// filled in: VMAs change, and table pages are freed or replaced, only under the
/// exclusive VMA lock, which takes a fresh epoch. So under a shared lock whose
/// epoch matches, no exclusive section ran since the fill: the VMA is still in
/// the tree unchanged and the PMD entry still points to the cached PTE table,
/// which is live. Epochs are unique across spaces, so an entry of another (or a
/// dropped) space never matches. Filled and used only under the shared lock.
#[derive(Copy, Clone)]
struct WalkCache {
    vma_gen: u64,
    vma: Vma,
    pt_gen: u64,
    /// The 2 MiB-aligned range `[pt_base, pt_base + PMD_SIZE)` mapped by `pt`.
    pt_base: u64,
    pt: Pfn,
}

thread_local! {
    static WALK_CACHE: Cell<WalkCache> = const {
        Cell::new(WalkCache {
            vma_gen: 0,
            vma: Vma { start: 0, end: 0, flags: MapFlags::empty() },
            pt_gen: 0,
            // Not 2 MiB aligned: never matches.
            pt_base: u64::MAX,
            pt: Pfn::new(0),
        })
    };
}

impl VmaTree {
    /// The VMA containing `addr`.
    fn find(&self, addr: u64) -> Option<&Vma> {
        self.map
            .range(..=addr)
            .next_back()
            .map(|(_, v)| v)
            .filter(|v| addr < v.end)
    }

    /// The VMA containing `addr`, through this thread's [`WalkCache`]. Only under
    /// the shared VMA lock.
    #[inline]
    fn find_cached(&self, addr: u64) -> Option<Vma> {
        let c = WALK_CACHE.with(Cell::get);
        if c.vma_gen == self.gen && c.vma.start <= addr && addr < c.vma.end {
            return Some(c.vma);
        }
        let vma = *self.find(addr)?;
        WALK_CACHE.with(|cell| {
            cell.set(WalkCache {
                vma_gen: self.gen,
                vma,
                ..cell.get()
            })
        });
        Some(vma)
    }

    /// Is every byte of `[start, end)` inside some VMA?
    fn covers(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            match self.find(at) {
                Some(v) => at = v.end,
                None => return false,
            }
        }
        true
    }

    /// First `align`-aligned gap of `len` bytes at or above `from`.
    fn find_gap(&self, from: u64, len: u64, align: u64) -> Option<u64> {
        let mut cand = align_up(from.max(MMAP_BASE), align)?;
        let first = self
            .map
            .range(..=cand)
            .next_back()
            .map_or(cand, |(k, _)| *k);
        for v in self.map.range(first..).map(|(_, v)| v) {
            if v.end <= cand {
                continue;
            }
            if cand.checked_add(len)? <= v.start {
                return Some(cand);
            }
            cand = align_up(v.end, align)?;
        }
        (cand.checked_add(len)? <= TASK_SIZE).then_some(cand)
    }

    /// Linux's `get_unmapped_area`: from the hint, then from the bottom.
    fn get_unmapped_area(&self, len: u64, align: u64) -> Option<u64> {
        self.find_gap(self.hint, len, align)
            .or_else(|| self.find_gap(MMAP_BASE, len, align))
    }

    /// Removes `[start, end)` from the VMAs, splitting those that straddle an end.
    fn detach(&mut self, start: u64, end: u64) {
        let hit: Vec<Vma> = self
            .map
            .range(..end)
            .rev()
            .map(|(_, v)| *v)
            .take_while(|v| v.end > start)
            .collect();
        for v in hit {
            self.map.remove(&v.start);
            if v.start < start {
                self.map.insert(v.start, Vma { end: start, ..v });
            }
            if v.end > end {
                self.map.insert(end, Vma { start: end, ..v });
            }
        }
        self.hint = self.hint.min(start);
    }
}

const fn align_up(x: u64, align: u64) -> Option<u64> {
    match x.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

/// `[addr, addr + len)` is a non-empty range inside `0..2^47`; returns its end.
fn check_range(addr: u64, len: u64) -> Result<u64, Error> {
    if len == 0 {
        return Err(bad(addr, len, "zero length"));
    }
    match addr.checked_add(len) {
        Some(end) if end <= TASK_SIZE => Ok(end),
        Some(_) => Err(bad(
            addr,
            len,
            "range leaves the user address space (0..2^47)",
        )),
        None => Err(bad(addr, len, "range wraps around the address space")),
    }
}

fn bad(addr: u64, len: u64, reason: &'static str) -> Error {
    Error::BadAddress { addr, len, reason }
}

// ---------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------

/// Counters of one address space.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Faults handled (first touches and NUMA-hinting faults, including lost races).
    pub faults: u64,
    /// Faults that installed an order-9 page.
    pub huge_faults: u64,
    /// Huge-eligible faults that fell back to order 0 (no order-9 block).
    pub huge_fallbacks: u64,
    /// 4 KiB frames mapped (a huge page counts 512).
    pub rss_pages: u64,
    /// Order-9 pages mapped by a PMD.
    pub huge_pages: u64,
    /// Table pages, the root included.
    pub pgtable_pages: u64,
    /// Mappings.
    pub vmas: u64,
}

#[derive(Copy, Clone)]
enum Stat {
    Faults,
    HugeFaults,
    HugeFallbacks,
    Rss,
    HugePages,
    PgTables,
}
const NR_STATS: usize = 6;

/// Per-CPU counters, folded on read (signed deltas kept as wrapping u64).
struct Counters {
    slots: Box<[CachePadded<[AtomicU64; NR_STATS]>]>,
}

impl Counters {
    fn new(n: usize) -> Counters {
        Counters {
            slots: (0..n.max(1)).map(|_| CachePadded::default()).collect(),
        }
    }
    #[inline]
    fn add(&self, s: Stat, v: i64) {
        let i = StdPlatform::cpu_id() % self.slots.len();
        self.slots[i][s as usize].fetch_add(v as u64, Ordering::Relaxed);
    }
    fn get(&self, s: Stat) -> u64 {
        self.slots.iter().fold(0u64, |a, c| {
            a.wrapping_add(c[s as usize].load(Ordering::Relaxed))
        })
    }
}

// ---------------------------------------------------------------------------------
// mmu_gather
// ---------------------------------------------------------------------------------

/// Pages and table pages unmapped but not yet freed (Linux's `mmu_gather`): freed
/// in batches of up to [`MMU_GATHER_BATCH`] through `Mm::put_pages_bulk`, which
/// takes the per-CPU (or zone) lock once per batch. Dropping it frees the rest.
pub(crate) struct MmuGather<'a> {
    mm: &'a Mm,
    batch: Vec<(Pfn, u32)>,
}

impl<'a> MmuGather<'a> {
    fn new(mm: &'a Mm) -> Self {
        MmuGather {
            mm,
            batch: Vec::with_capacity(MMU_GATHER_BATCH),
        }
    }
    /// Drops the mapping's reference on a data page (the reverse map is cleared).
    fn remove_page(&mut self, pfn: Pfn, order: u32) {
        self.batch.push((pfn, order));
        if self.batch.len() >= MMU_GATHER_BATCH {
            self.flush();
        }
    }
    /// Frees a table page (Linux's `tlb_remove_table`).
    fn remove_table(&mut self, pfn: Pfn) {
        used(self.mm, pfn).store(0, Ordering::Relaxed);
        self.remove_page(pfn, 0);
    }
    fn flush(&mut self) {
        if !self.batch.is_empty() {
            self.mm.put_pages_bulk(&self.batch);
            self.batch.clear();
        }
    }
}

impl Drop for MmuGather<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

// ---------------------------------------------------------------------------------
// The address space
// ---------------------------------------------------------------------------------

/// What a virtual address maps to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The 4 KiB frame holding the address.
    pub pfn: Pfn,
    /// The head of the block the frame belongs to (`pfn` for an order-0 page).
    pub head: Pfn,
    /// Order of that block: 0, or 9 for a huge page (mapped whole or split).
    pub order: u32,
    /// Mapped by one PMD (a huge page not split).
    pub huge: bool,
    /// Accessed bit of the entry.
    pub accessed: bool,
    /// Dirty bit of the entry.
    pub dirty: bool,
    /// The entry is in the NUMA-hinting state (the next access faults).
    pub numa_hint: bool,
}

/// An address space: mappings, a page table and the pages faulted into it.
/// `Send + Sync`; every method takes `&self`. Dropping it unmaps everything.
pub struct Space {
    inner: Arc<SpaceInner>,
}

pub(crate) struct SpaceInner {
    id: u64,
    mm: Mm,
    /// The root table page (PGD).
    pgd: Pfn,
    vmas: ShardedLock<VmaTree>,
    page_locks: Box<[CachePadded<parking_lot::Mutex<()>>]>,
    stats: Counters,
    /// Number of VMAs (written under the exclusive VMA lock).
    nr_vmas: AtomicU64,
}

thread_local! {
    /// Set while this thread runs a `with_page` closure (holding a page lock).
    static IN_PAGE: Cell<bool> = const { Cell::new(false) };
}

fn not_in_page(addr: u64) -> Result<(), Error> {
    if IN_PAGE.with(|c| c.get()) {
        return Err(Error::Fault {
            addr,
            reason: "address-space call from inside a with_page closure (would deadlock)",
        });
    }
    Ok(())
}

/// Marks this thread as inside a `with_page` closure until dropped.
struct InPage;
impl InPage {
    fn enter() -> InPage {
        IN_PAGE.with(|c| c.set(true));
        InPage
    }
}
impl Drop for InPage {
    fn drop(&mut self) {
        IN_PAGE.with(|c| c.set(false));
    }
}

/// A reference on a block, dropped with the guard.
struct PagePin<'a> {
    mm: &'a Mm,
    head: Pfn,
}
impl Drop for PagePin<'_> {
    fn drop(&mut self) {
        self.mm.unpin_page(self.head);
    }
}

impl Mm {
    /// A new, empty address space whose table and data pages come from this Mm.
    pub fn new_space(&self) -> Result<Space, Error> {
        let id = rmap::reserve_id()?;
        let pgd = match alloc_table(self) {
            Ok(p) => p,
            Err(e) => {
                rmap::release_id(id);
                return Err(e);
            }
        };
        let inner = Arc::new(SpaceInner {
            id,
            mm: self.clone(),
            pgd,
            vmas: ShardedLock::new(VmaTree {
                map: BTreeMap::new(),
                hint: MMAP_BASE,
                gen: next_gen(),
            }),
            page_locks: (0..PAGE_LOCK_STRIPES)
                .map(|_| CachePadded::new(parking_lot::Mutex::new(())))
                .collect(),
            stats: Counters::new(self.config().nr_cpus),
            nr_vmas: AtomicU64::new(0),
        });
        inner.stats.add(Stat::PgTables, 1);
        rmap::publish(id, &inner);
        Ok(Space { inner })
    }
}

impl fmt::Debug for Space {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Space")
            .field("id", &self.inner.id)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Space {
    pub(crate) fn from_inner(inner: Arc<SpaceInner>) -> Space {
        Space { inner }
    }

    pub(crate) fn inner(&self) -> &SpaceInner {
        &self.inner
    }

    /// The id the reverse map records ([`Mm::rmap_lookup`]).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The memory manager the pages come from.
    pub fn mm(&self) -> &Mm {
        &self.inner.mm
    }

    /// Maps `len` bytes (rounded up to 4 KiB) of anonymous, zero-filled memory and
    /// returns its address (page aligned; 2 MiB aligned with [`MapFlags::HUGE`]).
    /// Nothing is allocated until the pages are touched.
    pub fn mmap(&self, len: usize, flags: MapFlags) -> Result<u64, Error> {
        not_in_page(0)?;
        let len = len as u64;
        if len == 0 {
            return Err(bad(0, 0, "zero length"));
        }
        let Some(len_r) = align_up(len, PAGE).filter(|l| *l <= TASK_SIZE - MMAP_BASE) else {
            return Err(Error::AddressSpaceFull { len });
        };
        let align = if flags.contains(MapFlags::HUGE) {
            PMD_SIZE
        } else {
            PAGE
        };
        let mut g = self.inner.write_lock();
        let addr = g
            .get_unmapped_area(len_r, align)
            .ok_or(Error::AddressSpaceFull { len })?;
        g.map.insert(
            addr,
            Vma {
                start: addr,
                end: addr + len_r,
                flags,
            },
        );
        g.hint = addr + len_r;
        self.inner
            .nr_vmas
            .store(g.map.len() as u64, Ordering::Relaxed);
        Ok(addr)
    }

    /// Unmaps `[addr, addr + len)` (`addr` page aligned, `len` rounded up to 4 KiB):
    /// any part of one or more mappings, which are split as needed; holes in the
    /// range are fine. The pages are freed in batches and table pages that became
    /// empty with them. Refused (changing nothing) for a zero length, an unaligned
    /// address, a range that wraps or leaves `0..2^47`, or no memory for splitting
    /// a huge page that straddles an end of the range.
    pub fn munmap(&self, addr: u64, len: usize) -> Result<(), Error> {
        self.munmap_parallel(addr, len, 1)
    }

    /// As [`munmap`](Self::munmap), zapping the range on `threads` threads (parts
    /// split at 2 MiB boundaries, each thread freeing its pages and PTE tables in its
    /// own batches), then freeing the upper-level tables on this thread.
    pub fn munmap_parallel(&self, addr: u64, len: usize, threads: usize) -> Result<(), Error> {
        not_in_page(addr)?;
        let len = len as u64;
        if addr & (PAGE - 1) != 0 {
            return Err(bad(addr, len, "munmap address is not page aligned"));
        }
        if len == 0 {
            return Err(bad(addr, len, "zero length"));
        }
        let end = align_up(len, PAGE)
            .ok_or_else(|| bad(addr, len, "range wraps around the address space"))
            .and_then(|l| check_range(addr, l))?;
        let mut g = self.inner.write_lock();
        self.inner.do_munmap(&mut g, addr, end, threads.max(1))
    }

    /// Copies `buf.len()` bytes from `addr` (across pages and adjacent mappings),
    /// faulting pages in on first touch (never-written memory reads 0). The whole
    /// range must be mapped, else nothing is read. An empty `buf` is a no-op.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let dst = buf.as_mut_ptr();
        self.inner.copy(addr, buf.len(), false, |frame, done, n| {
            // SAFETY: `frame` points at `n` readable bytes of a mapped page whose
            // page lock we hold; `done + n <= buf.len()`, and `buf` is exclusively
            // ours, so the ranges are valid and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(frame, dst.add(done), n) }
        })
    }

    /// Copies `buf` to `addr` (across pages and adjacent mappings), faulting pages
    /// in on first touch. The whole range must be mapped, else nothing is written.
    /// Out of memory during a fault returns [`Error::NoMemory`] (the pages before
    /// it were written). An empty `buf` is a no-op.
    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Error> {
        if buf.is_empty() {
            return Ok(());
        }
        let src = buf.as_ptr();
        self.inner.copy(addr, buf.len(), true, |frame, done, n| {
            // SAFETY: `frame` points at `n` writable bytes of a mapped page whose
            // page lock we hold (no other reference to them exists);
            // `done + n <= buf.len()`; a page never overlaps the caller's slice.
            unsafe { std::ptr::copy_nonoverlapping(src.add(done), frame, n) }
        })
    }

    /// Faults in the page at `addr` (as a write if `write`) without copying
    /// anything: the access of a hot loop.
    pub fn touch(&self, addr: u64, write: bool) -> Result<(), Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        let g = self.inner.read_lock();
        let vma = g
            .find_cached(addr)
            .ok_or_else(|| bad(addr, 1, "address is not mapped"))?;
        self.inner.access(&g, &vma, addr, write, 1).map(|_| ())
    }

    /// Faults in every page of `[addr, addr + len)` (Linux's `MADV_POPULATE_READ`/
    /// `_WRITE`) under one lock hold. The whole range must be mapped.
    pub fn populate(&self, addr: u64, len: usize, write: bool) -> Result<(), Error> {
        not_in_page(addr)?;
        let end = check_range(addr, len as u64)?;
        let g = self.inner.read_lock();
        if !g.covers(addr, end) {
            return Err(bad(addr, len as u64, "range is not entirely mapped"));
        }
        let mut a = addr & !(PAGE - 1);
        let mut vma = *g.find(a).expect("range is covered");
        while a < end {
            if a >= vma.end {
                vma = *g.find(a).expect("range is covered");
            }
            let t = self.inner.access(&g, &vma, a, write, 1)?;
            a = if t.huge {
                (a & !(PMD_SIZE - 1)) + PMD_SIZE
            } else {
                a + PAGE
            };
        }
        Ok(())
    }

    /// Runs `f` on the bytes of the 4 KiB page containing `addr` (the whole page,
    /// page aligned; `addr % 4096` is the offset of `addr` in it), faulting it in
    /// first (as a write if `write`; write through the slice only with `write` set,
    /// or the dirty bit misses it). The page is pinned by a reference
    /// (`get_page`/`put_page`) while `f` runs, so it cannot be freed or moved even if
    /// the range is unmapped meanwhile (then writes land in the unmapped page), and
    /// its page lock is held, so no other access of the page runs at the same time.
    /// `f` must not call into an address space: such calls return [`Error::Fault`].
    pub fn with_page<R>(
        &self,
        addr: u64,
        write: bool,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, Error> {
        not_in_page(addr)?;
        check_range(addr, 1)?;
        let mm = &self.inner.mm;
        let (t, _lock) = loop {
            let g = self.inner.read_lock();
            let vma = g
                .find_cached(addr)
                .ok_or_else(|| bad(addr, 1, "address is not mapped"))?;
            let t = self.inner.access(&g, &vma, addr, write, PAGE_SIZE)?;
            let lock = self.inner.page_lock(t.pfn);
            if !self.inner.still_maps(&g, addr, &t) {
                // A migration moved the page after the walk: walk again.
                continue;
            }
            // Pinned while the VMA lock still keeps unmap away.
            mm.pin_page(t.head);
            break (t, lock);
        };
        let _pin = PagePin { mm, head: t.head };
        let _in = InPage::enter();
        // SAFETY: the frame is 4096 bytes inside the arena; it stays allocated while
        // our reference pins it; its page lock (held until after `f` returns) makes
        // this the only reference to its bytes among all accessors of the space,
        // migration included (it only try-locks it, and we checked that the PTE
        // still maps the frame after taking the lock), and nothing else writes a
        // mapped data page.
        let bytes = unsafe { std::slice::from_raw_parts_mut(mm.page_address(t.pfn), PAGE_SIZE) };
        Ok(f(bytes))
    }

    /// What `addr` maps to now, without faulting or touching the accessed bit;
    /// `None` if nothing is mapped there (never touched, or not in a mapping).
    pub fn translate(&self, addr: u64) -> Option<Translation> {
        not_in_page(addr).ok()?;
        if addr >= TASK_SIZE {
            return None;
        }
        let g = self.inner.read_lock();
        loop {
            let (slot, e, level) = self.inner.follow_pte(&g, addr)?;
            if e.is_migration() {
                wait_migration(slot, e);
                continue;
            }
            return e
                .maps_page()
                .then(|| SpaceInner::translation(e, level, addr));
        }
    }

    /// The mappings, `(start, end, flags)` in address order (like `/proc/pid/maps`).
    pub fn mappings(&self) -> Vec<(u64, u64, MapFlags)> {
        if not_in_page(0).is_err() {
            return Vec::new();
        }
        let g = self.inner.read_lock();
        g.map.values().map(|v| (v.start, v.end, v.flags)).collect()
    }

    /// Counters (folded per-CPU values, so a snapshot).
    pub fn stats(&self) -> SpaceStats {
        let s = &self.inner.stats;
        let vmas = self.inner.nr_vmas.load(Ordering::Relaxed);
        SpaceStats {
            faults: s.get(Stat::Faults),
            huge_faults: s.get(Stat::HugeFaults),
            huge_fallbacks: s.get(Stat::HugeFallbacks),
            rss_pages: s.get(Stat::Rss),
            huge_pages: s.get(Stat::HugePages),
            pgtable_pages: s.get(Stat::PgTables),
            vmas,
        }
    }
}

impl SpaceInner {
    fn read_lock(&self) -> ShardedLockReadGuard<'_, VmaTree> {
        self.vmas.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared VMA lock if it can be had without waiting (compaction never
    /// waits for an address space: it may run inside a fault of this very space).
    pub(crate) fn try_read_lock(&self) -> Option<ShardedLockReadGuard<'_, VmaTree>> {
        self.vmas.try_read().ok()
    }

    /// The id the reverse map records.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The Mm the pages come from.
    pub(crate) fn mm(&self) -> &Mm {
        &self.mm
    }

    /// The page lock of `frame` if it is free (migration: an access in progress
    /// makes the migration of that page fail rather than wait).
    pub(crate) fn page_try_lock(&self, frame: Pfn) -> Option<parking_lot::MutexGuard<'_, ()>> {
        let h = frame.get().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
        self.page_locks[h as usize % PAGE_LOCK_STRIPES].try_lock()
    }

    /// Does `addr` still map the frame of `t` through a present entry? Checked
    /// under the page lock of `t.pfn` before touching its bytes: a migration that
    /// started after `t` was taken has replaced the entry. Only under the shared
    /// VMA lock (through the walk cache).
    fn still_maps(&self, held: &VmaTree, addr: u64, t: &Translation) -> bool {
        match self.follow_pte_cached(held, addr) {
            Some((_, e, level)) if e.is_present() => Self::translation(e, level, addr).pfn == t.pfn,
            _ => false,
        }
    }

    /// The exclusive VMA lock, in a new walk-cache epoch: every [`WalkCache`]
    /// entry filled before is void from now on.
    fn write_lock(&self) -> ShardedLockWriteGuard<'_, VmaTree> {
        let mut g = self.vmas.write().unwrap_or_else(|e| e.into_inner());
        g.gen = next_gen();
        g
    }

    fn page_lock(&self, frame: Pfn) -> parking_lot::MutexGuard<'_, ()> {
        let h = frame.get().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
        self.page_locks[h as usize % PAGE_LOCK_STRIPES].lock()
    }

    /// The table page at `pfn`, valid while `_held` (a VMA lock guard) lives.
    #[inline]
    fn tbl<'a>(&'a self, _held: &'a VmaTree, pfn: Pfn) -> &'a Table {
        // SAFETY: `pfn` came from this space's root or from a table entry read under
        // the VMA lock, so it is a live table page of this space; table pages are
        // freed only under the exclusive VMA lock (or in `drop`), after the last use
        // of references to them, and `_held` proves a guard is alive for 'a.
        unsafe { table(&self.mm, pfn) }
    }

    /// Walks to the leaf entry for `addr` without allocating: the slot and value of
    /// the PTE (level 0) or of a huge PMD (level 1). `None` if a table is missing.
    pub(crate) fn follow_pte<'a>(
        &'a self,
        held: &'a VmaTree,
        addr: u64,
    ) -> Option<(&'a AtomicU64, Pte, u32)> {
        match self.walk_upper(held, addr)? {
            Upper::Huge(slot, e) => Some((slot, e, 1)),
            Upper::Table(pt) => Some(self.pte_of(held, pt, addr)),
        }
    }

    /// `follow_pte` through this thread's [`WalkCache`], which it fills when the
    /// walk reaches a PTE table. Only under the shared VMA lock.
    #[inline]
    fn follow_pte_cached<'a>(
        &'a self,
        held: &'a VmaTree,
        addr: u64,
    ) -> Option<(&'a AtomicU64, Pte, u32)> {
        let c = WALK_CACHE.with(Cell::get);
        let base = addr & !(PMD_SIZE - 1);
        let pt = if c.pt_gen == held.gen && c.pt_base == base {
            c.pt
        } else {
            match self.walk_upper(held, addr)? {
                Upper::Huge(slot, e) => return Some((slot, e, 1)),
                Upper::Table(pt) => {
                    self.cache_pte_table(held, base, pt);
                    pt
                }
            }
        };
        Some(self.pte_of(held, pt, addr))
    }

    /// The upper three levels of the walk for `addr`: the PTE table, or a huge
    /// PMD; `None` if a table is missing.
    fn walk_upper<'a>(&'a self, held: &'a VmaTree, addr: u64) -> Option<Upper<'a>> {
        let mut t = self.tbl(held, self.pgd);
        let mut pfn = self.pgd;
        for level in [3, 2, 1] {
            let slot = &t[pt_index(addr, level)];
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if level == 1 && e.is_huge() {
                return Some(Upper::Huge(slot, e));
            }
            if !e.is_present() {
                return None;
            }
            pfn = e.pfn();
            t = self.tbl(held, pfn);
        }
        Some(Upper::Table(pfn))
    }

    /// The PTE slot for `addr` in the PTE table `pt`, and its value.
    #[inline]
    fn pte_of<'a>(&'a self, held: &'a VmaTree, pt: Pfn, addr: u64) -> (&'a AtomicU64, Pte, u32) {
        let slot = &self.tbl(held, pt)[pt_index(addr, 0)];
        (slot, Pte::from_raw(slot.load(Ordering::Acquire)), 0)
    }

    /// Remembers that the PMD entry for `base` points to the PTE table `pt` (read
    /// under the shared VMA lock `held`).
    #[inline]
    fn cache_pte_table(&self, held: &VmaTree, base: u64, pt: Pfn) {
        WALK_CACHE.with(|cell| {
            cell.set(WalkCache {
                pt_gen: held.gen,
                pt_base: base,
                pt,
                ..cell.get()
            })
        });
    }

    fn translation(e: Pte, level: u32, addr: u64) -> Translation {
        let sub = (addr >> 12) & (HPAGE_PMD_NR - 1);
        let (pfn, head, order) = if level == 1 {
            let head = e.pfn();
            (Pfn::new(head.get() + sub), head, HPAGE_PMD_ORDER)
        } else if e.is_compound() {
            let pfn = e.pfn();
            (
                pfn,
                Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1)),
                HPAGE_PMD_ORDER,
            )
        } else {
            (e.pfn(), e.pfn(), 0)
        };
        Translation {
            pfn,
            head,
            order,
            huge: level == 1,
            accessed: e.is_accessed(),
            dirty: e.is_dirty(),
            numa_hint: e.is_numa_hint(),
        }
    }

    /// The access path (Linux's `follow_page` + `handle_mm_fault` retry loop):
    /// the frame mapped at `addr`, faulting it in if needed, with the accessed bit
    /// (and the dirty bit for a write) set. The access covers `len` bytes from
    /// `addr` (within its page): the hint that fault-around's clearing follows.
    fn access(
        &self,
        held: &VmaTree,
        vma: &Vma,
        addr: u64,
        write: bool,
        len: usize,
    ) -> Result<Translation, Error> {
        let want = PTE_ACCESSED | if write { PTE_DIRTY } else { 0 };
        loop {
            if let Some((slot, e, level)) = self.follow_pte_cached(held, addr) {
                if e.is_present() {
                    let e2 = e.with(want);
                    if e2 == e
                        || slot
                            .compare_exchange(
                                e.raw(),
                                e2.raw(),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_ok()
                    {
                        return Ok(Self::translation(e2, level, addr));
                    }
                    continue;
                }
            }
            self.handle_mm_fault(held, vma, addr, write, len)?;
        }
    }

    /// Makes `slot` (an entry of the table at `parent`) point to a table, allocating
    /// one if it is empty (Linux's `__pte_alloc`/`__pmd_alloc`). `Ok(None)` when
    /// the slot holds a huge leaf (possibly installed by a racing fault).
    fn table_alloc(&self, slot: &AtomicU64, parent: Pfn, addr: u64) -> Result<Option<Pfn>, Error> {
        let e = Pte::from_raw(slot.load(Ordering::Acquire));
        if e.is_huge() {
            return Ok(None);
        }
        if e.is_present() {
            return Ok(Some(e.pfn()));
        }
        if !e.is_none() {
            return Err(Error::Fault {
                addr,
                reason: "unexpected non-present entry in an upper-level table",
            });
        }
        let new = alloc_table(&self.mm)?;
        match slot.compare_exchange(
            0,
            Pte::table(new).raw(),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                used(&self.mm, parent).fetch_add(1, Ordering::Relaxed);
                self.stats.add(Stat::PgTables, 1);
                Ok(Some(new))
            }
            Err(cur) => {
                // Lost the race: the winner's table (or huge page) is there.
                self.mm
                    .free_owned_pages(new, 0)
                    .expect("freeing our own unpublished table page");
                let cur = Pte::from_raw(cur);
                Ok((!cur.is_huge()).then(|| cur.pfn()))
            }
        }
    }

    /// Linux's `handle_mm_fault` for an anonymous VMA: installs what `addr` needs
    /// (tables, then a huge page or a page), or restores a NUMA-hinting entry.
    /// Returns once the caller can retry the access. Kept out of line so that the
    /// access path that finds its entry present stays small.
    #[inline(never)]
    fn handle_mm_fault(
        &self,
        held: &VmaTree,
        vma: &Vma,
        addr: u64,
        write: bool,
        len: usize,
    ) -> Result<(), Error> {
        self.stats.add(Stat::Faults, 1);
        let pgd = self.tbl(held, self.pgd);
        let pud_pfn = self
            .table_alloc(&pgd[pt_index(addr, 3)], self.pgd, addr)?
            .expect("no huge entries above PMD level");
        let pud = self.tbl(held, pud_pfn);
        let pmd_pfn = self
            .table_alloc(&pud[pt_index(addr, 2)], pud_pfn, addr)?
            .expect("no huge entries above PMD level");
        let pmd = self.tbl(held, pmd_pfn);
        let pmd_slot = &pmd[pt_index(addr, 1)];
        let pte_pfn = loop {
            let e = Pte::from_raw(pmd_slot.load(Ordering::Acquire));
            if e.is_huge() {
                if e.is_numa_hint() {
                    // do_huge_pmd_numa_page, without migration for now.
                    let _ = pmd_slot.compare_exchange(
                        e.raw(),
                        e.clear_numa_hint().raw(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                return Ok(());
            }
            if e.is_none() && vma.huge_eligible(addr) {
                if self.do_huge_pmd_anonymous_page(vma, pmd_slot, pmd_pfn, addr, write, len) {
                    return Ok(());
                }
                self.stats.add(Stat::HugeFallbacks, 1);
            }
            if let Some(p) = self.table_alloc(pmd_slot, pmd_pfn, addr)? {
                break p;
            }
        };
        self.cache_pte_table(held, addr & !(PMD_SIZE - 1), pte_pfn);
        let pt = self.tbl(held, pte_pfn);
        let slot = &pt[pt_index(addr, 0)];
        let e = Pte::from_raw(slot.load(Ordering::Acquire));
        if e.is_none() {
            return self.do_anonymous_page(vma, pt, pte_pfn, addr, write, len);
        }
        if e.is_migration() {
            wait_migration(slot, e);
            return Ok(());
        }
        if e.is_numa_hint() {
            // do_numa_page, without migration for now.
            let _ = slot.compare_exchange(
                e.raw(),
                e.clear_numa_hint().raw(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return Ok(());
        }
        if e.is_swap() {
            return Err(Error::Fault {
                addr,
                reason: "swap entry, and this build has no swap",
            });
        }
        Ok(()) // present: a racing fault installed it
    }

    /// Linux's `do_anonymous_page`: a cleared order-0 page at `addr`, and, with
    /// anonymous fault-around (`Mm::fault_around`, an mTHP-like batch of
    /// independent order-0 pages), cleared pages for the empty entries that follow
    /// it in the same page table and mapping. The batch is allocated under one
    /// per-CPU lock hold (`alloc_pages_bulk`), cleared back to back, then installed:
    /// the store-buffer drain that the first `compare_exchange` forces after
    /// clearing is paid once per batch instead of once per page. Each page is an
    /// ordinary movable order-0 page with its own reverse map.
    ///
    /// Clearing, with [`ClearStrategy::Auto`]: `rep stosb` when the faulting
    /// access covers more than [`SPARSE_TOUCH_BYTES`] of its page (a loop that
    /// fills each page, like anon_w_seq, reads its zeroes back at once, so cached
    /// stores pay their read for ownership once). When it is sparse (page_fault1:
    /// a byte per page), streaming stores, with one `sfence` for the batch: they
    /// skip the read for ownership of every line, which makes a 4 KiB clear
    /// 1.5-2x cheaper here, and the zeroes a sparse loop never reads would only
    /// evict its working set. After the fence, the cache lines the faulting access
    /// covers, at the same offset in every page of the batch, are prefetched for
    /// writing: the access resumes on them, and a loop that strides by pages
    /// touches the other pages at that offset too, so its stores hit the cache
    /// instead of waiting on memory at the locked instruction that follows them.
    /// Explicit strategies apply to the whole batch.
    fn do_anonymous_page(
        &self,
        vma: &Vma,
        pt: &Table,
        pt_pfn: Pfn,
        addr: u64,
        write: bool,
        len: usize,
    ) -> Result<(), Error> {
        const MAX_AROUND: usize = 64;
        let mm = &self.mm;
        let idx = pt_index(addr, 0);
        let va = addr & !(PAGE - 1);
        let mut want = 1;
        let around = mm.fault_around().min(MAX_AROUND);
        if around > 1 {
            let limit = around
                .min(PTRS_PER_TABLE - idx)
                .min(((vma.end - va) / PAGE) as usize);
            while want < limit && pt[idx + want].load(Ordering::Relaxed) == 0 {
                want += 1;
            }
        }
        let mut pfns = [Pfn::new(0); MAX_AROUND];
        let mut n = mm.alloc_owned_pages_bulk(Gfp::MOVABLE, &mut pfns[..want]);
        if n == 0 {
            // The lists and the zone's fast path are empty: the faulting page
            // through the slow path (reclaim, compaction, the error).
            pfns[0] = mm.alloc_owned_pages(Gfp::MOVABLE, 0)?;
            n = 1;
        }
        let off = (addr % PAGE) as usize;
        let (strategy, hot) = match mm.clear_strategy() {
            ClearStrategy::Auto if len <= SPARSE_TOUCH_BYTES => {
                (ClearStrategy::NonTemporal, off..(off + len).min(PAGE_SIZE))
            }
            s => (s, 0..0),
        };
        // SAFETY: each page is ours (just allocated, not yet mapped): 4096 writable
        // bytes inside the arena that nothing else references; the pfns differ.
        unsafe {
            clear_page_batch(pfns[..n].iter().map(|p| mm.page_address(*p)), strategy, hot);
        }
        // Every page of the batch is mapped young, as Linux maps the pages of an
        // anonymous large folio, so the accesses that follow find their bits set.
        let bits = PTE_ACCESSED | if write { PTE_DIRTY } else { 0 };
        let mut installed = 0;
        for (i, pfn) in pfns[..n].iter().enumerate() {
            rmap::set(mm, *pfn, self.id, va + (i as u64) * PAGE);
            let pte = leaf(*pfn, false).with(bits);
            match pt[idx + i].compare_exchange(0, pte.raw(), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => installed += 1,
                Err(_) => {
                    // A racing fault installed its own page here.
                    rmap::clear(mm, *pfn);
                    mm.free_owned_pages(*pfn, 0)
                        .expect("freeing our own unpublished page");
                }
            }
        }
        if installed > 0 {
            used(mm, pt_pfn).fetch_add(installed, Ordering::Relaxed);
            self.stats.add(Stat::Rss, installed as i64);
        }
        Ok(())
    }

    /// Linux's `do_huge_pmd_anonymous_page`: a cleared order-9 page under the PMD
    /// `slot`. False when no order-9 block could be had (the caller falls back to
    /// order 0); true when the PMD is now populated (by us or a racing fault).
    fn do_huge_pmd_anonymous_page(
        &self,
        vma: &Vma,
        slot: &AtomicU64,
        pmd_pfn: Pfn,
        addr: u64,
        write: bool,
        len: usize,
    ) -> bool {
        let mm = &self.mm;
        let Ok(pfn) = mm.alloc_owned_pages(Gfp::MOVABLE | Gfp::NOWARN, HPAGE_PMD_ORDER) else {
            return false;
        };
        let haddr = addr & !(PMD_SIZE - 1);
        let fault_index = ((addr - haddr) / PAGE) as usize;
        // A sparse first touch predicts sparse accesses at the same offset of the
        // other sub-pages: their lines are prefetched after a streaming clear.
        let hot = if len <= SPARSE_TOUCH_BYTES { len } else { 0 };
        let clear = ChunkedClear::new(huge_clear_strategy(mm.clear_strategy(), vma))
            .with_hot((addr % PAGE) as usize, hot);
        // SAFETY: the block is ours (just allocated, not yet mapped): 512 * 4096
        // writable bytes inside the arena that nothing else references; the yield
        // function touches nothing.
        unsafe {
            clear.clear_huge_page(
                mm.page_address(pfn),
                HPAGE_PMD_NR as usize,
                fault_index,
                &mut || {},
            )
        };
        rmap::set(mm, pfn, self.id, haddr);
        // Not split: no sub-page map count.
        desc(mm, Pfn::new(pfn.get() + 1))
            .private
            .store(0, Ordering::Relaxed);
        let pmd = leaf(pfn, true).with(PTE_ACCESSED | if write { PTE_DIRTY } else { 0 });
        match slot.compare_exchange(0, pmd.raw(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                used(mm, pmd_pfn).fetch_add(1, Ordering::Relaxed);
                self.stats.add(Stat::HugeFaults, 1);
                self.stats.add(Stat::HugePages, 1);
                self.stats.add(Stat::Rss, HPAGE_PMD_NR as i64);
            }
            Err(_) => {
                rmap::clear(mm, pfn);
                mm.free_owned_pages(pfn, HPAGE_PMD_ORDER)
                    .expect("freeing our own unpublished huge page");
            }
        }
        true
    }

    /// Runs `op(frame, done, n)` for each piece of `[addr, addr + len)` within one
    /// 4 KiB frame, under the shared VMA lock and the frame's page lock, faulting
    /// frames in as needed. Refuses (doing nothing) a range not entirely mapped.
    fn copy(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        mut op: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), Error> {
        not_in_page(addr)?;
        let end = check_range(addr, len as u64)?;
        let g = self.read_lock();
        let mut vma = match g.find_cached(addr) {
            Some(v) if end <= v.end || g.covers(v.end, end) => v,
            _ => return Err(bad(addr, len as u64, "range is not entirely mapped")),
        };
        let mut done = 0usize;
        while done < len {
            let a = addr + done as u64;
            if a >= vma.end {
                vma = g.find_cached(a).expect("range is covered");
            }
            let off = (a % PAGE) as usize;
            let n = (PAGE_SIZE - off).min(len - done);
            let t = self.access(&g, &vma, a, write, n)?;
            let _pl = self.page_lock(t.pfn);
            if !self.still_maps(&g, a, &t) {
                // Migrated (or being migrated) since the walk: walk again.
                continue;
            }
            // SAFETY: off < 4096, so the pointer stays inside the frame, which is
            // mapped and cannot be freed while we hold the shared VMA lock; its page
            // lock is held and the PTE still maps it, so no migration copies it now.
            let frame = unsafe { self.mm.page_address(t.pfn).add(off) };
            op(frame, done, n);
            done += n;
        }
        Ok(())
    }

    /// Linux's `do_munmap` with the VMA lock held exclusively.
    fn do_munmap(
        &self,
        g: &mut VmaTree,
        start: u64,
        end: u64,
        threads: usize,
    ) -> Result<(), Error> {
        // Split huge pages straddling an end first: the only step that can fail,
        // and it changes nothing visible.
        for b in [start, end] {
            if b & (PMD_SIZE - 1) != 0 && b < TASK_SIZE {
                self.split_huge_pmd(g, b)?;
            }
        }
        g.detach(start, end);
        self.nr_vmas.store(g.map.len() as u64, Ordering::Relaxed);
        let held: &VmaTree = g;
        if threads > 1 {
            self.zap_parallel(held, start, end, threads);
            self.free_pgtables(held, start, end);
        } else {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(held, start, end, FREE_UPPER, &mut tlb);
        }
        Ok(())
    }

    /// Linux's `free_pgtables` after a parallel zap: the same walk over the (now
    /// empty) range frees the PMD and PUD tables that became empty.
    fn free_pgtables(&self, held: &VmaTree, start: u64, end: u64) {
        let mut tlb = MmuGather::new(&self.mm);
        self.zap_range(held, start, end, FREE_UPPER, &mut tlb);
    }

    /// Zaps `[start, end)` in 2 MiB-aligned parts on `threads` scoped threads.
    fn zap_parallel(&self, held: &VmaTree, start: u64, end: u64, threads: usize) {
        let lo = start & !(PMD_SIZE - 1);
        let units = (end - lo).div_ceil(PMD_SIZE);
        let n = (threads as u64).min(units).max(1);
        let per = units.div_ceil(n) * PMD_SIZE;
        let parts: Vec<(u64, u64)> = (0..n)
            .map(|k| (start.max(lo + k * per), end.min(lo + (k + 1) * per)))
            .filter(|(s, e)| s < e)
            .collect();
        let zap = |s: u64, e: u64| {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(held, s, e, FREE_PTE_TABLES, &mut tlb);
        };
        std::thread::scope(|sc| {
            for &(s, e) in parts.iter().skip(1) {
                let spawned = std::thread::Builder::new()
                    .name("mmkit-zap".into())
                    .spawn_scoped(sc, move || zap(s, e));
                if spawned.is_err() {
                    zap(s, e);
                }
            }
            if let Some(&(s, e)) = parts.first() {
                zap(s, e);
            }
        });
    }

    /// Linux's `split_huge_pmd`: replaces the huge PMD covering `addr` (if any) by a
    /// PTE table mapping its 512 sub-pages. Exclusive VMA lock held.
    fn split_huge_pmd(&self, held: &VmaTree, addr: u64) -> Result<(), Error> {
        let Some((slot, e, 1)) = self.follow_pte(held, addr) else {
            return Ok(());
        };
        let mm = &self.mm;
        let pt = alloc_table(mm)?;
        let t = self.tbl(held, pt);
        let head = e.pfn();
        let haddr = addr & !(PMD_SIZE - 1);
        let bits = e.raw() & (PTE_WRITE | PTE_ACCESSED | PTE_DIRTY);
        for (i, s) in t.iter().enumerate() {
            let sub = Pfn::new(head.get() + i as u64);
            let mut p = leaf(sub, false).with(bits | PTE_COMPOUND);
            if e.is_numa_hint() {
                p = p.mk_numa_hint();
            }
            s.store(p.raw(), Ordering::Relaxed);
            if i > 0 {
                rmap::set(mm, sub, self.id, haddr + i as u64 * PAGE);
            }
        }
        used(mm, pt).store(HPAGE_PMD_NR, Ordering::Relaxed);
        desc(mm, Pfn::new(head.get() + 1))
            .private
            .store(HPAGE_PMD_NR, Ordering::Release);
        slot.store(Pte::table(pt).raw(), Ordering::Release);
        self.stats.add(Stat::PgTables, 1);
        self.stats.add(Stat::HugePages, -1);
        Ok(())
    }

    /// Linux's `unmap_page_range` + `free_pgtables`: clears every entry in
    /// `[start, end)`, gathers the pages, and frees table pages of levels up to
    /// `free_max` that became empty. Huge PMDs straddling an end must have been
    /// split. Exclusive VMA lock held (the parallel zap's threads run under the
    /// caller's guard on disjoint 2 MiB-aligned parts, with `free_max` 0).
    fn zap_range(
        &self,
        held: &VmaTree,
        start: u64,
        end: u64,
        free_max: u32,
        tlb: &mut MmuGather<'_>,
    ) {
        self.zap_level(held, self.pgd, 3, start, end, free_max, tlb);
    }

    /// One level of the walk (Linux's `zap_p4d_range` .. `zap_pte_range`): the
    /// entries of the level-`level` table at `table_pfn` that cover `[start, end)`.
    #[allow(clippy::too_many_arguments)]
    fn zap_level(
        &self,
        held: &VmaTree,
        table_pfn: Pfn,
        level: u32,
        start: u64,
        end: u64,
        free_max: u32,
        tlb: &mut MmuGather<'_>,
    ) {
        let t = self.tbl(held, table_pfn);
        if level == 0 {
            self.zap_pte_range(t, table_pfn, start, end, tlb);
            return;
        }
        let shift = level_shift(level);
        let mut addr = start;
        while addr < end {
            let next = (((addr >> shift) + 1) << shift).min(end);
            let slot = &t[pt_index(addr, level)];
            let e = Pte::from_raw(slot.load(Ordering::Acquire));
            if e.is_none() {
                addr = next;
                continue;
            }
            if level == 1 && e.is_huge() {
                if addr & (PMD_SIZE - 1) == 0 && next - addr == PMD_SIZE {
                    self.zap_huge_pmd(slot, table_pfn, tlb);
                } else {
                    debug_assert!(false, "huge PMD straddling a zap boundary was not split");
                }
            } else if e.is_present() {
                let child = e.pfn();
                self.zap_level(held, child, level - 1, addr, next, free_max, tlb);
                if level - 1 <= free_max && used(&self.mm, child).load(Ordering::Relaxed) == 0 {
                    slot.store(0, Ordering::Release);
                    used(&self.mm, table_pfn).fetch_sub(1, Ordering::Relaxed);
                    tlb.remove_table(child);
                    self.stats.add(Stat::PgTables, -1);
                }
            }
            addr = next;
        }
    }

    /// Linux's `zap_pte_range`: clears the entries of the PTE table `t` (at
    /// `table_pfn`) that cover `[start, end)`, drops their reverse maps and gathers
    /// their pages (a split huge page with its last mapped sub-page). The table's
    /// used count and the RSS counter are updated once for the whole range. Under
    /// the exclusive VMA lock nothing else writes these entries (the parallel
    /// zap's threads own disjoint tables), so each is read and then cleared by a
    /// plain atomic store, without a locked read-modify-write.
    fn zap_pte_range(
        &self,
        t: &Table,
        table_pfn: Pfn,
        start: u64,
        end: u64,
        tlb: &mut MmuGather<'_>,
    ) {
        let mm = &self.mm;
        debug_assert!(start < end && (end - 1) / PMD_SIZE == start / PMD_SIZE);
        let first = pt_index(start, 0);
        let last = pt_index(end - 1, 0) + 1;
        let (mut cleared, mut rss) = (0u64, 0i64);
        for slot in &t[first..last] {
            let e = Pte::from_raw(slot.load(Ordering::Relaxed));
            if e.is_none() {
                continue;
            }
            slot.store(0, Ordering::Relaxed);
            cleared += 1;
            if !e.maps_page() {
                // A swap entry: freeing the swap slot comes with swap.
                continue;
            }
            let pfn = e.pfn();
            rmap::clear(mm, pfn);
            rss += 1;
            if e.is_compound() {
                let head = Pfn::new(pfn.get() & !(HPAGE_PMD_NR - 1));
                let mapcount = &desc(mm, Pfn::new(head.get() + 1)).private;
                if mapcount.fetch_sub(1, Ordering::AcqRel) == 1 {
                    tlb.remove_page(head, HPAGE_PMD_ORDER);
                }
            } else {
                tlb.remove_page(pfn, 0);
            }
        }
        if cleared > 0 {
            used(mm, table_pfn).fetch_sub(cleared, Ordering::Relaxed);
        }
        if rss > 0 {
            self.stats.add(Stat::Rss, -rss);
        }
    }

    /// Linux's `zap_huge_pmd`.
    fn zap_huge_pmd(&self, slot: &AtomicU64, table_pfn: Pfn, tlb: &mut MmuGather<'_>) {
        let mm = &self.mm;
        let e = Pte::from_raw(slot.swap(0, Ordering::AcqRel));
        used(mm, table_pfn).fetch_sub(1, Ordering::Relaxed);
        let head = e.pfn();
        rmap::clear(mm, head);
        self.stats.add(Stat::Rss, -(HPAGE_PMD_NR as i64));
        self.stats.add(Stat::HugePages, -1);
        tlb.remove_page(head, HPAGE_PMD_ORDER);
    }
}

impl Space {
    /// Linux's `change_prot_numa`: turns the present leaves mapping
    /// `[addr, addr + len)` into NUMA-hinting entries, so that the next access of
    /// each faults (and, for now, simply restores it). Returns the entries changed.
    /// For the NUMA balancing scanner; needs only the shared VMA lock.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn change_prot_numa(&self, addr: u64, len: u64) -> u64 {
        let Some(end) = addr.checked_add(len).filter(|e| *e <= TASK_SIZE) else {
            return 0;
        };
        let inner = &self.inner;
        let g = inner.read_lock();
        let mut changed = 0;
        let mut a = addr & !(PAGE - 1);
        while a < end {
            let mut step = PAGE;
            if let Some((slot, e, level)) = inner.follow_pte(&g, a) {
                if level == 1 {
                    step = (a & !(PMD_SIZE - 1)) + PMD_SIZE - a;
                }
                if e.is_present()
                    && slot
                        .compare_exchange(
                            e.raw(),
                            e.mk_numa_hint().raw(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                {
                    changed += 1;
                }
            }
            a += step;
        }
        changed
    }
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

/// A present, writable leaf for a frame of the arena (pfns fit in 32 bits).
#[inline]
fn leaf(pfn: Pfn, huge: bool) -> Pte {
    Pte::page(pfn, huge).expect("arena pfns fit in the PTE's 40-bit pfn field")
}

impl Drop for SpaceInner {
    fn drop(&mut self) {
        // No other reference exists: no walker, no lock needed.
        let held = std::mem::take(self.vmas.get_mut().unwrap_or_else(|e| e.into_inner()));
        {
            let mut tlb = MmuGather::new(&self.mm);
            self.zap_range(&held, 0, TASK_SIZE, FREE_UPPER, &mut tlb);
            tlb.remove_table(self.pgd);
        }
        rmap::release_id(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgtable::SwapEntry;

    /// Fault-around off: these tests place entries page by page.
    fn mm() -> Mm {
        Mm::builder()
            .memory(32 << 20)
            .fault_around(1)
            .build()
            .unwrap()
    }

    /// The per-thread walk cache never outlives an unmap, and never serves one
    /// space's tables to another (both spaces map the same addresses).
    #[test]
    fn walk_cache_follows_unmap_and_other_spaces() {
        let mm = mm();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        {
            let s1 = mm.new_space().unwrap();
            let s2 = mm.new_space().unwrap();
            let a = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
            s1.write(a + PAGE, &[1]).unwrap();
            s1.touch(a + 2 * PAGE, true).unwrap();
            s1.munmap(a, 4 << 20).unwrap();
            assert_eq!(s1.stats().pgtable_pages, 1, "tables freed with the range");
            let b = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
            assert_eq!(a, b, "the same range again, under new tables");
            let mut byte = [9u8];
            s1.read(b + PAGE, &mut byte).unwrap();
            assert_eq!(byte, [0], "a new mapping reads zero");
            s1.write(b + PAGE, &[2]).unwrap();
            let c = s2.mmap(4 << 20, MapFlags::empty()).unwrap();
            assert_eq!(c, a, "each space starts at MMAP_BASE");
            s2.write(c + PAGE, &[3]).unwrap();
            s1.read(b + PAGE, &mut byte).unwrap();
            assert_eq!(byte, [2]);
            s2.read(c + PAGE, &mut byte).unwrap();
            assert_eq!(byte, [3]);
            assert_ne!(
                s1.translate(b + PAGE).unwrap().pfn,
                s2.translate(c + PAGE).unwrap().pfn
            );
            assert_eq!(s1.stats().rss_pages, 1);
            assert_eq!(s2.stats().rss_pages, 1);
            // Another thread unmaps the range this thread has cached.
            std::thread::scope(|sc| {
                sc.spawn(|| s1.munmap(b, 4 << 20).unwrap());
            });
            assert!(s1.touch(b + PAGE, true).is_err());
            drop(s2);
            let d = s1.mmap(4 << 20, MapFlags::empty()).unwrap();
            s1.touch(d + PAGE, false).unwrap();
            assert_eq!(s1.stats().rss_pages, 1);
        }
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
        mm.check().unwrap();
    }

    #[test]
    fn numa_hint_faults_restore_the_entry() {
        let mm = mm();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        {
            let s = mm.new_space().unwrap();
            let a = s.mmap(4 << 20, MapFlags::HUGE).unwrap();
            let b = s.mmap(4 * PAGE_SIZE, MapFlags::empty()).unwrap();
            s.write(a + 5, &[1, 2, 3]).unwrap();
            s.write(b + 4093, &[4, 5, 6, 7, 8, 9]).unwrap();
            assert_eq!(s.change_prot_numa(a, 4 << 20), 1); // one huge PMD
            assert_eq!(s.change_prot_numa(b, 4 * PAGE), 2);
            assert!(s.translate(a).unwrap().numa_hint);
            assert!(s.translate(b + PAGE).unwrap().numa_hint);
            let rss = s.stats().rss_pages;
            let mut buf = [0u8; 6];
            s.read(b + 4093, &mut buf).unwrap();
            assert_eq!(buf, [4, 5, 6, 7, 8, 9]);
            s.read(a + 5, &mut buf[..3]).unwrap();
            assert_eq!(buf[..3], [1, 2, 3]);
            for at in [a, b, b + PAGE] {
                let t = s.translate(at).unwrap();
                assert!(!t.numa_hint, "{t:?}");
            }
            assert_eq!(
                s.stats().rss_pages,
                rss,
                "a hinting fault allocates nothing"
            );
            // Hinting entries are still mapped pages: split and unmap them cleanly.
            s.change_prot_numa(a, 4 << 20);
            s.munmap(a + (1 << 20), 1 << 20).unwrap();
            let t = s.translate(a + 5).unwrap();
            assert!(t.numa_hint && t.order == 9 && !t.huge, "{t:?}");
            s.read(a + 5, &mut buf[..3]).unwrap();
            assert_eq!(buf[..3], [1, 2, 3]);
        }
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
        mm.check().unwrap();
    }

    #[test]
    fn swap_entries_fault_with_an_error_and_unmap() {
        let mm = mm();
        mm.drain_all_pages();
        let before = mm.nr_free_pages();
        {
            let s = mm.new_space().unwrap();
            let a = s.mmap(2 * PAGE_SIZE, MapFlags::empty()).unwrap();
            s.touch(a, true).unwrap();
            let swp = a + PAGE;
            {
                let inner = &s.inner;
                let g = inner.read_lock();
                let (slot, e, level) = inner.follow_pte(&g, swp).unwrap();
                assert!(e.is_none() && level == 0);
                let entry = Pte::swap(SwapEntry::new(1, 42).unwrap());
                slot.store(entry.raw(), Ordering::Release);
                // Account for the entry in the PTE table holding it.
                let mut t = inner.pgd;
                for level in [3, 2, 1] {
                    t = Pte::from_raw(
                        inner.tbl(&g, t)[pt_index(swp, level)].load(Ordering::Acquire),
                    )
                    .pfn();
                }
                used(&mm, t).fetch_add(1, Ordering::Relaxed);
            }
            assert!(matches!(s.touch(swp, false), Err(Error::Fault { .. })));
            assert!(s.translate(swp).is_none());
            s.munmap(a, 2 * PAGE_SIZE).unwrap();
            assert_eq!(s.stats().pgtable_pages, 1);
        }
        mm.drain_all_pages();
        assert_eq!(mm.nr_free_pages(), before);
        mm.check().unwrap();
    }
}
