//! A capture's export written as it is read: `GET /workload` and `tokentap workload export`
//! turn captured rows into trace lines page by page and hand each chunk on as it is made, so
//! an export of a full capture (1,000,000 rows) never holds the whole trace, its rows or its
//! text, in memory.
//!
//! Memory per export: one page of rows ([`EXPORT_PAGE_ROWS`]), one chunk of text
//! ([`EXPORT_CHUNK_BYTES`]) being written plus what the consumer holds (the admin endpoint's
//! channel holds [`EXPORT_CHANNEL_CHUNKS`]), and the prefix renumbering map, which is bounded:
//! it remembers the most recently seen [`RENUMBER_GENERATION`] to twice that many distinct
//! prefix block ids (≈ 9 MiB a generation). Within that the ids are exactly those of the
//! in-memory trace (dense, in order of first appearance); a block id seen again after more
//! distinct ids than that came between is given a new number, so equal numbers still mean a
//! shared prefix, but that far-apart sharing is no longer shown.

use std::collections::HashMap;

use crate::base::wallclock::{format_rfc3339, from_unix_millis};
use crate::store::{StoreError, WorkloadReader, WorkloadRow, EXPORT_PAGE_ROWS};

use super::formats::TraceFormat;
use super::sessions::SessionCursor;
use super::trace::{push_line, TraceHeader, TraceRequest, BLOCK_TOKENS, SCHEMA};
use super::{bailian, mooncake};

/// Most rows one export returns.
pub const MAX_EXPORT_ROWS: usize = 1_000_000;

/// Text handed on in one piece: a chunk is passed on once it reaches this size.
pub const EXPORT_CHUNK_BYTES: usize = 256 * 1024;

/// Chunks the admin endpoint queues between the reader and the connection: past them the
/// reader waits for the client (back-pressure, not a growing buffer).
pub const EXPORT_CHANNEL_CHUNKS: usize = 2;

/// Distinct prefix block ids one generation of the renumbering map holds: the exact capacity
/// of a 2¹⁹-bucket table (7/8 of it), ≈ 9 MiB.
pub const RENUMBER_GENERATION: usize = 458_752;

/// The rows an export reads: the store's snapshot, or the rows copied from the in-memory ring
/// (at most `capture::MAX_MEMORY_ROWS`), both oldest first.
#[derive(Debug)]
pub enum ExportRows {
    Store(WorkloadReader),
    Memory {
        rows: std::vec::IntoIter<WorkloadRow>,
        count: u64,
        first_ms: Option<i64>,
    },
}

impl ExportRows {
    /// Rows already in memory (sorted here by arrival; the sort is stable, so rows of the same
    /// millisecond keep the order they were captured in).
    pub fn memory(mut rows: Vec<WorkloadRow>) -> Self {
        rows.sort_by_key(|r| r.started_ms);
        let first_ms = rows.first().map(|r| r.started_ms);
        ExportRows::Memory {
            count: rows.len() as u64,
            rows: rows.into_iter(),
            first_ms,
        }
    }

    /// The rows this export holds.
    pub fn rows(&self) -> u64 {
        match self {
            ExportRows::Store(reader) => reader.rows(),
            ExportRows::Memory { count, .. } => *count,
        }
    }

    /// The first row's arrival (Unix milliseconds).
    pub fn first_ms(&self) -> Option<i64> {
        match self {
            ExportRows::Store(reader) => reader.first_ms(),
            ExportRows::Memory { first_ms, .. } => *first_ms,
        }
    }

    /// The next page of rows; empty at the end.
    fn next_page(&mut self) -> Result<Vec<WorkloadRow>, StoreError> {
        match self {
            ExportRows::Store(reader) => reader.next_page(EXPORT_PAGE_ROWS),
            ExportRows::Memory { rows, .. } => Ok(rows.by_ref().take(EXPORT_PAGE_ROWS).collect()),
        }
    }
}

/// A stored row as a trace request: its arrival offset from the first row, its block ids cut
/// to the blocks its prompt's token count covers (not yet renumbered).
pub fn request_of_row(row: WorkloadRow, first_ms: i64) -> TraceRequest {
    let prompt_tokens = row.prompt_tokens.unwrap_or(0);
    let covered = usize::try_from(prompt_tokens.div_ceil(BLOCK_TOKENS)).unwrap_or(0);
    let mut hash_ids = row.prefix_blocks;
    hash_ids.truncate(covered);
    TraceRequest {
        at_ms: u64::try_from(row.started_ms.saturating_sub(first_ms)).unwrap_or(0),
        route: Some(row.route),
        model: Some(row.model),
        stream: row.stream,
        prompt_tokens,
        cached_tokens: row.cached_tokens,
        max_tokens: row.max_tokens,
        output_tokens: row.output_tokens,
        outcome: Some(row.outcome),
        hash_ids,
        // A row this build wrote always parses; one that does not is shown without its turn.
        turn: row
            .turn
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default(),
    }
}

/// Dense renumbering of salted prefix block ids in order of first appearance, remembering a
/// bounded number of them: two generations of at most [`RENUMBER_GENERATION`] ids each; an
/// id found in the older one moves to the newer, and when the newer is full the older is
/// dropped.
#[derive(Debug, Default)]
struct Renumber {
    current: HashMap<u64, u64>,
    previous: HashMap<u64, u64>,
    next: u64,
}

impl Renumber {
    fn id(&mut self, salted: u64) -> u64 {
        if let Some(&dense) = self.current.get(&salted) {
            return dense;
        }
        let dense = self.previous.remove(&salted).unwrap_or_else(|| {
            let dense = self.next;
            self.next += 1;
            dense
        });
        if self.current.len() >= RENUMBER_GENERATION {
            // Free the older generation before the new one is allocated: at most two at once.
            self.previous = HashMap::new();
            self.previous = std::mem::replace(
                &mut self.current,
                HashMap::with_capacity(RENUMBER_GENERATION),
            );
        }
        self.current.insert(salted, dense);
        dense
    }
}

/// Writes an export's lines: the header (tokentap format), then one line per row.
#[derive(Debug)]
pub struct ExportWriter {
    format: TraceFormat,
    first_ms: i64,
    renumber: Renumber,
    /// Each session's latest turn, for the session formats (AIPerf, Bailian).
    sessions: SessionCursor,
}

impl ExportWriter {
    pub fn new(format: TraceFormat, first_ms: Option<i64>) -> Self {
        Self {
            format,
            first_ms: first_ms.unwrap_or(0),
            renumber: Renumber::default(),
            sessions: SessionCursor::default(),
        }
    }

    /// The header line (the tokentap format has one; Mooncake has none).
    pub fn header(&self, rows: u64, first_ms: Option<i64>, out: &mut String) {
        if self.format == TraceFormat::Tokentap {
            push_line(
                out,
                &TraceHeader {
                    schema: SCHEMA.to_string(),
                    block_tokens: BLOCK_TOKENS,
                    origin: "capture".to_string(),
                    start: first_ms.map(|ms| format_rfc3339(from_unix_millis(ms))),
                    requests: rows,
                },
            );
        }
    }

    /// One row's line.
    pub fn row(&mut self, row: WorkloadRow, out: &mut String) {
        let mut request = request_of_row(row, self.first_ms);
        for id in &mut request.hash_ids {
            *id = self.renumber.id(*id);
        }
        match self.format {
            TraceFormat::Tokentap => push_line(out, &request),
            TraceFormat::Mooncake => push_line(out, &mooncake::line_of(&request)),
            TraceFormat::Aiperf => {
                push_line(out, &mooncake::aiperf_line_of(&request, &mut self.sessions))
            }
            TraceFormat::Bailian => push_line(
                out,
                &bailian::line_of(&request, BLOCK_TOKENS, &mut self.sessions),
            ),
        }
    }
}

/// Writes the whole export of `rows` in `format`, handing `sink` chunks of about
/// [`EXPORT_CHUNK_BYTES`] as they are made. Returns `Ok(false)` when `sink` refused a chunk
/// (the reader went away: the export stops there), `Ok(true)` when every row was written.
/// Blocking (it reads the store): run it on a blocking thread.
pub fn write_export(
    rows: &mut ExportRows,
    format: TraceFormat,
    mut sink: impl FnMut(String) -> bool,
) -> Result<bool, StoreError> {
    let first_ms = rows.first_ms();
    let mut writer = ExportWriter::new(format, first_ms);
    let mut out = String::with_capacity(EXPORT_CHUNK_BYTES + 4096);
    writer.header(rows.rows(), first_ms, &mut out);
    loop {
        let page = rows.next_page()?;
        if page.is_empty() {
            break;
        }
        for row in page {
            writer.row(row, &mut out);
            if out.len() >= EXPORT_CHUNK_BYTES
                && !sink(std::mem::replace(
                    &mut out,
                    String::with_capacity(EXPORT_CHUNK_BYTES + 4096),
                ))
            {
                return Ok(false);
            }
        }
    }
    Ok(out.is_empty() || sink(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::capture::trace_of_rows;
    use crate::workload::render;

    fn row(started_ms: i64, prompt_tokens: u64, blocks: Vec<u64>) -> WorkloadRow {
        WorkloadRow {
            started_ms,
            route: "chat_completions".into(),
            model: "m".into(),
            stream: true,
            prompt_tokens: Some(prompt_tokens),
            cached_tokens: Some(512),
            max_tokens: None,
            output_tokens: 64,
            outcome: "ok".into(),
            prefix_blocks: blocks,
            turn: None,
        }
    }

    fn rows() -> Vec<WorkloadRow> {
        (0..5000i64)
            .map(|i| {
                let shared = u64::MAX - (i % 7) as u64;
                row(
                    1_750_000_000_000 + (i * 37) % 4000,
                    1100,
                    vec![shared, i as u64 * 11, 3],
                )
            })
            .collect()
    }

    #[test]
    fn the_streamed_export_is_byte_for_byte_the_in_memory_one() {
        for format in [TraceFormat::Tokentap, TraceFormat::Mooncake] {
            let expected = render(&trace_of_rows(rows()), format);
            let mut chunks = Vec::new();
            let done = write_export(&mut ExportRows::memory(rows()), format, |chunk| {
                chunks.push(chunk);
                true
            })
            .unwrap();
            assert!(done);
            assert!(chunks.len() > 1, "one chunk: nothing was streamed");
            assert!(chunks.iter().all(|c| c.len() < EXPORT_CHUNK_BYTES + 4096));
            assert_eq!(chunks.concat(), expected, "{format:?}");
        }
        let empty = render(&trace_of_rows(Vec::new()), TraceFormat::Tokentap);
        let mut text = String::new();
        write_export(
            &mut ExportRows::memory(Vec::new()),
            TraceFormat::Tokentap,
            |chunk| {
                text.push_str(&chunk);
                true
            },
        )
        .unwrap();
        assert_eq!(text, empty);
    }

    #[test]
    fn a_refused_chunk_stops_the_export() {
        let mut calls = 0;
        let done = write_export(
            &mut ExportRows::memory(rows()),
            TraceFormat::Tokentap,
            |_| {
                calls += 1;
                false
            },
        )
        .unwrap();
        assert!(!done);
        assert_eq!(calls, 1);
    }

    #[test]
    fn renumbering_is_dense_and_bounded() {
        let mut renumber = Renumber::default();
        // Exact while the ids fit: first appearance order.
        assert_eq!(renumber.id(900), 0);
        assert_eq!(renumber.id(7), 1);
        assert_eq!(renumber.id(900), 0);
        let total = 3 * RENUMBER_GENERATION as u64;
        for salted in 0..total {
            renumber.id(1_000_000 + salted);
            assert!(renumber.current.len() <= RENUMBER_GENERATION);
            assert!(renumber.previous.len() <= RENUMBER_GENERATION);
        }
        // The most recent ids keep their numbers.
        assert_eq!(renumber.id(1_000_000 + total - 1), total + 1);
        // A long-forgotten id gets a new number, never another id's.
        let again = renumber.id(900);
        assert_eq!(again, total + 2);
    }
}
