//! What `tokentap sweep`, `replay` and `demo` print on stdout when they end: `--format
//! table|list|md|json|llmd`. The default (`auto`) is the seed page's grid on a terminal and
//! Markdown otherwise, so `tokentap sweep … > matrix.md` keeps writing the page format; the files
//! written beside (`.json`, `.html`, `.md`) do not depend on it. Also the word wrap
//! ([`indented_wrap`]) that keeps the commands' text lines within 120 columns.

use std::io::IsTerminal;

use crate::matrix::diff::{render_diff_json, render_diff_markdown, MatrixDiff};
use crate::matrix::table::render_diff_table;
use crate::matrix::{Format, MatrixDoc};

/// A `--format` value parser offering `offered` of the matrix renderings (`matrix::Format`),
/// by their names.
pub fn format_parser(
    offered: &'static [Format],
) -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(offered.iter().map(|f| f.name())).try_map(
        |name: String| Format::parse(&name).ok_or_else(|| format!("unknown format {name}")),
    )
}

/// `--format` of the commands that end with a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// `table` when stdout is a terminal, else `md`.
    #[default]
    Auto,
    /// The seed page's grid: contexts × concurrency, total tok/s over TTFT, at most 120
    /// characters wide.
    Table,
    /// Every figure of every cell, one aligned row per cell, at most 120 characters wide.
    List,
    /// Markdown laid out like the seed pages (imports back with `tokentap matrix import`).
    Md,
    /// The matrix document (schema tokentap.matrix/v1).
    Json,
    /// llm-d benchmark reports (llm-d-benchmark's schema 0.2.1): a JSON array of one report
    /// per measured cell, tokentap's own figures under results.observability.tokentap. What
    /// is not a matrix (a diff, a summary) prints as json.
    Llmd,
}

impl OutputFormat {
    /// `Auto` decided for this process's stdout.
    pub fn resolve(self) -> OutputFormat {
        match self {
            OutputFormat::Auto if std::io::stdout().is_terminal() => OutputFormat::Table,
            OutputFormat::Auto => OutputFormat::Md,
            other => other,
        }
    }

    /// The matrix rendering this is (`Auto` resolved first).
    pub fn format(self) -> Format {
        match self.resolve() {
            OutputFormat::Table => Format::Table,
            OutputFormat::List => Format::List,
            OutputFormat::Json => Format::Json,
            OutputFormat::Llmd => Format::Llmd,
            _ => Format::Markdown,
        }
    }

    /// A matrix in this format (`Auto` resolved first).
    pub fn matrix(self, doc: &MatrixDoc) -> String {
        self.format().render(doc)
    }

    /// A diff in this format (`Auto` resolved first).
    pub fn diff(self, diff: &MatrixDiff) -> String {
        match self.resolve() {
            OutputFormat::Table | OutputFormat::List => render_diff_table(diff),
            OutputFormat::Json | OutputFormat::Llmd => render_diff_json(diff),
            _ => render_diff_markdown(diff),
        }
    }

    /// Whether what is not a matrix (a summary, a preview) prints as JSON: `json` and `llmd`.
    pub fn machine(self) -> bool {
        matches!(self.resolve(), OutputFormat::Json | OutputFormat::Llmd)
    }
}

/// `text` broken between words into lines of at most `width` characters, the first starting
/// with `first`, the others with `rest` (a word longer than a line stays whole).
pub fn indented_wrap(text: &str, first: &str, rest: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::indented_wrap;

    #[test]
    fn lines_break_between_words_and_a_long_word_stays_whole() {
        let text = format!("a note that runs on {} and on", "x".repeat(30));
        let wrapped = indented_wrap(&text, "  ", "    ", 24);
        assert_eq!(
            wrapped,
            format!(
                "  a note that runs on\n    {}\n    and on\n",
                "x".repeat(30)
            )
        );
        assert_eq!(indented_wrap("short", "", "  ", 120), "short\n");
    }
}
