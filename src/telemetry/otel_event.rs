//! The opt-in per-request OpenTelemetry log event, `gen_ai.client.inference.operation.details`
//! (GenAI semantic conventions, `docs/gen-ai/client-inference.md`), sent over OTLP/HTTP to
//! `<telemetry.otlp_endpoint>/v1/logs` when `telemetry.otlp_request_events` is on: what a
//! fleet's collector routes to a store (ClickHouse, Loki, object storage) one row per request.
//!
//! One event per metered request, built when it ends from the same [`RequestRecord`] the span
//! is, so it costs nothing per SSE event. It carries the conventions' attributes tokentap knows
//! (operation, provider, model, stream, usage with cached and reasoning tokens, time to first
//! chunk, `error.type`) and `tokentap.*` figures, and never a body's text: the conventions'
//! opt-in `gen_ai.input.messages` / `gen_ai.output.messages` / `gen_ai.system_instructions`
//! are not set, and no header's value is sent but the bounded request id. Identities are hashed:
//! the tenant is sent as `tokentap.tenant.hash`, an HMAC-SHA-256 under
//! `telemetry.otlp_event_salt` (the workload capture's keyed hash, `stream::fingerprint`),
//! never as its name.

use std::time::SystemTime;

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::trace::SpanContext;
use opentelemetry::{KeyValue, Value};
use opentelemetry_otlp::{LogExporter, WithExportConfig};
use opentelemetry_sdk::logs::log_processor_with_async_runtime::BatchLogProcessor;
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::Resource;

use crate::meter::record::RequestRecord;
use crate::stream::fingerprint::PrefixSalt;

/// The event's name, as the conventions fix it.
pub const EVENT_NAME: &str = "gen_ai.client.inference.operation.details";

/// Slice dimensions that name who sent a request: sent hashed, never as their value. A session
/// id is one too: the record carries none yet; when it does, it is hashed here the same way
/// (`hashed_identity`, as `tokentap.session.hash`), never sent as `gen_ai.conversation.id`,
/// which the conventions reserve for the conversation's own identifier.
const HASHED_DIMENSIONS: &[&str] = &["tenant"];

/// The log pipeline of the request events.
pub(super) struct RequestEvents {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
    salt: PrefixSalt,
}

/// Why the events could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EventSetupError {
    #[error(transparent)]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("no randomness for the event salt (set telemetry.otlp_event_salt)")]
    NoRandomness,
}

impl RequestEvents {
    /// The OTLP/HTTP log exporter to `<base>/v1/logs`, batched on the tokio runtime.
    pub(super) fn start(
        base: &str,
        resource: Resource,
        salt: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<Self, EventSetupError> {
        let salt = match salt {
            Some(secret) => PrefixSalt::from_secret(secret.as_bytes()),
            None => PrefixSalt::random().ok_or(EventSetupError::NoRandomness)?,
        };
        let exporter = LogExporter::builder()
            .with_http()
            .with_endpoint(format!("{base}/v1/logs"))
            .with_timeout(timeout)
            .build()?;
        // The batch processor's queue is bounded (2,048 records by default): past it records are
        // dropped, not held, so a collector that is down costs no memory beyond it.
        let provider = SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_log_processor(BatchLogProcessor::builder(exporter, Tokio).build())
            .build();
        let logger = provider.logger("tokentap");
        Ok(Self {
            provider,
            logger,
            salt,
        })
    }

    pub(super) fn force_flush(&self) {
        let _ = self.provider.force_flush();
    }

    pub(super) fn shutdown(&self) {
        let _ = self.provider.shutdown();
    }

    /// The salted hash of one identity (tenant, later a session): 16 hex digits. The keyed
    /// hash is the workload capture's: for a value up to 64 KiB its last block id covers all
    /// of it (labels are far shorter), so equal values hash equal and nothing else is learned.
    fn hashed_identity(&self, value: &str) -> String {
        let id = self
            .salt
            .fingerprint(value.as_bytes())
            .last()
            .copied()
            .unwrap_or_default();
        format!("{id:016x}")
    }

    /// Emits the event of one finished request. `common` are the attributes spans and metrics
    /// share (operation, provider, model, server); `trace` ties it to the request's span.
    pub(super) fn emit(
        &self,
        r: &RequestRecord,
        common: &[KeyValue],
        extra: Vec<KeyValue>,
        trace: &SpanContext,
    ) {
        let mut record = self.logger.create_log_record();
        record.set_event_name(EVENT_NAME);
        record.set_severity_number(Severity::Info);
        record.set_severity_text("INFO");
        record.set_timestamp(r.timing.started_at + r.timing.duration);
        record.set_observed_timestamp(SystemTime::now());
        if trace.is_valid() {
            record.set_trace_context(trace.trace_id(), trace.span_id(), Some(trace.trace_flags()));
        }
        record.add_attributes(
            common
                .iter()
                .map(|kv| (kv.key.clone(), any(kv.value.clone()))),
        );
        for (dimension, value) in r.labels.slice.iter() {
            if HASHED_DIMENSIONS.contains(&dimension) {
                record.add_attribute(
                    format!("tokentap.{dimension}.hash"),
                    self.hashed_identity(value.as_str()),
                );
            } else {
                // Bounded bands (`priority`), no identity: as the span has them.
                record.add_attribute(format!("tokentap.{dimension}"), value.as_str().to_owned());
            }
        }
        record.add_attributes(extra.into_iter().map(|kv| (kv.key, any(kv.value))));
        self.logger.emit(record);
    }
}

/// A span attribute's value as a log attribute's (the SDK converts no `Value` itself).
fn any(value: Value) -> AnyValue {
    match value {
        Value::Bool(b) => b.into(),
        Value::I64(i) => i.into(),
        Value::F64(f) => f.into(),
        Value::String(s) => s.into(),
        // Arrays (no attribute of tokentap's is one) and variants added later: as text.
        other => other.to_string().into(),
    }
}
