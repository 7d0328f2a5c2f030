//! Reading a matrix from text: JSON (our schema), the seed page text format, or our Markdown.
//!
//! Owns format detection and the JSON reader; the seed page and Markdown readers live in
//! `seed.rs` and `markdown.rs`, the error type and the helpers they share in `text_import.rs`.
//! Every failure names the line and what was expected; nothing here panics on any input, and
//! nothing here touches the file system (see `file.rs`).
use serde::Deserialize;

use super::doc::{MatrixDoc, SCHEMA};
use super::page::PAGE_TITLE;
pub use super::text_import::ImportError;

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

#[cfg(test)]
mod tests {
    use super::*;

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
