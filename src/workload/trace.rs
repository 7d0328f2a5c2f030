//! The workload trace (schema `tokentap.workload/v2`, `v1` still read): versioned JSON Lines,
//! one header line then one line per request in arrival order. docs/workload.md defines every
//! field.
//!
//! A trace holds shapes only: arrival offsets, token counts, route, model, outcome, prefix
//! block ids (dense small integers, renumbered per trace in order of first appearance, so
//! equal ids mean a shared prompt prefix and nothing else) and, from v2, each request as a
//! turn of its session ([`SessionTurn`]: the session's hashed id, turn index, end-to-start gap,
//! first-byte and end times). Reading accepts any format tokentap knows (`super::read_trace`)
//! and never panics; the session structure is checked by `sessions.rs`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// The schema this build writes (and reads).
pub const SCHEMA: &str = "tokentap.workload/v2";

/// The schema before sessions, still read (its lines are v2 lines without the session keys).
pub const SCHEMA_V1: &str = "tokentap.workload/v1";

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
    /// The request as a turn of its session, and its own timing (v2; all absent in v1).
    #[serde(flatten)]
    pub turn: SessionTurn,
}

/// One request as a turn of its session, and when its answer began and ended (schema v2).
/// Every key is optional: absent where the source did not know it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTurn {
    /// The session: a salted hash (captures), or the source trace's own id (conversions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The agent (or sub-agent) that sent it, and the agent that started that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// 1 for the session's first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// What this turn's input followed: `first`, `user` (an answer without a tool call),
    /// `tool` (an answer that called a tool) or `overlap` (an answer still running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Milliseconds from the previous turn's end (last byte) to this turn's start.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "milliseconds"
    )]
    pub gap_ms: Option<u64>,
    /// Milliseconds from this request's start to the first byte of its answer, and to its end
    /// (last byte).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "milliseconds"
    )]
    pub first_byte_ms: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "milliseconds"
    )]
    pub end_ms: Option<u64>,
    /// How the answer ended where known (`tool_calls` when it called a tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// The `input` of the session's next turn, where the trace has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_input: Option<String>,
}

/// A count of milliseconds: a negative or fractional number is refused by name (serde's own
/// message for a negative `u64` does not say what was wrong with the trace).
fn milliseconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let value = Option::<f64>::deserialize(d)?;
    match value {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some(ms.round() as u64)),
        Some(ms) => Err(serde::de::Error::custom(format!(
            "{ms} ms is negative: a time or gap cannot be"
        ))),
    }
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
    #[error("the trace has schema {found:?}; this tokentap reads {SCHEMA} and {SCHEMA_V1}")]
    Schema { found: String },
    #[error("the trace has more than {MAX_REQUESTS} requests")]
    TooLarge,
}

impl Trace {
    /// Builds a trace from requests (sorted by arrival here), renumbering prefix ids densely.
    /// Each session's turns are numbered in arrival order where the source did not number
    /// them, and each turn learns its successor's input kind (`next_input`).
    pub fn new(origin: &str, start: Option<String>, mut requests: Vec<TraceRequest>) -> Trace {
        requests.sort_by_key(|r| r.at_ms);
        renumber_blocks(&mut requests);
        link_turns(&mut requests);
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

/// Numbers each session's turns in arrival order where the source did not (the requests are
/// sorted by arrival), and gives each turn its successor's input kind as `next_input`.
pub fn link_turns(requests: &mut [TraceRequest]) {
    let mut latest: HashMap<String, (usize, u32)> = HashMap::new();
    for i in 0..requests.len() {
        let Some(session) = requests[i].turn.session.clone() else {
            continue;
        };
        let previous = latest.get(&session).copied();
        let turn = match (requests[i].turn.turn, previous) {
            (Some(turn), _) => turn,
            (None, Some((_, turn))) => turn.saturating_add(1),
            (None, None) => 1,
        };
        requests[i].turn.turn = Some(turn);
        if let Some((before, _)) = previous {
            if requests[before].turn.next_input.is_none() {
                requests[before].turn.next_input = requests[i].turn.input.clone();
            }
        }
        latest.insert(session, (i, turn));
    }
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
            turn: SessionTurn::default(),
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
        assert!(text.starts_with("{\"schema\":\"tokentap.workload/v2\""));
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
