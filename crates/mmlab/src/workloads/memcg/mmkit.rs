//! `memcg` on mmkit: one point of one case is a fresh `Mm` (the arena,
//! prefaulted, and a populated RAM swap device), the groups of the variant's
//! setup, A's space with its hot set written once, B's space with a region
//! per B thread; A's and B's threads run (`phase::drive`) while the calling
//! thread warms up (until B has filled memory and streamed one more memory
//! through it) and then measures, sampling both groups' usage. Afterwards the
//! spaces and groups are dropped and the `Mm` must be whole again: its
//! invariant walk passes, every page is free and no swap slot is used.
//!
//! A miss is a fault of A's space while measuring (its page was not mapped);
//! A's space is written in full before the point starts, so every such fault
//! is a swap-in (from the device or from the swap cache).

use super::{
    read_loop, stream_loop, Case, GroupReport, Outcome, Pages, Picker, Plan, Progress, Sampled,
    Sizes,
};
use crate::host::cpu;
use crate::phase::{self, Phase, Placement};
use mmkit::{MapFlags, MemCgStat, MemCgroup, Mm, Space, SwapDevice, Variant};
use std::time::{Duration, Instant};

/// The name of A's threads (their CPU time is A's).
const A_THREAD: &str = "memcg-a";

/// Which groups a point makes and how they are set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// A in a group, no B.
    Alone,
    /// A's `memory.low` >= its hot set.
    Low,
    /// B's `memory.max` = what A's protection leaves.
    Max,
    /// Groups without limits or protection.
    NoLow,
    /// No groups.
    Root,
}

impl Setup {
    pub fn from_variant(name: &str) -> Option<Setup> {
        Some(match name {
            "mmkit-alone" => Setup::Alone,
            "mmkit-low" => Setup::Low,
            "mmkit-max" => Setup::Max,
            "mmkit-nolow" => Setup::NoLow,
            "mmkit-root" => Setup::Root,
            _ => return None,
        })
    }
}

/// A mapping of `pages` pages of a space at `base`.
#[derive(Clone)]
struct Region<'a> {
    space: &'a Space,
    base: u64,
    pages: u64,
    /// The first error of an access, for the note.
    error: Option<String>,
}

impl Region<'_> {
    fn map(space: &Space, pages: u64) -> Result<Region<'_>, mmkit::Error> {
        let base = space.mmap((pages * 4096) as usize, MapFlags::empty())?;
        Ok(Region {
            space,
            base,
            pages,
            error: None,
        })
    }
}

impl Region<'_> {
    /// Keeps the first error; whether `r` is Ok.
    fn note(&mut self, r: Result<(), String>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                self.error.get_or_insert(e);
                false
            }
        }
    }
}

impl Pages for Region<'_> {
    fn pages(&self) -> u64 {
        self.pages
    }
    #[inline]
    fn read(&mut self, page: u64) -> bool {
        let mut b = [0u8; 4];
        // A different word of each page: no two pages share a cache set.
        let off = page * 4096 + (page % 1024) * 4;
        let r = self.space.read(self.base + off, &mut b);
        self.note(r.map_err(|e| format!("A's read at {:#x}: {e}", self.base + off)))
    }
    #[inline]
    fn write(&mut self, page: u64) -> bool {
        let r = self.space.write(self.base + page * 4096, &[1]);
        self.note(r.map_err(|e| format!("B's write of page {page}: {e}")))
    }
    fn recycle(&mut self) -> bool {
        let len = (self.pages * 4096) as usize;
        let r = self.space.munmap(self.base, len);
        if !self.note(r.map_err(|e| format!("B's munmap: {e}"))) {
            return false;
        }
        match self.space.mmap(len, MapFlags::empty()) {
            Ok(b) => {
                self.base = b;
                true
            }
            Err(e) => self.note(Err(format!("B's mmap: {e}"))),
        }
    }
}

/// The arena of `sizes` with its swap device on.
fn build_mm(sizes: &Sizes) -> Result<Mm, String> {
    let mm = Mm::builder()
        .memory(sizes.memory as usize)
        .variant(Variant::Mmkit)
        .prefault(true)
        .build()
        .map_err(|e| format!("building the Mm: {e}"))?;
    mm.swapon(SwapDevice::ram(sizes.swap).populated())
        .map_err(|e| format!("swapon: {e}"))?;
    Ok(mm)
}

/// One point of `setup` on a fresh `Mm`, then the leak check.
pub fn run_point(
    setup: Setup,
    case: Case,
    sizes: &Sizes,
    threads: usize,
    plan: &Plan,
) -> Result<Outcome, String> {
    let mm = build_mm(sizes)?;
    mm.drain_all_pages();
    let free0 = mm.nr_free_pages();
    let o = measure(&mm, setup, case, sizes, threads, plan)?;
    mm.wait_reclaim_idle();
    mm.wait_compaction_idle();
    mm.drain_all_pages();
    mm.check()
        .map_err(|e| format!("mm.check() after the point: {e}"))?;
    let free = mm.nr_free_pages();
    if free != free0 {
        return Err(format!(
            "nr_free_pages is {free} after the point, {free0} before: pages leaked"
        ));
    }
    let used: u64 = mm.swap_info().iter().map(|s| s.used_pages).sum();
    if used != 0 {
        return Err(format!("{used} swap slots still used after the point"));
    }
    Ok(o)
}

/// A custom variant's point: `mmkit-low`'s setup on its own `Mm` (a RAM swap
/// device is turned on first if it has none).
pub fn run_custom(
    mm: &Mm,
    case: Case,
    sizes: &Sizes,
    threads: usize,
    plan: &Plan,
) -> Result<Outcome, String> {
    if mm.swap_info().is_empty() {
        mm.swapon(SwapDevice::ram(sizes.swap).populated())
            .map_err(|e| format!("swapon: {e}"))?;
    }
    measure(mm, Setup::Low, case, sizes, threads, plan)
}

/// What the controller reads at each end of the measured interval.
struct Snap {
    a_ops: u64,
    a_cpu_ns: u64,
    a_faults: u64,
    b_ops: u64,
    a: Option<(MemCgStat, u64)>,
    b: Option<MemCgStat>,
}

fn snap(
    pa: &Progress,
    pb: &Progress,
    sa: &Space,
    ga: &Option<MemCgroup>,
    gb: &Option<MemCgroup>,
) -> Snap {
    Snap {
        a_ops: pa.ops(),
        a_cpu_ns: cpu::threads_cpu_ns(A_THREAD),
        a_faults: sa.stats().faults,
        b_ops: pb.ops(),
        a: ga.as_ref().map(|g| (g.stat(), g.events().low)),
        b: gb.as_ref().map(|g| g.stat()),
    }
}

/// A group's report from its samples and the stats at both ends.
fn report(g: &MemCgroup, sampled: Sampled, s0: &MemCgStat, s1: &MemCgStat) -> GroupReport {
    GroupReport {
        sampled,
        peak: Some(g.peak()),
        pgscan: Some(s1.pgscan.saturating_sub(s0.pgscan)),
        pgsteal: Some(s1.pgsteal.saturating_sub(s0.pgsteal)),
        events_low: None,
    }
}

/// An error of `what`, for `map_err`.
fn err(what: &'static str) -> impl Fn(mmkit::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// A's and B's groups as `setup` says, set up: none without groups, no B's
/// alone; B's `max` from the free memory now.
type Groups = (Option<MemCgroup>, Option<MemCgroup>);

fn groups(mm: &Mm, setup: Setup, sizes: &Sizes) -> Result<Groups, String> {
    let usable = mm.nr_free_pages() * 4096;
    if setup == Setup::Root {
        return Ok((None, None));
    }
    let a = mm.new_group().map_err(err("new_group"))?;
    if setup == Setup::Low {
        a.set_low(sizes.low).map_err(err("A's set_low"))?;
    }
    if setup == Setup::Alone {
        return Ok((Some(a), None));
    }
    let b = mm.new_group().map_err(err("new_group"))?;
    if setup == Setup::Max {
        b.set_max(sizes.b_max(usable)).map_err(err("B's set_max"))?;
    }
    Ok((Some(a), Some(b)))
}

/// Makes the groups and spaces of `setup` on `mm`, runs A and B, measures.
pub fn measure(
    mm: &Mm,
    setup: Setup,
    case: Case,
    sizes: &Sizes,
    threads: usize,
    plan: &Plan,
) -> Result<Outcome, String> {
    let threads = threads.max(1);
    let with_b = setup != Setup::Alone;
    let (ga, gb) = groups(mm, setup, sizes)?;
    let space_in = |g: &Option<MemCgroup>| match g {
        Some(g) => mm.new_space_in(g),
        None => mm.new_space(),
    };
    let sa = space_in(&ga).map_err(err("A's space"))?;
    let hot = Region::map(&sa, sizes.hot / 4096).map_err(err("A's mmap"))?;
    for p in 0..hot.pages {
        sa.write(hot.base + p * 4096, &[1])
            .map_err(err("writing A's hot set"))?;
    }
    let sb = if with_b {
        Some(space_in(&gb).map_err(err("B's space"))?)
    } else {
        None
    };
    let mut inputs: Vec<(bool, Region<'_>)> = (0..threads).map(|_| (true, hot.clone())).collect();
    if let Some(sb) = &sb {
        let per = (sizes.region / threads as u64 / 4096).max(1);
        for _ in 0..threads {
            inputs.push((false, Region::map(sb, per).map_err(err("B's mmap"))?));
        }
    }
    let picker = Picker::new(case, hot.pages);
    let (pa, pb) = (Progress::default(), Progress::default());
    let cpus = cpu::allowed_cpus();
    let max_of = |g: &Option<MemCgroup>| Sampled::new(g.as_ref().map(|g| g.limits().0));
    let sample = |s: &mut Sampled, g: &Option<MemCgroup>| {
        if let Some(g) = g {
            s.sample(g.current(), g.swap_current());
        }
    };
    let ((s0, s1, sampled, secs, warm), errors) = phase::drive(
        inputs,
        |i| Placement {
            cpus: cpu::round_robin(&cpus, i),
            name: Some(if i < threads { A_THREAD } else { "memcg-b" }),
        },
        |i, (is_a, mut r), word| {
            if is_a {
                read_loop(&mut r, &picker, 0x5eed + i as u64 * 7919, &pa, word);
            } else {
                stream_loop(&mut r, &pb, word);
            }
            r.error
        },
        |word| {
            let t0 = Instant::now();
            let mut warm = true;
            if with_b {
                while pb.ops() < sizes.warm_pages() {
                    if t0.elapsed() >= plan.max_warmup {
                        warm = false;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            std::thread::sleep(plan.warmup);
            let (mut sa_, mut sb_) = (max_of(&ga), max_of(&gb));
            let s0 = snap(&pa, &pb, &sa, &ga, &gb);
            let t = Instant::now();
            word.set(Phase::Measure);
            while t.elapsed() < plan.duration {
                sample(&mut sa_, &ga);
                sample(&mut sb_, &gb);
                std::thread::sleep(plan.sample);
            }
            sample(&mut sa_, &ga);
            sample(&mut sb_, &gb);
            let s1 = snap(&pa, &pb, &sa, &ga, &gb);
            let secs = t.elapsed().as_secs_f64();
            (s0, s1, (sa_, sb_), secs, warm)
        },
    );
    if let Some(e) = errors.into_iter().flatten().next() {
        eprintln!("note: memcg {setup:?}: an access failed: {e}");
    }
    if !warm {
        eprintln!(
            "note: memcg: B wrote {} of {} warm-up pages in {} ms; measured anyway",
            pb.ops(),
            sizes.warm_pages(),
            plan.max_warmup.as_millis()
        );
    }
    let a = ga
        .as_ref()
        .zip(s0.a.as_ref().zip(s1.a.as_ref()))
        .map(|(g, (x0, x1))| GroupReport {
            events_low: Some(x1.1.saturating_sub(x0.1)),
            ..report(g, sampled.0, &x0.0, &x1.0)
        });
    let b = gb
        .as_ref()
        .zip(s0.b.as_ref().zip(s1.b.as_ref()))
        .map(|(g, (x0, x1))| report(g, sampled.1, x0, x1));
    Ok(Outcome {
        secs,
        a_accesses: s1.a_ops - s0.a_ops,
        a_misses: s1.a_faults - s0.a_faults,
        b_pages: s1.b_ops - s0.b_ops,
        failures: pa.failures() + pb.failures(),
        a_cpu_ns: s1.a_cpu_ns.saturating_sub(s0.a_cpu_ns),
        alone: None,
        a,
        b,
    })
}
