//! The seed's monitoring signals as SVG line charts, one line per policy:
//! prefix-cache hit rate over time, and mean turn latency by turn index.
//! SVG only (plotters' svg backend, no font library): the viewer lays out
//! the text.

use std::path::Path;

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::metrics::RunResult;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 560;
const LEGEND_WIDTH: u32 = 230;

/// Distinct colours (Tableau 10); `none` is always black.
const COLORS: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

/// How one policy's line looks.
#[derive(Debug, Clone, Copy)]
struct Look {
    color: RGBColor,
    dashed: bool,
    width: u32,
}

impl Look {
    fn style(&self) -> ShapeStyle {
        ShapeStyle {
            color: self.color.to_rgba(),
            filled: false,
            stroke_width: self.width,
        }
    }
}

fn looks(runs: &[RunResult]) -> Vec<Look> {
    let mut next = 0;
    runs.iter()
        .map(|r| {
            if r.policy.name == "none" {
                return Look {
                    color: BLACK,
                    dashed: false,
                    width: 3,
                };
            }
            let color = COLORS[next % COLORS.len()];
            next += 1;
            Look {
                color,
                dashed: r.policy.name.starts_with("cap"),
                width: 2,
            }
        })
        .collect()
}

/// A plotting failure, rendered as text.
fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// What one chart shows.
struct Chart<'a> {
    title: String,
    x_desc: &'a str,
    y_desc: &'a str,
    x_max: f64,
    y_max: f64,
}

/// One chart: `series[i]` are the points of `runs[i]`.
fn chart(
    path: &Path,
    c: &Chart<'_>,
    runs: &[RunResult],
    series: &[Vec<(f64, f64)>],
) -> Result<(), String> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..c.x_max, 0f64..c.y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .axis_desc_style(("sans-serif", 16))
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    let looks = looks(runs);
    // The baseline goes on top, so it stays visible where others coincide.
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| runs[i].policy.name == "none");
    for (points, look) in order.iter().map(|&i| (&series[i], &looks[i])) {
        let style = look.style();
        if look.dashed {
            chart
                .draw_series(DashedLineSeries::new(points.iter().copied(), 8, 5, style))
                .map_err(err)?;
        } else {
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))
                .map_err(err)?;
        }
    }
    for (i, (run, look)) in runs.iter().zip(&looks).enumerate() {
        let y = 40 + 24 * i as i32;
        let style = look.style();
        if look.dashed {
            legend_area
                .draw(&DashedPathElement::new(vec![(8, y), (44, y)], 8, 5, style))
                .map_err(err)?;
        } else {
            legend_area
                .draw(&PathElement::new(vec![(8, y), (44, y)], style))
                .map_err(err)?;
        }
        legend_area
            .draw(&Text::new(
                run.policy.name.clone(),
                (52, y - 7),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `hit_rate_over_time.svg` and `latency_by_turn.svg` into `dir`.
pub fn write(dir: &Path, scenario: &str, runs: &[RunResult], bucket_ns: u64) -> Result<(), String> {
    let hits: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.hit_rate_over_time(bucket_ns)
                .into_iter()
                // Plot each bucket at its middle.
                .map(|(t, h)| (t + bucket_ns as f64 / 2e9, h * 100.0))
                .collect()
        })
        .collect();
    let x_max = runs.iter().map(|r| r.makespan_ns).max().unwrap_or(1) as f64 / 1e9;
    let hit_chart = Chart {
        title: format!("{scenario}: prefix-cache hit rate over time"),
        x_desc: "simulated time (s)",
        y_desc: "hit rate (%)",
        x_max: x_max.max(1.0) * 1.02,
        y_max: 100.0,
    };
    chart(&dir.join("hit_rate_over_time.svg"), &hit_chart, runs, &hits)?;
    let latency: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            r.latency_by_turn()
                .into_iter()
                .map(|(k, l, _)| (k as f64, l))
                .collect()
        })
        .collect();
    let turns = runs
        .iter()
        .flat_map(|r| r.turns.iter().map(|t| t.turn))
        .max()
        .unwrap_or(1) as f64;
    let y_max = latency
        .iter()
        .flatten()
        .map(|&(_, l)| l)
        .fold(0.0, f64::max);
    let latency_chart = Chart {
        title: format!("{scenario}: mean turn latency by turn index"),
        x_desc: "turn index",
        y_desc: "mean latency, issue to last token (s)",
        x_max: turns.max(1.0),
        y_max: (y_max * 1.08).max(0.1),
    };
    chart(
        &dir.join("latency_by_turn.svg"),
        &latency_chart,
        runs,
        &latency,
    )
}
