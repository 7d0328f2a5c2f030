//! The demo report's tables: the columns compared between the sweep and production (each
//! pair with its ratio), the interference columns, and [`TextTable`], rendered for a terminal,
//! Markdown or HTML.

use std::fmt::Write as _;

use crate::base::escape::xml_escape;
use crate::matrix::markdown::escape as md_escape;
use crate::matrix::table::MAX_WIDTH;
use crate::matrix::units::{format_percent, MISSING};
use crate::matrix::DecodeCell;

/// A column compared between the sweep and production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compared {
    PerRequest,
    Tbt,
    Ttft,
    Total,
}

impl Compared {
    pub fn of(self, cell: &DecodeCell) -> Option<f64> {
        match self {
            Compared::PerRequest => cell.per_request_tok_s,
            Compared::Tbt => cell.tbt_ms,
            Compared::Ttft => cell.ttft_ms,
            Compared::Total => cell.total_tok_s,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compared::PerRequest => "per-request tok/s",
            Compared::Tbt => "TBT",
            Compared::Ttft => "TTFT",
            Compared::Total => "total tok/s",
        }
    }

    pub fn format(self, value: f64) -> String {
        match self {
            Compared::PerRequest | Compared::Total => format!("{value:.1}"),
            Compared::Tbt => format!("{value:.1} ms"),
            Compared::Ttft => format!("{value:.0} ms"),
        }
    }

    /// "sweep · production (×ratio)" and the ratio.
    pub fn pair(self, sweep: &DecodeCell, production: &DecodeCell) -> (String, Option<f64>) {
        match (self.of(sweep), self.of(production)) {
            (Some(a), Some(b)) if a > 0.0 => (
                format!("{} · {} (×{:.3})", self.format(a), self.format(b), b / a),
                Some(b / a),
            ),
            (a, b) => (
                format!(
                    "{} · {}",
                    a.map_or_else(|| MISSING.to_owned(), |v| self.format(v)),
                    b.map_or_else(|| MISSING.to_owned(), |v| self.format(v))
                ),
                None,
            ),
        }
    }
}

/// A production cell's decode tok/s per stream (decode tokens per request-second: Total
/// tok/s ÷ Average active requests) beside what the sweep's speed and the cell's prefill overlap
/// predict for a server that pauses decoding to prefill, with their ratio.
pub fn explained(sweep: &DecodeCell, production: &DecodeCell) -> String {
    let mean = production
        .total_tok_s
        .zip(production.average_active_requests)
        .filter(|(_, active)| *active > 0.0)
        .map(|(total, active)| total / active);
    let predicted = sweep
        .per_request_tok_s
        .zip(production.prefill_overlap_share)
        .map(|(speed, overlap)| speed * (1.0 - overlap));
    match (mean, predicted) {
        (Some(mean), Some(predicted)) if predicted > 0.0 => {
            format!("{mean:.1} · {predicted:.1} (×{:.3})", mean / predicted)
        }
        (mean, predicted) => format!(
            "{} · {}",
            mean.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}")),
            predicted.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}"))
        ),
    }
}

pub fn interference_text(cell: &DecodeCell) -> (String, String) {
    (
        cell.prefill_overlap_share
            .map_or_else(|| MISSING.to_owned(), format_percent),
        cell.overlapping_prefills
            .map_or_else(|| MISSING.to_owned(), |v| format!("{v:.2}")),
    )
}

/// A report cell shortened for a terminal: no ` ms` (the header says it) and ratios with two
/// decimals without parentheses (`118.4 · 117.9 (×0.994)` → `118.4 · 117.9 ×0.99`).
fn compact(cell: &str) -> String {
    let text = cell.replace(" ms", "");
    let Some(open) = text.find("(×") else {
        return text;
    };
    let rest = &text[open + "(×".len()..];
    let Some(close) = rest.find(')') else {
        return text;
    };
    match rest[..close].parse::<f64>() {
        Ok(ratio) => format!("{}×{ratio:.2}{}", &text[..open], &rest[close + 1..]),
        Err(_) => text,
    }
}

/// A table as header and rows of plain text, rendered to Markdown or HTML.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextTable {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl TextTable {
    /// Aligned for a terminal under `header` (shorter names than the report's), at most
    /// [`MAX_WIDTH`] columns.
    pub fn terminal(&self, header: &[&str]) -> String {
        // Short names only while they name the report's columns one for one.
        let own: Vec<&str> = self.header.iter().map(String::as_str).collect();
        let header = if header.len() == own.len() {
            header
        } else {
            &own
        };
        let mut table = crate::matrix::table::TextTable::new(header);
        table.numeric = (1..header.len()).collect();
        table.rows = self
            .rows
            .iter()
            .map(|row| row.iter().map(|cell| compact(cell)).collect())
            .collect();
        table.render(MAX_WIDTH)
    }

    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| {
            let escaped: Vec<String> = cells.iter().map(|c| md_escape(c)).collect();
            format!("| {} |\n", escaped.join(" | "))
        };
        let mut out = line(&self.header);
        out.push('|');
        for index in 0..self.header.len() {
            out.push_str(if index == 0 { "---|" } else { "---:|" });
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    pub fn html(&self) -> String {
        let mut out = String::from("<table class=\"measurements\"><thead><tr>");
        for column in &self.header {
            let _ = write!(out, "<th>{}</th>", xml_escape(column));
        }
        out.push_str("</tr></thead><tbody>");
        for row in &self.rows {
            out.push_str("<tr>");
            for (index, cell) in row.iter().enumerate() {
                let class = if index > 0 { " class=\"num\"" } else { "" };
                let _ = write!(out, "<td{class}>{}</td>", xml_escape(cell));
            }
            out.push_str("</tr>");
        }
        out.push_str("</tbody></table>");
        out
    }
}

#[cfg(test)]
mod terminal_tests {
    use super::compact;

    #[test]
    fn report_cells_shorten_for_a_terminal() {
        assert_eq!(compact("118.4 · 117.9 (×0.994)"), "118.4 · 117.9 ×0.99");
        assert_eq!(compact("192 ms · 2160 ms (×11.250)"), "192 · 2160 ×11.25");
        assert_eq!(compact("0.0%"), "0.0%");
    }
}
