//! JSON text: a string literal written into a buffer, for bodies built by hand (the simulator's
//! responses, the sweep's requests), the one pretty rendering of documents, and a trimmed text
//! field read from a server's answer.
//!
//! Hand-written because the simulator must write the exact bytes an engine writes (raw UTF-8,
//! short escapes), into a buffer it reuses, without serde_json's intermediate `String`.

use std::fmt::Write as _;

/// The string at `key` of a JSON object, trimmed; `None` when absent, not a string or blank
/// (how a server's self-description is read: a blank field says nothing).
pub fn field_text(value: &serde_json::Value, key: &str) -> Option<String> {
    value
        .get(key)
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// A document as pretty JSON with a trailing newline: the stable file and API rendering of the
/// matrix, its diff and its comparison.
pub fn pretty_json_line<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut json = serde_json::to_string_pretty(value).unwrap_or_else(|error| {
        // Serializing plain structs of strings and numbers cannot fail; keep the reason visible.
        format!("{{\"error\": {:?}}}", error.to_string())
    });
    json.push('\n');
    json
}

/// Append `s` as a JSON string (compact, raw UTF-8 like orjson/msgspec/pydantic).
pub fn push_json_string(out: &mut String, s: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep's request bodies were written by serde_json before; the bytes must not change.
    #[test]
    fn writes_what_serde_json_writes() {
        let mut every_ascii: String = (0u8..0x80).map(char::from).collect();
        every_ascii.push_str("é 日本 \u{2028} 🦀 \u{7f}");
        for text in [every_ascii.as_str(), "", "plain", "a\"b\\c\nd"] {
            let mut out = String::from("prefix:");
            push_json_string(&mut out, text);
            let expected = format!("prefix:{}", serde_json::to_string(text).unwrap());
            assert_eq!(out, expected, "{text:?}");
        }
    }
}
