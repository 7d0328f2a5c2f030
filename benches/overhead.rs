//! End-to-end overhead of the proxy, against baselines measured in the same run:
//!
//! 1. **Added latency.** N concurrent SSE streams from an in-process upstream whose events carry
//!    their own send time (same process, same clock as the client): each event's lateness
//!    (receive − send) direct to the upstream vs through `tokentap serve` (a child process,
//!    release build). The difference of the distributions is what tokentap adds, per frame and
//!    to the first token.
//! 2. **CPU per forwarded event** of tokentap vs nginx (`proxy_buffering off`) forwarding the
//!    same streams, from /proc/<pid>/stat (nginx: master + workers). Skipped without nginx.
//!    HAProxy beside it, and the floor: a bare TCP relay on one tokio thread (this binary in a
//!    child process, `OVERHEAD_FLOOR=0` leaves it out), what forwarding costs before any HTTP.
//! 3. **Memory per idle in-flight stream** (RSS delta of the proxy process / streams), and
//!    **10,000 concurrent streams held**.
//!
//! Run: `cargo bench --bench overhead` (scripts/bench.sh overhead). Environment knobs:
//! `OVERHEAD_STREAMS` (1000), `OVERHEAD_EVENTS` (200), `OVERHEAD_INTERVAL_MS` (50),
//! `OVERHEAD_IDLE` (2000), `OVERHEAD_HELD` (10000), `OVERHEAD_RAMP_MS` (1000, the spread of stream
//! starts), `OVERHEAD_OPENING` (64: idle and held streams being opened at once; 0 opens them all
//! in one burst), `OVERHEAD_MAX_STEAL` (5: a measured window in which the hypervisor took more
//! than this percent of the machine makes its round disturbed; the bench runs rounds until
//! `OVERHEAD_ROUNDS` are clean or `OVERHEAD_MAX_ROUNDS`, twice as many, have run, and takes
//! its medians of the clean ones). `OVERHEAD_SOAK_SECS=600` runs only the soak: 1,000 clients
//! streaming back to back through the proxy for that long, its RSS sampled every 30 s.
//! `OVERHEAD_AB="A=/path/old,B=/path/new;TOKENTAP_X__Y=v"` runs several tokentaps interleaved;
//! `OVERHEAD_PATH=/v1/unmetered` in an entry sends that subject's streams down a route tokentap
//! forwards without metering (the cost of its HTTP alone).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite())
        .unwrap_or(default)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The in-process upstream: `/v1/chat/completions?events=E&interval_ms=I&ttft_ms=T&idle=1`.
/// Each content event carries `"sent_ns":<ns since EPOCH>`; with `idle=1` it sends one role
/// chunk and then nothing until the client goes away.
async fn upstream(epoch: Instant) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |r: Request<Incoming>| respond(r, epoch));
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http2().max_concurrent_streams(100_000);
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn respond(
    request: Request<Incoming>,
    epoch: Instant,
) -> Result<Response<ChannelBody>, Infallible> {
    let query = request.uri().query().unwrap_or("").to_string();
    let param = |key: &str, default: u64| {
        query
            .split('&')
            .find_map(|kv| {
                kv.strip_prefix(&format!("{key}="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(default)
    };
    let (events, interval, ttft, idle) = (
        param("events", 100),
        param("interval_ms", 20),
        param("ttft_ms", 50),
        param("idle", 0) == 1,
    );
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let continuous = body
        .windows(28)
        .any(|w| w == b"\"continuous_usage_stats\":true");
    let include_usage = body.windows(20).any(|w| w == b"\"include_usage\":true");
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let role = Bytes::from_static(b"data: {\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n");
        if tx.send(Ok(Frame::data(role))).await.is_err() {
            return;
        }
        if idle {
            tx.closed().await;
            return;
        }
        let start = Instant::now() + Duration::from_millis(ttft);
        for i in 0..events {
            let due = start + Duration::from_millis(interval * i);
            tokio::time::sleep_until(due).await;
            let sent = Instant::now().duration_since(epoch).as_nanos();
            let usage = if continuous {
                format!(",\"usage\":{{\"prompt_tokens\":100,\"total_tokens\":{},\"completion_tokens\":{}}}", 101 + i, i + 1)
            } else {
                String::new()
            };
            // The last event finishes the choice, as engines send it.
            let finish = if i + 1 == events {
                "\"length\""
            } else {
                "null"
            };
            let event = format!(
                "data: {{\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok\"}},\"finish_reason\":{finish}}}]{usage},\"sent_ns\":{sent}}}\n\n"
            );
            if tx.send(Ok(Frame::data(Bytes::from(event)))).await.is_err() {
                return;
            }
        }
        if include_usage {
            // vLLM's usage chunk, written right after the finish chunk as a frame of its own
            // (tokentap holds the finish chunk until it arrives when it injected the usage).
            let usage = format!("data: {{\"id\":\"b\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":100,\"total_tokens\":{},\"completion_tokens\":{events}}},\"system_fingerprint\":\"fp\"}}\n\n", 100 + events);
            if tx.send(Ok(Frame::data(Bytes::from(usage)))).await.is_err() {
                return;
            }
        }
        let _ = tx
            .send(Ok(Frame::data(Bytes::from_static(b"data: [DONE]\n\n"))))
            .await;
    });
    let mut response = Response::new(ChannelBody(rx));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    Ok(response)
}

struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}

/// A `tokentap serve` child process; killed on drop.
struct Proxy {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on `addr` within 5 s.
async fn listens(addr: SocketAddr) -> bool {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

async fn wait_for_port(addr: SocketAddr) {
    assert!(listens(addr).await, "nothing listens on {addr}");
}

/// One tokentap under test: a name, its binary, and environment settings for it (config
/// overrides such as `TOKENTAP_PROXY__MAX_STREAM_BUFFER=409600`).
struct Subject {
    name: String,
    binary: String,
    env: Vec<(String, String)>,
    /// The request path its clients ask for: `OVERHEAD_PATH=/v1/unmetered` in its entry sends
    /// the same stream down a route tokentap does not meter, so the row is the cost of
    /// forwarding alone (HTTP on both sides, no SSE scan, no meter).
    path: String,
}

/// The path every stream asks for unless its subject says otherwise: a metered route.
const METERED_PATH: &str = "/v1/chat/completions";

/// The tokentaps under test: `OVERHEAD_AB="A=/path/old,B=/path/new;TOKENTAP_X__Y=v"` runs them
/// interleaved in one run (each entry `name=binary[;KEY=VALUE…]`); otherwise
/// `OVERHEAD_TOKENTAP` or this build's `tokentap`.
fn tokentap_subjects() -> Vec<Subject> {
    if let Ok(list) = std::env::var("OVERHEAD_AB") {
        let parsed: Vec<Subject> = list
            .split(',')
            .filter_map(|entry| {
                let mut parts = entry.split(';');
                let (name, binary) = parts.next()?.split_once('=')?;
                let mut env: Vec<(String, String)> = parts
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .collect();
                let path = env
                    .iter()
                    .position(|(k, _)| k == "OVERHEAD_PATH")
                    .map_or_else(|| METERED_PATH.to_string(), |at| env.remove(at).1);
                Some(Subject {
                    name: name.trim().to_string(),
                    binary: binary.trim().to_string(),
                    env,
                    path,
                })
            })
            .collect();
        if !parsed.is_empty() {
            return parsed;
        }
    }
    let binary = std::env::var("OVERHEAD_TOKENTAP")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tokentap").to_string());
    vec![Subject {
        name: "tokentap".to_string(),
        binary,
        env: Vec::new(),
        path: METERED_PATH.to_string(),
    }]
}

/// Threads (nginx workers, HAProxy threads) each baseline gets: one per core the proxies run on
/// (`OVERHEAD_PROXY_CPUS`, else every core), as tokentap's runtime sizes itself and as nginx's
/// `worker_processes auto` would; a baseline with more threads than cores pays for switching
/// between them, one with fewer leaves cores idle that tokentap uses.
fn proxy_threads() -> usize {
    std::env::var("OVERHEAD_PROXY_CPUS")
        .ok()
        .and_then(|v| cpu_list(&v))
        .map(|cpus| cpus.len())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(2)
}

/// A command that runs `program` pinned to the cores of `OVERHEAD_PROXY_CPUS` (taskset), or
/// unpinned when it is not set; every proxy under test gets the same cores.
fn proxy_command(program: &str) -> Command {
    match std::env::var("OVERHEAD_PROXY_CPUS") {
        Ok(cpus) if !cpus.is_empty() => {
            let mut command = Command::new("taskset");
            command.args(["-c", &cpus, program]);
            command
        }
        _ => Command::new(program),
    }
}

async fn start_proxy(subject: &Subject, upstream: SocketAddr, upstream_http2: bool) -> Proxy {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = proxy_command(&subject.binary)
        .args([
            "serve",
            "--upstream",
            &format!("http://{upstream}"),
            "--listen",
            &addr.to_string(),
        ])
        .args(["--admin", &format!("127.0.0.1:{}", free_port())])
        .env("TOKENTAP_STORE__DATA_DIR", "")
        .env(
            "TOKENTAP_UPSTREAM__HTTP2",
            if upstream_http2 { "true" } else { "false" },
        )
        .env("RUST_LOG", "warn")
        .envs(subject.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(addr).await;
    Proxy { child, addr }
}

/// A baseline proxy process (nginx or HAProxy) and its config directory; killed and removed on drop.
/// `start_nginx`: nginx with `proxy_buffering off` in front of `upstream`; `None` without nginx.
struct Baseline {
    child: Child,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        // SIGTERM first: nginx's master then stops its workers (SIGKILL would leave them
        // running, holding cores and memory through the rounds after).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..40 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_nginx(upstream: SocketAddr) -> Option<Baseline> {
    let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = std::env::temp_dir().join(format!("tokentap-nginx-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let config = format!(
        "worker_processes {workers};\nworker_rlimit_nofile 100000;\ndaemon off;\nmaster_process on;\npid {dir}/nginx.pid;\nerror_log {dir}/logs/error.log warn;\nevents {{ worker_connections 40000; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n  upstream up {{ server {upstream}; keepalive 1024; }}\n  server {{\n    listen {addr};\n    location / {{\n      proxy_pass http://up;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_request_buffering off;\n      proxy_read_timeout 3600s;\n    }}\n  }}\n}}\n",
        dir = dir.display(),
        workers = proxy_threads()
    );
    std::fs::write(dir.join("nginx.conf"), config).unwrap();
    let child = proxy_command(binary)
        .args([
            "-c",
            &dir.join("nginx.conf").display().to_string(),
            "-p",
            &dir.display().to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    wait_for_port(addr).await;
    Some(Baseline { child, addr, dir })
}

/// HAProxy in front of `upstream` (`option http-no-delay`, no request buffering, a thread per
/// proxy core as nginx has a worker per core); `None` when HAProxy is not installed.
async fn start_haproxy(upstream: SocketAddr) -> Option<Baseline> {
    let binary = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = std::env::temp_dir().join(format!("tokentap-haproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two descriptors per proxied stream: HAProxy refuses to start with more than the limit allows.
    let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(1_048_576);
    let maxconn = descriptors.saturating_sub(200) / 2;
    let threads = proxy_threads();
    let config = format!(
        "global\n  maxconn {maxconn}\n  nbthread {threads}\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 1h\n  timeout server 1h\n  option http-no-delay\n  http-reuse always\nfrontend bench\n  bind {addr}\n  default_backend up\nbackend up\n  server up {upstream} maxconn {maxconn}\n"
    );
    std::fs::write(dir.join("haproxy.cfg"), config).unwrap();
    let child = proxy_command(binary)
        .args(["-db", "-f", &dir.join("haproxy.cfg").display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let haproxy = Baseline { child, addr, dir };
    if !listens(addr).await {
        println!(
            "haproxy: did not start (see its config in {})",
            haproxy.dir.display()
        );
        return None;
    }
    Some(haproxy)
}

/// The environment variable that makes this bench binary the floor relay (`LISTEN UPSTREAM`).
const FLOOR_RELAY_ENV: &str = "OVERHEAD_FLOOR_RELAY";

/// The floor: a bare TCP relay on one single-threaded tokio runtime (the shape of one
/// `proxy.workers` thread), each client connection copied both ways to an upstream connection
/// of its own (`tokio::io::copy_bidirectional`), no HTTP and no metering. Its CPU per event is
/// the kernel's loopback TCP path plus tokio's least: what any proxy on this stack pays before
/// it reads a byte, so the room between it and nginx is what HTTP and metering may cost under
/// the CPU bar. Runs in a child process of this binary (its CPU is read like the others'), for
/// as long as it lives.
fn floor_relay(spec: &str) {
    let mut parts = spec.split_whitespace();
    let (Some(listen), Some(upstream)) = (parts.next(), parts.next()) else {
        panic!("{FLOOR_RELAY_ENV}: expected `LISTEN UPSTREAM`, got {spec:?}");
    };
    let listen: SocketAddr = listen.parse().unwrap();
    let upstream: SocketAddr = upstream.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await.unwrap();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = client.set_nodelay(true);
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
}

/// The floor relay (see [`floor_relay`]) in front of `upstream`, as a child process of this
/// binary, pinned where the proxies are.
async fn start_floor(upstream: SocketAddr) -> Option<Baseline> {
    let binary = std::env::current_exe().ok()?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = proxy_command(&binary.display().to_string())
        .env(FLOOR_RELAY_ENV, format!("{addr} {upstream}"))
        .stdout(Stdio::null())
        .spawn()
        .ok()?;
    let dir = std::env::temp_dir().join(format!("tokentap-floor-{}", std::process::id()));
    let floor = Baseline { child, addr, dir };
    if !listens(addr).await {
        println!("floor relay: did not start");
        return None;
    }
    Some(floor)
}

/// The machine's CPU ticks so far from `/proc/stat`'s first line: (stolen by the hypervisor,
/// all). A window whose share of steal is high ran on a disturbed machine: its CPU per event
/// reads high for any forwarder (cold caches after each preemption), so the rows print it.
fn machine_ticks() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice: guest time is already
    // inside user and nice.
    let all = fields.iter().take(8).sum();
    (fields.get(7).copied().unwrap_or(0), all)
}

/// Percent of the machine's ticks between `before` and now that the hypervisor took.
fn steal_percent(before: (u64, u64)) -> f64 {
    let (steal, all) = machine_ticks();
    let all = all.saturating_sub(before.1);
    if all == 0 {
        return f64::NAN;
    }
    steal.saturating_sub(before.0) as f64 * 100.0 / all as f64
}

/// CPU seconds (user + system) used so far by `pid` and its children processes (nginx workers).
fn cpu_seconds(pid: u32) -> f64 {
    let ticks = |pid: u32| -> u64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return 0;
        };
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        fields
            .get(11)
            .and_then(|u| u.parse::<u64>().ok())
            .unwrap_or(0)
            + fields
                .get(12)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
    };
    let mut total = ticks(pid);
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(pid) {
                total += ticks(child);
            }
        }
    }
    total as f64 / 100.0 // USER_HZ
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct StreamResult {
    ttft_us: Vec<u64>,
    lateness_us: Vec<u64>,
    /// Lateness of each stream's finish event alone (held by tokentap when it injected usage).
    finish_lateness_us: Vec<u64>,
    events: u64,
    failures: u64,
}

/// The client asks for per-chunk usage itself, so the upstream sends the same bytes to every
/// proxy (tokentap then injects and strips nothing; `OVERHEAD_INJECT=1` measures injection).
const BODY: &str = r#"{"model":"bench","stream":true,"max_tokens":4096,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}"#;
const BODY_WITHOUT_OPTIONS: &str = r#"{"model":"bench","stream":true,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}"#;

fn body() -> &'static str {
    if env_or("OVERHEAD_INJECT", 0) == 1 {
        BODY_WITHOUT_OPTIONS
    } else {
        BODY
    }
}

/// Runs `streams` concurrent streams against `target`; lateness is measured per content event.
async fn run_streams(
    target: SocketAddr,
    path: &str,
    streams: u64,
    events: u64,
    interval: u64,
    epoch: Instant,
) -> StreamResult {
    let ramp_ms = env_or("OVERHEAD_RAMP_MS", 1000);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build_http();
    let (tx, mut rx) = mpsc::unbounded_channel();
    for i in 0..streams {
        let client = client.clone();
        let tx = tx.clone();
        let path = path.to_string();
        tokio::spawn(async move {
            // Spread the starts over the ramp so connects do not all land in the same instant.
            tokio::time::sleep(Duration::from_micros(i * ramp_ms * 1000 / streams.max(1))).await;
            let uri =
                format!("http://{target}{path}?events={events}&interval_ms={interval}&ttft_ms=50");
            let sent = Instant::now();
            let mut out = StreamResult::default();
            let Ok(response) = client
                .request(
                    Request::post(uri)
                        .body(Full::new(Bytes::from_static(body().as_bytes())))
                        .unwrap(),
                )
                .await
            else {
                out.failures += 1;
                let _ = tx.send(out);
                return;
            };
            let mut body = response.into_body();
            let mut first = true;
            let mut carry = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let now = Instant::now();
                carry.extend_from_slice(&data);
                while let Some(end) = carry.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = carry.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&event);
                    if let Some(pos) = text.find("\"sent_ns\":") {
                        let digits: String = text[pos + 10..]
                            .chars()
                            .take_while(char::is_ascii_digit)
                            .collect();
                        let sent_ns: u128 = digits.parse().unwrap_or(0);
                        let recv_ns = now.duration_since(epoch).as_nanos();
                        let late = (recv_ns.saturating_sub(sent_ns) / 1000) as u64;
                        out.lateness_us.push(late);
                        if text.contains("\"finish_reason\":\"length\"") {
                            out.finish_lateness_us.push(late);
                        }
                        out.events += 1;
                        if first {
                            out.ttft_us
                                .push(now.duration_since(sent).as_micros() as u64);
                            first = false;
                        }
                    }
                }
            }
            let _ = tx.send(out);
        });
    }
    drop(tx);
    let mut all = StreamResult::default();
    while let Some(r) = rx.recv().await {
        all.ttft_us.extend(r.ttft_us);
        all.lateness_us.extend(r.lateness_us);
        all.finish_lateness_us.extend(r.finish_lateness_us);
        all.events += r.events;
        all.failures += r.failures;
    }
    all
}

fn quantile(values: &mut [u64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let index = ((values.len() - 1) as f64 * q).round() as usize;
    values[index] as f64 / 1000.0 // ms
}

/// Opens `streams` idle streams (headers + role chunk, then silence) and returns the handles
/// that keep them open and how many got their role chunk.
///
/// At most `OVERHEAD_OPENING` (default 64; 0: no bound, all at once as before 2026-12-04) are
/// being opened at once, as streams arrive at a real proxy: opened all in one burst, the
/// figure held whatever that burst's setup had in flight at its peak (request bodies, heads,
/// upstream connects), a different amount each time, and the allocator kept it for the next
/// burst to reuse — one half's marginal RSS read
/// 11.1 KiB per stream in one round and 15.4 in the next for the same binary, the total for
/// both halves within 1 % (docs/benchmarks.md, "Memory per idle stream: the burst taken out
/// of the ruler").
async fn hold_idle(target: SocketAddr, streams: u64) -> (Vec<tokio::task::JoinHandle<()>>, u64) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build_http();
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let opening = match env_or("OVERHEAD_OPENING", 64) {
        0 => Semaphore::MAX_PERMITS,
        bound => bound as usize,
    };
    let opening = Arc::new(Semaphore::new(opening));
    let mut handles = Vec::new();
    for _ in 0..streams {
        let client = client.clone();
        let tx = tx.clone();
        let Ok(permit) = Arc::clone(&opening).acquire_owned().await else {
            break;
        };
        handles.push(tokio::spawn(async move {
            let _opening = permit;
            let uri = format!("http://{target}/v1/chat/completions?idle=1");
            let Ok(response) = client
                .request(
                    Request::post(uri)
                        .body(Full::new(Bytes::from_static(body().as_bytes())))
                        .unwrap(),
                )
                .await
            else {
                return;
            };
            let mut body = response.into_body();
            if let Some(Ok(_)) = body.frame().await {
                let _ = tx.send(());
            }
            drop(_opening);
            let _ = body.frame().await; // hold until the bench ends
        }));
    }
    drop(tx);
    let mut opened = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while opened < streams {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(())) => opened += 1,
            _ => break,
        }
    }
    (handles, opened)
}

/// Soak: `streams` clients each run back-to-back streams through the proxy for `seconds`;
/// the proxy's RSS is sampled every `every`. Returns the samples (seconds since start, KiB).
async fn soak(
    proxy: &Proxy,
    streams: u64,
    seconds: u64,
    every: Duration,
) -> (Vec<(u64, u64)>, u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let target = proxy.addr;
    let mut tasks = Vec::new();
    for i in 0..streams {
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(i * 1_000_000 / streams.max(1))).await;
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            let mut completed = 0u64;
            while Instant::now() < deadline {
                let uri = format!(
                    "http://{target}/v1/chat/completions?events=100&interval_ms=50&ttft_ms=20"
                );
                let Ok(response) = client
                    .request(
                        Request::post(uri)
                            .body(Full::new(Bytes::from_static(body().as_bytes())))
                            .unwrap(),
                    )
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut body = response.into_body();
                while let Some(Ok(_)) = body.frame().await {}
                completed += 1;
            }
            completed
        }));
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        samples.push((start.elapsed().as_secs(), rss_kib(proxy.child.id())));
        tokio::time::sleep(every).await;
    }
    let mut completed = 0;
    for task in tasks {
        completed += task.await.unwrap_or(0);
    }
    samples.push((start.elapsed().as_secs(), rss_kib(proxy.child.id())));
    (samples, completed)
}

/// The marginal memory of idle in-flight streams through `proxy`: opens `streams / 2` (which
/// also grows the allocator's arenas and the runtime's tables to their working size), reads the
/// RSS, opens `streams / 2` more and reads it again, then closes all of them: (streams in the
/// second half, RSS before it, RSS with it open), in KiB. The first half's growth is what any
/// process pays once; the second half's is what each further stream costs.
async fn idle_rss(proxy: &Proxy, streams: u64) -> (u64, u64, u64) {
    let (first, _) = hold_idle(proxy.addr, streams / 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = rss_kib(proxy.child.id());
    let (second, opened) = hold_idle(proxy.addr, streams - streams / 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let with_streams = rss_kib(proxy.child.id());
    for handle in first.into_iter().chain(second) {
        handle.abort();
    }
    (opened, base, with_streams)
}

/// A CPU list as taskset writes it (`0-3,8`), or `None` when empty or unreadable.
fn cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Pins the calling thread to `cpus` (a no-op when the list is empty).
fn pin_thread(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu);
    }
    let _ = rustix::thread::sched_setaffinity(None, &set);
}

/// A multi-threaded runtime whose workers are pinned to the cores in the environment variable
/// `pin_from` (all cores when it is unset).
fn runtime_pinned(pin_from: &str) -> tokio::runtime::Runtime {
    let cpus = std::env::var(pin_from)
        .ok()
        .and_then(|v| cpu_list(&v))
        .unwrap_or_default();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if !cpus.is_empty() {
        builder.worker_threads(cpus.len());
        let pinned = cpus.clone();
        builder.on_thread_start(move || pin_thread(&pinned));
    }
    pin_thread(&cpus);
    builder.enable_all().build().unwrap()
}

/// Raises this process's open-file soft limit to its hard limit: the client and the in-process
/// upstream hold a socket per stream each.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);
}

/// What one proxy added to one run of streams, against the direct run just before it.
struct Row {
    round: u64,
    subject: String,
    events: u64,
    failures: u64,
    ttft_p50: f64,
    ttft_p99: f64,
    frame_p50: f64,
    frame_p99: f64,
    finish_p99: f64,
    cpu_us_per_event: f64,
    /// Percent of the machine's time the hypervisor took while the streams went through.
    steal_percent: f64,
    idle_kib_per_stream: Option<f64>,
}

impl Row {
    /// The hypervisor took more than `max_steal` percent of the machine while this row's
    /// streams went through (no `/proc/stat`: never).
    fn disturbed(&self, max_steal: f64) -> bool {
        self.steal_percent > max_steal
    }
}

/// No window of `round` was disturbed.
fn is_clean(rows: &[Row], round: u64, max_steal: f64) -> bool {
    rows.iter()
        .filter(|r| r.round == round)
        .all(|r| !r.disturbed(max_steal))
}

/// What one row measures: a forwarder's name, where it listens, its process (CPU is read
/// there, children included) and the path its streams ask for.
struct Target<'a> {
    subject: &'a str,
    addr: SocketAddr,
    pid: u32,
    path: &'a str,
}

/// Runs the streams direct and then through `target` (the proxy process `pid`), and returns
/// what the proxy added (ms) and its CPU per forwarded event (µs).
async fn measure(
    Target {
        subject,
        addr: target,
        pid,
        path,
    }: Target<'_>,
    round: u64,
    upstream: SocketAddr,
    shape: (u64, u64, u64),
    epoch: Instant,
) -> Row {
    let (streams, events, interval) = shape;
    // Warm both paths (connections, allocator, page cache) before measuring either.
    run_streams(upstream, path, streams.min(100), 10, interval, epoch).await;
    run_streams(target, path, streams.min(100), 10, interval, epoch).await;
    let mut direct = run_streams(upstream, path, streams, events, interval, epoch).await;
    let before = cpu_seconds(pid);
    let ticks = machine_ticks();
    let mut through = run_streams(target, path, streams, events, interval, epoch).await;
    let cpu = cpu_seconds(pid) - before;
    let steal = steal_percent(ticks);
    let added = |through: &mut Vec<u64>, direct: &mut Vec<u64>, q: f64| {
        quantile(through, q) - quantile(direct, q)
    };
    Row {
        round,
        subject: subject.to_string(),
        events: through.events,
        failures: through.failures + direct.failures,
        ttft_p50: added(&mut through.ttft_us, &mut direct.ttft_us, 0.5),
        ttft_p99: added(&mut through.ttft_us, &mut direct.ttft_us, 0.99),
        frame_p50: added(&mut through.lateness_us, &mut direct.lateness_us, 0.5),
        frame_p99: added(&mut through.lateness_us, &mut direct.lateness_us, 0.99),
        finish_p99: quantile(&mut through.finish_lateness_us, 0.99),
        cpu_us_per_event: cpu * 1e6 / through.events.max(1) as f64,
        steal_percent: steal,
        idle_kib_per_stream: None,
    }
}

/// A window in which the hypervisor took more than this percent of the machine is disturbed:
/// on this project's shared 2-vCPU VM, windows of 0–3 % steal and windows of 8–40 % alternate
/// within a sitting, and in the disturbed ones every forwarder's CPU per event reads up to 30 %
/// higher (docs/benchmarks.md, "Steal: the hypervisor's share, per window").
const DEFAULT_MAX_STEAL: f64 = 5.0;

/// The fewest clean rounds a median is taken of (fewer: every round, and the CPU ratio is not
/// judged).
const MIN_CLEAN_ROUNDS: u64 = 3;

/// Interleaved rounds unless `OVERHEAD_ROUNDS` says otherwise: a median of five survives one
/// round disturbed by the machine.
const DEFAULT_ROUNDS: u64 = 5;

/// A baseline (nginx, the floor relay) whose CPU per event moves more than this fraction of its
/// median between rounds leaves the machine too noisy to judge a ratio: the bar's own margin
/// (the whole ≤ 1.15× nginx) is 15 %, so a baseline moving more cannot tell pass from fail.
const NOISE_FRACTION: f64 = 0.15;

/// Median, lowest and highest of `values` (finite ones), and the spread (highest − lowest) as a
/// fraction of the median.
fn spread(values: Vec<f64>) -> Option<(f64, f64, f64, f64)> {
    let finite: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    let lowest = finite.iter().copied().reduce(f64::min)?;
    let highest = finite.iter().copied().reduce(f64::max)?;
    let mid = median(finite);
    Some((
        mid,
        lowest,
        highest,
        (highest - lowest) / mid.abs().max(f64::MIN_POSITIVE),
    ))
}

/// The noise verdict: `None` when the baselines held still enough to judge CPU ratios, else
/// the sentence naming which baseline moved and by how much.
fn noise_verdict(rows: &[Row]) -> Option<String> {
    let rounds = rows.iter().map(|r| r.round).max().unwrap_or(0);
    if rounds < 2 {
        return Some("one round: no spread to judge noise by (OVERHEAD_ROUNDS=5)".to_string());
    }
    let moved: Vec<String> = ["nginx", "floor"]
        .into_iter()
        .filter_map(|baseline| {
            let cpu = rows.iter().filter(|r| r.subject == baseline).map(|r| r.cpu_us_per_event).collect();
            let (mid, lowest, highest, fraction) = spread(cpu)?;
            (fraction > NOISE_FRACTION).then(|| {
                format!("{baseline} moved {lowest:.1}–{highest:.1} µs/event ({:.0} % of its median {mid:.1})", fraction * 100.0)
            })
        })
        .collect();
    (!moved.is_empty()).then(|| {
        format!(
            "too noisy to judge a CPU ratio: {} between rounds, more than the bar's {:.0} % margin",
            moved.join(", "),
            NOISE_FRACTION * 100.0
        )
    })
}

/// `value` as `show` writes it, or a dash where there is none (NaN, infinite).
fn finite_or_dash(value: f64, show: impl FnOnce(f64) -> String) -> String {
    if value.is_finite() {
        show(value)
    } else {
        "—".to_string()
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The CPU ratio of `row` to the nginx row of the same round, when nginx ran.
fn nginx_ratio(row: &Row, rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.round == row.round && r.subject == "nginx")
        .map(|nginx| row.cpu_us_per_event / nginx.cpu_us_per_event)
}

fn main() {
    raise_fd_limit();
    if let Ok(spec) = std::env::var(FLOOR_RELAY_ENV) {
        floor_relay(&spec);
        return;
    }
    let streams = env_or("OVERHEAD_STREAMS", 1000);
    let events = env_or("OVERHEAD_EVENTS", 200);
    let interval = env_or("OVERHEAD_INTERVAL_MS", 50);
    let idle = env_or("OVERHEAD_IDLE", 2000);
    let held = env_or("OVERHEAD_HELD", 10_000);
    let rounds = env_or("OVERHEAD_ROUNDS", DEFAULT_ROUNDS).max(1);
    let soak_seconds = env_or("OVERHEAD_SOAK_SECS", 0);
    // The floor relay's row (OVERHEAD_FLOOR=0 leaves it out).
    let floor = env_or("OVERHEAD_FLOOR", 1) == 1;
    let subjects = tokentap_subjects();
    let epoch = Instant::now();
    // With OVERHEAD_UPSTREAM_CPUS the upstream runs on a runtime of its own, pinned there; the
    // client (this runtime) is pinned to OVERHEAD_CLIENT_CPUS; the proxies to OVERHEAD_PROXY_CPUS.
    let upstream_runtime = std::env::var("OVERHEAD_UPSTREAM_CPUS")
        .ok()
        .filter(|v| cpu_list(v).is_some())
        .map(|_| runtime_pinned("OVERHEAD_UPSTREAM_CPUS"));
    let runtime = runtime_pinned("OVERHEAD_CLIENT_CPUS");
    let upstream = match &upstream_runtime {
        Some(own) => own.block_on(upstream(epoch)),
        None => runtime.block_on(upstream(epoch)),
    };
    runtime.block_on(async {
        if soak_seconds > 0 {
            let proxy = start_proxy(&subjects[0], upstream, false).await;
            println!("soak: {streams} clients running back-to-back 5 s streams through tokentap for {soak_seconds} s");
            let (samples, completed) = soak(&proxy, streams, soak_seconds, Duration::from_secs(30)).await;
            for (at, kib) in &samples {
                println!("  t = {at:>4} s   proxy RSS {kib} KiB");
            }
            let first_full = samples.get(1).map_or(0, |s| s.1);
            let last = samples.last().map_or(0, |s| s.1);
            println!("soak: {completed} streams completed; RSS after the first 30 s {first_full} KiB, at the end {last} KiB ({:+.1}%)", (last as f64 / first_full.max(1) as f64 - 1.0) * 100.0);
            return;
        }
        let pinning = match std::env::var("OVERHEAD_PROXY_CPUS") {
            Ok(cpus) if !cpus.is_empty() => format!(
                "pinned: proxy cores {cpus}, upstream cores {}, client cores {}",
                std::env::var("OVERHEAD_UPSTREAM_CPUS").unwrap_or_default(),
                std::env::var("OVERHEAD_CLIENT_CPUS").unwrap_or_default()
            ),
            _ => "client, upstream and proxy share this machine's cores".to_string(),
        };
        let max_steal = env_f64("OVERHEAD_MAX_STEAL", DEFAULT_MAX_STEAL);
        let max_rounds = env_or("OVERHEAD_MAX_ROUNDS", rounds * 2).max(rounds);
        println!("overhead bench: {streams} streams × {events} events every {interval} ms; {rounds} clean round(s), at most {max_rounds} in all (clean: the hypervisor took ≤ {max_steal} % of the machine in every window); {pinning}");
        let shape = (streams, events, interval);
        let mut rows = Vec::new();
        let (mut round, mut clean) = (0, 0);
        while clean < rounds && round < max_rounds {
            round += 1;
            // A B A B: every binary and baseline once per round, so drift of a shared machine
            // lands on all of them alike.
            for subject in &subjects {
                let proxy = start_proxy(subject, upstream, false).await;
                // Idle streams first, on a fresh process: after the streaming run the allocator
                // keeps what 1,000 active streams used, and idle ones would cost nothing new.
                let idle_kib = if idle > 0 {
                    let (opened, base_rss, rss) = idle_rss(&proxy, idle).await;
                    Some(rss.saturating_sub(base_rss) as f64 / opened.max(1) as f64)
                } else {
                    None
                };
                let mut row = measure(Target { subject: &subject.name, addr: proxy.addr, pid: proxy.child.id(), path: &subject.path }, round, upstream, shape, epoch).await;
                row.idle_kib_per_stream = idle_kib;
                rows.push(row);
            }
            match start_nginx(upstream).await {
                Some(nginx) => rows.push(measure(Target { subject: "nginx", addr: nginx.addr, pid: nginx.child.id(), path: METERED_PATH }, round, upstream, shape, epoch).await),
                None if round == 1 => println!("nginx: skipped (not installed: apt-get install nginx-light)"),
                None => {}
            }
            match start_haproxy(upstream).await {
                Some(haproxy) => rows.push(measure(Target { subject: "haproxy", addr: haproxy.addr, pid: haproxy.child.id(), path: METERED_PATH }, round, upstream, shape, epoch).await),
                None if round == 1 => println!("haproxy: skipped (not installed: apt-get install haproxy)"),
                None => {}
            }
            if floor {
                if let Some(relay) = start_floor(upstream).await {
                    rows.push(measure(Target { subject: "floor", addr: relay.addr, pid: relay.child.id(), path: METERED_PATH }, round, upstream, shape, epoch).await);
                }
            }
            if is_clean(&rows, round, max_steal) {
                clean += 1;
            }
        }
        println!("| round | proxy | events | failures | added TTFT p50 ms | p99 ms | added per frame p50 ms | p99 ms | finish event p99 ms | CPU µs/event | ÷ nginx | steal % | KiB per idle stream |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for row in &rows {
            println!(
                "| {} | {} | {} | {} | {:+.3} | {:+.3} | {:+.3} | {:+.3} | {:.3} | {:.1} | {} | {:.1}{} | {} |",
                row.round,
                row.subject,
                row.events,
                row.failures,
                row.ttft_p50,
                row.ttft_p99,
                row.frame_p50,
                row.frame_p99,
                row.finish_p99,
                row.cpu_us_per_event,
                nginx_ratio(row, &rows).map_or("—".to_string(), |r| format!("{r:.2}")),
                row.steal_percent,
                if row.disturbed(max_steal) { " (disturbed)" } else { "" },
                row.idle_kib_per_stream.map_or("—".to_string(), |k| format!("{k:.1}")),
            );
        }
        // Medians, spreads and verdicts are of the clean rounds when there are enough of them to
        // take a median of; otherwise of every round, and the CPU ratio is not judged.
        let clean_rounds: Vec<u64> = (1..=round).filter(|n| is_clean(&rows, *n, max_steal)).collect();
        let enough = clean_rounds.len() as u64 >= rounds.min(MIN_CLEAN_ROUNDS);
        let disturbed = (!enough).then(|| {
            let highest = rows.iter().map(|r| r.steal_percent).filter(|s| s.is_finite()).fold(0.0, f64::max);
            format!(
                "the hypervisor took more than {max_steal} % of the machine during a measured window in {} of {round} rounds (up to {highest:.1} %): too few clean rounds to judge a CPU ratio",
                round - clean_rounds.len() as u64
            )
        });
        println!(
            "rounds: {round} run, {} clean{}",
            clean_rounds.len(),
            if enough { "; the medians below are of the clean rounds" } else { "; too few: the medians below are of every round" }
        );
        let rows: Vec<Row> = if enough {
            rows.into_iter().filter(|r| clean_rounds.contains(&r.round)).collect()
        } else {
            rows
        };
        let rounds = if enough { clean_rounds.len() as u64 } else { round };
        let mut names: Vec<&str> = Vec::new();
        for row in &rows {
            if !names.contains(&row.subject.as_str()) {
                names.push(&row.subject);
            }
        }
        for subject in &names {
            let of = |f: &dyn Fn(&Row) -> Option<f64>| {
                median(rows.iter().filter(|r| r.subject == *subject).filter_map(f).collect())
            };
            println!(
                "median {subject}: added TTFT p99 {:+.3} ms; per frame p50 {:+.3} ms, p99 {:+.3} ms; CPU {:.1} µs/event; ÷ nginx {}; idle stream {}",
                of(&|r| Some(r.ttft_p99)),
                of(&|r| Some(r.frame_p50)),
                of(&|r| Some(r.frame_p99)),
                of(&|r| Some(r.cpu_us_per_event)),
                // No ratio without nginx's CPU (not installed, or a run too short to read
                // it), and only tokentap's memory is measured: a dash then, not NaN.
                finite_or_dash(of(&|r| nginx_ratio(r, &rows)), |ratio| format!("{ratio:.2}")),
                finite_or_dash(of(&|r| r.idle_kib_per_stream), |kib| format!("{kib:.1} KiB")),
            );
            let cpu = rows.iter().filter(|r| r.subject == *subject).map(|r| r.cpu_us_per_event).collect();
            let ratio = rows.iter().filter(|r| r.subject == *subject).filter_map(|r| nginx_ratio(r, &rows)).collect();
            let range = |values| {
                spread(values).map_or("—".to_string(), |(mid, lo, hi, f)| format!("{mid:.2} ({lo:.2}–{hi:.2}, spread {:.0} %)", f * 100.0))
            };
            println!("spread {subject}: CPU µs/event {}; ÷ nginx {}", range(cpu), range(ratio));
        }
        let noise = disturbed.or_else(|| noise_verdict(&rows));
        match &noise {
            Some(noise) => println!("noise: {noise}"),
            None => println!(
                "noise: quiet enough to judge (nginx and the floor each within {:.0} % between rounds)",
                NOISE_FRACTION * 100.0
            ),
        }
        if env_or("OVERHEAD_VERDICT", 0) == 1 {
            for Subject { name, .. } in &subjects {
                let mine: Vec<&Row> = rows.iter().filter(|r| &r.subject == name).collect();
                let ttft = median(mine.iter().map(|r| r.ttft_p99).collect());
                let frame = median(mine.iter().map(|r| r.frame_p99).collect());
                let ratio = median(mine.iter().filter_map(|r| nginx_ratio(r, &rows)).collect());
                let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
                println!("verdict {name} at {streams} streams: added TTFT p99 {ttft:+.3} ms (bar ≤ 1 ms): {}", verdict(ttft <= 1.0));
                println!("verdict {name} at {streams} streams: added per-frame p99 {:+.0} µs (bar ≤ 200 µs): {}", frame * 1000.0, verdict(frame <= 0.2));
                match (&noise, ratio.is_finite()) {
                    (_, false) => println!("verdict {name} at {streams} streams: CPU ÷ nginx not measured (no nginx)"),
                    (Some(noise), true) => println!("verdict {name} at {streams} streams: CPU ÷ nginx median {ratio:.2}: NOT JUDGED ({noise})"),
                    (None, true) => println!("verdict {name} at {streams} streams: CPU ÷ nginx median of {rounds} rounds {ratio:.2} (bar ≤ 1.15, goal ≤ 1.00): {}", verdict(ratio <= 1.15)),
                }
            }
        }

        if held > 0 {
            // Held streams: HTTP/1.1 from clients, HTTP/2 to the upstream (this machine's 20,000
            // file descriptors per process would not fit 10,000 upstream sockets beside 10,000
            // client sockets in one proxy process), with the default config.
            let proxy = start_proxy(&subjects[0], upstream, true).await;
            // In two halves, as the idle streams above: the second half's growth is what one
            // more stream costs once the allocator and the runtime have grown to their size.
            let base_rss = rss_kib(proxy.child.id());
            let (mut handles, first) = hold_idle(proxy.addr, held / 2).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let half_rss = rss_kib(proxy.child.id());
            let (second_handles, second) = hold_idle(proxy.addr, held - held / 2).await;
            handles.extend(second_handles);
            tokio::time::sleep(Duration::from_millis(500)).await;
            let rss = rss_kib(proxy.child.id());
            drop(handles);
            let opened = first + second;
            println!(
                "held: {opened}/{held} concurrent streams open through one proxy ({}); RSS of the fresh process {base_rss} KiB → {half_rss} KiB → {rss} KiB: {:.1} KiB per stream with the process's one-time growth, {:.1} KiB per stream of the second half",
                subjects[0].name,
                (rss.saturating_sub(base_rss)) as f64 / opened.max(1) as f64,
                (rss.saturating_sub(half_rss)) as f64 / second.max(1) as f64
            );
            if env_or("OVERHEAD_VERDICT", 0) == 1 {
                println!("verdict {} held: {opened}/{held} streams: {}", subjects[0].name, if opened == held { "PASS" } else { "FAIL" });
            }
        }
    });
}
