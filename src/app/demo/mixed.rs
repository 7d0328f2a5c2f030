//! The demo's mixed phase: ordinary client traffic through the proxy, cold prompts of many
//! lengths at changing concurrency, measured by the phase's own aggregator.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::http;
use super::phase::{wait_until_idle, Phase};
use super::start::Demo;
use crate::matrix::MatrixDoc;
use crate::sweep::progress::ProgressLine;
use crate::synthetic::prompt::{filler_text, mix};

/// What the mixed phase measured, and how its requests went.
pub struct MixedOutcome {
    pub matrix: Option<MatrixDoc>,
    pub burst: BurstSummary,
}

/// Step 3/4: `requests` ordinary requests through the proxy ([`burst`]).
pub async fn mixed(demo: &Demo, model: &str, requests: usize) -> MixedOutcome {
    let server = &demo.server;
    eprintln!();
    eprintln!(
        "3/4 Mixed traffic: {} ordinary requests through http://{} (chat and completions, cold prompts of 1.5K–24K tokens, concurrency 1 → 8)",
        requests, server.proxy_addr
    );
    let phase = Phase::begin(server);
    let mut progress = ProgressLine::new(true);
    let burst = burst(server.proxy_addr, model, requests, &mut progress).await;
    progress.done();
    wait_until_idle(&server.proxy.meter).await;
    let matrix = phase.end(model);
    eprintln!(
        "    {} answered 200, {} failed, in {:.1} s",
        burst.ok,
        burst.failed,
        burst.elapsed.as_secs_f64()
    );
    MixedOutcome { matrix, burst }
}

/// How the burst went.
#[derive(Debug, Default)]
pub struct BurstSummary {
    pub ok: usize,
    pub failed: usize,
    pub elapsed: Duration,
}

/// Ordinary client traffic: four phases at concurrency 1, 2, 4 and 8; chat and completions,
/// streaming, cold prompts of about 1.5K to 24K tokens (the simulator counts 4 bytes a token),
/// 32 to 128 output tokens. All stream: the proxy sees a non-streaming response's first token
/// only at its end, so it would count as one long prefill in everyone's interference figure.
/// `progress` shows the requests answered so far (one live line on a terminal).
pub async fn burst(
    proxy: SocketAddr,
    model: &str,
    requests: usize,
    progress: &mut ProgressLine,
) -> BurstSummary {
    let began = Instant::now();
    let client = http::client();
    let mut summary = BurstSummary::default();
    let phases = [1usize, 2, 4, 8];
    let per_phase = requests.div_ceil(phases.len()).max(1);
    let mut sent = 0usize;
    for concurrency in phases {
        let mut running = JoinSet::new();
        let phase_end = (sent + per_phase).min(requests);
        while sent < phase_end || !running.is_empty() {
            while sent < phase_end && running.len() < concurrency {
                let index = sent;
                sent += 1;
                let client = client.clone();
                let body = burst_body(model, index);
                let path = if index % 2 == 0 {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                let uri = format!("http://{proxy}{path}");
                running.spawn(async move {
                    match http::post_json(&uri, body) {
                        Some(request) => {
                            http::succeeds(&client, request, Duration::from_secs(120)).await
                        }
                        None => false,
                    }
                });
            }
            match running.join_next().await {
                Some(Ok(true)) => summary.ok += 1,
                Some(_) => summary.failed += 1,
                None => {}
            }
            let answered = summary.ok + summary.failed;
            progress.message(
                // The part before " · elapsed" names the phase: plain output prints one line
                // per concurrency level, a terminal redraws the count.
                &format!(
                    "mixed: up to {concurrency} at once · elapsed {:.0} s, {answered} of {requests} answered",
                    began.elapsed().as_secs_f64()
                ),
                Some((answered, requests)),
            );
        }
    }
    summary.elapsed = began.elapsed();
    summary
}

fn burst_body(model: &str, index: usize) -> String {
    const SIZES: [usize; 5] = [1_500, 3_000, 6_000, 12_000, 24_000];
    const OUTPUTS: [u64; 3] = [32, 64, 128];
    let pick = mix(index as u64);
    let tokens = SIZES.get((pick % 5) as usize).copied().unwrap_or(1_500);
    let max_tokens = OUTPUTS.get((pick >> 8) as usize % 3).copied().unwrap_or(64);
    let text = filler_text(&format!("demo-user-{index}"), tokens as u64, tokens * 4);
    let text = serde_json::Value::String(text);
    let model = serde_json::Value::String(model.to_owned());
    if index % 2 == 0 {
        format!(
            "{{\"model\":{model},\"messages\":[{{\"role\":\"user\",\"content\":{text}}}],\"max_tokens\":{max_tokens},\"stream\":true}}"
        )
    } else {
        format!(
            "{{\"model\":{model},\"prompt\":{text},\"max_tokens\":{max_tokens},\"stream\":true}}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_bodies_are_json() {
        for index in 0..8 {
            let body = burst_body("m", index);
            let value: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(value["model"], "m");
            assert!(value["max_tokens"].as_u64().unwrap() >= 32);
        }
    }
}
