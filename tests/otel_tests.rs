//! OpenTelemetry export against a fake OTLP/HTTP collector on 127.0.0.1: one span per metered
//! request with GenAI attributes and a first-token event, the GenAI metrics, and no secrets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::Full;

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn spans_and_genai_metrics_reach_the_collector() {
    let upstream = ScriptedUpstream::start(|_| {
        Script::sse(vec![
            data(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#),
            wait_ms(20),
            data(r#"{"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":1}}"#),
            data(r#"{"choices":[{"index":0,"delta":{"content":" there"}}],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#),
            Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
        ])
    })
    .await;
    // The collector: accepts anything, the test reads what it received.
    let collector = ScriptedUpstream::start(|_| Script::json(200, "")).await;
    let (server, records) = proxy(
        &upstream.url(),
        &format!("[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"tokentap-test\"\nmetric_interval = \"1s\"", collector.url()),
    )
    .await;
    let request = http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
        .header("authorization", "Bearer sk-do-not-leak")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"traced-model","stream":true,"max_tokens":5}"#,
        )))
        .unwrap();
    let response = send(request).await;
    assert_eq!(response.status, 200);
    records.wait_for(1).await;
    server.shutdown().await; // flushes the exporters

    let received = collector.requests();
    let traces: Vec<_> = received.iter().filter(|r| r.path == "/v1/traces").collect();
    let metrics: Vec<_> = received
        .iter()
        .filter(|r| r.path == "/v1/metrics")
        .collect();
    assert!(
        !traces.is_empty(),
        "no trace export; got {:?}",
        received.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert!(!metrics.is_empty(), "no metrics export");
    let trace = &traces[0];
    assert_eq!(trace.method, "POST");
    assert_eq!(trace.headers["content-type"], "application/x-protobuf");
    for needle in [
        "chat traced-model",
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.request.max_tokens",
        "gen_ai.first_token",
        "tokentap.time_to_first_token_s",
        "tokentap-test",
    ] {
        assert!(contains(&trace.body, needle), "span export lacks {needle}");
    }
    let all_metrics: Vec<u8> = metrics.iter().flat_map(|m| m.body.to_vec()).collect();
    for needle in [
        "gen_ai.client.token.usage",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
    ] {
        assert!(
            contains(&all_metrics, needle),
            "metrics export lacks {needle}"
        );
    }
    for export in &received {
        assert!(
            !contains(&export.body, "sk-do-not-leak"),
            "the API key leaked into {}",
            export.path
        );
    }
}
