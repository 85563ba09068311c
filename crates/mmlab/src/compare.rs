//! `mmlab compare A.jsonl B.jsonl [C.jsonl...]`: the same points of several runs
//! side by side. One table per workload, metric and case; a row per variant and
//! thread count; a column per run, each after the first with its change against
//! the first (`1123 (+12.3%)`), marked `~` where the change is no larger than the
//! spread of the rounds (max - min of either run's rounds): noise. A point one run
//! lacks shows `-`. Records of a workload whose name starts with `_` (header
//! records) are skipped.

use crate::host::facts as host_facts;
use crate::record::Record;
use crate::report::table::{decimals, grid_markdown, grid_text, Table};
use crate::workloads;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// The mark of a change within the noise.
pub const NOISE_MARK: &str = "~";

/// One run: its label (the column header) and records.
#[derive(Debug, Clone)]
pub struct Run {
    pub label: String,
    pub records: Vec<Record>,
}

/// Reads one JSON Lines file of records (blank lines and header records skipped).
pub fn load(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let records = parse(&text).with_context(|| format!("in {}", path.display()))?;
    Ok(Run {
        label: path.display().to_string(),
        records,
    })
}

/// Parses JSON Lines text into records (blank lines and `_` workloads skipped).
pub fn parse(text: &str) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}: not JSON", i + 1))?;
        if v["workload"].as_str().is_some_and(|w| w.starts_with('_')) {
            continue;
        }
        let r: Record = serde_json::from_value(v)
            .with_context(|| format!("line {}: not an mmlab record", i + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// Short column labels: the file names without `.jsonl`; where two are equal,
/// with their directory (`a/run`), and where those are equal too, the paths as
/// given.
pub fn short_labels(paths: &[String]) -> Vec<String> {
    let tail = |p: &String, n: usize| {
        let parts: Vec<String> = Path::new(p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        let t = parts[parts.len().saturating_sub(n)..].join("/");
        t.strip_suffix(".jsonl").map_or(t.clone(), str::to_string)
    };
    let unique = |v: &[String]| v.iter().enumerate().all(|(i, s)| !v[..i].contains(s));
    for n in [1, 2] {
        let labels: Vec<String> = paths.iter().map(|p| tail(p, n)).collect();
        if unique(&labels) {
            return labels;
        }
    }
    paths.to_vec()
}

/// One table of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareTable {
    pub title: String,
    /// The run labels.
    pub columns: Vec<String>,
    pub rows: Vec<CompareRow>,
}

/// One row: a point and its value in each run (`None`: not measured there).
#[derive(Debug, Clone, PartialEq)]
pub struct CompareRow {
    pub threads: usize,
    pub variant: String,
    /// Per run: the value and the spread of its rounds (0 without rounds).
    pub cells: Vec<Option<(f64, f64)>>,
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// Matches the runs' records by workload, metric, case, variant and thread
/// count. Tables in the order the points first appear (first run first); rows by
/// variant (first seen) and thread count (ascending).
pub fn compare(runs: &[Run]) -> Vec<CompareTable> {
    type Key<'a> = (&'a str, &'a str, Option<&'a str>);
    let mut keys: Vec<Key> = Vec::new();
    for run in runs {
        for r in &run.records {
            push_unique(
                &mut keys,
                (r.workload.as_str(), r.metric.as_str(), r.case.as_deref()),
            );
        }
    }
    let mut out = Vec::new();
    for (workload, metric, case) in keys {
        let of =
            |r: &&Record| r.workload == workload && r.metric == metric && r.case.as_deref() == case;
        let mut variants: Vec<&str> = Vec::new();
        let mut threads: Vec<usize> = Vec::new();
        for run in runs {
            for r in run.records.iter().filter(of) {
                push_unique(&mut variants, r.variant.as_str());
                push_unique(&mut threads, r.threads);
            }
        }
        threads.sort_unstable();
        let decl = workloads::by_name(workload)
            .and_then(|w| w.metrics().iter().find(|m| m.name == metric));
        let mut rows = Vec::new();
        for v in &variants {
            for &t in &threads {
                let cells: Vec<Option<(f64, f64)>> = runs
                    .iter()
                    .map(|run| {
                        run.records
                            .iter()
                            .filter(of)
                            .find(|r| r.variant == *v && r.threads == t)
                            .map(|r| (r.value, r.spread()))
                    })
                    .collect();
                if cells.iter().any(Option::is_some) {
                    rows.push(CompareRow {
                        threads: t,
                        variant: v.to_string(),
                        cells,
                    });
                }
            }
        }
        let all_zero = rows
            .iter()
            .all(|r| r.cells.iter().flatten().all(|(v, _)| *v == 0.0));
        if decl.is_some_and(|m| m.hide_if_zero) && all_zero {
            continue;
        }
        let unit = runs
            .iter()
            .flat_map(|r| r.records.iter())
            .find(of)
            .map(|r| r.unit.clone())
            .unwrap_or_default();
        let title = Table {
            workload: workload.to_string(),
            metric: metric.to_string(),
            case: case.map(str::to_string),
            unit,
            higher_is_better: decl.map(|m| m.higher_is_better),
            columns: Vec::new(),
            rows: Vec::new(),
        }
        .title();
        out.push(CompareTable {
            title,
            columns: runs.iter().map(|r| r.label.clone()).collect(),
            rows,
        });
    }
    out
}

/// Whether the change from `base` to `v` is within the spread of the rounds.
pub fn is_noise(base: (f64, f64), v: (f64, f64)) -> bool {
    let spread = base.1.max(v.1);
    spread > 0.0 && (v.0 - base.0).abs() <= spread
}

impl CompareTable {
    fn grid(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let max = self
            .rows
            .iter()
            .flat_map(|r| r.cells.iter().flatten())
            .fold(0.0f64, |m, (v, _)| m.max(v.abs()));
        let prec = decimals(max);
        let mut header = vec!["threads".to_string(), "variant".to_string()];
        header.extend(self.columns.iter().cloned());
        let body = self
            .rows
            .iter()
            .map(|row| {
                let values: Vec<Option<f64>> =
                    row.cells.iter().map(|c| c.map(|(v, _)| v)).collect();
                let mut cells = vec![row.threads.to_string(), row.variant.clone()];
                for (i, c) in row.cells.iter().enumerate() {
                    let mut text = Table::cell(&values, i, prec);
                    if let (true, Some(base), Some(v)) = (i > 0, row.cells[0], *c) {
                        if is_noise(base, v) {
                            text = format!("{text} {NOISE_MARK}");
                        }
                    }
                    cells.push(text);
                }
                cells
            })
            .collect();
        (header, body)
    }

    pub fn render_text(&self) -> String {
        let (header, body) = self.grid();
        grid_text(&self.title, &header, &body)
    }

    pub fn render_markdown(&self) -> String {
        let (header, body) = self.grid();
        format!("### {}\n\n{}", self.title, grid_markdown(&header, &body))
    }
}

/// Where a run was measured, from its records' params: "cpu, N CPUs, kernel,
/// THP mode, commit".
fn provenance(run: &Run) -> String {
    let params = run.records.iter().find_map(|r| r.params.as_ref());
    let mut parts = Vec::new();
    if let Some(host) = params
        .and_then(|p| p.get("host"))
        .and_then(|h| h.as_object())
    {
        for (k, v) in host_facts::describe(host) {
            parts.push(format!("{k} {v}"));
        }
    }
    if let Some(c) = params
        .and_then(|p| p.get("commit"))
        .and_then(|c| c.as_str())
    {
        parts.push(format!("commit {c}"));
    }
    if parts.is_empty() {
        "no host facts recorded".into()
    } else {
        parts.join(", ")
    }
}

/// The whole comparison as text (or Markdown with `md`).
pub fn render(runs: &[Run], md: bool) -> String {
    let mut out = String::new();
    let labels: Vec<String> = runs.iter().map(|r| r.label.clone()).collect();
    let short = short_labels(&labels);
    let runs: Vec<Run> = runs
        .iter()
        .zip(&short)
        .map(|(r, s)| Run {
            label: s.clone(),
            records: r.records.clone(),
        })
        .collect();
    for (r, path) in runs.iter().zip(&labels) {
        let line = if r.label == *path {
            format!("{path}: {}", provenance(r))
        } else {
            format!("{}: {path}: {}", r.label, provenance(r))
        };
        if md {
            out += &format!("- {line}\n");
        } else {
            out += &format!("# {line}\n");
        }
    }
    let legend = format!(
        "Changes against the first run; {NOISE_MARK}: within the spread of the rounds \
         (max - min of either run), noise; -: not measured in that run."
    );
    if md {
        out += &format!("\n{legend}\n\n");
    } else {
        out += &format!("# {legend}\n\n");
    }
    for t in compare(&runs) {
        if md {
            out += &t.render_markdown();
        } else {
            out += &t.render_text();
        }
        out.push('\n');
    }
    out
}

/// `mmlab compare FILES...`.
pub fn run(files: &[std::path::PathBuf], md: bool) -> Result<String> {
    if files.len() < 2 {
        bail!("compare needs at least two JSON Lines files");
    }
    let runs = files.iter().map(|f| load(f)).collect::<Result<Vec<_>>>()?;
    if runs.iter().all(|r| r.records.is_empty()) {
        bail!("no records in {} files", files.len());
    }
    Ok(render(&runs, md))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(variant: &str, threads: usize, value: f64, rounds: Option<Vec<f64>>) -> Record {
        Record {
            workload: "alloc_free".into(),
            variant: variant.into(),
            threads,
            metric: "ops_per_sec".into(),
            value,
            unit: "1/s".into(),
            case: None,
            params: None,
            rounds,
        }
    }

    fn run(label: &str, records: Vec<Record>) -> Run {
        Run {
            label: label.into(),
            records,
        }
    }

    #[test]
    fn matches_points_and_marks_noise() {
        let a = run(
            "A",
            vec![
                rec("mmkit", 1, 1000.0, Some(vec![950.0, 1000.0, 1050.0])),
                rec("mmkit", 2, 2000.0, Some(vec![1990.0, 2000.0, 2010.0])),
            ],
        );
        let b = run(
            "B",
            vec![
                // Listed out of order: matching is by key, not position.
                rec("mmkit", 2, 2500.0, Some(vec![2490.0, 2500.0, 2510.0])),
                rec("mmkit", 1, 1040.0, Some(vec![1030.0, 1040.0, 1050.0])),
            ],
        );
        let t = compare(&[a, b]);
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[0].title,
            "alloc_free: ops_per_sec [1/s, higher is better]"
        );
        let text = t[0].render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].contains("threads") && lines[1].contains("variant"));
        assert!(lines[2].ends_with("1040 (+4.0%) ~"), "{text}");
        assert!(lines[3].ends_with("2500 (+25.0%)"), "{text}");
        let md = t[0].render_markdown();
        assert!(md.contains("| 1 | mmkit | 1000 | 1040 (+4.0%) ~ |"), "{md}");
    }

    #[test]
    fn different_variants_and_missing_points_show_a_dash() {
        let a = run(
            "A",
            vec![
                rec("mmkit", 1, 1000.0, None),
                rec("mimalloc", 1, 800.0, None),
            ],
        );
        let b = run(
            "B",
            vec![
                rec("mmkit", 1, 1100.0, None),
                rec("mmkit", 2, 1900.0, None),
                rec("set:pcp=off", 1, 500.0, None),
            ],
        );
        let c = run("C", vec![]);
        let t = compare(&[a, b, c]);
        assert_eq!(t.len(), 1);
        let rows: Vec<(usize, &str)> = t[0]
            .rows
            .iter()
            .map(|r| (r.threads, r.variant.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                (1, "mmkit"),
                (2, "mmkit"),
                (1, "mimalloc"),
                (1, "set:pcp=off")
            ]
        );
        let text = t[0].render_text();
        let lines: Vec<&str> = text.lines().collect();
        // No rounds: no noise mark.
        assert!(lines[2].contains("1100 (+10.0%)") && !lines[2].contains('~'));
        // mmkit at 2 threads only in B: the base is missing, the value stands alone.
        assert!(
            lines[3].contains("-  1900  -") || lines[3].contains("1900"),
            "{text}"
        );
        assert!(lines[4].trim_end().ends_with('-'), "{text}");
        assert!(lines[5].contains("500") && lines[5].contains('-'), "{text}");
    }

    #[test]
    fn cases_and_metrics_get_their_own_tables() {
        let mut x = rec("mmkit", 1, 5.0, None);
        x.case = Some("2MiB".into());
        let mut y = rec("mmkit", 1, 3.0, None);
        y.metric = "zone_lock_contended_pct".into();
        let mut z = rec("mmkit", 1, 0.0, None);
        z.metric = "alloc_failures".into();
        let a = run(
            "A",
            vec![rec("mmkit", 1, 1.0, None), x.clone(), y.clone(), z],
        );
        let b = run("B", vec![x, y]);
        let t = compare(&[a, b]);
        let titles: Vec<&str> = t.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(
            titles.len(),
            3,
            "all-zero alloc_failures hidden: {titles:?}"
        );
        assert!(titles[1].contains("(2MiB)"));
    }

    #[test]
    fn noise_needs_a_spread() {
        assert!(is_noise((100.0, 10.0), (105.0, 0.0)));
        assert!(is_noise((100.0, 0.0), (105.0, 6.0)));
        assert!(!is_noise((100.0, 2.0), (105.0, 2.0)));
        assert!(!is_noise((100.0, 0.0), (100.0, 0.0)));
    }

    #[test]
    fn parses_jsonl_and_skips_header_records() {
        let text = "{\"workload\":\"_host\",\"cpu\":\"x\"}\n\n\
             {\"workload\":\"alloc_free\",\"variant\":\"mmkit\",\"threads\":1,\
             \"metric\":\"ops_per_sec\",\"value\":1.0,\"unit\":\"1/s\",\"rounds\":[1.0,2.0]}\n";
        let r = parse(text).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].spread(), 1.0);
        assert!(parse("{oops").is_err());
        assert!(parse("{\"workload\":\"x\"}").is_err());
    }

    #[test]
    fn labels_are_file_names_unless_they_clash() {
        assert_eq!(
            short_labels(&["a/base.jsonl".into(), "b/new.jsonl".into()]),
            ["base", "new"]
        );
        assert_eq!(
            short_labels(&["/x/a/r.jsonl".into(), "/x/b/r.jsonl".into()]),
            ["a/r", "b/r"]
        );
        assert_eq!(
            short_labels(&["x/a/r.jsonl".into(), "y/a/r.jsonl".into()]),
            ["x/a/r.jsonl", "y/a/r.jsonl"]
        );
    }
}
