//! Plain-HTTP/1 upstream connections driven inside the task that reads their response.
//!
//! hyper-util's pooled client spawns one task per upstream connection: each SSE event then
//! crosses tasks twice (the connection task reads it and wakes the client's connection task,
//! which takes it and wakes the connection task back to read on), and on a multi-threaded
//! runtime a cross-task wake often unparks another worker thread: a futex call per event.
//! Here the connection (hyper's `client::conn::http1` dispatcher) is a value, not a task: the
//! request future polls it until the response head arrives, then the response body
//! ([`DrivenBody`]) polls it before each frame, so the upstream socket, the HTTP/1 parser and
//! the client's connection all run in the client's task, as nginx runs them in one event loop.
//!
//! The pool keeps idle connections (LIFO, at most `upstream.pool_max_idle`, dropped after
//! `upstream.pool_idle_timeout`); a connection returns to it only when its response body was
//! read to the end. Every open connection holds one of `upstream.max_connections` slots
//! (as [`super::connector::Limited`] does for the pooled client). A request that finds the
//! reused connection closed before anything was sent is retried once on a fresh one, as
//! hyper-util retries canceled requests. Used for `http://` upstreams without `http2`; TLS
//! and HTTP/2 upstreams keep hyper-util's client (HTTP/2 multiplexes streams on one
//! connection, so there is no connection per stream to drive).

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::connector::{acquire_slot, Slotted};
use super::request_body::RequestBody;
use super::BoxError;
use crate::base::lock;
use crate::net::faults::FaultCounters;

/// One upstream TCP connection holding its `max_connections` slot.
type Io = Slotted<TokioIo<TcpStream>>;
type Connection = http1::Connection<Io, RequestBody>;

/// A connection not serving a request: its sender, and the dispatcher nobody polls meanwhile
/// (a close by the server is seen when it is checked out).
struct Idle {
    sender: http1::SendRequest<RequestBody>,
    connection: Connection,
    since: Instant,
}

/// What the pool needs to open connections to one upstream.
#[derive(Debug, Clone)]
pub struct InlineOptions {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
    pub max_connections: usize,
    /// hyper's read-buffer cap per connection (`proxy.max_stream_buffer`, at least 8 KiB).
    pub max_buf_size: usize,
}

/// The connections of one plain-HTTP/1 upstream.
pub struct InlinePool {
    host: String,
    port: u16,
    /// `Host` of every request (the client's was removed: it addressed tokentap).
    host_header: HeaderValue,
    options: InlineOptions,
    slots: Arc<Semaphore>,
    limit: usize,
    faults: Arc<FaultCounters>,
    idle: Mutex<VecDeque<Idle>>,
    reaper_started: AtomicBool,
    http1: http1::Builder,
}

impl std::fmt::Debug for InlinePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlinePool")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("idle", &lock::lock(&self.idle).len())
            .finish()
    }
}

/// The upstream is not plain `http://` with a host (those keep hyper-util's client).
#[derive(Debug)]
pub struct NotPlainHttp;

impl InlinePool {
    pub fn new(
        url: &Uri,
        options: InlineOptions,
        faults: Arc<FaultCounters>,
    ) -> Result<Arc<Self>, NotPlainHttp> {
        if url.scheme_str() != Some("http") {
            return Err(NotPlainHttp);
        }
        let authority = url.authority().ok_or(NotPlainHttp)?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = authority.port_u16().unwrap_or(80);
        // hyper-util's `set_host`: the port only when it is not the scheme's default.
        let host_header = match authority.port_u16() {
            Some(80) | None => HeaderValue::from_str(authority.host()),
            Some(port) => HeaderValue::from_str(&format!("{}:{port}", authority.host())),
        }
        .map_err(|_| NotPlainHttp)?;
        let limit = options.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let mut http1 = http1::Builder::new();
        http1.max_buf_size(options.max_buf_size.max(8192));
        Ok(Arc::new(Self {
            host,
            port,
            host_header,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            faults,
            idle: Mutex::new(VecDeque::new()),
            reaper_started: AtomicBool::new(false),
            http1,
            options,
        }))
    }

    /// Sends `request` (absolute URI towards this upstream) and answers with its response,
    /// whose body drives the connection.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Result<Response<DrivenBody>, BoxError> {
        origin_form(request.uri_mut());
        request
            .headers_mut()
            .entry(HOST)
            .or_insert_with(|| self.host_header.clone());
        // A reused connection may have been closed by the server while idle; the request
        // comes back unsent and goes once more on a fresh connection.
        let mut attempts_left = 2u8;
        loop {
            attempts_left -= 1;
            let (reused, mut sender, mut connection) = match self.checkout() {
                Some((sender, connection)) => (true, sender, connection),
                None => {
                    let (sender, connection) = self.connect().await?;
                    (false, sender, connection)
                }
            };
            let sent = sender.try_send_request(request);
            match drive_until(&mut connection, sent).await {
                Ok(response) => {
                    let wakes = OwnWakes::new();
                    let driver = Driver {
                        sender,
                        connection,
                        closed: false,
                        pool: Arc::downgrade(self),
                        waker: Waker::from(Arc::clone(&wakes)),
                        wakes,
                    };
                    return Ok(response.map(|incoming| DrivenBody {
                        incoming,
                        driver: Some(driver),
                    }));
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused && attempts_left > 0 => request = unsent,
                    _ => return Err(Box::new(error.into_error())),
                },
            }
        }
    }

    /// The most recently idled connection that is still open and ready.
    fn checkout(&self) -> Option<(http1::SendRequest<RequestBody>, Connection)> {
        let now = Instant::now();
        loop {
            let Idle {
                mut sender,
                mut connection,
                since,
            } = lock::lock(&self.idle).pop_back()?;
            if now.saturating_duration_since(since) >= self.options.idle_timeout {
                // The oldest are at the front: everything before this one is older still.
                lock::lock(&self.idle).clear();
                return None;
            }
            // One poll with a no-op waker: a server that closed the connection shows as
            // the dispatcher ending; a live idle one answers Pending and leaves its sender
            // ready. Whoever takes it polls it with a real waker from here on.
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            if Pin::new(&mut connection).poll(&mut cx).is_ready() {
                continue;
            }
            if let Poll::Ready(Ok(())) = sender.poll_ready(&mut cx) {
                return Some((sender, connection));
            }
        }
    }

    /// A new connection, holding a slot (waiting up to `connect_timeout` for one).
    async fn connect(
        self: &Arc<Self>,
    ) -> Result<(http1::SendRequest<RequestBody>, Connection), BoxError> {
        let wait = self.options.connect_timeout;
        let slot = acquire_slot(&self.slots, self.limit, wait, &self.faults).await?;
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let stream = if wait.is_zero() {
            connecting.await?
        } else {
            tokio::time::timeout(wait, connecting)
                .await
                .map_err(|_| ConnectTimeout(wait))??
        };
        stream.set_nodelay(true)?;
        let io = Slotted::new(TokioIo::new(stream), slot);
        Ok(self.http1.handshake(io).await?)
    }

    /// Back to the pool: a connection whose response was read to the end.
    fn release(self: &Arc<Self>, sender: http1::SendRequest<RequestBody>, connection: Connection) {
        if self.options.max_idle == 0 || sender.is_closed() {
            return;
        }
        let mut idle = lock::lock(&self.idle);
        if idle.len() >= self.options.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle {
            sender,
            connection,
            since: Instant::now(),
        });
        drop(idle);
        self.start_reaper();
    }

    /// Closes connections idle past `idle_timeout` even when no request comes to check them
    /// out (their descriptors and slots are freed). One task per pool, ended with the pool.
    fn start_reaper(self: &Arc<Self>) {
        if self.options.idle_timeout.is_zero() || self.reaper_started.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reaper_started.store(false, Ordering::Relaxed);
            return;
        };
        let pool = Arc::downgrade(self);
        let idle_timeout = self.options.idle_timeout;
        let every = idle_timeout.max(Duration::from_secs(1));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                let now = Instant::now();
                let expired: Vec<Idle> = {
                    let mut idle = lock::lock(&pool.idle);
                    let keep = idle
                        .iter()
                        .position(|i| now.saturating_duration_since(i.since) < idle_timeout)
                        .unwrap_or(idle.len());
                    idle.drain(..keep).collect()
                };
                // Closed outside the lock.
                drop(expired);
            }
        });
    }

    /// Connections idle in the pool now.
    pub fn idle_connections(&self) -> usize {
        lock::lock(&self.idle).len()
    }
}

/// The TCP connect took longer than `upstream.connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("connecting took longer than {0:?} (upstream.connect_timeout)")]
struct ConnectTimeout(Duration);

/// Polls `connection` beside `response` until the response head (or the failure) arrives.
async fn drive_until<F, T>(connection: &mut Connection, response: F) -> T
where
    F: Future<Output = T>,
{
    let mut response = std::pin::pin!(response);
    let mut connection_done = false;
    poll_fn(|cx| {
        if !connection_done {
            // The dispatcher writes the request and reads the head; when it ends (closed or
            // failed), the response future resolves with the reason.
            connection_done = Pin::new(&mut *connection).poll(cx).is_ready();
        }
        response.as_mut().poll(cx)
    })
    .await
}

fn origin_form(uri: &mut Uri) {
    let origin = match uri.path_and_query() {
        Some(path) if path.as_str() != "/" => {
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(path.clone());
            Uri::from_parts(parts).unwrap_or_default()
        }
        _ => Uri::default(),
    };
    *uri = origin;
}

/// The connection under a response body, back to its pool when the body has ended.
struct Driver {
    sender: http1::SendRequest<RequestBody>,
    connection: Connection,
    closed: bool,
    pool: Weak<InlinePool>,
    /// What the connection and the body channel are polled with (see [`OwnWakes`]).
    wakes: Arc<OwnWakes>,
    waker: Waker,
}

/// The waker the connection and its body channel see. hyper's dispatcher and the body
/// channel wake each other on every chunk (the dispatcher wakes the receiver when it sends,
/// the receiver wakes the dispatcher when it takes); both run in this task, inside one
/// `poll_frame`, so those wakes would only make the runtime poll the whole client
/// connection once more for nothing. While `poll_frame` runs they are noted, not passed on:
/// it polls again itself when one came before it would answer `Pending`. Any wake from
/// outside (the upstream socket became readable while the task slept) goes to the task.
struct OwnWakes {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for OwnWakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted first, then `polling` read: whichever order this meets `settle`'s in, either
        // `settle` sees the note or this wakes the task (SeqCst: one order for both).
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl OwnWakes {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            task: AtomicWaker::new(),
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
        })
    }

    fn begin(&self, task: &Waker) {
        self.task.register(task);
        self.woken.store(false, Ordering::SeqCst);
        self.polling.store(true, Ordering::SeqCst);
    }

    /// Ends a poll: whether a wake came during it.
    fn settle(&self) -> bool {
        self.polling.store(false, Ordering::SeqCst);
        self.woken.swap(false, Ordering::SeqCst)
    }
}

/// An upstream response body; from an [`InlinePool`] it carries and drives its connection.
pub struct DrivenBody {
    incoming: Incoming,
    driver: Option<Driver>,
}

impl DrivenBody {
    /// A body whose connection some other task drives (hyper-util's client).
    pub fn pooled(incoming: Incoming) -> Self {
        Self {
            incoming,
            driver: None,
        }
    }
}

impl std::fmt::Debug for DrivenBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenBody")
            .field("driven", &self.driver.is_some())
            .finish()
    }
}

impl Body for DrivenBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(driver) = this.driver.as_mut() else {
            return Pin::new(&mut this.incoming).poll_frame(cx);
        };
        // Bounded: each round either answers or follows a wake that brought progress; a
        // connection that keeps waking itself is left to the runtime after a few.
        let mut rounds = 0u8;
        let frame = loop {
            rounds += 1;
            driver.wakes.begin(cx.waker());
            let mut own = Context::from_waker(&driver.waker);
            if !driver.closed {
                // Reads what the socket has into the body channel (and finishes writing the
                // request body, if the upstream answered before it ended).
                driver.closed = Pin::new(&mut driver.connection).poll(&mut own).is_ready();
            }
            let frame = Pin::new(&mut this.incoming).poll_frame(&mut own);
            let woken = driver.wakes.settle();
            match frame {
                Poll::Pending if woken && rounds < 4 => continue,
                Poll::Pending if woken => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                // A `Ready` needs no wake: whoever took it polls again when it wants more,
                // and a wake noted meanwhile left its readiness where that poll finds it.
                frame => break frame,
            }
        };
        // The end shows as `None`, or as `is_end_stream` after the last data frame of a body
        // with a length (hyper's server then never polls for the `None`).
        let ended = match &frame {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.incoming.is_end_stream(),
            Poll::Ready(Some(Err(_))) => {
                this.driver = None;
                false
            }
            Poll::Pending => false,
        };
        if ended {
            if let Some(driver) = this.driver.take() {
                if !driver.closed {
                    if let Some(pool) = driver.pool.upgrade() {
                        pool.release(driver.sender, driver.connection);
                    }
                }
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// A loopback HTTP/1 server answering `host path` (chunked, in `chunks` pieces), counting
    /// the connections it accepted; `close_after_one` answers with `Connection: close`.
    async fn upstream(chunks: usize, close: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let host = request
                            .headers()
                            .get(HOST)
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-")
                            .to_string();
                        let line = format!("{host} {}", request.uri());
                        async move {
                            let pieces: VecDeque<Bytes> = (0..chunks)
                                .map(|i| {
                                    Bytes::from(if i == 0 {
                                        line.clone()
                                    } else {
                                        format!(" {i}")
                                    })
                                })
                                .collect();
                            let body = Chunks(pieces);
                            let mut response = Response::new(body);
                            if close {
                                response.headers_mut().insert(
                                    http::header::CONNECTION,
                                    HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (format!("http://{address}").parse().unwrap(), accepted)
    }

    /// A body of ready chunks.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
        }
    }

    fn pool(url: &Uri, idle_timeout: Duration) -> Arc<InlinePool> {
        InlinePool::new(
            url,
            InlineOptions {
                connect_timeout: Duration::from_secs(5),
                idle_timeout,
                max_idle: 8,
                max_connections: 4,
                max_buf_size: 8192,
            },
            Arc::new(FaultCounters::default()),
        )
        .unwrap()
    }

    fn get(url: &Uri, path: &str) -> Request<RequestBody> {
        let uri: Uri = format!("{url}{}", path.trim_start_matches('/'))
            .parse()
            .unwrap();
        Request::builder()
            .uri(uri)
            .body(RequestBody::empty())
            .unwrap()
    }

    async fn text(response: Response<DrivenBody>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_read_to_the_end_serves_the_next_request_with_host_and_origin_form() {
        let (url, accepted) = upstream(3, false).await;
        let pool = pool(&url, Duration::from_secs(60));
        let authority = url.authority().unwrap().to_string();
        for round in 0..3 {
            let response = pool
                .send(get(&url, &format!("/v1/x?round={round}")))
                .await
                .unwrap();
            assert_eq!(
                text(response).await,
                format!("{authority} /v1/x?round={round} 1 2")
            );
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_connections(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_early_closes_its_connection() {
        let (url, accepted) = upstream(3, false).await;
        let pool = pool(&url, Duration::from_secs(60));
        let mut body = pool.send(get(&url, "/")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert!(first.is_data());
        drop(body);
        assert_eq!(pool.idle_connections(), 0);
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert!(text(response).await.ends_with("/ 1 2"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_reused() {
        let (url, accepted) = upstream(1, true).await;
        let pool = pool(&url, Duration::from_secs(60));
        for _ in 0..3 {
            let response = pool.send(get(&url, "/a")).await.unwrap();
            assert!(text(response).await.ends_with(" /a"));
            // Let the server's close reach the idle connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_idle_connection_the_server_dropped_is_replaced_unseen() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Keep-alive answers, then the server drops the idle connection 30 ms later.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                });
            }
        });
        let pool = pool(&url, Duration::from_secs(60));
        for _ in 0..2 {
            let response = pool.send(get(&url, "/")).await.unwrap();
            assert_eq!(text(response).await, "ok");
            assert_eq!(pool.idle_connections(), 1);
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn at_most_max_connections_then_at_capacity() {
        let (url, _) = upstream(2, false).await;
        let pool = InlinePool::new(
            &url,
            InlineOptions {
                connect_timeout: Duration::from_millis(100),
                idle_timeout: Duration::from_secs(60),
                max_idle: 8,
                max_connections: 1,
                max_buf_size: 8192,
            },
            Arc::new(FaultCounters::default()),
        )
        .unwrap();
        // The first response's body is held open (not read to the end): its connection is busy.
        let held = pool.send(get(&url, "/")).await.unwrap();
        let error = pool.send(get(&url, "/")).await.unwrap_err();
        assert!(
            super::super::connector::at_capacity(&*error).is_some(),
            "{error}"
        );
        drop(held);
        let response = pool.send(get(&url, "/")).await.unwrap();
        assert!(text(response).await.ends_with("/ 1"));
    }

    #[tokio::test]
    async fn idle_connections_close_after_the_idle_timeout() {
        let (url, _) = upstream(1, false).await;
        let pool = pool(&url, Duration::from_secs(1));
        let response = pool.send(get(&url, "/")).await.unwrap();
        text(response).await;
        assert_eq!(pool.idle_connections(), 1);
        // The reaper runs every second; bounded wait.
        for _ in 0..40 {
            if pool.idle_connections() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(pool.idle_connections(), 0);
    }

    #[test]
    fn only_plain_http_upstreams() {
        let faults = Arc::new(FaultCounters::default());
        let options = InlineOptions {
            connect_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
            max_idle: 0,
            max_connections: 1,
            max_buf_size: 8192,
        };
        let https: Uri = "https://example.test/".parse().unwrap();
        assert!(InlinePool::new(&https, options.clone(), Arc::clone(&faults)).is_err());
        let http: Uri = "http://[::1]:8000/".parse().unwrap();
        let pool = InlinePool::new(&http, options, faults).unwrap();
        assert_eq!(pool.host, "::1");
        assert_eq!(pool.host_header, "[::1]:8000");
    }
}
