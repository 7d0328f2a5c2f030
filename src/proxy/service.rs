//! The forwarding service: one request in, the upstream's response out, measured on the way.
//!
//! Every request is forwarded: method, path, query, headers (minus hop-by-hop) and body. On
//! metered routes (POST to the generation endpoints) the body is read up to the parse limit to
//! learn the model and whether it streams, usage options may be injected, and the response
//! body is wrapped in the metering body. Bodies over the limit, bodies that are not JSON and
//! every other route pass through unmeasured. Nothing on this path ever rejects a request on
//! tokentap's account except a body the client failed to send (or sent too slowly: request
//! bodies are under an idle timeout, metered ones also under a total one). Upstream response
//! bodies are under the upstream's idle timeout; a stall ends them as `upstream_stalled`.
//!
//! A client may get its request's own timing back (`metering.server_timing`: on request, by a
//! header, or always): a stream as a trailer where the client takes trailers (HTTP/2, or
//! HTTP/1.1 with `TE: trailers`, announced by `Trailer: Server-Timing`), else as a final SSE
//! comment; a non-streamed answer as a `Server-Timing` header, for which its body is read whole
//! first (up to `metering.max_parse_bytes`; a longer one is forwarded as it is, without it).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, Response, Version};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::body::{DynBody, RequestBody, ResponseBody};
use super::box_error::BoxError;
use super::code_fields::{FieldScanner, GuardedBody};
use super::connector::at_capacity;
use super::error::{error_chain, ProxyError};
use super::headers::{announces_trailer, is_event_stream, remove_hop_by_hop, takes_trailers};
use super::request_id;
use super::routes::{Internal, Refused, RoutePolicy};
use super::timeout::{is_stall, IdleError, IdleTimeout};
use super::upstream::{Router, Upstream};
use crate::base::lock;
use crate::base::Route;
use crate::base::Source;
use crate::config::{CodeFields, MeteringConfig, ServerTiming};
use crate::meter::priority::PriorityBand;
use crate::meter::slo::SLO_HEADER;
use crate::meter::{Meter, RequestLabels, RequestMeter};
use crate::net::faults::{Fault, FaultCounters};
use crate::net::streams::StreamWatch;
use crate::stream::body::{MeteredBody, Metering, MeteringOptions};
use crate::stream::fingerprint::PrefixSalt;
use crate::stream::held::HeldBudget;
use crate::stream::request::{carries_field, injection, inspect};
use crate::stream::rewrite::Injected;
use crate::stream::timing::{TimingDelivery, SERVER_TIMING};

/// Marks a request as the sweep's own (set in-process only: clients cannot set it).
#[derive(Debug, Clone, Default)]
pub struct Synthetic {
    /// Groups the records of one sweep cell.
    pub tag: Option<Arc<str>>,
}

/// Interns model names for labels. Names the upstreams serve (their `/v1/models`, refreshed
/// in the background by `served_model`, and the configured `models` and `default_model`)
/// always get their own label; any other name a client sends takes one of `max` first-come
/// slots, then is `other`. So junk names can never turn a served model into `other`, and the
/// label set stays bounded by what the servers serve plus `max`.
#[derive(Debug)]
pub struct ModelLabels {
    known: RwLock<HashMap<Box<str>, Arc<str>>>,
    /// Names the upstreams serve.
    served: RwLock<std::collections::HashSet<Box<str>>>,
    /// Slots taken by names no upstream serves.
    unserved: std::sync::atomic::AtomicUsize,
    max: usize,
    other: Arc<str>,
}

pub use super::upstream::MAX_SERVED_MODELS;

impl ModelLabels {
    pub fn new(max: usize) -> Self {
        Self {
            known: RwLock::new(HashMap::new()),
            served: RwLock::new(std::collections::HashSet::new()),
            unserved: std::sync::atomic::AtomicUsize::new(0),
            max,
            other: Arc::from("other"),
        }
    }

    /// Adds names the upstreams serve (kept for the process's life, at most
    /// [`MAX_SERVED_MODELS`]).
    pub fn serve<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let mut served = lock::write(&self.served);
        for name in names {
            if served.len() >= MAX_SERVED_MODELS {
                break;
            }
            if name.len() <= 200 && !served.contains(name) {
                served.insert(Box::from(name));
            }
        }
    }

    /// The label of names no upstream serves once the slots are taken.
    pub fn other(&self) -> Arc<str> {
        Arc::clone(&self.other)
    }

    pub fn label(&self, model: &str) -> Arc<str> {
        use std::sync::atomic::Ordering;
        if let Some(label) = lock::read(&self.known).get(model) {
            return Arc::clone(label);
        }
        if model.len() > 200 {
            return Arc::clone(&self.other);
        }
        let served = lock::read(&self.served).contains(model);
        let mut known = lock::write(&self.known);
        if let Some(label) = known.get(model) {
            return Arc::clone(label);
        }
        if !served {
            if self.unserved.load(Ordering::Relaxed) >= self.max {
                return Arc::clone(&self.other);
            }
            self.unserved.fetch_add(1, Ordering::Relaxed);
        }
        Arc::clone(
            known
                .entry(Box::from(model))
                .or_insert_with(|| Arc::from(model)),
        )
    }
}

/// Shared state of the data path.
#[derive(Debug)]
pub struct Proxy {
    pub router: Router,
    pub meter: Arc<Meter>,
    pub metering: MeteringConfig,
    pub models: ModelLabels,
    pub limits: BodyLimits,
    pub body_budget: BodyBudget,
    /// The data listener's fault counters (timeouts the proxy cuts short count here too).
    pub faults: Arc<FaultCounters>,
    /// Set when the workload capture is on: production prompts are fingerprinted with it.
    pub prefix_salt: Option<PrefixSalt>,
    /// Which paths clients may reach (`proxy.routes`).
    pub routes: RoutePolicy,
    /// Whether request fields an engine runs as code are refused (`proxy.code_fields`).
    pub code_fields: CodeFields,
    /// Who a production request is counted under (`[tenants]`).
    pub tenants: super::tenants::Tenants,
    /// The memory non-streamed answers are held in, over all requests
    /// (`metering.max_held_bytes`).
    pub held_budget: Arc<HeldBudget>,
}

/// The memory metered request bodies may hold while being read, over all requests, in KiB
/// permits. A body that would take more is forwarded as it streams, unmetered: many slow
/// clients cannot make tokentap hold more than this.
#[derive(Debug)]
pub struct BodyBudget {
    kib: Semaphore,
}

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        Self {
            kib: Semaphore::new((bytes / 1024).clamp(1, Semaphore::MAX_PERMITS)),
        }
    }

    /// Grows `held` to cover `bytes`; false if the budget cannot.
    fn cover<'a>(&'a self, held: &mut Option<SemaphorePermit<'a>>, bytes: usize) -> bool {
        let needed = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        let have = held.as_ref().map_or(0, |p| p.num_permits());
        let Some(more) = needed.checked_sub(u32::try_from(have).unwrap_or(u32::MAX)) else {
            return true;
        };
        if more == 0 {
            return true;
        }
        match self.kib.try_acquire_many(more) {
            Ok(permit) => {
                match held {
                    Some(held) => held.merge(permit),
                    None => *held = Some(permit),
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// How long tokentap waits for a client's request body.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Longest gap between frames of any request body.
    pub idle: Duration,
    /// Most time to read a metered body up to the parse limit.
    pub metered_total: Duration,
}

/// The data path as a tower `Service`, generic over the client body type so the sweep engine
/// can send its requests through exactly the same code as production traffic.
#[derive(Debug, Clone)]
pub struct ProxyService {
    proxy: Arc<Proxy>,
}

impl ProxyService {
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Self { proxy }
    }

    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }
}

impl<B> tower::Service<Request<B>> for ProxyService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let proxy = Arc::clone(&self.proxy);
        Box::pin(async move { Ok(proxy.handle(request).await) })
    }
}

/// A body read as far as the parse limit and the buffer budget allow.
enum ReadBody<'a> {
    /// The whole body, and the share of the budget it holds: kept until the upstream has
    /// answered (it has read the body by then), so bodies forwarded to a hung upstream count
    /// as much as bodies being read.
    Complete(Bytes, Option<SemaphorePermit<'a>>),
    /// Longer than the limit, or than the budget allowed: what was read, and the rest still
    /// streaming.
    TooLong(Bytes, DynBody),
}

async fn read_limited(
    mut body: DynBody,
    limit: usize,
    budget: &BodyBudget,
) -> Result<ReadBody<'_>, BoxError> {
    let mut held = None;
    let mut buffer = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // request trailers: nothing to meter
        };
        if first.is_none() && buffer.is_empty() {
            first = Some(data); // the common single-frame body: no copy
        } else {
            if let Some(first) = first.take() {
                buffer.extend_from_slice(&first);
            }
            buffer.extend_from_slice(&data);
        }
        let read = first.as_ref().map_or(buffer.len(), Bytes::len);
        if read > limit || !budget.cover(&mut held, read) {
            let prefix = first.unwrap_or_else(|| buffer.freeze());
            return Ok(ReadBody::TooLong(prefix, body));
        }
    }
    Ok(ReadBody::Complete(
        first.unwrap_or_else(|| buffer.freeze()),
        held,
    ))
}

impl Proxy {
    /// The client's body under the idle timeout, boxed once for either use (read for metering
    /// or streamed upstream).
    fn client_body<B>(&self, body: B) -> DynBody
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Box::pin(
            IdleTimeout::new(body.map_err(Into::into), self.limits.idle)
                .counted(&self.faults, Fault::BodyIdleTimeout)
                .map_err(IdleError::into_box),
        )
    }

    /// Forwards one request and measures it when it is on a metered route.
    pub async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let head_in = Instant::now();
        if request.method() == Method::CONNECT {
            // A tunnel, not a request for the upstream: the client's mistake, not the
            // upstream's failure (HTTP/1 `CONNECT host:port`, HTTP/2 extended CONNECT alike).
            return ProxyError::Method { method: "CONNECT" }.into_response();
        }
        let (mut parts, body) = request.into_parts();
        let synthetic = parts.extensions.remove::<Synthetic>();
        let internal = parts.extensions.remove::<Internal>().is_some() || synthetic.is_some();
        let path = parts.uri.path().to_string();
        let (mut upstream, upstream_path) = match self.router.by_path(&path) {
            Some((upstream, rest)) => (Arc::clone(upstream), rest.to_string()),
            None => (Arc::clone(self.router.default_upstream()), path.clone()),
        };
        if !internal {
            // The path the engine will route, as it will route it.
            if let Err(refused) = self.routes.check(parts.method.as_str(), &upstream_path) {
                let error = match refused {
                    Refused::Route { path, why } => {
                        self.faults.add(Fault::RouteRefused);
                        ProxyError::RouteRefused { path, why }
                    }
                    Refused::Unreadable { target, why } => {
                        self.faults.add(Fault::PathUnreadable);
                        ProxyError::BadPath { target, why }
                    }
                };
                tracing::debug!(%error, "route refused");
                return error.into_response();
            }
        }
        let body = self.client_body(body);
        let route = (parts.method == Method::POST)
            .then(|| Route::from_path(&upstream_path))
            .flatten();

        // A field its engine runs as code is looked for where that engine reads it: the body
        // of such a route is read even when it is not metered.
        let code_field = (!internal && parts.method == Method::POST)
            .then(|| self.code_field(&upstream, &upstream_path))
            .flatten();
        if route.is_none() && code_field.is_none() {
            let body = RequestBody::Stream {
                prefix: None,
                rest: body,
            };
            return self
                .forward(parts, body, &upstream, &upstream_path, None)
                .await;
        }

        let read = read_limited(body, self.metering.max_parse_bytes, &self.body_budget);
        let bytes = match tokio::time::timeout(self.limits.metered_total, read).await {
            Err(_elapsed) => {
                self.faults.add(Fault::BodyReadTimeout);
                let error = ProxyError::BodyTimeout {
                    after: self.limits.metered_total,
                    limit: "in all, proxy.body_read_timeout",
                };
                tracing::debug!(path, %error, "request body too slow");
                return error.into_response();
            }
            Ok(read) => read,
        };
        // Held until this request is answered (the upstream has read the body by then).
        let (bytes, _budget) = match bytes {
            Ok(ReadBody::Complete(bytes, held)) => (bytes, held),
            Ok(ReadBody::TooLong(prefix, rest)) => {
                // Too long to be read whole first: what was read is scanned now, the rest as it
                // streams (a field found there cuts the body off before its end).
                let rest = match code_field {
                    None => rest,
                    Some(found @ (engine, field)) => {
                        let mut scanner = FieldScanner::new(&field);
                        if scanner.feed(&prefix) {
                            return self.refuse_code_field(found);
                        }
                        Box::pin(GuardedBody::new(rest, scanner, engine))
                    }
                };
                tracing::debug!(
                    path,
                    limit = self.metering.max_parse_bytes,
                    "request body over the parse limit or the buffer budget: forwarded unmetered"
                );
                let body = RequestBody::Stream {
                    prefix: Some(prefix),
                    rest,
                };
                return self
                    .forward(parts, body, &upstream, &upstream_path, None)
                    .await;
            }
            Err(error) if is_stall(error.as_ref()) => {
                return self.body_stalled().into_response();
            }
            Err(error) => return ProxyError::client_body(error).into_response(),
        };
        let body_read = Instant::now();
        if let Some(found @ (_, field)) = code_field {
            if carries_field(&bytes, field.field) {
                return self.refuse_code_field(found);
            }
        }
        let metered = route.and_then(|route| Some((route, inspect(route, &bytes)?)));
        let Some((route, facts)) = metered else {
            // Read only to be checked for a field run as code, or not a JSON object (the
            // upstream will say what it thinks of it): forwarded as it came, unmetered.
            return self
                .forward(
                    parts,
                    RequestBody::Full(Some(bytes)),
                    &upstream,
                    &upstream_path,
                    None,
                )
                .await;
        };
        if let Some(model) = facts.model.as_deref() {
            if self.router.by_path(&path).is_none() {
                if let Some(by_model) = self.router.by_model(model) {
                    upstream = Arc::clone(by_model);
                }
            }
        }

        // Once per request, on the body as the client sent it (injection moves spans).
        let prefix_blocks = match (&self.prefix_salt, facts.prompt, &synthetic) {
            (Some(salt), Some(prompt), None) => salt.fingerprint(prompt.bytes(&bytes)),
            _ => Vec::new(),
        };
        let mut bytes = bytes;
        let mut injected = Injected::default();
        if self.metering.inject_usage {
            if let Some((edited, added)) = injection(route, &bytes, &facts, upstream.server_usage())
            {
                bytes = Bytes::from(edited);
                injected = added;
                if let Ok(length) = HeaderValue::try_from(bytes.len().to_string()) {
                    parts.headers.insert(header::CONTENT_LENGTH, length);
                }
            }
        }

        // The response is read as it passes (events, or the JSON body's usage): ask for it
        // uncompressed. `identity` is always acceptable to the client; a compressed stream
        // could be neither metered nor stripped of what tokentap injected.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let (model, asked_model) = self.recorded_model(&upstream, facts.model.as_deref());
        let (source, tag, tenant) = match synthetic {
            Some(s) => (Source::Synthetic, s.tag, None),
            None => (Source::Production, None, self.tenants.of(&parts.headers)),
        };
        let mut meter = self.meter.begin(
            RequestLabels {
                route,
                source,
                model,
                asked_model,
                upstream: Arc::clone(&upstream.name),
                tag,
                tenant,
                priority: facts.priority.map(PriorityBand::of),
            },
            head_in,
        );
        meter.timeline.body_read = Some(body_read);
        meter.max_tokens = facts.max_tokens;
        meter.with_tools = facts.with_tools;
        // One atomic load: the configuration the upstream runs as this request starts.
        meter.fingerprint = upstream.identity.current();
        meter.prefix_blocks = prefix_blocks;
        // The cell's series exist before its first request ends (Prometheus' `increase()`
        // never counts a series' first sample): its prompt's size says which, until the
        // upstream counts it.
        if let Some(prompt) = facts.prompt {
            let bytes = prompt.end.saturating_sub(prompt.start) as u64;
            meter.expect_cell(bytes / crate::meter::PROMPT_BYTES_PER_TOKEN);
        }
        // Once per request, off the hot path; the header is forwarded like any other.
        // A model's targets are found under the served name (what the matrix says) or the
        // name the client sent.
        let slo_model = Some(&*meter.labels.model)
            .filter(|served| self.metering.slo.models.contains_key(*served))
            .or(facts.model.as_deref());
        meter.slo = self.metering.slo.resolve(
            slo_model,
            parts.headers.get(SLO_HEADER).map(HeaderValue::as_bytes),
        );
        // Only a client gets its timing back: tokentap's own requests read their records.
        let timing = (!internal && self.timing_asked(&parts.headers)).then(|| TimingAsk {
            trailers: parts.version == Version::HTTP_2
                || (parts.version == Version::HTTP_11 && takes_trailers(&parts.headers)),
        });
        // The client's id when it is safe to repeat; tokentap's own where the client is handed
        // its timing (the id ties it to the record) and sent none it could be given back.
        meter.request_id = request_id::from_client(&parts.headers)
            .or_else(|| timing.is_some().then(request_id::generate));
        let metered = MeteredRequest {
            meter,
            route,
            injected,
            timing,
        };
        self.forward(
            parts,
            RequestBody::Full(Some(bytes)),
            &upstream,
            &upstream_path,
            Some(metered),
        )
        .await
    }

    /// The model a request is recorded under, and the client's own name for it when that
    /// differs (a bounded label, never a matrix key). Neither the request nor the response can
    /// be trusted for the first: sglang serves any name a client sends and echoes it back. So:
    /// a server that serves one model records every request under it; one that serves several
    /// (vLLM with LoRA adapters) under the served id the client named, else `other`. Until the
    /// server has said what it serves, the client's name (bounded by `max_models`), and for a
    /// request that names none, `default_model`.
    fn recorded_model(
        &self,
        upstream: &Upstream,
        asked: Option<&str>,
    ) -> (Arc<str>, Option<Arc<str>>) {
        let served = upstream.served_models();
        let recorded = match (served.as_ref(), asked) {
            ([], Some(asked)) => self.models.label(asked),
            ([], None) => match &upstream.default_model {
                Some(configured) => Arc::clone(configured),
                None => self.models.label(super::upstream::UNKNOWN_MODEL),
            },
            ([only], _) => self.models.label(only),
            (several, Some(asked)) => match several.iter().find(|m| &***m == asked) {
                Some(served) => self.models.label(served),
                None => self.models.other(),
            },
            ([first, ..], None) => match &upstream.default_model {
                Some(configured) => Arc::clone(configured),
                None => self.models.label(first),
            },
        };
        let asked = asked
            .filter(|asked| *asked != &*recorded)
            .map(|asked| self.models.label(asked));
        (recorded, asked)
    }

    /// The field run as code that a request to `path` may carry, when its upstream's engine
    /// reads it there (any engine's, while the upstream has not said what it is), unless
    /// `proxy.code_fields = "forward"`.
    fn code_field(
        &self,
        upstream: &Upstream,
        path: &str,
    ) -> Option<(&'static str, crate::base::engine::CodeField)> {
        if self.code_fields == CodeFields::Forward {
            return None;
        }
        let path = super::routes::normalise(path).ok()?;
        let engine = upstream.engine().map(|engine| engine.spec().name);
        let found = crate::base::engine::code_fields(&path)
            .find(|(declared_by, _)| engine.is_none_or(|engine| engine == *declared_by));
        found
    }

    /// The 403 for a body carrying a field run as code.
    fn refuse_code_field(
        &self,
        (engine, field): (&'static str, crate::base::engine::CodeField),
    ) -> Response<ResponseBody> {
        self.faults.add(Fault::CodeFieldRefused);
        let error = ProxyError::CodeField {
            field: field.field,
            engine,
            opened_by: field.opened_by,
        };
        tracing::debug!(%error, "a field run as code refused");
        error.into_response()
    }

    /// Whether this request's client gets its timing back (`metering.server_timing`).
    fn timing_asked(&self, headers: &http::HeaderMap) -> bool {
        match self.metering.server_timing {
            ServerTiming::Off => false,
            ServerTiming::OnRequest => headers.contains_key(&self.metering.server_timing_header),
            ServerTiming::Always => true,
        }
    }

    /// The answer to a request body that went silent (counted where it stalled).
    fn body_stalled(&self) -> ProxyError {
        ProxyError::BodyTimeout {
            after: self.limits.idle,
            limit: "between frames, proxy.body_idle_timeout",
        }
    }

    async fn forward(
        &self,
        mut parts: http::request::Parts,
        body: RequestBody,
        upstream: &Arc<Upstream>,
        upstream_path: &str,
        mut metered: Option<MeteredRequest>,
    ) -> Response<ResponseBody> {
        let path_and_query = match parts.uri.query() {
            Some(query) => format!("{upstream_path}?{query}"),
            None => upstream_path.to_string(),
        };
        parts.uri = match upstream.uri(&path_and_query) {
            Ok(uri) => uri,
            Err(error) => {
                let error = ProxyError::BadUpstreamUri {
                    upstream: Arc::clone(&upstream.name),
                    cause: error.to_string(),
                };
                return fail(error, metered);
            }
        };
        parts.version = if upstream.config.http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        remove_hop_by_hop(&mut parts.headers);
        // The client addressed tokentap; the upstream gets its own authority.
        parts.headers.remove(header::HOST);
        // The connection's send-stall watch, for the response body (not for a HEAD answer:
        // hyper never polls that body).
        let watch = parts
            .extensions
            .remove::<StreamWatch>()
            .filter(|_| parts.method != Method::HEAD)
            .map(|StreamWatch(watch)| watch);
        parts.extensions = http::Extensions::new();
        let request = Request::from_parts(parts, body);

        if let Some(m) = metered.as_mut() {
            m.meter.timeline.upstream_sent = Some(Instant::now());
        }
        let call = upstream.send(request);
        let timeout = upstream.config.response_timeout;
        let result = if timeout.is_zero() {
            Ok(call.await)
        } else {
            tokio::time::timeout(timeout, call).await
        };
        let response = match result {
            Ok(Ok(response)) => response,
            Ok(Err(error)) if is_stall(&*error) => {
                // The client's streamed body went silent while hyper was sending it.
                return fail(self.body_stalled(), metered);
            }
            Ok(Err(error)) if at_capacity(&*error).is_some() => {
                let error = ProxyError::Busy {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    cause: at_capacity(&*error)
                        .map(|full| full.to_string())
                        .unwrap_or_default(),
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream connection limit");
                return fail(error, metered);
            }
            Ok(Err(error)) => {
                let error = ProxyError::Upstream {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    cause: error_chain(&*error),
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream request failed");
                return fail(error, metered);
            }
            Err(_elapsed) => {
                self.faults.add(Fault::UpstreamTimeout);
                let error = ProxyError::Timeout {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    after: timeout,
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream timed out");
                return fail(error, metered);
            }
        };

        let (mut parts, incoming) = response.into_parts();
        let incoming = IdleTimeout::new(incoming, upstream.config.stream_idle_timeout)
            .counted(&self.faults, Fault::UpstreamStalled)
            .counting_breaks(Fault::UpstreamAborted);
        remove_hop_by_hop(&mut parts.headers);
        let mut delivery = None;
        let metering = metered.map(|m| {
            let MeteredRequest {
                mut meter,
                route,
                injected,
                timing,
            } = m;
            meter.timeline.response_head = Some(Instant::now());
            meter.status = parts.status.as_u16();
            let event_stream = is_event_stream(&parts.headers);
            // Compressed although asked not to be: passed through untouched, counts
            // approximate, nothing stripped.
            let encoded = parts
                .headers
                .get(header::CONTENT_ENCODING)
                .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
            if encoded {
                tracing::debug!(upstream = %upstream.name, "a metered response is content-encoded: forwarded unread");
            }
            delivery = timing.and_then(|ask| match (event_stream, ask.trailers) {
                (false, _) => Some(TimingDelivery::Header),
                (true, true) => Some(TimingDelivery::Trailer),
                // A comment cannot be appended to compressed bytes.
                (true, false) => (!encoded).then_some(TimingDelivery::Comment),
            });
            if delivery == Some(TimingDelivery::Trailer)
                && !announces_trailer(&parts.headers, SERVER_TIMING.as_str())
            {
                // hyper's HTTP/1 server sends only the trailer fields the head announces;
                // once, when the upstream announced its own already.
                parts
                    .headers
                    .append(header::TRAILER, HeaderValue::from_static("server-timing"));
            }
            let metering = Metering::new(
                meter,
                MeteringOptions {
                    route,
                    event_stream,
                    injected: if event_stream {
                        injected
                    } else {
                        Injected::default()
                    },
                    max_event_bytes: self.metering.max_event_bytes,
                    max_body_bytes: self.metering.max_parse_bytes,
                    encoded,
                    timing: delivery,
                    held_budget: Some(Arc::clone(&self.held_budget)),
                    length: parts
                        .headers
                        .get(header::CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok()?.parse().ok()),
                },
            );
            if metering.rewrites() {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            metering
        });
        let body = MeteredBody::new(incoming, metering);
        if delivery == Some(TimingDelivery::Header) {
            return self.with_timing_header(parts, body, watch).await;
        }
        Response::from_parts(parts, ResponseBody::upstream(body, watch))
    }

    /// A non-streamed answer with the request's `Server-Timing` in its head: the body is read
    /// whole first (its record is published at its end), into the one copy metering keeps
    /// anyway, up to `metering.max_parse_bytes` and within the held-answer budget
    /// (`metering.max_held_bytes`). A longer one, or one the budget cannot hold, is forwarded as
    /// it is, without the header: what was held, then the rest as it comes. One that breaks off
    /// is forwarded up to the break, then broken, without it. The upstream's idle timeout
    /// bounds the wait.
    async fn with_timing_header(
        &self,
        mut parts: http::response::Parts,
        mut body: MeteredBody<crate::proxy::timeout::UpstreamBody>,
        watch: Option<Arc<crate::net::streams::SendWatch>>,
    ) -> Response<ResponseBody> {
        let end = loop {
            match body.frame().await {
                None => break None,
                Some(Ok(frame)) => match frame.into_data() {
                    // Its bytes are in the held copy: this frame itself is dropped.
                    Ok(_) if body.holds_for_client() => {}
                    Ok(data) => {
                        tracing::debug!(
                            limit = self.metering.max_parse_bytes,
                            held = self.held_budget.held(),
                            "a non-streamed answer over the parse limit or the held-answer budget: forwarded without Server-Timing"
                        );
                        let held = body.take_held();
                        let read = if held.is_empty() {
                            data
                        } else {
                            let mut read = BytesMut::with_capacity(held.len() + data.len());
                            read.extend_from_slice(&held);
                            read.extend_from_slice(&data);
                            read.freeze()
                        };
                        return Response::from_parts(
                            parts,
                            ResponseBody::upstream_after(read, body, watch),
                        );
                    }
                    Err(frame) => break frame.into_trailers().ok().map(Ok),
                },
                Some(Err(error)) => break Some(Err(error)),
            }
        };
        if !matches!(end, Some(Err(_))) {
            if let Some(value) = body
                .take_server_timing()
                .and_then(|value| HeaderValue::try_from(value).ok())
            {
                // Beside the upstream's own entries, never in their place.
                parts.headers.append(SERVER_TIMING, value);
            }
        }
        Response::from_parts(parts, ResponseBody::held(body.take_held(), end, watch))
    }
}

/// A client asked for its timing back.
#[derive(Debug, Clone, Copy)]
struct TimingAsk {
    /// It takes trailers: HTTP/2, or HTTP/1.1 with `TE: trailers`.
    trailers: bool,
}

/// A metered request on its way to the upstream.
struct MeteredRequest {
    meter: RequestMeter,
    route: Route,
    injected: Injected,
    /// The client asked for its timing back.
    timing: Option<TimingAsk>,
}

fn fail(error: ProxyError, metered: Option<MeteredRequest>) -> Response<ResponseBody> {
    if let Some(mut m) = metered {
        m.meter.status = error.status().as_u16();
        m.meter
            .finish(error.outcome(), Default::default(), 0, false);
    }
    error.into_response()
}
