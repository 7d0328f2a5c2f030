//! What the text importers share: the import error type (every failure names its line and what
//! was expected), numbered input lines and Markdown-style table rows.
//!
//! A leaf below `import.rs`, `seed.rs` and `markdown.rs`, so that format detection can call both
//! readers while they use these helpers. Pure: nothing here panics on any input or does I/O.
use super::doc::SCHEMA;
use super::facts::FactError;
use super::page::RowError;
use super::validate::ValidationError;

/// Why a text is not a matrix. Line numbers count from 1.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("not a matrix document: expected JSON (starting with `{{`), a seed page (first line `Speed test matrix`) or tokentap Markdown (first line `# Speed test matrix`), found {found:?} on line 1")]
    UnknownFormat { found: String },
    #[error("line {line}: expected {expected}, found {found:?}")]
    Expected {
        line: usize,
        expected: String,
        found: String,
    },
    #[error("line {line}: the text ends here, expected {expected}")]
    Truncated { line: usize, expected: String },
    #[error("line {line}: All measurements row")]
    Row {
        line: usize,
        #[source]
        source: RowError,
    },
    #[error("line {line}: All measurements row")]
    InvalidRow {
        line: usize,
        #[source]
        source: ValidationError,
    },
    #[error("line {line}: {section} fact")]
    Fact {
        line: usize,
        section: String,
        #[source]
        source: FactError,
    },
    #[error("line {line}: {what} reads {found:?}, but the All measurements table (the source of truth) gives {expected:?}")]
    Inconsistent {
        line: usize,
        what: String,
        found: String,
        expected: String,
    },
    #[error(
        "line {line}: {what} has no row in the All measurements table (is the table truncated?)"
    )]
    MissingRow { line: usize, what: String },
    #[error("line {line}: {what} appears twice (first on line {first_line})")]
    Duplicate {
        line: usize,
        first_line: usize,
        what: String,
    },
    #[error("line {line}: this line differs from what the document implies (the facts and the All measurements table are the source of truth): expected {expected:?}, found {found:?}")]
    Mismatch {
        line: usize,
        expected: String,
        found: String,
    },
    #[error("JSON schema is {found:?}, this tokentap reads {SCHEMA:?}")]
    Schema { found: String },
    #[error("JSON line {line}, column {column}, at `{path}`")]
    Json {
        line: usize,
        column: usize,
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the imported matrix is not valid")]
    Invalid(#[source] ValidationError),
}

/// A line of input with its 1-based number; carriage returns and trailing blanks removed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'a> {
    pub number: usize,
    pub text: &'a str,
}

/// Numbers the lines of `text`, dropping a byte-order mark and trailing `\r`.
pub(crate) fn numbered_lines(text: &str) -> Vec<Line<'_>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.split('\n')
        .enumerate()
        .map(|(index, line)| Line {
            number: index + 1,
            text: line.strip_suffix('\r').unwrap_or(line),
        })
        .collect()
}

/// Splits a `| a | b |` table row into trimmed cells. With `unescape`, `\|` does not split and a
/// backslash before ASCII punctuation is dropped (Markdown escapes). `None` when the line is not
/// a complete row (does not start and end with `|`).
pub(crate) fn split_table_row(line: &str, unescape: bool) -> Option<Vec<String>> {
    let trimmed = line.trim();
    let inner = trimmed.strip_prefix('|')?;
    let mut cells = Vec::new();
    let mut current = String::new();
    let mut chars = inner.chars().peekable();
    let mut closed = false;
    while let Some(ch) = chars.next() {
        closed = false;
        match ch {
            '\\' if unescape => match chars.peek() {
                Some(next) if next.is_ascii_punctuation() => {
                    current.push(*next);
                    chars.next();
                }
                _ => current.push('\\'),
            },
            '|' => {
                cells.push(current.trim().to_owned());
                current.clear();
                closed = true;
            }
            other => current.push(other),
        }
    }
    if !closed {
        return None;
    }
    Some(cells)
}

/// Whether `line` is a Markdown table delimiter row like `|---|---:|`.
pub(crate) fn is_delimiter_row(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.starts_with('|')
        && trimmed.contains('-')
        && trimmed.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        assert_eq!(
            split_table_row("| a | b\\|c | d |", true),
            Some(vec!["a".to_owned(), "b|c".to_owned(), "d".to_owned()])
        );
        assert_eq!(split_table_row("| a | b", false), None);
        assert_eq!(split_table_row("a | b |", false), None);
        assert_eq!(split_table_row("|", false), None);
        assert!(is_delimiter_row("|---|---:|"));
        assert!(!is_delimiter_row("| 8K | 1 |"));
    }
}
