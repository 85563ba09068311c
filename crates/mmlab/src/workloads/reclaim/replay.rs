//! Replaying a trace on one target (an mmkit `Space`, the host's memory in the
//! kernel child, the exact-LRU model): the one loop every peer runs, so that
//! they count the same things over the same events.
//!
//! Counting: only between `Measure(true)` and `Measure(false)`; the target's
//! counters (`Snapshot`) are read at each edge and at each `Sample`, and the
//! measured figures are the sums of the deltas over the measured stretches.
//! Content: a write stores the page number in the page's first 4 bytes, and a
//! read must find that number or 0 (never written, or dropped); anything else
//! is counted as corrupt.

use super::trace::{Event, Source, TraceError};
use std::time::{Duration, Instant};

/// Events read from the source at once.
const BATCH: usize = 4096;

/// A target's cumulative counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Pages read from the swap device (pswpin; lru-exact: misses of pages
    /// seen before).
    pub reads: u64,
    /// Major faults (kernel: the process's; others: 0).
    pub majflt: u64,
    pub pgscan_kswapd: u64,
    pub pgscan_direct: u64,
    pub pgsteal_kswapd: u64,
    pub pgsteal_direct: u64,
    /// CPU time of the kswapd threads, ns (0 where not known).
    pub kswapd_ns: u64,
}

impl Snapshot {
    fn since(&self, b: &Snapshot) -> Snapshot {
        Snapshot {
            reads: self.reads.saturating_sub(b.reads),
            majflt: self.majflt.saturating_sub(b.majflt),
            pgscan_kswapd: self.pgscan_kswapd.saturating_sub(b.pgscan_kswapd),
            pgscan_direct: self.pgscan_direct.saturating_sub(b.pgscan_direct),
            pgsteal_kswapd: self.pgsteal_kswapd.saturating_sub(b.pgsteal_kswapd),
            pgsteal_direct: self.pgsteal_direct.saturating_sub(b.pgsteal_direct),
            kswapd_ns: self.kswapd_ns.saturating_sub(b.kswapd_ns),
        }
    }

    fn add(&mut self, d: &Snapshot) {
        self.reads += d.reads;
        self.majflt += d.majflt;
        self.pgscan_kswapd += d.pgscan_kswapd;
        self.pgscan_direct += d.pgscan_direct;
        self.pgsteal_kswapd += d.pgsteal_kswapd;
        self.pgsteal_direct += d.pgsteal_direct;
        self.kswapd_ns += d.kswapd_ns;
    }
}

/// What a trace is replayed on.
pub trait Target {
    /// Reads (`write` false) or writes the page's first 4 bytes; returns what
    /// a read found (a write returns `value`), or None on failure.
    fn access(&mut self, page: u64, write: bool, value: u32) -> Option<u32>;
    /// Drops segment `n`: its pages are fresh (zero) afterwards.
    fn discard(&mut self, n: u64) -> Result<(), String>;
    /// The counters now.
    fn snapshot(&mut self) -> Snapshot;
    /// Pages of the trace resident now (0 where not known).
    fn resident(&mut self) -> u64 {
        0
    }
}

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub accesses: u64,
    pub failures: u64,
    /// Reads that found neither the page number nor 0.
    pub corrupt: u64,
    pub elapsed: Duration,
    /// The counters' deltas over the measured stretches.
    pub counts: Snapshot,
    /// The counters' deltas from the first measured access to the end of the
    /// last measured stretch, unmeasured stretches between included (the
    /// reclaim cost of the whole measured span: scan's scans too).
    pub span: Snapshot,
    /// (measured accesses, measured reads) at each `Sample`.
    pub series: Vec<(u64, u64)>,
    /// Mean resident pages at the samples and measure edges (0 if unknown).
    pub resident: u64,
}

/// Replays `src` on `t`.
pub fn replay(src: &mut dyn Source, t: &mut dyn Target) -> Result<Outcome, TraceError> {
    let mut o = Outcome::default();
    let mut buf = Vec::with_capacity(BATCH + 2);
    let mut on: Option<(Instant, Snapshot)> = None;
    let mut first: Option<Snapshot> = None;
    let (mut res_sum, mut res_n) = (0u64, 0u64);
    let mut acc_in = 0u64;
    loop {
        src.fill(&mut buf, BATCH)?;
        if buf.is_empty() {
            break;
        }
        for e in &buf {
            match *e {
                Event::Touch { page, write } => {
                    let v = (page as u32).wrapping_add(1);
                    match t.access(page, write, v) {
                        None => o.failures += u64::from(on.is_some()),
                        Some(got) if !write && got != v && got != 0 => o.corrupt += 1,
                        Some(_) => {}
                    }
                    acc_in += u64::from(on.is_some());
                }
                Event::Measure(true) if on.is_none() => {
                    let s = t.snapshot();
                    first.get_or_insert(s);
                    on = Some((Instant::now(), s));
                }
                Event::Measure(false) => {
                    if let Some((t0, s0)) = on.take() {
                        o.elapsed += t0.elapsed();
                        let s1 = t.snapshot();
                        o.counts.add(&s1.since(&s0));
                        o.span = s1.since(first.as_ref().unwrap_or(&s0));
                        o.accesses += acc_in;
                        acc_in = 0;
                        res_sum += t.resident();
                        res_n += 1;
                    }
                }
                Event::Measure(true) => {}
                Event::Sample => {
                    if let Some((_, s0)) = &on {
                        let d = t.snapshot().since(s0);
                        o.series
                            .push((o.accesses + acc_in, o.counts.reads + d.reads));
                        res_sum += t.resident();
                        res_n += 1;
                    }
                }
                Event::Discard(n) => {
                    t.discard(n)
                        .map_err(|e| TraceError(format!("discard: {e}")))?;
                }
            }
        }
    }
    if let Some((t0, s0)) = on.take() {
        o.elapsed += t0.elapsed();
        let s1 = t.snapshot();
        o.counts.add(&s1.since(&s0));
        o.span = s1.since(first.as_ref().unwrap_or(&s0));
        o.accesses += acc_in;
    }
    o.resident = res_sum.checked_div(res_n).unwrap_or(0);
    Ok(o)
}

/// Faults (in pages) after the move at `move_at` measured accesses until the
/// miss ratio of a window is within one point of the new steady state (the
/// mean of the last half of the windows after the move), or None if it never
/// is. Windows are the stretches between samples.
pub fn settle_faults(series: &[(u64, u64)], move_at: u64) -> Option<u64> {
    let start = series.iter().position(|&(a, _)| a >= move_at)?;
    // A sample taken twice at one point (the move's own marker on a window
    // boundary) is one sample: windows have accesses.
    let mut after: Vec<(u64, u64)> = series[start..].to_vec();
    after.dedup_by_key(|s| s.0);
    if after.len() < 4 {
        return None;
    }
    let ratio = |w: &[(u64, u64)]| {
        let (a0, r0) = w[0];
        let (a1, r1) = w[w.len() - 1];
        (r1 - r0) as f64 / (a1 - a0).max(1) as f64
    };
    let steady = ratio(&after[after.len() / 2..]);
    let after = &after[..];
    let r_move = after[0].1;
    after
        .windows(2)
        .find_map(|w| (ratio(w) <= steady + 0.01).then(|| w[0].1 - r_move))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_is_counted_from_the_move() {
        // 10 windows of 100 accesses after a move at 1000: misses 50, 30, 10,
        // then 2 each (steady 2%).
        let mut s = vec![(1000, 0)];
        let mut r = 0;
        for (i, m) in [50, 30, 10, 2, 2, 2, 2, 2, 2, 2].iter().enumerate() {
            r += m;
            s.push((1100 + 100 * i as u64, r));
        }
        assert_eq!(settle_faults(&s, 1000), Some(90));
        // The move's marker repeats the sample at the move: still 90.
        let mut twice = s.clone();
        twice.insert(1, (1000, 0));
        assert_eq!(settle_faults(&twice, 1000), Some(90));
        assert_eq!(settle_faults(&s, 5000), None);
    }
}
