//! The SVG charts of BENCHMARKS.md, drawn with plotters' SVG backend: text is
//! written as SVG `<text>` and laid out by the viewer, so no fonts or C libraries
//! are needed.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::format::rate;
use crate::analysis::ratios::{overhead, pgbench_summaries, PgbenchSummary, OVERHEAD_TARGET};
use crate::analysis::statistics::summaries;
use crate::error::BenchError;
use crate::plan::{paired_cases, HOT_WORKERS};
use crate::run::pgbench::Mode;
use crate::run::results::Results;
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload};

fn err<E: std::fmt::Display>(e: E) -> BenchError {
    BenchError::Other(format!("chart: {e}"))
}

/// A chart of two `f64` axes, as the overhead and pgbench charts draw.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A white SVG canvas of `size` pixels, drawn into `path`.
fn canvas(
    path: &Path,
    size: (u32, u32),
) -> Result<DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, BenchError> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// The x label at `x` of a chart whose categories stand at 0, 1, ..: the
/// category's label, none between them.
fn category(labels: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 1e-6 && i >= 0.0 {
        labels.get(i as usize).cloned().unwrap_or_default()
    } else {
        String::new()
    }
}

/// The y axis of a [`category_chart`]: its description, if any, and its labels.
type YAxis<'a> = (Option<&'a str>, &'a dyn Fn(&f64) -> String);

/// A chart on `root` with `labels` along x (one category at 0, 1, ..) and `y`
/// up: its caption (text, font size), a y label area `y_area` wide, and its
/// mesh drawn, without lines across x.
fn category_chart<'a, 'b: 'a>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    (caption, size): (&str, u32),
    y_area: u32,
    labels: &[String],
    y: std::ops::Range<f64>,
    (y_desc, y_label): YAxis<'_>,
) -> Result<Chart<'a, 'b>, BenchError> {
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", size))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(y_area)
        .build_cartesian_2d(-0.5f64..(labels.len() as f64 - 0.5), y)
        .map_err(err)?;
    let x_label = |x: &f64| category(labels, *x);
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .x_labels(labels.len())
        .x_label_formatter(&x_label)
        .y_label_formatter(y_label);
    if let Some(desc) = y_desc {
        mesh.y_desc(desc);
    }
    mesh.draw().map_err(err)?;
    Ok(chart)
}

/// The legend of a chart's series, boxed in light white, at `position`.
fn legend<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    position: SeriesLabelPosition,
) -> Result<(), BenchError> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .position(position)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(err)
}

const STRATEGY_COLORS: [RGBColor; 5] = [
    RGBColor(150, 150, 150), // naive
    RGBColor(31, 119, 180),  // optimistic
    RGBColor(214, 39, 40),   // with_lock
    RGBColor(255, 127, 14),  // nowait
    RGBColor(44, 160, 44),   // atomic
];

fn backend_color(b: Backend) -> RGBColor {
    match b {
        Backend::Postgres => RGBColor(51, 103, 145),
        Backend::Mysql => RGBColor(196, 109, 30),
        Backend::Sqlite => RGBColor(90, 150, 60),
    }
}

/// Writes every chart into `dir`; returns the file names written.
pub fn write_all(results: &Results, dir: &Path) -> Result<Vec<String>, BenchError> {
    let mut written = Vec::new();
    if hot_row(results, &dir.join("hot_row.svg"))? {
        written.push("hot_row.svg".to_owned());
    }
    if overhead_chart(results, &dir.join("overhead.svg"))? {
        written.push("overhead.svg".to_owned());
    }
    if pgbench_chart(results, &dir.join("pgbench.svg"))? {
        written.push("pgbench.svg".to_owned());
    }
    Ok(written)
}

/// Hot-row throughput against workers, one panel per backend, one line per strategy.
fn hot_row(results: &Results, path: &Path) -> Result<bool, BenchError> {
    let sums = summaries(results);
    let backends: Vec<Backend> = Backend::ALL
        .into_iter()
        .filter(|b| {
            sums.keys()
                .any(|(bb, c)| bb == b && c.workload == Workload::HotRow)
        })
        .collect();
    if backends.is_empty() {
        return Ok(false);
    }
    let width = (420 * backends.len() as u32).max(720);
    let root = canvas(path, (width, 430))?;
    let root = root
        .titled(
            "Hot row: updates per second against workers (higher is better)",
            ("sans-serif", 18),
        )
        .map_err(err)?;
    let (legend, root) = root.split_vertically(30);
    // The legend, once, in a strip of its own: inside a panel it hides lines.
    let mut x = 20;
    for (k, s) in Strategy::HOT_ROW.iter().enumerate() {
        let color = STRATEGY_COLORS[k];
        legend
            .draw(&PathElement::new(
                vec![(x, 15), (x + 24, 15)],
                color.stroke_width(3),
            ))
            .map_err(err)?;
        legend
            .draw(&Text::new(s.title(), (x + 30, 8), ("sans-serif", 13)))
            .map_err(err)?;
        x += 36 + 7 * s.title().len() as i32;
    }
    let panels = root.split_evenly((1, backends.len()));
    for (panel, &b) in panels.iter().zip(&backends) {
        let series: Vec<(Strategy, Vec<(i32, f64)>)> = Strategy::HOT_ROW
            .iter()
            .map(|&s| {
                let points = HOT_WORKERS
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &n)| {
                        sums.get(&(b, Case::new(Workload::HotRow, s, n)))
                            .map(|x| (i as i32, x.throughput))
                    })
                    .collect();
                (s, points)
            })
            .collect();
        let max = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|x| x.1))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(report_name(b), ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0i32..(HOT_WORKERS.len() as i32 - 1), 0.0..max * 1.1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_labels(HOT_WORKERS.len())
            .x_label_formatter(&|i| {
                HOT_WORKERS
                    .get(*i as usize)
                    .map_or(String::new(), |n| n.to_string())
            })
            .x_desc("workers")
            .y_desc("updates/s")
            .y_label_formatter(&|v| rate(*v))
            .draw()
            .map_err(err)?;
        for (k, (_, points)) in series.into_iter().enumerate() {
            let color = STRATEGY_COLORS[k];
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(err)?;
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(true)
}

fn case_short(case: &Case) -> String {
    match case.workload {
        Workload::Uncontended => format!("update {}w", case.workers),
        Workload::HotRow => {
            let s = match case.strategy {
                Strategy::Optimistic => "optimistic",
                Strategy::WithLock => "with_lock",
                Strategy::Atomic => "atomic",
                s => s.title(),
            };
            format!("{s} {}w", case.workers)
        }
        Workload::Queue => format!("claim b{}", case.batch),
        Workload::Orders => case.strategy.title().to_owned(),
        Workload::OwnRows => format!("own {} {}w", case.strategy.title(), case.workers),
    }
}

/// lockkit / hand-written per case and backend: median, with min–max whiskers.
fn overhead_chart(results: &Results, path: &Path) -> Result<bool, BenchError> {
    let cases = paired_cases();
    let mut points = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        for (j, b) in Backend::ALL.into_iter().enumerate() {
            if let Some((m, lo, hi)) = overhead(results, b, case) {
                points.push((i as f64 + (j as f64 - 1.0) * 0.22, b, m, lo, hi));
            }
        }
    }
    if points.is_empty() {
        return Ok(false);
    }
    let lo = points.iter().map(|p| p.3).fold(0.9, f64::min).max(0.0) - 0.02;
    let hi = points.iter().map(|p| p.4).fold(1.1, f64::max) + 0.02;
    let labels: Vec<String> = cases.iter().map(case_short).collect();
    let root = canvas(path, (1000, 420))?;
    let mut chart = category_chart(
        &root,
        (
            "lockkit / hand-written Diesel (part of it: statement caching; dots: median, bars: min–max)",
            16,
        ),
        50,
        &labels,
        lo..hi,
        (Some("throughput ratio"), &|v| format!("{v:.2}")),
    )?;
    let xs = (-0.5, cases.len() as f64 - 0.5);
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(xs.0, 1.0), (xs.1, 1.0)],
            BLACK.stroke_width(1),
        )))
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(xs.0, OVERHEAD_TARGET), (xs.1, OVERHEAD_TARGET)],
            RED.mix(0.6).stroke_width(1),
        )))
        .map_err(err)?
        .label(format!("target {OVERHEAD_TARGET:.2}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.mix(0.6)));
    for b in Backend::ALL {
        let color = backend_color(b);
        let mine: Vec<_> = points.iter().filter(|p| p.1 == b).collect();
        if mine.is_empty() {
            continue;
        }
        chart
            .draw_series(
                mine.iter()
                    .map(|p| PathElement::new(vec![(p.0, p.3), (p.0, p.4)], color.stroke_width(2))),
            )
            .map_err(err)?;
        chart
            .draw_series(
                mine.iter()
                    .map(|p| Circle::new((p.0, p.2), 4, color.filled())),
            )
            .map_err(err)?
            .label(report_name(b))
            .legend(move |(x, y)| Circle::new((x + 9, y), 4, color.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    root.present().map_err(err)?;
    Ok(true)
}

/// A bar series of the pgbench chart: label, colour, value.
type Bar = (String, RGBColor, Box<dyn Fn(&PgbenchSummary) -> f64>);

/// lockkit against pgbench (four ways) per script.
fn pgbench_chart(results: &Results, path: &Path) -> Result<bool, BenchError> {
    let pg = pgbench_summaries(results);
    if pg.is_empty() {
        return Ok(false);
    }
    let max = pg
        .iter()
        .flat_map(|s| std::iter::once(s.lockkit).chain(Mode::ALL.iter().map(|&m| s.rate(m))))
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max);
    let labels: Vec<String> = pg.iter().map(|s| s.script.title()).collect();
    let root = canvas(path, (900, 420))?;
    let mut chart = category_chart(
        &root,
        (
            "PostgreSQL, 16 clients, the same SQL: lockkit and pgbench (per second; label: lockkit / server limit)",
            15,
        ),
        60,
        &labels,
        0.0..max * 1.2,
        (None, &|v| rate(*v)),
    )?;
    let bars: [Bar; 5] = [
        (
            "lockkit".into(),
            RGBColor(214, 39, 40),
            Box::new(|s| s.lockkit),
        ),
        (
            format!("pgbench {}", Mode::Prepared.title()),
            RGBColor(51, 103, 145),
            Box::new(|s| s.rate(Mode::Prepared)),
        ),
        (
            format!("pgbench {}", Mode::PreparedThreads.title()),
            RGBColor(85, 135, 175),
            Box::new(|s| s.rate(Mode::PreparedThreads)),
        ),
        (
            format!("pgbench {}", Mode::Extended.title()),
            RGBColor(120, 160, 200),
            Box::new(|s| s.rate(Mode::Extended)),
        ),
        (
            format!("pgbench {}", Mode::ExtendedThreads.title()),
            RGBColor(180, 205, 230),
            Box::new(|s| s.rate(Mode::ExtendedThreads)),
        ),
    ];
    let width = 0.8 / bars.len() as f64;
    for (k, (label, color, value)) in bars.iter().enumerate() {
        let color = *color;
        chart
            .draw_series(pg.iter().enumerate().map(|(i, s)| {
                let x0 = i as f64 - 0.4 + k as f64 * width;
                let v = value(s);
                Rectangle::new(
                    [
                        (x0 + 0.01, 0.0),
                        (x0 + width - 0.01, if v.is_finite() { v } else { 0.0 }),
                    ],
                    color.filled(),
                )
            }))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .draw_series(pg.iter().enumerate().map(|(i, s)| {
            Text::new(
                format!("{:.2}", s.ratio(Mode::Prepared).0),
                (i as f64 - 0.38, s.lockkit + max * 0.05),
                ("sans-serif", 13),
            )
        }))
        .map_err(err)?;
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)?;
    Ok(true)
}
