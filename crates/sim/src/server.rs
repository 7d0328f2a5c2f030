//! The simulator's listener: builds the state every connection shares (starting the scheduler
//! task) and accepts connections, each served as HTTP/1.1 or h2c (prior knowledge),
//! auto-detected, until shutdown.
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::json_out;
use super::options::SimOptions;
use super::profile::Profile;
use super::router;
use super::scheduler;
use super::state::AppState;

/// Start the scheduler (on the current runtime) and build the shared server state.
pub fn build_state(
    profile: Profile,
    options: SimOptions,
) -> (Arc<AppState>, tokio::task::JoinHandle<()>) {
    let profile = profile.slowed(options.slowdown);
    let (scheduler, scheduler_task) = scheduler::spawn(&profile, options.seed);
    let fingerprint = format!("vllm-0.32.0-{:08x}", options.seed as u32);
    let state = Arc::new(AppState {
        profile: Arc::new(profile),
        options,
        scheduler,
        next_request: AtomicU64::new(0),
        started_unix: json_out::unix_seconds(),
        fingerprint,
    });
    (state, scheduler_task)
}

/// Accept connections until `shutdown`, then close them all and stop the scheduler.
pub async fn serve_state(
    listener: TcpListener,
    state: Arc<AppState>,
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
                            router::handle(Arc::clone(&state), request)
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
