//! The canary comparison: two fleet matrices over the same window of real traffic (a baseline
//! and a candidate configuration), per cell candidate ÷ baseline with each side's request
//! count, and a mark where either side has too little traffic to say (the evidence rule:
//! only cells `Valid` on both sides get ratios, as in `matrix::diff`, which does the
//! arithmetic). Pure: documents in, a comparison and its text out (Markdown, JSON, or an
//! aligned table within 120 columns for a terminal).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::matrix::diff::{self, format_ratio, DiffColumn, MatrixDiff};
use crate::matrix::doc::{CellStatus, MatrixDoc};
use crate::matrix::table::{TextTable, MAX_WIDTH};
use crate::matrix::units::context_label;

/// The schema tag of a comparison's JSON.
pub const COMPARE_SCHEMA: &str = "tokentap.fleet-compare/v1";

/// One cell compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareCell {
    pub context_tokens: u64,
    pub concurrency: u32,
    /// Completed requests in the window on each side (0 where the side has no such cell).
    pub baseline_requests: u64,
    pub candidate_requests: u64,
    /// Whether both sides are `Valid` (enough traffic, no failures): only then are there ratios.
    pub enough_evidence: bool,
    /// Why not, when not: each side's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_status: Option<CellStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_status: Option<CellStatus>,
    /// Candidate ÷ baseline of the decode tok/s per stream: Total tok/s ÷ average active
    /// requests of each side (in a fleet matrix Σ completion tokens ÷ Σ decode request-seconds,
    /// exact from counters, where 1 ÷ TBT is as coarse as the TBT buckets; docs/fleet.md).
    pub decode_tok_s_per_stream: Option<f64>,
    /// Deprecated: `decode_tok_s_per_stream` under its old name, kept for one release (the
    /// same figure; it is not the ratio of 1 ÷ TBT, what "per-request tok/s" means elsewhere).
    pub per_request_tok_s: Option<f64>,
    pub total_tok_s: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// Candidate ÷ baseline of the mean TTFT (exact from sums and counts, where the median
    /// is as coarse as the histogram's buckets); absent when no means were given.
    pub ttft_mean_ms: Option<f64>,
}

/// Mean TTFT per cell (context, concurrency), milliseconds.
pub type CellMeans = BTreeMap<(u64, u32), f64>;

/// Candidate against baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetComparison {
    /// Always [`COMPARE_SCHEMA`].
    pub schema: String,
    pub baseline: String,
    pub candidate: String,
    pub window_s: Option<f64>,
    pub cells: Vec<CompareCell>,
    /// Geometric means over the cells with enough evidence on both sides; the first of the
    /// decode tok/s per stream (see [`CompareCell::decode_tok_s_per_stream`]).
    pub decode_tok_s_per_stream: Option<f64>,
    /// Deprecated: `decode_tok_s_per_stream` under its old name, kept for one release.
    pub per_request_tok_s: Option<f64>,
    pub total_tok_s: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub ttft_mean_ms: Option<f64>,
    /// The underlying matrix diff (baseline = A, candidate = B), for the HTML ratio grid.
    #[serde(skip)]
    pub diff: MatrixDiff,
}

/// Compares `candidate` with `baseline` (ratios candidate ÷ baseline); `means` are each
/// side's mean TTFT per cell, when known.
pub fn compare(
    baseline: &MatrixDoc,
    candidate: &MatrixDoc,
    baseline_label: &str,
    candidate_label: &str,
    means: Option<(&CellMeans, &CellMeans)>,
) -> FleetComparison {
    let mut result = diff::diff(baseline, candidate);
    result.a.label = baseline_label.to_owned();
    result.b.label = candidate_label.to_owned();
    let (index_a, index_b) = (baseline.cell_index(), candidate.cell_index());
    let cells = result
        .decode
        .iter()
        .map(|cell| {
            let key = (cell.context_tokens, cell.concurrency);
            let a = index_a.get(&key).copied();
            let b = index_b.get(&key).copied();
            let enough =
                a.is_some_and(|c| c.status.is_valid()) && b.is_some_and(|c| c.status.is_valid());
            let p99 = |c: Option<&crate::matrix::doc::DecodeCell>| {
                c.and_then(|c| c.tails).and_then(|t| t.ttft_p99_ms)
            };
            let gate = |r: Option<f64>| r.filter(|_| enough);
            let per_stream = gate(diff::ratio(
                a.and_then(decode_tok_s_per_stream),
                b.and_then(decode_tok_s_per_stream),
            ));
            CompareCell {
                context_tokens: cell.context_tokens,
                concurrency: cell.concurrency,
                baseline_requests: a.and_then(|c| c.completed_requests).unwrap_or(0),
                candidate_requests: b.and_then(|c| c.completed_requests).unwrap_or(0),
                enough_evidence: enough,
                baseline_status: (!enough).then(|| cell.status_a.clone()).flatten(),
                candidate_status: (!enough).then(|| cell.status_b.clone()).flatten(),
                decode_tok_s_per_stream: per_stream,
                per_request_tok_s: per_stream,
                total_tok_s: gate(cell.ratios.total_tok_s),
                ttft_ms: gate(cell.ratios.ttft_ms),
                tbt_ms: gate(cell.ratios.tbt_ms),
                ttft_p99_ms: gate(diff::ratio(p99(a), p99(b))),
                ttft_mean_ms: gate(
                    means
                        .and_then(|(a, b)| diff::ratio(a.get(&key).copied(), b.get(&key).copied())),
                ),
            }
        })
        .collect::<Vec<CompareCell>>();
    let mean_ttft: Vec<f64> = cells
        .iter()
        .filter_map(|c| c.ttft_mean_ms)
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let ttft_mean_ms = diff::summarise(DiffColumn::TtftMs, &mean_ttft).geometric_mean;
    let per_stream: Vec<f64> = cells
        .iter()
        .filter_map(|c| c.decode_tok_s_per_stream)
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let decode_tok_s_per_stream =
        diff::summarise(DiffColumn::PerRequestTokS, &per_stream).geometric_mean;
    let mean = |column: DiffColumn| result.column_summary(column).and_then(|s| s.geometric_mean);
    FleetComparison {
        schema: COMPARE_SCHEMA.to_owned(),
        baseline: baseline_label.to_owned(),
        candidate: candidate_label.to_owned(),
        window_s: candidate
            .metadata
            .run
            .window_s
            .or(baseline.metadata.run.window_s),
        cells,
        decode_tok_s_per_stream,
        per_request_tok_s: decode_tok_s_per_stream,
        total_tok_s: mean(DiffColumn::TotalTokS),
        ttft_ms: mean(DiffColumn::TtftMs),
        tbt_ms: mean(DiffColumn::TbtMs),
        ttft_mean_ms,
        diff: result,
    }
}

/// A cell's decode tok/s per stream: Total tok/s ÷ average active requests.
fn decode_tok_s_per_stream(cell: &crate::matrix::doc::DecodeCell) -> Option<f64> {
    let active = cell.average_active_requests.filter(|a| *a > 0.0)?;
    Some(cell.total_tok_s? / active).filter(|v| v.is_finite())
}

/// The comparison as JSON (pretty, trailing newline).
pub fn render_compare_json(comparison: &FleetComparison) -> String {
    crate::base::json::pretty_json_line(comparison)
}

/// What a side's cell says when it gives no ratio.
fn side_text(requests: u64, status: Option<&CellStatus>) -> String {
    match status {
        None => format!("{requests}"),
        Some(CellStatus::Valid) => format!("{requests}"),
        Some(status) => format!("{requests} ({status})"),
    }
}

/// The comparison as Markdown: the geometric means, then one row per cell.
pub fn render_compare_markdown(comparison: &FleetComparison) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "# Canary comparison: {} ÷ {}\n\n",
        comparison.candidate, comparison.baseline
    ));
    if let Some(window) = comparison.window_s {
        out.push_str(&format!(
            "Both sides over the same {window:.0} s of live traffic. Ratios are candidate ÷ baseline; above 1 is faster for tok/s, slower for TTFT and TBT. Only cells with enough requests on both sides (the evidence rule) get ratios; `too few` marks the others.\n\n"
        ));
    }
    let with_evidence = comparison
        .cells
        .iter()
        .filter(|c| c.enough_evidence)
        .count();
    out.push_str(&format!(
        "Over {with_evidence} cells with enough traffic on both sides (geometric mean): decode tok/s per stream (Total tok/s ÷ average active requests) {}, Total tok/s {}, TTFT {} (mean {}), TBT {}. Medians and p99 come from histogram buckets and are as coarse as they are; the mean TTFT is exact.\n\n",
        format_ratio(comparison.decode_tok_s_per_stream),
        format_ratio(comparison.total_tok_s),
        format_ratio(comparison.ttft_ms),
        format_ratio(comparison.ttft_mean_ms),
        format_ratio(comparison.tbt_ms),
    ));
    out.push_str("| Context | Concurrency | Baseline requests | Candidate requests | Decode tok/s per stream | Total tok/s | TTFT | TTFT mean | TBT | TTFT p99 | |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for cell in &comparison.cells {
        let mark = if cell.enough_evidence { "" } else { "too few" };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {mark} |\n",
            context_label(cell.context_tokens),
            cell.concurrency,
            side_text(cell.baseline_requests, cell.baseline_status.as_ref()),
            side_text(cell.candidate_requests, cell.candidate_status.as_ref()),
            format_ratio(cell.decode_tok_s_per_stream),
            format_ratio(cell.total_tok_s),
            format_ratio(cell.ttft_ms),
            format_ratio(cell.ttft_mean_ms),
            format_ratio(cell.tbt_ms),
            format_ratio(cell.ttft_p99_ms),
        ));
    }
    out
}

/// The comparison as aligned text for a terminal, every line at most
/// [`MAX_WIDTH`] columns: the sides, the geometric means (wrapped at word boundaries),
/// then one row per cell.
pub fn render_compare_table(comparison: &FleetComparison) -> String {
    let mut out = wrap_words(
        &format!(
            "Canary comparison: {} ÷ {}",
            comparison.candidate, comparison.baseline
        ),
        MAX_WIDTH,
    );
    let with_evidence = comparison
        .cells
        .iter()
        .filter(|c| c.enough_evidence)
        .count();
    let window = comparison.window_s.map_or_else(String::new, |w| {
        format!("Both sides over the same {w:.0} s of live traffic. ")
    });
    out.push_str(&wrap_words(
        &format!(
            "{window}Ratios are candidate ÷ baseline; only cells with enough requests on both sides get them (\"too few\": the others). Over {with_evidence} such cells (geometric mean): decode tok/s per stream {}, Total tok/s {}, TTFT {} (mean {}), TBT {}.",
            format_ratio(comparison.decode_tok_s_per_stream),
            format_ratio(comparison.total_tok_s),
            format_ratio(comparison.ttft_ms),
            format_ratio(comparison.ttft_mean_ms),
            format_ratio(comparison.tbt_ms),
        ),
        MAX_WIDTH,
    ));
    let mut table = TextTable::new(&[
        "Context",
        "Conc",
        "Baseline n",
        "Candidate n",
        "Tok/s/stream",
        "Total tok/s",
        "TTFT",
        "TTFT mean",
        "TBT",
        "TTFT p99",
        "",
    ]);
    table.numeric = vec![1, 4, 5, 6, 7, 8, 9];
    table.rows = comparison
        .cells
        .iter()
        .map(|cell| {
            vec![
                context_label(cell.context_tokens),
                cell.concurrency.to_string(),
                side_text(cell.baseline_requests, cell.baseline_status.as_ref()),
                side_text(cell.candidate_requests, cell.candidate_status.as_ref()),
                format_ratio(cell.decode_tok_s_per_stream),
                format_ratio(cell.total_tok_s),
                format_ratio(cell.ttft_ms),
                format_ratio(cell.ttft_mean_ms),
                format_ratio(cell.tbt_ms),
                format_ratio(cell.ttft_p99_ms),
                if cell.enough_evidence { "" } else { "too few" }.to_owned(),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table.render(MAX_WIDTH));
    out
}

/// `text` as lines of at most `width` characters, broken between words (a word longer than
/// the line stays whole on its own line), each ending in a newline.
fn wrap_words(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && needed > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::{DecodeCell, Metadata};

    fn doc(cells: &[(u64, u32, f64, u64, CellStatus)]) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Metadata::default());
        for (context, concurrency, tok_s, requests, status) in cells {
            let mut cell = DecodeCell::status_only(*context, *concurrency, status.clone());
            // 1 ÷ TBT twice the decode tok/s per stream: the comparison reads the latter.
            cell.per_request_tok_s = Some(2.0 * tok_s);
            cell.total_tok_s = Some(tok_s * 3.0);
            cell.average_active_requests = Some(3.0);
            cell.ttft_ms = Some(1000.0 / tok_s);
            cell.completed_requests = Some(*requests);
            doc.decode.push(cell);
        }
        doc
    }

    #[test]
    fn ratios_only_where_both_sides_have_evidence() {
        let baseline = doc(&[
            (8192, 1, 100.0, 40, CellStatus::Valid),
            (8192, 4, 80.0, 3, CellStatus::LowEvidence),
        ]);
        let candidate = doc(&[
            (8192, 1, 66.0, 30, CellStatus::Valid),
            (8192, 4, 50.0, 30, CellStatus::Valid),
            (16384, 1, 50.0, 30, CellStatus::Valid),
        ]);
        let means_a = CellMeans::from([((8192, 1), 10.0), ((8192, 4), 10.0)]);
        let means_b = CellMeans::from([((8192, 1), 15.0), ((8192, 4), 15.0)]);
        let result = compare(
            &baseline,
            &candidate,
            "aaa",
            "bbb",
            Some((&means_a, &means_b)),
        );
        assert_eq!(result.cells.len(), 3);
        let first = &result.cells[0];
        assert!(first.enough_evidence);
        assert_eq!(
            (first.baseline_requests, first.candidate_requests),
            (40, 30)
        );
        assert!((first.per_request_tok_s.unwrap() - 0.66).abs() < 1e-9);
        assert_eq!(first.ttft_mean_ms, Some(1.5));
        assert_eq!(result.ttft_mean_ms, Some(1.5));
        let second = &result.cells[1];
        assert!(!second.enough_evidence);
        assert_eq!(second.per_request_tok_s, None);
        assert_eq!(second.ttft_mean_ms, None);
        assert_eq!(second.baseline_status, Some(CellStatus::LowEvidence));
        let third = &result.cells[2];
        assert!(!third.enough_evidence);
        assert_eq!(third.baseline_requests, 0);
        assert!((result.per_request_tok_s.unwrap() - 0.66).abs() < 1e-9);

        let md = render_compare_markdown(&result);
        assert!(md.contains("bbb ÷ aaa"), "{md}");
        assert!(md.contains("| 8K | 4 | 3 (Low evidence) | 30 |"), "{md}");
        assert!(md.contains("too few"), "{md}");
        let json: serde_json::Value = serde_json::from_str(&render_compare_json(&result)).unwrap();
        assert_eq!(json["schema"], COMPARE_SCHEMA);
        assert_eq!(json["cells"][0]["baseline_requests"], 40);
        // Issue 45.2: the ratio of total ÷ average active is named for it, beside its
        // definition; the old key stays for one release with the same figure.
        assert!(
            md.contains("decode tok/s per stream (Total tok/s ÷ average active requests) 0.660"),
            "{md}"
        );
        assert!(md.contains("| Decode tok/s per stream |"), "{md}");
        assert!(!md.to_lowercase().contains("per-request"), "{md}");
        assert_eq!(
            json["cells"][0]["decode_tok_s_per_stream"],
            json["cells"][0]["per_request_tok_s"]
        );
        assert_eq!(json["decode_tok_s_per_stream"], json["per_request_tok_s"]);
        assert!(json["decode_tok_s_per_stream"].is_number(), "{json:#}");
    }

    #[test]
    fn the_terminal_table_fits_120_columns() {
        let baseline = doc(&[
            (8192, 1, 100.0, 40, CellStatus::Valid),
            (8192, 4, 80.0, 3, CellStatus::LowEvidence),
        ]);
        let candidate = doc(&[
            (8192, 1, 66.0, 30, CellStatus::Valid),
            (8192, 4, 50.0, 30, CellStatus::Valid),
        ]);
        let result = compare(&baseline, &candidate, "3f2a9c01b7de", "77aa01bc02de", None);
        let text = render_compare_table(&result);
        assert!(
            text.lines().all(|l| l.chars().count() <= MAX_WIDTH),
            "{text}"
        );
        assert!(!text.contains('|'), "{text}");
        assert!(
            text.contains("too few") && text.contains("Tok/s/stream"),
            "{text}"
        );
    }
}
