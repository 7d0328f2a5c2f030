//! Which trace format a JSON line is of, told by the keys only that format has, and the error
//! that names a line of another format in a file: every reader asks this file, so a file that
//! mixes formats is refused by whichever reader took it.

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::trace::TraceError;

/// Which JSONL format a line belongs to, told by the keys only that format has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// A tokentap trace's header (`schema`).
    Header,
    /// A tokentap trace's request (`prompt_tokens`).
    Tokentap,
    /// Bailian (`chat_id`).
    Bailian,
    /// Mooncake or AIPerf's `mooncake_trace` (`input_length`).
    Mooncake,
}

impl LineKind {
    fn name(self) -> &'static str {
        match self {
            LineKind::Header => "tokentap trace header",
            LineKind::Tokentap => "tokentap",
            LineKind::Bailian => "Bailian",
            LineKind::Mooncake => "Mooncake",
        }
    }
}

#[derive(Deserialize)]
struct Keys {
    schema: Option<IgnoredAny>,
    chat_id: Option<IgnoredAny>,
    prompt_tokens: Option<IgnoredAny>,
    input_length: Option<IgnoredAny>,
}

/// The format a JSON line is of; `None` when it is not a JSON object or has none of the keys
/// (its reader then says what is wrong with it).
pub fn line_kind(line: &str) -> Option<LineKind> {
    let keys: Keys = serde_json::from_str(line).ok()?;
    if keys.schema.is_some() {
        Some(LineKind::Header)
    } else if keys.chat_id.is_some() {
        Some(LineKind::Bailian)
    } else if keys.prompt_tokens.is_some() {
        Some(LineKind::Tokentap)
    } else if keys.input_length.is_some() {
        Some(LineKind::Mooncake)
    } else {
        None
    }
}

/// An error naming `line` when it is a line of another format than `expected`, the file's.
pub fn same_format(text: &str, expected: LineKind, line: usize) -> Result<(), TraceError> {
    match line_kind(text) {
        Some(found) if found != expected => Err(TraceError::Line {
            line,
            message: format!(
                "a {} line in a {} trace: the file mixes formats",
                found.name(),
                expected.name()
            ),
        }),
        _ => Ok(()),
    }
}
