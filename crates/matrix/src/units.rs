//! How numbers look on a matrix page, both ways: `8K` contexts, `11.4K` and `9,111.0` rates,
//! `718 ms`, `5.6 ms`, `30.0 s`, `4,096`, and `—` for a missing value.
//!
//! Every formatter here is idempotent through its parser (format → parse → format gives the same
//! text), which is what makes Markdown → import → Markdown byte-identical. Parsing is exact: the
//! decimal text is shifted by its suffix as text and parsed once, so `11.4K` is the f64 nearest
//! 11400, not 11.4 × 1000. Nothing here panics on any input.

/// The placeholder the pages print for a missing value.
pub const MISSING: &str = "—";

/// A page value that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}, found {found:?}")]
pub struct ValueError {
    pub expected: &'static str,
    pub found: String,
}

fn value_error(expected: &'static str, found: &str) -> ValueError {
    ValueError {
        expected,
        found: found.to_owned(),
    }
}

/// Context label: multiples of 1024 print as `<n>K` (`8K` = 8192, `1019K` = 1043456,
/// `1024K` = 1048576); anything else prints as the plain integer.
pub fn context_label(context_tokens: u64) -> String {
    if context_tokens >= 1024 && context_tokens % 1024 == 0 {
        format!("{}K", context_tokens / 1024)
    } else {
        context_tokens.to_string()
    }
}

/// Parses a context label: `<n>K` or `<n>k` (n × 1024) or a plain integer. The suffix is
/// case-insensitive because people type `--contexts 8k` and mean 8K; the page prints `K`.
pub fn parse_context(text: &str) -> Result<u64, ValueError> {
    const EXPECTED: &str = "a context like 8K (× 1024 tokens) or a token count";
    let (digits, multiplier) = match text.strip_suffix(['K', 'k']) {
        Some(digits) => (digits, 1024u64),
        None => (text, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(value_error(EXPECTED, text));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| value_error(EXPECTED, text))
}

/// Inserts thousands separators into a plain decimal rendering (`-1234567.5` → `-1,234,567.5`).
fn group_thousands(plain: &str) -> String {
    let (sign, unsigned) = match plain.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", plain),
    };
    let (integer, fraction) = match unsigned.find('.') {
        Some(dot) => (&unsigned[..dot], &unsigned[dot..]),
        None => (unsigned, ""),
    };
    if !integer.bytes().all(|b| b.is_ascii_digit()) {
        // inf / NaN: nothing to group.
        return plain.to_owned();
    }
    let mut grouped = String::with_capacity(plain.len() + integer.len() / 3);
    for (index, digit) in integer.chars().enumerate() {
        if index > 0 && (integer.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{sign}{grouped}{fraction}")
}

/// `value` with `places` decimals and thousands separators: `1,335.0`, `5,110`.
pub fn format_decimal(value: f64, places: usize) -> String {
    group_thousands(&format!("{value:.places$}"))
}

/// A share (0–1) as a percentage with one decimal: `12.3%`.
pub fn format_percent(share: f64) -> String {
    format!("{}%", format_decimal(share * 100.0, 1))
}

/// Parses `12.3%` back into a share (0.123).
pub fn parse_percent(text: &str) -> Result<f64, ValueError> {
    const EXPECTED: &str = "a percentage like 12.3%";
    let number = text
        .strip_suffix('%')
        .ok_or_else(|| value_error(EXPECTED, text))?;
    parse_decimal(number)
        .map(|percent| percent / 100.0)
        .map_err(|_| value_error(EXPECTED, text))
}

/// An integer count with thousands separators: `5,110`.
pub fn format_count(value: u64) -> String {
    group_thousands(&value.to_string())
}

/// Checks `1,234,567.89`-style text (separators optional but, when present, every three digits)
/// and returns it without separators.
fn strip_separators(text: &str, expected: &'static str) -> Result<String, ValueError> {
    let (integer, fraction) = match text.find('.') {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    if integer.is_empty() || integer.starts_with(',') || integer.ends_with(',') {
        return Err(value_error(expected, text));
    }
    if integer.contains(',') {
        let mut groups = integer.split(',');
        let first = groups.next().unwrap_or_default();
        if first.is_empty() || first.len() > 3 || groups.any(|group| group.len() != 3) {
            return Err(value_error(expected, text));
        }
    }
    let digits: String = integer.chars().filter(|c| *c != ',').collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(value_error(expected, text));
    }
    match fraction {
        None => Ok(digits),
        Some(fraction) if !fraction.is_empty() && fraction.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(format!("{digits}.{fraction}"))
        }
        Some(_) => Err(value_error(expected, text)),
    }
}

/// Parses a non-negative decimal with optional thousands separators: `1,335.0`, `5.6`, `30`.
pub fn parse_decimal(text: &str) -> Result<f64, ValueError> {
    const EXPECTED: &str = "a number like 1,335.0";
    let plain = strip_separators(text, EXPECTED)?;
    plain
        .parse::<f64>()
        .ok()
        .filter(|value| value.is_finite())
        .ok_or_else(|| value_error(EXPECTED, text))
}

/// Parses an integer count with optional thousands separators: `5,110`.
pub fn parse_count(text: &str) -> Result<u64, ValueError> {
    const EXPECTED: &str = "a whole number like 5,110";
    let plain = strip_separators(text, EXPECTED)?;
    if plain.contains('.') {
        return Err(value_error(EXPECTED, text));
    }
    plain
        .parse::<u64>()
        .map_err(|_| value_error(EXPECTED, text))
}

/// Moves the decimal point of `plain` (digits with at most one `.`) right by `shift` places, as text.
fn shift_decimal(plain: &str, shift: usize) -> String {
    let (integer, fraction) = match plain.find('.') {
        Some(dot) => (&plain[..dot], &plain[dot + 1..]),
        None => (plain, ""),
    };
    if fraction.len() <= shift {
        format!("{integer}{fraction}{}", "0".repeat(shift - fraction.len()))
    } else {
        format!("{integer}{}.{}", &fraction[..shift], &fraction[shift..])
    }
}

/// Whether a rate prints with the `K` suffix: when its one-decimal rounding reaches 10,000.
fn uses_thousands_suffix(value: f64) -> bool {
    format!("{value:.1}")
        .parse::<f64>()
        .is_ok_and(|rounded| rounded >= 10_000.0)
}

/// A tok/s figure as the "All measurements" table prints it: below 10,000 with one decimal and
/// separators (`9,111.0`, `170.4`), from 10,000 in thousands with one decimal, a trailing `.0`
/// dropped (`11.4K`, `15K`).
pub fn format_rate(value: f64) -> String {
    if uses_thousands_suffix(value) {
        let thousands = format_decimal(value / 1000.0, 1);
        let trimmed = thousands.strip_suffix(".0").unwrap_or(&thousands);
        format!("{trimmed}K")
    } else {
        format_decimal(value, 1)
    }
}

/// A tok/s figure as the seed page's prefill chart labels print it: like [`format_rate`] from
/// 10,000, below that a whole number (`9,111`).
pub fn format_rate_compact(value: f64) -> String {
    if uses_thousands_suffix(value) {
        format_rate(value)
    } else {
        format_decimal(value, 0)
    }
}

/// Parses a rate: `170.4`, `9,111.0`, `11.4K` (× 1000), `1.2M` (× 1,000,000).
pub fn parse_rate(text: &str) -> Result<f64, ValueError> {
    const EXPECTED: &str = "a rate like 170.4, 9,111.0 or 11.4K";
    let (number, shift) = if let Some(number) = text.strip_suffix('K') {
        (number, 3)
    } else if let Some(number) = text.strip_suffix('M') {
        (number, 6)
    } else {
        (text, 0)
    };
    let plain = strip_separators(number, EXPECTED)?;
    shift_decimal(&plain, shift)
        .parse::<f64>()
        .ok()
        .filter(|value| value.is_finite())
        .ok_or_else(|| value_error(EXPECTED, text))
}

/// Milliseconds as a whole number: `718 ms`, `108,126 ms`.
pub fn format_ms_whole(value: f64) -> String {
    format!("{} ms", format_decimal(value, 0))
}

/// Milliseconds with one decimal: `5.6 ms`.
pub fn format_ms_tenths(value: f64) -> String {
    format!("{} ms", format_decimal(value, 1))
}

/// Seconds with one decimal: `30.0 s`.
pub fn format_seconds_tenths(value: f64) -> String {
    format!("{} s", format_decimal(value, 1))
}

/// Parses `<number> <unit>` (e.g. `718 ms`, `30.0 s`).
pub fn parse_with_unit(text: &str, unit: &str) -> Result<f64, ValueError> {
    let expected = match unit {
        "ms" => "milliseconds like 718 ms",
        "s" => "seconds like 30.0 s",
        "GB" => "gigabytes like 96 GB",
        _ => "a number with its unit",
    };
    let number = text
        .strip_suffix(unit)
        .and_then(|rest| rest.strip_suffix(' '))
        .ok_or_else(|| value_error(expected, text))?;
    parse_decimal(number).map_err(|_| value_error(expected, text))
}

/// Formats an optional value with `format`, or `—`.
pub fn or_missing<T>(value: Option<T>, format: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| MISSING.to_owned(), format)
}

/// Parses `—` as `None`, anything else with `parse`.
pub fn parse_optional<T>(
    text: &str,
    parse: impl FnOnce(&str) -> Result<T, ValueError>,
) -> Result<Option<T>, ValueError> {
    if text == MISSING {
        Ok(None)
    } else {
        parse(text).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts() {
        assert_eq!(context_label(8192), "8K");
        assert_eq!(context_label(1_043_456), "1019K");
        assert_eq!(context_label(1_048_576), "1024K");
        assert_eq!(context_label(1500), "1500");
        assert_eq!(context_label(512), "512");
        assert_eq!(parse_context("1019K"), Ok(1_043_456));
        assert_eq!(parse_context("1500"), Ok(1500));
        assert_eq!(parse_context("8k"), Ok(8192));
        assert_eq!(parse_context("32k"), parse_context("32K"));
        for bad in [
            "",
            "K",
            "k",
            "8.5K",
            "-8K",
            "8kk",
            "8 k",
            "99999999999999999999K",
        ] {
            assert!(parse_context(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentages_round_trip() {
        assert_eq!(format_percent(0.123), "12.3%");
        assert_eq!(format_percent(0.0), "0.0%");
        assert_eq!(format_percent(1.0), "100.0%");
        for text in ["12.3%", "0.0%", "100.0%", "0.1%", "99.9%", "12.2%"] {
            assert_eq!(format_percent(parse_percent(text).unwrap()), text);
        }
        for bad in ["", "%", "12.3", "x%", "12.3 %"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_as_the_seed_prints_them() {
        assert_eq!(parse_rate("11.4K"), Ok(11_400.0));
        assert_eq!(parse_rate("15K"), Ok(15_000.0));
        assert_eq!(parse_rate("9,111.0"), Ok(9_111.0));
        assert_eq!(parse_rate("1,335.0"), Ok(1_335.0));
        assert_eq!(parse_rate("1.25M"), Ok(1_250_000.0));
        assert_eq!(format_rate(11_400.0), "11.4K");
        assert_eq!(format_rate(15_000.0), "15K");
        assert_eq!(format_rate(9_111.0), "9,111.0");
        assert_eq!(format_rate(170.44), "170.4");
        assert_eq!(format_rate(9_999.96), "10K");
        assert_eq!(format_rate(1_234_567.0), "1,234.6K");
        assert_eq!(format_rate_compact(9_111.0), "9,111");
        assert_eq!(format_rate_compact(12_700.0), "12.7K");
        for bad in [
            "", "1,33.0", ",133", "1.2.3", "12.K", "NaN", "inf", "1e3", "-5.0", "١٢",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn units() {
        assert_eq!(format_ms_whole(108_126.0), "108,126 ms");
        assert_eq!(format_ms_tenths(5.55), "5.5 ms");
        assert_eq!(format_seconds_tenths(30.0), "30.0 s");
        assert_eq!(parse_with_unit("108,126 ms", "ms"), Ok(108_126.0));
        assert_eq!(parse_with_unit("30.0 s", "s"), Ok(30.0));
        assert!(parse_with_unit("30.0s", "s").is_err());
        assert!(parse_with_unit("30.0 ms", "s").is_err());
        assert_eq!(parse_count("5,110"), Ok(5_110));
        assert!(parse_count("5.0").is_err());
        assert_eq!(parse_optional(MISSING, parse_count), Ok(None));
    }

    #[test]
    fn formatting_is_idempotent_through_parsing() {
        let mut value = 0.013_f64;
        while value < 5e7 {
            let text = format_rate(value);
            let again = format_rate(parse_rate(&text).unwrap());
            assert_eq!(text, again, "rate {value}");
            let text = format_decimal(value, 1);
            assert_eq!(text, format_decimal(parse_decimal(&text).unwrap(), 1));
            let text = format_decimal(value, 0);
            assert_eq!(text, format_decimal(parse_decimal(&text).unwrap(), 0));
            value *= 1.0137;
        }
    }
}
