//! Memory cgroups (Linux's cgroup v2 memory controller, `mm/memcontrol.c`, for
//! anonymous memory and swap): a tree of groups under each [`Mm`], whose root
//! (the `Mm` itself) is never limited; each address space belongs to one group
//! (`Mm::new_space_in`), and its pages and swap slots are charged to it.
//!
//! - `mod.rs` (this file): the [`MemCgroup`] handle, the group table of an
//!   `Mm` (ids, the owner of every page frame), creating and removing groups,
//!   the limits' setters.
//! - `charge.rs`: charging (`try_charge` with the per-CPU stock, `max` and
//!   `high` handling), uncharging, swap charging per slot.
//! - `reclaim.rs`: the reclaim walk over the groups of a node
//!   (`shrink_node_memcgs`: effective protection, the low pass, scanning in
//!   proportion to each group's excess).
//! - `stat.rs`: `memory.stat`, `memory.events`, pressure (PSI) and the text view.
//!
//! The page counter itself (usage, limits, effective protection) is the core's
//! [`mmkit_core::page_counter`].
//!
//! Invariants:
//! - a page frame's owner (`MemCgTable::owner`, by pfn; 0 = the root) is set
//!   before the page is published in a page table and cleared when its
//!   mapping goes (the unmap's free batch, reclaim's unmap); the group's
//!   counter holds exactly the pages whose owner is the group, plus the pages
//!   the per-CPU stocks hold for it (a huge page counts 512 under its head);
//! - a swap slot's owner is set when the slot is allocated for a page of the
//!   group (and the group's swap counter charged) and cleared when the slot
//!   is freed;
//! - a group outlives every page and slot charged to it: its spaces hold it
//!   (an `Arc`), and a space's pages and slots are uncharged when it unmaps
//!   them, at the latest when it is dropped; a child holds its parent;
//! - ids are unique among the live groups of an `Mm`, 1..=`MAX_GROUPS`, reused
//!   after the group is gone.
//!
//! Locking: the group table is a reader-writer lock (read to turn an id into
//! a counted reference; written to add or release an id); the fast paths
//! (uncharge batches, the stock's evictions and drains) turn an id into a
//! group through the lock-free pointer table instead, under the rules of
//! `owning_group`; the per-CPU charge stock is lock-free (`stock.rs`); the
//! counters are atomics. No other mm lock is taken under the table's. Limit
//! and `high` reclaim run in the charging thread with none of these held.

mod charge;
mod reclaim;
mod stat;
mod stock;

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use mmkit_core::page_counter::{PageCounter, PAGE_COUNTER_MAX};
use parking_lot::RwLock;

pub use stat::{MemCgEvents, MemCgStat, Pressure};

pub(crate) use charge::{
    check, move_swap_charge, try_charge, try_charge_swap, uncharge_batch, uncharge_swap,
    UnchargeGather,
};
pub(crate) use reclaim::shrink_node_memcgs;
use stat::GroupStats;
pub(crate) use stat::{Event, Stall};

use crate::{Error, Mm, PAGE_SIZE};

/// Most memory cgroups alive in one `Mm` (ids fit the per-frame owner).
pub const MAX_GROUPS: u32 = u16::MAX as u32;

/// The memory cgroups of one `Mm`: ids, the owner of every frame, the root's
/// counters and the per-CPU charge stocks.
pub(crate) struct MemCgTable {
    /// By id (index 0 unused: the root has no `MemCgInner`).
    groups: RwLock<Slots>,
    /// (A) By id: the live group, for the fast paths that act on a frame it
    /// owns (`owning_group`); set when the group is made, cleared when it is
    /// freed.
    ptrs: Box<[AtomicPtr<MemCgInner>]>,
    /// Set once the first group is made: until then the unmap and reclaim
    /// paths skip the owner array entirely.
    in_use: AtomicBool,
    /// (A) Per frame: the id of the group charged for the block it heads
    /// (0: the root, uncharged).
    owner: Box<[AtomicU16]>,
    /// The root's counters: every child's charges add up here.
    pub(crate) root_memory: PageCounter,
    pub(crate) root_swap: PageCounter,
    /// Per CPU: pages charged ahead for a few groups (Linux's `memcg_stock`).
    stocks: stock::Stocks,
    /// Per node: where the next reclaim walk over the groups starts (Linux's
    /// `mem_cgroup_reclaim_cookie` position).
    cursors: Box<[CachePadded<std::sync::atomic::AtomicUsize>]>,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Option<Weak<MemCgInner>>>,
    free: Vec<u16>,
}

impl MemCgTable {
    pub(crate) fn new(nr_pages: u64, nr_nodes: usize, nr_cpus: usize) -> MemCgTable {
        MemCgTable {
            groups: RwLock::new(Slots {
                slots: vec![None],
                free: Vec::new(),
            }),
            in_use: AtomicBool::new(false),
            ptrs: (0..=MAX_GROUPS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            owner: (0..nr_pages).map(|_| AtomicU16::new(0)).collect(),
            root_memory: PageCounter::new_root(true),
            root_swap: PageCounter::new_root(false),
            stocks: stock::Stocks::new(nr_cpus),
            cursors: (0..nr_nodes.max(1))
                .map(|_| CachePadded::new(Default::default()))
                .collect(),
        }
    }

    /// Whether any group was ever made.
    #[inline]
    pub(crate) fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The live group with this id.
    pub(crate) fn get(&self, id: u16) -> Option<Arc<MemCgInner>> {
        self.groups
            .read()
            .slots
            .get(id as usize)?
            .as_ref()?
            .upgrade()
    }

    /// The group with id `id`, without a lock or a reference count.
    ///
    /// # Safety
    /// The group must stay alive while the reference is used: the caller acts
    /// on a frame the group owns (charged pages keep their group's spaces,
    /// and so the group, alive until they are uncharged), or holds pages it
    /// took from a stock slot of the group (a dying group waits for such
    /// takes before it is freed: `stock.rs`).
    #[inline]
    pub(crate) unsafe fn owning_group(&self, id: u16) -> Option<&MemCgInner> {
        let p = self.ptrs[id as usize].load(Ordering::Acquire);
        // SAFETY: non-null only between the group's creation and the end of
        // its drop (cleared after its stock drain), and the caller guarantees
        // the group is not freed meanwhile (see above).
        unsafe { p.as_ref() }
    }

    /// Every live group (for views and the reclaim walk), by id.
    pub(crate) fn all(&self) -> Vec<Arc<MemCgInner>> {
        self.groups
            .read()
            .slots
            .iter()
            .flatten()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The owner id of the block headed by `pfn`.
    #[inline]
    pub(crate) fn owner(&self, pfn: u64) -> u16 {
        self.owner[pfn as usize].load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn set_owner(&self, pfn: u64, id: u16) {
        self.owner[pfn as usize].store(id, Ordering::Relaxed);
    }

    /// Clears and returns the owner of `pfn`, whose last mapping is going
    /// (the unmap's or reclaim's free batch, a lost fault race, migration's
    /// source): no one else writes its owner meanwhile, so a load and a
    /// store do, without a locked exchange per page.
    #[inline]
    pub(crate) fn take_owner(&self, pfn: u64) -> u16 {
        let o = &self.owner[pfn as usize];
        let id = o.load(Ordering::Relaxed);
        if id != 0 {
            o.store(0, Ordering::Relaxed);
        }
        id
    }
}

/// One memory cgroup (Linux's `struct mem_cgroup`).
pub(crate) struct MemCgInner {
    pub(crate) id: u16,
    pub(crate) mm: Mm,
    parent: Option<Arc<MemCgInner>>,
    /// `memory.current` / `max` / `high` / `low` / `min`.
    pub(crate) memory: PageCounter,
    /// `memory.swap.current` / `swap.max`.
    pub(crate) swap: PageCounter,
    /// Live spaces of this group.
    nr_spaces: AtomicU64,
    /// Live child groups.
    nr_children: AtomicU64,
    removed: AtomicBool,
    pub(crate) stats: GroupStats,
    /// Its LRU lists on every node (`lru.rs`).
    pub(crate) lruvec: crate::lru::Lruvec,
}

/// A memory cgroup of an [`Mm`]: a handle, cheap to clone. Dropping the last
/// handle of a group without spaces or children removes it; a group with
/// either lives on until they are gone (they hold it).
///
/// Values are in bytes and rounded down to whole pages, as Linux's
/// `page_counter_memparse` does; `u64::MAX` is "no limit" (Linux's `max`).
#[derive(Clone)]
pub struct MemCgroup {
    pub(crate) inner: Arc<MemCgInner>,
}

impl std::fmt::Debug for MemCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemCgroup")
            .field("id", &self.inner.id)
            .field("current", &self.current())
            .field("max", &self.inner.memory.max())
            .finish()
    }
}

/// Bytes to pages, rounded down (`u64::MAX` stays "no limit").
fn to_pages(bytes: u64) -> u64 {
    if bytes == u64::MAX {
        PAGE_COUNTER_MAX
    } else {
        (bytes / PAGE_SIZE as u64).min(PAGE_COUNTER_MAX)
    }
}

/// Pages to bytes ("no limit" is `u64::MAX`).
fn to_bytes(pages: u64) -> u64 {
    if pages >= PAGE_COUNTER_MAX {
        u64::MAX
    } else {
        pages * PAGE_SIZE as u64
    }
}

/// Reclaims up to `nr` pages from `g`'s subtree in the calling thread (limit,
/// `high` and proactive reclaim: Linux's `try_to_free_mem_cgroup_pages`).
pub(crate) fn reclaim_pages(g: &MemCgInner, nr: u64) -> u64 {
    reclaim::try_to_free_mem_cgroup_pages(&g.mm, g, nr)
}

impl Mm {
    pub(crate) fn memcg(&self) -> &MemCgTable {
        &self.inner.memcg
    }

    /// A new memory cgroup, a child of the root (`mkdir` under
    /// `/sys/fs/cgroup`), with no limits and no protection.
    pub fn new_group(&self) -> Result<MemCgroup, Error> {
        MemCgInner::create(self, None)
    }

    /// A new address space in group `g`: its pages and swap slots are
    /// charged to `g`. Refused for a group of another `Mm` or a removed one.
    pub fn new_space_in(&self, g: &MemCgroup) -> Result<crate::Space, Error> {
        let inner = &g.inner;
        if !Arc::ptr_eq(&inner.mm.inner, &self.inner) {
            return Err(Error::ForeignGroup {
                group: inner.id.into(),
            });
        }
        inner.check_live()?;
        self.new_space_charged(Some(inner.clone()))
    }

    /// `memory.current` of the root: every page mapped by a space of this Mm
    /// (the root is never charged; this adds up what its children hold and
    /// what the root's own spaces map).
    pub fn root_current(&self) -> u64 {
        let own: u64 = self
            .spaces()
            .all()
            .iter()
            .filter(|s| s.inner().memcg().is_none())
            .map(|s| s.stats().rss_pages)
            .sum();
        (own + self.memcg().root_memory.usage()) * PAGE_SIZE as u64
    }
}

impl MemCgInner {
    fn create(mm: &Mm, parent: Option<&Arc<MemCgInner>>) -> Result<MemCgroup, Error> {
        let table = mm.memcg();
        let (pmem, pswap) = match parent {
            Some(p) => (&p.memory, &p.swap),
            None => (&table.root_memory, &table.root_swap),
        };
        let mut slots = table.groups.write();
        let id = match slots.free.pop() {
            Some(id) => id,
            None => {
                let id = slots.slots.len();
                if id > MAX_GROUPS as usize {
                    return Err(Error::TooManyGroups { max: MAX_GROUPS });
                }
                slots.slots.push(None);
                id as u16
            }
        };
        // SAFETY: the parent counters outlive these: a child holds its parent
        // group (an `Arc`, dropped after the child's counters), and the
        // root's counters live in the `MmInner` that `mm` (a clone, held by
        // the group) keeps alive; neither moves (both are behind an `Arc`).
        let (memory, swap) = unsafe {
            (
                PageCounter::new_child(pmem, true),
                PageCounter::new_child(pswap, false),
            )
        };
        let inner = Arc::new(MemCgInner {
            id,
            mm: mm.clone(),
            parent: parent.cloned(),
            memory,
            swap,
            nr_spaces: AtomicU64::new(0),
            nr_children: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            stats: GroupStats::new(mm.config().nr_cpus),
            lruvec: mm.lru().new_lruvec(),
        });
        slots.slots[id as usize] = Some(Arc::downgrade(&inner));
        table.ptrs[id as usize].store(Arc::as_ptr(&inner).cast_mut(), Ordering::Release);
        drop(slots);
        if let Some(p) = parent {
            p.nr_children.fetch_add(1, Ordering::Relaxed);
        }
        table.in_use.store(true, Ordering::Relaxed);
        Ok(MemCgroup { inner })
    }

    fn check_live(&self) -> Result<(), Error> {
        if self.removed.load(Ordering::Acquire) {
            return Err(Error::GroupRemoved {
                group: self.id.into(),
            });
        }
        Ok(())
    }

    /// The parent group (`None`: the root).
    pub(crate) fn parent(&self) -> Option<&Arc<MemCgInner>> {
        self.parent.as_ref()
    }

    /// Whether `self` is `ancestor` or below it.
    pub(crate) fn is_descendant(&self, ancestor: &MemCgInner) -> bool {
        let mut g = Some(self);
        while let Some(x) = g {
            if std::ptr::eq(x, ancestor) {
                return true;
            }
            g = x.parent.as_deref();
        }
        false
    }

    /// A space of this group was made (`new_space_in`).
    pub(crate) fn space_added(&self) {
        self.nr_spaces.fetch_add(1, Ordering::Relaxed);
    }

    /// A space of this group is gone (its pages are uncharged), after
    /// `faults` faults (kept for `memory.stat`'s pgfault).
    pub(crate) fn space_gone(&self, faults: u64) {
        self.stats.add(Event::PgFault, faults);
        self.nr_spaces.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for MemCgInner {
    fn drop(&mut self) {
        let table = self.mm.memcg();
        // Pages held ahead for it go back before its counter does.
        charge::drain_stock_of(table, self);
        debug_assert_eq!(self.memory.usage(), 0, "group freed with pages charged");
        // Protection it published leaves its parent's sums.
        self.memory.set_min(0);
        self.memory.set_low(0);
        // Slots still charged to it (held by the swap cache after its
        // spaces went: a page being written, one read ahead) leave the
        // ancestors' counts now, and its id is not reused, so that their
        // later free finds no group (Linux keeps such a memcg as a dying
        // one until its last reference goes).
        let swapped = self.swap.usage();
        self.swap.uncharge(swapped);
        let mut slots = table.groups.write();
        slots.slots[self.id as usize] = None;
        table.ptrs[self.id as usize].store(std::ptr::null_mut(), Ordering::Release);
        if swapped == 0 {
            slots.free.push(self.id);
        }
        drop(slots);
        if let Some(p) = &self.parent {
            p.nr_children.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl MemCgroup {
    /// The group's id, unique among the live groups of its `Mm`.
    pub fn id(&self) -> u32 {
        self.inner.id.into()
    }

    /// A new child group (`mkdir` below this one).
    pub fn new_child(&self) -> Result<MemCgroup, Error> {
        self.inner.check_live()?;
        MemCgInner::create(&self.inner.mm, Some(&self.inner))
    }

    /// Removes the group (`rmdir`): refused while it has live spaces or
    /// children. Afterwards it takes no new settings, spaces or children; it
    /// is freed when its last handle goes.
    pub fn remove(&self) -> Result<(), Error> {
        let g = &self.inner;
        g.check_live()?;
        let spaces = g.nr_spaces.load(Ordering::Acquire);
        let children = g.nr_children.load(Ordering::Acquire);
        if spaces > 0 || children > 0 {
            return Err(Error::GroupBusy {
                group: g.id.into(),
                spaces,
                children,
            });
        }
        g.removed.store(true, Ordering::Release);
        Ok(())
    }

    /// `memory.max`: charging over it reclaims from the group in the faulting
    /// thread, then fails with `NoMemory`. Lowering it below the usage
    /// reclaims toward it (Linux's `memory_max_write`); if reclaim cannot get
    /// there, `Err(LimitBelowUsage)` and the old limit stays (Linux would OOM
    /// kill; a library has no task to kill).
    pub fn set_max(&self, bytes: u64) -> Result<(), Error> {
        self.inner.check_live()?;
        charge::set_max(&self.inner, to_pages(bytes), bytes)
    }

    /// `memory.high`: above it the charging thread reclaims from the group
    /// and is throttled a bounded time; it never fails a charge. Setting it
    /// does not reclaim by itself.
    pub fn set_high(&self, bytes: u64) -> Result<(), Error> {
        self.inner.check_live()?;
        self.inner.memory.set_high(to_pages(bytes));
        Ok(())
    }

    /// `memory.low`: best-effort protection (see `docs/architecture.md`).
    pub fn set_low(&self, bytes: u64) -> Result<(), Error> {
        self.inner.check_live()?;
        self.inner.memory.set_low(to_pages(bytes));
        Ok(())
    }

    /// `memory.min`: hard protection; reclaim never takes a group's pages
    /// below its effective `min`.
    pub fn set_min(&self, bytes: u64) -> Result<(), Error> {
        self.inner.check_live()?;
        self.inner.memory.set_min(to_pages(bytes));
        Ok(())
    }

    /// `memory.swap.max`: at the limit the group's pages stay resident. Below
    /// the current swap usage it is refused (`LimitBelowUsage`): swap usage
    /// drains only as pages are swapped in or unmapped.
    pub fn set_swap_max(&self, bytes: u64) -> Result<(), Error> {
        let g = &self.inner;
        g.check_live()?;
        g.swap
            .set_max(to_pages(bytes))
            .map_err(|usage| Error::LimitBelowUsage {
                group: g.id.into(),
                what: "memory.swap.max",
                bytes,
                usage: to_bytes(usage),
            })
    }

    /// `memory.current`: bytes charged (pages of its spaces and of its
    /// descendants', plus what the per-CPU stocks hold for them).
    pub fn current(&self) -> u64 {
        to_bytes(self.inner.memory.usage())
    }

    /// `memory.swap.current`: bytes of swap slots charged.
    pub fn swap_current(&self) -> u64 {
        to_bytes(self.inner.swap.usage())
    }

    /// `memory.peak`: the highest `current` seen.
    pub fn peak(&self) -> u64 {
        to_bytes(self.inner.memory.watermark())
    }

    /// The limits and protections as set: (max, high, low, min, swap.max),
    /// bytes, `u64::MAX` for "max".
    pub fn limits(&self) -> (u64, u64, u64, u64, u64) {
        let m = &self.inner.memory;
        (
            to_bytes(m.max()),
            to_bytes(m.high()),
            to_bytes(m.low()),
            to_bytes(m.min()),
            to_bytes(self.inner.swap.max()),
        )
    }

    /// `memory.reclaim`: reclaims up to `bytes` from the group now (its pages
    /// and its descendants'); returns the bytes reclaimed. Refused for less
    /// than one page.
    pub fn reclaim(&self, bytes: u64) -> Result<u64, Error> {
        let g = &self.inner;
        g.check_live()?;
        let pages = bytes / PAGE_SIZE as u64;
        if pages == 0 {
            return Err(Error::BadGroupValue {
                group: g.id.into(),
                what: "memory.reclaim",
                bytes,
                reason: "less than one page: ask for at least 4096 bytes",
            });
        }
        Ok(charge::reclaim(g, pages) * PAGE_SIZE as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Linux's `memory.high` penalty for a 64-page charge, high = 100M:
    /// 101M 6 ms (under the 10 ms floor: not slept), 105M 159 ms, 110M 639 ms,
    /// 118M and above the 2 s cap (mm/memcontrol.c's table).
    #[test]
    fn high_penalty_follows_linux() {
        let mm = crate::space::tests::mm();
        let g = mm.new_group().unwrap();
        let mb = 256;
        g.set_high(100 << 20).unwrap();
        let at = |usage_mb: u64| {
            g.inner.memory.charge(usage_mb * mb);
            let d = charge::penalty(&g.inner, charge::CHARGE_BATCH);
            g.inner.memory.uncharge(usage_mb * mb);
            d.as_millis() as u64
        };
        assert_eq!(at(101), 0);
        assert!((155..=165).contains(&at(105)), "{}", at(105));
        assert!((630..=650).contains(&at(110)), "{}", at(110));
        assert_eq!(at(118), 2000);
        assert_eq!(at(200), charge::MAX_HIGH_DELAY.as_millis() as u64);
        assert_eq!(charge::penalty(&g.inner, 0), Duration::ZERO);
    }
}
