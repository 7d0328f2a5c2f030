//! The metering core: [`Meter`], shared by every request of a proxy instance, and the
//! [`RequestMeter`] of one request; the labels a request is recorded under, the cell it is
//! expected in, the usage counts, and the [`RecordSink`] trait records are handed to.
//!
//! [`Meter::begin`] counts a metered request in and returns its [`RequestMeter`], which the body
//! wrapper feeds per event and which publishes one [`RequestRecord`](super::record::RequestRecord)
//! when the request ends — exactly once, whichever way it ends (an explicit finish, or drop: a
//! client that hung up).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use tokio::time::Instant;

use crate::base::lock;
use crate::base::Source;

use super::bounds::{OVERHEAD_BOUNDS, TOKEN_GAP_BOUNDS};
use super::buckets::Ladder;
use super::conversation::Turn;
use super::inflight::{InflightGuard, InflightRegistry, InterferenceSpan};
use super::labels::{HeldRelease, RequestLabels, SettleLabels};
use super::record::{
    prefill_rate, time_between_tokens, Buckets, Interference, Outcome, Overhead, RequestRecord,
    SloResult, Timing, Tokens,
};
use super::server_state::{ServerStateRegistry, ServerStateTracker, StateReading};
use super::slo::{ResolvedSlo, SloFigures};
use super::timeline::Timeline;

/// Most tokens one SSE event may carry. Speculative decoding and sglang's `stream_interval`
/// put a handful to a few dozen tokens in an event; no real server sends a thousand. A larger
/// jump in the upstream's `completion_tokens` is clamped to this and flagged (the request's
/// count becomes approximate and `Meter::clamped_counts` goes up), so one absurd number costs
/// what a plausible event costs: its inter-token latency is flushed as one histogram sample
/// per token, and this bounds them.
pub const MAX_TOKENS_PER_EVENT: u64 = 1024;

/// Most tokens one request may report, prompt or completion (16.7 M: above every context
/// window served today). Larger usage numbers are clamped to this and flagged.
pub const MAX_TOKENS_PER_REQUEST: u64 = 1 << 24;

/// Token counts reported by the upstream (any field may be missing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Of the completion, the reasoning tokens (`completion_tokens_details.reasoning_tokens`),
    /// when the server sends them.
    pub reasoning_tokens: Option<u64>,
}

/// Receives every finished record. Called on the request's own task when it ends: keep it
/// short and never block (take a brief lock, bump counters, try_send to a channel).
pub trait RecordSink: Send + Sync {
    /// A metered request began (its labels are known once its body was read).
    fn started(&self, _labels: &RequestLabels) {}
    /// The cell a metered request is expected to land in, said when it is admitted (from
    /// its prompt's size) and again at its first token (from the prompt count the upstream
    /// reported, and the concurrency then) where that differs. A sink may create the cell's
    /// series at 0 now, so the increments it gets when the request ends are counted by
    /// Prometheus' `increase()`, which never counts a series' first sample.
    fn expected(&self, _labels: &RequestLabels, _cell: ExpectedCell) {}
    /// A metered request ended; called exactly once per `started`.
    fn record(&self, record: &Arc<RequestRecord>);
}

/// Where a request is expected to be recorded: the cell's buckets and the upstream's
/// configuration (see [`RecordSink::expected`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedCell {
    pub context: usize,
    pub concurrency: usize,
    pub fingerprint: super::identity::FingerprintId,
}

/// Bytes of a prompt's JSON per token, for the cell a request is expected in before the
/// upstream counted its prompt: about what English text and chat JSON take per token in
/// today's tokenizers (the simulator counts exactly this for text).
pub const PROMPT_BYTES_PER_TOKEN: u64 = 4;

/// Shared metering state of one proxy instance.
pub struct Meter {
    contexts: Ladder,
    concurrency: Ladder,
    inflight: InflightRegistry,
    /// The upstreams' own state as scraped from their `/metrics` (empty when not scraped).
    server_state: ServerStateRegistry,
    /// Which configuration each upstream runs (its fingerprint), as last read.
    identities: super::identity::IdentityRegistry,
    sinks: RwLock<Vec<Arc<dyn RecordSink>>>,
    /// Completion tokens seen in token events, per source, as they pass: the sweep reads this
    /// at window start and end to get "usage increments inside the window". Striped: every
    /// event adds to it, from whichever core serves it.
    live_tokens: [super::striped::StripedCounter; 2],
    /// Metered requests in flight per source (the sweep's production guard reads it).
    inflight_by_source: [AtomicI64; 2],
    /// Token counts from upstreams that no real server could send, clamped (see
    /// [`MAX_TOKENS_PER_EVENT`], [`MAX_TOKENS_PER_REQUEST`]).
    clamped_counts: AtomicU64,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("contexts", &self.contexts)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl Meter {
    pub fn new(contexts: Ladder, concurrency: Ladder) -> Arc<Self> {
        Arc::new(Self {
            contexts,
            concurrency,
            inflight: InflightRegistry::default(),
            server_state: ServerStateRegistry::default(),
            identities: super::identity::IdentityRegistry::default(),
            sinks: RwLock::new(Vec::new()),
            live_tokens: Default::default(),
            inflight_by_source: [AtomicI64::new(0), AtomicI64::new(0)],
            clamped_counts: AtomicU64::new(0),
        })
    }

    /// How many implausible token counts from upstreams were clamped since start.
    pub fn clamped_counts(&self) -> u64 {
        self.clamped_counts.load(Ordering::Relaxed)
    }

    pub fn contexts(&self) -> &Ladder {
        &self.contexts
    }

    pub fn concurrency(&self) -> &Ladder {
        &self.concurrency
    }

    /// The upstreams' scraped state, which each request reads at its start and end.
    pub fn server_state(&self) -> &ServerStateRegistry {
        &self.server_state
    }

    /// Which configuration each upstream runs: the fingerprint slots and their history.
    pub fn identities(&self) -> &super::identity::IdentityRegistry {
        &self.identities
    }

    /// Adds a sink; it sees every record finished from now on.
    pub fn add_sink(&self, sink: Arc<dyn RecordSink>) {
        lock::write(&self.sinks).push(sink);
    }

    /// Removes a sink added earlier (compared by pointer).
    pub fn remove_sink(&self, sink: &Arc<dyn RecordSink>) {
        lock::write(&self.sinks).retain(|s| !Arc::ptr_eq(s, sink));
    }

    /// Completion tokens seen so far in token events of `source`.
    pub fn live_tokens(&self, source: Source) -> u64 {
        self.live_tokens
            .get(source.index())
            .map_or(0, super::striped::StripedCounter::sum)
    }

    /// Metered requests of (`upstream`, `model`) in flight now, every source.
    pub fn inflight_of(&self, upstream: &str, model: &str) -> u32 {
        self.inflight.current(upstream, model)
    }

    /// Metered requests of `source` in flight now.
    pub fn inflight(&self, source: Source) -> u64 {
        self.inflight_by_source
            .get(source.index())
            .map_or(0, |c| c.load(Ordering::Relaxed).max(0) as u64)
    }

    /// Counts a metered request in: `start` says who it is and what its head and body said
    /// (labels alone for a request known only by them); `head_in` is when its head arrived.
    pub fn begin(
        self: &Arc<Self>,
        start: impl Into<RequestStart>,
        head_in: Instant,
    ) -> RequestMeter {
        let RequestStart {
            labels,
            max_tokens,
            with_tools,
            prefix_blocks,
            turn,
            slo,
            request_id,
            body_read,
            estimated_prompt_tokens,
            settle,
        } = start.into();
        let tracker = self.inflight.tracker(&labels.upstream, &labels.model);
        let guard = tracker.enter(head_in);
        let server_state = self
            .server_state
            .tracker(&labels.upstream, &labels.model)
            .map(|tracker| {
                let start = tracker.reading(head_in);
                (tracker, start)
            });
        if let Some(c) = self.inflight_by_source.get(labels.source.index()) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        // Provisional labels make no series: the sinks hear of the request once they are
        // settled (its first token) or as it ends.
        if settle.is_none() {
            for sink in lock::read(&self.sinks).iter() {
                sink.started(&labels);
            }
        }
        let mut timeline = Timeline::new(head_in, &TOKEN_GAP_BOUNDS, &OVERHEAD_BOUNDS);
        timeline.body_read = body_read;
        let mut meter = RequestMeter {
            meter: Arc::clone(self),
            timeline,
            started_at: SystemTime::now(),
            labels,
            guard: Some(guard),
            max_tokens,
            extras: (!prefix_blocks.is_empty() || turn.is_some()).then(|| {
                Box::new(StartExtras {
                    prefix_blocks,
                    turn,
                })
            }),
            status: 0,
            streaming: false,
            with_tools,
            inflight_at_head: tracker.current(),
            interference: InterferenceSpan::default(),
            clamped: false,
            slo,
            server_state,
            expected: None,
            request_id,
            settle,
        };
        if let Some(prompt_tokens) = estimated_prompt_tokens {
            meter.expect_cell(prompt_tokens);
        }
        meter
    }

    fn publish(&self, record: RequestRecord) -> Arc<RequestRecord> {
        let record = Arc::new(record);
        let sinks = lock::read(&self.sinks);
        for sink in sinks.iter() {
            sink.record(&record);
        }
        record
    }
}

/// What is known of a metered request as it starts, handed to [`Meter::begin`] in one piece:
/// who it is, and what its head and body said. A request known only by its labels (a test, a
/// bench) starts from them, the rest unknown (`From<RequestLabels>`).
#[derive(Debug, Clone)]
pub struct RequestStart {
    pub labels: RequestLabels,
    /// The generation limit the client set.
    pub max_tokens: Option<u64>,
    /// The request offered tools (`RequestFacts::with_tools`).
    pub with_tools: bool,
    /// The prompt's salted prefix block ids (empty unless the workload capture is on).
    pub prefix_blocks: Vec<u64>,
    /// The request as a turn of its session (`meter::conversation`), when it has one.
    pub turn: Option<Turn>,
    /// The request's SLO targets (none unless the proxy resolved some).
    pub slo: ResolvedSlo,
    /// The request's id, carried into its record (see `RequestRecord::request_id`).
    pub request_id: Option<Arc<str>>,
    /// When its body had been read whole: tokentap's own time before the upstream send counts
    /// from there (from head in without it).
    pub body_read: Option<Instant>,
    /// Its prompt's tokens as estimated from the prompt's size, when known: the cell it is
    /// expected in is said to the sinks as it begins ([`RequestMeter::expect_cell`]).
    pub estimated_prompt_tokens: Option<u64>,
    /// Set when the labels are provisional (the upstream has not said what it serves or runs
    /// yet): what settles them at the first token or at the end ([`SettleLabels`]).
    pub settle: Option<Arc<dyn SettleLabels>>,
}

impl From<RequestLabels> for RequestStart {
    fn from(labels: RequestLabels) -> Self {
        Self {
            labels,
            max_tokens: None,
            with_tools: false,
            prefix_blocks: Vec::new(),
            turn: None,
            slo: ResolvedSlo::default(),
            request_id: None,
            body_read: None,
            estimated_prompt_tokens: None,
            settle: None,
        }
    }
}

/// What a request started with that only its record reads.
#[derive(Debug)]
struct StartExtras {
    prefix_blocks: Vec<u64>,
    turn: Option<Turn>,
}

/// The measurement of one request in progress.
///
/// Laid out in declaration order (`repr(C)`), what every token event reads or writes first,
/// then the timeline (itself hot fields first): a stream's meter is cold by its next event,
/// so the fewer cache lines an event touches, the fewer memory reads it costs.
#[repr(C)]
pub struct RequestMeter {
    meter: Arc<Meter>,
    /// Present until the record is published.
    guard: Option<InflightGuard>,
    labels: RequestLabels,
    /// A token count of this request was clamped: its record is marked approximate.
    clamped: bool,
    streaming: bool,
    /// The request offered tools (`RequestFacts::with_tools`).
    with_tools: bool,
    /// The prefill integrals read at the first and the latest token.
    interference: InterferenceSpan,
    timeline: Timeline,
    started_at: SystemTime,
    max_tokens: Option<u64>,
    /// The prompt's prefix block ids and the request's turn, when either is there: read at
    /// the end only, so boxed out of the metering box every event touches.
    extras: Option<Box<StartExtras>>,
    /// Upstream status (or tokentap's own answer, e.g. 502).
    status: u16,
    inflight_at_head: u32,
    /// The request's SLO targets (none unless the proxy resolved some).
    slo: ResolvedSlo,
    /// The upstream's scraped-state tracker and its integrals at head in, when scraped.
    server_state: Option<(Arc<ServerStateTracker>, StateReading)>,
    /// The cell last announced to the sinks (`expect_cell`).
    expected: Option<ExpectedCell>,
    /// The request's id, carried into its record (see `RequestRecord::request_id`).
    request_id: Option<std::sync::Arc<str>>,
    /// While its labels are provisional: what settles them (cold: asked at the first token
    /// and at the end only).
    settle: Option<Arc<dyn SettleLabels>>,
}

impl std::fmt::Debug for RequestMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestMeter")
            .field("labels", &self.labels)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl RequestMeter {
    /// Says which cell this request is expected in, with `prompt_tokens` (counted by the
    /// upstream, or estimated from the prompt's size) and the concurrency in force now; the
    /// sinks hear of each cell once per request. Called at admission and at the first token
    /// (one read lock, like the first token's own bookkeeping; never on later events).
    pub fn expect_cell(&mut self, prompt_tokens: u64) {
        if self.guard.is_none() {
            return;
        }
        // Provisional labels are settled here if the upstream has said by now; until they
        // are, the cell is kept (a failed request's context) but no sink hears of it.
        let was_provisional = self.settle.is_some();
        let provisional = was_provisional && !self.settle_labels();
        let Some(guard) = &self.guard else {
            return;
        };
        let cell = ExpectedCell {
            context: self.meter.contexts.context_bucket(prompt_tokens),
            concurrency: self
                .meter
                .concurrency
                .concurrency_bucket_of_count(guard.tracker().current()),
            fingerprint: self.labels.fingerprint,
        };
        let newly_settled = was_provisional && !provisional;
        if self.expected == Some(cell) && !newly_settled {
            return;
        }
        self.expected = Some(cell);
        if provisional {
            return;
        }
        for sink in lock::read(&self.meter.sinks).iter() {
            sink.expected(&self.labels, cell);
        }
    }

    /// Settles provisional labels with what the upstream has said by now; whether they are
    /// settled. Once settled, the sinks hear that the request started (they heard nothing of
    /// it under its provisional labels). At most at the first token and at the end.
    fn settle_labels(&mut self) -> bool {
        let Some(settle) = &self.settle else {
            return true;
        };
        if !settle.settle(&mut self.labels) {
            return false;
        }
        self.settle = None;
        for sink in lock::read(&self.meter.sinks).iter() {
            sink.started(&self.labels);
        }
        true
    }

    /// The request was sent on to the upstream at `at`.
    pub fn upstream_sent(&mut self, at: Instant) {
        self.timeline.upstream_sent = Some(at);
    }

    /// The upstream's response head arrived at `at`, with `status`.
    pub fn response_head(&mut self, at: Instant, status: u16) {
        self.timeline.response_head = Some(at);
        self.status = status;
    }

    /// The status the request was answered with: the upstream's, or tokentap's own (a 502).
    pub fn set_status(&mut self, status: u16) {
        self.status = status;
    }

    /// The status the request was answered with (0 until it was).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Whether the answer is an event stream (a non-streamed answer reaches its client whole,
    /// which its SLO verdict reads).
    pub fn set_streaming(&mut self, streaming: bool) {
        self.streaming = streaming;
    }

    /// A frame of the response body arrived at `at`: the first one is its first byte. On every
    /// frame's path: one branch.
    #[inline]
    pub fn first_byte(&mut self, at: Instant) {
        self.timeline.first_byte.get_or_insert(at);
    }

    /// A frame that `arrived` was handed on at `forwarded`: the time tokentap held it.
    #[inline]
    pub fn frame(&mut self, arrived: Instant, forwarded: Instant) {
        self.timeline.frame(arrived, forwarded);
    }

    /// Whether no output token was seen yet (the next one is the first).
    pub fn before_first_token(&self) -> bool {
        self.guard.as_ref().is_some_and(InflightGuard::in_prefill)
    }

    /// Records an event that carried `tokens` tokens of output at `now`. No allocation, no
    /// lock: atomic reads of the in-flight count and the tracker's integrals, and field
    /// updates. (The first token also ends this request's prefill phase: one short writer
    /// lock per request, like entering and leaving.)
    pub fn token_event(&mut self, now: Instant, tokens: u64) {
        let tokens = self.plausible(tokens, MAX_TOKENS_PER_EVENT);
        let Some(guard) = &mut self.guard else {
            return;
        };
        let reading = if guard.in_prefill() {
            guard.end_prefill(now)
        } else {
            guard.tracker().reading(now)
        };
        let inflight = guard.tracker().current();
        let bucket = self.meter.concurrency.concurrency_bucket_of_count(inflight);
        self.interference.at_token(reading, bucket);
        self.timeline
            .token_event(now, tokens, inflight, bucket, reading.inflight_area);
        if let Some(c) = self.meter.live_tokens.get(self.labels.source.index()) {
            c.add(tokens.max(1));
        }
    }

    /// Records what kind of output a token event carried: the first answer token and the
    /// first tool-call delta are timed. Two branches, no lock.
    #[inline]
    pub fn output_kinds(&mut self, now: Instant, answer: bool, tool_call: bool) {
        if answer && self.timeline.first_answer.is_none() {
            self.timeline.first_answer = Some(now);
        }
        if tool_call && self.timeline.first_tool_call.is_none() {
            self.timeline.first_tool_call = Some(now);
        }
    }

    /// Records tokens the upstream reported without visible output (partial UTF-8 held back,
    /// a swallowed `<think>` marker): they count for throughput and share the next output
    /// event's gap in ITL, but are never the first or last token.
    pub fn silent_tokens(&mut self, now: Instant, tokens: u64) {
        let tokens = self.plausible(tokens, MAX_TOKENS_PER_EVENT);
        let Some(guard) = &self.guard else {
            return;
        };
        let bucket = self
            .meter
            .concurrency
            .concurrency_bucket_of_count(guard.tracker().current());
        self.timeline.split.add_tokens(bucket, tokens);
        self.timeline.silent_tokens(now, tokens);
        if let Some(c) = self.meter.live_tokens.get(self.labels.source.index()) {
            c.add(tokens);
        }
    }

    /// `count` if a real server could have sent it, else `max`, flagged. O(1) whatever the
    /// number: a count from the network is never looped over.
    fn plausible(&mut self, count: u64, max: u64) -> u64 {
        if count <= max {
            return count;
        }
        if !self.clamped {
            self.clamped = true;
            self.meter.clamped_counts.fetch_add(1, Ordering::Relaxed);
        }
        max
    }

    /// True once the record has been published.
    pub fn is_finished(&self) -> bool {
        self.guard.is_none()
    }

    /// The context and concurrency ladders a record's `buckets` index (for the cell's labels).
    pub fn ladders(&self) -> (&Ladder, &Ladder) {
        (&self.meter.contexts, &self.meter.concurrency)
    }

    /// Publishes the record and returns it (for what the client is handed back of it). Later
    /// calls (and the drop) do nothing and return `None`.
    pub fn finish(
        &mut self,
        outcome: Outcome,
        usage: Usage,
        completion_tokens: u64,
        exact: bool,
    ) -> Option<Arc<RequestRecord>> {
        // Already published: nothing to do (checked before the counts are clamped, which
        // would flag a finished record).
        self.guard.as_ref()?;
        let (usage, completion_tokens, exact) =
            self.plausible_counts(usage, completion_tokens, exact);
        // Still provisional as it ends: the record is held until the upstream has said what
        // it serves and runs (seconds at most), then published under that.
        let unsettled = if self.settle.is_some() && !self.settle_labels() {
            self.settle.take()
        } else {
            None
        };
        let guard = self.guard.take()?;
        let now = Instant::now();
        self.timeline.end = Some(now);
        let interference = self.interference(completion_tokens, exact);
        drop(guard);
        let server_state = self
            .server_state
            .as_ref()
            .map(|(tracker, start)| tracker.reading(now).means_since(start))
            .unwrap_or_default();
        if let Some(c) = self
            .meter
            .inflight_by_source
            .get(self.labels.source.index())
        {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        let timing = self.timing(now, completion_tokens);
        let tokens = self.tokens(usage, completion_tokens, exact, &timing);
        let buckets = self.buckets(&tokens, &interference);
        let slo = self.slo_result(outcome, &timing, completion_tokens);
        let mut extras = self.extras.take();
        let record = RequestRecord {
            labels: self.labels.clone(),
            outcome,
            status: self.status,
            streaming: self.streaming,
            with_tools: self.with_tools,
            prefix_blocks: extras
                .as_mut()
                .map(|e| std::mem::take(&mut e.prefix_blocks))
                .unwrap_or_default(),
            turn: extras.and_then(|e| e.turn),
            timing,
            tokens,
            interference,
            buckets,
            server_state,
            slo,
            overhead: self.overhead(),
            request_id: self.request_id.take(),
        };
        match unsettled {
            None => Some(self.meter.publish(record)),
            Some(settle) => Some(self.hold_unsettled(record, settle)),
        }
    }

    /// Holds `record` until `settle` can settle its labels, then publishes it (the sinks
    /// told it started first: they heard nothing of it); published at once under what is
    /// known when it cannot be held. Returns the record as it is now, for its client.
    fn hold_unsettled(
        &self,
        record: RequestRecord,
        settle: Arc<dyn SettleLabels>,
    ) -> Arc<RequestRecord> {
        let as_now = Arc::new(record.clone());
        let meter = Arc::clone(&self.meter);
        let settler = Arc::clone(&settle);
        let release = HeldRelease::new(move || {
            let mut record = record;
            settler.settle(&mut record.labels);
            for sink in lock::read(&meter.sinks).iter() {
                sink.started(&record.labels);
            }
            meter.publish(record);
        });
        if let Err(release) = settle.hold(release) {
            release.run();
        }
        as_now
    }

    /// The usage counts and the completion count, each clamped to what a real server could
    /// report; `exact` unless a count of this request was clamped.
    fn plausible_counts(
        &mut self,
        usage: Usage,
        completion: u64,
        exact: bool,
    ) -> (Usage, u64, bool) {
        let completion = self.plausible(completion, MAX_TOKENS_PER_REQUEST);
        let usage = Usage {
            prompt_tokens: usage
                .prompt_tokens
                .map(|n| self.plausible(n, MAX_TOKENS_PER_REQUEST)),
            completion_tokens: usage
                .completion_tokens
                .map(|n| self.plausible(n, MAX_TOKENS_PER_REQUEST)),
            cached_tokens: usage
                .cached_tokens
                .map(|n| self.plausible(n, MAX_TOKENS_PER_REQUEST)),
            reasoning_tokens: usage
                .reasoning_tokens
                .map(|n| self.plausible(n, MAX_TOKENS_PER_REQUEST)),
        };
        // A part is never more than its whole: a server that reports more cached tokens than
        // prompt tokens, or more reasoning than completion tokens, is read as all of it.
        let usage = Usage {
            cached_tokens: match (usage.cached_tokens, usage.prompt_tokens) {
                (Some(cached), Some(prompt)) => Some(cached.min(prompt)),
                (cached, _) => cached,
            },
            reasoning_tokens: usage.reasoning_tokens.map(|n| n.min(completion)),
            ..usage
        };
        if self.clamped {
            tracing::debug!(
                upstream = %self.labels.upstream,
                request_id = self.request_id.as_deref(),
                "implausible token count from the upstream clamped; the record is approximate"
            );
        }
        (usage, completion, exact && !self.clamped)
    }

    /// The counts (already clamped) and the rates derived from them and `timing`.
    fn tokens(&self, usage: Usage, completion: u64, exact: bool, timing: &Timing) -> Tokens {
        Tokens {
            prompt: usage.prompt_tokens,
            cached: usage.cached_tokens,
            reasoning: usage.reasoning_tokens,
            completion,
            completion_exact: exact,
            events: u64::from(self.timeline.token_events),
            coalesced_events: u64::from(self.timeline.coalesced_events),
            max: self.max_tokens,
            per_second: timing.tbt.map(|t| 1.0 / t.as_secs_f64()),
            prefill_per_second: prefill_rate(usage.prompt_tokens, usage.cached_tokens, timing.ttft),
        }
    }

    /// The matrix cell: the prompt's context bucket, the concurrency bucket of its average.
    /// Without the upstream's prompt count (a failed request's usually) the context is the one
    /// the request was expected in, from its prompt's size (`expect_cell`).
    fn buckets(&self, tokens: &Tokens, interference: &Interference) -> Buckets {
        let context = match (tokens.prompt, self.expected) {
            (Some(prompt), _) => self.meter.contexts.context_bucket(prompt),
            (None, Some(expected)) => expected.context,
            (None, None) => self.meter.contexts.context_bucket(0),
        };
        Buckets {
            context,
            concurrency: self
                .meter
                .concurrency
                .concurrency_bucket(interference.average_active),
        }
    }

    /// The in-flight and prefill integrals over the decode interval, and the concurrency split
    /// with its token counts rescaled to `completion` when that is the better count.
    fn interference(&self, completion: u64, exact: bool) -> Interference {
        let timeline = &self.timeline;
        let decode = timeline.decode_time();
        let average_active = match decode {
            Some(d) if !d.is_zero() => {
                (timeline.area_at_last_token - timeline.area_at_first_token) / d.as_secs_f64()
            }
            _ if timeline.first_token.is_some() => f64::from(timeline.inflight_at_first_token),
            _ => f64::from(self.inflight_at_head),
        };
        let overlap = self
            .interference
            .result(decode.map_or(0.0, |d| d.as_secs_f64()));
        let mut split = timeline.split;
        if exact || completion != split.total_tokens() {
            split.rescale_tokens(completion);
        }
        Interference {
            average_active,
            prefill_overlap_share: overlap.map(|(share, _)| share),
            overlapping_prefills: overlap.map(|(_, count)| count),
            prefill_busy: self.interference.busy_by_bucket,
            split,
        }
    }

    /// The stream's events were counted one token each (no per-chunk usage: Responses and
    /// Messages deltas, chat without `continuous_usage_stats`) and the upstream's final usage
    /// says they carried `completion` tokens: the ITL samples are spread over those tokens, so
    /// ITL stays one sample per token (docs/metrics.md "ITL"). Once, before the end.
    pub fn spread_counted_itl(&mut self, completion: u64) {
        let counted = u64::from(self.timeline.streamed_tokens);
        // No delta carries more than an event can: an implausible count spreads nothing.
        let plausible = completion <= counted.saturating_mul(MAX_TOKENS_PER_EVENT);
        if counted > 0 && completion > 0 && completion != counted && plausible {
            self.timeline.itl.spread(completion as f64 / counted as f64);
        }
    }

    /// The timeline read at `now`, the request's end, as durations from head in.
    /// Called once, at the end: the histograms move into the record.
    fn timing(&mut self, now: Instant, completion: u64) -> Timing {
        let timeline = &mut self.timeline;
        let decode = timeline.decode_time();
        let itl = timeline.itl.take();
        Timing {
            started_at: self.started_at,
            to_headers: timeline.since_head(timeline.response_head),
            to_first_byte: timeline.since_head(timeline.first_byte),
            ttft: timeline.since_head(timeline.first_token),
            ttft_answer: timeline.since_head(timeline.first_answer),
            ttft_tool_call: timeline.since_head(timeline.first_tool_call),
            to_first_delivery: timeline.since_head(timeline.first_delivery),
            duration: now.saturating_duration_since(timeline.head_in),
            decode,
            tbt: time_between_tokens(decode, completion),
            itl,
        }
    }

    /// The request judged against its SLO targets, as its client saw it.
    fn slo_result(&self, outcome: Outcome, timing: &Timing, completion: u64) -> SloResult {
        // A non-streamed answer reaches the client whole: its first token arrives at the end.
        let first = match self.slo.ttft_of {
            super::slo::TtftOf::Any => timing.ttft,
            super::slo::TtftOf::Answer => match (timing.ttft_answer, timing.ttft_tool_call) {
                (Some(a), Some(t)) => Some(a.min(t)),
                (answer, tool_call) => answer.or(tool_call).or(timing.ttft),
            },
        };
        let client_ttft = first.or((!self.streaming && completion > 0).then_some(timing.duration));
        SloResult {
            verdict: self.slo.targets.judge(&SloFigures {
                outcome,
                time_to_first_token: client_ttft,
                time_between_tokens: timing.tbt,
                duration: timing.duration,
            }),
            header_invalid: self.slo.header_invalid,
        }
    }

    /// Time spent inside tokentap: before the upstream send and per forwarded frame.
    /// Called once, at the end: the per-frame histogram moves into the record.
    fn overhead(&mut self) -> Overhead {
        let timeline = &mut self.timeline;
        Overhead {
            request: timeline.upstream_sent.map(|sent| {
                let from = timeline.body_read.unwrap_or(timeline.head_in);
                sent.saturating_duration_since(from)
            }),
            per_frame: timeline.frame_overhead.take(),
            frames: u64::from(timeline.frames),
        }
    }
}

impl Drop for RequestMeter {
    fn drop(&mut self) {
        // Dropped before an explicit finish: the client (or the server shutting down) went
        // away mid-request.
        let usage = Usage::default();
        let tokens = u64::from(self.timeline.streamed_tokens);
        self.finish(Outcome::ClientAborted, usage, tokens, false);
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::super::timeline::Timeline;
    use super::*;

    /// A token event reads and writes these; they are kept in the meter's first cache lines
    /// (`repr(C)`, declaration order), since a stream's meter is cold by its next event.
    #[test]
    fn what_a_token_event_touches_sits_at_the_front() {
        for end in [
            offset_of!(RequestMeter, meter) + std::mem::size_of::<Arc<Meter>>(),
            offset_of!(RequestMeter, guard) + std::mem::size_of::<Option<InflightGuard>>(),
            offset_of!(RequestMeter, labels) + std::mem::size_of::<RequestLabels>(),
            offset_of!(RequestMeter, clamped) + 1,
        ] {
            assert!(
                end <= 128,
                "a per-event field ends at byte {end} of the meter"
            );
        }
        // The interference span's per-event part, and the timeline right after it.
        assert!(offset_of!(RequestMeter, interference) <= 128);
        assert!(offset_of!(RequestMeter, timeline) <= 512);
        assert!(offset_of!(Timeline, area_at_last_token) < 128);
        // The two histograms recorded per event, whose staged buckets spare the cold array.
        assert!(
            offset_of!(Timeline, frame_overhead)
                + std::mem::size_of::<super::super::timeline::LocalHistogram>()
                <= 192
        );
    }
}
