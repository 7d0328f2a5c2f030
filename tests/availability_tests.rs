#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Issue 61, point 1: availability first in the verdict. Real proxies on loopback in front of
//! the simulator, a scripted upstream or nothing at all:
//!
//! - an outage: good traffic, then the simulator stopped and clients answered 502 — the
//!   headline of `GET /status`, `tokentap status` and the page (headless Chromium) says
//!   unavailable, since when, and the last error, above the SLO of the earlier cells;
//! - a dead upstream without `[slo]`: said to be one, with and without traffic, never
//!   "nothing to judge";
//! - an engine shedding 9 of 10 requests (sglang's 503 body, vLLM's 429 + `Retry-After`):
//!   the SLO clause misses and the headroom is at most 0, whatever the admitted request did;
//! - a healthy proxy: the availability clause is ok and no headline.
//!
//! Every wait is bounded; nothing sleeps for a fixed time.
use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokentap::matrix::doc::{CellStatus, DecodeCell, MatrixDoc, Metadata};
use tokentap::sim::{Profile, SimOptions, SimServer};

use common::{Script, ScriptedUpstream};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const LIMIT: Duration = Duration::from_secs(60);

async fn status_json(server: &tokentap::app::serve::ProxyServer) -> Value {
    let answer = common::get(&format!("http://{}/status", server.admin_addr)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    serde_json::from_slice(&answer.bytes()).unwrap()
}

/// `tokentap status --admin` of `server`: its stdout, every line within 120 columns.
async fn status_cli(server: &tokentap::app::serve::ProxyServer) -> String {
    let admin_url = format!("http://{}", server.admin_addr);
    let output = tokio::time::timeout(
        LIMIT,
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args(["status", "--admin", &admin_url])
                .env_remove("TOKENTAP_ADMIN__TOKEN")
                .output()
                .unwrap()
        }),
    )
    .await
    .expect("tokentap status answers within 60 s")
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 120, "{line}");
    }
    text
}

/// The text without line breaks (the terminal wraps it).
fn joined(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn chat(model: &str, tokens: u64) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"hello"}}],"max_tokens":{tokens},"stream":true}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_heads_the_verdict_with_since_when_and_the_last_error() {
    let sim = SimServer::start(
        Profile::builtin(STEP).unwrap(),
        SimOptions {
            seed: 61,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let (server, records) = common::proxy(
        &sim.base_url(),
        &format!(
            "[slo]\nttft = \"30s\"\ntbt = \"1s\"\n[capacity]\nwindow = \"1m\"\n{}",
            common::NO_EVIDENCE_MINIMUM
        ),
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for _ in 0..3 {
        assert_eq!(common::post(&url, &chat("step3p7", 8)).await.status, 200);
    }
    records.wait_for(3).await;
    // Before the outage: production meets the SLO, no headline.
    let before = status_json(&server).await;
    assert!(before["headline"].is_null(), "{before:#}");
    assert_eq!(
        before["models"][0]["clauses"][1]["state"], "ok",
        "{before:#}"
    );

    // The upstream stops; ten clients get 502.
    sim.shutdown().await;
    for _ in 0..10 {
        assert_eq!(common::post(&url, &chat("step3p7", 8)).await.status, 502);
    }
    records.wait_for(13).await;
    // `/readyz` says so too (its probe's answer is reused for a second).
    let readyz = format!("http://{}/readyz", server.admin_addr);
    common::wait::until_async("/readyz answers 503", LIMIT, async || {
        common::get(&readyz).await.status == 503
    })
    .await;

    let status = status_json(&server).await;
    let headline = status["headline"]["text"].as_str().unwrap_or_default();
    assert_eq!(status["headline"]["key"], "availability", "{status:#}");
    assert_eq!(status["headline"]["state"], "bad", "{status:#}");
    for words in [
        "unavailable since ",
        "does not answer",
        "not ready",
        "10 of 13 requests in the window failed",
        "last error: 502 from tokentap at",
        "could not be reached",
    ] {
        assert!(headline.contains(words), "{words}: {headline}");
    }
    let model = &status["models"][0];
    assert_eq!(model["state"], "bad", "{status:#}");
    assert_eq!(model["clauses"][0]["key"], "availability", "{status:#}");
    assert_eq!(model["summary"], headline, "{status:#}");
    assert_eq!(model["availability"]["kind"], "unavailable", "{status:#}");
    assert_eq!(model["availability"]["ready"], false, "{status:#}");
    assert_eq!(status["upstreams"][0]["answering"], false, "{status:#}");
    // The earlier cells still meet the SLO: that is the clause under it, not the headline.
    assert_eq!(model["clauses"][1]["key"], "slo", "{status:#}");

    // `tokentap status`: the headline is its first line.
    let text = status_cli(&server).await;
    eprintln!("{text}");
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("✗ unavailable since "), "{text}");
    assert!(
        joined(&text).contains("last error: 502 from tokentap"),
        "{text}"
    );

    // The page, as a browser renders it: the headline is the verdict's first line.
    let dir = common::TempDir::new("availability-page");
    let target = format!("http://{}/", server.admin_addr);
    let profile_dir = dir.0.join("profile");
    let dom =
        tokio::task::spawn_blocking(move || common::chromium::dump_dom(&target, &profile_dir))
            .await
            .unwrap();
    let verdict_at = dom.find("id=\"verdict\"").expect("the verdict");
    let verdict = &dom[verdict_at..dom[verdict_at..].find("</section>").unwrap() + verdict_at];
    let first_line = verdict
        .split("</h2>")
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap_or_default();
    assert!(
        first_line.contains("class=\"headline\"")
            && first_line.contains("unavailable since")
            && first_line.contains("502 from tokentap"),
        "{verdict}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_without_slo_is_said_to_be_one() {
    // A port nothing listens on.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (server, records) = common::proxy(&format!("http://{dead}"), "").await;

    // No traffic: the verdict says the upstream does not answer, not "nothing to judge".
    let status = status_json(&server).await;
    let headline = status["headline"]["text"].as_str().unwrap_or_default();
    assert!(
        headline.starts_with("unavailable") && headline.contains("does not answer"),
        "{status:#}"
    );
    let note = status["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("unavailable") && !note.contains("nothing to judge"),
        "{status:#}"
    );
    let text = status_cli(&server).await;
    assert!(text.starts_with("✗ unavailable"), "{text}");
    assert!(!joined(&text).contains("nothing to judge"), "{text}");

    // A client's request: 502, and the model's availability clause heads its verdict.
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    assert_eq!(common::post(&url, &chat("m", 8)).await.status, 502);
    records.wait_for(1).await;
    let status = status_json(&server).await;
    let model = &status["models"][0];
    assert_eq!(model["clauses"][0]["key"], "availability", "{status:#}");
    assert_eq!(model["clauses"][0]["state"], "bad", "{status:#}");
    let headline = status["headline"]["text"].as_str().unwrap_or_default();
    assert!(
        headline.contains("1 of 1 requests in the window failed")
            && headline.contains("the default 5.0% error budget (no [slo] targets)")
            && headline.contains("last error: 502 from tokentap"),
        "{status:#}"
    );
    assert!(status["note"].is_null(), "{status:#}");
    server.shutdown().await;
}

/// A sweep's matrix of model `m` at 8K in which every concurrency up to 64 meets the SLO:
/// the boundary the headroom is held to.
fn roomy_sweep() -> MatrixDoc {
    let mut metadata = Metadata::default();
    metadata.model.served_model = Some("m".to_owned());
    metadata.run.sweep_id = Some("roomy".to_owned());
    let mut doc = MatrixDoc::new(metadata);
    for concurrency in [1u32, 2, 4, 8, 16, 32, 64] {
        let mut cell = DecodeCell::status_only(8192, concurrency, CellStatus::Valid);
        cell.per_request_tok_s = Some(100.0);
        cell.total_tok_s = Some(100.0 * f64::from(concurrency));
        cell.ttft_ms = Some(100.0);
        cell.tbt_ms = Some(10.0);
        cell.average_active_requests = Some(f64::from(concurrency));
        cell.completed_requests = Some(10);
        cell.output_tokens = Some(4096);
        cell.measured_for_s = Some(30.0);
        doc.decode.push(cell);
    }
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_shedding_nine_in_ten_misses_the_slo_and_has_no_headroom() {
    let generations = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&generations);
    let upstream = ScriptedUpstream::start(move |request| {
        if request.path.starts_with("/v1/models") {
            return Script::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#);
        }
        match counter.fetch_add(1, Ordering::Relaxed) % 10 {
            0 => common::timed_chat_stream(
                request,
                Duration::from_millis(20),
                Duration::from_millis(10),
                Some(20),
            ),
            // sglang's own refusal.
            n if n % 2 == 1 => Script::json(
                503,
                r#"{"object":"error","message":"The request queue is full.","type":"Service Unavailable","param":null,"code":503}"#,
            ),
            // vLLM behind a gateway: 429 with Retry-After.
            _ => {
                let mut script = Script::json(
                    429,
                    r#"{"error":{"message":"Too many requests","type":"RateLimitError","code":429}}"#,
                );
                script.headers.push(("retry-after", "1".to_owned()));
                script
            }
        }
    })
    .await;
    let (server, records) = common::proxy(
        &upstream.url(),
        &format!(
            "[slo]\nttft = \"30s\"\ntbt = \"1s\"\n[capacity]\nwindow = \"1m\"\n{}",
            common::NO_EVIDENCE_MINIMUM
        ),
    )
    .await;
    server.admin.synthetic.set_completed(roomy_sweep());
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(common::post(&url, &chat("m", 20)).await.status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    records.wait_for(10).await;

    let status = status_json(&server).await;
    let model = &status["models"][0];
    let clause = |key: &str| {
        model["clauses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("a {key} clause: {status:#}"))
    };
    // The availability clause: shedding, over the SLO's budget.
    let available = clause("availability");
    assert_eq!(available["state"], "bad", "{status:#}");
    assert_eq!(model["availability"]["kind"], "shedding", "{status:#}");
    assert!(
        available["text"]
            .as_str()
            .unwrap()
            .starts_with("shedding since "),
        "{status:#}"
    );
    // The SLO: missed, by the shed share, whatever the admitted request did.
    let slo = clause("slo");
    assert_eq!(slo["state"], "bad", "{status:#}");
    assert!(
        slo["text"].as_str().unwrap().contains(
            "90.0% of requests (9 of 10) were shed by the engine, over the 1.0% error budget"
        ),
        "{status:#}"
    );
    // The headroom: none, not the sweep's room.
    let headroom = clause("headroom");
    assert_eq!(headroom["state"], "bad", "{status:#}");
    assert!(
        headroom["text"]
            .as_str()
            .unwrap()
            .starts_with("no headroom: the engine sheds 90.0% of requests"),
        "{status:#}"
    );
    let capacity = common::get(&format!("http://{}/capacity", server.admin_addr)).await;
    let capacity: Value = serde_json::from_slice(&capacity.bytes()).unwrap();
    let figures = &capacity["models"][0];
    assert!(
        figures["capacity_from"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sweep"),
        "{capacity:#}"
    );
    assert!(
        figures["headroom"]["headroom"].as_f64().unwrap() <= 0.0,
        "{capacity:#}"
    );
    assert_eq!(figures["rests_on"], "production_misses", "{capacity:#}");
    assert_eq!(figures["production"]["shed"]["shed"], 9, "{capacity:#}");
    let text = status_cli(&server).await;
    eprintln!("{text}");
    let text = joined(&text);
    assert!(
        text.contains("no headroom: the engine sheds 90.0%"),
        "{text}"
    );
    assert!(!text.contains("% headroom ("), "{text}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_proxy_has_no_availability_headline() {
    let upstream = ScriptedUpstream::start(|request| {
        if request.path.starts_with("/v1/models") {
            return Script::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#);
        }
        common::timed_chat_stream(
            request,
            Duration::from_millis(20),
            Duration::from_millis(5),
            Some(10),
        )
    })
    .await;
    let (server, records) = common::proxy(
        &upstream.url(),
        &format!(
            "[slo]\nttft = \"30s\"\ntbt = \"1s\"\n[capacity]\nwindow = \"1m\"\n{}",
            common::NO_EVIDENCE_MINIMUM
        ),
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for _ in 0..5 {
        assert_eq!(common::post(&url, &chat("m", 10)).await.status, 200);
    }
    records.wait_for(5).await;
    let status = status_json(&server).await;
    assert!(status["headline"].is_null(), "{status:#}");
    let model = &status["models"][0];
    let available = &model["clauses"][0];
    assert_eq!(available["key"], "availability", "{status:#}");
    assert_eq!(available["state"], "ok", "{status:#}");
    assert!(
        available["text"]
            .as_str()
            .unwrap()
            .contains("none of 5 requests in the window failed"),
        "{status:#}"
    );
    assert_ne!(model["summary"], available["text"], "{status:#}");
    assert_eq!(model["clauses"][1]["state"], "ok", "{status:#}");
    let text = status_cli(&server).await;
    assert!(text.starts_with("tokentap status of "), "{text}");
    let page = common::get(&format!("http://{}/", server.admin_addr))
        .await
        .text();
    assert!(!page.contains("class=\"headline\""), "{page}");
    assert!(
        page.contains("<span data-clause=\"availability\" data-state=\"Ok\""),
        "{page}"
    );
    server.shutdown().await;
}
