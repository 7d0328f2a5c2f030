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
use super::options::{Dialect, QueueCaps, SimOptions};
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
    let (scheduler, scheduler_task) = scheduler::spawn(
        &profile,
        options.seed,
        options.queue_order(),
        QueueCaps {
            abort_least_preferred: options.priority_scheduling
                && options.dialect == Dialect::Sglang,
            ..options.queue_caps
        },
    );
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use serde_json::{json, Value};
    use tokio::sync::mpsc;

    use super::*;
    use crate::engine_info;
    use crate::options::Dialect;
    use crate::profile::BUILTIN_PROFILES;

    /// Virtual time (the runtime's clock is paused): only a stuck request reaches it.
    const PATIENCE: Duration = Duration::from_secs(3600);

    fn state(
        dialect: Dialect,
        priority_scheduling: bool,
    ) -> (Arc<AppState>, tokio::task::JoinHandle<()>) {
        let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
        // One request at a time: everything sent while one runs queues.
        profile.capacity.max_running_requests = 1;
        let options = SimOptions {
            dialect,
            priority_scheduling,
            ..SimOptions::default()
        };
        build_state(profile, options)
    }

    /// POST a whole (not streamed) chat completion; its status once it has finished.
    async fn chat(
        state: Arc<AppState>,
        content: String,
        max_tokens: u64,
        priority: Option<i64>,
    ) -> u16 {
        let mut body = json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
        });
        if let (Some(map), Some(priority)) = (body.as_object_mut(), priority) {
            map.insert("priority".to_owned(), json!(priority));
        }
        let request = http::Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = router::handle(state, request).await.unwrap();
        let status = response.status().as_u16();
        let _ = response.into_body().collect().await.unwrap();
        status
    }

    /// Occupy the one place with a long request, send one chat request per entry of
    /// `priorities` while it runs, and return their indexes in the order they finished.
    async fn finish_order(
        dialect: Dialect,
        priority_scheduling: bool,
        priorities: &[Option<i64>],
    ) -> Vec<usize> {
        let (state, scheduler_task) = state(dialect, priority_scheduling);
        let blocker = tokio::spawn(chat(Arc::clone(&state), "blocker".to_owned(), 64, None));
        let mut stats = state.scheduler.stats.clone();
        tokio::time::timeout(PATIENCE, stats.wait_for(|s| s.running == 1))
            .await
            .unwrap()
            .unwrap();
        let (done_tx, mut done) = mpsc::unbounded_channel();
        for (index, priority) in priorities.iter().copied().enumerate() {
            let (state, done_tx) = (Arc::clone(&state), done_tx.clone());
            tokio::spawn(async move {
                let status = chat(state, format!("request {index}"), 2, priority).await;
                let _ = done_tx.send((index, status));
            });
        }
        // All of them wait behind the blocker at once.
        let queued = stats.wait_for(|s| s.running == 1 && s.queued == priorities.len());
        tokio::time::timeout(PATIENCE, queued)
            .await
            .unwrap()
            .unwrap();
        let mut order = Vec::new();
        while order.len() < priorities.len() {
            let (index, status) = tokio::time::timeout(PATIENCE, done.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(status, 200, "request {index}");
            order.push(index);
        }
        assert_eq!(blocker.await.unwrap(), 200);
        scheduler_task.abort();
        order
    }

    #[tokio::test(start_paused = true)]
    async fn a_chat_requests_priority_orders_the_queue_in_the_dialects_direction() {
        let priorities = [Some(1), Some(9), None, Some(-4)];
        // sglang: larger first, the request without a priority last.
        assert_eq!(
            finish_order(Dialect::Sglang, true, &priorities).await,
            [1, 0, 3, 2]
        );
        // vLLM: smaller first, no priority counting as 0.
        assert_eq!(
            finish_order(Dialect::Vllm, true, &priorities).await,
            [3, 2, 0, 1]
        );
        // Off: arrival order, the field ignored.
        assert_eq!(
            finish_order(Dialect::Sglang, false, &priorities).await,
            [0, 1, 2, 3]
        );
    }

    #[tokio::test]
    async fn server_info_reports_the_priority_scheduling_arguments() {
        for on in [false, true] {
            let mut profile = Profile::builtin(BUILTIN_PROFILES[0].0).unwrap();
            profile.capacity.max_running_requests = 1;
            let options = SimOptions {
                priority_scheduling: on,
                low_priority_values_first: on,
                ..SimOptions::default()
            };
            let (state, scheduler_task) = build_state(profile, options);
            let info: Value = serde_json::from_str(&engine_info::server_info(&state).body).unwrap();
            assert_eq!(info["enable_priority_scheduling"], json!(on));
            assert_eq!(info["schedule_low_priority_values_first"], json!(on));
            scheduler_task.abort();
        }
    }
}
