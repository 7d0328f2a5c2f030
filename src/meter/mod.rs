//! Metering: in-flight tracking, buckets, the per-request timeline and records, and the sinks
//! records are handed to. This file only declares and re-exports: the core (`Meter`,
//! `RequestMeter`, `RecordSink`) is `metering.rs`.

pub mod bounds;
pub mod buckets;
pub mod conversation;
pub mod identity;
pub mod inflight;
pub mod labels;
mod metering;
pub mod priority;
pub mod record;
pub mod server_state;
pub mod slo;
pub mod striped;
pub mod timeline;
pub mod turn_stats;

pub use labels::RequestLabels;
pub use metering::{
    ExpectedCell, Meter, RecordSink, RequestMeter, RequestStart, Usage, MAX_TOKENS_PER_EVENT,
    MAX_TOKENS_PER_REQUEST, PROMPT_BYTES_PER_TOKEN,
};
