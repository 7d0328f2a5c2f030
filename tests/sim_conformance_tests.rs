#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The simulator's sglang dialect held to sglang's own bytes: every capture under
//! `tests/fixtures/engines/sglang-0.5.23/` (sglang 0.5.23's HTTP stack on the conformance
//! harness's fake scheduler, `conformance/`) is sent to the simulator, and the answer must have
//! the capture's shape: the same status and content type, and event for event the same JSON
//! members in the same order with the same literals (`null`, booleans), the same `object`,
//! `finish_reason`, `role` and `type` strings and `index` numbers; only generated text, ids,
//! timestamps and counts may differ, and runs of events of one shape count once (the two
//! "models" produce different numbers of tokens). What stays different is listed in
//! [`KNOWN_DIFFERENCES`] and in `docs/simulator.md`, with why.
use crate::common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokentap::sim::{Dialect, Profile, SimOptions, SimServer};

/// Capture cases the simulator does not reproduce, with why (also in `docs/simulator.md`).
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[
    (
        "chat-stream-n2",
        "the simulator generates one choice per request and refuses n > 1 with a 400",
    ),
    // Captured from sglang's own server run with a reasoning parser, a tool-call parser, its
    // cache report or several tokens a step (tests/fixtures/engines/sglang-0.5.23/*/meta.json):
    // deployment choices the test's simulator profile does not make (its reasoning is per
    // profile, its steps one token, its cache report off). The replay tests use them.
    (
        "reasoning-chat-stream",
        "a reasoning parser: reasoning_content deltas first",
    ),
    (
        "reasoning-chat-stream-separate-reasoning",
        "a reasoning parser (the request's own switch)",
    ),
    (
        "reasoning-chat-stream-no-separate-reasoning",
        "a reasoning parser, switched off by the request",
    ),
    (
        "reasoning-chat-nonstream",
        "a reasoning parser: message.reasoning_content",
    ),
    (
        "tool-call-chat-stream",
        "a tool-call parser: tool_calls deltas",
    ),
    (
        "tool-call-chat-nonstream",
        "a tool-call parser: message.tool_calls",
    ),
    (
        "cached-chat-stream",
        "--enable-cache-report: usage.prompt_tokens_details",
    ),
    (
        "cached-chat-nonstream",
        "--enable-cache-report: usage.prompt_tokens_details",
    ),
    (
        "multi-token-step-chat-stream",
        "several tokens a step (speculative decoding)",
    ),
];

/// String values compared as they are; every other non-empty string is masked.
const KEPT_STRINGS: &[&str] = &["object", "finish_reason", "role", "type", "model"];
/// Numbers compared as they are; every other number is masked.
const KEPT_NUMBERS: &[&str] = &["index", "code"];

fn captures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/engines/sglang-0.5.23")
}

/// The end of the JSON string starting at `start` (its opening quote): the index after the
/// closing quote.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The shape of one JSON text, member order kept (serde_json's map would sort keys).
fn shape(json: &str) -> String {
    let bytes = json.as_bytes();
    let mut out = String::new();
    let mut key = String::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let end = string_end(bytes, i);
                let text = &json[i..end];
                let mut j = end;
                while bytes.get(j).is_some_and(u8::is_ascii_whitespace) {
                    j += 1;
                }
                if bytes.get(j) == Some(&b':') {
                    key = text.trim_matches('"').to_owned();
                    out.push_str(text);
                    out.push(':');
                    i = j + 1;
                    continue;
                }
                if text == "\"\"" || KEPT_STRINGS.contains(&key.as_str()) {
                    out.push_str(text);
                } else {
                    out.push_str("\"<s>\"");
                }
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while bytes
                    .get(i)
                    .is_some_and(|b| b.is_ascii_digit() || b".eE+-".contains(b))
                {
                    i += 1;
                }
                if KEPT_NUMBERS.contains(&key.as_str()) {
                    out.push_str(&json[start..i]);
                } else {
                    out.push_str("<n>");
                }
            }
            b if b.is_ascii_whitespace() => i += 1,
            b => {
                out.push(b as char);
                i += 1;
            }
        }
    }
    // Arrays of numbers (token ids) of any length are one shape.
    while out.contains("<n>,<n>") {
        out = out.replace("<n>,<n>", "<n>");
    }
    out
}

/// A response's shape: status, content type, then the shape of its JSON body or of each SSE
/// event (runs of one shape once).
fn body_shape(status: u16, content_type: &str, body: &[u8]) -> Vec<String> {
    let mut shapes = vec![format!("{status} {content_type}")];
    let text = String::from_utf8_lossy(body);
    if content_type.starts_with("text/event-stream") {
        for event in text.split("\n\n").filter(|e| !e.is_empty()) {
            let data = event.strip_prefix("data: ").unwrap_or(event);
            let one = shape(data);
            if shapes.last() != Some(&one) {
                shapes.push(one);
            }
        }
    } else {
        shapes.push(shape(&text));
    }
    shapes
}

/// The capture's content type: sglang's for the route and status (the captures keep bodies
/// only).
fn captured_content_type(meta: &Value, body: &[u8]) -> &'static str {
    let status = meta["status"].as_u64().unwrap_or(200);
    if status == 200 && body.starts_with(b"data: ") {
        "text/event-stream; charset=utf-8"
    } else {
        "application/json"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sglang_dialect_has_the_shape_of_sglangs_own_bytes() {
    // The captures' server: a tiny model without a reasoning parser, one token per step, served
    // as tiny-llama. Its context is 2,048 tokens of a byte-level tokenizer; the simulator counts
    // 4 bytes a token, so 1,024 here puts the captures' too-long prompts (2,100 words) over it
    // and the others (under 40 tokens with their output) under it.
    let mut profile = Profile::builtin("step-3.7-flash-fp8-4x-rtx-pro-6000").unwrap();
    profile.model.reasoning = false;
    profile.model.reasoning_tokens = 0;
    profile.model.context_length = 1024;
    profile.decode.tokens_per_step = 1.0;
    profile.decode.accept_length_spread = 0;
    // Without ignore_eos the fake scheduler's sentence ends on EOS after 31 tokens, inside the
    // eos case's 64.
    profile.model.natural_output_tokens = 31;
    let sim = SimServer::start(
        profile,
        SimOptions {
            seed: 1,
            dialect: Dialect::Sglang,
            served_model_name: Some("tiny-llama".into()),
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();

    let mut dirs: Vec<PathBuf> = std::fs::read_dir(captures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.join("meta.json").is_file())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 15, "the sglang captures: {}", dirs.len());
    let mut differences = Vec::new();
    let mut compared = 0;
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if KNOWN_DIFFERENCES.iter().any(|(case, _)| *case == name) {
            continue;
        }
        let meta: Value =
            serde_json::from_slice(&std::fs::read(dir.join("meta.json")).unwrap()).unwrap();
        let request = std::fs::read_to_string(dir.join("request.json")).unwrap();
        let direct = std::fs::read(dir.join("direct.body")).unwrap();
        let route = meta["route"].as_str().unwrap();
        let want = body_shape(
            meta["status"].as_u64().map_or(200, |s| s as u16),
            captured_content_type(&meta, &direct),
            &direct,
        );
        let answer = common::post(&format!("{}{route}", sim.base_url()), request.trim_end()).await;
        let content_type = answer
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let got = body_shape(answer.status, &content_type, &answer.bytes());
        compared += 1;
        if got != want {
            let at = got.iter().zip(&want).take_while(|(g, w)| g == w).count();
            differences.push(format!(
                "{name}: {} shapes from sglang, {} from the simulator; first difference at {at}:\n  sglang:    {}\n  simulator: {}",
                want.len(),
                got.len(),
                want.get(at).map_or("(none)", String::as_str),
                got.get(at).map_or("(none)", String::as_str),
            ));
        }
    }
    sim.shutdown().await;
    assert!(compared >= 15, "compared {compared}");
    assert!(
        differences.is_empty(),
        "the simulator differs from sglang 0.5.23 in {} cases:\n{}",
        differences.len(),
        differences.join("\n")
    );
}

#[test]
fn shapes_keep_order_literals_and_the_named_values() {
    assert_eq!(
        shape(
            r#"{"id":"x1","choices":[{"index":1,"delta":{"content":"hi"},"finish_reason":null,"matched_stop":128001}],"usage":null}"#
        ),
        r#"{"id":"<s>","choices":[{"index":1,"delta":{"content":"<s>"},"finish_reason":null,"matched_stop":<n>}],"usage":null}"#
    );
    assert_eq!(
        shape(r#"{"b": 1.5e-3, "a": "", "object": "list", "ok": true}"#),
        r#"{"b":<n>,"a":"","object":"list","ok":true}"#
    );
    assert_ne!(shape(r#"{"a":1,"b":2}"#), shape(r#"{"b":2,"a":1}"#));
}
