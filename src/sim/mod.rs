//! The simulated sglang-compatible server (`tokentap simulate`), the embedded default
//! upstream: a performance model driven by a [`Profile`] (prefill curve, decode grid,
//! speculative tokens per step, KV capacity with queueing, prompt cache, chunked prefill
//! stalling decode) behind sglang's HTTP API, byte for byte, or vLLM's with
//! [`Dialect::Vllm`].
//!
//! Code map: `profile` (data + validation), `from_matrix` (a profile inferred from a
//! speed-test matrix), `model` (pure timing functions and seeded draws), `scheduler` (the one task that owns every request's progress), `wire` (SSE and
//! JSON bytes), `text` (token rules and filler words), `http` (hyper server and routes),
//! `lag` (the schedule-lag measurement).
//!
//! This module must not depend on the proxy or the sweep engine: they call it, through
//! [`serve`], [`SimServer::start`] and [`Profile`].
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

pub mod from_matrix;
pub mod http;
pub mod lag;
pub mod model;
pub mod profile;
pub mod scheduler;
pub mod text;
pub mod wire;

pub use from_matrix::{FromMatrixError, FromMatrixOptions};
pub use model::PerformanceModel;
pub use profile::{Profile, ProfileError, BUILTIN_PROFILES};

/// The profile `tokentap simulate` uses when none is named.
pub const DEFAULT_PROFILE: &str = "glm-5.3-flash-nvfp4-4x-rtx-pro-6000";

/// Which server the simulator impersonates on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dialect {
    /// sglang: headers at first token on OpenAI routes, `reasoning_content`, `sglang:` metrics.
    #[default]
    Sglang,
    /// vLLM: headers at once, `reasoning`, usage on every chunk with continuous stats,
    /// finish reason on the last content chunk, `vllm:` metrics with `cache_config_info`.
    Vllm,
}

/// Run-time options that are not part of the deployment's profile.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Seeds ids, output text, accept lengths and natural output lengths.
    pub seed: u64,
    pub dialect: Dialect,
    /// Overrides the profile's `served_model_name`.
    pub served_model_name: Option<String>,
    /// sglang `--enable-cache-report`: fill `prompt_tokens_details.cached_tokens`.
    pub enable_cache_report: bool,
    /// A vocabulary of this many ids: `/tokenize` answers ids below it, and a prompt with a
    /// larger id is refused as the engine refuses it (vLLM: status 200, then an error event).
    /// `None`: every id is valid.
    pub vocab_size: Option<u64>,
    /// sglang `--stream-response-default-include-usage`: every stream gets the final usage
    /// chunk, asked or not, and `/server_info` says so.
    pub stream_response_default_include_usage: bool,
}

/// Why the simulator could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("invalid simulator profile")]
    Profile(#[from] ProfileError),
    #[error("cannot bind the simulator listener on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the simulator listener's address")]
    LocalAddr(#[source] std::io::Error),
}

/// Serve the simulator on `listener` until `shutdown` resolves. Validates the profile
/// first. Every connection is HTTP/1.1 or h2c (prior knowledge), auto-detected.
pub async fn serve(
    listener: TcpListener,
    profile: Profile,
    options: SimOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SimError> {
    profile.validate()?;
    let (state, scheduler_task) = build_state(profile, options);
    serve_state(listener, state, scheduler_task, shutdown).await;
    Ok(())
}

/// Start the scheduler (on the current runtime) and build the shared server state.
pub(crate) fn build_state(
    profile: Profile,
    options: SimOptions,
) -> (Arc<http::AppState>, tokio::task::JoinHandle<()>) {
    let (scheduler, scheduler_task) = scheduler::spawn(&profile, options.seed);
    let fingerprint = format!("vllm-0.32.0-{:08x}", options.seed as u32);
    let state = Arc::new(http::AppState {
        profile: Arc::new(profile),
        options,
        scheduler,
        next_request: AtomicU64::new(0),
        started_unix: wire::unix_seconds(),
        fingerprint,
    });
    (state, scheduler_task)
}

/// Accept connections until `shutdown`, then close them all and stop the scheduler.
pub(crate) async fn serve_state(
    listener: TcpListener,
    state: Arc<http::AppState>,
    scheduler_task: tokio::task::JoinHandle<()>,
    shutdown: impl Future<Output = ()>,
) {
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let state = Arc::clone(&state);
                    connections.spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            http::handle(Arc::clone(&state), request)
                        });
                        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                        if let Err(error) = builder.serve_connection(TokioIo::new(stream), service).await {
                            tracing::debug!(%error, "simulator connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "simulator accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
    scheduler_task.abort();
}

/// A simulator running in the background on 127.0.0.1 (tests, sweeps, `tokentap demo`).
#[derive(Debug)]
pub struct SimServer;

/// The running simulator; dropping it shuts it down.
#[derive(Debug)]
pub struct SimHandle {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), SimError>>>,
}

impl SimServer {
    /// Bind 127.0.0.1:0 and serve `profile` on the current runtime.
    pub async fn start(profile: Profile, options: SimOptions) -> Result<SimHandle, SimError> {
        profile.validate()?;
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|source| SimError::Bind {
                addr: "127.0.0.1:0".to_owned(),
                source,
            })?;
        let addr = listener.local_addr().map_err(SimError::LocalAddr)?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, profile, options, async move {
            let _ = rx.await;
        }));
        Ok(SimHandle {
            addr,
            shutdown: Some(tx),
            task: Some(task),
        })
    }
}

impl SimHandle {
    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, close every connection, stop the scheduler, and wait for it.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}
