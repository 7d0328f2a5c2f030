//! Durations as people write them in the configuration and on the command line: `500ms`,
//! `30s`, `5m`, `1h`, `2.5s`, `0`.
//!
//! Hand-written because the error names the accepted forms (`500ms, 30s, 5m or 1h`), which
//! the configuration's messages rely on; `humantime` would also accept forms (`2days`,
//! `1h 30m`) the documentation does not promise.

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `1h`, `0` (zero).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit: write e.g. 500ms, 30s, 5m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: write e.g. 500ms, 30s, 5m or 1h"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use ms, s, m or h"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is out of range"))
}
