//! The matrix as an aligned plain-text list for a terminal (`--format list` of `tokentap
//! matrix show`, `sweep`, `replay` and `demo`; the seed grid is `--format table`,
//! `grid.rs`): a title line, the prefill rows, one row per decode cell, then
//! the cells' tails (p90 and p99 of TTFT, TBT and ITL) where the document has them,
//! columns padded to their widest entry and numbers right-aligned, never wider than
//! [`MAX_WIDTH`] columns (a long status is cut with `…`). No colour, no box-drawing: it reads the
//! same in a pipe, a log and a terminal. [`TextTable`] is the aligned-table primitive, also used
//! for the demo's comparison tables.

use crate::doc::{DecodeCell, MatrixDoc, PrefillRow};
use crate::units::{
    context_label, format_count, format_decimal, format_ms_tenths, format_ms_whole, format_rate,
    format_seconds_tenths,
};

/// Widest line the table writes, in characters.
pub const MAX_WIDTH: usize = 120;

/// A table of text cells: a header, rows, and which columns are numbers (right-aligned).
#[derive(Debug, Clone, Default)]
pub struct TextTable {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Column indexes aligned to the right; the others align left.
    pub numeric: Vec<usize>,
}

impl TextTable {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            numeric: Vec::new(),
        }
    }

    /// The table as aligned lines, each at most `max_width` characters: when the columns do not
    /// fit, the widest column is cut (its entries end in `…`) until they do.
    pub fn render(&self, max_width: usize) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        const GAP: usize = 2;
        let total = |widths: &[usize]| -> usize {
            widths.iter().sum::<usize>() + GAP * widths.len().saturating_sub(1)
        };
        while total(&widths) > max_width {
            let Some((widest, width)) = widths.iter().copied().enumerate().max_by_key(|(_, w)| *w)
            else {
                break;
            };
            if width <= 4 {
                break;
            }
            widths[widest] = width - 1;
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut text = String::new();
            for (index, width) in widths.iter().enumerate() {
                let cell = cells.get(index).map_or("", String::as_str);
                let cell = cut(cell, *width);
                let pad = width.saturating_sub(cell.chars().count());
                if index > 0 {
                    text.push_str("  ");
                }
                if self.numeric.contains(&index) {
                    text.extend(std::iter::repeat_n(' ', pad));
                    text.push_str(&cell);
                } else {
                    text.push_str(&cell);
                    if index + 1 < widths.len() {
                        text.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&self.header);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule);
        for row in &self.rows {
            line(row);
        }
        out
    }
}

/// `text` in at most `width` characters, ending in `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn or_dash<T>(value: Option<T>, format: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), format)
}

fn prefill_row(row: &PrefillRow) -> Vec<String> {
    vec![
        context_label(row.context_tokens),
        row.requests_at_once.to_string(),
        row.status.to_string(),
        or_dash(row.prompt_tok_s, format_rate),
        or_dash(row.ttft_ms, format_ms_whole),
        or_dash(row.prompt_tokens, format_count),
    ]
}

fn decode_row(cell: &DecodeCell) -> Vec<String> {
    vec![
        context_label(cell.context_tokens),
        cell.concurrency.to_string(),
        cell.status.to_string(),
        or_dash(cell.total_tok_s, format_rate),
        or_dash(cell.per_request_tok_s, format_rate),
        or_dash(cell.ttft_ms, format_ms_whole),
        or_dash(cell.tbt_ms, format_ms_tenths),
        or_dash(cell.average_active_requests, |v| format_decimal(v, 1)),
        or_dash(cell.prefill_overlap_share, |v| {
            format!("{} %", format_decimal(v * 100.0, 0))
        }),
        or_dash(cell.completed_requests, format_count),
        or_dash(cell.output_tokens, format_count),
        or_dash(cell.measured_for_s, format_seconds_tenths),
    ]
}

/// The matrix as aligned text, at most [`MAX_WIDTH`] columns wide.
pub fn render_table(doc: &MatrixDoc) -> String {
    let mut out = String::new();
    out.push_str(&cut(&crate::page::title(&doc.metadata), MAX_WIDTH));
    out.push('\n');
    let summary = crate::page::summary_line(doc, " · ");
    if !summary.is_empty() {
        out.push_str(&cut(&summary, MAX_WIDTH));
        out.push('\n');
    }
    if !doc.prefill.is_empty() {
        let mut table = TextTable::new(&[
            "Prefill",
            "At once",
            "Status",
            "Prompt tok/s",
            "TTFT",
            "Prompt tokens",
        ]);
        table.numeric = vec![1, 3, 4, 5];
        table.rows = doc.prefill.iter().map(prefill_row).collect();
        out.push('\n');
        out.push_str(&table.render(MAX_WIDTH));
    }
    if !doc.decode.is_empty() {
        let mut table = TextTable::new(&[
            "Context",
            "Conc",
            "Status",
            "Total tok/s",
            "Req tok/s",
            "TTFT",
            "TBT",
            "Active",
            "Overlap",
            "Done",
            "Tokens",
            "Measured",
        ]);
        table.numeric = (3..12).chain([1]).collect();
        table.rows = doc.decode.iter().map(decode_row).collect();
        out.push('\n');
        out.push_str(&table.render(MAX_WIDTH));
    }
    let tailed: Vec<&DecodeCell> = doc.decode.iter().filter(|c| c.tails.is_some()).collect();
    if !tailed.is_empty() {
        let mut table = TextTable::new(&[
            "Context", "Conc", "TTFT p90", "TTFT p99", "TBT p90", "TBT p99", "ITL p90", "ITL p99",
        ]);
        table.numeric = (1..8).collect();
        table.rows = tailed
            .iter()
            .map(|cell| {
                let mut row = vec![
                    context_label(cell.context_tokens),
                    cell.concurrency.to_string(),
                ];
                let values = cell.tails.map(|t| t.values()).unwrap_or_default();
                for (index, value) in values.into_iter().enumerate() {
                    row.push(if index < 2 {
                        or_dash(value, format_ms_whole)
                    } else {
                        or_dash(value, format_ms_tenths)
                    });
                }
                row
            })
            .collect();
        out.push_str("\nTails per cell (p90 and p99):\n");
        out.push_str(&table.render(MAX_WIDTH));
    }
    if doc.prefill.is_empty() && doc.decode.is_empty() {
        out.push_str("\n(no measurement)\n");
    }
    out
}

/// A ratio as `×0.98`, `-` when absent.
fn ratio(value: Option<f64>) -> String {
    or_dash(value, |v| format!("×{}", format_decimal(v, 3)))
}

/// A diff (B ÷ A per cell) as aligned text, at most [`MAX_WIDTH`] columns wide.
pub fn render_diff_table(diff: &crate::diff::MatrixDiff) -> String {
    let mut out = String::new();
    for (name, side) in [("A", &diff.a), ("B", &diff.b)] {
        let label = if side.label.is_empty() {
            side.title.clone()
        } else {
            format!("{} ({})", side.label, side.title)
        };
        out.push_str(&cut(&format!("{name}: {label}"), MAX_WIDTH));
        out.push('\n');
    }
    out.push_str("Each figure is B ÷ A of the same cell.\n");
    let status = |s: &Option<crate::doc::CellStatus>| {
        s.as_ref()
            .map_or_else(|| "absent".to_owned(), ToString::to_string)
    };
    if !diff.decode.is_empty() {
        let mut table = TextTable::new(&[
            "Context",
            "Conc",
            "Status A → B",
            "Total tok/s",
            "Req tok/s",
            "TTFT",
            "TBT",
            "Active",
        ]);
        table.numeric = vec![1, 3, 4, 5, 6, 7];
        table.rows = diff
            .decode
            .iter()
            .map(|cell| {
                let statuses = if cell.status_changed {
                    format!("{} → {}", status(&cell.status_a), status(&cell.status_b))
                } else {
                    status(&cell.status_b)
                };
                vec![
                    context_label(cell.context_tokens),
                    cell.concurrency.to_string(),
                    statuses,
                    ratio(cell.ratios.total_tok_s),
                    ratio(cell.ratios.per_request_tok_s),
                    ratio(cell.ratios.ttft_ms),
                    ratio(cell.ratios.tbt_ms),
                    ratio(cell.ratios.average_active_requests),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table.render(MAX_WIDTH));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_lines_fit() {
        let mut table = TextTable::new(&["Name", "Value"]);
        table.numeric = vec![1];
        table.rows = vec![
            vec!["a".into(), "1".into()],
            vec!["longer".into(), "1,234.5".into()],
        ];
        let text = table.render(MAX_WIDTH);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Name      Value");
        assert_eq!(lines[1], "------  -------");
        assert_eq!(lines[2], "a             1");
        assert_eq!(lines[3], "longer  1,234.5");

        let mut wide = TextTable::new(&["Status", "N"]);
        wide.rows = vec![vec![format!("Error: {}", "x".repeat(300)), "1".into()]];
        let text = wide.render(40);
        assert!(text.lines().all(|l| l.chars().count() <= 40), "{text}");
        assert!(text.contains('…'));
    }
}
