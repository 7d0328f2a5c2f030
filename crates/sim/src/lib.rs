//! The simulated sglang-compatible server (`tokentap simulate`), the embedded default
//! upstream: a performance model driven by a [`Profile`] (prefill curve, decode grid,
//! speculative tokens per step, KV capacity with queueing, a block-granular prefix cache with
//! LRU eviction, chunked prefill stalling decode) behind sglang's HTTP API, byte for byte, or vLLM's with
//! [`Dialect::Vllm`].
//!
//! Code map, lowest first (a file uses only files above it):
//! * `options` (dialect, run options), `profile` (data + validation), `model` (pure timing
//!   functions and seeded draws), `text` (token rules, prompt-cache keys and block chains,
//!   filler words), `json_out` (hand-written JSON), `scheduler` (the one task that owns every
//!   request's progress; `scheduler/prefix_cache` its prefix cache), `from_matrix` (a profile inferred from a speed-test matrix);
//! * `request` (the parsed request, field readers, the error value), `error_body` (every
//!   error body), `output` (the words of each step), `state` (what connections share);
//! * `api/` — one module per API, its parsing and its bytes: `openai` (chat completions,
//!   completions), `generate`, `messages`, `responses`;
//! * `render` (scheduler events → the API's bytes), `body` (the streaming response body),
//!   `generation` (one generation request end to end), `engine_info` (models, server and
//!   model info, version, tokenize, abort), `metrics` (the server metrics table), `router`
//!   (the route table), `server` (the listener and the shared state it builds), `lag` (the
//!   schedule-lag measurement, which runs a `server`).
//!
//! The crate `tokentap-sim` (`tokentap::sim`), on `tokentap-base` and `tokentap-matrix` only: it
//! cannot depend on the proxy or the sweep engine (the compiler keeps that); they call it, through
//! [`serve`], [`SimServer::start`] and [`Profile`].
use std::future::Future;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

mod api;
mod body;
mod engine_info;
mod error_body;
pub mod from_matrix;
mod generation;
mod json_out;
pub mod lag;
mod metrics;
pub mod model;
mod options;
mod output;
pub mod profile;
mod render;
mod request;
mod router;
pub mod scheduler;
mod server;
mod state;
pub mod text;

pub use from_matrix::{FromMatrixError, FromMatrixOptions};
pub use model::PerformanceModel;
pub use options::{Dialect, QueueCaps, QueueOrder, ShedCause, SimOptions};
pub use profile::{Profile, ProfileError, BUILTIN_PROFILES};

/// The profile `tokentap simulate` uses when none is named.
pub const DEFAULT_PROFILE: &str = "glm-5.3-flash-nvfp4-4x-rtx-pro-6000";

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
    let (state, scheduler_task) = server::build_state(profile, options);
    server::serve_state(listener, state, scheduler_task, shutdown).await;
    Ok(())
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
