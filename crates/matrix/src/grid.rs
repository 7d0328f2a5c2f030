//! The matrix as the seed page's grid for a terminal (`--format table`, the default of `matrix
//! show`, `sweep`, `replay` and `demo` on a terminal): the prefill row (prompt tok/s and TTFT
//! per context), then the "Sustained decode" grid — contexts as rows, requests at once as
//! columns, total tok/s over the median TTFT in each cell, a short status word where a cell has
//! no figures — and a one-line legend naming only the statuses shown. Never wider than
//! [`MAX_WIDTH`]: columns that do not fit wrap into further column
//! groups, each with its own header. The flat list of every figure is `--format list`
//! ([`crate::table::render_table`]).

use std::collections::BTreeSet;

use crate::doc::{CellStatus, DecodeCell, MatrixDoc, PrefillRow};
use crate::table::MAX_WIDTH;
use crate::units::{context_label, format_decimal, format_rate, format_rate_compact};

/// Spaces between two columns of the grid.
const GAP: usize = 2;

/// A cell's two lines: its figure (with a caveated status's mark) over its TTFT.
struct GridCell {
    top: String,
    bottom: String,
}

/// The short word a status without figures shows in its cell, and its legend entry.
fn status_word(status: &CellStatus) -> (&'static str, &'static str) {
    match status {
        CellStatus::Valid => ("", ""),
        CellStatus::LowEvidence => ("*", "* low evidence (too few seconds or tokens to trust)"),
        CellStatus::OffTarget => (
            "†",
            "† off target (measured another concurrency, or beside production prefills)",
        ),
        CellStatus::OverCapacity => (
            "over cap",
            "over cap: would exceed the server's KV cache, not run",
        ),
        CellStatus::NotRun => ("not run", "not run: skipped or stopped early"),
        CellStatus::Error(_) => (
            "error",
            "error: the measurement failed (--format list says why)",
        ),
        CellStatus::Shed(_) => (
            "shed",
            "shed: the engine refused requests for load (429/503, a queue cap)",
        ),
        CellStatus::Bursts(_) => (
            "‡",
            "‡ delivered in bursts (the streams came all at once: gaps are not decode steps)",
        ),
    }
}

/// A TTFT in the grid: whole milliseconds below 10 s, seconds with one decimal above.
fn grid_ms(ms: f64) -> String {
    if ms >= 10_000.0 {
        format!("{} s", format_decimal(ms / 1000.0, 1))
    } else {
        format!("{} ms", format_decimal(ms, 0))
    }
}

fn decode_cell(cell: Option<&DecodeCell>, legend: &mut BTreeSet<&'static str>) -> GridCell {
    let Some(cell) = cell else {
        return GridCell {
            top: "·".to_owned(),
            bottom: String::new(),
        };
    };
    let (word, entry) = status_word(&cell.status);
    if !entry.is_empty() {
        legend.insert(entry);
    }
    match (&cell.status, cell.total_tok_s) {
        (CellStatus::Valid, Some(rate)) => GridCell {
            top: format_rate(rate),
            bottom: cell.ttft_ms.map(grid_ms).unwrap_or_default(),
        },
        (status, Some(rate)) if status.is_caveated() => GridCell {
            top: format!("{}{word}", format_rate(rate)),
            bottom: cell.ttft_ms.map(grid_ms).unwrap_or_default(),
        },
        (CellStatus::Valid, None) => GridCell {
            top: "—".to_owned(),
            bottom: String::new(),
        },
        (status, None) if status.is_caveated() => GridCell {
            top: format!("—{word}"),
            bottom: String::new(),
        },
        _ => GridCell {
            top: word.to_owned(),
            bottom: String::new(),
        },
    }
}

fn prefill_cell(row: &PrefillRow, legend: &mut BTreeSet<&'static str>) -> GridCell {
    let (word, entry) = status_word(&row.status);
    if !entry.is_empty() {
        legend.insert(entry);
    }
    match (&row.status, row.prompt_tok_s) {
        (status, Some(rate)) if status.is_valid() || status.is_caveated() => GridCell {
            top: format!("{}{word}", format_rate_compact(rate)),
            bottom: row.ttft_ms.map(grid_ms).unwrap_or_default(),
        },
        (CellStatus::Valid, None) => GridCell {
            top: "—".to_owned(),
            bottom: String::new(),
        },
        _ => GridCell {
            top: word.to_owned(),
            bottom: String::new(),
        },
    }
}

/// Chars of `text` (the grid counts characters, as the terminal shows them).
fn width(text: &str) -> usize {
    text.chars().count()
}

/// Lays out a grid: `corner` over the row labels, `columns` as headers, each row's label and
/// its cells (two lines each), wrapped into column groups that fit `max_width`.
fn layout(
    corner: &str,
    columns: &[String],
    rows: &[(String, Vec<GridCell>)],
    max_width: usize,
) -> String {
    let label_width = rows
        .iter()
        .map(|(label, _)| width(label))
        .chain([width(corner)])
        .max()
        .unwrap_or(0);
    let column_widths: Vec<usize> = (0..columns.len())
        .map(|index| {
            rows.iter()
                .filter_map(|(_, cells)| cells.get(index))
                .flat_map(|cell| [width(&cell.top), width(&cell.bottom)])
                .chain([width(&columns[index])])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Column groups: as many columns as fit beside the labels, at least one per group.
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    while start < columns.len() {
        let mut used = label_width;
        let mut end = start;
        while end < columns.len() && (end == start || used + GAP + column_widths[end] <= max_width)
        {
            used += GAP + column_widths[end];
            end += 1;
        }
        groups.push(start..end);
        start = end;
    }
    let mut out = String::new();
    for (number, group) in groups.iter().enumerate() {
        if number > 0 {
            out.push('\n');
        }
        let mut line = pad_right(corner, label_width);
        for index in group.clone() {
            line.push_str(&" ".repeat(GAP));
            line.push_str(&pad_left(&columns[index], column_widths[index]));
        }
        push_line(&mut out, &line);
        for (label, cells) in rows {
            let mut top = pad_right(label, label_width);
            let mut bottom = " ".repeat(label_width);
            for index in group.clone() {
                let (upper, lower) = cells
                    .get(index)
                    .map_or(("", ""), |c| (c.top.as_str(), c.bottom.as_str()));
                top.push_str(&" ".repeat(GAP));
                top.push_str(&pad_left(upper, column_widths[index]));
                bottom.push_str(&" ".repeat(GAP));
                bottom.push_str(&pad_left(lower, column_widths[index]));
            }
            push_line(&mut out, &top);
            if !bottom.trim().is_empty() {
                push_line(&mut out, &bottom);
            }
        }
    }
    out
}

/// `parts` joined with ` · `, wrapped at part boundaries into lines of at most `max_width`
/// characters (a part longer than a line is cut).
fn push_wrapped(out: &mut String, parts: &[&str], max_width: usize) {
    let mut line = String::new();
    for part in parts {
        let joined = if line.is_empty() {
            (*part).to_owned()
        } else {
            format!("{line} · {part}")
        };
        if width(&joined) > max_width && !line.is_empty() {
            push_line(out, &line);
            line = cut(part, max_width);
        } else {
            line = cut(&joined, max_width);
        }
    }
    if !line.is_empty() {
        push_line(out, &line);
    }
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line.trim_end());
    out.push('\n');
}

fn pad_left(text: &str, to: usize) -> String {
    let mut out = " ".repeat(to.saturating_sub(width(text)));
    out.push_str(text);
    out
}

fn pad_right(text: &str, to: usize) -> String {
    let mut out = text.to_owned();
    out.push_str(&" ".repeat(to.saturating_sub(width(text))));
    out
}

/// `text` in at most `max` characters, ending in `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The grid of `doc`, at most `max_width` characters wide.
pub fn render_grid_within(doc: &MatrixDoc, max_width: usize) -> String {
    let mut out = String::new();
    push_line(
        &mut out,
        &cut(&crate::page::title(&doc.metadata), max_width),
    );
    let summary = crate::page::summary_line(doc, " · ");
    if !summary.is_empty() {
        let parts: Vec<&str> = summary.split(" · ").collect();
        push_wrapped(&mut out, &parts, max_width);
    }
    let mut legend = BTreeSet::new();
    if !doc.prefill.is_empty() {
        let columns: Vec<String> = doc
            .prefill
            .iter()
            .map(|row| match row.requests_at_once {
                1 => context_label(row.context_tokens),
                n => format!("{}×{n}", context_label(row.context_tokens)),
            })
            .collect();
        let cells = doc
            .prefill
            .iter()
            .map(|row| prefill_cell(row, &mut legend))
            .collect();
        out.push('\n');
        push_line(
            &mut out,
            &cut(
                "Prefill · prompt tok/s over TTFT · columns are context length",
                max_width,
            ),
        );
        out.push_str(&layout(
            "Context",
            &columns,
            &[("Prefill".to_owned(), cells)],
            max_width,
        ));
    }
    if !doc.decode.is_empty() {
        let contexts = doc.contexts();
        let concurrencies = doc.concurrencies();
        let columns: Vec<String> = concurrencies.iter().map(u32::to_string).collect();
        let rows: Vec<(String, Vec<GridCell>)> = contexts
            .iter()
            .map(|&context| {
                let cells = concurrencies
                    .iter()
                    .map(|&concurrency| decode_cell(doc.cell(context, concurrency), &mut legend))
                    .collect();
                (context_label(context), cells)
            })
            .collect();
        out.push('\n');
        push_line(
            &mut out,
            &cut(
                "Sustained decode · total tok/s over median TTFT · rows are context length, \
                 columns are simultaneous requests",
                max_width,
            ),
        );
        out.push_str(&layout("Context", &columns, &rows, max_width));
    }
    if doc.prefill.is_empty() && doc.decode.is_empty() {
        out.push_str("\n(no measurement)\n");
        return out;
    }
    let grid_has_gaps = doc.decode.len() < doc.contexts().len() * doc.concurrencies().len();
    if grid_has_gaps {
        legend.insert("· not measured");
    }
    if !legend.is_empty() {
        out.push('\n');
        let entries: Vec<&str> = legend.into_iter().collect();
        push_wrapped(&mut out, &entries, max_width);
    }
    push_line(
        &mut out,
        &cut(
            "Every figure of every cell (per-request tok/s, TBT, tails): --format list",
            max_width,
        ),
    );
    out
}

/// The grid of `doc`, at most [`MAX_WIDTH`] characters wide.
pub fn render_grid(doc: &MatrixDoc) -> String {
    render_grid_within(doc, MAX_WIDTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(context: u64, concurrency: u32, status: CellStatus, rate: Option<f64>) -> DecodeCell {
        let mut cell = DecodeCell::status_only(context, concurrency, status);
        cell.total_tok_s = rate;
        cell.ttft_ms = rate.map(|_| 412.4);
        cell
    }

    #[test]
    fn the_grid_puts_contexts_in_rows_and_names_only_the_statuses_shown() {
        let mut doc = MatrixDoc::new(crate::doc::Metadata::default());
        doc.decode = vec![
            cell(8192, 1, CellStatus::Valid, Some(170.43)),
            cell(8192, 2, CellStatus::LowEvidence, Some(278.7)),
            cell(16384, 1, CellStatus::Valid, Some(12_345.0)),
            cell(16384, 2, CellStatus::OverCapacity, None),
        ];
        let text = render_grid(&doc);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("Context")).unwrap();
        assert_eq!(lines[header], "Context       1         2", "{text}");
        assert_eq!(lines[header + 1], "8K        170.4    278.7*");
        assert_eq!(lines[header + 2], "         412 ms    412 ms");
        assert_eq!(lines[header + 3], "16K       12.3K  over cap");
        assert_eq!(lines[header + 4], "         412 ms");
        assert!(text.contains("* low evidence"), "{text}");
        assert!(text.contains("over cap: would exceed"), "{text}");
        assert!(!text.contains("not run:"), "{text}");
        assert!(!text.contains('†'), "{text}");
    }

    #[test]
    fn wide_grids_wrap_into_column_groups_within_the_width() {
        let mut doc = MatrixDoc::new(crate::doc::Metadata::default());
        for context in [8192, 1_048_576] {
            for concurrency in (0..20).map(|i| 1u32 << (i % 12) | i) {
                doc.decode.push(cell(
                    context,
                    concurrency,
                    CellStatus::Valid,
                    Some(123_456.7),
                ));
            }
        }
        doc.decode
            .sort_by_key(|c| (c.context_tokens, c.concurrency));
        doc.decode
            .dedup_by_key(|c| (c.context_tokens, c.concurrency));
        let text = render_grid_within(&doc, 60);
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
        assert!(text.lines().filter(|l| l.starts_with("Context")).count() > 1);
        for concurrency in doc.concurrencies() {
            assert!(
                text.lines()
                    .filter(|l| l.starts_with("Context"))
                    .any(|l| l.split_whitespace().any(|w| w == concurrency.to_string())),
                "{concurrency} has a column: {text}"
            );
        }
    }
}
