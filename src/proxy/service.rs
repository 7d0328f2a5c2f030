//! The forwarding service: one request in, the upstream's response out, measured on the way.
//!
//! Every request is forwarded: method, path, query, headers (minus hop-by-hop) and body. On
//! metered routes (POST to the generation endpoints) the body is read up to the parse limit to
//! learn the model and whether it streams, usage options may be injected, and the response
//! body is wrapped in the metering body. Bodies over the limit, bodies that are not JSON and
//! every other route pass through unmeasured. Nothing on this path ever rejects a request on
//! tokentap's account except a body the client failed to send (or sent too slowly: request
//! bodies are under an idle timeout, metered ones also under a total one).
//!
//! `Proxy::handle` is the sequence of the phases, each in a file of its own (`phase`): admit,
//! read, prepare, start, forward. Each goes on with what it made of the request, forwards it as
//! it is, unmetered, or answers now (`Step`), as pingora's `ProxyHttp` phases do.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::body::{RequestBody, ResponseBody};
use super::box_error::BoxError;
use super::error::ProxyError;
use super::routes::RoutePolicy;
use super::upstream::Router;
use crate::base::lock;
use crate::config::{CodeFields, MeteringConfig};
use crate::meter::Meter;
use crate::net::faults::FaultCounters;
use crate::stream::fingerprint::PrefixSalt;
use crate::stream::held::HeldBudget;

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
    /// Shared with the settling of provisional labels (`phase::start`).
    pub models: Arc<ModelLabels>,
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
    /// What the data port refused and has logged (once per path).
    pub refusals: super::refusals::Refusals,
    /// The engine sessions opened through this proxy and who opened each.
    pub sessions: super::sessions::SessionOwners,
    /// Which turn of which conversation each production request is (`[sessions]`; `None`
    /// when off).
    pub turns: Option<super::turns::TurnTaker>,
    /// The admin listener as bound (`http://127.0.0.1:9464`), set once the server has bound
    /// it: the 403 for an admin route sent to the data port says where to send it.
    pub admin_address: std::sync::OnceLock<String>,
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
    pub(super) fn cover<'a>(
        &'a self,
        held: &mut Option<SemaphorePermit<'a>>,
        bytes: usize,
    ) -> bool {
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

/// What `ProxyService` answers with, under either service trait: the proxy never fails a
/// request (its failures are answers).
pub type ProxyFuture =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

impl<B> tower::Service<Request<B>> for ProxyService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        hyper::service::Service::call(self, request)
    }
}

/// hyper's own service trait, so that a connection serves the proxy without hyper-util's
/// tower adapter: hyper keeps the service's future in a box of its own for the connection's
/// whole life, and the adapter's future (the service and the request inline, 272 bytes) made
/// that box cost every open stream a 320-byte allocation where the boxed future's pointer
/// takes 16 (docs/benchmarks.md, "Memory per idle stream"). `poll_ready` above is always
/// ready, so nothing is skipped.
impl<B> hyper::service::Service<Request<B>> for ProxyService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn call(&self, request: Request<B>) -> Self::Future {
        let proxy = Arc::clone(&self.proxy);
        Box::pin(async move { Ok(proxy.handle(request).await) })
    }
}

/// What a phase of `Proxy::handle` made of a request: go on with it, forward it as it is, or
/// answer now (pingora's `ProxyHttp` phases answer the same way).
pub(crate) enum Step<T> {
    /// Go on to the next phase with this.
    Next(T),
    /// Forward the request to its upstream as it is now, with this body, unmetered.
    Unmetered(RequestBody),
    /// Answer the client now, without the upstream.
    Answer(ProxyError),
}

impl Proxy {
    /// Forwards one request and measures it when it is on a metered route: admit (routing, the
    /// route policy), read (the body, within its limits), prepare (inspection, usage
    /// injection, the prefix fingerprint), start (the meter), forward.
    pub async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let head_in = Instant::now();
        let (mut admitted, body) = match self.admit(request) {
            Ok(admitted) => admitted,
            Err(refused) => return refused.into_response(),
        };
        // The budget is held until this request is answered (the upstream has read the body
        // by then).
        let (bytes, _budget) = match self.read(&admitted, body).await {
            Step::Next(read) => read,
            Step::Unmetered(body) => return self.forward(admitted, body, None).await,
            Step::Answer(error) => return error.into_response(),
        };
        let body_read = Instant::now();
        let (bytes, prepared) = match self.prepare(&mut admitted, bytes) {
            Step::Next(prepared) => prepared,
            Step::Unmetered(body) => return self.forward(admitted, body, None).await,
            Step::Answer(error) => return error.into_response(),
        };
        let metered = self.start(&admitted, prepared, head_in, body_read);
        let body = RequestBody::Full(Some(bytes));
        self.forward(admitted, body, Some(metered)).await
    }
}
