//! The Mooncake trace format (JSON Lines, as read by AIPerf's `mooncake_trace` mode): per
//! request `timestamp` (milliseconds from the first request), `input_length`,
//! `output_length` and `hash_ids` (one id per 512-token prompt block; a shared id is a shared
//! prefix). Other keys are ignored on reading.
//!
//! AIPerf's sessions are read and written too: a line with `session_id` is a turn of that
//! session (turns in file order); a later turn may give `delay` instead of `timestamp` — the
//! milliseconds from the session's previous turn's end to its start (AIPerf's end-to-start
//! delays), kept as the turn's `gap_ms`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::line_kind::{same_format, LineKind};
use super::sessions::{end_to_start_gap_ms, SessionCursor};
use super::trace::{push_line, SessionTurn, Trace, TraceError, TraceRequest, MAX_REQUESTS};

/// One line of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MooncakeLine {
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

/// One line of AIPerf's `mooncake_trace` with sessions, as read (either time may be absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AiperfLine {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<f64>,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

/// A session id as traces write it: a string or a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SessionId {
    Text(String),
    Number(u64),
}

impl SessionId {
    fn into_text(self) -> String {
        match self {
            SessionId::Text(text) => text,
            SessionId::Number(n) => n.to_string(),
        }
    }
}

/// The trace's requests as Mooncake JSONL, for replay tools that read that format.
pub fn write(trace: &Trace) -> String {
    let mut out = String::new();
    for request in &trace.requests {
        push_line(&mut out, &line_of(request));
    }
    out
}

/// One request's Mooncake line.
pub fn line_of(request: &TraceRequest) -> MooncakeLine {
    MooncakeLine {
        timestamp: request.at_ms as f64,
        input_length: request.prompt_tokens,
        output_length: request.output_tokens,
        hash_ids: request.hash_ids.clone(),
    }
}

/// The trace as AIPerf's `mooncake_trace` with sessions: a session's first turn (and a request
/// of no session) at its `timestamp`, each later turn at its end-to-start `delay`.
pub fn write_aiperf(trace: &Trace) -> String {
    let mut out = String::new();
    let mut cursor = SessionCursor::default();
    for request in &trace.requests {
        push_line(&mut out, &aiperf_line_of(request, &mut cursor));
    }
    out
}

/// One request's AIPerf line, given what `cursor` remembers of its session.
pub fn aiperf_line_of(request: &TraceRequest, cursor: &mut SessionCursor) -> AiperfLine {
    let previous = cursor.advance(request);
    let (timestamp, delay) = match &previous {
        Some(previous) => (None, Some(end_to_start_gap_ms(*previous, request) as f64)),
        None => (Some(request.at_ms as f64), None),
    };
    AiperfLine {
        session_id: request.turn.session.clone().map(SessionId::Text),
        timestamp,
        delay,
        input_length: request.prompt_tokens,
        output_length: request.output_tokens,
        hash_ids: request.hash_ids.clone(),
    }
}

/// Reads Mooncake JSONL into a trace (blank lines skipped), AIPerf's sessions included.
pub fn read(text: &str) -> Result<Trace, TraceError> {
    let mut requests: Vec<TraceRequest> = Vec::new();
    let mut lines = Vec::new();
    // Each session's latest turn: (its index in `requests`, its turn number).
    let mut latest: HashMap<String, (usize, u32)> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if requests.len() >= MAX_REQUESTS {
            return Err(TraceError::TooLarge);
        }
        let error = |message: String| TraceError::Line {
            line: index + 1,
            message,
        };
        same_format(line, LineKind::Mooncake, index + 1)?;
        let parsed: AiperfLine = serde_json::from_str(line)
            .map_err(|e| error(format!("not a Mooncake trace line: {e}")))?;
        let milliseconds = |name: &str, value: f64| {
            if value.is_finite() && value >= 0.0 {
                Ok(value)
            } else {
                Err(error(format!(
                    "{name} {value} is not a count of milliseconds{}",
                    if value < 0.0 { " (it is negative)" } else { "" }
                )))
            }
        };
        let session = parsed.session_id.map(SessionId::into_text);
        let previous = session.as_ref().and_then(|s| latest.get(s).copied());
        let delay = parsed.delay.map(|d| milliseconds("delay", d)).transpose()?;
        // Saturating float → integer conversions: a huge time stays huge, not UB.
        let at_ms = match (parsed.timestamp, delay, previous) {
            (Some(timestamp), _, _) => milliseconds("timestamp", timestamp)? as u64,
            (None, Some(delay), Some((before, _))) => {
                let before = &requests[before];
                before.at_ms.saturating_add(delay as u64)
            }
            (None, Some(_), None) => {
                return Err(error(match &session {
                    Some(session) => format!(
                        "delay on the first turn of session {session:?}: a delay counts from \
                         the session's previous turn"
                    ),
                    None => "delay without a session_id: a delay counts from the session's \
                             previous turn"
                        .to_string(),
                }))
            }
            (None, None, Some((before, _))) => requests[before].at_ms,
            (None, None, None) if session.is_some() => 0,
            (None, None, None) => return Err(error("no timestamp".to_string())),
        };
        let turn = session.as_ref().map(|s| {
            let number = previous.map_or(1, |(_, turn)| turn.saturating_add(1));
            latest.insert(s.clone(), (requests.len(), number));
            number
        });
        requests.push(TraceRequest {
            at_ms,
            route: None,
            model: None,
            stream: true,
            prompt_tokens: parsed.input_length,
            cached_tokens: None,
            max_tokens: Some(parsed.output_length),
            output_tokens: parsed.output_length,
            outcome: None,
            hash_ids: parsed.hash_ids,
            turn: SessionTurn {
                input: (turn == Some(1)).then(|| "first".to_string()),
                session,
                turn,
                gap_ms: delay.map(|d| d as u64),
                ..SessionTurn::default()
            },
        });
        lines.push(index + 1);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    super::sessions::check(&requests, &lines)?;
    let first = requests.iter().map(|r| r.at_ms).min().unwrap_or(0);
    for request in &mut requests {
        request.at_ms -= first;
    }
    let origin = if latest.is_empty() {
        "mooncake"
    } else {
        "aiperf"
    };
    Ok(Trace::new(origin, None, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}
{"timestamp": 0, "input_length": 7319, "output_length": 490, "hash_ids": [0, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]}
{"timestamp": 3052, "input_length": 7234, "output_length": 794, "hash_ids": [0, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42], "extra": 1}
"#;

    #[test]
    fn reads_the_published_shape_and_writes_it_back() {
        let trace = crate::workload::read_trace(SAMPLE).unwrap();
        assert_eq!(trace.header.origin, "mooncake");
        assert_eq!(trace.requests.len(), 3);
        let third = &trace.requests[2];
        assert_eq!(
            (third.at_ms, third.prompt_tokens, third.output_tokens),
            (3052, 7234, 794)
        );
        // Shared first block, renumbered densely in order of appearance.
        assert_eq!(trace.requests[1].hash_ids[..2], [0, 14]);
        let again = crate::workload::read_trace(&write(&trace)).unwrap();
        assert_eq!(again.requests, trace.requests);
    }

    #[test]
    fn bad_lines_are_named() {
        let error = crate::workload::read_trace(
            "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1}",
        )
        .unwrap_err();
        assert!(error.to_string().contains("line 1"), "{error}");
        assert!(crate::workload::read_trace("{\"timestamp\": 1}\n").is_err());
    }

    /// AIPerf's `mooncake_trace` with sessions (docs/benchmark-modes/trace-replay.md): a
    /// session's first turn at its timestamp, later turns at an end-to-start delay.
    const AIPERF: &str = r#"{"session_id": "a", "timestamp": 1000, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}
{"session_id": "b", "timestamp": 1500, "input_length": 300, "output_length": 20, "hash_ids": [9]}
{"session_id": "a", "delay": 2000, "input_length": 1200, "output_length": 26, "hash_ids": [46, 47, 48]}
"#;

    #[test]
    fn aiperf_sessions_read_as_turns_with_gaps_and_write_back() {
        let trace = crate::workload::read_trace(AIPERF).unwrap();
        assert_eq!(trace.header.origin, "aiperf");
        let [a1, b1, a2] = [&trace.requests[0], &trace.requests[1], &trace.requests[2]];
        assert_eq!((a1.at_ms, b1.at_ms, a2.at_ms), (0, 500, 2000));
        assert_eq!(
            (a1.turn.turn, a2.turn.turn, b1.turn.turn),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!(a2.turn.gap_ms, Some(2000));
        assert_eq!(a2.turn.session.as_deref(), Some("a"));
        let written = write_aiperf(&trace);
        assert!(
            written.lines().nth(2).unwrap().contains("\"delay\":2000.0"),
            "{written}"
        );
        let again = crate::workload::read_trace(&written).unwrap();
        assert_eq!(again.requests, trace.requests);
        let v2 = crate::workload::read_trace(&trace.to_jsonl()).unwrap();
        assert_eq!(v2.requests, trace.requests);
    }

    #[test]
    fn aiperf_bad_sessions_name_their_line() {
        let negative = "{\"session_id\": 1, \"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n\
                        {\"session_id\": 1, \"delay\": -5, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(negative)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("negative"),
            "{error}"
        );
        let first =
            "{\"session_id\": 1, \"delay\": 5, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(first).unwrap_err().to_string();
        assert!(
            error.starts_with("line 1:") && error.contains("first turn"),
            "{error}"
        );
        let early = "{\"session_id\": 1, \"timestamp\": 90, \"input_length\": 1, \"output_length\": 1}\n\
                     {\"session_id\": 1, \"timestamp\": 10, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(early).unwrap_err().to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("before the session"),
            "{error}"
        );
        let mixed = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n\
                     {\"chat_id\": 3, \"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(mixed).unwrap_err().to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("mixes formats"),
            "{error}"
        );
        let v2_negative = "{\"schema\":\"tokentap.workload/v2\",\"block_tokens\":512,\"origin\":\"capture\",\"requests\":1}\n\
                           {\"at_ms\":0,\"prompt_tokens\":1,\"output_tokens\":1,\"session\":\"s\",\"gap_ms\":-3}\n";
        let error = crate::workload::read_trace(v2_negative)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("negative"),
            "{error}"
        );
    }
}
