//! The one door from synthetic traffic to the data path: the [`DataPath`] trait, what a sweep
//! or a replay may ask of the proxy, and [`ProxyPath`], its implementation over a real
//! `Arc<Proxy>` (its meter, its upstreams' scrapers). Tests put a scripted fake behind the same
//! trait, so the logic that decides when to pause, retry, cancel or drain runs in paused time
//! without a network.
//!
//! A record sink is registered only through [`DataPath::collect`], which returns a
//! [`SinkScope`] that removes the sink when dropped: a run's future that is dropped midway
//! (Ctrl-C, a cancelled task) leaves no sink behind.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::client::{call, Answer, CallError};
use super::driver::{drive, StreamEnd, StreamPhase, StreamRequest, StreamSignals};
use super::server_load::{fresh_scraped, read_load, LoadGauges};
use crate::base::engine::Abort;
use crate::base::json::push_json_string;
use crate::base::Source;
use crate::meter::buckets::Ladder;
use crate::meter::RecordSink;
use crate::proxy::answers::Answers;
use crate::proxy::describe;
use crate::proxy::Proxy;

/// A boxed future the trait's methods return (one per stream or control request, never per
/// event), so the trait stays object-safe and its futures can be spawned.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What synthetic traffic asks of the data path.
pub trait DataPath: Send + Sync + fmt::Debug {
    /// Sends one synthetic stream and follows it until it ends or `phase` says to drop it.
    fn stream(
        &self,
        request: StreamRequest,
        phase: watch::Receiver<StreamPhase>,
        signals: Arc<StreamSignals>,
    ) -> BoxFuture<'static, StreamEnd>;

    /// One small request about the server (`/tokenize`, `/v1/models`, …), bounded in time and
    /// size.
    fn call<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, CallError>>;

    /// Registers `sink` for every record the data path publishes, until the scope is dropped.
    fn collect(&self, sink: Arc<dyn RecordSink>) -> SinkScope;

    /// Production requests in flight now.
    fn production_in_flight(&self) -> u64;

    /// Synthetic output tokens counted so far (the live counter, read at a window's ends).
    fn synthetic_tokens(&self) -> u64;

    /// The context and concurrency ladders records are bucketed by.
    fn ladders(&self) -> (Ladder, Ladder);

    /// Running and queued requests on the server serving `model` now (`None` when it does not
    /// say).
    fn server_load<'a>(
        &'a self,
        model: &'a Arc<str>,
        gauges: &'a LoadGauges,
    ) -> BoxFuture<'a, Option<(f64, f64)>>;

    /// Has the server's whole state read now (where it is scraped), so what the requests'
    /// "server state" figures see is not a read from before a phase change.
    fn refresh_server_state<'a>(&'a self, model: &'a Arc<str>) -> BoxFuture<'a, ()>;

    /// Asks the server to abort the requests tagged `rids`, the engine's way (`how`: its route,
    /// one request id each, concurrently, each bounded by `timeout`; never all requests).
    fn abort<'a>(
        &'a self,
        how: Abort,
        rids: &'a [Arc<str>],
        timeout: Duration,
    ) -> BoxFuture<'a, ()>;

    /// What the server says of itself now: a fresh read of the upstream (`proxy::describe`, the
    /// one reader; the read is published there as every read is), and the configuration it
    /// runs as its fingerprint reader last saw it.
    fn describe(&self) -> BoxFuture<'_, Described>;
}

/// A fresh read of the server's self-description.
#[derive(Debug, Clone, Default)]
pub struct Described {
    /// What answered (`None`: nothing did).
    pub answers: Option<Arc<Answers>>,
    /// The upstream's configuration id, when it has been read (`meter::identity`).
    pub fingerprint: Option<String>,
}

/// A record sink registered with a data path for as long as this value lives.
pub struct SinkScope {
    remove: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl SinkScope {
    /// A scope that calls `remove` once, when dropped.
    pub fn new(remove: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self {
            remove: Some(Box::new(remove)),
        }
    }
}

impl Drop for SinkScope {
    fn drop(&mut self) {
        if let Some(remove) = self.remove.take() {
            remove();
        }
    }
}

impl fmt::Debug for SinkScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkScope")
            .field("registered", &self.remove.is_some())
            .finish()
    }
}

/// The data path of a real proxy: streams and control requests through [`Proxy::handle`], the
/// meter's counters and sinks, the upstreams' scrapers.
#[derive(Debug, Clone)]
pub struct ProxyPath {
    proxy: Arc<Proxy>,
}

impl ProxyPath {
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Self { proxy }
    }

    /// The same, ready to share (what the sweep and the replay hold).
    pub fn shared(proxy: Arc<Proxy>) -> Arc<dyn DataPath> {
        Arc::new(Self::new(proxy))
    }
}

impl DataPath for ProxyPath {
    fn stream(
        &self,
        request: StreamRequest,
        phase: watch::Receiver<StreamPhase>,
        signals: Arc<StreamSignals>,
    ) -> BoxFuture<'static, StreamEnd> {
        Box::pin(drive(Arc::clone(&self.proxy), request, phase, signals))
    }

    fn call<'a>(
        &'a self,
        method: Method,
        path: &'a str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, CallError>> {
        Box::pin(call(&self.proxy, method, path, body, timeout))
    }

    fn collect(&self, sink: Arc<dyn RecordSink>) -> SinkScope {
        self.proxy.meter.add_sink(Arc::clone(&sink));
        let meter = Arc::clone(&self.proxy.meter);
        SinkScope::new(move || meter.remove_sink(&sink))
    }

    fn production_in_flight(&self) -> u64 {
        self.proxy.meter.inflight(Source::Production)
    }

    fn synthetic_tokens(&self) -> u64 {
        self.proxy.meter.live_tokens(Source::Synthetic)
    }

    fn ladders(&self) -> (Ladder, Ladder) {
        (
            self.proxy.meter.contexts().clone(),
            self.proxy.meter.concurrency().clone(),
        )
    }

    fn server_load<'a>(
        &'a self,
        model: &'a Arc<str>,
        gauges: &'a LoadGauges,
    ) -> BoxFuture<'a, Option<(f64, f64)>> {
        Box::pin(read_load(&self.proxy, model, gauges))
    }

    fn refresh_server_state<'a>(&'a self, model: &'a Arc<str>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let _ = fresh_scraped(&self.proxy, model).await;
        })
    }

    fn abort<'a>(
        &'a self,
        how: Abort,
        rids: &'a [Arc<str>],
        timeout: Duration,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut aborts = JoinSet::new();
            for rid in rids {
                let proxy = Arc::clone(&self.proxy);
                let mut body = String::from("{");
                push_json_string(&mut body, how.id_field);
                body.push(':');
                push_json_string(&mut body, rid);
                body.push('}');
                aborts.spawn(async move {
                    call(
                        &proxy,
                        Method::POST,
                        how.route,
                        Some(Bytes::from(body)),
                        timeout,
                    )
                    .await
                });
            }
            while aborts.join_next().await.is_some() {}
        })
    }

    fn describe(&self) -> BoxFuture<'_, Described> {
        Box::pin(async move {
            let upstream = Arc::clone(self.proxy.router.default_upstream());
            let answers = describe::read_now(&self.proxy, &upstream, false, true).await;
            let fingerprint = upstream.identity.current();
            Described {
                answers,
                fingerprint: fingerprint.is_config().then(|| fingerprint.to_string()),
            }
        })
    }
}

/// How a run reads the server's load: through its data path, for one model, by the engine's
/// gauges. Cheap to clone (the sweep's sampler task holds one).
#[derive(Debug, Clone)]
pub struct ServerLoad {
    pub path: Arc<dyn DataPath>,
    pub model: Arc<str>,
    pub gauges: LoadGauges,
}

impl ServerLoad {
    /// Running and queued requests now (`None` when the server does not say).
    pub async fn read(&self) -> Option<(f64, f64)> {
        self.path.server_load(&self.model, &self.gauges).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_scope_removes_once_when_dropped() {
        let removed = Arc::new(AtomicUsize::new(0));
        let scope = {
            let removed = Arc::clone(&removed);
            SinkScope::new(move || {
                removed.fetch_add(1, Ordering::Relaxed);
            })
        };
        assert_eq!(removed.load(Ordering::Relaxed), 0);
        drop(scope);
        assert_eq!(removed.load(Ordering::Relaxed), 1);
    }
}
