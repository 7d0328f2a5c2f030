//! The HTML rendering: one self-contained page (inline CSS and SVG, no scripts, no network) with
//! the facts, the decode grid as a heat map, the decode and prefill charts and the full table.
//!
//! Built from fragments so the admin page can reuse them: [`page()`] wraps any body,
//! [`grid_fragment`], [`facts_fragment`], [`prefill_fragment`], [`measurements_fragment`] and
//! [`ratio_grid_fragment`] each return one `<section>`. All text is escaped; everything is in the
//! DOM without JavaScript. Pure: documents in, strings out.
use std::fmt::Write as _;

use super::capacity::{capacity_text, CapacityReport};
use super::diff::{format_ratio, grid_text, status_text, MatrixDiff};
use super::doc::{CellStatus, DecodeCell, MatrixDoc};
use super::facts::{section_facts, FACT_SECTIONS};
use super::page::{
    self, grid_cell_parts, measurement_header, measurement_rows, status_legends, ttft_note,
    GridCellText, ALL_CAPTION, DECODE_CAPTION, PAGE_TITLE, PREFILL_CAPTION, SECTION_LAUNCH,
    SECTION_NOTES,
};
use super::side_by_side::{legend_fragment, Axes};
use super::svg::{decode_chart, prefill_chart, xml_escape as escape};
use super::units::{context_label, format_ms_tenths, format_ms_whole, format_rate, or_missing};

/// The page's stylesheet (inline; the page loads nothing).
pub const STYLE: &str = r#"
:root { color-scheme: light; --ink: #1b1f24; --muted: #57606a; --line: #d0d7de; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); margin: 24px auto; max-width: 1180px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; } h3 { font-size: 14px; margin: 0 0 6px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
.title { font-size: 18px; font-weight: 600; margin: 0; } .summary { color: var(--muted); margin: 2px 0 16px; }
.facts { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 12px 24px; }
.facts dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0; } .facts dt { color: var(--muted); } .facts dd { margin: 0; overflow-wrap: anywhere; }
pre { background: #f6f8fa; border: 1px solid var(--line); border-radius: 6px; padding: 10px; white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 8px; } th { background: #f6f8fa; font-weight: 600; }
table.measurements td.num { text-align: right; } table.measurements { font-size: 12px; }
table.grid td { text-align: center; min-width: 86px; height: 44px; }
table.grid .total { display: block; font-weight: 600; font-size: 15px; } table.grid .ttft, table.grid .tails { display: block; font-size: 11px; opacity: .85; } table.grid .tails { font-size: 10px; }
td.over-capacity { background: repeating-linear-gradient(45deg, #eee, #eee 6px, #e2e2e2 6px, #e2e2e2 12px); color: #777; font-size: 12px; }
td.not-run { background: #fafafa; color: #999; font-size: 12px; } td.error { background: #ffe3e3; color: #a40e26; font-size: 12px; } td.shed { background: #fff0db; color: #8a4b00; font-size: 12px; }
td.absent { background: #fff; }
td.low-evidence, td.off-target { background: #eceef1; color: #6e7781; font-size: 12px; } td.low-evidence .total, td.off-target .total { font-size: 12px; font-weight: 600; }
.scroll { max-width: 100%; overflow-x: auto; }
.legend, .note { color: var(--muted); font-size: 12px; margin: 6px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } .charts svg { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
table.ratio-grid td { text-align: center; min-width: 70px; } td.changed { font-weight: 700; outline: 2px solid #bf8700; outline-offset: -2px; }
td.at-capacity { outline: 3px solid #1b1f24; outline-offset: -3px; } td.beyond-capacity { background-image: repeating-linear-gradient(135deg, rgba(255,255,255,.55) 0 4px, transparent 4px 9px) !important; opacity: .8; }
td.not-compared { background: #eceef1; color: #6e7781; font-size: 12px; } td.explained { outline: 2px solid #1a7f37; outline-offset: -2px; }
.scale-legend { display: flex; flex-wrap: wrap; gap: 2px; margin: 6px 0; font-size: 11px; } .scale-legend .swatch { padding: 2px 8px; border: 1px solid var(--line); } .scale-legend .not-compared { background: #eceef1; color: #6e7781; }
.panels { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; } .panel { flex: 1 1 420px; min-width: 0; }
"#;

/// A complete HTML document around `body`, with the stylesheet inline.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n",
        escape(title)
    )
}

/// Title, summary line, fact lists, launch command and notes.
pub fn facts_fragment(doc: &MatrixDoc) -> String {
    let mut out = String::from("<section class=\"header\">");
    let _ = write!(
        out,
        "<h1>{}</h1><p class=\"title\">{}</p><p class=\"summary\">{}</p><div class=\"facts\">",
        escape(PAGE_TITLE),
        escape(&page::title(&doc.metadata)),
        escape(&page::summary_line(doc, " · "))
    );
    for section in FACT_SECTIONS {
        let facts = section_facts(&doc.metadata, section);
        if facts.is_empty() {
            continue;
        }
        let _ = write!(out, "<div><h3>{}</h3><dl>", escape(section));
        for (key, value) in facts {
            let _ = write!(out, "<dt>{}</dt><dd>{}</dd>", escape(&key), escape(&value));
        }
        out.push_str("</dl></div>");
    }
    out.push_str("</div>");
    if let Some(command) = &doc.metadata.launch_command {
        let _ = write!(
            out,
            "<h2>{SECTION_LAUNCH}</h2><pre class=\"launch\"><code>{}</code></pre>",
            escape(command)
        );
    }
    if !doc.metadata.notes.is_empty() {
        let _ = write!(out, "<h2>{SECTION_NOTES}</h2><ul class=\"notes\">");
        for note in super::notes::collapsed(&doc.metadata.notes) {
            let _ = write!(out, "<li>{}</li>", escape(&note));
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
    out
}

/// Background for a heat-map cell: light for the lowest total tok/s, dark blue for the highest.
/// Returns the CSS background and whether the text must be light.
fn heat_colour(fraction: f64) -> (String, bool) {
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let lightness = 94.0 - fraction * 62.0;
    (format!("hsl(212, 72%, {lightness:.0}%)"), lightness < 58.0)
}

/// The largest `Valid` total tok/s over `docs`: the top of a heat-map colour scale shared by
/// grids drawn side by side (0 when there is none).
pub fn heat_scale_max(docs: &[&MatrixDoc]) -> f64 {
    docs.iter()
        .flat_map(|doc| doc.decode.iter())
        .filter(|cell| cell.status.is_valid())
        .filter_map(|cell| cell.total_tok_s)
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max)
}

/// The Sustained decode grid as a heat map coloured by total tok/s, TTFT in each cell.
/// Every cell carries `data-context`, `data-concurrency` and `data-status`.
pub fn grid_fragment(doc: &MatrixDoc) -> String {
    let axes = Axes::union(&[doc]);
    grid_fragment_on(doc, &axes, heat_scale_max(&[doc]))
}

/// [`grid_fragment`] on given axes (a cell the document lacks is blank) and colour scale
/// (`max` total tok/s is the darkest), so two grids drawn side by side read alike. Only `Valid`
/// cells are coloured; `Low evidence` and `Off target` cells are grey with their evidence.
pub fn grid_fragment_on(doc: &MatrixDoc, axes: &Axes, max: f64) -> String {
    grid_fragment_marked(doc, axes, max, None)
}

/// [`grid_fragment_on`] with a capacity line: the cell at each context's capacity is outlined
/// (`at-capacity`), the cells beyond it are hatched (`beyond-capacity`, `data-beyond="yes"`).
pub fn grid_fragment_marked(
    doc: &MatrixDoc,
    axes: &Axes,
    max: f64,
    capacity: Option<&CapacityReport>,
) -> String {
    let contexts = &axes.contexts;
    let concurrencies = &axes.concurrencies;
    let cells = doc.cell_index();
    let mut out = String::from("<section class=\"decode\">");
    let _ = write!(
        out,
        "<h2>Sustained decode</h2><p class=\"note\">{}</p><div class=\"scroll\"><table class=\"grid\"><thead><tr><th>Context</th>",
        escape(DECODE_CAPTION)
    );
    for concurrency in concurrencies {
        let _ = write!(out, "<th>{concurrency}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for context in contexts {
        let label = context_label(*context);
        let _ = write!(out, "<tr><th>{}</th>", escape(&label));
        for concurrency in concurrencies {
            let cell = cells.get(&(*context, *concurrency)).copied();
            let status = cell.map_or("absent", |c| c.status.slug());
            let mark = capacity.map_or("", |report| {
                let at = report
                    .context(*context)
                    .and_then(|c| c.capacity)
                    .is_some_and(|c| c == *concurrency);
                if report.beyond(*context, *concurrency) {
                    " beyond-capacity\" data-beyond=\"yes"
                } else if at {
                    " at-capacity"
                } else {
                    ""
                }
            });
            let _ = write!(
                out,
                "<td class=\"{status}{mark}\" data-context=\"{}\" data-concurrency=\"{concurrency}\" data-status=\"{status}\"",
                escape(&label)
            );
            match grid_cell_parts(cell) {
                Some(GridCellText::Figures { total_tok_s, ttft }) => {
                    let fraction = cell.and_then(|c| c.total_tok_s).map_or(0.0, |v| {
                        if max > 0.0 {
                            v / max
                        } else {
                            0.0
                        }
                    });
                    let (background, light_text) = heat_colour(fraction);
                    let colour = if light_text { "#fff" } else { "#111" };
                    let tails = cell.map_or_else(String::new, tails_line);
                    let _ = write!(
                        out,
                        " style=\"background:{background};color:{colour}\" title=\"{}\"><span class=\"total\">{}</span><span class=\"ttft\">{}</span>{}</td>",
                        escape(&tails),
                        escape(&total_tok_s),
                        escape(&ttft),
                        match tails_short(cell) {
                            short if short.is_empty() => String::new(),
                            short => format!("<span class=\"tails\">{}</span>", escape(&short)),
                        }
                    );
                }
                Some(GridCellText::Caveat { status, detail }) => {
                    let figure = cell
                        .and_then(|c| c.total_tok_s)
                        .map_or_else(String::new, |v| format!("({}) ", format_rate(v)));
                    let _ = write!(
                        out,
                        " title=\"{} — {}{}\"><span class=\"total\">{}</span><span class=\"ttft\">{}</span></td>",
                        escape(&status),
                        escape(&figure),
                        escape(&detail),
                        escape(&status),
                        escape(&detail)
                    );
                }
                Some(GridCellText::Status(text)) => {
                    let _ = write!(out, " title=\"{}\">{}</td>", escape(&text), escape(&text));
                }
                None => out.push_str("></td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    for legend in status_legends(doc) {
        let _ = write!(out, "<p class=\"legend\">{}</p>", escape(legend));
    }
    let _ = write!(out, "<p class=\"note\">{}</p>", escape(ttft_note(doc)));
    out.push_str("</section>");
    out
}

/// A cell's tails as one line, ITL first (it has a sample per token, thousands per cell, where
/// TTFT and TBT have one per request): `ITL p90 21.0 ms, p99 25.3 ms · TBT … · TTFT …`. A
/// figure without its p90 or p99 names only the tail it has; one with neither is left out.
pub fn tails_line(cell: &DecodeCell) -> String {
    let Some(tails) = cell.tails else {
        return String::new();
    };
    let pair = |name: &str, p90: Option<f64>, p99: Option<f64>, format: fn(f64) -> String| match (
        p90, p99,
    ) {
        (None, None) => None,
        (Some(p90), None) => Some(format!("{name} p90 {}", format(p90))),
        (None, Some(p99)) => Some(format!("{name} p99 {}", format(p99))),
        (Some(p90), Some(p99)) => Some(format!("{name} p90 {}, p99 {}", format(p90), format(p99))),
    };
    [
        pair("ITL", tails.itl_p90_ms, tails.itl_p99_ms, format_ms_tenths),
        pair("TBT", tails.tbt_p90_ms, tails.tbt_p99_ms, format_ms_tenths),
        pair(
            "TTFT",
            tails.ttft_p90_ms,
            tails.ttft_p99_ms,
            format_ms_whole,
        ),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" · ")
}

/// The p99s a grid cell shows under its figures, only those the cell has evidence for, ITL
/// first: `p99 ITL 25.3 ms · TBT 30.1 ms · TTFT 1,083 ms`. Empty when it has none (a sweep
/// cell of C streams withholds its TTFT and TBT tails: a line of dashes said nothing).
fn tails_short(cell: Option<&DecodeCell>) -> String {
    let Some(tails) = cell.and_then(|c| c.tails) else {
        return String::new();
    };
    let parts: Vec<String> = [
        ("ITL", tails.itl_p99_ms.map(format_ms_tenths)),
        ("TBT", tails.tbt_p99_ms.map(format_ms_tenths)),
        ("TTFT", tails.ttft_p99_ms.map(format_ms_whole)),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.map(|v| format!("{name} {v}")))
    .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!("p99 {}", parts.join(" · "))
}

/// The decode chart (inline SVG).
pub fn decode_chart_fragment(doc: &MatrixDoc) -> String {
    format!(
        "<section class=\"decode-chart\"><div class=\"charts\">{}</div></section>",
        decode_chart(doc)
    )
}

/// Prefill: the chart (inline SVG) and a small table.
pub fn prefill_fragment(doc: &MatrixDoc) -> String {
    let mut out = String::from("<section class=\"prefill\">");
    let _ = write!(
        out,
        "<h2>Prefill</h2><p class=\"note\">{}</p><div class=\"charts\">{}</div><table class=\"prefill-table\"><thead><tr><th>Context</th><th>Prompt tok/s</th><th>TTFT</th></tr></thead><tbody>",
        escape(PREFILL_CAPTION),
        prefill_chart(doc)
    );
    let mut rows: Vec<_> = doc.prefill.iter().collect();
    rows.sort_by_key(|row| row.context_tokens);
    for row in rows {
        let (rate, ttft) = if row.status.is_valid() {
            (
                or_missing(row.prompt_tok_s, format_rate),
                or_missing(row.ttft_ms, format_ms_whole),
            )
        } else {
            (row.status.to_string(), super::units::MISSING.to_owned())
        };
        let _ = write!(
            out,
            "<tr data-context=\"{label}\"><th>{label}</th><td>{}</td><td>{}</td></tr>",
            escape(&rate),
            escape(&ttft),
            label = escape(&context_label(row.context_tokens))
        );
    }
    out.push_str("</tbody></table></section>");
    out
}

/// The full "All measurements" table.
pub fn measurements_fragment(doc: &MatrixDoc) -> String {
    let mut out = String::from("<section class=\"all\">");
    let _ = write!(
        out,
        "<h2>All measurements</h2><p class=\"note\">{}</p><div class=\"scroll\"><table class=\"measurements\"><thead><tr>",
        escape(ALL_CAPTION)
    );
    for column in measurement_header(doc) {
        let _ = write!(out, "<th>{}</th>", escape(column));
    }
    out.push_str("</tr></thead><tbody>");
    for row in measurement_rows(doc) {
        out.push_str("<tr>");
        for (index, cell) in row.iter().enumerate() {
            let class = if index >= 4 { " class=\"num\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", escape(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    for legend in status_legends(doc) {
        let _ = write!(out, "<p class=\"legend\">{}</p>", escape(legend));
    }
    out.push_str("</section>");
    out
}

/// The capacity answer under the heat map: one row per context, and the legend of the line.
pub fn capacity_fragment(doc: &MatrixDoc, report: &CapacityReport) -> String {
    let axes = Axes::union(&[doc]);
    let mut out =
        String::from("<section class=\"capacity\" id=\"capacity\"><h2>Capacity under the SLO</h2>");
    let _ = write!(
        out,
        "<p class=\"note\">SLO: {} · attainment ≥ {} · judged by {}. The outlined cell is each context's capacity (the largest concurrency whose cell, and every judged cell below it, meets the SLO); hatched cells lie beyond it.</p>",
        escape(&report.targets.describe()),
        escape(&super::units::format_percent(report.attainment)),
        escape(report.basis.label())
    );
    out.push_str(&grid_fragment_marked(
        doc,
        &axes,
        heat_scale_max(&[doc]),
        Some(report),
    ));
    out.push_str("<div class=\"scroll\"><table class=\"measurements capacity-table\"><thead><tr><th>Context</th><th>Capacity</th><th>Judged by</th><th>Goodput tok/s</th><th>Total tok/s</th><th>Limited by</th></tr></thead><tbody>");
    for context in &report.contexts {
        let _ = write!(
            out,
            "<tr data-context=\"{label}\" data-capacity=\"{}\"><th>{label}</th><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            context.capacity.map_or_else(String::new, |c| c.to_string()),
            escape(&capacity_text(context)),
            escape(&context.judged_by),
            escape(&or_missing(context.goodput_tok_s, format_rate)),
            escape(&or_missing(context.total_tok_s, format_rate)),
            escape(context.limited_by.as_deref().unwrap_or("not reached")),
            label = escape(&context_label(context.context_tokens))
        );
    }
    out.push_str("</tbody></table></div></section>");
    out
}

/// The report page of one matrix with its capacity answer (the grid with the capacity line,
/// and the table) in place of the plain grid.
pub fn render_html_with_capacity(doc: &MatrixDoc, report: &CapacityReport) -> String {
    render_report(doc, Some(report))
}

/// The whole report page for one matrix.
pub fn render_html(doc: &MatrixDoc) -> String {
    render_report(doc, None)
}

fn render_report(doc: &MatrixDoc, capacity: Option<&CapacityReport>) -> String {
    let grid = match capacity {
        Some(report) => capacity_fragment(doc, report),
        None => grid_fragment(doc),
    };
    let body = [
        facts_fragment(doc),
        grid,
        decode_chart_fragment(doc),
        prefill_fragment(doc),
        measurements_fragment(doc),
    ]
    .join("\n");
    page(
        &format!("{PAGE_TITLE}: {}", page::title(&doc.metadata)),
        &body,
    )
}

/// `background` and text `color` for a ratio on the one fixed scale
/// ([`RATIO_BANDS`](super::side_by_side::RATIO_BANDS)): green within 5 % of ×1, orange and red
/// slower, blue faster, whatever the other cells.
pub fn ratio_style(ratio: f64) -> String {
    super::side_by_side::ratio_style(ratio)
}

/// The total tok/s ratio grid of a diff, status changes outlined. Cells carry `data-context`,
/// `data-concurrency` and `data-ratio` (the B ÷ A total tok/s ratio, when there is one).
pub fn ratio_grid_fragment(diff: &MatrixDiff) -> String {
    let contexts = diff.contexts();
    let concurrencies = diff.concurrencies();
    let mut out = String::from("<section class=\"ratio\"><h2>Total tok/s ratio (B ÷ A)</h2>");
    out.push_str(&legend_fragment());
    out.push_str("<div class=\"scroll\"><table class=\"ratio-grid\"><thead><tr><th>Context</th>");
    for concurrency in &concurrencies {
        let _ = write!(out, "<th>{concurrency}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for context in &contexts {
        let label = context_label(*context);
        let _ = write!(out, "<tr><th>{}</th>", escape(&label));
        for concurrency in &concurrencies {
            let cell = diff.cell(*context, *concurrency);
            let changed = cell.is_some_and(|c| c.status_changed);
            // A status change is not a ratio: the cell says so in one word, the change itself
            // is in its title and in the "Status changes" list.
            let (text, title) = if changed {
                ("status changed".to_owned(), grid_text(cell))
            } else {
                (grid_text(cell), String::new())
            };
            let ratio = cell
                .filter(|c| !c.status_changed && c.status_a == Some(CellStatus::Valid))
                .and_then(|c| c.ratios.total_tok_s);
            let class = if changed {
                " class=\"changed not-compared\""
            } else {
                ""
            };
            let title = if title.is_empty() {
                String::new()
            } else {
                format!(" title=\"{}\"", escape(&title))
            };
            let style =
                ratio.map_or_else(String::new, |r| format!(" style=\"{}\"", ratio_style(r)));
            let data_ratio = ratio.map_or_else(String::new, |r| format!(" data-ratio=\"{r}\""));
            let _ = write!(
                out,
                "<td{class}{style}{title} data-context=\"{}\" data-concurrency=\"{concurrency}\"{data_ratio}>{}</td>",
                escape(&label),
                escape(&text)
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div></section>");
    out
}

/// The whole diff page: sides, summary, ratio grid and status changes.
pub fn render_diff_html(diff: &MatrixDiff) -> String {
    let mut body =
        String::from("<section class=\"header\"><h1>Matrix diff</h1><dl class=\"sides\">");
    for (name, side) in [("A", &diff.a), ("B", &diff.b)] {
        let _ = write!(
            body,
            "<dt>{name}</dt><dd>{}{}</dd>",
            if side.label.is_empty() {
                String::new()
            } else {
                format!("<code>{}</code> — ", escape(&side.label))
            },
            escape(&side.title)
        );
    }
    body.push_str("</dl><p class=\"note\">Every figure is the ratio B ÷ A of the same cell. The summary is the geometric mean over cells Valid in both.</p></section>");
    body.push_str("<section class=\"summary\"><h2>Summary</h2><table class=\"measurements\"><thead><tr><th>Column</th><th>Geometric mean B/A</th><th>Min</th><th>Max</th><th>Cells</th></tr></thead><tbody>");
    for summary in &diff.summary {
        let _ = write!(
            body,
            "<tr data-column=\"{}\"><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            summary.column.name(),
            escape(summary.column.label()),
            format_ratio(summary.geometric_mean),
            format_ratio(summary.min),
            format_ratio(summary.max),
            summary.cells
        );
    }
    body.push_str("</tbody></table></section>");
    body.push_str(&ratio_grid_fragment(diff));
    body.push_str("<section class=\"changes\"><h2>Status changes</h2>");
    if diff.status_changes == 0 {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str("<ul>");
        for row in diff.prefill.iter().filter(|row| row.status_changed) {
            let _ = write!(
                body,
                "<li>Prefill {}: {} → {}</li>",
                escape(&context_label(row.context_tokens)),
                escape(&status_text(row.status_a.as_ref())),
                escape(&status_text(row.status_b.as_ref()))
            );
        }
        for cell in diff.decode.iter().filter(|cell| cell.status_changed) {
            let _ = write!(
                body,
                "<li>{} × {}: {} → {}</li>",
                escape(&context_label(cell.context_tokens)),
                cell.concurrency,
                escape(&status_text(cell.status_a.as_ref())),
                escape(&status_text(cell.status_b.as_ref()))
            );
        }
        body.push_str("</ul>");
    }
    body.push_str("</section>");
    page("Matrix diff", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{Metadata, Tails};

    fn sweep_cell(tails: Tails) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Metadata::default());
        let mut cell = DecodeCell::status_only(8192, 4, CellStatus::Valid);
        cell.total_tok_s = Some(400.0);
        cell.ttft_ms = Some(1083.4);
        cell.tails = Some(tails);
        doc.decode.push(cell);
        doc
    }

    /// A sweep cell of C streams withholds its TTFT and TBT tails (one sample per request) but
    /// has thousands of ITL samples: the grid shows ITL p99 first and no line of dashes.
    #[test]
    fn a_grid_cell_shows_the_tails_it_has_itl_p99_first() {
        let withheld = sweep_cell(Tails {
            itl_p90_ms: Some(21.04),
            itl_p99_ms: Some(25.31),
            ..Tails::default()
        });
        let grid = grid_fragment(&withheld);
        assert!(
            grid.contains("<span class=\"tails\">p99 ITL 25.3 ms</span>"),
            "{grid}"
        );
        assert!(!grid.contains("p99 —"), "{grid}");
        assert!(
            grid.contains("title=\"ITL p90 21.0 ms, p99 25.3 ms\""),
            "{grid}"
        );

        let all = sweep_cell(Tails {
            ttft_p90_ms: Some(900.0),
            ttft_p99_ms: Some(1083.4),
            tbt_p99_ms: Some(30.06),
            itl_p99_ms: Some(25.31),
            ..Tails::default()
        });
        let grid = grid_fragment(&all);
        assert!(
            grid.contains("p99 ITL 25.3 ms · TBT 30.1 ms · TTFT 1,083 ms"),
            "{grid}"
        );

        // No tail at all: no tails line.
        let none = sweep_cell(Tails::default());
        assert!(!grid_fragment(&none).contains("class=\"tails\""));
    }
}
