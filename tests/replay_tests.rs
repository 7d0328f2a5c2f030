//! Replay of real engine captures: every case folder under `tests/fixtures/engines/` (layout in
//! `tests/fixtures/engines/README.md`) is fed through tokentap's own response path — the request
//! injected as the proxy injects it, the upstream's bytes through `MeteredBody` in many frame
//! splits and SSE framings — and the client's bytes must equal what the engine sends the same
//! request direct, after masking only what the engine randomises per request (`id`, `created`;
//! and the generated text where the case says its two captures came from different
//! generations). The metering must match the engine's own usage. New case folders are picked
//! up without touching this file; no engine is needed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::Body;
use proptest::prelude::*;
use serde_json::Value;
use tokentap::base::Route;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::record::{Outcome, RequestRecord};
use tokentap::meter::{Meter, RecordSink};
use tokentap::stream::request::{injection, inspect, ServerUsage};
use tokentap::stream::rewrite::Injected;
use tokentap::stream::sample::metered_body;

/// One captured case.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    route: Route,
    status: u16,
    stream: bool,
    /// What the server sends unasked (`meta.server_sends_usage_unasked`: vLLM's force flag
    /// sends usage on every chunk, sglang's default-usage flag only the final chunk).
    server_usage: ServerUsage,
    /// `"shape"`: direct and upstream come from different generations (mask generated text).
    shape_only: bool,
    /// `"per-choice"`: an `n` > 1 stream whose choices interleave differently from run to run
    /// (sglang streams each choice as its own request): compared with the events grouped by
    /// choice, in order within each.
    per_choice: bool,
    request: Vec<u8>,
    direct: Vec<u8>,
    upstream: Vec<u8>,
    /// The engine's own (prompt, completion) tokens.
    usage: Option<(u64, u64)>,
}

fn engines_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engines")
}

fn sorted_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        // A case is a folder with its meta.json (`describe/` holds an engine's self-description).
        .filter(|p| p.is_dir() && (p.join("meta.json").is_file() || !p.ends_with("describe")))
        .collect();
    dirs.sort();
    dirs
}

fn load(dir: &Path) -> Case {
    let read = |file: &str| {
        std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
    };
    let meta: Value = serde_json::from_slice(&read("meta.json")).unwrap();
    let route_path = meta["route"].as_str().expect("meta.route");
    let usage = std::fs::read(dir.join("usage.json")).ok().map(|bytes| {
        let usage: Value = serde_json::from_slice(&bytes).unwrap();
        (
            usage["prompt_tokens"]
                .as_u64()
                .expect("usage.prompt_tokens"),
            usage["completion_tokens"]
                .as_u64()
                .expect("usage.completion_tokens"),
        )
    });
    Case {
        name: format!(
            "{}/{}",
            dir.parent().unwrap().file_name().unwrap().to_string_lossy(),
            dir.file_name().unwrap().to_string_lossy()
        ),
        route: Route::from_path(route_path)
            .unwrap_or_else(|| panic!("{}: unmetered route {route_path}", dir.display())),
        status: meta["status"].as_u64().map_or(200, |s| s as u16),
        stream: meta["stream"].as_bool().expect("meta.stream"),
        server_usage: match (
            meta["server_sends_usage_unasked"].as_bool(),
            meta["engine"].as_str(),
        ) {
            (Some(true), Some("vllm")) => ServerUsage::EveryChunk,
            (Some(true), _) => ServerUsage::Final,
            _ => ServerUsage::OnlyAsked,
        },
        shape_only: meta["compare"].as_str() == Some("shape"),
        per_choice: meta["compare"].as_str() == Some("per-choice"),
        request: read("request.json"),
        direct: read("direct.body"),
        upstream: read("upstream.body"),
        usage,
    }
}

fn cases() -> Vec<Case> {
    let cases: Vec<Case> = sorted_dirs(&engines_dir())
        .iter()
        .flat_map(|engine| sorted_dirs(engine))
        .map(|dir| load(&dir))
        .collect();
    assert!(
        cases.len() >= 8,
        "expected the vLLM 0.32.0 captures at least, found {}",
        cases.len()
    );
    cases
}

impl Case {
    /// What tokentap injects into this request, decided by the proxy's own code.
    /// (A request that is not a JSON object, as sglang's `invalid-json` case, gets nothing.)
    fn injected(&self) -> Injected {
        let Some(facts) = inspect(self.route, &self.request) else {
            return Injected::default();
        };
        injection(self.route, &self.request, &facts, self.server_usage)
            .map_or(Injected::default(), |(_, injected)| injected)
    }

    fn event_stream(&self) -> bool {
        self.stream && self.status < 400
    }
}

#[derive(Default)]
struct Collect(Mutex<Vec<Arc<RequestRecord>>>);

impl RecordSink for Collect {
    fn record(&self, record: &Arc<RequestRecord>) {
        self.0.lock().unwrap().push(Arc::clone(record));
    }
}

/// Feeds `frames` (the upstream's bytes) through the metered body; returns the client's bytes
/// and the one record.
fn replay(case: &Case, frames: Vec<Bytes>) -> (Vec<u8>, Arc<RequestRecord>) {
    let meter = Meter::new(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    );
    let sink = Arc::new(Collect::default());
    meter.add_sink(sink.clone());
    let mut body = metered_body(
        case.route,
        case.status,
        case.event_stream(),
        frames,
        &meter,
        case.injected(),
    );
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    // Every poll makes progress on a ready body: bounded by the number of frames it yields.
    for _ in 0..1_000_000 {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(frame)) => {
                if let Ok(data) = frame.unwrap().into_data() {
                    out.extend_from_slice(&data);
                }
            }
            Poll::Ready(None) => break,
            Poll::Pending => panic!("{}: a ready body returned Pending", case.name),
        }
    }
    assert!(body.is_end_stream(), "{}: body not ended", case.name);
    drop(body);
    let records = sink.0.lock().unwrap();
    assert_eq!(records.len(), 1, "{}: exactly one record", case.name);
    (out, Arc::clone(&records[0]))
}

/// Cuts `bytes` at `points` (offsets, any order, duplicates allowed).
fn split_at(bytes: &[u8], points: &[usize]) -> Vec<Bytes> {
    let mut points: Vec<usize> = points.iter().map(|&p| p.min(bytes.len())).collect();
    points.sort_unstable();
    points.dedup();
    let mut frames = Vec::new();
    let mut last = 0;
    for p in points.into_iter().chain([bytes.len()]) {
        if p > last {
            frames.push(Bytes::copy_from_slice(&bytes[last..p]));
            last = p;
        }
    }
    frames
}

/// Masks the string value of every `"key":"…"` and the number of every `"key":N` (integer or
/// decimal) for `keys`.
fn mask(text: &str, keys: &[&str]) -> String {
    let bytes = text.as_bytes();
    let patterns: Vec<String> = keys.iter().map(|key| format!("\"{key}\":")).collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'outer: while i < bytes.len() {
        // Every pattern opens with a quote: other bytes are copied as they are.
        for pattern in patterns.iter().filter(|_| bytes[i] == b'"') {
            if text[i..].starts_with(pattern.as_str()) {
                out.push_str(pattern);
                let mut j = i + pattern.len();
                while bytes.get(j) == Some(&b' ') {
                    j += 1;
                }
                if bytes.get(j) == Some(&b'"') {
                    j += 1;
                    while j < bytes.len() && bytes[j] != b'"' {
                        j += if bytes[j] == b'\\' { 2 } else { 1 };
                    }
                    out.push_str("\"<masked>\"");
                    i = j + 1;
                } else if bytes.get(j).is_some_and(u8::is_ascii_digit) {
                    while bytes
                        .get(j)
                        .is_some_and(|b| b.is_ascii_digit() || b".eE+-".contains(b))
                    {
                        j += 1;
                    }
                    out.push_str("<n>");
                    i = j;
                } else {
                    i = j;
                }
                continue 'outer;
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// What the engine randomises per request: ids and timestamps (sglang's `/generate` also
/// puts in `meta_info` when the request was received, dispatched, its first token sent and
/// it finished, and the latencies and decode rate measured between them).
const PER_REQUEST: [&str; 9] = [
    "id",
    "created",
    "response_sent_to_client_ts",
    "request_received_ts",
    "api_server_dispatch_finish_ts",
    "request_finished_ts",
    "e2e_latency",
    "first_token_latency",
    "decode_throughput",
];

/// The bytes with what the engine randomises per request masked (and the generated text, for
/// cases whose two captures are different generations). Never `system_fingerprint` or any
/// other field.
fn normalise(case: &Case, bytes: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if case.per_choice {
        text = choice_order(&text);
    }
    if case.shape_only {
        let keys: Vec<&str> = PER_REQUEST
            .iter()
            .copied()
            .chain(["content", "text"])
            .collect();
        mask(&text, &keys)
    } else {
        mask(&text, &PER_REQUEST)
    }
}

/// The LF-framed events of `text` grouped by the index of their (one) choice, in order within
/// each; events without a choice (usage, `[DONE]`) after them, in order.
fn choice_order(text: &str) -> String {
    let mut events: Vec<(u64, &str)> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            let index = event
                .strip_prefix("data: ")
                .and_then(|data| serde_json::from_str::<Value>(data).ok())
                .and_then(|chunk| chunk["choices"][0]["index"].as_u64())
                .unwrap_or(u64::MAX);
            (index, event)
        })
        .collect();
    events.sort_by_key(|(index, _)| *index);
    events
        .iter()
        .map(|(_, event)| format!("{event}\n\n"))
        .collect()
}

/// The engine's own account of `upstream.body`, read independently of tokentap's code: for
/// each data event of a chat/completions stream, the tokens it delivered (from per-chunk usage,
/// per choice) and whether it carried visible text; of a `/generate` stream, from its cumulative
/// `meta_info.completion_tokens` and `text`.
fn engine_events(body: &[u8]) -> Vec<(u64, bool)> {
    let text = String::from_utf8_lossy(body);
    let mut cumulative = 0u64;
    let mut per_choice: Vec<u64> = Vec::new();
    let mut generated = 0usize;
    let mut events = Vec::new();
    for event in text.split("\n\n") {
        let Some(data) = event.strip_prefix("data: ") else {
            continue;
        };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        // sglang `/generate`: cumulative `text`, cumulative `meta_info.completion_tokens`.
        if let Some(meta) = chunk.get("meta_info") {
            let total = meta["completion_tokens"].as_u64().unwrap_or(cumulative);
            let length = chunk["text"].as_str().map_or(generated, str::len);
            events.push((total.saturating_sub(cumulative), length > generated));
            cumulative = cumulative.max(total);
            generated = generated.max(length);
            continue;
        }
        let Some(choices) = chunk["choices"].as_array().filter(|c| !c.is_empty()) else {
            continue;
        };
        let visible = choices.iter().any(|c| {
            ["text", "content", "reasoning_content"].iter().any(|k| {
                c[k].as_str().is_some_and(|s| !s.is_empty())
                    || c["delta"][k].as_str().is_some_and(|s| !s.is_empty())
            }) || c["delta"]["tool_calls"]
                .as_array()
                .is_some_and(|calls| !calls.is_empty())
        });
        // Per-chunk usage counts the chunk's choice (sglang's `n` > 1 streams each choice as
        // its own request, with its own running count).
        let index = choices[0]["index"].as_u64().unwrap_or(0) as usize;
        if per_choice.len() <= index.min(64) {
            per_choice.resize(index.min(64) + 1, 0);
        }
        let so_far = &mut per_choice[index.min(64)];
        let delivered = chunk["usage"]["completion_tokens"]
            .as_u64()
            .map_or(0, |c| c.saturating_sub(*so_far));
        *so_far += delivered;
        events.push((delivered, visible));
    }
    events
}

/// Checks the record against the engine's own figures.
fn check_metering(case: &Case, record: &RequestRecord) {
    let name = &case.name;
    let error = case.status >= 400
        || String::from_utf8_lossy(&case.upstream).contains("data: {\"error\"")
        || (!case.stream
            && serde_json::from_slice::<Value>(&case.upstream)
                .is_ok_and(|v| v.get("error").is_some()));
    let expected_outcome = if error {
        Outcome::UpstreamError
    } else {
        Outcome::Ok
    };
    assert_eq!(record.outcome, expected_outcome, "{name}: outcome");
    assert_eq!(record.status, case.status, "{name}: status");
    if let Some((prompt, completion)) = case.usage {
        assert_eq!(record.tokens.prompt, Some(prompt), "{name}: prompt tokens");
        assert_eq!(
            record.tokens.completion, completion,
            "{name}: completion tokens"
        );
        assert!(
            record.tokens.completion_exact,
            "{name}: completion count exact"
        );
    }
    if !case.event_stream() {
        return;
    }
    let events = engine_events(&case.upstream);
    let visible = events.iter().filter(|(_, v)| *v).count() as u64;
    assert_eq!(record.tokens.events, visible, "{name}: token events");
    assert_eq!(
        record.timing.ttft.is_some(),
        visible > 0,
        "{name}: first token"
    );
    // ITL per token: every token delivered after the first output event up to the last one,
    // silent ones included (without per-chunk usage each output event counts as one token).
    let per_chunk_usage = events.iter().any(|(delivered, _)| *delivered > 0);
    let first = events.iter().position(|(_, v)| *v);
    let last = events.iter().rposition(|(_, v)| *v);
    let expected_itl = match (first, last) {
        (Some(f), Some(l)) if per_chunk_usage => events[f + 1..=l].iter().map(|(d, _)| d).sum(),
        (Some(_), Some(_)) => visible - 1,
        _ => 0,
    };
    let itl = record.timing.itl.count();
    match case.usage {
        // Counted one token per output event, and the final usage says how many they
        // carried: the gaps are spread over those tokens (each bin's count scaled, rounded).
        Some((_, completion)) if !per_chunk_usage && visible > 0 && completion != visible => {
            let spread = expected_itl as f64 * completion as f64 / visible as f64;
            let bins = record.timing.itl.buckets().count() as f64;
            assert!(
                (itl as f64 - spread).abs() <= bins,
                "{name}: ITL samples {itl}, spread from {expected_itl} to {spread:.1}"
            );
        }
        _ => assert_eq!(itl, expected_itl, "{name}: ITL samples"),
    }
}

#[test]
fn every_capture_replays_transparently_in_any_frame_split() {
    let _cores = common::cores::busy_blocking();
    for case in cases() {
        let expected = normalise(&case, &case.direct);
        let bytes = &case.upstream;
        let mut splits: Vec<Vec<usize>> = vec![vec![], (1..bytes.len()).collect()];
        // Deterministic pseudo-random cuts (xorshift), so failures reproduce.
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ bytes.len() as u64;
        for round in 0..64 {
            let mut points = Vec::new();
            for _ in 0..(round % 12) + 1 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                points.push((state % (bytes.len() as u64 + 1)) as usize);
            }
            splits.push(points);
        }
        for points in splits {
            let (client, record) = replay(&case, split_at(bytes, &points));
            assert_eq!(
                normalise(&case, &client),
                expected,
                "{}: client bytes differ from the engine's direct bytes (cuts {points:?})",
                case.name
            );
            check_metering(&case, &record);
        }
    }
}

#[test]
fn the_vllm_finish_chunk_gets_its_system_fingerprint_back() {
    // The issue's own example, asserted on the bytes rather than through `normalise`.
    let case = cases()
        .into_iter()
        .find(|c| c.name == "vllm-0.32.0/chat-stream")
        .unwrap();
    assert_eq!(
        case.injected(),
        Injected {
            include_usage: true,
            continuous_usage: true
        }
    );
    let (client, _) = replay(&case, vec![Bytes::from(case.upstream.clone())]);
    let client = String::from_utf8(client).unwrap();
    let events: Vec<&str> = client.split("\n\n").filter(|e| !e.is_empty()).collect();
    let finish = events[events.len() - 2];
    assert!(
        finish.contains("\"finish_reason\":\"length\"")
            && finish.ends_with("}],\"system_fingerprint\":\"vllm-0.32.0-6d2f8ac1\"}"),
        "{finish}"
    );
    assert!(!client.contains("usage"), "{client}");
    assert_eq!(events.last(), Some(&"data: [DONE]"));
}

#[test]
fn server_default_usage_reaches_the_client() {
    // A server that sends usage unasked: the client that did not ask still gets the usage
    // chunk through tokentap, as it does direct.
    let mut case = cases()
        .into_iter()
        .find(|c| c.name == "vllm-0.32.0/chat-stream")
        .unwrap();
    case.server_usage = ServerUsage::Final;
    assert_eq!(
        case.injected(),
        Injected {
            include_usage: false,
            continuous_usage: true
        }
    );
    let (client, record) = replay(&case, vec![Bytes::from(case.upstream.clone())]);
    let client = String::from_utf8(client).unwrap();
    assert!(
        client.contains("\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"total_tokens\":19,\"completion_tokens\":8},\"system_fingerprint\""),
        "{client}"
    );
    assert_eq!(record.tokens.completion, 8);
}

/// An sglang started with `--stream-response-default-include-usage`: says so in `/server_info`
/// and sends the usage chunk to every stream; per-chunk usage only when asked.
fn sglang_with_default_usage(request: &common::Received) -> common::Script {
    if request.path == "/server_info" {
        return common::Script::json(
            200,
            r#"{"stream_response_default_include_usage":true,"version":"0.5.6"}"#,
        );
    }
    let body: Value = serde_json::from_slice(&request.body).unwrap_or_default();
    let continuous = body["stream_options"]["continuous_usage_stats"] == true;
    let usage = |c: u64| {
        format!(
            r#""usage":{{"prompt_tokens":5,"total_tokens":{},"completion_tokens":{c}}}"#,
            5 + c
        )
    };
    let chunk = |content: &str, c: u64| {
        let tail = if continuous {
            format!(",{}", usage(c))
        } else {
            String::new()
        };
        common::data(&format!(
            r#"{{"id":"x","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]{tail}}}"#
        ))
    };
    common::Script::sse(vec![
        chunk("a", 1),
        chunk("b", 2),
        common::data(r#"{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#),
        common::data(&format!(r#"{{"id":"x","choices":[],{}}}"#, usage(2))),
        common::Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
    ])
}

#[tokio::test]
async fn usage_an_sglang_sends_unasked_is_discovered_and_left_to_the_client() {
    let upstream = common::ScriptedUpstream::start(sglang_with_default_usage).await;
    let (server, records) = common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"auto\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    // Discovery asks at start-up; wait (bounded) until the answer is in.
    let default = Arc::clone(server.proxy.router.default_upstream());
    common::wait::until(
        "the usage discovery",
        std::time::Duration::from_secs(5),
        || default.server_usage() == ServerUsage::Final,
    )
    .await;
    assert_eq!(
        default.server_usage(),
        ServerUsage::Final,
        "discovered from /server_info"
    );
    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let through = common::post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    let direct = common::post(&format!("{}/v1/chat/completions", upstream.url()), body).await;
    assert_eq!(through.text(), direct.text());
    assert!(through.text().contains(r#""choices":[],"usage""#));
    // tokentap added only what the server does not send by itself.
    let forwarded = upstream
        .requests()
        .into_iter()
        .find(|r| r.path == "/v1/chat/completions")
        .unwrap();
    let forwarded: Value = serde_json::from_slice(&forwarded.body).unwrap();
    assert_eq!(
        forwarded["stream_options"],
        serde_json::json!({"continuous_usage_stats": true})
    );
    let record = &records.wait_for(1).await[0];
    assert_eq!(record.tokens.completion, 2);
    assert!(record.tokens.completion_exact);
    server.shutdown().await;
}

// ---- SSE framings ----

/// How the generator re-frames a capture's events. Single-line framings are compared byte for
/// byte; framings that spread an event over several `data:` lines are compared as the events a
/// client's SSE parser sees (data lines joined, comments ignored), since the rewriter may then
/// merge the lines it edits.
#[derive(Debug, Clone)]
struct Framing {
    newline: &'static str,
    /// Per event: a space after `data:`.
    space: Vec<bool>,
    /// Per event: a comment line before it.
    comment_before: Vec<bool>,
    /// Per event: split the payload into several `data:` lines after these top-level members.
    splits: Vec<Vec<usize>>,
    /// Per event: a comment line between its data lines.
    inner_comment: Vec<bool>,
}

impl Framing {
    fn multi_line(&self) -> bool {
        self.splits.iter().any(|s| !s.is_empty())
    }
}

fn framing(events: usize) -> impl Strategy<Value = Framing> {
    (
        prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        proptest::collection::vec(any::<bool>(), events),
        proptest::collection::vec(proptest::bool::weighted(0.2), events),
        proptest::collection::vec(
            prop_oneof![
                3 => Just(vec![]),
                1 => proptest::collection::vec(0usize..40, 1..5),
            ],
            events,
        ),
        proptest::collection::vec(proptest::bool::weighted(0.3), events),
        any::<bool>(),
    )
        .prop_map(
            move |(newline, space, comment_before, splits, inner_comment, multi)| Framing {
                newline,
                space,
                comment_before,
                splits: if multi { splits } else { vec![vec![]; events] },
                inner_comment,
            },
        )
}

/// The data payloads of an LF-framed capture, in order.
fn payloads(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// Byte offsets just after the commas of a JSON payload (outside strings, at any depth): where a
/// server could break an event into several `data:` lines without changing its JSON.
fn member_ends(payload: &str) -> Vec<usize> {
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    let mut ends = Vec::new();
    for (i, b) in payload.bytes().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b',' if depth >= 1 => ends.push(i + 1),
            _ => {}
        }
    }
    ends
}

/// The stream of `payloads` in `framing` (the same choices index by event position, so the
/// upstream's and the direct capture's events get the same treatment).
fn frame(payloads: &[String], framing: &Framing) -> Vec<u8> {
    let nl = framing.newline;
    let mut out = String::new();
    for (i, payload) in payloads.iter().enumerate() {
        if framing.comment_before.get(i) == Some(&true) {
            out.push_str(&format!(": keep-alive{nl}{nl}"));
        }
        let prefix = if framing.space.get(i) == Some(&false) {
            "data:"
        } else {
            "data: "
        };
        let ends = member_ends(payload);
        let mut cuts: Vec<usize> = framing
            .splits
            .get(i)
            .map(|s| s.iter().filter_map(|&k| ends.get(k).copied()).collect())
            .unwrap_or_default();
        cuts.sort_unstable();
        cuts.dedup();
        let mut last = 0;
        for (n, cut) in cuts.into_iter().chain([payload.len()]).enumerate() {
            if n > 0 && framing.inner_comment.get(i) == Some(&true) {
                out.push_str(&format!(": inner{nl}"));
            }
            out.push_str(&format!("{prefix}{}{nl}", &payload[last..cut]));
            last = cut;
        }
        out.push_str(nl);
    }
    out.into_bytes()
}

/// Frames the upstream's events and the direct capture's events alike: event for event, except
/// the upstream's usage chunks that tokentap drops (they have no counterpart in the direct
/// capture, and get no comment before them, whose place in the direct stream would be
/// ambiguous).
fn frame_pair(upstream: &[String], direct: &[String], framing: &Framing) -> (Vec<u8>, Vec<u8>) {
    let usage_only: Vec<usize> = (0..upstream.len())
        .filter(|&i| upstream[i].contains("\"choices\":[],\"usage\":{"))
        .collect();
    let dropped = if upstream.len() == direct.len() + usage_only.len() {
        usage_only
    } else {
        Vec::new()
    };
    let mut up = framing.clone();
    for &i in &dropped {
        if let Some(c) = up.comment_before.get_mut(i) {
            *c = false;
        }
    }
    let keep = |v: &Vec<bool>| -> Vec<bool> {
        v.iter()
            .enumerate()
            .filter(|(i, _)| !dropped.contains(i))
            .map(|(_, b)| *b)
            .collect()
    };
    let down = Framing {
        newline: framing.newline,
        space: keep(&framing.space),
        comment_before: keep(&framing.comment_before),
        splits: framing
            .splits
            .iter()
            .enumerate()
            .filter(|(i, _)| !dropped.contains(i))
            .map(|(_, s)| s.clone())
            .collect(),
        inner_comment: keep(&framing.inner_comment),
    };
    (frame(upstream, &up), frame(direct, &down))
}

/// The events a client's SSE parser sees: each event's data lines joined (the joining newlines
/// fall between JSON members, where they are whitespace, so they are removed), comments
/// ignored.
fn client_events(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .replace('\r', "\n");
    text.split("\n\n")
        .filter_map(|block| {
            let data: Vec<&str> = block
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|v| v.strip_prefix(' ').unwrap_or(v))
                .collect();
            (!data.is_empty()).then(|| data.concat())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Any SSE framing of a real capture, cut anywhere, reaches the client as the engine's
    /// direct answer in the same framing.
    #[test]
    fn every_framing_of_every_capture_is_transparent(
        index in any::<proptest::sample::Index>(),
        framing in framing(24),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..24),
    ) {
        // (Per-choice cases are compared by regrouping LF-framed events; the frame-split test
        // above replays them in every split.)
        let streams: Vec<Case> = cases()
            .into_iter()
            .filter(|c| c.event_stream() && !c.per_choice)
            .collect();
        let case = index.get(&streams);
        let upstream_events = payloads(&case.upstream);
        let direct_events = payloads(&case.direct);
        prop_assume!(upstream_events.len() <= 24 && direct_events.len() <= 24);
        let (upstream, direct) = frame_pair(&upstream_events, &direct_events, &framing);
        let points: Vec<usize> = cuts.iter().map(|i| i.index(upstream.len() + 1)).collect();
        let (client, record) = replay(case, split_at(&upstream, &points));
        if framing.multi_line() {
            let got: Vec<String> = client_events(&client).iter().map(|e| normalise(case, e.as_bytes())).collect();
            let want: Vec<String> = client_events(&direct).iter().map(|e| normalise(case, e.as_bytes())).collect();
            prop_assert_eq!(got, want, "{}", case.name);
        } else {
            prop_assert_eq!(normalise(case, &client), normalise(case, &direct), "{}", case.name);
        }
        check_metering(case, &record);
    }
}

#[tokio::test]
async fn the_answer_ttft_through_sglangs_reasoning_parser_agrees_with_the_clients_first_content() {
    // sglang 0.5.23's own reasoning parser (qwen3) split `<think>…</think>answer` into 20
    // `reasoning_content` chunks, then `content` chunks: replayed at 15 ms per event, the first
    // answer token comes about 300 ms after the first token. tokentap's answer TTFT minus its
    // TTFT must equal what the client sees between its first reasoning and first content
    // chunk, within 2 ms.
    let capture = std::fs::read_to_string(
        engines_dir().join("sglang-0.5.23/reasoning-chat-stream/upstream.body"),
    )
    .unwrap();
    let mut steps = Vec::new();
    for block in common::blocks(&capture) {
        steps.push(block);
        steps.push(common::wait_ms(15));
    }
    let script = common::Script::sse(steps);
    let upstream = common::ScriptedUpstream::start(move |_| script.clone()).await;
    let (server, records) = common::proxy(&upstream.url(), "").await;
    let body = r#"{"model":"tiny","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"What is the answer?"}],"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#;
    let answer = common::post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        body,
    )
    .await;
    assert_eq!(answer.status, 200);
    let first_with = |needle: &str| {
        answer
            .frames
            .iter()
            .find(|(_, frame)| String::from_utf8_lossy(frame).contains(needle))
            .map(|(at, _)| *at)
            .unwrap_or_else(|| panic!("no frame with {needle}"))
    };
    let client_gap =
        first_with("\"content\":\"T").duration_since(first_with("\"reasoning_content\":\"L"));
    let record = &records.wait_for(1).await[0];
    let ttft = record.timing.ttft.unwrap();
    let answer_ttft = record.timing.ttft_answer.unwrap();
    let ours = answer_ttft - ttft;
    let difference = ours.as_secs_f64() - client_gap.as_secs_f64();
    assert!(
        difference.abs() <= 0.002,
        "tokentap: answer {:?} after the first token; the client: {client_gap:?}",
        ours
    );
    assert!(ours >= std::time::Duration::from_millis(250), "{ours:?}");
    assert_eq!(record.timing.ttft_tool_call, None);
    server.shutdown().await;
}

#[tokio::test]
async fn a_tool_call_is_timed_and_the_request_offering_tools_is_told_apart() {
    let capture = std::fs::read_to_string(
        engines_dir().join("sglang-0.5.23/tool-call-chat-stream/upstream.body"),
    )
    .unwrap();
    let mut steps = vec![common::wait_ms(20)];
    for block in common::blocks(&capture) {
        steps.push(block);
        steps.push(common::wait_ms(5));
    }
    let script = common::Script::sse(steps);
    let upstream = common::ScriptedUpstream::start(move |_| script.clone()).await;
    let (server, records) = common::proxy(&upstream.url(), "").await;
    let request: Value = serde_json::from_str(
        &std::fs::read_to_string(
            engines_dir().join("sglang-0.5.23/tool-call-chat-stream/request.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(request["tools"].as_array().is_some_and(|t| !t.is_empty()));
    let answer = common::post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        &request.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200);
    let record = &records.wait_for(1).await[0];
    assert!(record.with_tools);
    let tool_call = record.timing.ttft_tool_call.expect("a tool call was timed");
    assert!(tool_call >= record.timing.ttft.unwrap());
    server.shutdown().await;
}
