//! `index.html`: the report as one self-contained page (no network: styles,
//! the plots' SVG and a small self-check script are inline). It opens with the
//! answer: the seeds' table (each patch series, its published headline, the
//! ratio measured here, met or not) and a small plot per seed; then the host,
//! the command line and the commit, the `figures:` block, and each workload's
//! tables with their plots.
//!
//! The self-check (for `.ci/check-report.sh`): when the page has loaded, a script
//! sets `data-check` on `<body>` to `ok N plots` if every plot (`.plot`: the
//! seeds' and the tables') is drawn (an inline
//! `<svg>` with a size and its data marks: points for a line chart, bars for a bar
//! chart), else to `empty plots: ...`; a script error sets `error: ...`.

use super::plot::{self, Kind};
use super::seeds;
use super::table::{html_escape, Table};
use super::RunInfo;
use crate::host::facts as host_facts;
use crate::record::Record;
use anyhow::Result;
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:1200px;\
color:#222;padding:0 1em}table{border-collapse:collapse;margin:.5em 0 1em}\
th,td{border:1px solid #ccc;padding:2px 8px;text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
th{background:#f3f3f3}section{overflow-x:auto}table.facts td,table.facts th{text-align:left}\
pre{background:#f7f7f7;padding:.5em;overflow-x:auto}\
.plot svg{max-width:100%;height:auto}#check{color:#888;font-size:small}\
table.seeds td,table.seeds th{text-align:left;white-space:normal;vertical-align:top}\
table.seeds td.num{text-align:right;white-space:nowrap}\
td.met{background:#dff0d8;font-weight:bold}td.notmet{background:#f8d7da;font-weight:bold}\
table.seeds tr.first td{border-top:2px solid #888}td.seedplot{padding:0;vertical-align:middle;min-width:320px}\
td.seedplot svg{width:320px;max-width:none;height:auto;display:block}\
p.note{font-size:small;color:#555}";

const CHECK: &str = r#"(function () {
  var body = document.body;
  window.addEventListener('error', function (e) {
    body.setAttribute('data-check', 'error: ' + e.message);
  });
  var plots = document.querySelectorAll('.plot');
  var bad = [];
  for (var i = 0; i < plots.length; i++) {
    var p = plots[i];
    var svg = p.querySelector('svg');
    var ok = false;
    if (svg) {
      var r = svg.getBoundingClientRect();
      var marks = p.getAttribute('data-kind') === 'bar'
        ? svg.querySelectorAll('rect').length - 1
        : svg.querySelectorAll('circle').length;
      ok = r.width > 0 && r.height > 0 && marks > 0;
    }
    if (!ok) bad.push(p.getAttribute('data-name'));
  }
  var state = bad.length ? 'empty plots: ' + bad.join(' ') : 'ok ' + plots.length + ' plots';
  body.setAttribute('data-check', state);
  document.getElementById('check').textContent = 'self-check: ' + state;
})();"#;

/// One workload's part of the page.
pub struct Section<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub tables: Vec<Table>,
}

/// The page.
pub fn page(
    info: &RunInfo,
    records: &[Record],
    figures: &[String],
    sections: &[Section],
) -> Result<String> {
    let mut h = String::new();
    writeln!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>mmlab report</title>\n<style>{STYLE}</style>\n</head>\n\
         <body data-check=\"pending\">\n<h1>mmlab report</h1>"
    )?;
    writeln!(h, "<h2>Seeds</h2>")?;
    writeln!(
        h,
        "<p class=\"note\">Each patch series the lab reproduces: its published \
         headline, the same change measured in this run (after / before), and \
         whether the measured ratio is at least the published change in the \
         direction the metric improves. In the plots, grey is published, green \
         met and red not met, on a log axis around 1.</p>"
    )?;
    h += &seeds::html(&seeds::rows(records))?;
    writeln!(h, "<h2>Run</h2>\n<table class=\"facts\">")?;
    let mut facts = host_facts::describe(info.host);
    facts.push(("command".into(), info.command.to_string()));
    facts.push((
        "commit".into(),
        info.commit.unwrap_or("unknown").to_string(),
    ));
    for (k, v) in facts {
        writeln!(
            h,
            "<tr><th>{}</th><td><code>{}</code></td></tr>",
            html_escape(&k),
            html_escape(&v)
        )?;
    }
    writeln!(h, "</table>")?;
    writeln!(
        h,
        "<p>Every record is in <a href=\"results.jsonl\">results.jsonl</a>. \
         Percentages compare each column with the first.</p>"
    )?;
    writeln!(h, "<h2>Figures</h2>\n<pre>")?;
    for f in figures {
        writeln!(h, "{}", html_escape(f))?;
    }
    writeln!(h, "</pre>")?;
    if !info.warnings.is_empty() {
        writeln!(h, "<h2>Warnings</h2>\n<ul>")?;
        for w in info.warnings {
            writeln!(h, "<li>{}</li>", html_escape(w))?;
        }
        writeln!(h, "</ul>")?;
    }
    writeln!(h, "<h2>Workloads</h2>\n<ul>")?;
    for s in sections {
        writeln!(h, "<li><a href=\"#{0}\">{0}</a></li>", html_escape(s.name))?;
    }
    writeln!(h, "</ul>")?;
    for s in sections {
        writeln!(
            h,
            "<section id=\"{0}\">\n<h2>{0}</h2>\n<p>{1}</p>",
            html_escape(s.name),
            html_escape(s.description)
        )?;
        for t in &s.tables {
            let kind = match plot::kind(t) {
                Kind::Line => "line",
                Kind::Bar => "bar",
            };
            writeln!(
                h,
                "<h3>{}</h3>\n{}<div class=\"plot\" data-kind=\"{kind}\" data-name=\"{}\">\n{}\n</div>",
                html_escape(&t.title()),
                t.render_html(),
                html_escape(&plot::file_name(t)),
                plot::svg(t)?
            )?;
        }
        writeln!(h, "</section>")?;
    }
    writeln!(
        h,
        "<p id=\"check\"></p>\n<script>\n{CHECK}\n</script>\n</body>\n</html>"
    )?;
    Ok(h)
}
