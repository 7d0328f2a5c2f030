//! Test fixtures shared by the integration test binaries: a scripted upstream on a real
//! loopback socket, a proxy started on port 0 in front of it, a client that records when each
//! byte arrived, and a sink that collects the proxy's records.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "shared fixtures: each test binary uses part of them; a test fails loudly on what it asserts"
)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokentap::app::serve::ProxyServer;
use tokentap::config::ConfigLoader;
use tokentap::meter::record::RequestRecord;
use tokentap::meter::RecordSink;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One step of a scripted response body.
#[derive(Debug, Clone)]
pub enum Step {
    Send(Bytes),
    Wait(Duration),
    /// Wait until this long after the response body began (an absolute schedule: timer
    /// lateness does not accumulate over a long stream).
    Until(Duration),
    /// Trailer fields after the body (HTTP/1 sends them only to a request with `TE: trailers`
    /// and when the head's `Trailer` names them).
    Trailers(Vec<(&'static str, &'static str)>),
}

/// How a scripted body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The body ends normally.
    Clean,
    /// The upstream breaks the connection mid-body.
    Reset,
    /// The body never ends (until the peer goes away).
    Hang,
}

/// A scripted response.
#[derive(Debug, Clone)]
pub struct Script {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    /// Delay before the response head (sglang sends headers only at the first token).
    pub head_delay: Duration,
    pub steps: Vec<Step>,
    pub end: End,
}

impl Script {
    pub fn sse(steps: Vec<Step>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type", "text/event-stream; charset=utf-8".into())],
            head_delay: Duration::ZERO,
            steps,
            end: End::Clean,
        }
    }

    pub fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type", "application/json".into())],
            head_delay: Duration::ZERO,
            steps: vec![Step::Send(Bytes::from(body.to_string()))],
            end: End::Clean,
        }
    }

    /// The concatenated bytes the script sends.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for step in &self.steps {
            if let Step::Send(b) = step {
                out.extend_from_slice(b);
            }
        }
        out
    }
}

/// What the upstream received, and whether the peer went away before the script ended.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub disconnected: Arc<Mutex<Option<Instant>>>,
}

type Handler = Arc<dyn Fn(&Received) -> Script + Send + Sync>;

/// A scripted HTTP server on 127.0.0.1.
pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Body bytes handed to hyper so far (across all responses).
    pub sent: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx)
    }
}

impl ScriptedUpstream {
    pub async fn start(handler: impl Fn(&Received) -> Script + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let handler: Handler = Arc::new(handler);
        let log = Arc::clone(&received);
        let sent: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let sent_total = Arc::clone(&sent);
        let connections: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let handler = Arc::clone(&handler);
                let log = Arc::clone(&log);
                let sent = Arc::clone(&sent_total);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let handler = Arc::clone(&handler);
                        let log = Arc::clone(&log);
                        let sent = Arc::clone(&sent);
                        async move { Ok::<_, Infallible>(respond(request, handler, log, sent).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            received,
            sent,
            connections,
            task,
        }
    }

    /// Body bytes the upstream has handed to hyper so far.
    pub fn sent_bytes(&self) -> usize {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn respond(
    request: Request<Incoming>,
    handler: Handler,
    log: Arc<Mutex<Vec<Received>>>,
    sent: Arc<std::sync::atomic::AtomicUsize>,
) -> Response<ChannelBody> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let received = Received {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
        disconnected: Arc::default(),
    };
    let script = handler(&received);
    let disconnected = Arc::clone(&received.disconnected);
    log.lock().unwrap().push(received);
    tokio::time::sleep(script.head_delay).await;
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let body_start = Instant::now();
        for step in script.steps {
            match step {
                Step::Wait(d) => tokio::time::sleep(d).await,
                Step::Until(d) => tokio::time::sleep_until(body_start + d).await,
                Step::Trailers(fields) => {
                    let mut trailers = http::HeaderMap::new();
                    for (name, value) in fields {
                        trailers.append(name, value.parse().unwrap());
                    }
                    let _ = tx.send(Ok(Frame::trailers(trailers))).await;
                }
                Step::Send(bytes) => {
                    let len = bytes.len();
                    if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                        *disconnected.lock().unwrap() = Some(Instant::now());
                        return;
                    }
                    sent.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        match script.end {
            End::Clean => {}
            End::Reset => {
                let _ = tx.send(Err(std::io::Error::other("scripted reset"))).await;
            }
            End::Hang => {
                tx.closed().await;
                *disconnected.lock().unwrap() = Some(Instant::now());
            }
        }
    });
    let mut response = Response::new(ChannelBody(rx));
    *response.status_mut() = http::StatusCode::from_u16(script.status).unwrap();
    for (name, value) in script.headers {
        response.headers_mut().append(name, value.parse().unwrap());
    }
    response
}

pub mod chromium;
pub mod cores;
pub mod pki;
pub mod wait;

/// Collects every record the proxy publishes.
#[derive(Default)]
pub struct Records(pub Mutex<Vec<Arc<RequestRecord>>>);

impl RecordSink for Records {
    fn record(&self, record: &Arc<RequestRecord>) {
        self.0.lock().unwrap().push(Arc::clone(record));
    }
}

impl Records {
    /// Waits (bounded) until `n` records exist, then returns them.
    pub async fn wait_for(&self, n: usize) -> Vec<Arc<RequestRecord>> {
        wait::eventually(Duration::from_secs(10), async || {
            let records = self.0.lock().unwrap().clone();
            if records.len() >= n {
                Ok(records)
            } else {
                Err(records)
            }
        })
        .await
        .unwrap_or_else(|records| {
            panic!("expected {n} records, have {}: {records:#?}", records.len())
        })
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A proxy on 127.0.0.1:0 in front of `upstream`, with `extra` TOML appended to its config.
/// An `[evidence]` section that passes every cell, for tests of the figures themselves (a
/// test's traffic lasts seconds; production's default asks for 20 requests, 10 s, 500 tokens).
pub const NO_EVIDENCE_MINIMUM: &str =
    "[evidence]\nmin_requests = 0\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n";

pub async fn proxy(upstream: &str, extra: &str) -> (ProxyServer, Arc<Records>) {
    // `sends_usage_unasked = "no"`, `metrics_interval = "0"`, a `default_model` and no
    // fingerprint reads: no background `/server_info` or `/v1/models` questions or `/metrics`
    // scrapes in the upstream's request log (tests of those configure them themselves).
    proxy_from_config(&format!(
        "[upstream]\nurl = \"{upstream}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"0s\"\n{extra}\n"
    ))
    .await
}

/// A proxy on 127.0.0.1:0 (data and admin) from this whole config text, with a record collector.
pub async fn proxy_from_config(text: &str) -> (ProxyServer, Arc<Records>) {
    let config = ConfigLoader::new()
        .text(text, "test.toml")
        .unwrap()
        .load()
        .unwrap();
    let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = ProxyServer::start_on(config, proxy_listener, admin_listener)
        .await
        .unwrap();
    let records = Arc::new(Records::default());
    server.proxy.meter.add_sink(records.clone());
    (server, records)
}

/// The body as received, with the arrival time of each frame.
#[derive(Debug)]
pub struct Received2 {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    pub sent_at: Instant,
    pub error: Option<String>,
}

impl Received2 {
    pub fn bytes(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// Time from sending to the first frame containing `needle`.
    pub fn time_to(&self, needle: &str) -> Option<Duration> {
        let mut seen = Vec::new();
        for (at, bytes) in &self.frames {
            seen.extend_from_slice(bytes);
            if String::from_utf8_lossy(&seen).contains(needle) {
                return Some(at.duration_since(self.sent_at));
            }
        }
        None
    }
}

/// Sends one request and reads its whole body (answered 200).
pub async fn exchange(request: Request<Full<Bytes>>) {
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
}

/// The decode cell (context, concurrency) of `doc`, or a panic showing the whole matrix.
pub fn decode_cell(
    doc: &tokentap::matrix::MatrixDoc,
    context: u64,
    concurrency: u32,
) -> tokentap::matrix::DecodeCell {
    doc.cell(context, concurrency).cloned().unwrap_or_else(|| {
        panic!(
            "no cell {context} × {concurrency} in\n{}",
            tokentap::matrix::render_markdown(doc)
        )
    })
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs `body` to `url` and reads the whole response, timing each frame.
pub async fn post(url: &str, body: &str) -> Received2 {
    send(
        Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

pub async fn get(url: &str) -> Received2 {
    send(Request::get(url).body(Full::new(Bytes::new())).unwrap()).await
}

pub async fn send(request: Request<Full<Bytes>>) -> Received2 {
    let sent_at = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("response head within 30 s")
        .expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    let mut error = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(30), body.frame())
            .await
            .expect("frame within 30 s")
        {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Some(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    Received2 {
        status,
        headers,
        frames,
        sent_at,
        error,
    }
}

/// SSE `data:` block.
pub fn data(json: &str) -> Step {
    Step::Send(Bytes::from(format!("data: {json}\n\n")))
}

pub fn wait_ms(ms: u64) -> Step {
    Step::Wait(Duration::from_millis(ms))
}

/// Splits a text into SSE data blocks (for fixtures).
pub fn blocks(text: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("\n\n") {
        steps.push(Step::Send(Bytes::from(rest[..end + 2].to_string())));
        rest = &rest[end + 2..];
    }
    if !rest.is_empty() {
        steps.push(Step::Send(Bytes::from(rest.to_string())));
    }
    steps
}

pub fn queue<T>(items: impl IntoIterator<Item = T>) -> VecDeque<T> {
    items.into_iter().collect()
}

/// Runs a sweep through the manager of `server` and waits (bounded) for its end.
pub async fn run_sweep(
    server: &tokentap::app::serve::ProxyServer,
    plan: tokentap::sweep::SweepRequest,
    limit: Duration,
) -> tokentap::sweep::SweepStatus {
    let manager = &server.admin.sweeps;
    let id = manager.start(plan).await.unwrap();
    tokio::time::timeout(limit, manager.follow(&id, |_| {}))
        .await
        .expect("the sweep ends in time")
        .unwrap()
}

/// An sglang-style chat stream whose prompt length is the request's `x_prompt_tokens` (its
/// cached tokens `x_cached_tokens`, when given) and whose token count is `fixed_tokens`, else
/// the request's `max_tokens`, else 40: a role chunk at once, the first token at `ttft`, then
/// one token every `gap` on an absolute schedule, usage as the request asked for it.
pub fn timed_chat_stream(
    request: &Received,
    ttft: Duration,
    gap: Duration,
    fixed_tokens: Option<u64>,
) -> Script {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
    let prompt = body["x_prompt_tokens"].as_u64().unwrap_or(10);
    let cached = body["x_cached_tokens"].as_u64();
    let tokens = fixed_tokens.unwrap_or_else(|| body["max_tokens"].as_u64().unwrap_or(40));
    let options = &body["stream_options"];
    let include_usage = options["include_usage"] == true;
    let continuous = options["continuous_usage_stats"] == true;
    let head = r#"{"id":"c1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":["#;
    let details = cached.map_or("null".to_string(), |c| {
        format!(r#"{{"cached_tokens":{c}}}"#)
    });
    let usage = |completion: u64| {
        format!(
            r#""usage":{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion},"prompt_tokens_details":{details}}}"#,
            prompt + completion
        )
    };
    let mut steps = vec![data(&format!(
        r#"{head}{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}]}}"#
    ))];
    for i in 0..tokens {
        steps.push(Step::Until(
            ttft + gap * u32::try_from(i).unwrap_or(u32::MAX),
        ));
        let tail = if continuous {
            format!(",{}", usage(i + 1))
        } else {
            String::new()
        };
        steps.push(data(&format!(
            r#"{head}{{"index":0,"delta":{{"content":"t{i} "}},"finish_reason":null}}]{tail}}}"#
        )));
    }
    steps.push(data(&format!(
        r#"{head}{{"index":0,"delta":{{}},"finish_reason":"length"}}]}}"#
    )));
    if include_usage {
        steps.push(data(&format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","created":1767225600,"model":"m","choices":[],{}}}"#,
            usage(tokens)
        )));
    }
    steps.push(Step::Send(Bytes::from_static(b"data: [DONE]\n\n")));
    Script::sse(steps)
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("tokentap-{label}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (and reaped) on every path out of the test, panics included.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A simulator profile serving `model`, decoding at `tok_s` per stream at any batch size, with
/// a near-instant prefill (so no prefill stalls decode and the cells' figures are known) and a
/// cached-prompt TTFT of `ttft_ms`.
pub fn flat_profile(model: &str, tok_s: f64, ttft_ms: f64, source: &str) -> tokentap::sim::Profile {
    let text = format!(
        r#"
[model]
served_model_name = "{model}"
model_path = "{model}"
context_length = 131072
reasoning = false

[labels]
engine = "sglang"
engine_version = "simulated"
source = "{source}"

[capacity]
kv_tokens = 4000000
max_running_requests = 256
chunked_prefill_size = 65536

[prefill]
contexts = [1024]
tok_s = [2000000.0]

[decode]
tokens_per_step = 1.0
contexts = [1024]
batch_sizes = [1, 256]
per_request_tok_s = [[{tok_s:.4}, {tok_s:.4}]]

[cached_ttft]
contexts = [1024]
batch_sizes = [1]
ms = [[{ttft_ms:.4}]]
"#
    );
    tokentap::sim::Profile::from_toml_str(&text, "a flat test profile").unwrap()
}

/// Whether the Prometheus at `base` answers `/-/ready` with 200 within 2 s.
pub async fn prometheus_ready(base: &str) -> bool {
    let request = Request::get(format!("{base}/-/ready"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    matches!(
        tokio::time::timeout(Duration::from_secs(2), client().request(request)).await,
        Ok(Ok(response)) if response.status() == 200
    )
}

/// Starts the Prometheus `binary` on a free loopback port with `config`, its data and logs in
/// `dir`; retries if the port was taken between choosing and binding it. Returns the process
/// (killed on drop) and its base URL once it is ready.
pub async fn start_prometheus(
    binary: &std::path::Path,
    dir: &std::path::Path,
    config: &std::path::Path,
) -> (ChildGuard, String) {
    let mut last_log = String::new();
    for attempt in 0..3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log_path = dir.join(format!("prometheus-{attempt}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = std::process::Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join(format!("data-{attempt}")).display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut guard = ChildGuard(child);
        let base = format!("http://127.0.0.1:{port}");
        // Ready, or exited (a port taken between choosing and binding it).
        let ready = wait::eventually(Duration::from_secs(30), async || {
            if matches!(guard.0.try_wait(), Ok(Some(_))) {
                return Ok(false);
            }
            if prometheus_ready(&base).await {
                Ok(true)
            } else {
                Err(())
            }
        })
        .await;
        if ready == Ok(true) {
            return (guard, base);
        }
        last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if !last_log.contains("address already in use") {
            break;
        }
    }
    panic!("prometheus did not become ready:\n{last_log}");
}
