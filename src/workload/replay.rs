//! Replay: a trace's requests sent open-loop at their recorded arrival times (÷ a speed factor)
//! through the proxy's own data path, tagged synthetic, so the same metering code measures
//! them; the replay's matrix is built from those records.
//!
//! Each request becomes a `/v1/completions` stream with a token-id prompt of exactly the
//! recorded prompt length and `max_tokens` = the recorded output tokens with `ignore_eos`, so
//! the server produces exactly as many tokens as production did. Prefix sharing is reproduced:
//! the prompt's block `i` (of the trace's `block_tokens`) is a function of its `hash_ids[i]`
//! alone (the exact-length ids of `synthetic::prompt`, seeded by the id and the run), so requests
//! that shared a prefix block share those tokens; the rest of the prompt is the request's own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::aggregate::{ProductionMatrix, Window};
use crate::base::lock::lock;
use crate::base::Source;
use crate::matrix::{EvidenceRule, MatrixDoc};
use crate::meter::record::{RequestRecord, SloVerdict};
use crate::meter::slo::{SloFigures, SloTargets};
use crate::meter::RecordSink;
use crate::synthetic::prompt::{mix, token_ids};
use crate::synthetic::{DataPath, StreamEnd, StreamPhase, StreamRequest, StreamSignals};

use super::trace::{Trace, TraceRequest};

/// How to replay.
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    /// Arrival times are divided by this (2 = twice as fast).
    pub speed: f64,
    /// Send at most this many requests (the first ones).
    pub max_requests: Option<usize>,
    /// Stop sending and disconnect what is in flight after this long.
    pub max_duration: Option<Duration>,
    /// The `model` every request names.
    pub model: String,
    /// Sent as `x-tokentap-slo` on every request (the SLO the replay is judged by).
    pub slo_header: Option<HeaderValue>,
    /// Seeds the prompts: another seed gives prompts that share nothing with this run's.
    pub seed: u64,
    /// The replay matrix's evidence rule (`[evidence]`, as production's).
    pub evidence: EvidenceRule,
}

/// Where a replay is, for the progress line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayProgress {
    pub sent: usize,
    pub finished: usize,
    pub total: usize,
    pub elapsed: Duration,
    /// Time the trace takes at this speed.
    pub span: Duration,
}

/// What a replay measured.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub sent: usize,
    /// Streams that failed (an HTTP error, an error event, no terminator).
    pub failed: usize,
    /// The first failure, for the message.
    pub first_failure: Option<String>,
    /// Stopped before the end (Ctrl-C or `max_duration`).
    pub stopped: bool,
    /// The replay's matrix (`None` when nothing was recorded).
    pub matrix: Option<MatrixDoc>,
    /// The replay's requests judged one by one (SLO verdicts, TTFTs).
    pub tally: ReplayTally,
}

/// The replay's own records, request by request: their SLO verdicts (the proxy's, from the
/// `x-tokentap-slo` header each request carried: the judge production and the matrix use) and
/// which single target each missed, and the TTFT of each request that got a first token. One
/// entry per request at its end, never per event; bounded by the trace's length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayTally {
    /// Records of the replay's requests.
    pub recorded: usize,
    /// Records whose verdict is `Met`.
    pub met: usize,
    /// Records whose verdict is `Missed`.
    pub missed: usize,
    /// Records missing the TTFT, TBT and end-to-end target on its own (a failed request misses
    /// every target that is set).
    pub missed_ttft: usize,
    pub missed_tbt: usize,
    pub missed_e2e: usize,
    /// TTFT of each request that got a first token, sorted.
    pub ttft: Vec<Duration>,
}

impl ReplayTally {
    /// The `q` quantile (nearest rank) of the TTFTs measured; `None` when none was.
    pub fn ttft_quantile(&self, q: f64) -> Option<Duration> {
        let n = self.ttft.len();
        if n == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        self.ttft.get(rank.clamp(1, n) - 1).copied()
    }

    fn add(&mut self, record: &RequestRecord, targets: &SloTargets) {
        self.recorded += 1;
        match record.slo.verdict {
            SloVerdict::Met => self.met += 1,
            SloVerdict::Missed => self.missed += 1,
            SloVerdict::Unset => {}
        }
        if record.slo.verdict == SloVerdict::Missed {
            // Which target(s) it missed: each judged alone, by the same rule.
            let figures = SloFigures {
                outcome: record.outcome,
                time_to_first_token: record.timing.ttft,
                time_between_tokens: record.timing.tbt,
                duration: record.timing.duration,
            };
            let alone = |target: SloTargets| target.judge(&figures) == SloVerdict::Missed;
            let none = SloTargets::NONE;
            self.missed_ttft += usize::from(
                targets.ttft.is_some()
                    && alone(SloTargets {
                        ttft: targets.ttft,
                        ..none
                    }),
            );
            self.missed_tbt += usize::from(
                targets.tbt.is_some()
                    && alone(SloTargets {
                        tbt: targets.tbt,
                        ..none
                    }),
            );
            self.missed_e2e += usize::from(
                targets.e2e.is_some()
                    && alone(SloTargets {
                        e2e: targets.e2e,
                        ..none
                    }),
            );
        }
        if let Some(ttft) = record.timing.ttft {
            self.ttft.push(ttft);
        }
    }
}

/// The sink that keeps the tally of the replay's own records (tagged `replay`, synthetic).
struct TallySink {
    tag: Arc<str>,
    targets: SloTargets,
    tally: std::sync::Mutex<ReplayTally>,
}

impl RecordSink for TallySink {
    fn record(&self, record: &Arc<RequestRecord>) {
        if record.labels.source == Source::Synthetic
            && record.labels.tag.as_deref() == Some(&*self.tag)
        {
            lock(&self.tally).add(record, &self.targets);
        }
    }
}

/// The request body of one trace request.
pub fn request_body(
    request: &TraceRequest,
    index: usize,
    block_tokens: u64,
    plan: &ReplayPlan,
) -> Bytes {
    use std::fmt::Write as _;
    let prompt_tokens = request.prompt_tokens.max(1);
    let block_tokens = block_tokens.max(1);
    let mut json = String::with_capacity(usize::try_from(prompt_tokens).unwrap_or(0) * 5 + 256);
    json.push_str("{\"model\":");
    json.push_str(&serde_json::Value::String(plan.model.clone()).to_string());
    json.push_str(",\"prompt\":[");
    let mut written = 0u64;
    fn push(ids: impl Iterator<Item = u64>, json: &mut String, written: &mut u64) {
        for id in ids {
            if *written > 0 {
                json.push(',');
            }
            let _ = write!(json, "{id}");
            *written += 1;
        }
    }
    for hash in &request.hash_ids {
        let length = block_tokens.min(prompt_tokens.saturating_sub(written));
        if length == 0 {
            break;
        }
        let seed = mix(plan.seed ^ mix(*hash));
        push(token_ids(seed, 0, length, None), &mut json, &mut written);
    }
    let rest = prompt_tokens.saturating_sub(written);
    let own = mix(plan.seed ^ mix((index as u64) | (1 << 63)));
    push(token_ids(own, 1, rest, None), &mut json, &mut written);
    let _ = write!(
        json,
        "],\"max_tokens\":{},\"ignore_eos\":true,\"stream\":true,\"temperature\":0}}",
        request.output_tokens.max(1)
    );
    Bytes::from(json)
}

/// Replays `trace` through `path` until done, `stop` turns true, or the plan's bounds.
pub async fn replay(
    path: Arc<dyn DataPath>,
    trace: &Trace,
    plan: &ReplayPlan,
    mut stop: watch::Receiver<bool>,
    mut progress: impl FnMut(ReplayProgress),
) -> ReplayReport {
    let (contexts, concurrency) = path.ladders();
    let matrix =
        ProductionMatrix::with_evidence(contexts, concurrency, Source::Synthetic, plan.evidence);
    // Both sinks are scoped: a replay future dropped midway (Ctrl-C in a caller that gives up)
    // leaves neither behind in the meter.
    let matrix_scope = path.collect(matrix.clone());
    let tag: Arc<str> = Arc::from("replay");
    let tally = Arc::new(TallySink {
        tag: Arc::clone(&tag),
        targets: plan
            .slo_header
            .as_ref()
            .and_then(|h| SloTargets::parse_header(h.as_bytes()).ok())
            .unwrap_or_default(),
        tally: std::sync::Mutex::default(),
    });
    let tally_scope = path.collect(tally.clone());

    let speed = if plan.speed.is_finite() && plan.speed > 0.0 {
        plan.speed
    } else {
        1.0
    };
    let requests = &trace.requests[..plan
        .max_requests
        .unwrap_or(usize::MAX)
        .min(trace.requests.len())];
    let offset = |r: &TraceRequest| Duration::from_secs_f64(r.at_ms as f64 / 1000.0 / speed);
    let span = requests.last().map_or(Duration::ZERO, offset);
    let start = Instant::now();
    let deadline = plan.max_duration.map(|d| start + d);
    let (phase_tx, phase) = watch::channel(StreamPhase::Running);
    let signals = Arc::new(StreamSignals::default());
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let mut failures = (0usize, None::<String>);
    let mut stopped = false;
    let mut sent = 0;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut report = |sent: usize, finished: &AtomicUsize| {
        progress(ReplayProgress {
            sent,
            finished: finished.load(Ordering::Relaxed),
            total: requests.len(),
            elapsed: start.elapsed(),
            span,
        });
    };

    let mut note = |end: Result<StreamEnd, tokio::task::JoinError>| {
        let reason = match end {
            Ok(StreamEnd::Failed(failure)) => failure.to_string(),
            Ok(_) => return,
            Err(error) => error.to_string(),
        };
        failures.0 += 1;
        failures.1.get_or_insert(reason);
    };

    'send: for (index, request) in requests.iter().enumerate() {
        let due = start + offset(request);
        // The body (an exact-length prompt: milliseconds for a long one) is built before the
        // request is due, so it leaves at its recorded time, not after its own preparation.
        let stream = StreamRequest {
            path: "/v1/completions",
            body: request_body(request, index, trace.header.block_tokens, plan),
            tag: Arc::clone(&tag),
            slo_header: plan.slo_header.clone(),
        };
        loop {
            if deadline.is_some_and(|d| d <= Instant::now()) {
                stopped = true;
                break 'send;
            }
            let wake = deadline.map_or(due, |d| d.min(due));
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= due { break; }
                }
                _ = ticker.tick() => report(sent, &finished),
                Some(end) = tasks.join_next(), if !tasks.is_empty() => note(end),
                _ = stop.changed() => {
                    stopped = true;
                    break 'send;
                }
            }
        }
        let stream = path.stream(stream, phase.clone(), Arc::clone(&signals));
        let finished = Arc::clone(&finished);
        tasks.spawn(async move {
            let end = stream.await;
            finished.fetch_add(1, Ordering::Relaxed);
            end
        });
        sent += 1;
    }
    if stopped {
        // Dropping the streams disconnects them: the upstream stops at once.
        let _ = phase_tx.send(StreamPhase::Disconnect);
    }
    // Wait for what is in flight, bounded by the deadline and Ctrl-C like sending was.
    while !tasks.is_empty() {
        let wake = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            Some(end) = tasks.join_next() => note(end),
            _ = ticker.tick() => report(sent, &finished),
            () = tokio::time::sleep_until(wake), if !stopped => {
                stopped = true;
                let _ = phase_tx.send(StreamPhase::Disconnect);
            }
            _ = stop.changed(), if !stopped => {
                stopped = true;
                let _ = phase_tx.send(StreamPhase::Disconnect);
            }
        }
    }
    report(sent, &finished);
    drop((matrix_scope, tally_scope));
    let mut tally = std::mem::take(&mut *lock(&tally.tally));
    tally.ttft.sort_unstable();
    ReplayReport {
        tally,
        sent,
        failed: failures.0,
        first_failure: failures.1,
        stopped,
        matrix: matrix.matrix(Window::All, None, SystemTime::now()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ReplayPlan {
        ReplayPlan {
            speed: 1.0,
            max_requests: None,
            max_duration: None,
            model: "m".into(),
            slo_header: None,
            seed: 9,
            evidence: EvidenceRule::default(),
        }
    }

    fn prompt(body: &Bytes) -> Vec<u64> {
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(value["ignore_eos"], true);
        value["prompt"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    }

    fn request(prompt_tokens: u64, hash_ids: Vec<u64>) -> TraceRequest {
        TraceRequest {
            at_ms: 0,
            route: None,
            model: None,
            stream: true,
            prompt_tokens,
            cached_tokens: None,
            max_tokens: None,
            output_tokens: 7,
            outcome: None,
            hash_ids,
            turn: super::super::trace::SessionTurn::default(),
        }
    }

    #[test]
    fn prompts_are_exact_length_and_share_exactly_the_shared_blocks() {
        let a = prompt(&request_body(
            &request(1200, vec![0, 1, 2]),
            0,
            512,
            &plan(),
        ));
        let b = prompt(&request_body(
            &request(1100, vec![0, 1, 3]),
            1,
            512,
            &plan(),
        ));
        let c = prompt(&request_body(&request(300, vec![]), 2, 512, &plan()));
        let d = prompt(&request_body(
            &request(1200, vec![0, 1, 2]),
            3,
            512,
            &plan(),
        ));
        assert_eq!((a.len(), b.len(), c.len()), (1200, 1100, 300));
        assert_eq!(a[..1024], b[..1024]);
        assert_ne!(a[1024..1100], b[1024..1100]);
        assert_ne!(a[..16], c[..16]);
        assert_eq!(a, d);
        let other_run = ReplayPlan { seed: 10, ..plan() };
        let e = prompt(&request_body(
            &request(1200, vec![0, 1, 2]),
            0,
            512,
            &other_run,
        ));
        assert_ne!(a[..512], e[..512]);
        let body: serde_json::Value =
            serde_json::from_slice(&request_body(&request(1, vec![]), 0, 512, &plan())).unwrap();
        assert_eq!(body["max_tokens"], 7);
    }

    /// A data path whose streams never end: the replay can only be dropped midway.
    #[derive(Default)]
    struct Silent {
        sinks: std::sync::Mutex<Vec<Arc<dyn RecordSink>>>,
        streams: AtomicUsize,
    }

    impl std::fmt::Debug for Silent {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Silent")
        }
    }

    impl DataPath for Arc<Silent> {
        fn stream(
            &self,
            _request: StreamRequest,
            _phase: watch::Receiver<StreamPhase>,
            _signals: Arc<StreamSignals>,
        ) -> crate::synthetic::BoxFuture<'static, StreamEnd> {
            self.streams.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::pending())
        }

        fn call<'a>(
            &'a self,
            _method: http::Method,
            _path: &'a str,
            _body: Option<Bytes>,
            _timeout: Duration,
        ) -> crate::synthetic::BoxFuture<
            'a,
            Result<crate::synthetic::client::Answer, crate::synthetic::client::CallError>,
        > {
            Box::pin(std::future::pending())
        }

        fn collect(&self, sink: Arc<dyn RecordSink>) -> crate::synthetic::SinkScope {
            self.sinks.lock().unwrap().push(Arc::clone(&sink));
            let me = Arc::clone(self);
            crate::synthetic::SinkScope::new(move || {
                me.sinks.lock().unwrap().retain(|s| !Arc::ptr_eq(s, &sink));
            })
        }

        fn production_in_flight(&self) -> u64 {
            0
        }

        fn synthetic_tokens(&self) -> u64 {
            0
        }

        fn ladders(&self) -> (crate::meter::buckets::Ladder, crate::meter::buckets::Ladder) {
            (
                crate::meter::buckets::Ladder::contexts(&[8192]).unwrap(),
                crate::meter::buckets::Ladder::concurrency(&[1]).unwrap(),
            )
        }

        fn server_load<'a>(
            &'a self,
            _model: &'a Arc<str>,
            _gauges: &'a crate::synthetic::LoadGauges,
        ) -> crate::synthetic::BoxFuture<'a, Option<(f64, f64)>> {
            Box::pin(async { None })
        }

        fn refresh_server_state<'a>(
            &'a self,
            _model: &'a Arc<str>,
        ) -> crate::synthetic::BoxFuture<'a, ()> {
            Box::pin(async {})
        }

        fn abort<'a>(
            &'a self,
            _how: crate::base::engine::Abort,
            _rids: &'a [Arc<str>],
            _timeout: Duration,
        ) -> crate::synthetic::BoxFuture<'a, ()> {
            Box::pin(async {})
        }

        fn describe(&self) -> crate::synthetic::BoxFuture<'_, crate::synthetic::Described> {
            Box::pin(async { crate::synthetic::Described::default() })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replay_dropped_midway_leaves_no_sink_behind() {
        let silent = Arc::new(Silent::default());
        let path: Arc<dyn DataPath> = Arc::new(Arc::clone(&silent));
        let trace = Trace {
            header: super::super::trace::TraceHeader {
                schema: super::super::trace::SCHEMA.into(),
                block_tokens: 512,
                origin: "capture".into(),
                start: None,
                requests: 1,
            },
            requests: vec![request(64, vec![])],
        };
        let (_stop_tx, stop) = watch::channel(false);
        let plan = plan();
        let replaying = replay(path, &trace, &plan, stop, |_| {});
        // Far longer than it takes to send the one request; its stream never ends.
        let outcome = tokio::time::timeout(Duration::from_secs(10), replaying).await;
        assert!(outcome.is_err(), "the replay cannot finish");
        assert_eq!(silent.streams.load(Ordering::SeqCst), 1, "it was sent");
        assert!(
            silent.sinks.lock().unwrap().is_empty(),
            "the dropped replay's matrix and tally sinks are gone"
        );
    }
}
