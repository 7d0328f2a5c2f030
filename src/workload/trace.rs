//! The workload trace (schema `tokentap.workload/v1`): versioned JSON Lines, one header line
//! then one line per request in arrival order. docs/workload.md defines every field.
//!
//! A trace holds shapes only: arrival offsets, token counts, route, model, outcome and prefix
//! block ids (dense small integers, renumbered per trace in order of first appearance, so
//! equal ids mean a shared prompt prefix and nothing else). Reading accepts any of the three
//! formats tokentap knows (`super::read_trace`) never panics.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The schema this build writes and reads.
pub const SCHEMA: &str = "tokentap.workload/v1";

/// Tokens per prefix block, as in the Mooncake trace format.
pub const BLOCK_TOKENS: u64 = 512;

/// Most requests a trace may hold when read (a larger file is refused, not truncated).
pub const MAX_REQUESTS: usize = 10_000_000;

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub schema: String,
    /// Tokens each `hash_ids` entry stands for.
    pub block_tokens: u64,
    /// Where the requests came from: `capture`, `mooncake` or `azure`.
    pub origin: String,
    /// Wall-clock time of the first request (RFC 3339), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    pub requests: u64,
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Milliseconds from the first request's arrival.
    pub at_ms: u64,
    /// Metered route label (`chat_completions`, `completions`, `generate`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default = "streamed")]
    pub stream: bool,
    pub prompt_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    pub output_tokens: u64,
    /// How the request ended (`ok`, `client_aborted`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// One id per prompt block of `block_tokens`; a shared id is a shared prefix.
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

fn streamed() -> bool {
    true
}

/// A whole trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub requests: Vec<TraceRequest>,
}

/// Why a trace could not be read; each names the line.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("the trace is empty")]
    Empty,
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("the trace has schema {found:?}; this tokentap reads {SCHEMA}")]
    Schema { found: String },
    #[error("the trace has more than {MAX_REQUESTS} requests")]
    TooLarge,
}

impl Trace {
    /// Builds a trace from requests (sorted by arrival here), renumbering prefix ids densely.
    pub fn new(origin: &str, start: Option<String>, mut requests: Vec<TraceRequest>) -> Trace {
        requests.sort_by_key(|r| r.at_ms);
        renumber_blocks(&mut requests);
        Trace {
            header: TraceHeader {
                schema: SCHEMA.to_string(),
                block_tokens: BLOCK_TOKENS,
                origin: origin.to_string(),
                start,
                requests: requests.len() as u64,
            },
            requests,
        }
    }

    /// The trace as JSON Lines (header first).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        push_line(&mut out, &self.header);
        for request in &self.requests {
            push_line(&mut out, request);
        }
        out
    }
}

/// Appends `value` as one JSON line.
pub fn push_line<T: Serialize>(out: &mut String, value: &T) {
    // Plain data with string keys: serialising cannot fail.
    if let Ok(line) = serde_json::to_string(value) {
        out.push_str(&line);
        out.push('\n');
    }
}

/// Renumbers prefix ids as 0, 1, 2, … in order of first appearance: the ids stay a sharing
/// pattern, and captured fingerprints (salted hashes) never leave the process.
pub fn renumber_blocks(requests: &mut [TraceRequest]) {
    let mut dense: HashMap<u64, u64> = HashMap::new();
    for request in requests {
        for id in &mut request.hash_ids {
            let next = dense.len() as u64;
            *id = *dense.entry(*id).or_insert(next);
        }
    }
}

/// Reads tokentap JSONL (header first).
pub fn read_tokentap(text: &str) -> Result<Trace, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (index, first) = lines.next().ok_or(TraceError::Empty)?;
    let header: TraceHeader = serde_json::from_str(first).map_err(|e| TraceError::Line {
        line: index + 1,
        message: format!("not a trace header: {e}"),
    })?;
    if header.schema != SCHEMA {
        return Err(TraceError::Schema {
            found: header.schema,
        });
    }
    let mut requests = Vec::new();
    for (index, line) in lines {
        if requests.len() >= MAX_REQUESTS {
            return Err(TraceError::TooLarge);
        }
        let request: TraceRequest = serde_json::from_str(line).map_err(|e| TraceError::Line {
            line: index + 1,
            message: e.to_string(),
        })?;
        requests.push(request);
    }
    let mut trace = Trace::new(&header.origin, header.start, requests);
    trace.header.block_tokens = header.block_tokens.max(1);
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(at_ms: u64, hash_ids: Vec<u64>) -> TraceRequest {
        TraceRequest {
            at_ms,
            route: Some("chat_completions".into()),
            model: Some("m".into()),
            stream: true,
            prompt_tokens: 1000,
            cached_tokens: Some(512),
            max_tokens: Some(64),
            output_tokens: 64,
            outcome: Some("ok".into()),
            hash_ids,
        }
    }

    #[test]
    fn round_trips_and_renumbers_prefix_ids_in_order_of_appearance() {
        let trace = Trace::new(
            "capture",
            Some("2026-01-01T00:00:00Z".into()),
            vec![
                request(40, vec![u64::MAX, 7]),
                request(0, vec![u64::MAX, 3]),
            ],
        );
        assert_eq!(trace.requests[0].hash_ids, vec![0, 1]);
        assert_eq!(trace.requests[1].hash_ids, vec![0, 2]);
        let text = trace.to_jsonl();
        assert!(text.starts_with("{\"schema\":\"tokentap.workload/v1\""));
        assert_eq!(crate::workload::read_trace(&text).unwrap(), trace);
    }

    #[test]
    fn a_newer_schema_is_refused_by_name() {
        let text = "{\"schema\":\"tokentap.workload/v9\",\"block_tokens\":512,\"origin\":\"capture\",\"requests\":0}\n";
        assert!(matches!(
            crate::workload::read_trace(text),
            Err(TraceError::Schema { .. })
        ));
        assert!(matches!(
            crate::workload::read_trace("  \n"),
            Err(TraceError::Empty)
        ));
    }
}
