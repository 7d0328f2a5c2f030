//! The metering body: wraps the upstream's response body, forwards every frame as it
//! arrives, and measures it on the way.
//!
//! Shape (linkerd `record_response.rs`, tower-http `trace/body.rs`): poll the inner body,
//! look at the frame, hand the same `Bytes` on. Frames are never collected. When usage was
//! injected the client-facing bytes are edited by an [`EditQueue`] (pure: frame in, pieces
//! out; see [`super::edits`]), which holds back only the unfinished tail of an event that
//! straddles frames and, briefly, a finish chunk.
//!
//! End of stream arrives four ways — `None`, trailers, an error, `is_end_stream()` after a
//! data frame — and a client hang-up only as `Drop`; the record is published exactly once
//! whichever comes first.
//!
//! When the client asked for its timing back ([`TimingDelivery`]), the `Server-Timing` value is
//! written from the published record, once, and handed over after the upstream's last bytes:
//! as a trailer (merged with the upstream's own), or as a final SSE comment where the client
//! cannot read trailers — not after a break, and no comment after a stream cut off mid-event
//! (it would join that event). For a non-streamed answer the proxy takes the value
//! ([`MeteredBody::take_server_timing`]) to put in the response head.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::meter::record::Outcome;
use crate::meter::RequestMeter;

use super::classify::{is_shed_status, EventClassifier};
use super::edits::EditQueue;
use super::held::{HeldBudget, HeldBuffer, Push};
use super::rewrite::Injected;
use super::sse::SseScanner;
use super::timing::{self, TimingDelivery};
use crate::base::Route;

/// How the response body is read.
#[derive(Debug)]
enum Mode {
    /// A content-encoded (compressed) body: forwarded untouched, not read; its counts are
    /// approximate (none).
    Opaque,
    /// `text/event-stream`: scanned event by event.
    Sse(SseScanner),
    /// Any other body on a metered route: copied up to `limit` bytes, within the shared
    /// budget of held answers, and parsed at the end (non-streamed completions and JSON
    /// errors). A copy that cannot go on is released at once (`overflowed`), unless the client
    /// gets it (`for_client`: its timing header waits for the end): the proxy then takes it.
    /// A content-encoded body held for its timing header is copied but not parsed (`parse`).
    Json {
        buffer: HeldBuffer,
        limit: usize,
        overflowed: bool,
        for_client: bool,
        parse: bool,
    },
}

/// Per-request metering state carried by the body: the scanner and the classifier first
/// (`repr(C)`, small and touched by every event), then the meter (its per-event fields first).
#[repr(C)]
pub struct Metering {
    mode: Mode,
    classifier: EventClassifier,
    meter: RequestMeter,
    /// What the client gets of the upstream's bytes, when tokentap injected usage. Boxed:
    /// most streams have none (the client asked for its usage, or nothing was injected), and
    /// every stream, held ones included, carries this box (docs/benchmarks.md, "Memory per
    /// held stream").
    edits: Option<Box<EditQueue>>,
    /// The request's timing, when its client gets it back (touched once, at the end).
    hand_back: Option<Box<HandBack>>,
}

/// A request's `Server-Timing`, for a client that asked for it.
#[derive(Debug)]
struct HandBack {
    delivery: TimingDelivery,
    /// The engine's own queue time, read from a non-streamed body.
    queue: Option<Duration>,
    /// The value, written when the record is published and taken when it is handed over.
    value: Option<String>,
}

impl std::fmt::Debug for Metering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metering")
            .field("meter", &self.meter)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Options for one metered response.
#[derive(Debug, Clone)]
pub struct MeteringOptions {
    pub route: Route,
    /// The response is `text/event-stream`.
    pub event_stream: bool,
    /// What was injected into the request (nothing: no rewriting).
    pub injected: Injected,
    /// Largest single event kept for measurement (and held for rewriting).
    pub max_event_bytes: usize,
    /// Largest non-streamed body copied for parsing usage.
    pub max_body_bytes: usize,
    /// The body has a `Content-Encoding` (gzip, br…): it cannot be read as it passes, so it
    /// is forwarded untouched and nothing is stripped from it.
    pub encoded: bool,
    /// Where the request's `Server-Timing` goes, when its client asked for it.
    pub timing: Option<TimingDelivery>,
    /// The budget non-streamed answers are held within (`None`: unbounded, for benches and
    /// pure tests).
    pub held_budget: Option<Arc<HeldBudget>>,
    /// The body's length, when its head says (`Content-Length`).
    pub length: Option<usize>,
}

impl Metering {
    pub fn new(meter: RequestMeter, options: MeteringOptions) -> Box<Self> {
        let header = options.timing == Some(TimingDelivery::Header);
        let mode = if options.encoded && !header {
            Mode::Opaque
        } else if options.event_stream && !options.encoded {
            Mode::Sse(SseScanner::within(
                options.max_event_bytes,
                options.held_budget.clone(),
            ))
        } else {
            // A declared length is reserved as its bytes arrive, never past it (a head that
            // declares the whole budget and stalls would keep every other answer unheld); an
            // answer held for its client that finds the budget spent half-way is forwarded as
            // what was held, then the rest (`MeteredBody::take_held`).
            let (buffer, overflowed) = match options.length {
                None => (HeldBuffer::new(options.held_budget.clone()), false),
                Some(length) => match HeldBuffer::for_length(
                    options.held_budget.clone(),
                    length,
                    options.max_body_bytes,
                ) {
                    Ok(buffer) => (buffer, false),
                    Err(_) => (HeldBuffer::new(None), true),
                },
            };
            Mode::Json {
                buffer,
                limit: options.max_body_bytes,
                overflowed,
                for_client: header,
                parse: !options.encoded,
            }
        };
        let edits =
            (options.event_stream && !options.encoded && options.injected.any()).then(|| {
                Box::new(EditQueue::new(
                    options.injected,
                    options.max_event_bytes,
                    options.held_budget.clone(),
                ))
            });
        let mut meter = meter;
        meter.set_streaming(options.event_stream);
        Box::new(Self {
            meter,
            classifier: EventClassifier::new(options.route),
            mode,
            edits,
            hand_back: options.timing.map(|delivery| {
                Box::new(HandBack {
                    delivery,
                    queue: None,
                    value: None,
                })
            }),
        })
    }

    /// True when the forwarded bytes differ from the upstream's (size hints are then unknown):
    /// usage stripped, or timing added after them.
    pub fn rewrites(&self) -> bool {
        self.edits.is_some() || self.adds_after_body()
    }

    /// The request's timing is added after the upstream's bytes (a trailer or a comment).
    fn adds_after_body(&self) -> bool {
        self.hand_back
            .as_ref()
            .is_some_and(|h| h.delivery != TimingDelivery::Header)
    }

    /// The frame that hands the request's timing over after the upstream's last bytes, if it
    /// goes there and is still due; `trailers` are the upstream's own, merged into it.
    fn hand_over(&mut self, trailers: &mut Option<http::HeaderMap>) -> Option<Frame<Bytes>> {
        let hand_back = self.hand_back.as_mut()?;
        match hand_back.delivery {
            TimingDelivery::Header => None,
            TimingDelivery::Trailer => {
                let value = http::HeaderValue::try_from(hand_back.value.take()?).ok()?;
                let mut fields = trailers.take().unwrap_or_default();
                // Beside the upstream's own entries, never in their place.
                fields.append(timing::SERVER_TIMING, value);
                Some(Frame::trailers(fields))
            }
            TimingDelivery::Comment => {
                let value = hand_back.value.take()?;
                if matches!(&self.mode, Mode::Sse(scanner) if scanner.mid_event()) {
                    return None;
                }
                let mut line = Vec::with_capacity(timing::COMMENT_PREFIX.len() + value.len() + 2);
                line.extend_from_slice(timing::COMMENT_PREFIX);
                line.extend_from_slice(value.as_bytes());
                line.extend_from_slice(b"\n\n");
                Some(Frame::data(Bytes::from(line)))
            }
        }
    }

    /// Whether a trailer or comment may still follow (see `hand_over`).
    fn hands_over_later(&self) -> bool {
        self.adds_after_body()
            && self
                .hand_back
                .as_ref()
                .is_some_and(|h| h.value.is_some() || !self.meter.is_finished())
    }

    /// Measures one data frame that arrived at `now` and queues what the client gets.
    /// Returns the frame itself when it is forwarded unchanged.
    fn on_data(&mut self, data: Bytes, now: Instant) -> Option<Bytes> {
        let Self {
            meter,
            classifier,
            mode,
            edits,
            ..
        } = self;
        match mode {
            Mode::Opaque => Some(data),
            Mode::Json {
                buffer,
                limit,
                overflowed,
                for_client,
                ..
            } => {
                if !*overflowed && buffer.push(&data, *limit) != Push::Held {
                    *overflowed = true;
                    if !*for_client {
                        buffer.release();
                    }
                }
                Some(data)
            }
            Mode::Sse(scanner) => {
                let mut frame = edits.as_mut().map(|edits| edits.frame(&data));
                scanner.feed(&data, |block| {
                    // What the event says (its tokens, when), then what the client gets of
                    // its bytes.
                    if let Some(payload) = block.event.data {
                        measure(meter, classifier, now, block.event.name, payload);
                    }
                    if let Some(frame) = frame.as_mut() {
                        frame.block(&block);
                    }
                });
                match frame {
                    Some(frame) => frame.finish().then_some(data),
                    None => Some(data),
                }
            }
        }
    }

    /// Publishes the record for a stream that ended normally (`None` or trailers).
    fn on_end(&mut self) {
        if let Mode::Json {
            buffer,
            overflowed: false,
            parse: true,
            ..
        } = &self.mode
        {
            self.classifier.observe_body(buffer.as_slice());
            if let Some(hand_back) = &mut self.hand_back {
                hand_back.queue = timing::queue_time(buffer.as_slice());
            }
        }
        let status = self.meter.status();
        // Shed inside a stream already answered 200 only while nothing was generated (a
        // request aborted from the queue); an abort carrying 503 after tokens came is a
        // failure mid-generation (sglang's "Generation aborted." on a scheduler timeout or
        // memory pressure), not load shed at admission.
        let shed_in_stream =
            status < 400 && self.classifier.shed_seen() && self.meter.before_first_token();
        let outcome = if is_shed_status(u64::from(status)) || shed_in_stream {
            // The engine (or a gateway) refused it for load: 429/503 as the answer's status,
            // or an error event or abort carrying one before any token.
            Outcome::Shed
        } else if status >= 400 || self.classifier.error_seen() {
            Outcome::UpstreamError
        } else if matches!(self.mode, Mode::Sse(_)) && !self.classifier.terminal_seen() {
            // The stream closed cleanly but without its end marker (`[DONE]`, `message_stop`,
            // `response.completed`): the upstream gave up mid-response.
            Outcome::UpstreamAborted
        } else {
            Outcome::Ok
        };
        self.finish(outcome);
        if let Some(edits) = &mut self.edits {
            edits.end();
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        let classifier = &self.classifier;
        let exact = classifier.completion_exact() && !matches!(self.mode, Mode::Opaque);
        if let Some(reported) = classifier.usage().completion_tokens {
            // The events were counted one token each; the final usage says how many they
            // carried (a stream with per-chunk usage timed each token already).
            if outcome == Outcome::Ok && !classifier.per_event_exact() {
                self.meter.spread_counted_itl(reported);
            }
        }
        let record = self.meter.finish(
            outcome,
            classifier.usage(),
            classifier.completion_tokens(),
            exact,
        );
        // Once per request, at its end: what the client asked to get back.
        if let (Some(record), Some(hand_back)) = (record, &mut self.hand_back) {
            if outcome != Outcome::ClientAborted {
                hand_back.value = Some(timing::server_timing(
                    &record,
                    self.meter.ladders(),
                    hand_back.queue,
                ));
            }
        }
    }

    fn is_finished(&self) -> bool {
        self.meter.is_finished()
    }

    /// The body is being held whole for its client (see [`MeteredBody::take_held`]).
    fn holds_for_client(&self) -> bool {
        matches!(
            self.mode,
            Mode::Json {
                for_client: true,
                overflowed: false,
                ..
            }
        )
    }

    /// The copy held for the client, taken (empty when none).
    fn take_held(&mut self) -> Bytes {
        match &mut self.mode {
            Mode::Json {
                buffer,
                for_client: true,
                ..
            } => std::mem::replace(buffer, HeldBuffer::new(None)).into_bytes(),
            _ => Bytes::new(),
        }
    }
}

impl Drop for Metering {
    fn drop(&mut self) {
        // Dropped before the end: the client hung up (hyper drops the body). A stream whose
        // own end marker (`[DONE]`, `message_stop`, `response.completed`) was seen is complete
        // whatever the client did after it: the OpenAI SDK and GuideLLM close the connection
        // once they read `[DONE]`, before the chunked body's terminator arrives.
        if !self.is_finished()
            && matches!(self.mode, Mode::Sse(_))
            && self.classifier.terminal_seen()
        {
            self.on_end();
        } else {
            self.finish(Outcome::ClientAborted);
        }
    }
}

/// Feeds one event's classification to the request's meter.
#[inline]
fn measure(
    meter: &mut RequestMeter,
    classifier: &mut EventClassifier,
    now: Instant,
    name: &[u8],
    payload: &[u8],
) {
    let facts = classifier.observe(name, payload);
    if facts.output && meter.before_first_token() {
        // Once per request: the cell it will land in, now that the upstream may have counted
        // its prompt.
        if let Some(prompt) = classifier.usage().prompt_tokens {
            meter.expect_cell(prompt);
        }
    }
    if facts.output {
        meter.token_event(now, facts.tokens);
        if facts.answer || facts.tool_call {
            meter.output_kinds(now, facts.answer, facts.tool_call);
        }
    } else if facts.tokens > 0 {
        meter.silent_tokens(now, facts.tokens);
    }
}

pin_project! {
    /// A response body measured as it passes. Without metering it is a transparent wrapper.
    pub struct MeteredBody<B: Body> {
        #[pin]
        inner: B,
        metering: Option<Box<Metering>>,
        // An upstream error to hand on once held bytes are forwarded.
        pending_error: Option<B::Error>,
        // Trailers to hand on once held bytes are forwarded.
        pending_trailers: Option<http::HeaderMap>,
        inner_done: bool,
        // The pending error waited one poll.
        error_delayed: bool,
    }
}

impl<B: Body> MeteredBody<B> {
    pub fn new(inner: B, metering: Option<Box<Metering>>) -> Self {
        Self {
            inner,
            metering,
            pending_error: None,
            pending_trailers: None,
            inner_done: false,
            error_delayed: false,
        }
    }

    /// Whether every byte of the answer so far is in the copy held for the client (a
    /// non-streamed answer whose client waits for its timing header): false once it could not
    /// go on (the answer is longer than `metering.max_parse_bytes`, or the held-answer budget
    /// is spent), and for any other body.
    pub fn holds_for_client(&self) -> bool {
        self.metering
            .as_ref()
            .is_some_and(|metering| metering.holds_for_client())
    }

    /// The copy held for the client, taken: the whole answer once the body has ended, or what
    /// was held before the frame that did not fit. Its share of the budget is handed back when
    /// the client's copy is dropped.
    pub fn take_held(&mut self) -> Bytes {
        self.metering
            .as_mut()
            .map_or_else(Bytes::new, |metering| metering.take_held())
    }

    /// The request's `Server-Timing` value for the response head, once the body has ended
    /// (a non-streamed answer read whole; [`TimingDelivery::Header`]).
    pub fn take_server_timing(&mut self) -> Option<String> {
        let hand_back = self.metering.as_mut()?.hand_back.as_mut()?;
        (hand_back.delivery == TimingDelivery::Header)
            .then(|| hand_back.value.take())
            .flatten()
    }
}

/// How an error of the wrapped body ends a metered request: an upstream abort, unless the
/// error says otherwise (the proxy's idle timer reports a stall).
pub trait BodyFailure {
    fn outcome(&self) -> Outcome {
        Outcome::UpstreamAborted
    }
}

impl BodyFailure for std::convert::Infallible {}
impl BodyFailure for hyper::Error {}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: BodyFailure,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(metering) = this.metering.as_mut() {
                if let Some(piece) = metering.edits.as_deref_mut().and_then(EditQueue::pop) {
                    return Poll::Ready(Some(Ok(Frame::data(piece))));
                }
            }
            if *this.inner_done {
                if this.pending_error.is_some() && !*this.error_delayed {
                    // Once: the connection flushes what came before the error (hyper writes
                    // when its body is pending), instead of aborting with it still buffered.
                    *this.error_delayed = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                if let Some(error) = this.pending_error.take() {
                    return Poll::Ready(Some(Err(error)));
                }
                if let Some(frame) = this
                    .metering
                    .as_mut()
                    .and_then(|metering| metering.hand_over(this.pending_trailers))
                {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(trailers) = this.pending_trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                return Poll::Ready(None);
            }
            let Some(metering) = this.metering.as_mut() else {
                return this.inner.as_mut().poll_frame(cx);
            };
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let arrived = Instant::now();
                        // Before a last frame ends the request: its record has the body's time.
                        metering.meter.first_byte(arrived);
                        let forward = metering.on_data(data, arrived);
                        if this.inner.is_end_stream() {
                            metering.on_end();
                            *this.inner_done = true;
                        }
                        metering.meter.frame(arrived, Instant::now());
                        if let Some(data) = forward {
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                    }
                    Err(frame) => {
                        metering.on_end();
                        *this.inner_done = true;
                        if let Ok(trailers) = frame.into_trailers() {
                            *this.pending_trailers = Some(trailers);
                        }
                    }
                },
                Some(Err(error)) => {
                    if !metering.is_finished() {
                        metering.finish(error.outcome());
                    }
                    if let Some(edits) = &mut metering.edits {
                        edits.end();
                    }
                    *this.pending_error = Some(error);
                    *this.inner_done = true;
                }
                None => {
                    metering.on_end();
                    *this.inner_done = true;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.metering {
            None => self.inner.is_end_stream(),
            Some(metering) => {
                self.pending_error.is_none()
                    && self.pending_trailers.is_none()
                    && (self.inner_done || self.inner.is_end_stream())
                    && metering.edits.as_deref().is_none_or(EditQueue::is_drained)
                    && !metering.hands_over_later()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.metering {
            Some(metering) if metering.rewrites() => SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::Waker;

    use proptest::prelude::*;

    use super::*;
    use crate::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
    use crate::meter::record::RequestRecord;
    use crate::meter::{Meter, RecordSink};

    /// The scanner and the classifier, touched by every event, come before the meter's
    /// kilobytes (`repr(C)`), so they share the allocation's first lines.
    #[test]
    fn the_scanner_and_the_classifier_come_first() {
        assert_eq!(std::mem::offset_of!(Metering, mode), 0);
        assert!(std::mem::offset_of!(Metering, classifier) < 128);
        assert!(
            std::mem::offset_of!(Metering, meter) < std::mem::offset_of!(Metering, edits),
            "the edit queue (only with injected usage) goes after the meter"
        );
        assert!(
            std::mem::offset_of!(Metering, edits) < std::mem::offset_of!(Metering, hand_back),
            "the timing handed back (touched once, at the end) goes last"
        );
    }

    /// Every stream carries this box, held ones included: it stays inside jemalloc's 1,536-byte
    /// class (it was 2,960 bytes, then 1,968 in the 2 KiB class, then 1,624 in the 1,792-byte
    /// one; docs/benchmarks.md).
    #[test]
    fn the_metering_box_fits_a_1536_byte_allocation() {
        let size = std::mem::size_of::<Metering>();
        assert!(size <= 1536, "Metering is {size} bytes");
    }

    #[derive(Default)]
    struct Collect(Mutex<Vec<Arc<RequestRecord>>>);

    impl RecordSink for Collect {
        fn record(&self, record: &Arc<RequestRecord>) {
            self.0.lock().unwrap().push(Arc::clone(record));
        }
    }

    /// Runs `frames` through a metered body; returns the client bytes and the record.
    fn run(frames: Vec<Bytes>, injected: Injected) -> (Vec<u8>, Arc<RequestRecord>) {
        let meter = Meter::new(
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        );
        let sink = Arc::new(Collect::default());
        meter.add_sink(sink.clone());
        let mut body = crate::stream::sample::metered_chat_body(frames, &meter, injected);
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            if let Ok(data) = frame.unwrap().into_data() {
                out.extend_from_slice(&data);
            }
        }
        assert!(body.is_end_stream());
        drop(body);
        let records = sink.0.lock().unwrap();
        assert_eq!(records.len(), 1, "exactly one record");
        (out, Arc::clone(&records[0]))
    }

    /// The outcome of a chat request whose upstream answered `status` with `body`.
    fn outcome_of(status: u16, event_stream: bool, body: &str) -> Outcome {
        let meter = Meter::new(
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        );
        let sink = Arc::new(Collect::default());
        meter.add_sink(sink.clone());
        let mut metered = crate::stream::sample::metered_body(
            Route::ChatCompletions,
            status,
            event_stream,
            [Bytes::from(body.to_owned())],
            &meter,
            Injected::default(),
        );
        let mut cx = Context::from_waker(Waker::noop());
        while let Poll::Ready(Some(_)) = Pin::new(&mut metered).poll_frame(&mut cx) {}
        drop(metered);
        let records = sink.0.lock().unwrap();
        records[0].outcome
    }

    #[test]
    fn answers_that_mean_the_engine_shed_the_request_are_shed() {
        let sglang = r#"{"object":"error","message":"The request queue is full.","type":"Service Unavailable","param":null,"code":503}"#;
        assert_eq!(outcome_of(503, false, sglang), Outcome::Shed);
        assert_eq!(outcome_of(429, false, "{}"), Outcome::Shed);
        assert_eq!(outcome_of(503, false, ""), Outcome::Shed);
        // A stream already answered 200 whose error event carries the shed status.
        let event = "data: {\"error\": {\"message\": \"The request queue is full.\", \"code\": 503}}\n\ndata: [DONE]\n\n";
        assert_eq!(outcome_of(200, true, event), Outcome::Shed);
        // After tokens came, a 503 abort is a failure mid-generation, not shed.
        let mid = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"error\": {\"message\": \"Generation aborted.\", \"code\": 503}}\n\ndata: [DONE]\n\n";
        assert_eq!(outcome_of(200, true, mid), Outcome::UpstreamError);
        // Other failures stay what they were.
        assert_eq!(outcome_of(500, false, sglang), Outcome::UpstreamError);
        assert_eq!(outcome_of(400, false, "{}"), Outcome::UpstreamError);
        let refused =
            "data: {\"error\": {\"message\": \"too long\", \"code\": 400}}\n\ndata: [DONE]\n\n";
        assert_eq!(outcome_of(200, true, refused), Outcome::UpstreamError);
    }

    /// Polls a chat stream of `frames` whose client asked for its timing by `delivery` to its
    /// end: the data and the trailers it handed over.
    fn hand_back(frames: &[&str], delivery: TimingDelivery) -> (String, Option<http::HeaderMap>) {
        let meter = Meter::new(
            Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
            Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
        );
        let labels = crate::meter::RequestLabels {
            route: Route::ChatCompletions,
            source: crate::base::Source::Production,
            model: Arc::from("m"),
            asked_model: None,
            upstream: Arc::from("u"),
            tag: None,
            fingerprint: crate::meter::identity::FingerprintId::UNKNOWN,
            slice: Default::default(),
        };
        let start = crate::meter::RequestStart {
            request_id: Some(Arc::from("r-1")),
            ..crate::meter::RequestStart::from(labels)
        };
        let mut request = meter.begin(start, Instant::now());
        request.set_status(200);
        let metering = Metering::new(
            request,
            MeteringOptions {
                route: Route::ChatCompletions,
                event_stream: true,
                injected: Injected::default(),
                max_event_bytes: 1 << 16,
                max_body_bytes: 1 << 16,
                encoded: false,
                timing: Some(delivery),
                held_budget: None,
                length: None,
            },
        );
        assert!(
            metering.rewrites(),
            "bytes follow the upstream's: no length"
        );
        let frames = frames.iter().map(|f| Bytes::copy_from_slice(f.as_bytes()));
        let mut body = MeteredBody::new(
            crate::stream::sample::Frames(frames.collect()),
            Some(metering),
        );
        let mut cx = Context::from_waker(Waker::noop());
        let (mut out, mut trailers) = (String::new(), None);
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            match frame.unwrap().into_data() {
                Ok(data) => out.push_str(std::str::from_utf8(&data).unwrap()),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert!(body.is_end_stream());
        (out, trailers)
    }

    #[test]
    fn the_timing_follows_the_upstream_s_last_bytes_as_a_comment_or_a_trailer() {
        let stream = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: [DONE]\n\n",
        ];
        let (out, trailers) = hand_back(&stream, TimingDelivery::Comment);
        let comment = out.strip_prefix(&stream.concat()).unwrap();
        assert!(
            comment.starts_with(": server-timing ttft;dur=")
                && comment.ends_with("request;desc=\"r-1\"\n\n"),
            "{comment:?}"
        );
        assert!(trailers.is_none());
        let (out, trailers) = hand_back(&stream, TimingDelivery::Trailer);
        assert_eq!(out, stream.concat());
        let value = trailers.unwrap()["server-timing"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(value.ends_with("request;desc=\"r-1\""), "{value}");
        // Cut off mid-event: a comment would join that event.
        let cut = [stream[0], "data: {\"choi"];
        assert_eq!(
            hand_back(&cut, TimingDelivery::Comment),
            (cut.concat(), None)
        );
    }

    fn stream(newline: &str, pieces: &[u64]) -> (String, String) {
        let nl2 = format!("{newline}{newline}");
        let chunk = |content: &str, usage: Option<u64>| {
            let usage = usage.map_or(String::new(), |c| {
                format!(
                    r#","usage":{{"prompt_tokens":9,"total_tokens":{},"completion_tokens":{c}}}"#,
                    9 + c
                )
            });
            format!(
                r#"data: {{"id":"x","choices":[{{"index":0,"delta":{{"reasoning_content":null,"content":"{content}"}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]{usage}}}{nl2}"#
            )
        };
        let mut injected =
            chunk("", None).replace(r#""content":"""#, r#""role":"assistant","content":"""#);
        let mut plain = injected.clone();
        let mut total = 0;
        for (i, tokens) in pieces.iter().enumerate() {
            total += tokens;
            injected.push_str(&chunk(&format!("w{i}"), Some(total)));
            plain.push_str(&chunk(&format!("w{i}"), None));
        }
        injected.push_str(&format!(
            r#"data: {{"id":"x","choices":[],"usage":{{"prompt_tokens":9,"total_tokens":{},"completion_tokens":{total}}}}}{nl2}"#,
            9 + total
        ));
        for s in [&mut injected, &mut plain] {
            s.push_str(&format!(": keep-alive{nl2}data: [DONE]{nl2}"));
        }
        (injected, plain)
    }

    /// A vLLM-shaped tail: the finish chunk, a keep-alive comment, the usage chunk carrying
    /// `system_fingerprint`, `[DONE]` — cut at every byte, with CRLF so that cuts fall between
    /// the CR and LF of the held chunk's terminator too.
    #[test]
    fn held_finish_chunk_gets_the_fingerprint_back_in_every_split() {
        let upstream = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}],\"usage\":{\"completion_tokens\":1}}\r\n\r\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":2}}\r\n\r\n",
            ": keep-alive\r\n\r\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"completion_tokens\":2},\"system_fingerprint\":\"fp\"}\r\n\r\n",
            "data: [DONE]\r\n\r\n",
        );
        let expected = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\r\n\r\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}],\"system_fingerprint\":\"fp\"}\r\n\r\n",
            ": keep-alive\r\n\r\n",
            "data: [DONE]\r\n\r\n",
        );
        let both = Injected {
            include_usage: true,
            continuous_usage: true,
        };
        let bytes = upstream.as_bytes();
        for a in 0..=bytes.len() {
            for b in [a, a + 1, a + 7, bytes.len()] {
                let b = b.clamp(a, bytes.len());
                let frames: Vec<Bytes> = [&bytes[..a], &bytes[a..b], &bytes[b..]]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .map(Bytes::copy_from_slice)
                    .collect();
                let (client, record) = run(frames, both);
                assert_eq!(
                    String::from_utf8(client).unwrap(),
                    expected,
                    "cuts at {a} and {b}"
                );
                assert_eq!(record.tokens.completion, 2);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any split of the upstream's bytes gives the same client bytes and measurements.
        #[test]
        fn every_split_gives_the_same_bytes_and_measurements(
            pieces in proptest::collection::vec(1u64..5, 1..12),
            crlf in any::<bool>(),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..24),
        ) {
            let (upstream, expected_client) = stream(if crlf { "\r\n" } else { "\n" }, &pieces);
            let bytes = upstream.as_bytes();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            points.dedup();
            let mut frames = Vec::new();
            let mut last = 0;
            for p in points.into_iter().chain([bytes.len()]) {
                if p > last {
                    frames.push(Bytes::copy_from_slice(&bytes[last..p]));
                    last = p;
                }
            }
            let both = Injected { include_usage: true, continuous_usage: true };
            let (client, record) = run(frames, both);
            prop_assert_eq!(String::from_utf8(client).unwrap(), expected_client);
            let total: u64 = pieces.iter().sum();
            prop_assert_eq!(record.tokens.completion, total);
            prop_assert!(record.tokens.completion_exact);
            prop_assert_eq!(record.tokens.events, pieces.len() as u64);
            prop_assert_eq!(record.tokens.prompt, Some(9));
            prop_assert_eq!(record.timing.itl.count(), total - pieces[0]);
            prop_assert_eq!(record.interference.split.total_tokens(), total);
            prop_assert_eq!(record.outcome, Outcome::Ok);
        }

        /// Arbitrary bytes never panic and always reach the client unchanged when nothing was
        /// injected.
        #[test]
        fn arbitrary_bytes_pass_through(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let frames: Vec<Bytes> = chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect();
            let expected: Vec<u8> = chunks.concat();
            let (client, _) = run(frames, Injected::default());
            prop_assert_eq!(client, expected);
        }

        /// With injection on, arbitrary bytes still never panic.
        #[test]
        fn arbitrary_bytes_never_panic_when_rewriting(chunks in proptest::collection::vec(proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'{'), Just(b'"'), Just(b':'), any::<u8>()], 0..64), 0..16)) {
            let frames: Vec<Bytes> = chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect();
            let _ = run(frames, Injected { include_usage: true, continuous_usage: true });
        }
    }
}
