//! Charging and uncharging (Linux's `try_charge_memcg`, `consume_stock` /
//! `refill_stock`, `mem_cgroup_handle_over_high`, `uncharge_batch`,
//! `__mem_cgroup_try_charge_swap` / `__mem_cgroup_uncharge_swap`).
//!
//! The fault path charges a group before it publishes its pages; a charge is
//! served from this CPU's stock when the stock holds enough pages for the
//! group, and otherwise charges a batch of [`CHARGE_BATCH`] pages up the
//! tree and keeps the rest in the stock. Over `max`: the stocks are drained
//! once, then the group over its limit is reclaimed in the charging thread
//! (up to [`MAX_RECLAIM_RETRIES`] rounds) and the charge fails with
//! `NoMemory` (`events.max`, then `events.oom`). Over `high` after a
//! successful charge: the charging thread reclaims from every ancestor over
//! its `high` (`events.high`) while that progresses, then sleeps Linux's
//! penalty, at most [`MAX_HIGH_DELAY`]. Under global pressure, a charge of
//! a group above its protection then reclaims from the group itself
//! (allocator-paid reclaim: `reclaim.rs`).
//!
//! Invariants: what a stock holds is charged to its group and counted in its
//! `current` (so `current` >= the pages whose owner is the group); a charge
//! never leaves `current` above `max` (the counter's compare-and-swap); an
//! uncharge takes exactly what the matching charge added (a huge page 512).
//!
//! Locking: none on the charge path: the stock is lock-free (`stock.rs`),
//! the counters are atomics; reclaim and the throttle sleep run with no
//! memcg lock held.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mmkit_core::page_counter::PageCounter;
use mmkit_core::Platform;

use super::stat::{Event, Stall};
use super::stock::{Refilled, Taken};
use super::{to_bytes, MemCgInner, MemCgTable};
use crate::vmscan::SWAP_CLUSTER_MAX;
use crate::{Error, Mm, Pfn, StdPlatform};

/// Pages charged at once ahead of need (Linux's `MEMCG_CHARGE_BATCH`).
pub(crate) const CHARGE_BATCH: u64 = 64;
/// Reclaim rounds before a charge over `max` fails (`MAX_RECLAIM_RETRIES`).
pub(crate) const MAX_RECLAIM_RETRIES: usize = 16;
/// Longest `high` throttle per charge (Linux's `MEMCG_MAX_HIGH_DELAY_JIFFIES`).
pub(crate) const MAX_HIGH_DELAY: Duration = Duration::from_secs(2);

/// Linux's `consume_stock`: takes `nr` pages charged ahead for `g` on this CPU.
#[inline]
fn consume_stock(table: &MemCgTable, g: &MemCgInner, nr: u64) -> bool {
    nr <= CHARGE_BATCH && table.stocks.consume(StdPlatform::cpu_id(), g.id, nr)
}

/// Linux's `refill_stock`: keeps `nr` charged pages of `g` on this CPU; a
/// slot over [`CHARGE_BATCH`] gives its pages back, and a full stock evicts
/// a slot (uncharged).
fn refill_stock(table: &MemCgTable, g: &MemCgInner, nr: u64) {
    match table
        .stocks
        .refill(StdPlatform::cpu_id(), g.id, nr, CHARGE_BATCH)
    {
        Refilled::Kept => {}
        Refilled::Overflow(n) => g.memory.uncharge(n),
        Refilled::Evicted(t) => {
            uncharge_taken(table, &t);
        }
    }
}

/// Uncharges pages taken out of the stocks by id (under the take: see
/// `stock.rs`), without the group table's lock or a reference.
fn uncharge_taken(table: &MemCgTable, t: &Taken<'_>) -> u64 {
    let mut n = 0;
    for &(id, pages) in &t.pages {
        // SAFETY: a slot held pages of group `id`, so the group was alive
        // when the take emptied it, and a dying group waits for every take
        // to end (`Stocks::wait_takers` in its drop) before it is freed.
        match unsafe { table.owning_group(id) } {
            Some(x) => {
                x.memory.uncharge(pages);
                n += pages;
            }
            None => debug_assert!(false, "stocked pages of a freed group {id}"),
        }
    }
    n
}

/// Gives back every CPU's stocked pages (Linux's `drain_all_stock` for `g`,
/// which here drains the other groups' slots too); returns the pages of `g`
/// and its descendants uncharged.
pub(crate) fn drain_all_stock(table: &MemCgTable, g: &MemCgInner) -> u64 {
    let t = table.stocks.take_all();
    let mut freed = 0;
    for &(id, pages) in &t.pages {
        // SAFETY: as in `uncharge_taken`.
        if let Some(x) = unsafe { table.owning_group(id) } {
            if x.is_descendant(g) {
                freed += pages;
            }
        }
    }
    uncharge_taken(table, &t);
    freed
}

/// Gives back the stocked pages of a group being freed (`&mut`: no handle is
/// left, so no charge for it can race), then waits for any thread that took
/// a slot of it to finish uncharging it.
pub(super) fn drain_stock_of(table: &MemCgTable, g: &MemCgInner) {
    g.memory.uncharge(table.stocks.drain_id(g.id));
    table.stocks.wait_takers();
}

/// Pages the stocks hold for `g` now (a snapshot).
pub(super) fn stocked(table: &MemCgTable, g: &MemCgInner) -> u64 {
    table.stocks.stocked(g.id)
}

/// The group whose counter is `c`, among `g` and its ancestors.
fn group_of<'a>(g: &'a MemCgInner, c: &PageCounter) -> &'a MemCgInner {
    let mut x = g;
    loop {
        if std::ptr::eq(&x.memory, c) {
            return x;
        }
        match x.parent() {
            Some(p) => x = p,
            None => return g,
        }
    }
}

/// Linux's `try_charge_memcg`: `nr` pages for a fault of `g`'s space, or
/// `NoMemory` (`order` for the error) when `g` or an ancestor stays at its
/// `max` after reclaim. Nothing is charged on failure.
pub(crate) fn try_charge(g: &MemCgInner, nr: u64, order: u32) -> Result<(), Error> {
    let table = g.mm.memcg();
    if consume_stock(table, g, nr) {
        return Ok(());
    }
    g.stats.active();
    let mut batch = nr.max(CHARGE_BATCH);
    let mut drained = false;
    let mut retries = MAX_RECLAIM_RETRIES;
    loop {
        let over = match g.memory.try_charge(batch) {
            Ok(()) => break,
            Err(c) => group_of(g, c),
        };
        if batch > nr {
            batch = nr; // the exact amount may still fit
            continue;
        }
        over.stats.event(Event::Max);
        if retries == 0 {
            over.stats.event(Event::Oom);
            return Err(Error::NoMemory { order });
        }
        retries -= 1;
        {
            let _stall = Stall::enter(g);
            super::reclaim_pages(over, nr);
        }
        if over.memory.max().saturating_sub(over.memory.usage()) >= nr {
            continue;
        }
        if !drained {
            drained = true;
            drain_all_stock(table, over);
            continue;
        }
        // A huge page falls back to order 0 rather than retrying (Linux's
        // THP charges are `__GFP_NORETRY`).
        if nr > 8 {
            return Err(Error::NoMemory { order });
        }
    }
    if batch > nr {
        refill_stock(table, g, batch - nr);
    }
    handle_over_high(g, batch);
    super::reclaim::reclaim_own(g, batch);
    Ok(())
}

/// Linux's `mem_cgroup_handle_over_high` at the end of a charge of `nr`
/// pages: every ancestor over its `high` is reclaimed toward it
/// (`events.high`), again while that makes progress and the penalty is over
/// 10 ms; once reclaim stops making progress the thread sleeps Linux's
/// penalty (quadratic in the overage, scaled by the charge), at most
/// [`MAX_HIGH_DELAY`].
fn handle_over_high(g: &MemCgInner, nr: u64) {
    let mut x = Some(g);
    let mut over = false;
    while let Some(c) = x {
        if c.memory.usage() > c.memory.high() {
            over = true;
            break;
        }
        x = c.parent().map(|p| &**p);
    }
    if !over {
        return;
    }
    let _stall = Stall::enter(g);
    // Linux's `__mem_cgroup_handle_over_high`: reclaim while it progresses
    // and the penalty is worth sleeping; sleep only once it stops.
    // (Bounded here: a few rounds more than Linux's retries in all.)
    let mut want = nr.max(CHARGE_BATCH);
    let mut retries = MAX_RECLAIM_RETRIES;
    for _ in 0..4 * MAX_RECLAIM_RETRIES {
        let freed = reclaim_high(g, want);
        let delay = penalty(g, nr);
        if delay.is_zero() {
            return;
        }
        if freed == 0 {
            if retries == 0 {
                break;
            }
            retries -= 1;
        }
        want = SWAP_CLUSTER_MAX as u64;
    }
    std::thread::sleep(penalty(g, nr));
}

/// Linux's `reclaim_high`: up to `nr` pages from every ancestor of `g` (and
/// `g`) over its `high` (`events.high`); the pages freed.
fn reclaim_high(g: &MemCgInner, nr: u64) -> u64 {
    let mut freed = 0;
    let mut x = Some(g);
    while let Some(c) = x {
        let (usage, high) = (c.memory.usage(), c.memory.high());
        if usage > high {
            c.stats.event(Event::High);
            freed += super::reclaim_pages(c, (usage - high).min(nr));
        }
        x = c.parent().map(|p| &**p);
    }
    freed
}

/// Linux's `calculate_high_delay`: the largest overage of `g` and its
/// ancestors (`(usage - high) << 20 / high`), squared and scaled to one
/// second (`HZ`) >> 14, times `nr / CHARGE_BATCH`; capped at
/// [`MAX_HIGH_DELAY`], nothing under 10 ms (the next charge pays it).
pub(crate) fn penalty(g: &MemCgInner, nr: u64) -> Duration {
    let mut overage = 0u64;
    let mut x = Some(g);
    while let Some(c) = x {
        let (usage, high) = (c.memory.usage(), c.memory.high().max(1));
        if usage > high {
            overage = overage.max(((usage - high) << 20) / high);
        }
        x = c.parent().map(|p| &**p);
    }
    if overage == 0 {
        return Duration::ZERO;
    }
    let ms = (overage.saturating_mul(overage).saturating_mul(1000) >> 20 >> 14).saturating_mul(nr)
        / CHARGE_BATCH;
    let d = Duration::from_millis(ms).min(MAX_HIGH_DELAY);
    if d <= Duration::from_millis(10) {
        Duration::ZERO
    } else {
        d
    }
}

/// Uncharges the blocks of a free batch (the mmu_gather's flush, reclaim):
/// each block's owner is cleared and its group uncharged `2^order` pages,
/// one counter update per group.
pub(crate) fn uncharge_batch(mm: &Mm, blocks: &[(Pfn, u32)]) {
    let table = mm.memcg();
    if !table.in_use() {
        return;
    }
    // A batch is mostly one space's pages: one group, counted in `cur`.
    let mut cur = (0u16, 0u64);
    let mut others: Vec<(u16, u64)> = Vec::new();
    for &(p, order) in blocks {
        let id = table.take_owner(p.get());
        if id == 0 {
            continue;
        }
        if id == cur.0 || cur.0 == 0 {
            cur = (id, cur.1 + (1 << order));
        } else {
            match others.iter_mut().find(|x| x.0 == id) {
                Some(x) => x.1 += 1 << order,
                None => others.push((id, 1 << order)),
            }
        }
    }
    for (id, n) in std::iter::once(cur).chain(others).filter(|x| x.0 != 0) {
        // SAFETY: the group owned these frames until just now: the spaces
        // that mapped them (and hold the group) are still being unmapped.
        if let Some(g) = unsafe { table.owning_group(id) } {
            g.memory.uncharge(n);
        }
    }
}

/// The uncharge of an unmap's free batch, a run of one group's pages at a
/// time as they leave the LRU (`Lru::remove_batch`), with one counter update
/// per group at
/// [`finish`](Self::finish) (Linux's `uncharge_batch`). For frames the
/// unmapping space still holds, so their owners cannot change meanwhile.
pub(crate) struct UnchargeGather<'a> {
    mm: &'a Mm,
    table: &'a MemCgTable,
    /// Whether some block is a huge page (otherwise each block is 1 page).
    huge: bool,
    /// The group most of the batch belongs to, and its pages.
    cur: (u16, u64),
    others: Vec<(u16, u64)>,
}

impl<'a> UnchargeGather<'a> {
    /// For a batch with a huge page in it where `huge`.
    pub(crate) fn new(mm: &'a Mm, huge: bool) -> Self {
        UnchargeGather {
            mm,
            table: mm.memcg(),
            huge,
            cur: (0, 0),
            others: Vec::new(),
        }
    }

    /// The blocks headed by `pfns`, owned by group `owner` (0: the root,
    /// nothing to do), are being freed: their owners are cleared.
    #[inline]
    pub(crate) fn add_run(&mut self, owner: u16, pfns: impl ExactSizeIterator<Item = u32>) {
        if owner == 0 {
            return;
        }
        let n = if self.huge {
            pfns.map(|pfn| {
                self.table.set_owner(pfn.into(), 0);
                1u64 << crate::pgtable::desc(self.mm, Pfn::new(pfn.into())).order()
            })
            .sum()
        } else {
            let n = pfns.len() as u64;
            for pfn in pfns {
                self.table.set_owner(pfn.into(), 0);
            }
            n
        };
        if owner == self.cur.0 {
            self.cur.1 += n;
        } else {
            self.add_other(owner, n);
        }
    }

    #[cold]
    fn add_other(&mut self, owner: u16, n: u64) {
        if self.cur.0 == 0 {
            self.cur = (owner, n);
            return;
        }
        match self.others.iter_mut().find(|x| x.0 == owner) {
            Some(x) => x.1 += n,
            None => self.others.push((owner, n)),
        }
    }

    /// Uncharges what was gathered.
    pub(crate) fn finish(self) {
        let table = self.table;
        for (id, n) in std::iter::once(self.cur).chain(self.others) {
            // SAFETY: the group owned these frames until just now: the
            // spaces that mapped them (and hold the group) are still being
            // unmapped.
            if let Some(g) = unsafe { table.owning_group(id) } {
                g.memory.uncharge(n);
            }
        }
    }
}

/// Charges one swap slot to the owner of the page `pfn` going out (Linux's
/// `__mem_cgroup_try_charge_swap`): the owner id to record on the slot, 0 for
/// the root; `Err` (`swap.events max`, the page stays resident) when the
/// group or an ancestor is at its `swap.max`.
pub(crate) fn try_charge_swap(mm: &Mm, pfn: Pfn) -> Result<u16, ()> {
    let table = mm.memcg();
    if !table.in_use() {
        return Ok(0);
    }
    let id = table.owner(pfn.get());
    if id == 0 {
        return Ok(0);
    }
    let Some(g) = table.get(id) else { return Ok(0) };
    match g.swap.try_charge(1) {
        Ok(()) => Ok(id),
        Err(_) => {
            g.stats.event(Event::SwapMax);
            Err(())
        }
    }
}

/// A slot charged to group `id` was freed (Linux's `__mem_cgroup_uncharge_swap`).
pub(crate) fn uncharge_swap(table: &MemCgTable, id: u16) {
    if let Some(g) = table.get(id) {
        g.swap.uncharge(1);
    }
}

/// A swap-in exchange wrote the victim `page` into `entry`'s slot: the
/// slot's swap charge moves from the incoming page's group to the victim's
/// (forced: the victim's page went out either way).
pub(crate) fn move_swap_charge(
    mm: &Mm,
    dev: &crate::swapfile::SwapInfoStruct,
    entry: crate::pgtable::SwapEntry,
    page: Pfn,
) {
    let table = mm.memcg();
    if !table.in_use() {
        return;
    }
    let (old, new) = (dev.swap_owner(entry), table.owner(page.get()));
    if old == new {
        return;
    }
    uncharge_swap(table, old);
    let new = match table.get(new) {
        Some(g) => {
            g.swap.charge(1);
            new
        }
        None => 0,
    };
    dev.set_swap_owner(entry, new);
}

/// Linux's `memory_max_write`: the limit is set once the usage fits under
/// it; until then the stocks are drained once and the group reclaimed, up to
/// [`MAX_RECLAIM_RETRIES`] rounds without progress (64 in all); then `Err` with the old
/// limit in place.
pub(super) fn set_max(g: &MemCgInner, pages: u64, bytes: u64) -> Result<(), Error> {
    let table = g.mm.memcg();
    let mut drained = false;
    let mut fruitless = 0;
    // Bounded even while reclaim progresses (chargers may refill the group
    // as fast as it is reclaimed: the old limit is in force meanwhile).
    let mut rounds = 0;
    loop {
        let usage = match g.memory.set_max(pages) {
            Ok(()) => return Ok(()),
            Err(usage) => usage,
        };
        if !drained {
            drained = true;
            drain_all_stock(table, g);
            continue;
        }
        rounds += 1;
        if fruitless >= MAX_RECLAIM_RETRIES || rounds > 4 * MAX_RECLAIM_RETRIES {
            g.stats.event(Event::Oom);
            return Err(Error::LimitBelowUsage {
                group: g.id.into(),
                what: "memory.max",
                bytes,
                usage: to_bytes(usage),
            });
        }
        let freed = {
            let _stall = Stall::enter(g);
            super::reclaim_pages(g, usage - pages)
        };
        if freed == 0 {
            fruitless += 1;
        }
    }
}

/// `memory.reclaim`: up to `pages` from `g`'s subtree; the pages freed.
pub(super) fn reclaim(g: &MemCgInner, pages: u64) -> u64 {
    let _stall = Stall::enter(g);
    let mut done = 0;
    let mut fruitless = 0;
    while done < pages && fruitless < MAX_RECLAIM_RETRIES {
        let n = super::reclaim_pages(g, pages - done);
        if n == 0 {
            fruitless += 1;
        }
        done += n;
    }
    if done < pages {
        // What the stocks hold is charged but unused: it counts too.
        done += drain_all_stock(g.mm.memcg(), g).min(pages - done);
    }
    done
}

/// The group's pages charged ahead on all CPUs (for `stat()`).
pub(super) fn nr_stocked(g: &MemCgInner) -> u64 {
    stocked(g.mm.memcg(), g)
}

/// Sanity of the counters of a quiet `Mm` (`check()`): every group's usage
/// equals the pages owned by it and its descendants plus their stocks.
pub(crate) fn check(mm: &Mm) -> Result<(), String> {
    let table = mm.memcg();
    if !table.in_use() {
        return Ok(());
    }
    let groups = table.all();
    let mut own = vec![0u64; groups.iter().map(|g| g.id as usize + 1).max().unwrap_or(1)];
    for (pfn, o) in table.owner.iter().enumerate() {
        let id = o.load(Ordering::Relaxed);
        if id != 0 {
            let order = crate::pgtable::desc(mm, Pfn::new(pfn as u64)).order();
            if let Some(x) = own.get_mut(id as usize) {
                *x += 1 << order;
            } else {
                return Err(format!("pfn {pfn} owned by group {id}, which is gone"));
            }
        }
    }
    for g in &groups {
        let mine: u64 = groups
            .iter()
            .filter(|x| x.is_descendant(g))
            .map(|x| own[x.id as usize] + stocked(table, x))
            .sum();
        if mine != g.memory.usage() {
            return Err(format!(
                "memory cgroup {}: usage {} pages, its pages and stocks {}",
                g.id,
                g.memory.usage(),
                mine
            ));
        }
    }
    Ok(())
}
