//! The start phase: what a metered request is recorded as, gathered into one
//! `meter::RequestStart` and handed to the meter, which counts the request in from here: its
//! labels (built in `labels` alone: the model it is recorded under, its source, the upstream's
//! configuration and its traffic slice), its SLO targets, whether its client gets its
//! timing back, and its id.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Version};
use tokio::time::Instant;

use super::admit::Admitted;
use super::prepare::Prepared;
use crate::base::{Route, Source};
use crate::config::ServerTiming;
use crate::meter::labels::{HeldRelease, SettleLabels};
use crate::meter::slo::SLO_HEADER;
use crate::meter::{RequestLabels, RequestMeter, RequestStart, PROMPT_BYTES_PER_TOKEN};
use crate::proxy::headers::takes_trailers;
use crate::proxy::request_id;
use crate::proxy::service::{ModelLabels, Proxy};
use crate::proxy::slice::slice_of;
use crate::proxy::upstream::{Upstream, UNKNOWN_MODEL};
use crate::stream::request::RequestFacts;
use crate::stream::rewrite::Injected;

/// A client asked for its timing back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimingAsk {
    /// It takes trailers: HTTP/2, or HTTP/1.1 with `TE: trailers`.
    pub(crate) trailers: bool,
}

/// A metered request on its way to the upstream.
pub(crate) struct MeteredRequest {
    pub(crate) meter: RequestMeter,
    pub(crate) route: Route,
    pub(crate) injected: Injected,
    /// The client asked for its timing back.
    pub(crate) timing: Option<TimingAsk>,
}

impl Proxy {
    /// The start phase: the request counted in by the meter, from its head in and the moment
    /// its body had been read.
    pub(crate) fn start(
        &self,
        admitted: &Admitted,
        prepared: Prepared,
        head_in: Instant,
        body_read: Instant,
    ) -> MeteredRequest {
        let Prepared {
            route,
            facts,
            injected,
            prefix_blocks,
            turn,
        } = prepared;
        let (headers, version) = (&admitted.parts.headers, admitted.parts.version);
        let labels = self.labels(admitted, route, &facts);
        // The upstream's first self-description read (or the fingerprint that follows it) is
        // under way: the model and the fingerprint are provisional, settled when the request's
        // first token comes or it ends, its record held until then (one check per request).
        let settle = (!admitted.upstream.labels_settled()).then(|| {
            Arc::new(Unsettled {
                upstream: Arc::clone(&admitted.upstream),
                models: Arc::clone(&self.models),
                asked: facts.model.as_deref().map(Arc::from),
            }) as Arc<dyn SettleLabels>
        });
        // Once per request, off the hot path; the header is forwarded like any other.
        // A model's targets are found under the served name (what the matrix says) or the
        // name the client sent.
        let slo_model = Some(&*labels.model)
            .filter(|served| self.metering.slo.models.contains_key(*served))
            .or(facts.model.as_deref());
        let slo = self.metering.slo.resolve(
            slo_model,
            headers.get(SLO_HEADER).map(HeaderValue::as_bytes),
        );
        // Only a client gets its timing back: tokentap's own requests read their records.
        let timing = (!admitted.internal && self.timing_asked(headers)).then(|| TimingAsk {
            trailers: version == Version::HTTP_2
                || (version == Version::HTTP_11 && takes_trailers(headers)),
        });
        // The client's id when it is safe to repeat; tokentap's own where the client is handed
        // its timing (the id ties it to the record) and sent none it could be given back.
        let request_id = request_id::from_client(headers)
            .or_else(|| timing.is_some().then(request_id::generate));
        // The cell's series exist before its first request ends (Prometheus' `increase()`
        // never counts a series' first sample): its prompt's size says which, until the
        // upstream counts it.
        let estimated_prompt_tokens = facts.prompt.map(|prompt| {
            let bytes = prompt.end.saturating_sub(prompt.start) as u64;
            bytes / PROMPT_BYTES_PER_TOKEN
        });
        let start = RequestStart {
            labels,
            max_tokens: facts.max_tokens,
            with_tools: facts.with_tools,
            prefix_blocks,
            turn,
            slo,
            request_id,
            body_read: Some(body_read),
            estimated_prompt_tokens,
            settle,
        };
        MeteredRequest {
            meter: self.meter.begin(start, head_in),
            route,
            injected,
            timing,
        }
    }

    /// Who a metered request is, for labels and aggregation: built here and nowhere else.
    fn labels(&self, admitted: &Admitted, route: Route, facts: &RequestFacts) -> RequestLabels {
        let upstream = &admitted.upstream;
        let (model, asked_model) = recorded_model(&self.models, upstream, facts.model.as_deref());
        let (source, tag, tenant) = match &admitted.synthetic {
            Some(s) => (Source::Synthetic, s.tag.clone(), None),
            None => (
                Source::Production,
                None,
                self.tenants.of(&admitted.parts.headers),
            ),
        };
        RequestLabels {
            route,
            source,
            model,
            asked_model,
            upstream: Arc::clone(&upstream.name),
            tag,
            // One atomic load: the configuration the upstream runs as this request starts.
            fingerprint: upstream.identity.current(),
            slice: slice_of(&admitted.parts, facts, tenant, source == Source::Production),
        }
    }

    /// Whether this request's client gets its timing back (`metering.server_timing`).
    fn timing_asked(&self, headers: &HeaderMap) -> bool {
        match self.metering.server_timing {
            ServerTiming::Off => false,
            ServerTiming::OnRequest => headers.contains_key(&self.metering.server_timing_header),
            ServerTiming::Always => true,
        }
    }
}

/// The model a request is recorded under, and the client's own name for it when that
/// differs (a bounded label, never a matrix key). Neither the request nor the response can
/// be trusted for the first: sglang serves any name a client sends and echoes it back. So:
/// a server that serves one model records every request under it; one that serves several
/// (vLLM with LoRA adapters) under the served id the client named, else `other`. Until the
/// server has said what it serves, the client's name (bounded by `max_models`), and for a
/// request that names none, `default_model`.
fn recorded_model(
    models: &ModelLabels,
    upstream: &Upstream,
    asked: Option<&str>,
) -> (Arc<str>, Option<Arc<str>>) {
    let served = upstream.served_models();
    let recorded = match (served.as_ref(), asked) {
        ([], Some(asked)) => models.label(asked),
        ([], None) => match &upstream.default_model {
            Some(configured) => Arc::clone(configured),
            None => models.label(UNKNOWN_MODEL),
        },
        ([only], _) => models.label(only),
        (several, Some(asked)) => match several.iter().find(|m| &***m == asked) {
            Some(served) => models.label(served),
            None => models.other(),
        },
        ([first, ..], None) => match &upstream.default_model {
            Some(configured) => Arc::clone(configured),
            None => models.label(first),
        },
    };
    let asked = asked
        .filter(|asked| *asked != &*recorded)
        .map(|asked| models.label(asked));
    (recorded, asked)
}

/// What settles a request's provisional labels: its upstream, the proxy's model labels and
/// the name the client sent.
struct Unsettled {
    upstream: Arc<Upstream>,
    models: Arc<ModelLabels>,
    asked: Option<Arc<str>>,
}

impl SettleLabels for Unsettled {
    fn settle(&self, labels: &mut RequestLabels) -> bool {
        if !self.upstream.served_models().is_empty() {
            let (model, asked) =
                recorded_model(&self.models, &self.upstream, self.asked.as_deref());
            labels.model = model;
            labels.asked_model = asked;
        }
        if !labels.fingerprint.is_config() {
            labels.fingerprint = self.upstream.identity.current();
        }
        self.upstream.labels_settled()
    }

    fn hold(&self, release: HeldRelease) -> Result<(), HeldRelease> {
        self.upstream.hold_until_settled(release)
    }
}
