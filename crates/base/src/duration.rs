//! Durations as people write them in the configuration and on the command line: `500ms`,
//! `30s`, `5m`, `1h`, `7d`, `2.5s`, `0`; and seconds shown to people (`human_duration`).
//!
//! Hand-written because the error names the accepted forms (`500ms, 30s, 5m, 1h or 7d`), which
//! the configuration's messages rely on; `humantime` would also accept forms (`2days`,
//! `1h 30m`) the documentation does not promise.

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `1h`, `7d` (days of 24 h), `0` (zero).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| no_unit(text, "500ms, 30s, 5m, 1h or 7d"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: write e.g. 500ms, 30s, 5m, 1h or 7d"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        "d" => number * 86_400.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`: use ms, s, m, h or d"
            ))
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is out of range"))
}

/// The one message for a bare number where a duration is wanted (`500` from a file, an
/// environment variable or `--set`): it has no unit, and `examples` are the forms the key takes
/// (`"500ms, 2s or 1m"`).
pub fn no_unit(text: &str, examples: &str) -> String {
    format!("`{text}` has no unit: write e.g. {examples}")
}

/// `1h 02m`, `3m 05s`, `42s`.
pub fn human_duration(seconds: f64) -> String {
    let total = seconds.max(0.0).round() as u64;
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    if h > 0 {
        format!("{h}h {m:02}m")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_up_to_days() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("7w")
            .unwrap_err()
            .contains("ms, s, m, h or d"));
    }
}
