//! The runner's decisions — pause for production and resume, measure an interrupted cell again
//! and give up after three, cancel within its grace, note a drain that did not finish, fall
//! back from token-id to text prompts on a refusal — driven against a scripted [`DataPath`] in
//! paused time (`start_paused`: every sleep and timeout of the runner advances the clock at
//! once, so a sweep of 30-second barriers runs in milliseconds of wall time). The fake streams
//! until told to stop, answers `/tokenize` by counting four characters a token, and publishes a
//! record for every scout it completes, as the metering path would.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{run, RunnerInput, CANCEL_GRACE, DRAIN_LIMIT, TICK};
use crate::base::{Route, Source};
use crate::config::SweepConfig;
use crate::matrix::{CellStatus, MatrixDoc};
use crate::meter::buckets::Ladder;
use crate::meter::record::{Outcome, RequestRecord, SloVerdict};
use crate::meter::timeline::{ConcurrencySplit, LocalHistogram};
use crate::meter::RecordSink;
use crate::sweep::latest::LatestMatrix;
use crate::sweep::plan::{
    DurationValue, EngineKind, Plan, PromptMode, ServerFacts, SweepRequest, TokensValue,
};
use crate::sweep::status::{StatusCell, StepPhase, SweepState, SweepStatus};
use crate::synthetic::client::{Answer, CallError};
use crate::synthetic::{
    BoxFuture, DataPath, LoadGauges, SinkScope, StreamEnd, StreamFailure, StreamPhase,
    StreamRequest, StreamSignals,
};

const GUARD: u64 = 4;

type Production = Box<dyn Fn(&FakeState) -> u64 + Send + Sync>;
type Load = Box<dyn Fn(&FakeState) -> Option<(f64, f64)> + Send + Sync>;

/// What the fake data path holds and has seen.
struct FakeState {
    started: Instant,
    /// Production in flight, asked at every look.
    production: Production,
    /// The server's running and queued requests, asked at every look.
    load: Load,
    /// How the next scouts end (a completed scout, with its record, once this is empty).
    scouts: Mutex<VecDeque<StreamEnd>>,
    /// Decode streams end only on a disconnect (as if the server ignored the abort).
    streams_ignore_abort: bool,
    /// An abort never answers (bounded only by the runner's grace).
    abort_hangs: bool,
    sinks: Mutex<Vec<Arc<dyn RecordSink>>>,
    bodies: Mutex<Vec<String>>,
    live_streams: AtomicUsize,
    disconnected: AtomicUsize,
    aborted: AtomicUsize,
    tokens: AtomicU64,
}

#[derive(Clone)]
struct Fake(Arc<FakeState>);

impl fmt::Debug for Fake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fake").finish_non_exhaustive()
    }
}

impl Fake {
    fn builder(production: Production, load: Load) -> FakeBuilder {
        FakeBuilder(FakeState {
            started: Instant::now(),
            production,
            load,
            scouts: Mutex::default(),
            streams_ignore_abort: false,
            abort_hangs: false,
            sinks: Mutex::default(),
            bodies: Mutex::default(),
            live_streams: AtomicUsize::new(0),
            disconnected: AtomicUsize::new(0),
            aborted: AtomicUsize::new(0),
            tokens: AtomicU64::new(0),
        })
    }

    fn bodies(&self) -> Vec<String> {
        self.0.bodies.lock().unwrap().clone()
    }
}

struct FakeBuilder(FakeState);

impl FakeBuilder {
    fn scouts(self, ends: Vec<StreamEnd>) -> Self {
        *self.0.scouts.lock().unwrap() = ends.into();
        self
    }

    fn deaf_to_aborts(mut self) -> Self {
        self.0.streams_ignore_abort = true;
        self.0.abort_hangs = true;
        self
    }

    fn build(self) -> Fake {
        Fake(Arc::new(self.0))
    }
}

/// Counts a decode stream live while it runs.
struct Live(Arc<FakeState>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live_streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The record the metering path would publish for a scout that got its token in 50 ms.
fn scout_record(tag: Arc<str>, prompt_tokens: u64) -> Arc<RequestRecord> {
    Arc::new(RequestRecord {
        route: Route::Completions,
        source: Source::Synthetic,
        model: Arc::from("m"),
        upstream: Arc::from("default"),
        tag: Some(tag),
        outcome: Outcome::Ok,
        status: 200,
        streaming: true,
        started_at: SystemTime::now(),
        time_to_headers: None,
        time_to_first_byte: None,
        time_to_first_token: Some(Duration::from_millis(50)),
        time_to_first_delivery: Some(Duration::from_millis(50)),
        duration: Duration::from_millis(50),
        decode_time: None,
        prompt_tokens: Some(prompt_tokens),
        cached_tokens: Some(0),
        completion_tokens: 1,
        completion_exact: true,
        token_events: 1,
        max_tokens: Some(1),
        prefix_blocks: Vec::new(),
        time_between_tokens: None,
        per_request_tokens_per_second: None,
        prefill_tokens_per_second: None,
        average_active_requests: 1.0,
        prefill_overlap_share: None,
        overlapping_prefills: None,
        prefill_busy: [0.0; crate::meter::buckets::MAX_LADDER],
        slo: SloVerdict::Unset,
        slo_header_invalid: false,
        server_state: Default::default(),
        context_bucket: 0,
        concurrency_bucket: 0,
        itl: LocalHistogram::new(&[]),
        split: ConcurrencySplit::default(),
        request_overhead: None,
        frame_overhead: LocalHistogram::new(&[]),
        frames: 0,
    })
}

/// The prompt's length in tokens as the fake counts it: ids one a token, text four characters.
fn prompt_tokens(body: &str) -> u64 {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    match &value["prompt"] {
        serde_json::Value::Array(ids) => ids.len() as u64,
        serde_json::Value::String(text) => (text.len() as u64).div_ceil(4),
        _ => 0,
    }
}

impl DataPath for Fake {
    fn stream(
        &self,
        request: StreamRequest,
        mut phase: watch::Receiver<StreamPhase>,
        signals: Arc<StreamSignals>,
    ) -> BoxFuture<'static, StreamEnd> {
        let state = Arc::clone(&self.0);
        let body = String::from_utf8_lossy(&request.body).into_owned();
        state.bodies.lock().unwrap().push(body.clone());
        let scout = body.contains("\"max_tokens\":1,");
        Box::pin(async move {
            if scout {
                let scripted = state.scouts.lock().unwrap().pop_front();
                if let Some(end) = scripted {
                    return end;
                }
                let record = scout_record(Arc::clone(&request.tag), prompt_tokens(&body));
                for sink in state.sinks.lock().unwrap().iter() {
                    sink.record(&record);
                }
                return StreamEnd::Completed { at: Instant::now() };
            }
            state.live_streams.fetch_add(1, Ordering::SeqCst);
            let _live = Live(Arc::clone(&state));
            signals.first_outputs.fetch_add(1, Ordering::SeqCst);
            let deaf = state.streams_ignore_abort;
            let _ = phase
                .wait_for(|p| match p {
                    StreamPhase::Running => false,
                    StreamPhase::Aborting => !deaf,
                    StreamPhase::Disconnect => true,
                })
                .await;
            if *phase.borrow() == StreamPhase::Disconnect {
                state.disconnected.fetch_add(1, Ordering::SeqCst);
            }
            StreamEnd::Stopped
        })
    }

    fn call<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<Bytes>,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, CallError>> {
        Box::pin(async move {
            let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
            let answer = if method == Method::POST && path == "/tokenize" {
                let count = prompt_tokens(&body);
                Answer {
                    status: StatusCode::OK,
                    body: Bytes::from(format!("{{\"count\":{count}}}")),
                }
            } else {
                Answer {
                    status: StatusCode::NOT_FOUND,
                    body: Bytes::from_static(b"{\"message\":\"not here\"}"),
                }
            };
            Ok(answer)
        })
    }

    fn collect(&self, sink: Arc<dyn RecordSink>) -> SinkScope {
        self.0.sinks.lock().unwrap().push(Arc::clone(&sink));
        let state = Arc::clone(&self.0);
        SinkScope::new(move || {
            state
                .sinks
                .lock()
                .unwrap()
                .retain(|s| !Arc::ptr_eq(s, &sink));
        })
    }

    fn production_in_flight(&self) -> u64 {
        (self.0.production)(&self.0)
    }

    fn synthetic_tokens(&self) -> u64 {
        // Ten tokens a look: every window sees output.
        self.0.tokens.fetch_add(10, Ordering::SeqCst)
    }

    fn ladders(&self) -> (Ladder, Ladder) {
        (
            Ladder::contexts(&[8192]).unwrap(),
            Ladder::concurrency(&[1, 2]).unwrap(),
        )
    }

    fn server_load<'a>(
        &'a self,
        _model: &'a Arc<str>,
        _gauges: &'a LoadGauges,
    ) -> BoxFuture<'a, Option<(f64, f64)>> {
        Box::pin(async move { (self.0.load)(&self.0) })
    }

    fn refresh_server_state<'a>(&'a self, _model: &'a Arc<str>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn abort<'a>(&'a self, rids: &'a [Arc<str>], _timeout: Duration) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.0.aborted.fetch_add(rids.len(), Ordering::SeqCst);
            if self.0.abort_hangs {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// Production in flight that is always `n`.
fn production(n: u64) -> Production {
    Box::new(move |_| n)
}

/// A server that says it runs exactly what the sweep streams (and queues nothing).
fn load_of_live_streams() -> Load {
    Box::new(|state| Some((state.live_streams.load(Ordering::SeqCst) as f64, 0.0)))
}

/// One context (8K), one level (2 streams), a one-second window, on an sglang server.
fn plan(prompt: PromptMode) -> (Plan, ServerFacts, SweepRequest) {
    let facts = ServerFacts {
        engine: EngineKind::Sglang,
        served_model: Some("m".into()),
        context_length: Some(32_768),
        kv_budget_tokens: Some(1 << 20),
        has_running_gauge: true,
        answered: true,
        ..ServerFacts::default()
    };
    let request = SweepRequest {
        contexts: Some(vec![TokensValue::Count(8192)]),
        concurrency: Some(vec![2]),
        cell_duration: Some(DurationValue::Seconds(1.0)),
        max_output: Some(64),
        full_context_prefill: Some(false),
        model: Some("m".into()),
        prompt: Some(prompt),
        ..SweepRequest::default()
    };
    let config = SweepConfig {
        production_guard: GUARD,
        cell_duration: Duration::from_secs(1),
        max_output: 64,
        kv_budget_tokens: 0,
    };
    let plan = Plan::resolve(&request, &facts, &config).unwrap();
    (plan, facts, request)
}

struct Sweep {
    status: Arc<StatusCell>,
    cancel: watch::Sender<bool>,
    task: tokio::task::JoinHandle<MatrixDoc>,
}

fn start(fake: &Fake, prompt: PromptMode) -> Sweep {
    let (plan, facts, request) = plan(prompt);
    let status = StatusCell::new(SweepStatus::new("t".into(), request));
    let (cancel, cancel_rx) = watch::channel(false);
    let input = RunnerInput {
        path: Arc::new(fake.clone()),
        id: "t".into(),
        plan,
        facts,
        production_guard: GUARD,
        status: Arc::clone(&status),
        latest: LatestMatrix::default(),
        cancel: cancel_rx,
    };
    Sweep {
        status,
        cancel,
        task: tokio::spawn(run(input)),
    }
}

async fn finish(fake: &Fake, prompt: PromptMode) -> (MatrixDoc, SweepStatus) {
    let sweep = start(fake, prompt);
    let matrix = sweep.task.await.unwrap();
    assert!(
        fake.0.sinks.lock().unwrap().is_empty(),
        "the run's record sink is gone with it"
    );
    (matrix, sweep.status.snapshot())
}

fn has_note(matrix: &MatrixDoc, wanted: &str) -> bool {
    matrix.metadata.notes.iter().any(|n| n.contains(wanted))
}

#[tokio::test(start_paused = true)]
async fn production_above_the_guard_pauses_the_sweep_and_it_resumes_when_it_falls() {
    // Ten production requests for the first 1.5 s (of paused time), none after.
    let busy = Box::new(|state: &FakeState| {
        if Instant::now() < state.started + Duration::from_millis(1500) {
            10
        } else {
            0
        }
    });
    let fake = Fake::builder(busy, load_of_live_streams()).build();
    let (matrix, status) = finish(&fake, PromptMode::TokenIds).await;
    assert!(
        has_note(
            &matrix,
            "Paused 1.5 s before prefill 8K: up to 10 production requests in flight (guard 4)"
        ),
        "{:#?}",
        matrix.metadata.notes
    );
    assert_eq!(status.state, SweepState::Finished);
    assert!(
        status.progress.paused_s >= 1.5,
        "{}",
        status.progress.paused_s
    );
    // It resumed: the scout and the cell's two streams were sent after the pause.
    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert!(matrix.prefill_row(8192).unwrap().status.is_valid());
}

#[tokio::test(start_paused = true)]
async fn a_cell_interrupted_three_times_by_production_is_an_error_cell() {
    // Production arrives whenever the cell's streams run.
    let with_streams = Box::new(|state: &FakeState| {
        if state.live_streams.load(Ordering::SeqCst) > 0 {
            10
        } else {
            0
        }
    });
    let fake = Fake::builder(with_streams, load_of_live_streams()).build();
    let (matrix, status) = finish(&fake, PromptMode::TokenIds).await;
    let cell = matrix.cell(8192, 2).unwrap();
    assert_eq!(
        cell.status,
        CellStatus::error(
            "interrupted 3 times by production traffic above the guard (10 in flight > 4)"
        )
    );
    let retries = matrix
        .metadata
        .notes
        .iter()
        .filter(|n| {
            n.as_str()
                == "8K × 2 was interrupted by production traffic (10 requests in flight > guard 4) and measured again"
        })
        .count();
    assert_eq!(retries, 2, "{:#?}", matrix.metadata.notes);
    assert_eq!(status.state, SweepState::Finished);
    // Three attempts of two streams each, after the scout; every stream was stopped.
    assert_eq!(fake.bodies().len(), 1 + 3 * 2);
    assert_eq!(fake.0.live_streams.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_stops_streams_that_ignore_the_abort_within_its_grace() {
    let fake = Fake::builder(production(0), load_of_live_streams())
        .deaf_to_aborts()
        .build();
    let sweep = start(&fake, PromptMode::TokenIds);
    // Wait (bounded, in paused time) for the window, then cancel.
    let mut looks = 0;
    while sweep
        .status
        .snapshot()
        .progress
        .current
        .is_none_or(|c| c.phase != StepPhase::Window)
    {
        looks += 1;
        assert!(looks < 1000, "the sweep never reached its window");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cancelled_at = Instant::now();
    sweep.cancel.send(true).unwrap();
    let matrix = sweep.task.await.unwrap();
    let took = cancelled_at.elapsed();
    // The abort that never answers and the wait for streams deaf to it are each cut at the
    // grace; then the streams are dropped.
    assert!(took <= 2 * CANCEL_GRACE + TICK, "{took:?}");
    assert_eq!(fake.0.disconnected.load(Ordering::SeqCst), 2);
    assert_eq!(
        fake.0.aborted.load(Ordering::SeqCst),
        2,
        "both asked by rid"
    );
    assert_eq!(sweep.status.snapshot().state, SweepState::Cancelled);
    assert!(has_note(
        &matrix,
        "Cancelled: the cells not measured are Not run"
    ));
    assert_eq!(matrix.cell(8192, 2).unwrap().status, CellStatus::NotRun);
    assert!(fake.0.sinks.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_drains_is_noted_and_the_sweep_goes_on() {
    // The server keeps saying it runs five and queues one, whatever the sweep does.
    let stuck = Box::new(|_: &FakeState| Some((5.0, 1.0)));
    let fake = Fake::builder(production(0), stuck).build();
    let began = Instant::now();
    let (matrix, status) = finish(&fake, PromptMode::TokenIds).await;
    assert!(
        has_note(
            &matrix,
            "8K × 2: the server still reported 5 running and 1 queued 30 s after the abort; the next cell went ahead"
        ),
        "{:#?}",
        matrix.metadata.notes
    );
    assert!(began.elapsed() >= DRAIN_LIMIT);
    assert_eq!(status.state, SweepState::Finished);
}

#[tokio::test(start_paused = true)]
async fn a_refused_token_id_prompt_falls_back_to_text_and_other_failures_do_not() {
    let refused = StreamFailure::Status {
        status: 400,
        message: "token ids are not supported".into(),
    };
    let fake = Fake::builder(production(0), load_of_live_streams())
        .scouts(vec![StreamEnd::Failed(refused)])
        .build();
    let (matrix, _) = finish(&fake, PromptMode::Auto).await;
    assert!(
        has_note(
            &matrix,
            "The server refused a token-id prompt (HTTP 400: token ids are not supported); prompts are text calibrated"
        ),
        "{:#?}",
        matrix.metadata.notes
    );
    let bodies = fake.bodies();
    let prompt =
        |body: &str| serde_json::from_str::<serde_json::Value>(body).unwrap()["prompt"].clone();
    assert!(prompt(&bodies[0]).is_array(), "first scout: token ids");
    let text = prompt(&bodies[1]);
    assert!(
        text.as_str()
            .is_some_and(|t| t.starts_with("[BENCH_t_CTX_8192] ")),
        "{text}"
    );
    assert!(matrix.prefill_row(8192).unwrap().status.is_valid());
    // The cell's streams use the text prompt too.
    assert!(bodies[2..].iter().all(|b| prompt(b).is_string()));

    // A failure that is not a refusal fails the scout and leaves the prompts as they were.
    let fake = Fake::builder(production(0), load_of_live_streams())
        .scouts(vec![StreamEnd::Failed(StreamFailure::NoEnd { chars: 0 })])
        .build();
    let (matrix, _) = finish(&fake, PromptMode::Auto).await;
    assert_eq!(
        matrix.prefill_row(8192).unwrap().status,
        CellStatus::error("the stream ended without a finish reason or [DONE] after 0 characters")
    );
    assert!(!has_note(&matrix, "refused a token-id prompt"));
    assert_eq!(fake.bodies().len(), 1, "no second scout, no cell");
}
