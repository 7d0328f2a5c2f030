//! The per-request record: what was measured and what is derived from it, and the SLO
//! verdict it carries.
//!
//! A record is built once, when a request ends, from its [`Timeline`](super::timeline::Timeline) and the upstream's
//! usage, and handed to every [`super::RecordSink`] (Prometheus, matrix aggregators,
//! OpenTelemetry, sweeps). Derived values follow the seed tool's definitions:
//! TTFT = first token − request head in; TBT = (last token − first token) / (completion − 1);
//! per-request tok/s = 1 / TBT; prefill tok/s = (prompt − cached) / TTFT.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::buckets::MAX_LADDER;
use super::server_state::ServerStateMeans;
use super::timeline::{ConcurrencySplit, LocalHistogram, NO_BOUNDS};

/// How a finished request fared against its targets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SloVerdict {
    /// No target was set for this request.
    #[default]
    Unset,
    /// Every set target was met.
    Met,
    /// At least one set target was missed, or the request failed.
    Missed,
}

impl SloVerdict {
    /// The verdicts that count towards attainment, in label order.
    pub const JUDGED: [SloVerdict; 2] = [SloVerdict::Met, SloVerdict::Missed];

    pub fn label(self) -> &'static str {
        match self {
            SloVerdict::Unset => "unset",
            SloVerdict::Met => "met",
            SloVerdict::Missed => "missed",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream answered with a success status and, when streaming, its end marker.
    Ok,
    /// Status ≥ 400, or an error event inside the stream.
    UpstreamError,
    /// The client went away before the response ended.
    ClientAborted,
    /// The upstream reset the connection or ended the stream without its end marker.
    UpstreamAborted,
    /// The upstream did not answer within the configured time.
    Timeout,
    /// The upstream's response went silent mid-body for longer than `stream_idle_timeout`;
    /// tokentap ended it (a stalling server, not a client giving up).
    UpstreamStalled,
    /// The engine (or a gateway in front of it) refused the request for load: status 429 or
    /// 503 (with or without `Retry-After`), or a stream that ended with the engine's own
    /// queue-full or priority-preemption abort (sglang's `--max-queued-requests`, vLLM's
    /// `--max-num-queued-reqs`/`--max-num-queued-tokens`). A server failure (one of
    /// [`Outcome::FAILURES`]: it misses every SLO and counts against availability), not a
    /// client abort, kept apart from `upstream_error` because it means "over capacity", not
    /// "broken".
    Shed,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::UpstreamError,
        Outcome::ClientAborted,
        Outcome::UpstreamAborted,
        Outcome::Timeout,
        Outcome::UpstreamStalled,
        Outcome::Shed,
    ];

    /// The outcomes that are the server's failures, in [`Outcome::ALL`] order: upstream errors,
    /// upstream aborts, timeouts, stalls and shed requests (a request the engine refused for
    /// load was not served: it misses its SLO and counts against availability). A client abort
    /// is not one (people press stop): availability = 1 − failed ÷ (every request but client
    /// aborts), docs/metrics.md.
    pub const FAILURES: [Outcome; 5] = [
        Outcome::UpstreamError,
        Outcome::UpstreamAborted,
        Outcome::Timeout,
        Outcome::UpstreamStalled,
        Outcome::Shed,
    ];

    /// Whether the request failed on the server's side (one of [`Outcome::FAILURES`]): the one
    /// definition the matrix's `Error` status, the SLO verdict and the availability rules share.
    pub fn is_failure(self) -> bool {
        Self::FAILURES.contains(&self)
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientAborted => "client_aborted",
            Outcome::UpstreamAborted => "upstream_aborted",
            Outcome::Timeout => "timeout",
            Outcome::UpstreamStalled => "upstream_stalled",
            Outcome::Shed => "shed",
        }
    }
}

/// Everything measured about one metered request: who it was and how it ended at the top,
/// the measurements in one group per concern (`record.timing.ttft`, `record.tokens.completion`,
/// `record.interference.average_active`, …).
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// Who it was (model, upstream, route, source, configuration, traffic slice), as fixed
    /// when it started.
    pub labels: super::labels::RequestLabels,
    pub outcome: Outcome,
    /// HTTP status from the upstream (or the one tokentap answered with, e.g. 502).
    pub status: u16,
    /// The response was an event stream.
    pub streaming: bool,
    /// The request offered tools: such requests are told apart (a tools list alone adds
    /// prefill time on some models).
    pub with_tools: bool,
    /// Salted block ids of the prompt's prefix (`stream::fingerprint`), for the workload
    /// capture; empty when capture is off.
    pub prefix_blocks: Vec<u64>,
    /// The request as a turn of its session (`meter::conversation`), when it has one.
    pub turn: Option<super::conversation::Turn>,
    pub timing: Timing,
    pub tokens: Tokens,
    pub interference: Interference,
    /// The production-matrix cell the request lands in.
    pub buckets: Buckets,
    /// The upstream's own state (scraped from its `/metrics`), time-weighted over this
    /// request's interval (head in → end); a gauge no scrape covered is absent.
    pub server_state: ServerStateMeans,
    pub slo: SloResult,
    pub overhead: Overhead,
    /// The request id the client sent (`x-request-id`, visible ASCII, at most 128 bytes), or
    /// tokentap's own when the request's timing was handed back and the client sent none or a
    /// bad one (`proxy::request_id`): what ties a client's `Server-Timing` to this record.
    pub request_id: Option<Arc<str>>,
}

/// When things happened, relative to request head in (`started_at` is wall-clock).
#[derive(Debug, Clone)]
pub struct Timing {
    /// Wall-clock time of request head in (for windows and traces).
    pub started_at: SystemTime,
    pub to_headers: Option<Duration>,
    pub to_first_byte: Option<Duration>,
    /// Time to first token, of any kind (reasoning, answer or tool call): the matrix's TTFT.
    pub ttft: Option<Duration>,
    /// Time to the first answer token (content): what a user of a reasoning model waits for.
    pub ttft_answer: Option<Duration>,
    /// Time to the first tool-call delta.
    pub ttft_tool_call: Option<Duration>,
    /// To the first event that delivered a token, visible or not (usage advanced): the end of
    /// prefill even when the first token is silent (a partial UTF-8 byte). The sweep's scout
    /// times prefill with it.
    pub to_first_delivery: Option<Duration>,
    pub duration: Duration,
    /// First token → last token.
    pub decode: Option<Duration>,
    /// Time between tokens: `decode / (completion − 1)`.
    pub tbt: Option<Duration>,
    /// Inter-token latency, per token (see [`super::timeline::Timeline::itl`]).
    pub itl: LocalHistogram,
}

impl Default for Timing {
    /// Nothing timed, started at the Unix epoch, an ITL histogram without bounds.
    fn default() -> Self {
        Self {
            started_at: SystemTime::UNIX_EPOCH,
            to_headers: None,
            to_first_byte: None,
            ttft: None,
            ttft_answer: None,
            ttft_tool_call: None,
            to_first_delivery: None,
            duration: Duration::ZERO,
            decode: None,
            tbt: None,
            itl: LocalHistogram::new(&NO_BOUNDS),
        }
    }
}

/// Token counts and the rates derived from them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tokens {
    pub prompt: Option<u64>,
    pub cached: Option<u64>,
    /// Of the completion, the reasoning tokens, when the server reported them.
    pub reasoning: Option<u64>,
    pub completion: u64,
    /// `completion` came from the upstream's usage, not from counting events.
    pub completion_exact: bool,
    /// Events that carried output.
    pub events: u64,
    /// Of those, the events that came less than `meter::timeline::BURST_GAP` after the
    /// previous one: delivered together rather than as decoded.
    pub coalesced_events: u64,
    /// The request's `max_tokens`.
    pub max: Option<u64>,
    /// Per-request tok/s = 1 / TBT.
    pub per_second: Option<f64>,
    /// Prefill tok/s = (prompt − cached) / TTFT.
    pub prefill_per_second: Option<f64>,
}

impl Tokens {
    /// Completion tokens per event (speculative decoding shows several).
    pub fn per_event(&self) -> Option<f64> {
        (self.events > 0).then(|| self.completion as f64 / self.events as f64)
    }

    /// Whether the stream came in bursts: more than half the gaps between its output events
    /// (at least two of them) were too short to be decode steps. Its gaps measure the
    /// delivery, not the engine: a cell of such streams has no decode figures to trust.
    pub fn delivered_in_bursts(&self) -> bool {
        let gaps = self.events.saturating_sub(1);
        gaps >= 2 && self.coalesced_events.saturating_mul(2) > gaps
    }
}

/// What else the upstream was doing while this request decoded.
#[derive(Debug, Clone, Copy)]
pub struct Interference {
    /// Time-weighted mean in-flight count (same upstream and model) over the decode interval.
    pub average_active: f64,
    /// Share (0–1) of the decode interval during which at least one other request to the
    /// same upstream and model was in prefill (head in → first token); `None` without a
    /// decode interval.
    pub prefill_overlap_share: Option<f64>,
    /// Prefills of other requests that overlapped the decode interval.
    pub overlapping_prefills: Option<u32>,
    /// Seconds of the decode gaps during which another request was in prefill, by the
    /// concurrency bucket in force when each gap's token event arrived (as `split.seconds`).
    pub prefill_busy: [f64; MAX_LADDER],
    /// Tokens and decode seconds by the concurrency bucket in force at each token event.
    pub split: ConcurrencySplit,
}

impl Default for Interference {
    fn default() -> Self {
        Self {
            average_active: 0.0,
            prefill_overlap_share: None,
            overlapping_prefills: None,
            prefill_busy: [0.0; MAX_LADDER],
            split: ConcurrencySplit::default(),
        }
    }
}

/// The ladder buckets (indices) of the request's production-matrix cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buckets {
    /// From the prompt's length: the upstream's count, else (an error body, a stream broken
    /// off before its usage, no answer) the estimate from the prompt's size the request was
    /// admitted with, so a failure is counted in the cell its prompt belongs to.
    pub context: usize,
    /// From [`Interference::average_active`].
    pub concurrency: usize,
}

/// The request's SLO verdict and how its targets were read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SloResult {
    /// How the request fared against its SLO targets (configured or from its header).
    pub verdict: SloVerdict,
    /// The request's `x-tokentap-slo` header could not be read (and was ignored).
    pub header_invalid: bool,
}

/// Time spent inside tokentap itself.
#[derive(Debug, Clone)]
pub struct Overhead {
    /// Between request head in (or body read) and upstream send.
    pub request: Option<Duration>,
    /// Per forwarded frame.
    pub per_frame: LocalHistogram,
    /// Frames forwarded.
    pub frames: u64,
}

impl Default for Overhead {
    fn default() -> Self {
        Self {
            request: None,
            per_frame: LocalHistogram::new(&NO_BOUNDS),
            frames: 0,
        }
    }
}

#[cfg(test)]
impl RequestRecord {
    /// A streamed chat request to model `m` on upstream `default`, production, `ok` with
    /// status 200, nothing measured: tests set the groups they need
    /// (`RequestRecord { tokens, ..RequestRecord::for_test() }`).
    pub fn for_test() -> Self {
        Self {
            labels: super::labels::RequestLabels::for_test(),
            outcome: Outcome::Ok,
            status: 200,
            streaming: true,
            with_tools: false,
            prefix_blocks: Vec::new(),
            turn: None,
            timing: Timing::default(),
            tokens: Tokens::default(),
            interference: Interference::default(),
            buckets: Buckets::default(),
            server_state: ServerStateMeans::default(),
            slo: SloResult::default(),
            overhead: Overhead::default(),
            request_id: None,
        }
    }
}

/// TBT = decode time / (completion − 1); `None` with fewer than two tokens or no decode time.
pub fn time_between_tokens(decode: Option<Duration>, completion_tokens: u64) -> Option<Duration> {
    let decode = decode?;
    if completion_tokens < 2 || decode.is_zero() {
        return None;
    }
    Some(decode / u32::try_from(completion_tokens - 1).unwrap_or(u32::MAX))
}

/// Prefill tok/s = (prompt − cached) / TTFT.
pub fn prefill_rate(
    prompt: Option<u64>,
    cached: Option<u64>,
    ttft: Option<Duration>,
) -> Option<f64> {
    let prompt = prompt?;
    let ttft = ttft?.as_secs_f64();
    let uncached = prompt.saturating_sub(cached.unwrap_or(0));
    (ttft > 0.0 && uncached > 0).then(|| uncached as f64 / ttft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_values_follow_the_seed_definitions() {
        let tbt = time_between_tokens(Some(Duration::from_millis(990)), 100).unwrap();
        assert_eq!(tbt, Duration::from_millis(10));
        assert_eq!(time_between_tokens(Some(Duration::from_secs(1)), 1), None);
        assert_eq!(time_between_tokens(Some(Duration::ZERO), 5), None);
        let rate = prefill_rate(Some(8192), Some(192), Some(Duration::from_millis(500))).unwrap();
        assert!((rate - 16_000.0).abs() < 1e-6);
        assert_eq!(
            prefill_rate(Some(10), Some(10), Some(Duration::from_secs(1))),
            None
        );
    }
}
