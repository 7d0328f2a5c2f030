//! SLO attainment and goodput (issue 13, point 2) on the simulator, through the real proxy.
//!
//! Targets far below what the simulator can do (1 ms TTFT and TBT) are missed by every request,
//! so a cell's attainment is 0 and its goodput 0; targets far above (minutes) are met by every
//! request, so attainment is 1 and goodput equals total tok/s — in the production matrix, in
//! Prometheus and in a sweep's cells alike. A valid `x-tokentap-slo` header replaces the
//! configured targets for its request; an unreadable one is ignored and counted.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{client, get, proxy, send, Script, ScriptedUpstream};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokentap::aggregate::Window;
use tokentap::app::serve::ProxyServer;
use tokentap::matrix::{DecodeCell, MatrixDoc};
use tokentap::meter::record::SloVerdict;
use tokentap::meter::record::{Outcome, RequestRecord};
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokentap::sweep::{SweepRequest, SweepState};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const CONTEXT: u64 = 8192;
const TOKENS: u64 = 40;
/// Targets no request can meet (the simulator's TBT is ~11 ms, its warm TTFT well over 1 ms).
const TIGHT: &str = "ttft = \"1ms\"\ntbt = \"1ms\"\n";
const LOOSE_HEADER: &str = "ttft=10m,tbt=10s,e2e=10m";

fn completion(url: &str, slo_header: Option<&str>) -> http::Request<Full<Bytes>> {
    let prompt: Vec<u64> = (0..CONTEXT).map(|i| 1000 + (i * 7919) % 50_000).collect();
    let body = json!({
        "model": "step3p7",
        "prompt": prompt,
        "max_tokens": TOKENS,
        "ignore_eos": true,
        "stream": true,
    });
    let mut request = http::Request::post(url).header("content-type", "application/json");
    if let Some(value) = slo_header {
        request = request.header("x-tokentap-slo", value);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Two streams at once, each read to its end.
async fn two_streams(url: &str, slo_header: Option<&'static str>) {
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let request = completion(url, slo_header);
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

/// The production cells with SLO figures.
fn slo_cells(doc: &MatrixDoc) -> Vec<&DecodeCell> {
    doc.decode
        .iter()
        .filter(|c| c.slo_attainment.is_some())
        .collect()
}

fn verdicts(records: &[Arc<RequestRecord>]) -> Vec<SloVerdict> {
    records.iter().map(|r| r.slo.verdict).collect()
}

async fn metrics(server: &ProxyServer) -> String {
    get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text()
}

/// The sum of every sample of `name` whose line contains `filter`.
fn sum_of(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A short sweep (8K × 2, 2 s) through the proxy, with its own SLO targets if `slo` is set
/// (`tokentap sweep --slo`); its one decode cell.
async fn sweep_cell(server: &ProxyServer, slo: Option<&str>) -> DecodeCell {
    let mut plan = json!({
        "contexts": [CONTEXT],
        "concurrency": [2],
        "cell_duration": "2s",
    });
    if let Some(slo) = slo {
        plan["slo"] = json!(slo);
    }
    let plan: SweepRequest = serde_json::from_value(plan).unwrap();
    let status = common::run_sweep(server, plan, Duration::from_secs(120)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let matrix = status.matrix.unwrap();
    matrix.cell(CONTEXT, 2).cloned().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tight_targets_give_no_attainment_and_no_goodput_and_a_header_overrides_them() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    let (server, records) = proxy(&sim.base_url(), &format!("[slo]\n{TIGHT}")).await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);

    two_streams(&url, None).await;
    let tight = records.wait_for(2).await;
    assert_eq!(verdicts(&tight), [SloVerdict::Missed; 2], "{tight:#?}");
    let doc = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let md = tokentap::matrix::render_markdown(&doc);
    assert!(md.contains("| SLO attainment | Goodput tok/s |"), "{md}");
    let cells = slo_cells(&doc);
    assert!(!cells.is_empty(), "{md}");
    for cell in cells {
        assert_eq!(cell.slo_attainment, Some(0.0), "{md}");
        assert_eq!(cell.goodput_tok_s, Some(0.0), "{md}");
    }

    // The same model, loose targets from the header: met, for those requests only.
    two_streams(&url, Some(LOOSE_HEADER)).await;
    let with_header = records.wait_for(4).await;
    assert_eq!(
        verdicts(&with_header[2..]),
        [SloVerdict::Met; 2],
        "{with_header:#?}"
    );
    assert!(with_header.iter().all(|r| !r.slo.header_invalid));
    // An unreadable header is ignored (the configured targets apply) and counted; the request
    // itself goes through.
    two_streams(&url, Some("ttft=soon")).await;
    let with_bad = records.wait_for(6).await;
    assert_eq!(verdicts(&with_bad[4..]), [SloVerdict::Missed; 2]);
    assert!(with_bad[4..].iter().all(|r| r.slo.header_invalid));
    for r in &with_bad {
        assert_eq!(r.outcome, Outcome::Ok);
    }

    let text = metrics(&server).await;
    let source = "source=\"production\"";
    assert_eq!(
        sum_of(&text, "tokentap_slo_requests_total", "slo=\"missed\"") as u64,
        4,
        "{text}"
    );
    assert_eq!(
        sum_of(&text, "tokentap_slo_requests_total", "slo=\"met\"") as u64,
        2,
        "{text}"
    );
    // Goodput tokens: the two header-met requests' tokens, exactly.
    let met_tokens: u64 = with_bad
        .iter()
        .filter(|r| r.slo.verdict == SloVerdict::Met)
        .map(|r| r.tokens.completion)
        .sum();
    assert_eq!(met_tokens, 2 * TOKENS);
    assert_eq!(
        sum_of(&text, "tokentap_slo_goodput_tokens_total", source) as u64,
        met_tokens,
        "{text}"
    );
    assert_eq!(
        sum_of(&text, "tokentap_slo_header_invalid_total", source) as u64,
        2,
        "{text}"
    );

    // The sweep's cell, measured by the same proxy (same configured targets): none met.
    let cell = sweep_cell(&server, None).await;
    eprintln!("tight sweep cell: {cell:?}");
    assert_eq!(cell.slo_attainment, Some(0.0), "{cell:?}");
    assert_eq!(cell.goodput_tok_s, Some(0.0), "{cell:?}");
    // A sweep with its own targets (sent as the header) is judged by them instead.
    let cell = sweep_cell(&server, Some(LOOSE_HEADER)).await;
    eprintln!("sweep cell with loose targets of its own: {cell:?}");
    assert_eq!(cell.slo_attainment, Some(1.0), "{cell:?}");
    assert_eq!(cell.goodput_tok_s, cell.total_tok_s, "{cell:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_targets_give_full_attainment_and_goodput_equal_to_total() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    // Tight by default, loose for this model: the model's table replaces the default.
    let config = format!(
        "[slo]\n{TIGHT}[slo.models.\"step3p7\"]\nttft = \"10m\"\ntbt = \"10s\"\ne2e = \"10m\"\n"
    );
    let (server, records) = proxy(&sim.base_url(), &config).await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    two_streams(&url, None).await;
    two_streams(&url, None).await;
    let all = records.wait_for(4).await;
    assert_eq!(verdicts(&all), [SloVerdict::Met; 4], "{all:#?}");

    let doc = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let md = tokentap::matrix::render_markdown(&doc);
    eprintln!("{md}");
    let cells = slo_cells(&doc);
    assert!(!cells.is_empty(), "{md}");
    for cell in cells {
        assert_eq!(cell.slo_attainment, Some(1.0), "{md}");
        let (goodput, total) = (cell.goodput_tok_s.unwrap(), cell.total_tok_s.unwrap());
        assert!((goodput / total - 1.0).abs() < 1e-9, "{md}");
    }
    // The JSON and HTML renderings carry the same figures.
    let json = tokentap::matrix::render_json(&doc);
    assert!(json.contains("\"slo_attainment\": 1.0"), "{json}");
    let html = tokentap::matrix::html::render_html(&doc);
    assert!(
        html.contains("SLO attainment") && html.contains("100.0%"),
        "{html}"
    );
    // The admin endpoint serves the same columns in every format.
    let admin = format!("http://{}/matrix", server.admin_addr);
    let md = get(&format!("{admin}?format=md")).await.text();
    assert!(md.contains("| SLO attainment | Goodput tok/s |"), "{md}");
    assert!(md.contains("| 100.0% |"), "{md}");
    let json = get(&format!("{admin}?format=json")).await.text();
    assert!(json.contains("\"slo_attainment\": 1.0"), "{json}");
    assert!(json.contains("\"goodput_tok_s\""), "{json}");
    let html = get(&format!("{admin}?format=html")).await.text();
    assert!(html.contains("SLO attainment"), "{html}");
    let csv = get(&format!("{admin}?format=csv")).await.text();
    assert!(csv.contains("slo_attainment,goodput_tok_s"), "{csv}");

    let text = metrics(&server).await;
    assert_eq!(
        sum_of(&text, "tokentap_slo_requests_total", "slo=\"met\"") as u64,
        4,
        "{text}"
    );
    assert_eq!(
        sum_of(&text, "tokentap_slo_goodput_tokens_total", "production") as u64,
        sum_of(&text, "tokentap_tokens_total", "type=\"completion\"") as u64,
        "{text}"
    );

    let cell = sweep_cell(&server, None).await;
    eprintln!("loose sweep cell: {cell:?}");
    assert_eq!(cell.slo_attainment, Some(1.0), "{cell:?}");
    assert_eq!(cell.goodput_tok_s, cell.total_tok_s, "{cell:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn the_header_is_forwarded_untouched_and_a_failed_request_misses() {
    let upstream = ScriptedUpstream::start(|r| {
        if r.body.windows(4).any(|w| w == b"fail") {
            Script::json(500, r#"{"error":"boom"}"#)
        } else {
            Script::json(
                200,
                r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            )
        }
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "[slo]\ne2e = \"10m\"\n").await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let request = |content: &str, slo: &str| {
        http::Request::post(&url)
            .header("content-type", "application/json")
            .header("x-tokentap-slo", slo)
            .body(Full::new(Bytes::from(format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"{content}"}}]}}"#
            ))))
            .unwrap()
    };
    assert_eq!(send(request("ok", "e2e=1m, ttft=30s")).await.status, 200);
    assert_eq!(send(request("fail", "e2e=1m")).await.status, 500);
    assert_eq!(send(request("ok", "ttft=never")).await.status, 200);
    let all = records.wait_for(3).await;
    assert_eq!(
        verdicts(&all),
        [SloVerdict::Met, SloVerdict::Missed, SloVerdict::Met]
    );
    assert_eq!(
        all.iter().map(|r| r.slo.header_invalid).collect::<Vec<_>>(),
        [false, false, true]
    );
    // Every header value reached the upstream exactly as the client sent it, bad one included.
    let sent: Vec<_> = upstream
        .requests()
        .iter()
        .map(|r| r.headers.get("x-tokentap-slo").cloned())
        .collect();
    assert_eq!(
        sent,
        ["e2e=1m, ttft=30s", "e2e=1m", "ttft=never"]
            .map(|v| Some(http::HeaderValue::from_static(v)))
    );
    server.shutdown().await;
}
