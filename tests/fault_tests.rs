//! The fault suite: every way an upstream or a client can misbehave, produced for real on
//! loopback sockets against the real proxy (in process, or the built binary when the fault
//! needs its own process: descriptor limits, memory, start-up logs). Each test asserts that
//! the client receives exactly what the upstream sent up to the fault, that the outcome and
//! fault counter are the right ones, and that the proxy keeps serving other requests.
//!
//! Timing: limits are set short (hundreds of milliseconds to a second) and every wait is
//! bounded with generous slack; no assertion depends on the machine being fast.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use tokentap::app::serve::ProxyServer;
use tokentap::base::Route;
use tokentap::base::Source;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::record::Outcome;
use tokentap::meter::RecordSink;
use tokentap::meter::Usage;
use tokentap::meter::{Meter, RequestLabels, MAX_TOKENS_PER_REQUEST};
use tokentap::net::faults::Fault;
use tokentap::telemetry::prometheus::{PrometheusMetrics, MAX_SAMPLES_PER_FLUSH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A streaming chat request that asks for usage itself, so nothing is injected and the client
/// must receive the upstream's bytes exactly.
const CHAT_WITH_USAGE: &str = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}"#;

fn chunk(text: &str, completion: &str) -> Step {
    data(&format!(
        r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":{completion}}}}}"#
    ))
}

fn done() -> Step {
    Step::Send(Bytes::from_static(b"data: [DONE]\n\n"))
}

/// A proxy in front of `upstream` with `proxy`/`upstream` TOML lines added to those sections.
async fn proxy_with(
    upstream: &str,
    proxy_keys: &str,
    upstream_keys: &str,
) -> (ProxyServer, Arc<Records>) {
    // `sends_usage_unasked = "no"`, `metrics_interval = "0"`, a `default_model`: no background
    // `/server_info` or `/v1/models` questions or `/metrics` scrapes in the upstream's request
    // log, which several faults count.
    proxy_from_config(&format!(
        "[proxy]\n{proxy_keys}\n[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n{upstream_keys}\n[store]\ndata_dir = \"\"\n"
    ))
    .await
}

/// The value of the first sample line of `metrics` that starts with `prefix` and contains
/// every one of `labels`.
fn sample(metrics: &str, prefix: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix) && labels.iter().all(|l| line.contains(l)))
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// A plain request that must work whatever faults came before.
async fn still_serves(server: &ProxyServer) {
    let response = get(&format!("http://{}/v1/models", server.proxy_addr)).await;
    assert_eq!(response.status, 200, "the proxy stopped serving");
}

/// An upstream answering /v1/models with JSON and everything else by `handler`.
async fn upstream_with(
    handler: impl Fn(&Received) -> Script + Send + Sync + 'static,
) -> ScriptedUpstream {
    ScriptedUpstream::start(move |r| {
        if r.path == "/v1/models" {
            Script::json(200, r#"{"data":[]}"#)
        } else {
            handler(r)
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------
// 1. Absurd usage numbers.

#[tokio::test]
async fn a_u64_max_usage_jump_is_clamped_flagged_and_costs_microseconds() {
    // Measured directly: one event whose count jumps to u64::MAX, through the meter and the
    // Prometheus sink, is bounded work (before: a loop of 2^64 histogram samples).
    let meter = Meter::new(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    );
    let metrics = PrometheusMetrics::new(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    )
    .unwrap();
    meter.add_sink(metrics.clone() as Arc<dyn RecordSink>);
    let labels = RequestLabels {
        route: Route::ChatCompletions,
        source: Source::Production,
        model: Arc::from("m"),
        upstream: Arc::from("u"),
        tag: None,
    };
    // One request whose last event jumps by `jump` tokens; returns what it cost.
    let request = |jump: u64| {
        let mut request = meter.begin(labels.clone(), Instant::now());
        let started = Instant::now();
        request.token_event(Instant::now(), 1);
        request.token_event(Instant::now() + Duration::from_millis(5), jump);
        let total = jump.saturating_add(1);
        let usage = Usage {
            prompt_tokens: Some(total),
            completion_tokens: Some(total),
            cached_tokens: Some(0),
        };
        request.finish(Outcome::Ok, usage, total, true);
        started.elapsed()
    };
    request(1); // registers the metric handles of this label set
    let plain = request(1);
    let cost = request(u64::MAX);
    eprintln!(
        "figure: a u64::MAX usage jump (event + record + Prometheus flush) cost {cost:?}; a 2-token request {plain:?}"
    );
    assert!(cost < Duration::from_secs(1), "{cost:?}");
    assert_eq!(meter.clamped_counts(), 1, "one request, flagged once");
    let text = metrics.render();
    let itl = sample(&text, "tokentap_inter_token_latency_seconds_count", &[]).unwrap();
    assert!(itl <= MAX_SAMPLES_PER_FLUSH as f64, "{itl}");

    // End to end: the client receives the upstream's bytes exactly; the record is clamped.
    let script = Script::sse(vec![
        chunk("a", "1"),
        chunk("b", "18446744073709551615"),
        data(
            r#"{"choices":[],"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615}}"#,
        ),
        done(),
    ]);
    let sent = script.bytes();
    let upstream = upstream_with(move |_| script.clone()).await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let started = Instant::now();
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT_WITH_USAGE,
    )
    .await;
    eprintln!(
        "figure: the whole request with a u64::MAX jump took {:?}",
        started.elapsed()
    );
    assert_eq!(response.bytes(), sent);
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::Ok);
    assert_eq!(record.completion_tokens, MAX_TOKENS_PER_REQUEST);
    assert_eq!(record.prompt_tokens, Some(MAX_TOKENS_PER_REQUEST));
    assert!(!record.completion_exact, "a clamped count is approximate");
    assert_eq!(server.proxy.meter.clamped_counts(), 1);
    let text = server.metrics.render();
    assert_eq!(
        sample(&text, "tokentap_clamped_token_counts_total", &[]),
        Some(1.0),
        "{text}"
    );
    still_serves(&server).await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 2. Silent connections, slowloris, oversized heads.

/// Reads until the peer closes (EOF or error); `None` if it is still open at `deadline`.
async fn closed_by(mut socket: TcpStream, deadline: Instant) -> Option<Instant> {
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => continue, // an HTTP/2 SETTINGS frame, a 408: keep reading
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_and_bare_http2_prefaces_are_closed_at_the_header_timeout() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, _) = proxy_with(&upstream.url(), "header_read_timeout = \"1s\"", "").await;
    const SILENT: usize = 800;
    const PREFACES: usize = 200;
    const ADMIN: usize = 50;
    let opened = Instant::now();
    let mut sockets = Vec::new();
    for i in 0..SILENT + PREFACES {
        let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
        if i >= SILENT {
            socket
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap();
        }
        sockets.push(socket);
    }
    // The admin listener has the same deadline.
    for _ in 0..ADMIN {
        sockets.push(TcpStream::connect(server.admin_addr).await.unwrap());
    }
    // They do not keep anyone else out.
    still_serves(&server).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let waits: Vec<_> = sockets
        .into_iter()
        .map(|socket| tokio::spawn(closed_by(socket, deadline)))
        .collect();
    let mut last = opened;
    for wait in waits {
        let closed = wait
            .await
            .unwrap()
            .expect("a silent socket is still open after 10 s");
        last = last.max(closed);
    }
    eprintln!(
        "figure: {} silent sockets (incl. {PREFACES} bare HTTP/2 prefaces, {ADMIN} on the admin listener) all closed {:?} after the first was opened (header timeout 1 s)",
        SILENT + PREFACES + ADMIN,
        last - opened
    );
    assert_eq!(
        server.proxy.faults.get(Fault::HeaderTimeout),
        (SILENT + PREFACES) as u64
    );
    let text = server.metrics.render();
    assert_eq!(
        sample(
            &text,
            "tokentap_faults_total",
            &["listener=\"proxy\"", "fault=\"header_timeout\""]
        ),
        Some((SILENT + PREFACES) as f64),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "tokentap_faults_total",
            &["listener=\"admin\"", "fault=\"header_timeout\""]
        ),
        Some(ADMIN as f64),
        "{text}"
    );
    still_serves(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn slowloris_heads_are_cut_and_oversized_heads_refused() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, _) = proxy_with(&upstream.url(), "header_read_timeout = \"1s\"", "").await;
    // One header byte every 100 ms: never finishes within the timeout.
    let mut slow = TcpStream::connect(server.proxy_addr).await.unwrap();
    slow.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let mut cut = None;
    for _ in 0..100 {
        if slow.write_all(b"x").await.is_err() {
            cut = Some(start.elapsed());
            break;
        }
        let mut buffer = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), slow.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = Some(start.elapsed());
                break;
            }
            // hyper answers 408 before closing: read on until the close.
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    let cut = cut.expect("a slowloris head was never cut (10 s)");
    eprintln!("figure: slowloris head cut after {cut:?} (header timeout 1 s)");

    let huge = format!(
        "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let mut big = TcpStream::connect(server.proxy_addr).await.unwrap();
    let _ = big.write_all(huge.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), big.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    still_serves(&server).await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 3. Stalled request bodies, stalled upstreams, slow response heads.

/// Sends a request head announcing `length` body bytes and `sent` of them, then reads the
/// answer (bounded); returns the status line and when it came.
async fn stalled_body(
    addr: SocketAddr,
    path: &str,
    length: usize,
    sent: &[u8],
) -> (String, Duration) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(sent).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), socket.read(&mut answer))
        .await
        .expect("no answer to a stalled body within 20 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    (text, start.elapsed())
}

#[tokio::test]
async fn stalled_request_bodies_end_at_their_timeouts_with_a_408() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, records) = proxy_with(
        &upstream.url(),
        "body_idle_timeout = \"500ms\"\nbody_read_timeout = \"2s\"",
        "",
    )
    .await;
    // A metered body that stops after 10 of 100 bytes: the idle gap ends it.
    let (answer, after) = stalled_body(
        server.proxy_addr,
        "/v1/chat/completions",
        100,
        br#"{"model":"#,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_body_timeout"), "{answer}");
    eprintln!("figure: stalled metered body answered 408 after {after:?} (idle timeout 500 ms)");

    // A metered body trickling a byte every 200 ms: under the idle gap, over the total.
    let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
    let start = Instant::now();
    socket
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{",
        )
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = loop {
        match tokio::time::timeout(Duration::from_millis(200), socket.read(&mut answer)).await {
            Ok(result) => break result.unwrap(),
            Err(_) => {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "no 408 within 20 s"
                );
                let _ = socket.write_all(b" ").await;
            }
        }
    };
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    eprintln!(
        "figure: trickled metered body answered 408 after {:?} (total timeout 2 s)",
        start.elapsed()
    );

    // An unmetered body streamed to the upstream stalls: the client still gets a 408.
    let (answer, _) = stalled_body(server.proxy_addr, "/upload", 100, b"0123456789").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    assert_eq!(server.proxy.faults.get(Fault::BodyIdleTimeout), 2);
    assert_eq!(server.proxy.faults.get(Fault::BodyReadTimeout), 1);
    assert_eq!(
        upstream
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/v1/chat"))
            .count(),
        0,
        "a body that never arrived is not forwarded"
    );
    assert_eq!(records.len(), 0, "no metered request began");
    still_serves(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_stalled_upstream_ends_the_stream_as_upstream_stalled() {
    let upstream = upstream_with(|_| {
        let mut script = Script::sse(vec![chunk("a", "1"), chunk("b", "2")]);
        script.end = End::Hang;
        script
    })
    .await;
    let (server, records) =
        proxy_with(&upstream.url(), "", "stream_idle_timeout = \"500ms\"").await;
    let start = Instant::now();
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT_WITH_USAGE,
    )
    .await;
    eprintln!(
        "figure: stalled upstream stream ended after {:?} (idle timeout 500 ms)",
        start.elapsed()
    );
    let expected = Script::sse(vec![chunk("a", "1"), chunk("b", "2")]).bytes();
    assert_eq!(response.bytes(), expected, "exactly what the upstream sent");
    assert!(
        response.error.is_some(),
        "the client must see the stream break off"
    );
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::UpstreamStalled);
    assert_eq!(record.completion_tokens, 2);
    assert_eq!(server.proxy.faults.get(Fault::UpstreamStalled), 1);
    let text = server.metrics.render();
    assert_eq!(
        sample(
            &text,
            "tokentap_requests_total",
            &["outcome=\"upstream_stalled\""]
        ),
        Some(1.0),
        "{text}"
    );
    let hung = upstream.requests().into_iter().last().unwrap();
    for _ in 0..200 {
        if hung.disconnected.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        hung.disconnected.lock().unwrap().is_some(),
        "the upstream request was not cancelled"
    );
    still_serves(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn an_upstream_without_a_response_head_is_a_504() {
    let upstream = upstream_with(|_| {
        let mut script = Script::sse(vec![chunk("a", "1"), done()]);
        script.head_delay = Duration::from_secs(30);
        script
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "response_timeout = \"300ms\"").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT_WITH_USAGE,
    )
    .await;
    assert_eq!(response.status, 504);
    assert!(
        response.text().contains("upstream_timeout"),
        "{}",
        response.text()
    );
    assert_eq!(records.wait_for(1).await[0].outcome, Outcome::Timeout);
    assert_eq!(server.proxy.faults.get(Fault::UpstreamTimeout), 1);
    still_serves(&server).await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 4. The faults of the first rounds: reset, 5xx, malformed events, missing [DONE], a
//    truncated chunked body, a client hang-up.

#[tokio::test]
async fn upstream_faults_reach_the_client_as_sent_and_are_recorded() {
    let script_for = |case: &str| {
        let mut script = Script::sse(vec![chunk("a", "1"), chunk("b", "2")]);
        match case {
            "reset" => script.end = End::Reset,
            "no-done" => {}
            "malformed" => {
                script.steps.push(Step::Send(Bytes::from_static(
                    b"data: {not json\n\n: comment\n\nevent: x\ndata: \xff\xfe\n\n",
                )));
                script.steps.push(done());
            }
            "5xx" => {
                script = Script::json(503, r#"{"error":{"message":"overloaded"}}"#);
            }
            _ => script.steps.push(done()),
        }
        script
    };
    let upstream = upstream_with(move |r| {
        let case = r.path.split("case=").nth(1).unwrap_or("ok").to_string();
        script_for(&case)
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let cases = [
        ("ok", Outcome::Ok, false),
        ("reset", Outcome::UpstreamAborted, true),
        ("no-done", Outcome::UpstreamAborted, false),
        ("malformed", Outcome::Ok, false),
        ("5xx", Outcome::UpstreamError, false),
    ];
    for (n, (case, outcome, broken)) in cases.iter().enumerate() {
        let response = post(
            &format!(
                "http://{}/v1/chat/completions?case={case}",
                server.proxy_addr
            ),
            CHAT_WITH_USAGE,
        )
        .await;
        assert_eq!(response.bytes(), script_for(case).bytes(), "{case}");
        assert_eq!(response.error.is_some(), *broken, "{case}");
        let records = records.wait_for(n + 1).await;
        assert_eq!(records[n].outcome, *outcome, "{case}");
    }
    still_serves(&server).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_truncated_chunked_body_is_an_upstream_abort() {
    // A raw upstream: a chunked event stream that breaks off inside a chunk.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n";
    let upstream = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buffer = [0u8; 4096];
            while !String::from_utf8_lossy(&head).contains("\r\n\r\n") {
                let n = socket.read(&mut buffer).await.unwrap();
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buffer[..n]);
            }
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n40\r\ndata: {{\"cho",
                event.len()
            );
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
        }
    });
    let (server, records) = proxy_with(&format!("http://{addr}"), "", "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT_WITH_USAGE,
    )
    .await;
    let received = response.text();
    assert!(received.starts_with(event), "{received}");
    assert!(
        format!("{event}data: {{\"cho").starts_with(&received),
        "only what the upstream sent: {received}"
    );
    assert!(
        response.error.is_some(),
        "the client must see the truncation"
    );
    assert_eq!(
        records.wait_for(1).await[0].outcome,
        Outcome::UpstreamAborted
    );
    upstream.abort();
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_hang_up_is_a_client_abort_and_cancels_the_upstream() {
    let upstream = upstream_with(|_| {
        let mut script = Script::sse(vec![chunk("a", "1")]);
        script.end = End::Hang;
        script
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
        .body(Full::new(Bytes::from(CHAT_WITH_USAGE)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut body = response.into_body();
    let _ = body.frame().await;
    drop(body);
    assert_eq!(records.wait_for(1).await[0].outcome, Outcome::ClientAborted);
    let hung = upstream.requests().into_iter().last().unwrap();
    for _ in 0..200 {
        if hung.disconnected.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hung.disconnected.lock().unwrap().is_some());
    still_serves(&server).await;
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 5. The connection limit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_limit_accepting_pauses_and_in_flight_requests_finish() {
    let script = Script::sse(vec![chunk("a", "1"), wait_ms(500), chunk("b", "2"), done()]);
    let expected = script.bytes();
    let upstream = upstream_with(move |_| script.clone()).await;
    let (server, _) = proxy_with(&upstream.url(), "max_connections = 2", "").await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    // Two streams fill the listener; `connection: close` frees each slot when it ends.
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let response = send(
                    http::Request::post(&url)
                        .header("connection", "close")
                        .body(Full::new(Bytes::from(CHAT_WITH_USAGE)))
                        .unwrap(),
                )
                .await;
                (response, Instant::now())
            })
        })
        .collect();
    // Wait until both are in flight, then knock a third time.
    for _ in 0..500 {
        if upstream.requests().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(upstream.requests().len(), 2);
    let models = format!("http://{}/v1/models", server.proxy_addr);
    let third = tokio::spawn(async move {
        let response = get(&models).await;
        (response, Instant::now())
    });
    let mut first_end = None;
    for stream in streams {
        let (response, ended) = stream.await.unwrap();
        assert_eq!(
            response.bytes(),
            expected,
            "an in-flight stream was disturbed"
        );
        assert!(response.error.is_none());
        first_end = Some(first_end.map_or(ended, |e: Instant| e.min(ended)));
    }
    let (response, answered) = third.await.unwrap();
    assert_eq!(response.status, 200);
    assert!(
        answered >= first_end.unwrap(),
        "the third connection was served before a slot was free"
    );
    assert!(server.proxy.faults.get(Fault::ConnectionLimit) >= 1);
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 6. One reading of JSON.

#[tokio::test]
async fn duplicate_keys_follow_the_server_and_usage_the_client_asked_for_is_kept() {
    // The scripted upstream reads JSON like Python (serde_json's Value: the last key wins).
    let upstream = upstream_with(|r| {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let options = &body["stream_options"];
        let mut steps = vec![chunk("a", "1")];
        if options["include_usage"] == true {
            steps.push(data(
                r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#,
            ));
        }
        steps.push(done());
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for body in [
        r#"{"model":"m","stream":true,"stream_options":{},"stream_options":{"include_usage":true},"messages":[]}"#,
        r#"{"model":"m","stream":true,"stream\u005foptions":{"include\u005fusage":true},"messages":[]}"#,
    ] {
        let response = post(&url, body).await;
        assert!(
            response.text().contains(r#""choices":[],"usage""#),
            "the usage chunk the client asked for was stripped: {body}\n{}",
            response.text()
        );
    }
    let records = records.wait_for(2).await;
    assert!(records
        .iter()
        .all(|r| r.outcome == Outcome::Ok && r.completion_tokens == 1));
    server.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// 7. The built binary: credentials in URLs, descriptor exhaustion, memory under stalled bodies.

/// `tokentap serve` in its own process (optionally under a descriptor limit), its stderr
/// collected line by line.
struct Served {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn address_after(line: &str, key: &str) -> Option<SocketAddr> {
    let start = line.find(key)? + key.len();
    line[start..].split_whitespace().next()?.parse().ok()
}

impl Served {
    fn start(upstream: &str, config: &str, descriptor_limit: Option<u32>) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tokentap-fault-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokentap.toml");
        std::fs::write(&file, format!("[store]\ndata_dir = \"\"\n{config}")).unwrap();
        let binary = env!("CARGO_BIN_EXE_tokentap");
        let limit = descriptor_limit.map_or(String::new(), |n| format!("ulimit -n {n} && "));
        let script = format!(
            "{limit}exec \"$0\" serve --upstream \"$1\" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --config \"$2\""
        );
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(binary)
            .arg(upstream)
            .arg(&file)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                if line.contains("tokentap is forwarding") {
                    let _ = ready_tx.send(line.clone());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("tokentap did not start: {:?}", log.lock().unwrap()));
        let proxy = address_after(&ready, "proxy=").unwrap();
        let admin = address_after(&ready, "admin=").unwrap();
        Self {
            child,
            log,
            proxy,
            admin,
        }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Resident memory in bytes (Linux).
    fn rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[tokio::test]
async fn credentials_in_the_upstream_url_appear_nowhere() {
    // Port 9 on loopback: nothing listens, so every request is a 502 naming the upstream.
    let served = Served::start("http://user:secret@127.0.0.1:9", "", None);
    let response = post(
        &format!("http://{}/v1/chat/completions", served.proxy),
        CHAT_WITH_USAGE,
    )
    .await;
    assert_eq!(response.status, 502);
    assert!(
        response.text().contains("127.0.0.1:9"),
        "{}",
        response.text()
    );
    let metrics = get(&format!("http://{}/metrics", served.admin)).await;
    for (what, text) in [
        ("the 502 body", response.text()),
        ("/metrics", metrics.text()),
        ("the log", served.log().join("\n")),
    ] {
        assert!(
            !text.contains("secret"),
            "{what} leaks the password:\n{text}"
        );
        assert!(!text.contains("user:"), "{what} leaks the user:\n{text}");
    }
    assert!(
        served
            .log()
            .iter()
            .any(|l| l.contains("credentials in the upstream URL")),
        "the operator is told the credentials were removed"
    );
    // Config errors show the URL redacted too.
    let output = Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(["serve", "--upstream", "ftp://user:secret@host/?token=abc"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(message.contains("***@host"), "{message}");
    assert!(
        !message.contains("secret") && !message.contains("abc"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off_and_says_so_once() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let served = Served::start(
        &upstream.url(),
        "[proxy]\nheader_read_timeout = \"2s\"\n",
        Some(64),
    );
    // More silent sockets than the child has descriptors.
    let mut sockets = Vec::new();
    for _ in 0..150 {
        sockets.push(TcpStream::connect(served.proxy).await.unwrap());
    }
    // Let the accept loop hit EMFILE for a while.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(sockets);
    // Once the silent sockets are gone (closed by us, or by the header timeout), it serves.
    let url = format!("http://{}/v1/models", served.proxy);
    let start = Instant::now();
    let mut status = 0;
    while start.elapsed() < Duration::from_secs(20) {
        let request = http::Request::get(&url)
            .header("connection", "close")
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Ok(Ok(response)) =
            tokio::time::timeout(Duration::from_secs(5), client().request(request)).await
        {
            status = response.status().as_u16();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status,
        200,
        "the proxy never served again: {:?}",
        served.log()
    );
    let log = served.log();
    let warnings = log
        .iter()
        .filter(|l| l.contains("cannot accept connections"))
        .count();
    eprintln!("figure: under a 64-descriptor limit with 150 silent sockets, {warnings} back-off warning(s) were logged");
    assert!(warnings >= 1, "the back-off was never announced: {log:?}");
    assert!(
        warnings <= 5,
        "one warning per episode, not per failure: {log:?}"
    );
    let metrics = get(&format!("http://{}/metrics", served.admin))
        .await
        .text();
    let backoffs = sample(
        &metrics,
        "tokentap_faults_total",
        &["listener=\"proxy\"", "fault=\"accept_backoff\""],
    )
    .unwrap_or(0.0);
    assert!(backoffs >= 1.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_stalled_bodies_hold_bounded_memory_and_end_at_the_timeout() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let served = Served::start(
        &upstream.url(),
        "[proxy]\nbody_idle_timeout = \"2s\"\nbody_read_timeout = \"60s\"\n",
        None,
    );
    let idle_rss = served.rss().unwrap_or(0);
    // Each sends all but the last KiB of an 8 MiB metered body, then stops.
    const LENGTH: usize = 8 << 20;
    let payload = Arc::new(vec![b' '; LENGTH - 1024]);
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let payload = Arc::clone(&payload);
        let addr = served.proxy;
        tasks.push(tokio::spawn(async move {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {LENGTH}\r\n\r\n"
            );
            socket.write_all(head.as_bytes()).await.unwrap();
            socket.write_all(&payload).await.unwrap();
            let sent_at = Instant::now();
            let mut answer = vec![0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut answer))
                .await
                .expect("a stalled body was never answered")
                .unwrap();
            (
                String::from_utf8_lossy(&answer[..n]).into_owned(),
                sent_at.elapsed(),
            )
        }));
    }
    // Sample memory while the bodies sit stalled.
    let mut peak = idle_rss;
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_millis(1500) {
        peak = peak.max(served.rss().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut slowest = Duration::ZERO;
    for task in tasks {
        let (answer, after) = task.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        slowest = slowest.max(after);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_rss = served.rss().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "figure: 20 stalled 8 MiB bodies: RSS {:.0} MiB idle, {:.0} MiB peak while stalled, {:.0} MiB after the 408s (slowest answered {slowest:?} after its last byte; idle timeout 2 s)",
        mib(idle_rss),
        mib(peak),
        mib(after_rss)
    );
    // Bounded by 20 bodies' worth (plus allocator slack), and only until the timeout.
    assert!(peak < idle_rss + 2 * 20 * LENGTH as u64, "{}", mib(peak));
    let response = get(&format!("http://{}/v1/models", served.proxy)).await;
    assert_eq!(response.status, 200);
}
