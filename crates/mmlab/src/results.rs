//! `mmlab results FILE.jsonl [--out docs/results.md] [--readme README.md]
//! [--check]`: the results page written from a run's JSON Lines, so that no
//! figure is ever copied by hand. The page holds where and how the run was taken
//! (the command line, the commit and the host, from the records' `params`), the
//! seeds' table, the figures, and every table of every workload (a column per
//! variant, as `mmlab run` prints them).
//!
//! The README carries the seeds' table between two markers,
//! `<!-- results:seeds -->` and `<!-- /results -->`; `--readme` rewrites what is
//! between them, and `--check` fails instead of writing when a file differs from
//! what the records give. A test holds the committed docs/results.md and the
//! README's block to the committed docs/results.jsonl.
//!
//! The output depends on the records alone (no clock, no host lookups), so the
//! same file always gives the same page.

use crate::compare;
use crate::host::facts as host_facts;
use crate::record::Record;
use crate::report::{figures, seeds, table};
use crate::workloads;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The marker that opens the README's generated block.
pub const BEGIN: &str = "<!-- results:seeds -->";
/// The marker that closes it.
pub const END: &str = "<!-- /results -->";

/// What `mmlab results` does.
pub struct Options {
    pub file: PathBuf,
    pub out: PathBuf,
    pub readme: Option<PathBuf>,
    pub check: bool,
}

/// The distinct string values of `params.KEY` over the records, in order of
/// first appearance.
fn param_values(records: &[Record], key: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records {
        if let Some(Value::String(s)) = r.params.as_ref().and_then(|p| p.get(key)) {
            if !out.contains(s) {
                out.push(s.clone());
            }
        }
    }
    out
}

/// The distinct host descriptions (`params.host`), in order of first appearance.
fn hosts(records: &[Record]) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = Vec::new();
    for r in records {
        if let Some(Value::Object(h)) = r.params.as_ref().and_then(|p| p.get("host")) {
            let d = host_facts::describe(h);
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

/// One line on where the figures come from: "`CMD` at commit C on CPU (N CPUs)".
fn provenance(records: &[Record]) -> String {
    let commands = param_values(records, "command");
    let commits = param_values(records, "commit");
    let host = hosts(records)
        .into_iter()
        .next()
        .map(|h| {
            let get = |k: &str| h.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
            match (get("cpu"), get("cpus")) {
                (Some(c), Some(n)) => format!(" on {c} ({n} CPUs)"),
                (Some(c), None) => format!(" on {c}"),
                (None, Some(n)) => format!(" on {n} CPUs"),
                (None, None) => String::new(),
            }
        })
        .unwrap_or_default();
    let cmd = if commands.is_empty() {
        "an unrecorded command".to_string()
    } else {
        commands
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let commit = if commits.is_empty() {
        " at an unrecorded commit".to_string()
    } else {
        format!(" at commit `{}`", commits.join("`, `"))
    };
    format!("{cmd}{commit}{host}")
}

/// The README's block (without the markers): the seeds' table and where it
/// comes from.
pub fn readme_block(records: &[Record]) -> String {
    let rows = seeds::rows(records);
    format!(
        "{}\nMeasured by {}; every table of that run is in \
         [docs/results.md](docs/results.md). *met*: mmkit's ratio is at least the \
         published change, in the direction the metric improves.\n",
        seeds::markdown(&rows),
        provenance(records)
    )
}

/// docs/results.md.
pub fn markdown(records: &[Record]) -> Result<String> {
    let mut s = String::from("# Results\n\n");
    writeln!(
        s,
        "<!-- Written by `mmlab results` from results.jsonl: edit the run, not this \
         file. -->\n"
    )?;
    writeln!(
        s,
        "Every figure below comes from the records of one lab run, \
         [results.jsonl](results.jsonl) (JSON Lines, one record per figure), through \
         `mmlab results docs/results.jsonl --readme README.md`. Percentages compare \
         each column with the first; docs/lab.md explains the workloads, variants \
         and metrics.\n"
    )?;
    writeln!(s, "## The run\n\n| | |\n|---|---|")?;
    for c in param_values(records, "command") {
        writeln!(s, "| command | `{c}` |")?;
    }
    let commits = param_values(records, "commit");
    if commits.is_empty() {
        writeln!(s, "| commit | unrecorded |")?;
    }
    for c in commits {
        writeln!(s, "| commit | `{c}` |")?;
    }
    for h in hosts(records) {
        for (k, v) in h {
            writeln!(s, "| {k} | {} |", v.replace('|', "\\|"))?;
        }
    }
    writeln!(s, "| records | {} |", records.len())?;
    writeln!(s, "\n## Seeds\n")?;
    writeln!(
        s,
        "Each patch series the lab reproduces: its published headline, the same \
         change measured here (after / before), and whether mmkit's ratio is at \
         least the published change in the direction the metric improves.\n"
    )?;
    s += &seeds::markdown(&seeds::rows(records));
    writeln!(s, "\nThe series:\n\n{}", seeds::sources_markdown())?;
    writeln!(s, "## Figures\n\n```text")?;
    for f in figures::figures(records) {
        writeln!(s, "{f}")?;
    }
    writeln!(s, "```\n\n## Tables")?;
    let mut unknown: Vec<&str> = Vec::new();
    for r in records {
        if workloads::by_name(&r.workload).is_none() && !unknown.contains(&r.workload.as_str()) {
            unknown.push(&r.workload);
        }
    }
    for w in workloads::all() {
        if !records.iter().any(|r| r.workload == w.name()) {
            continue;
        }
        writeln!(s, "\n### {}\n\n{}", w.name(), w.description())?;
        for t in table::tables(w.name(), w.metrics(), records) {
            writeln!(s, "\n{}\n\n{}", t.title(), t.render_markdown().trim_end())?;
        }
    }
    if !unknown.is_empty() {
        writeln!(
            s,
            "\nRecords of workloads this lab does not know, left out: {}.",
            unknown.join(", ")
        )?;
    }
    Ok(s)
}

/// `text` with the block between the markers replaced by `block`.
pub fn replace_block(text: &str, block: &str) -> Result<String> {
    let (start, end) = block_span(text)?;
    Ok(format!("{}\n{}{}", &text[..start], block, &text[end..]))
}

/// The block between the markers (without them).
#[cfg(test)]
pub fn extract_block(text: &str) -> Result<&str> {
    let (start, end) = block_span(text)?;
    Ok(text[start..end]
        .strip_prefix('\n')
        .unwrap_or(&text[start..end]))
}

/// The byte range between the end of `BEGIN` and the start of `END`.
fn block_span(text: &str) -> Result<(usize, usize)> {
    let b = match text.match_indices(BEGIN).count() {
        1 => text.find(BEGIN).expect("counted") + BEGIN.len(),
        0 => bail!("no {BEGIN} marker"),
        n => bail!("{n} {BEGIN} markers; there must be one"),
    };
    let Some(e) = text[b..].find(END) else {
        bail!("no {END} marker after {BEGIN}");
    };
    Ok((b, b + e))
}

/// Writes `path` with `text`, or with `check` fails if it differs.
fn write_or_check(path: &Path, text: &str, check: bool) -> Result<bool> {
    let old = std::fs::read_to_string(path).ok();
    if old.as_deref() == Some(text) {
        return Ok(false);
    }
    if check {
        bail!(
            "{} differs from what the records give; run `mmlab results` without --check",
            path.display()
        );
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

/// `mmlab results`: returns what it did, one line per file.
pub fn run(o: &Options) -> Result<String> {
    let records = compare::load(&o.file)?.records;
    if records.is_empty() {
        bail!("{}: no records", o.file.display());
    }
    let mut said = String::new();
    let md = markdown(&records)?;
    let verb = |changed: bool| match (changed, o.check) {
        (true, _) => "written",
        (false, true) => "up to date",
        (false, false) => "unchanged",
    };
    let changed = write_or_check(&o.out, &md, o.check)?;
    writeln!(said, "{}: {}", o.out.display(), verb(changed))?;
    if let Some(readme) = &o.readme {
        let text = std::fs::read_to_string(readme)
            .with_context(|| format!("reading {}", readme.display()))?;
        let new = replace_block(&text, &readme_block(&records))
            .with_context(|| format!("in {}", readme.display()))?;
        let changed = write_or_check(readme, &new, o.check)?;
        writeln!(said, "{}: {}", readme.display(), verb(changed))?;
    }
    Ok(said)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(workload: &str, variant: &str, metric: &str, value: f64) -> Record {
        let mut p = serde_json::Map::new();
        p.insert("command".into(), "mmlab run --quick".into());
        p.insert("commit".into(), "abc123".into());
        let mut h = serde_json::Map::new();
        h.insert("cpu".into(), "Example CPU".into());
        h.insert("cpus".into(), 2.into());
        h.insert("memory_bytes".into(), (1u64 << 30).into());
        p.insert("host".into(), h.into());
        Record {
            workload: workload.into(),
            variant: variant.into(),
            threads: 2,
            metric: metric.into(),
            value,
            unit: "1/s".into(),
            case: None,
            params: Some(p),
            rounds: None,
        }
    }

    #[test]
    fn the_page_holds_the_run_the_seeds_the_figures_and_the_tables() {
        let recs = vec![
            rec("cross_cpu_free", "mmkit", "ops_per_sec", 300.0),
            rec("cross_cpu_free", "mmkit-eager", "ops_per_sec", 100.0),
            rec("no_such_workload", "mmkit", "ops_per_sec", 1.0),
        ];
        let md = markdown(&recs).unwrap();
        assert!(md.contains("| command | `mmlab run --quick` |"), "{md}");
        assert!(md.contains("| commit | `abc123` |"));
        assert!(md.contains("| cpu | Example CPU |"));
        assert!(md.contains("| memory | 1024 MiB |"));
        assert!(md.contains("| records | 3 |"));
        assert!(md.contains("cross_cpu_free @ 2 threads: mmkit / mmkit-eager ops_per_sec = 3.00x"));
        assert!(md.contains("| 2 | 300.0 | 100.0 (-66.7%) |"), "{md}");
        assert!(md.contains("| 3.00x | met |"));
        assert!(md.contains("left out: no_such_workload."));
        // The same records, the same page.
        assert_eq!(md, markdown(&recs).unwrap());
        let block = readme_block(&recs);
        assert!(block.contains(
            "Measured by `mmlab run --quick` at commit `abc123` on Example CPU (2 CPUs)"
        ));
    }

    #[test]
    fn the_readme_block_is_replaced_between_its_markers_only() {
        let text = format!("# T\n\nbefore\n{BEGIN}\nold\n{END}\nafter\n");
        let new = replace_block(&text, "new\n").unwrap();
        assert_eq!(new, format!("# T\n\nbefore\n{BEGIN}\nnew\n{END}\nafter\n"));
        assert_eq!(extract_block(&new).unwrap(), "new\n");
        assert_eq!(replace_block(&new, "new\n").unwrap(), new);
        assert!(replace_block("no markers", "x").is_err());
        assert!(replace_block(&format!("{BEGIN} x"), "x").is_err());
        assert!(replace_block(&format!("{BEGIN}{BEGIN}{END}"), "x").is_err());
    }

    /// docs/results.md and the README's seeds block are what the committed
    /// docs/results.jsonl gives: no figure in them was edited by hand.
    #[test]
    fn committed_results_and_readme_come_from_the_committed_run() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let read = |p: &str| {
            std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("reading {p}: {e}"))
        };
        let records = compare::parse(&read("docs/results.jsonl")).unwrap();
        assert!(!records.is_empty());
        let want = markdown(&records).unwrap();
        assert!(
            read("docs/results.md") == want,
            "docs/results.md is not what docs/results.jsonl gives: run \
             `cargo run --release -p mmlab -- results docs/results.jsonl --readme README.md`"
        );
        let readme = read("README.md");
        assert_eq!(
            extract_block(&readme).unwrap(),
            readme_block(&records),
            "README.md's seeds block is not what docs/results.jsonl gives: run \
             `cargo run --release -p mmlab -- results docs/results.jsonl --readme README.md`"
        );
    }
}
