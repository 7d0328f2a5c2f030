//! OpenTelemetry export: one OTLP/HTTP trace span per metered request and the GenAI metrics.
//! Off unless `telemetry.otlp_endpoint` is set.
//!
//! Spans are built when a request ends, from its record, with the real start and end times and
//! a `gen_ai.first_token` event at the first token — so tracing costs nothing per SSE event.
//! Attributes follow the OpenTelemetry GenAI semantic conventions (`gen_ai.operation.name`,
//! `gen_ai.request.model`, `gen_ai.usage.*`, `server.address`, `error.type`) plus `tokentap.*`
//! for what the conventions do not name (TTFT, TBT, buckets, source, `tokentap.request_id`: the
//! request id a client sent or was handed back with its timing, visible ASCII and bounded,
//! `proxy::request_id`). No other request header, no prompt or completion text is ever
//! attached: API keys cannot leak into traces.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::base::Route;
use crate::config::TelemetryConfig;
use crate::meter::buckets::Ladder;
use crate::meter::record::{Outcome, RequestRecord};
use crate::meter::RecordSink;

#[derive(Debug, thiserror::Error)]
#[error("cannot set up OpenTelemetry export to {endpoint}: {source}")]
pub struct OtelError {
    endpoint: String,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

/// GenAI metric instruments.
struct Instruments {
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
    time_to_first_token: Histogram<f64>,
    time_per_output_token: Histogram<f64>,
    request_duration: Histogram<f64>,
}

/// The OpenTelemetry sink of one proxy instance.
pub struct OtelSink {
    tracer_provider: SdkTracerProvider,
    tracer: SdkTracer,
    meter_provider: SdkMeterProvider,
    instruments: Instruments,
    contexts: Ladder,
    concurrency: Ladder,
}

impl std::fmt::Debug for OtelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtelSink")
    }
}

/// How long an export may take before it is abandoned.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

impl OtelSink {
    /// Starts the exporters when an endpoint is configured; `None` when tracing is off.
    /// Must run inside the tokio runtime (the exporters' tasks live there).
    pub fn start(
        config: &TelemetryConfig,
        contexts: Ladder,
        concurrency: Ladder,
        metric_interval: Duration,
    ) -> Result<Option<Arc<Self>>, OtelError> {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(None);
        };
        let base = endpoint.to_string().trim_end_matches('/').to_string();
        let error = |source| OtelError {
            // The endpoint may carry credentials (userinfo, a token in the query).
            endpoint: crate::net::redact::redact_url(&base),
            source,
        };
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let spans = SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(error)?;
        let tracer_provider = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_span_processor(BatchSpanProcessor::builder(spans, Tokio).build())
            .build();
        let tracer = tracer_provider.tracer("tokentap");

        let metrics = MetricExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(error)?;
        let meter_provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(
                PeriodicReader::builder(metrics, Tokio)
                    .with_interval(metric_interval)
                    .build(),
            )
            .build();
        let meter = meter_provider.meter("tokentap");
        let seconds = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(crate::meter::bounds::LATENCY_BUCKETS.to_vec())
                .build()
        };
        let instruments = Instruments {
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Input and output tokens per request")
                .with_boundaries(crate::meter::bounds::TOKEN_COUNT_BUCKETS.to_vec())
                .build(),
            operation_duration: seconds(
                "gen_ai.client.operation.duration",
                "Request duration seen by tokentap",
            ),
            time_to_first_token: seconds(
                "gen_ai.server.time_to_first_token",
                "Time to the first generated token",
            ),
            time_per_output_token: meter
                .f64_histogram("gen_ai.server.time_per_output_token")
                .with_unit("s")
                .with_description("Time between tokens after the first")
                .with_boundaries(crate::meter::bounds::TOKEN_GAP_BUCKETS.to_vec())
                .build(),
            request_duration: seconds(
                "gen_ai.server.request.duration",
                "Generation request duration",
            ),
        };
        Ok(Some(Arc::new(Self {
            tracer_provider,
            tracer,
            meter_provider,
            instruments,
            contexts,
            concurrency,
        })))
    }

    /// Exports what is pending and stops the exporters. The SDK's flush blocks its thread until
    /// the export tasks (which run on the tokio runtime) finish, so it runs on a blocking thread:
    /// on a runtime worker it could deadlock a current-thread runtime.
    pub async fn shutdown(self: Arc<Self>) {
        let flushed = tokio::task::spawn_blocking(move || {
            let _ = self.tracer_provider.force_flush();
            let _ = self.meter_provider.force_flush();
            let _ = self.tracer_provider.shutdown();
            let _ = self.meter_provider.shutdown();
        });
        if tokio::time::timeout(EXPORT_TIMEOUT * 2, flushed)
            .await
            .is_err()
        {
            tracing::warn!("OpenTelemetry export did not finish in time at shutdown");
        }
    }
}

fn operation(route: Route) -> &'static str {
    match route {
        Route::ChatCompletions | Route::Messages | Route::Responses => "chat",
        Route::Completions => "text_completion",
        Route::Generate => "generate_content",
    }
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl RecordSink for OtelSink {
    fn record(&self, r: &Arc<RequestRecord>) {
        let op = operation(r.labels.route);
        let common = [
            KeyValue::new("gen_ai.operation.name", op),
            KeyValue::new("gen_ai.request.model", r.labels.model.to_string()),
            KeyValue::new("server.address", r.labels.upstream.to_string()),
            KeyValue::new("tokentap.source", r.labels.source.as_str()),
        ];

        let mut attributes = common.to_vec();
        for (dimension, value) in r.labels.slice.iter() {
            // `tokentap.tenant`, `tokentap.priority`, …: one attribute per slice dimension.
            attributes.push(KeyValue::new(
                format!("tokentap.{dimension}"),
                value.as_str().to_owned(),
            ));
        }
        if let Some(asked) = &r.labels.asked_model {
            // The name the client sent, when the served model differs (bounded like labels).
            attributes.push(KeyValue::new("tokentap.model.asked", asked.to_string()));
        }
        if let Some(id) = &r.request_id {
            // What ties this span to the client's own logs and the timing it was handed back.
            attributes.push(KeyValue::new("tokentap.request_id", id.to_string()));
        }
        attributes.extend([
            KeyValue::new("gen_ai.usage.output_tokens", as_i64(r.tokens.completion)),
            KeyValue::new("http.response.status_code", i64::from(r.status)),
            KeyValue::new("tokentap.route", r.labels.route.label()),
            KeyValue::new("tokentap.outcome", r.outcome.label()),
            KeyValue::new("tokentap.streaming", r.streaming),
            KeyValue::new(
                "tokentap.completion_tokens_exact",
                r.tokens.completion_exact,
            ),
            KeyValue::new("tokentap.token_events", as_i64(r.tokens.events)),
            KeyValue::new(
                "tokentap.average_active_requests",
                r.interference.average_active,
            ),
            KeyValue::new(
                "tokentap.context_bucket",
                self.contexts.label(r.buckets.context).to_string(),
            ),
            KeyValue::new(
                "tokentap.concurrency_bucket",
                self.concurrency.label(r.buckets.concurrency).to_string(),
            ),
        ]);
        if let Some(prompt) = r.tokens.prompt {
            attributes.push(KeyValue::new("gen_ai.usage.input_tokens", as_i64(prompt)));
        }
        if let Some(cached) = r.tokens.cached {
            attributes.push(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                as_i64(cached),
            ));
        }
        if let Some(max) = r.tokens.max {
            attributes.push(KeyValue::new("gen_ai.request.max_tokens", as_i64(max)));
        }
        if let Some(ttft) = r.timing.ttft {
            attributes.push(KeyValue::new(
                "tokentap.time_to_first_token_s",
                ttft.as_secs_f64(),
            ));
        }
        if let Some(answer) = r.timing.ttft_answer {
            attributes.push(KeyValue::new(
                "tokentap.time_to_first_answer_token_s",
                answer.as_secs_f64(),
            ));
        }
        if let Some(tool_call) = r.timing.ttft_tool_call {
            attributes.push(KeyValue::new(
                "tokentap.time_to_first_tool_call_s",
                tool_call.as_secs_f64(),
            ));
        }
        if let Some(reasoning) = r.tokens.reasoning {
            attributes.push(KeyValue::new(
                "tokentap.usage.reasoning_tokens",
                as_i64(reasoning),
            ));
        }
        if r.with_tools {
            attributes.push(KeyValue::new("tokentap.request.tools", true));
        }
        if let Some(tbt) = r.timing.tbt {
            attributes.push(KeyValue::new(
                "tokentap.time_between_tokens_s",
                tbt.as_secs_f64(),
            ));
        }
        if let Some(rate) = r.tokens.prefill_per_second {
            attributes.push(KeyValue::new("tokentap.prefill_tokens_per_second", rate));
        }
        if r.slo.verdict != crate::meter::record::SloVerdict::Unset {
            // met / missed against the request's SLO targets (docs/metrics.md).
            attributes.push(KeyValue::new("tokentap.slo", r.slo.verdict.label()));
        }
        if r.outcome != Outcome::Ok {
            attributes.push(KeyValue::new("error.type", r.outcome.label()));
        }

        let start = r.timing.started_at;
        let mut span = self
            .tracer
            .span_builder(format!("{op} {}", r.labels.model))
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes(attributes)
            .start(&self.tracer);
        if let Some(ttft) = r.timing.ttft {
            span.add_event_with_timestamp("gen_ai.first_token", start + ttft, Vec::new());
        }
        if let Some(answer) = r.timing.ttft_answer.filter(|a| Some(*a) != r.timing.ttft) {
            span.add_event_with_timestamp(
                "tokentap.first_answer_token",
                start + answer,
                Vec::new(),
            );
        }
        if r.outcome != Outcome::Ok {
            span.set_status(Status::error(r.outcome.label()));
        }
        span.end_with_timestamp(start + r.timing.duration);

        let i = &self.instruments;
        let mut with_outcome = common.to_vec();
        if r.outcome != Outcome::Ok {
            with_outcome.push(KeyValue::new("error.type", r.outcome.label()));
        }
        i.operation_duration
            .record(r.timing.duration.as_secs_f64(), &with_outcome);
        i.request_duration
            .record(r.timing.duration.as_secs_f64(), &with_outcome);
        if let Some(ttft) = r.timing.ttft {
            i.time_to_first_token.record(ttft.as_secs_f64(), &common);
        }
        if let Some(tbt) = r.timing.tbt {
            i.time_per_output_token.record(tbt.as_secs_f64(), &common);
        }
        let mut tokens = common.to_vec();
        tokens.push(KeyValue::new("gen_ai.token.type", "output"));
        i.token_usage.record(r.tokens.completion, &tokens);
        if let Some(prompt) = r.tokens.prompt {
            if let Some(kind) = tokens.last_mut() {
                *kind = KeyValue::new("gen_ai.token.type", "input");
            }
            i.token_usage.record(prompt, &tokens);
        }
    }
}
