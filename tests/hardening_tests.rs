//! Round 6's hostile findings and what real clients showed, each produced for real on loopback
//! against the real proxy: a field run as code reaching sglang by `PUT`, inside a zstd body, or
//! through a second upstream routed by `model`; a client that reads a stream to its end marker
//! and hangs up before the chunked terminator; another caller's sglang session closed or
//! continued; the conformance harness reading a real tokentap's refusals.
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
use hyper::Request;
use tokentap::meter::record::Outcome;

const FIELD_BODY: &str = r#"{"text":"hi","custom_logit_processor":"8004"}"#;

fn proxy_config(upstream: &str, extra: &str) -> String {
    format!(
        "[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n{extra}\n"
    )
}

async fn send_with(method: &str, url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Received2 {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(request.body(Full::new(Bytes::from(body))).unwrap()).await
}

/// sglang registers `/generate` (and `/encode`, `/classify`, `/v1/rerank`) for `PUT` as well as
/// `POST`: a `PUT` carrying the field is refused as the `POST` is, and a clean `PUT` is metered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_to_a_generation_route_is_checked_and_metered() {
    let upstream = ScriptedUpstream::start(|_| {
        Script::json(
            200,
            r#"{"text":"ok","meta_info":{"prompt_tokens":3,"completion_tokens":1}}"#,
        )
    })
    .await;
    let (server, records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    let url = format!("http://{}/generate", server.proxy_addr);
    let refused = send_with("PUT", &url, &[], FIELD_BODY.into()).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(refused.text().contains("custom_logit_processor"));
    assert!(upstream.requests().is_empty(), "the field reached sglang");
    let clean = send_with("PUT", &url, &[], br#"{"text":"hi"}"#.to_vec()).await;
    assert_eq!(clean.status, 200);
    let records = records.wait_for(1).await;
    assert_eq!(records[0].outcome, Outcome::Ok);
    server.shutdown().await;
}

/// A body sent `x-body-compressed: zstd` is what sglang reads decompressed: the field inside is
/// refused; a clean compressed body is forwarded byte for byte; a corrupt one, or one past the
/// parse limit once decompressed, cannot be checked and is refused naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_body_is_checked_as_sglang_decompresses_it() {
    use ruzstd::encoding::{compress_to_vec, CompressionLevel};
    let upstream = ScriptedUpstream::start(|_| Script::json(200, r#"{"text":"ok"}"#)).await;
    let (server, _records) = proxy_from_config(&proxy_config(
        &upstream.url(),
        "[metering]\nmax_parse_bytes = 4096\n",
    ))
    .await;
    let url = format!("http://{}/generate", server.proxy_addr);
    let zstd = [("x-body-compressed", "zstd")];
    // Made by the zstd tool (`zstd -19`): its literals are Huffman-coded, so the field's name
    // is nowhere in the bytes on the wire, as in any real compressed body.
    let hidden = include_bytes!("fixtures/compressed/custom-logit-processor.json.zst").to_vec();
    let hides = |needle: &[u8]| hidden.windows(needle.len()).any(|w| w == needle);
    assert!(
        !hides(b"custom_logit_processor") && !hides(b"\\u"),
        "the test's body shows the field on the wire"
    );
    let refused = send_with("POST", &url, &zstd, hidden).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(
        refused.text().contains("custom_logit_processor"),
        "{}",
        refused.text()
    );

    let corrupt = send_with("POST", &url, &zstd, b"\x28\xb5\x2f\xfd garbage".to_vec()).await;
    assert_eq!(corrupt.status, 403, "{}", corrupt.text());
    assert!(
        corrupt.text().contains("x-body-compressed"),
        "{}",
        corrupt.text()
    );

    let bomb = format!(r#"{{"text":"{}"}}"#, "a".repeat(64 * 1024));
    let bomb = compress_to_vec(bomb.as_bytes(), CompressionLevel::Fastest);
    assert!(bomb.len() < 4096, "compressed below the parse limit");
    let long = send_with("POST", &url, &zstd, bomb).await;
    assert_eq!(long.status, 403, "{}", long.text());
    assert!(long.text().contains("max_parse_bytes"), "{}", long.text());
    assert!(
        upstream.requests().is_empty(),
        "an unchecked body reached sglang"
    );

    let clean = compress_to_vec(&br#"{"text":"hi"}"#[..], CompressionLevel::Fastest);
    let forwarded = send_with("POST", &url, &zstd, clean.clone()).await;
    assert_eq!(forwarded.status, 200, "{}", forwarded.text());
    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].body.as_ref(),
        clean.as_slice(),
        "forwarded as it came"
    );
    server.shutdown().await;
}

/// vLLM is the default upstream and sglang serves model `s` as a second one: a request for `s`
/// is checked by sglang's fields (it goes there), one for vLLM's model is not held to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_field_check_follows_the_upstream_the_model_routes_to() {
    let vllm = ScriptedUpstream::start(|r| match r.path.as_str() {
        "/v1/models" => Script::json(
            200,
            r#"{"object":"list","data":[{"id":"v","object":"model","owned_by":"vllm"}]}"#,
        ),
        _ => Script::json(200, r#"{"choices":[{"text":"ok"}]}"#),
    })
    .await;
    let sglang = ScriptedUpstream::start(|r| match r.path.as_str() {
        "/v1/models" => Script::json(
            200,
            r#"{"object":"list","data":[{"id":"s","object":"model","owned_by":"sglang"}]}"#,
        ),
        _ => Script::json(200, r#"{"choices":[{"text":"ok"}]}"#),
    })
    .await;
    let (server, _records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[[upstreams]]\nname = \"s\"\nurl = \"{}\"\nmodels = [\"s\"]\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        vllm.url(),
        sglang.url()
    ))
    .await;
    let engines = || {
        let all = server.proxy.router.all();
        (
            all[0].engine().map(|e| e.spec().name),
            all[1].engine().map(|e| e.spec().name),
        )
    };
    wait::until("both engines known", Duration::from_secs(10), || {
        engines() == (Some("vllm"), Some("sglang"))
    })
    .await;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let to_sglang = r#"{"model":"s","prompt":"hi","custom_logit_processor":"8004"}"#;
    for _ in 0..2 {
        let refused = post(&url, to_sglang).await;
        assert_eq!(refused.status, 403, "{}", refused.text());
    }
    let completions = |u: &ScriptedUpstream| {
        u.requests()
            .into_iter()
            .filter(|r| r.path == "/v1/completions")
            .count()
    };
    assert_eq!(completions(&sglang), 0, "the field reached sglang");
    // vLLM runs no field as code: its own model's request is forwarded to it.
    let to_vllm = r#"{"model":"v","prompt":"hi","custom_logit_processor":"8004"}"#;
    assert_eq!(post(&url, to_vllm).await.status, 200);
    assert_eq!(completions(&vllm), 1);
    server.shutdown().await;
}

/// The OpenAI SDK, GuideLLM and httpx clients read a stream to `data: [DONE]` and close before
/// the chunked body's terminator: the request is complete, recorded `ok`, not `client_aborted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_after_the_end_marker_completed_its_request() {
    let upstream = ScriptedUpstream::start(|_| {
        let mut steps = vec![data(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
        )];
        for word in ["Hello", " there", "!"] {
            steps.push(data(&format!(
                r#"{{"choices":[{{"index":0,"delta":{{"content":"{word}"}}}}]}}"#
            )));
        }
        steps.push(data(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ));
        steps.push(data("[DONE]"));
        // The terminator comes late (uvicorn's last write after its handler returns).
        steps.push(wait_ms(3_000));
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    for _ in 0..3 {
        let request = Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            )))
            .unwrap();
        let response = client().request(request).await.unwrap();
        let mut body = response.into_body();
        let mut seen = Vec::new();
        while !seen.windows(6).any(|w| w == b"[DONE]") {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("a frame within 10 s")
                .expect("the stream goes on to [DONE]")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                seen.extend_from_slice(&data);
            }
        }
        drop(body); // hangs up before the terminator
    }
    let records = records.wait_for(3).await;
    for record in &records {
        assert_eq!(record.outcome, Outcome::Ok, "{record:?}");
        assert_eq!(record.tokens.completion, 3);
    }
    server.shutdown().await;
}

/// sglang's `bench_serving` asks `GET /server_info` (and `/get_server_info`): forwarded, with
/// every credential of the resolved server arguments masked — the members sglang 0.5.23 declares
/// (`arg_groups/fields/serving.py`: `api_key`, `admin_api_key`, `ssl_keyfile_password`; the
/// watermark's keys) and the flags in `launch_command` — and everything else as it came. vLLM's
/// development-mode `/server_info` likewise (`hf_token` in its JSON and its text form). An
/// answer that is not JSON is not forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_info_is_forwarded_with_its_credentials_masked() {
    const SGLANG: &str = r#"{"model_path":"/models/llama","api_key":"sk-user-1","admin_api_key":"sk-admin-2","ssl_keyfile":"/etc/key.pem","ssl_keyfile_password":"pem-pass-3","watermark_key":null,"max_total_num_tokens":65536,"launch_command":"python -m sglang.launch_server --model-path /models/llama --api-key sk-user-1 --admin-api-key=sk-admin-2 --port 30000","internal_states":[{"avg_spec_accept_length":2.5}],"version":"0.5.23","frontend":"python"}"#;
    const VLLM_JSON: &str = r#"{"vllm_config":{"model_config":{"model":"m","hf_token":"hf_secret_4"},"kv_transfer_config":{"kv_connector_extra_config":{"aws_secret_access_key":"aws-5"}}}}"#;
    const VLLM_TEXT: &str = r#"{"vllm_config":"model='m', hf_token='hf_secret_6', seed=0"}"#;
    let upstream = ScriptedUpstream::start(|r| match (r.path.as_str(), r.headers.get("x-form")) {
        ("/server_info", Some(form)) if form == "vllm-json" => Script::json(200, VLLM_JSON),
        ("/server_info", Some(form)) if form == "vllm-text" => Script::json(200, VLLM_TEXT),
        ("/server_info", Some(form)) if form == "html" => {
            Script::json(200, "<html>api_key=sk-7</html>")
        }
        _ => Script::json(200, SGLANG),
    })
    .await;
    let (server, _records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    let base = format!("http://{}", server.proxy_addr);
    for path in ["/server_info", "/get_server_info"] {
        let answer = get(&format!("{base}{path}")).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        let text = answer.text();
        for secret in ["sk-user-1", "sk-admin-2", "pem-pass-3"] {
            assert!(
                !text.contains(secret),
                "{secret} leaked from {path}: {text}"
            );
        }
        let document: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(document["max_total_num_tokens"], 65536);
        assert_eq!(
            document["internal_states"][0]["avg_spec_accept_length"],
            2.5
        );
        assert_eq!(
            document["ssl_keyfile"], "/etc/key.pem",
            "a path is not a secret"
        );
        assert_eq!(document["watermark_key"], serde_json::Value::Null);
        assert!(document["launch_command"]
            .as_str()
            .unwrap()
            .contains("--model-path /models/llama --api-key <redacted> --admin-api-key=<redacted> --port 30000"));
    }
    for (form, secret) in [("vllm-json", "hf_secret_4"), ("vllm-text", "hf_secret_6")] {
        let answer = send_with(
            "GET",
            &format!("{base}/server_info"),
            &[("x-form", form)],
            Vec::new(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(!answer.text().contains(secret), "{}", answer.text());
        assert!(!answer.text().contains("aws-5"), "{}", answer.text());
    }
    let html = send_with(
        "GET",
        &format!("{base}/server_info"),
        &[("x-form", "html")],
        Vec::new(),
    )
    .await;
    assert_eq!(html.status, 502, "{}", html.text());
    assert!(!html.text().contains("sk-7"));
    server.shutdown().await;
}

/// 300 logins from 60 addresses whose bodies come a byte every few seconds (the admin listener
/// allows 32 connections here): at most a few are read at once, each within its deadline, the
/// rest answered at once and closed — `/healthz`, `/readyz` and `/metrics` keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_login_bodies_cannot_take_the_admin_listener() {
    use tokio::io::AsyncWriteExt;
    let upstream = ScriptedUpstream::start(|_| Script::json(200, "{}")).await;
    let (server, _records) = proxy_from_config(&proxy_config(
        &upstream.url(),
        "[admin]\ntoken = \"a-long-enough-admin-token-for-tests\"\nmax_connections = 32\n",
    ))
    .await;
    let mut slow = Vec::new();
    for n in 0..300u32 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from((
                [127, 0, 9, (n % 60) as u8 + 1],
                0,
            )))
            .unwrap();
        let Ok(mut stream) = socket.connect(server.admin_addr).await else {
            continue;
        };
        let head = "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\nt";
        if stream.write_all(head.as_bytes()).await.is_ok() {
            slow.push(stream);
        }
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answered = tokio::time::timeout(
            Duration::from_secs(5),
            get(&format!("http://{}{path}", server.admin_addr)),
        )
        .await;
        let answered = answered.unwrap_or_else(|_| panic!("{path} did not answer in 5 s"));
        assert!(
            answered.status < 500 || path == "/readyz",
            "{path}: {}",
            answered.status
        );
    }
    drop(slow);
    server.shutdown().await;
}

/// The stream of one chat answer of `tokens` tokens with its usage, as SSE blocks.
fn chat_stream_blocks(tokens: usize) -> Vec<String> {
    let mut blocks = vec![r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#.to_owned()];
    for i in 0..tokens {
        blocks.push(format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"t{i} "}}}}]}}"#
        ));
    }
    blocks.push(format!(
        r#"{{"choices":[{{"index":0,"delta":{{}},"finish_reason":"length"}}],"usage":{{"prompt_tokens":40,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
        40 + tokens
    ));
    blocks.push("[DONE]".to_owned());
    blocks
}

/// vLLM often hands a finished stream over at once: every event in one write. Its gaps are
/// microseconds, and read as decode figures they said 484.3K tok/s per request. A cell of such
/// streams is `Delivered in bursts`, greyed and never judged, and the verdict says how many
/// requests sit in cells it did not judge; the same streams paced as an engine decodes them
/// (a few milliseconds a token) make a `Valid` cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_handed_over_at_once_makes_no_decode_figures() {
    let upstream = ScriptedUpstream::start(|request| {
        let body = String::from_utf8_lossy(&request.body).into_owned();
        let blocks = chat_stream_blocks(12);
        if body.contains(r#""model":"burst""#) {
            // One write: the whole answer.
            let whole: String = blocks.iter().map(|b| format!("data: {b}\n\n")).collect();
            Script::sse(vec![Step::Send(Bytes::from(whole))])
        } else {
            let mut steps = Vec::new();
            for block in &blocks {
                steps.push(data(block));
                steps.push(wait_ms(4));
            }
            Script::sse(steps)
        }
    })
    .await;
    let (server, records) = proxy_from_config(&proxy_config(
        &upstream.url(),
        "[slo]\nttft = \"10s\"\n[evidence]\nmin_requests = 1\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n",
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);
    for model in ["burst", "paced"] {
        for _ in 0..6 {
            let body = format!(
                r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
            );
            let response = send_with(
                "POST",
                &url,
                &[("content-type", "application/json")],
                body.into_bytes(),
            )
            .await;
            assert_eq!(response.status, 200);
            assert!(response.text().contains("[DONE]"));
        }
    }
    let records = records.wait_for(12).await;
    for record in &records {
        assert_eq!(record.outcome, Outcome::Ok, "{record:?}");
        let burst = record.labels.model.as_ref() == "burst";
        assert_eq!(
            record.tokens.delivered_in_bursts(),
            burst,
            "{:?}",
            record.tokens
        );
    }
    let matrix = |model: &'static str| {
        let admin = server.admin_addr;
        async move {
            let response = get(&format!(
                "http://{admin}/matrix?source=production&window=15m&format=json&model={model}"
            ))
            .await;
            assert_eq!(response.status, 200, "{}", response.text());
            let doc: serde_json::Value = serde_json::from_str(&response.text()).unwrap();
            doc["decode"][0]["status"].as_str().unwrap().to_owned()
        }
    };
    assert_eq!(
        matrix("burst").await,
        "Delivered in bursts: 6 of 6 streams delivered in bursts"
    );
    assert_eq!(matrix("paced").await, "Valid");
    // The verdict names what it did not judge.
    let status = get(&format!("http://{}/status", server.admin_addr)).await;
    let status: serde_json::Value = serde_json::from_str(&status.text()).unwrap();
    let burst = status["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model"] == "burst")
        .expect("the burst model has a verdict");
    let slo = burst["clauses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == "slo")
        .unwrap();
    assert!(
        slo["text"].as_str().unwrap().contains(
            "6 completed requests sit in cells not judged (6 of them in cells delivered in bursts)"
        ),
        "{slo}"
    );
    server.shutdown().await;
}

/// `/v1/responses` deltas carry no token count; vLLM's often carry several tokens each. With
/// the final usage the ITL samples are one per token (the gaps divided over the tokens the
/// usage says the deltas carried), as on chat with per-chunk usage, not one per delta.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn itl_on_responses_is_one_sample_per_token_when_the_usage_says_how_many() {
    const DELTAS: u64 = 8;
    const TOKENS_PER_DELTA: u64 = 3;
    let upstream = ScriptedUpstream::start(|_| {
        let event = |name: &str, json: &str| {
            Step::Send(Bytes::from(format!("event: {name}\ndata: {json}\n\n")))
        };
        let mut steps = vec![event(
            "response.created",
            r#"{"type":"response.created","response":{"id":"r"}}"#,
        )];
        for i in 0..DELTAS {
            steps.push(event(
                "response.output_text.delta",
                &format!(r#"{{"type":"response.output_text.delta","delta":"a{i} b c "}}"#),
            ));
            steps.push(wait_ms(3));
        }
        steps.push(event(
            "response.completed",
            &format!(
                r#"{{"type":"response.completed","response":{{"usage":{{"input_tokens":5,"output_tokens":{}}}}}}}"#,
                DELTAS * TOKENS_PER_DELTA
            ),
        ));
        Script::sse(steps)
    })
    .await;
    let (server, records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    let response = send_with(
        "POST",
        &format!("http://{}/v1/responses", server.proxy_addr),
        &[("content-type", "application/json")],
        br#"{"model":"m","stream":true,"input":"hi"}"#.to_vec(),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let records = records.wait_for(1).await;
    let record = &records[0];
    assert_eq!(record.outcome, Outcome::Ok);
    assert_eq!(record.tokens.completion, DELTAS * TOKENS_PER_DELTA);
    assert!(record.tokens.completion_exact);
    assert_eq!(record.tokens.events, DELTAS);
    // One sample per token after the first delta's: 21, not the 7 gaps between deltas.
    assert_eq!(
        record.timing.itl.count(),
        (DELTAS - 1) * TOKENS_PER_DELTA,
        "{:?}",
        record.timing.itl
    );
    // The samples still add up to the decode time.
    let sum: f64 = record.timing.itl.buckets().map(|(m, c)| m * c as f64).sum();
    let decode = record.timing.decode.unwrap().as_secs_f64();
    assert!((sum - decode).abs() < 1e-6, "{sum} vs {decode}");
    server.shutdown().await;
}

/// A scripted sglang session server: `/open_session` answers a new id (or the one the client
/// chose) as a JSON string, as sglang's `http_server.py` does; `/close_session` answers 200
/// whatever it names (sglang only logs an unknown one); `/generate` answers a short JSON.
async fn sglang_sessions() -> ScriptedUpstream {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    ScriptedUpstream::start(move |r| match r.path.as_str() {
        "/open_session" => {
            let chosen = serde_json::from_slice::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|body| body["session_id"].as_str().map(str::to_owned));
            let id = chosen.unwrap_or_else(|| {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("5e551{n:027x}")
            });
            Script::json(200, &serde_json::Value::String(id).to_string())
        }
        "/close_session" => Script::json(200, ""),
        _ => Script::json(200, r#"{"text":"ok","meta_info":{}}"#),
    })
    .await
}

/// sglang closes a session for whoever names its id, and `/generate` with `session_params.id`
/// is built on that session's prompts and answers: tokentap remembers who opened each session
/// through it and refuses another caller's close or continuation (403), while the owner's close
/// and continuation, and a close of a session it never saw opened, are forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_closed_or_continued_only_by_the_caller_that_opened_it() {
    use tokentap::net::faults::Fault;
    let upstream = sglang_sessions().await;
    let (server, _records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    let base = format!("http://{}", server.proxy_addr);
    let call =
        |headers: &'static [(&'static str, &'static str)], path: &'static str, body: String| {
            let url = format!("{base}{path}");
            async move { send_with("POST", &url, headers, body.into_bytes()).await }
        };
    let closes_reaching = |id: &str| {
        upstream
            .requests()
            .iter()
            .filter(|r| r.path == "/close_session" && String::from_utf8_lossy(&r.body).contains(id))
            .count()
    };
    const ALICE: &[(&str, &str)] = &[("authorization", "Bearer sk-alice")];
    const BOB: &[(&str, &str)] = &[("authorization", "Bearer sk-bob")];
    const NOBODY: &[(&str, &str)] = &[];

    // Alice opens a session: the answer reaches her as sglang sent it.
    let opened = call(
        ALICE,
        "/open_session",
        r#"{"capacity_of_str_len":1000}"#.into(),
    )
    .await;
    assert_eq!(opened.status, 200, "{}", opened.text());
    let id: String = serde_json::from_slice(&opened.bytes()).unwrap();
    assert_eq!(opened.text(), format!("\"{id}\""));
    let close = format!(r#"{{"session_id":"{id}"}}"#);

    // Bob, and a caller with no credential, may neither close it nor continue it.
    for headers in [BOB, NOBODY] {
        let refused = call(headers, "/close_session", close.clone()).await;
        assert_eq!(refused.status, 403, "{}", refused.text());
        let text = refused.text();
        assert!(text.contains("session_refused"), "{text}");
        assert!(
            text.contains("opened through tokentap by another caller"),
            "{text}"
        );
        assert!(!text.contains("sk-alice"), "{text}");
    }
    // The key as sglang's parser reads it: escapes decoded, the last of a repeated one.
    let escaped = format!(r#"{{"session_id":"other","session\u005fid":"{id}"}}"#);
    assert_eq!(call(BOB, "/close_session", escaped).await.status, 403);
    for body in [
        format!(r#"{{"text":"what did she say?","session_params":{{"id":"{id}"}}}}"#),
        format!(r#"{{"text":"x","session\u005fparams":{{"id":"{id}","offset":0}}}}"#),
    ] {
        let refused = call(BOB, "/generate", body).await;
        assert_eq!(refused.status, 403, "{}", refused.text());
    }
    let vertex = format!(
        r#"{{"instances":[{{"text":"x"}}],"parameters":{{"session_params":{{"id":"{id}"}}}}}}"#
    );
    assert_eq!(call(BOB, "/vertex_generate", vertex).await.status, 403);
    assert_eq!(closes_reaching(&id), 0, "no refused close reached sglang");
    assert_eq!(server.proxy.faults.get(Fault::SessionRefused), 6);

    // Alice continues her own session; Bob's requests naming no session are forwarded.
    let own = call(
        ALICE,
        "/generate",
        format!(r#"{{"text":"go on","session_params":{{"id":"{id}"}}}}"#),
    )
    .await;
    assert_eq!(own.status, 200, "{}", own.text());
    assert_eq!(
        call(BOB, "/generate", r#"{"text":"session_params"}"#.into())
            .await
            .status,
        200
    );
    // A session tokentap never saw opened (before it started, or directly at the engine) is
    // closed for whoever names it, as sglang would.
    let unseen = call(
        BOB,
        "/close_session",
        r#"{"session_id":"opened-before"}"#.into(),
    )
    .await;
    assert_eq!(unseen.status, 200, "{}", unseen.text());
    assert_eq!(closes_reaching("opened-before"), 1);

    // Alice closes hers; once closed, it is forgotten (sglang may hand the id out again).
    let closed = call(ALICE, "/close_session", close.clone()).await;
    assert_eq!(closed.status, 200, "{}", closed.text());
    assert_eq!(closes_reaching(&id), 1);
    assert!(server.proxy.sessions.is_empty());
    assert_eq!(call(BOB, "/close_session", close).await.status, 200);

    // A session id the client chose is remembered the same way.
    let chosen = call(
        BOB,
        "/open_session",
        r#"{"capacity_of_str_len":10,"session_id":"bobs"}"#.into(),
    )
    .await;
    assert_eq!(chosen.text(), "\"bobs\"");
    let refused = call(ALICE, "/close_session", r#"{"session_id":"bobs"}"#.into()).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    // The refusal is logged once per path, and its counter is on /metrics.
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    assert!(
        metrics.contains(r#"fault="session_refused"} 7"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("session_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    server.shutdown().await;
}

/// With `[tenants]`, the caller is the tenant: two keys of one tenant share its sessions, and
/// another tenant's close is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_keys_share_its_sessions() {
    let upstream = sglang_sessions().await;
    let (one, two, three) = (
        tokentap::proxy::tenants::key_hash(b"sk-1"),
        tokentap::proxy::tenants::key_hash(b"sk-2"),
        tokentap::proxy::tenants::key_hash(b"sk-3"),
    );
    let tenants = format!(
        "[tenants]\n[tenants.keys]\n\"{one}\" = \"search\"\n\"{two}\" = \"search\"\n\"{three}\" = \"chat\"\n"
    );
    let (server, _records) = proxy_from_config(&proxy_config(&upstream.url(), &tenants)).await;
    let url = |path: &str| format!("http://{}{path}", server.proxy_addr);
    let opened = send_with(
        "POST",
        &url("/open_session"),
        &[("authorization", "Bearer sk-1")],
        br#"{"capacity_of_str_len":1}"#.to_vec(),
    )
    .await;
    let id: String = serde_json::from_slice(&opened.bytes()).unwrap();
    let close = format!(r#"{{"session_id":"{id}"}}"#).into_bytes();
    let chat = send_with(
        "POST",
        &url("/close_session"),
        &[("authorization", "Bearer sk-3")],
        close.clone(),
    )
    .await;
    assert_eq!(chat.status, 403, "{}", chat.text());
    let search = send_with(
        "POST",
        &url("/close_session"),
        &[("x-api-key", "sk-2")],
        close,
    )
    .await;
    assert_eq!(search.status, 200, "{}", search.text());
    server.shutdown().await;
}

/// A log sink for one test: what the subscriber writes, kept.
#[derive(Clone, Default)]
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `conformance/run` fails a run whose real clients tokentap refused: the harness's reading of
/// the refusals (`conformance/harness.py`: `refusal_counts`, `refused_paths`) holds against a real
/// tokentap's `/metrics` page and refusal log lines, not only the samples of its own unit test
/// (`conformance/test_harness.py`, run here too).
#[tokio::test]
async fn the_conformance_harness_reads_a_real_tokentaps_refusals() {
    // The subscriber is this thread's, and the test's runtime runs every task on it.
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let upstream = sglang_sessions().await;
    let (server, _records) = proxy_from_config(&proxy_config(&upstream.url(), "")).await;
    let base = format!("http://{}", server.proxy_addr);
    for path in ["/flush_cache", "/flush_cache", "/x%2Fy"] {
        assert_eq!(post(&format!("{base}{path}"), "{}").await.status, 403);
    }
    let page = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    server.shutdown().await;
    let log = String::from_utf8_lossy(&logged.0.lock().unwrap()).into_owned();
    let dir = TempDir::new("harness-refusals");
    std::fs::write(dir.0.join("metrics.txt"), &page).unwrap();
    std::fs::write(dir.0.join("tokentap.log"), &log).unwrap();
    let conformance = concat!(env!("CARGO_MANIFEST_DIR"), "/conformance");
    let script = "import harness, json, sys\n\
                  page = open(sys.argv[1]).read()\n\
                  log = open(sys.argv[2]).read()\n\
                  print(json.dumps([harness.refusal_counts(page), harness.refused_paths(log)]))\n";
    let read = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir.0.join("metrics.txt"))
        .arg(dir.0.join("tokentap.log"))
        .env("PYTHONPATH", conformance)
        .output()
        .expect("python3 runs (the harness's interpreter)");
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let said: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(said[0]["route_refused"], 3.0, "{said}\n{page}");
    assert_eq!(said[0]["session_refused"], 0.0, "{said}");
    assert_eq!(
        said[1],
        serde_json::json!(["/flush_cache", "/x/y"]),
        "{said}\n{log}"
    );
    let unit = std::process::Command::new("python3")
        .args(["-m", "unittest", "-q", "test_harness"])
        .current_dir(conformance)
        .output()
        .expect("python3 runs");
    assert!(
        unit.status.success(),
        "{}",
        String::from_utf8_lossy(&unit.stderr)
    );
}
