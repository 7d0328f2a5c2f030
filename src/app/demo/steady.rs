//! The demo's steady phase: plain clients reproduce a few of the sweep's cells (same prompt
//! length, same number of streams, warm prompt), each cell after the simulator has gone idle.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::http;
use super::phase::{wait_until_idle, Phase};
use super::start::Demo;
use crate::base::engine::load_metric_names;
use crate::base::exposition::sum_of;
use crate::matrix::units::context_label;
use crate::matrix::MatrixDoc;
use crate::sweep::progress::ProgressLine;

/// What the steady phase measured, and how many of its cells had a failure.
pub struct SteadyOutcome {
    pub matrix: Option<MatrixDoc>,
    pub failures: usize,
}

/// Step 2/4: each of `cells` held for `hold` (`hold_text` as the user wrote it) through the
/// proxy, measured by the phase's own aggregator.
pub async fn steady(
    demo: &Demo,
    model: &str,
    cells: &[(u64, u32)],
    hold: Duration,
    hold_text: &str,
) -> SteadyOutcome {
    let (sim, server) = (&demo.sim, &demo.server);
    eprintln!();
    eprintln!(
        "2/4 Steady traffic through http://{}: plain clients hold the streams of {} sweep cells (same prompt length, same number of streams, warm prompt) for {}",
        server.proxy_addr,
        cells.len(),
        hold_text
    );
    let phase = Phase::begin(server);
    let mut failures = 0;
    let mut progress = ProgressLine::new(true);
    for (done, &(context, concurrency)) in cells.iter().enumerate() {
        progress.message(
            &format!(
                "steady: {} × {concurrency}, {} streams for {}",
                context_label(context),
                concurrency,
                hold_text
            ),
            Some((done, cells.len())),
        );
        wait_until_server_idle(&sim.base_url()).await;
        let (warm, failed) = steady_cell(
            &sim.base_url(),
            server.proxy_addr,
            model,
            context,
            concurrency,
            hold,
        )
        .await;
        if !warm || failed > 0 {
            failures += 1;
            progress.done();
            eprintln!(
                "    {} × {concurrency}: {}{failed} streams failed",
                context_label(context),
                if warm {
                    ""
                } else {
                    "warming the prompt failed; "
                }
            );
        }
        wait_until_idle(&server.proxy.meter).await;
    }
    progress.done();
    wait_until_server_idle(&sim.base_url()).await;
    SteadyOutcome {
        matrix: phase.end(model),
        failures,
    }
}

/// The sweep cells the steady phase reproduces: 8K × 1, 8K × 4 and 16K × 2 when the sweep has
/// them valid (the default sweep does), else its first three valid cells.
pub fn steady_cells(synthetic: &MatrixDoc) -> Vec<(u64, u32)> {
    let valid = |context: u64, concurrency: u32| {
        synthetic
            .cell(context, concurrency)
            .is_some_and(|cell| cell.status.is_valid() && cell.per_request_tok_s.is_some())
    };
    let preferred: Vec<(u64, u32)> = [(8192, 1), (8192, 4), (16384, 2)]
        .into_iter()
        .filter(|&(context, concurrency)| valid(context, concurrency))
        .collect();
    if !preferred.is_empty() {
        return preferred;
    }
    synthetic
        .decode
        .iter()
        .filter(|cell| valid(cell.context_tokens, cell.concurrency))
        .map(|cell| (cell.context_tokens, cell.concurrency))
        .take(3)
        .collect()
}

/// Waits (at most 10 s) until the simulator reports no running or queued request: the proxy
/// counts a stream out when its client goes away, the server a moment later, and a request it
/// still holds would count in the next cell's batch (as the sweep's drain barrier avoids).
pub(crate) async fn wait_until_server_idle(simulator: &str) {
    let client = http::client();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Some(request) = http::get(&format!("{simulator}/metrics")) else {
            return;
        };
        let Some((_, body)) = http::exchange(&client, request, Duration::from_secs(5)).await else {
            return;
        };
        let text = String::from_utf8_lossy(&body);
        let held: f64 = load_metric_names()
            .iter()
            .filter_map(|name| sum_of(&text, name))
            .sum();
        if held <= 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A token-id prompt of exactly `len` tokens: the same for every stream of a cell, so after
/// one warming request every stream hits the prompt cache, as the sweep's streams do.
fn steady_body(model: &str, len: u64, max_tokens: u64) -> String {
    let ids: Vec<String> = (0..len)
        .map(|i| (1000 + (i * 7919 + len) % 50_000).to_string())
        .collect();
    let model = serde_json::Value::String(model.to_owned());
    format!(
        "{{\"model\":{model},\"prompt\":[{}],\"max_tokens\":{max_tokens},\"ignore_eos\":true,\"stream\":true}}",
        ids.join(",")
    )
}

/// One steady cell: warms the prompt straight at the simulator (as the sweep's scout does, so
/// the warming request is not production traffic), then holds `concurrency` streams through the
/// proxy for `hold`, reading every byte, and goes away, as an application that cancels does.
/// Returns whether warming worked and how many streams failed.
async fn steady_cell(
    simulator: &str,
    proxy: SocketAddr,
    model: &str,
    context: u64,
    concurrency: u32,
    hold: Duration,
) -> (bool, usize) {
    let client = http::client();
    // Warmed straight at the simulator, as the sweep's scout does.
    let warmed = match http::post_json(
        &format!("{simulator}/v1/completions"),
        steady_body(model, context, 1),
    ) {
        Some(request) => http::succeeds(&client, request, Duration::from_secs(60)).await,
        None => false,
    };
    let mut streams = JoinSet::new();
    for _ in 0..concurrency {
        let Some(request) = http::post_json(
            &format!("http://{proxy}/v1/completions"),
            steady_body(model, context, 4096),
        ) else {
            continue;
        };
        let client = client.clone();
        streams.spawn(async move {
            let Ok(response) = client.request(request).await else {
                return false;
            };
            if !response.status().is_success() {
                return false;
            }
            let mut body = response.into_body();
            let deadline = Instant::now() + hold;
            while let Ok(Some(frame)) = tokio::time::timeout_at(deadline, body.frame()).await {
                if frame.is_err() {
                    return false;
                }
            }
            true
        });
    }
    let mut failed = concurrency as usize - streams.len();
    while let Some(outcome) = streams.join_next().await {
        if !matches!(outcome, Ok(true)) {
            failed += 1;
        }
    }
    (warmed, failed)
}
