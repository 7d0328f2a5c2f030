//! One synthetic stream: sent through [`Proxy::handle`] tagged [`Synthetic`], its body read to
//! the end (or dropped: a disconnect), watched for what invalidates a cell — an HTTP error, an
//! error event, a stream that ends without its terminator, an output loop.
//!
//! The driver measures nothing: timing and token counts come from the proxy's record of the
//! same request. It only reports when the stream produced its first output (so the runner knows
//! the cell is warm), whether it finished by itself (a completed request that the runner
//! restarts), and why it failed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::meter::slo::SLO_HEADER;
use crate::proxy::{Proxy, Synthetic};
use crate::stream::sse::SseScanner;

/// Largest SSE event the driver keeps while looking for its end.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// The seed tool's output-loop rule: a repeating pattern covering this many characters…
pub const LOOP_SPAN: usize = 4096;
/// …whose period is at most a quarter of it (at least four identical repeats).
pub const LOOP_MAX_PERIOD: usize = LOOP_SPAN / 4;
/// Of an error response, the driver reads about this many bytes for its message…
const ERROR_BODY_BYTES: usize = 2048;
/// …for at most this long (an error body that trickles must not hold up the cell)…
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// …and keeps this many bytes of the message (one line of a cell's status).
const ERROR_MESSAGE_BYTES: usize = 200;

/// What the runner wants streams to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPhase {
    /// Keep reading; the runner restarts streams that complete.
    Running,
    /// The runner asked the server to abort (sglang `/abort_request`): read to the end.
    Aborting,
    /// Drop the stream now (a disconnect; servers without a targeted abort).
    Disconnect,
}

/// How a stream ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEnd {
    /// It finished by itself (`finish_reason` length or stop) at `at`.
    Completed { at: Instant },
    /// The runner stopped it (abort or disconnect).
    Stopped,
    /// It failed: why, as a type the caller decides on; its `Display` is the one line a cell's
    /// status or a matrix note shows.
    Failed(StreamFailure),
}

/// Why a synthetic stream failed. Callers decide on the variant (the sweep's token-id → text
/// fallback takes [`StreamFailure::is_refusal`]), never on the words, which are only for people:
/// `Display` prints the same line the driver wrote as text before this type existed, so matrices
/// and notes read as they did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamFailure {
    /// The request could not be built (a header value the `http` crate refuses).
    #[error("cannot build the request: {0}")]
    Build(String),
    /// The server answered with a status that is not 2xx; `message` is from its error body.
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
    /// The response body failed while the stream was running.
    #[error("the stream broke off: {0}")]
    BrokeOff(String),
    /// An SSE event grew past [`MAX_EVENT_BYTES`] without ending.
    #[error("an SSE event grew past {MAX_EVENT_BYTES} bytes without ending")]
    OversizedEvent,
    /// The stream carried an error event (vLLM answers a refused prompt so, with status 200).
    #[error("error event in the stream: {0}")]
    ErrorEvent(String),
    /// The output repeats ([`LoopDetector`]); `chars` of output so far.
    #[error("output loop: the last {LOOP_SPAN} characters repeat with a period of at most {LOOP_MAX_PERIOD} (after {chars} characters)")]
    OutputLoop { chars: usize },
    /// A finish reason came but `[DONE]` never did.
    #[error("the stream ended without [DONE] (finish_reason {finish_reason})")]
    NoTerminator { finish_reason: String },
    /// The stream ended with neither a finish reason nor `[DONE]`.
    #[error("the stream ended without a finish reason or [DONE] after {chars} characters")]
    NoEnd { chars: usize },
    /// The caller's limit on the whole request passed (the sweep's scout).
    #[error("no end of the request within {limit_s} s")]
    Timeout { limit_s: u64 },
}

impl StreamFailure {
    /// The HTTP status class of a refused request (4 for 4xx, 5 for 5xx), else `None`.
    pub fn status_class(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(status / 100),
            _ => None,
        }
    }

    /// The server refused the request itself: any 4xx or 5xx (llama-cpp-python answers token
    /// ids with 500), or a stream that is only an error event (vLLM, status 200).
    pub fn is_refusal(&self) -> bool {
        matches!(self.status_class(), Some(4 | 5)) || matches!(self, Self::ErrorEvent(_))
    }
}

/// One stream to send.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    pub path: &'static str,
    pub body: Bytes,
    pub tag: Arc<str>,
    /// Sent as `x-tokentap-slo` (the sweep's own targets), so the proxy judges the stream by it.
    pub slo_header: Option<HeaderValue>,
}

/// Counters the runner reads while streams run.
#[derive(Debug, Default)]
pub struct StreamSignals {
    /// Streams that have produced their first output.
    pub first_outputs: AtomicUsize,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
}

/// Sends `request` and follows it until it ends or `phase` says to drop it.
pub async fn drive(
    proxy: Arc<Proxy>,
    request: StreamRequest,
    mut phase: watch::Receiver<StreamPhase>,
    signals: Arc<StreamSignals>,
) -> StreamEnd {
    let mut builder = Request::post(request.path).header(header::CONTENT_TYPE, "application/json");
    if let Some(slo) = request.slo_header {
        builder = builder.header(SLO_HEADER, slo);
    }
    let built = builder.body(Full::new(request.body));
    let mut http_request = match built {
        Ok(r) => r,
        Err(error) => return StreamEnd::Failed(StreamFailure::Build(error.to_string())),
    };
    http_request.extensions_mut().insert(Synthetic {
        tag: Some(Arc::clone(&request.tag)),
    });

    let response = tokio::select! {
        response = proxy.handle(http_request) => response,
        () = wait_for(&mut phase, StreamPhase::Disconnect) => return StreamEnd::Stopped,
    };
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let mut text = Vec::new();
        let read = async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    text.extend_from_slice(&data);
                    if text.len() > ERROR_BODY_BYTES {
                        break;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(ERROR_BODY_TIMEOUT, read).await;
        return StreamEnd::Failed(StreamFailure::Status {
            status: status.as_u16(),
            message: error_message(&text),
        });
    }

    let mut scanner = SseScanner::new(MAX_EVENT_BYTES);
    let mut state = StreamState::default();
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = wait_for(&mut phase, StreamPhase::Disconnect) => return StreamEnd::Stopped,
        };
        match frame {
            None => break,
            Some(Err(error)) => {
                return if *phase.borrow() == StreamPhase::Running {
                    StreamEnd::Failed(StreamFailure::BrokeOff(error.to_string()))
                } else {
                    StreamEnd::Stopped
                };
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if let Err(reason) = read_events(&mut scanner, &data, &mut state, &signals) {
                    return StreamEnd::Failed(reason);
                }
                if let Some(reason) = state.failure.take() {
                    return StreamEnd::Failed(reason);
                }
            }
        }
    }
    state.end(*phase.borrow())
}

/// Resolves once `phase` reaches `target` (never, if the sender is gone before that).
async fn wait_for(phase: &mut watch::Receiver<StreamPhase>, target: StreamPhase) {
    if phase.wait_for(|p| *p == target).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The message of an error body (`{"message"}`, `{"error":{"message"}}`), else the text.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.get("message")
            .or_else(|| v.get("error").and_then(|e| e.get("message")))
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str().map(str::to_owned))
    });
    let mut text = message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    if text.len() > ERROR_MESSAGE_BYTES {
        let mut cut = ERROR_MESSAGE_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    if text.trim().is_empty() {
        "(empty body)".to_owned()
    } else {
        text
    }
}

/// Feeds one frame to the scanner (the proxy's own: any split, LF, CRLF or lone CR) and hands
/// each event's data to `state`. Errs on an event larger than [`MAX_EVENT_BYTES`], as soon as
/// the scanner starts skipping it: the stream is not what the sweep asked for.
fn read_events(
    scanner: &mut SseScanner,
    frame: &[u8],
    state: &mut StreamState,
    signals: &StreamSignals,
) -> Result<(), StreamFailure> {
    let mut oversized = false;
    scanner.feed(frame, |block| {
        oversized |= block.oversized;
        match block.event.data {
            Some(data) if !data.is_empty() => state.event(data, signals),
            _ => {} // comments, keep-alives, the LF completing a CRLF
        }
    });
    if oversized || scanner.skipping_oversized() {
        return Err(StreamFailure::OversizedEvent);
    }
    Ok(())
}

/// What one stream has shown so far.
#[derive(Default)]
struct StreamState {
    saw_output: bool,
    done: bool,
    finish_reason: Option<String>,
    failure: Option<StreamFailure>,
    output_chars: usize,
    loops: LoopDetector,
}

impl StreamState {
    fn event(&mut self, data: &[u8], signals: &StreamSignals) {
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
            return; // not ours to judge: the proxy records malformed events
        };
        if let Some(error) = chunk.error {
            let message = error
                .get("message")
                .and_then(|m| m.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string());
            self.failure = Some(StreamFailure::ErrorEvent(message));
            return;
        }
        for choice in chunk.choices {
            let text = choice.text.or_else(|| {
                choice
                    .delta
                    .and_then(|d| d.content.or(d.reasoning_content).or(d.reasoning))
            });
            if let Some(text) = text.filter(|t| !t.is_empty()) {
                if !self.saw_output {
                    self.saw_output = true;
                    signals.first_outputs.fetch_add(1, Ordering::Relaxed);
                }
                self.output_chars += text.len();
                if self.loops.push(&text) {
                    self.failure = Some(StreamFailure::OutputLoop {
                        chars: self.output_chars,
                    });
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
        }
    }

    fn end(self, phase: StreamPhase) -> StreamEnd {
        match self.finish_reason.as_deref() {
            Some("abort") => StreamEnd::Stopped,
            Some(_) if self.done => StreamEnd::Completed { at: Instant::now() },
            _ if phase != StreamPhase::Running => StreamEnd::Stopped,
            Some(reason) => StreamEnd::Failed(StreamFailure::NoTerminator {
                finish_reason: reason.to_owned(),
            }),
            None if self.done => StreamEnd::Completed { at: Instant::now() },
            None => StreamEnd::Failed(StreamFailure::NoEnd {
                chars: self.output_chars,
            }),
        }
    }
}

/// The output-loop check: after every [`LOOP_MAX_PERIOD`] new characters, is the last
/// [`LOOP_SPAN`] of output periodic with a period ≤ [`LOOP_MAX_PERIOD`] (four or more
/// identical repeats)? The smallest period comes from the KMP failure function, O(span).
#[derive(Debug, Default)]
pub struct LoopDetector {
    tail: Vec<u8>,
    since_check: usize,
    failure: Vec<usize>,
}

impl LoopDetector {
    /// Adds output; true once a loop shows.
    pub fn push(&mut self, text: &str) -> bool {
        self.tail.extend_from_slice(text.as_bytes());
        self.since_check += text.len();
        if self.tail.len() > 2 * LOOP_SPAN {
            let cut = self.tail.len() - LOOP_SPAN;
            self.tail.drain(..cut);
        }
        if self.tail.len() < LOOP_SPAN || self.since_check < LOOP_MAX_PERIOD {
            return false;
        }
        self.since_check = 0;
        let window = self
            .tail
            .get(self.tail.len() - LOOP_SPAN..)
            .unwrap_or_default();
        smallest_period(window, &mut self.failure) <= LOOP_MAX_PERIOD
    }
}

/// The smallest period of `s` (its length when it has none shorter).
pub fn smallest_period(s: &[u8], failure: &mut Vec<usize>) -> usize {
    let n = s.len();
    if n == 0 {
        return 0;
    }
    failure.clear();
    failure.resize(n, 0);
    let mut k = 0usize;
    for i in 1..n {
        while k > 0 && s.get(i) != s.get(k) {
            k = failure.get(k - 1).copied().unwrap_or(0);
        }
        if s.get(i) == s.get(k) {
            k += 1;
        }
        if let Some(slot) = failure.get_mut(i) {
            *slot = k;
        }
    }
    n - failure.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Data of every event `read_events` hands on, frame by frame.
    fn read_all(frames: &[&[u8]]) -> (Vec<String>, Result<(), StreamFailure>) {
        let signals = StreamSignals::default();
        let mut scanner = SseScanner::new(MAX_EVENT_BYTES);
        let mut state = StreamState::default();
        let mut result = Ok(());
        for frame in frames {
            result = read_events(&mut scanner, frame, &mut state, &signals);
            if result.is_err() {
                break;
            }
        }
        let mut seen = Vec::new();
        if state.saw_output {
            seen.push(format!("output {}", state.output_chars));
        }
        if state.done {
            seen.push("[DONE]".to_owned());
        }
        (seen, result)
    }

    #[test]
    fn events_split_across_frames_in_every_line_ending() {
        for ending in ["\n", "\r\n", "\r"] {
            let stream = format!(
                ": keep-alive{e}{e}data: {{\"choices\":[{{\"text\":\"abc\"}}]}}{e}{e}data: [DONE]{e}{e}",
                e = ending
            );
            let bytes = stream.as_bytes();
            for cut in 0..=bytes.len() {
                let (a, b) = bytes.split_at(cut);
                let (seen, result) = read_all(&[a, b]);
                assert_eq!(result, Ok(()));
                assert_eq!(seen, ["output 3", "[DONE]"], "{ending:?} split at {cut}");
            }
        }
    }

    #[test]
    fn an_event_past_the_limit_fails_the_stream_before_it_ends() {
        let mut frame = b"data: ".to_vec();
        frame.resize(MAX_EVENT_BYTES + 1, b'x');
        let (_, result) = read_all(&[&frame]);
        assert_eq!(result, Err(StreamFailure::OversizedEvent));
        // Whole in one frame, too.
        frame.extend_from_slice(b"\n\n");
        let (_, result) = read_all(&[&frame]);
        assert!(result.is_err());
    }

    #[test]
    fn loops_are_found_and_varied_text_is_not() {
        let mut detector = LoopDetector::default();
        let phrase = "I will check the file again. ";
        let mut found = false;
        for _ in 0..400 {
            found |= detector.push(phrase);
        }
        assert!(found, "a repeated sentence is a loop");

        let mut detector = LoopDetector::default();
        let words = crate::synthetic::prompt::filler_text("x", 1, 200_000);
        let found = words
            .as_bytes()
            .chunks(7)
            .any(|c| detector.push(std::str::from_utf8(c).unwrap()));
        assert!(!found, "seeded filler is not a loop");

        // A period longer than a quarter of the span is not a loop (fewer than 4 repeats).
        let long: String = (0..LOOP_MAX_PERIOD + 50)
            .map(|i| char::from(b'a' + (crate::synthetic::prompt::mix(i as u64) % 26) as u8))
            .collect();
        let mut detector = LoopDetector::default();
        let found = (0..10).any(|_| detector.push(&long));
        assert!(!found);
    }

    #[test]
    fn failures_print_the_words_the_driver_always_wrote() {
        let cases = [
            (
                StreamFailure::Build("invalid header value".into()),
                "cannot build the request: invalid header value",
            ),
            (
                StreamFailure::Status {
                    status: 400,
                    message: "too long".into(),
                },
                "HTTP 400: too long",
            ),
            (
                StreamFailure::BrokeOff("reset".into()),
                "the stream broke off: reset",
            ),
            (
                StreamFailure::OversizedEvent,
                "an SSE event grew past 1048576 bytes without ending",
            ),
            (
                StreamFailure::ErrorEvent("out of memory".into()),
                "error event in the stream: out of memory",
            ),
            (
                StreamFailure::OutputLoop { chars: 5000 },
                "output loop: the last 4096 characters repeat with a period of at most 1024 (after 5000 characters)",
            ),
            (
                StreamFailure::NoTerminator {
                    finish_reason: "length".into(),
                },
                "the stream ended without [DONE] (finish_reason length)",
            ),
            (
                StreamFailure::NoEnd { chars: 12 },
                "the stream ended without a finish reason or [DONE] after 12 characters",
            ),
            (
                StreamFailure::Timeout { limit_s: 60 },
                "no end of the request within 60 s",
            ),
        ];
        for (failure, words) in cases {
            assert_eq!(failure.to_string(), words);
        }
        let status = |status| StreamFailure::Status {
            status,
            message: String::new(),
        };
        assert!(status(404).is_refusal() && status(500).is_refusal());
        assert!(!status(302).is_refusal());
        assert_eq!(status(503).status_class(), Some(5));
        assert!(StreamFailure::ErrorEvent(String::new()).is_refusal());
        assert!(!StreamFailure::NoEnd { chars: 0 }.is_refusal());
        assert!(!StreamFailure::Timeout { limit_s: 1 }.is_refusal());
    }

    #[test]
    fn smallest_periods() {
        let mut scratch = Vec::new();
        assert_eq!(smallest_period(b"abcabcabc", &mut scratch), 3);
        assert_eq!(smallest_period(b"abcd", &mut scratch), 4);
        assert_eq!(smallest_period(b"aaaa", &mut scratch), 1);
        assert_eq!(smallest_period(b"", &mut scratch), 0);
    }

    #[test]
    fn stream_endings() {
        let signals = StreamSignals::default();
        let mut s = StreamState::default();
        s.event(
            br#"{"choices":[{"text":" hi","finish_reason":null}]}"#,
            &signals,
        );
        s.event(
            br#"{"choices":[{"text":" yo","finish_reason":"length"}]}"#,
            &signals,
        );
        s.event(b"[DONE]", &signals);
        assert!(matches!(
            s.end(StreamPhase::Running),
            StreamEnd::Completed { .. }
        ));
        assert_eq!(signals.first_outputs.load(Ordering::Relaxed), 1);

        let mut s = StreamState::default();
        s.event(
            br#"{"choices":[{"text":"","finish_reason":"abort"}]}"#,
            &signals,
        );
        s.event(b"[DONE]", &signals);
        assert_eq!(s.end(StreamPhase::Aborting), StreamEnd::Stopped);

        let mut s = StreamState::default();
        s.event(br#"{"choices":[{"text":"a"}]}"#, &signals);
        assert!(matches!(s.end(StreamPhase::Running), StreamEnd::Failed(_)));

        let mut s = StreamState::default();
        s.event(
            br#"{"error": {"message": "out of memory", "code": 503}}"#,
            &signals,
        );
        assert_eq!(
            s.failure,
            Some(StreamFailure::ErrorEvent("out of memory".to_owned()))
        );
        assert_eq!(
            error_message(br#"{"object":"error","message":"too long","code":400}"#),
            "too long"
        );
    }
}
