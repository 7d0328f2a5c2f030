//! The texts a matrix page is made of, shared by every page-like rendering and both importers:
//! the title, the summary line, the "All measurements" rows, the grid cell texts and the
//! legends (the fact lists come from `facts.rs`).
//!
//! Owns the mapping between measurements and page wording (`Total tok/s`, `Over capacity`, …)
//! in both directions. Pure: no I/O, no markup (callers escape for their format).
use super::doc::{
    CellStatus, DecodeCell, FirstTokens, MatrixDoc, Metadata, PrefillRow, PromptCache, ServerState,
    Source, Tails,
};
use super::evidence::evidence_label;
use super::units::{
    context_label, format_count, format_decimal, format_ms_tenths, format_ms_whole, format_percent,
    format_rate, format_seconds_tenths, or_missing, parse_context, parse_count, parse_decimal,
    parse_optional, parse_percent, parse_rate, parse_with_unit, ValueError,
};

pub const PAGE_TITLE: &str = "Speed test matrix";
pub const SECTION_LAUNCH: &str = "Launch command";
pub const SECTION_NOTES: &str = "Notes";
pub const SECTION_PREFILL: &str = "Prefill";
pub const SECTION_DECODE: &str = "Sustained decode";
pub const SECTION_ALL: &str = "All measurements";

pub const PREFILL_CAPTION: &str = "prompt tok/s by context length";
pub const DECODE_CAPTION: &str =
    "total tok/s · rows are context length, columns are simultaneous requests";
pub const ALL_CAPTION: &str =
    "Latencies are medians. Total tok/s is output across all simultaneous requests.";
pub const LEGEND_OVER_CAPACITY: &str = "Over capacity: not run because this many requests at this context would exceed the server's KV cache.";
pub const LEGEND_NOT_RUN: &str =
    "Not run: the benchmark skipped this measurement during the run, or the run stopped early.";
pub const LEGEND_ERROR: &str =
    "Error: the measurement failed; the reason is in the All measurements table.";
pub const LEGEND_SHED: &str = "Shed: the engine refused more than 5 % of the cell's requests for load (HTTP 429/503, a queue cap such as vLLM's --max-num-queued-reqs or sglang's --max-queued-requests); its figures are the admitted requests', and capacity counts it as an SLO miss.";
pub const LEGEND_LOW_EVIDENCE: &str = "Low evidence: too few seconds or output tokens to trust its decode figures (n = completed requests, what its TTFT rests on); shown greyed, never in a ratio or a colour scale.";
pub const LEGEND_OFF_TARGET: &str = "Off target: the sweep cell did not run at its concurrency (the server's average active requests were off it, or production prefills overlapped its decode); its figures measured another cell.";
pub const LEGEND_BURSTS: &str = "Delivered in bursts: more than 1 in 20 of the cell's streams had most of their token events arrive together (the engine or a gateway handed the stream over at once), so its gaps measure the delivery, not the decode steps; shown greyed, never in a ratio, a colour scale or a capacity answer.";
pub const TTFT_NOTE_SYNTHETIC: &str =
    "TTFT is measured after the benchmark warms the server's prompt cache, so it mostly excludes prefill.";
pub const TTFT_NOTE_PRODUCTION: &str =
    "TTFT of production requests includes the prefill of their uncached prompt tokens.";

/// One name per quantity (issue 45.2). Total tok/s ÷ average active requests — decode tokens
/// per request-second of decode, a mean over the cell — is the "decode tok/s per stream"
/// wherever it is shown; "per-request tok/s" is only ever 1 ÷ TBT of one stream (the median over
/// the cell's requests, the "Per request tok/s" column). Steady traffic gives both the same
/// figure; a server that stalls decoding for others' prefills does not.
pub const PER_STREAM: &str = "decode tok/s per stream";
/// What [`PER_STREAM`] is, in the words shown beside it.
pub const PER_STREAM_DEFINITION: &str = "total tok/s ÷ average active requests";
/// The name of 1 ÷ TBT (the "Per request tok/s" column), never of [`PER_STREAM`].
pub const PER_REQUEST: &str = "per-request tok/s";
/// What [`PER_REQUEST`] is, in the words shown beside it.
pub const PER_REQUEST_DEFINITION: &str =
    "1 ÷ TBT of one stream, the median over the cell's requests";

pub const PHASE_PREFILL: &str = "Prefill";
pub const PHASE_DECODE: &str = "Sustained decode";

/// Column headers of the "All measurements" table, in order.
pub const MEASUREMENT_COLUMNS: [&str; 12] = [
    "Phase",
    "Context",
    "Requests at once",
    "Status",
    "Total tok/s",
    "Per request tok/s",
    "TTFT",
    "Time between tokens",
    "Average active requests",
    "Completed requests",
    "Output tokens",
    "Measured for",
];
/// The optional 13th column, present when any row knows its real prompt length.
pub const PROMPT_TOKENS_COLUMN: &str = "Prompt tokens";
/// The optional interference columns, present when any cell measured prefill interference.
pub const PREFILL_OVERLAP_COLUMN: &str = "Prefill overlap";
pub const OVERLAPPING_PREFILLS_COLUMN: &str = "Overlapping prefills";
/// The optional SLO columns, present when any cell had requests with SLO targets.
pub const SLO_ATTAINMENT_COLUMN: &str = "SLO attainment";
pub const GOODPUT_COLUMN: &str = "Goodput tok/s";
/// The optional server-state columns, present when any cell carries the server's scraped
/// state, in [`ServerState::values`] order.
pub const SERVER_STATE_COLUMNS: [&str; 4] = [
    "Server running",
    "Server queued",
    "KV cache usage",
    "Prefix cache hits",
];

/// The optional tail columns, present when any cell carries tails, in [`Tails::values`] order.
pub const TAIL_COLUMNS: [&str; 6] = [
    "TTFT p90", "TTFT p99", "TBT p90", "TBT p99", "ITL p90", "ITL p99",
];
/// The optional column of sweep cells that ran beside production traffic.
pub const PRODUCTION_IN_FLIGHT_COLUMN: &str = "Production in flight";
/// The optional column of the tokens each decode step gave (speculative decoding), present
/// when any cell carries it.
pub const TOKENS_PER_STEP_COLUMN: &str = "Tokens per step";
/// The optional prompt-cache columns, present when any cell carries them, in
/// [`PromptCache::values`] order.
pub const PROMPT_CACHE_COLUMNS: [&str; 5] = [
    "Cached share",
    "Warm TTFT",
    "Warm requests",
    "Cold TTFT",
    "Cold requests",
];
/// The optional first-token columns (reasoning models, tool calls), present when any cell
/// carries them, in [`FirstTokens::values`] order.
pub const FIRST_TOKEN_COLUMNS: [&str; 10] = [
    "Answer TTFT",
    "Answer TTFT p90",
    "Answer TTFT p99",
    "Answer requests",
    "Tool-call TTFT",
    "Tool-call TTFT p90",
    "Tool-call TTFT p99",
    "Tool-call requests",
    "Reasoning tokens",
    "Requests with tools",
];

/// Which optional columns follow the standard ones, in this order: Prompt tokens, then
/// Prefill overlap and Overlapping prefills, then SLO attainment and Goodput tok/s, then the
/// server-state columns, then the tails, then Production in flight, then the first-token
/// columns, then the prompt-cache columns, then Tokens per step. Pages written before a column existed simply lack it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalColumns {
    pub prompt_tokens: bool,
    pub interference: bool,
    pub slo: bool,
    pub server_state: bool,
    pub tails: bool,
    pub production_in_flight: bool,
    pub first_tokens: bool,
    pub prompt_cache: bool,
    pub tokens_per_step: bool,
}

impl OptionalColumns {
    /// The columns `doc` needs.
    pub fn of(doc: &MatrixDoc) -> OptionalColumns {
        OptionalColumns {
            prompt_tokens: has_prompt_tokens(doc),
            interference: has_interference(doc),
            slo: has_slo(doc),
            server_state: has_server_state(doc),
            tails: has_tails(doc),
            production_in_flight: has_production_in_flight(doc),
            first_tokens: doc.decode.iter().any(|cell| cell.first_tokens.is_some()),
            prompt_cache: doc.decode.iter().any(|cell| cell.prompt_cache.is_some()),
            tokens_per_step: doc.decode.iter().any(|cell| cell.tokens_per_step.is_some()),
        }
    }

    /// Their headers, in table order.
    pub fn headers(self) -> Vec<&'static str> {
        let mut headers = Vec::new();
        if self.prompt_tokens {
            headers.push(PROMPT_TOKENS_COLUMN);
        }
        if self.interference {
            headers.push(PREFILL_OVERLAP_COLUMN);
            headers.push(OVERLAPPING_PREFILLS_COLUMN);
        }
        if self.slo {
            headers.push(SLO_ATTAINMENT_COLUMN);
            headers.push(GOODPUT_COLUMN);
        }
        if self.server_state {
            headers.extend(SERVER_STATE_COLUMNS);
        }
        if self.tails {
            headers.extend(TAIL_COLUMNS);
        }
        if self.production_in_flight {
            headers.push(PRODUCTION_IN_FLIGHT_COLUMN);
        }
        if self.first_tokens {
            headers.extend(FIRST_TOKEN_COLUMNS);
        }
        if self.prompt_cache {
            headers.extend(PROMPT_CACHE_COLUMNS);
        }
        if self.tokens_per_step {
            headers.push(TOKENS_PER_STEP_COLUMN);
        }
        headers
    }
}

/// Reads an "All measurements" header: the optional columns that follow the standard ones, or
/// `None` when the header is anything else.
pub fn measurement_header_columns(header: &[String]) -> Option<OptionalColumns> {
    let standard = header.len() >= MEASUREMENT_COLUMNS.len()
        && header
            .iter()
            .zip(MEASUREMENT_COLUMNS)
            .all(|(got, want)| got == want);
    if !standard {
        return None;
    }
    let tail: Vec<&str> = header
        .iter()
        .skip(MEASUREMENT_COLUMNS.len())
        .map(String::as_str)
        .collect();
    (0u16..512)
        .map(|bits| OptionalColumns {
            prompt_tokens: bits & 1 != 0,
            interference: bits & 2 != 0,
            slo: bits & 4 != 0,
            server_state: bits & 8 != 0,
            tails: bits & 16 != 0,
            production_in_flight: bits & 32 != 0,
            first_tokens: bits & 64 != 0,
            prompt_cache: bits & 128 != 0,
            tokens_per_step: bits & 256 != 0,
        })
        .find(|columns| columns.headers() == tail)
}

/// The title line: `<model> on <hardware>`.
pub fn title(metadata: &Metadata) -> String {
    let model = metadata.model.title_name().unwrap_or("Unknown model");
    match metadata.hardware.summary() {
        Some(hardware) => format!("{model} on {hardware}"),
        None => model.to_owned(),
    }
}

/// Splits a title into its model and hardware parts and stores them in canonical form: a part
/// equal to what the fields already imply is stored as `None`. Call after the facts are in.
pub fn apply_title(metadata: &mut Metadata, title: &str) {
    let (model, hardware) = match title.split_once(" on ") {
        Some((model, hardware)) => (model, Some(hardware)),
        None => (title, None),
    };
    let fallback = metadata
        .model
        .served_model
        .as_deref()
        .or(metadata.model.model_path.as_deref())
        .unwrap_or("Unknown model");
    metadata.model.display_name = (model != fallback).then(|| model.to_owned());
    metadata.hardware.label = match hardware {
        Some(hardware) if Some(hardware) != metadata.hardware.derived_summary().as_deref() => {
            Some(hardware.to_owned())
        }
        _ => None,
    };
}

/// `sglang · 0.0.0.dev0 · NVFP4`: engine, version and quantization that are known.
pub fn engine_summary(metadata: &Metadata) -> String {
    [
        &metadata.engine.name,
        &metadata.engine.version,
        &metadata.engine.quantization,
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect::<Vec<_>>()
    .join(" · ")
}

fn plural(count: usize, singular: &str, plural: &str) -> String {
    if count == 1 {
        format!("1 {singular}")
    } else {
        format!("{count} {plural}")
    }
}

fn range_label<T: Copy>(values: &[T], label: impl Fn(T) -> String) -> String {
    match (values.first(), values.last()) {
        (Some(first), Some(last)) if values.len() > 1 => {
            format!("{}–{}", label(*first), label(*last))
        }
        (Some(first), _) => label(*first),
        _ => String::new(),
    }
}

/// The line under the title: `<engine summary><joiner><n> contexts (8K–1019K) × <m> concurrency
/// levels (1–128) · prefill at 8K, …`. The seed page has no separator after the engine summary
/// (its HTML elements run together), the Markdown rendering uses ` · `.
pub fn summary_line(doc: &MatrixDoc, engine_joiner: &str) -> String {
    let engine = engine_summary(&doc.metadata);
    let mut rest = Vec::new();
    let contexts = doc.contexts();
    let concurrencies = doc.concurrencies();
    if !contexts.is_empty() {
        rest.push(format!(
            "{} ({}) × {} ({})",
            plural(contexts.len(), "context", "contexts"),
            range_label(&contexts, context_label),
            plural(
                concurrencies.len(),
                "concurrency level",
                "concurrency levels"
            ),
            range_label(&concurrencies, |c| c.to_string()),
        ));
    }
    let prefill = doc.prefill_contexts();
    if !prefill.is_empty() {
        let labels: Vec<String> = prefill.into_iter().map(context_label).collect();
        rest.push(format!("prefill at {}", labels.join(", ")));
    }
    let rest = rest.join(" · ");
    match (engine.is_empty(), rest.is_empty()) {
        (true, _) => rest,
        (false, true) => engine,
        (false, false) => format!("{engine}{engine_joiner}{rest}"),
    }
}

/// The measured-value part of a grid cell: total tok/s and TTFT; the status text otherwise.
/// `None` for an absent cell.
pub fn grid_cell_parts(cell: Option<&DecodeCell>) -> Option<GridCellText> {
    let cell = cell?;
    Some(match &cell.status {
        CellStatus::Valid => GridCellText::Figures {
            total_tok_s: or_missing(cell.total_tok_s, format_rate),
            ttft: format!("{} TTFT", or_missing(cell.ttft_ms, format_ms_whole)),
        },
        CellStatus::LowEvidence => GridCellText::Caveat {
            status: CellStatus::LowEvidence.to_string(),
            detail: evidence_label(cell),
        },
        CellStatus::OffTarget => GridCellText::Caveat {
            status: CellStatus::OffTarget.to_string(),
            detail: format!(
                "ran at {}",
                or_missing(cell.average_active_requests, |v| format_decimal(v, 1))
            ),
        },
        CellStatus::Bursts(reason) => GridCellText::Caveat {
            status: "Delivered in bursts".to_owned(),
            detail: reason.clone(),
        },
        other => GridCellText::Status(other.to_string()),
    })
}

/// What a grid cell shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GridCellText {
    /// A valid cell: `170.4` and `34 ms TTFT`.
    Figures { total_tok_s: String, ttft: String },
    /// A cell whose figures are not trusted: its status and the evidence that says why
    /// (`Low evidence` and `n=3 · 11 tok · 0.3 s`; `Off target` and `ran at 5.0`).
    Caveat { status: String, detail: String },
    /// `Over capacity`, `Not run`, `Error: …`, `Shed: …`.
    Status(String),
}

impl GridCellText {
    /// The cell as one string, the two figures joined by `joiner` (empty on the seed page).
    pub fn joined(&self, joiner: &str) -> String {
        match self {
            GridCellText::Figures { total_tok_s, ttft } => format!("{total_tok_s}{joiner}{ttft}"),
            GridCellText::Caveat { status, detail } => format!("{status}{joiner}{detail}"),
            GridCellText::Status(text) => text.clone(),
        }
    }
}

/// The legend sentences for the statuses present in the decode grid, in page order.
pub fn status_legends(doc: &MatrixDoc) -> Vec<&'static str> {
    let mut legends = Vec::new();
    if doc
        .decode
        .iter()
        .any(|c| c.status == CellStatus::OverCapacity)
    {
        legends.push(LEGEND_OVER_CAPACITY);
    }
    if doc.decode.iter().any(|c| c.status == CellStatus::NotRun) {
        legends.push(LEGEND_NOT_RUN);
    }
    if doc
        .decode
        .iter()
        .any(|c| matches!(c.status, CellStatus::Error(_)))
    {
        legends.push(LEGEND_ERROR);
    }
    if doc
        .decode
        .iter()
        .any(|c| matches!(c.status, CellStatus::Shed(_)))
    {
        legends.push(LEGEND_SHED);
    }
    if doc
        .decode
        .iter()
        .any(|c| c.status == CellStatus::LowEvidence)
    {
        legends.push(LEGEND_LOW_EVIDENCE);
    }
    if doc.decode.iter().any(|c| c.status == CellStatus::OffTarget) {
        legends.push(LEGEND_OFF_TARGET);
    }
    if doc
        .decode
        .iter()
        .any(|c| matches!(c.status, CellStatus::Bursts(_)))
    {
        legends.push(LEGEND_BURSTS);
    }
    legends
}

/// The note on what TTFT in the grid means, which depends on where the figures come from.
pub fn ttft_note(doc: &MatrixDoc) -> &'static str {
    match doc.metadata.run.source {
        Some(Source::Production) => TTFT_NOTE_PRODUCTION,
        _ => TTFT_NOTE_SYNTHETIC,
    }
}

/// Whether the table needs the optional "Prompt tokens" column.
pub fn has_prompt_tokens(doc: &MatrixDoc) -> bool {
    doc.prefill.iter().any(|row| row.prompt_tokens.is_some())
        || doc.decode.iter().any(|cell| cell.prompt_tokens.is_some())
}

/// Whether the table needs the optional interference columns.
pub fn has_interference(doc: &MatrixDoc) -> bool {
    doc.decode
        .iter()
        .any(|cell| cell.prefill_overlap_share.is_some() || cell.overlapping_prefills.is_some())
}

/// Whether the table needs the optional SLO columns.
pub fn has_slo(doc: &MatrixDoc) -> bool {
    doc.decode
        .iter()
        .any(|cell| cell.slo_attainment.is_some() || cell.goodput_tok_s.is_some())
}

/// Whether the table needs the optional server-state columns.
pub fn has_server_state(doc: &MatrixDoc) -> bool {
    doc.decode.iter().any(|cell| cell.server_state.is_some())
}

/// Whether the table needs the optional tail columns.
pub fn has_tails(doc: &MatrixDoc) -> bool {
    doc.decode.iter().any(|cell| cell.tails.is_some())
}

/// Whether the table needs the optional "Production in flight" column.
pub fn has_production_in_flight(doc: &MatrixDoc) -> bool {
    doc.decode
        .iter()
        .any(|cell| cell.production_in_flight.is_some())
}

/// The "All measurements" rows as page text, prefill rows first, each with the 12 standard
/// cells and the optional ones [`OptionalColumns::of`] `doc` asks for.
pub fn measurement_rows(doc: &MatrixDoc) -> Vec<Vec<String>> {
    let columns = OptionalColumns::of(doc);
    let with_prompt_tokens = columns.prompt_tokens;
    let mut prefill: Vec<&PrefillRow> = doc.prefill.iter().collect();
    prefill.sort_by_key(|row| row.context_tokens);
    let mut decode: Vec<&DecodeCell> = doc.decode.iter().collect();
    decode.sort_by_key(|cell| (cell.context_tokens, cell.concurrency));
    let missing = || super::units::MISSING.to_owned();
    let mut rows = Vec::with_capacity(prefill.len() + decode.len());
    for row in prefill {
        let mut cells = vec![
            PHASE_PREFILL.to_owned(),
            context_label(row.context_tokens),
            row.requests_at_once.to_string(),
            row.status.to_string(),
            or_missing(row.prompt_tok_s, format_rate),
            missing(),
            or_missing(row.ttft_ms, format_ms_whole),
            missing(),
            missing(),
            or_missing(row.completed_requests, format_count),
            missing(),
            missing(),
        ];
        if with_prompt_tokens {
            cells.push(or_missing(row.prompt_tokens, format_count));
        }
        if columns.interference {
            cells.push(missing());
            cells.push(missing());
        }
        if columns.slo {
            cells.push(missing());
            cells.push(missing());
        }
        if columns.server_state {
            cells.extend(SERVER_STATE_COLUMNS.map(|_| missing()));
        }
        if columns.tails {
            cells.extend(TAIL_COLUMNS.map(|_| missing()));
        }
        if columns.production_in_flight {
            cells.push(missing());
        }
        if columns.first_tokens {
            cells.extend(FIRST_TOKEN_COLUMNS.map(|_| missing()));
        }
        if columns.prompt_cache {
            cells.extend(PROMPT_CACHE_COLUMNS.map(|_| missing()));
        }
        if columns.tokens_per_step {
            cells.push(missing());
        }
        rows.push(cells);
    }
    for cell in decode {
        let mut cells = vec![
            PHASE_DECODE.to_owned(),
            context_label(cell.context_tokens),
            cell.concurrency.to_string(),
            cell.status.to_string(),
            or_missing(cell.total_tok_s, format_rate),
            or_missing(cell.per_request_tok_s, format_rate),
            or_missing(cell.ttft_ms, format_ms_whole),
            or_missing(cell.tbt_ms, format_ms_tenths),
            or_missing(cell.average_active_requests, |v| format_decimal(v, 1)),
            or_missing(cell.completed_requests, format_count),
            or_missing(cell.output_tokens, format_count),
            or_missing(cell.measured_for_s, format_seconds_tenths),
        ];
        if with_prompt_tokens {
            cells.push(or_missing(cell.prompt_tokens, format_count));
        }
        if columns.interference {
            cells.push(or_missing(cell.prefill_overlap_share, format_percent));
            cells.push(or_missing(cell.overlapping_prefills, |v| {
                format_decimal(v, 2)
            }));
        }
        if columns.slo {
            cells.push(or_missing(cell.slo_attainment, format_percent));
            cells.push(or_missing(cell.goodput_tok_s, format_rate));
        }
        if columns.server_state {
            let [running, queued, kv, hits] = cell.server_state.unwrap_or_default().values();
            cells.push(or_missing(running, |v| format_decimal(v, 1)));
            cells.push(or_missing(queued, |v| format_decimal(v, 1)));
            cells.push(or_missing(kv, format_percent));
            cells.push(or_missing(hits, format_percent));
        }
        if columns.tails {
            let [ttft90, ttft99, tbt90, tbt99, itl90, itl99] =
                cell.tails.unwrap_or_default().values();
            cells.push(or_missing(ttft90, format_ms_whole));
            cells.push(or_missing(ttft99, format_ms_whole));
            cells.push(or_missing(tbt90, format_ms_tenths));
            cells.push(or_missing(tbt99, format_ms_tenths));
            cells.push(or_missing(itl90, format_ms_tenths));
            cells.push(or_missing(itl99, format_ms_tenths));
        }
        if columns.production_in_flight {
            cells.push(or_missing(cell.production_in_flight, |v| {
                format_decimal(v, 1)
            }));
        }
        if columns.first_tokens {
            let values = cell.first_tokens.unwrap_or_default().values();
            for (index, value) in values.into_iter().enumerate() {
                // Times in whole milliseconds; counts and the reasoning-token mean whole.
                let time = !matches!(index, 3 | 7 | 8 | 9);
                cells.push(if time {
                    or_missing(value, format_ms_whole)
                } else {
                    or_missing(value, |v| format_decimal(v, 0))
                });
            }
        }
        if columns.prompt_cache {
            let [share, warm, warm_n, cold, cold_n] =
                cell.prompt_cache.unwrap_or_default().values();
            cells.push(or_missing(share, format_percent));
            cells.push(or_missing(warm, format_ms_whole));
            cells.push(or_missing(warm_n, |v| format_decimal(v, 0)));
            cells.push(or_missing(cold, format_ms_whole));
            cells.push(or_missing(cold_n, |v| format_decimal(v, 0)));
        }
        if columns.tokens_per_step {
            cells.push(or_missing(cell.tokens_per_step, |v| format_decimal(v, 2)));
        }
        rows.push(cells);
    }
    rows
}

/// The header of the "All measurements" table for `doc`.
pub fn measurement_header(doc: &MatrixDoc) -> Vec<&'static str> {
    let mut header = MEASUREMENT_COLUMNS.to_vec();
    header.extend(OptionalColumns::of(doc).headers());
    header
}

/// One parsed "All measurements" row.
// A row lives only while a page is imported, one at a time: boxing the larger variant would
// cost an allocation per row for no saving.
#[allow(
    clippy::large_enum_variant,
    reason = "built once per page render; boxing would only move the allocation"
)]
#[derive(Debug, Clone, PartialEq)]
pub enum MeasurementRow {
    Prefill(PrefillRow),
    Decode(DecodeCell),
}

/// Why a measurement row does not parse; the caller adds the line number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RowError {
    #[error("expected {expected} cells ({}), found {found}", MEASUREMENT_COLUMNS.join(" | "))]
    ColumnCount { expected: usize, found: usize },
    #[error("unknown phase {found:?}, expected \"Prefill\" or \"Sustained decode\"")]
    UnknownPhase { found: String },
    #[error("unknown status {found:?}, expected Valid, Low evidence, Off target, Over capacity, Not run, Error: <reason> or Shed: <reason>")]
    UnknownStatus { found: String },
    #[error("column {column:?}")]
    Value {
        column: &'static str,
        #[source]
        source: ValueError,
    },
    #[error("column {column:?} must be — in a Prefill row, found {found:?}")]
    NotForPrefill { column: &'static str, found: String },
}

/// Parses one row of the "All measurements" table (cells already split and unescaped).
pub fn parse_measurement_row(
    cells: &[String],
    columns: OptionalColumns,
) -> Result<MeasurementRow, RowError> {
    let optional = columns.headers();
    let expected = MEASUREMENT_COLUMNS.len() + optional.len();
    if cells.len() != expected {
        return Err(RowError::ColumnCount {
            expected,
            found: cells.len(),
        });
    }
    let column = |index: usize| {
        MEASUREMENT_COLUMNS
            .get(index)
            .or_else(|| {
                index
                    .checked_sub(MEASUREMENT_COLUMNS.len())
                    .and_then(|i| optional.get(i))
            })
            .copied()
            .unwrap_or(PROMPT_TOKENS_COLUMN)
    };
    let cell = |index: usize| cells.get(index).map(String::as_str).unwrap_or_default();
    let value = |index: usize| {
        move |source: ValueError| RowError::Value {
            column: column(index),
            source,
        }
    };
    let context = parse_context(cell(1)).map_err(value(1))?;
    let requests = parse_count(cell(2))
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            value(2)(ValueError {
                expected: "a number of requests like 32",
                found: cell(2).to_owned(),
            })
        })?;
    let status = CellStatus::parse(cell(3)).ok_or_else(|| RowError::UnknownStatus {
        found: cell(3).to_owned(),
    })?;
    let prompt_tokens = if columns.prompt_tokens {
        parse_optional(cell(12), parse_count).map_err(value(12))?
    } else {
        None
    };
    let interference_at = MEASUREMENT_COLUMNS.len() + usize::from(columns.prompt_tokens);
    let (overlap_share, overlapping) = if columns.interference {
        (
            parse_optional(cell(interference_at), parse_percent).map_err(value(interference_at))?,
            parse_optional(cell(interference_at + 1), parse_decimal)
                .map_err(value(interference_at + 1))?,
        )
    } else {
        (None, None)
    };
    let slo_at = interference_at + 2 * usize::from(columns.interference);
    let (slo_attainment, goodput) = if columns.slo {
        (
            parse_optional(cell(slo_at), parse_percent).map_err(value(slo_at))?,
            parse_optional(cell(slo_at + 1), parse_rate).map_err(value(slo_at + 1))?,
        )
    } else {
        (None, None)
    };
    let state_at = slo_at + 2 * usize::from(columns.slo);
    let server_state = if columns.server_state {
        let decimal = |i: usize| parse_optional(cell(i), parse_decimal).map_err(value(i));
        let percent = |i: usize| parse_optional(cell(i), parse_percent).map_err(value(i));
        ServerState::from_values([
            decimal(state_at)?,
            decimal(state_at + 1)?,
            percent(state_at + 2)?,
            percent(state_at + 3)?,
        ])
    } else {
        None
    };
    let tails_at = state_at + SERVER_STATE_COLUMNS.len() * usize::from(columns.server_state);
    let tails = if columns.tails {
        let ms = |i: usize| parse_optional(cell(i), |t| parse_with_unit(t, "ms")).map_err(value(i));
        Tails::from_values([
            ms(tails_at)?,
            ms(tails_at + 1)?,
            ms(tails_at + 2)?,
            ms(tails_at + 3)?,
            ms(tails_at + 4)?,
            ms(tails_at + 5)?,
        ])
    } else {
        None
    };
    let in_flight_at = tails_at + TAIL_COLUMNS.len() * usize::from(columns.tails);
    let production_in_flight = if columns.production_in_flight {
        parse_optional(cell(in_flight_at), parse_decimal).map_err(value(in_flight_at))?
    } else {
        None
    };
    let first_at = in_flight_at + usize::from(columns.production_in_flight);
    let first_tokens = if columns.first_tokens {
        let mut values = [None; FIRST_TOKEN_COLUMNS.len()];
        for (offset, slot) in values.iter_mut().enumerate() {
            let i = first_at + offset;
            *slot = if matches!(offset, 3 | 7 | 8 | 9) {
                parse_optional(cell(i), parse_decimal).map_err(value(i))?
            } else {
                parse_optional(cell(i), |t| parse_with_unit(t, "ms")).map_err(value(i))?
            };
        }
        FirstTokens::from_values(values)
    } else {
        None
    };
    let cache_at = first_at + FIRST_TOKEN_COLUMNS.len() * usize::from(columns.first_tokens);
    let prompt_cache = if columns.prompt_cache {
        let ms = |i: usize| parse_optional(cell(i), |t| parse_with_unit(t, "ms")).map_err(value(i));
        let decimal = |i: usize| parse_optional(cell(i), parse_decimal).map_err(value(i));
        PromptCache::from_values([
            parse_optional(cell(cache_at), parse_percent).map_err(value(cache_at))?,
            ms(cache_at + 1)?,
            decimal(cache_at + 2)?,
            ms(cache_at + 3)?,
            decimal(cache_at + 4)?,
        ])
    } else {
        None
    };
    let step_at = cache_at + PROMPT_CACHE_COLUMNS.len() * usize::from(columns.prompt_cache);
    let tokens_per_step = if columns.tokens_per_step {
        parse_optional(cell(step_at), parse_decimal).map_err(value(step_at))?
    } else {
        None
    };
    match cell(0) {
        PHASE_PREFILL => {
            let mut decode_only = vec![5, 7, 8, 10, 11];
            if columns.interference {
                decode_only.extend([interference_at, interference_at + 1]);
            }
            if columns.slo {
                decode_only.extend([slo_at, slo_at + 1]);
            }
            if columns.server_state {
                decode_only.extend(state_at..state_at + SERVER_STATE_COLUMNS.len());
            }
            if columns.tails {
                decode_only.extend(tails_at..tails_at + TAIL_COLUMNS.len());
            }
            if columns.production_in_flight {
                decode_only.push(in_flight_at);
            }
            if columns.first_tokens {
                decode_only.extend(first_at..first_at + FIRST_TOKEN_COLUMNS.len());
            }
            if columns.prompt_cache {
                decode_only.extend(cache_at..cache_at + PROMPT_CACHE_COLUMNS.len());
            }
            if columns.tokens_per_step {
                decode_only.push(step_at);
            }
            for index in decode_only {
                if cell(index) != super::units::MISSING {
                    return Err(RowError::NotForPrefill {
                        column: column(index),
                        found: cell(index).to_owned(),
                    });
                }
            }
            Ok(MeasurementRow::Prefill(PrefillRow {
                context_tokens: context,
                requests_at_once: requests,
                status,
                prompt_tok_s: parse_optional(cell(4), parse_rate).map_err(value(4))?,
                ttft_ms: parse_optional(cell(6), |t| parse_with_unit(t, "ms")).map_err(value(6))?,
                completed_requests: parse_optional(cell(9), parse_count).map_err(value(9))?,
                prompt_tokens,
            }))
        }
        PHASE_DECODE => Ok(MeasurementRow::Decode(DecodeCell {
            context_tokens: context,
            concurrency: requests,
            status,
            total_tok_s: parse_optional(cell(4), parse_rate).map_err(value(4))?,
            per_request_tok_s: parse_optional(cell(5), parse_rate).map_err(value(5))?,
            ttft_ms: parse_optional(cell(6), |t| parse_with_unit(t, "ms")).map_err(value(6))?,
            tbt_ms: parse_optional(cell(7), |t| parse_with_unit(t, "ms")).map_err(value(7))?,
            average_active_requests: parse_optional(cell(8), parse_decimal).map_err(value(8))?,
            completed_requests: parse_optional(cell(9), parse_count).map_err(value(9))?,
            output_tokens: parse_optional(cell(10), parse_count).map_err(value(10))?,
            measured_for_s: parse_optional(cell(11), |t| parse_with_unit(t, "s"))
                .map_err(value(11))?,
            prompt_tokens,
            prefill_overlap_share: overlap_share,
            overlapping_prefills: overlapping,
            slo_attainment,
            goodput_tok_s: goodput,
            server_state,
            tails,
            production_in_flight,
            first_tokens,
            prompt_cache,
            tokens_per_step,
        })),
        other => Err(RowError::UnknownPhase {
            found: other.to_owned(),
        }),
    }
}

/// Pulls `--model-path X` (or `--model X`) out of a launch command, for pages that only show it there.
pub fn model_path_from_command(command: &str) -> Option<String> {
    let mut words = command.split_whitespace();
    while let Some(word) = words.next() {
        for flag in ["--model-path", "--model"] {
            if word == flag {
                return words
                    .next()
                    .map(|value| value.trim_matches(['"', '\'']).to_owned());
            }
            if let Some(value) = word
                .strip_prefix(flag)
                .and_then(|rest| rest.strip_prefix('='))
            {
                return Some(value.trim_matches(['"', '\'']).to_owned());
            }
        }
    }
    None
}
