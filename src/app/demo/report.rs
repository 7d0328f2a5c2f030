//! The demo's report: the sweep, and each phase's production cells beside it (the steady
//! table with its agreement marks, the mixed table with its measured interference), rendered
//! for a terminal, as Markdown, JSON and the HTML page.

use std::fmt::Write as _;

use super::table::{explained, interference_text, Compared, TextTable};
use crate::base::escape::xml_escape;
use crate::matrix::html::{
    facts_fragment, grid_fragment_on, heat_scale_max, measurements_fragment, page, prefill_fragment,
};
use crate::matrix::markdown::escape as md_escape;
use crate::matrix::side_by_side::{comparison_fragment, Axes};
use crate::matrix::units::{context_label, MISSING};
use crate::matrix::MatrixDoc;

/// Relative tolerance within which a steady cell agrees with the sweep.
pub const AGREEMENT: f64 = 0.05;

/// What the columns of the comparison tables mean; printed beside them.
pub const DEFINITIONS: [&str; 7] = [
    "Per-request tok/s: 1 ÷ TBT of one stream, median over the cell's streams.",
    "TBT: (last token − first token) ÷ (completion tokens − 1), median.",
    "TTFT: request head in → first token at the proxy, median. The sweep warms the prompt cache first; the steady clients warm theirs the same way, but their TTFT also holds the upload of their request body, which the sweep's in-process requests skip (on a busy machine it is the column that moves most); the mixed requests arrive cold, so their TTFT includes their prefill.",
    "Total tok/s (steady phase only): output tokens per second across the cell's simultaneous streams. It means the same on both sides only when every request of the cell has the same prompt length and runs through the whole window, as in the sweep and the steady phase; mixed traffic does not, so it is not compared there.",
    "Prefill overlap: the share of the cell's decode time (each request's first → last token) during which at least one other request to the same server was in prefill (head in → first token), measured by the proxy for every request.",
    "Decode tok/s per stream: decode tokens per request-second of decode, Total tok/s ÷ Average active requests (a mean over the cell, where Per-request tok/s is a median of 1 ÷ TBT); a server that pauses decoding while it prefills (chunked prefill, as the simulator models sglang) gives sweep × (1 − overlap): the sweep's undisturbed speed slowed by the stalls alone.",
    "Overlapping prefills: mean number of other requests' prefills that overlapped a request's decode.",
];

/// The demo's findings: the sweep, and each phase's production cells beside it.
pub struct DemoReport<'a> {
    pub synthetic: &'a MatrixDoc,
    pub steady: Option<&'a MatrixDoc>,
    pub mixed: Option<&'a MatrixDoc>,
    pub steady_cells: &'a [(u64, u32)],
    /// Set when the machine was too busy for the simulator's timing (`machine::TimingCheck`):
    /// the sentence that says so, printed first, and no comparison is judged.
    pub too_busy: Option<String>,
}

impl DemoReport<'_> {
    /// Steady cells beside the sweep's: per-request tok/s, TBT, TTFT and total tok/s, each
    /// marked ✓ within 5 %, and the cells' prefill overlap (≈ 0: nothing cold arrives).
    pub fn steady_table(&self) -> (TextTable, usize) {
        let mut table = TextTable {
            header: [
                "Cell",
                "Per-request tok/s sweep · production",
                "TBT",
                "TTFT",
                "Total tok/s",
                "Prefill overlap",
                "Within 5 %",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows: Vec::new(),
        };
        let mut agreeing = 0;
        for &(context, concurrency) in self.steady_cells {
            let label = format!("{} × {concurrency}", context_label(context));
            let sweep = self.synthetic.cell(context, concurrency);
            let production = self.steady.and_then(|doc| doc.cell(context, concurrency));
            let (Some(sweep), Some(production)) = (sweep, production) else {
                table.rows.push(vec![
                    label,
                    "no production cell (the streams failed or landed elsewhere)".to_owned(),
                ]);
                continue;
            };
            let mut row = vec![label];
            let mut outside = Vec::new();
            for column in [
                Compared::PerRequest,
                Compared::Tbt,
                Compared::Ttft,
                Compared::Total,
            ] {
                let (text, ratio) = column.pair(sweep, production);
                if !ratio.is_some_and(|r| (r - 1.0).abs() <= AGREEMENT) {
                    outside.push(column.name());
                }
                row.push(text);
            }
            row.push(interference_text(production).0);
            let all_within = outside.is_empty();
            row.push(if self.too_busy.is_some() {
                // The machine missed the simulator's timing: no verdict either way.
                "not judged".to_owned()
            } else if all_within {
                "✓".to_owned()
            } else {
                format!("✗ {}", outside.join(", "))
            });
            agreeing += usize::from(all_within);
            table.rows.push(row);
        }
        (table, agreeing)
    }

    /// Mixed cells beside the sweep's cell of the same context and concurrency: the columns that
    /// mean the same on both sides, and the cell's measured prefill interference.
    pub fn mixed_table(&self) -> TextTable {
        let mut table = TextTable {
            header: [
                "Cell",
                "Requests",
                "Per-request tok/s sweep · production",
                "Prefill overlap",
                "Overlapping prefills",
                "Decode tok/s per stream production · sweep × (1 − overlap)",
                "TBT",
                "TTFT",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows: Vec::new(),
        };
        let Some(mixed) = self.mixed else {
            return table;
        };
        for production in &mixed.decode {
            let (context, concurrency) = (production.context_tokens, production.concurrency);
            let Some(sweep) = self
                .synthetic
                .cell(context, concurrency)
                .filter(|cell| cell.status.is_valid())
            else {
                continue;
            };
            let (overlap, overlapping) = interference_text(production);
            table.rows.push(vec![
                format!("{} × {concurrency}", context_label(context)),
                production
                    .completed_requests
                    .map_or_else(|| MISSING.to_owned(), |n| n.to_string()),
                Compared::PerRequest.pair(sweep, production).0,
                overlap,
                overlapping,
                explained(sweep, production),
                Compared::Tbt.pair(sweep, production).0,
                Compared::Ttft.pair(sweep, production).0,
            ]);
        }
        table
    }

    /// The comparison in Markdown, definitions under the tables.
    pub fn markdown(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mut out = String::new();
        if let Some(warning) = &self.too_busy {
            let _ = writeln!(out, "> **Warning.** {}\n", md_escape(warning));
        }
        out.push_str("## Steady traffic · the sweep\n\n");
        let _ = writeln!(
            out,
            "Plain clients reproduce sweep cells: same prompt length, same number of streams, warm prompt. {}\n",
            self.agreement(agreeing)
        );
        out.push_str(&steady.markdown());
        out.push_str("\n## Mixed traffic · the sweep\n\n");
        out.push_str("Cold prompts of many lengths at changing concurrency. Each request sits in the row of its prompt length and the column of its average number of active requests (prefilling ones included). Where the decode tok/s per stream (Total tok/s ÷ Average active requests) matches sweep × (1 − overlap), the gap to the sweep is the time other requests' prefills held the decode up.\n\n");
        let mixed = self.mixed_table();
        if mixed.rows.is_empty() {
            out.push_str("No mixed cell shares a context and concurrency with the sweep.\n");
        } else {
            out.push_str(&mixed.markdown());
        }
        out.push_str("\nDefinitions (the same for the sweep and production):\n\n");
        for definition in DEFINITIONS {
            let _ = writeln!(out, "- {}", md_escape(definition));
        }
        out
    }

    /// How many steady cells agree, or why that is not judged.
    fn agreement(&self, agreeing: usize) -> String {
        if self.too_busy.is_some() {
            "Not judged: the machine was too busy for the simulator's timing (see the warning)."
                .to_owned()
        } else {
            format!(
                "{agreeing} of {} cells agree with the sweep within 5 % on every compared column.",
                self.steady_cells.len()
            )
        }
    }

    /// The comparisons as aligned text for a terminal (`--format table`).
    pub fn terminal(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mut out = String::new();
        if let Some(warning) = &self.too_busy {
            out.push_str(&wrap(&format!("WARNING: {warning}"), 100));
            out.push('\n');
        }
        let _ = write!(
            out,
            "Steady traffic beside the sweep: {}\n\n",
            self.agreement(agreeing)
        );
        out.push_str(&steady.terminal(&[
            "Cell",
            "Req tok/s sweep · prod",
            "TBT ms",
            "TTFT ms",
            "Total tok/s",
            "Overlap",
            "Within 5 %",
        ]));
        out.push_str("\nMixed traffic beside the sweep: cold prompts. Pref. = other requests' prefills overlapping a decode;\nwhere prod ≈ sweep × (1 − overlap), those prefills explain the gap.\n\n");
        let mixed = self.mixed_table();
        if mixed.rows.is_empty() {
            out.push_str("No mixed cell shares a context and concurrency with the sweep.\n");
        } else {
            out.push_str(&mixed.terminal(&[
                "Cell",
                "Reqs",
                "Req tok/s sweep · prod",
                "Overlap",
                "Pref.",
                "Per stream · sw×(1−ov)",
                "TBT ms",
                "TTFT ms",
            ]));
        }
        out
    }

    /// The demo's matrices as one JSON object (`--format json`): `synthetic`, and `production`,
    /// `steady`, `mixed` where measured.
    pub fn json(&self, production: Option<&MatrixDoc>) -> String {
        let value = serde_json::json!({
            "synthetic": self.synthetic,
            "production": production,
            "steady": self.steady,
            "mixed": self.mixed,
        });
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }

    /// The demo's HTML report: the sweep, both phases beside it, definitions, every measurement.
    pub fn html(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mixed = self.mixed_table();
        let definitions: String = DEFINITIONS
            .iter()
            .map(|d| format!("<li>{}</li>", xml_escape(d)))
            .collect();
        let all = |doc: Option<&MatrixDoc>| {
            doc.map_or_else(
                || "<p class=\"note\">No request was measured.</p>".to_owned(),
                measurements_fragment,
            )
        };
        let shown: Vec<&MatrixDoc> = std::iter::once(self.synthetic)
            .chain(self.steady)
            .chain(self.mixed)
            .collect();
        let axes = Axes::union(&shown);
        let max = heat_scale_max(&shown);
        let heat = |doc: Option<&MatrixDoc>, id: &str, title: &str| {
            let grid = doc.map_or_else(
                || "<p class=\"note\">No request was measured.</p>".to_owned(),
                |doc| grid_fragment_on(doc, &axes, max),
            );
            format!("<div class=\"panel\" id=\"{id}\"><h3>{title}</h3>{grid}</div>")
        };
        let versus = |doc: Option<&MatrixDoc>| {
            // Ratios drawn in colour read as findings; a machine too busy has none to show.
            doc.filter(|d| !d.decode.is_empty() && self.too_busy.is_none())
                .map_or_else(String::new, |doc| comparison_fragment(doc, self.synthetic))
        };
        let body = format!(
            "<h1>tokentap demo</h1>{busy}<p class=\"note\">A simulated sglang server behind the tokentap proxy: a synthetic sweep, then ordinary traffic in two phases, all measured by the proxy's metering path. First: the steady traffic's cells ÷ the sweep's, on one grid.</p>{steady_versus}\
<div class=\"panels\">{sweep_heat}{steady_heat}{mixed_heat}</div>{facts}<h2>Synthetic sweep</h2>{prefill}\
<h2>Steady traffic · the sweep</h2><p class=\"note\">Plain clients reproduce sweep cells: same prompt length, same number of streams, warm prompt. {agreement}</p><div class=\"scroll\">{steady}</div>\
<h2>Mixed traffic · the sweep</h2><p class=\"note\">Cold prompts of many lengths at changing concurrency. Each request sits in the row of its prompt length and the column of its average number of active requests (prefilling ones included). Where the decode tok/s per stream (Total tok/s ÷ Average active requests) matches sweep × (1 − overlap), the gap to the sweep is the time other requests' prefills held the decode up.</p>{mixed_versus}<div class=\"scroll\">{mixed}</div>\
<h3>Definitions (the same for the sweep and production)</h3><ul class=\"note\">{definitions}</ul>\
<h2>Synthetic: all measurements</h2>{synthetic_all}<h2>Steady traffic: all measurements</h2>{steady_all}<h2>Mixed traffic: all measurements</h2>{mixed_all}",
            busy = self.too_busy.as_ref().map_or_else(String::new, |w| format!(
                "<p class=\"warning\" id=\"too-busy\"><strong>Warning.</strong> {}</p>",
                xml_escape(w)
            )),
            steady_versus = versus(self.steady),
            sweep_heat = heat(Some(self.synthetic), "synthetic", "Synthetic sweep"),
            steady_heat = heat(self.steady, "production", "Steady traffic (production)"),
            mixed_heat = heat(self.mixed, "mixed", "Mixed traffic (production)"),
            facts = facts_fragment(self.synthetic),
            prefill = prefill_fragment(self.synthetic),
            agreement = xml_escape(&self.agreement(agreeing)),
            steady = steady.html(),
            mixed_versus = versus(self.mixed),
            mixed = mixed.html(),
            synthetic_all = measurements_fragment(self.synthetic),
            steady_all = all(self.steady),
            mixed_all = all(self.mixed),
        );
        page("tokentap demo", &body)
    }
}

/// `text` wrapped at spaces into lines of at most `width` characters (a word longer than a
/// line stands alone).
pub(super) fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::demo::steady::steady_cells;
    use crate::matrix::DecodeCell;

    fn cell(context: u64, concurrency: u32, speed: f64, overlap: Option<f64>) -> DecodeCell {
        let mut cell =
            DecodeCell::status_only(context, concurrency, crate::matrix::CellStatus::Valid);
        cell.per_request_tok_s = Some(speed);
        cell.tbt_ms = Some(1000.0 / speed);
        cell.ttft_ms = Some(100.0);
        cell.total_tok_s = Some(speed * f64::from(concurrency));
        cell.average_active_requests = Some(f64::from(concurrency));
        cell.prefill_overlap_share = overlap;
        cell.overlapping_prefills = overlap.map(|s| s * 10.0);
        cell
    }

    fn doc(cells: Vec<DecodeCell>) -> MatrixDoc {
        let mut doc = MatrixDoc::new(crate::matrix::Metadata::default());
        doc.decode = cells;
        doc
    }

    #[test]
    fn the_report_marks_agreement_and_puts_interference_beside_the_gap() {
        let synthetic = doc(vec![
            cell(8192, 1, 118.5, Some(0.0)),
            cell(8192, 4, 77.7, Some(0.01)),
            cell(16384, 2, 86.3, Some(0.0)),
        ]);
        assert_eq!(
            steady_cells(&synthetic),
            vec![(8192, 1), (8192, 4), (16384, 2)]
        );
        // 8K × 1 agrees (within 5 % everywhere); 8K × 4 is 10 % slow.
        let steady = doc(vec![
            cell(8192, 1, 117.0, Some(0.0)),
            cell(8192, 4, 70.0, Some(0.0)),
        ]);
        let mixed = doc(vec![
            cell(8192, 4, 40.0, Some(0.45)),
            cell(65536, 1, 50.0, None),
        ]);
        let cells = steady_cells(&synthetic);
        let report = DemoReport {
            synthetic: &synthetic,
            steady: Some(&steady),
            mixed: Some(&mixed),
            steady_cells: &cells,
            too_busy: None,
        };
        let (table, agreeing) = report.steady_table();
        assert_eq!(agreeing, 1);
        assert_eq!(table.rows[0].last().unwrap(), "✓");
        assert_eq!(
            table.rows[1].last().unwrap(),
            "✗ per-request tok/s, TBT, total tok/s"
        );
        assert!(table.rows[2][1].starts_with("no production cell"));
        // Only cells the sweep also has are compared; 1 − overlap stands beside the ratio.
        let mixed_table = report.mixed_table();
        assert_eq!(mixed_table.rows.len(), 1);
        let row = &mixed_table.rows[0];
        assert_eq!(row[2], "77.7 · 40.0 (×0.515)");
        assert_eq!(row[3], "45.0%");
        // Mean 160 ÷ 4 = 40.0 against 77.7 × 0.55 = 42.7.
        assert_eq!(row[5], "40.0 · 42.7 (×0.936)");
        let md = report.markdown();
        assert!(md.contains("1 of 3 cells agree"), "{md}");
        assert!(
            md.contains("Prefill overlap: the share of the cell's decode time"),
            "{md}"
        );
        let html = report.html();
        assert!(html.contains("<td class=\"num\">45.0%</td>"), "{html}");
    }

    /// Issue 45.2, one name per quantity: Total tok/s ÷ Average active requests is "Decode
    /// tok/s per stream", 1 ÷ TBT is "Per-request tok/s", each beside its own definition, in
    /// the definitions, the tables' headers and every rendering.
    #[test]
    fn the_report_names_the_two_speeds_apart() {
        let name = |definition: &str| definition.split(':').next().unwrap_or("").to_owned();
        let per_stream: Vec<&str> = DEFINITIONS
            .iter()
            .copied()
            .filter(|d| d.contains("Total tok/s ÷ Average active requests"))
            .collect();
        assert_eq!(per_stream.len(), 1, "{DEFINITIONS:?}");
        assert_eq!(name(per_stream[0]), "Decode tok/s per stream");
        let per_request: Vec<&str> = DEFINITIONS
            .iter()
            .copied()
            .filter(|d| name(d).to_lowercase().contains("per-request"))
            .collect();
        assert_eq!(per_request.len(), 1, "{DEFINITIONS:?}");
        assert!(
            per_request[0].starts_with("Per-request tok/s: 1 ÷ TBT"),
            "{per_request:?}"
        );

        let synthetic = doc(vec![cell(8192, 4, 77.7, Some(0.0))]);
        let mixed = doc(vec![cell(8192, 4, 40.0, Some(0.45))]);
        let report = DemoReport {
            synthetic: &synthetic,
            steady: None,
            mixed: Some(&mixed),
            steady_cells: &[],
            too_busy: None,
        };
        let header = report.mixed_table().header;
        // The column of Total ÷ Average active is named for it; the 1 ÷ TBT column keeps its name.
        assert_eq!(
            header[5], "Decode tok/s per stream production · sweep × (1 − overlap)",
            "{header:?}"
        );
        assert_eq!(
            header[2], "Per-request tok/s sweep · production",
            "{header:?}"
        );
        for text in [report.markdown(), report.html(), report.terminal()] {
            let lower = text.to_lowercase();
            assert!(!lower.contains("mean per-request"), "{text}");
            assert!(!lower.contains("per-request speed"), "{text}");
        }
        let md = report.markdown();
        assert!(md.contains("Decode tok/s per stream"), "{md}");
        assert!(md.contains("Per-request tok/s: 1 ÷ TBT"), "{md}");
    }
}
