//! Charts of a members sweep (`plaza bench` find-max): latency and throughput against the
//! number of members per room, one line per target, each written as SVG and PNG.
//!
//! Text is drawn with DejaVu Sans, embedded in the binary (`assets/DejaVuSans.ttf`, its
//! license beside it) and handed to plotters' `ab_glyph` renderer, so the PNGs look the same
//! on every machine and need no system fonts. The SVGs name the `sans-serif` family and leave
//! the font to the viewer.
//!
//! Points that did not pass are drawn as crosses, passing ones as filled marks, so the point
//! where a target breaks shows; the lines join the points in order of members, whatever the
//! order they were measured in.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

/// DejaVu Sans 2.37; see `assets/DejaVuSans-LICENSE.txt`.
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// The family every text of the charts uses (plotters' default family, too).
const FAMILY: &str = "sans-serif";

/// Size of every chart, in pixels (SVG user units).
const SIZE: (u32, u32) = (900, 560);

/// One measured point of a sweep.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SweepPoint {
    /// Members per room in this run.
    pub members: u64,
    /// Mean delivery latency, ms; `None` when nothing was timed.
    pub latency_mean_ms: Option<f64>,
    /// 99th percentile of the delivery latency, ms; `None` when nothing was timed.
    pub latency_p99_ms: Option<f64>,
    /// Deliveries received per second over the measured window.
    pub deliveries_per_s: f64,
    /// Whether the run met the scenario's expectations.
    pub passed: bool,
}

/// One target's points, in the order measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Series {
    /// The target's name, e.g. `plaza`, `centrifugo`, `socketio`, `reference`.
    pub target: String,
    /// Its points, in the order measured.
    pub points: Vec<SweepPoint>,
}

/// Why the charts could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The embedded font could not be loaded.
    #[error("chart font: {0}")]
    Font(String),
    /// Creating the directory or writing a file failed.
    #[error("writing chart: {0}")]
    Io(String),
    /// plotters failed to draw or to encode the image.
    #[error("drawing chart: {0}")]
    Draw(String),
}

/// Draws latency.svg/.png and throughput.svg/.png into `dir`; returns the paths written.
///
/// `dir` is created if missing. Latency (mean solid, p99 dashed, log scale) and deliveries per
/// second share the members axis. Missing or non-finite values are left out; an empty `series`
/// gives charts with axes only.
pub fn draw_sweep_charts(
    title: &str,
    series: &[Series],
    dir: &Path,
) -> Result<Vec<PathBuf>, ChartError> {
    ensure_font()?;
    std::fs::create_dir_all(dir).map_err(|e| ChartError::Io(format!("{}: {e}", dir.display())))?;
    let lines = prepare(series);
    let x = members_range(&lines);
    let mut written = Vec::with_capacity(4);
    for (name, chart) in [
        ("latency", Chart::Latency),
        ("throughput", Chart::Throughput),
    ] {
        let svg_path = dir.join(format!("{name}.svg"));
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
            draw(&root, chart, title, &lines, x.clone())?;
            root.present().map_err(draw_error)?;
        }
        std::fs::write(&svg_path, svg)
            .map_err(|e| ChartError::Io(format!("{}: {e}", svg_path.display())))?;
        written.push(svg_path);

        let png_path = dir.join(format!("{name}.png"));
        {
            let root = BitMapBackend::new(&png_path, SIZE).into_drawing_area();
            draw(&root, chart, title, &lines, x.clone())?;
            root.present()
                .map_err(|e| ChartError::Draw(format!("{}: {e}", png_path.display())))?;
        }
        written.push(png_path);
    }
    Ok(written)
}

/// Registers the embedded font under [`FAMILY`], once per process.
fn ensure_font() -> Result<(), ChartError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            register_font(FAMILY, FontStyle::Normal, FONT)
                .map_err(|_| "the embedded DejaVu Sans could not be parsed".to_string())
        })
        .clone()
        .map_err(ChartError::Font)
}

fn draw_error(e: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(e.to_string())
}

#[derive(Debug, Clone, Copy)]
enum Chart {
    Latency,
    Throughput,
}

/// A point ready to draw: members as a coordinate, and whether it passed.
#[derive(Debug, Clone, Copy)]
struct Mark {
    x: f64,
    y: f64,
    passed: bool,
}

/// One target, sorted by members, finite values only.
struct Line {
    target: String,
    color: RGBColor,
    mean: Vec<Mark>,
    p99: Vec<Mark>,
    rate: Vec<Mark>,
}

fn prepare(series: &[Series]) -> Vec<Line> {
    let mut spare = 0;
    series
        .iter()
        .map(|s| {
            let mut points: Vec<&SweepPoint> = s.points.iter().collect();
            points.sort_by_key(|p| p.members);
            let pick = |value: fn(&SweepPoint) -> Option<f64>, positive: bool| -> Vec<Mark> {
                points
                    .iter()
                    .filter_map(|p| {
                        let y = value(p)?;
                        let ok = y.is_finite() && if positive { y > 0.0 } else { y >= 0.0 };
                        ok.then_some(Mark {
                            x: p.members as f64,
                            y,
                            passed: p.passed,
                        })
                    })
                    .collect()
            };
            // Latencies go on a log scale: zero cannot be drawn there.
            let mean = pick(|p| p.latency_mean_ms, true);
            let p99 = pick(|p| p.latency_p99_ms, true);
            let rate = pick(|p| Some(p.deliveries_per_s), false);
            let color = known_color(&s.target).unwrap_or_else(|| {
                spare += 1;
                SPARE_COLORS[(spare - 1) % SPARE_COLORS.len()]
            });
            Line {
                target: s.target.clone(),
                color,
                mean,
                p99,
                rate,
            }
        })
        .collect()
}

/// Fixed colours for the usual targets, so charts of different runs compare at a glance.
fn known_color(target: &str) -> Option<RGBColor> {
    Some(match target.to_ascii_lowercase().as_str() {
        "plaza" => RGBColor(31, 119, 180),
        "centrifugo" => RGBColor(255, 127, 14),
        "socketio" | "socket.io" => RGBColor(44, 160, 44),
        "reference" => RGBColor(110, 110, 110),
        _ => return None,
    })
}

/// Colours for other targets, none of them one of the fixed ones.
const SPARE_COLORS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The members axis, shared by both charts: from 0 unless the sweep starts far from it.
fn members_range(lines: &[Line]) -> std::ops::Range<f64> {
    let xs = lines
        .iter()
        .flat_map(|l| l.mean.iter().chain(&l.p99).chain(&l.rate))
        .map(|m| m.x);
    let Some((lo, hi)) = min_max(xs) else {
        return 0.0..10.0;
    };
    if lo == hi {
        return (lo * 0.8 - 1.0).max(0.0)..hi * 1.2 + 1.0;
    }
    let pad = (hi - lo) * 0.05;
    let start = if lo <= hi - lo { 0.0 } else { lo - pad };
    start..hi + pad
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: Chart,
    title: &str,
    lines: &[Line],
    x: std::ops::Range<f64>,
) -> Result<(), ChartError> {
    root.fill(&WHITE).map_err(draw_error)?;
    let caption = match chart {
        Chart::Latency => format!("{title}: latency"),
        Chart::Throughput => format!("{title}: throughput"),
    };
    let area = root
        .margin(10, 0, 0, 0)
        .titled(&caption, (FAMILY, 22))
        .map_err(draw_error)?;
    let keys = legend_keys(chart, lines);
    // The legend gets a column of its own right of the plot, so it never hides a line.
    let (plot, legend) = if keys.is_empty() {
        (area, None)
    } else {
        let style = legend_style();
        let mut widest = 0;
        for key in &keys {
            let (w, _) = area
                .estimate_text_size(&key.label, &style)
                .map_err(draw_error)?;
            widest = widest.max(w);
        }
        let width = (widest + LEGEND_TEXT_X as u32 + 16).clamp(110, 320);
        let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(width));
        (plot, Some(legend))
    };
    match chart {
        Chart::Latency => draw_latency(&plot, lines, x)?,
        Chart::Throughput => draw_throughput(&plot, lines, x)?,
    }
    if let Some(legend) = legend {
        draw_legend(&legend, &keys)?;
    }
    Ok(())
}

/// Plot margins, in pixels; the legend's first row lines up with the top of the plot.
const MARGIN: u32 = 16;

fn mesh_and_chart<'a, DB, Y>(
    area: &'a DrawingArea<DB, Shift>,
    x: std::ops::Range<f64>,
    y: Y,
    y_desc: &str,
    y_format: &dyn Fn(&f64) -> String,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y::CoordDescType>>, ChartError>
where
    DB: DrawingBackend + 'a,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .margin_top(MARGIN)
        .margin_bottom(MARGIN / 2)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("members per room")
        .y_desc(y_desc)
        .x_labels(10)
        .y_labels(12)
        .x_label_formatter(&|v| format_count(*v))
        .y_label_formatter(y_format)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(BLACK.mix(0.04))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(draw_error)?;
    Ok(chart)
}

fn draw_latency<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lines: &[Line],
    x: std::ops::Range<f64>,
) -> Result<(), ChartError> {
    let ys = lines
        .iter()
        .flat_map(|l| l.mean.iter().chain(&l.p99))
        .map(|m| m.y);
    // From just below a power of ten, over at least one decade: the log axis labels powers of
    // ten (and steps between them when there are few), so a range without one has no labels.
    let y = match min_max(ys) {
        None => 0.999..1000.0,
        Some((lo, hi)) => {
            let decade = 10f64.powf(lo.log10().floor());
            decade * 0.999..(hi * 1.5).max(decade * 10.0)
        }
    };
    let mut chart = mesh_and_chart(area, x, y.log_scale(), "latency (ms)", &|v| format_ms(*v))?;
    for line in lines {
        let color = line.color;
        chart
            .draw_series(LineSeries::new(
                line.mean.iter().map(|m| (m.x, m.y)),
                color.stroke_width(2),
            ))
            .map_err(draw_error)?;
        chart
            .draw_series(DashedLineSeries::new(
                line.p99.iter().map(|m| (m.x, m.y)),
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(draw_error)?;
        draw_marks(&mut chart, &line.mean, color, Glyph::Circle)?;
        draw_marks(&mut chart, &line.p99, color, Glyph::Triangle)?;
    }
    Ok(())
}

fn draw_throughput<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lines: &[Line],
    x: std::ops::Range<f64>,
) -> Result<(), ChartError> {
    let top = min_max(lines.iter().flat_map(|l| &l.rate).map(|m| m.y))
        .map(|(_, hi)| hi)
        .filter(|hi| *hi > 0.0)
        .unwrap_or(1.0);
    let mut chart = mesh_and_chart(area, x, 0.0..top * 1.08, "deliveries / s", &|v| {
        format_si(*v)
    })?;
    for line in lines {
        chart
            .draw_series(LineSeries::new(
                line.rate.iter().map(|m| (m.x, m.y)),
                line.color.stroke_width(2),
            ))
            .map_err(draw_error)?;
        draw_marks(&mut chart, &line.rate, line.color, Glyph::Circle)?;
    }
    Ok(())
}

/// How a point is marked, and its line in the legend.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Glyph {
    /// Solid line, filled circles (mean latency, throughput).
    Circle,
    /// Dashed line, filled triangles (p99 latency).
    Triangle,
    /// A cross alone: the run did not pass.
    Cross,
}

/// Filled marks where the run passed, crosses where it did not.
fn draw_marks<'a, DB, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    marks: &[Mark],
    color: RGBColor,
    glyph: Glyph,
) -> Result<(), ChartError>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64>,
{
    let passed = marks.iter().filter(|m| m.passed).map(|m| (m.x, m.y));
    if glyph == Glyph::Triangle {
        chart
            .draw_series(passed.map(|c| TriangleMarker::new(c, 5, color.filled())))
            .map_err(draw_error)?;
    } else {
        chart
            .draw_series(passed.map(|c| Circle::new(c, 4, color.filled())))
            .map_err(draw_error)?;
    }
    chart
        .draw_series(
            marks
                .iter()
                .filter(|m| !m.passed)
                .map(|m| Cross::new((m.x, m.y), 6, color.stroke_width(3))),
        )
        .map_err(draw_error)?;
    Ok(())
}

/// One row of the legend.
struct Key {
    label: String,
    color: RGBColor,
    glyph: Glyph,
}

fn legend_keys(chart: Chart, lines: &[Line]) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut failed = false;
    for line in lines {
        let key = |label: String, glyph| Key {
            label,
            color: line.color,
            glyph,
        };
        match chart {
            Chart::Latency => {
                keys.push(key(format!("{} mean", line.target), Glyph::Circle));
                keys.push(key(format!("{} p99", line.target), Glyph::Triangle));
                failed |= line.mean.iter().chain(&line.p99).any(|m| !m.passed);
            }
            Chart::Throughput => {
                keys.push(key(line.target.clone(), Glyph::Circle));
                failed |= line.rate.iter().any(|m| !m.passed);
            }
        }
    }
    if failed {
        keys.push(Key {
            label: "did not pass".into(),
            color: BLACK,
            glyph: Glyph::Cross,
        });
    }
    keys
}

/// Where a legend row's text starts, from the legend column's left edge.
const LEGEND_TEXT_X: i32 = 40;
/// Height of a legend row.
const LEGEND_ROW: i32 = 22;

fn legend_style() -> TextStyle<'static> {
    TextStyle::from((FAMILY, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    keys: &[Key],
) -> Result<(), ChartError> {
    let style = legend_style();
    let top = MARGIN as i32;
    let (width, _) = area.dim_in_pixel();
    let bottom = top + LEGEND_ROW * keys.len() as i32 + 8;
    area.draw(&Rectangle::new(
        [(0, top), (width as i32 - MARGIN as i32, bottom)],
        BLACK.mix(0.3),
    ))
    .map_err(draw_error)?;
    for (i, key) in keys.iter().enumerate() {
        let y = top + 4 + LEGEND_ROW * i as i32 + LEGEND_ROW / 2;
        let (x0, x1, mid) = (8, 32, 20);
        let line = key.color.stroke_width(2);
        match key.glyph {
            Glyph::Circle => {
                area.draw(&PathElement::new(vec![(x0, y), (x1, y)], line))
                    .map_err(draw_error)?;
                area.draw(&Circle::new((mid, y), 4, key.color.filled()))
                    .map_err(draw_error)?;
            }
            Glyph::Triangle => {
                area.draw(&DashedPathElement::new(vec![(x0, y), (x1, y)], 5, 3, line))
                    .map_err(draw_error)?;
                area.draw(&TriangleMarker::new((mid, y), 5, key.color.filled()))
                    .map_err(draw_error)?;
            }
            Glyph::Cross => {
                area.draw(&Cross::new((mid, y), 6, key.color.stroke_width(3)))
                    .map_err(draw_error)?;
            }
        }
        area.draw(&Text::new(key.label.as_str(), (LEGEND_TEXT_X, y), &style))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// `12345.0` as `12,345`.
fn format_count(v: f64) -> String {
    let n = v.round();
    let digits = format!("{}", n.abs() as u64);
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0.0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds with no more digits than the axis needs: `0.05`, `2`, `250`, `10,000`.
fn format_ms(v: f64) -> String {
    if v >= 100.0 {
        format_count(v)
    } else {
        trim_zeros(format!("{v:.3}"))
    }
}

/// `2500000.0` as `2.5M`, `750000.0` as `750k`.
fn format_si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        trim_zeros(format!("{:.2}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim_zeros(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e3 {
        trim_zeros(format!("{:.2}", v / 1e3)) + "k"
    } else {
        trim_zeros(format!("{v:.2}"))
    }
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(
        members: u64,
        mean: Option<f64>,
        p99: Option<f64>,
        rate: f64,
        passed: bool,
    ) -> SweepPoint {
        SweepPoint {
            members,
            latency_mean_ms: mean,
            latency_p99_ms: p99,
            deliveries_per_s: rate,
            passed,
        }
    }

    /// A fresh directory under the system's temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("plaza-chart-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn two_series() -> Vec<Series> {
        // Measured out of order, as a find-max bisection would.
        let plaza = Series {
            target: "plaza".into(),
            points: vec![
                point(250, Some(1.2), Some(4.0), 124_500.0, true),
                point(500, Some(2.9), Some(9.5), 499_000.0, true),
                point(2000, Some(900.0), Some(2400.0), 2_900_000.0, false),
                point(1000, Some(71.8), Some(207.0), 1_998_735.0, true),
                point(1500, Some(160.0), None, 2_600_000.0, false),
            ],
        };
        let centrifugo = Series {
            target: "centrifugo".into(),
            points: vec![
                point(250, Some(3.1), Some(15.0), 124_000.0, true),
                point(500, Some(8.0), Some(40.0), 498_000.0, true),
                point(1000, None, None, 1_100_000.0, false),
                point(750, Some(400.0), Some(1800.0), 950_000.0, false),
            ],
        };
        vec![plaza, centrifugo]
    }

    fn names(paths: &[PathBuf]) -> Vec<String> {
        paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn chart_files_are_written() {
        let tmp = TempDir::new("two");
        let written = draw_sweep_charts("room-broadcast", &two_series(), &tmp.0).unwrap();
        assert_eq!(
            names(&written),
            [
                "latency.svg",
                "latency.png",
                "throughput.svg",
                "throughput.png"
            ]
        );
        for path in &written {
            assert!(path.starts_with(&tmp.0));
            assert!(path.is_file(), "{} missing", path.display());
        }
        for name in ["latency.svg", "throughput.svg"] {
            let svg = std::fs::read_to_string(tmp.0.join(name)).unwrap();
            assert!(svg.starts_with("<svg"), "{name}");
            for target in ["plaza", "centrifugo"] {
                assert!(svg.contains(target), "{name} lacks {target}");
            }
            assert!(svg.contains("members per room"), "{name}");
            assert!(svg.contains("did not pass"), "{name}");
        }
        let latency = std::fs::read_to_string(tmp.0.join("latency.svg")).unwrap();
        assert!(latency.contains("latency (ms)"));
        assert!(latency.contains("plaza p99"));
        let throughput = std::fs::read_to_string(tmp.0.join("throughput.svg")).unwrap();
        assert!(throughput.contains("deliveries / s"));
        for name in ["latency.png", "throughput.png"] {
            let png = std::fs::read(tmp.0.join(name)).unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name} is not a PNG");
            assert!(png.len() > 10_000, "{name}: only {} bytes", png.len());
        }
    }

    #[test]
    fn empty_and_degenerate_input_draw_without_error() {
        let cases: Vec<Vec<Series>> = vec![
            vec![],
            vec![Series {
                target: "plaza".into(),
                points: vec![],
            }],
            vec![Series {
                target: "single".into(),
                points: vec![point(1000, Some(5.0), Some(5.0), 10.0, true)],
            }],
            vec![Series {
                target: "no-latency".into(),
                points: vec![
                    point(100, None, None, 0.0, false),
                    point(200, Some(0.0), Some(f64::NAN), f64::INFINITY, false),
                ],
            }],
        ];
        for (i, series) in cases.iter().enumerate() {
            let tmp = TempDir::new(&format!("edge{i}"));
            let written = draw_sweep_charts("edge", series, &tmp.0)
                .unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(written.len(), 4);
            assert!(written.iter().all(|p| p.is_file()), "case {i}");
        }
    }

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(format_count(0.0), "0");
        assert_eq!(format_count(999.6), "1,000");
        assert_eq!(format_count(1_234_567.0), "1,234,567");
        assert_eq!(format_ms(0.05), "0.05");
        assert_eq!(format_ms(2.0), "2");
        assert_eq!(format_ms(20_000.0), "20,000");
        assert_eq!(format_si(0.0), "0");
        assert_eq!(format_si(750_000.0), "750k");
        assert_eq!(format_si(2_500_000.0), "2.5M");
    }
}
