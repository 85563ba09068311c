//! Runs the lab: for each workload and thread count, every variant in turn
//! (A, B, C at 1 thread, then A, B, C at 2 threads, ...), all in this process,
//! so that the variants of a figure are measured side by side under the same
//! conditions. Also the timed multi-thread harness (`run_workers`) that the
//! workloads use:
//!
//! 1. each thread (pinned by `phase::drive` to a CPU: thread i on the i-th
//!    allowed CPU, round robin) builds its worker and waits on a barrier with
//!    the main thread;
//! 2. warmup: workers run, their ops are not counted;
//! 3. the main thread snapshots the zone lock counters, measures for the
//!    duration (`PhaseWord::measure_for`) and takes the counters again;
//! 4. every worker counts its ops in a local counter; after the stop, the workers
//!    meet on a second barrier (so nothing is still in flight between them) and
//!    release what they hold.
//!
//! The result is total ops / elapsed, the lock counter delta and the number of
//! failed allocations (out of memory is counted, never a panic).

use crate::host::cpu;
use crate::peers::Peer;
use crate::phase::{self, Placement};
use crate::record::Record;
use crate::settings::Settings;
use crate::workloads::{self, Workload};
use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use mmkit::LockStats;
use std::sync::Barrier;
use std::time::Duration;

/// How long each measured point runs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Unmeasured run before the measured interval (caches, PCP lists, malloc
    /// thread caches, first-touch faults of the mallocs).
    pub warmup: Duration,
    /// The measured interval.
    pub duration: Duration,
    /// `--quick`: workloads with a data size (the address-space workloads) use
    /// their small one.
    pub quick: bool,
}

/// What a run does, from the command line.
#[derive(Clone)]
pub struct Config {
    /// Thread counts; `None` means each workload's default.
    pub threads: Option<Vec<usize>>,
    /// Variants in column order; `None` means every variant the workload applies to.
    pub variants: Option<Vec<String>>,
    pub timing: Timing,
    /// Bytes of mmkit arena (and of the buddy peer's buffer).
    pub memory: usize,
    /// Show a progress bar.
    pub progress: bool,
    /// Rounds per point (variants interleaved in each round); the median is reported.
    pub rounds: usize,
    /// Custom variants (`--set`), after the named ones.
    pub settings: Vec<Settings>,
    /// Put into every record's params (the host, the command line, the commit).
    pub params: serde_json::Map<String, serde_json::Value>,
    /// `--swap file:PATH`: the swapping workloads' mmkit variants swap to this
    /// file instead of a RAM device.
    pub swap_file: Option<std::path::PathBuf>,
    /// The memory plan's sizes per workload: (name, small data sizes, arena,
    /// scaled); a workload not listed runs with `timing.quick` and `memory`.
    pub sizes: Vec<(&'static str, bool, usize, bool)>,
}

impl Config {
    /// This run's config for workload `name`: its planned sizes, and
    /// `scaled`/`memory_arena` in the records' params.
    pub fn for_workload(&self, name: &str) -> Config {
        let mut c = self.clone();
        if let Some(&(_, small, arena, scaled)) = self.sizes.iter().find(|s| s.0 == name) {
            c.timing.quick = small;
            c.memory = arena;
            c.params.insert("small_sizes".into(), small.into());
            c.params
                .insert("memory_arena".into(), (arena as u64).into());
            c.params.insert("scaled".into(), scaled.into());
        }
        c
    }
}

/// One unit of a workload's per-thread loop.
pub trait Worker {
    /// Does one step of the loop; returns how many ops it completed.
    fn step(&mut self) -> u64;
    /// Releases whatever the worker still holds. Called once, after the stop and
    /// after every worker has left its loop.
    fn finish(&mut self) {}
    /// Allocations that failed (out of memory) during the whole run.
    fn failures(&self) -> u64 {
        0
    }
}

/// What `run_workers` measured.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Ops counted in the measured interval, all threads summed.
    pub ops: u64,
    pub elapsed: Duration,
    /// Zone lock counters over the measured interval (mmkit variants).
    pub lock: Option<LockStats>,
    /// Failed allocations, all threads summed.
    pub failures: u64,
}

impl Measured {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs `threads` workers built by `make(thread_index)` (on their own thread)
/// with the warmup and measured interval of `timing`; see the module comment.
pub fn run_workers<W, F>(peer: &Peer, threads: usize, timing: &Timing, make: F) -> Measured
where
    W: Worker,
    F: Fn(usize) -> W + Sync,
{
    let threads = threads.max(1);
    let start = Barrier::new(threads + 1);
    let stopped = Barrier::new(threads);
    let cpus = cpu::allowed_cpus();
    let ((elapsed, lock), per_thread) = phase::drive(
        vec![(); threads],
        |tid| Placement::on(cpu::round_robin(&cpus, tid)),
        |tid, (), word| {
            let mut w = make(tid);
            start.wait();
            let ops = phase::step_until_stop(&mut w, word);
            stopped.wait();
            w.finish();
            (ops, w.failures())
        },
        |word| {
            start.wait();
            std::thread::sleep(timing.warmup);
            let before = peer.lock_stats();
            let elapsed = word.measure_for(timing.duration);
            let after = peer.lock_stats();
            (elapsed, after.zip(before).map(|(a, b)| a.since(&b)))
        },
    );
    Measured {
        ops: per_thread.iter().map(|r| r.0).sum(),
        elapsed,
        lock,
        failures: per_thread.iter().map(|r| r.1).sum(),
    }
}

/// The variants `workload` runs in under `config`, in column order: those of
/// `--variants` that it knows (its own variants, or the allocator variants), else
/// every one it applies to (only `mmkit`, when there are custom variants); then
/// the custom variants of `--set`, for a workload that has mmkit variants.
pub fn variants_for(workload: &dyn Workload, config: &Config) -> Vec<String> {
    let known = workloads::variants_of(workload);
    let mut names: Vec<String> = match &config.variants {
        Some(v) => v
            .iter()
            .filter(|n| known.iter().any(|k| k.name == n.as_str()))
            .cloned()
            .collect(),
        None if !config.settings.is_empty() => known
            .iter()
            .filter(|v| v.name == "mmkit")
            .map(|v| v.name.to_string())
            .collect(),
        None => known
            .iter()
            .map(|v| v.name.to_string())
            .filter(|v| workload.applies_to(v))
            .collect(),
    };
    if known.iter().any(|k| k.name.starts_with("mmkit")) {
        for s in &config.settings {
            let name = s.name();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Builds variant `name` of `w`: a custom variant from its settings with the
/// workload's mmkit arena, any other as the workload builds it.
fn build_variant(w: &dyn Workload, name: &str, config: &Config) -> Result<Peer> {
    match config.settings.iter().find(|s| s.name() == name) {
        Some(s) => Peer::from_settings(s, w.mmkit_arena(config)),
        None => w.build(name, config),
    }
}

/// The thread counts `workload` runs at under `config`.
pub fn threads_for(workload: &dyn Workload, config: &Config) -> Vec<usize> {
    config.threads.clone().unwrap_or_else(|| {
        if config.timing.quick {
            workload.quick_threads().to_vec()
        } else {
            workload.default_threads().to_vec()
        }
    })
}

/// Runs every workload in every variant and thread count, interleaved as the
/// module comment says. `done` is called after each workload with its records
/// (through the progress bar, so printing from it is clean). Problems that do not
/// stop the run (a failed `check` after a workload) go to stderr and `warnings`.
fn rounds_for(w: &dyn Workload, config: &Config) -> usize {
    if w.repeatable() {
        config.rounds.max(1)
    } else {
        1
    }
}

/// The whole run's ETA from the points done so far: the mean time per point
/// done, times the points left ("eta 3m20s, 4.2s/point"; "eta ?" before the
/// first point is done). Every point counts alike, whatever its workload.
pub fn eta_text(elapsed: Duration, done: u64, total: u64) -> String {
    if done == 0 {
        return "eta ?".into();
    }
    let per = elapsed.as_secs_f64() / done as f64;
    let left = (per * total.saturating_sub(done) as f64).round() as u64;
    let eta = match (left / 3600, left / 60 % 60, left % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    };
    format!("eta {eta}, {per:.1}s/point")
}

pub fn run(
    config: &Config,
    list: &[&dyn Workload],
    warnings: &mut Vec<String>,
    mut done: impl FnMut(&dyn Workload, &[Record]),
) -> Result<Vec<Record>> {
    let total: usize = list
        .iter()
        .map(|w| {
            let config = &config.for_workload(w.name());
            variants_for(*w, config).len() * threads_for(*w, config).len() * rounds_for(*w, config)
        })
        .sum();
    let pb = if config.progress {
        let pb = ProgressBar::new(total as u64);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} points ({run_eta}) {msg}",
            )
            .expect("valid template")
            .with_key(
                "run_eta",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let text = eta_text(s.elapsed(), s.pos(), s.len().unwrap_or(0));
                    let _ = w.write_str(&text);
                },
            ),
        );
        pb.enable_steady_tick(Duration::from_millis(250));
        pb
    } else {
        ProgressBar::hidden()
    };
    let mut all = Vec::new();
    for &w in list {
        let config = &config.for_workload(w.name());
        let variants = variants_for(w, config);
        let threads = threads_for(w, config);
        pb.set_message(format!(
            "{}: building {} variants",
            w.name(),
            variants.len()
        ));
        let peers = variants
            .iter()
            .map(|v| build_variant(w, v, config))
            .collect::<Result<Vec<_>>>()?;
        let mut records = Vec::new();
        for &t in &threads {
            // Rounds of the variants interleaved, then the median of each figure:
            // a burst of noise on this shared machine hits one round of one
            // variant, not the comparison.
            let mut rounds: Vec<Vec<Vec<workloads::Figure>>> = vec![Vec::new(); variants.len()];
            for _ in 0..rounds_for(w, config) {
                for (i, (name, peer)) in variants.iter().zip(&peers).enumerate() {
                    pb.set_message(format!("{} {} threads={}", w.name(), name, t));
                    peer.settle();
                    rounds[i].push(w.run(peer, t, &config.timing));
                    pb.inc(1);
                }
            }
            for (name, r) in variants.iter().zip(&rounds) {
                let figures = workloads::median_figures(r);
                let mut recs = workloads::to_records(w, name, t, config, figures);
                if r.len() > 1 {
                    for rec in &mut recs {
                        rec.rounds = Some(workloads::round_values(r, &rec.metric, &rec.case));
                    }
                }
                records.extend(recs);
            }
        }
        for (name, peer) in variants.iter().zip(&peers) {
            if let Err(e) = peer.check() {
                let msg = format!("{} / {}: {:#}", w.name(), name, e);
                pb.suspend(|| eprintln!("warning: {msg}"));
                warnings.push(msg);
            }
        }
        drop(peers);
        pb.suspend(|| done(w, &records));
        all.extend(records);
    }
    pb.finish_and_clear();
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(variants: Option<Vec<String>>, sets: &[&str]) -> Config {
        Config {
            threads: Some(vec![1]),
            variants,
            timing: Timing {
                warmup: Duration::from_millis(1),
                duration: Duration::from_millis(5),
                quick: true,
            },
            memory: 16 << 20,
            progress: false,
            rounds: 2,
            settings: sets.iter().map(|s| Settings::parse(s).unwrap()).collect(),
            params: serde_json::Map::new(),
            swap_file: None,
            sizes: Vec::new(),
        }
    }

    #[test]
    fn eta_is_the_mean_point_time_times_the_points_left() {
        let s = Duration::from_secs;
        assert_eq!(eta_text(s(10), 0, 100), "eta ?");
        assert_eq!(eta_text(s(10), 5, 10), "eta 10s, 2.0s/point");
        assert_eq!(eta_text(s(100), 10, 30), "eta 3m20s, 10.0s/point");
        assert_eq!(eta_text(s(3600), 1, 3), "eta 2h00m, 3600.0s/point");
        assert_eq!(eta_text(s(7), 10, 10), "eta 0s, 0.7s/point");
        // More done than planned (a workload added points): nothing left.
        assert_eq!(eta_text(s(7), 11, 10), "eta 0s, 0.6s/point");
    }

    #[test]
    fn custom_variants_follow_the_named_ones() {
        let w = workloads::by_name("alloc_free").unwrap();
        let c = config(Some(vec!["mmkit".into()]), &["merge=eager", "pcp=off"]);
        assert_eq!(
            variants_for(w, &c),
            ["mmkit", "set:merge=eager", "set:pcp=off"]
        );
        // Without --variants: mmkit alone, then the custom ones.
        let c = config(None, &["pcp=off"]);
        assert_eq!(variants_for(w, &c), ["mmkit", "set:pcp=off"]);
        // A workload with its own variants takes them too.
        let pf = workloads::by_name("page_fault1").unwrap();
        assert_eq!(variants_for(pf, &c), ["mmkit", "set:pcp=off"]);
        assert!(variants_for(w, &config(None, &[])).len() > 2);
    }

    #[test]
    fn a_custom_variant_runs_and_records_its_rounds() {
        let w = workloads::by_name("alloc_free").unwrap();
        let c = config(Some(vec!["mmkit".into()]), &["merge=eager,fault_around=1"]);
        let mut warnings = Vec::new();
        let recs = run(&c, &[w], &mut warnings, |_, _| {}).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let r = recs
            .iter()
            .find(|r| r.variant == "set:merge=eager,fault_around=1" && r.metric == "ops_per_sec")
            .unwrap();
        assert!(r.value > 0.0);
        assert_eq!(r.rounds.as_ref().map(Vec::len), Some(2));
        let p = r.params.as_ref().unwrap();
        assert_eq!(p["set"]["merge"], "eager");
    }
}
