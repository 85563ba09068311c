//! The phases of a timed point, and the one driver that runs them.
//!
//! A point's threads loop while a controller (the calling thread, or a parent
//! process through its messages) moves one shared word through
//! `Phase::Warmup` -> `Phase::Measure` -> `Phase::Stop`. The threads read the
//! word between steps (relaxed: a step late at each edge is within the noise
//! of a measured interval of milliseconds) and count what they do only while it
//! says `Measure`; the controller times the interval from just before it
//! says `Measure` to just after it says `Stop` (`PhaseWord::measure`).
//!
//! `drive` runs the threads, each on its own scoped thread placed by the
//! caller (`host::cpu`), and the controller on the calling thread; the word
//! says `Stop` once the controller returns, whatever it did, so no thread can
//! outlive the point. `step_until_stop` is the thread side for a
//! `runner::Worker`.

use crate::runner::Worker;
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Where a point is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Threads run; nothing is counted (caches, per-CPU lists, first touches).
    Warmup = 0,
    /// The measured interval: threads count.
    Measure = 1,
    /// Threads leave their loops.
    Stop = 2,
}

/// The phase word the controller writes and the threads read, on a cache line
/// of its own.
pub struct PhaseWord(CachePadded<AtomicU8>);

impl Default for PhaseWord {
    fn default() -> Self {
        PhaseWord::new()
    }
}

impl PhaseWord {
    /// A word at `Phase::Warmup`.
    pub fn new() -> PhaseWord {
        PhaseWord(CachePadded::new(AtomicU8::new(Phase::Warmup as u8)))
    }

    /// The current phase.
    #[inline]
    pub fn get(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::Warmup,
            1 => Phase::Measure,
            _ => Phase::Stop,
        }
    }

    /// Moves to `p`.
    pub fn set(&self, p: Phase) {
        self.0.store(p as u8, Ordering::Relaxed);
    }

    /// The measured interval: says `Measure`, runs `interval` (given the
    /// interval's start), says `Stop`; returns the time from just before the
    /// first to just after the last.
    pub fn measure(&self, interval: impl FnOnce(Instant)) -> Duration {
        let t0 = Instant::now();
        self.set(Phase::Measure);
        interval(t0);
        self.set(Phase::Stop);
        t0.elapsed()
    }

    /// `measure` with a sleep of `duration` as the interval.
    pub fn measure_for(&self, duration: Duration) -> Duration {
        self.measure(|_| std::thread::sleep(duration))
    }
}

/// Where thread `i` of a point runs: the CPUs it is pinned to (empty: not
/// pinned) and its name (shown by `perf` and `top`).
pub struct Placement {
    pub cpus: Vec<usize>,
    pub name: Option<&'static str>,
}

impl Placement {
    /// On `cpus`, unnamed.
    pub fn on(cpus: Vec<usize>) -> Placement {
        Placement { cpus, name: None }
    }

    /// Wherever the scheduler puts it, unnamed.
    pub fn anywhere() -> Placement {
        Placement::on(Vec::new())
    }
}

/// Runs a thread per input, thread `i` placed by `place(i)` running
/// `body(i, inputs[i], word)`, while `control(word)` runs on the calling thread;
/// then says `Stop` and joins them. Returns what `control` returned and each
/// thread's result, in thread order. A thread that panics panics the point.
pub fn drive<I, R, C>(
    inputs: Vec<I>,
    place: impl Fn(usize) -> Placement,
    body: impl Fn(usize, I, &PhaseWord) -> R + Sync,
    control: impl FnOnce(&PhaseWord) -> C,
) -> (C, Vec<R>)
where
    I: Send,
    R: Send,
{
    let word = PhaseWord::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let Placement { cpus, name } = place(i);
                let (word, body) = (&word, &body);
                let mut b = std::thread::Builder::new();
                if let Some(n) = name {
                    b = b.name(n.into());
                }
                b.spawn_scoped(s, move || {
                    crate::host::cpu::pin_to(&cpus);
                    body(i, input, word)
                })
                .expect("spawning a measuring thread")
            })
            .collect();
        let c = control(&word);
        word.set(Phase::Stop);
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("a measuring thread panicked"))
            .collect();
        (c, results)
    })
}

/// Steps `w` until the phase says stop; returns the ops counted while measuring.
pub fn step_until_stop(w: &mut impl Worker, word: &PhaseWord) -> u64 {
    let mut ops = 0;
    loop {
        let ph = word.get();
        if ph == Phase::Stop {
            return ops;
        }
        let n = w.step();
        if ph == Phase::Measure {
            ops += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    struct Count(u64);

    impl Worker for Count {
        fn step(&mut self) -> u64 {
            self.0 += 1;
            // Leave the CPUs to the other tests' measurements.
            std::thread::sleep(Duration::from_micros(200));
            1
        }
    }

    /// Many more threads than CPUs: each counts only its measured steps, the
    /// driver stops them all after the controller, and results come back in
    /// thread order.
    #[test]
    fn threads_count_only_the_measured_interval() {
        let threads = 16;
        let started = AtomicU64::new(0);
        let (elapsed, results) = drive(
            vec![(); threads],
            |_| Placement {
                cpus: Vec::new(),
                name: Some("phase-test"),
            },
            |i, (), word| {
                assert_eq!(std::thread::current().name(), Some("phase-test"));
                started.fetch_add(1, Ordering::Relaxed);
                let mut w = Count(0);
                let counted = step_until_stop(&mut w, word);
                (i, counted, w.0)
            },
            |word| {
                assert_eq!(word.get(), Phase::Warmup);
                while started.load(Ordering::Relaxed) < threads as u64 {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(5));
                word.measure_for(Duration::from_millis(20))
            },
        );
        assert!(elapsed >= Duration::from_millis(20));
        assert_eq!(results.len(), threads);
        for (k, &(i, counted, all)) in results.iter().enumerate() {
            assert_eq!(i, k);
            assert!(counted <= all, "thread {i}: {counted} > {all}");
        }
        assert!(results.iter().any(|r| r.1 > 0), "nothing measured");
        // A controller that never measures: nothing is counted, all stop.
        let (_, r) = drive(
            vec![(); 3],
            |_| Placement::anywhere(),
            |_, (), w| step_until_stop(&mut Count(0), w),
            |_| std::thread::sleep(Duration::from_millis(2)),
        );
        assert_eq!(r, vec![0, 0, 0]);
    }
}
