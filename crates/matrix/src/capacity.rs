//! Capacity under an SLO: per context, the largest concurrency whose cell meets the targets,
//! from any matrix (a sweep, a production window, a fleet matrix, a seed page).
//!
//! A cell is judged ([`judge`]) by SLO attainment where it has one and the query allows it, else
//! by its medians, or by its p90 or p99 tails when asked ([`Basis`]); the report says which for
//! every context. Only `Valid` cells are judged (`Low evidence`, `Off target`, skipped and failed
//! cells are listed as excluded), and `Shed` cells, which always miss: the engine refused
//! their load. The capacity of a context is the largest concurrency `C` such
//! that every judged cell at or below `C` meets the SLO; a judged cell above the first failure
//! that meets again is reported as non-monotonic rather than moving the answer (a boundary
//! that noise can move is no boundary). End-to-end latency, which a matrix does not hold, is
//! estimated as TTFT + TBT × (output tokens − 1) from the figures of the chosen basis, with the
//! output length given or the run's `max_output_tokens`. Pure: documents in, a report out.
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::doc::{CellStatus, DecodeCell, MatrixDoc};
use super::markdown::escape as md_escape;
use super::units::{context_label, format_decimal, format_percent, format_rate, or_missing};

/// The schema tag of a capacity report's JSON.
pub const CAPACITY_SCHEMA: &str = "tokentap.capacity/v1";

/// How a `Shed` cell is judged: a miss, whatever its admitted requests' figures.
pub const SHED_BASIS: &str = "shed";

/// The latency targets, milliseconds; `None` is not set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Targets {
    pub ttft_ms: Option<f64>,
    pub tbt_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Targets {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tbt_ms.is_some() || self.e2e_ms.is_some()
    }

    /// `TTFT ≤ 2,000 ms, TBT ≤ 50.0 ms`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.ttft_ms {
            parts.push(format!("TTFT ≤ {} ms", format_decimal(t, 0)));
        }
        if let Some(t) = self.tbt_ms {
            parts.push(format!("TBT ≤ {} ms", format_decimal(t, 1)));
        }
        if let Some(t) = self.e2e_ms {
            parts.push(format!("end to end ≤ {} ms", format_decimal(t, 0)));
        }
        parts.join(", ")
    }
}

/// Which figures a cell is judged by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// SLO attainment where the cell has it, else its medians.
    #[default]
    Auto,
    /// SLO attainment only (cells without it are not judged).
    Attainment,
    /// The cell's medians.
    Median,
    /// The cell's p90 tails.
    P90,
    /// The cell's p99 tails.
    P99,
}

impl Basis {
    pub fn label(self) -> &'static str {
        match self {
            Basis::Auto => "auto",
            Basis::Attainment => "SLO attainment",
            Basis::Median => "medians",
            Basis::P90 => "p90",
            Basis::P99 => "p99",
        }
    }

    /// Parses `auto`, `attainment`, `median`, `p90`, `p99`.
    pub fn parse(text: &str) -> Option<Basis> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Basis::Auto),
            "attainment" => Some(Basis::Attainment),
            "median" | "medians" | "p50" => Some(Basis::Median),
            "p90" => Some(Basis::P90),
            "p99" => Some(Basis::P99),
            _ => None,
        }
    }
}

/// What is asked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapacityQuery {
    pub targets: Targets,
    /// The share of requests that must meet the targets, for the attainment basis (0–1).
    pub attainment: f64,
    pub basis: Basis,
    /// Output tokens per request for the end-to-end estimate; `None`: the run's
    /// `max_output_tokens`.
    pub output_tokens: Option<u64>,
}

/// Why a query cannot be answered on a document.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    #[error("no SLO target is set: give at least one of ttft=, tbt=, e2e= (e.g. --slo ttft=2s,tbt=50ms)")]
    NoTargets,
    #[error("the attainment must lie in (0, 1], got {0}")]
    BadAttainment(f64),
    #[error("an end-to-end target needs the output length per request: the matrix names no max_output_tokens, so give --output-tokens N")]
    NoOutputLength,
}

/// The verdict on one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellVerdict {
    pub concurrency: u32,
    pub meets: bool,
    /// The basis actually used: `SLO attainment`, `medians`, `p90` or `p99`.
    pub judged_by: String,
    /// The target that failed worst (largest figure ÷ target), as text, e.g.
    /// `TBT 62.1 ms > 50.0 ms`; `None` when the cell meets.
    pub limited_by: Option<String>,
}

/// One context's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextCapacity {
    pub context_tokens: u64,
    /// The largest concurrency whose cell, and every judged cell below it, meets the SLO;
    /// 0 when even the lowest judged cell misses; `None` when no cell could be judged.
    pub capacity: Option<u32>,
    /// Whether a judged cell above the capacity missed (the boundary was seen). Otherwise the
    /// true capacity is at least `capacity` (the largest cell measured meets).
    pub boundary_seen: bool,
    /// How the cells of this context were judged (`medians`, `SLO attainment`, … or
    /// `SLO attainment, medians` when they differ).
    pub judged_by: String,
    /// The capacity cell's goodput (tok/s of the requests that met their targets), when it has
    /// one.
    pub goodput_tok_s: Option<f64>,
    /// The capacity cell's total tok/s.
    pub total_tok_s: Option<f64>,
    /// Which target stops it: the first missing cell above the capacity and why.
    pub limited_by: Option<String>,
    /// Every judged cell, by concurrency.
    pub cells: Vec<CellVerdict>,
    /// Cells that meet again above a miss (not counted in the capacity).
    pub non_monotonic: Vec<u32>,
    /// Cells not judged and why (`Low evidence`, `Off target`, `Over capacity`, …).
    pub excluded: Vec<(u32, String)>,
}

/// The capacity of every context of a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityReport {
    /// Always [`CAPACITY_SCHEMA`].
    pub schema: String,
    /// The document's page title.
    pub title: String,
    pub targets: Targets,
    pub attainment: f64,
    pub basis: Basis,
    /// Output tokens per request used for the end-to-end estimate, when one was needed.
    pub output_tokens: Option<u64>,
    pub contexts: Vec<ContextCapacity>,
    /// The shape of the requests the cells were measured with, when not the seed method's
    /// (`like production: 8K 20 % cached, …`): the capacity holds for that traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
}

impl CapacityReport {
    pub fn context(&self, context_tokens: u64) -> Option<&ContextCapacity> {
        self.contexts
            .iter()
            .find(|c| c.context_tokens == context_tokens)
    }

    /// Whether the cell at (`context`, `concurrency`) lies beyond the context's capacity.
    pub fn beyond(&self, context_tokens: u64, concurrency: u32) -> bool {
        self.context(context_tokens)
            .and_then(|c| c.capacity)
            .is_some_and(|capacity| concurrency > capacity)
    }
}

/// The figures of one basis: TTFT and TBT, ms.
fn latencies(cell: &DecodeCell, basis: Basis) -> (Option<f64>, Option<f64>) {
    match basis {
        Basis::P90 => cell
            .tails
            .map_or((None, None), |t| (t.ttft_p90_ms, t.tbt_p90_ms)),
        Basis::P99 => cell
            .tails
            .map_or((None, None), |t| (t.ttft_p99_ms, t.tbt_p99_ms)),
        _ => (cell.ttft_ms, cell.tbt_ms),
    }
}

/// Judges one `Valid` cell; `None` when the chosen basis has no figure to judge it by.
pub fn judge(
    cell: &DecodeCell,
    query: &CapacityQuery,
    output_tokens: Option<u64>,
) -> Option<CellVerdict> {
    let by_attainment = match query.basis {
        Basis::Attainment => true,
        Basis::Auto => cell.slo_attainment.is_some(),
        _ => false,
    };
    if by_attainment {
        let attainment = cell.slo_attainment?;
        let meets = attainment >= query.attainment;
        return Some(CellVerdict {
            concurrency: cell.concurrency,
            meets,
            judged_by: Basis::Attainment.label().to_owned(),
            limited_by: (!meets).then(|| {
                format!(
                    "SLO attainment {} < {}",
                    format_percent(attainment),
                    format_percent(query.attainment)
                )
            }),
        });
    }
    let basis = if query.basis == Basis::Auto {
        Basis::Median
    } else {
        query.basis
    };
    let (ttft, tbt) = latencies(cell, basis);
    let e2e = match (ttft, tbt, output_tokens) {
        (Some(ttft), Some(tbt), Some(tokens)) => Some(ttft + tbt * tokens.saturating_sub(1) as f64),
        _ => None,
    };
    // (figure, target, name, decimals) for every target set; a set target without its figure
    // leaves the cell unjudged.
    let mut checks = Vec::new();
    for (figure, target, name, decimals) in [
        (ttft, query.targets.ttft_ms, "TTFT", 0),
        (tbt, query.targets.tbt_ms, "TBT", 1),
        (e2e, query.targets.e2e_ms, "end to end", 0),
    ] {
        if let Some(target) = target {
            checks.push((figure?, target, name, decimals));
        }
    }
    let worst = checks
        .iter()
        .filter(|(figure, target, ..)| figure > target)
        .max_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
    Some(CellVerdict {
        concurrency: cell.concurrency,
        meets: worst.is_none(),
        judged_by: basis.label().to_owned(),
        limited_by: worst.map(|(figure, target, name, decimals)| {
            format!(
                "{name} {} ms > {} ms",
                format_decimal(*figure, *decimals),
                format_decimal(*target, *decimals)
            )
        }),
    })
}

/// The capacity of every context of `doc` under `query`.
pub fn capacity(doc: &MatrixDoc, query: &CapacityQuery) -> Result<CapacityReport, CapacityError> {
    if !query.targets.is_set() && query.basis != Basis::Attainment {
        return Err(CapacityError::NoTargets);
    }
    if !(query.attainment > 0.0 && query.attainment <= 1.0) {
        return Err(CapacityError::BadAttainment(query.attainment));
    }
    let output_tokens = query.output_tokens.or(doc.metadata.run.max_output_tokens);
    if query.targets.e2e_ms.is_some() && output_tokens.is_none() {
        return Err(CapacityError::NoOutputLength);
    }
    let mut contexts = Vec::new();
    for context in doc.contexts() {
        let mut cells: Vec<&DecodeCell> = doc
            .decode
            .iter()
            .filter(|c| c.context_tokens == context)
            .collect();
        cells.sort_by_key(|c| c.concurrency);
        contexts.push(context_capacity(context, &cells, query, output_tokens));
    }
    Ok(CapacityReport {
        schema: CAPACITY_SCHEMA.to_owned(),
        title: super::page::title(&doc.metadata),
        targets: query.targets,
        attainment: query.attainment,
        basis: query.basis,
        output_tokens: query.targets.e2e_ms.and(output_tokens),
        contexts,
        shape: doc
            .like_production()
            .then(|| "like production (requests shaped like production's traffic)".to_owned()),
    })
}

/// One context from its cells, ascending by concurrency.
pub fn context_capacity(
    context_tokens: u64,
    cells: &[&DecodeCell],
    query: &CapacityQuery,
    output_tokens: Option<u64>,
) -> ContextCapacity {
    let mut verdicts = Vec::new();
    let mut excluded = Vec::new();
    for cell in cells {
        if let CellStatus::Shed(reason) = &cell.status {
            // The engine refused the cell's load: whatever its admitted requests did, the
            // cell misses (a shed request is an SLO miss).
            verdicts.push(CellVerdict {
                concurrency: cell.concurrency,
                meets: false,
                judged_by: SHED_BASIS.to_owned(),
                limited_by: Some(format!("shed by the engine ({reason})")),
            });
            continue;
        }
        if cell.status != CellStatus::Valid {
            excluded.push((cell.concurrency, cell.status.to_string()));
            continue;
        }
        match judge(cell, query, output_tokens) {
            Some(verdict) => verdicts.push(verdict),
            None => excluded.push((
                cell.concurrency,
                format!("no figure to judge by ({})", judged_basis(query)),
            )),
        }
    }
    let mut capacity = None;
    let mut first_miss: Option<&CellVerdict> = None;
    let mut non_monotonic = Vec::new();
    for verdict in &verdicts {
        match (first_miss, verdict.meets) {
            (None, true) => capacity = Some(verdict.concurrency),
            (None, false) => {
                first_miss = Some(verdict);
                capacity.get_or_insert(0);
            }
            (Some(_), true) => non_monotonic.push(verdict.concurrency),
            (Some(_), false) => {}
        }
    }
    // No judged cell missed, but the next level would not fit the KV cache: that is the
    // boundary, and the answer is exact.
    let kv_limit = if first_miss.is_none() {
        cells
            .iter()
            .filter(|c| c.status == CellStatus::OverCapacity)
            .map(|c| c.concurrency)
            .filter(|c| capacity.is_none_or(|cap| *c > cap))
            .min()
    } else {
        None
    };
    let at = |concurrency: Option<u32>| {
        concurrency.and_then(|c| cells.iter().find(|cell| cell.concurrency == c && c > 0))
    };
    let capacity_cell = at(capacity);
    let mut bases: Vec<&str> = verdicts.iter().map(|v| v.judged_by.as_str()).collect();
    bases.sort_unstable();
    bases.dedup();
    ContextCapacity {
        context_tokens,
        capacity,
        boundary_seen: first_miss.is_some() || (kv_limit.is_some() && capacity.is_some()),
        judged_by: bases.join(", "),
        goodput_tok_s: capacity_cell.and_then(|c| c.goodput_tok_s),
        total_tok_s: capacity_cell.and_then(|c| c.total_tok_s),
        limited_by: first_miss
            .map(|miss| {
                format!(
                    "{} at {}",
                    miss.limited_by.as_deref().unwrap_or("missed"),
                    miss.concurrency
                )
            })
            .or_else(|| {
                kv_limit.map(|c| format!("KV cache: {c} at once would not fit (Over capacity)"))
            }),
        cells: verdicts,
        non_monotonic,
        excluded,
    }
}

fn judged_basis(query: &CapacityQuery) -> &'static str {
    match query.basis {
        Basis::Auto => "SLO attainment or medians",
        other => other.label(),
    }
}

/// The capacity as text: `8`, `≥ 8` (no miss seen above), `0` (even the lowest misses), `—`.
pub fn capacity_text(context: &ContextCapacity) -> String {
    match context.capacity {
        None => super::units::MISSING.to_owned(),
        Some(c) if !context.boundary_seen => format!("≥ {c}"),
        Some(c) => c.to_string(),
    }
}

/// What stops a context's capacity, and where its cells meet again above a miss.
fn limited_text(context: &ContextCapacity) -> String {
    let mut limited = context
        .limited_by
        .clone()
        .unwrap_or_else(|| "not reached".to_owned());
    if !context.non_monotonic.is_empty() {
        let again: Vec<String> = context.non_monotonic.iter().map(u32::to_string).collect();
        let _ = write!(
            limited,
            "; meets again at {} (non-monotonic)",
            again.join(", ")
        );
    }
    limited
}

/// The report as Markdown: the query, then one row per context.
pub fn render_capacity_markdown(report: &CapacityReport) -> String {
    let mut out = String::from("# Capacity under an SLO\n\n");
    let _ = writeln!(out, "**{}**\n", md_escape(&report.title));
    let _ = writeln!(
        out,
        "SLO: {} · attainment ≥ {} · judged by: {}{}\n",
        md_escape(&report.targets.describe()),
        format_percent(report.attainment),
        report.basis.label(),
        report.output_tokens.map_or_else(String::new, |n| format!(
            " · end to end estimated as TTFT + TBT × {}",
            n.saturating_sub(1)
        ))
    );
    if let Some(shape) = &report.shape {
        let _ = writeln!(out, "Judged on requests shaped {}\n", md_escape(shape));
    }
    out.push_str("Capacity: the largest number of simultaneous requests whose cell, and every judged cell below it, meets the SLO (`≥ C`: no cell above C missed, the boundary lies beyond what was measured).\n\n");
    // A column with nothing to show is left out (a seed page has no per-request attainment to
    // count goodput from), and the line under the table says so.
    let goodput = has_goodput(report);
    if goodput {
        out.push_str("| Context | Capacity | Judged by | Goodput tok/s | Total tok/s | Limited by | Cells (✓ meets, ✗ misses) |\n|---|---:|---|---:|---:|---|---|\n");
    } else {
        out.push_str("| Context | Capacity | Judged by | Total tok/s | Limited by | Cells (✓ meets, ✗ misses) |\n|---|---:|---|---:|---|---|\n");
    }
    for context in &report.contexts {
        let cells: Vec<String> = context
            .cells
            .iter()
            .map(|v| format!("{} {}", v.concurrency, if v.meets { "✓" } else { "✗" }))
            .chain(
                context
                    .excluded
                    .iter()
                    .map(|(c, why)| format!("{c} ({why})")),
            )
            .collect();
        let limited = limited_text(context);
        let goodput_cell = if goodput {
            format!(" {} |", or_missing(context.goodput_tok_s, format_rate))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} |{goodput_cell} {} | {} | {} |",
            context_label(context.context_tokens),
            capacity_text(context),
            if context.judged_by.is_empty() {
                super::units::MISSING
            } else {
                &context.judged_by
            },
            or_missing(context.total_tok_s, format_rate),
            md_escape(&limited),
            md_escape(&cells.join(" · "))
        );
    }
    if !goodput {
        out.push_str(NO_GOODPUT_NOTE);
        out.push('\n');
    }
    out
}

/// Under a table without the goodput column.
const NO_GOODPUT_NOTE: &str =
    "\nGoodput tok/s left out: no cell has per-request SLO attainment to count it from.";

/// Whether any context has a goodput figure to show.
fn has_goodput(report: &CapacityReport) -> bool {
    report.contexts.iter().any(|c| c.goodput_tok_s.is_some())
}

/// The report as aligned text for a terminal, at most
/// [`MAX_WIDTH`](crate::table::MAX_WIDTH) characters wide: the query, then one row per
/// context (its judged cells compressed to the first concurrency that misses).
pub fn render_capacity_table(report: &CapacityReport) -> String {
    use crate::table::{TextTable, MAX_WIDTH};
    let mut out = String::from("Capacity under an SLO\n");
    let _ = writeln!(
        out,
        "SLO: {} · attainment ≥ {} · judged by: {}",
        report.targets.describe(),
        format_percent(report.attainment),
        report.basis.label(),
    );
    if let Some(shape) = &report.shape {
        let _ = writeln!(out, "Judged on requests shaped {shape}");
    }
    out.push_str(
        "Capacity: the most requests at once whose cell, and every judged cell below it, meets \
         the SLO;\n`≥ C`: no cell above C missed, the boundary lies beyond what was measured.\n\n",
    );
    let goodput = has_goodput(report);
    let mut table = if goodput {
        TextTable::new(&[
            "Context",
            "Capacity",
            "Goodput tok/s",
            "Total tok/s",
            "Limited by",
        ])
    } else {
        TextTable::new(&["Context", "Capacity", "Total tok/s", "Limited by"])
    };
    table.numeric = if goodput { vec![1, 2, 3] } else { vec![1, 2] };
    table.rows = report
        .contexts
        .iter()
        .map(|context| {
            let mut row = vec![
                context_label(context.context_tokens),
                capacity_text(context),
            ];
            if goodput {
                row.push(or_missing(context.goodput_tok_s, format_rate));
            }
            row.push(or_missing(context.total_tok_s, format_rate));
            row.push(limited_text(context));
            row
        })
        .collect();
    out.push_str(&table.render(MAX_WIDTH));
    if !goodput {
        out.push_str(NO_GOODPUT_NOTE);
        out.push('\n');
    }
    out
}

/// The report as JSON (schema [`CAPACITY_SCHEMA`]).
pub fn render_capacity_json(report: &CapacityReport) -> String {
    tokentap_base::json::pretty_json_line(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::Tails;

    fn cell(concurrency: u32, ttft: f64, tbt: f64) -> DecodeCell {
        let mut cell = DecodeCell::status_only(8192, concurrency, CellStatus::Valid);
        cell.ttft_ms = Some(ttft);
        cell.tbt_ms = Some(tbt);
        cell.total_tok_s = Some(f64::from(concurrency) * 1000.0 / tbt);
        cell
    }

    fn query(ttft: f64, tbt: f64) -> CapacityQuery {
        CapacityQuery {
            targets: Targets {
                ttft_ms: Some(ttft),
                tbt_ms: Some(tbt),
                e2e_ms: None,
            },
            attainment: 0.95,
            basis: Basis::Auto,
            output_tokens: None,
        }
    }

    fn doc(cells: Vec<DecodeCell>) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Default::default());
        doc.decode = cells;
        doc
    }

    #[test]
    fn the_boundary_is_below_the_first_miss_and_names_the_target() {
        let report = capacity(
            &doc(vec![
                cell(1, 300.0, 20.0),
                cell(2, 320.0, 30.0),
                cell(4, 350.0, 45.0),
                cell(8, 400.0, 62.1),
                cell(16, 2500.0, 90.0),
            ]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        let context = report.context(8192).unwrap();
        assert_eq!(context.capacity, Some(4));
        assert!(context.boundary_seen);
        assert_eq!(context.judged_by, "medians");
        assert_eq!(
            context.limited_by.as_deref(),
            Some("TBT 62.1 ms > 50.0 ms at 8")
        );
        assert_eq!(context.total_tok_s, Some(4.0 * 1000.0 / 45.0));
        let md = render_capacity_markdown(&report);
        assert!(md.contains("| 8K | 4 | medians |"), "{md}");
        assert!(report.beyond(8192, 8) && !report.beyond(8192, 4));
    }

    /// A column with nothing to show is left out, in Markdown and on the terminal, and the line
    /// under the table says why; with a figure it is back.
    #[test]
    fn the_goodput_column_is_left_out_when_no_context_has_one() {
        let mut report = capacity(
            &doc(vec![cell(1, 300.0, 20.0), cell(2, 320.0, 30.0)]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        assert!(report.contexts.iter().all(|c| c.goodput_tok_s.is_none()));
        for text in [
            render_capacity_markdown(&report),
            render_capacity_table(&report),
        ] {
            assert!(
                !text.contains("| Goodput") && !text.contains("Goodput tok/s  "),
                "{text}"
            );
            assert!(text.contains(NO_GOODPUT_NOTE.trim()), "{text}");
        }
        assert!(render_capacity_markdown(&report)
            .contains("| Context | Capacity | Judged by | Total tok/s |"));
        report.contexts[0].goodput_tok_s = Some(42.0);
        for text in [
            render_capacity_markdown(&report),
            render_capacity_table(&report),
        ] {
            assert!(text.contains("Goodput tok/s"), "{text}");
            assert!(!text.contains(NO_GOODPUT_NOTE.trim()), "{text}");
        }
    }

    #[test]
    fn a_shed_cell_is_a_miss_whatever_its_admitted_requests_did() {
        let mut shed = cell(8, 300.0, 20.0);
        shed.status = CellStatus::Shed("9 of 40 requests shed".into());
        let report = capacity(
            &doc(vec![cell(1, 300.0, 20.0), cell(4, 320.0, 25.0), shed]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        let context = report.context(8192).unwrap();
        assert_eq!(context.capacity, Some(4));
        assert!(context.boundary_seen);
        assert_eq!(
            context.limited_by.as_deref(),
            Some("shed by the engine (9 of 40 requests shed) at 8")
        );
        assert!(context.excluded.is_empty());
    }

    #[test]
    fn a_cell_that_meets_again_above_a_miss_is_non_monotonic_and_excluded_cells_are_listed() {
        let mut thin = cell(16, 300.0, 20.0);
        thin.status = CellStatus::LowEvidence;
        let report = capacity(
            &doc(vec![
                cell(1, 300.0, 20.0),
                cell(2, 300.0, 55.0),
                cell(4, 300.0, 40.0),
                thin,
                DecodeCell::status_only(8192, 32, CellStatus::OverCapacity),
            ]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        let context = &report.contexts[0];
        assert_eq!(context.capacity, Some(1));
        assert_eq!(context.non_monotonic, [4]);
        assert!(context
            .limited_by
            .as_deref()
            .unwrap()
            .starts_with("TBT 55.0 ms"));
        assert_eq!(
            context.excluded,
            [
                (16, "Low evidence".to_owned()),
                (32, "Over capacity".to_owned())
            ]
        );
    }

    #[test]
    fn attainment_is_used_where_the_cell_has_it_and_tails_on_request() {
        let mut judged = cell(1, 300.0, 20.0);
        judged.slo_attainment = Some(0.9);
        judged.tails = Some(Tails {
            tbt_p99_ms: Some(70.0),
            ttft_p99_ms: Some(500.0),
            ..Tails::default()
        });
        let auto = judge(&judged, &query(2000.0, 50.0), None).unwrap();
        assert!(!auto.meets);
        assert_eq!(auto.judged_by, "SLO attainment");
        assert_eq!(
            auto.limited_by.as_deref(),
            Some("SLO attainment 90.0% < 95.0%")
        );
        let p99 = CapacityQuery {
            basis: Basis::P99,
            ..query(2000.0, 50.0)
        };
        let verdict = judge(&judged, &p99, None).unwrap();
        assert_eq!(verdict.limited_by.as_deref(), Some("TBT 70.0 ms > 50.0 ms"));
        // Every cell meets: the capacity is at least the largest measured.
        let report = capacity(
            &doc(vec![cell(1, 10.0, 10.0), cell(2, 10.0, 10.0)]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        assert_eq!(capacity_text(&report.contexts[0]), "≥ 2");
    }

    #[test]
    fn the_kv_cache_is_a_boundary_too() {
        let report = capacity(
            &doc(vec![
                cell(1, 300.0, 20.0),
                cell(2, 300.0, 25.0),
                DecodeCell::status_only(8192, 4, CellStatus::OverCapacity),
            ]),
            &query(2000.0, 50.0),
        )
        .unwrap();
        let context = &report.contexts[0];
        assert_eq!(capacity_text(context), "2");
        assert_eq!(
            context.limited_by.as_deref(),
            Some("KV cache: 4 at once would not fit (Over capacity)")
        );
    }

    #[test]
    fn end_to_end_needs_an_output_length() {
        let mut q = query(2000.0, 50.0);
        q.targets.e2e_ms = Some(30_000.0);
        let matrix = doc(vec![cell(1, 300.0, 20.0)]);
        assert_eq!(capacity(&matrix, &q), Err(CapacityError::NoOutputLength));
        q.output_tokens = Some(2000);
        // 300 + 20 × 1999 = 40,280 ms > 30 s.
        let report = capacity(&matrix, &q).unwrap();
        assert_eq!(report.contexts[0].capacity, Some(0));
        assert_eq!(
            report.contexts[0].limited_by.as_deref(),
            Some("end to end 40,280 ms > 30,000 ms at 1")
        );
    }
}
