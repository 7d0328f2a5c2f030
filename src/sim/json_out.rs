//! Hand-written JSON output and wall-clock seconds for the simulator's bodies. Written by hand,
//! not through serde, because the servers' exact bytes (key order, compact separators, raw
//! UTF-8) are the product and no per-chunk `serde_json::Value` may be built.
use std::fmt::Write as _;

/// Append `s` as a JSON string (compact, raw UTF-8 like orjson/msgspec/pydantic).
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whole seconds since the Unix epoch (0 if the clock is before it): `created` fields.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Fractional seconds since the Unix epoch: sglang's `response_sent_to_client_ts`.
pub fn unix_seconds_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
