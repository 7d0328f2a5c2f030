//! The Bailian (Alibaba) trace format, as AIPerf reads it: JSON Lines, per request `chat_id`,
//! `parent_chat_id` (−1 for a session's first request), `turn`, `type`, `timestamp` (seconds),
//! `input_length` (the kept history included), `output_length` and `hash_ids` (one id per
//! 16-token block). Requests reached from the same root through `parent_chat_id` form one
//! session, whose id is the root's `chat_id`.
//!
//! Read: a chain of parents that comes back to a request, a request that starts before its
//! parent, and a `chat_id` given twice are errors naming the line; a parent not in the file
//! makes the request the first of its own session. Written: one `chat_id` per request in
//! arrival order, each later turn's parent the session's previous turn, block ids cut to 16
//! tokens (a block of the trace's `block_tokens` becomes that many 16-token ids).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::line_kind::{same_format, LineKind};
use super::sessions::{roots, SessionCursor};
use super::trace::{push_line, SessionTurn, Trace, TraceError, TraceRequest, MAX_REQUESTS};

/// Tokens per Bailian `hash_ids` entry.
pub const BAILIAN_BLOCK_TOKENS: u64 = 16;

/// One line of a Bailian trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BailianLine {
    pub chat_id: i64,
    #[serde(default = "root")]
    pub parent_chat_id: i64,
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

fn root() -> i64 {
    -1
}

/// Reads Bailian JSONL into a trace (blank lines skipped).
pub fn read(text: &str) -> Result<Trace, TraceError> {
    let mut parsed: Vec<(usize, BailianLine)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if parsed.len() >= MAX_REQUESTS {
            return Err(TraceError::TooLarge);
        }
        let error = |message: String| TraceError::Line {
            line: index + 1,
            message,
        };
        same_format(line, LineKind::Bailian, index + 1)?;
        let entry: BailianLine = serde_json::from_str(line)
            .map_err(|e| error(format!("not a Bailian trace line: {e}")))?;
        if !(entry.timestamp.is_finite() && entry.timestamp >= 0.0) {
            return Err(error(format!(
                "timestamp {} is not a count of seconds{}",
                entry.timestamp,
                if entry.timestamp < 0.0 {
                    " (it is negative)"
                } else {
                    ""
                }
            )));
        }
        parsed.push((index + 1, entry));
    }
    if parsed.is_empty() {
        return Err(TraceError::Empty);
    }
    let ids: Vec<String> = parsed.iter().map(|(_, l)| l.chat_id.to_string()).collect();
    let parents: Vec<Option<String>> = parsed
        .iter()
        .map(|(_, l)| (l.parent_chat_id >= 0).then(|| l.parent_chat_id.to_string()))
        .collect();
    let mut line_of: HashMap<&str, usize> = HashMap::with_capacity(parsed.len());
    for (i, id) in ids.iter().enumerate() {
        if let Some(first) = line_of.insert(id, i) {
            return Err(TraceError::Line {
                line: parsed[i].0,
                message: format!(
                    "chat_id {id} is given twice (first on line {})",
                    parsed[first].0
                ),
            });
        }
    }
    let nodes: Vec<(usize, &str, Option<&str>)> = parsed
        .iter()
        .zip(&ids)
        .zip(&parents)
        .map(|(((line, _), id), parent)| (*line, id.as_str(), parent.as_deref()))
        .collect();
    let sessions = roots(&nodes, "chat_id")?;
    for (i, (line, entry)) in parsed.iter().enumerate() {
        let Some(&parent) = parents[i].as_deref().and_then(|p| line_of.get(p)) else {
            continue;
        };
        let (parent_line, parent_entry) = &parsed[parent];
        if entry.timestamp < parent_entry.timestamp {
            return Err(TraceError::Line {
                line: *line,
                message: format!(
                    "chat {} of session {} starts at {} s, before its parent chat {} (line \
                     {parent_line}) at {} s",
                    entry.chat_id,
                    sessions[i],
                    entry.timestamp,
                    parent_entry.chat_id,
                    parent_entry.timestamp
                ),
            });
        }
    }
    let first = parsed
        .iter()
        .map(|(_, l)| l.timestamp)
        .fold(f64::INFINITY, f64::min);
    let first = if first.is_finite() { first } else { 0.0 };
    let requests = parsed
        .iter()
        .zip(sessions)
        .map(|((_, entry), session)| TraceRequest {
            // Saturating float → integer conversion: a huge timestamp stays huge, not UB.
            at_ms: ((entry.timestamp - first) * 1000.0).round() as u64,
            route: None,
            model: None,
            stream: true,
            prompt_tokens: entry.input_length,
            cached_tokens: None,
            max_tokens: Some(entry.output_length),
            output_tokens: entry.output_length,
            outcome: None,
            hash_ids: entry.hash_ids.clone(),
            turn: SessionTurn {
                session: Some(session.to_string()),
                input: (entry.parent_chat_id < 0).then(|| "first".to_string()),
                ..SessionTurn::default()
            },
        })
        .collect();
    // Turns are numbered by arrival within each session (`Trace::new`): a branching
    // conversation's own `turn` numbers can repeat.
    let mut trace = Trace::new("bailian", None, requests);
    trace.header.block_tokens = BAILIAN_BLOCK_TOKENS;
    Ok(trace)
}

/// The trace as Bailian JSONL.
pub fn write(trace: &Trace) -> String {
    let mut out = String::new();
    let mut cursor = SessionCursor::default();
    for request in &trace.requests {
        push_line(
            &mut out,
            &line_of(request, trace.header.block_tokens, &mut cursor),
        );
    }
    out
}

/// One request's Bailian line, given its trace's block size and what `cursor` remembers of
/// its session.
pub fn line_of(
    request: &TraceRequest,
    block_tokens: u64,
    cursor: &mut SessionCursor,
) -> BailianLine {
    let block_tokens = block_tokens.max(1);
    // A block of the trace becomes this many 16-token ids (1 where it is not a multiple).
    let split = if block_tokens % BAILIAN_BLOCK_TOKENS == 0 {
        block_tokens / BAILIAN_BLOCK_TOKENS
    } else {
        1
    };
    let number = cursor.written;
    let previous = cursor.advance(request);
    let covered = if split > 1 {
        usize::try_from(request.prompt_tokens.div_ceil(BAILIAN_BLOCK_TOKENS)).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    let hash_ids = request
        .hash_ids
        .iter()
        .flat_map(|id| (0..split).map(move |k| id.saturating_mul(split).saturating_add(k)))
        .take(covered)
        .collect();
    let chat = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    BailianLine {
        chat_id: chat(number),
        parent_chat_id: previous.map_or(-1, |p| chat(p.number)),
        timestamp: request.at_ms as f64 / 1000.0,
        input_length: request.prompt_tokens,
        output_length: request.output_tokens,
        kind: Some("text".to_string()),
        turn: Some(request.turn.turn.unwrap_or(1)),
        hash_ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AIPerf's documented example (docs/tutorials/bailian-trace.md), with block ids.
    const EXAMPLE: &str = r#"{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521, "output_length": 132, "type": "text", "turn": 1, "hash_ids": [1089, 1090, 1091]}
{"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 400, "output_length": 80, "type": "text", "turn": 2, "hash_ids": [1089, 1090]}
{"chat_id": 7, "parent_chat_id": -1, "timestamp": 61.5, "input_length": 16, "output_length": 1, "type": "search", "turn": 1, "hash_ids": [5]}
"#;

    #[test]
    fn the_documented_example_is_two_sessions_and_writes_back() {
        let trace = crate::workload::read_trace(EXAMPLE).unwrap();
        assert_eq!(trace.header.origin, "bailian");
        assert_eq!(trace.header.block_tokens, 16);
        let [a, other, b] = [&trace.requests[0], &trace.requests[1], &trace.requests[2]];
        assert_eq!((a.at_ms, other.at_ms, b.at_ms), (0, 386, 1386));
        assert_eq!(a.turn.session.as_deref(), Some("159"));
        assert_eq!(b.turn.session.as_deref(), Some("159"));
        assert_eq!(other.turn.session.as_deref(), Some("7"));
        assert_eq!(
            (a.turn.turn, b.turn.turn, other.turn.turn),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!(b.hash_ids, a.hash_ids[..2]);
        assert_eq!((b.prompt_tokens, b.output_tokens), (400, 80));
        let again = crate::workload::read_trace(&write(&trace)).unwrap();
        let sessions = |t: &Trace| -> Vec<(u64, Option<u32>, Vec<u64>)> {
            t.requests
                .iter()
                .map(|r| (r.at_ms, r.turn.turn, r.hash_ids.clone()))
                .collect()
        };
        assert_eq!(sessions(&again), sessions(&trace));
        assert_eq!(
            again.requests[2].turn.session,
            again.requests[0].turn.session
        );
    }

    #[test]
    fn cycles_early_turns_and_repeated_ids_name_their_line() {
        let cycle = "{\"chat_id\": 1, \"parent_chat_id\": 2, \"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}\n\
                     {\"chat_id\": 2, \"parent_chat_id\": 1, \"timestamp\": 2, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(cycle).unwrap_err().to_string();
        assert!(
            error.starts_with("line 1:") && error.contains("cycle"),
            "{error}"
        );
        let early = "{\"chat_id\": 1, \"timestamp\": 5, \"input_length\": 1, \"output_length\": 1}\n\
                     {\"chat_id\": 2, \"parent_chat_id\": 1, \"timestamp\": 4, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(early).unwrap_err().to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("before its parent"),
            "{error}"
        );
        let twice = "{\"chat_id\": 1, \"timestamp\": 5, \"input_length\": 1, \"output_length\": 1}\n\n\
                     {\"chat_id\": 1, \"timestamp\": 6, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(twice).unwrap_err().to_string();
        assert!(
            error.starts_with("line 3:") && error.contains("twice"),
            "{error}"
        );
        let mixed =
            "{\"chat_id\": 1, \"timestamp\": 5, \"input_length\": 1, \"output_length\": 1}\n\
                     {\"timestamp\": 6, \"input_length\": 1, \"output_length\": 1}\n";
        let error = crate::workload::read_trace(mixed).unwrap_err().to_string();
        assert!(
            error.starts_with("line 2:") && error.contains("mixes formats"),
            "{error}"
        );
    }
}
