#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Replay fidelity (issue 14): steady traffic from an ordinary client through the proxy to the
//! simulator, captured (`[workload] capture = true`), exported from `/workload`, then replayed
//! open-loop against the same simulator through a fresh in-process proxy must reproduce the
//! production cells: per-request tok/s, TBT and TTFT within 5 %.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{client, get, proxy, NO_EVIDENCE_MINIMUM};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokentap::aggregate::Window;
use tokentap::config::ConfigLoader;
use tokentap::matrix::CellStatus;
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokentap::synthetic::ProxyPath;
use tokentap::workload::replay::{replay, ReplayPlan};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const CONTEXT: u64 = 8000;
const OUTPUT: u64 = 300;
/// The concurrency levels of the steady traffic, one after the other.
const LEVELS: [u32; 2] = [1, 4];

fn completion_body(len: u64) -> Bytes {
    let prompt: Vec<u64> = (0..len).map(|i| 1000 + (i * 7919 + len) % 50_000).collect();
    Bytes::from(
        json!({
            "model": "step3p7",
            "prompt": prompt,
            "max_tokens": OUTPUT,
            "ignore_eos": true,
            "stream": true,
        })
        .to_string(),
    )
}

/// `streams` completions sent together, each read to its end.
async fn run_streams(url: &str, streams: u32) {
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let request = http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(completion_body(CONTEXT)))
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let response = client().request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let body =
                tokio::time::timeout(Duration::from_secs(60), response.into_body().collect());
            body.await.expect("the stream ends in time").unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_trace_replayed_on_the_same_simulator_reproduces_the_production_cells() {
    let _cores = common::cores::for_timing().await;
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    // Two rounds per level: the figures themselves are under test, not their evidence.
    let (server, records) = proxy(
        &sim.base_url(),
        &format!("[workload]\ncapture = true\n{NO_EVIDENCE_MINIMUM}"),
    )
    .await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let mut expected = 0;
    for streams in LEVELS {
        // Twice per level: the first round's prompt is cold, the second's is a cache hit.
        for _ in 0..2 {
            run_streams(&url, streams).await;
            expected += streams as usize;
            // A pause between rounds. The client here is closed-loop (a round starts when the last
            // one ended, a millisecond later); the replay is open-loop at the recorded times, so
            // a round replayed a millisecond late would still be running when the next one
            // joins, and the simulator's cache-hit TTFT depends on the batch a request joins.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    records.wait_for(expected).await;
    let production = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .expect("production records");
    let response = get(&format!("http://{}/workload?window=1h", server.admin_addr)).await;
    assert_eq!(response.status, 200);
    let trace = tokentap::workload::read_trace(&response.text()).unwrap();
    assert_eq!(trace.requests.len(), expected);
    server.shutdown().await;

    let config = ConfigLoader::new()
        .text(
            &format!(
                "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\n[store]\ndata_dir = \"\"\n",
                sim.base_url()
            ),
            "test.toml",
        )
        .unwrap()
        .load()
        .unwrap();
    let replay_proxy = tokentap::app::proxy::build_proxy(&config).unwrap();
    let plan = ReplayPlan {
        speed: 1.0,
        max_requests: None,
        max_duration: Some(Duration::from_secs(120)),
        model: "step3p7".into(),
        slo_header: None,
        seed: 1,
        evidence: tokentap::matrix::EvidenceRule::NONE,
    };
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let report = replay(
        ProxyPath::shared(Arc::clone(&replay_proxy)),
        &trace,
        &plan,
        stop,
        |_| {},
    )
    .await;
    assert_eq!((report.sent, report.failed), (expected, 0), "{report:?}");
    assert!(!report.stopped);
    let replayed = report.matrix.expect("replay records");
    eprintln!(
        "production:\n{}\nreplay:\n{}",
        tokentap::matrix::render_markdown(&production),
        tokentap::matrix::render_markdown(&replayed)
    );
    for streams in LEVELS {
        let (want, got) = (
            common::decode_cell(&production, 8192, streams),
            common::decode_cell(&replayed, 8192, streams),
        );
        assert_eq!(want.status, CellStatus::Valid);
        assert_eq!(got.status, CellStatus::Valid, "8K × {streams}");
        for (column, got, want) in [
            (
                "per-request tok/s",
                got.per_request_tok_s,
                want.per_request_tok_s,
            ),
            ("TBT", got.tbt_ms, want.tbt_ms),
            // Meaningful here: the replay's prompts share blocks as the originals did, so the
            // same requests are cold (prefill) and warm (cache hit).
            ("TTFT", got.ttft_ms, want.ttft_ms),
        ] {
            let (got, want) = (got.unwrap(), want.unwrap());
            let ratio = got / want;
            eprintln!(
                "8K × {streams} {column}: replay {got:.2} / production {want:.2} = {ratio:.4}"
            );
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "8K × {streams} {column}: replay {got} vs production {want}"
            );
        }
    }
    sim.shutdown().await;
}
