//! SVG charts of a matrix: decode total tok/s against concurrency (log2 axis, one line per
//! context, with a legend) and prefill tok/s against context (log2 axis). Self-contained,
//! well-formed XML with every text escaped; the HTML page inlines the same elements.
use std::fmt::Write as _;

pub use tokentap_base::escape::xml_escape;

use super::doc::MatrixDoc;
use super::units::{context_label, format_rate};

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 130.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
/// Horizontal room a tick or point label needs before the next one is drawn.
const MIN_LABEL_GAP: f64 = 40.0;
/// Colour-blind-friendly palette (Okabe–Ito plus two), cycled when there are more contexts.
const PALETTE: [&str; 10] = [
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#b8a200", "#000000",
    "#7f3c8d", "#8c6d31",
];

/// A "nice" upper bound and step for a linear axis from 0 to at least `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let rough = max / 8.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * magnitude);
    ((max / step).ceil().max(1.0) * step, step)
}

struct Plot {
    x_min: f64,
    x_max: f64,
    y_max: f64,
}

impl Plot {
    fn x(&self, log2_value: f64) -> f64 {
        let span = (self.x_max - self.x_min).max(f64::EPSILON);
        LEFT + (log2_value - self.x_min) / span * (WIDTH - LEFT - RIGHT)
    }
    fn y(&self, value: f64) -> f64 {
        TOP + (1.0 - value / self.y_max) * (HEIGHT - TOP - BOTTOM)
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "pixel coordinates of a chart, far below 2^52"
)]
fn log2(value: u64) -> f64 {
    (value.max(1) as f64).log2()
}

/// A y-axis tick: `15K` from 10,000, whole numbers for whole steps, two decimals otherwise.
fn tick_label(value: f64, step: f64) -> String {
    if value >= 10_000.0 {
        format_rate(value)
    } else if step >= 1.0 {
        super::units::format_decimal(value, 0)
    } else {
        super::units::format_decimal(value, 2)
    }
}

/// Axes, grid lines, tick labels and titles shared by both charts.
fn axes(
    out: &mut String,
    plot: &Plot,
    x_ticks: &[(f64, String)],
    y_step: f64,
    x_title: &str,
    y_title: &str,
) {
    let bottom = HEIGHT - BOTTOM;
    let right = WIDTH - RIGHT;
    let _ = write!(
        out,
        r##"<g class="axes" font-size="12" fill="#333"><line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/>"##
    );
    let mut tick = 0.0;
    while tick <= plot.y_max + y_step / 2.0 {
        let y = plot.y(tick);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            y + 4.0,
            xml_escape(&tick_label(tick, y_step))
        );
        tick += y_step;
    }
    let mut last_label_x = f64::NEG_INFINITY;
    for (position, label) in x_ticks {
        let x = plot.x(*position);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##,
            bottom + 5.0,
        );
        // Ticks closer than a label's width (1019K next to 1024K) keep only the first label.
        if x - last_label_x >= MIN_LABEL_GAP {
            last_label_x = x;
            let _ = write!(
                out,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 18.0,
                xml_escape(label)
            );
        }
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text></g>"##,
        (LEFT + right) / 2.0,
        HEIGHT - 14.0,
        xml_escape(x_title),
        (TOP + bottom) / 2.0,
        xml_escape(y_title)
    );
}

fn open_svg(out: &mut String, class: &str, title: &str) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="{class}" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="system-ui, sans-serif"><title>{t}</title><rect width="100%" height="100%" fill="#fff"/><text x="{LEFT}" y="26" font-size="15" font-weight="600" fill="#111">{t}</text>"##,
        t = xml_escape(title)
    );
}

fn no_data(out: &mut String, message: &str) {
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14" fill="#666">{}</text>"##,
        WIDTH / 2.0,
        HEIGHT / 2.0,
        xml_escape(message)
    );
}

/// An `<svg>` element: decode total tok/s against concurrency, one line per context.
pub fn decode_chart(doc: &MatrixDoc) -> String {
    let mut out = String::new();
    open_svg(
        &mut out,
        "decode-chart",
        "Sustained decode: total tok/s by simultaneous requests",
    );
    let contexts = doc.contexts();
    let concurrencies = doc.concurrencies();
    let cells = doc.cell_index();
    let series: Vec<(u64, Vec<(u32, f64)>)> = contexts
        .iter()
        .map(|context| {
            let points = concurrencies
                .iter()
                .filter_map(|concurrency| {
                    let cell = *cells.get(&(*context, *concurrency))?;
                    cell.status
                        .is_valid()
                        .then_some(())
                        .and(cell.total_tok_s.filter(|v| v.is_finite()))
                        .map(|total| (*concurrency, total))
                })
                .collect();
            (*context, points)
        })
        .filter(|(_, points): &(u64, Vec<(u32, f64)>)| !points.is_empty())
        .collect();
    let max = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, v)| *v))
        .fold(0.0_f64, f64::max);
    let (y_max, y_step) = nice_axis(max);
    let x_min = concurrencies.first().map_or(0.0, |c| log2(u64::from(*c)));
    let x_max = concurrencies.last().map_or(1.0, |c| log2(u64::from(*c)));
    let plot = Plot {
        x_min: if x_max > x_min { x_min } else { x_min - 1.0 },
        x_max: if x_max > x_min { x_max } else { x_max + 1.0 },
        y_max,
    };
    let ticks: Vec<(f64, String)> = concurrencies
        .iter()
        .map(|c| (log2(u64::from(*c)), c.to_string()))
        .collect();
    axes(
        &mut out,
        &plot,
        &ticks,
        y_step,
        "simultaneous requests (log2 scale)",
        "total tok/s",
    );
    if series.is_empty() {
        no_data(&mut out, "no valid decode cells");
    }
    for (index, (context, points)) in series.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        let label = context_label(*context);
        let coordinates: Vec<String> = points
            .iter()
            .map(|(c, v)| format!("{:.1},{:.1}", plot.x(log2(u64::from(*c))), plot.y(*v)))
            .collect();
        let _ = write!(
            out,
            r##"<g class="series" data-context="{context}"><polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"##,
            coordinates.join(" ")
        );
        for (concurrency, value) in points {
            let _ = write!(
                out,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{} × {concurrency}: {} tok/s</title></circle>"##,
                plot.x(log2(u64::from(*concurrency))),
                plot.y(*value),
                xml_escape(&label),
                xml_escape(&format_rate(*value))
            );
        }
        #[allow(
            clippy::cast_precision_loss,
            reason = "pixel coordinates of a chart, far below 2^52"
        )]
        let legend_y = TOP + 8.0 + index as f64 * 20.0;
        let legend_x = WIDTH - RIGHT + 16.0;
        let _ = write!(
            out,
            r##"<line x1="{legend_x}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="12" fill="#111">{} context</text></g>"##,
            legend_x + 22.0,
            legend_x + 28.0,
            legend_y + 4.0,
            xml_escape(&label)
        );
    }
    out.push_str("</svg>");
    out
}

/// An `<svg>` element: prefill tok/s against context.
pub fn prefill_chart(doc: &MatrixDoc) -> String {
    let mut out = String::new();
    open_svg(
        &mut out,
        "prefill-chart",
        "Prefill: prompt tok/s by context length",
    );
    let mut rows: Vec<_> = doc.prefill.iter().collect();
    rows.sort_by_key(|row| row.context_tokens);
    let points: Vec<(u64, f64)> = rows
        .iter()
        .filter(|row| row.status.is_valid())
        .filter_map(|row| {
            row.prompt_tok_s
                .filter(|v| v.is_finite())
                .map(|v| (row.context_tokens, v))
        })
        .collect();
    let max = points.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
    let (y_max, y_step) = nice_axis(max);
    let x_min = rows.first().map_or(0.0, |r| log2(r.context_tokens));
    let x_max = rows.last().map_or(1.0, |r| log2(r.context_tokens));
    let plot = Plot {
        x_min: if x_max > x_min { x_min } else { x_min - 1.0 },
        x_max: if x_max > x_min { x_max } else { x_max + 1.0 },
        y_max,
    };
    let ticks: Vec<(f64, String)> = rows
        .iter()
        .map(|row| (log2(row.context_tokens), context_label(row.context_tokens)))
        .collect();
    axes(
        &mut out,
        &plot,
        &ticks,
        y_step,
        "context length (log2 scale)",
        "prompt tok/s",
    );
    if points.is_empty() {
        no_data(&mut out, "no valid prefill rows");
    } else {
        let coordinates: Vec<String> = points
            .iter()
            .map(|(c, v)| format!("{:.1},{:.1}", plot.x(log2(*c)), plot.y(*v)))
            .collect();
        let _ = write!(
            out,
            r##"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"##,
            PALETTE[0],
            coordinates.join(" ")
        );
        let mut last_label_x = f64::NEG_INFINITY;
        for (context, value) in &points {
            let (x, y) = (plot.x(log2(*context)), plot.y(*value));
            let _ = write!(
                out,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{}"><title>{}: {} tok/s</title></circle>"##,
                PALETTE[0],
                xml_escape(&context_label(*context)),
                xml_escape(&format_rate(*value)),
            );
            if x - last_label_x >= MIN_LABEL_GAP {
                last_label_x = x;
                let _ = write!(
                    out,
                    r##"<text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="#111">{}</text>"##,
                    y - 8.0,
                    xml_escape(&format_rate(*value))
                );
            }
        }
    }
    out.push_str("</svg>");
    out
}

/// A standalone SVG document with both charts stacked: decode above, prefill below.
pub fn render_svg(doc: &MatrixDoc) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}" viewBox="0 0 {WIDTH} {}"><title>{}</title>"##,
        HEIGHT * 2.0,
        HEIGHT * 2.0,
        xml_escape(&super::page::title(&doc.metadata))
    );
    let _ = write!(out, r#"<g class="decode">{}</g>"#, decode_chart(doc));
    let _ = write!(
        out,
        r#"<g class="prefill" transform="translate(0 {HEIGHT})">{}</g>"#,
        prefill_chart(doc)
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_bounds_are_round() {
        assert_eq!(nice_axis(1357.7), (1400.0, 200.0));
        assert_eq!(nice_axis(12_800.0), (14_000.0, 2_000.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
        assert_eq!(nice_axis(f64::NAN), (1.0, 0.2));
    }

    #[test]
    fn escaping() {
        assert_eq!(
            xml_escape("a<b & \"c\"\u{1}"),
            "a&lt;b &amp; &quot;c&quot;\u{fffd}"
        );
    }
}
