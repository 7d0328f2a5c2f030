//! Comparing two matrices: per-cell ratios B ÷ A of every column, status changes, a summary
//! (geometric mean of the ratios of cells Valid in both), a gate for CI, and the Markdown
//! rendering. Pure: documents in, a diff and text out.
//!
//! Ratio rule: B ÷ A when A > 0; 1 when both are 0 (nothing changed); none when only A is 0 or
//! either side lacks the value. A ratio of 0 makes the geometric mean 0.
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::doc::{CellStatus, MatrixDoc};
use super::markdown::escape;
use super::units::{context_label, MISSING};

/// The schema tag of a diff's JSON.
pub const DIFF_SCHEMA: &str = "tokentap.matrix-diff/v1";

/// A column whose ratios a diff summarises (and a gate can check).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DiffColumn {
    /// Decode: total tok/s across all simultaneous requests.
    TotalTokS,
    /// Decode: tok/s of one stream.
    PerRequestTokS,
    /// Decode: time to first token.
    TtftMs,
    /// Decode: time between tokens.
    TbtMs,
    /// Decode: mean running requests.
    AverageActiveRequests,
    /// Decode: requests finished in the window.
    CompletedRequests,
    /// Decode: output tokens in the window.
    OutputTokens,
    /// Decode: window length.
    MeasuredForS,
    /// Prefill: prompt tok/s.
    PrefillTokS,
    /// Prefill: time to first token of the cold request.
    PrefillTtftMs,
}

impl DiffColumn {
    /// The decode columns, in table order.
    pub const DECODE: [DiffColumn; 8] = [
        DiffColumn::TotalTokS,
        DiffColumn::PerRequestTokS,
        DiffColumn::TtftMs,
        DiffColumn::TbtMs,
        DiffColumn::AverageActiveRequests,
        DiffColumn::CompletedRequests,
        DiffColumn::OutputTokens,
        DiffColumn::MeasuredForS,
    ];
    /// The prefill columns.
    pub const PREFILL: [DiffColumn; 2] = [DiffColumn::PrefillTokS, DiffColumn::PrefillTtftMs];

    /// The JSON / command-line name, e.g. `total_tok_s`.
    pub fn name(self) -> &'static str {
        match self {
            DiffColumn::TotalTokS => "total_tok_s",
            DiffColumn::PerRequestTokS => "per_request_tok_s",
            DiffColumn::TtftMs => "ttft_ms",
            DiffColumn::TbtMs => "tbt_ms",
            DiffColumn::AverageActiveRequests => "average_active_requests",
            DiffColumn::CompletedRequests => "completed_requests",
            DiffColumn::OutputTokens => "output_tokens",
            DiffColumn::MeasuredForS => "measured_for_s",
            DiffColumn::PrefillTokS => "prefill_tok_s",
            DiffColumn::PrefillTtftMs => "prefill_ttft_ms",
        }
    }

    /// The page wording, e.g. `Total tok/s`.
    pub fn label(self) -> &'static str {
        match self {
            DiffColumn::TotalTokS => "Total tok/s",
            DiffColumn::PerRequestTokS => "Per request tok/s",
            DiffColumn::TtftMs => "TTFT",
            DiffColumn::TbtMs => "Time between tokens",
            DiffColumn::AverageActiveRequests => "Average active requests",
            DiffColumn::CompletedRequests => "Completed requests",
            DiffColumn::OutputTokens => "Output tokens",
            DiffColumn::MeasuredForS => "Measured for",
            DiffColumn::PrefillTokS => "Prefill tok/s",
            DiffColumn::PrefillTtftMs => "Prefill TTFT",
        }
    }
}

/// Which document is which.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffSide {
    /// Where it came from (the CLI puts the file name here); empty when unknown.
    pub label: String,
    /// The page title of the document.
    pub title: String,
}

/// B ÷ A of every decode column; `None` where a side lacks the value or only A is 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecodeRatios {
    pub total_tok_s: Option<f64>,
    pub per_request_tok_s: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub average_active_requests: Option<f64>,
    pub completed_requests: Option<f64>,
    pub output_tokens: Option<f64>,
    pub measured_for_s: Option<f64>,
}

impl DecodeRatios {
    pub fn get(&self, column: DiffColumn) -> Option<f64> {
        match column {
            DiffColumn::TotalTokS => self.total_tok_s,
            DiffColumn::PerRequestTokS => self.per_request_tok_s,
            DiffColumn::TtftMs => self.ttft_ms,
            DiffColumn::TbtMs => self.tbt_ms,
            DiffColumn::AverageActiveRequests => self.average_active_requests,
            DiffColumn::CompletedRequests => self.completed_requests,
            DiffColumn::OutputTokens => self.output_tokens,
            DiffColumn::MeasuredForS => self.measured_for_s,
            DiffColumn::PrefillTokS | DiffColumn::PrefillTtftMs => None,
        }
    }
}

/// One decode cell compared (matched by context × concurrency).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellDiff {
    pub context_tokens: u64,
    pub concurrency: u32,
    /// Status in A; `None` when A has no such cell.
    pub status_a: Option<CellStatus>,
    /// Status in B; `None` when B has no such cell.
    pub status_b: Option<CellStatus>,
    pub status_changed: bool,
    pub ratios: DecodeRatios,
}

/// One prefill row compared (matched by context).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillDiff {
    pub context_tokens: u64,
    pub status_a: Option<CellStatus>,
    pub status_b: Option<CellStatus>,
    pub status_changed: bool,
    /// B ÷ A of prompt tok/s.
    pub prompt_tok_s: Option<f64>,
    /// B ÷ A of TTFT.
    pub ttft_ms: Option<f64>,
}

/// The summary of one column over the cells Valid in both documents that have a ratio.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnSummary {
    pub column: DiffColumn,
    /// Geometric mean of the ratios; `None` when no cell qualifies.
    pub geometric_mean: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// How many cells the figures cover.
    pub cells: usize,
}

/// Two matrices compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatrixDiff {
    /// Always [`DIFF_SCHEMA`].
    pub schema: String,
    pub a: DiffSide,
    pub b: DiffSide,
    /// Every decode cell of either document, by context then concurrency.
    pub decode: Vec<CellDiff>,
    /// Every prefill row of either document, by context.
    pub prefill: Vec<PrefillDiff>,
    /// One entry per column: the 8 decode columns, then the 2 prefill columns.
    pub summary: Vec<ColumnSummary>,
    /// How many cells and rows changed status (appearing or disappearing counts).
    pub status_changes: usize,
}

impl MatrixDiff {
    /// The summary of `column`.
    pub fn column_summary(&self, column: DiffColumn) -> Option<&ColumnSummary> {
        self.summary.iter().find(|summary| summary.column == column)
    }

    /// The compared cell at `context_tokens` × `concurrency`.
    pub fn cell(&self, context_tokens: u64, concurrency: u32) -> Option<&CellDiff> {
        self.decode
            .iter()
            .find(|cell| cell.context_tokens == context_tokens && cell.concurrency == concurrency)
    }

    /// Decode contexts of either side, ascending.
    pub fn contexts(&self) -> Vec<u64> {
        let set: BTreeSet<u64> = self.decode.iter().map(|c| c.context_tokens).collect();
        set.into_iter().collect()
    }

    /// Decode concurrency levels of either side, ascending.
    pub fn concurrencies(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.decode.iter().map(|c| c.concurrency).collect();
        set.into_iter().collect()
    }
}

/// B ÷ A under the module's ratio rule.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    let (a, b) = (a?, b?);
    if a > 0.0 {
        Some(b / a)
    } else if a == 0.0 && b == 0.0 {
        Some(1.0)
    } else {
        None
    }
}

fn count_ratio(a: Option<u64>, b: Option<u64>) -> Option<f64> {
    // Counts are far below 2^53, so the conversion is exact in practice.
    #[allow(
        clippy::cast_precision_loss,
        reason = "counts of cells, far below 2^52"
    )]
    ratio(a.map(|v| v as f64), b.map(|v| v as f64))
}

/// Geometric mean, min and max of `ratios`.
pub fn summarise(column: DiffColumn, ratios: &[f64]) -> ColumnSummary {
    if ratios.is_empty() {
        return ColumnSummary {
            column,
            geometric_mean: None,
            min: None,
            max: None,
            cells: 0,
        };
    }
    #[allow(
        clippy::cast_precision_loss,
        reason = "counts of cells, far below 2^52"
    )]
    let count = ratios.len() as f64;
    let mean_log = ratios.iter().map(|r| r.ln()).sum::<f64>() / count;
    ColumnSummary {
        column,
        geometric_mean: Some(mean_log.exp()),
        min: ratios.iter().copied().reduce(f64::min),
        max: ratios.iter().copied().reduce(f64::max),
        cells: ratios.len(),
    }
}

/// Compares `a` with `b` (ratios are B ÷ A). Side labels are left empty for the caller.
pub fn diff(a: &MatrixDoc, b: &MatrixDoc) -> MatrixDiff {
    let keys: BTreeSet<(u64, u32)> = a
        .decode
        .iter()
        .chain(&b.decode)
        .map(|cell| (cell.context_tokens, cell.concurrency))
        .collect();
    let (index_a, index_b) = (a.cell_index(), b.cell_index());
    let mut decode = Vec::with_capacity(keys.len());
    for (context, concurrency) in keys {
        let cell_a = index_a.get(&(context, concurrency)).copied();
        let cell_b = index_b.get(&(context, concurrency)).copied();
        let pick = |get: fn(&super::doc::DecodeCell) -> Option<f64>| {
            ratio(cell_a.and_then(get), cell_b.and_then(get))
        };
        let pick_count = |get: fn(&super::doc::DecodeCell) -> Option<u64>| {
            count_ratio(cell_a.and_then(get), cell_b.and_then(get))
        };
        let status_a = cell_a.map(|cell| cell.status.clone());
        let status_b = cell_b.map(|cell| cell.status.clone());
        // Figures a side shows but does not trust (Low evidence, Off target) get no ratio.
        let caveated = [&status_a, &status_b]
            .into_iter()
            .any(|status| status.as_ref().is_some_and(CellStatus::is_caveated));
        decode.push(CellDiff {
            context_tokens: context,
            concurrency,
            status_changed: status_a != status_b,
            status_a,
            status_b,
            ratios: if caveated {
                DecodeRatios::default()
            } else {
                DecodeRatios {
                    total_tok_s: pick(|c| c.total_tok_s),
                    per_request_tok_s: pick(|c| c.per_request_tok_s),
                    // Warm with warm where a side split its TTFT by the prompt cache.
                    ttft_ms: pick(super::doc::DecodeCell::comparable_ttft_ms),
                    tbt_ms: pick(|c| c.tbt_ms),
                    average_active_requests: pick(|c| c.average_active_requests),
                    completed_requests: pick_count(|c| c.completed_requests),
                    output_tokens: pick_count(|c| c.output_tokens),
                    measured_for_s: pick(|c| c.measured_for_s),
                }
            },
        });
    }
    let prefill_keys: BTreeSet<u64> = a
        .prefill
        .iter()
        .chain(&b.prefill)
        .map(|row| row.context_tokens)
        .collect();
    let prefill: Vec<PrefillDiff> = prefill_keys
        .into_iter()
        .map(|context| {
            let row_a = a.prefill_row(context);
            let row_b = b.prefill_row(context);
            let status_a = row_a.map(|row| row.status.clone());
            let status_b = row_b.map(|row| row.status.clone());
            PrefillDiff {
                context_tokens: context,
                status_changed: status_a != status_b,
                status_a,
                status_b,
                prompt_tok_s: ratio(
                    row_a.and_then(|r| r.prompt_tok_s),
                    row_b.and_then(|r| r.prompt_tok_s),
                ),
                ttft_ms: ratio(row_a.and_then(|r| r.ttft_ms), row_b.and_then(|r| r.ttft_ms)),
            }
        })
        .collect();

    let both_valid = |a: &Option<CellStatus>, b: &Option<CellStatus>| {
        matches!((a, b), (Some(CellStatus::Valid), Some(CellStatus::Valid)))
    };
    let mut summary = Vec::new();
    for column in DiffColumn::DECODE {
        let ratios: Vec<f64> = decode
            .iter()
            .filter(|cell| both_valid(&cell.status_a, &cell.status_b))
            .filter_map(|cell| cell.ratios.get(column))
            .collect();
        summary.push(summarise(column, &ratios));
    }
    for column in DiffColumn::PREFILL {
        let ratios: Vec<f64> = prefill
            .iter()
            .filter(|row| both_valid(&row.status_a, &row.status_b))
            .filter_map(|row| match column {
                DiffColumn::PrefillTokS => row.prompt_tok_s,
                _ => row.ttft_ms,
            })
            .collect();
        summary.push(summarise(column, &ratios));
    }
    let status_changes = decode.iter().filter(|c| c.status_changed).count()
        + prefill.iter().filter(|r| r.status_changed).count();
    MatrixDiff {
        schema: DIFF_SCHEMA.to_owned(),
        a: DiffSide {
            label: String::new(),
            title: super::page::title(&a.metadata),
        },
        b: DiffSide {
            label: String::new(),
            title: super::page::title(&b.metadata),
        },
        decode,
        prefill,
        summary,
        status_changes,
    }
}

/// What `tokentap matrix diff` checks before exiting.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// The column whose geometric mean is checked.
    pub column: DiffColumn,
    /// Fail when the geometric mean is below this.
    pub fail_below: Option<f64>,
    /// Fail when the geometric mean is above this.
    pub fail_above: Option<f64>,
    /// Fail when any cell or prefill row changed status.
    pub fail_on_status_change: bool,
}

/// Every way `diff` fails `gate`, one sentence each naming the offending value; empty = pass.
pub fn evaluate_gate(diff: &MatrixDiff, gate: &Gate) -> Vec<String> {
    let mut failures = Vec::new();
    if gate.fail_below.is_some() || gate.fail_above.is_some() {
        let summary = diff.column_summary(gate.column);
        match summary.and_then(|s| s.geometric_mean.map(|mean| (mean, s.cells))) {
            None => failures.push(format!(
                "no cell is Valid in both matrices with a {} value, so its ratio cannot be checked",
                gate.column.name()
            )),
            Some((mean, cells)) => {
                if let Some(limit) = gate.fail_below {
                    if mean < limit {
                        failures.push(format!(
                            "geometric mean of {} ratios (B/A) over {cells} valid cells is {mean:.4}, below --fail-below {limit}",
                            gate.column.name()
                        ));
                    }
                }
                if let Some(limit) = gate.fail_above {
                    if mean > limit {
                        failures.push(format!(
                            "geometric mean of {} ratios (B/A) over {cells} valid cells is {mean:.4}, above --fail-above {limit}",
                            gate.column.name()
                        ));
                    }
                }
            }
        }
    }
    if gate.fail_on_status_change && diff.status_changes > 0 {
        let first = diff
            .decode
            .iter()
            .find(|cell| cell.status_changed)
            .map(|cell| {
                format!(
                    "decode {} × {}: {} → {}",
                    context_label(cell.context_tokens),
                    cell.concurrency,
                    status_text(cell.status_a.as_ref()),
                    status_text(cell.status_b.as_ref())
                )
            })
            .or_else(|| {
                diff.prefill
                    .iter()
                    .find(|row| row.status_changed)
                    .map(|row| {
                        format!(
                            "prefill {}: {} → {}",
                            context_label(row.context_tokens),
                            status_text(row.status_a.as_ref()),
                            status_text(row.status_b.as_ref())
                        )
                    })
            })
            .unwrap_or_default();
        failures.push(format!(
            "{} status change(s), e.g. {first}",
            diff.status_changes
        ));
    }
    failures
}

/// The status as the page writes it, `absent` when the side has no such cell.
pub fn status_text(status: Option<&CellStatus>) -> String {
    status.map_or_else(|| "absent".to_owned(), ToString::to_string)
}

/// A ratio as the diff pages print it: `1.000`, or `—`.
pub fn format_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| MISSING.to_owned(), |r| format!("{r:.3}"))
}

fn status_pair(a: Option<&CellStatus>, b: Option<&CellStatus>, changed: bool) -> (String, String) {
    let (a, b) = (escape(&status_text(a)), escape(&status_text(b)));
    if changed {
        (format!("**{a}**"), format!("**{b}**"))
    } else {
        (a, b)
    }
}

/// What the ratio grid shows for one cell: the total tok/s ratio when Valid in both, the change
/// when the status changed, the shared status otherwise.
pub fn grid_text(cell: Option<&CellDiff>) -> String {
    let Some(cell) = cell else {
        return String::new();
    };
    if cell.status_changed {
        format!(
            "{} → {}",
            status_text(cell.status_a.as_ref()),
            status_text(cell.status_b.as_ref())
        )
    } else if cell.status_a.as_ref().is_some_and(CellStatus::is_valid) {
        format!("×{}", format_ratio(cell.ratios.total_tok_s))
    } else {
        status_text(cell.status_a.as_ref())
    }
}

/// Renders the diff as Markdown: sides, summary, status changes, the total tok/s ratio grid and
/// every ratio of every cell.
pub fn render_diff_markdown(diff: &MatrixDiff) -> String {
    let mut lines = vec!["# Matrix diff".to_owned(), String::new()];
    for (name, side) in [("A", &diff.a), ("B", &diff.b)] {
        let label = if side.label.is_empty() {
            String::new()
        } else {
            format!("`{}` — ", side.label.replace('`', "'"))
        };
        lines.push(format!("- **{name}:** {label}{}", escape(&side.title)));
    }
    lines.push(String::new());
    lines.push("Every figure is the ratio B ÷ A of the same cell (context × simultaneous requests). The summary is the geometric mean over cells Valid in both.".to_owned());
    lines.push(String::new());
    lines.push("## Summary".to_owned());
    lines.push(String::new());
    lines.push("| Column | Geometric mean B/A | Min | Max | Cells |".to_owned());
    lines.push("|---|---:|---:|---:|---:|".to_owned());
    for summary in &diff.summary {
        lines.push(format!(
            "| {} | {} | {} | {} | {} |",
            summary.column.label(),
            format_ratio(summary.geometric_mean),
            format_ratio(summary.min),
            format_ratio(summary.max),
            summary.cells
        ));
    }
    lines.push(String::new());
    lines.push("## Status changes".to_owned());
    lines.push(String::new());
    if diff.status_changes == 0 {
        lines.push("None.".to_owned());
    } else {
        for row in diff.prefill.iter().filter(|row| row.status_changed) {
            lines.push(format!(
                "- **Prefill {}:** {} → {}",
                context_label(row.context_tokens),
                escape(&status_text(row.status_a.as_ref())),
                escape(&status_text(row.status_b.as_ref()))
            ));
        }
        for cell in diff.decode.iter().filter(|cell| cell.status_changed) {
            lines.push(format!(
                "- **{} × {}:** {} → {}",
                context_label(cell.context_tokens),
                cell.concurrency,
                escape(&status_text(cell.status_a.as_ref())),
                escape(&status_text(cell.status_b.as_ref()))
            ));
        }
    }
    lines.push(String::new());
    let contexts = diff.contexts();
    let concurrencies = diff.concurrencies();
    if !contexts.is_empty() {
        lines.push("## Total tok/s ratio".to_owned());
        lines.push(String::new());
        let mut header = String::from("| Context |");
        let mut delimiter = String::from("|---|");
        for concurrency in &concurrencies {
            header.push_str(&format!(" {concurrency} |"));
            delimiter.push_str("---:|");
        }
        lines.push(header);
        lines.push(delimiter);
        for context in &contexts {
            let mut row = format!("| {} |", context_label(*context));
            for concurrency in &concurrencies {
                let cell = diff.cell(*context, *concurrency);
                let text = escape(&grid_text(cell));
                if cell.is_some_and(|c| c.status_changed) {
                    row.push_str(&format!(" **{text}** |"));
                } else {
                    row.push_str(&format!(" {text} |"));
                }
            }
            lines.push(row);
        }
        lines.push(String::new());
    }
    lines.push("## All cells".to_owned());
    lines.push(String::new());
    let mut header = String::from("| Phase | Context | Requests at once | Status A | Status B |");
    let mut delimiter = String::from("|---|---|---|---|---|");
    for column in DiffColumn::DECODE {
        header.push_str(&format!(" {} |", column.label()));
        delimiter.push_str("---:|");
    }
    lines.push(header);
    lines.push(delimiter);
    for row in &diff.prefill {
        let (a, b) = status_pair(
            row.status_a.as_ref(),
            row.status_b.as_ref(),
            row.status_changed,
        );
        let mut line = format!(
            "| Prefill | {} | — | {a} | {b} | {} | — | {} |",
            context_label(row.context_tokens),
            format_ratio(row.prompt_tok_s),
            format_ratio(row.ttft_ms)
        );
        for _ in 3..DiffColumn::DECODE.len() {
            line.push_str(" — |");
        }
        lines.push(line);
    }
    for cell in &diff.decode {
        let (a, b) = status_pair(
            cell.status_a.as_ref(),
            cell.status_b.as_ref(),
            cell.status_changed,
        );
        let mut line = format!(
            "| Sustained decode | {} | {} | {a} | {b} |",
            context_label(cell.context_tokens),
            cell.concurrency
        );
        for column in DiffColumn::DECODE {
            line.push_str(&format!(" {} |", format_ratio(cell.ratios.get(column))));
        }
        lines.push(line);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// The stable JSON rendering of a diff (pretty, trailing newline).
pub fn render_diff_json(diff: &MatrixDiff) -> String {
    tokentap_base::json::pretty_json_line(diff)
}
