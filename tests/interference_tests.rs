//! Prefill interference (issue 13, point 1) on the simulator, through the real proxy.
//!
//! The simulator models sglang's chunked prefill: while a cold prompt is being prefilled no
//! decode step runs, so a stream whose decode overlaps other requests' prefill for a share *s*
//! of its decode interval gets about (1 − *s*) of the per-request tok/s it gets alone. The test
//! runs two warm 8K streams alone, then two more while cold 8K prompts arrive one after another,
//! and checks the measured share and the slowdown it predicts; then a short sweep, whose warm
//! cells show almost none.
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
use common::{get, proxy};
use http_body_util::Full;
use serde_json::json;
use tokentap::aggregate::Window;
use tokentap::meter::record::{Outcome, RequestRecord};
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokentap::sweep::{SweepRequest, SweepState};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const CONTEXT: u64 = 8192;
/// Output tokens of each steady stream (about 4.5 s at the profile's 87.7 tok/s for two).
const STREAM_TOKENS: u64 = 400;

/// A token-id prompt of exactly `len` tokens; a different `salt` is a different (cold) prompt.
fn prompt(len: u64, salt: u64) -> Vec<u64> {
    (0..len)
        .map(|i| 1000 + (i * 7919 + salt * 104_729 + len) % 50_000)
        .collect()
}

fn completion(url: &str, salt: u64, max_tokens: u64) -> http::Request<Full<Bytes>> {
    let body = json!({
        "model": "step3p7",
        "prompt": prompt(CONTEXT, salt),
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    });
    http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Two streams of `STREAM_TOKENS` on the warm prompt, run to their end.
async fn two_streams(url: &str) {
    let a = tokio::spawn(common::exchange(completion(url, 0, STREAM_TOKENS)));
    let b = tokio::spawn(common::exchange(completion(url, 0, STREAM_TOKENS)));
    a.await.unwrap();
    b.await.unwrap();
}

/// The steady streams' records among `records`: theirs are the long ones.
fn streams(records: &[Arc<RequestRecord>]) -> Vec<Arc<RequestRecord>> {
    records
        .iter()
        .filter(|r| r.tokens.completion == STREAM_TOKENS)
        .cloned()
        .collect()
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    assert!(!values.is_empty());
    values.iter().sum::<f64>() / values.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_request_speed_falls_with_prefill_interference_as_chunked_prefill_predicts() {
    let _cores = common::cores::for_timing().await;
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    let (server, records) = proxy(&sim.base_url(), "").await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    // Warm the streams' prompt straight at the simulator, as a sweep's scout does.
    common::exchange(completion(
        &format!("{}/v1/completions", sim.base_url()),
        0,
        1,
    ))
    .await;

    // Quiet: two warm streams alone.
    two_streams(&url).await;
    let quiet = streams(&records.wait_for(2).await);
    assert_eq!(quiet.len(), 2);

    // Mixed: two warm streams while cold 8K prompts arrive one after another, each answering
    // with one token (so it only prefills: the batch stays at two).
    let before = records.len();
    let mixed_streams = tokio::spawn({
        let url = url.clone();
        async move { two_streams(&url).await }
    });
    let mut cold = 0u64;
    while !mixed_streams.is_finished() {
        cold += 1;
        common::exchange(completion(&url, cold, 1)).await;
        // Pacing of the arrival pattern (not synchronisation): about one cold prompt per 1.1 s.
        tokio::time::sleep(Duration::from_millis(550)).await;
    }
    mixed_streams.await.unwrap();
    let all = records.wait_for(before + 2 + cold as usize).await;
    let mixed = streams(&all[before..]);
    assert_eq!(mixed.len(), 2);
    assert!(
        cold >= 3,
        "only {cold} cold prompts during the mixed streams"
    );

    for r in quiet.iter().chain(&mixed) {
        assert_eq!(r.outcome, Outcome::Ok);
    }
    let share = |rs: &[Arc<RequestRecord>]| {
        mean(
            rs.iter()
                .map(|r| r.interference.prefill_overlap_share.unwrap()),
        )
    };
    let speed = |rs: &[Arc<RequestRecord>]| mean(rs.iter().map(|r| r.tokens.per_second.unwrap()));
    let (quiet_share, mixed_share) = (share(&quiet), share(&mixed));
    let (quiet_speed, mixed_speed) = (speed(&quiet), speed(&mixed));
    let predicted = quiet_speed * (1.0 - mixed_share);
    eprintln!(
        "quiet: share {quiet_share:.3}, {quiet_speed:.1} tok/s; mixed ({cold} cold prompts): share {mixed_share:.3}, {mixed_speed:.1} tok/s; predicted {predicted:.1} tok/s (ratio {:.3})",
        mixed_speed / predicted
    );
    for r in &mixed {
        eprintln!(
            "  stream: share {:.3}, overlapping prefills {:?}, {:.1} tok/s",
            r.interference.prefill_overlap_share.unwrap(),
            r.interference.overlapping_prefills,
            r.tokens.per_second.unwrap()
        );
    }
    // Alone, the two streams overlap only each other's short cache-hit prefill at the start.
    assert!(quiet_share < 0.1, "quiet share {quiet_share}");
    // With a cold prefill (~0.55 s at 15K tok/s) about every 1.1 s, about half the decode stalls.
    assert!(mixed_share > 0.25, "mixed share {mixed_share}");
    assert!(
        mixed_speed < 0.8 * quiet_speed,
        "{mixed_speed} vs {quiet_speed}"
    );
    // The slowdown is what the share predicts, within 10 %.
    assert!(
        (mixed_speed / predicted - 1.0).abs() <= 0.10,
        "mixed {mixed_speed} tok/s, predicted {predicted} tok/s from share {mixed_share}"
    );
    // Each mixed stream overlapped several of the cold prefills, and counts them.
    for r in &mixed {
        assert!(r.interference.overlapping_prefills.unwrap() >= 2, "{r:?}");
    }

    // The production matrix carries the figures per cell, and Prometheus per cell too.
    let production = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let md = tokentap::matrix::render_markdown(&production);
    eprintln!("{md}");
    let decoding: Vec<_> = production
        .decode
        .iter()
        .filter(|c| c.context_tokens == CONTEXT && c.prefill_overlap_share.is_some())
        .collect();
    assert!(!decoding.is_empty(), "{md}");
    assert!(
        decoding
            .iter()
            .any(|c| c.prefill_overlap_share.unwrap() > 0.1),
        "{md}"
    );
    assert!(
        md.contains("| Prefill overlap | Overlapping prefills |"),
        "{md}"
    );
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(
        metrics.contains("tokentap_prefill_overlap_ratio_bucket")
            && metrics.contains("tokentap_overlapping_prefills_sum")
            && metrics.contains("tokentap_prefill_busy_seconds_sum"),
        "{metrics}"
    );

    // A short sweep's warm cells: its streams start together on a cache-hit prompt and see
    // only each other's brief start.
    let plan: SweepRequest = serde_json::from_value(json!({
        "contexts": [CONTEXT],
        "concurrency": [1, 2],
        "cell_duration": "2s",
    }))
    .unwrap();
    let status = common::run_sweep(&server, plan, Duration::from_secs(120)).await;
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let synthetic = status.matrix.unwrap();
    for cell in &synthetic.decode {
        let share = cell.prefill_overlap_share.unwrap();
        eprintln!(
            "sweep {} × {}: prefill overlap {share:.4}, overlapping prefills {:?}",
            cell.context_tokens, cell.concurrency, cell.overlapping_prefills
        );
        assert!(share < 0.05, "sweep cell {cell:?}");
    }
    server.shutdown().await;
}
