//! Reading a matrix from text: JSON (our schema), the seed page text format, or our Markdown.
//!
//! Owns format detection, the import error type and the helpers both text parsers share (numbered
//! lines, table rows). Every failure names the line and what was expected; nothing here panics on
//! any input, and nothing here touches the file system (see `file.rs`).
use serde::Deserialize;

use super::doc::{MatrixDoc, ValidationError, SCHEMA};
use super::page::{FactError, RowError, PAGE_TITLE};

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

/// The text formats a matrix can be read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    Json,
    SeedText,
    Markdown,
}

/// Which format `text` is in, judged by its first non-blank characters.
pub fn detect_format(text: &str) -> Result<InputFormat, ImportError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first_line = text.lines().next().unwrap_or_default().trim_end();
    if text.trim_start().starts_with('{') {
        Ok(InputFormat::Json)
    } else if first_line == PAGE_TITLE {
        Ok(InputFormat::SeedText)
    } else if first_line.strip_prefix("# ") == Some(PAGE_TITLE) {
        Ok(InputFormat::Markdown)
    } else {
        Err(ImportError::UnknownFormat {
            found: first_line.chars().take(80).collect(),
        })
    }
}

/// Reads a matrix from JSON, seed page text or Markdown, whichever `text` is.
pub fn parse_any(text: &str) -> Result<MatrixDoc, ImportError> {
    match detect_format(text)? {
        InputFormat::Json => parse_json(text),
        InputFormat::SeedText => super::seed::parse_seed_text(text),
        InputFormat::Markdown => super::markdown::parse_markdown(text),
    }
}

/// Reads our JSON schema; checks the schema tag first so an old or new document gets a clear error.
pub fn parse_json(text: &str) -> Result<MatrixDoc, ImportError> {
    #[derive(Deserialize)]
    struct SchemaOnly {
        schema: Option<String>,
    }
    let json_error = |path: String, source: serde_json::Error| ImportError::Json {
        line: source.line(),
        column: source.column(),
        path,
        source,
    };
    let tag: SchemaOnly =
        serde_json::from_str(text).map_err(|source| json_error(".".to_owned(), source))?;
    if let Some(found) = tag.schema {
        if found != SCHEMA {
            return Err(ImportError::Schema { found });
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let doc: MatrixDoc = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        json_error(path, error.into_inner())
    })?;
    deserializer
        .end()
        .map_err(|source| json_error(".".to_owned(), source))?;
    doc.validate().map_err(ImportError::Invalid)?;
    Ok(doc)
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

    #[test]
    fn detection() {
        assert_eq!(detect_format("  {}").unwrap(), InputFormat::Json);
        assert_eq!(
            detect_format("Speed test matrix\r\nx").unwrap(),
            InputFormat::SeedText
        );
        assert_eq!(
            detect_format("\u{feff}# Speed test matrix\n").unwrap(),
            InputFormat::Markdown
        );
        assert!(matches!(
            detect_format("hello"),
            Err(ImportError::UnknownFormat { .. })
        ));
    }
}
