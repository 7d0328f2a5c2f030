//! Schedule-lag measurement (`tokentap simulate --measure-lag N`): is the simulator cheap
//! enough to keep its own schedule with N concurrent streams on one core?
//!
//! The simulator runs on a dedicated thread with a single-threaded tokio runtime (one
//! core at most); N real HTTP/1.1 streaming clients run on the caller's runtime. After a
//! scout request warms the prompt cache and all N streams are running, the scheduler's
//! lag samples (actual start of each back-to-back prefill chunk or decode step minus its
//! planned start) are collected for the window. Only loopback traffic; every loop is
//! bounded in count and time.
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::model::PerformanceModel;
use super::options::SimOptions;
use super::profile::Profile;
use super::scheduler::{Command, SchedulerHandle, OUTPUT_RESERVATION_CLIP};
use super::server::{build_state, serve_state};

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct LagPlan {
    pub streams: usize,
    pub seconds: f64,
    /// Prompt tokens of every stream.
    pub context: u64,
}

/// The measurement's result.
#[derive(Debug, Clone)]
pub struct LagReport {
    pub profile: String,
    pub streams: usize,
    pub window: Duration,
    pub samples: usize,
    pub p50_us: u32,
    pub p99_us: u32,
    pub max_us: u32,
    /// SSE events the clients received during the window, per second.
    pub events_per_second: f64,
    /// Bytes the clients received during the window, per second.
    pub bytes_per_second: f64,
    /// Requests the scheduler reported running at window start.
    pub running: usize,
    /// Per-request decode speed the model prescribes at this batch and context.
    pub model_per_request_tok_s: f64,
}

impl fmt::Display for LagReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "profile            {}", self.profile)?;
        writeln!(
            f,
            "streams            {} ({} running at window start)",
            self.streams, self.running
        )?;
        writeln!(f, "window             {:.1} s", self.window.as_secs_f64())?;
        writeln!(f, "schedule samples   {}", self.samples)?;
        writeln!(
            f,
            "schedule lag       p50 {:.3} ms   p99 {:.3} ms   max {:.3} ms",
            f64::from(self.p50_us) / 1000.0,
            f64::from(self.p99_us) / 1000.0,
            f64::from(self.max_us) / 1000.0
        )?;
        writeln!(
            f,
            "delivered          {:.0} SSE events/s, {:.2} MB/s",
            self.events_per_second,
            self.bytes_per_second / 1.0e6
        )?;
        write!(
            f,
            "model speed        {:.2} tok/s per stream at this batch",
            self.model_per_request_tok_s
        )
    }
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum LagError {
    #[error("the simulator thread could not start")]
    Thread(#[source] std::io::Error),
    #[error("the simulator did not come up")]
    NoServer,
    #[error("stream {index} could not connect to the simulator at {addr}")]
    Connect {
        index: usize,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("only {running} of {wanted} streams were running after {waited:?}")]
    NotRunning {
        running: usize,
        wanted: usize,
        waited: Duration,
    },
    #[error("the scout request failed: {0}")]
    Scout(String),
    #[error("invalid profile for the measurement")]
    Profile(#[from] super::profile::ProfileError),
}

/// Run the measurement (see the module docs).
pub async fn measure(
    mut profile: Profile,
    options: SimOptions,
    plan: LagPlan,
) -> Result<LagReport, LagError> {
    let streams = plan.streams.max(1);
    let per_stream = plan.context + OUTPUT_RESERVATION_CLIP;
    profile.capacity.kv_tokens = profile
        .capacity
        .kv_tokens
        .max(per_stream * streams as u64 + per_stream);
    profile.capacity.max_running_requests = profile
        .capacity
        .max_running_requests
        .max(u32::try_from(streams + 1).unwrap_or(u32::MAX));
    profile.validate()?;
    let model = PerformanceModel::new(&profile);
    let max_tokens = profile
        .model
        .context_length
        .saturating_sub(plan.context + 2)
        .min(1_000_000);

    // The simulator: its own thread, one single-threaded runtime.
    let (ready_tx, ready_rx) = oneshot::channel::<(std::net::SocketAddr, SchedulerHandle)>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let sim_profile = profile.clone();
    let thread = std::thread::Builder::new()
        .name("tokentap-sim".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await else {
                    return;
                };
                let Ok(addr) = listener.local_addr() else {
                    return;
                };
                let (state, task) = build_state(sim_profile, options);
                let _ = ready_tx.send((addr, state.scheduler.clone()));
                serve_state(listener, state, task, async move {
                    let _ = stop_rx.await;
                })
                .await;
            });
        })
        .map_err(LagError::Thread)?;
    let (addr, scheduler) = ready_rx.await.map_err(|_| LagError::NoServer)?;

    let prompt: String = {
        let ids: Vec<String> = (0..plan.context)
            .map(|i| (1000 + i % 5000).to_string())
            .collect();
        ids.join(",")
    };
    let body = |max: u64| {
        format!(
            "{{\"model\":\"bench\",\"prompt\":[{prompt}],\"max_tokens\":{max},\"ignore_eos\":true,\"stream\":true,\"stream_options\":{{\"include_usage\":true,\"continuous_usage_stats\":true}}}}"
        )
    };
    let request = |body: &str| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };

    let result = async {
        // Scout: warms the prompt cache so every stream below is a cache hit.
        let scout = request(&body(1));
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|source| LagError::Connect {
                index: 0,
                addr,
                source,
            })?;
        stream
            .write_all(scout.as_bytes())
            .await
            .map_err(|e| LagError::Scout(e.to_string()))?;
        let mut sink = Vec::new();
        tokio::time::timeout(Duration::from_secs(600), stream.read_to_end(&mut sink))
            .await
            .map_err(|_| LagError::Scout("timed out".into()))?
            .map_err(|e| LagError::Scout(e.to_string()))?;
        if !sink.starts_with(b"HTTP/1.1 200") {
            return Err(LagError::Scout(
                String::from_utf8_lossy(&sink).chars().take(300).collect(),
            ));
        }

        let events = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let stream_request = Arc::new(request(&body(max_tokens)));
        let mut clients = tokio::task::JoinSet::new();
        for index in 0..streams {
            let mut socket =
                TcpStream::connect(addr)
                    .await
                    .map_err(|source| LagError::Connect {
                        index,
                        addr,
                        source,
                    })?;
            let (events, bytes, stream_request) = (
                Arc::clone(&events),
                Arc::clone(&bytes),
                Arc::clone(&stream_request),
            );
            clients.spawn(async move {
                if socket.write_all(stream_request.as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let chunk = &buf[..n];
                            let count = chunk.windows(2).filter(|w| w == b"\n\n").count();
                            events.fetch_add(count as u64, Ordering::Relaxed);
                            bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }
                }
            });
        }

        // Wait until every stream runs (bounded).
        let mut stats = scheduler.stats.clone();
        let wait_limit = Duration::from_secs(120);
        let waited_from = Instant::now();
        loop {
            let running = stats.borrow().running;
            if running >= streams {
                break;
            }
            let left = wait_limit.saturating_sub(waited_from.elapsed());
            if left.is_zero() {
                return Err(LagError::NotRunning {
                    running,
                    wanted: streams,
                    waited: wait_limit,
                });
            }
            let _ = tokio::time::timeout(left, stats.changed()).await;
        }
        // Let the joins finish and the batch settle into steady decode.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let running = stats.borrow().running;

        let _ = take_lag(&scheduler).await;
        let events_before = events.load(Ordering::Relaxed);
        let bytes_before = bytes.load(Ordering::Relaxed);
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(plan.seconds.clamp(0.5, 3600.0))).await;
        let window = started.elapsed();
        let mut samples = take_lag(&scheduler).await;
        let events_delta = events.load(Ordering::Relaxed) - events_before;
        let bytes_delta = bytes.load(Ordering::Relaxed) - bytes_before;
        clients.abort_all();

        samples.sort_unstable();
        let pick = |q: f64| -> u32 {
            if samples.is_empty() {
                return 0;
            }
            let index = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[index.min(samples.len() - 1)]
        };
        Ok(LagReport {
            profile: profile.model.served_model_name.clone(),
            streams,
            window,
            samples: samples.len(),
            p50_us: pick(0.50),
            p99_us: pick(0.99),
            max_us: samples.last().copied().unwrap_or(0),
            events_per_second: events_delta as f64 / window.as_secs_f64(),
            bytes_per_second: bytes_delta as f64 / window.as_secs_f64(),
            running,
            model_per_request_tok_s: model.per_request_tok_s(plan.context as f64, streams),
        })
    }
    .await;

    let _ = stop_tx.send(());
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    result
}

async fn take_lag(scheduler: &SchedulerHandle) -> Vec<u32> {
    let (tx, rx) = oneshot::channel();
    if scheduler.commands.send(Command::TakeLag(tx)).is_err() {
        return Vec::new();
    }
    rx.await.unwrap_or_default()
}
