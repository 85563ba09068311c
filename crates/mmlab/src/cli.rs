//! The command line: `mmlab run [WORKLOAD...]`, `mmlab list`, `mmlab compare`
//! and `mmlab results`. Turns flags
//! into a `runner::Config`, runs, prints the tables and the figures, and writes
//! the report directory and the optional JSON Lines file.

use crate::compare;
use crate::host::facts as host_facts;
use crate::peers::VARIANTS;
use crate::plan;
use crate::record::write_jsonl;
use crate::report;
use crate::results;
use crate::runner::{self, Config, Timing};
use crate::settings::{self, Settings};
use crate::workloads::{self, Workload};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Measured interval per point, full run.
pub const DURATION_MS: u64 = 500;
/// Rounds per point in a full run (the median is reported).
pub const ROUNDS: usize = 3;
/// Measured interval per point, `--quick`.
pub const QUICK_DURATION_MS: u64 = 150;

#[derive(Parser, Debug)]
#[command(
    name = "mmlab",
    version,
    about = "mmkit's lab: the classic mm scalability experiments, variants side by side"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run workloads (default: all) in every variant and thread count.
    Run(Box<RunArgs>),
    /// List the workloads, variants, metrics and the keys of --set.
    List,
    /// Compare runs: for each point, a column per JSON Lines file with the
    /// change against the first (~: within the spread of the rounds).
    Compare(CompareArgs),
    /// Write docs/results.md (and the README's seeds table) from a run's JSON
    /// Lines: the run's command, commit and host, the seeds, the figures and
    /// every table.
    Results(ResultsArgs),
    /// Internal: the child process of pmbench's kernel variant.
    #[command(name = "pmbench-child", hide = true)]
    PmbenchChild {
        threads: usize,
        wss_bytes: usize,
        deadline_ms: u64,
    },
    /// Internal: the child process of reclaim's kernel peer.
    #[command(name = "reclaim-child", hide = true)]
    ReclaimChild {
        deadline_ms: u64,
        #[arg(num_args = 3)]
        spec: Vec<String>,
    },
    /// Internal: a child process of memcg's kernel peer.
    #[command(name = "memcg-child", hide = true)]
    MemcgChild {
        role: String,
        case: String,
        bytes: u64,
        threads: usize,
        deadline_ms: u64,
    },
    /// Page traces of real programs for `run reclaim --trace`.
    #[command(subcommand)]
    Trace(TraceCommand),
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Run PROGRAM under valgrind's lackey and write its data references as a
    /// page trace (exit status 77 when valgrind is missing).
    Record {
        /// The trace file [default: PROGRAM's name with .mmtrace].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The program and its arguments (after `--`).
        #[arg(required = true, last = true, value_name = "PROGRAM ARGS")]
        program: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// JSON Lines files of `mmlab run --json` (or a report's results.jsonl); the
    /// first is the baseline.
    #[arg(required = true, num_args = 2.., value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Markdown tables instead of aligned text.
    #[arg(long)]
    md: bool,
}

#[derive(clap::Args, Debug)]
struct ResultsArgs {
    /// JSON Lines of `mmlab run --json` (or a report's results.jsonl).
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// The Markdown page to write.
    #[arg(long, value_name = "PATH", default_value = "docs/results.md")]
    out: PathBuf,
    /// Also rewrite the seeds' table between `<!-- results:seeds -->` and
    /// `<!-- /results -->` in this file (e.g. README.md).
    #[arg(long, value_name = "PATH")]
    readme: Option<PathBuf>,
    /// Write nothing; fail if a file differs from what the records give.
    #[arg(long)]
    check: bool,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Workloads to run (default: all; see `mmlab list`).
    workloads: Vec<String>,
    /// Small and short enough for CI (150 ms points, small data sizes, at most a 256 MiB
    /// arena, no progress bar).
    #[arg(long)]
    quick: bool,
    /// Thread counts, comma-separated [default: each workload's, 1,2,4,8].
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Variants, comma-separated, in column order; the first is the baseline
    /// [default: all that apply].
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// A custom variant: mmkit's defaults changed by KEY=VALUE settings, e.g.
    /// `--set merge=eager,pcp_high=fixed`; named `set:merge=eager,pcp_high=fixed`.
    /// Repeat for several; they follow the --variants columns [without
    /// --variants: after `mmkit` alone]. `mmlab list` shows the keys.
    #[arg(long = "set", value_name = "KEY=VALUE,...", value_parser = parse_settings)]
    set: Vec<Settings>,
    /// Measured interval per point in ms [default: 500, quick: 150].
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Rounds per point: the variants run interleaved this many times and the
    /// median is reported [default: 3, quick: 1].
    #[arg(long)]
    rounds: Option<usize>,
    /// Unmeasured warmup before each point in ms [default: a fifth of the duration].
    #[arg(long)]
    warmup_ms: Option<u64>,
    /// Also write every record to FILE as JSON Lines.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Report directory (tables, plots, results.jsonl, README.md).
    #[arg(long, value_name = "DIR", default_value = "report")]
    report: PathBuf,
    /// Memory budget of the run, bytes or with a suffix: 4G, 512M, 1GiB
    /// [default: half of MemAvailable]. Data sizes and arenas scale down to fit it
    /// (the header and every record's params say so); a budget too small for the
    /// smallest sizes is refused.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    memory: Option<u64>,
    /// Swap device of the swapping workloads' (pmbench) mmkit variants: `ram`
    /// or `file:PATH`, a real file (created, removed afterwards) [default: ram].
    #[arg(long, value_name = "ram|file:PATH", value_parser = parse_swap)]
    swap: Option<SwapArg>,
    /// reclaim: replay this trace file (`mmlab trace record`) instead of the
    /// synthetic cases.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// reclaim with --trace: memory as a fraction of the trace's footprint.
    #[arg(long, value_name = "F", default_value_t = 0.5, requires = "trace")]
    memory_fraction: f64,
}

/// `--swap`: a RAM device or a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapArg {
    Ram,
    File(PathBuf),
}

fn parse_swap(s: &str) -> Result<SwapArg, String> {
    match s.split_once(':') {
        _ if s == "ram" => Ok(SwapArg::Ram),
        Some(("file", p)) if !p.is_empty() => Ok(SwapArg::File(PathBuf::from(p))),
        _ => Err(format!("{s:?}: expected ram or file:PATH")),
    }
}

fn parse_settings(s: &str) -> Result<Settings, String> {
    Settings::parse(s)
}

/// Parses "1073741824", "256M", "256MiB", "1g", "64k" (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a number of bytes such as 268435456 or 256M"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "{s:?}: unknown size suffix {other:?} (use K, M, G or T)"
            ))
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// Entry point.
pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::List => {
            print!("{}", list_text());
            Ok(())
        }
        Command::Run(args) => run(*args),
        Command::Compare(args) => {
            print!("{}", compare::run(&args.files, args.md)?);
            Ok(())
        }
        Command::Results(a) => {
            print!(
                "{}",
                results::run(&results::Options {
                    file: a.file,
                    out: a.out,
                    readme: a.readme,
                    check: a.check,
                })?
            );
            Ok(())
        }
        Command::PmbenchChild {
            threads,
            wss_bytes,
            deadline_ms,
        } => workloads::pmbench::kernel::child_main(threads, wss_bytes, deadline_ms),
        Command::ReclaimChild { deadline_ms, spec } => {
            workloads::reclaim::kernel::child_main(deadline_ms, &spec)
        }
        Command::MemcgChild {
            role,
            case,
            bytes,
            threads,
            deadline_ms,
        } => workloads::memcg::kernel::child_main(&role, &case, bytes, threads, deadline_ms),
        Command::Trace(TraceCommand::Record { out, program }) => trace_record(out, &program),
    }
}

/// `mmlab trace record`.
fn trace_record(out: Option<PathBuf>, program: &[String]) -> Result<()> {
    use workloads::reclaim::record;
    if let Some(why) = record::valgrind_missing() {
        eprintln!("skipped: {why}");
        std::process::exit(record::SKIPPED);
    }
    let out = out.unwrap_or_else(|| {
        let name = std::path::Path::new(&program[0])
            .file_name()
            .map_or("trace".into(), |n| n.to_string_lossy().into_owned());
        PathBuf::from(format!("{name}.mmtrace"))
    });
    record::record(&out, program)?;
    Ok(())
}

/// The text of `mmlab list`.
fn list_text() -> String {
    let mut s = String::from("workloads:\n");
    for w in workloads::all() {
        let metrics: Vec<&str> = w.metrics().iter().map(|m| m.name).collect();
        s += &format!(
            "  {:<22} {}\n  {:<22} threads {:?}; metrics: {}\n",
            w.name(),
            w.description(),
            "",
            w.default_threads(),
            metrics.join(", ")
        );
    }
    s += "variants (of the allocator workloads):\n";
    for v in VARIANTS {
        s += &format!("  {:<22} {}\n", v.name, v.description);
    }
    for w in workloads::all() {
        if let Some(own) = w.own_variants() {
            s += &format!("variants of {}:\n", w.name());
            for v in own {
                s += &format!("  {:<22} {}\n", v.name, v.description);
            }
        }
    }
    s += &settings::list_text();
    s += "metrics:\n";
    for m in workloads::all_metrics() {
        let only = if m.mmkit_only {
            " (mmkit variants)"
        } else {
            ""
        };
        s += &format!("  {:<31} [{}] {}{}\n", m.name, m.unit, m.description, only);
    }
    s
}

fn run(args: RunArgs) -> Result<()> {
    let list: Vec<&dyn Workload> = if args.workloads.is_empty() {
        workloads::all()
    } else {
        args.workloads
            .iter()
            .map(|n| {
                workloads::by_name(n).with_context(|| {
                    let names: Vec<_> = workloads::all().iter().map(|w| w.name()).collect();
                    format!("unknown workload {n:?}; workloads: {}", names.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    if let Some(v) = &args.variants {
        if v.is_empty() {
            bail!("--variants needs at least one variant");
        }
        for name in v {
            if !workloads::is_variant(name) {
                let mut names: Vec<&str> = Vec::new();
                for w in workloads::all() {
                    for v in workloads::variants_of(w) {
                        if !names.contains(&v.name) {
                            names.push(v.name);
                        }
                    }
                }
                let hint = if settings::is_custom(name) {
                    " (custom variants go in --set)"
                } else {
                    ""
                };
                bail!(
                    "unknown variant {name:?}{hint}; variants: {}",
                    names.join(", ")
                );
            }
        }
    }
    if let Some(path) = &args.trace {
        if !list.iter().any(|w| w.name() == "reclaim") {
            bail!("--trace is reclaim's: run `mmlab run reclaim --trace FILE`");
        }
        workloads::reclaim::set_trace(workloads::reclaim::TraceArg {
            path: path.clone(),
            memory_fraction: args.memory_fraction,
        })
        .map_err(|e| anyhow::anyhow!(e))?;
    }
    if let Some(t) = &args.threads {
        if t.is_empty() || t.contains(&0) {
            bail!("--threads needs thread counts of at least 1, e.g. --threads 1,2,4,8");
        }
    }
    let duration_ms = args.duration_ms.unwrap_or(if args.quick {
        QUICK_DURATION_MS
    } else {
        DURATION_MS
    });
    if duration_ms == 0 {
        bail!("--duration-ms must be at least 1");
    }
    let warmup_ms = args.warmup_ms.unwrap_or(duration_ms / 5);
    let command: Vec<String> = std::env::args().collect();
    let command = command.join(" ");
    let host = host_facts::host();
    let commit = host_facts::commit();
    let mut params = serde_json::Map::new();
    params.insert("host".into(), host.clone().into());
    params.insert("command".into(), command.clone().into());
    if let Some(c) = &commit {
        params.insert("commit".into(), c.clone().into());
    }
    let mut config = Config {
        threads: args.threads.clone(),
        variants: args.variants.clone(),
        timing: Timing {
            warmup: Duration::from_millis(warmup_ms),
            duration: Duration::from_millis(duration_ms),
            quick: args.quick,
        },
        memory: 0,
        progress: !args.quick && std::io::stdout().is_terminal(),
        rounds: args.rounds.unwrap_or(if args.quick { 1 } else { ROUNDS }),
        settings: args.set.clone(),
        params,
        swap_file: match &args.swap {
            Some(SwapArg::File(p)) => Some(p.clone()),
            _ => None,
        },
        sizes: Vec::new(),
    };
    let (budget, source) = plan::budget(args.memory, || {
        let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
        plan::available(&text, plan::cgroup_headroom())
    })?;
    // Each workload runs alone, after the one before it freed its memory: each
    // gets the largest sizes that fit the budget.
    let mut plans = Vec::new();
    for &w in &list {
        let p = plan::choose(budget, source, args.quick, |small, arena| {
            config.timing.quick = small;
            config.memory = arena;
            w.peak_bytes(&config, runner::variants_for(w, &config).len()) as u64
        })
        .with_context(|| format!("planning {}", w.name()))?;
        config.sizes.push((w.name(), p.small, p.arena, p.scaled));
        plans.push((w.name(), p));
    }
    config.timing.quick = args.quick;
    config.memory = if args.quick { 256 << 20 } else { 1 << 30 };
    config.params.insert("memory_budget".into(), budget.into());
    let peak = plans.iter().map(|(_, p)| p.peak).max().unwrap_or(0);
    let scaled: Vec<String> = plans
        .iter()
        .filter(|(_, p)| p.scaled)
        .map(|(n, p)| format!("{n} ({})", p.sizes()))
        .collect();
    let plan_line = format!(
        "{}, estimated peak {} MiB; {}",
        plan::describe_budget(budget, source),
        peak.div_ceil(1 << 20),
        if scaled.is_empty() {
            "nothing scaled".to_string()
        } else {
            format!("scaled down to fit: {}", scaled.join(", "))
        }
    );
    let memory = config.memory as u64;
    let facts: Vec<String> = host_facts::describe(&host)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!(
        "# {command}\n# {} ms per point after {} ms warmup, median of {} rounds, {} MiB arena unless scaled\n\
         # {}\n# host: {}; commit {}\n",
        duration_ms,
        warmup_ms,
        config.rounds,
        memory >> 20,
        plan_line,
        facts.join(", "),
        commit.as_deref().unwrap_or("unknown")
    );

    let mut warnings = Vec::new();
    let records = runner::run(&config, &list, &mut warnings, |w, recs| {
        print!("{}", report::text_tables(w, recs));
    })?;

    println!("figures:");
    for f in report::figures::figures(&records) {
        println!("  {f}");
    }
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the directory of --json {}", path.display()))?;
        }
        let f = std::fs::File::create(path)
            .with_context(|| format!("creating --json {}", path.display()))?;
        write_jsonl(std::io::BufWriter::new(f), &records)?;
    }
    let meta = report::RunInfo {
        command: &command,
        commit: commit.as_deref(),
        host: &host,
        warnings: &warnings,
    };
    report::write_dir(&args.report, &list, &records, &meta)?;
    println!("\nreport written to {}/", args.report.display());
    if !warnings.is_empty() {
        bail!(
            "{} check(s) failed after workloads (see warnings above)",
            warnings.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn swap_flag() {
        assert_eq!(parse_swap("ram"), Ok(SwapArg::Ram));
        assert_eq!(
            parse_swap("file:/var/tmp/s"),
            Ok(SwapArg::File(PathBuf::from("/var/tmp/s")))
        );
        assert!(parse_swap("file:").is_err());
        assert!(parse_swap("disk").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from([
            "mmlab",
            "run",
            "alloc_free",
            "--quick",
            "--threads",
            "1,2",
            "--variants",
            "mmkit,mimalloc",
            "--memory",
            "64M",
            "--json",
            "x.jsonl",
        ])
        .unwrap();
        let Command::Run(a) = c.command else {
            panic!("not run")
        };
        assert_eq!(a.workloads, ["alloc_free"]);
        assert_eq!(a.threads, Some(vec![1, 2]));
        assert_eq!(a.variants.unwrap(), ["mmkit", "mimalloc"]);
        assert_eq!(a.memory, Some(64 << 20));
        assert!(a.quick);
    }

    #[test]
    fn set_and_compare_parse() {
        let c = Cli::try_parse_from([
            "mmlab",
            "run",
            "alloc_free",
            "--set",
            "merge=eager,pcp_high=fixed",
            "--set",
            "pcp=off",
            "--variants",
            "mmkit",
        ])
        .unwrap();
        let Command::Run(a) = c.command else {
            panic!("not run")
        };
        let names: Vec<String> = a.set.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["set:merge=eager,pcp_high=fixed", "set:pcp=off"]);
        let e = Cli::try_parse_from(["mmlab", "run", "--set", "merge=sometimes"]).unwrap_err();
        assert!(e.to_string().contains("eager|lazy|lazy-nomerge"), "{e}");
        let e = Cli::try_parse_from(["mmlab", "run", "--set", "nope=1"]).unwrap_err();
        assert!(e.to_string().contains("fault_around"), "{e}");
        let c = Cli::try_parse_from(["mmlab", "compare", "a.jsonl", "b.jsonl", "--md"]).unwrap();
        let Command::Compare(a) = c.command else {
            panic!("not compare")
        };
        assert_eq!(a.files.len(), 2);
        assert!(a.md);
        assert!(Cli::try_parse_from(["mmlab", "compare", "a.jsonl"]).is_err());
    }

    /// The Markdown tables of `md`: each table's header cells and, per row, its
    /// first cell with the backticks taken off.
    fn doc_tables(md: &str) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
        let cells = |l: &str| -> Vec<String> {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        };
        let lines: Vec<&str> = md.lines().collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i + 1 < lines.len() {
            if lines[i].starts_with('|') && lines[i + 1].starts_with("|---") {
                let header = cells(lines[i]);
                let mut rows = Vec::new();
                i += 2;
                while i < lines.len() && lines[i].starts_with('|') {
                    rows.push(cells(lines[i]));
                    i += 1;
                }
                out.push((header, rows));
            } else {
                i += 1;
            }
        }
        out
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// docs/lab.md's lists of workloads, variants, metrics and `--set` keys are
    /// those `mmlab list` prints (it is built from the same registries): none
    /// missing, none stale, and each metric with its unit.
    #[test]
    fn lab_md_lists_what_mmlab_list_lists() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/lab.md");
        let md = std::fs::read_to_string(path).unwrap();
        let tables = doc_tables(&md);
        let table = |first: &str, second: &str| -> Vec<Vec<String>> {
            let found: Vec<_> = tables
                .iter()
                .filter(|(h, _)| h[0] == first && h.get(1).map(String::as_str) == Some(second))
                .collect();
            assert_eq!(
                found.len(),
                1,
                "docs/lab.md: one table | {first} | {second} |"
            );
            found[0].1.clone()
        };
        let names = |rows: &[Vec<String>]| sorted(rows.iter().map(|r| r[0].clone()).collect());

        let workloads = table("name", "what each thread does");
        let want = sorted(
            workloads::all()
                .iter()
                .map(|w| w.name().to_string())
                .collect(),
        );
        assert_eq!(names(&workloads), want, "docs/lab.md's workloads");

        let variants = table("name", "what it is");
        let want = sorted(VARIANTS.iter().map(|v| v.name.to_string()).collect());
        assert_eq!(names(&variants), want, "docs/lab.md's allocator variants");

        let metrics = table("name", "unit");
        let want = sorted(
            workloads::all_metrics()
                .iter()
                .map(|m| m.name.to_string())
                .collect(),
        );
        assert_eq!(names(&metrics), want, "docs/lab.md's metrics");
        for m in workloads::all_metrics() {
            let row = metrics.iter().find(|r| r[0] == m.name).unwrap();
            assert_eq!(row[1], m.unit, "docs/lab.md: the unit of {}", m.name);
        }

        let keys = table("key", "values");
        let want = sorted(settings::KEYS.iter().map(|k| k.name.to_string()).collect());
        assert_eq!(names(&keys), want, "docs/lab.md's --set keys");

        // Every workload's own variants are documented, and every row of a
        // variant table names a variant of some workload.
        let mut all: Vec<&str> = Vec::new();
        for w in workloads::all() {
            for v in workloads::variants_of(w) {
                assert!(
                    md.contains(&format!("`{}`", v.name)),
                    "docs/lab.md does not name {}'s variant {}",
                    w.name(),
                    v.name
                );
                all.push(v.name);
            }
        }
        for (h, rows) in &tables {
            if h[0] == "variant" {
                // A row may name several: `a`, `b`, `c`.
                for name in rows.iter().flat_map(|r| r[0].split("`, `")) {
                    assert!(all.contains(&name), "docs/lab.md: {name} is no variant");
                }
            }
        }
    }

    #[test]
    fn list_names_everything() {
        let s = list_text();
        for w in workloads::all() {
            assert!(s.contains(w.name()));
        }
        for v in VARIANTS {
            assert!(s.contains(v.name));
        }
        assert!(s.contains("zone_lock_contended_pct"));
        for k in settings::KEYS {
            assert!(s.contains(k.name), "{}", k.name);
        }
    }
}
