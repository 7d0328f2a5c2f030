#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Integration tests of synthetic sweeps: the simulator on 127.0.0.1 behind a real proxy, the
//! sweep driven through the proxy's metering path (the manager, the admin API, the CLI). Every
//! wait is bounded; windows are short (1–2 s) at small contexts.
use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{data, proxy, run_sweep, wait_ms, Script, ScriptedUpstream};
use serde_json::{json, Value};
use tokentap::matrix::{CellStatus, MatrixDoc};
use tokentap::sim::{Profile, SimHandle, SimOptions, SimServer};
use tokentap::sweep::discover::gauge_sum;
use tokentap::sweep::{SweepRequest, SweepState};
use tokio::time::Instant;

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const TOKEN: &str = "sweep-test-token";

async fn sim(profile: &str) -> SimHandle {
    SimServer::start(
        Profile::builtin(profile).unwrap(),
        SimOptions {
            seed: 11,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap()
}

fn request(json: Value) -> SweepRequest {
    serde_json::from_value(json).unwrap()
}

fn seed(name: &str) -> MatrixDoc {
    tokentap::matrix::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/seeds")
            .join(name),
    )
    .unwrap()
}

fn within(got: Option<f64>, want: Option<f64>, tolerance: f64) -> bool {
    match (got, want) {
        (Some(got), Some(want)) => ((got - want) / want).abs() <= tolerance,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_step_sweep_reproduces_its_seed() {
    let _cores = common::cores::for_timing().await;
    let sim = sim(STEP).await;
    let (server, _records) = proxy(&sim.base_url(), "").await;
    let plan = request(json!({
        "contexts": ["8K", "16K"],
        "concurrency": [1, 2, 4, 8, 16, 32, 64],
        "cell_duration": "2s",
    }));
    let began = Instant::now();
    let status = run_sweep(&server, plan, Duration::from_secs(180)).await;
    eprintln!("sweep took {:.1} s", began.elapsed().as_secs_f64());
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let got = status.matrix.unwrap();
    got.validate().unwrap();
    eprintln!("{}", tokentap::matrix::render_markdown(&got));
    let want = seed("003_5c468af628b56f4a.txt");

    for row in &got.prefill {
        let seed_row = want.prefill_row(row.context_tokens).unwrap();
        assert_eq!(row.status, CellStatus::Valid);
        assert_eq!(row.prompt_tokens, Some(row.context_tokens));
        assert!(
            within(row.prompt_tok_s, seed_row.prompt_tok_s, 0.05),
            "prefill {}: {:?} vs {:?}",
            row.context_tokens,
            row.prompt_tok_s,
            seed_row.prompt_tok_s
        );
    }
    let mut valid = 0;
    for cell in &got.decode {
        let seed_cell = want.cell(cell.context_tokens, cell.concurrency).unwrap();
        let name = format!("{} × {}", cell.context_tokens, cell.concurrency);
        assert_eq!(cell.status, seed_cell.status, "{name}");
        if !cell.status.is_valid() {
            continue;
        }
        valid += 1;
        assert!(
            within(cell.total_tok_s, seed_cell.total_tok_s, 0.05),
            "{name} total {:?} vs {:?}",
            cell.total_tok_s,
            seed_cell.total_tok_s
        );
        assert!(
            within(cell.per_request_tok_s, seed_cell.per_request_tok_s, 0.05),
            "{name} per request {:?} vs {:?}",
            cell.per_request_tok_s,
            seed_cell.per_request_tok_s
        );
        assert!(
            within(cell.tbt_ms, seed_cell.tbt_ms, 0.05),
            "{name} TBT {:?} vs {:?}",
            cell.tbt_ms,
            seed_cell.tbt_ms
        );
        let (ttft, seed_ttft) = (cell.ttft_ms.unwrap(), seed_cell.ttft_ms.unwrap());
        assert!(
            (ttft - seed_ttft).abs() <= (seed_ttft * 0.10).max(20.0),
            "{name} TTFT {ttft} vs {seed_ttft}"
        );
        assert_eq!(cell.prompt_tokens, Some(cell.context_tokens), "{name}");
        assert!(
            within(
                cell.average_active_requests,
                Some(f64::from(cell.concurrency)),
                0.01
            ),
            "{name} active {:?}",
            cell.average_active_requests
        );
    }
    assert_eq!(valid, 6 + 5);
    assert_eq!(
        running(&sim).await,
        0.0,
        "no stream of the sweep is left running"
    );
    server.shutdown().await;
}

/// The simulator's running-requests gauge.
async fn running(sim: &SimHandle) -> f64 {
    let metrics = common::get(&format!("{}/metrics", sim.base_url()))
        .await
        .text();
    gauge_sum(&metrics, "sglang:num_running_reqs").expect("running gauge")
}

/// A proxy on 127.0.0.1:0 from a whole configuration text.
async fn start_proxy(config: &str) -> tokentap::app::serve::ProxyServer {
    common::proxy_from_config(config).await.0
}

/// A proxy with the admin token set (sweeps need it) and `extra` config.
async fn proxy_with_token(upstream: &str, extra: &str) -> tokentap::app::serve::ProxyServer {
    let (server, _) = proxy(upstream, &format!("[admin]\ntoken = \"{TOKEN}\"\n{extra}")).await;
    server
}

async fn admin(
    server: &tokentap::app::serve::ProxyServer,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", server.admin_addr))
        .header("content-type", "application/json");
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    let response = common::send(
        builder
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap(),
    )
    .await;
    let value = serde_json::from_slice(&response.bytes()).unwrap_or(Value::Null);
    (response.status, value)
}

/// The admin page `/`, with the token.
async fn admin_page(server: &tokentap::app::serve::ProxyServer) -> String {
    common::send(
        http::Request::get(format!("http://{}/", server.admin_addr))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .text()
}

/// `streams` long production completions through the data listener (the client goes away
/// when its task is aborted), returned once the proxy counts them all in flight.
async fn long_production_streams(
    server: &tokentap::app::serve::ProxyServer,
    streams: u64,
) -> Vec<tokio::task::JoinHandle<common::Received2>> {
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let tasks = (0..streams)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                common::post(
                    &url,
                    r#"{"model":"step3p7","prompt":"hello","max_tokens":100000,"ignore_eos":true,"stream":true}"#,
                )
                .await
            })
        })
        .collect();
    let meter = &server.proxy.meter;
    common::wait::until(
        "the production streams to start",
        Duration::from_secs(10),
        || meter.inflight(tokentap::base::Source::Production) >= streams,
    )
    .await;
    tasks
}

/// `POST /sweeps` with `body`; the new sweep's id.
async fn start_sweep(server: &tokentap::app::serve::ProxyServer, body: &str) -> String {
    let (code, answer) = admin(server, "POST", "/sweeps", Some(TOKEN), body).await;
    assert_eq!(code, 202, "{answer}");
    answer["id"].as_str().unwrap().to_owned()
}

/// Polls `GET /sweeps/{id}` until `check` holds (bounded).
async fn wait_status(
    server: &tokentap::app::serve::ProxyServer,
    id: &str,
    what: &str,
    limit: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    common::wait::eventually(limit, async || {
        let (code, status) = admin(server, "GET", &format!("/sweeps/{id}"), Some(TOKEN), "").await;
        assert_eq!(code, 200, "{status}");
        if check(&status) {
            Ok(status)
        } else {
            Err(status)
        }
    })
    .await
    .unwrap_or_else(|status| panic!("timed out waiting for {what}: {status:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_starts_refuses_cancels_and_persists_sweeps() {
    let sim = sim(STEP).await;
    // Without a configured token, sweeps are refused outright.
    let (open, _) = proxy(&sim.base_url(), "").await;
    let (code, body) = admin(&open, "POST", "/sweeps", None, "{}").await;
    assert_eq!(code, 403, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("admin.token"));
    open.shutdown().await;

    let data_dir = std::env::temp_dir().join(format!("tokentap-sweep-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let config = format!(
        "[upstream]\nurl = \"{}\"\n[admin]\ntoken = \"{TOKEN}\"\n[store]\ndata_dir = \"{}\"\n",
        sim.base_url(),
        data_dir.display()
    );
    let server = start_proxy(&config).await;
    let plan = r#"{"contexts": ["8K"], "concurrency": [1, 2, 4, 8, 16], "cell_duration": "3s"}"#;
    assert_eq!(admin(&server, "POST", "/sweeps", None, plan).await.0, 401);
    // (A wrong token would make this address wait a second, the right one too: the admin
    // tests and `admin::sessions` cover that.)
    let (code, body) = admin(
        &server,
        "POST",
        "/sweeps",
        Some(TOKEN),
        r#"{"concurrency": [0]}"#,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("concurrency"),
        "{body}"
    );
    let (code, body) = admin(
        &server,
        "POST",
        "/sweeps",
        Some(TOKEN),
        r#"{"contxts": []}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("contxts"),
        "{body}"
    );

    let (code, body) = admin(&server, "POST", "/sweeps", Some(TOKEN), plan).await;
    assert_eq!(code, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let (code, busy) = admin(&server, "POST", "/sweeps", Some(TOKEN), plan).await;
    assert_eq!(code, 409, "{busy}");
    assert!(busy["error"]["message"].as_str().unwrap().contains(&id));

    // Cancel while the 8K × 2 window runs, then the streams must be gone within a second.
    let status = wait_status(
        &server,
        &id,
        "the 8K × 2 window",
        Duration::from_secs(60),
        |s| {
            s["progress"]["current"]["label"] == "8K × 2"
                && s["progress"]["current"]["phase"] == "window"
        },
    )
    .await;
    assert_eq!(status["state"], "running");
    assert!(status["progress"]["eta_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        status["matrix"]["decode"][0]["status"], "Valid",
        "8K × 1 is measured: {status:#}"
    );
    assert!(running(&sim).await >= 2.0);
    let (code, _) = admin(&server, "DELETE", &format!("/sweeps/{id}"), Some(TOKEN), "").await;
    assert_eq!(code, 202);
    let cancelled_at = Instant::now();
    common::wait::until_async(
        "the streams to end after a cancel",
        Duration::from_secs(2),
        async || running(&sim).await == 0.0,
    )
    .await;
    let aborted_within = cancelled_at.elapsed();
    eprintln!(
        "streams gone {:.0} ms after DELETE",
        aborted_within.as_secs_f64() * 1000.0
    );
    let status = wait_status(&server, &id, "cancelled", Duration::from_secs(10), |s| {
        s["state"] == "cancelled"
    })
    .await;
    let decode = status["matrix"]["decode"].as_array().unwrap();
    let statuses: Vec<&str> = decode
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["Valid", "Not run", "Not run", "Not run", "Not run"]
    );
    // Nothing restarts after the cancel: the runner has ended (that nothing is sent after it,
    // however long one waits, is `sweep::runner::tests`, in paused time).
    assert_eq!(running(&sim).await, 0.0);
    let (code, _) = admin(&server, "DELETE", &format!("/sweeps/{id}"), Some(TOKEN), "").await;
    assert_eq!(code, 409, "cancelling a cancelled sweep");
    assert_eq!(
        admin(&server, "DELETE", "/sweeps/nope", Some(TOKEN), "")
            .await
            .0,
        404
    );

    // The matrix renders on its own.
    let md = common::send(
        http::Request::get(format!(
            "http://{}/sweeps/{id}?format=md",
            server.admin_addr
        ))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap(),
    )
    .await;
    assert_eq!(md.status, 200);
    assert!(
        md.text().starts_with("# Speed test matrix"),
        "{}",
        md.text()
    );

    // Listed again after a restart on the same data dir.
    server.shutdown().await;
    let restarted = start_proxy(&config).await;
    let (code, list) = admin(&restarted, "GET", "/sweeps", Some(TOKEN), "").await;
    assert_eq!(code, 200);
    assert_eq!(list[0]["id"], id.as_str(), "{list:#}");
    assert_eq!(list[0]["state"], "cancelled");
    let (code, again) = admin(&restarted, "GET", &format!("/sweeps/{id}"), Some(TOKEN), "").await;
    assert_eq!(code, 200);
    assert_eq!(again["matrix"]["decode"][0]["status"], "Valid");
    restarted.shutdown().await;
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// An upstream that serves a steady token stream, failing every other decode stream with a
/// 500; scouts (max_tokens 1) always succeed. No metrics, no server info: the sweep falls back
/// to stream activity and disconnects.
async fn half_failing_upstream() -> (ScriptedUpstream, Arc<AtomicUsize>) {
    let decode_streams = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&decode_streams);
    let upstream = ScriptedUpstream::start(move |received| {
        match received.path.as_str() {
            "/v1/models" => {
                return Script::json(200, r#"{"data":[{"id":"flaky","max_model_len":32768}]}"#)
            }
            "/v1/completions" => {}
            _ => return Script::json(404, r#"{"detail":"Not Found"}"#),
        }
        let body: Value = serde_json::from_slice(&received.body).unwrap();
        let max_tokens = body["max_tokens"].as_u64().unwrap();
        let prompt = body["prompt"].as_array().unwrap().len();
        if max_tokens > 1 && counter.fetch_add(1, Ordering::SeqCst) % 2 == 1 {
            return Script::json(500, r#"{"object":"error","message":"simulated GPU fault","code":500}"#);
        }
        let mut steps = Vec::new();
        let events = max_tokens.min(600);
        for n in 1..=events {
            let finish = if n == max_tokens { "\"length\"" } else { "null" };
            steps.push(data(&format!(
                r#"{{"id":"x","object":"text_completion","choices":[{{"index":0,"text":" w{n}","finish_reason":{finish}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{n},"total_tokens":{}}}}}"#,
                prompt as u64 + n
            )));
            steps.push(wait_ms(5));
        }
        if events == max_tokens {
            steps.push(data("[DONE]"));
        }
        let mut script = Script::sse(steps);
        if events < max_tokens {
            script.end = common::End::Hang;
        }
        script
    })
    .await;
    (upstream, decode_streams)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_streams_mark_their_cells_error_and_the_sweep_finishes() {
    let (upstream, decode_streams) = half_failing_upstream().await;
    let (server, _) = proxy(&upstream.url(), "").await;
    let plan = request(json!({
        "contexts": [1024],
        "concurrency": [1, 2, 4],
        "cell_duration": "1s",
        "kv_budget_tokens": 100000,
    }));
    let status = run_sweep(&server, plan, Duration::from_secs(60)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let matrix = status.matrix.unwrap();
    matrix.validate().unwrap();
    assert_eq!(matrix.prefill[0].status, CellStatus::Valid);
    let one = matrix.cell(1024, 1).unwrap();
    assert_eq!(one.status, CellStatus::Valid, "{one:?}");
    assert_eq!(one.prompt_tokens, Some(1024));
    assert!(one.total_tok_s.unwrap() > 50.0, "{one:?}");
    for c in [2, 4] {
        let cell = matrix.cell(1024, c).unwrap();
        match &cell.status {
            CellStatus::Error(reason) => {
                assert!(reason.contains("HTTP 500: simulated GPU fault"), "{reason}")
            }
            other => panic!("1024 × {c}: {other:?}"),
        }
    }
    assert!(decode_streams.load(Ordering::SeqCst) >= 1 + 2 + 2);
    server.shutdown().await;
}

/// A vLLM-like server whose first generated token is silent: a partial UTF-8 byte it holds
/// back (`"text":""`) that only the per-chunk usage counts, after `PREFILL_MS` of prefill.
async fn silent_first_token_upstream() -> ScriptedUpstream {
    ScriptedUpstream::start(|received| match received.path.as_str() {
        "/v1/models" => Script::json(200, r#"{"data":[{"id":"bytes","max_model_len":32768}]}"#),
        "/v1/completions" => {
            let body: Value = serde_json::from_slice(&received.body).unwrap();
            let max_tokens = body["max_tokens"].as_u64().unwrap();
            let prompt = body["prompt"].as_array().map_or(0, Vec::len);
            let chunk = |n: u64, text: &str| {
                let finish = if n == max_tokens { "\"length\"" } else { "null" };
                data(&format!(
                    r#"{{"id":"cmpl-x","object":"text_completion","choices":[{{"index":0,"text":"{text}","finish_reason":{finish}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{n},"total_tokens":{}}}}}"#,
                    prompt as u64 + n
                ))
            };
            let mut steps = vec![wait_ms(PREFILL_MS), chunk(1, "")];
            for n in 2..=max_tokens.min(400) {
                steps.push(wait_ms(5));
                steps.push(chunk(n, " x"));
            }
            let mut script = Script::sse(steps);
            if max_tokens <= 400 {
                script.steps.push(data(&format!(
                    r#"{{"id":"cmpl-x","object":"text_completion","choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{n},"total_tokens":{}}}}}"#,
                    prompt as u64 + max_tokens,
                    n = max_tokens
                )));
                script.steps.push(data("[DONE]"));
            } else {
                script.end = common::End::Hang;
            }
            script
        }
        _ => Script::json(404, r#"{"detail":"Not Found"}"#),
    })
    .await
}

const PREFILL_MS: u64 = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scout_whose_only_token_is_silent_still_times_prefill() {
    // Finding 5 (docs/conformance.md): the scout asks for one token; when vLLM sends it as
    // `"text":""` (counted only by usage), the prefill row must still be measured.
    let upstream = silent_first_token_upstream().await;
    let (server, _) = proxy(&upstream.url(), "").await;
    let plan = request(json!({
        "contexts": [1024],
        "concurrency": [1],
        "cell_duration": "1s",
        "kv_budget_tokens": 100000,
    }));
    let status = run_sweep(&server, plan, Duration::from_secs(60)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let matrix = status.matrix.unwrap();
    let prefill = &matrix.prefill[0];
    assert_eq!(prefill.status, CellStatus::Valid, "{prefill:?}");
    // Prefill ends with the silent token, after the server's prefill wait (a lower bound only:
    // the machine may be slow, never fast).
    let ttft = prefill.ttft_ms.unwrap();
    assert!(ttft >= PREFILL_MS as f64, "{prefill:?}");
    assert_eq!(prefill.prompt_tokens, Some(1024));
    assert!(prefill.prompt_tok_s.unwrap() > 0.0, "{prefill:?}");
    let cell = matrix.cell(1024, 1).unwrap();
    assert_eq!(cell.status, CellStatus::Valid, "{cell:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_loop_marks_the_cell_error() {
    let upstream = ScriptedUpstream::start(|received| match received.path.as_str() {
        "/v1/models" => Script::json(200, r#"{"data":[{"id":"loopy","max_model_len":32768}]}"#),
        "/v1/completions" => {
            let body: Value = serde_json::from_slice(&received.body).unwrap();
            let max_tokens = body["max_tokens"].as_u64().unwrap();
            let mut steps = Vec::new();
            for n in 1..=max_tokens.min(2000) {
                let finish = if n == max_tokens { "\"length\"" } else { "null" };
                steps.push(data(&format!(
                    r#"{{"choices":[{{"index":0,"text":" and again","finish_reason":{finish}}}],"usage":{{"prompt_tokens":512,"completion_tokens":{n},"total_tokens":1}}}}"#
                )));
                if n % 20 == 0 {
                    steps.push(wait_ms(1));
                }
            }
            steps.push(data("[DONE]"));
            Script::sse(steps)
        }
        _ => Script::json(404, "{}"),
    })
    .await;
    let (server, _) = proxy(&upstream.url(), "").await;
    let plan = request(
        json!({"contexts": [512], "concurrency": [1], "cell_duration": "1s", "max_output": 2000}),
    );
    let status = run_sweep(&server, plan, Duration::from_secs(60)).await;
    let cell = status.matrix.unwrap().cell(512, 1).unwrap().clone();
    match cell.status {
        CellStatus::Error(reason) => assert!(reason.starts_with("output loop"), "{reason}"),
        other => panic!("{other:?}"),
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_above_the_guard_pauses_the_sweep() {
    let sim = sim(STEP).await;
    let server = proxy_with_token(&sim.base_url(), "[sweep]\nproduction_guard = 0\n").await;
    // One long production stream through the data listener holds the guard.
    let production = long_production_streams(&server, 1).await;
    let id = start_sweep(
        &server,
        r#"{"contexts": ["8K"], "concurrency": [1], "cell_duration": "1s", "beside_production": true}"#,
    )
    .await;
    let paused = wait_status(&server, &id, "paused", Duration::from_secs(10), |s| {
        s["state"] == "paused"
    })
    .await;
    assert_eq!(paused["progress"]["current"]["phase"], "paused");
    assert_eq!(paused["matrix"]["prefill"][0]["status"], "Not run");
    // It stays paused while production is above the guard, however long (the runner's paused-
    // time tests wait seconds of it: `sweep::runner::tests`); here, a second look.
    let still = wait_status(&server, &id, "paused", Duration::from_secs(1), |_| true).await;
    assert_eq!(
        still["state"], "paused",
        "no measurement while production is above the guard"
    );
    // The production stream ends (the client goes away): the sweep resumes and finishes.
    for stream in production {
        stream.abort();
    }
    let done = wait_status(&server, &id, "finished", Duration::from_secs(60), |s| {
        s["state"] == "finished"
    })
    .await;
    let notes: Vec<&str> = done["matrix"]["metadata"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with("Paused ")
            && n.contains("before prefill 8K")
            && n.contains("guard 0")),
        "{notes:#?}"
    );
    assert!(done["progress"]["paused_s"].as_f64().unwrap() > 0.0);
    assert_eq!(done["matrix"]["decode"][0]["status"], "Valid");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_measured_beside_production_is_off_target_and_the_page_shows_the_finished_sweep() {
    let sim = sim(STEP).await;
    // The default guard (4) lets the sweep run beside two production streams.
    let server = proxy_with_token(&sim.base_url(), "").await;
    let production = long_production_streams(&server, 2).await;
    let id = start_sweep(
        &server,
        r#"{"contexts": ["8K"], "concurrency": [1], "cell_duration": "1s", "beside_production": true}"#,
    )
    .await;
    let done = wait_status(&server, &id, "finished", Duration::from_secs(90), |s| {
        s["state"] == "finished"
    })
    .await;
    let cell = &done["matrix"]["decode"][0];
    assert_eq!(cell["status"], "Off target", "{cell:#}");
    let active = cell["average_active_requests"].as_f64().unwrap();
    assert!(active > 2.0, "it measured about three streams: {active}");
    assert!(
        cell["production_in_flight"].as_f64().unwrap() >= 1.5,
        "{cell:#}"
    );
    let notes: Vec<&str> = done["matrix"]["metadata"]["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("was off target") && n.contains("measured again")),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("is Off target") && n.contains("production requests in flight")),
        "{notes:#?}"
    );
    // The stale-sweep regression: the page and /matrix show the finished sweep at once.
    let (code, synthetic) = admin(
        &server,
        "GET",
        "/matrix?source=synthetic&format=json",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(synthetic["decode"], done["matrix"]["decode"]);
    assert_eq!(
        synthetic["metadata"]["notes"],
        done["matrix"]["metadata"]["notes"]
    );
    let page = admin_page(&server).await;
    assert!(
        page.contains("data-context=\"8K\" data-concurrency=\"1\" data-status=\"off-target\""),
        "{page}"
    );
    // Pinning it warns that the cell will not be compared.
    let (code, pinned) = admin(
        &server,
        "PUT",
        "/reference",
        Some(TOKEN),
        r#"{"from":"latest-sweep"}"#,
    )
    .await;
    assert_eq!(code, 200, "{pinned}");
    let warning = pinned["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("8K × 1 is Off target") && warning.contains("drift will not compare it"),
        "{warning}"
    );
    for stream in production {
        stream.abort();
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_search_finds_the_profile_boundary_with_fewer_cells_than_the_ladder() {
    use tokentap::matrix::capacity::{capacity, Basis, CapacityQuery, Targets};
    // The profile's TBT at 8K by batch size: the target sits between batch 4 and batch 8, so
    // the true capacity at 8K under it is 4.
    let profile = Profile::builtin(STEP).unwrap();
    let model = tokentap::sim::model::PerformanceModel::new(&profile);
    let tbt = |batch: usize| 1000.0 / model.per_request_tok_s(8192.0, batch);
    let (at_four, at_eight) = (tbt(4), tbt(8));
    assert!(
        at_eight > at_four * 1.08,
        "the profile separates 4 from 8: {at_four} {at_eight}"
    );
    let target = (at_four + at_eight) / 2.0;
    let slo = format!("tbt={:.2}ms", target);
    let ladder = [1, 2, 4, 8, 16, 32];

    let sim = sim(STEP).await;
    let server = proxy_with_token(&sim.base_url(), "").await;
    let sweep = |body: Value| {
        let server = &server;
        async move {
            let (code, started) =
                admin(server, "POST", "/sweeps", Some(TOKEN), &body.to_string()).await;
            assert_eq!(code, 202, "{started}");
            let id = started["id"].as_str().unwrap().to_owned();
            wait_status(server, &id, "finished", Duration::from_secs(240), |s| {
                s["state"] == "finished"
            })
            .await
        }
    };
    // The whole ladder, then `matrix capacity` on it.
    let full = sweep(
        json!({"contexts": ["8K"], "concurrency": ladder, "cell_duration": "1s", "slo": slo}),
    )
    .await;
    let full_matrix: MatrixDoc = serde_json::from_value(full["matrix"].clone()).unwrap();
    let query = CapacityQuery {
        targets: Targets {
            tbt_ms: Some(target),
            ..Targets::default()
        },
        attainment: 0.95,
        basis: Basis::Auto,
        output_tokens: None,
    };
    let report = capacity(&full_matrix, &query).unwrap();
    let context = report.context(8192).unwrap();
    assert_eq!(context.capacity, Some(4), "{context:#?}\n{full_matrix:#?}");
    assert!(context.boundary_seen);
    assert_eq!(
        context.judged_by, "SLO attainment",
        "the streams carried the SLO"
    );
    let runnable = full_matrix
        .decode
        .iter()
        .filter(|c| c.status != CellStatus::OverCapacity)
        .count();

    // The search: the same answer from fewer cells, through POST /sweeps.
    let searched = sweep(json!({"contexts": ["8K"], "concurrency": ladder, "cell_duration": "1s", "slo": slo, "find_capacity": true})).await;
    let answer = &searched["capacity"]["contexts"][0];
    assert_eq!(answer["capacity"], 4, "{answer:#}");
    assert_eq!(answer["boundary_seen"], true);
    let measured = searched["matrix"]["decode"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "Not run" && c["status"] != "Over capacity")
        .count();
    assert!(
        measured < runnable,
        "the search measured {measured} cells, the ladder {runnable}"
    );
    assert_eq!(
        searched["progress"]["measurements_done"], searched["progress"]["measurements_total"],
        "the cells the search skipped are not left to come"
    );
    let notes = searched["matrix"]["metadata"]["notes"].to_string();
    assert!(
        notes.contains("Capacity search at 8K: measured 1 ✓, 2 ✓"),
        "{notes}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_on_steady_traffic_is_one_minus_load_over_capacity() {
    let _cores = common::cores::for_timing().await;
    // The boundary at 8K: the profile's TBT target between batch 4 and 8 gives capacity 4.
    let profile = Profile::builtin(STEP).unwrap();
    let model = tokentap::sim::model::PerformanceModel::new(&profile);
    let tbt = |batch: usize| 1000.0 / model.per_request_tok_s(8192.0, batch);
    let target = (tbt(4) + tbt(8)) / 2.0;
    let slo = format!("tbt={target:.2}ms");
    let sim = sim(STEP).await;
    // Proxy A finds the capacity; proxy B serves production traffic against it as a reference.
    let a = proxy_with_token(&sim.base_url(), "").await;
    let (code, started) = admin(
        &a,
        "POST",
        "/sweeps",
        Some(TOKEN),
        &json!({"contexts": ["8K"], "concurrency": [1, 2, 4, 8, 16], "cell_duration": "1s", "slo": slo, "find_capacity": true}).to_string(),
    )
    .await;
    assert_eq!(code, 202, "{started}");
    let id = started["id"].as_str().unwrap().to_owned();
    let done = wait_status(&a, &id, "finished", Duration::from_secs(120), |s| {
        s["state"] == "finished"
    })
    .await;
    assert_eq!(
        done["capacity"]["contexts"][0]["capacity"], 4,
        "{:#}",
        done["capacity"]
    );
    let sweep = done["matrix"].to_string();
    a.shutdown().await;

    // Two streams at once, each of about 6 s of decode, two after another in each slot, their
    // prompt warmed in the server's cache first (straight at it, not production traffic).
    let ids: Vec<String> = (0..7000).map(|i| (1000 + i % 5000).to_string()).collect();
    let prompt = ids.join(",");
    let warm =
        format!(r#"{{"model":"step3p7","prompt":[{prompt}],"max_tokens":1,"stream":false}}"#);
    assert_eq!(
        common::post(&format!("{}/v1/completions", sim.base_url()), &warm)
            .await
            .status,
        200
    );
    let b = proxy_with_token(
        &sim.base_url(),
        &format!("[slo]\ntbt = \"{target:.2}ms\"\n[capacity]\nwindow = \"1m\"\n"),
    )
    .await;
    let (code, pinned) = admin(&b, "PUT", "/reference?source=sweep", Some(TOKEN), &sweep).await;
    assert_eq!(code, 200, "{pinned}");
    let tokens = (6.0 * model.per_request_tok_s(8192.0, 2)) as u64;
    let body = format!(
        r#"{{"model":"step3p7","prompt":[{prompt}],"max_tokens":{tokens},"ignore_eos":true,"stream":true}}"#
    );
    let url = format!("http://{}/v1/completions", b.proxy_addr);
    let slots: Vec<_> = (0..2)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            tokio::spawn(async move {
                for _ in 0..2 {
                    assert_eq!(common::post(&url, &body).await.status, 200);
                }
            })
        })
        .collect();
    for slot in slots {
        slot.await.unwrap();
    }
    let (code, answer) = admin(&b, "GET", "/capacity", Some(TOKEN), "").await;
    assert_eq!(code, 200, "{answer}");
    let figures = &answer["models"][0];
    assert_eq!(figures["capacity_from"], "reference sweep", "{answer:#}");
    let headroom = figures["headroom"]["headroom"].as_f64().unwrap();
    let load = figures["headroom"]["load"].as_f64().unwrap();
    eprintln!("load {load:.3} streams, headroom {headroom:.3}");
    // 1 − 2 ÷ 4, within 10 %.
    assert!((headroom - 0.5).abs() <= 0.05, "{answer:#}");
    // The gauge and the page say the same.
    tokentap::app::drift::refresh_capacity(&b.admin, &b.metrics.capacity);
    let metrics = b.metrics.render();
    assert!(
        metrics.contains(
            "tokentap_capacity_headroom_ratio{upstream=\"default\",model=\"step3p7\",lower_bound=\"false\"}"
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        "tokentap_capacity_streams{upstream=\"default\",model=\"step3p7\",context_bucket=\"8K\",lower_bound=\"false\"} 4"
    ));
    let page = admin_page(&b).await;
    assert!(page.contains("id=\"headroom\""), "{page}");
    assert!(!page.contains("≥ 4"), "the boundary was seen: {page}");

    // A sweep that stopped at 4 with every cell meeting gives only a lower bound: "≥ 4" on the
    // page, a field in /capacity, a label on the gauges; and the streams running now stand
    // beside the window's mean.
    let mut truncated: Value = serde_json::from_str(&sweep).unwrap();
    truncated["decode"]
        .as_array_mut()
        .unwrap()
        .retain(|c| c["concurrency"].as_u64().unwrap() <= 4);
    let (code, pinned) = admin(
        &b,
        "PUT",
        "/reference?source=sweep",
        Some(TOKEN),
        &truncated.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{pinned}");
    let long = {
        let (url, body) = (url.clone(), body.clone());
        tokio::spawn(async move { common::post(&url, &body).await.status })
    };
    let answer = common::wait::eventually(Duration::from_secs(10), async || {
        let (_, answer) = admin(&b, "GET", "/capacity", Some(TOKEN), "").await;
        if answer["models"][0]["headroom"]["running_now"].as_u64() == Some(1) {
            Ok(answer)
        } else {
            Err(answer)
        }
    })
    .await
    .unwrap_or_else(|answer| answer);
    let figures = &answer["models"][0]["headroom"];
    assert_eq!(figures["running_now"], 1, "{answer:#}");
    assert_eq!(figures["capacity_is_lower_bound"], true, "{answer:#}");
    assert_eq!(figures["contexts"][0]["capacity"], 4, "{answer:#}");
    assert_eq!(
        figures["contexts"][0]["capacity_is_lower_bound"], true,
        "{answer:#}"
    );
    tokentap::app::drift::refresh_capacity(&b.admin, &b.metrics.capacity);
    let metrics = b.metrics.render();
    for line in [
        "tokentap_capacity_streams{upstream=\"default\",model=\"step3p7\",context_bucket=\"8K\",lower_bound=\"true\"} 4",
        "tokentap_capacity_running_streams{upstream=\"default\",model=\"step3p7\"} 1",
        "lower_bound=\"true\"}",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    let page = admin_page(&b).await;
    assert!(
        page.contains("data-lower-bound=\"true\"") && page.contains("1 request running now"),
        "{page}"
    );
    assert!(page.contains("<td class=\"num\">≥ 4</td>"), "{page}");
    assert_eq!(long.await.unwrap(), 200);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sweep_replaces_the_partial_matrix_on_the_page_at_once() {
    let sim = sim(STEP).await;
    let server = proxy_with_token(&sim.base_url(), "").await;
    let id = start_sweep(
        &server,
        r#"{"contexts": ["8K"], "concurrency": [1, 2], "cell_duration": "1s"}"#,
    )
    .await;
    let done = wait_status(&server, &id, "finished", Duration::from_secs(90), |s| {
        s["state"] == "finished"
    })
    .await;
    // No wait: the moment the sweep says finished, every reader shows its last cell.
    let (code, synthetic) = admin(
        &server,
        "GET",
        "/matrix?source=synthetic&format=json",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(synthetic["decode"], done["matrix"]["decode"]);
    assert_eq!(synthetic["decode"][1]["status"], "Valid", "{synthetic:#}");
    let page = admin_page(&server).await;
    assert!(
        page.contains("data-context=\"8K\" data-concurrency=\"2\" data-status=\"valid\""),
        "{page}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_dialect_with_text_prompts_calibrated_by_tokenize() {
    let sim = SimServer::start(
        Profile::builtin(STEP).unwrap(),
        SimOptions {
            seed: 3,
            dialect: tokentap::sim::Dialect::Vllm,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let (server, _) = proxy(&sim.base_url(), "").await;
    let plan = request(json!({
        "contexts": [2000, "8K"],
        "concurrency": [1, 2],
        "cell_duration": "1s",
        "prompt": "text",
    }));
    let status = run_sweep(&server, plan, Duration::from_secs(90)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let facts = status.server.unwrap();
    assert_eq!(facts.engine, Some(tokentap::base::engine::Engine::VLLM));
    let kv = facts.kv_budget_tokens.unwrap();
    assert!(
        kv > 600_000 && kv <= 622_592,
        "vLLM KV from cache_config_info: {kv}"
    );
    let matrix = status.matrix.unwrap();
    for row in &matrix.prefill {
        assert_eq!(row.status, CellStatus::Valid, "{row:?}");
        assert_eq!(
            row.prompt_tokens,
            Some(row.context_tokens),
            "calibrated exactly: {row:?}"
        );
    }
    for cell in &matrix.decode {
        assert_eq!(cell.status, CellStatus::Valid, "{cell:?}");
        assert_eq!(cell.prompt_tokens, Some(cell.context_tokens));
        assert!(within(
            cell.average_active_requests,
            Some(f64::from(cell.concurrency)),
            0.01
        ));
    }
    // Without a targeted abort the streams were disconnected, and the server saw it.
    let metrics = common::get(&format!("{}/metrics", sim.base_url()))
        .await
        .text();
    assert_eq!(gauge_sum(&metrics, "vllm:num_requests_running"), Some(0.0));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sweeps_a_target_and_follows_a_remote_proxy() {
    let sim = sim(STEP).await;
    let out = std::env::temp_dir().join(format!("tokentap-sweep-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let local = out.join("local");
    let standalone = cli(
        &[
            "sweep",
            "--target",
            &sim.base_url(),
            "--contexts",
            "4K",
            "--concurrency",
            "1,2",
        ],
        &["--cell-duration", "1s", "--out", local.to_str().unwrap()],
        &[("TOKENTAP_STORE__DATA_DIR", "")],
    )
    .await;
    let stdout = String::from_utf8_lossy(&standalone.stdout);
    let stderr = String::from_utf8_lossy(&standalone.stderr);
    assert!(standalone.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("# Speed test matrix"), "{stdout}");
    assert!(
        stderr.contains("measurements"),
        "progress on stderr: {stderr}"
    );
    let written = tokentap::matrix::load(&local.join("matrix.json")).unwrap();
    assert_eq!(written.decode.len(), 2);
    assert!(written.decode.iter().all(|c| c.status.is_valid()));
    assert!(local.join("matrix.html").exists() && local.join("matrix.md").exists());

    // A dry run prints the plan and starts nothing, locally and on a proxy.
    let dry = cli(
        &["sweep", "--target", &sim.base_url(), "--dry-run"],
        &[],
        &[("TOKENTAP_STORE__DATA_DIR", "")],
    )
    .await;
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    for part in [
        "nothing was started",
        "Decode cells:",
        "largest prompt",
        "Expected duration: about",
        "cut to fit sweep.max_default_duration",
    ] {
        assert!(stdout.contains(part), "{part}: {stdout}");
    }
    // Within 120 columns: the long note is broken between words (issue 45.3).
    assert!(stdout.lines().all(|l| l.chars().count() <= 120), "{stdout}");

    let server = proxy_with_token(&sim.base_url(), "").await;
    let admin_url = format!("http://{}", server.admin_addr);
    let dry = cli(
        &[
            "sweep",
            "--admin",
            &admin_url,
            "--dry-run",
            // A lower-case suffix is the same context (issue 61.10).
            "--contexts",
            "8k",
            "--concurrency",
            "1,2",
        ],
        &[],
        &[("TOKENTAP_ADMIN__TOKEN", TOKEN)],
    )
    .await;
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(stdout.contains("Decode cells: 2 of 2 run"), "{stdout}");
    assert!(stdout.contains("8K"), "8k is read as 8K: {stdout}");
    assert!(
        server.admin.sweeps.list().is_empty(),
        "a dry run started a sweep"
    );
    let remote_dir = out.join("remote");
    let remote = cli(
        &[
            "sweep",
            "--admin",
            &admin_url,
            "--contexts",
            "4K",
            "--concurrency",
            "1",
        ],
        &[
            "--cell-duration",
            "1s",
            "--quiet",
            "--out",
            remote_dir.to_str().unwrap(),
        ],
        &[("TOKENTAP_ADMIN__TOKEN", TOKEN)],
    )
    .await;
    assert!(
        remote.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&remote.stderr)
    );
    let written = tokentap::matrix::load(&remote_dir.join("matrix.json")).unwrap();
    let id = written.metadata.run.sweep_id.clone().unwrap();
    assert!(
        server.admin.sweeps.get(&id).is_some(),
        "the sweep ran on the proxy"
    );
    assert!(written.cell(4096, 1).unwrap().status.is_valid());

    let refused = cli(
        &["sweep", "--admin", &admin_url, "--quiet"],
        &[],
        &[("TOKENTAP_ADMIN__TOKEN", "wrong")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("401"), "{stderr}");
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs the tokentap binary (bounded to a minute).
async fn cli(args: &[&str], more: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"));
    command.args(args).args(more);
    for (key, value) in env {
        command.env(key, value);
    }
    let run = tokio::task::spawn_blocking(move || command.output().unwrap());
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the command ends within a minute")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_prompts_fall_back_to_calibrated_text_when_token_ids_are_refused() {
    // A server without token-id input whose tokenizer counts 3 bytes a token.
    let upstream = ScriptedUpstream::start(|received| {
        let body: Value = serde_json::from_slice(&received.body).unwrap_or(Value::Null);
        let tokens = |text: &str| text.len().div_ceil(3);
        match received.path.as_str() {
            "/v1/models" => Script::json(200, r#"{"data":[{"id":"textonly","max_model_len":65536}]}"#),
            "/tokenize" => {
                let count = tokens(body["prompt"].as_str().unwrap());
                Script::json(200, &format!(r#"{{"count":{count}}}"#))
            }
            "/v1/completions" => {
                let Some(prompt) = body["prompt"].as_str() else {
                    return Script::json(400, r#"{"object":"error","message":"prompt must be a string","code":400}"#);
                };
                let prompt_tokens = tokens(prompt);
                let max_tokens = body["max_tokens"].as_u64().unwrap();
                let mut steps = Vec::new();
                for n in 1..=max_tokens.min(300) {
                    let finish = if n == max_tokens { "\"length\"" } else { "null" };
                    steps.push(data(&format!(
                        r#"{{"choices":[{{"index":0,"text":" t{n}","finish_reason":{finish}}}],"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":{n},"total_tokens":1}}}}"#
                    )));
                    steps.push(wait_ms(5));
                }
                let mut script = Script::sse(steps);
                if max_tokens <= 300 {
                    script.steps.push(data("[DONE]"));
                } else {
                    script.end = common::End::Hang;
                }
                script
            }
            _ => Script::json(404, "{}"),
        }
    })
    .await;
    let (server, _) = proxy(&upstream.url(), "").await;
    let plan = request(
        json!({"contexts": [3000], "concurrency": [1], "cell_duration": "1s", "kv_budget_tokens": 0}),
    );
    let status = run_sweep(&server, plan, Duration::from_secs(60)).await;
    let matrix = status.matrix.unwrap();
    assert_eq!(
        matrix.prefill[0].status,
        CellStatus::Valid,
        "{:?}",
        matrix.prefill
    );
    assert_eq!(
        matrix.prefill[0].prompt_tokens,
        Some(3000),
        "calibrated to the server's count"
    );
    let cell = matrix.cell(3000, 1).unwrap();
    assert_eq!(cell.status, CellStatus::Valid, "{cell:?}");
    assert_eq!(cell.prompt_tokens, Some(3000));
    assert!(
        matrix
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("refused a token-id prompt")),
        "{:?}",
        matrix.metadata.notes
    );
    server.shutdown().await;
}

/// A server like llama-cpp-python: `/v1/completions` takes string prompts only and answers a
/// token-id prompt with HTTP 500; no usage in streams; its tokenizer counts 3 bytes a token
/// plus BOS. With `extras`, it has llama-cpp-python's `/extras/tokenize` (and never
/// `/tokenize`); without, no tokenizer endpoint at all, so only an unstreamed answer's usage
/// counts a prompt. `tokenize_calls` counts the tokenizer requests it answered.
async fn llama_cpp_python_like(extras: bool, tokenize_calls: Arc<AtomicUsize>) -> ScriptedUpstream {
    ScriptedUpstream::start(move |received| {
        let body: Value = serde_json::from_slice(&received.body).unwrap_or(Value::Null);
        let tokens = |text: &str| text.len().div_ceil(3) as u64 + 1;
        match received.path.as_str() {
            "/v1/models" => Script::json(200, r#"{"object":"list","data":[{"id":"gguf","object":"model","owned_by":"me"}]}"#),
            "/extras/tokenize" if extras => {
                tokenize_calls.fetch_add(1, Ordering::SeqCst);
                let count = tokens(body["input"].as_str().unwrap());
                let ids: Vec<u64> = (0..count).map(|i| 1 + i % 500).collect();
                Script::json(200, &json!({ "tokens": ids }).to_string())
            }
            "/v1/completions" => {
                let Some(prompt) = body["prompt"].as_str() else {
                    return Script::json(500, r#"{"error":{"message":"1 validation error for CreateCompletionRequest","type":"internal_server_error"}}"#);
                };
                let max_tokens = body["max_tokens"].as_u64().unwrap();
                if body["stream"] != true {
                    return Script::json(200, &json!({
                        "id": "cmpl-x", "object": "text_completion", "model": "gguf",
                        "choices": [{"text": " t", "index": 0, "logprobs": null, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": tokens(prompt), "completion_tokens": 1, "total_tokens": tokens(prompt) + 1},
                    }).to_string());
                }
                let mut steps = Vec::new();
                for n in 1..=max_tokens.min(300) {
                    let finish = if n == max_tokens { "\"length\"" } else { "null" };
                    steps.push(data(&format!(
                        r#"{{"id":"cmpl-x","object":"text_completion","created":1,"model":"gguf","choices":[{{"text":" t{n}","index":0,"logprobs":null,"finish_reason":{finish}}}]}}"#
                    )));
                    steps.push(wait_ms(5));
                }
                let mut script = Script::sse(steps);
                if max_tokens <= 300 {
                    script.steps.push(data("[DONE]"));
                } else {
                    script.end = common::End::Hang;
                }
                script
            }
            _ => Script::json(404, r#"{"detail":"Not Found"}"#),
        }
    })
    .await
}

/// Runs a one-context sweep with `--prompt auto` against `upstream` and checks the prefill row
/// and the cell are measured with a text prompt of the calibrated length.
async fn auto_prompt_sweep_is_valid(upstream: &ScriptedUpstream) {
    let (server, _) = proxy(&upstream.url(), "").await;
    let plan = request(json!({
        "model": "gguf",
        "contexts": [600],
        "concurrency": [1],
        "cell_duration": "1s",
        "kv_budget_tokens": 0,
    }));
    let status = run_sweep(&server, plan, Duration::from_secs(60)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let matrix = status.matrix.unwrap();
    let notes = &matrix.metadata.notes;
    assert_eq!(
        matrix.prefill[0].status,
        CellStatus::Valid,
        "{:?} {notes:?}",
        matrix.prefill
    );
    let cell = matrix.cell(600, 1).unwrap();
    assert_eq!(cell.status, CellStatus::Valid, "{cell:?} {notes:?}");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("refused a token-id prompt (HTTP 500")),
        "{notes:?}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_prompts_on_llama_cpp_python_fall_back_on_500_and_use_extras_tokenize() {
    // Finding 8 (docs/conformance.md): a 500 to the first token-id prompt is a refusal too, and
    // text calibration uses /extras/tokenize when /tokenize is missing.
    let tokenize_calls = Arc::new(AtomicUsize::new(0));
    let upstream = llama_cpp_python_like(true, Arc::clone(&tokenize_calls)).await;
    auto_prompt_sweep_is_valid(&upstream).await;
    assert!(
        tokenize_calls.load(Ordering::SeqCst) >= 2,
        "calibrated by /extras/tokenize"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_prompts_without_a_tokenizer_are_calibrated_by_a_probe_requests_usage() {
    let tokenize_calls = Arc::new(AtomicUsize::new(0));
    let upstream = llama_cpp_python_like(false, Arc::clone(&tokenize_calls)).await;
    auto_prompt_sweep_is_valid(&upstream).await;
    assert_eq!(tokenize_calls.load(Ordering::SeqCst), 0);
}

/// Issue 4's round trip on the Step seed (its Total is C × per-request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matrix_round_trips_through_the_simulator_and_a_sweep() {
    round_trip(
        "003_5c468af628b56f4a.txt",
        json!(["8K", "32K"]),
        json!([1, 4, 16, 32]),
        true,
    )
    .await;
}

/// Issue 4's round trip on the GLM seed. Its Total sits 3–10% below C × per-request for a
/// reason outside the serving path (its 64K × 2 cell: 262.4 vs 2 × 146.5; docs/simulator.md);
/// a simulator models the physical C × per-request, so the Total is checked against that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_glm_matrix_round_trips_through_the_simulator_and_a_sweep() {
    round_trip(
        "000_7bda87e292bd4f4e.txt",
        json!(["16K", "64K"]),
        json!([1, 2, 8, 16, 32, 128]),
        false,
    )
    .await;
}

/// Issue 4's round trip: a published matrix → `simulate --from-matrix` → a sweep through
/// `serve` → a matrix with the same statuses and every valid cell within 5%.
async fn round_trip(
    seed_name: &str,
    contexts: Value,
    concurrency: Value,
    seed_total_consistent: bool,
) {
    let _cores = common::cores::for_timing().await;
    {
        let input = seed(seed_name);
        let profile = Profile::from_matrix(&input, &Default::default()).unwrap();
        let sim = SimServer::start(profile, SimOptions::default())
            .await
            .unwrap();
        let (server, _) = proxy(&sim.base_url(), "").await;
        let plan = request(json!({
            "contexts": contexts,
            "concurrency": concurrency,
            "cell_duration": "2s",
        }));
        let status = run_sweep(&server, plan, Duration::from_secs(180)).await;
        assert_eq!(status.state, SweepState::Finished, "{status:#?}");
        let output = status.matrix.unwrap();
        eprintln!(
            "{seed_name}:\n{}",
            tokentap::matrix::render_markdown(&output)
        );
        let mut compared = 0;
        for row in &output.prefill {
            let want = input.prefill_row(row.context_tokens).unwrap();
            assert!(
                within(row.prompt_tok_s, want.prompt_tok_s, 0.05),
                "{seed_name} prefill {}: {:?} vs {:?}",
                row.context_tokens,
                row.prompt_tok_s,
                want.prompt_tok_s
            );
        }
        for cell in &output.decode {
            let want = input.cell(cell.context_tokens, cell.concurrency).unwrap();
            let name = format!("{seed_name} {} × {}", cell.context_tokens, cell.concurrency);
            assert_eq!(cell.status, want.status, "{name}");
            if !cell.status.is_valid() {
                continue;
            }
            compared += 1;
            let want_total = if seed_total_consistent {
                want.total_tok_s
            } else {
                want.per_request_tok_s
                    .map(|r| r * f64::from(cell.concurrency))
            };
            for (column, got, wanted) in [
                ("total", cell.total_tok_s, want_total),
                (
                    "per request",
                    cell.per_request_tok_s,
                    want.per_request_tok_s,
                ),
                ("TBT", cell.tbt_ms, want.tbt_ms),
            ] {
                assert!(
                    within(got, wanted, 0.05),
                    "{name} {column}: {got:?} vs {wanted:?}"
                );
            }
            // TTFT of a cache hit also carries the time the proxy and the simulator take to
            // parse a request of `context` token ids: ~0.5 ms per 1K tokens in a debug build,
            // more on 2 loaded cores (GLM 64K × 8: 281–299 ms against the seed's 260 ms when
            // idle; the release benchmark in docs/benchmarks.md is within 3%). A cell's C streams
            // start together, so their parsing queues on the two cores: the median stream waits
            // for about C/4 parses; C/8 of them (at least one) are allowed (GLM 64K × 16: 547 ms
            // against 446 ms once in four idle runs with one).
            let (ttft, want_ttft) = (cell.ttft_ms.unwrap(), want.ttft_ms.unwrap());
            let queued_parses = f64::from(cell.concurrency.div_ceil(8));
            let parse_allowance = 20.0 + queued_parses * cell.context_tokens as f64 / 1000.0;
            assert!(
                (ttft - want_ttft).abs() <= (want_ttft * 0.10).max(parse_allowance),
                "{name} TTFT {ttft} vs {want_ttft}"
            );
        }
        assert!(
            compared >= 7,
            "{seed_name}: {compared} valid cells compared"
        );
        server.shutdown().await;
        sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_arriving_mid_cell_interrupts_it_and_the_cell_is_measured_again() {
    let sim = sim(STEP).await;
    let server = proxy_with_token(&sim.base_url(), "[sweep]\nproduction_guard = 0\n").await;
    let id = start_sweep(
        &server,
        r#"{"contexts": ["4K"], "concurrency": [2], "cell_duration": "3s"}"#,
    )
    .await;
    wait_status(&server, &id, "the window", Duration::from_secs(30), |s| {
        s["progress"]["current"]["phase"] == "window"
    })
    .await;
    // A production request arrives in the middle of the window and lasts a while.
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let production = tokio::spawn(async move {
        common::post(
            &url,
            r#"{"model":"step3p7","prompt":"hi","max_tokens":100,"ignore_eos":true,"stream":true}"#,
        )
        .await
    });
    let paused = wait_status(&server, &id, "paused", Duration::from_secs(10), |s| {
        s["state"] == "paused"
    })
    .await;
    assert_eq!(
        paused["matrix"]["decode"][0]["status"], "Not run",
        "the interrupted window counts for nothing"
    );
    assert_eq!(production.await.unwrap().status, 200);
    let done = wait_status(&server, &id, "finished", Duration::from_secs(60), |s| {
        s["state"] == "finished"
    })
    .await;
    let cell = &done["matrix"]["decode"][0];
    assert_eq!(cell["status"], "Valid", "{done:#}");
    assert!(
        (cell["measured_for_s"].as_f64().unwrap() - 3.0).abs() < 0.2,
        "a whole window: {cell}"
    );
    let notes = done["matrix"]["metadata"]["notes"].to_string();
    assert!(
        notes.contains("4K × 2 was interrupted by production traffic"),
        "{notes}"
    );
    assert!(notes.contains("Paused"), "{notes}");
    server.shutdown().await;
}

/// A vLLM serving a tiny model (vocabulary 1,024, like the conformance harness's): vLLM answers
/// 200 and puts "Token id … is out of vocabulary" inside the stream. The default prompt mode
/// must still give an all-Valid sweep: token ids drawn from what `/tokenize` produced, or —
/// when the vocabulary cannot be learnt — text, after the refusal inside the 200 stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_prompts_work_on_a_tiny_vocabulary() {
    for (vocab, expected_note) in [
        (1024, "Token-id prompts draw from"),
        // Eight ids are too few to draw prompts from: the 1000–9999 ids are refused in-stream.
        (
            8,
            "refused a token-id prompt (error event in the stream: Token id",
        ),
    ] {
        let sim = SimServer::start(
            Profile::builtin(STEP).unwrap(),
            SimOptions {
                seed: 5,
                dialect: tokentap::sim::Dialect::Vllm,
                vocab_size: Some(vocab),
                ..SimOptions::default()
            },
        )
        .await
        .unwrap();
        let (server, _) = proxy(&sim.base_url(), "").await;
        let plan = request(json!({
            "contexts": [1000, 2000],
            "concurrency": [1, 2],
            "cell_duration": "1s",
        }));
        let status = run_sweep(&server, plan, Duration::from_secs(90)).await;
        assert_eq!(status.state, SweepState::Finished, "{status:#?}");
        let matrix = status.matrix.unwrap();
        let notes = &matrix.metadata.notes;
        assert!(
            notes.iter().any(|n| n.contains(expected_note)),
            "vocabulary {vocab}: {notes:#?}"
        );
        for row in &matrix.prefill {
            assert_eq!(row.status, CellStatus::Valid, "vocabulary {vocab}: {row:?}");
        }
        for cell in &matrix.decode {
            assert_eq!(
                cell.status,
                CellStatus::Valid,
                "vocabulary {vocab}: {cell:?}"
            );
        }
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hanging_up_during_discovery_leaves_sweeps_usable() {
    // Discovery is slow (every answer 1 s late, and useless: the plan cannot run). The first
    // client hangs up 200 ms into its POST; the sweep it claimed must still end (here: failed)
    // and free the slot, so the next POST gets its own answer, not a 409 forever.
    let upstream = ScriptedUpstream::start(|_| {
        let mut script = Script::json(404, r#"{"error":"no"}"#);
        script.head_delay = Duration::from_secs(1);
        script
    })
    .await;
    let server = proxy_with_token(&upstream.url(), "").await;
    let hung_up = tokio::time::timeout(
        Duration::from_millis(200),
        admin(&server, "POST", "/sweeps", Some(TOKEN), "{}"),
    )
    .await;
    assert!(hung_up.is_err(), "the POST answered before the hang-up");
    let (code, body) = common::wait::eventually(Duration::from_secs(30), async || {
        let (code, body) = admin(&server, "POST", "/sweeps", Some(TOKEN), "{}").await;
        if code != 409 {
            Ok((code, body))
        } else {
            Err((code, body))
        }
    })
    .await
    .unwrap_or_else(|last| last);
    assert_eq!(code, 400, "sweeps stayed wedged: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot run"),
        "{body}"
    );
    let (code, list) = admin(&server, "GET", "/sweeps", Some(TOKEN), "").await;
    assert_eq!(code, 200);
    assert!(
        !list.to_string().contains("\"starting\""),
        "a sweep is still starting: {list}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_server_info_never_answers_still_gets_a_sweep() {
    // sglang answers /server_info only after a round trip to its scheduler, which may never
    // come (the conformance harness's fake scheduler never answers it): the plan comes from
    // /v1/models, /model_info and /metrics, which did answer.
    let sim = SimServer::start(
        Profile::builtin(STEP).unwrap(),
        SimOptions {
            seed: 3,
            hang_server_info: true,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let hung = tokio::time::timeout(
        Duration::from_millis(500),
        common::get(&format!("{}/server_info", sim.base_url())),
    )
    .await;
    assert!(hung.is_err(), "the simulator's /server_info hangs");
    let (server, _) = proxy(&sim.base_url(), "").await;
    let plan = request(json!({
        "contexts": [1000, 2000],
        "concurrency": [1, 2],
        "cell_duration": "1s",
    }));
    let status = run_sweep(&server, plan, Duration::from_secs(90)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let facts = status.server.unwrap();
    assert_eq!(facts.engine, Some(tokentap::base::engine::Engine::SGLANG));
    let model = Profile::builtin(STEP).unwrap().model;
    assert_eq!(
        facts.served_model.as_deref(),
        Some(model.served_model_name.as_str())
    );
    assert!(facts.context_length.is_some(), "{facts:?}");
    assert_eq!(
        facts.model_path.as_deref(),
        Some(model.model_path.as_str()),
        "from /model_info (sglang's /v1/models root is the served name)"
    );
    assert_eq!(facts.kv_budget_tokens, None, "only /server_info says it");
    let plan = status.plan.unwrap();
    assert!(plan.kv_source.starts_with("unknown"), "{}", plan.kv_source);
    let matrix = status.matrix.unwrap();
    assert!(!matrix.decode.is_empty());
    for row in &matrix.prefill {
        assert_eq!(row.status, CellStatus::Valid, "{row:?}");
    }
    for cell in &matrix.decode {
        assert_eq!(cell.status, CellStatus::Valid, "{cell:?}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_cannot_surprise_production_and_a_cancelled_one_loses_nothing() {
    let sim = sim(STEP).await;
    let server = proxy_with_token(&sim.base_url(), "").await;

    // A dry run shows what the default plan would do and starts nothing; the default plan is
    // cut to its duration bound, and says so.
    let (code, preview) = admin(&server, "POST", "/sweeps?dry_run=true", Some(TOKEN), "").await;
    assert_eq!(code, 200, "{preview}");
    assert!(
        preview["expected_duration_s"].as_f64().unwrap() <= 600.0,
        "{preview:#}"
    );
    assert!(preview["largest_prompt_tokens"].as_u64().unwrap() >= 8192);
    assert!(preview["peak_kv_tokens"].as_u64().unwrap() > 0);
    assert!(!preview["cells"].as_array().unwrap().is_empty());
    let notes = preview["notes"].to_string();
    assert!(
        notes.contains("cut to fit sweep.max_default_duration"),
        "{notes}"
    );
    let (_, list) = admin(&server, "GET", "/sweeps", Some(TOKEN), "").await;
    assert_eq!(
        list.as_array().unwrap().len(),
        0,
        "a dry run started a sweep"
    );
    // An explicit plan is the user's: not cut.
    let plan = r#"{"contexts": ["8K"], "concurrency": [1, 2], "cell_duration": "1s"}"#;
    let (code, explicit) = admin(&server, "POST", "/sweeps?dry_run=true", Some(TOKEN), plan).await;
    assert_eq!(code, 200);
    assert_eq!(explicit["runnable_cells"], 2);
    assert_eq!(explicit["notes"].as_array().unwrap().len(), 0);

    // Production in flight: refused with the count and the ways forward.
    let production = long_production_streams(&server, 1).await;
    let (code, refused) = admin(&server, "POST", "/sweeps", Some(TOKEN), plan).await;
    assert_eq!(code, 409);
    let message = refused["error"]["message"].as_str().unwrap();
    for part in [
        "1 production request is in flight",
        "Drain this replica",
        "beside_production",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let (_, preview) = admin(&server, "POST", "/sweeps?dry_run=true", Some(TOKEN), plan).await;
    assert_eq!(preview["production_in_flight"], 1);
    for stream in production {
        stream.abort();
    }
    let meter = &server.proxy.meter;
    common::wait::until(
        "the production streams to end",
        Duration::from_secs(10),
        || meter.inflight(tokentap::base::Source::Production) == 0,
    )
    .await;

    // A finished sweep is the comparison, the capacity source and the gauges' ...
    let first = start_sweep(&server, plan).await;
    wait_status(&server, &first, "finished", Duration::from_secs(60), |s| {
        s["state"] == "finished"
    })
    .await;
    let matrix_of = |server: &tokentap::app::serve::ProxyServer| {
        let addr = server.admin_addr;
        async move {
            let response = common::send(
                http::Request::get(format!("http://{addr}/matrix?source=synthetic&format=json"))
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await;
            serde_json::from_slice::<Value>(&response.bytes()).unwrap()
        }
    };
    let metrics_of = |server: &tokentap::app::serve::ProxyServer| {
        let addr = server.admin_addr;
        async move {
            common::send(
                http::Request::get(format!("http://{addr}/metrics"))
                    .header("authorization", format!("Bearer {TOKEN}"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap(),
            )
            .await
            .text()
        }
    };
    let before = matrix_of(&server).await;
    assert_eq!(before["metadata"]["run"]["sweep_id"], first);
    let gauges_before: Vec<String> = metrics_of(&server)
        .await
        .lines()
        .filter(|l| l.starts_with("tokentap_sweep_cell_"))
        .map(str::to_owned)
        .collect();
    assert!(!gauges_before.is_empty());
    let (_, capacity_before) = admin(&server, "GET", "/capacity", Some(TOKEN), "").await;

    // ... and stays so when the next one is cancelled: it is kept in history, cancelled.
    let second = start_sweep(
        &server,
        r#"{"contexts": ["8K", "16K"], "concurrency": [1, 2, 4], "cell_duration": "5s"}"#,
    )
    .await;
    wait_status(&server, &second, "running", Duration::from_secs(30), |s| {
        s["progress"]["measurements_done"].as_u64().unwrap_or(0) >= 1
    })
    .await;
    let (code, _) = admin(
        &server,
        "DELETE",
        &format!("/sweeps/{second}"),
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(code, 202);
    wait_status(
        &server,
        &second,
        "cancelled",
        Duration::from_secs(30),
        |s| s["state"] == "cancelled",
    )
    .await;
    let after = matrix_of(&server).await;
    assert_eq!(
        after["metadata"]["run"]["sweep_id"], first,
        "the cancelled sweep replaced the comparison"
    );
    assert_eq!(after["decode"], before["decode"]);
    let gauges_after: Vec<String> = metrics_of(&server)
        .await
        .lines()
        .filter(|l| l.starts_with("tokentap_sweep_cell_"))
        .map(str::to_owned)
        .collect();
    assert_eq!(gauges_after, gauges_before, "the sweep gauges changed");
    let (_, capacity_after) = admin(&server, "GET", "/capacity", Some(TOKEN), "").await;
    assert_eq!(capacity_after, capacity_before);
    let (_, list) = admin(&server, "GET", "/sweeps", Some(TOKEN), "").await;
    let states: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["cancelled", "finished"], "{list:#}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_curl_and_a_sweep_land_in_the_same_models_matrices() {
    // sglang answers to any model name: the README's curl sends "default". The request is
    // recorded under the model the server serves, like the sweep's, so the page, /capacity,
    // /matrix and the Prometheus labels meet on one name.
    let sim = sim(STEP).await;
    // As a user runs it: no default_model, so the upstream's /v1/models is read.
    let server = start_proxy(&format!(
        "[upstream]\nurl = \"{}\"\n[store]\ndata_dir = \"\"\n[admin]\ntoken = \"{TOKEN}\"\n[slo]\ntbt = \"1s\"\n",
        sim.base_url()
    ))
    .await;
    let upstream = std::sync::Arc::clone(server.proxy.router.default_upstream());
    common::wait::until("the served model", Duration::from_secs(10), || {
        upstream.served_model().is_some()
    })
    .await;
    let served = upstream.served_model().unwrap().to_string();
    assert_ne!(served, "default");
    let curl = r#"{"model":"default","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for _ in 0..2 {
        assert_eq!(common::post(&url, curl).await.status, 200);
    }
    let id = start_sweep(
        &server,
        r#"{"contexts": ["8K"], "concurrency": [1, 2], "cell_duration": "1s", "slo": "tbt=1s", "find_capacity": true}"#,
    )
    .await;
    let done = wait_status(&server, &id, "finished", Duration::from_secs(90), |s| {
        s["state"] == "finished"
    })
    .await;
    assert_eq!(
        done["matrix"]["metadata"]["model"]["served_model"], served,
        "{done:#}"
    );
    let (code, production) = admin(
        &server,
        "GET",
        "/matrix?source=production&format=json",
        Some(TOKEN),
        "",
    )
    .await;
    assert_eq!(code, 200, "{production}");
    assert_eq!(
        production["metadata"]["model"]["served_model"], served,
        "{production:#}"
    );
    let (code, capacity) = admin(&server, "GET", "/capacity", Some(TOKEN), "").await;
    assert_eq!(code, 200, "{capacity}");
    assert_eq!(capacity["models"][0]["model"], served, "{capacity:#}");
    assert!(
        !capacity["models"][0]["capacity"].is_null(),
        "the sweep of the served model gives production its capacity: {capacity:#}"
    );
    let metrics = server.metrics.render();
    assert!(
        metrics.contains(&format!("model=\"{served}\"")) && !metrics.contains("model=\"default\""),
        "{metrics}"
    );
    server.shutdown().await;
}

/// A simulator profile whose prompt cache matters: a cold 2K prompt pays ~100 ms of prefill, a
/// warm one (a prefix-cache hit) answers in ~10 ms; decode at 200 tok/s per stream.
fn cache_profile() -> Profile {
    Profile::from_toml_str(
        r#"
[model]
served_model_name = "cache-model"
model_path = "cache-model"
context_length = 131072
reasoning = false

[labels]
engine = "sglang"
engine_version = "simulated"
source = "a test profile with a costly prefill"

[capacity]
kv_tokens = 4000000
max_running_requests = 256
chunked_prefill_size = 65536

[prefill]
contexts = [1024]
tok_s = [20000.0]

[decode]
tokens_per_step = 1.0
contexts = [1024]
batch_sizes = [1, 256]
per_request_tok_s = [[200.0, 200.0]]

[cached_ttft]
contexts = [1024]
batch_sizes = [1]
ms = [[10.0]]
"#,
        "the cache test profile",
    )
    .unwrap()
}

/// A 2,048-token token-id prompt: the same every time for `seed` 0, else unique.
fn prompt_ids(seed: u64) -> String {
    let ids: Vec<String> = (0..2048u64)
        .map(|j| (1000 + (seed * 7919 + j * 104_729 + j * j) % 9000).to_string())
        .collect();
    format!("[{}]", ids.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_like_production_sweep_judges_capacity_on_production_s_cold_prompts() {
    let sim = SimServer::start(
        cache_profile(),
        SimOptions {
            seed: 5,
            enable_cache_report: true,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let server = proxy_with_token(&sim.base_url(), "").await;
    // Between the warm TTFT (~10 ms) and the cold one (~100 ms).
    let slo = "ttft=40ms";
    // Production: one request in five repeats a prompt the server has cached (warmed straight
    // at the simulator, so the warming request is not production's), the rest are cold and
    // unique; each carries the SLO.
    let warm = prompt_ids(0);
    common::post(
        &format!("{}/v1/completions", sim.base_url()),
        &format!(r#"{{"model":"cache-model","prompt":{warm},"max_tokens":1}}"#),
    )
    .await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    for i in 0..25u64 {
        let prompt = if i % 5 == 4 {
            warm.clone()
        } else {
            prompt_ids(i + 1)
        };
        let request = http::Request::post(&url)
            .header("content-type", "application/json")
            .header("x-tokentap-slo", slo)
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                r#"{{"model":"cache-model","prompt":{prompt},"max_tokens":8,"ignore_eos":true,"stream":true}}"#
            ))))
            .unwrap();
        assert_eq!(common::send(request).await.status, 200);
    }
    let production = server
        .admin
        .production
        .matrix(
            tokentap::aggregate::Window::All,
            Some("cache-model"),
            std::time::SystemTime::now(),
        )
        .unwrap();
    let production_cell = production
        .decode
        .iter()
        .find(|c| c.completed_requests.unwrap_or(0) > 0)
        .unwrap()
        .clone();
    let production_attainment = production_cell.slo_attainment.unwrap();
    let cache = production_cell.prompt_cache.unwrap();
    assert!(
        (cache.cached_share.unwrap() - 0.2).abs() < 0.02,
        "{production_cell:#?}"
    );

    let sweep = |body: Value| {
        let server = &server;
        async move {
            let id = start_sweep(server, &body.to_string()).await;
            wait_status(server, &id, "finished", Duration::from_secs(120), |s| {
                s["state"] == "finished"
            })
            .await
        }
    };
    let plan = json!({"contexts": [2048], "concurrency": [1, 2], "cell_duration": "3s", "max_output": 8, "slo": slo, "find_capacity": true});
    // The seed method: identical warm streams meet the TTFT target at every level.
    let mut seed_method = plan.clone();
    seed_method["like_production"] = json!(false);
    let warm_sweep = sweep(seed_method).await;
    let warm_answer = &warm_sweep["capacity"]["contexts"][0];
    assert_eq!(warm_answer["capacity"], 2, "{warm_answer:#}");
    assert!(warm_sweep["capacity"]["shape"].is_null());
    assert!(warm_sweep["matrix"]["metadata"]["run"]["shape"].is_null());

    // The preview names the shape; the search uses it since production has evidence.
    let (code, preview) = admin(
        &server,
        "POST",
        "/sweeps?dry_run=true",
        Some(TOKEN),
        &plan.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{preview}");
    assert!(
        preview["like_production"]
            .as_str()
            .is_some_and(|s| s.starts_with("like production: 8K 20 % cached")),
        "{preview:#}"
    );
    // The note names the command line's flag, not only the plan's JSON key (issue 61.10).
    assert!(
        preview["notes"]
            .as_array()
            .is_some_and(|notes| notes.iter().any(|n| n
                .as_str()
                .is_some_and(|n| n.contains("--seed-method") && n.contains("like_production")))),
        "{preview:#}"
    );
    let shaped = sweep(plan).await;
    let answer = &shaped["capacity"]["contexts"][0];
    assert_eq!(
        answer["capacity"], 0,
        "production's cold prompts miss the TTFT target: {answer:#}"
    );
    assert!(
        shaped["capacity"]["shape"]
            .as_str()
            .is_some_and(|s| s.starts_with("like production")),
        "{:#}",
        shaped["capacity"]
    );
    let matrix: MatrixDoc = serde_json::from_value(shaped["matrix"].clone()).unwrap();
    assert!(matrix.like_production());
    let cell = matrix.decode.iter().find(|c| c.concurrency == 1).unwrap();
    let attainment = cell.slo_attainment.unwrap();
    eprintln!(
        "like production: SLO attainment {attainment:.3} (production {production_attainment:.3}); capacity 0 against the seed method's {}; TTFT {:?} ms (production {:?} ms)",
        warm_answer["capacity"], cell.ttft_ms, production_cell.ttft_ms
    );
    assert!(
        (attainment - production_attainment).abs() <= 0.05,
        "the like-production cell's SLO attainment {attainment:.3} against production's {production_attainment:.3}: {cell:#?}"
    );
    server.shutdown().await;
}
