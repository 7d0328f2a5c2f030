//! OpenTelemetry export: one OTLP/HTTP trace span per metered request, the GenAI metrics and,
//! when `telemetry.otlp_request_events` is on, one `gen_ai.client.inference.operation.details`
//! log event per request (`otel_event`). Off unless `telemetry.otlp_endpoint` is set.
//!
//! Spans are built when a request ends, from its record, with the real start and end times and
//! a `gen_ai.first_token` event at the first token — so tracing costs nothing per SSE event; the
//! log event is built at the same moment from the same record.
//! Attributes follow the OpenTelemetry GenAI semantic conventions (`gen_ai.operation.name`,
//! `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.usage.*`, `server.address`,
//! `error.type`) plus `tokentap.*` for what the conventions do not name (TTFT, TBT, buckets,
//! source, `tokentap.request_id`: the request id a client sent or was handed back with its
//! timing, visible ASCII and bounded, `proxy::request_id`). No other request header, no prompt
//! or completion text is ever attached: API keys cannot leak into traces.
//!
//! Metric names are the current conventions' (`semantic-conventions-genai`,
//! `docs/gen-ai/client-inference.md` and `model/gen-ai/token-metrics.yaml`): the
//! `gen_ai.client.inference.*` duration, time to first chunk, per-request token histograms and
//! usage counters; the `gen_ai.server.*` histograms are kept (the conventions did not replace
//! them). `telemetry.otlp_legacy_genai_names` also pushes the names those replaced
//! (`gen_ai.client.token.usage`, `gen_ai.client.operation.duration`) for one release.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
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

use super::otel_event::{EventSetupError, RequestEvents};

#[derive(Debug, thiserror::Error)]
#[error("cannot set up OpenTelemetry export to {endpoint}: {source}")]
pub struct OtelError {
    endpoint: String,
    #[source]
    source: EventSetupError,
}

/// GenAI metric instruments of the current conventions.
struct Instruments {
    /// `gen_ai.client.inference.duration`.
    inference_duration: Histogram<f64>,
    /// `gen_ai.client.inference.time_to_first_chunk`: streamed answers only.
    time_to_first_chunk: Histogram<f64>,
    /// `gen_ai.client.inference.operation.{input,output}_tokens`: one sample per request.
    operation_input_tokens: Histogram<u64>,
    operation_output_tokens: Histogram<u64>,
    /// `gen_ai.client.inference.usage.*`: token counters by `gen_ai.token.modality`.
    usage_input_tokens: Counter<u64>,
    usage_output_tokens: Counter<u64>,
    usage_cache_read_input_tokens: Counter<u64>,
    usage_reasoning_output_tokens: Counter<u64>,
    time_to_first_token: Histogram<f64>,
    time_per_output_token: Histogram<f64>,
    request_duration: Histogram<f64>,
    /// The names the current ones replaced, while `telemetry.otlp_legacy_genai_names` is on.
    legacy: Option<LegacyInstruments>,
}

/// `gen_ai.client.token.usage` (by `gen_ai.token.type`) and `gen_ai.client.operation.duration`,
/// as tokentap pushed them before.
struct LegacyInstruments {
    token_usage: Histogram<u64>,
    operation_duration: Histogram<f64>,
}

/// The OpenTelemetry sink of one proxy instance.
pub struct OtelSink {
    tracer_provider: SdkTracerProvider,
    tracer: SdkTracer,
    meter_provider: SdkMeterProvider,
    instruments: Instruments,
    /// The per-request log events, when `telemetry.otlp_request_events` is on.
    events: Option<RequestEvents>,
    /// `gen_ai.provider.name` (`telemetry.otlp_provider_name`).
    provider_name: opentelemetry::StringValue,
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
            source: EventSetupError::from(source),
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

        let events = if config.otlp_request_events {
            let events = RequestEvents::start(
                &base,
                resource.clone(),
                config.otlp_event_salt.as_deref(),
                EXPORT_TIMEOUT,
            )
            .map_err(|source| OtelError {
                endpoint: crate::net::redact::redact_url(&base),
                source,
            })?;
            Some(events)
        } else {
            None
        };

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
        let tokens = |name: &'static str, description: &'static str| {
            meter
                .u64_histogram(name)
                .with_unit("{token}")
                .with_description(description)
                .with_boundaries(crate::meter::bounds::TOKEN_COUNT_BUCKETS.to_vec())
                .build()
        };
        let counter = |name: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit("{token}")
                .with_description(description)
                .build()
        };
        let legacy = config.otlp_legacy_genai_names.then(|| LegacyInstruments {
            token_usage: tokens(
                "gen_ai.client.token.usage",
                "Input and output tokens per request (superseded)",
            ),
            operation_duration: seconds(
                "gen_ai.client.operation.duration",
                "Request duration seen by tokentap (superseded)",
            ),
        });
        let instruments = Instruments {
            inference_duration: seconds(
                "gen_ai.client.inference.duration",
                "Request duration seen by tokentap",
            ),
            time_to_first_chunk: seconds(
                "gen_ai.client.inference.time_to_first_chunk",
                "Time to the first chunk of a streamed answer",
            ),
            operation_input_tokens: tokens(
                "gen_ai.client.inference.operation.input_tokens",
                "Input tokens per request",
            ),
            operation_output_tokens: tokens(
                "gen_ai.client.inference.operation.output_tokens",
                "Output tokens per request",
            ),
            usage_input_tokens: counter(
                "gen_ai.client.inference.usage.input_tokens",
                "Input tokens, cached ones included",
            ),
            usage_output_tokens: counter(
                "gen_ai.client.inference.usage.output_tokens",
                "Output tokens, reasoning ones included",
            ),
            usage_cache_read_input_tokens: counter(
                "gen_ai.client.inference.usage.cache_read.input_tokens",
                "Input tokens served from the server's prefix cache",
            ),
            usage_reasoning_output_tokens: counter(
                "gen_ai.client.inference.usage.reasoning.output_tokens",
                "Output tokens spent on reasoning",
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
            legacy,
        };
        Ok(Some(Arc::new(Self {
            tracer_provider,
            tracer,
            meter_provider,
            instruments,
            events,
            provider_name: config.otlp_provider_name.clone().into(),
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
            if let Some(events) = &self.events {
                events.force_flush();
                events.shutdown();
            }
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

/// A token count for a `gen_ai.client.inference.usage.*` counter: what the server reported, in
/// `text` (every route tokentap meters is text), or `0` in `unknown` when it reported none, as
/// the conventions ask (the counter is recorded for every request, failed ones included).
fn usage(count: Option<u64>) -> (u64, &'static str) {
    match count {
        Some(count) => (count, "text"),
        None => (0, "unknown"),
    }
}

impl RecordSink for OtelSink {
    fn record(&self, r: &Arc<RequestRecord>) {
        let op = operation(r.labels.route);
        let common = [
            KeyValue::new("gen_ai.operation.name", op),
            KeyValue::new("gen_ai.provider.name", self.provider_name.clone()),
            KeyValue::new("gen_ai.request.model", r.labels.model.to_string()),
            KeyValue::new("server.address", r.labels.upstream.to_string()),
            KeyValue::new("tokentap.source", r.labels.source.as_str()),
        ];
        let legacy = self.instruments.legacy.as_ref();
        // A streamed answer's first chunk: its first body byte from the upstream.
        let first_chunk = r.timing.to_first_byte.filter(|_| r.streaming);

        // What the span and the log event both carry: never a slice value (the event hashes
        // the tenant) nor the client's model name (text from the body).
        let mut shared = vec![
            KeyValue::new("gen_ai.response.model", r.labels.model.to_string()),
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
        ];
        if r.streaming {
            // The conventions: set if and only if the request streamed.
            shared.push(KeyValue::new("gen_ai.request.stream", true));
        }
        if let Some(first) = first_chunk {
            shared.push(KeyValue::new(
                "gen_ai.response.time_to_first_chunk",
                first.as_secs_f64(),
            ));
        }
        if let Some(id) = &r.request_id {
            // What ties this request to the client's own logs and the timing it was handed back.
            shared.push(KeyValue::new("tokentap.request_id", id.to_string()));
        }
        if let Some(prompt) = r.tokens.prompt {
            shared.push(KeyValue::new("gen_ai.usage.input_tokens", as_i64(prompt)));
        }
        if let Some(cached) = r.tokens.cached {
            shared.push(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                as_i64(cached),
            ));
        }
        if let Some(max) = r.tokens.max {
            shared.push(KeyValue::new("gen_ai.request.max_tokens", as_i64(max)));
        }
        if let Some(ttft) = r.timing.ttft {
            shared.push(KeyValue::new(
                "tokentap.time_to_first_token_s",
                ttft.as_secs_f64(),
            ));
        }
        if let Some(answer) = r.timing.ttft_answer {
            shared.push(KeyValue::new(
                "tokentap.time_to_first_answer_token_s",
                answer.as_secs_f64(),
            ));
        }
        if let Some(tool_call) = r.timing.ttft_tool_call {
            shared.push(KeyValue::new(
                "tokentap.time_to_first_tool_call_s",
                tool_call.as_secs_f64(),
            ));
        }
        if let Some(reasoning) = r.tokens.reasoning {
            shared.push(KeyValue::new(
                "gen_ai.usage.reasoning.output_tokens",
                as_i64(reasoning),
            ));
            if legacy.is_some() {
                // tokentap's name from before the conventions had one.
                shared.push(KeyValue::new(
                    "tokentap.usage.reasoning_tokens",
                    as_i64(reasoning),
                ));
            }
        }
        if r.with_tools {
            shared.push(KeyValue::new("tokentap.request.tools", true));
        }
        if let Some(tbt) = r.timing.tbt {
            shared.push(KeyValue::new(
                "tokentap.time_between_tokens_s",
                tbt.as_secs_f64(),
            ));
        }
        if let Some(rate) = r.tokens.prefill_per_second {
            shared.push(KeyValue::new("tokentap.prefill_tokens_per_second", rate));
        }
        if r.slo.verdict != crate::meter::record::SloVerdict::Unset {
            // met / missed against the request's SLO targets (docs/metrics.md).
            shared.push(KeyValue::new("tokentap.slo", r.slo.verdict.label()));
        }
        if r.outcome != Outcome::Ok {
            shared.push(KeyValue::new("error.type", r.outcome.label()));
        }

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
        // The event takes its own copy only when events are on: no cost otherwise.
        let event_attributes = self.events.as_ref().map(|_| shared.clone());
        attributes.extend(shared);

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
        let span_context = span.span_context().clone();
        span.end_with_timestamp(start + r.timing.duration);

        if let (Some(events), Some(mut extra)) = (&self.events, event_attributes) {
            extra.push(KeyValue::new(
                "tokentap.duration_s",
                r.timing.duration.as_secs_f64(),
            ));
            events.emit(r, &common, extra, &span_context);
        }

        let i = &self.instruments;
        let mut with_outcome = common.to_vec();
        if r.outcome != Outcome::Ok {
            with_outcome.push(KeyValue::new("error.type", r.outcome.label()));
        }
        let duration = r.timing.duration.as_secs_f64();
        i.inference_duration.record(duration, &with_outcome);
        i.request_duration.record(duration, &with_outcome);
        if let Some(first) = first_chunk {
            i.time_to_first_chunk.record(first.as_secs_f64(), &common);
        }
        if let Some(ttft) = r.timing.ttft {
            i.time_to_first_token.record(ttft.as_secs_f64(), &common);
        }
        if let Some(tbt) = r.timing.tbt {
            i.time_per_output_token.record(tbt.as_secs_f64(), &common);
        }
        // Every request, failed ones included, `0` where no usage came (the conventions).
        i.operation_input_tokens
            .record(r.tokens.prompt.unwrap_or(0), &with_outcome);
        i.operation_output_tokens
            .record(r.tokens.completion, &with_outcome);
        // Output tokens are counted from the events where the server reported no usage: known
        // unless nothing at all came.
        let completion =
            Some(r.tokens.completion).filter(|&count| count > 0 || r.tokens.completion_exact);
        let mut by_modality = common.to_vec();
        by_modality.push(KeyValue::new("gen_ai.token.modality", "text"));
        for (counter, count) in [
            (&i.usage_input_tokens, r.tokens.prompt),
            (&i.usage_output_tokens, completion),
            (&i.usage_cache_read_input_tokens, r.tokens.cached),
            (&i.usage_reasoning_output_tokens, r.tokens.reasoning),
        ] {
            let (count, modality) = usage(count);
            if let Some(last) = by_modality.last_mut() {
                *last = KeyValue::new("gen_ai.token.modality", modality);
            }
            counter.add(count, &by_modality);
        }

        if let Some(legacy) = legacy {
            legacy.operation_duration.record(duration, &with_outcome);
            let mut tokens = common.to_vec();
            tokens.push(KeyValue::new("gen_ai.token.type", "output"));
            legacy.token_usage.record(r.tokens.completion, &tokens);
            if let Some(prompt) = r.tokens.prompt {
                if let Some(kind) = tokens.last_mut() {
                    *kind = KeyValue::new("gen_ai.token.type", "input");
                }
                legacy.token_usage.record(prompt, &tokens);
            }
        }
    }
}
