//! The workload: capture of production request shapes, the trace format they are written in,
//! interchange with public trace formats, and their replay.
//!
//! - `capture.rs`: the [`capture::WorkloadCapture`] sink (opt-in, `[workload] capture`).
//! - `export.rs`: a capture's export written page by page as it is read (bounded memory).
//! - `trace.rs`: the versioned JSONL trace (`tokentap.workload/v2`, v1 still read).
//! - `formats.rs`: which format a file (and each of its lines) is in; writing each.
//! - `sessions.rs`: a trace's sessions: their checks, turn links and end-to-start gaps.
//! - `mooncake.rs`, `bailian.rs`, `azure.rs`: the Mooncake JSONL (with AIPerf's sessions),
//!   Bailian JSONL and Azure CSV trace formats.
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
pub mod bailian;
pub mod capture;
pub mod export;
pub mod formats;
pub mod line_kind;
pub mod mooncake;
pub mod replay;
pub mod sessions;
pub mod speed;
pub mod trace;

pub use capture::WorkloadCapture;
pub use formats::{read_trace, render, TraceFormat};
pub use trace::{SessionTurn, Trace, TraceError, TraceRequest};
