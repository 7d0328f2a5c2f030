//! The Mooncake trace format (JSON Lines, as read by AIPerf's `mooncake_trace` mode): per
//! request `timestamp` (milliseconds from the first request), `input_length`,
//! `output_length` and `hash_ids` (one id per 512-token prompt block; a shared id is a shared
//! prefix). Other keys are ignored on reading.

use serde::{Deserialize, Serialize};

use super::trace::{push_line, Trace, TraceError, TraceRequest, MAX_REQUESTS};

/// One line of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MooncakeLine {
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
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

/// Reads Mooncake JSONL into a trace (blank lines skipped).
pub fn read(text: &str) -> Result<Trace, TraceError> {
    let mut requests = Vec::new();
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
        let parsed: MooncakeLine = serde_json::from_str(line)
            .map_err(|e| error(format!("not a Mooncake trace line: {e}")))?;
        if !(parsed.timestamp.is_finite() && parsed.timestamp >= 0.0) {
            return Err(error(format!(
                "timestamp {} is not a count of milliseconds",
                parsed.timestamp
            )));
        }
        requests.push(TraceRequest {
            // Saturating float → integer conversion: a huge timestamp stays huge, not UB.
            at_ms: parsed.timestamp as u64,
            route: None,
            model: None,
            stream: true,
            prompt_tokens: parsed.input_length,
            cached_tokens: None,
            max_tokens: Some(parsed.output_length),
            output_tokens: parsed.output_length,
            outcome: None,
            hash_ids: parsed.hash_ids,
        });
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    let first = requests.iter().map(|r| r.at_ms).min().unwrap_or(0);
    for request in &mut requests {
        request.at_ms -= first;
    }
    Ok(Trace::new("mooncake", None, requests))
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
}
