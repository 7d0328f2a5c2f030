//! The fault suite: every way an upstream or a client can misbehave, produced for real on
//! loopback sockets against the real proxy (in process, or the built binary when the fault
//! needs its own process: descriptor limits, memory, start-up logs). Each test asserts that
//! the client receives exactly what the upstream sent up to the fault, that the outcome and
//! fault counter are the right ones, and that the proxy keeps serving other requests.
//!
//! Timing: limits are set short (hundreds of milliseconds to a second) and every wait is
//! bounded with generous slack; no assertion depends on the machine being fast.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

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
use tokentap::telemetry::prometheus::PrometheusMetrics;
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
    // `sends_usage_unasked = "no"`, `metrics_interval = "0"`, a `default_model`, no
    // fingerprint reads: no background `/server_info` or `/v1/models` questions or `/metrics`
    // scrapes in the upstream's request log, which several faults count.
    proxy_from_config(&format!(
        "[proxy]\n{proxy_keys}\n[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n{upstream_keys}\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n"
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
        asked_model: None,
        upstream: Arc::from("u"),
        tag: None,
        fingerprint: tokentap::meter::identity::FingerprintId::UNKNOWN,
        slice: Default::default(),
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
            reasoning_tokens: None,
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
    // Each token's gap counted once, the jump clamped: three requests' tokens at most.
    let most = 3.0 * (tokentap::meter::MAX_TOKENS_PER_EVENT as f64 + 2.0);
    assert!(itl >= 1.0 && itl <= most, "{itl}");

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
    assert_eq!(record.tokens.completion, MAX_TOKENS_PER_REQUEST);
    assert_eq!(record.tokens.prompt, Some(MAX_TOKENS_PER_REQUEST));
    assert!(
        !record.tokens.completion_exact,
        "a clamped count is approximate"
    );
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

/// The listener decides HTTP/1 or HTTP/2 by peeking at a connection's first bytes; a first
/// segment that cannot decide (a lone `P`, the start of both `POST` and the HTTP/2 preface)
/// is left to hyper-util's detection, and the request is still served.
#[tokio::test]
async fn a_request_whose_first_segment_is_one_byte_is_still_served() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, _) = proxy_with(&upstream.url(), "", "").await;
    for (first, rest) in [
        (
            "P",
            "OST /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        ),
        (
            "G",
            "ET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ),
    ] {
        let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
        socket.write_all(first.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        socket.write_all(rest.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
            .await
            .expect("no answer within 10 s")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{first}{rest} → {answer}"
        );
    }
    still_serves(&server).await;
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

/// `max_header_bytes` is exact, whether the listener also speaks HTTP/2 or not, and when the
/// whole head is already waiting in the socket (hyper's read-buffer limit alone, which is
/// all hyper-util's protocol detection exposes, let a 100 KiB head through a 64 KiB limit).
#[tokio::test]
async fn a_head_one_byte_over_max_header_bytes_is_refused_whole_or_in_pieces() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    for listener in [
        "max_header_bytes = 16384",
        "max_header_bytes = 16384\nhttp2 = false",
    ] {
        let (server, _) = proxy_with(&upstream.url(), listener, "").await;
        let head = |total: usize| {
            let start = "GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-pad: ";
            let pad = total - start.len() - 4;
            format!("{start}{}\r\n\r\n", "a".repeat(pad))
        };
        for (total, expected) in [
            (16384, "HTTP/1.1 200"),
            (16385, "HTTP/1.1 431"),
            (40_000, "HTTP/1.1 431"),
        ] {
            let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
            let _ = socket.write_all(head(total).as_bytes()).await;
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
                .await;
            let answer = String::from_utf8_lossy(&answer);
            assert!(
                answer.starts_with(expected),
                "{listener}: a {total}-byte head → {answer}"
            );
        }
        still_serves(&server).await;
        server.shutdown().await;
    }
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
    let (answer, _) = stalled_body(
        server.proxy_addr,
        "/v1/audio/transcriptions",
        100,
        b"0123456789",
    )
    .await;
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
    assert_eq!(record.tokens.completion, 2);
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
    wait::until(
        "the upstream request's cancel",
        Duration::from_secs(5),
        || hung.disconnected.lock().unwrap().is_some(),
    )
    .await;
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
        // A 503 answer is the engine shedding load (issue 44), its own outcome.
        ("5xx", Outcome::Shed, false),
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
    wait::until(
        "the upstream request's cancel",
        Duration::from_secs(5),
        || hung.disconnected.lock().unwrap().is_some(),
    )
    .await;
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
    wait::until("both requests upstream", Duration::from_secs(5), || {
        upstream.requests().len() >= 2
    })
    .await;
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
        .all(|r| r.outcome == Outcome::Ok && r.tokens.completion == 1));
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
        Self::start_logging(upstream, config, descriptor_limit, "info")
    }

    /// As [`Served::start`], with `RUST_LOG` set to `rust_log`.
    fn start_logging(
        upstream: &str,
        config: &str,
        descriptor_limit: Option<u32>,
        rust_log: &str,
    ) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tokentap-fault-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokentap.toml");
        // No store unless the test names one.
        let store = if config.contains("[store]") {
            ""
        } else {
            "[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n"
        };
        std::fs::write(&file, format!("{store}{config}")).unwrap();
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
            .env("RUST_LOG", rust_log)
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
        self.status_bytes("VmRSS:")
    }

    /// Peak resident memory since start, in bytes (Linux).
    fn peak_rss(&self) -> Option<u64> {
        self.status_bytes("VmHWM:")
    }

    fn status_bytes(&self, key: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with(key))?;
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
    // The accept loop hits EMFILE and says so (its pauses, doubling to a second, and one
    // warning per episode however many failures: `net::accept`'s tests, failure by failure).
    wait::until("the back-off warning", Duration::from_secs(10), || {
        served
            .log()
            .iter()
            .any(|l| l.contains("cannot accept connections"))
    })
    .await;
    drop(sockets);
    // Once the silent sockets are gone (closed by us, or by the header timeout), it serves.
    let url = format!("http://{}/v1/models", served.proxy);
    let status = wait::eventually(Duration::from_secs(20), async || {
        let request = http::Request::get(&url)
            .header("connection", "close")
            .body(Full::new(Bytes::new()))
            .unwrap();
        match tokio::time::timeout(Duration::from_secs(5), client().request(request)).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            _ => Err(0),
        }
    })
    .await
    .unwrap_or_else(|none| none);
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
    let mut slowest = Duration::ZERO;
    for task in tasks {
        let (answer, after) = task.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        slowest = slowest.max(after);
    }
    // The most memory it held at any time, the bodies' stall included (the kernel's record:
    // no sampling).
    let peak = served.peak_rss().unwrap_or(0).max(idle_rss);
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

// ---------------------------------------------------------------------------------------
// HTTP/2 flow control and idleness: hostile readers on a raw HTTP/2 client.

/// An upstream that answers every request but `/v1/models` with an endless event stream
/// (one static 16 KiB chunk written again and again until the proxy stops taking it or goes
/// away), and counts its connections: accepted in all, open now.
struct EndlessUpstream {
    addr: SocketAddr,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EndlessUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// 16 KiB of SSE events.
fn endless_chunk() -> Bytes {
    let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}]}\n\n";
    let mut body = String::new();
    while body.len() + event.len() <= 16 * 1024 - 16 {
        body.push_str(event);
    }
    Bytes::from(format!("{:x}\r\n{body}\r\n", body.len()))
}

impl EndlessUpstream {
    /// `hang`: answer nothing at all (no head), holding the connection.
    async fn start(hang: bool) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let open: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (a, o) = (accepted.clone(), open.clone());
        let chunk = endless_chunk();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    continue;
                };
                a.fetch_add(1, SeqCst);
                o.fetch_add(1, SeqCst);
                let o = o.clone();
                let chunk = chunk.clone();
                tokio::spawn(async move {
                    let _ = serve_endless(&mut socket, &chunk, hang).await;
                    o.fetch_sub(1, SeqCst);
                });
            }
        });
        Self {
            addr,
            accepted,
            open,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn serve_endless(socket: &mut TcpStream, chunk: &Bytes, hang: bool) -> std::io::Result<()> {
    loop {
        // One request head (bodies are small and ignored: they stay in the kernel's buffer).
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if socket.read(&mut byte).await? == 0 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        if hang {
            // Until the proxy closes the connection.
            while socket.read(&mut byte).await? != 0 {}
            return Ok(());
        }
        if head.starts_with(b"GET /v1/models") {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"data\":[]}")
                .await?;
            continue;
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            .await?;
        loop {
            socket.write_all(chunk).await?;
        }
    }
}

/// A TCP stream whose reading can be switched off for good: the peer that stops reading.
struct Gate {
    io: TcpStream,
    reading: Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for Gate {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.reading.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Pending; // never again
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Gate {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One raw HTTP/2 connection to `addr` with the given stream window (the connection window is
/// opened as wide as the stream's, at least the spec's 65,535): its request sender, the switch
/// that stops its reading, and the connection task (done when the connection closes).
async fn h2_connect(
    addr: SocketAddr,
    window: u32,
) -> (
    h2::client::SendRequest<Bytes>,
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let io = Gate {
        io: TcpStream::connect(addr).await.unwrap(),
        reading: Arc::clone(&reading),
    };
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window.max(65_535))
        .handshake::<_, Bytes>(io)
        .await
        .unwrap();
    (send, reading, tokio::spawn(connection))
}

/// Starts a streaming chat request on `send`; returns its response future (the request body
/// is sent whole).
async fn h2_chat(send: &mut h2::client::SendRequest<Bytes>) -> h2::client::ResponseFuture {
    let request = http::Request::post("http://tokentap/v1/chat/completions")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let mut ready = send.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(request, false).unwrap();
    body.send_data(Bytes::from_static(CHAT_WITH_USAGE.as_bytes()), true)
        .unwrap();
    *send = ready;
    response
}

fn faults(metrics: &str, fault: &str) -> f64 {
    sample(
        metrics,
        "tokentap_faults_total",
        &["listener=\"proxy\"", &format!("fault=\"{fault}\"")],
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wide_open_http2_windows_that_are_never_read_hold_bounded_memory() {
    let _cores = common::cores::busy().await;
    // Five connections, 100 streams each (the default stream limit), windows 2^31-1, and after
    // the response heads the client reads nothing more: the proxy may hold, per stream, its
    // send buffer and its upstream read buffer (proxy.max_stream_buffer each), whatever the
    // client's windows say.
    const CONNECTIONS: usize = 5;
    const STREAMS: usize = 100;
    let upstream = EndlessUpstream::start(false).await;
    let served = Served::start(
        &upstream.url(),
        "[proxy]\nsend_stall_timeout = \"120s\"\n[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n",
        None,
    );
    let idle_rss = served.rss().unwrap();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut send, reading, task) = h2_connect(served.proxy, i32::MAX as u32).await;
        let mut responses = Vec::new();
        for _ in 0..STREAMS {
            responses.push(h2_chat(&mut send).await);
        }
        let mut bodies = Vec::new();
        for response in responses {
            let response = tokio::time::timeout(Duration::from_secs(20), response)
                .await
                .expect("no response head")
                .unwrap();
            assert_eq!(response.status(), 200);
            bodies.push(response.into_body());
        }
        reading.store(false, std::sync::atomic::Ordering::SeqCst);
        clients.push((send, bodies, task));
    }
    // Memory until it stops growing (at most 30 s): every buffer on the way filled.
    let mut peak = idle_rss;
    let mut last_growth = Instant::now();
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_secs(30)
        && last_growth.elapsed() < Duration::from_secs(3)
    {
        let rss = served.rss().unwrap_or(0);
        if rss > peak + (1 << 20) {
            last_growth = Instant::now();
        }
        peak = peak.max(rss);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let per_connection = (peak.saturating_sub(idle_rss)) / CONNECTIONS as u64;
    eprintln!(
        "figure: {CONNECTIONS} HTTP/2 connections x {STREAMS} streams, windows 2^31-1, never read: RSS {:.0} MiB idle, {:.0} MiB peak, {:.1} MiB per connection ({:.0} KiB per stream)",
        mib(idle_rss),
        mib(peak),
        mib(per_connection),
        per_connection as f64 / STREAMS as f64 / 1024.0,
    );
    // docs/operations.md: about 18 MiB per connection with the defaults (100 streams x (64 KiB
    // send buffer + 64 KiB upstream read buffer + ~50 KiB of each stream's own state and
    // allocator slack)); before these bounds, ~1 MiB per stream.
    assert!(
        per_connection < 24 << 20,
        "{:.1} MiB per connection",
        mib(per_connection)
    );
    // Meanwhile the proxy serves others.
    let response = get(&format!("http://{}/v1/models", served.proxy)).await;
    assert_eq!(response.status, 200);
    drop(clients);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_window_never_opened_releases_upstreams_at_the_send_stall_timeout() {
    // Window 0: the proxy can send the client nothing, so nobody polls the response bodies.
    // At the send stall timeout each stream is reset, its upstream request cancelled (the
    // upstream sees its connection close), recorded as client_aborted and counted.
    const STREAMS: usize = 40;
    let upstream = EndlessUpstream::start(false).await;
    let (server, records) = proxy_with(&upstream.url(), "send_stall_timeout = \"3s\"", "").await;
    let (mut send, _reading, task) = h2_connect(server.proxy_addr, 0).await;
    let mut responses = Vec::new();
    for _ in 0..STREAMS {
        responses.push(h2_chat(&mut send).await);
    }
    wait::until("every stream upstream", Duration::from_secs(20), || {
        upstream.open() >= STREAMS
    })
    .await;
    assert_eq!(
        upstream.open(),
        STREAMS,
        "every stream reached the upstream"
    );
    let opened = Instant::now();
    wait::until("the upstreams' release", Duration::from_secs(20), || {
        upstream.open() == 0
    })
    .await;
    let released = opened.elapsed();
    eprintln!("figure: {STREAMS} streams behind a zero window held their upstream connections {released:?} (send_stall_timeout 1 s)");
    assert_eq!(upstream.open(), 0, "upstream connections still held");
    let all = records.wait_for(STREAMS).await;
    assert!(
        all.iter().all(|r| r.outcome == Outcome::ClientAborted),
        "{:?}",
        all.iter().map(|r| r.outcome).collect::<Vec<_>>()
    );
    assert_eq!(server.proxy.faults.get(Fault::SendStalled), STREAMS as u64);
    // Each stream was reset; the connection itself lives on.
    for response in responses {
        match tokio::time::timeout(Duration::from_secs(5), response).await {
            Ok(Ok(response)) => {
                let mut body = response.into_body();
                let end = tokio::time::timeout(Duration::from_secs(5), body.data()).await;
                assert!(
                    matches!(end, Ok(Some(Err(_)))),
                    "the stream was not reset: {end:?}"
                );
            }
            Ok(Err(error)) => assert!(error.is_reset(), "{error}"),
            Err(_) => panic!("the stream was neither answered nor reset"),
        }
    }
    assert!(
        !task.is_finished(),
        "the connection was closed, not the streams"
    );
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert_eq!(faults(&metrics, "send_stalled"), STREAMS as f64);
    still_serves(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_reader_that_stops_reading_is_cut_at_the_send_stall_timeout() {
    let upstream = EndlessUpstream::start(false).await;
    let (server, records) = proxy_with(&upstream.url(), "send_stall_timeout = \"3s\"", "").await;
    let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT_WITH_USAGE}",
        CHAT_WITH_USAGE.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    wait::until("the stream upstream", Duration::from_secs(10), || {
        upstream.open() >= 1
    })
    .await;
    assert_eq!(upstream.open(), 1);
    // We read nothing; the proxy's buffers fill, then the timeout runs.
    wait::until("the upstream's release", Duration::from_secs(20), || {
        upstream.open() == 0
    })
    .await;
    assert_eq!(upstream.open(), 0, "the upstream request is still held");
    let record = records.wait_for(1).await;
    assert_eq!(record[0].outcome, Outcome::ClientAborted);
    assert_eq!(server.proxy.faults.get(Fault::SendStalled), 1);
    still_serves(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_close_and_unanswered_pings_close_busy_ones() {
    let upstream = EndlessUpstream::start(false).await;
    let (server, _records) = proxy_with(
        &upstream.url(),
        "header_read_timeout = \"1s\"\nhttp2_keep_alive_interval = \"300ms\"\nhttp2_keep_alive_timeout = \"500ms\"",
        "",
    )
    .await;
    // One request, answered in full, then nothing: closed (GOAWAY) after the idle time.
    let (mut send, _reading, task) = h2_connect(server.proxy_addr, 65_535).await;
    let request = http::Request::get("http://tokentap/v1/models")
        .body(())
        .unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        data.unwrap();
    }
    let idle = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert!(closed.is_ok(), "an idle HTTP/2 connection stayed open");
    eprintln!(
        "figure: an idle HTTP/2 connection closed {:?} after its last stream (idle time 1 s)",
        idle.elapsed()
    );
    assert!(
        idle.elapsed() >= Duration::from_millis(900),
        "{:?}",
        idle.elapsed()
    );
    assert_eq!(server.proxy.faults.get(Fault::IdleClosed), 1);

    // A connection with a stream waiting on a silent upstream, whose client stops answering
    // anything (pings included): closed once a ping goes unanswered.
    let silent = EndlessUpstream::start(true).await;
    let (server, records) = proxy_with(
        &silent.url(),
        "header_read_timeout = \"1s\"\nhttp2_keep_alive_interval = \"300ms\"\nhttp2_keep_alive_timeout = \"500ms\"",
        "",
    )
    .await;
    let (mut send, reading, task) = h2_connect(server.proxy_addr, 65_535).await;
    let _response = h2_chat(&mut send).await;
    wait::until("the stream upstream", Duration::from_secs(10), || {
        silent.open() >= 1
    })
    .await;
    reading.store(false, std::sync::atomic::Ordering::SeqCst);
    let deaf = Instant::now();
    wait::until("the deaf client's close", Duration::from_secs(10), || {
        silent.open() == 0
    })
    .await;
    eprintln!("figure: a client that stopped answering pings was closed after {:?} (ping every 300 ms, 500 ms to answer)", deaf.elapsed());
    assert_eq!(
        silent.open(),
        0,
        "the upstream request outlived a dead client"
    );
    let record = records.wait_for(1).await;
    assert_eq!(record[0].outcome, Outcome::ClientAborted);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_reset_at_once_never_hold_more_upstream_connections_than_the_limit() {
    // Far fewer streams per connection than before (100, from the server's SETTINGS), and a
    // client that opens streams and resets them once the proxy is on its way to the upstream
    // never makes the proxy hold more than upstream.max_connections descriptors towards it
    // (counted in the proxy's own /proc/PID/fd). Each stream that reached the upstream still
    // costs it a connection: an HTTP/1 request is cancelled only by closing its connection.
    let upstream = EndlessUpstream::start(true).await;
    let served = Served::start(
        &upstream.url(),
        "[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"m\"\nmax_connections = 8\nconnect_timeout = \"500ms\"\n",
        None,
    );
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", served.child.id()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    };
    let (mut send, _reading, task) = h2_connect(served.proxy, 65_535).await;
    let idle_fds = descriptors();
    let mut most_fds = idle_fds;
    // 12 rounds of 50 streams, each reset 200 ms after it was sent.
    let mut opened = 0;
    'rounds: for _ in 0..12 {
        let mut round = Vec::new();
        for _ in 0..50 {
            let request = http::Request::get("http://tokentap/v1/models")
                .body(())
                .unwrap();
            let Ok(ready) = send.clone().ready().await else {
                break 'rounds; // GOAWAY (too many resets): the proxy's own defence
            };
            send = ready;
            let Ok((response, _)) = send.send_request(request, true) else {
                break 'rounds;
            };
            round.push(response);
            opened += 1;
        }
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            most_fds = most_fds.max(descriptors());
        }
        drop(round); // RST_STREAM(CANCEL) for each
        most_fds = most_fds.max(descriptors());
    }
    // The server's SETTINGS have arrived by now.
    assert_eq!(send.current_max_send_streams(), 100);
    let accepted = upstream.accepted.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("figure: {opened} streams opened and reset 200 ms later, 50 at a time: the proxy held at most {} descriptors more than idle (upstream.max_connections 8); the upstream accepted {accepted} connections in all", most_fds - idle_fds);
    assert!(opened >= 300, "only {opened} streams opened");
    assert!(accepted >= 8, "the streams never reached the upstream");
    // 8 upstream connections, and a few of the kernel's and the runtime's in passing.
    assert!(
        most_fds <= idle_fds + 8 + 4,
        "{} descriptors more than idle",
        most_fds - idle_fds
    );
    task.abort();
    // The reset streams' upstream connections are closed first (the proxy's descriptors back
    // to idle), so the 8 requests below take all 8 slots.
    wait::until(
        "the descriptors back to idle",
        Duration::from_secs(10),
        || descriptors() <= idle_fds + 2,
    )
    .await;
    // At the limit, a request that cannot get a connection within connect_timeout is a 503.
    // (The hanging upstream never notices a closed connection, so what is counted is the new
    // connections it accepted for these 8.)
    // A reset stream's connection that the kernel completed before the proxy closed it can
    // still be accepted by the upstream now (a busy runtime accepts late): counted here, it
    // would pass for one of the 8 below. Count once the accepts stop (bounded: 2 s).
    let accepted = || upstream.accepted.load(std::sync::atomic::Ordering::SeqCst);
    let mut accepted_before = accepted();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if accepted() == accepted_before {
            break;
        }
        accepted_before = accepted();
    }
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let url = format!("http://{}/v1/chat/completions", served.proxy);
        waiting.push(tokio::spawn(
            async move { post(&url, CHAT_WITH_USAGE).await },
        ));
    }
    wait::until("8 upstream connections", Duration::from_secs(10), || {
        upstream.accepted.load(std::sync::atomic::Ordering::SeqCst) >= accepted_before + 8
    })
    .await;
    assert!(
        upstream.accepted.load(std::sync::atomic::Ordering::SeqCst) >= accepted_before + 8,
        "the 8 requests hold the 8 upstream connections"
    );
    let response = post(
        &format!("http://{}/v1/chat/completions", served.proxy),
        CHAT_WITH_USAGE,
    )
    .await;
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(
        response.text().contains("upstream_connection_limit"),
        "{}",
        response.text()
    );
    let metrics = get(&format!("http://{}/metrics", served.admin))
        .await
        .text();
    assert!(
        faults(&metrics, "upstream_connection_limit") >= 1.0,
        "{metrics}"
    );
    for task in waiting {
        task.abort();
    }
}

// ---------------------------------------------------------------------------------------
// Signals and shutdown.

/// A chat stream of `events` events, one every 100 ms, with usage on each.
fn slow_stream(events: usize) -> Script {
    let mut steps = Vec::new();
    for n in 1..=events {
        steps.push(chunk("x", &n.to_string()));
        steps.push(wait_ms(100));
    }
    steps.push(done());
    Script::sse(steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_cut_at_the_end_of_the_grace_are_in_the_final_snapshot() {
    // Streams (HTTP/1 and HTTP/2) that outlive the grace period are closed at its end, each
    // recorded as client_aborted before the final snapshot is written: a restart loses none.
    let upstream = upstream_with(|_| slow_stream(1_000)).await;
    let dir = std::env::temp_dir().join(format!(
        "tokentap-fault-grace-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let (server, records) = proxy_from_config(&format!(
        "[proxy]\nshutdown_grace = \"1s\"\n[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"m\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"{}\"\n",
        upstream.url(),
        dir.display()
    ))
    .await;
    let store = server.store.clone().unwrap();
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let mut http1 = Vec::new();
    for _ in 0..3 {
        let url = url.clone();
        http1.push(tokio::spawn(
            async move { post(&url, CHAT_WITH_USAGE).await },
        ));
    }
    let (mut send, _reading, _task) = h2_connect(server.proxy_addr, i32::MAX as u32).await;
    let mut http2 = Vec::new();
    for _ in 0..3 {
        http2.push(h2_chat(&mut send).await);
    }
    wait::until("6 streams upstream", Duration::from_secs(10), || {
        upstream.requests().len() >= 6
    })
    .await;
    assert_eq!(upstream.requests().len(), 6);
    assert_eq!(records.len(), 0, "the streams run for 100 s");
    let before = store.snapshots(None, None).unwrap().len();
    let stopping = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), server.shutdown())
        .await
        .expect("shutdown outlived the grace period");
    eprintln!(
        "figure: shutdown with 6 streams in flight took {:?} (grace 1 s)",
        stopping.elapsed()
    );
    let recorded = records.0.lock().unwrap().clone();
    assert_eq!(recorded.len(), 6, "every stream that ran is recorded");
    assert!(recorded.iter().all(|r| r.outcome == Outcome::ClientAborted));
    let snapshots = store.snapshots(None, None).unwrap();
    assert!(
        snapshots.len() > before,
        "no snapshot at shutdown: {snapshots:?}"
    );
    let tokens: u64 = snapshots.iter().map(|s| s.output_tokens).sum();
    assert!(
        tokens >= 6,
        "the snapshot lacks the cut streams' tokens: {snapshots:?}"
    );
    drop(http1);
    let _ = std::fs::remove_dir_all(&dir);
}

fn signal(served: &Served, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(served.child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits (bounded) for the child to exit; its exit status.
fn exited(served: &mut Served, limit: Duration) -> Option<std::process::ExitStatus> {
    wait::child_exit(&mut served.child, limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_drains_and_a_second_signal_cuts_the_grace_short() {
    let upstream = upstream_with(|_| slow_stream(1_000)).await;
    // SIGHUP with nothing in flight: drains and exits 0, saying so.
    let mut served = Served::start(&upstream.url(), "[proxy]\nshutdown_grace = \"30s\"\n", None);
    signal(&served, "HUP");
    let status = exited(&mut served, Duration::from_secs(15)).expect("SIGHUP did not stop it");
    assert!(status.success(), "{status:?}: {:?}", served.log());
    assert!(
        served
            .log()
            .iter()
            .any(|l| l.contains("SIGHUP") && l.contains("draining")),
        "{:?}",
        served.log()
    );

    // A stream that would run 100 s and a 30 s grace: SIGTERM drains (the stream goes on), a
    // second SIGTERM closes it at once and the process exits well before the grace is over.
    let mut served = Served::start(&upstream.url(), "[proxy]\nshutdown_grace = \"30s\"\n", None);
    let url = format!("http://{}/v1/chat/completions", served.proxy);
    let stream = tokio::spawn(async move { post(&url, CHAT_WITH_USAGE).await });
    // The stream's own request (both processes also ask the upstream's /v1/models in the
    // background: waiting for any request let the signal come before the stream began).
    wait::until("the stream upstream", Duration::from_secs(10), || {
        upstream
            .requests()
            .iter()
            .any(|r| r.path == "/v1/chat/completions")
    })
    .await;
    signal(&served, "TERM");
    // The first signal is heard (it says it drains), and the process and the stream go on.
    wait::until("the drain to begin", Duration::from_secs(10), || {
        served.log().iter().any(|l| l.contains("draining"))
    })
    .await;
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "it did not wait for the stream"
    );
    assert!(
        !stream.is_finished(),
        "the stream was cut at the first signal"
    );
    let second = Instant::now();
    signal(&served, "TERM");
    let status =
        exited(&mut served, Duration::from_secs(15)).expect("the second SIGTERM was ignored");
    eprintln!(
        "figure: a second SIGTERM ended a 30 s grace after {:?}",
        second.elapsed()
    );
    assert!(status.success(), "{status:?}");
    assert!(
        served.log().iter().any(|l| l.contains("second signal")),
        "{:?}",
        served.log()
    );
    let _ = stream.await;
}

// ---------------------------------------------------------------------------------------
// Budgets and bytes.

/// An upstream on a raw socket that answers every request with `answer` (after reading its
/// head and, when there is one, a small body it ignores), and records each request head.
async fn raw_upstream(answer: &'static [u8]) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).to_lowercase());
                let _ = socket.write_all(answer).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, heads)
}

/// Sends `request` on a fresh connection and reads the answer until the peer closes.
async fn raw_exchange(addr: SocketAddr, request: &str) -> String {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn upstream_trailers_reach_http1_clients_that_take_them() {
    let (addr, heads) = raw_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntrailer: x-checksum\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc123\r\n\r\n",
    )
    .await;
    let (server, _records) = proxy_with(&format!("http://{addr}"), "", "").await;
    let answer = raw_exchange(
        server.proxy_addr,
        "GET /v1/files/1 HTTP/1.1\r\nhost: x\r\nte: trailers\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_lowercase().contains("x-checksum: abc123"),
        "the trailer was lost: {answer:?}"
    );
    assert!(
        heads.lock().unwrap()[0].contains("te: trailers"),
        "the upstream was not told the client takes trailers: {:?}",
        heads.lock().unwrap()
    );
    // Without `TE: trailers` the client gets the body and no trailer (hyper's rule).
    let answer = raw_exchange(
        server.proxy_addr,
        "GET /v1/files/1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.contains("hello"), "{answer}");
    assert!(
        !heads.lock().unwrap()[1].contains("te:"),
        "{:?}",
        heads.lock().unwrap()
    );
}

#[tokio::test]
async fn connect_is_a_client_error_not_an_upstream_failure() {
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, _records) = proxy_with(&upstream.url(), "", "").await;
    let answer = raw_exchange(
        server.proxy_addr,
        "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert!(answer.contains("method_not_allowed"), "{answer}");
    assert!(
        upstream.requests().is_empty(),
        "CONNECT reached the upstream"
    );
    still_serves(&server).await;
}

#[tokio::test]
async fn choices_whose_counts_sum_past_u64_max_saturate_instead_of_wrapping() {
    // Two choices (n = 2) each claiming 2^63 tokens: their sum is 2^64, which wrapped to 0.
    let half = 1u64 << 63;
    let upstream = upstream_with(move |_| {
        Script::sse(vec![
            data(&format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"a"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":{half}}}}}"#
            )),
            data(&format!(
                r#"{{"choices":[{{"index":1,"delta":{{"content":"b"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":{half}}}}}"#
            )),
            done(),
        ])
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT_WITH_USAGE,
    )
    .await;
    assert_eq!(response.status, 200);
    let record = records.wait_for(1).await;
    assert_eq!(
        record[0].tokens.completion, MAX_TOKENS_PER_REQUEST,
        "clamped at the most, not wrapped to nothing"
    );
    assert!(
        !record[0].tokens.completion_exact,
        "a clamped count is approximate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_budget_covers_metered_bodies_until_the_upstream_answers() {
    // An upstream that accepts and then neither reads nor answers. Two ~1 MB metered bodies
    // fill a 2 MiB budget while they wait for it (forwarded, not only while being read), so
    // the next ones are forwarded unmetered as they stream: their memory is the kernel's.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let keep = Arc::clone(&held);
    let acceptor = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"http://{addr}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\nresponse_timeout = \"3s\"\n[metering]\nmax_buffered_bytes = 2097152\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n"
    ))
    .await;
    let body = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(1_000_000)
    );
    let mut answers = Vec::new();
    for _ in 0..4 {
        let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
        let body = body.clone();
        let before = held.lock().unwrap().len();
        answers.push(tokio::spawn(async move { post(&url, &body).await.status }));
        // In order: the first two take the budget before the others ask.
        wait::until("the body upstream", Duration::from_secs(10), || {
            held.lock().unwrap().len() > before
        })
        .await;
    }
    for answer in answers {
        assert_eq!(answer.await.unwrap(), 504);
    }
    // Only metered requests are recorded: the two inside the budget (the proxy shut down,
    // every request's record is in).
    records.wait_for(2).await;
    server.shutdown().await;
    assert_eq!(
        records.len(),
        2,
        "bodies waiting on the upstream were not counted against the budget"
    );
    acceptor.abort();
}

#[tokio::test]
async fn with_injection_a_partial_last_event_is_forwarded_without_what_tokentap_added() {
    // The client asked for no usage, so tokentap injects it and must strip it, also from an
    // event the stream ends inside (no blank line after it), whether it ends cleanly or not.
    const PLAIN: &str =
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let partial = r#"data: {"choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;
    for end in [End::Clean, End::Reset] {
        let partial = partial.to_string();
        let upstream = upstream_with(move |_| {
            let mut script = Script::sse(vec![
                chunk("a", "1"),
                Step::Send(Bytes::from(partial.clone())),
            ]);
            script.end = end;
            script
        })
        .await;
        let (server, records) = proxy_with(&upstream.url(), "", "").await;
        let response = post(
            &format!("http://{}/v1/chat/completions", server.proxy_addr),
            PLAIN,
        )
        .await;
        let text = response.text();
        let sent = upstream.requests()[0].body.clone();
        assert!(
            String::from_utf8_lossy(&sent).contains("include_usage"),
            "nothing was injected: the test would prove nothing"
        );
        assert!(
            text.ends_with(r#"data: {"choices":[{"index":0,"delta":{"content":"b"}}]}"#),
            "{end:?}: the partial event is missing or carries the injected usage: {text:?}"
        );
        assert!(
            !text.contains("usage"),
            "{end:?}: injected usage leaked: {text:?}"
        );
        assert_eq!(response.error.is_some(), end == End::Reset, "{end:?}");
        let record = records.wait_for(1).await;
        // An event no blank line closed is no event to an SSE client (it discards it), so it
        // is not counted either.
        assert_eq!(record[0].tokens.completion, 1, "{end:?}");
        assert_eq!(record[0].outcome, Outcome::UpstreamAborted, "{end:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Compressed streams.

#[tokio::test]
async fn metered_requests_ask_for_identity_and_compressed_streams_pass_untouched_on_time() {
    // The client (the OpenAI SDK does) sends `Accept-Encoding: gzip`; tokentap asks the
    // upstream for identity. One that compresses anyway is passed through byte for byte as it
    // arrives: not held, not stripped, recorded with approximate counts, not as an abort.
    let part_one =
        Bytes::from_static(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03compressed-part-one");
    let part_two = Bytes::from_static(b"compressed-part-two\x00\x00");
    let (one, two) = (part_one.clone(), part_two.clone());
    let upstream = upstream_with(move |_| {
        let mut script = Script::sse(vec![
            Step::Send(one.clone()),
            wait_ms(1_500),
            Step::Send(two.clone()),
        ]);
        script.headers.push(("content-encoding", "gzip".into()));
        script
    })
    .await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    const PLAIN: &str =
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
        .header("content-type", "application/json")
        .header("accept-encoding", "gzip, deflate, br")
        .body(Full::new(Bytes::from_static(PLAIN.as_bytes())))
        .unwrap();
    let response = send(request).await;
    let asked = upstream.requests()[0].headers.clone();
    assert_eq!(asked["accept-encoding"], "identity", "{asked:?}");
    assert_eq!(response.headers["content-encoding"], "gzip");
    let mut expected = part_one.to_vec();
    expected.extend_from_slice(&part_two);
    assert_eq!(response.bytes(), expected, "the bytes were changed");
    // On time: the first part came as it was sent, not with the end.
    let (first, _) = response.frames.first().unwrap();
    let (last, _) = response.frames.last().unwrap();
    assert!(
        *last - *first >= Duration::from_millis(1_000),
        "the first part was held until the end: {:?}",
        *last - *first
    );
    let record = records.wait_for(1).await;
    assert_eq!(record[0].outcome, Outcome::Ok, "not an upstream abort");
    assert!(
        !record[0].tokens.completion_exact,
        "counts of an unread stream are approximate"
    );
    // An uncompressed stream through the same proxy is metered as ever.
    let upstream = upstream_with(|_| Script::sse(vec![chunk("a", "1"), done()])).await;
    let (server, records) = proxy_with(&upstream.url(), "", "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        PLAIN,
    )
    .await;
    assert!(!response.text().contains("usage"), "{}", response.text());
    let record = records.wait_for(1).await;
    assert_eq!(record[0].tokens.completion, 1);
    assert!(record[0].tokens.completion_exact);
}

// ---------------------------------------------------------------------------------------
// The store.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_capture_writes_are_logged_once_with_their_cause_and_the_lost_rows_counted() {
    // The workload table vanishes under the running proxy (as a full or broken disk fails
    // every write): each batch fails. One warning names the cause (not one per batch), and
    // every lost row is counted in /metrics.
    let upstream = upstream_with(|_| Script::sse(vec![chunk("a", "1"), done()])).await;
    let dir = std::env::temp_dir().join(format!(
        "tokentap-fault-capture-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let served = Served::start(
        &upstream.url(),
        &format!(
            "[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[workload]\ncapture = true\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"{}\"\n",
            dir.display()
        ),
        None,
    );
    let url = format!("http://{}/v1/chat/completions", served.proxy);
    assert_eq!(post(&url, CHAT_WITH_USAGE).await.status, 200);
    let database = rusqlite::Connection::open(dir.join("tokentap.sqlite3")).unwrap();
    database.busy_timeout(Duration::from_secs(10)).unwrap();
    // The first request's row is written (batches are asynchronous) before the table goes, so
    // exactly the next REQUESTS rows are the lost ones.
    wait::until("the first row stored", Duration::from_secs(10), || {
        database
            .query_row("SELECT count(*) FROM workload", [], |row| {
                row.get::<_, i64>(0)
            })
            .unwrap_or(0)
            >= 1
    })
    .await;
    database.execute_batch("DROP TABLE workload").unwrap();
    drop(database);
    const REQUESTS: usize = 60;
    // One after another: most rows a batch of their own, every batch failing (told once: the
    // once-a-minute reminder and the end of an episode are `workload::capture`'s paused-time
    // test).
    for _ in 0..REQUESTS {
        assert_eq!(post(&url, CHAT_WITH_USAGE).await.status, 200);
    }
    let metrics_url = format!("http://{}/metrics", served.admin);
    let lost = wait::eventually(Duration::from_secs(10), async || {
        let metrics = get(&metrics_url).await.text();
        let lost = sample(
            &metrics,
            "tokentap_workload_rows_lost_total",
            &["reason=\"store_failed\""],
        )
        .unwrap_or(0.0);
        if lost >= REQUESTS as f64 {
            Ok(lost)
        } else {
            Err(lost)
        }
    })
    .await
    .unwrap_or_else(|lost| lost);
    assert_eq!(lost, REQUESTS as f64, "lost rows are not counted");
    let log = served.log();
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("cannot store captured workload rows"))
        .collect();
    eprintln!("figure: {REQUESTS} requests whose capture rows all failed to store: {} warning(s), {lost} rows counted lost", warnings.len());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("no such table"),
        "the cause is not named: {}",
        warnings[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Metric labels.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_model_names_cannot_take_the_labels_of_served_models() {
    // The upstream serves `real-model` (its /v1/models, read in the background). A client
    // sends more junk names than there are first-come slots before the first real request:
    // the junk gets its slots, then `other`; the served model keeps its own label.
    let upstream = ScriptedUpstream::start(|r| {
        if r.path == "/v1/models" {
            Script::json(
                200,
                r#"{"object":"list","data":[{"id":"real-model","object":"model"}]}"#,
            )
        } else {
            Script::sse(vec![chunk("a", "1"), done()])
        }
    })
    .await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"5s\"\n[metering]\nmax_models = 4\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    // The served list is read at start.
    let served = std::sync::Arc::clone(server.proxy.router.default_upstream());
    wait::until("the served list", Duration::from_secs(10), || {
        served.served_model().is_some()
    })
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let chat = |model: &str| {
        format!(
            r#"{{"model":"{model}","stream":true,"stream_options":{{"include_usage":true,"continuous_usage_stats":true}},"messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    for n in 0..10 {
        assert_eq!(post(&url, &chat(&format!("junk-{n}"))).await.status, 200);
    }
    assert_eq!(post(&url, &chat("real-model")).await.status, 200);
    let all = records.wait_for(11).await;
    // One model served: every request is recorded under it, whatever name it sent.
    assert!(
        all.iter().all(|r| &*r.labels.model == "real-model"),
        "{all:?}"
    );
    // The names the clients sent are kept as a bounded attribute: 4 slots, then `other`.
    let asked: Vec<Option<&str>> = all
        .iter()
        .map(|r| r.labels.asked_model.as_deref())
        .collect();
    assert_eq!(
        asked
            .iter()
            .filter(|a| a.is_some_and(|a| a.starts_with("junk-")))
            .count(),
        4,
        "{asked:?}"
    );
    assert_eq!(
        asked.iter().filter(|a| **a == Some("other")).count(),
        6,
        "{asked:?}"
    );
    assert_eq!(asked.last(), Some(&None), "{asked:?}");
}

#[tokio::test]
async fn a_server_of_several_models_records_each_request_under_the_served_id_it_named() {
    // vLLM with a LoRA adapter serves two ids: a request naming one is recorded under it, a
    // name it does not serve under `other` (the client's name kept only as an attribute).
    let upstream = ScriptedUpstream::start(|r| {
        if r.path == "/v1/models" {
            Script::json(
                200,
                r#"{"object":"list","data":[{"id":"base-model","object":"model"},{"id":"sql-lora","object":"model","parent":"base-model"}]}"#,
            )
        } else {
            Script::sse(vec![chunk("a", "1"), done()])
        }
    })
    .await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let served = std::sync::Arc::clone(server.proxy.router.default_upstream());
    wait::until("the served list", Duration::from_secs(10), || {
        served.served_model().is_some()
    })
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for model in ["sql-lora", "base-model", "gpt-4o"] {
        let body = format!(
            r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        assert_eq!(post(&url, &body).await.status, 200);
    }
    let all = records.wait_for(3).await;
    let recorded: Vec<(&str, Option<&str>)> = all
        .iter()
        .map(|r| (&*r.labels.model, r.labels.asked_model.as_deref()))
        .collect();
    assert_eq!(
        recorded,
        vec![
            ("sql-lora", None),
            ("base-model", None),
            ("other", Some("gpt-4o"))
        ]
    );
}

#[test]
fn a_model_served_later_takes_its_label_back_from_other_and_listed_names_stay_bounded() {
    use tokentap::proxy::service::{ModelLabels, MAX_SERVED_MODELS};
    // What the background refresh of each upstream's /v1/models does
    // (`proxy::served_model`, every `REFRESH`): `serve` the names it lists now.
    let labels = ModelLabels::new(4);
    labels.serve(["real"]);
    for n in 0..10 {
        labels.label(&format!("junk-{n}"));
    }
    assert_eq!(&*labels.label("real"), "real");
    // The upstream loads another model after junk took every slot: until a refresh lists
    // it, it is `other`...
    assert_eq!(&*labels.label("late"), "other");
    // ...once listed, it has its own label, and junk still has none.
    labels.serve(["real", "late"]);
    assert_eq!(&*labels.label("late"), "late");
    assert_eq!(&*labels.label("junk-99"), "other");
    // A served name over 200 bytes is `other`, and a list of absurdly many names is believed
    // only up to MAX_SERVED_MODELS: the labels stay bounded whatever the upstream says.
    let long = "x".repeat(201);
    labels.serve([long.as_str()]);
    assert_eq!(&*labels.label(&long), "other");
    let listed: Vec<String> = (0..5 * MAX_SERVED_MODELS)
        .map(|n| format!("listed-{n}"))
        .collect();
    labels.serve(listed.iter().map(String::as_str));
    let distinct: std::collections::HashSet<String> = listed
        .iter()
        .map(|name| labels.label(name).to_string())
        .collect();
    assert!(
        distinct.len() <= MAX_SERVED_MODELS + 1,
        "{}",
        distinct.len()
    );
    assert!(distinct.contains("other"));
}

// ---------------------------------------------------------------------------------------
// The workload export.

/// Rows in a full capture (`workload.max_requests`' default and the export's row limit).
const FULL_CAPTURE: usize = 1_000_000;

/// Fills `dir`'s store with `FULL_CAPTURE` rows in one transaction: one row a millisecond,
/// ending now; each prompt's 3 blocks are one of 100 shared system prompts and two blocks of
/// its own (so the export sees ~2,000,000 distinct prefix blocks: past the renumbering
/// bound). Returns the first row's arrival (Unix ms).
fn fill_capture(dir: &std::path::Path) -> i64 {
    fill_capture_with(dir, FULL_CAPTURE)
}

fn fill_capture_with(dir: &std::path::Path, count: usize) -> i64 {
    drop(tokentap::store::Store::open(dir).unwrap());
    let mut database = rusqlite::Connection::open(dir.join("tokentap.sqlite3")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let first = now - count as i64 - 1000;
    let transaction = database.transaction().unwrap();
    {
        let mut insert = transaction
            .prepare(
                "INSERT INTO workload (started_ms, route, model, stream, prompt_tokens,
                   cached_tokens, max_tokens, output_tokens, outcome, prefix_blocks)
                 VALUES (?1, 'chat_completions', 'm', 1, 1100, ?2, 64, ?3, 'ok', ?4)",
            )
            .unwrap();
        let mut blob = [0u8; 24];
        for i in 0..count as u64 {
            let blocks = [
                0xA5A5_0000_0000_0000 | (i % 100),
                0x5A5A_0000_0000_0000 | (2 * i),
                0x5A5A_0000_0000_0000 | (2 * i + 1),
            ];
            for (slot, id) in blob.chunks_exact_mut(8).zip(blocks) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
            let cached = (i % 3 == 0).then_some(512i64);
            insert
                .execute(rusqlite::params![
                    first + i as i64,
                    cached,
                    (i % 500) as i64,
                    &blob[..]
                ])
                .unwrap();
        }
    }
    transaction.commit().unwrap();
    first
}

/// An export's response head, its body not read yet.
async fn export_head(admin: SocketAddr) -> http::Response<hyper::body::Incoming> {
    let request = http::Request::get(format!("http://{admin}/workload?window=1h"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), client().request(request))
        .await
        .expect("the export's head within 60 s")
        .unwrap()
}

/// Reads an export's body to its end: (line count, the first `keep` lines).
async fn read_export(
    response: http::Response<hyper::body::Incoming>,
    keep: usize,
    progress: tokio::sync::watch::Sender<usize>,
) -> (usize, Vec<String>) {
    let mut body = response.into_body();
    let mut lines = 0;
    let mut first = Vec::new();
    let mut partial = Vec::new();
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(60), body.frame())
        .await
        .expect("an export frame within 60 s")
    {
        let Ok(data) = frame.expect("the export broke off").into_data() else {
            continue;
        };
        lines += data.iter().filter(|b| **b == b'\n').count();
        progress.send_replace(lines);
        if first.len() < keep {
            partial.extend_from_slice(&data);
            while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=end).collect();
                if first.len() < keep {
                    first.push(String::from_utf8(line).unwrap().trim_end().to_string());
                }
            }
        }
    }
    (lines, first)
}

/// The page and `/matrix` (and `/healthz`), each answered 200 within `bound`; the slowest.
async fn page_answers(admin: SocketAddr, bound: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for path in ["/healthz", "/matrix", "/"] {
        let started = Instant::now();
        let answer = tokio::time::timeout(bound, get(&format!("http://{admin}{path}")))
            .await
            .unwrap_or_else(|_| panic!("{path} did not answer within {bound:?} during the export"));
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_row_workload_export_streams_in_bounded_memory_beside_the_page() {
    let _cores = common::cores::busy().await;
    let dir = std::env::temp_dir().join(format!(
        "tokentap-fault-export-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let filling = Instant::now();
    let first_ms = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || fill_capture(&dir)
    })
    .await
    .unwrap();
    let filled = filling.elapsed();
    // Today's format, from the in-memory trace of the first rows (the reference the stream
    // must equal line for line: ids are renumbered in order of first appearance).
    const FIRST: usize = 2000;
    let reference = {
        let store = tokentap::store::Store::open(&dir).unwrap();
        let from = std::time::UNIX_EPOCH + Duration::from_millis(first_ms as u64);
        let rows = store.workload_since(from, FIRST).unwrap();
        let trace = tokentap::workload::capture::trace_of_rows(rows);
        tokentap::workload::render(&trace, tokentap::workload::TraceFormat::Tokentap)
    };
    let reference: Vec<&str> = reference.lines().collect();
    let upstream = upstream_with(|_| Script::sse(vec![chunk("a", "1"), done()])).await;
    let served = Served::start(
        &upstream.url(),
        &format!(
            "[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[workload]\ncapture = true\n[store]\ndata_dir = \"{}\"\n",
            dir.display()
        ),
        None,
    );
    page_answers(served.admin, Duration::from_secs(10)).await;
    let before = served.rss().unwrap();

    // Two exports run (the bound, `max_exports` = 2); their heads are in, their bodies wait.
    let started = Instant::now();
    let a = export_head(served.admin).await;
    let b = export_head(served.admin).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    // A third is refused by name, with a Retry-After, and counted.
    let refused = get(&format!("http://{}/workload?window=1h", served.admin)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("5")
    );
    assert!(
        refused.text().contains("workload.max_exports = 2"),
        "{}",
        refused.text()
    );
    // The page answers while both exports are open and not read (their readers wait on the
    // client: back-pressure, no store lock held)...
    let paused = page_answers(served.admin, Duration::from_secs(5)).await;
    // ...and while they stream.
    let (progress, mut lines_read) = tokio::sync::watch::channel(0);
    let readers = [
        tokio::spawn(read_export(a, FIRST + 1, progress)),
        tokio::spawn(read_export(b, 1, tokio::sync::watch::Sender::new(0))),
    ];
    // A look at the page each time the first export has streamed another 50,000 lines.
    let mut streaming = Duration::ZERO;
    let mut looks = 0;
    let mut next_look = 0;
    while lines_read.changed().await.is_ok() && looks < 200 {
        if *lines_read.borrow_and_update() < next_look {
            continue;
        }
        streaming = streaming.max(page_answers(served.admin, Duration::from_secs(5)).await);
        looks += 1;
        next_look = *lines_read.borrow() + 50_000;
    }
    let [a, b] = readers;
    let (lines_a, head_a) = a.await.unwrap();
    let (lines_b, head_b) = b.await.unwrap();
    let took = started.elapsed();
    let peak = served.peak_rss().unwrap();
    let growth = peak.saturating_sub(before);
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    eprintln!(
        "figure: filled {FULL_CAPTURE} rows in {:.1} s; two concurrent exports of {FULL_CAPTURE} rows each in {:.1} s; RSS {:.1} MiB before, peak {:.1} MiB: growth {:.1} MiB; page with both exports paused {paused:?}, while streaming at most {streaming:?} over {looks} looks",
        filled.as_secs_f64(),
        took.as_secs_f64(),
        mib(before),
        mib(peak),
        mib(growth)
    );
    // Exactly every row, after the header, in both.
    assert_eq!(lines_a, FULL_CAPTURE + 1);
    assert_eq!(lines_b, FULL_CAPTURE + 1);
    // The format is today's: the header with the full count, then the same lines.
    let header: serde_json::Value = serde_json::from_str(&head_a[0]).unwrap();
    let mut expected: serde_json::Value = serde_json::from_str(reference[0]).unwrap();
    expected["requests"] = serde_json::json!(FULL_CAPTURE);
    assert_eq!(header, expected);
    assert_eq!(head_b[0], head_a[0]);
    assert_eq!(&head_a[1..], &reference[1..]);
    assert!(
        growth < 64 << 20,
        "two exports of a full capture grew the proxy's memory by {:.1} MiB",
        mib(growth)
    );
    let metrics = get(&format!("http://{}/metrics", served.admin))
        .await
        .text();
    assert_eq!(
        sample(&metrics, "tokentap_workload_exports_refused_total", &[]),
        Some(1.0)
    );
    // Clients that hang up mid-export free their slots: a later export is served.
    let c = export_head(served.admin).await;
    let d = export_head(served.admin).await;
    assert_eq!((c.status().as_u16(), d.status().as_u16()), (200, 200));
    drop((c, d));
    let status = wait::eventually(Duration::from_secs(20), async || {
        match get(&format!("http://{}/workload?window=1s", served.admin))
            .await
            .status
        {
            200 => Ok(200),
            other => Err(other),
        }
    })
    .await
    .unwrap_or_else(|status| status);
    assert_eq!(status, 200, "hung-up exports kept their slots");
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// The /metrics series budget.

/// `promtool check metrics` on `page`: its complaints (empty when it parses; lint notes about
/// naming conventions, exit status 3, aside) — Prometheus's own parser, from Debian's
/// `prometheus` package (scripts/test installs it).
fn promtool_check(page: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Exit status 1 and "parsing error": the page does not parse (checked against a broken
    // line by hand: `foo{a="b" 1` → "text format parsing error in line 1", status 1).
    if output.status.code() == Some(1) || text.contains("parsing error") {
        text
    } else {
        String::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_page_keeps_its_series_budget_in_priority_order() {
    use tokentap::telemetry::prometheus::{
        histogram_series, CELL_CORE_HISTOGRAMS, CELL_DETAIL_HISTOGRAMS,
    };
    // Each request names its prompt size; the upstream reports it as the usage, so the
    // requests fall into a new context bucket each: 4 models × 5 contexts = 20 cells of about
    // 330 series each, against a budget of 2,000.
    let upstream = upstream_with(|r| {
        let body = String::from_utf8_lossy(&r.body);
        let prompt: u64 = body
            .split("p=")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(5);
        Script::sse(vec![
            data(&format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"a"}}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":1}}}}"#
            )),
            data(&format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"b"}}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":2}}}}"#
            )),
            done(),
        ])
    })
    .await;
    const BUDGET: usize = 2000;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[metering]\nmax_models = 8\n[telemetry]\nmax_series = {BUDGET}\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let models = ["m0", "m1", "m2", "m3"];
    let prompts = [100u64, 9_000, 20_000, 40_000, 70_000];
    // In order of first traffic.
    let mut cells = Vec::new();
    for model in models {
        for prompt in prompts {
            let body = format!(
                r#"{{"model":"{model}","stream":true,"stream_options":{{"include_usage":true,"continuous_usage_stats":true}},"messages":[{{"role":"user","content":"p={prompt}"}}]}}"#
            );
            assert_eq!(post(&url, &body).await.status, 200);
            cells.push((model, prompt));
            // The client has its answer a moment before the proxy has finished the request:
            // the next one starts once this one is out of flight, at a concurrency of 1 (a
            // cell of its own otherwise, and the budget's figures below would not hold).
            records.wait_for(cells.len()).await;
        }
    }
    let all = records.wait_for(cells.len()).await;
    let buckets: Vec<String> = all
        .iter()
        .map(|r| format!("{}/{}", r.labels.model, r.buckets.context))
        .collect();
    let distinct: std::collections::HashSet<&String> = buckets.iter().collect();
    assert_eq!(
        distinct.len(),
        cells.len(),
        "each request a cell of its own: {buckets:?}"
    );

    let page = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    let samples: Vec<_> = tokentap::base::exposition::samples(&page).collect();
    let lines = page
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    // Every sample line reads (the crate's parser skips what it cannot read)...
    assert_eq!(samples.len(), lines, "unreadable sample lines");
    // ...and so does Prometheus's own.
    let complaints = promtool_check(&page);
    assert!(complaints.is_empty(), "promtool: {complaints}");
    let gauge = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let used = gauge("tokentap_metrics_series");
    eprintln!(
        "figure: {} cells reached, budget {BUDGET}: {} series on the page ({} bytes, {} a series), {used} counted in use",
        cells.len(),
        samples.len(),
        page.len(),
        page.len() / samples.len().max(1)
    );
    // The upstreams' configurations are outside the budget, bounded per upstream instead
    // (docs/operations.md): at most 4 kept fingerprints and 2 more series each.
    let configuration = samples
        .iter()
        .filter(|s| s.name.starts_with("tokentap_upstream_config"))
        .count();
    assert!(configuration <= 6, "{configuration} configuration series");
    // So are the session figures, bounded per model (docs/metrics.md, "Sessions and turns"):
    // these requests are sessions of one turn each, so only the table's size shows.
    let sessions = samples
        .iter()
        .filter(|s| s.name.starts_with("tokentap_session"))
        .count();
    assert!(sessions <= 1, "{sessions} session series");
    let budgeted = samples.len() - configuration - sessions;
    assert!(budgeted <= BUDGET, "{budgeted} series");
    assert!(used <= BUDGET as f64 && budgeted as f64 <= used);
    assert_eq!(gauge("tokentap_metrics_series_budget"), BUDGET as f64);
    // Process-wide series are always there.
    assert!(samples.iter().any(|s| s.name == "tokentap_faults_total"
        && s.label("fault").as_deref() == Some("send_stalled")));

    // Each cell in traffic order: every series, its core series only, or none.
    let context_label = |prompt: u64| {
        all.iter()
            .find(|r| r.tokens.prompt == Some(prompt))
            .map(|r| {
                server
                    .proxy
                    .meter
                    .contexts()
                    .label(r.buckets.context)
                    .to_string()
            })
            .unwrap()
    };
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Kept {
        Full,
        Core,
        Nothing,
    }
    let in_cell = |name: &str, model: &str, context: &str| {
        samples.iter().any(|s| {
            s.name == name
                && s.label("model").as_deref() == Some(model)
                && s.label("context_bucket").as_deref() == Some(context)
        })
    };
    let kept: Vec<Kept> = cells
        .iter()
        .map(|(model, prompt)| {
            let context = context_label(*prompt);
            let core = in_cell("tokentap_requests_total", model, &context)
                && in_cell("tokentap_tokens_total", model, &context)
                && in_cell(
                    "tokentap_time_to_first_token_seconds_count",
                    model,
                    &context,
                )
                && in_cell(
                    "tokentap_time_between_tokens_seconds_count",
                    model,
                    &context,
                )
                && in_cell("tokentap_decode_seconds_count", model, &context);
            let detail = in_cell("tokentap_request_duration_seconds_count", model, &context)
                || in_cell("tokentap_prompt_tokens_count", model, &context);
            let any = samples.iter().any(|s| {
                s.label("model").as_deref() == Some(*model)
                    && s.label("context_bucket").as_deref() == Some(&*context)
            });
            match (core, detail, any) {
                (true, true, _) => Kept::Full,
                (true, false, _) => Kept::Core,
                (false, false, false) => Kept::Nothing,
                other => panic!("cell {model}/{context}: partial series {other:?}"),
            }
        })
        .collect();
    eprintln!("figure: cells in traffic order kept {kept:?}");
    assert!(
        kept.windows(2).all(|w| w[0] <= w[1]),
        "priority broken: {kept:?}"
    );
    for kind in [Kept::Full, Kept::Core, Kept::Nothing] {
        assert!(kept.contains(&kind), "no {kind:?} cell: {kept:?}");
    }
    // What was left out is counted, series by series.
    let dropped = |what: &str| {
        samples
            .iter()
            .find(|s| {
                s.name == "tokentap_metrics_series_dropped_total"
                    && s.label("what").as_deref() == Some(what)
            })
            .map(|s| s.value)
            .unwrap()
    };
    // Per cell: a requests counter per outcome (Outcome::ALL, `shed` included) and 3 token counters.
    let core_cost = (tokentap::meter::record::Outcome::ALL.len() as u64 + 3)
        + CELL_CORE_HISTOGRAMS
            .iter()
            .map(|n| histogram_series(n))
            .sum::<u64>();
    let detail_cost = CELL_DETAIL_HISTOGRAMS
        .iter()
        .map(|n| histogram_series(n))
        .sum::<u64>();
    eprintln!(
        "figure: a cell costs {} series, {core_cost} of them core",
        core_cost + detail_cost
    );
    let count = |kind: Kept| kept.iter().filter(|k| **k == kind).count() as f64;
    assert_eq!(
        dropped("cell_detail"),
        count(Kept::Core) * detail_cost as f64
    );
    assert_eq!(
        dropped("cell"),
        count(Kept::Nothing) * (core_cost + detail_cost) as f64
    );
    // Requests still count everywhere else (the production matrix keeps every cell).
    still_serves(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_whose_clients_stop_reading_are_cut_at_the_send_stall_timeout() {
    // Two exports hold both slots and their clients never read: each is cut at the send-stall
    // deadline (counted on the admin listener), its slot freed, and the next export is served.
    let dir = std::env::temp_dir().join(format!(
        "tokentap-fault-export-stall-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    // 200,000 rows: ~34 MB of trace, far more than the sockets' buffers hold.
    tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || fill_capture_with(&dir, 200_000)
    })
    .await
    .unwrap();
    let upstream = upstream_with(|_| Script::sse(vec![chunk("a", "1"), done()])).await;
    let served = Served::start(
        &upstream.url(),
        &format!(
            "[proxy]\nsend_stall_timeout = \"3s\"\n[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[workload]\ncapture = true\n[store]\ndata_dir = \"{}\"\n",
            dir.display()
        ),
        None,
    );
    let a = export_head(served.admin).await;
    let b = export_head(served.admin).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let url = format!("http://{}/workload?window=1s", served.admin);
    assert_eq!(get(&url).await.status, 503);
    // The clients keep their connections open (a and b are alive) and read nothing.
    let start = Instant::now();
    let status = wait::eventually(Duration::from_secs(20), async || {
        match get(&url).await.status {
            200 => Ok(200),
            other => Err(other),
        }
    })
    .await
    .unwrap_or_else(|status| status);
    let freed = start.elapsed();
    assert_eq!(status, 200, "stalled exports kept their slots");
    let metrics = get(&format!("http://{}/metrics", served.admin))
        .await
        .text();
    let stalled = sample(
        &metrics,
        "tokentap_faults_total",
        &["listener=\"admin\"", "fault=\"send_stalled\""],
    );
    eprintln!(
        "figure: two unread exports cut at a 3 s send-stall timeout; a slot free after {freed:?}"
    );
    assert!(stalled >= Some(1.0), "{stalled:?}");
    drop((a, b));
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Do no harm: a hostile upstream must not make a request run twice, hand one client's
// bytes to another, or turn a truncation into nothing. Each case runs through both upstream
// clients: the inline pool (`proxy::relay`, the default for HTTP/1, plain or TLS) and
// hyper-util's client (`upstream.inline_connections = false`), and again through a TLS
// upstream (`Transport::Tls`) with the inline pool.

/// How the hostile upstream is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Plain,
    /// TLS 1.3 by rustls with a certificate of a throwaway CA (`upstream.tls_ca`); rustls sends
    /// its session tickets right after the handshake, as servers do.
    Tls,
}

/// What a hostile upstream does after reading a request.
#[derive(Debug, Clone)]
enum Act {
    Write(Vec<u8>),
    Sleep(Duration),
    /// A TCP reset (linger 0, then close).
    Reset,
    /// A close (FIN).
    Close,
}

/// One request as the hostile upstream read it.
#[derive(Debug, Clone)]
struct Heard {
    method: String,
    target: String,
}

/// A raw HTTP/1 upstream: for each request it reads the head, then the body by its length
/// unless the plan says to answer first (`read_body` false), then does what the plan says.
/// Every request line it read is logged.
struct Hostile {
    addr: SocketAddr,
    heard: Arc<Mutex<Vec<Heard>>>,
    task: tokio::task::JoinHandle<()>,
    /// The certificates of a TLS upstream.
    pki: Option<common::pki::Pki>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Plan = Arc<dyn Fn(&Heard) -> (bool, Vec<Act>) + Send + Sync>;

impl Hostile {
    async fn start_over(
        transport: Transport,
        plan: impl Fn(&Heard) -> (bool, Vec<Act>) + Send + Sync + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heard: Arc<Mutex<Vec<Heard>>> = Arc::default();
        let log = Arc::clone(&heard);
        let plan: Plan = Arc::new(plan);
        let pki = (transport == Transport::Tls).then(|| common::pki::Pki::new("hostile"));
        let acceptor = pki
            .as_ref()
            .map(|pki| common::pki::acceptor(pki, &[b"http/1.1"]));
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (log, plan, acceptor) = (Arc::clone(&log), Arc::clone(&plan), acceptor.clone());
                tokio::spawn(async move {
                    let _ = match acceptor {
                        None => hostile_connection(socket, log, plan).await,
                        Some(acceptor) => match acceptor.accept(socket).await {
                            Ok(tls) => hostile_connection(tls, log, plan).await,
                            Err(error) => Err(error),
                        },
                    };
                });
            }
        });
        Self {
            addr,
            heard,
            task,
            pki,
        }
    }

    fn url(&self) -> String {
        match self.pki {
            None => format!("http://{}", self.addr),
            Some(_) => format!("https://{}", self.addr),
        }
    }

    /// The `[upstream]` lines a proxy needs for it besides its URL (the CA of a TLS one).
    fn upstream_keys(&self) -> String {
        match &self.pki {
            None => String::new(),
            Some(pki) => format!("tls_ca = \"{}\"", pki.path("ca.pem")),
        }
    }

    fn count(&self, method: &str, path_start: &str) -> usize {
        self.heard
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.method == method && h.target.starts_with(path_start))
            .count()
    }
}

/// The hostile upstream's side of a connection, plain or TLS.
trait HostileSocket: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {
    /// The TCP socket under it, for a reset.
    fn tcp(&self) -> &TcpStream;
}

impl HostileSocket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl HostileSocket for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

async fn hostile_connection(
    mut socket: impl HostileSocket,
    log: Arc<Mutex<Vec<Heard>>>,
    plan: Plan,
) -> std::io::Result<()> {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut more = [0u8; 4096];
            let n = socket.read(&mut more).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&more[..n]);
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
        buffer.drain(..end);
        let mut words = head.split_whitespace();
        let heard = Heard {
            method: words.next().unwrap_or("").to_uppercase(),
            target: words.next().unwrap_or("").to_string(),
        };
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let (read_body, acts) = plan(&heard);
        if read_body {
            while buffer.len() < length {
                let mut more = [0u8; 4096];
                let n = socket.read(&mut more).await?;
                if n == 0 {
                    return Ok(());
                }
                buffer.extend_from_slice(&more[..n]);
            }
            buffer.drain(..length);
        }
        log.lock().unwrap().push(heard);
        for act in acts {
            match act {
                Act::Write(bytes) => {
                    socket.write_all(&bytes).await?;
                    // TLS: out of rustls and into the socket now, as one write.
                    socket.flush().await?;
                }
                Act::Sleep(pause) if pause.is_zero() => {}
                Act::Sleep(pause) => tokio::time::sleep(pause).await,
                Act::Reset => {
                    socket.tcp().set_zero_linger()?;
                    return Ok(());
                }
                // TLS: a close_notify, then the FIN.
                Act::Close => {
                    socket.shutdown().await?;
                    return Ok(());
                }
            }
        }
    }
}

/// A 200 answer with this body, framed by its length, kept alive.
fn answer(body: &str, extra_headers: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra_headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The two upstream clients, as the `[upstream]` key that selects each.
const UPSTREAM_CLIENTS: [(&str, &str); 2] = [
    ("inline", "inline_connections = true"),
    ("hyper", "inline_connections = false"),
];

/// Longer than `upstream.pool_reuse_after` (50 ms by default): a kept-alive connection idle
/// this long carries the next request.
const PAST_REUSE_AFTER: Duration = Duration::from_millis(80);

/// The `[upstream]` lines of a proxy in front of `upstream` through the client `key` selects.
fn upstream_lines(upstream: &Hostile, key: &str) -> String {
    format!("{key}\n{}", upstream.upstream_keys())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_upstream_read_is_never_sent_twice() {
    never_sent_twice(Transport::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_a_tls_upstream_read_is_never_sent_twice() {
    never_sent_twice(Transport::Tls).await;
}

async fn never_sent_twice(transport: Transport) {
    // Each POST is read whole, then the connection is reset (or closed) without an answer.
    // Before it, a GET leaves a kept-alive connection in the pool, and the POST waits until
    // that connection has settled, so it goes out on a reused connection: the case a client
    // may retry, but only if the request never left.
    for (client, key) in UPSTREAM_CLIENTS {
        for ending in [Act::Reset, Act::Close] {
            let upstream = Hostile::start_over(transport, {
                let ending = ending.clone();
                move |heard| {
                    if heard.method == "POST" {
                        (true, vec![ending.clone()])
                    } else {
                        (true, vec![Act::Write(answer("{}", ""))])
                    }
                }
            })
            .await;
            let (server, records) =
                proxy_with(&upstream.url(), "", &upstream_lines(&upstream, key)).await;
            let rounds = 8;
            for round in 0..rounds {
                let warm = get(&format!("http://{}/v1/models", server.proxy_addr)).await;
                assert_eq!(warm.status, 200, "{client} {transport:?}");
                tokio::time::sleep(PAST_REUSE_AFTER).await;
                let response = post(
                    &format!("http://{}/v1/chat/completions", server.proxy_addr),
                    r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                )
                .await;
                assert_eq!(
                    response.status, 502,
                    "{client} {transport:?} {ending:?} round {round}"
                );
            }
            assert_eq!(
                upstream.count("POST", "/v1/chat/completions"),
                rounds,
                "{client} {transport:?} {ending:?}: the upstream saw a request more than once"
            );
            let records = records.wait_for(rounds).await;
            assert!(
                records.iter().all(|r| r.outcome == Outcome::UpstreamError),
                "{client} {transport:?}: {:?}",
                records.iter().map(|r| r.outcome).collect::<Vec<_>>()
            );
            server.shutdown().await;
        }
    }
}

/// The kinds of stray bytes: after a body framed by its length, after a 204 and after a
/// HEAD answer, each time a whole other answer arriving `late`.
fn stray_plan(late: Duration) -> impl Fn(&Heard) -> (bool, Vec<Act>) + Send + Sync + 'static {
    move |heard| {
        let id = heard.target.split("id=").nth(1).unwrap_or("?").to_string();
        let stray = answer(r#"{"stray":true}"#, "x-id: stray\r\n");
        let first = if heard.method == "HEAD" {
            format!("HTTP/1.1 200 OK\r\nx-id: {id}\r\ncontent-length: 14\r\n\r\n").into_bytes()
        } else if heard.target.contains("kind=204") {
            format!("HTTP/1.1 204 No Content\r\nx-id: {id}\r\n\r\n").into_bytes()
        } else {
            answer(&format!(r#"{{"id":"{id}"}}"#), &format!("x-id: {id}\r\n"))
        };
        (
            true,
            vec![Act::Write(first), Act::Sleep(late), Act::Write(stray)],
        )
    }
}

/// Whether one good client got its own answer, another's, or a failure.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    own: usize,
    wrong: usize,
    failed: usize,
}

async fn stray_round(proxy: SocketAddr, id: usize, tally: &Mutex<Tally>) {
    let kind = ["length", "204", "head"][id % 3];
    let url = format!("http://{proxy}/v1/models?kind={kind}&id={id}");
    let method = if kind == "head" { "HEAD" } else { "GET" };
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = send(request).await;
    let own = response
        .headers
        .get("x-id")
        .is_some_and(|v| v.as_bytes() == id.to_string().as_bytes());
    let mut tally = tally.lock().unwrap();
    if response.status >= 500 {
        tally.failed += 1;
    } else if own && !response.text().contains("stray") {
        tally.own += 1;
    } else {
        tally.wrong += 1;
    }
}

/// 90 good clients, `workers` at a time, against an upstream that sends a stray answer
/// `late` after each of its answers; `pause` between one worker's requests.
async fn stray_run(
    transport: Transport,
    key: &str,
    late: Duration,
    workers: usize,
    pause: Duration,
) -> (Tally, f64) {
    let upstream = Hostile::start_over(transport, stray_plan(late)).await;
    let (server, _records) = proxy_with(&upstream.url(), "", &upstream_lines(&upstream, key)).await;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let per_worker = 90 / workers;
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let (tally, proxy) = (Arc::clone(&tally), server.proxy_addr);
        tasks.push(tokio::spawn(async move {
            for n in 0..per_worker {
                stray_round(proxy, worker * per_worker + n, &tally).await;
                tokio::time::sleep(pause).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    server.shutdown().await;
    let tally = *tally.lock().unwrap();
    (tally, faults(&metrics, "upstream_stray_bytes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_upstream_bytes_never_reach_another_client() {
    stray_bytes_reach_no_other_client(Transport::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_bytes_from_a_tls_upstream_never_reach_another_client() {
    let _cores = common::cores::busy().await;
    // Over TLS the idle check reads what arrived into rustls: the session tickets rustls sends
    // after every handshake are no stray bytes, the stray answers are.
    stray_bytes_reach_no_other_client(Transport::Tls).await;
}

async fn stray_bytes_reach_no_other_client(transport: Transport) {
    let (inline_key, hyper_key) = (UPSTREAM_CLIENTS[0].1, UPSTREAM_CLIENTS[1].1);
    for late in [Duration::from_millis(3), Duration::from_millis(30)] {
        // Stray bytes that arrive before the connection is reused: no client may see them,
        // whichever upstream client carries the requests (the inline pool peeks the socket;
        // hyper's connection task reads them and closes).
        let settle = late + Duration::from_millis(20);
        let (inline, strays) = stray_run(transport, inline_key, late, 1, settle).await;
        assert_eq!(
            (inline.wrong, inline.own),
            (0, 90),
            "inline, {transport:?}, {late:?} late, reuse after: {inline:?}"
        );
        assert!(strays >= 1.0, "the stray bytes were not counted: {strays}");

        // Back to back: a connection carries the next request only once it has sat idle
        // `upstream.pool_reuse_after` (50 ms) and its socket showed nothing then, so bytes
        // sent up to then reach no other client, from the first reuse on. (Bytes that arrive
        // after the next request was written cannot be told from its answer in HTTP/1.)
        let (inline, _) = stray_run(transport, inline_key, late, 6, Duration::ZERO).await;
        let (hyper, _) = stray_run(transport, hyper_key, late, 6, Duration::ZERO).await;
        eprintln!(
            "figure: {transport:?}, {late:?} late, back to back: inline {inline:?}, hyper {hyper:?}"
        );
        assert_eq!(
            (inline.wrong, inline.own),
            (0, 90),
            "inline, {transport:?}, {late:?} late, back to back (hyper: {hyper:?})"
        );
    }
}

/// hyper-util's client (`inline_connections = false`) cannot hold an HTTP/1 connection back
/// until it has settled (it reuses one the moment its answer ends), so it reuses none: stray
/// bytes, at once or late, never reach another client, and no request is failed by another's
/// (round 6 found 17–26 of 90 answers crossed and 5–6 spurious 502s, back to back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_s_client_hands_no_stray_bytes_to_another_client_and_fails_none() {
    let hyper_key = UPSTREAM_CLIENTS[1].1;
    for late in [
        Duration::ZERO,
        Duration::from_millis(3),
        Duration::from_millis(30),
    ] {
        for workers in [1, 6] {
            let (hyper, _) =
                stray_run(Transport::Plain, hyper_key, late, workers, Duration::ZERO).await;
            eprintln!("figure: hyper's client, {late:?} late, {workers} at a time: {hyper:?}");
            // Every answer of this upstream is good: its stray bytes come after it.
            assert_eq!(
                (hyper.wrong, hyper.failed, hyper.own),
                (0, 0, 90),
                "hyper, {late:?} late, {workers} at a time"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_answer_reaches_the_client_as_a_truncation() {
    truncation_forwarded(Transport::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_answer_from_a_tls_upstream_reaches_the_client_as_a_truncation() {
    truncation_forwarded(Transport::Tls).await;
}

async fn truncation_forwarded(transport: Transport) {
    // The head, ten bytes of a hundred, and the close: all in one write (over TLS, the close
    // is a close_notify right after it), so the proxy reads the close together with the head.
    let truncated = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 100\r\n\r\n0123456789".to_vec();
    for (client, key) in UPSTREAM_CLIENTS {
        let upstream = Hostile::start_over(transport, {
            let truncated = truncated.clone();
            move |heard| {
                if heard.target.starts_with("/v1/models") {
                    (true, vec![Act::Write(answer(r#"{"data":[]}"#, ""))])
                } else {
                    (true, vec![Act::Write(truncated.clone()), Act::Close])
                }
            }
        })
        .await;
        let (server, records) =
            proxy_with(&upstream.url(), "", &upstream_lines(&upstream, key)).await;
        let client = format!("{client} {transport:?}");
        // A passthrough route.
        let response = get(&format!("http://{}/v1/files/1", server.proxy_addr)).await;
        assert_eq!(response.status, 200, "{client}");
        assert_eq!(response.text(), "0123456789", "{client}");
        assert!(
            response.error.is_some(),
            "{client}: the truncation was hidden"
        );
        // The same on the wire, read to the close.
        let raw = raw_exchange(
            server.proxy_addr,
            "GET /v1/files/1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{client}: {raw:?}");
        assert!(raw.ends_with("0123456789"), "{client}: {raw:?}");
        // A metered route (a non-streamed chat answer).
        let response = post(
            &format!("http://{}/v1/chat/completions", server.proxy_addr),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
        assert_eq!(response.text(), "0123456789", "{client}");
        assert!(response.error.is_some(), "{client}");
        assert_eq!(
            records.wait_for(1).await[0].outcome,
            Outcome::UpstreamAborted,
            "{client}"
        );
        assert_eq!(
            server.proxy.faults.get(Fault::UpstreamAborted),
            3,
            "{client}: every broken answer is counted"
        );
        still_serves(&server).await;
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_and_a_close_fail_no_later_request() {
    // The inline pool sees the close before the next request, at once after the answer and
    // 2 ms later (the keep-alive race): a connection waits `pool_reuse_after` before its next
    // request. hyper-util's client (`inline_connections = false`) does not wait: it usually
    // sees an immediate close first, but on a loaded machine a GET now and then meets the
    // closing connection and fails (a 502, never sent twice: docs/operations.md), so it is
    // not held to this.
    let cases = [
        ("inline", "inline_connections = true", Duration::ZERO),
        (
            "inline",
            "inline_connections = true",
            Duration::from_millis(2),
        ),
    ];
    early_answer_then_close(Transport::Plain, &cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_and_a_close_from_a_tls_upstream_fail_no_later_request() {
    // The close is a close_notify (then the reset of the unread upload).
    let cases = [
        ("inline", "inline_connections = true", Duration::ZERO),
        (
            "inline",
            "inline_connections = true",
            Duration::from_millis(2),
        ),
    ];
    early_answer_then_close(Transport::Tls, &cases).await;
}

/// The upstream answers an upload before reading its body, then closes (a reset: the body is
/// still unread); a GET in between and after must never meet that connection.
async fn early_answer_then_close(transport: Transport, cases: &[(&str, &str, Duration)]) {
    for &(client, key, close_after) in cases {
        let upstream = Hostile::start_over(transport, move |heard| {
            if heard.method == "POST" {
                (
                    false,
                    vec![
                        Act::Write(answer(r#"{"early":true}"#, "")),
                        Act::Sleep(close_after),
                        Act::Close,
                    ],
                )
            } else {
                (true, vec![Act::Write(answer(r#"{"data":[]}"#, ""))])
            }
        })
        .await;
        let (server, _records) =
            proxy_with(&upstream.url(), "", &upstream_lines(&upstream, key)).await;
        let upload = "x".repeat(64 * 1024);
        let mut failed = Vec::new();
        for round in 0..45 {
            // The early answer itself may be lost: the reset that follows it can reach the
            // proxy while it still writes the upload (hyper then fails the request).
            let _ = post(&format!("http://{}/v1/files", server.proxy_addr), &upload).await;
            let after = get(&format!("http://{}/v1/models", server.proxy_addr)).await;
            if after.status != 200 || after.error.is_some() {
                failed.push((round, after.status, after.text(), after.error));
            }
        }
        assert!(
            failed.is_empty(),
            "{client} {transport:?}, close {close_after:?} after the answer: later requests failed: {failed:?}"
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn engine_control_routes_are_refused_on_the_data_port_unless_opened() {
    let upstream = upstream_with(|_| Script::json(200, r#"{"ok":true}"#)).await;
    let (server, _records) = proxy_with(&upstream.url(), "", "").await;
    let base = format!("http://{}", server.proxy_addr);
    for (method, path) in [
        ("POST", "/flush_cache"),
        ("GET", "/flush_cache"),
        ("POST", "/flush%5Fcache"),
        ("POST", "//update_weights_from_disk"),
        ("POST", "/abort_request"),
        ("POST", "/start_profile"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/sleep"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/slots/0?action=erase"),
        // vLLM's SageMaker aliases of LoRA loading, and the scale-out twin of its abort.
        ("POST", "/adapters"),
        ("DELETE", "/adapters/my-lora"),
        ("POST", "/inference/v1/abort_requests"),
        // uvicorn reads `%FF` as U+FFFD: sglang's `/dumper/{method}`.
        ("POST", "/%64umper/x%FF"),
        // No engine serves these: refused too (fail closed).
        ("POST", "/FLUSH_CACHE"),
        ("GET", "/internal/debug"),
    ] {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = send(request).await;
        assert_eq!(response.status, 403, "{method} {path}");
        let text = response.text();
        assert!(text.contains("proxy.routes"), "{text}");
        assert!(text.contains("route_refused"), "{text}");
    }
    assert!(
        upstream.requests().is_empty(),
        "a control route reached the upstream: {:?}",
        upstream
            .requests()
            .iter()
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );
    // Inference, model listing, health and the engine's own metrics pass.
    for path in [
        "/v1/models",
        "/health",
        "/metrics",
        "/get_model_info",
        "/version",
    ] {
        assert_eq!(get(&format!("{base}{path}")).await.status, 200, "{path}");
    }
    let chat = post(&format!("{base}/v1/chat/completions"), CHAT_WITH_USAGE).await;
    assert_eq!(chat.status, 200);
    assert_eq!(server.proxy.faults.get(Fault::RouteRefused), 16);
    // A target without a leading `/` is the client's mistake: 400, never a 502.
    let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
    socket
        .write_all(b"OPTIONS * HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    socket.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 400");
    assert_eq!(server.proxy.faults.get(Fault::PathUnreadable), 1);
    let malformed = post(&format!("{base}/v1/chat%zzcompletions"), "{}").await;
    assert_eq!(malformed.status, 400, "{}", malformed.text());
    assert!(malformed.text().contains("bad_request_target"));
    server.shutdown().await;

    // Opened one by one, or all of them.
    for (routes, flush, abort) in [
        (r#"routes = ["safe", "/flush_cache"]"#, 200, 403),
        (r#"routes = "all""#, 200, 200),
        (r#"routes = ["/v1/*"]"#, 403, 403),
    ] {
        let (server, _records) = proxy_with(&upstream.url(), routes, "").await;
        let base = format!("http://{}", server.proxy_addr);
        assert_eq!(
            post(&format!("{base}/flush_cache"), "{}").await.status,
            flush,
            "{routes}"
        );
        assert_eq!(
            post(&format!("{base}/abort_request"), "{}").await.status,
            abort,
            "{routes}"
        );
        assert_eq!(
            get(&format!("{base}/v1/models")).await.status,
            200,
            "{routes}"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_client_that_never_answers_the_ping_is_closed_at_the_idle_limit() {
    // A raw HTTP/2 client: the preface, its SETTINGS, one GET, then it reads and throws away
    // whatever comes (the GOAWAY, the PING of the graceful close) and answers nothing. The
    // keep-alive pings stay at their defaults (every 30 s, 10 s to answer): the close must
    // come from the idle limit (1 s here), not from them.
    let upstream = upstream_with(|_| Script::json(200, "{}")).await;
    let (server, _records) = proxy_with(&upstream.url(), "header_read_timeout = \"1s\"", "").await;
    let mut socket = TcpStream::connect(server.proxy_addr).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    let mut block = vec![0x82, 0x86, 0x44, 10];
    block.extend_from_slice(b"/v1/models");
    block.extend_from_slice(&[0x41, 1, b'x']);
    hello.extend_from_slice(&[0, 0, block.len() as u8, 1, 0x05, 0, 0, 0, 1]); // HEADERS
    hello.extend_from_slice(&block);
    socket.write_all(&hello).await.unwrap();
    let sent = Instant::now();
    let mut scratch = [0u8; 4096];
    let mut answered = None;
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match socket.read(&mut scratch).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {
                    answered.get_or_insert_with(Instant::now);
                }
            }
        }
    })
    .await;
    let closed = closed.expect("the deaf HTTP/2 client's connection stayed open for 20 s");
    let answered = answered.expect("no answer to the GET");
    let after = closed.duration_since(answered);
    eprintln!(
        "figure: a deaf idle HTTP/2 client was closed {after:?} after its answer (idle limit 1 s; request sent {:?} before)",
        answered.duration_since(sent)
    );
    assert!(after >= Duration::from_millis(900), "{after:?}");
    assert!(after <= Duration::from_millis(3000), "{after:?}");
    assert_eq!(server.proxy.faults.get(Fault::IdleClosed), 1);
    server.shutdown().await;
}

/// Held answers have one memory budget (`metering.max_held_bytes`): 50 clients whose
/// non-streamed answers are 8 MB each, over HTTP/1.1 connections of their own and as 50
/// streams of one HTTP/2 connection, with their timing asked (held whole for the header) and
/// not (copied for metering), make the proxy's peak memory grow by at most the budget plus a
/// stated margin (the connections' own buffers). Without the budget the same load held every
/// answer: +391 MiB (+774 MiB with timing asked). Every answer reaches its client whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_answers_stay_within_one_memory_budget_over_http1_and_http2() {
    let _cores = common::cores::busy().await;
    // 8 MB: within `metering.max_parse_bytes` (8 MiB), so each one is held when the budget allows.
    const ANSWER: usize = 8_000_000;
    const CLIENTS: usize = 50;
    const BUDGET: u64 = 32 << 20;
    // What 100 connections' buffers and the allocator's slack may add: hyper's write buffers,
    // the upstream read buffers, HTTP/2 stream windows, and glibc's per-thread arenas (the test
    // build's allocator), each of which keeps freed 8 MB blocks for its own thread.
    const MARGIN: u64 = 64 << 20;
    let answer = {
        let filler = "x".repeat(ANSWER - 120);
        let text = format!(
            r#"{{"id":"big","object":"chat.completion","choices":[{{"index":0,"message":{{"content":"{filler}"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":7}}}}"#
        );
        Bytes::from(text)
    };
    let length = answer.len();
    let sent = answer.clone();
    let upstream = upstream_with(move |_| {
        // Sent in 256 KiB pieces a few milliseconds apart, so the 50 answers are in flight
        // together.
        let mut steps = Vec::new();
        let mut at = 0;
        while at < sent.len() {
            let end = (at + (256 << 10)).min(sent.len());
            steps.push(Step::Send(sent.slice(at..end)));
            steps.push(Step::Wait(Duration::from_millis(5)));
            at = end;
        }
        let mut script = Script::json(200, "");
        script.steps = steps;
        script
            .headers
            .push(("content-length", sent.len().to_string()));
        script
    })
    .await;
    let served = Served::start(
        &upstream.url(),
        &format!(
            "[upstream]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[metering]\nserver_timing = \"on_request\"\nmax_held_bytes = {BUDGET}\n"
        ),
        None,
    );
    let url = format!("http://{}/v1/chat/completions", served.proxy);
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let request = |timing: bool| {
        let mut request = http::Request::post(&url).header("content-type", "application/json");
        if timing {
            request = request.header("x-tokentap-timing", "1");
        }
        request
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    // Reads an answer to its end without keeping it: its length, first and last bytes.
    async fn drain(response: http::Response<hyper::body::Incoming>) -> (u16, usize, u8, u8) {
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let (mut length, mut first, mut last) = (0, 0, 0);
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                if length == 0 && !data.is_empty() {
                    first = data[0];
                }
                if let Some(byte) = data.last() {
                    last = *byte;
                }
                length += data.len();
            }
        }
        (status, length, first, last)
    }
    // One answer first: the process at rest, every lazy allocation made.
    let warm = drain(client().request(request(true)).await.unwrap()).await;
    assert_eq!(warm, (200, length, b'{', b'}'));
    let before = served.rss().unwrap();

    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    for timing in [false, true] {
        // HTTP/1.1: a connection per client.
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let request = request(timing);
            tasks.push(tokio::spawn(async move {
                let client = client();
                drain(client.request(request).await.unwrap()).await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), (200, length, b'{', b'}'));
        }
        // HTTP/2: one connection, 50 streams.
        let stream = TcpStream::connect(served.proxy).await.unwrap();
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let mut sender = sender.clone();
            let request = request(timing);
            tasks.push(tokio::spawn(async move {
                drain(sender.send_request(request).await.unwrap()).await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), (200, length, b'{', b'}'));
        }
        let peak = served.peak_rss().unwrap();
        let growth = peak.saturating_sub(before);
        eprintln!(
            "figure: 50 × 8 MiB answers, timing asked {timing}: RSS {:.1} MiB at rest, peak {:.1} MiB, growth {:.1} MiB (budget {:.0} + margin {:.0})",
            mib(before),
            mib(peak),
            mib(growth),
            mib(BUDGET),
            mib(MARGIN)
        );
        assert!(
            growth <= BUDGET + MARGIN,
            "held answers grew the proxy by {:.1} MiB (budget {:.0} MiB + margin {:.0} MiB)",
            mib(growth),
            mib(BUDGET),
            mib(MARGIN)
        );
    }
    let metrics = get(&format!("http://{}/metrics", served.admin))
        .await
        .text();
    let unheld = sample(
        &metrics,
        "tokentap_faults_total",
        &["listener=\"proxy\"", "fault=\"answer_unheld\""],
    )
    .unwrap();
    assert!(unheld > 0.0, "answers past the budget are counted");
}

/// A non-streamed answer whose head declares nearly the whole held-answer budget and then
/// stalls reserves only what arrives (and a first piece), not the whole of it until the
/// upstream's timeouts: other answers are still held, and their usage read, meanwhile (before:
/// every one of them passed unheld, `answer_unheld`, its usage unread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_content_length_does_not_take_the_held_budget_from_other_answers() {
    const BUDGET: usize = 1 << 20;
    const HONEST: usize = 8;
    let upstream = upstream_with(|request| {
        if request.body.windows(4).any(|w| w == b"liar") {
            // A head for BUDGET - 1,000 bytes, ten of them, then nothing for longer than the
            // test runs.
            let mut script = Script::json(200, "");
            script.steps = vec![
                Step::Send(Bytes::from_static(b"{\"id\":\"li")),
                Step::Wait(Duration::from_secs(60)),
            ];
            script
                .headers
                .push(("content-length", (BUDGET - 1000).to_string()));
            return script;
        }
        let filler = "x".repeat(2000);
        let body = format!(
            r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{{"content":"{filler}"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":7}}}}"#
        );
        let mut script = Script::json(200, &body);
        script.headers.push(("content-length", body.len().to_string()));
        script
    })
    .await;
    let (server, records) = proxy_with(
        &upstream.url(),
        &format!("[metering]\nmax_held_bytes = {BUDGET}"),
        "",
    )
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let liar = tokio::spawn({
        let url = url.clone();
        async move {
            post(
                &url,
                r#"{"model":"m","user":"liar","messages":[{"role":"user","content":"hi"}]}"#,
            )
            .await
        }
    });
    // The liar's head has reached the proxy and its copy begun.
    let held = wait::eventually(Duration::from_secs(10), async || {
        match server.proxy.held_budget.held() {
            0 => Err(0),
            held => Ok(held),
        }
    })
    .await;
    eprintln!(
        "figure: a head declaring {} bytes holds {held:?} of the {BUDGET}-byte budget",
        BUDGET - 1000
    );
    for _ in 0..HONEST {
        let response = post(
            &url,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .await;
        assert_eq!(response.status, 200);
        assert!(response.text().ends_with("\"completion_tokens\":7}}"));
    }
    let records = records.wait_for(HONEST).await;
    let read: Vec<u64> = records.iter().map(|r| r.tokens.completion).collect();
    assert_eq!(
        server.proxy.faults.get(Fault::AnswerUnheld),
        0,
        "answers passed unheld beside the liar (usage read: {read:?})"
    );
    assert!(read.iter().all(|&c| c == 7), "usage unread: {read:?}");
    assert!(
        held.is_ok_and(|held| held <= 64 << 10),
        "the liar holds {held:?}"
    );
    liar.abort();
    server.shutdown().await;
}

/// sglang runs `custom_logit_processor` as code (a pickle it loads, with
/// `--enable-custom-logit-processor`): a request carrying it, however its key is written, is
/// refused on every route sglang reads it from, naming the flag and `proxy.code_fields`; one
/// whose body is too long to be checked is refused too; one without it passes, and
/// `proxy.code_fields = "forward"` forwards it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_an_engine_runs_as_code_are_refused_unless_opened() {
    let upstream = upstream_with(|_| Script::json(200, r#"{"ok":true}"#)).await;
    let (server, _records) = proxy_with(&upstream.url(), "", "").await;
    let base = format!("http://{}", server.proxy_addr);
    for (path, body) in [
        (
            "/generate",
            r#"{"text":"hi","custom_logit_processor":"8004"}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[],"custom\u005flogit_processor":"8004"}"#,
        ),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"hi","custom_logit_processor":"8004"}"#,
        ),
        (
            "/invocations",
            r#"{"messages":[],"custom_logit_processor":"8004"}"#,
        ),
        (
            "/vertex_generate",
            r#"{"instances":[],"parameters":{"custom_logit_processor":"8004"}}"#,
        ),
    ] {
        let refused = post(&format!("{base}{path}"), body).await;
        assert_eq!(refused.status, 403, "{path}");
        let text = refused.text();
        assert!(text.contains("--enable-custom-logit-processor"), "{text}");
        assert!(text.contains("proxy.code_fields"), "{text}");
    }
    assert!(
        upstream.requests().is_empty(),
        "a refused request reached the upstream"
    );
    // Without the field, and naming it only inside a prompt: forwarded.
    for (path, body) in [
        (
            "/generate",
            r#"{"text":"what does custom_logit_processor do?"}"#,
        ),
        (
            "/invocations",
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    ] {
        assert_eq!(
            post(&format!("{base}{path}"), body).await.status,
            200,
            "{path}"
        );
    }
    assert_eq!(server.proxy.faults.get(Fault::CodeFieldRefused), 5);
    server.shutdown().await;

    let (server, _records) = proxy_from_config(&format!(
        "[proxy]\ncode_fields = \"forward\"\n[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[metering]\nmax_parse_bytes = 64\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let opened = post(
        &format!("http://{}/generate", server.proxy_addr),
        r#"{"text":"hi","custom_logit_processor":"8004"}"#,
    )
    .await;
    assert_eq!(opened.status, 200);
    server.shutdown().await;

    // The parse limit at 64 bytes: a longer body is forwarded as it streams, scanned on the way.
    // With the field in what was read first: refused before anything goes upstream. With it
    // further on: the body is cut off before its end, so the upstream never has a whole
    // document to read it from. Without it: forwarded whole.
    let (server, _records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[metering]\nmax_parse_bytes = 64\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let generate = format!("http://{}/generate", server.proxy_addr);
    let padding = "x".repeat(200);
    let early = format!(r#"{{"custom_logit_processor":"8004","text":"{padding}"}}"#);
    assert_eq!(post(&generate, &early).await.status, 403);
    let late = format!(r#"{{"text":"{padding}","custom\u005flogit_processor":"8004"}}"#);
    let cut = post(&generate, &late).await;
    assert_ne!(cut.status, 200, "{}", cut.text());
    let clean = format!(r#"{{"text":"{padding}"}}"#);
    assert_eq!(post(&generate, &clean).await.status, 200);
    let whole: Vec<_> = upstream
        .requests()
        .into_iter()
        .filter(|r| r.path == "/generate")
        .map(|r| r.body)
        .collect();
    assert!(
        whole
            .iter()
            .all(|body| !body.windows(6).any(|w| w == b"\\u005f")),
        "a whole body with the field reached the upstream"
    );
    assert!(whole.iter().any(|body| body.as_ref() == clean.as_bytes()));
    server.shutdown().await;
}

/// Every refused path is logged once, with why and how to open it, and a client-sent path is
/// one printable line there (a percent-encoded newline cannot forge a log line); `RUST_LOG`
/// raises the level past `info` (it was capped there: `debug` printed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_logged_once_per_path_and_rust_log_raises_the_level() {
    let upstream = upstream_with(|_| Script::json(200, r#"{"choices":[]}"#)).await;
    let served = Served::start_logging(
        &upstream.url(),
        "[metering]\nmax_parse_bytes = 64\n",
        None,
        "debug",
    );
    let base = format!("http://{}", served.proxy);
    for _ in 0..3 {
        assert_eq!(post(&format!("{base}/flush_cache"), "{}").await.status, 403);
    }
    assert_eq!(
        post(&format!("{base}/x%0Aforged:%20line"), "{}")
            .await
            .status,
        403
    );
    let long = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(200)
    );
    assert_eq!(
        post(&format!("{base}/v1/chat/completions"), &long)
            .await
            .status,
        200
    );
    wait::until(
        "the refusals and the debug line logged",
        Duration::from_secs(10),
        || {
            let log = served.log();
            log.iter()
                .any(|l| l.contains("forwarded unmetered") && l.contains("DEBUG"))
                && log
                    .iter()
                    .any(|l| l.contains("refused on the data port") && l.contains("/x\\u{a}forged"))
        },
    )
    .await;
    let log = served.log();
    let flush: Vec<_> = log
        .iter()
        .filter(|l| l.contains("refused on the data port") && l.contains("/flush_cache"))
        .collect();
    assert_eq!(flush.len(), 1, "{log:#?}");
    assert!(flush[0].contains("proxy.routes"), "{}", flush[0]);
    assert!(!log.iter().any(|l| l.starts_with("forged")), "{log:#?}");
}

/// `serve` in front of a port where nothing listens yet (an engine still loading): it says
/// "upstream not answering" at start and `/readyz` is 503 naming it; once the upstream answers
/// anything there (a 404 is a server that is up), `/readyz` is 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_an_upstream_that_answers() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let served = Served::start(&url, "", None);
    wait::until("the start-up warning", Duration::from_secs(10), || {
        served
            .log()
            .iter()
            .any(|l| l.contains("upstream not answering") && l.contains(&url))
    })
    .await;
    let readyz = format!("http://{}/readyz", served.admin);
    let not_ready = get(&readyz).await;
    assert_eq!(not_ready.status, 503, "{}", not_ready.text());
    assert!(
        not_ready
            .text()
            .contains(&format!("at {url}/: not answering"))
            || not_ready
                .text()
                .contains(&format!("at {url}: not answering")),
        "{}",
        not_ready.text()
    );
    // The engine is up on that port: it answers every request 404.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = socket.read(&mut head).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    common::wait::until_async("/readyz 200", Duration::from_secs(15), async || {
        get(&readyz).await.status == 200
    })
    .await;
}

/// A streamed event that straddles frames is copied while it is open (by the scanner, and by
/// the edit queue when tokentap asked for the usage): those copies are inside
/// `metering.max_held_bytes` past a small free part each. An event the budget cannot cover
/// passes through untouched, its figures unread, and `fault="event_unheld"` counts it; the
/// stream goes on, and the next request is held as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_event_past_the_held_budget_passes_untouched() {
    let big = format!(
        r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{}"}}}}]}}"#,
        "x".repeat(300_000)
    );
    let big_for_upstream = big.clone();
    let upstream = upstream_with(move |_| {
        let mut steps = vec![data(r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#)];
        // The large event in ten writes: it straddles frames, so it is copied while open.
        let bytes = big_for_upstream.as_bytes();
        for piece in bytes.chunks(bytes.len() / 10 + 1) {
            steps.push(Step::Send(Bytes::copy_from_slice(piece)));
            steps.push(wait_ms(5));
        }
        steps.push(Step::Send(Bytes::from_static(b"\n\n")));
        steps.push(data(
            r#"{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}"#,
        ));
        steps.push(done());
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n[metering]\nmax_held_bytes = 65536\nmax_event_bytes = 1048576\n",
        upstream.url()
    ))
    .await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(response.status, 200);
    let text = response.text();
    assert!(
        text.contains(&big),
        "the large event reached the client whole"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
    let records = records.wait_for(1).await;
    assert_eq!(records[0].outcome, Outcome::Ok);
    // The two small events were read; the large one was not kept.
    assert_eq!(records[0].tokens.events, 2);
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    let unheld = sample(
        &metrics,
        "tokentap_faults_total",
        &["listener=\"proxy\"", "fault=\"event_unheld\""],
    )
    .unwrap_or(0.0);
    assert!(unheld >= 1.0, "counted: {unheld}");
    still_serves(&server).await;
    server.shutdown().await;
}
