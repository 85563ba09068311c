//! SVG plots (plotters): one per table, the metric against the thread count
//! (log2 axis, ticks at the thread counts), one line per variant in its own
//! colour, bounds (raw clearing loops) dashed; a table with one thread count is
//! a bar per variant instead. Written as `DIR/<workload>_<metric>.svg` (a case, when
//! there is one, goes between: `<workload>_<case>_<metric>.svg`).

use super::table::Table;
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::path::Path;

/// The file name of `table`'s plot.
pub fn file_name(table: &Table) -> String {
    let case = table
        .case
        .as_ref()
        .map(|c| format!("_{}", sanitize(c)))
        .unwrap_or_default();
    format!("{}{}_{}.svg", table.workload, case, table.metric)
}

/// Keeps a case name usable in a file name.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Axis labels: 3100000 -> "3.1M".
fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Colours, one per variant in column order: a qualitative palette, then hues
/// spread by the golden angle, so no two columns of a table share one.
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(128, 128, 0),
];

/// The colour of column `i`.
pub fn color(i: usize) -> RGBColor {
    if let Some(c) = PALETTE.get(i) {
        return *c;
    }
    let hue = (i as f64 * 0.618_034).fract();
    let (r, g, b) = HSLColor(hue, 0.65, 0.4).rgb();
    RGBColor(r, g, b)
}

/// Whether a variant is a bound rather than an implementation (a raw loop that
/// only clears): drawn dashed (lines) or hollow (bars).
pub fn is_bound(variant: &str) -> bool {
    variant.starts_with("clear-only") || variant.starts_with("raw-")
}

/// How a table is drawn: a line per variant over the thread counts, or, with one
/// thread count, a bar per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Line,
    Bar,
}

/// The kind of `table`'s plot.
pub fn kind(table: &Table) -> Kind {
    if table.rows.len() > 1 {
        Kind::Line
    } else {
        Kind::Bar
    }
}

/// Draws `table` into the SVG file `path`.
pub fn plot(table: &Table, path: &Path) -> Result<()> {
    let svg = svg(table)?;
    std::fs::write(path, svg).map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

/// `table`'s plot as SVG text.
pub fn svg(table: &Table) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 480)).into_drawing_area();
        match kind(table) {
            Kind::Line => line_chart(table, &root)?,
            Kind::Bar => bar_chart(table, &root)?,
        }
        root.present()
            .map_err(|e| anyhow!("plotting {}: {e:?}", table.title()))?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn max_value(table: &Table) -> f64 {
    let max_y = table
        .rows
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v));
    if max_y > 0.0 {
        max_y * 1.1
    } else {
        1.0
    }
}

/// Lines over the thread counts, on a log2 axis whose ticks are the thread counts.
fn line_chart(table: &Table, root: &Area) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plotting {}: {e:?}", table.title());
    let ticks: Vec<f64> = table.rows.iter().map(|(t, _)| (*t).max(1) as f64).collect();
    let (lo, hi) = (
        ticks.iter().copied().fold(f64::INFINITY, f64::min),
        ticks.iter().copied().fold(1.0, f64::max),
    );
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(root)
        .caption(table.title(), ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (lo / 1.3..hi * 1.3)
                .log_scale()
                .base(2.0)
                .with_key_points(ticks.clone()),
            0f64..max_value(table),
        )
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc(table.unit.as_str())
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| si(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, name) in table.columns.iter().enumerate() {
        let color = color(i);
        let style = color.stroke_width(2);
        let pts: Vec<(f64, f64)> = table
            .rows
            .iter()
            .filter_map(|(t, vals)| vals[i].map(|v| ((*t).max(1) as f64, v)))
            .collect();
        let series = if is_bound(name) {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))
        };
        let dashed = is_bound(name);
        series
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                if dashed {
                    PathElement::new(vec![(x, y), (x + 7, y)], color)
                } else {
                    PathElement::new(vec![(x, y), (x + 20, y)], color)
                }
            });
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    Ok(())
}

/// One horizontal bar per variant (a table with one thread count), the variant
/// names on the axis, the first at the top.
fn bar_chart(table: &Table, root: &Area) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plotting {}: {e:?}", table.title());
    let n = table.columns.len().max(1);
    let threads = table.rows.first().map_or(1, |(t, _)| *t);
    let values: Vec<Option<f64>> = table
        .rows
        .first()
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    // Column i sits at y = n - i - 0.5.
    let names = table.columns.clone();
    // The axis has key points every half unit; the centres get the names.
    let label = move |y: &f64| {
        let i = n as f64 - y - 0.5;
        if (i - i.round()).abs() > 0.01 || i < -0.01 {
            return String::new();
        }
        names.get(i.round() as usize).cloned().unwrap_or_default()
    };
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let t = if threads == 1 { "thread" } else { "threads" };
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{} @ {threads} {t}", table.title()),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(180)
        .build_cartesian_2d(0f64..max_value(table), 0f64..n as f64)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(2 * n + 1)
        .x_desc(table.unit.as_str())
        .x_label_formatter(&|x| si(*x))
        .y_label_formatter(&label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, v) in values.iter().enumerate() {
        let Some(v) = *v else { continue };
        let y = n as f64 - i as f64 - 0.5;
        let c = color(i);
        let style = if is_bound(&table.columns[i]) {
            c.stroke_width(2)
        } else {
            c.filled()
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.35), (v, y + 0.35)],
                style,
            )))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                si(v),
                (v, y),
                ("sans-serif", 12).into_font(),
            )))
            .map_err(|e| err(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg() {
        let t = Table {
            workload: "alloc_free".into(),
            metric: "ops_per_sec".into(),
            case: Some("2 MiB".into()),
            unit: "1/s".into(),
            higher_is_better: Some(true),
            columns: vec!["mmkit".into(), "mimalloc".into()],
            rows: vec![
                (1, vec![Some(1e6), Some(2e6)]),
                (2, vec![Some(1.5e6), None]),
            ],
        };
        assert_eq!(file_name(&t), "alloc_free_2_MiB_ops_per_sec.svg");
        let dir = std::env::temp_dir().join(format!("mmlab-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(file_name(&t));
        plot(&t, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("mimalloc"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_thread_count_is_a_bar_chart_with_distinct_colours() {
        let columns: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
        let t = Table {
            workload: "clear_huge".into(),
            metric: "gb_per_sec".into(),
            case: None,
            unit: "GB/s".into(),
            higher_is_better: Some(true),
            rows: vec![(1, (0..10).map(|i| Some(i as f64 + 1.0)).collect())],
            columns,
        };
        assert_eq!(kind(&t), Kind::Bar);
        let svg = svg(&t).unwrap();
        assert!(svg.matches("<rect").count() >= 11, "{svg}");
        assert!(svg.contains("v9"));
        let colors: std::collections::HashSet<_> = (0..20).map(color).collect();
        assert_eq!(colors.len(), 20);
        assert!(is_bound("clear-only-nt") && is_bound("raw-nt") && !is_bound("mmkit"));
    }

    #[test]
    fn axis_labels() {
        assert_eq!(si(3.1e6), "3.1M");
        assert_eq!(si(2500.0), "2.5k");
        assert_eq!(si(42.0), "42");
        assert_eq!(si(0.5), "0.50");
    }
}
