//! The latest sweep as gauges in `/metrics`, so a dashboard can put production beside the
//! sweep long after the sweep's own requests have left the rate windows:
//! `tokentap_sweep_cell_*{model, context_bucket, concurrency_bucket}` for every Valid decode
//! cell of the latest synthetic matrix (total and per-request tok/s, median TTFT and TBT in
//! seconds), and `tokentap_sweep_info{model, sweep_id}` (value: when the sweep ended, Unix
//! seconds; 0 when unknown). Written as text at each scrape from the one latest matrix, so the
//! series are bounded by its cells (contexts × concurrency levels, a few dozen) and a new
//! sweep replaces them whole. Labels match the per-cell recording rules', so
//! `production / ignoring(source) sweep` joins cell by cell.

use std::fmt::Write as _;

use super::names::{
    label_value, SWEEP_CELL_REQUEST_TOKENS_PER_SECOND, SWEEP_CELL_TIME_BETWEEN_TOKENS,
    SWEEP_CELL_TIME_TO_FIRST_TOKEN, SWEEP_CELL_TOTAL_TOKENS_PER_SECOND, SWEEP_INFO,
    SWEEP_INFO_HELP,
};
use crate::matrix::doc::{DecodeCell, MatrixDoc};
use crate::matrix::units::context_label;

/// A cell's figure in the gauge's base unit.
type CellValue = fn(&DecodeCell) -> Option<f64>;

/// (name, description, value) of each cell gauge.
const SWEEP_CELL_GAUGES: [(&str, &str, CellValue); 4] = [
    (
        SWEEP_CELL_TOTAL_TOKENS_PER_SECOND,
        "Total tok/s of each Valid decode cell of the latest sweep (its matrix's Total tok/s).",
        |c| c.total_tok_s,
    ),
    (
        SWEEP_CELL_REQUEST_TOKENS_PER_SECOND,
        "Per-request tok/s of each Valid decode cell of the latest sweep.",
        |c| c.per_request_tok_s,
    ),
    (
        SWEEP_CELL_TIME_TO_FIRST_TOKEN,
        "Median time to first token of each Valid decode cell of the latest sweep, in seconds.",
        |c| c.ttft_ms.map(|ms| ms / 1000.0),
    ),
    (
        SWEEP_CELL_TIME_BETWEEN_TOKENS,
        "Median time between tokens of each Valid decode cell of the latest sweep, in seconds.",
        |c| c.tbt_ms.map(|ms| ms / 1000.0),
    ),
];

/// Appends the gauges of `doc` (nothing when it has no Valid decode cell).
pub fn render_into(doc: &MatrixDoc, out: &mut String) {
    let model = doc.metadata.model.served_model.as_deref().unwrap_or("");
    let cells: Vec<&DecodeCell> = doc.decode.iter().filter(|c| c.status.is_valid()).collect();
    if cells.is_empty() {
        return;
    }
    let model = label_value(model);
    let ended = doc
        .metadata
        .run
        .ended_at
        .as_deref()
        .and_then(crate::base::wallclock::parse_rfc3339)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64());
    let _ = writeln!(out, "# HELP {SWEEP_INFO} {SWEEP_INFO_HELP}");
    let _ = writeln!(out, "# TYPE {SWEEP_INFO} gauge");
    let _ = writeln!(
        out,
        "{SWEEP_INFO}{{model=\"{model}\",sweep_id=\"{}\"}} {ended}",
        label_value(doc.metadata.run.sweep_id.as_deref().unwrap_or(""))
    );
    for (name, help, value) in SWEEP_CELL_GAUGES {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for cell in &cells {
            let Some(value) = value(cell).filter(|v| v.is_finite()) else {
                continue;
            };
            let _ = writeln!(
                out,
                "{name}{{model=\"{model}\",context_bucket=\"{}\",concurrency_bucket=\"{}\"}} {value}",
                context_label(cell.context_tokens),
                cell.concurrency
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::doc::CellStatus;

    #[test]
    fn valid_cells_become_gauges_in_base_units() {
        let mut doc: MatrixDoc = crate::matrix::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/seeds/003_5c468af628b56f4a.txt"),
        )
        .unwrap();
        doc.metadata.model.served_model = Some("a\"b".into());
        doc.metadata.run.sweep_id = Some("s-1".into());
        doc.metadata.run.ended_at = Some("2026-12-01T10:00:00Z".into());
        doc.decode[1].status = CellStatus::NotRun;
        let mut out = String::new();
        render_into(&doc, &mut out);
        assert!(
            out.contains("tokentap_sweep_info{model=\"a\\\"b\",sweep_id=\"s-1\"} 1796119200\n"),
            "{out}"
        );
        let first = &doc.decode[0];
        let line = format!(
            "tokentap_sweep_cell_time_to_first_token_seconds{{model=\"a\\\"b\",context_bucket=\"{}\",concurrency_bucket=\"{}\"}} {}\n",
            context_label(first.context_tokens),
            first.concurrency,
            first.ttft_ms.unwrap() / 1000.0
        );
        assert!(out.contains(&line), "{line}\n{out}");
        let second = &doc.decode[1];
        assert!(!out.contains(&format!(
            "concurrency_bucket=\"{}\"}} {}",
            second.concurrency,
            second.total_tok_s.unwrap_or(-1.0)
        )));
        let valid = doc.decode.iter().filter(|c| c.status.is_valid()).count();
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("tokentap_sweep_cell_total_tokens_per_second{"))
                .count(),
            valid
        );
        let mut none = doc.clone();
        none.decode
            .iter_mut()
            .for_each(|c| c.status = CellStatus::NotRun);
        let mut empty = String::new();
        render_into(&none, &mut empty);
        assert!(empty.is_empty());
    }
}
