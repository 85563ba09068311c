//! SVG plots (plotters): one per table, the metric against the thread count,
//! one line per variant, written as `DIR/<workload>_<metric>.svg` (a case, when
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

/// Line colours, one per variant in column order (then repeating).
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draws `table` into the SVG file `path`.
pub fn plot(table: &Table, path: &Path) -> Result<()> {
    let err = |e: &dyn std::fmt::Debug| anyhow!("plotting {}: {e:?}", path.display());
    let max_t = table.rows.iter().map(|(t, _)| *t).max().unwrap_or(1) as u32;
    let max_y = table
        .rows
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v));
    let max_y = if max_y > 0.0 { max_y * 1.1 } else { 1.0 };

    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(table.title(), ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0u32..max_t + 1, 0f64..max_y)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc(table.unit.as_str())
        .x_labels(max_t as usize + 2)
        .y_label_formatter(&|y| si(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, name) in table.columns.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(u32, f64)> = table
            .rows
            .iter()
            .filter_map(|(t, vals)| vals[i].map(|v| (*t as u32, v)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
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
    root.present().map_err(|e| err(&e))?;
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
    fn axis_labels() {
        assert_eq!(si(3.1e6), "3.1M");
        assert_eq!(si(2500.0), "2.5k");
        assert_eq!(si(42.0), "42");
        assert_eq!(si(0.5), "0.50");
    }
}
