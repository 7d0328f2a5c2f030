//! The Markdown rendering of a matrix, laid out like the seed page (title, facts, launch
//! command, Prefill, Sustained decode grid with TTFT per cell, legends, All measurements), and
//! its importer.
//!
//! The importer reads the facts, the launch command, the notes and the All measurements table,
//! then renders the document again and requires every line to match: so a Markdown file that
//! imports is exactly what `render_markdown` writes for the imported document (Markdown → import
//! → Markdown is byte-identical by construction), and a hand edit that makes the grid disagree
//! with the table is reported at its line. Pure: strings in, strings out.
use super::doc::MatrixDoc;
use super::facts::{apply_fact, section_facts, FACT_SECTIONS};
use super::page::{
    self, apply_title, grid_cell_parts, measurement_header, measurement_header_columns,
    measurement_rows, parse_measurement_row, status_legends, ttft_note, MeasurementRow,
    ALL_CAPTION, DECODE_CAPTION, MEASUREMENT_COLUMNS, PAGE_TITLE, PREFILL_CAPTION, SECTION_ALL,
    SECTION_DECODE, SECTION_LAUNCH, SECTION_NOTES, SECTION_PREFILL,
};
use super::redact::redact_launch_command;
use super::text_import::{is_delimiter_row, numbered_lines, split_table_row, ImportError, Line};
use super::units::{context_label, format_ms_whole, format_rate, or_missing};

/// Characters escaped with a backslash in Markdown text (table cells, facts, notes, title).
const ESCAPED: &[char] = &['\\', '`', '*', '_', '[', ']', '<', '>', '|', '#'];

/// Backslash-escapes the Markdown characters that could change how `text` renders.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ESCAPED.contains(&ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// Undoes [`escape`] (and any other backslash before ASCII punctuation).
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\\' {
            if let Some(next) = chars.peek().copied() {
                if next.is_ascii_punctuation() {
                    out.push(next);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(ch);
    }
    out
}

fn table_row<S: AsRef<str>>(cells: &[S]) -> String {
    let mut line = String::from("|");
    for cell in cells {
        line.push(' ');
        line.push_str(&escape(cell.as_ref()));
        line.push_str(" |");
    }
    line
}

/// A table row whose cells are already Markdown (not escaped again).
fn raw_table_row(cells: &[String]) -> String {
    let mut line = String::from("|");
    for cell in cells {
        line.push(' ');
        line.push_str(cell);
        line.push_str(" |");
    }
    line
}

/// `|---|---:|…`: the first `left_columns` columns left-aligned (labels), the rest right-aligned
/// (numbers).
fn delimiter_row(columns: usize, left_columns: usize) -> String {
    let mut line = String::from("|");
    for index in 0..columns {
        line.push_str(if index < left_columns {
            "---|"
        } else {
            "---:|"
        });
    }
    line
}

/// The fence for a code block: three backticks, more if the content has a run of them.
fn fence_for(content: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for ch in content.chars() {
        if ch == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

/// Renders `doc` as GitHub-flavoured Markdown laid out like the seed page.
pub fn render_markdown(doc: &MatrixDoc) -> String {
    let mut lines: Vec<String> = vec![format!("# {PAGE_TITLE}"), String::new()];
    lines.push(format!("**{}**", escape(&page::title(&doc.metadata))));
    lines.push(String::new());
    let summary = page::summary_line(doc, " · ");
    if !summary.is_empty() {
        lines.push(escape(&summary));
        lines.push(String::new());
    }
    for section in FACT_SECTIONS {
        let facts = section_facts(&doc.metadata, section);
        if facts.is_empty() {
            continue;
        }
        lines.push(format!("## {section}"));
        lines.push(String::new());
        for (key, value) in facts {
            lines.push(format!("- **{}:** {}", escape(&key), escape(&value)));
        }
        lines.push(String::new());
    }
    if let Some(command) = &doc.metadata.launch_command {
        let fence = fence_for(command);
        lines.push(format!("## {SECTION_LAUNCH}"));
        lines.push(String::new());
        lines.push(format!("{fence}sh"));
        lines.extend(command.lines().map(str::to_owned));
        lines.push(fence);
        lines.push(String::new());
    }
    if !doc.metadata.notes.is_empty() {
        lines.push(format!("## {SECTION_NOTES}"));
        lines.push(String::new());
        for note in &doc.metadata.notes {
            lines.push(format!("- {}", escape(note)));
        }
        lines.push(String::new());
    }
    let mut prefill: Vec<_> = doc.prefill.iter().collect();
    prefill.sort_by_key(|row| row.context_tokens);
    if !prefill.is_empty() {
        lines.push(format!("## {SECTION_PREFILL}"));
        lines.push(String::new());
        lines.push(PREFILL_CAPTION.to_owned());
        lines.push(String::new());
        lines.push(table_row(&["Context", "Prompt tok/s", "TTFT"]));
        lines.push(delimiter_row(3, 1));
        for row in prefill {
            let (rate, ttft) = if row.status.is_valid() {
                (
                    or_missing(row.prompt_tok_s, format_rate),
                    or_missing(row.ttft_ms, format_ms_whole),
                )
            } else {
                (row.status.to_string(), super::units::MISSING.to_owned())
            };
            lines.push(table_row(&[context_label(row.context_tokens), rate, ttft]));
        }
        lines.push(String::new());
    }
    let contexts = doc.contexts();
    let concurrencies = doc.concurrencies();
    let cell_index = doc.cell_index();
    if !contexts.is_empty() {
        lines.push(format!("## {SECTION_DECODE}"));
        lines.push(String::new());
        lines.push(DECODE_CAPTION.to_owned());
        lines.push(String::new());
        let mut header = vec!["Context".to_owned()];
        header.extend(concurrencies.iter().map(u32::to_string));
        lines.push(table_row(&header));
        lines.push(delimiter_row(header.len(), 1));
        for context in &contexts {
            let mut cells = vec![escape(&context_label(*context))];
            for concurrency in &concurrencies {
                let text = grid_cell_parts(cell_index.get(&(*context, *concurrency)).copied())
                    .map_or_else(String::new, |parts| match parts {
                        page::GridCellText::Figures { total_tok_s, ttft } => {
                            format!("{}<br>{}", escape(&total_tok_s), escape(&ttft))
                        }
                        page::GridCellText::Caveat { status, detail } => {
                            format!("{}<br>{}", escape(&status), escape(&detail))
                        }
                        page::GridCellText::Status(status) => escape(&status),
                    });
                cells.push(text);
            }
            lines.push(raw_table_row(&cells));
        }
        lines.push(String::new());
        let legends = status_legends(doc);
        if !legends.is_empty() {
            lines.push(escape(&legends.join(" ")));
            lines.push(String::new());
        }
        lines.push(escape(ttft_note(doc)));
        lines.push(String::new());
    }
    lines.push(format!("## {SECTION_ALL}"));
    lines.push(String::new());
    lines.push(escape(ALL_CAPTION));
    lines.push(String::new());
    let header = measurement_header(doc);
    lines.push(table_row(&header));
    lines.push(delimiter_row(header.len(), 4));
    for row in measurement_rows(doc) {
        lines.push(table_row(&row));
    }
    let legends = status_legends(doc);
    if !legends.is_empty() {
        lines.push(String::new());
        lines.push(escape(&legends.join(" ")));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Reads Markdown written by [`render_markdown`] (see the module doc for how strictly).
pub fn parse_markdown(text: &str) -> Result<MatrixDoc, ImportError> {
    let mut lines = numbered_lines(text);
    // A final newline leaves one empty line behind; it is not content.
    if lines.len() > 1 && lines.last().is_some_and(|line| line.text.is_empty()) {
        lines.pop();
    }
    let last_number = lines.last().map_or(1, |line| line.number);
    let first = lines.first().copied().ok_or(ImportError::Truncated {
        line: 1,
        expected: format!("`# {PAGE_TITLE}`"),
    })?;
    if first.text != format!("# {PAGE_TITLE}") {
        return Err(expected(first, &format!("`# {PAGE_TITLE}`")));
    }
    let title = lines
        .iter()
        .skip(1)
        .find(|line| !line.text.is_empty())
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: "the title line `**<model> on <hardware>**`".to_owned(),
        })?;
    let title_text = title
        .text
        .strip_prefix("**")
        .and_then(|rest| rest.strip_suffix("**"))
        .map(unescape)
        .ok_or_else(|| expected(title, "the title line `**<model> on <hardware>**`"))?;

    let mut doc = MatrixDoc::new(Default::default());
    let mut section: Option<String> = None;
    let mut index = 0;
    let mut saw_table = false;
    while index < lines.len() {
        let line = lines[index];
        index += 1;
        if let Some(heading) = line.text.strip_prefix("## ") {
            section = Some(heading.to_owned());
            continue;
        }
        let Some(current) = section.as_deref() else {
            continue;
        };
        if line.text.is_empty() {
            continue;
        }
        match current {
            name if FACT_SECTIONS.contains(&name) => {
                let (key, value) = line
                    .text
                    .strip_prefix("- **")
                    .and_then(|rest| rest.split_once(":** "))
                    .ok_or_else(|| expected(line, "a fact line `- **<key>:** <value>`"))?;
                apply_fact(&mut doc.metadata, name, &unescape(key), &unescape(value)).map_err(
                    |source| ImportError::Fact {
                        line: line.number,
                        section: name.to_owned(),
                        source,
                    },
                )?;
            }
            SECTION_LAUNCH => {
                let fence: String = line.text.chars().take_while(|c| *c == '`').collect();
                if fence.len() < 3 {
                    return Err(expected(
                        line,
                        "a code fence ``` opening the launch command",
                    ));
                }
                let mut command = Vec::new();
                loop {
                    let Some(body) = lines.get(index).copied() else {
                        return Err(ImportError::Truncated {
                            line: last_number,
                            expected: format!("the closing fence {fence} of the launch command"),
                        });
                    };
                    index += 1;
                    if body.text == fence {
                        break;
                    }
                    command.push(body.text);
                }
                let command = command.join("\n");
                if !command.trim().is_empty() {
                    doc.metadata.launch_command = Some(redact_launch_command(&command));
                }
            }
            SECTION_NOTES => {
                let note = line
                    .text
                    .strip_prefix("- ")
                    .ok_or_else(|| expected(line, "a note line `- <note>`"))?;
                doc.metadata.notes.push(unescape(note));
            }
            SECTION_ALL => {
                if saw_table || line.text == escape(ALL_CAPTION) {
                    continue;
                }
                saw_table = true;
                index = parse_measurements(&mut doc, &lines, index - 1, last_number)?;
            }
            _ => {}
        }
    }
    if !saw_table {
        return Err(ImportError::Truncated {
            line: last_number,
            expected: format!("the `## {SECTION_ALL}` table"),
        });
    }
    apply_title(&mut doc.metadata, &title_text);
    doc.sort();
    doc.validate().map_err(ImportError::Invalid)?;

    let rendered = render_markdown(&doc);
    let rendered: Vec<&str> = rendered
        .strip_suffix('\n')
        .unwrap_or(&rendered)
        .split('\n')
        .collect();
    for (line, expected_text) in lines.iter().zip(&rendered) {
        if line.text != *expected_text {
            return Err(ImportError::Mismatch {
                line: line.number,
                expected: (*expected_text).to_owned(),
                found: line.text.to_owned(),
            });
        }
    }
    if let Some(missing) = rendered.get(lines.len()) {
        return Err(ImportError::Truncated {
            line: last_number,
            expected: format!("{missing:?}"),
        });
    }
    if let Some(extra) = lines.get(rendered.len()) {
        return Err(ImportError::Mismatch {
            line: extra.number,
            expected: "the end of the document".to_owned(),
            found: extra.text.to_owned(),
        });
    }
    Ok(doc)
}

fn expected(line: Line<'_>, what: &str) -> ImportError {
    ImportError::Expected {
        line: line.number,
        expected: what.to_owned(),
        found: line.text.to_owned(),
    }
}

/// Parses the All measurements table starting at `start` (its header); returns the index of the
/// first line after the table.
fn parse_measurements(
    doc: &mut MatrixDoc,
    lines: &[Line<'_>],
    start: usize,
    last_number: usize,
) -> Result<usize, ImportError> {
    let header_line = lines[start.min(lines.len().saturating_sub(1))];
    let header = split_table_row(header_line.text, true).unwrap_or_default();
    let Some(optional_columns) = measurement_header_columns(&header) else {
        return Err(expected(
            header_line,
            &format!("the table header | {} |", MEASUREMENT_COLUMNS.join(" | ")),
        ));
    };
    let delimiter = lines
        .get(start + 1)
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: "the table delimiter row |---|…|".to_owned(),
        })?;
    if !is_delimiter_row(delimiter.text) {
        return Err(expected(delimiter, "the table delimiter row |---|…|"));
    }
    let mut index = start + 2;
    let mut seen = std::collections::HashMap::new();
    while let Some(line) = lines.get(index).copied() {
        if !line.text.starts_with('|') {
            break;
        }
        index += 1;
        let cells = split_table_row(line.text, true).ok_or_else(|| {
            expected(
                line,
                &format!("a table row of {} cells ending with `|`", header.len()),
            )
        })?;
        let row =
            parse_measurement_row(&cells, optional_columns).map_err(|source| ImportError::Row {
                line: line.number,
                source,
            })?;
        let (key, what) = match &row {
            MeasurementRow::Prefill(row) => (
                (true, row.context_tokens, 0),
                format!("the prefill row at {}", context_label(row.context_tokens)),
            ),
            MeasurementRow::Decode(cell) => (
                (false, cell.context_tokens, cell.concurrency),
                format!(
                    "the decode cell {} × {}",
                    context_label(cell.context_tokens),
                    cell.concurrency
                ),
            ),
        };
        if let Some(first_line) = seen.insert(key, line.number) {
            return Err(ImportError::Duplicate {
                line: line.number,
                first_line,
                what,
            });
        }
        let checked = match &row {
            MeasurementRow::Prefill(row) => row.validate(),
            MeasurementRow::Decode(cell) => cell.validate(),
        };
        checked.map_err(|source| ImportError::InvalidRow {
            line: line.number,
            source,
        })?;
        match row {
            MeasurementRow::Prefill(row) => doc.prefill.push(row),
            MeasurementRow::Decode(cell) => doc.decode.push(cell),
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips() {
        for text in [
            "a|b",
            "<redacted>",
            "x_y*z",
            "back\\slash",
            "plain · text × 4",
            "#1 [x]",
        ] {
            assert_eq!(unescape(&escape(text)), text);
        }
        assert_eq!(escape("Error: a|b"), "Error: a\\|b");
    }

    #[test]
    fn fences_outgrow_backticks() {
        assert_eq!(fence_for("echo hi"), "```");
        assert_eq!(fence_for("echo ```x```"), "````");
    }
}
