//! The capture sink: one shape row per production request, handed off without waiting.
//!
//! [`WorkloadCapture`] is a [`RecordSink`]. At a request's end it copies the record's shape
//! (never text: token counts, route, model, outcome, the salted prefix block ids computed when
//! the body was read) into a bounded channel with `try_send`, so the request task neither
//! locks nor waits; a full channel drops the row and counts it. One writer task drains the
//! channel in batches into the store's `workload` table (pruned by age and count), or into a
//! bounded in-memory ring when there is no store.

use crate::base::error::error_chain;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::base::wallclock::{format_rfc3339, from_unix_millis, unix_millis};
use crate::base::Source;
use crate::config::WorkloadConfig;
use crate::meter::record::RequestRecord;
use crate::meter::RecordSink;
use crate::store::{Store, WorkloadRow};

use super::export::{request_of_row, ExportRows};
use super::trace::{SessionTurn, Trace};

/// Rows waiting for the writer; past this they are dropped (and counted).
const CHANNEL_ROWS: usize = 4096;

/// Rows the writer puts in one transaction.
const BATCH_ROWS: usize = 512;

/// Most rows the in-memory ring keeps (without a store), whatever `max_requests` says: a row
/// with its block ids is up to ~0.5 KiB, so this bounds the ring at ~50 MiB.
pub const MAX_MEMORY_ROWS: u64 = 100_000;

pub use super::export::MAX_EXPORT_ROWS;

enum Message {
    Row(WorkloadRow),
    /// Answered once every row sent before it is stored.
    Flush(oneshot::Sender<()>),
}

/// Where rows are kept.
#[derive(Debug, Clone)]
enum Keep {
    Store(Arc<Store>),
    Memory(Arc<Mutex<VecDeque<WorkloadRow>>>),
}

/// The workload capture: a sink of the proxy's meter and the reader of what it kept.
#[derive(Debug)]
pub struct WorkloadCapture {
    sender: mpsc::Sender<Message>,
    keep: Keep,
    /// Rows handed to the writer.
    captured: AtomicU64,
    /// Rows dropped because the writer was behind.
    dropped: Arc<AtomicU64>,
    /// Rows of batches the store failed to write.
    failed: Arc<AtomicU64>,
    /// One permit per export running (`workload.max_exports`).
    exports: Arc<Semaphore>,
    max_exports: usize,
    /// Exports refused because `max_exports` were running.
    refused: Arc<AtomicU64>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Row(_) => f.write_str("Row"),
            Message::Flush(_) => f.write_str("Flush"),
        }
    }
}

impl WorkloadCapture {
    /// Starts the writer task (on the current runtime) and returns the sink.
    pub fn start(config: &WorkloadConfig, store: Option<Arc<Store>>) -> Arc<Self> {
        let (sender, receiver) = mpsc::channel(CHANNEL_ROWS);
        let keep = match store {
            Some(store) => Keep::Store(store),
            None => Keep::Memory(Arc::default()),
        };
        let failed: Arc<AtomicU64> = Arc::default();
        tokio::spawn(write_rows(
            receiver,
            keep.clone(),
            config.max_requests,
            (!config.max_age.is_zero()).then_some(config.max_age),
            Arc::clone(&failed),
        ));
        Arc::new(Self {
            sender,
            keep,
            captured: AtomicU64::new(0),
            dropped: Arc::default(),
            failed,
            exports: Arc::new(Semaphore::new(config.max_exports)),
            max_exports: config.max_exports,
            refused: Arc::default(),
        })
    }

    /// Rows captured, rows dropped (the writer was behind) and rows lost to failed store
    /// writes, since start.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.captured.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// The counters of lost rows, for `/metrics`: (writer behind, store failed).
    pub fn lost_counters(&self) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        (Arc::clone(&self.dropped), Arc::clone(&self.failed))
    }

    /// The counter of exports refused at the bound, for `/metrics`.
    pub fn refused_exports(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.refused)
    }

    /// A slot for one export, held until the export ends; `Err(max_exports)` (counted) when
    /// that many are running.
    pub fn export_slot(&self) -> Result<OwnedSemaphorePermit, usize> {
        Arc::clone(&self.exports).try_acquire_owned().map_err(|_| {
            self.refused.fetch_add(1, Ordering::Relaxed);
            self.max_exports
        })
    }

    /// The rows of the requests that arrived in the last `window` (flushed first), ready to be
    /// streamed by `export::write_export`: from the store, a reader on its own connection
    /// (never the store's mutex); from the ring, a copy (at most [`MAX_MEMORY_ROWS`]).
    pub async fn export_rows(&self, window: Duration) -> anyhow::Result<ExportRows> {
        self.flush().await;
        let from = SystemTime::now()
            .checked_sub(window)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(match &self.keep {
            Keep::Store(store) => {
                let store = Arc::clone(store);
                ExportRows::Store(
                    tokio::task::spawn_blocking(move || {
                        store.workload_reader(from, MAX_EXPORT_ROWS)
                    })
                    .await??,
                )
            }
            Keep::Memory(ring) => {
                let from = unix_millis(from);
                ExportRows::memory(
                    ring.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .iter()
                        .filter(|r| r.started_ms >= from)
                        .take(MAX_EXPORT_ROWS)
                        .cloned()
                        .collect(),
                )
            }
        })
    }

    /// Waits until every row captured so far is kept.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// The trace of the requests that arrived in the last `window` (flushed first).
    pub async fn export(&self, window: Duration) -> anyhow::Result<Trace> {
        self.flush().await;
        let from = SystemTime::now()
            .checked_sub(window)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let rows = match &self.keep {
            Keep::Store(store) => {
                let store = Arc::clone(store);
                tokio::task::spawn_blocking(move || store.workload_since(from, MAX_EXPORT_ROWS))
                    .await??
            }
            Keep::Memory(ring) => {
                let from = unix_millis(from);
                ring.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter(|r| r.started_ms >= from)
                    .take(MAX_EXPORT_ROWS)
                    .cloned()
                    .collect()
            }
        };
        Ok(trace_of_rows(rows))
    }
}

impl RecordSink for WorkloadCapture {
    fn record(&self, record: &Arc<RequestRecord>) {
        if record.labels.source != Source::Production {
            return;
        }
        match self.sender.try_send(Message::Row(row_of(record))) {
            Ok(()) => self.captured.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// The shape of one record.
pub fn row_of(record: &RequestRecord) -> WorkloadRow {
    WorkloadRow {
        started_ms: unix_millis(record.timing.started_at),
        route: record.labels.route.label().to_string(),
        model: record.labels.model.to_string(),
        stream: record.streaming,
        prompt_tokens: record.tokens.prompt,
        cached_tokens: record.tokens.cached,
        max_tokens: record.tokens.max,
        output_tokens: record.tokens.completion,
        outcome: record.outcome.label().to_string(),
        prefix_blocks: record.prefix_blocks.clone(),
        turn: serde_json::to_string(&turn_of(record)).ok(),
    }
}

/// The record as a turn of its session (when the session table placed it) and its answer's
/// first-byte and end times (always).
pub fn turn_of(record: &RequestRecord) -> SessionTurn {
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let turn = record.turn.as_ref();
    SessionTurn {
        session: turn.map(|t| format!("{:016x}", t.session)),
        turn: turn.map(|t| t.index),
        input: turn.map(|t| t.after.label().to_string()),
        gap_ms: turn.and_then(|t| t.gap).map(millis),
        first_byte_ms: record.timing.to_first_byte.map(millis),
        end_ms: Some(millis(record.timing.duration)),
        // The one finish reason the record keeps: the answer called a tool.
        finish_reason: record
            .timing
            .ttft_tool_call
            .is_some()
            .then(|| "tool_calls".to_string()),
        ..SessionTurn::default()
    }
}

/// Stored rows (oldest first) as a trace: arrival offsets from the first, block ids cut to
/// the blocks the prompt's token count covers, then renumbered. (The whole trace in memory:
/// for small captures; exports stream through `export::write_export`.)
pub fn trace_of_rows(mut rows: Vec<WorkloadRow>) -> Trace {
    rows.sort_by_key(|r| r.started_ms);
    let first = rows.first().map(|r| r.started_ms);
    let requests = rows
        .into_iter()
        .map(|row| request_of_row(row, first.unwrap_or(0)))
        .collect();
    Trace::new(
        "capture",
        first.map(|ms| format_rfc3339(from_unix_millis(ms))),
        requests,
    )
}

/// Least time between two warnings about failing store writes in one episode.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Failing batch writes, told once per episode with their cause (a full disk fails every batch:
/// one line per batch would flood the log), then at most once a minute with the rows lost, and
/// once when writing works again.
#[derive(Debug, Default)]
struct StoreFailures {
    batches: u64,
    rows: u64,
    last_warned: Option<tokio::time::Instant>,
}

impl StoreFailures {
    fn failed(&mut self, error: &(dyn std::error::Error + 'static), rows: u64) {
        self.batches += 1;
        self.rows += rows;
        let now = tokio::time::Instant::now();
        if self
            .last_warned
            .is_some_and(|at| now.duration_since(at) < FAILURE_LOG_EVERY)
        {
            return;
        }
        self.last_warned = Some(now);
        tracing::warn!(
            cause = %error_chain(error),
            batches = self.batches,
            rows_lost = self.rows,
            "cannot store captured workload rows; they are lost (tokentap_workload_rows_lost_total{{reason=\"store_failed\"}})"
        );
    }

    fn worked(&mut self) {
        if self.batches > 0 {
            tracing::warn!(
                batches = self.batches,
                rows_lost = self.rows,
                "storing captured workload rows again"
            );
            *self = Self::default();
        }
    }
}

/// The writer: batches rows into the store (or the ring), prunes, answers flushes. Ends when
/// the capture is dropped.
async fn write_rows(
    mut receiver: mpsc::Receiver<Message>,
    keep: Keep,
    max_rows: u64,
    max_age: Option<Duration>,
    failed_rows: Arc<AtomicU64>,
) {
    let mut failures = StoreFailures::default();
    let mut batch = Vec::with_capacity(BATCH_ROWS);
    let mut flushes = Vec::new();
    let mut since_prune = 0usize;
    while let Some(message) = receiver.recv().await {
        let mut next = Some(message);
        while let Some(message) = next.take() {
            match message {
                Message::Row(row) => batch.push(row),
                Message::Flush(done) => flushes.push(done),
            }
            if batch.len() < BATCH_ROWS {
                next = receiver.try_recv().ok();
            }
        }
        since_prune += batch.len();
        let rows = std::mem::take(&mut batch);
        let count = rows.len() as u64;
        let cutoff = max_age.and_then(|age| SystemTime::now().checked_sub(age));
        match &keep {
            Keep::Store(store) => {
                let store = Arc::clone(store);
                let prune = since_prune >= BATCH_ROWS || !flushes.is_empty();
                if prune {
                    since_prune = 0;
                }
                let written = tokio::task::spawn_blocking(move || {
                    if !rows.is_empty() {
                        store.put_workload(&rows)?;
                    }
                    if prune {
                        store.prune_workload(cutoff, max_rows)?;
                    }
                    Ok::<_, crate::store::StoreError>(())
                })
                .await;
                match written {
                    Ok(Ok(())) => failures.worked(),
                    Ok(Err(error)) => {
                        failed_rows.fetch_add(count, Ordering::Relaxed);
                        failures.failed(&error, count);
                    }
                    Err(error) => {
                        failed_rows.fetch_add(count, Ordering::Relaxed);
                        failures.failed(&error, count);
                    }
                }
            }
            Keep::Memory(ring) => {
                let mut ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
                ring.extend(rows);
                let max = usize::try_from(max_rows.min(MAX_MEMORY_ROWS)).unwrap_or(usize::MAX);
                while ring.len() > max {
                    ring.pop_front();
                }
                if let Some(cutoff) = cutoff {
                    let cutoff = unix_millis(cutoff);
                    while ring.front().is_some_and(|r| r.started_ms < cutoff) {
                        ring.pop_front();
                    }
                }
            }
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
