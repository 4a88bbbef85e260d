//! Report output: markdown tables and SVG line charts, written to an output folder.
//!
//! Charts are drawn with plotters' SVG backend, which needs no system fonts (text is left to
//! the viewer), so reports render the same on every machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// A markdown table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    /// Per column: right-align (numbers) or left-align (names).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns; a column is right-aligned when its header ends with `>`
    /// (which is stripped), as numbers read best right-aligned.
    pub fn new<S: AsRef<str>>(headers: &[S]) -> Self {
        let (headers, right) = headers
            .iter()
            .map(|h| {
                let h = h.as_ref();
                h.strip_suffix('>')
                    .map_or((h.to_owned(), false), |s| (s.to_owned(), true))
            })
            .unzip();
        Self {
            headers,
            right,
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are left empty, extra cells dropped).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The markdown text, columns padded so the source reads as a table too.
    pub fn to_markdown(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.headers[c].chars().count(), 3])
                    .max()
                    .unwrap_or(3)
            })
            .collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .zip(&self.right)
                .map(|((cell, &w), &right)| {
                    if right {
                        format!("{cell:>w$}")
                    } else {
                        format!("{cell:<w$}")
                    }
                })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut out = line(&self.headers);
        let rule: Vec<String> = widths
            .iter()
            .zip(&self.right)
            .map(|(&w, &right)| {
                if right {
                    format!("{}:", "-".repeat(w - 1))
                } else {
                    "-".repeat(w)
                }
            })
            .collect();
        let _ = writeln!(out, "| {} |", rule.join(" | "));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// One named line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
    /// Dashed (for published reference curves).
    pub dashed: bool,
}

/// How a chart's axes are set up.
#[derive(Clone, Debug)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Fixed y range; `None` fits the data (from zero).
    pub y_range: Option<(f64, f64)>,
    /// Logarithmic x axis (values ≤ 0 are not drawn).
    pub log_x: bool,
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or folder could not be written.
    #[error("{path}: cannot write: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The chart could not be drawn.
    #[error("chart {title:?}: {message}")]
    Draw {
        /// The chart.
        title: String,
        /// What went wrong.
        message: String,
    },
}

/// Qualitative colours that stay apart for the colour-blind (Okabe–Ito).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// The colour of the `i`-th series.
fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Renders `series` as an SVG line chart.
pub fn line_chart(chart: &Chart, series: &[Series]) -> Result<String, ReportError> {
    let draw_error = |e: &dyn std::fmt::Display| ReportError::Draw {
        title: chart.title.clone(),
        message: e.to_string(),
    };
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    };
    let (mut x_min, mut x_max) = points()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (x, _)| {
            (lo.min(*x), hi.max(*x))
        });
    if chart.log_x {
        x_min = points()
            .map(|(x, _)| *x)
            .filter(|x| *x > 0.0)
            .fold(f64::INFINITY, f64::min);
    }
    if !x_min.is_finite() || !x_max.is_finite() {
        (x_min, x_max) = (if chart.log_x { 1.0 } else { 0.0 }, 1.0);
    }
    if x_max <= x_min {
        x_max = x_min + 1.0;
    }
    let (y_min, y_max) = chart.y_range.unwrap_or_else(|| {
        let top = points().map(|(_, y)| *y).fold(0.0_f64, f64::max);
        (0.0, if top > 0.0 { top * 1.05 } else { 1.0 })
    });

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_error(&e))?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(&chart.title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(42)
            .y_label_area_size(58);
        if chart.log_x {
            let mut ctx = builder
                .build_cartesian_2d((x_min..x_max).log_scale(), y_min..y_max)
                .map_err(|e| draw_error(&e))?;
            ctx.configure_mesh()
                .x_desc(&chart.x_label)
                .y_desc(&chart.y_label)
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .map_err(|e| draw_error(&e))?;
            for (i, s) in series.iter().enumerate() {
                let style = ShapeStyle::from(colour(i)).stroke_width(2);
                let pts: Vec<(f64, f64)> =
                    s.points.iter().copied().filter(|(x, _)| *x > 0.0).collect();
                ctx.draw_series(LineSeries::new(pts, style))
                    .map_err(|e| draw_error(&e))?
                    .label(&s.name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            }
            ctx.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(|e| draw_error(&e))?;
        } else {
            let mut ctx = builder
                .build_cartesian_2d(x_min..x_max, y_min..y_max)
                .map_err(|e| draw_error(&e))?;
            ctx.configure_mesh()
                .x_desc(&chart.x_label)
                .y_desc(&chart.y_label)
                .light_line_style(WHITE.mix(0.0))
                .draw()
                .map_err(|e| draw_error(&e))?;
            for (i, s) in series.iter().enumerate() {
                let style = ShapeStyle::from(colour(i)).stroke_width(2);
                if s.dashed {
                    ctx.draw_series(DashedLineSeries::new(s.points.clone(), 6, 4, style))
                        .map_err(|e| draw_error(&e))?
                        .label(&s.name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
                } else {
                    ctx.draw_series(LineSeries::new(s.points.clone(), style))
                        .map_err(|e| draw_error(&e))?
                        .label(&s.name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
                }
            }
            ctx.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| draw_error(&e))?;
        }
        root.present().map_err(|e| draw_error(&e))?;
    }
    Ok(svg)
}

/// Most points a CDF is drawn with: enough for a smooth curve, few enough for a small file.
const CDF_POINTS: usize = 400;

/// The empirical CDF of a sorted sample as chart points (x = value, y = % at or below), thinned
/// to at most about [`CDF_POINTS`] evenly spaced ranks (the last one always kept).
#[allow(clippy::cast_precision_loss)]
pub fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    let step = n.div_ceil(CDF_POINTS).max(1);
    let point = |i: usize| (sorted[i], 100.0 * (i + 1) as f64 / n as f64);
    let mut points: Vec<(f64, f64)> = (0..n).step_by(step).map(point).collect();
    if n > 0 && !(n - 1).is_multiple_of(step) {
        points.push(point(n - 1));
    }
    points
}

/// Writes `contents` to `dir/name`, creating `dir`.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> Result<PathBuf, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// A number with `digits` decimals, or `—` when absent.
pub fn number(value: Option<f64>, digits: usize) -> String {
    value
        .filter(|v| v.is_finite())
        .map_or_else(|| "—".to_owned(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
    use super::*;

    #[test]
    fn markdown_tables_align() {
        let mut table = Table::new(&["policy", "alloc %>"]);
        table.row(["FGD", "95.39"]);
        table.row(["best-fit"]);
        assert_eq!(
            table.to_markdown(),
            "| policy   | alloc % |\n| -------- | ------: |\n| FGD      |   95.39 |\n| best-fit |         |\n"
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn charts_are_svg_with_every_series() {
        let chart = Chart {
            title: "Utilisation".into(),
            x_label: "hour".into(),
            y_label: "% of GPUs".into(),
            y_range: Some((0.0, 100.0)),
            log_x: false,
        };
        let series = vec![
            Series {
                name: "static".into(),
                points: vec![(0.0, 40.0), (1.0, 45.0)],
                dashed: false,
            },
            Series {
                name: "borrow".into(),
                points: vec![(0.0, 70.0), (1.0, 75.0)],
                dashed: true,
            },
        ];
        let svg = line_chart(&chart, &series).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("static") && svg.contains("borrow") && svg.contains("Utilisation"));
        let log = Chart {
            log_x: true,
            ..chart
        };
        let svg = line_chart(
            &log,
            &[Series {
                name: "cdf".into(),
                points: cdf_points(&[0.0, 0.5, 2.0]),
                dashed: false,
            }],
        )
        .unwrap();
        assert!(svg.contains("cdf"));
    }

    #[test]
    fn numbers_and_cdf() {
        assert_eq!(number(Some(95.391), 2), "95.39");
        assert_eq!(number(None, 2), "—");
        assert_eq!(number(Some(f64::NAN), 1), "—");
        assert_eq!(cdf_points(&[1.0, 2.0]), vec![(1.0, 50.0), (2.0, 100.0)]);
        let many: Vec<f64> = (0..10_001).map(f64::from).collect();
        let thin = cdf_points(&many);
        assert!(thin.len() <= CDF_POINTS + 1, "{}", thin.len());
        assert_eq!(thin.last(), Some(&(10_000.0, 100.0)), "the maximum is kept");
        assert!(cdf_points(&[]).is_empty());
    }
}
