//! Upstreams: their pooled keep-alive clients and how a request picks one.
//!
//! HTTP/1 upstreams, plain or TLS, go through tokentap's inline pool (`inline_pool`); HTTP/2
//! upstreams, and any upstream with `inline_connections = false`, through a hyper-util client
//! (HTTP/2 pooled; HTTP/1.1 a connection per request, see `hyper_pool_max_idle`). Both use the same rustls configuration for
//! https:// upstreams. Routing: a matching `path_prefix` wins (the prefix is stripped), then a
//! `models` match on a metered request's JSON `model`, else the default upstream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use http::uri::{PathAndQuery, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::answers::{Answers, RouteFacts};
use super::body::RequestBody;
use super::box_error::BoxError;
use super::connector::Limited;
use super::inline_pool::{DrivenBody, InlineOptions, InlinePool};
use crate::base::lock;
use crate::config::{UpstreamConfig, UsageUnasked};
use crate::meter::labels::HeldRelease;
use crate::net::faults::FaultCounters;
use crate::net::tls::{client_config, TlsError};
use crate::stream::request::ServerUsage;

/// The label of a request that names no model while neither the configuration nor the server
/// says one (`served_model`).
pub const UNKNOWN_MODEL: &str = "default";

/// Most served names kept per upstream and as labels (a server listing more is not believed
/// past this).
pub const MAX_SERVED_MODELS: usize = 1024;

/// The pooled client type of every upstream.
pub type UpstreamClient = Client<Limited<HttpsConnector<HttpConnector>>, RequestBody>;

/// The receive window of each HTTP/2 connection to an upstream: what its streams together
/// may have sent and tokentap not yet forwarded (each stream's own window is
/// `proxy.max_stream_buffer`).
pub const UPSTREAM_CONNECTION_WINDOW: u32 = 4 << 20;

/// How many idle connections hyper-util's client keeps for an upstream: none on HTTP/1.
///
/// hyper's HTTP/1 connection task closes a connection with bytes after its answer only when it
/// reads them before the next request is written (`proto/h1/conn.rs`, `require_empty_read`),
/// and hyper-util hands a connection back to its pool the moment the answer ends: bytes an
/// upstream sends past its framing a few milliseconds late became the next client's answer
/// (17–26 of 90 in round 6, and the answers behind them 502s). Nothing outside hyper can hold
/// a connection back until it has settled, so this client never reuses an HTTP/1 connection:
/// each carries one request (a connect per request, and its `TIME_WAIT`; the inline pool,
/// the default, is the HTTP/1 client that keeps connections). HTTP/2 streams cannot cross (a
/// frame names its stream; a body past its `content-length` resets that stream alone), so an
/// HTTP/2 upstream's connection is shared as configured.
fn hyper_pool_max_idle(config: &UpstreamConfig) -> usize {
    if config.http2 {
        config.pool_max_idle
    } else {
        0
    }
}

/// One upstream inference server.
#[derive(Debug)]
pub struct Upstream {
    pub name: Arc<str>,
    pub config: UpstreamConfig,
    pub client: UpstreamClient,
    /// HTTP/1 upstreams, plain or TLS: connections driven inside the client's task
    /// (`inline_pool`); `None` for HTTP/2 upstreams and with `inline_connections = false`,
    /// which use `client`.
    inline: Option<Arc<InlinePool>>,
    /// The configured label for requests that name no model (interned once), if any.
    pub default_model: Option<Arc<str>>,
    /// The models the server says it serves (its `/v1/models`, at most
    /// [`MAX_SERVED_MODELS`]), empty until it has said:
    /// what every metered request is recorded under (`service::recorded_model`). Read once per
    /// request (one brief read lock), written when a read finds them changed.
    served_models: RwLock<Arc<[Arc<str>]>>,
    /// The server sends the final usage chunk to streams that did not ask (configured
    /// `"final"`, or discovered by `usage_unasked` for `"auto"`).
    pub usage_unasked: AtomicBool,
    /// Which configuration the server runs (its fingerprint slot, read once per request;
    /// written by `upstream_identity`).
    pub identity: Arc<crate::meter::identity::UpstreamIdentity>,
    /// What the server last said of itself (`describe`, the one reader): `None` until a read
    /// answered. Subscribers (the fingerprint) are woken by each new read.
    description: tokio::sync::watch::Sender<Option<Arc<Answers>>>,
    /// The engine that description names, worked out once per read: every POST asks it (the
    /// guard on fields run as code, `phase::admit`), and working it out reads every line of
    /// the metrics page the read kept, hundreds of KB on a vLLM server.
    engine: RwLock<Option<crate::base::engine::Engine>>,
    /// The route table that description holds it to and the routes it publishes that no table
    /// classifies, worked out once per read: every request's route check reads it (one brief
    /// read lock and a reference count).
    route_facts: RwLock<Arc<RouteFacts>>,
    /// Its first self-description read is under way (`describe::spawn` sets it for an
    /// upstream read in the background, the first read's end clears it): requests that start
    /// meanwhile have provisional labels, settled when they end (`phase::start`).
    first_read: AtomicBool,
    /// Its first read is to be followed by a fingerprint (`[fingerprint] interval` set) that
    /// the follower has not computed yet: labels are provisional until it has.
    identity_pending: AtomicBool,
    /// What publishes the records of requests that ended while their labels were still
    /// provisional, run once the labels can settle (bounded by [`MAX_HELD_RECORDS`]).
    held: Mutex<Vec<HeldRelease>>,
}

/// Records held for an upstream's first read at most: past this (a flood in its first
/// seconds), a request's record is published under its provisional labels.
pub const MAX_HELD_RECORDS: usize = 4096;

impl Upstream {
    /// `stream_buffer` bounds what one response may have read from the upstream and not yet
    /// forwarded (`proxy.max_stream_buffer`); connection limits count in `faults`.
    pub fn new(
        config: UpstreamConfig,
        stream_buffer: usize,
        faults: Arc<FaultCounters>,
    ) -> Result<Self, TlsError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        if !config.connect_timeout.is_zero() {
            http.set_connect_timeout(Some(config.connect_timeout));
        }
        let tls = client_config(
            config.tls_ca.as_deref(),
            config
                .tls_client_cert
                .as_deref()
                .zip(config.tls_client_key.as_deref()),
        )?;
        let builder = HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1();
        // Without `http2`, HTTP/1.1 only (as the inline pool offers): a server picking h2 over
        // ALPN would get a connection per request below.
        let connector = if config.http2 {
            builder.enable_http2().wrap_connector(http)
        } else {
            builder.wrap_connector(http)
        };
        let inline = if config.http2 || !config.inline_connections {
            None
        } else {
            InlinePool::new(
                &config.url,
                InlineOptions {
                    connect_timeout: config.connect_timeout,
                    idle_timeout: config.pool_idle_timeout,
                    max_idle: config.pool_max_idle,
                    reuse_after: config.pool_reuse_after,
                    max_connections: config.max_connections,
                    max_buf_size: stream_buffer,
                },
                Some(tls),
                Arc::clone(&faults),
            )
            .ok()
        };
        let connector = Limited::new(
            connector,
            config.max_connections,
            config.connect_timeout,
            faults,
        );
        // hyper's minimum read buffer is 8192; the window fits a u32 (validated ≤ 16 MiB).
        let buffer = stream_buffer.max(8192);
        let window = u32::try_from(buffer).unwrap_or(u32::MAX);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_max_idle_per_host(hyper_pool_max_idle(&config))
            .http2_only(config.http2)
            // What tokentap reads from the upstream ahead of what it forwards: one buffer per
            // HTTP/1 connection, one window per HTTP/2 stream, not the 400 KiB / 2 MiB defaults.
            .http1_max_buf_size(buffer)
            .http2_initial_stream_window_size(window)
            .http2_initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW.max(window))
            .http2_adaptive_window(false)
            .build(connector);
        let name: Arc<str> = Arc::from(config.name.as_str());
        Ok(Self {
            identity: Arc::new(crate::meter::identity::UpstreamIdentity::new(Arc::clone(
                &name,
            ))),
            name,
            default_model: config.default_model.as_deref().map(Arc::from),
            served_models: RwLock::new(Arc::from(Vec::new())),
            usage_unasked: AtomicBool::new(config.sends_usage_unasked == UsageUnasked::Final),
            config,
            client,
            inline,
            description: tokio::sync::watch::Sender::new(None),
            engine: RwLock::new(None),
            route_facts: RwLock::new(Arc::new(RouteFacts::default())),
            first_read: AtomicBool::new(false),
            identity_pending: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Sends `request` (its URI from [`Upstream::uri`]) to the upstream: HTTP/1 (plain or TLS)
    /// through the inline pool, HTTP/2 through the pooled client.
    pub async fn send(
        &self,
        request: http::Request<RequestBody>,
    ) -> Result<http::Response<DrivenBody>, BoxError> {
        match &self.inline {
            Some(pool) => pool.send(request).await,
            None => Ok(self.client.request(request).await?.map(DrivenBody::pooled)),
        }
    }

    /// The upstream URI for a request path and query (the upstream's base path is prepended).
    pub fn uri(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        let base = &self.config.url;
        let base_path = base.path().trim_end_matches('/');
        let joined = format!("{base_path}{path_and_query}");
        let mut parts = base.clone().into_parts();
        parts.path_and_query = Some(PathAndQuery::try_from(joined)?);
        Ok(Uri::from_parts(parts)?)
    }

    /// What the server sends to streams that did not ask for usage.
    pub fn server_usage(&self) -> ServerUsage {
        match self.config.sends_usage_unasked {
            // Configured only: vLLM does not say so over HTTP, so discovery never sets it.
            UsageUnasked::EveryChunk => ServerUsage::EveryChunk,
            UsageUnasked::Final | UsageUnasked::Auto | UsageUnasked::No => {
                if self.usage_unasked.load(Ordering::Relaxed) {
                    ServerUsage::Final
                } else {
                    ServerUsage::OnlyAsked
                }
            }
        }
    }

    /// What the server last said of itself (the latest read that answered).
    pub fn description(&self) -> Option<Arc<Answers>> {
        self.description.borrow().clone()
    }

    /// Publishes a read (`describe::read_now`), waking subscribers.
    pub fn publish_description(&self, answers: Arc<Answers>) {
        *lock::write(&self.engine) = answers.engine();
        let facts = answers.route_facts();
        // Before the read is published: whoever waits on it finds the gauge's count set.
        self.identity
            .set_unclassified_routes(facts.unclassified.as_ref().map(Vec::len));
        *lock::write(&self.route_facts) = Arc::new(facts);
        self.description.send_replace(Some(answers));
    }

    /// Follows the reads of this upstream (`changed()` wakes on each).
    pub fn subscribe_description(&self) -> tokio::sync::watch::Receiver<Option<Arc<Answers>>> {
        self.description.subscribe()
    }

    /// Records whether the server sends the final usage chunk unasked (`"auto"`: as it says).
    pub fn set_usage_unasked(&self, flag: bool) {
        let before = self.usage_unasked.swap(flag, Ordering::Relaxed);
        if before != flag {
            tracing::info!(
                upstream = %self.name,
                sends_usage_unasked = flag,
                "the server says whether it sends usage unasked"
            );
        }
    }

    /// The engine the server's answers name, once a read answered (one brief read lock).
    pub fn engine(&self) -> Option<crate::base::engine::Engine> {
        *lock::read(&self.engine)
    }

    /// What the latest read says of the server's routes (empty until a read answered).
    pub fn route_facts(&self) -> Arc<RouteFacts> {
        Arc::clone(&lock::read(&self.route_facts))
    }

    /// The model the server last said it serves first, if it has said.
    pub fn served_model(&self) -> Option<Arc<str>> {
        lock::read(&self.served_models).first().cloned()
    }

    /// Every model the server last said it serves (empty until it has said).
    pub fn served_models(&self) -> Arc<[Arc<str>]> {
        Arc::clone(&lock::read(&self.served_models))
    }

    /// Records the models the server says it serves (at most
    /// [`MAX_SERVED_MODELS`], in its order); whether
    /// they changed.
    pub fn set_served_models(&self, models: &[&str]) -> bool {
        let models = &models[..models.len().min(MAX_SERVED_MODELS)];
        let same = {
            let current = lock::read(&self.served_models);
            current.len() == models.len() && current.iter().zip(models).all(|(a, b)| &**a == *b)
        };
        if same {
            return false;
        }
        let list: Vec<Arc<str>> = models.iter().map(|m| Arc::from(*m)).collect();
        *lock::write(&self.served_models) = Arc::from(list);
        true
    }

    /// Whether its first self-description read is under way (see `first_read`).
    pub fn awaiting_first_read(&self) -> bool {
        self.first_read.load(Ordering::Acquire)
    }

    /// Whether a request's labels can settle: the first read is over and, when a fingerprint
    /// follows it, the fingerprint is computed.
    pub fn labels_settled(&self) -> bool {
        !self.first_read.load(Ordering::Acquire) && !self.identity_pending.load(Ordering::Acquire)
    }

    /// Marks its first self-description read as under way, to be followed by a fingerprint
    /// when `fingerprinted`.
    pub fn await_first_read(&self, fingerprinted: bool) {
        self.identity_pending
            .store(fingerprinted, Ordering::Release);
        self.first_read.store(true, Ordering::Release);
    }

    /// Its first read is over; `answered`: something answered it (else no fingerprint will
    /// follow it either, and what was held is published under what is known).
    pub fn first_read_over(&self, answered: bool) {
        if !answered {
            self.identity_pending.store(false, Ordering::Release);
        }
        self.first_read.store(false, Ordering::Release);
        self.release_held();
    }

    /// Its fingerprint is computed (the follower observed a read).
    pub fn identity_observed(&self) {
        self.identity_pending.store(false, Ordering::Release);
        self.release_held();
    }

    /// Keeps `release` (the publication of a record whose labels are provisional) until the
    /// labels can settle; hands it back when they can now, or when [`MAX_HELD_RECORDS`] wait.
    pub fn hold_until_settled(&self, release: HeldRelease) -> Result<(), HeldRelease> {
        let mut held = lock::lock(&self.held);
        // Checked under the lock that `release_held` takes after the flags are cleared: a
        // record pushed here is either released by it or was never pushed.
        if self.labels_settled() || held.len() >= MAX_HELD_RECORDS {
            return Err(release);
        }
        held.push(release);
        Ok(())
    }

    /// Publishes what is held under what is known now, and holds nothing more (at shutdown:
    /// nothing is lost to a first read that has not ended).
    pub fn release_held_now(&self) {
        self.identity_pending.store(false, Ordering::Release);
        self.first_read.store(false, Ordering::Release);
        self.release_held();
    }

    /// Publishes what was held, when the labels can settle.
    fn release_held(&self) {
        if !self.labels_settled() {
            return;
        }
        let held = std::mem::take(&mut *lock::lock(&self.held));
        for release in held {
            release.run();
        }
    }

    /// The upstream URL for messages (no credentials are ever part of it).
    pub fn url(&self) -> String {
        self.config.url.to_string()
    }
}

/// Picks the upstream of a request.
#[derive(Debug)]
pub struct Router {
    upstreams: Vec<Arc<Upstream>>,
}

impl Router {
    /// `upstreams[0]` is the default.
    pub fn new(upstreams: Vec<Arc<Upstream>>) -> Option<Self> {
        (!upstreams.is_empty()).then_some(Self { upstreams })
    }

    pub fn default_upstream(&self) -> &Arc<Upstream> {
        &self.upstreams[0]
    }

    pub fn all(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    /// The upstream claiming `path` by prefix, with the path it should see.
    pub fn by_path<'a>(&self, path: &'a str) -> Option<(&Arc<Upstream>, &'a str)> {
        self.upstreams.iter().skip(1).find_map(|u| {
            let prefix = u.config.path_prefix.as_deref()?;
            let rest = path.strip_prefix(prefix)?;
            if rest.is_empty() {
                Some((u, "/"))
            } else if rest.starts_with('/') {
                Some((u, rest))
            } else {
                None
            }
        })
    }

    /// Whether any upstream besides the default claims models (a request may then go by its
    /// `model`, read from its body).
    pub fn routes_by_model(&self) -> bool {
        self.upstreams
            .iter()
            .skip(1)
            .any(|u| !u.config.models.is_empty())
    }

    /// The upstream claiming `model`.
    pub fn by_model(&self, model: &str) -> Option<&Arc<Upstream>> {
        self.upstreams
            .iter()
            .skip(1)
            .find(|u| u.config.models.iter().any(|m| m == model))
    }
}
