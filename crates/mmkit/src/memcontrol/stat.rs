//! What a memory cgroup reports: `memory.stat` ([`MemCgStat`]),
//! `memory.events` ([`MemCgEvents`]), `memory.pressure` ([`Pressure`], PSI
//! style) and the `/sys/fs/cgroup`-style text of each.
//!
//! Statistics and events are per-CPU counters folded on read; they count for
//! the group where the thing happened and, on read, its descendants' are
//! added (Linux's hierarchical `memory.stat` and `memory.events`).
//!
//! Pressure. A thread *stalls* on a group while it runs that group's reclaim
//! (limit, `high`, proactive or allocator-paid), sleeps in its `high`
//! throttle, or waits for a
//! swap-in of one of its spaces' pages. The group's threads are those that
//! stalled on it or charged it through the slow path (a stock refill, every
//! 64 pages; recorded at most every 1/16 s per thread) in the last second. `some` is the share of wall time in which at
//! least one thread stalled; `full` the share in which every one of the
//! group's threads stalled at once. Both are kept as running totals and as
//! exponentially decaying averages over 10, 60 and 300 s, updated every 2 s
//! (Linux's `PSI_FREQ`) or when read.
//!
//! Invariants: totals only grow; the averages are in 0..=1.
//!
//! Locking: the counters are atomics; the pressure state is a mutex per
//! group, taken when a stall begins or ends and on read (never held across
//! a stall).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use mmkit_core::Platform;
use parking_lot::Mutex;

use super::{MemCgInner, MemCgroup};
use crate::{StdPlatform, PAGE_SIZE};

/// `memory.events` of a group and its descendants.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemCgEvents {
    /// Reclaimed while under `low` (its protection was overcommitted).
    pub low: u64,
    /// Reclaimed and throttled for being over `high`.
    pub high: u64,
    /// A charge went over `max` (reclaim followed).
    pub max: u64,
    /// A charge failed at `max` after reclaim (or `max` could not be lowered).
    pub oom: u64,
    /// `swap.events max`: a page stayed resident at `swap.max`.
    pub swap_max: u64,
}

/// `memory.stat` of a group and its descendants (the fields that apply to
/// anonymous memory and swap; pages are counted in bytes where Linux does).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemCgStat {
    /// Bytes of anonymous memory charged (`current` less the stocks).
    pub anon: u64,
    /// Bytes of swap charged.
    pub swap: u64,
    /// Pages scanned by reclaim on the group's inactive lists.
    pub pgscan: u64,
    /// Pages reclaimed (swapped out) from the group.
    pub pgsteal: u64,
    /// Pages moved to the active list.
    pub pgactivate: u64,
    /// Pages moved to the inactive list.
    pub pgdeactivate: u64,
    /// Pages swapped out.
    pub pswpout: u64,
    /// Pages swapped in.
    pub pswpin: u64,
    /// Swapped-out pages faulted back in with a shadow (refaults).
    pub workingset_refault_anon: u64,
    /// Refaults activated (their distance was short enough).
    pub workingset_activate_anon: u64,
    /// Refaults of pages that were in the working set when evicted.
    pub workingset_restore_anon: u64,
    /// Faults in the group's spaces (first touches, swap-ins, lost races).
    pub pgfault: u64,
}

/// `memory.pressure` of a group: stall shares (0..=1) over 10, 60 and 300 s,
/// and the total stall time in microseconds (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct Pressure {
    /// Some thread stalled: avg10, avg60, avg300.
    pub some: [f64; 3],
    /// Every thread stalled: avg10, avg60, avg300.
    pub full: [f64; 3],
    /// Total time some thread stalled, µs.
    pub some_total_us: u64,
    /// Total time every thread stalled, µs.
    pub full_total_us: u64,
}

/// The counters a group keeps (per CPU).
#[derive(Copy, Clone)]
pub(crate) enum Event {
    Low,
    High,
    Max,
    Oom,
    SwapMax,
    PgScan,
    PgSteal,
    PgActivate,
    PgDeactivate,
    PswpOut,
    PswpIn,
    Refault,
    Activate,
    Restore,
    PgFault,
}
const NR_EVENTS: usize = 15;

/// A group's counters and pressure state.
pub(crate) struct GroupStats {
    cpus: Box<[CachePadded<[AtomicU64; NR_EVENTS]>]>,
    psi: Mutex<Psi>,
}

/// Averaging periods of the pressure averages, seconds.
const WINDOWS: [f64; 3] = [10.0, 60.0, 300.0];
/// How often the averages take a sample (Linux's `PSI_FREQ`).
const PSI_FREQ: Duration = Duration::from_secs(2);
/// A thread that has not charged or stalled for this long is idle.
const IDLE_AFTER: Duration = Duration::from_secs(1);
/// How stale a thread's last sighting through the slow charge path may be.
const SEEN_EVERY: Duration = Duration::from_millis(IDLE_AFTER.as_millis() as u64 / 16);

struct Psi {
    /// Threads stalled now.
    stalled: u32,
    /// The group's threads and when each was last seen.
    threads: Vec<(ThreadId, Instant)>,
    since: Instant,
    some_total: Duration,
    full_total: Duration,
    avg_at: Instant,
    avg_some_at: Duration,
    avg_full_at: Duration,
    some: [f64; 3],
    full: [f64; 3],
}

impl Psi {
    fn new() -> Psi {
        let now = Instant::now();
        Psi {
            stalled: 0,
            threads: Vec::new(),
            since: now,
            some_total: Duration::ZERO,
            full_total: Duration::ZERO,
            avg_at: now,
            avg_some_at: Duration::ZERO,
            avg_full_at: Duration::ZERO,
            some: [0.0; 3],
            full: [0.0; 3],
        }
    }

    /// Brings the totals up to `now` under the state since the last change.
    fn advance(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.since);
        if self.stalled > 0 {
            self.some_total += dt;
            let live = self
                .threads
                .iter()
                .filter(|t| now.saturating_duration_since(t.1) < IDLE_AFTER)
                .count() as u32;
            if self.stalled >= live.max(1) {
                self.full_total += dt;
            }
        }
        self.since = now;
        let period = now.saturating_duration_since(self.avg_at);
        if period >= PSI_FREQ {
            let secs = period.as_secs_f64();
            let some = ((self.some_total - self.avg_some_at).as_secs_f64() / secs).min(1.0);
            let full = ((self.full_total - self.avg_full_at).as_secs_f64() / secs).min(1.0);
            for (i, w) in WINDOWS.iter().enumerate() {
                let e = (-secs / w).exp();
                self.some[i] = self.some[i] * e + some * (1.0 - e);
                self.full[i] = self.full[i] * e + full * (1.0 - e);
            }
            self.avg_at = now;
            self.avg_some_at = self.some_total;
            self.avg_full_at = self.full_total;
        }
    }

    fn seen(&mut self, now: Instant) {
        let me = std::thread::current().id();
        self.threads
            .retain(|t| now.saturating_duration_since(t.1) < IDLE_AFTER || t.0 == me);
        match self.threads.iter_mut().find(|t| t.0 == me) {
            Some(t) => t.1 = now,
            None => self.threads.push((me, now)),
        }
    }
}

impl GroupStats {
    pub(crate) fn new(nr_cpus: usize) -> GroupStats {
        GroupStats {
            cpus: (0..nr_cpus.max(1))
                .map(|_| CachePadded::default())
                .collect(),
            psi: Mutex::new(Psi::new()),
        }
    }

    #[inline]
    pub(crate) fn add(&self, e: Event, n: u64) {
        if n > 0 {
            let c = &self.cpus[StdPlatform::cpu_id() % self.cpus.len()];
            c[e as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn event(&self, e: Event) {
        self.add(e, 1);
    }

    fn sum(&self, e: Event) -> u64 {
        self.cpus
            .iter()
            .map(|c| c[e as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// The calling thread charged this group through the slow path: it is
    /// one of the group's threads for the next second.
    /// A thread's sightings of one group are recorded at most every
    /// [`SEEN_EVERY`] (thread-local), so that the fault path's refills do not
    /// take the pressure mutex each time.
    pub(crate) fn active(&self) {
        thread_local! {
            /// The group this thread was last recorded in, and when.
            static LAST: std::cell::Cell<(usize, Option<Instant>)> =
                const { std::cell::Cell::new((0, None)) };
        }
        let now = Instant::now();
        let me = self as *const GroupStats as usize;
        let fresh = LAST.with(|l| match l.get() {
            (g, Some(t)) if g == me && now.saturating_duration_since(t) < SEEN_EVERY => true,
            _ => {
                l.set((me, Some(now)));
                false
            }
        });
        if fresh {
            return;
        }
        let mut p = self.psi.lock();
        p.advance(now);
        p.seen(now);
    }

    fn stall_begin(&self) {
        let now = Instant::now();
        let mut p = self.psi.lock();
        p.advance(now);
        p.seen(now);
        p.stalled += 1;
    }

    fn stall_end(&self) {
        let now = Instant::now();
        let mut p = self.psi.lock();
        p.advance(now);
        p.seen(now);
        p.stalled -= 1;
    }

    fn pressure(&self) -> Pressure {
        let mut p = self.psi.lock();
        p.advance(Instant::now());
        Pressure {
            some: p.some,
            full: p.full,
            some_total_us: p.some_total.as_micros() as u64,
            full_total_us: p.full_total.as_micros() as u64,
        }
    }
}

/// A stall of the calling thread on a group, from `enter` to the drop
/// (Linux's `psi_memstall_enter` / `psi_memstall_leave`).
pub(crate) struct Stall<'a>(&'a MemCgInner);

impl<'a> Stall<'a> {
    pub(crate) fn enter(g: &'a MemCgInner) -> Stall<'a> {
        g.stats.stall_begin();
        Stall(g)
    }
}

impl Drop for Stall<'_> {
    fn drop(&mut self) {
        self.0.stats.stall_end();
    }
}

impl MemCgInner {
    /// The group and its live descendants.
    fn subtree(&self) -> Vec<std::sync::Arc<MemCgInner>> {
        self.mm
            .memcg()
            .all()
            .into_iter()
            .filter(|x| x.is_descendant(self))
            .collect()
    }
}

impl MemCgroup {
    /// `memory.stat` (hierarchical: the group and its descendants).
    pub fn stat(&self) -> MemCgStat {
        let g = &self.inner;
        let sub = g.subtree();
        let sum = |e: Event| sub.iter().map(|x| x.stats.sum(e)).sum::<u64>();
        let stocked: u64 = sub.iter().map(|x| super::charge::nr_stocked(x)).sum();
        MemCgStat {
            anon: g.memory.usage().saturating_sub(stocked) * PAGE_SIZE as u64,
            swap: g.swap.usage() * PAGE_SIZE as u64,
            pgscan: sum(Event::PgScan),
            pgsteal: sum(Event::PgSteal),
            pgactivate: sum(Event::PgActivate),
            pgdeactivate: sum(Event::PgDeactivate),
            pswpout: sum(Event::PswpOut),
            pswpin: sum(Event::PswpIn),
            workingset_refault_anon: sum(Event::Refault),
            workingset_activate_anon: sum(Event::Activate),
            workingset_restore_anon: sum(Event::Restore),
            // Faults of the spaces gone, and of the live ones (counted by
            // each space, so the fault path pays nothing here).
            pgfault: sum(Event::PgFault)
                + g.mm
                    .spaces()
                    .all()
                    .iter()
                    .filter(|s| s.inner().memcg().is_some_and(|x| x.is_descendant(g)))
                    .map(|s| s.stats().faults)
                    .sum::<u64>(),
        }
    }

    /// `memory.events` (hierarchical).
    pub fn events(&self) -> MemCgEvents {
        let sub = self.inner.subtree();
        let sum = |e: Event| sub.iter().map(|x| x.stats.sum(e)).sum::<u64>();
        MemCgEvents {
            low: sum(Event::Low),
            high: sum(Event::High),
            max: sum(Event::Max),
            oom: sum(Event::Oom),
            swap_max: sum(Event::SwapMax),
        }
    }

    /// The group's place in the tree, `/g<id>/g<id>...` from the root.
    pub fn path(&self) -> String {
        let mut ids = Vec::new();
        let mut x = Some(&*self.inner);
        while let Some(c) = x {
            ids.push(c.id);
            x = c.parent().map(|p| &**p);
        }
        ids.iter().rev().map(|id| format!("/g{id}")).collect()
    }

    /// `memory.pressure` of this group (its own threads' stalls).
    pub fn pressure(&self) -> Pressure {
        self.inner.stats.pressure()
    }

    /// The group's files as `/sys/fs/cgroup/<group>/` shows them: one
    /// `== memory.X ==` section each for `current`, `max`, `high`, `low`,
    /// `min`, `peak`, `swap.current`, `swap.max`, `stat`, `events`,
    /// `pressure` (Linux's formats: limits as bytes or `max`, `stat` and
    /// `events` as `key value` lines, `pressure` as `some|full avg10=..
    /// avg60=.. avg300=.. total=..`).
    pub fn text(&self) -> String {
        let mut s = String::new();
        let lim = |b: u64| {
            if b == u64::MAX {
                "max".to_string()
            } else {
                b.to_string()
            }
        };
        let (max, high, low, min, swap_max) = self.limits();
        let _ = writeln!(s, "== memory.current ==\n{}", self.current());
        let _ = writeln!(s, "== memory.max ==\n{}", lim(max));
        let _ = writeln!(s, "== memory.high ==\n{}", lim(high));
        let _ = writeln!(s, "== memory.low ==\n{}", lim(low));
        let _ = writeln!(s, "== memory.min ==\n{}", lim(min));
        let _ = writeln!(s, "== memory.peak ==\n{}", self.peak());
        let _ = writeln!(s, "== memory.swap.current ==\n{}", self.swap_current());
        let _ = writeln!(s, "== memory.swap.max ==\n{}", lim(swap_max));
        let st = self.stat();
        let _ = writeln!(s, "== memory.stat ==");
        for (k, v) in [
            ("anon", st.anon),
            ("swap", st.swap),
            ("pgfault", st.pgfault),
            ("pgscan", st.pgscan),
            ("pgsteal", st.pgsteal),
            ("pgactivate", st.pgactivate),
            ("pgdeactivate", st.pgdeactivate),
            ("pswpin", st.pswpin),
            ("pswpout", st.pswpout),
            ("workingset_refault_anon", st.workingset_refault_anon),
            ("workingset_activate_anon", st.workingset_activate_anon),
            ("workingset_restore_anon", st.workingset_restore_anon),
        ] {
            let _ = writeln!(s, "{k} {v}");
        }
        let ev = self.events();
        let _ = writeln!(
            s,
            "== memory.events ==\nlow {}\nhigh {}\nmax {}\noom {}\noom_kill 0",
            ev.low, ev.high, ev.max, ev.oom
        );
        let _ = writeln!(s, "== memory.swap.events ==\nmax {}", ev.swap_max);
        let p = self.pressure();
        let _ = writeln!(s, "== memory.pressure ==");
        for (name, a, t) in [
            ("some", p.some, p.some_total_us),
            ("full", p.full, p.full_total_us),
        ] {
            let _ = writeln!(
                s,
                "{name} avg10={:.2} avg60={:.2} avg300={:.2} total={t}",
                a[0] * 100.0,
                a[1] * 100.0,
                a[2] * 100.0
            );
        }
        s
    }
}
