//! Importer for the seed page text format (the published pages; copies in
//! `tests/fixtures/seeds/`): the text of an HTML page, where neighbouring elements run together
//! (`NVFP48 contexts`, `170.434 ms TTFT`, `256K context9,11128,276 ms TTFT`).
//!
//! The "All measurements" table is unambiguous, so it is the source of truth; the title, the
//! summary line, the prefill chart labels and the decode grid are then checked against what the
//! table implies, and any disagreement is an error naming its line. Pure: text in, document out.
use std::collections::HashMap;

use super::doc::{MatrixDoc, Metadata, Source};
use super::facts::{apply_fact, FACT_SECTIONS, SECTION_ENGINE, SECTION_HARDWARE, SECTION_RUN};
use super::page::{
    self, apply_title, grid_cell_parts, measurement_header_columns, model_path_from_command,
    parse_measurement_row, MeasurementRow, ALL_CAPTION, DECODE_CAPTION, MEASUREMENT_COLUMNS,
    PAGE_TITLE, PREFILL_CAPTION, SECTION_ALL, SECTION_DECODE, SECTION_LAUNCH, SECTION_PREFILL,
};
use super::redact::redact_launch_command;
use super::text_import::{is_delimiter_row, numbered_lines, split_table_row, ImportError, Line};
use super::units::{context_label, format_ms_whole, format_rate_compact, parse_context, MISSING};

const SECTIONS: [&str; 7] = [
    SECTION_HARDWARE,
    SECTION_ENGINE,
    SECTION_RUN,
    SECTION_LAUNCH,
    SECTION_PREFILL,
    SECTION_DECODE,
    SECTION_ALL,
];

struct Section<'a> {
    name: &'static str,
    heading: Line<'a>,
    lines: Vec<Line<'a>>,
}

/// Parses the seed page text format into a document (source `synthetic`: the pages are sweeps).
pub fn parse_seed_text(text: &str) -> Result<MatrixDoc, ImportError> {
    let lines: Vec<Line<'_>> = numbered_lines(text)
        .into_iter()
        .map(|line| Line {
            number: line.number,
            text: line.text.trim_end(),
        })
        .collect();
    let mut content = lines.iter().copied().filter(|line| !line.text.is_empty());
    let last_number = lines.last().map_or(1, |line| line.number);
    let heading = content.next().ok_or(ImportError::Truncated {
        line: 1,
        expected: format!("the first line `{PAGE_TITLE}`"),
    })?;
    if heading.text != PAGE_TITLE {
        return Err(expected(heading, &format!("`{PAGE_TITLE}`")));
    }
    let title_line = content.next().ok_or(ImportError::Truncated {
        line: last_number,
        expected: "the title line `<model> on <hardware>`".to_owned(),
    })?;
    let summary = content.next().ok_or(ImportError::Truncated {
        line: last_number,
        expected: "the summary line `<engine> · <version> · …`".to_owned(),
    })?;

    let sections = split_sections(content, last_number)?;
    let mut metadata = Metadata::default();
    let mut doc_parts = Parts::default();
    for section in &sections {
        match section.name {
            name if FACT_SECTIONS.contains(&name) => {
                parse_facts(&mut metadata, section, last_number)?
            }
            SECTION_LAUNCH => {
                let command = section
                    .lines
                    .iter()
                    .map(|line| line.text)
                    .collect::<Vec<_>>()
                    .join("\n");
                let command = command.trim();
                if !command.is_empty() {
                    metadata.launch_command = Some(redact_launch_command(command));
                }
            }
            SECTION_PREFILL => doc_parts.prefill = Some(section),
            SECTION_DECODE => doc_parts.decode = Some(section),
            _ => doc_parts.all = Some(section),
        }
    }
    let all = doc_parts.all.ok_or(ImportError::Truncated {
        line: last_number,
        expected: format!("the `{SECTION_ALL}` section"),
    })?;
    let mut doc = MatrixDoc::new(metadata);
    parse_measurements(&mut doc, all, last_number)?;

    if doc.metadata.model.model_path.is_none() {
        doc.metadata.model.model_path = doc
            .metadata
            .launch_command
            .as_deref()
            .and_then(model_path_from_command);
    }
    if doc.metadata.run.source.is_none() {
        doc.metadata.run.source = Some(Source::Synthetic);
    }
    apply_title(&mut doc.metadata, title_line.text);
    let expected_title = page::title(&doc.metadata);
    if expected_title != title_line.text {
        return Err(ImportError::Inconsistent {
            line: title_line.number,
            what: "the title".to_owned(),
            found: title_line.text.to_owned(),
            expected: expected_title,
        });
    }
    doc.sort();

    if let Some(prefill) = doc_parts.prefill {
        check_prefill_chart(&doc, prefill, last_number)?;
    }
    if let Some(decode) = doc_parts.decode {
        check_decode_grid(&doc, decode, last_number)?;
    }
    let expected_summary = page::summary_line(&doc, "");
    if summary.text != expected_summary {
        return Err(ImportError::Inconsistent {
            line: summary.number,
            what: "the summary line".to_owned(),
            found: summary.text.to_owned(),
            expected: expected_summary,
        });
    }
    doc.validate().map_err(ImportError::Invalid)?;
    Ok(doc)
}

#[derive(Default)]
struct Parts<'s, 'a> {
    prefill: Option<&'s Section<'a>>,
    decode: Option<&'s Section<'a>>,
    all: Option<&'s Section<'a>>,
}

fn expected(line: Line<'_>, what: &str) -> ImportError {
    ImportError::Expected {
        line: line.number,
        expected: what.to_owned(),
        found: line.text.to_owned(),
    }
}

fn split_sections<'a>(
    content: impl Iterator<Item = Line<'a>>,
    last_number: usize,
) -> Result<Vec<Section<'a>>, ImportError> {
    let mut sections: Vec<Section<'a>> = Vec::new();
    for line in content {
        if let Some(name) = SECTIONS.iter().find(|name| **name == line.text) {
            if let Some(first) = sections.iter().find(|section| section.name == *name) {
                return Err(ImportError::Duplicate {
                    line: line.number,
                    first_line: first.heading.number,
                    what: format!("the section `{name}`"),
                });
            }
            sections.push(Section {
                name,
                heading: line,
                lines: Vec::new(),
            });
        } else if let Some(section) = sections.last_mut() {
            section.lines.push(line);
        } else {
            return Err(expected(
                line,
                &format!("a section heading ({})", SECTIONS.join(", ")),
            ));
        }
    }
    if sections.is_empty() {
        return Err(ImportError::Truncated {
            line: last_number,
            expected: format!("the `{SECTION_HARDWARE}` section"),
        });
    }
    Ok(sections)
}

/// `- Key` / `- Value` pairs (the value's dash is sometimes missing on the page).
fn parse_facts(
    metadata: &mut Metadata,
    section: &Section<'_>,
    last_number: usize,
) -> Result<(), ImportError> {
    let mut lines = section.lines.iter();
    while let Some(key_line) = lines.next() {
        let key = key_line
            .text
            .strip_prefix("- ")
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .ok_or_else(|| {
                expected(
                    *key_line,
                    &format!("a `- <key>` line of the {} section", section.name),
                )
            })?;
        let value_line = lines.next().ok_or(ImportError::Truncated {
            line: last_number,
            expected: format!("the value of `{key}`"),
        })?;
        let value = value_line
            .text
            .strip_prefix("- ")
            .unwrap_or(value_line.text)
            .trim();
        if value.is_empty() {
            return Err(expected(*value_line, &format!("the value of `{key}`")));
        }
        apply_fact(metadata, section.name, key, value).map_err(|source| ImportError::Fact {
            line: value_line.number,
            section: section.name.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// A table whose header sits at the end of a caption line: `<caption>| A | B |`.
fn caption_and_header<'a>(
    section: &Section<'a>,
    caption: &str,
    last_number: usize,
) -> Result<(Line<'a>, Vec<String>), ImportError> {
    let first = section
        .lines
        .first()
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: format!("`{caption}` under `{}`", section.name),
        })?;
    let rest = first
        .text
        .strip_prefix(caption)
        .ok_or_else(|| expected(first, &format!("`{caption}` followed by the table header")))?;
    let header = split_table_row(rest, false)
        .ok_or_else(|| expected(first, &format!("`{caption}| Context | …|`")))?;
    Ok((first, header))
}

fn parse_measurements(
    doc: &mut MatrixDoc,
    section: &Section<'_>,
    last_number: usize,
) -> Result<(), ImportError> {
    let (header_line, header) = caption_and_header(section, ALL_CAPTION, last_number)?;
    let Some(optional_columns) = measurement_header_columns(&header) else {
        return Err(expected(
            header_line,
            &format!("the header | {} |", MEASUREMENT_COLUMNS.join(" | ")),
        ));
    };
    let delimiter = section
        .lines
        .get(1)
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: "the table delimiter row |---|…|".to_owned(),
        })?;
    if !is_delimiter_row(delimiter.text) {
        return Err(expected(delimiter, "the table delimiter row |---|…|"));
    }
    let mut seen: HashMap<(bool, u64, u32), usize> = HashMap::new();
    for line in section.lines.iter().skip(2) {
        if !line.text.starts_with('|') {
            // The legend under the table; everything after it is legend too.
            break;
        }
        let cells = split_table_row(line.text, false).ok_or_else(|| {
            expected(
                *line,
                &format!("a table row of {} cells ending with `|`", header.len()),
            )
        })?;
        let row =
            parse_measurement_row(&cells, optional_columns).map_err(|source| ImportError::Row {
                line: line.number,
                source,
            })?;
        let key = match &row {
            MeasurementRow::Prefill(row) => (true, row.context_tokens, 0),
            MeasurementRow::Decode(cell) => (false, cell.context_tokens, cell.concurrency),
        };
        if let Some(first_line) = seen.insert(key, line.number) {
            return Err(ImportError::Duplicate {
                line: line.number,
                first_line,
                what: describe_key(key),
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
    Ok(())
}

fn describe_key((prefill, context, concurrency): (bool, u64, u32)) -> String {
    if prefill {
        format!("the prefill row at {}", context_label(context))
    } else {
        format!("the decode cell {} × {concurrency}", context_label(context))
    }
}

/// What the seed's prefill chart prints for a row: `8K context11.4K718 ms TTFT`.
fn prefill_entry(row: &super::doc::PrefillRow) -> String {
    let label = context_label(row.context_tokens);
    if row.status.is_valid() {
        let rate = row
            .prompt_tok_s
            .map_or_else(|| MISSING.to_owned(), format_rate_compact);
        let ttft = row
            .ttft_ms
            .map_or_else(|| MISSING.to_owned(), format_ms_whole);
        format!("{label} context{rate}{ttft} TTFT")
    } else {
        format!("{label} context{}", row.status)
    }
}

fn check_prefill_chart(
    doc: &MatrixDoc,
    section: &Section<'_>,
    last_number: usize,
) -> Result<(), ImportError> {
    let first = section
        .lines
        .first()
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: format!("`{PREFILL_CAPTION}`"),
        })?;
    let rest = first.text.strip_prefix(PREFILL_CAPTION).ok_or_else(|| {
        expected(
            first,
            &format!("`{PREFILL_CAPTION}` followed by the first entry"),
        )
    })?;
    let mut entries: Vec<Line<'_>> = Vec::new();
    if !rest.is_empty() {
        entries.push(Line {
            number: first.number,
            text: rest,
        });
    }
    entries.extend(section.lines.iter().skip(1).copied());
    for (index, entry) in entries.iter().enumerate() {
        let context = entry
            .text
            .split_once(" context")
            .and_then(|(label, _)| parse_context(label).ok())
            .ok_or_else(|| expected(*entry, "a prefill entry like `8K context11.4K718 ms TTFT`"))?;
        let Some(row) = doc.prefill.get(index) else {
            return Err(ImportError::MissingRow {
                line: entry.number,
                what: format!("the prefill entry at {}", context_label(context)),
            });
        };
        let expected_text = prefill_entry(row);
        if entry.text != expected_text {
            return Err(ImportError::Inconsistent {
                line: entry.number,
                what: format!("the prefill entry at {}", context_label(context)),
                found: entry.text.to_owned(),
                expected: expected_text,
            });
        }
    }
    if let Some(missing) = doc.prefill.get(entries.len()) {
        return Err(ImportError::Inconsistent {
            line: entries.last().map_or(first.number, |line| line.number),
            what: "the prefill chart".to_owned(),
            found: "no further entry".to_owned(),
            expected: prefill_entry(missing),
        });
    }
    Ok(())
}

fn check_decode_grid(
    doc: &MatrixDoc,
    section: &Section<'_>,
    last_number: usize,
) -> Result<(), ImportError> {
    let (header_line, header) = caption_and_header(section, DECODE_CAPTION, last_number)?;
    if header.first().map(String::as_str) != Some("Context") {
        return Err(expected(
            header_line,
            "the grid header `| Context | 1 | 2 | … |`",
        ));
    }
    let concurrencies = doc.concurrencies();
    let expected_header: Vec<String> = concurrencies.iter().map(u32::to_string).collect();
    if let Some(missing) = header[1..]
        .iter()
        .find(|label| !expected_header.contains(label))
    {
        return Err(ImportError::MissingRow {
            line: header_line.number,
            what: format!("the grid column {missing}"),
        });
    }
    if header[1..] != expected_header[..] {
        return Err(ImportError::Inconsistent {
            line: header_line.number,
            what: "the grid's concurrency columns".to_owned(),
            found: header[1..].join(" | "),
            expected: expected_header.join(" | "),
        });
    }
    let delimiter = section
        .lines
        .get(1)
        .copied()
        .ok_or(ImportError::Truncated {
            line: last_number,
            expected: "the grid delimiter row |---|…|".to_owned(),
        })?;
    if !is_delimiter_row(delimiter.text) {
        return Err(expected(delimiter, "the grid delimiter row |---|…|"));
    }
    let rows: Vec<Line<'_>> = section
        .lines
        .iter()
        .skip(2)
        .take_while(|line| line.text.starts_with('|'))
        .copied()
        .collect();
    let contexts = doc.contexts();
    let cells_by_key = doc.cell_index();
    for (index, line) in rows.iter().enumerate() {
        let cells = split_table_row(line.text, false)
            .ok_or_else(|| expected(*line, "a grid row ending with `|`"))?;
        if cells.len() != header.len() {
            return Err(expected(
                *line,
                &format!(
                    "{} grid cells (context + {} concurrency levels), found {}",
                    header.len(),
                    concurrencies.len(),
                    cells.len()
                ),
            ));
        }
        let context = parse_context(&cells[0]).map_err(|source| ImportError::Expected {
            line: line.number,
            expected: format!("a context label in the first cell ({source})"),
            found: cells[0].clone(),
        })?;
        if contexts.get(index) != Some(&context) {
            return Err(match contexts.get(index) {
                Some(expected_context) => ImportError::Inconsistent {
                    line: line.number,
                    what: "the grid row's context".to_owned(),
                    found: cells[0].clone(),
                    expected: context_label(*expected_context),
                },
                None => ImportError::MissingRow {
                    line: line.number,
                    what: format!("the grid row {}", cells[0]),
                },
            });
        }
        for (concurrency, text) in concurrencies.iter().zip(&cells[1..]) {
            let what = format!("grid cell {} × {concurrency}", context_label(context));
            match grid_cell_parts(cells_by_key.get(&(context, *concurrency)).copied()) {
                None if text.is_empty() => {}
                None => {
                    return Err(ImportError::MissingRow {
                        line: line.number,
                        what,
                    })
                }
                Some(parts) => {
                    let expected_text = parts.joined("");
                    if *text != expected_text {
                        return Err(ImportError::Inconsistent {
                            line: line.number,
                            what,
                            found: text.clone(),
                            expected: expected_text,
                        });
                    }
                }
            }
        }
    }
    if let Some(missing) = contexts.get(rows.len()) {
        return Err(ImportError::Inconsistent {
            line: rows.last().map_or(delimiter.number, |line| line.number),
            what: "the decode grid".to_owned(),
            found: "no further row".to_owned(),
            expected: format!("a row for {}", context_label(*missing)),
        });
    }
    Ok(())
}
