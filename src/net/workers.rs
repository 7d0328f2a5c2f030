//! Connection workers (`proxy.workers` ≥ 1): the threads that serve the data listener's
//! connections, each with a single-threaded tokio runtime of its own (an event loop per thread,
//! as nginx runs a worker process per core and Envoy a dispatcher per worker thread).
//!
//! Why not the process's multi-threaded runtime (the default, `proxy.workers = 0`): every
//! forwarded SSE event wakes its client connection's task, and on the work-stealing scheduler
//! each wake-up also pays for what lets another thread take the task (the run queue's atomics,
//! waking a parked worker to steal, the futex behind it). A connection never needs another
//! thread: its upstream socket, its timers and its client socket are all its own. On a
//! current-thread runtime a wake-up is a push onto a local queue. Measured on 2 cores, one
//! worker costs 4–9 % less CPU per forwarded event than the shared runtime, but one per core
//! was no cheaper, since each worker then sleeps and wakes for its own share of the events
//! (docs/benchmarks.md, "Connection workers").
//!
//! The listener still accepts on the shared runtime (its limits, back-off and drain are one
//! loop) and hands each accepted socket to the worker with the fewest open connections; the
//! socket is registered with that worker's reactor there, and everything the connection
//! spawns (its HTTP/1 task, HTTP/2 stream tasks) runs on that worker until it closes.
//! [`current`] tells code on the request path which worker it runs on, so that a pool of
//! upstream connections can hand each worker the sockets its own reactor watches
//! (`proxy::inline_pool`).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

thread_local! {
    /// 1 + the index of the connection worker this thread is, 0 on any other thread.
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Which connection worker runs the calling code: 1 + its index, or 0 off the workers (the
/// shared runtime, a test's runtime).
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// One worker: its runtime's handle, its open connections, and what stops its thread.
struct Worker {
    handle: Handle,
    connections: Arc<AtomicUsize>,
    /// Dropped (with the workers), it ends the thread's `block_on`; the runtime is then shut
    /// down on its own thread, which a runtime requires (it cannot be dropped inside another).
    _stop: oneshot::Sender<()>,
}

/// The data listener's connection workers (see the module doc). Dropped, every worker thread
/// stops, and whatever still runs on it is cancelled: drop it after the listener has drained.
pub struct ConnectionWorkers {
    workers: Vec<Worker>,
    /// Where the search for the least-loaded worker starts, so ties take turns.
    next: AtomicUsize,
}

impl std::fmt::Debug for ConnectionWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWorkers")
            .field("workers", &self.workers.len())
            .field("connections", &self.connections())
            .finish()
    }
}

impl ConnectionWorkers {
    /// Starts `count` worker threads (at least one), named `tokentap-conn-N`.
    pub fn start(count: usize) -> std::io::Result<Arc<Self>> {
        let mut workers = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("tokentap-conn-{index}"))
                .spawn(move || {
                    WORKER.with(|worker| worker.set(index + 1));
                    // Runs the worker's tasks until the workers are dropped.
                    let _ = runtime.block_on(stopped);
                    // Connections still open here were past the listener's close wait: they
                    // are dropped, and nothing waits for blocking work they started.
                    runtime.shutdown_background();
                })?;
            workers.push(Worker {
                handle,
                connections: Arc::default(),
                _stop: stop,
            });
        }
        Ok(Arc::new(Self {
            workers,
            next: AtomicUsize::new(0),
        }))
    }

    /// How many worker threads there are.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Always false: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Connections open on the workers now.
    pub fn connections(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.connections.load(Ordering::Relaxed))
            .sum()
    }

    /// Where the next connection goes: the worker with the fewest open connections. The
    /// placement counts the connection as open there until its [`OpenConnection`] is dropped
    /// (the connection keeps it beside its listener slot, for as long as any of its tasks runs).
    pub fn place(&self) -> Option<Placement> {
        let worker = self.least_loaded()?;
        worker.connections.fetch_add(1, Ordering::Relaxed);
        Some(Placement {
            handle: worker.handle.clone(),
            open: OpenConnection(Arc::clone(&worker.connections)),
        })
    }

    /// The worker with the fewest open connections, ties broken in turn.
    fn least_loaded(&self) -> Option<&Worker> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.workers.len();
        (0..count)
            .filter_map(|offset| self.workers.get((start + offset) % count))
            .min_by_key(|w| w.connections.load(Ordering::Relaxed))
    }
}

/// A connection's worker, chosen by [`ConnectionWorkers::place`].
#[derive(Debug)]
pub struct Placement {
    /// The worker's runtime: the connection's first task is spawned here, and what it spawns
    /// stays here.
    pub handle: Handle,
    /// Counts the connection as open on its worker while kept.
    pub open: OpenConnection,
}

/// Counts a connection as open on its worker until dropped.
#[derive(Debug)]
pub struct OpenConnection(Arc<AtomicUsize>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::time::Duration;

    /// Runs `serve` on the placed worker, counted open until it ends (as the listener does).
    fn spawn<Fut>(workers: &ConnectionWorkers, serve: impl FnOnce() -> Fut + Send + 'static)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let placement = workers.place().unwrap();
        let open = placement.open;
        placement.handle.spawn(async move {
            let _open = open;
            serve().await;
        });
    }

    #[tokio::test]
    async fn connections_go_to_the_least_loaded_worker_and_run_there() {
        let workers = ConnectionWorkers::start(2).unwrap();
        assert_eq!(current(), 0, "a test's runtime is no worker");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (release, held) = tokio::sync::watch::channel(false);
        for _ in 0..4 {
            let tx = tx.clone();
            let mut held = held.clone();
            spawn(&workers, move || async move {
                let _ = tx.send(current());
                let _ = held.wait_for(|go| *go).await;
            });
        }
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(
                tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 1, 2, 2], "two connections on each worker");
        assert_eq!(workers.connections(), 4);
        release.send(true).unwrap();
        for _ in 0..200 {
            if workers.connections() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            workers.connections(),
            0,
            "ended connections are no longer counted"
        );
    }

    #[test]
    fn dropping_the_workers_stops_their_threads() {
        let workers = ConnectionWorkers::start(1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        spawn(&workers, move || async move {
            // Never ends by itself: the worker's shutdown drops it.
            struct Dropped(std::sync::mpsc::Sender<()>);
            impl Drop for Dropped {
                fn drop(&mut self) {
                    let _ = self.0.send(());
                }
            }
            let _dropped = Dropped(tx);
            std::future::pending::<()>().await;
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(workers);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the pending connection was dropped with its worker");
    }
}
