//! The workload: capture of production request shapes, the trace format they are written in,
//! interchange with public trace formats, and their replay.
//!
//! - `capture.rs`: the [`capture::WorkloadCapture`] sink (opt-in, `[workload] capture`).
//! - `export.rs`: a capture's export written page by page as it is read (bounded memory).
//! - `trace.rs`: the versioned JSONL trace (`tokentap.workload/v1`), reading any known format.
//! - `mooncake.rs`, `azure.rs`: the Mooncake JSONL and Azure CSV trace formats.
//! - `replay.rs`: the open-loop replay of a trace through the proxy's data path, tagged
//!   synthetic, and its per-request tally (SLO verdicts, TTFTs).
//! - `speed.rs`: `--find-speed`, the bounded search for the largest replay speed-up at which
//!   the workload still meets an SLO, and its report.
//!
//! The commands are `app::workload` (`tokentap workload export|convert`) and `app::replay`
//! (`tokentap replay`, against a server or an embedded simulator).
//!
//! Sits beside `sweep`: it reads records through the meter's sink seam and the store; nothing
//! below it imports it.

pub mod azure;
pub mod capture;
pub mod export;
pub mod mooncake;
pub mod replay;
pub mod speed;
pub mod trace;

pub use capture::WorkloadCapture;
pub use trace::{Trace, TraceError, TraceRequest};

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
