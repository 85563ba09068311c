//! The seeds' table: for each patch series the lab reproduces, its published
//! headline figures beside what mmkit measures for the same change, computed from
//! a run's records (never hard-coded: only the published side is a constant,
//! copied from the series' own cover letter or test report).
//!
//! A claim compares two variants of one workload point, `after / before`, the
//! change the series made (or mmkit's own policy against the series' "before").
//! It is *met* when the measured ratio is at least as large a change, in the
//! direction the metric improves, as the published one: `>=` it where higher is
//! better, `<=` where lower is. A claim whose records are missing is "not
//! measured"; one whose two values are both zero shows no change and is not met.
//!
//! A claim is read at the thread count the series published it at, except where
//! the series ran one process per CPU on a machine larger than this host
//! (`Claim::one_per_cpu`): that claim is read at the largest thread count the run
//! measured that is at most both the series' count and this host's CPUs (the
//! records' `params.host.cpus`), so that it keeps the series' one thread per
//! CPU instead of oversubscribing a small host; the row says so ("@ 2 threads,
//! one per CPU; the series: 16 on 48 CPUs").
//!
//! Rendered as Markdown (docs/results.md, the README's block), as HTML (the
//! report's first screen) and as one small SVG plot per seed: a bar per claim
//! for the published ratio and one for the measured, on a log axis around 1.

use super::plot::color;
use super::table::html_escape;
use crate::record::Record;
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::fmt::Write as _;

/// One published figure and the point that measures it.
pub struct Claim {
    /// A short name for the plot's axis.
    pub label: &'static str,
    /// The published figure, with its numbers as the series gives them.
    pub headline: &'static str,
    /// The published ratio, after / before, in the terms of `metric`.
    pub published: f64,
    pub workload: &'static str,
    pub case: Option<&'static str>,
    /// The thread count the series published the figure at.
    pub threads: usize,
    /// `Some(cpus)`: the series ran `threads` processes, one per CPU, on a
    /// machine of `cpus` CPUs; read at one thread per CPU of this host (see the
    /// module header). `None`: read at exactly `threads`.
    pub one_per_cpu: Option<usize>,
    pub metric: &'static str,
    pub higher_is_better: bool,
    /// The variant with the change (numerator).
    pub after: &'static str,
    /// The variant without it (denominator).
    pub before: &'static str,
}

/// One patch series.
pub struct Seed {
    pub id: &'static str,
    pub title: &'static str,
    /// Author, subject and list of the series.
    pub source: &'static str,
    /// The workload `mmlab run` takes to measure it.
    pub command: &'static str,
    pub claims: &'static [Claim],
}

const fn claim(
    label: &'static str,
    headline: &'static str,
    published: f64,
    point: (&'static str, Option<&'static str>, usize, &'static str),
    higher_is_better: bool,
    after: &'static str,
    before: &'static str,
) -> Claim {
    Claim {
        label,
        headline,
        published,
        workload: point.0,
        case: point.1,
        threads: point.2,
        one_per_cpu: None,
        metric: point.3,
        higher_is_better,
        after,
        before,
    }
}

/// `c`, read at one thread per CPU: the series ran `c.threads` processes on a
/// machine of `cpus` CPUs.
const fn per_cpu(c: Claim, cpus: usize) -> Claim {
    Claim {
        one_per_cpu: Some(cpus),
        ..c
    }
}

/// The seeds, in the order the design lists them.
pub const SEEDS: &[Seed] = &[
    Seed {
        id: "000",
        title: "zone->lock contention: skip merge and cluster alloc",
        source: "Aaron Lu, \"[RFC v4 PATCH 0/5] Eliminate zone->lock contention for \
                 will-it-scale/page_fault1 and parallel free\", linux-mm, 2018",
        command: "alloc_free_batch cross_cpu_free order0_thp_mix",
        claims: &[
            claim(
                "zone lock",
                "page_fault1 at full load: zone->lock contention on the free path 35% -> 1.1%",
                1.1 / 35.0,
                ("alloc_free_batch", None, 8, "zone_lock_contended_pct"),
                false,
                "mmkit",
                "mmkit-eager",
            ),
            claim(
                "alloc/free CPUs",
                "netperf, CPUs that only allocate and CPUs that only free: 72.3 -> 94.2 Gbit/s",
                94192.2 / 72254.6,
                ("cross_cpu_free", None, 2, "ops_per_sec"),
                true,
                "mmkit",
                "mmkit-eager",
            ),
            claim(
                "order-0 score",
                "order-0 and THP page_fault1 together: order-0 score 1522246 -> 2234073",
                2234073.0 / 1522246.0,
                ("order0_thp_mix", None, 4, "order0_score"),
                true,
                "mmkit",
                "mmkit-eager",
            ),
            claim(
                "THP score",
                "the same run: THP score 10540254 -> 9610295",
                9610295.0 / 10540254.0,
                ("order0_thp_mix", None, 4, "thp_score"),
                true,
                "mmkit",
                "mmkit-eager",
            ),
        ],
    },
    Seed {
        id: "003",
        title: "page allocator V3: PCP, lazy merging, fast and slow path",
        source: "Mel Gorman, \"[PATCH 00/35] Cleanup and optimise the page allocator V3\", \
                 linux-mm, 2009",
        command: "alloc_free_orders",
        claims: &[claim(
            "alloc/free",
            "kernbench: 16% less time overall (the whole build; mmkit times the allocator alone)",
            1.0 / 0.84,
            ("alloc_free_orders", None, 1, "ops_per_sec"),
            true,
            "mmkit",
            "mmkit-eager",
        )],
    },
    Seed {
        id: "001",
        title: "multi-page huge-page clearing",
        source: "Ankur Arora, \"[PATCH 0/9] x86/clear_huge_page: multi-page clearing\", \
                 linux-kernel, 2023",
        command: "clear_huge",
        claims: &[
            claim(
                "1 GiB",
                "demand-faulting 1 GiB pages (Milan): 17.98 -> 37.24 GB/s",
                37.24 / 17.98,
                ("clear_huge", Some("1GiB"), 1, "gb_per_sec"),
                true,
                "mmkit-multi-page",
                "mmkit-page-at-a-time",
            ),
            claim(
                "2 MiB",
                "demand-faulting 2 MiB pages (Milan): 12.24 -> 17.54 GB/s",
                17.54 / 12.24,
                ("clear_huge", Some("2MiB"), 1, "gb_per_sec"),
                true,
                "mmkit-multi-page",
                "mmkit-page-at-a-time",
            ),
            claim(
                "2 MiB, mmkit",
                "the same 2 MiB figure, against mmkit's default clearing",
                17.54 / 12.24,
                ("clear_huge", Some("2MiB"), 1, "gb_per_sec"),
                true,
                "mmkit",
                "mmkit-page-at-a-time",
            ),
        ],
    },
    Seed {
        id: "002",
        title: "swap-slot allocation: per-CPU cursors",
        source: "Huang Ying, \"[PATCH -V2] swap: Reduce lock contention on swap cache from \
                 swap slots allocation\", linux-mm, 2020",
        command: "pmbench",
        claims: &[
            per_cpu(
                claim(
                    "score",
                    "pmbench, 16 processes, swap on RAM disks: score +18.5%",
                    1.185,
                    ("pmbench", None, 16, "accesses_per_sec"),
                    true,
                    "mmkit-swap-2020",
                    "mmkit-swap-2019",
                ),
                48,
            ),
            per_cpu(
                claim(
                    "swap-in",
                    "the same run: swap-in 2.96 -> 3.51 GB/s",
                    3.51 / 2.96,
                    ("pmbench", None, 16, "swapin_gb_per_sec"),
                    true,
                    "mmkit-swap-2020",
                    "mmkit-swap-2019",
                ),
                48,
            ),
            per_cpu(
                claim(
                    "score, mmkit",
                    "the same score, against mmkit's swap (per-CPU clusters, swap table)",
                    1.185,
                    ("pmbench", None, 16, "accesses_per_sec"),
                    true,
                    "mmkit",
                    "mmkit-swap-2019",
                ),
                48,
            ),
        ],
    },
    Seed {
        id: "004",
        title: "NUMA balancing: slow the scan on migration failure",
        source: "Mel Gorman, \"[PATCH 4/4] mm: numa: Slow PTE scan rate if migration \
                 failures occur\", linux-kernel, 2015",
        command: "autonuma",
        claims: &[
            claim(
                "system time",
                "autonuma numa01: system time 602.44 -> 209.42 s",
                209.42 / 602.44,
                ("autonuma", Some("numa01-full"), 4, "system_ms"),
                false,
                "mmkit-numab-linux",
                "mmkit-numab-4.0",
            ),
            claim(
                "PTE updates",
                "NUMA base PTE updates 242201535 -> 117237258",
                117237258.0 / 242201535.0,
                ("autonuma", Some("numa01-full"), 4, "pte_updates"),
                false,
                "mmkit-numab-linux",
                "mmkit-numab-4.0",
            ),
            claim(
                "system, mmkit",
                "the same system time, against mmkit's scan policy",
                209.42 / 602.44,
                ("autonuma", Some("numa01-full"), 4, "system_ms"),
                false,
                "mmkit",
                "mmkit-numab-4.0",
            ),
        ],
    },
];

/// What a claim measured.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Both values, and their ratio (infinite over a zero baseline).
    Ratio { after: f64, before: f64, ratio: f64 },
    /// Both values are zero: no change to compare.
    BothZero,
    /// A record is missing.
    NotMeasured,
}

/// One claim evaluated against a run.
pub struct Row {
    pub seed: &'static Seed,
    pub claim: &'static Claim,
    pub measured: Outcome,
    /// The thread count it was read at (see `Claim::one_per_cpu`).
    pub threads: usize,
    /// A record it was read from ran with sizes scaled down to the run's
    /// memory budget (`params.scaled`).
    pub scaled: bool,
    /// The unit of the metric, from the records.
    pub unit: String,
}

impl Row {
    /// Whether the measured ratio reaches the published one; `None` when there
    /// is nothing to compare.
    pub fn met(&self) -> Option<bool> {
        match self.measured {
            Outcome::Ratio { ratio, .. } => Some(if self.claim.higher_is_better {
                ratio >= self.claim.published
            } else {
                ratio <= self.claim.published
            }),
            Outcome::BothZero => Some(false),
            Outcome::NotMeasured => None,
        }
    }

    /// "0.03x" (the measured ratio), "0 vs 0" or "not measured".
    pub fn ratio_text(&self) -> String {
        match self.measured {
            Outcome::Ratio { ratio, .. } => times(ratio),
            Outcome::BothZero => "0 vs 0".into(),
            Outcome::NotMeasured => "not measured".into(),
        }
    }

    /// "met", "not met" or "-".
    pub fn met_text(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "not met",
            None => "-",
        }
    }

    /// What mmkit measures: "alloc_free_batch @ 8 threads:
    /// mmkit / mmkit-eager zone_lock_contended_pct (0.00 vs 12.34 %)"; a claim
    /// read at one thread per CPU says so: "pmbench @ 2 threads (one per CPU;
    /// the series: 16 on 48 CPUs): ...".
    pub fn measures(&self) -> String {
        let c = self.claim;
        let case = c.case.map(|c| format!(" ({c})")).unwrap_or_default();
        let t = if self.threads == 1 {
            "thread"
        } else {
            "threads"
        };
        let mut notes: Vec<String> = c
            .one_per_cpu
            .map(|cpus| format!("one per CPU; the series: {} on {cpus} CPUs", c.threads))
            .into_iter()
            .collect();
        if self.scaled {
            notes.push("scaled sizes".into());
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        };
        let values = match self.measured {
            Outcome::Ratio { after, before, .. } => {
                format!(" ({} vs {} {})", num(after), num(before), self.unit)
            }
            Outcome::BothZero => format!(" (0 vs 0 {})", self.unit),
            Outcome::NotMeasured => String::new(),
        };
        format!(
            "{}{case} @ {} {t}{notes}: {} / {} {}{}",
            c.workload, self.threads, c.after, c.before, c.metric, values
        )
        .replace(" )", ")")
    }
}

/// `r` as "1.23x" (two significant decimals, more for small ratios).
fn times(r: f64) -> String {
    if r.is_infinite() {
        "inf".into()
    } else if r != 0.0 && r.abs() < 0.1 {
        format!("{r:.3}x")
    } else {
        format!("{r:.2}x")
    }
}

/// A value as the tables print it: no decimals from 1000 up, else two.
fn num(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The host's CPU count, from the records' `params.host.cpus`.
fn host_cpus(records: &[Record]) -> Option<usize> {
    records.iter().find_map(|r| {
        let cpus = r.params.as_ref()?.get("host")?.get("cpus")?.as_u64()?;
        usize::try_from(cpus).ok()
    })
}

/// The thread count to read `claim` at: its own, or for a claim read at one
/// thread per CPU the largest count measured for both variants that is at most
/// the claim's and the host's CPUs (without a CPU count, at most the claim's).
fn threads_for(claim: &Claim, records: &[Record], cpus: Option<usize>) -> usize {
    if claim.one_per_cpu.is_none() {
        return claim.threads;
    }
    let cap = claim.threads.min(cpus.unwrap_or(usize::MAX));
    let measured = |v: &str, t: usize| {
        records.iter().any(|r| {
            r.workload == claim.workload
                && r.variant == v
                && r.threads == t
                && r.metric == claim.metric
                && r.case.as_deref() == claim.case
        })
    };
    records
        .iter()
        .map(|r| r.threads)
        .filter(|&t| t <= cap && measured(claim.after, t) && measured(claim.before, t))
        .max()
        .unwrap_or(cap)
}

/// Every claim of every seed, evaluated against `records`.
pub fn rows(records: &[Record]) -> Vec<Row> {
    let cpus = host_cpus(records);
    let mut out = Vec::new();
    for seed in SEEDS {
        for claim in seed.claims {
            let threads = threads_for(claim, records, cpus);
            let find = |v: &str| {
                records.iter().find(|r| {
                    r.workload == claim.workload
                        && r.variant == v
                        && r.threads == threads
                        && r.metric == claim.metric
                        && r.case.as_deref() == claim.case
                })
            };
            let (a, b) = (find(claim.after), find(claim.before));
            let scaled = [a, b].into_iter().flatten().any(|r| {
                r.params
                    .as_ref()
                    .and_then(|p| p.get("scaled"))
                    .and_then(|v| v.as_bool())
                    == Some(true)
            });
            let measured = match (a.map(|r| r.value), b.map(|r| r.value)) {
                (Some(a), Some(b)) if a == 0.0 && b == 0.0 => Outcome::BothZero,
                (Some(after), Some(before)) => Outcome::Ratio {
                    after,
                    before,
                    ratio: if before == 0.0 {
                        f64::INFINITY
                    } else {
                        after / before
                    },
                },
                _ => Outcome::NotMeasured,
            };
            let unit = records
                .iter()
                .find(|r| r.workload == claim.workload && r.metric == claim.metric)
                .map_or_else(String::new, |r| r.unit.clone());
            out.push(Row {
                seed,
                claim,
                measured,
                threads,
                scaled,
                unit,
            });
        }
    }
    out
}

fn header() -> [&'static str; 7] {
    [
        "seed",
        "published",
        "mmkit measures",
        "published ratio",
        "mmkit ratio",
        "met",
        "command",
    ]
}

/// The seed's cell: "000 zone->lock contention: ..." on its first claim only.
fn seed_cell(rows: &[Row], i: usize) -> Option<&'static Seed> {
    let first = i == 0 || rows[i - 1].seed.id != rows[i].seed.id;
    first.then_some(rows[i].seed)
}

/// The table as Markdown (a pipe in a cell is escaped).
pub fn markdown(rows: &[Row]) -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut s = format!("| {} |\n", header().join(" | "));
    s += &format!("|{}\n", "---|".repeat(header().len()));
    for (i, r) in rows.iter().enumerate() {
        let seed = seed_cell(rows, i)
            .map(|s| format!("{} {}", s.id, s.title))
            .unwrap_or_default();
        let cmd = seed_cell(rows, i)
            .map(|s| format!("`mmlab run {}`", s.command))
            .unwrap_or_default();
        writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            esc(&seed),
            esc(r.claim.headline),
            esc(&r.measures()),
            times(r.claim.published),
            r.ratio_text(),
            r.met_text(),
            cmd
        )
        .expect("writing to a String");
    }
    s
}

/// The series each seed comes from, as a Markdown list.
pub fn sources_markdown() -> String {
    SEEDS
        .iter()
        .map(|s| format!("- {}: {}\n", s.id, s.source))
        .collect()
}

/// The table as HTML: a row per claim, the seed's cell (its title and command)
/// and its small plot spanning the seed's rows.
pub fn html(rows: &[Row]) -> Result<String> {
    let mut h = String::from("<table class=\"seeds\">\n<tr>");
    for c in [
        "seed",
        "published",
        "mmkit measures",
        "published ratio",
        "mmkit ratio",
        "met",
        "plot",
    ] {
        write!(h, "<th>{c}</th>")?;
    }
    h += "</tr>\n";
    for (i, r) in rows.iter().enumerate() {
        let class = match r.met() {
            Some(true) => "met",
            Some(false) => "notmet",
            None => "none",
        };
        let claim = format!(
            "<td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"{class}\">{}</td>",
            html_escape(r.claim.headline),
            html_escape(&r.measures()),
            times(r.claim.published),
            html_escape(&r.ratio_text()),
            r.met_text(),
        );
        let Some(seed) = seed_cell(rows, i) else {
            writeln!(h, "<tr>{claim}</tr>")?;
            continue;
        };
        let mine: Vec<&Row> = rows.iter().filter(|r| r.seed.id == seed.id).collect();
        writeln!(
            h,
            "<tr class=\"first\"><td rowspan=\"{n}\"><b>{}</b> {}<br><code>mmlab run {}</code></td>\
             {claim}<td rowspan=\"{n}\" class=\"plot seedplot\" data-kind=\"bar\" \
             data-name=\"seed {}\">{}</td></tr>",
            seed.id,
            html_escape(seed.title),
            seed.command,
            seed.id,
            svg(seed, &mine)?,
            n = mine.len()
        )?;
    }
    h += "</table>\n";
    Ok(h)
}

/// A ratio as drawn on the log axis (a zero or infinite one at the axis' end).
fn clamp(r: f64, lo: f64, hi: f64) -> f64 {
    r.clamp(lo, hi)
}

/// One seed's plot: per claim, the published ratio (grey) and the measured one
/// (green where met, red where not), bars from 1 on a log axis.
pub fn svg(seed: &Seed, rows: &[&Row]) -> Result<String> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plotting seed {}: {e:?}", seed.id);
    let n = rows.len().max(1);
    let mut lo: f64 = 0.5;
    let mut hi: f64 = 2.0;
    for r in rows {
        let mut see = |v: f64| {
            if v.is_finite() && v > 0.0 {
                lo = lo.min(v / 1.5);
                hi = hi.max(v * 1.5);
            }
        };
        see(r.claim.published);
        if let Outcome::Ratio { ratio, .. } = r.measured {
            see(ratio);
        }
    }
    let mut out = String::new();
    {
        let height = 70 + 56 * n as u32;
        let root = SVGBackend::with_string(&mut out, (320, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let labels: Vec<&str> = rows.iter().map(|r| r.claim.label).collect();
        let label = move |y: &f64| {
            let i = n as f64 - y - 0.5;
            if (i - i.round()).abs() > 0.01 || i < -0.01 {
                return String::new();
            }
            labels
                .get(i.round() as usize)
                .map(|s| s.to_string())
                .unwrap_or_default()
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("seed {}: after / before", seed.id),
                ("sans-serif", 15),
            )
            .margin(10)
            .x_label_area_size(28)
            .y_label_area_size(96)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..n as f64)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .label_style(("sans-serif", 12))
            .y_labels(2 * n + 1)
            .x_labels(6)
            .x_label_formatter(&|x| times(*x))
            .y_label_formatter(&label)
            .draw()
            .map_err(|e| err(&e))?;
        let grey = RGBColor(170, 170, 170);
        let (green, red) = (color(2), color(3));
        for (i, r) in rows.iter().enumerate() {
            let y = n as f64 - i as f64 - 0.5;
            let p = clamp(r.claim.published, lo, hi);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(1.0, y + 0.04), (p, y + 0.36)],
                    grey.filled(),
                )))
                .map_err(|e| err(&e))?;
            if let Outcome::Ratio { ratio, .. } = r.measured {
                let c = if r.met() == Some(true) { green } else { red };
                let m = clamp(ratio, lo, hi);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(1.0, y - 0.36), (m, y - 0.04)],
                        c.filled(),
                    )))
                    .map_err(|e| err(&e))?;
            }
        }
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, n as f64)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
