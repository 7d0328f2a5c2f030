//! The trace formats: reading any known one (tokentap JSONL, Azure CSV, Bailian JSONL,
//! Mooncake JSONL with AIPerf's sessions), refusing a file that mixes them, and writing the
//! ones tokentap writes ([`TraceFormat`]).

use super::line_kind::{line_kind, same_format, LineKind};
use super::trace::{self, Trace, TraceError};
use super::{azure, bailian, mooncake};

/// Reads a trace in any known format: tokentap JSONL (a header line with `schema`), the Azure
/// CSV (a `TIMESTAMP,…` header), Bailian JSONL (`chat_id`), else Mooncake JSONL (with or
/// without AIPerf's `session_id`). A line of another format than the file's is an error naming
/// it. Never panics; errors name the line.
pub fn read_trace(text: &str) -> Result<Trace, TraceError> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or(TraceError::Empty)?;
    if first.to_ascii_uppercase().starts_with("TIMESTAMP") {
        return azure::read(text);
    }
    match line_kind(first) {
        Some(LineKind::Header) => read_tokentap(text),
        Some(LineKind::Bailian) => bailian::read(text),
        _ => mooncake::read(text),
    }
}

/// The trace formats tokentap writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// `tokentap.workload/v2` JSONL (docs/workload.md).
    Tokentap,
    /// Mooncake JSONL (`timestamp`, `input_length`, `output_length`, `hash_ids`).
    Mooncake,
    /// AIPerf's `mooncake_trace` with sessions: `session_id`, the first turn's `timestamp`,
    /// later turns' `delay` (end to start, ms).
    Aiperf,
    /// Bailian JSONL (`chat_id`, `parent_chat_id`, `turn`, `timestamp` in s, 16-token blocks).
    Bailian,
}

/// The trace in `format`.
pub fn render(trace: &Trace, format: TraceFormat) -> String {
    match format {
        TraceFormat::Tokentap => trace.to_jsonl(),
        TraceFormat::Mooncake => mooncake::write(trace),
        TraceFormat::Aiperf => mooncake::write_aiperf(trace),
        TraceFormat::Bailian => bailian::write(trace),
    }
}
/// Reads tokentap JSONL (header first), v2 or v1.
pub fn read_tokentap(text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (index, first) = lines.next().ok_or(TraceError::Empty)?;
    let header: trace::TraceHeader = serde_json::from_str(first).map_err(|e| TraceError::Line {
        line: index + 1,
        message: format!("not a trace header: {e}"),
    })?;
    if header.schema != trace::SCHEMA && header.schema != trace::SCHEMA_V1 {
        return Err(TraceError::Schema {
            found: header.schema,
        });
    }
    let mut requests = Vec::new();
    let mut lines_of = Vec::new();
    for (index, line) in lines {
        if requests.len() >= trace::MAX_REQUESTS {
            return Err(TraceError::TooLarge);
        }
        same_format(line, LineKind::Tokentap, index + 1)?;
        let request: trace::TraceRequest =
            serde_json::from_str(line).map_err(|e| TraceError::Line {
                line: index + 1,
                message: e.to_string(),
            })?;
        requests.push(request);
        lines_of.push(index + 1);
    }
    super::sessions::check(&requests, &lines_of)?;
    let mut trace = Trace::new(&header.origin, header.start, requests);
    trace.header.block_tokens = header.block_tokens.max(1);
    Ok(trace)
}
