//! Production beside the sweep on one set of axes: the comparison every page leads with.
//!
//! [`comparison_fragment`] takes the union of both documents' contexts and concurrency levels, so the
//! production heat map, the sweep heat map and the ratio grid have the same rows and columns,
//! and one colour scale of total tok/s serves both heat maps. Each grid cell compares the
//! decode tok/s per stream (total tok/s ÷ average active requests) of production with the
//! sweep's, on a fixed diverging scale centred on ×1.0 (full colour at ×2 and ÷2, whatever the
//! other cells), with the "why" beside it: production's prefill overlap and what it predicts,
//! sweep × (1 − overlap). Only cells `Valid` on both sides get a ratio; every other pair is a
//! plain grey cell that names its sides, and the list under the grid says why it is not
//! compared (status changes never sit in a ratio cell). Pure: documents in, text out.
use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::doc::{CellStatus, DecodeCell, MatrixDoc};
use super::evidence::evidence_label;
use super::page::{PER_STREAM, PER_STREAM_DEFINITION};
use super::svg::xml_escape as escape;
use super::units::{context_label, format_percent};

/// One band of the one colour scale of a speed ratio (production ÷ sweep or reference, B ÷ A
/// of a diff; above 1 is faster): from `from` (inclusive) up to the next band's `from`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioBand {
    pub from: f64,
    /// Background, as Grafana's threshold colours write it (the dashboards use the same).
    pub colour: &'static str,
    /// Text colour readable on it.
    pub text: &'static str,
    pub meaning: &'static str,
}

/// The scale every ratio is drawn on — the page, the HTML reports and the Grafana ratio
/// panels (a deploy test checks their thresholds against it): green within 5 % of the
/// reference, orange and red slower, blue faster.
pub const RATIO_BANDS: [RatioBand; 5] = [
    RatioBand {
        from: 0.0,
        colour: "#c4162a",
        text: "#ffffff",
        meaning: "more than 20 % slower",
    },
    RatioBand {
        from: 0.8,
        colour: "#ff9830",
        text: "#1f2328",
        meaning: "5–20 % slower",
    },
    RatioBand {
        from: 0.95,
        colour: "#73bf69",
        text: "#1f2328",
        meaning: "within 5 %",
    },
    RatioBand {
        from: 1.05,
        colour: "#8ab8ff",
        text: "#1f2328",
        meaning: "5–20 % faster",
    },
    RatioBand {
        from: 1.2,
        colour: "#1f60c4",
        text: "#ffffff",
        meaning: "more than 20 % faster",
    },
];

/// Background of a gap the prefill overlap explains (drawn apart, never as a slow cell).
pub const EXPLAINED_COLOUR: &str = "#d8d9da";

/// The band `ratio` falls in (`None` for a ratio that is not a positive number).
pub fn ratio_band(ratio: f64) -> Option<&'static RatioBand> {
    if !ratio.is_finite() || ratio <= 0.0 {
        return None;
    }
    RATIO_BANDS.iter().rev().find(|band| ratio >= band.from)
}
/// A ratio within this share of what the prefill overlap predicts is "explained" by it.
pub const EXPLAINED_WITHIN: f64 = 0.10;
/// Overlap below this is not worth a "why".
const OVERLAP_WORTH_NAMING: f64 = 0.01;

/// The shared axes of two documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axes {
    pub contexts: Vec<u64>,
    pub concurrencies: Vec<u32>,
}

impl Axes {
    /// The union of the decode axes of `docs`, ascending.
    pub fn union(docs: &[&MatrixDoc]) -> Axes {
        let contexts: BTreeSet<u64> = docs.iter().flat_map(|d| d.contexts()).collect();
        let concurrencies: BTreeSet<u32> = docs.iter().flat_map(|d| d.concurrencies()).collect();
        Axes {
            contexts: contexts.into_iter().collect(),
            concurrencies: concurrencies.into_iter().collect(),
        }
    }
}

/// What one cell of the comparison says.
#[derive(Debug, Clone, PartialEq)]
pub enum Comparison {
    /// Valid on both sides.
    Ratio {
        /// Production ÷ sweep decode tok/s per stream.
        ratio: f64,
        /// Production ÷ sweep total tok/s (shown on hover).
        total_ratio: Option<f64>,
        /// Production's prefill overlap share, when measured.
        overlap: Option<f64>,
        /// What the overlap predicts for the ratio: 1 − overlap.
        predicted: Option<f64>,
        /// The ratio is within [`EXPLAINED_WITHIN`] of the prediction.
        explained: bool,
    },
    /// Not comparable: why, per side (`None` for a side that lacks the cell).
    NotCompared {
        production: Option<String>,
        sweep: Option<String>,
    },
}

/// Decode tok/s per stream: total tok/s ÷ average active requests ([`PER_STREAM`]), not the
/// cell's per-request tok/s (1 ÷ TBT, a median), which it falls back to only when either figure
/// is missing.
fn speed_per_stream(cell: &DecodeCell) -> Option<f64> {
    match (cell.total_tok_s, cell.average_active_requests) {
        (Some(total), Some(active)) if active > 0.0 && total.is_finite() => Some(total / active),
        _ => cell.per_request_tok_s,
    }
    .filter(|v| v.is_finite() && *v > 0.0)
}

/// Why a side's cell is not compared, in a few words.
fn side_text(cell: &DecodeCell) -> String {
    match &cell.status {
        CellStatus::LowEvidence => format!("Low evidence ({})", evidence_label(cell)),
        CellStatus::OffTarget => format!(
            "Off target (ran at {})",
            cell.average_active_requests
                .map_or_else(|| "?".to_owned(), |a| format!("{a:.1}"))
        ),
        CellStatus::Valid => "Valid, no speed figure".to_owned(),
        other => other.to_string(),
    }
}

/// Compares one cell.
pub fn compare_cell(production: Option<&DecodeCell>, sweep: Option<&DecodeCell>) -> Comparison {
    if let (Some(p), Some(s)) = (production, sweep) {
        if p.status.is_valid() && s.status.is_valid() {
            if let (Some(prod_speed), Some(sweep_speed)) =
                (speed_per_stream(p), speed_per_stream(s))
            {
                let ratio = prod_speed / sweep_speed;
                let overlap = p.prefill_overlap_share.filter(|o| o.is_finite());
                let predicted = overlap
                    .filter(|o| *o >= OVERLAP_WORTH_NAMING && *o < 1.0)
                    .map(|o| 1.0 - o);
                let explained =
                    predicted.is_some_and(|want| (ratio / want - 1.0).abs() <= EXPLAINED_WITHIN);
                let total_ratio = p
                    .total_tok_s
                    .zip(s.total_tok_s)
                    .filter(|(_, b)| *b > 0.0)
                    .map(|(a, b)| a / b);
                return Comparison::Ratio {
                    ratio,
                    total_ratio,
                    overlap,
                    predicted,
                    explained,
                };
            }
        }
    }
    // A side that is Valid with a speed is not the reason; a missing side is said by the caller.
    let why = |cell: Option<&DecodeCell>| {
        cell.filter(|c| !c.status.is_valid() || speed_per_stream(c).is_none())
            .map(side_text)
    };
    Comparison::NotCompared {
        production: why(production),
        sweep: why(sweep),
    }
}

/// Background of a ratio on the one fixed scale ([`RATIO_BANDS`]): its band's colour, grey for a
/// ratio that is not a positive number.
pub fn diverging_colour(ratio: f64) -> String {
    ratio_band(ratio).map_or_else(|| "#eceef1".to_owned(), |band| band.colour.to_owned())
}

/// `background` and `color` of a ratio's cell.
pub fn ratio_style(ratio: f64) -> String {
    match ratio_band(ratio) {
        Some(band) => format!("background:{};color:{}", band.colour, band.text),
        None => "background:#eceef1".to_owned(),
    }
}

/// The colour legend of the fixed scale.
pub fn legend_fragment() -> String {
    let mut out = String::from("<div class=\"scale-legend\" aria-label=\"colour scale\">");
    for band in &RATIO_BANDS {
        let range = match RATIO_BANDS.iter().find(|next| next.from > band.from) {
            Some(next) if band.from == 0.0 => format!("below ×{}", next.from),
            Some(next) => format!("×{}–×{}", band.from, next.from),
            None => format!("×{} and above", band.from),
        };
        let _ = write!(
            out,
            "<span class=\"swatch\" style=\"background:{};color:{}\" title=\"{}\">{range}</span>",
            band.colour, band.text, band.meaning
        );
    }
    let _ = write!(
        out,
        "<span class=\"swatch explained\" style=\"background:{EXPLAINED_COLOUR}\">explained by overlap</span>"
    );
    out.push_str("<span class=\"swatch not-compared\">not compared</span></div>");
    out
}

/// The tokens per decode step of production and the sweep, when both are known and differ
/// by more than [`ACCEPT_GAP`] (relative): speculative decoding accepted more or fewer drafted
/// tokens on one side, which explains a decode gap the prefill overlap does not.
pub fn accept_gap(
    production: Option<&DecodeCell>,
    sweep: Option<&DecodeCell>,
) -> Option<(f64, f64)> {
    let ours = production?.tokens_per_step?;
    let theirs = sweep?.tokens_per_step?;
    (theirs > 0.0 && ((ours - theirs) / theirs).abs() > ACCEPT_GAP).then_some((ours, theirs))
}

/// How far production's tokens per step may sit from the sweep's before the grid says so.
pub const ACCEPT_GAP: f64 = 0.10;

/// The production ÷ sweep grid on the shared axes, with its legend and the list of cells not
/// compared. Cells carry `data-context`, `data-concurrency` and either `data-ratio` or
/// `data-compared="no"`.
pub fn comparison_fragment(production: &MatrixDoc, sweep: &MatrixDoc) -> String {
    let axes = Axes::union(&[production, sweep]);
    let prod_cells = production.cell_index();
    let sweep_cells = sweep.cell_index();
    let mut out = format!(
        "<section class=\"comparison\" id=\"comparison\"><h2>Production ÷ sweep</h2><p class=\"note\">Each cell: production's {PER_STREAM} ({PER_STREAM_DEFINITION}) ÷ the sweep's, same context and concurrency. Below ×1 production is slower; the second line is the production cell's prefill overlap and what it predicts, sweep × (1 − overlap) — ✓ where that explains the gap within 10 % — and, where the two sides' decode steps gave tokens differing by more than 10 % (speculative decoding), production's tokens per step with the sweep's. Only cells Valid on both sides are compared.</p>",
    );
    out.push_str(&legend_fragment());
    out.push_str("<div class=\"scroll\"><table class=\"grid ratio-grid comparison-grid\"><thead><tr><th>Context</th>");
    for concurrency in &axes.concurrencies {
        let _ = write!(out, "<th>{concurrency}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    let mut not_compared = Vec::new();
    for context in &axes.contexts {
        let label = context_label(*context);
        let _ = write!(out, "<tr><th>{}</th>", escape(&label));
        for concurrency in &axes.concurrencies {
            let key = (*context, *concurrency);
            let p = prod_cells.get(&key).copied();
            let s = sweep_cells.get(&key).copied();
            let attributes = format!(
                "data-context=\"{}\" data-concurrency=\"{concurrency}\"",
                escape(&label)
            );
            if p.is_none() && s.is_none() {
                let _ = write!(
                    out,
                    "<td class=\"absent\" {attributes} data-compared=\"no\"></td>"
                );
                continue;
            }
            match compare_cell(p, s) {
                Comparison::Ratio {
                    ratio,
                    total_ratio,
                    overlap,
                    predicted,
                    explained,
                } => {
                    let why = match (overlap, predicted) {
                        (Some(o), Some(want)) => format!(
                            "overlap {} · expect ×{want:.2}{}",
                            format_percent(o),
                            if explained { " ✓" } else { "" }
                        ),
                        (Some(o), None) => format!("overlap {}", format_percent(o)),
                        _ => String::new(),
                    };
                    // Speculative decoding: acceptance depends on the content, so a production
                    // cell whose steps gave other token counts than the sweep's says so.
                    let steps = accept_gap(p, s).map_or_else(String::new, |(ours, theirs)| {
                        format!("{ours:.2} tok/step (sweep {theirs:.2})")
                    });
                    let why = match (why.is_empty(), steps.is_empty()) {
                        (_, true) => why,
                        (true, false) => steps,
                        (false, false) => format!("{why} · {steps}"),
                    };
                    let title = format!(
                        "{label} × {concurrency}: {PER_STREAM} ×{ratio:.3}{}",
                        total_ratio.map_or_else(String::new, |t| format!(", total tok/s ×{t:.3}"))
                    );
                    let _ = write!(
                        out,
                        "<td class=\"compared{}\" {attributes} data-ratio=\"{ratio}\" style=\"{}\" title=\"{}\"><span class=\"total\">×{ratio:.2}</span><span class=\"ttft\">{}</span></td>",
                        if explained { " explained" } else { "" },
                        // A gap the overlap explains is drawn as explained, not as a slow cell.
                        if explained {
                            format!("background:{EXPLAINED_COLOUR}")
                        } else {
                            ratio_style(ratio)
                        },
                        escape(&title),
                        escape(&why)
                    );
                }
                Comparison::NotCompared {
                    production: prod_why,
                    sweep: sweep_why,
                } => {
                    let mut parts = Vec::new();
                    if let Some(text) = &prod_why {
                        parts.push(format!("production: {text}"));
                    } else if p.is_none() {
                        parts.push("no production traffic".to_owned());
                    }
                    if let Some(text) = &sweep_why {
                        parts.push(format!("sweep: {text}"));
                    } else if s.is_none() {
                        parts.push("not in the sweep".to_owned());
                    }
                    let reason = parts.join("; ");
                    let short = match (p.map(|c| &c.status), s.map(|c| &c.status)) {
                        (Some(CellStatus::LowEvidence), _) => "low evidence",
                        (_, Some(CellStatus::OffTarget)) | (Some(CellStatus::OffTarget), _) => {
                            "off target"
                        }
                        (None, _) => "sweep only",
                        (_, None) => "production only",
                        _ => "not compared",
                    };
                    let _ = write!(
                        out,
                        "<td class=\"not-compared\" {attributes} data-compared=\"no\" title=\"{}\">{}</td>",
                        escape(&reason),
                        escape(short)
                    );
                    not_compared.push(format!("{label} × {concurrency}: {reason}"));
                }
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    if !not_compared.is_empty() {
        out.push_str("<details class=\"not-compared-list\"><summary>Not compared</summary><ul class=\"note\">");
        for line in &not_compared {
            let _ = write!(out, "<li>{}</li>", escape(line));
        }
        out.push_str("</ul></details>");
    }
    out.push_str("</section>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(context: u64, concurrency: u32, total: f64, active: f64) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
        cell.total_tok_s = Some(total);
        cell.average_active_requests = Some(active);
        cell.completed_requests = Some(30);
        cell.output_tokens = Some(3000);
        cell.measured_for_s = Some(30.0);
        cell
    }

    fn doc(cells: Vec<DecodeCell>) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = cells;
        doc
    }

    #[test]
    fn the_axes_are_the_union_of_both_documents() {
        let production = doc(vec![cell(8192, 1, 50.0, 1.0), cell(8192, 8, 300.0, 8.0)]);
        let sweep = doc(vec![cell(8192, 2, 90.0, 2.0), cell(16384, 4, 160.0, 4.0)]);
        let axes = Axes::union(&[&production, &sweep]);
        assert_eq!(axes.contexts, [8192, 16384]);
        assert_eq!(axes.concurrencies, [1, 2, 4, 8]);
    }

    #[test]
    fn only_cells_valid_on_both_sides_get_a_ratio_and_the_overlap_explains_the_gap() {
        let mut slowed = cell(8192, 4, 120.0, 4.0);
        slowed.prefill_overlap_share = Some(0.4);
        let sweep = cell(8192, 4, 200.0, 4.0);
        match compare_cell(Some(&slowed), Some(&sweep)) {
            Comparison::Ratio {
                ratio,
                predicted,
                explained,
                ..
            } => {
                assert!((ratio - 0.6).abs() < 1e-9);
                assert!((predicted.unwrap() - 0.6).abs() < 1e-9);
                assert!(explained);
            }
            other => panic!("{other:?}"),
        }
        let mut thin = cell(8192, 2, 367.8, 2.0);
        thin.status = CellStatus::LowEvidence;
        thin.completed_requests = Some(0);
        thin.output_tokens = Some(11);
        thin.measured_for_s = Some(0.0);
        let html = comparison_fragment(
            &doc(vec![thin.clone()]),
            &doc(vec![cell(8192, 2, 41.0, 2.0)]),
        );
        assert!(!html.contains("data-ratio"), "{html}");
        assert!(html.contains("data-compared=\"no\""), "{html}");
        assert!(
            html.contains("Low evidence (n=0 · 11 tok · 0.0 s)"),
            "{html}"
        );
        assert!(matches!(
            compare_cell(Some(&thin), Some(&cell(8192, 2, 41.0, 2.0))),
            Comparison::NotCompared { .. }
        ));
    }

    /// Issue 45.2, one name per quantity: the grid's ratio is of total tok/s ÷ average active
    /// requests, named "decode tok/s per stream" beside that definition in the note and in
    /// every cell's title, and never "per-request tok/s" (the name of 1 ÷ TBT).
    #[test]
    fn the_ratio_is_named_decode_tok_s_per_stream_beside_its_definition() {
        // 1 ÷ TBT is 50 on both sides; total ÷ active is 30 against 50: the ratio is ×0.6, so
        // the grid shows the per-stream figure, whatever per-request tok/s says.
        let mut production = cell(8192, 4, 120.0, 4.0);
        production.per_request_tok_s = Some(50.0);
        let mut sweep = cell(8192, 4, 200.0, 4.0);
        sweep.per_request_tok_s = Some(50.0);
        let html = comparison_fragment(&doc(vec![production]), &doc(vec![sweep]));
        assert!(
            html.contains(
                "production's decode tok/s per stream (total tok/s ÷ average active requests) ÷ the sweep's"
            ),
            "{html}"
        );
        assert!(
            html.contains("title=\"8K × 4: decode tok/s per stream ×0.600"),
            "{html}"
        );
        let lower = html.to_lowercase();
        assert!(!lower.contains("per-request"), "{html}");
        assert!(!lower.contains("per request"), "{html}");
        assert_eq!(PER_STREAM, "decode tok/s per stream");
        assert_eq!(super::super::page::PER_REQUEST, "per-request tok/s");
        assert!(super::super::page::PER_REQUEST_DEFINITION.starts_with("1 ÷ TBT"));
    }

    #[test]
    fn the_scale_is_fixed_and_centred_on_one() {
        // Within 5 % either way is the reference's own speed.
        assert_eq!(diverging_colour(1.0), "#73bf69");
        assert_eq!(diverging_colour(0.98), "#73bf69");
        assert_eq!(diverging_colour(0.95), "#73bf69");
        assert_eq!(diverging_colour(0.9), "#ff9830");
        assert_eq!(diverging_colour(0.5), diverging_colour(0.25));
        assert_eq!(diverging_colour(1.1), "#8ab8ff");
        assert_eq!(diverging_colour(2.0), "#1f60c4");
        assert_eq!(diverging_colour(f64::NAN), "#eceef1");
        assert!(RATIO_BANDS.windows(2).all(|w| w[0].from < w[1].from));
    }
}
