//! Overload as the engine reports it (issue 44, point 4), on the simulator through the real
//! proxy: the simulator started with sglang's `--max-queued-requests` (and a running cap of
//! its `--max-running-requests`), traffic above what it admits and queues is refused with
//! sglang's 503; the proxy records those requests as `shed` (an SLO miss, counted in
//! `/metrics`, their cell marked `Shed` in the production matrix), while the requests the
//! engine admitted keep their SLO.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{client, get, proxy};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokentap::aggregate::Window;
use tokentap::matrix::CellStatus;
use tokentap::meter::record::{Outcome, SloVerdict};
use tokentap::sim::{Profile, QueueCaps, SimOptions, SimServer};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const CONTEXT: u64 = 8192;
/// Long enough (≈ 1.7 s of decode) that the admitted requests still run while the rest come.
const TOKENS: u64 = 150;
const LIMIT: Duration = Duration::from_secs(60);

fn completion(url: &str) -> http::Request<Full<Bytes>> {
    completion_with_priority(url, None)
}

/// The simulator's own gauge `name` (sglang's `/metrics`).
async fn sim_gauge(base: &str, name: &str) -> f64 {
    let page = get(&format!("{base}/metrics")).await.text();
    page.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of every sample of `name` whose line contains `filter`.
fn sum_of(metrics: &str, name: &str, filter: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_queue_cap_sheds_the_excess_and_the_admitted_keep_their_slo() {
    let mut profile = Profile::builtin(STEP).unwrap();
    profile.capacity.max_running_requests = 2;
    let options = SimOptions {
        queue_caps: QueueCaps {
            requests: Some(1),
            tokens: None,
            ..QueueCaps::default()
        },
        ..SimOptions::default()
    };
    let sim = SimServer::start(profile, options).await.unwrap();
    let base = sim.base_url();
    let (server, records) = proxy(&base, "[slo]\nttft = \"30s\"\ntbt = \"1s\"\n").await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);

    // Two run (the running cap), then one waits (the queue cap): each step waited for on the
    // simulator's own gauges, so the order is the one sent.
    let stream = |url: String| {
        tokio::spawn(async move {
            let response = client().request(completion(&url)).await.unwrap();
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        })
    };
    let running = [stream(url.clone()), stream(url.clone())];
    common::wait::until_async("two requests running", LIMIT, async || {
        sim_gauge(&base, "sglang:num_running_reqs").await >= 2.0
    })
    .await;
    let queued = stream(url.clone());
    common::wait::until_async("one request queued", LIMIT, async || {
        sim_gauge(&base, "sglang:num_queue_reqs").await >= 1.0
    })
    .await;
    // The queue is full: the next two are refused at once with sglang's answer.
    for _ in 0..2 {
        let response = client().request(completion(&url)).await.unwrap();
        assert_eq!(response.status(), 503);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("The request queue is full."), "{body}");
    }
    for task in running {
        assert_eq!(task.await.unwrap(), 200);
    }
    assert_eq!(queued.await.unwrap(), 200);

    let all = records.wait_for(5).await;
    let shed: Vec<_> = all.iter().filter(|r| r.outcome == Outcome::Shed).collect();
    let served: Vec<_> = all.iter().filter(|r| r.outcome == Outcome::Ok).collect();
    assert_eq!((shed.len(), served.len()), (2, 3), "{all:#?}");
    assert!(shed
        .iter()
        .all(|r| r.status == 503 && r.slo.verdict == SloVerdict::Missed));
    // The admitted requests, the queued one included, keep the SLO.
    assert!(
        served.iter().all(|r| r.slo.verdict == SloVerdict::Met),
        "{served:#?}"
    );

    // Counted per cell in production's Prometheus series.
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert_eq!(
        sum_of(&metrics, "tokentap_requests_total", "outcome=\"shed\"") as u64,
        2,
        "{metrics}"
    );
    assert_eq!(
        sum_of(&metrics, "tokentap_slo_requests_total", "slo=\"missed\"") as u64,
        2,
        "{metrics}"
    );

    // The production matrix marks the cell the shed requests belong to; the cells of the
    // admitted requests stay valid with full attainment.
    let doc = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let md = tokentap::matrix::render_markdown(&doc);
    let shed_cells: Vec<_> = doc
        .decode
        .iter()
        .filter(|c| matches!(c.status, CellStatus::Shed(_)))
        .collect();
    assert!(!shed_cells.is_empty(), "{md}");
    for cell in &shed_cells {
        assert_eq!(cell.slo_attainment, Some(0.0), "{md}");
    }
    assert!(md.contains("Shed: "), "{md}");
    for cell in doc.decode.iter().filter(|c| c.status.is_valid()) {
        if let Some(attainment) = cell.slo_attainment {
            assert_eq!(attainment, 1.0, "{md}");
        }
    }
    server.shutdown().await;
}

/// A streamed completion of `CONTEXT` token ids, with sglang's `priority` field when given.
fn completion_with_priority(url: &str, priority: Option<i64>) -> http::Request<Full<Bytes>> {
    let prompt: Vec<u64> = (0..CONTEXT).map(|i| 1000 + (i * 7919) % 50_000).collect();
    let mut body = json!({
        "model": "step3p7",
        "prompt": prompt,
        "max_tokens": TOKENS,
        "ignore_eos": true,
        "stream": true,
    });
    if let Some(priority) = priority {
        body["priority"] = json!(priority);
    }
    http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// sglang under `--enable-priority-scheduling` with `--max-queued-requests`: a preferred
/// request arriving at the full queue aborts the least-preferred waiting one ("The request is
/// aborted by a higher priority request.", a 503 before its status line), which the proxy
/// records as shed; the preferred one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_aborted_for_a_preferred_one_is_recorded_as_shed() {
    let mut profile = Profile::builtin(STEP).unwrap();
    profile.capacity.max_running_requests = 1;
    let options = SimOptions {
        priority_scheduling: true,
        queue_caps: QueueCaps {
            requests: Some(1),
            ..QueueCaps::default()
        },
        ..SimOptions::default()
    };
    let sim = SimServer::start(profile, options).await.unwrap();
    let base = sim.base_url();
    let (server, records) = proxy(&base, "").await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let stream = |request: http::Request<Full<Bytes>>| {
        tokio::spawn(async move {
            let response = client().request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        })
    };
    let running = stream(completion_with_priority(&url, Some(0)));
    common::wait::until_async("one request running", LIMIT, async || {
        sim_gauge(&base, "sglang:num_running_reqs").await >= 1.0
    })
    .await;
    let low = stream(completion_with_priority(&url, Some(1)));
    common::wait::until_async("one request queued", LIMIT, async || {
        sim_gauge(&base, "sglang:num_queue_reqs").await >= 1.0
    })
    .await;
    let high = stream(completion_with_priority(&url, Some(10)));
    let (status, body) = low.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("The request is aborted by a higher priority request."),
        "{body}"
    );
    for task in [running, high] {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
    let all = records.wait_for(3).await;
    let outcomes: Vec<Outcome> = all.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Shed).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Ok).count(),
        2,
        "{outcomes:?}"
    );
    server.shutdown().await;
    sim.shutdown().await;
}
