//! Drift: a production matrix against a pinned reference matrix (a sweep, a published page, a
//! file), per cell, as production ÷ reference — the live counterpart of `matrix diff`, with the
//! same ratio rule (`diff::ratio`). Owns the pinned [`Reference`] value, the comparison
//! ([`compare`]), its Markdown and HTML renderings and the per-cell gauge values. Pure:
//! documents in, a comparison and text out.
//!
//! A production cell is compared only once it meets the evidence rule ([`EvidenceRule`]:
//! completed requests, seconds measured, output tokens): a median of a handful of requests says
//! little, and a ratio from it would raise alerts on noise. Below that it is shown as not
//! enough data, never as a ratio.
use std::fmt::Write as _;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::diff::{
    diff, format_ratio, summarise, ColumnSummary, DecodeRatios, DiffColumn, DiffSide,
};
use super::doc::{CellStatus, MatrixDoc};
use super::evidence::EvidenceRule;
use super::markdown::escape as md_escape;
use super::svg::xml_escape as html_escape;
use super::units::context_label;

/// The schema tag of a comparison's JSON.
pub const COMPARE_SCHEMA: &str = "tokentap.matrix-compare/v1";

/// The columns a comparison reports. Completed requests, output tokens and window length are
/// left out: they measure how long and how busy the window was, not how fast the server is.
pub const DRIFT_COLUMNS: [DiffColumn; 5] = [
    DiffColumn::PerRequestTokS,
    DiffColumn::TtftMs,
    DiffColumn::TotalTokS,
    DiffColumn::TbtMs,
    DiffColumn::AverageActiveRequests,
];

/// A reference matrix pinned for one upstream and model, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub upstream: String,
    pub model: String,
    /// Provenance in words, e.g. `latest-sweep 7f3a…`, `page`, `file /etc/tokentap/ref.json`.
    pub source: String,
    pub pinned_at: SystemTime,
    pub matrix: MatrixDoc,
}

/// The reference side of a comparison, as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceInfo {
    pub upstream: String,
    pub model: String,
    pub source: String,
    /// RFC 3339 time it was pinned.
    pub pinned_at: String,
    /// The reference document's page title.
    pub title: String,
}

/// What a production cell's comparison says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Enough requests, Valid on both sides: the ratios are set.
    Compared,
    /// Below the evidence rule in the window (too few requests, seconds or tokens).
    NotEnoughData,
    /// The reference has no such cell.
    NoReferenceCell,
    /// One side's status is not Valid (an error, over capacity, not run).
    NotValid,
}

impl Verdict {
    /// The page wording.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Compared => "compared",
            Verdict::NotEnoughData => "not enough data",
            Verdict::NoReferenceCell => "no reference cell",
            Verdict::NotValid => "not valid",
        }
    }
}

/// One production cell against the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriftCell {
    pub context_tokens: u64,
    pub concurrency: u32,
    /// Completed production requests in the window.
    pub requests: u64,
    pub verdict: Verdict,
    pub production_status: CellStatus,
    /// `None` when the reference has no such cell.
    pub reference_status: Option<CellStatus>,
    /// Production ÷ reference of [`DRIFT_COLUMNS`]; all `None` unless the verdict is `compared`.
    pub ratios: DecodeRatios,
}

/// A production matrix compared with its reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixCompare {
    /// Always [`COMPARE_SCHEMA`].
    pub schema: String,
    pub production: DiffSide,
    pub reference: ReferenceInfo,
    /// Completed requests a cell needs for ratios.
    pub min_requests: u64,
    /// The whole evidence rule a cell must meet for ratios, as text.
    #[serde(default)]
    pub evidence: String,
    /// Every production decode cell, by context then concurrency.
    pub cells: Vec<DriftCell>,
    /// Geometric mean, min and max of each [`DRIFT_COLUMNS`] ratio over the compared cells.
    pub summary: Vec<ColumnSummary>,
}

impl MatrixCompare {
    pub fn cell(&self, context_tokens: u64, concurrency: u32) -> Option<&DriftCell> {
        self.cells
            .iter()
            .find(|c| c.context_tokens == context_tokens && c.concurrency == concurrency)
    }

    pub fn column_summary(&self, column: DiffColumn) -> Option<&ColumnSummary> {
        self.summary.iter().find(|s| s.column == column)
    }
}

/// The figures a drift gauge shows: one per compared cell and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftMetric {
    /// Production ÷ reference per-request tok/s: below 1 is slower.
    PerRequestTokS,
    /// Production ÷ reference median TTFT: above 1 is slower.
    Ttft,
}

impl DriftMetric {
    pub const ALL: [DriftMetric; 2] = [DriftMetric::PerRequestTokS, DriftMetric::Ttft];

    /// The `metric` label value.
    pub fn label(self) -> &'static str {
        match self {
            DriftMetric::PerRequestTokS => "per_request_tok_s",
            DriftMetric::Ttft => "ttft",
        }
    }

    fn column(self) -> DiffColumn {
        match self {
            DriftMetric::PerRequestTokS => DiffColumn::PerRequestTokS,
            DriftMetric::Ttft => DiffColumn::TtftMs,
        }
    }
}

/// Compares `production` with `reference` (ratios production ÷ reference). Cells below the
/// evidence rule get no ratios.
pub fn compare(
    production: &MatrixDoc,
    reference: &MatrixDoc,
    info: ReferenceInfo,
    evidence: &EvidenceRule,
) -> MatrixCompare {
    let full = diff(reference, production);
    let reference_cells = reference.cell_index();
    let mut cells = Vec::with_capacity(production.decode.len());
    let mut sorted: Vec<_> = production.decode.iter().collect();
    sorted.sort_by_key(|c| (c.context_tokens, c.concurrency));
    for cell in sorted {
        let key = (cell.context_tokens, cell.concurrency);
        let reference_status = reference_cells.get(&key).map(|c| c.status.clone());
        let requests = cell.completed_requests.unwrap_or(0);
        let thin = cell.status == CellStatus::LowEvidence
            || (cell.status.is_valid() && !evidence.holds(cell));
        let verdict = if thin {
            Verdict::NotEnoughData
        } else if reference_status.is_none() {
            Verdict::NoReferenceCell
        } else if !cell.status.is_valid()
            || !reference_status.as_ref().is_some_and(CellStatus::is_valid)
        {
            Verdict::NotValid
        } else {
            Verdict::Compared
        };
        let mut ratios = DecodeRatios::default();
        if verdict == Verdict::Compared {
            if let Some(both) = full.cell(key.0, key.1) {
                ratios = DecodeRatios {
                    total_tok_s: both.ratios.total_tok_s,
                    per_request_tok_s: both.ratios.per_request_tok_s,
                    // The TTFT rests on the requests that ended in the cell.
                    ttft_ms: both.ratios.ttft_ms.filter(|_| evidence.ttft_holds(cell)),
                    tbt_ms: both.ratios.tbt_ms,
                    average_active_requests: both.ratios.average_active_requests,
                    ..DecodeRatios::default()
                };
            }
        }
        cells.push(DriftCell {
            context_tokens: cell.context_tokens,
            concurrency: cell.concurrency,
            requests,
            verdict,
            production_status: cell.status.clone(),
            reference_status,
            ratios,
        });
    }
    let summary = DRIFT_COLUMNS
        .iter()
        .map(|&column| {
            let values: Vec<f64> = cells.iter().filter_map(|c| c.ratios.get(column)).collect();
            summarise(column, &values)
        })
        .collect();
    MatrixCompare {
        schema: COMPARE_SCHEMA.to_owned(),
        production: full.b,
        reference: info,
        min_requests: evidence.min_requests,
        evidence: evidence.describe(),
        cells,
        summary,
    }
}

/// The evidence rule of a comparison as text (comparisons stored before the rule existed name
/// only their request minimum).
fn evidence_text(compare: &MatrixCompare) -> String {
    if compare.evidence.is_empty() {
        format!("at least {} completed requests", compare.min_requests)
    } else {
        compare.evidence.clone()
    }
}

/// One drift gauge value and its labels, as the refresher computes it and `/metrics` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftSample {
    pub upstream: String,
    pub model: String,
    /// The context ladder label, e.g. `8K` (as in `context_bucket` of the other metrics).
    pub context_bucket: String,
    /// The concurrency ladder label, e.g. `8`.
    pub concurrency_bucket: String,
    /// `per_request_tok_s` or `ttft`.
    pub metric: &'static str,
    pub value: f64,
}

/// The gauge values of a comparison: (context tokens, concurrency, metric, ratio) of every
/// compared cell that has the ratio.
pub fn gauge_values(compare: &MatrixCompare) -> Vec<(u64, u32, DriftMetric, f64)> {
    let mut out = Vec::new();
    for cell in compare
        .cells
        .iter()
        .filter(|c| c.verdict == Verdict::Compared)
    {
        for metric in DriftMetric::ALL {
            if let Some(value) = cell.ratios.get(metric.column()).filter(|v| v.is_finite()) {
                out.push((cell.context_tokens, cell.concurrency, metric, value));
            }
        }
    }
    out
}

fn sorted_axes(compare: &MatrixCompare) -> (Vec<u64>, Vec<u32>) {
    let mut contexts: Vec<u64> = compare.cells.iter().map(|c| c.context_tokens).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut concurrencies: Vec<u32> = compare.cells.iter().map(|c| c.concurrency).collect();
    concurrencies.sort_unstable();
    concurrencies.dedup();
    (contexts, concurrencies)
}

/// What the grid shows for a cell: `×0.812` when compared, the verdict otherwise.
pub fn grid_text(cell: Option<&DriftCell>) -> String {
    match cell {
        None => String::new(),
        Some(cell) if cell.verdict == Verdict::Compared => {
            format!("×{}", format_ratio(cell.ratios.per_request_tok_s))
        }
        Some(cell) if cell.verdict == Verdict::NotEnoughData => {
            format!("{} ({} req)", Verdict::NotEnoughData.text(), cell.requests)
        }
        Some(cell) => cell.verdict.text().to_owned(),
    }
}

/// One line naming the reference: upstream, model, source and when it was pinned.
pub fn provenance_line(info: &ReferenceInfo) -> String {
    format!(
        "Reference for upstream {} and model {}: {} ({}), pinned {}.",
        info.upstream, info.model, info.title, info.source, info.pinned_at
    )
}

/// Renders the comparison as Markdown: provenance, summary, the per-request tok/s ratio grid and
/// every ratio of every cell.
pub fn render_compare_markdown(compare: &MatrixCompare) -> String {
    let mut out = String::from("# Drift against the reference\n\n");
    let _ = writeln!(
        out,
        "- **Production:** {}",
        md_escape(&compare.production.title)
    );
    let _ = writeln!(
        out,
        "- **Reference:** {} — {}, pinned {} (upstream `{}`, model `{}`)",
        md_escape(&compare.reference.title),
        md_escape(&compare.reference.source),
        compare.reference.pinned_at,
        compare.reference.upstream.replace('`', "'"),
        compare.reference.model.replace('`', "'"),
    );
    let _ = writeln!(
        out,
        "\nEvery figure is production ÷ reference of the same cell (context × simultaneous requests); cells below the evidence rule ({}) are not compared.\n",
        md_escape(&evidence_text(compare))
    );
    out.push_str("## Summary\n\n| Column | Geometric mean | Min | Max | Cells |\n|---|---:|---:|---:|---:|\n");
    for summary in &compare.summary {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            summary.column.label(),
            format_ratio(summary.geometric_mean),
            format_ratio(summary.min),
            format_ratio(summary.max),
            summary.cells
        );
    }
    let (contexts, concurrencies) = sorted_axes(compare);
    if !contexts.is_empty() {
        out.push_str("\n## Per request tok/s ratio\n\n| Context |");
        for concurrency in &concurrencies {
            let _ = write!(out, " {concurrency} |");
        }
        out.push_str("\n|---|");
        for _ in &concurrencies {
            out.push_str("---:|");
        }
        out.push('\n');
        for context in &contexts {
            let _ = write!(out, "| {} |", context_label(*context));
            for concurrency in &concurrencies {
                let _ = write!(
                    out,
                    " {} |",
                    md_escape(&grid_text(compare.cell(*context, *concurrency)))
                );
            }
            out.push('\n');
        }
    }
    out.push_str("\n## All cells\n\n| Context | Requests at once | Requests | Verdict |");
    for column in DRIFT_COLUMNS {
        let _ = write!(out, " {} |", column.label());
    }
    out.push_str("\n|---|---:|---:|---|");
    for _ in DRIFT_COLUMNS {
        out.push_str("---:|");
    }
    out.push('\n');
    for cell in &compare.cells {
        let _ = write!(
            out,
            "| {} | {} | {} | {} |",
            context_label(cell.context_tokens),
            cell.concurrency,
            cell.requests,
            cell.verdict.text()
        );
        for column in DRIFT_COLUMNS {
            let _ = write!(out, " {} |", format_ratio(cell.ratios.get(column)));
        }
        out.push('\n');
    }
    out
}

/// The stable JSON rendering (pretty, trailing newline).
pub fn render_compare_json(compare: &MatrixCompare) -> String {
    tokentap_base::json::pretty_json_line(compare)
}

/// The per-request tok/s ratio grid as an HTML section, coloured like `matrix diff`'s grid
/// (green above 1, red below). Cells carry `data-context`, `data-concurrency`, `data-verdict`
/// and, when compared, `data-ratio`.
pub fn ratio_grid_fragment(compare: &MatrixCompare) -> String {
    let (contexts, concurrencies) = sorted_axes(compare);
    let mut out = String::from(
        "<section class=\"ratio drift\"><h2>Drift: per request tok/s, production ÷ reference</h2>",
    );
    let _ = write!(
        out,
        "<p class=\"note\">{} Cells below the evidence rule ({}) show “not enough data”.</p>",
        html_escape(&provenance_line(&compare.reference)),
        html_escape(&evidence_text(compare))
    );
    out.push_str("<table class=\"ratio-grid\"><thead><tr><th>Context</th>");
    for concurrency in &concurrencies {
        let _ = write!(out, "<th>{concurrency}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for context in &contexts {
        let label = context_label(*context);
        let _ = write!(out, "<tr><th>{}</th>", html_escape(&label));
        for concurrency in &concurrencies {
            let cell = compare.cell(*context, *concurrency);
            let ratio = cell
                .filter(|c| c.verdict == Verdict::Compared)
                .and_then(|c| c.ratios.per_request_tok_s);
            let style = ratio.map_or_else(String::new, |r| {
                format!(" style=\"{}\"", super::html::ratio_style(r))
            });
            let data_ratio = ratio.map_or_else(String::new, |r| format!(" data-ratio=\"{r}\""));
            let verdict = cell.map_or("", |c| match c.verdict {
                Verdict::Compared => "compared",
                Verdict::NotEnoughData => "not-enough-data",
                Verdict::NoReferenceCell => "no-reference-cell",
                Verdict::NotValid => "not-valid",
            });
            let _ = write!(
                out,
                "<td{style} data-context=\"{}\" data-concurrency=\"{concurrency}\" data-verdict=\"{verdict}\"{data_ratio}>{}</td>",
                html_escape(&label),
                html_escape(&grid_text(cell))
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></section>");
    out
}

/// The whole comparison as an HTML page: the grid, then every ratio of every cell.
pub fn render_compare_html(compare: &MatrixCompare) -> String {
    let mut body = String::from("<section class=\"header\"><h1>Drift against the reference</h1>");
    let _ = write!(
        body,
        "<p class=\"summary\">Production: {}</p></section>",
        html_escape(&compare.production.title)
    );
    body.push_str(&ratio_grid_fragment(compare));
    body.push_str("<section class=\"measurements\"><h2>All cells</h2><table><thead><tr><th>Context</th><th>Requests at once</th><th>Requests</th><th>Verdict</th>");
    for column in DRIFT_COLUMNS {
        let _ = write!(body, "<th>{}</th>", html_escape(column.label()));
    }
    body.push_str("</tr></thead><tbody>");
    for cell in &compare.cells {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            html_escape(&context_label(cell.context_tokens)),
            cell.concurrency,
            cell.requests,
            cell.verdict.text()
        );
        for column in DRIFT_COLUMNS {
            let _ = write!(body, "<td>{}</td>", format_ratio(cell.ratios.get(column)));
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table></section>");
    super::html::page("Drift against the reference", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::{DecodeCell, Metadata};

    fn cell(
        context: u64,
        concurrency: u32,
        per_request: f64,
        ttft_ms: f64,
        requests: u64,
    ) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, concurrency, CellStatus::Valid);
        cell.per_request_tok_s = Some(per_request);
        cell.ttft_ms = Some(ttft_ms);
        cell.total_tok_s = Some(per_request * f64::from(concurrency));
        cell.completed_requests = Some(requests);
        cell
    }

    fn doc(cells: Vec<DecodeCell>) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Metadata::default());
        doc.decode = cells;
        doc
    }

    fn info() -> ReferenceInfo {
        ReferenceInfo {
            upstream: "default".into(),
            model: "m".into(),
            source: "page".into(),
            pinned_at: "2026-01-01T00:00:00Z".into(),
            title: "ref".into(),
        }
    }

    #[test]
    fn ratios_are_production_over_reference_and_small_cells_are_not_compared() {
        let reference = doc(vec![
            cell(8192, 8, 64.0, 200.0, 5),
            cell(8192, 1, 80.0, 100.0, 5),
            cell(8192, 2, 80.0, 100.0, 5),
        ]);
        let measured = |mut cell: DecodeCell, seconds: f64| {
            cell.measured_for_s = Some(seconds);
            cell
        };
        let production = doc(vec![
            measured(cell(8192, 8, 16.0, 300.0, 25), 30.0),
            measured(cell(8192, 1, 80.0, 100.0, 19), 30.0),
            measured(cell(8192, 2, 80.0, 100.0, 40), 0.5),
            measured(cell(16384, 1, 70.0, 150.0, 40), 30.0),
        ]);
        let compared = compare(
            &production,
            &reference,
            info(),
            &EvidenceRule {
                min_requests: 20,
                min_measured_s: 1.0,
                ..EvidenceRule::NONE
            },
        );
        let busy = compared.cell(8192, 8).unwrap();
        assert_eq!(busy.verdict, Verdict::Compared);
        assert_eq!(busy.ratios.per_request_tok_s, Some(0.25));
        assert_eq!(busy.ratios.ttft_ms, Some(1.5));
        assert_eq!(
            busy.ratios.completed_requests, None,
            "counts are not compared"
        );
        // 19 completed requests: the decode figures are compared (they rest on tokens and
        // time), the TTFT is not.
        let few = compared.cell(8192, 1).unwrap();
        assert_eq!(few.verdict, Verdict::Compared);
        assert_eq!(few.ratios.per_request_tok_s, Some(1.0));
        assert_eq!(few.ratios.ttft_ms, None);
        // Half a second measured: not enough data at all.
        let short = compared.cell(8192, 2).unwrap();
        assert_eq!(short.verdict, Verdict::NotEnoughData);
        assert_eq!(short.ratios, DecodeRatios::default());
        assert_eq!(
            compared.cell(16384, 1).unwrap().verdict,
            Verdict::NoReferenceCell
        );
        let values = gauge_values(&compared);
        assert_eq!(
            values,
            vec![
                (8192, 1, DriftMetric::PerRequestTokS, 1.0),
                (8192, 8, DriftMetric::PerRequestTokS, 0.25),
                (8192, 8, DriftMetric::Ttft, 1.5)
            ]
        );
        let summary = compared.column_summary(DiffColumn::PerRequestTokS).unwrap();
        assert_eq!(summary.cells, 2);
        let md = render_compare_markdown(&compared);
        assert!(md.contains("×0.250"), "{md}");
        assert!(md.contains("not enough data (40 req)"), "{md}");
        let html = render_compare_html(&compared);
        assert!(html.contains("data-ratio=\"0.25\""), "{html}");
        assert!(html.contains("data-verdict=\"not-enough-data\""), "{html}");
        let back: MatrixCompare = serde_json::from_str(&render_compare_json(&compared)).unwrap();
        assert_eq!(back, compared);
    }

    #[test]
    fn a_cell_that_is_not_valid_on_either_side_has_no_ratio() {
        let mut broken = cell(8192, 8, 64.0, 200.0, 50);
        broken.status = CellStatus::error("3 of 10 requests failed");
        let compared = compare(
            &doc(vec![broken]),
            &doc(vec![cell(8192, 8, 64.0, 200.0, 1)]),
            info(),
            &EvidenceRule {
                min_requests: 20,
                ..EvidenceRule::NONE
            },
        );
        assert_eq!(compared.cells[0].verdict, Verdict::NotValid);
        assert!(gauge_values(&compared).is_empty());
    }
}
