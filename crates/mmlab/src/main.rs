//! `mmlab`: mmkit's lab. It runs the classic mm scalability experiments as
//! workloads, each in several variants (mmkit's own policies and the peers a user
//! would pick instead), side by side in one process, and reports the results as
//! mailing-list style tables, JSON Lines and SVG plots.
//!
//! Layers:
//! - `cli`: command line (clap), turns flags into a run configuration;
//! - `runner`: runs the points (workload x threads x variant) interleaved, and the
//!   timed multi-thread harness of the per-thread-loop workloads;
//! - `phase`: the warmup / measure / stop phases of a timed point and the one
//!   driver that runs a point's threads through them;
//! - `peers`: the variants: mmkit's policies and the peer allocators;
//! - `workloads/`: one file per workload, behind the `Workload` trait;
//! - `settings`: the keys of `--set` (custom variants from builder policies);
//! - `record`: the JSON Lines record, one per figure;
//! - `compare`: `mmlab compare`, several runs' records side by side;
//! - `host/`: the host side, one file per job: CPU pinning, host facts (where a
//!   run was measured, git commit), host memory, memory cgroups, a RAM-backed
//!   swap device and its teardown, and the child-process protocol;
//! - `results`: `mmlab results`, docs/results.md and the README's seeds table
//!   from a run's records;
//! - `report/`: tables (`table`), plots (`plot`), the figures (`figures`),
//!   the seeds' table (`seeds`) and the report directory (`mod`).

mod cli;
mod compare;
mod host;
mod peers;
mod phase;
mod plan;
mod record;
mod report;
mod results;
mod runner;
mod settings;
mod workloads;

fn main() -> anyhow::Result<()> {
    cli::main()
}
