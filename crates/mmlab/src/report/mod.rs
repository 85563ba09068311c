//! The report: tables on stdout after each workload, and the report directory:
//! `results.jsonl` (every record), `<workload>.md` (its tables, with its plots),
//! `<workload>_<metric>.svg` (the plots), `README.md` (an index, the command line,
//! the seeds, the figures) and `index.html` (all of it on one self-contained page,
//! the seeds' table first).

pub mod figures;
pub mod html;
pub mod plot;
pub mod seeds;
pub mod table;

use crate::record::{write_jsonl, Record};
use crate::workloads::Workload;
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// The text tables of one workload, for stdout.
pub fn text_tables(w: &dyn Workload, records: &[Record]) -> String {
    let mut out = String::new();
    for t in table::tables(w.name(), w.metrics(), records) {
        out += &t.render_text();
        out.push('\n');
    }
    out
}

/// What the report says about the run itself.
pub struct RunInfo<'a> {
    pub command: &'a str,
    pub commit: Option<&'a str>,
    pub host: &'a serde_json::Map<String, serde_json::Value>,
    pub warnings: &'a [String],
}

/// Writes the report directory `dir` (created if missing).
pub fn write_dir(
    dir: &Path,
    workloads: &[&dyn Workload],
    records: &[Record],
    info: &RunInfo,
) -> Result<()> {
    let (command, warnings) = (info.command, info.warnings);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let jsonl = dir.join("results.jsonl");
    write_jsonl(
        std::io::BufWriter::new(
            fs::File::create(&jsonl).with_context(|| format!("creating {}", jsonl.display()))?,
        ),
        records,
    )?;

    let mut index = String::new();
    writeln!(index, "# mmlab report\n")?;
    writeln!(index, "Command line:\n\n```\n{command}\n```\n")?;
    writeln!(
        index,
        "CPUs: {}. Every record is in [results.jsonl](results.jsonl) (JSON Lines, one \
         record per figure). Percentages compare each column with the first.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )?;
    writeln!(index, "All of it on one page: [index.html](index.html).\n")?;
    writeln!(index, "## Seeds\n")?;
    index += &seeds::markdown(&seeds::rows(records));
    writeln!(index, "\n## Figures\n")?;
    let figure_lines = figures::figures(records);
    for f in &figure_lines {
        writeln!(index, "- {f}")?;
    }
    if !warnings.is_empty() {
        writeln!(index, "\n## Warnings\n")?;
        for w in warnings {
            writeln!(index, "- {w}")?;
        }
    }
    writeln!(index, "\n## Tables\n")?;
    let mut sections = Vec::new();
    for w in workloads {
        let tables = table::tables(w.name(), w.metrics(), records);
        let mut md = format!("# {}\n\n{}\n", w.name(), w.description());
        writeln!(
            index,
            "- [{}]({}.md): {}",
            w.name(),
            w.name(),
            w.description()
        )?;
        for t in &tables {
            let svg = plot::file_name(t);
            plot::plot(t, &dir.join(&svg))?;
            writeln!(
                md,
                "\n## {}\n\n{}\n![{}]({svg})",
                t.title(),
                t.render_markdown(),
                t.metric
            )?;
            let case = t
                .case
                .as_ref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            writeln!(index, "  - {}{case}: [plot]({svg})", t.metric)?;
        }
        let path = dir.join(format!("{}.md", w.name()));
        fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
        sections.push(html::Section {
            name: w.name(),
            description: w.description(),
            tables,
        });
    }
    let path = dir.join("index.html");
    fs::write(&path, html::page(info, records, &figure_lines, &sections)?)
        .with_context(|| format!("writing {}", path.display()))?;
    let path = dir.join("README.md");
    fs::write(&path, index).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
