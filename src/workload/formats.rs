//! The trace formats: reading any known one (tokentap JSONL, Azure CSV, Mooncake JSONL), and
//! writing the ones tokentap writes ([`TraceFormat`]).

use super::trace::{self, Trace, TraceError};
use super::{azure, mooncake};

/// Reads a trace in any known format: tokentap JSONL (a header line with `schema`), the Azure
/// CSV (a `TIMESTAMP,…` header), else Mooncake JSONL. Never panics; errors name the line.
pub fn read_trace(text: &str) -> Result<Trace, TraceError> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or(TraceError::Empty)?;
    if first.to_ascii_uppercase().starts_with("TIMESTAMP") {
        azure::read(text)
    } else if first.contains("\"schema\"") {
        trace::read_tokentap(text)
    } else {
        mooncake::read(text)
    }
}

/// The trace formats tokentap writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// `tokentap.workload/v1` JSONL (docs/workload.md).
    Tokentap,
    /// Mooncake JSONL (`timestamp`, `input_length`, `output_length`, `hash_ids`).
    Mooncake,
}

/// The trace in `format`.
pub fn render(trace: &Trace, format: TraceFormat) -> String {
    match format {
        TraceFormat::Tokentap => trace.to_jsonl(),
        TraceFormat::Mooncake => mooncake::write(trace),
    }
}
