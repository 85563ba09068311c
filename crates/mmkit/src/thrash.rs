//! Load control under thrashing (Denning's working-set principle: a task runs
//! only while its working set can be resident; in the spirit of Linux's swap
//! token, 2.6.9-3.4, which let one thrashing task keep its pages). When the
//! address spaces that swap between them want more memory than there is, all
//! of them fault all of the time and none gets anywhere; load control then
//! lets a group of them whose working sets fit run (`admitted`) while the
//! others wait at their next access, and rotates the group every quantum, so
//! that the running ones work at memory speed and every space progresses
//! within a bounded time (all groups take their turn within `CYCLE`).
//!
//! Signals, per space (`SpaceLoad`): its major faults (swap-ins), counted by
//! the fault path; its resident pages. A space that swapped in is a member
//! of load control. Every `WINDOW` (evaluated by whichever member thread gets
//! there first, faulting or waiting; no thread of its own) each running
//! member's working set is estimated as its resident pages plus its swap-ins
//! over the window scaled to a second (what it touched that was not there);
//! load control engages when at least two members are active, their sets
//! together exceed the memory, and a group of them fits; it lets go when the
//! active members' sets fit together or fewer than two are left. A member is
//! active while it faults or waits; one seen doing neither for `IDLE` is
//! dropped.
//!
//! `SwapToken` (Linux's swap token, `mm/thrash.c`, 2.6.9-3.4): engaged on
//! the same signals, one member whose set fits in `TOKEN_FIT_PER_1024` of the
//! memory holds the token (one: the sets of the others are not known until
//! each has held it, and an underestimated group thrashes among itself);
//! reclaim takes the holder's pages as referenced
//! (`folio_referenced_one`), so its set stays resident and it runs at memory
//! speed, while the others keep running in the rest of the memory, never
//! stopped: each pauses `TOKEN_PAUSE` at its next access after a swap-in, so
//! that their thrashing leaves the CPUs to the holder. The token passes, to
//! the member that held it least recently, after `TOKEN_HOLD`, or at once
//! when its holder is gone or its set turned out not to fit.
//!
//! Invariants: when engaged, at least one member is admitted (the epoch's
//! group; under `SwapToken`, the holder, the only space whose `token` is
//! set); a space that is not a member never waits; a waiting or pausing
//! thread holds no lock of the space or the Mm (it waits before its access
//! takes any).
//!
//! Locking: the members and the rotation under one mutex, a leaf taken only
//! on the slow paths (a space's first swap-in, a window's end, a non-admitted
//! access); the fast path is one relaxed load of `engaged` (and, engaged, of
//! the epoch and the space's admission).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::space::SpaceInner;
use crate::Mm;

/// Whether the Mm controls its load when spaces thrash (see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadControl {
    /// Every space runs, whatever it costs the others.
    #[default]
    Off,
    /// Groups of spaces whose working sets fit take turns while thrashing.
    WorkingSet,
    /// While thrashing, one space at a time keeps its working set (the swap
    /// token); the others run in the rest of the memory.
    SwapToken,
}

/// How often the members are looked at.
const WINDOW: Duration = Duration::from_millis(100);
/// Every group runs once within this (so every space progresses within it,
/// give or take a window and the turn of the group that was running).
const CYCLE: Duration = Duration::from_secs(3);
/// Bounds of one group's turn.
const QUANTUM_MIN: Duration = Duration::from_millis(200);
const QUANTUM_MAX: Duration = Duration::from_secs(1);
/// A member neither faulting nor waiting this long is dropped.
const IDLE: Duration = Duration::from_secs(1);
/// Swap-ins per window (per memory page, in 1/1024) under which nothing is
/// thrashing.
const CALM_PER_1024: u64 = 4;
/// `SwapToken`: how long one space holds the token.
const TOKEN_HOLD: Duration = Duration::from_secs(3);
/// `SwapToken`: the share of the memory (in 1/1024) a holder's set must fit.
const TOKEN_FIT_PER_1024: u64 = 768;
/// `SwapToken`: a space without the token pauses this long at its next access
/// after a swap-in.
const TOKEN_PAUSE: Duration = Duration::from_millis(1);

/// A space's load-control counters (in its `SpaceInner`).
#[derive(Default)]
pub(crate) struct SpaceLoad {
    /// Swap-ins of its pages (major faults).
    majflt: AtomicU64,
    /// The epoch whose group it belongs to (admitted while it is current).
    admitted: AtomicU64,
    /// A member of load control (it swapped in since it last was dropped).
    member: AtomicBool,
    /// It holds the swap token (`SwapToken`).
    token: AtomicBool,
    /// `majflt` at its last pause (`SwapToken`).
    paid: AtomicU64,
}

impl SpaceLoad {
    /// Does this space hold the swap token? Reclaim takes its pages as
    /// referenced.
    #[inline]
    pub(crate) fn holds_token(&self) -> bool {
        self.token.load(Ordering::Relaxed)
    }
}

struct Member {
    space: Weak<SpaceInner>,
    majflt0: u64,
    /// Estimated working set, pages (as of its last window running).
    wss: u64,
    last_seen: Instant,
    /// When its last turn began (or it joined).
    last_turn: Instant,
}

#[derive(Default)]
struct State {
    members: Vec<Member>,
    /// Members in the group admitted now.
    group: usize,
    quantum_end: Option<Instant>,
    /// Half of the current group's turn.
    quantum_half: Option<Instant>,
}

/// The load control of one Mm.
pub(crate) struct Thrash {
    policy: LoadControl,
    memory_pages: u64,
    engaged: AtomicBool,
    epoch: AtomicU64,
    /// Nanoseconds since `t0` at which the next window ends.
    next_window: AtomicU64,
    t0: Instant,
    state: Mutex<State>,
    cv: Condvar,
}

impl Thrash {
    pub(crate) fn new(policy: LoadControl, memory_pages: u64) -> Thrash {
        Thrash {
            policy,
            memory_pages,
            engaged: AtomicBool::new(false),
            epoch: AtomicU64::new(1),
            next_window: AtomicU64::new(0),
            t0: Instant::now(),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Is load control holding some spaces back now?
    pub(crate) fn engaged(&self) -> bool {
        self.engaged.load(Ordering::Relaxed)
    }

    /// A swap-in of a page of space `id` of `mm`, whose counters are `load`
    /// (its major fault).
    pub(crate) fn note_major_fault(&self, mm: &Mm, id: u64, load: &SpaceLoad) {
        if self.policy == LoadControl::Off {
            return;
        }
        load.majflt.fetch_add(1, Ordering::Relaxed);
        if !load.member.load(Ordering::Relaxed) {
            // Resolved before the state lock (the registry's is a leaf too).
            let Some(space) = mm.spaces().get(id) else {
                return;
            };
            let mut st = self.lock();
            if !load.member.swap(true, Ordering::Relaxed) {
                st.members.push(Member {
                    space: space.downgrade(),
                    majflt0: 0,
                    wss: 0,
                    last_seen: Instant::now(),
                    last_turn: Instant::now(),
                });
            }
        }
        self.maybe_window();
    }

    /// Called before an access of `space` takes any lock: returns at once
    /// unless load control is engaged and the space is a member outside the
    /// admitted group; then waits for its group's turn.
    #[inline]
    pub(crate) fn throttle(&self, mm: &Mm, load: &SpaceLoad) {
        if self.engaged() && self.held_back(load) {
            if self.policy == LoadControl::SwapToken {
                self.token_pause(mm, load);
            } else {
                self.wait_turn(mm, load);
            }
        }
    }

    /// `SwapToken`, a member without the token: pauses once per swap-in it
    /// took since its last pause.
    #[cold]
    #[inline(never)]
    fn token_pause(&self, mm: &Mm, load: &SpaceLoad) {
        let f = load.majflt.load(Ordering::Relaxed);
        if load.paid.swap(f, Ordering::Relaxed) == f {
            return;
        }
        mm.page_alloc()
            .count_vm_event(mmkit_core::VmEvent::LoadControlWait, 1);
        self.maybe_window();
        std::thread::sleep(TOKEN_PAUSE);
    }

    /// The share of the memory one member's set must fit to be admitted.
    fn fit_pages(&self) -> u64 {
        match self.policy {
            LoadControl::SwapToken => self.memory_pages * TOKEN_FIT_PER_1024 / 1024,
            _ => self.memory_pages,
        }
    }

    fn held_back(&self, load: &SpaceLoad) -> bool {
        load.member.load(Ordering::Relaxed)
            && load.admitted.load(Ordering::Relaxed) != self.epoch.load(Ordering::Relaxed)
    }

    #[cold]
    #[inline(never)]
    fn wait_turn(&self, mm: &Mm, load: &SpaceLoad) {
        mm.page_alloc()
            .count_vm_event(mmkit_core::VmEvent::LoadControlWait, 1);
        loop {
            self.maybe_window();
            let mut st = self.lock();
            if !self.engaged() || !self.held_back(load) {
                return;
            }
            let me: *const SpaceLoad = load;
            if let Some(m) = st.members.iter_mut().find(|m| {
                m.space
                    .upgrade()
                    .is_some_and(|s| std::ptr::eq(s.load(), me))
            }) {
                m.last_seen = Instant::now();
            }
            let _ = self
                .cv
                .wait_timeout(st, WINDOW / 2)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Ends the window when it is due (one thread at a time; the others go on).
    fn maybe_window(&self) {
        let now = self.now_ns();
        let due = self.next_window.load(Ordering::Relaxed);
        if now < due
            || self
                .next_window
                .compare_exchange(
                    due,
                    now + WINDOW.as_nanos() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let mut st = self.lock();
        self.end_window(&mut st);
        drop(st);
        self.cv.notify_all();
    }

    /// The window's evaluation (module header): estimates, engage or let go,
    /// rotate at the quantum's end.
    fn end_window(&self, st: &mut State) {
        let now = Instant::now();
        let epoch = self.epoch.load(Ordering::Relaxed);
        let engaged = self.engaged();
        let per_sec = (Duration::from_secs(1).as_nanos() / WINDOW.as_nanos()) as u64;
        let late = st.quantum_half.is_some_and(|h| now >= h);
        let group = st.group;
        let mut faults = 0;
        st.members.retain_mut(|m| {
            let Some(s) = m.space.upgrade() else {
                return false;
            };
            let load = s.load();
            let f = load.majflt.load(Ordering::Relaxed);
            let d = f - m.majflt0.min(f);
            m.majflt0 = f;
            faults += d;
            if d > 0 {
                m.last_seen = now;
            }
            let running = !engaged || load.admitted.load(Ordering::Relaxed) == epoch;
            let seen = s.rss_pages() + d * per_sec;
            if !engaged {
                m.wss = seen;
            } else if running && self.policy == LoadControl::SwapToken {
                // The holder's set is what it keeps resident (it swaps in
                // at full speed while it loads); one still swapping in after
                // half its turn does not fit.
                m.last_seen = now;
                m.wss = m.wss.max(s.rss_pages());
                if late && d * 1024 > self.memory_pages * CALM_PER_1024 {
                    m.wss = self.memory_pages;
                }
            } else if running {
                m.last_seen = now; // its turn: running, at memory speed or not
                                   // Its set grows as it is measured running; a member still
                                   // swapping in after half its turn (its set did not fit, or
                                   // is still loading) is taken as twice as large, up to the
                                   // memory (then its group is itself alone).
                m.wss = m.wss.max(seen);
                let calm = self.memory_pages * CALM_PER_1024 / group.max(1) as u64;
                if late && d * 1024 > calm {
                    m.wss = (m.wss * 2).min(self.memory_pages);
                }
            }
            if now.duration_since(m.last_seen) > IDLE {
                load.member.store(false, Ordering::Relaxed);
                load.token.store(false, Ordering::Relaxed);
                return false;
            }
            true
        });
        let want: u64 = st.members.iter().map(|m| m.wss).sum();
        let fit = self.fit_pages();
        let fits_one = st.members.iter().any(|m| m.wss <= fit);
        let thrashing = faults * 1024 > self.memory_pages * CALM_PER_1024;
        if !engaged {
            if st.members.len() >= 2 && want > self.memory_pages && fits_one && thrashing {
                self.engaged.store(true, Ordering::Relaxed);
                st.group = 0;
                self.rotate(st, now);
            }
            return;
        }
        if st.members.len() < 2 || want <= self.memory_pages || !fits_one {
            self.engaged.store(false, Ordering::Relaxed);
            st.quantum_end = None;
            st.quantum_half = None;
            self.set_token(st, None);
            return;
        }
        if st.quantum_end.is_none_or(|end| now >= end) || self.token_lost(st) {
            self.rotate(st, now);
        }
    }

    /// `SwapToken`: has the holder gone (dropped, its space freed), or did
    /// its set turn out not to fit? Then the token passes at once.
    fn token_lost(&self, st: &State) -> bool {
        if self.policy != LoadControl::SwapToken {
            return false;
        }
        let (n, sum) = st
            .members
            .iter()
            .filter(|m| m.space.upgrade().is_some_and(|s| s.load().holds_token()))
            .fold((0, 0), |(n, sum), m| (n + 1, sum + m.wss));
        n == 0 || sum > self.fit_pages()
    }

    /// `SwapToken`: gives the token to the member admitted in `epoch` (none:
    /// to no one).
    fn set_token(&self, st: &State, epoch: Option<u64>) {
        if self.policy != LoadControl::SwapToken {
            return;
        }
        for m in &st.members {
            if let Some(s) = m.space.upgrade() {
                let l = s.load();
                let holds = epoch == Some(l.admitted.load(Ordering::Relaxed));
                l.token.store(holds, Ordering::Relaxed);
            }
        }
    }

    /// The next group: from the member that has waited longest for its turn
    /// (members come and go, so a cursor alone could pass one over), the
    /// members after it in turn while their sets fit (at least one); a new
    /// epoch admits it.
    fn rotate(&self, st: &mut State, now: Instant) {
        let n = st.members.len();
        let token = self.policy == LoadControl::SwapToken;
        let fit = self.fit_pages();
        let start = (0..n)
            .filter(|&i| !token || st.members[i].wss <= fit)
            .min_by_key(|&i| st.members[i].last_turn)
            .unwrap_or(0);
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed) + 1;
        let mut sum = 0;
        let mut group = 0;
        for k in 0..n {
            let m = &mut st.members[(start + k) % n];
            if group > 0 && (token || sum + m.wss > self.memory_pages) {
                break;
            }
            sum += m.wss;
            group += 1;
            m.last_turn = now;
            if let Some(s) = m.space.upgrade() {
                s.load().admitted.store(epoch, Ordering::Relaxed);
            }
        }
        st.group = group;
        self.set_token(st, token.then_some(epoch));
        let groups = n.div_ceil(group.max(1)).max(1) as u32;
        let quantum = if token {
            TOKEN_HOLD
        } else {
            (CYCLE / groups).clamp(QUANTUM_MIN, QUANTUM_MAX)
        };
        st.quantum_end = Some(now + quantum);
        st.quantum_half = Some(now + quantum / 2);
        if std::env::var_os("MMKIT_THRASH_DEBUG").is_some() {
            eprintln!(
                "thrash: epoch {epoch}: group of {group} from {start} of {n}, {:?} each, sets {:?}",
                quantum,
                st.members.iter().map(|m| m.wss).collect::<Vec<_>>()
            );
        }
    }
}

impl std::fmt::Debug for Thrash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Thrash")
            .field("policy", &self.policy)
            .field("engaged", &self.engaged())
            .finish()
    }
}
