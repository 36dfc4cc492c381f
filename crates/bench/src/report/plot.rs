//! SVG plots (plotters' SVG backend): line charts with markers (optionally log2 x) and grouped bar
//! charts. Every plot has a title, axis descriptions with units, and a legend naming each series.

use crate::model::{PlotKind, PlotSpec};
use plotters::coord::Shift;
use plotters::prelude::*;

const W: u32 = 820;
const H: u32 = 440;

/// Series colours (colour-blind friendly, Okabe-Ito).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// Renders `spec` to an SVG document.
pub fn render_svg(spec: &PlotSpec) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        match &spec.kind {
            PlotKind::Line { log_x } => line(&root, spec, *log_x)?,
            PlotKind::Bar { categories } => bars(&root, spec, categories)?,
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn y_max(spec: &PlotSpec) -> f64 {
    let m = spec
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(spec.hlines.iter().map(|h| h.0))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    // Headroom above the highest value keeps the legend (upper right) off the data.
    if m > 0.0 { m * 1.35 } else { 1.0 }
}

fn line(root: &DrawingArea<SVGBackend, Shift>, spec: &PlotSpec, log_x: bool) -> Result<(), String> {
    let xs: Vec<f64> = spec
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .collect();
    let (mut x0, mut x1) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    if xs.is_empty() {
        (x0, x1) = (1.0, 2.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let ymax = y_max(spec);
    // A log2 axis is drawn as a linear axis over log2(x), labelled with 2^v at whole v.
    let tx = |x: f64| if log_x { x.max(1e-9).log2() } else { x };
    if !log_x && x0 > 0.0 {
        x0 = 0.0; // linear axes start at zero so bars and lines are not visually exaggerated
    }
    let (a, b) = (tx(x0), tx(x1));
    let pad = if log_x { 0.3 } else { (b - a) * 0.05 };
    let (xa, xb) = (a - pad, b + pad);
    let mut c = b_chart(root, &spec.title)
        .build_cartesian_2d(xa..xb, 0.0..ymax)
        .map_err(|e| e.to_string())?;
    let fmt_log = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            short(2f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    let fmt_lin = |v: &f64| short(*v);
    let ticks = if log_x {
        ((xb - xa).ceil() as usize + 1).max(2)
    } else {
        10
    };
    c.configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc(&spec.x_label)
        .y_desc(&spec.y_label)
        .x_labels(ticks)
        .x_label_formatter(if log_x { &fmt_log } else { &fmt_lin })
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in spec.series.iter().enumerate() {
        let col = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|p| (tx(p.0), p.1))
            .collect();
        c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], col.stroke_width(3)));
        c.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, col.filled())))
            .map_err(|e| e.to_string())?;
    }
    hlines(&mut c, spec, xa, xb)?;
    legend(&mut c)
}

fn b_chart<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70);
    b
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn hlines(c: &mut Chart, spec: &PlotSpec, xa: f64, xb: f64) -> Result<(), String> {
    for (y, name) in &spec.hlines {
        let grey = RGBColor(120, 120, 120);
        c.draw_series(LineSeries::new(
            vec![(xa, *y), (xb, *y)],
            grey.stroke_width(1),
        ))
        .map_err(|e| e.to_string())?
        .label(name.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], grey.stroke_width(1)));
    }
    Ok(())
}

fn legend<'a>(c: &mut Chart<'a, 'a>) -> Result<(), String> {
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|e| e.to_string())
}

fn bars(
    root: &DrawingArea<SVGBackend, Shift>,
    spec: &PlotSpec,
    cats: &[String],
) -> Result<(), String> {
    let n = cats.len().max(1);
    let ymax = y_max(spec);
    let (xa, xb) = (-0.5, n as f64 - 0.5);
    let mut c = b_chart(root, &spec.title)
        .build_cartesian_2d(xa..xb, 0.0..ymax)
        .map_err(|e| e.to_string())?;
    let fmt = |v: &f64| {
        if (v - v.round()).abs() < 1e-6 {
            cats.get(v.round().max(0.0) as usize)
                .cloned()
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    c.configure_mesh()
        .disable_x_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc(&spec.x_label)
        .y_desc(&spec.y_label)
        .x_labels(n)
        .x_label_formatter(&fmt)
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(|e| e.to_string())?;
    let k = spec.series.len().max(1) as f64;
    let w = 0.8 / k;
    for (i, s) in spec.series.iter().enumerate() {
        let col = PALETTE[i % PALETTE.len()];
        let off = -0.4 + w * i as f64;
        c.draw_series(s.points.iter().filter(|p| p.1.is_finite()).map(|&(x, y)| {
            Rectangle::new([(x + off, 0.0), (x + off + w * 0.92, y)], col.filled())
        }))
        .map_err(|e| e.to_string())?
        .label(s.name.clone())
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], col.filled()));
    }
    hlines(&mut c, spec, xa, xb)?;
    legend(&mut c)
}

/// Axis tick labels: `120k`, `1.5M`, `0.25`.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Series;

    fn spec(kind: PlotKind) -> PlotSpec {
        PlotSpec {
            id: "t".into(),
            title: "Latency vs IOPS".into(),
            x_label: "IOPS".into(),
            y_label: "mean latency (µs)".into(),
            kind,
            series: vec![
                Series {
                    name: "basalt randread".into(),
                    points: vec![(1.0, 100.0), (2.0, 150.0), (4.0, 400.0)],
                },
                Series {
                    name: "nbdkit randread".into(),
                    points: vec![(1.0, 80.0), (2.0, 90.0)],
                },
            ],
            hlines: vec![(1000.0, "1 ms limit".into())],
        }
    }

    #[test]
    fn svg_has_axes_legend_and_title() {
        for kind in [
            PlotKind::Line { log_x: false },
            PlotKind::Line { log_x: true },
            PlotKind::Bar {
                categories: vec!["a".into(), "b".into(), "c".into(), "d".into()],
            },
        ] {
            let svg = render_svg(&spec(kind)).expect("renders");
            assert!(svg.starts_with("<svg"), "{}", &svg[..50]);
            for text in [
                "Latency vs IOPS",
                "mean latency (µs)",
                "basalt randread",
                "nbdkit randread",
                "1 ms limit",
            ] {
                assert!(svg.contains(text), "missing {text}");
            }
        }
    }

    #[test]
    fn empty_plot_still_renders() {
        let mut s = spec(PlotKind::Line { log_x: true });
        s.series.clear();
        s.hlines.clear();
        assert!(render_svg(&s).is_ok());
    }
}
