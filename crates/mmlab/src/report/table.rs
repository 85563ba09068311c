//! Tables in the style of the mm mailing list: one table per workload, metric
//! (and case), a row per thread count, a column per variant. Every column after
//! the first shows its value and the change against the first column in percent,
//! e.g. `1234567 (+12.3%)`. Rendered as aligned text (stdout) and as Markdown
//! (the report directory).

use crate::record::Record;
use crate::workloads::Metric;

/// One metric of one workload (one case), ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub workload: String,
    pub metric: String,
    pub case: Option<String>,
    pub unit: String,
    /// `None` for a metric the workload does not declare.
    pub higher_is_better: Option<bool>,
    /// Variants; the first is the baseline.
    pub columns: Vec<String>,
    /// Thread count and one value per column (`None`: not measured).
    pub rows: Vec<(usize, Vec<Option<f64>>)>,
}

/// Decimals for values of magnitude up to `max_abs`: none from 1000 up, one
/// from 100, else two. A table uses one precision for all its cells.
pub fn decimals(max_abs: f64) -> usize {
    if max_abs >= 1000.0 {
        0
    } else if max_abs >= 100.0 {
        1
    } else {
        2
    }
}

/// A value with `prec` decimals.
pub fn fmt_fixed(v: f64, prec: usize) -> String {
    format!("{v:.prec$}")
}

/// `v` rounded to `prec` decimals.
pub fn round_to(v: f64, prec: usize) -> f64 {
    let scale = 10f64.powi(prec as i32);
    (v * scale).round() / scale
}

/// Change of `v` against `base` in percent, signed, one decimal: `+12.3%`.
/// `n/a` when the base is zero and the value is not.
pub fn fmt_change(base: f64, v: f64) -> String {
    if base == 0.0 {
        return if v == 0.0 {
            "+0.0%".into()
        } else {
            "n/a".into()
        };
    }
    let pct = (v - base) / base.abs() * 100.0;
    // Print a change that rounds to zero as +0.0%, never -0.0%.
    let pct = if pct.abs() < 0.05 { 0.0 } else { pct };
    format!("{pct:+.1}%")
}

impl Table {
    /// The cell text of column `col` in a row, with `prec` decimals.
    pub fn cell(values: &[Option<f64>], col: usize, prec: usize) -> String {
        match (values.first().copied().flatten(), values[col]) {
            (_, None) => "-".into(),
            (_, Some(v)) if col == 0 => fmt_fixed(v, prec),
            (Some(base), Some(v)) => {
                // Compare what the reader sees: a base that prints as 0 has no
                // meaningful ratio, whatever its exact value.
                let (b, x) = (round_to(base, prec), round_to(v, prec));
                format!("{} ({})", fmt_fixed(v, prec), fmt_change(b, x))
            }
            (None, Some(v)) => fmt_fixed(v, prec),
        }
    }

    /// The precision of this table's cells (from its largest value).
    pub fn precision(&self) -> usize {
        let max = self
            .rows
            .iter()
            .flat_map(|(_, v)| v.iter().flatten())
            .fold(0.0f64, |m, v| m.max(v.abs()));
        decimals(max)
    }

    /// "alloc_free: ops_per_sec [1/s, higher is better]".
    pub fn title(&self) -> String {
        let case = self
            .case
            .as_ref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default();
        let better = match self.higher_is_better {
            Some(true) => ", higher is better",
            Some(false) => ", lower is better",
            None => "",
        };
        format!(
            "{}{}: {} [{}{}]",
            self.workload, case, self.metric, self.unit, better
        )
    }

    fn grid(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let prec = self.precision();
        let mut header = vec!["threads".to_string()];
        header.extend(self.columns.iter().cloned());
        let body = self
            .rows
            .iter()
            .map(|(t, vals)| {
                let mut r = vec![t.to_string()];
                r.extend((0..vals.len()).map(|c| Table::cell(vals, c, prec)));
                r
            })
            .collect();
        (header, body)
    }

    /// Aligned plain text, title first, for the terminal.
    pub fn render_text(&self) -> String {
        let (header, body) = self.grid();
        grid_text(&self.title(), &header, &body)
    }

    /// A Markdown table (no title).
    pub fn render_markdown(&self) -> String {
        let (header, body) = self.grid();
        grid_markdown(&header, &body)
    }

    /// An HTML table (no title).
    pub fn render_html(&self) -> String {
        let (header, body) = self.grid();
        grid_html(&header, &body)
    }
}

/// A grid of cells as aligned plain text (right-aligned columns, two spaces
/// apart), under `title`.
pub fn grid_text(title: &str, header: &[String], body: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            body.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:>w$}"))
            .collect();
        parts.join("  ")
    };
    let mut out = format!("{title}\n");
    out += &line(header);
    out.push('\n');
    for r in body {
        out += &line(r);
        out.push('\n');
    }
    out
}

/// A grid of cells as a Markdown table, right-aligned.
pub fn grid_markdown(header: &[String], body: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", header.join(" | "));
    out += &format!("|{}\n", "---:|".repeat(header.len()));
    for r in body {
        out += &format!("| {} |\n", r.join(" | "));
    }
    out
}

/// Escapes `&`, `<`, `>` and `"` for HTML text and attributes.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' => out += "&quot;",
            c => out.push(c),
        }
    }
    out
}

/// A grid of cells as an HTML table.
pub fn grid_html(header: &[String], body: &[Vec<String>]) -> String {
    let row = |cells: &[String], tag: &str| {
        let cells: String = cells
            .iter()
            .map(|c| format!("<{tag}>{}</{tag}>", html_escape(c)))
            .collect();
        format!("<tr>{cells}</tr>\n")
    };
    let mut out = String::from("<table>\n<thead>");
    out += &row(header, "th");
    out += "</thead>\n<tbody>\n";
    for r in body {
        out += &row(r, "td");
    }
    out += "</tbody>\n</table>\n";
    out
}

/// Pushes `x` unless present; keeps first-seen order.
fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// The tables of one workload from its records: metrics in the order of
/// `metrics` (then any undeclared ones), variants in the order first measured,
/// thread counts ascending. A `hide_if_zero` metric whose values are all zero
/// gets no table.
pub fn tables(workload: &str, metrics: &[Metric], records: &[Record]) -> Vec<Table> {
    let recs: Vec<&Record> = records.iter().filter(|r| r.workload == workload).collect();
    let mut metric_names: Vec<&str> = metrics
        .iter()
        .map(|m| m.name)
        .filter(|n| recs.iter().any(|r| r.metric == *n))
        .collect();
    for r in &recs {
        push_unique(&mut metric_names, r.metric.as_str());
    }
    let mut out = Vec::new();
    for name in metric_names {
        let decl = metrics.iter().find(|m| m.name == name);
        let of_metric: Vec<&&Record> = recs.iter().filter(|r| r.metric == name).collect();
        let mut cases: Vec<Option<&str>> = Vec::new();
        for r in &of_metric {
            push_unique(&mut cases, r.case.as_deref());
        }
        for case in cases {
            let rs: Vec<&&&Record> = of_metric
                .iter()
                .filter(|r| r.case.as_deref() == case)
                .collect();
            if decl.is_some_and(|m| m.hide_if_zero) && rs.iter().all(|r| r.value == 0.0) {
                continue;
            }
            let (mut columns, mut threads) = (Vec::new(), Vec::new());
            for r in &rs {
                push_unique(&mut columns, r.variant.clone());
                push_unique(&mut threads, r.threads);
            }
            threads.sort_unstable();
            let rows = threads
                .iter()
                .map(|&t| {
                    let vals = columns
                        .iter()
                        .map(|v| {
                            rs.iter()
                                .find(|r| r.threads == t && &r.variant == v)
                                .map(|r| r.value)
                        })
                        .collect();
                    (t, vals)
                })
                .collect();
            out.push(Table {
                workload: workload.to_string(),
                metric: name.to_string(),
                case: case.map(str::to_string),
                unit: rs.first().map(|r| r.unit.clone()).unwrap_or_default(),
                higher_is_better: decl.map(|m| m.higher_is_better),
                columns,
                rows,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::STANDARD;

    fn rec(variant: &str, threads: usize, metric: &str, value: f64) -> Record {
        Record {
            workload: "alloc_free".into(),
            variant: variant.into(),
            threads,
            metric: metric.into(),
            value,
            unit: "1/s".into(),
            case: None,
            params: None,
            rounds: None,
        }
    }

    #[test]
    fn value_formatting() {
        let auto = |v: f64| fmt_fixed(v, decimals(v));
        assert_eq!(auto(1234567.4), "1234567");
        assert_eq!(auto(1000.0), "1000");
        assert_eq!(auto(123.45), "123.5");
        assert_eq!(auto(12.345), "12.35");
        assert_eq!(auto(0.0), "0.00");
        assert_eq!(fmt_fixed(900.0, 0), "900");
    }

    #[test]
    fn percent_formatting() {
        assert_eq!(fmt_change(1000.0, 1123.0), "+12.3%");
        assert_eq!(fmt_change(1000.0, 877.0), "-12.3%");
        assert_eq!(fmt_change(1000.0, 1000.0), "+0.0%");
        assert_eq!(fmt_change(1000.0, 999.9999), "+0.0%");
        assert_eq!(fmt_change(1000.0, 2000.0), "+100.0%");
        assert_eq!(fmt_change(0.0, 0.0), "+0.0%");
        assert_eq!(fmt_change(0.0, 5.0), "n/a");
    }

    #[test]
    fn cells_show_value_and_change_against_the_first_column() {
        let vals = [Some(1000.0), Some(1123.0), None];
        assert_eq!(Table::cell(&vals, 0, 0), "1000");
        assert_eq!(Table::cell(&vals, 1, 0), "1123 (+12.3%)");
        assert_eq!(Table::cell(&vals, 2, 0), "-");
        let tiny_base = [Some(0.000_001), Some(117.0)];
        assert_eq!(Table::cell(&tiny_base, 1, 0), "117 (n/a)");
        let both_tiny = [Some(0.000_001), Some(0.000_002)];
        assert_eq!(Table::cell(&both_tiny, 1, 2), "0.00 (+0.0%)");
        let no_base = [None, Some(5.0)];
        assert_eq!(Table::cell(&no_base, 1, 2), "5.00");
    }

    #[test]
    fn table_from_records() {
        let recs = vec![
            rec("mmkit", 1, "ops_per_sec", 1000.0),
            rec("mimalloc", 1, "ops_per_sec", 1500.0),
            rec("mmkit", 2, "ops_per_sec", 1800.0),
            rec("mimalloc", 2, "ops_per_sec", 900.0),
            rec("mmkit", 1, "alloc_failures", 0.0),
            rec("mimalloc", 1, "alloc_failures", 0.0),
        ];
        let t = tables("alloc_free", STANDARD, &recs);
        assert_eq!(t.len(), 1, "all-zero alloc_failures is hidden");
        let t = &t[0];
        assert_eq!(t.columns, ["mmkit", "mimalloc"]);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.title(), "alloc_free: ops_per_sec [1/s, higher is better]");
        let text = t.render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "threads  mmkit       mimalloc");
        assert_eq!(lines[2], "      1   1000  1500 (+50.0%)");
        assert_eq!(lines[3], "      2   1800   900 (-50.0%)");
        let md = t.render_markdown();
        assert_eq!(
            md,
            "| threads | mmkit | mimalloc |\n|---:|---:|---:|\n\
             | 1 | 1000 | 1500 (+50.0%) |\n| 2 | 1800 | 900 (-50.0%) |\n"
        );
    }

    #[test]
    fn nonzero_failures_get_a_table() {
        let recs = vec![
            rec("mmkit", 1, "ops_per_sec", 1.0),
            rec("mmkit", 1, "alloc_failures", 3.0),
        ];
        assert_eq!(tables("alloc_free", STANDARD, &recs).len(), 2);
    }
}
