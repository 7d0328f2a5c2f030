//! OpenTelemetry export against a fake OTLP/HTTP collector on 127.0.0.1 that decodes what it is
//! sent with the OTLP protobuf messages: one span per metered request with GenAI attributes and
//! a first-token event; the current GenAI metric names, and the superseded ones only when
//! `telemetry.otlp_legacy_genai_names` asks; the opt-in per-request log event
//! `gen_ai.client.inference.operation.details` with the tenant hashed and no text; a failed request
//! counted with its `error.type` and zero tokens; no secrets; the docs' names and collector config.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use prost::Message as _;

/// Text only the request's body and the upstream's answer hold: none may reach an export.
const PROMPT_TEXT: &str = "prompt-text-that-must-not-leave";
const COMPLETION_TEXT: &str = "completion-text-that-must-not-leave";

const CURRENT_METRICS: [&str; 11] = [
    "gen_ai.client.inference.duration",
    "gen_ai.client.inference.time_to_first_chunk",
    "gen_ai.client.inference.operation.input_tokens",
    "gen_ai.client.inference.operation.output_tokens",
    "gen_ai.client.inference.usage.input_tokens",
    "gen_ai.client.inference.usage.output_tokens",
    "gen_ai.client.inference.usage.cache_read.input_tokens",
    "gen_ai.client.inference.usage.reasoning.output_tokens",
    "gen_ai.server.request.duration",
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
];
const LEGACY_METRICS: [&str; 2] = [
    "gen_ai.client.token.usage",
    "gen_ai.client.operation.duration",
];

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A streamed chat answer with usage (7 prompt tokens, 3 of them cached) and a known text.
async fn streaming_upstream() -> ScriptedUpstream {
    ScriptedUpstream::start(|_| {
        Script::sse(vec![
            data(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#),
            wait_ms(20),
            data(&format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{COMPLETION_TEXT}"}}}}],"usage":{{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":{{"cached_tokens":3}}}}}}"#)),
            data(r#"{"choices":[{"index":0,"delta":{"content":" there"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}"#),
            Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
        ])
    })
    .await
}

/// Sends `requests` streamed chat requests through a proxy configured with `telemetry` (more
/// `[telemetry]` keys) and `extra` (more sections), shuts it down (which flushes the
/// exporters) and hands back everything the collector received.
async fn exported(telemetry: &str, extra: &str, requests: usize) -> Vec<Received> {
    exported_from(streaming_upstream().await, telemetry, extra, requests, 200).await
}

/// [`exported`] against `upstream`, whose answers have `status`.
async fn exported_from(
    upstream: ScriptedUpstream,
    telemetry: &str,
    extra: &str,
    requests: usize,
    status: u16,
) -> Vec<Received> {
    // The collector: accepts anything, the test decodes what it received.
    let collector = ScriptedUpstream::start(|_| Script::json(200, "")).await;
    let (server, records) = proxy(
        &upstream.url(),
        &format!(
            "[telemetry]\notlp_endpoint = \"{}\"\nservice_name = \"tokentap-test\"\nmetric_interval = \"1s\"\n{telemetry}\n{extra}",
            collector.url()
        ),
    )
    .await;
    for _ in 0..requests {
        let request =
            http::Request::post(format!("http://{}/v1/chat/completions", server.proxy_addr))
                .header("authorization", "Bearer sk-do-not-leak")
                .header("x-tenant", "acme-tenant")
                .body(Full::new(Bytes::from(format!(
                    r#"{{"model":"traced-model","stream":true,"max_tokens":5,"messages":[{{"role":"user","content":"{PROMPT_TEXT}"}}]}}"#
                ))))
                .unwrap();
        let response = send(request).await;
        assert_eq!(response.status, status);
    }
    records.wait_for(requests).await;
    server.shutdown().await; // flushes the exporters
    collector.requests()
}

fn on_path<'a>(received: &'a [Received], path: &str) -> Vec<&'a Received> {
    received.iter().filter(|r| r.path == path).collect()
}

/// Every metric name the collector was sent.
fn metric_names(received: &[Received]) -> Vec<String> {
    on_path(received, "/v1/metrics")
        .iter()
        .flat_map(|export| {
            ExportMetricsServiceRequest::decode(export.body.clone())
                .expect("an OTLP metrics export")
                .resource_metrics
        })
        .flat_map(|resource| resource.scope_metrics)
        .flat_map(|scope| scope.metrics)
        .map(|metric| metric.name)
        .collect()
}

/// Every data point of metric `name`: its attributes and its value (a histogram's sum).
fn points(received: &[Received], name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    on_path(received, "/v1/metrics")
        .iter()
        .flat_map(|export| {
            ExportMetricsServiceRequest::decode(export.body.clone())
                .unwrap()
                .resource_metrics
        })
        .flat_map(|resource| resource.scope_metrics)
        .flat_map(|scope| scope.metrics)
        .filter(|metric| metric.name == name)
        .flat_map(|metric| match metric.data {
            Some(Data::Histogram(h)) => h
                .data_points
                .into_iter()
                .map(|p| (attributes(&p.attributes), p.sum.unwrap_or_default()))
                .collect::<Vec<_>>(),
            Some(Data::Sum(sum)) => sum
                .data_points
                .into_iter()
                .map(|p| {
                    let value = match p.value {
                        Some(Value::AsInt(i)) => i as f64,
                        Some(Value::AsDouble(d)) => d,
                        None => f64::NAN,
                    };
                    (attributes(&p.attributes), value)
                })
                .collect(),
            other => panic!("{name} is {other:?}"),
        })
        .collect()
}

/// Every log record the collector was sent.
fn log_records(received: &[Received]) -> Vec<LogRecord> {
    on_path(received, "/v1/logs")
        .iter()
        .flat_map(|export| {
            assert_eq!(export.method, "POST");
            assert_eq!(export.headers["content-type"], "application/x-protobuf");
            ExportLogsServiceRequest::decode(export.body.clone())
                .expect("an OTLP logs export")
                .resource_logs
        })
        .flat_map(|resource| resource.scope_logs)
        .flat_map(|scope| {
            // docs/deploy.md's collector keeps tokentap's events by this scope.
            assert_eq!(scope.scope.map(|s| s.name).as_deref(), Some("tokentap"));
            scope.log_records
        })
        .collect()
}

/// A record's attributes by key, each value as text (strings bare, numbers and flags written).
fn attributes(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// The tenant hash the event must carry: HMAC-SHA-256 of the name under the salt, its first 8
/// bytes little-endian, as 16 hex digits (the workload capture's keyed hash).
fn salted_hash(salt: &str, value: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, salt.as_bytes());
    let tag = ring::hmac::sign(&key, value.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&tag.as_ref()[..8]);
    format!("{:016x}", u64::from_le_bytes(first))
}

fn assert_nothing_leaked(received: &[Received]) {
    for export in received {
        for secret in ["sk-do-not-leak", PROMPT_TEXT, COMPLETION_TEXT] {
            assert!(
                !contains(&export.body, secret),
                "{secret} leaked into {}",
                export.path
            );
        }
    }
}

#[tokio::test]
async fn spans_and_current_genai_metrics_reach_the_collector() {
    let received = exported("", "", 1).await;
    let traces = on_path(&received, "/v1/traces");
    assert!(
        !traces.is_empty(),
        "no trace export; got {:?}",
        received.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    let trace = &traces[0];
    assert_eq!(trace.method, "POST");
    assert_eq!(trace.headers["content-type"], "application/x-protobuf");
    for needle in [
        "chat traced-model",
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.request.max_tokens",
        "gen_ai.request.stream",
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.first_token",
        "tokentap.time_to_first_token_s",
        "tokentap-test",
    ] {
        assert!(contains(&trace.body, needle), "span export lacks {needle}");
    }
    let names = metric_names(&received);
    for name in CURRENT_METRICS {
        assert!(
            names.iter().any(|n| n == name),
            "metrics export lacks {name}; got {names:?}"
        );
    }
    for name in LEGACY_METRICS {
        assert!(
            !names.iter().any(|n| n == name),
            "{name} is superseded: pushed only with otlp_legacy_genai_names"
        );
    }
    // Events are opt-in: none unless asked.
    assert!(on_path(&received, "/v1/logs").is_empty());
    assert_nothing_leaked(&received);
}

#[tokio::test]
async fn the_superseded_metric_names_come_back_behind_the_legacy_setting() {
    let received = exported("otlp_legacy_genai_names = true", "", 1).await;
    let names = metric_names(&received);
    for name in LEGACY_METRICS.iter().chain(&CURRENT_METRICS) {
        assert!(
            names.iter().any(|n| n == name),
            "metrics export lacks {name}; got {names:?}"
        );
    }
}

#[tokio::test]
async fn one_inference_details_event_per_request_with_the_tenant_hashed_and_no_text() {
    let salt = "event-salt-for-the-test";
    let received = exported(
        &format!(
            "otlp_request_events = true\notlp_event_salt = \"{salt}\"\notlp_provider_name = \"vllm\""
        ),
        "[tenants]\nheader = \"x-tenant\"\nallow = [\"acme-tenant\"]\n",
        2,
    )
    .await;
    let records = log_records(&received);
    // Once per request at its end, never per SSE event (each stream had three).
    assert_eq!(records.len(), 2, "{records:#?}");
    let spans: Vec<_> = on_path(&received, "/v1/traces")
        .iter()
        .flat_map(|export| {
            ExportTraceServiceRequest::decode(export.body.clone())
                .unwrap()
                .resource_spans
        })
        .flat_map(|resource| resource.scope_spans)
        .flat_map(|scope| scope.spans)
        .collect();
    for record in &records {
        assert_eq!(
            record.event_name,
            "gen_ai.client.inference.operation.details"
        );
        // No body at all: what the event says is in its attributes.
        assert!(record.body.is_none(), "{:?}", record.body);
        assert!(record.time_unix_nano > 0);
        // The event joins its request's span.
        assert!(
            spans
                .iter()
                .any(|s| s.trace_id == record.trace_id && s.span_id == record.span_id),
            "no span shares the event's trace context"
        );
        let a = attributes(&record.attributes);
        for (key, value) in [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "vllm"),
            ("gen_ai.request.model", "traced-model"),
            ("gen_ai.response.model", "traced-model"),
            ("gen_ai.request.stream", "true"),
            ("gen_ai.request.max_tokens", "5"),
            ("gen_ai.usage.input_tokens", "7"),
            ("gen_ai.usage.output_tokens", "2"),
            ("gen_ai.usage.cache_read.input_tokens", "3"),
            ("tokentap.outcome", "ok"),
            ("http.response.status_code", "200"),
        ] {
            assert_eq!(
                a.get(key).map(String::as_str),
                Some(value),
                "{key} in {a:#?}"
            );
        }
        for key in [
            "gen_ai.response.time_to_first_chunk",
            "tokentap.time_to_first_token_s",
            "tokentap.duration_s",
            "server.address",
        ] {
            assert!(a.contains_key(key), "{key} missing from {a:#?}");
        }
        assert!(!a.contains_key("error.type"), "{a:#?}");
        // The tenant is there only as its salted hash, never by name.
        assert_eq!(
            a.get("tokentap.tenant.hash"),
            Some(&salted_hash(salt, "acme-tenant")),
            "{a:#?}"
        );
        assert!(!a.contains_key("tokentap.tenant"), "{a:#?}");
        assert!(
            !a.values()
                .any(|v| v.contains("acme-tenant") || v.contains("sk-do-not-leak")),
            "a raw identity or key in {a:#?}"
        );
        // The conventions' content attributes are never set.
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
        ] {
            assert!(!a.contains_key(key), "{key} in {a:#?}");
        }
    }
    assert_nothing_leaked(&received);
}

/// The part of a Markdown page from `heading` to the next heading of the same level.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}`"));
    let rest = &page[start + heading.len() + 2..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The first fenced block of `language` in `text`.
fn fenced<'a>(text: &'a str, language: &str) -> &'a str {
    let open = format!("```{language}\n");
    let start = text
        .find(&open)
        .unwrap_or_else(|| panic!("no {language} block"))
        + open.len();
    &text[start..start + text[start..].find("```").unwrap()]
}

#[test]
fn the_docs_list_the_pushed_names_and_a_collector_pipeline_that_holds_together() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let metrics = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    let otel = section(&metrics, "## OpenTelemetry");
    // The table of metrics is exactly what a default export pushes.
    let listed: Vec<&str> = otel
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|line| line.split('`').next())
        .filter(|name| name.starts_with("gen_ai."))
        .collect();
    assert_eq!(
        listed, CURRENT_METRICS,
        "docs/metrics.md's OpenTelemetry table"
    );
    for name in LEGACY_METRICS.iter().chain(&[
        "gen_ai.client.inference.operation.details",
        "tokentap.tenant.hash",
    ]) {
        assert!(
            otel.contains(&format!("`{name}`")),
            "docs/metrics.md does not name {name}"
        );
    }

    let deploy = std::fs::read_to_string(root.join("docs/deploy.md")).unwrap();
    let events = section(&deploy, "## Per-request events to a store");
    // tokentap's side loads as written (the salt's placeholder is a salt like any other).
    let settings = fenced(events, "toml");
    let config = tokentap::config::ConfigLoader::new()
        .text(settings, "docs/deploy.md")
        .and_then(tokentap::config::ConfigLoader::load)
        .unwrap_or_else(|e| panic!("docs/deploy.md's settings: {e}"));
    assert!(config.telemetry.otlp_request_events);
    // The collector's: every component a pipeline names is defined, the logs pipeline takes
    // OTLP/HTTP and keeps tokentap's scope.
    let collector = crate::deploy_tests::yaml::parse(fenced(events, "yaml"), "docs/deploy.md")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(collector
        .str_at("receivers.otlp.protocols.http.endpoint")
        .ends_with(":4318"));
    let pipelines = collector.at("service.pipelines").unwrap().entries();
    assert!(pipelines.iter().any(|(name, _)| name.starts_with("logs")));
    for (name, pipeline) in pipelines {
        for kind in ["receivers", "processors", "exporters"] {
            for component in pipeline.get(kind).map(|c| c.strings()).unwrap_or_default() {
                assert!(
                    collector.get(kind).and_then(|d| d.get(component)).is_some(),
                    "pipeline {name} names {kind} {component}, which is not defined"
                );
            }
        }
    }
    let filter = collector
        .at("processors.filter/tokentap-requests.logs.log_record")
        .unwrap()
        .strings();
    assert_eq!(filter, ["instrumentation_scope.name != \"tokentap\""]);
}

#[tokio::test]
async fn a_failed_request_is_counted_with_its_error_and_zero_tokens_in_unknown() {
    let upstream =
        ScriptedUpstream::start(|_| Script::json(500, r#"{"error":"engine fell over"}"#)).await;
    let received = exported_from(upstream, "otlp_request_events = true", "", 1, 500).await;
    let records = log_records(&received);
    assert_eq!(records.len(), 1, "{records:#?}");
    let a = attributes(&records[0].attributes);
    assert_eq!(
        a.get("error.type").map(String::as_str),
        Some("upstream_error")
    );
    assert_eq!(
        a.get("http.response.status_code").map(String::as_str),
        Some("500")
    );
    assert!(!a.contains_key("gen_ai.usage.input_tokens"), "{a:#?}");
    // The conventions: the token histograms and counters are recorded for failed requests too,
    // `0` where no usage came, the counters' modality then `unknown`.
    // Points are cumulative: a periodic export and the one at shutdown may both carry the same
    // point; each is checked.
    let input = points(&received, "gen_ai.client.inference.operation.input_tokens");
    assert!(!input.is_empty());
    for (attributes, sum) in &input {
        assert_eq!(*sum, 0.0, "{input:?}");
        assert_eq!(
            attributes.get("error.type").map(String::as_str),
            Some("upstream_error")
        );
    }
    let usage = points(&received, "gen_ai.client.inference.usage.input_tokens");
    assert!(!usage.is_empty());
    for (attributes, value) in &usage {
        assert_eq!(*value, 0.0, "{usage:?}");
        assert_eq!(
            attributes.get("gen_ai.token.modality").map(String::as_str),
            Some("unknown")
        );
    }
    let duration = points(&received, "gen_ai.client.inference.duration");
    assert!(!duration.is_empty());
    for (attributes, _) in &duration {
        assert_eq!(
            attributes.get("error.type").map(String::as_str),
            Some("upstream_error")
        );
    }
    // A non-streamed answer has no first chunk.
    assert!(points(&received, "gen_ai.client.inference.time_to_first_chunk").is_empty());
}
