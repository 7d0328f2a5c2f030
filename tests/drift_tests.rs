#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Drift against a pinned reference (issue 13, point 3), end to end through the real proxy, the
//! real admin listener and the real SQLite store:
//!
//! - a reference from a Markdown page with known figures, pinned with `tokentap reference pin`,
//!   against a scripted upstream with known timing: `/matrix?compare=reference` gives
//!   production ÷ reference exactly (the production cell's own figures ÷ the page's), the
//!   gauge appears only once the cell meets `[evidence]` (`min_requests` requests), the refresher removes
//!   it when the reference is cleared, and the pin survives a restart;
//! - a reference pinned from a sweep on the simulator, then ordinary traffic that reproduces
//!   the swept cell: per-request tok/s ratio ≈ 1.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokentap::app::serve::ProxyServer;
use tokentap::matrix::doc::{CellStatus, DecodeCell, MatrixDoc, Metadata};
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokentap::sweep::{SweepRequest, SweepState};

const TOKEN: &str = "drift-test-token";
/// The scripted upstream's time to first token and gap between tokens: 40 tok/s per request.
const TTFT: Duration = Duration::from_millis(200);
const GAP: Duration = Duration::from_millis(25);
const TOKENS: u64 = 12;
/// The reference page's figures for 8K × 1.
const REFERENCE_TOK_S: f64 = 80.0;
const REFERENCE_TTFT_MS: f64 = 100.0;

/// The scripted upstream of these tests: `TOKENS` tokens, the first at `TTFT`, then one every
/// `GAP` (`timed_chat_stream`).
fn timed_stream(request: &Received) -> Script {
    timed_chat_stream(request, TTFT, GAP, Some(TOKENS))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tokentap-drift-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One request of 5,000 prompt tokens (the 8K bucket), alone (concurrency 1).
async fn one_request(server: &ProxyServer) {
    let body = format!(
        r#"{{"model":"m","stream":true,"max_tokens":{TOKENS},"x_prompt_tokens":5000,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        &body,
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
}

async fn admin(server: &ProxyServer, method: &str, path: &str, body: Option<String>) -> Received2 {
    let request = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", server.admin_addr))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    send(request).await
}

async fn admin_json(server: &ProxyServer, path: &str) -> Value {
    let response = admin(server, "GET", path, None).await;
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    serde_json::from_str(&response.text()).unwrap()
}

/// The `tokentap_drift_ratio` samples of `/metrics`: (labels, value).
async fn drift_samples(server: &ProxyServer) -> Vec<(String, f64)> {
    let text = admin(server, "GET", "/metrics", None).await.text();
    text.lines()
        .filter(|l| l.starts_with("tokentap_drift_ratio{"))
        .map(|l| {
            let (labels, value) = l.rsplit_once(' ').unwrap();
            (labels.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn refresh_now(server: &ProxyServer) {
    tokentap::app::drift::refresh(
        &server.production,
        &server.admin.drift,
        &server.metrics.drift,
    );
}

/// A reference page: model m, 8K × 1 at 80 tok/s per request and 100 ms TTFT.
fn reference_page() -> String {
    let mut metadata = Metadata::default();
    metadata.model.served_model = Some("m".to_owned());
    metadata.model.display_name = Some("Reference-Model".to_owned());
    let mut doc = MatrixDoc::new(metadata);
    let mut cell = DecodeCell::status_only(8192, 1, CellStatus::Valid);
    cell.per_request_tok_s = Some(REFERENCE_TOK_S);
    cell.total_tok_s = Some(REFERENCE_TOK_S);
    cell.ttft_ms = Some(REFERENCE_TTFT_MS);
    cell.tbt_ms = Some(1000.0 / REFERENCE_TOK_S);
    cell.average_active_requests = Some(1.0);
    cell.completed_requests = Some(10);
    cell.output_tokens = Some(4096);
    cell.measured_for_s = Some(30.0);
    doc.decode.push(cell);
    tokentap::matrix::render_markdown(&doc)
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(args)
        .env_remove("TOKENTAP_ADMIN__TOKEN")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_reference_gives_exact_ratios_gauges_follow_min_requests_and_the_pin_survives_a_restart(
) {
    let upstream = ScriptedUpstream::start(timed_stream).await;
    let dir = temp_dir("page");
    let config = format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\n[admin]\ntoken = \"{TOKEN}\"\n[store]\ndata_dir = \"{}\"\n[evidence]\nmin_requests = 4\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n[drift]\nrefresh_interval = \"200ms\"\n",
        upstream.url(),
        dir.display()
    );
    let (server, records) = proxy_from_config(&config).await;
    let admin_url = format!("http://{}", server.admin_addr);

    // Pinning needs the token.
    let page = dir.join("reference.md");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&page, reference_page()).unwrap();
    let page_arg = page.to_str().unwrap();
    let refused = cli(&[
        "reference",
        "pin",
        "--admin",
        &admin_url,
        "--file",
        page_arg,
    ]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("Bearer"),
        "{refused:?}"
    );
    let pinned = cli(&[
        "reference",
        "pin",
        "--admin",
        &admin_url,
        "--token",
        TOKEN,
        "--file",
        page_arg,
    ]);
    assert!(pinned.status.success(), "{pinned:?}");
    let answer: Value = serde_json::from_slice(&pinned.stdout).unwrap();
    assert_eq!(answer["upstream"], "default");
    assert_eq!(answer["model"], "m");
    assert_eq!(answer["kept"], true);
    assert_eq!(answer["source"], format!("file {page_arg}"));

    // Three requests: below min_requests, the cell's decode figures are compared (they rest on
    // tokens and time) but its TTFT is not: no TTFT ratio, no TTFT gauge.
    for _ in 0..3 {
        one_request(&server).await;
    }
    records.wait_for(3).await;
    refresh_now(&server);
    let early = drift_samples(&server).await;
    assert_eq!(early.len(), 1, "{early:?}");
    assert!(
        early[0].0.contains("metric=\"per_request_tok_s\""),
        "{early:?}"
    );
    let compared = admin_json(&server, "/matrix?compare=reference&window=15m&format=json").await;
    assert_eq!(compared["schema"], "tokentap.matrix-compare/v1");
    let cell = &compared["cells"][0];
    assert_eq!(
        (
            cell["context_tokens"].as_u64(),
            cell["concurrency"].as_u64()
        ),
        (Some(8192), Some(1))
    );
    assert_eq!(cell["verdict"], "compared", "{compared:#}");
    assert_eq!(cell["requests"], 3);
    assert!(cell["ratios"]["per_request_tok_s"].is_number());
    assert!(cell["ratios"]["ttft_ms"].is_null(), "{compared:#}");

    // The fourth: the TTFT compared too, exactly production ÷ reference, and its gauge appears.
    one_request(&server).await;
    records.wait_for(4).await;
    let production = admin_json(&server, "/matrix?window=15m&format=json").await;
    let production_cell = production["decode"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["context_tokens"] == 8192 && c["concurrency"] == 1)
        .unwrap()
        .clone();
    let tok_s = production_cell["per_request_tok_s"].as_f64().unwrap();
    let ttft_ms = production_cell["ttft_ms"].as_f64().unwrap();
    let compared = admin_json(&server, "/matrix?compare=reference&window=15m&format=json").await;
    let cell = &compared["cells"][0];
    assert_eq!(cell["verdict"], "compared", "{compared:#}");
    let tok_s_ratio = cell["ratios"]["per_request_tok_s"].as_f64().unwrap();
    let ttft_ratio = cell["ratios"]["ttft_ms"].as_f64().unwrap();
    assert_eq!(tok_s_ratio, tok_s / REFERENCE_TOK_S);
    assert_eq!(ttft_ratio, ttft_ms / REFERENCE_TTFT_MS);
    // And what the scripted timing says: 40 tok/s against 80 (one gap per token, ±10 % for a
    // loaded machine's timers), 200 ms TTFT against 100 (never faster than scripted).
    assert!((tok_s_ratio - 0.5).abs() <= 0.05, "{tok_s_ratio}");
    assert!((1.97..=3.0).contains(&ttft_ratio), "{ttft_ratio}");
    assert_eq!(compared["reference"]["source"], format!("file {page_arg}"));
    assert_eq!(compared["min_requests"], 4);

    refresh_now(&server);
    let samples = drift_samples(&server).await;
    let labels = "upstream=\"default\",model=\"m\",context_bucket=\"8K\",concurrency_bucket=\"1\"";
    assert_eq!(
        samples,
        vec![
            (
                format!("tokentap_drift_ratio{{{labels},metric=\"per_request_tok_s\"}}"),
                tok_s_ratio
            ),
            (
                format!("tokentap_drift_ratio{{{labels},metric=\"ttft\"}}"),
                ttft_ratio
            ),
        ]
    );

    // Markdown and HTML name the reference and show the ratio.
    let md = admin(
        &server,
        "GET",
        "/matrix?compare=reference&window=15m&format=md",
        None,
    )
    .await
    .text();
    assert!(md.contains("# Drift against the reference"), "{md}");
    assert!(md.contains(&format!("×{tok_s_ratio:.3}")), "{md}");
    assert!(md.contains("Reference-Model"), "{md}");
    let html = admin(
        &server,
        "GET",
        "/matrix?compare=reference&window=15m&format=html",
        None,
    )
    .await
    .text();
    assert!(
        html.contains(&format!("data-ratio=\"{tok_s_ratio}\"")),
        "{html}"
    );
    // On the one scale of every ratio: below ×0.95, orange or red.
    let style = tokentap::matrix::side_by_side::ratio_style(tok_s_ratio);
    assert!(tok_s_ratio < 0.95 && style.contains("#c4162a") || style.contains("#ff9830"));
    assert!(
        html.contains(&style),
        "a slower ratio is drawn {style}: {html}"
    );
    // The page shows the drift grid beside the matrices.
    let page_html = admin(&server, "GET", "/?window=15m", None).await.text();
    assert!(page_html.contains("id=\"drift\""), "{page_html}");
    assert!(
        page_html.contains(&format!("data-ratio=\"{tok_s_ratio}\"")),
        "{page_html}"
    );
    let shown = admin_json(&server, "/reference").await;
    assert_eq!(shown.as_array().unwrap().len(), 1, "{shown:#}");
    let pinned_at = shown[0]["pinned_at"].clone();

    // A restart on the same store keeps the reference (and its provenance).
    server.shutdown().await;
    let (server, _) = proxy_from_config(&config).await;
    let admin_url = format!("http://{}", server.admin_addr);
    let after = admin_json(&server, "/reference?model=m").await;
    assert_eq!(after["source"], format!("file {page_arg}"));
    assert_eq!(after["pinned_at"], pinned_at);
    assert_eq!(
        after["matrix"]["decode"][0]["per_request_tok_s"],
        REFERENCE_TOK_S
    );
    let shown = cli(&[
        "reference",
        "show",
        "--admin",
        &admin_url,
        "--token",
        TOKEN,
        "--model",
        "m",
        "--format",
        "md",
    ]);
    assert!(shown.status.success(), "{shown:?}");
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("Reference-Model"),
        "{shown:?}"
    );

    // Traffic after the restart gives a gauge again; clearing the reference makes the
    // refresher (every 200 ms) remove it.
    for _ in 0..4 {
        one_request(&server).await;
    }
    let present = common::wait::eventually(Duration::from_secs(10), async || {
        if drift_samples(&server).await.is_empty() {
            Err(())
        } else {
            Ok(())
        }
    })
    .await;
    assert!(present.is_ok(), "the refresher set no gauge within 10 s");
    let cleared = cli(&[
        "reference",
        "clear",
        "--admin",
        &admin_url,
        "--token",
        TOKEN,
        "--model",
        "m",
    ]);
    assert!(cleared.status.success(), "{cleared:?}");
    let gone = common::wait::eventually(Duration::from_secs(10), async || {
        if drift_samples(&server).await.is_empty() {
            Ok(())
        } else {
            Err(())
        }
    })
    .await
    .is_ok();
    assert!(
        gone,
        "the refresher kept the gauge of a cleared reference for 10 s"
    );
    let missing = admin(
        &server,
        "GET",
        "/matrix?compare=reference&format=json",
        None,
    )
    .await;
    assert_eq!(missing.status, 404, "{}", missing.text());
    assert!(
        missing.text().contains("tokentap reference pin"),
        "{}",
        missing.text()
    );
    assert!(server
        .store
        .clone()
        .unwrap()
        .reference("default", "m")
        .unwrap()
        .is_none());
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pins_are_refused_with_a_reason() {
    let upstream = ScriptedUpstream::start(timed_stream).await;
    let (server, _) = proxy(&upstream.url(), &format!("[admin]\ntoken = \"{TOKEN}\"\n")).await;
    for (body, needle) in [
        (r#"{"from":"latest-sweep"}"#, "no sweep has finished"),
        (r#"{"from":"yesterday"}"#, "latest-sweep"),
        ("not a matrix", "neither"),
    ] {
        let response = admin(&server, "PUT", "/reference?model=m", Some(body.to_owned())).await;
        assert!(response.status >= 400, "{body}");
        assert!(
            response.text().contains(needle),
            "{body}: {}",
            response.text()
        );
    }
    let unknown = admin(
        &server,
        "PUT",
        "/reference?model=m&upstream=nope",
        Some(reference_page()),
    )
    .await;
    assert_eq!(unknown.status, 400);
    assert!(unknown.text().contains("nope"), "{}", unknown.text());
    // Without a store the pin lasts for the process, and says so.
    let pinned = admin(&server, "PUT", "/reference", Some(reference_page())).await;
    assert_eq!(pinned.status, 200, "{}", pinned.text());
    let answer: Value = serde_json::from_str(&pinned.text()).unwrap();
    assert_eq!(answer["kept"], false);
    assert_eq!(answer["source"], "imported Markdown page");
    for (query, needle) in [
        ("compare=reference&source=synthetic", "source=synthetic"),
        ("compare=reference&model=m&upstream=nope", "nope"),
        ("compare=sweep", "compare=reference"),
    ] {
        let response = admin(&server, "GET", &format!("/matrix?{query}"), None).await;
        assert_eq!(response.status, 400, "{query}: {}", response.text());
        assert!(
            response.text().contains(needle),
            "{query}: {}",
            response.text()
        );
    }
    let unauthenticated = get(&format!("http://{}/reference", server.admin_addr)).await;
    assert_eq!(unauthenticated.status, 401);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_file_in_the_config_is_pinned_at_start_and_a_bad_one_stops_it() {
    let upstream = ScriptedUpstream::start(timed_stream).await;
    let dir = temp_dir("file");
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("reference.md");
    std::fs::write(&page, reference_page()).unwrap();
    let config = |file: &std::path::Path| {
        format!(
            "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nreference_file = \"{}\"\n[admin]\ntoken = \"{TOKEN}\"\n[store]\ndata_dir = \"\"\n",
            upstream.url(),
            file.display()
        )
    };
    let (server, _) = proxy_from_config(&config(&page)).await;
    let shown = admin_json(&server, "/reference?model=m").await;
    assert_eq!(
        shown["source"],
        format!("file {} (reference_file)", page.display())
    );
    assert_eq!(shown["upstream"], "default");
    server.shutdown().await;

    let loaded = tokentap::config::ConfigLoader::new()
        .text(&config(&dir.join("missing.md")), "test.toml")
        .unwrap()
        .load()
        .unwrap();
    let error = ProxyServer::start_on(
        loaded,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap_err();
    assert!(format!("{error:#}").contains("reference_file"), "{error:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const SIM_CONTEXT: u64 = 8192;
const SIM_TOKENS: u64 = 40;

/// Two simultaneous 8K streams to the simulator, each read to its end (the swept cell 8K × 2).
async fn two_streams(url: &str) {
    let prompt: Vec<u64> = (0..SIM_CONTEXT)
        .map(|i| 1000 + (i * 7919) % 50_000)
        .collect();
    let body = json!({
        "model": "step3p7",
        "prompt": prompt,
        "max_tokens": SIM_TOKENS,
        "ignore_eos": true,
        "stream": true,
    })
    .to_string();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let request = http::Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.clone())))
                .unwrap();
            tokio::spawn(async move {
                let response = client().request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                response.into_body().collect().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_pinned_from_a_sweep_gives_ratios_near_one_for_traffic_like_the_sweep() {
    let _cores = common::cores::for_timing().await;
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    let dir = temp_dir("sweep");
    let config = format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\n[admin]\ntoken = \"{TOKEN}\"\n[store]\ndata_dir = \"{}\"\n[evidence]\nmin_requests = 6\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n",
        sim.base_url(),
        dir.display()
    );
    let (server, records) = proxy_from_config(&config).await;
    let plan: SweepRequest = serde_json::from_value(json!({
        "contexts": [SIM_CONTEXT],
        "concurrency": [2],
        "cell_duration": "2s",
    }))
    .unwrap();
    let status = run_sweep(&server, plan, Duration::from_secs(120)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let swept = status
        .matrix
        .unwrap()
        .cell(SIM_CONTEXT, 2)
        .cloned()
        .unwrap();

    let wrong = admin(
        &server,
        "PUT",
        "/reference?model=other",
        Some(r#"{"from":"latest-sweep"}"#.to_owned()),
    )
    .await;
    assert_eq!(wrong.status, 400, "{}", wrong.text());
    assert!(wrong.text().contains("step3p7"), "{}", wrong.text());
    let pinned = admin(
        &server,
        "PUT",
        "/reference?model=step3p7",
        Some(r#"{"from":"latest-sweep"}"#.to_owned()),
    )
    .await;
    assert_eq!(pinned.status, 200, "{}", pinned.text());
    let answer: Value = serde_json::from_str(&pinned.text()).unwrap();
    assert_eq!(answer["source"], format!("latest-sweep {}", status.id));

    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let before = records.len();
    for round in 1..=4 {
        two_streams(&url).await;
        records.wait_for(before + 2 * round).await;
    }
    let compared = admin_json(
        &server,
        "/matrix?compare=reference&model=step3p7&window=15m&format=json",
    )
    .await;
    let cell = compared["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["context_tokens"] == SIM_CONTEXT && c["concurrency"] == 2)
        .unwrap_or_else(|| panic!("no 8K × 2 production cell: {compared:#}"));
    assert_eq!(cell["verdict"], "compared", "{compared:#}");
    let ratio = cell["ratios"]["per_request_tok_s"].as_f64().unwrap();
    eprintln!("sweep cell {swept:?}; production ÷ sweep per-request tok/s {ratio}");
    // Same server, same cell, same metering path: the simulator's decode speed is the same; the
    // tolerance covers the timers of a loaded 2-core machine.
    assert!((0.8..=1.25).contains(&ratio), "{ratio}: {compared:#}");
    refresh_now(&server);
    let samples = drift_samples(&server).await;
    let per_request = samples
        .iter()
        .find(|(labels, _)| {
            labels.contains(
                "context_bucket=\"8K\",concurrency_bucket=\"2\",metric=\"per_request_tok_s\"",
            )
        })
        .unwrap_or_else(|| panic!("no gauge for 8K × 2: {samples:?}"));
    assert_eq!(per_request.1, ratio);
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reference_help_teaches() {
    let help = cli(&["reference", "--help"]);
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8(help.stdout).unwrap();
    for needle in [
        "pin",
        "show",
        "clear",
        "--from latest-sweep",
        "compare=reference",
        "min_requests",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}
