//! The spread of a fleet sweep: the same cells measured on each replica, and per cell the
//! minimum, median and maximum over the replicas with max ÷ median and min ÷ median, so a
//! slow node stands out. Only `Valid` cells count. Pure: documents in, a spread and its text
//! out.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::matrix::doc::{DecodeCell, MatrixDoc};
use crate::matrix::units::{context_label, format_decimal, MISSING};

/// The schema tag of a spread's JSON.
pub const SPREAD_SCHEMA: &str = "tokentap.fleet-spread/v1";

/// One column of one cell across the replicas.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// One value per replica, in replica order; `None` where the replica's cell is not `Valid`.
    pub values: Vec<Option<f64>>,
    pub min: Option<f64>,
    pub median: Option<f64>,
    pub max: Option<f64>,
    pub max_over_median: Option<f64>,
    pub min_over_median: Option<f64>,
    /// The replica with the smallest value (for tok/s: the slowest).
    pub lowest: Option<String>,
}

/// One cell across the replicas.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpreadCell {
    pub context_tokens: u64,
    pub concurrency: u32,
    pub per_request_tok_s: Spread,
    pub total_tok_s: Spread,
}

/// Every cell of any replica.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetSpread {
    /// Always [`SPREAD_SCHEMA`].
    pub schema: String,
    /// The replicas (their admin URLs), in sweep order.
    pub replicas: Vec<String>,
    pub cells: Vec<SpreadCell>,
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => sorted.get(n / 2).copied(),
        _ => Some((sorted.get(n / 2 - 1)? + sorted.get(n / 2)?) / 2.0),
    }
}

fn spread(values: Vec<Option<f64>>, replicas: &[String]) -> Spread {
    let present: Vec<f64> = values.iter().flatten().copied().collect();
    let min = present.iter().copied().reduce(f64::min);
    let max = present.iter().copied().reduce(f64::max);
    let median = median(&present);
    let over = |v: Option<f64>| Some(v? / median.filter(|m| *m > 0.0)?);
    let lowest = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some((i, (*v)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .and_then(|(i, _)| replicas.get(i).cloned());
    Spread {
        max_over_median: over(max),
        min_over_median: over(min),
        values,
        min,
        median,
        max,
        lowest,
    }
}

/// The spread of `docs` (one per replica, labelled).
pub fn fleet_spread(docs: &[(String, MatrixDoc)]) -> FleetSpread {
    let replicas: Vec<String> = docs.iter().map(|(label, _)| label.clone()).collect();
    let keys: BTreeSet<(u64, u32)> = docs
        .iter()
        .flat_map(|(_, doc)| doc.decode.iter())
        .map(|cell| (cell.context_tokens, cell.concurrency))
        .collect();
    let indexes: Vec<_> = docs.iter().map(|(_, doc)| doc.cell_index()).collect();
    let column = |key: &(u64, u32), get: fn(&DecodeCell) -> Option<f64>| {
        indexes
            .iter()
            .map(|index| {
                index
                    .get(key)
                    .filter(|cell| cell.status.is_valid())
                    .and_then(|cell| get(cell))
            })
            .collect::<Vec<_>>()
    };
    let cells = keys
        .iter()
        .map(|key| SpreadCell {
            context_tokens: key.0,
            concurrency: key.1,
            per_request_tok_s: spread(column(key, |c| c.per_request_tok_s), &replicas),
            total_tok_s: spread(column(key, |c| c.total_tok_s), &replicas),
        })
        .collect();
    FleetSpread {
        schema: SPREAD_SCHEMA.to_owned(),
        replicas,
        cells,
    }
}

/// The spread as JSON (pretty, trailing newline).
pub fn render_spread_json(spread: &FleetSpread) -> String {
    crate::base::json::pretty_json_line(spread)
}

fn number(value: Option<f64>, places: usize) -> String {
    value.map_or_else(|| MISSING.to_owned(), |v| format_decimal(v, places))
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(
        || MISSING.to_owned(),
        |v| format!("×{}", format_decimal(v, 2)),
    )
}

/// The spread as Markdown: the replicas, then per cell each replica's per-request tok/s and
/// the spread of per-request and Total tok/s.
pub fn render_spread_markdown(spread: &FleetSpread) -> String {
    let mut out = String::from("# Fleet spread\n\n");
    out.push_str("Per cell, each replica's Valid figures; min ÷ median below 1 marks a replica slower than the fleet's middle.\n\n");
    for (i, replica) in spread.replicas.iter().enumerate() {
        out.push_str(&format!("- R{}: {replica}\n", i + 1));
    }
    out.push_str("\n| Context | Concurrency |");
    for i in 0..spread.replicas.len() {
        out.push_str(&format!(" R{} tok/s |", i + 1));
    }
    out.push_str(" Min | Median | Max ÷ median | Min ÷ median | Slowest | Total tok/s max ÷ median | Total tok/s min ÷ median |\n|---|---|");
    for _ in &spread.replicas {
        out.push_str("---|");
    }
    out.push_str("---|---|---|---|---|---|---|\n");
    for cell in &spread.cells {
        let s = &cell.per_request_tok_s;
        out.push_str(&format!(
            "| {} | {} |",
            context_label(cell.context_tokens),
            cell.concurrency
        ));
        for value in &s.values {
            out.push_str(&format!(" {} |", number(*value, 1)));
        }
        let slowest = s
            .lowest
            .as_ref()
            .and_then(|l| spread.replicas.iter().position(|r| r == l))
            .map_or_else(|| MISSING.to_owned(), |i| format!("R{}", i + 1));
        out.push_str(&format!(
            " {} | {} | {} | {} | {slowest} | {} | {} |\n",
            number(s.min, 1),
            number(s.median, 1),
            times(s.max_over_median),
            times(s.min_over_median),
            times(cell.total_tok_s.max_over_median),
            times(cell.total_tok_s.min_over_median),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::{CellStatus, Metadata};

    fn doc(tok_s: &[(u32, f64, CellStatus)]) -> MatrixDoc {
        let mut doc = MatrixDoc::new(Metadata::default());
        for (concurrency, value, status) in tok_s {
            let mut cell = DecodeCell::status_only(8192, *concurrency, status.clone());
            cell.per_request_tok_s = Some(*value);
            cell.total_tok_s = Some(*value * f64::from(*concurrency));
            doc.decode.push(cell);
        }
        doc
    }

    #[test]
    fn the_slow_replica_stands_out() {
        let docs = vec![
            (
                "a".to_owned(),
                doc(&[(1, 100.0, CellStatus::Valid), (2, 90.0, CellStatus::Valid)]),
            ),
            (
                "b".to_owned(),
                doc(&[
                    (1, 60.0, CellStatus::Valid),
                    (2, 50.0, CellStatus::OffTarget),
                ]),
            ),
            ("c".to_owned(), doc(&[(1, 102.0, CellStatus::Valid)])),
        ];
        let spread = fleet_spread(&docs);
        let first = &spread.cells[0].per_request_tok_s;
        assert_eq!(first.values, vec![Some(100.0), Some(60.0), Some(102.0)]);
        assert_eq!(
            (first.min, first.median, first.max),
            (Some(60.0), Some(100.0), Some(102.0))
        );
        assert_eq!(first.min_over_median, Some(0.6));
        assert_eq!(first.lowest.as_deref(), Some("b"));
        // The Off target cell does not count.
        let second = &spread.cells[1].per_request_tok_s;
        assert_eq!(second.values, vec![Some(90.0), None, None]);
        assert_eq!(second.max_over_median, Some(1.0));
        let md = render_spread_markdown(&spread);
        assert!(
            md.contains("| 8K | 1 | 100.0 | 60.0 | 102.0 | 60.0 | 100.0 | ×1.02 | ×0.60 | R2 |"),
            "{md}"
        );
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, 3.0]), Some(2.0));
    }
}
