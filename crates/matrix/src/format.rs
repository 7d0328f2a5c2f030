//! The renderings of a matrix document, in one place ([`Format`]): each one's name, content type,
//! file extension and renderer. The commands and the admin API offer subsets of it (by name), so
//! a rendering added here is one line wherever it is offered.

use crate::doc::MatrixDoc;

/// A rendering of a matrix document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Markdown laid out like the seed pages (imports back to the same document).
    Markdown,
    /// The JSON document (schema tokentap.matrix/v1), full precision.
    Json,
    /// One row per measurement, full precision, base units in the column names.
    Csv,
    /// A self-contained HTML report: heat-map grid, charts, full table.
    Html,
    /// SVG charts: decode tok/s by concurrency per context, prefill tok/s by context.
    Svg,
    /// The seed page's grid for a terminal (contexts × concurrency, total tok/s over TTFT),
    /// at most 120 characters wide.
    Table,
    /// Every figure of every cell, one aligned row per cell, at most 120 characters wide.
    List,
    /// llm-d benchmark reports (llm-d-benchmark's schema v0.2.1), a JSON array of one report
    /// per measured cell, tokentap's own figures under `results.observability.tokentap`.
    Llmd,
}

impl Format {
    /// Every rendering.
    pub const ALL: [Format; 8] = [
        Format::Markdown,
        Format::Json,
        Format::Csv,
        Format::Html,
        Format::Svg,
        Format::Table,
        Format::List,
        Format::Llmd,
    ];

    /// Its name where it is asked for by name (`--format md`, `?format=md`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Markdown => "md",
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Html => "html",
            Format::Svg => "svg",
            Format::Table => "table",
            Format::List => "list",
            Format::Llmd => "llmd",
        }
    }

    /// The rendering a name asks for (`markdown` is `md`'s other name).
    pub fn parse(text: &str) -> Option<Format> {
        match text {
            "markdown" => Some(Format::Markdown),
            _ => Format::ALL.into_iter().find(|f| f.name() == text),
        }
    }

    /// The one of `offered` that `text` names, or a message listing them.
    pub fn parse_among(text: &str, offered: &[Format]) -> Result<Format, String> {
        Format::parse(text)
            .filter(|f| offered.contains(f))
            .ok_or_else(|| {
                let names: Vec<&str> = offered.iter().map(|f| f.name()).collect();
                format!("unknown format {text:?}: use {}", names.join(", "))
            })
    }

    /// Its HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Markdown => "text/markdown; charset=utf-8",
            Format::Json | Format::Llmd => "application/json",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Html => "text/html; charset=utf-8",
            Format::Svg => "image/svg+xml",
            Format::Table | Format::List => "text/plain; charset=utf-8",
        }
    }

    /// Its file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Markdown => "md",
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Html => "html",
            Format::Svg => "svg",
            Format::Table => "txt",
            Format::List => "list.txt",
            Format::Llmd => "llmd.json",
        }
    }

    /// The rendering an `Accept` header asks for, of those `offered` (the first of them when it
    /// names none).
    pub fn from_accept(accept: &str, offered: &[Format]) -> Option<Format> {
        let accept = accept.to_ascii_lowercase();
        offered
            .iter()
            .copied()
            .find(|f| {
                let media = f.content_type().split(';').next().unwrap_or("");
                f.content_type() != Format::Table.content_type() && accept.contains(media)
            })
            .or_else(|| offered.first().copied())
    }

    /// `doc` rendered.
    pub fn render(self, doc: &MatrixDoc) -> String {
        match self {
            Format::Markdown => crate::markdown::render_markdown(doc),
            Format::Json => crate::render_json(doc),
            Format::Csv => crate::csv::render_csv(doc),
            Format::Html => crate::html::render_html(doc),
            Format::Svg => crate::svg::render_svg(doc),
            Format::Table => crate::grid::render_grid(doc),
            Format::List => crate::table::render_table(doc),
            Format::Llmd => crate::llmd::render_llmd(doc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_subsets_say_what_they_offer() {
        for format in Format::ALL {
            assert_eq!(Format::parse(format.name()), Some(format));
        }
        assert_eq!(Format::parse("markdown"), Some(Format::Markdown));
        assert_eq!(
            Format::parse_among("svg", &[Format::Json, Format::Markdown]).unwrap_err(),
            "unknown format \"svg\": use json, md"
        );
        let offered = [Format::Json, Format::Markdown, Format::Html];
        assert_eq!(
            Format::from_accept("text/html,*/*", &offered),
            Some(Format::Html)
        );
        assert_eq!(Format::from_accept("*/*", &offered), Some(Format::Json));
    }
}
