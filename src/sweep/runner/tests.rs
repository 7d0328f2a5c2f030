//! The runner's decisions — pause for production and resume, measure an interrupted cell again
//! and give up after three, cancel within its grace, note a drain that did not finish, fall
//! back from token-id to text prompts on a refusal — driven against a scripted [`DataPath`] in
//! paused time (`start_paused`: every sleep and timeout of the runner advances the clock at
//! once, so a sweep of 30-second barriers runs in milliseconds of wall time). The fake is
//! `fake.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::fake::{load_of_live_streams, production, Fake, FakeState};
use super::state::{run, RunnerInput, CANCEL_GRACE, DRAIN_LIMIT, TICK};
use crate::base::engine::Engine;
use crate::config::SweepConfig;
use crate::matrix::{CellStatus, MatrixDoc};
use crate::sweep::latest::LatestMatrix;
use crate::sweep::plan::{DurationValue, Plan, PromptMode, ServerFacts, SweepRequest, TokensValue};
use crate::sweep::status::{StatusCell, StepPhase, SweepState, SweepStatus};
use crate::synthetic::{StreamEnd, StreamFailure};

const GUARD: u64 = 4;

/// One context (8K), one level (2 streams), a one-second window, on an sglang server.
fn plan(prompt: PromptMode) -> (Plan, ServerFacts, SweepRequest) {
    let facts = ServerFacts {
        engine: Some(Engine::SGLANG),
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
        max_default_duration: Duration::ZERO,
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
async fn a_paused_sweep_shows_how_long_it_has_waited_and_its_eta_counts_the_pause() {
    // Ten production requests for the first 5 s, none after.
    let busy = Box::new(|state: &FakeState| {
        if Instant::now() < state.started + Duration::from_secs(5) {
            10
        } else {
            0
        }
    });
    let fake = Fake::builder(busy, load_of_live_streams()).build();
    let sweep = start(&fake, PromptMode::TokenIds);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let early = sweep.status.snapshot();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = sweep.status.snapshot();
    assert_eq!(later.state, SweepState::Paused);
    let (waited_early, waited_later) = (
        early.progress.paused_now_s.unwrap(),
        later.progress.paused_now_s.unwrap(),
    );
    assert!(
        waited_later >= waited_early + 1.5,
        "{waited_early} → {waited_later}"
    );
    assert!(
        later
            .progress_line()
            .contains("(paused for production traffic for "),
        "{}",
        later.progress_line()
    );
    // The work left did not change, but the ETA grew with the pause.
    let (eta_early, eta_later) = (early.progress.eta_s.unwrap(), later.progress.eta_s.unwrap());
    assert!(eta_later > eta_early, "{eta_early} → {eta_later}");
    let matrix = sweep.task.await.unwrap();
    assert!(
        has_note(&matrix, "Paused 5.0 s before prefill 8K"),
        "{:#?}",
        matrix.metadata.notes
    );
    let done = sweep.status.snapshot();
    assert_eq!(done.progress.paused_now_s, None);
    assert!(done.progress.paused_s >= 5.0);
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
    // Nothing is sent after the cancel, however long one waits (a minute of paused time).
    let sent = fake.bodies().len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(fake.bodies().len(), sent, "a request after the cancel");
    assert_eq!(fake.0.live_streams.load(Ordering::SeqCst), 0);
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
