//! What a connection knows about its requests while it serves them: the send-stall deadline
//! (a response the client's side has stopped taking) and the HTTP/2 stream count behind the
//! idle timeout.
//!
//! **Send stall.** hyper polls a response body only when it can send what comes next: an
//! HTTP/1 connection whose write buffer is flushed, an HTTP/2 stream with flow-control
//! capacity (window and send buffer). A reader that never reads, or never opens its HTTP/2
//! window, therefore stops the polling, and no timer inside the body can fire. So the body
//! only says, through a [`SendWatch`] (two relaxed atomic stores per frame, no lock, no clock),
//! whether it has been handed over and not polled since; the task that drives it — each HTTP/2
//! stream's task (`StreamExecutor`) or the HTTP/1 connection's — keeps the timer. When the
//! body has waited `send_stall_timeout` without being polled, the task drops it: the upstream
//! request is cancelled, the HTTP/2 stream is reset (an HTTP/1 connection is closed), the
//! request is recorded as `client_aborted` and `fault="send_stalled"` is counted.
//!
//! **Idle HTTP/2.** The executor counts the connection's streams in flight; the connection
//! task closes (GOAWAY) a connection that has had none for the idle time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};

use super::faults::{Fault, FaultCounters};
use super::workers::OpenConnection;
use crate::base::lock;

/// Whether a response body is waiting for its connection to take the next frame.
///
/// The body calls [`SendWatch::polling`] when it is polled and [`SendWatch::yielded`] when it
/// hands a frame over; in between, it waits on the client's side. One writer at a time (the
/// task polling the body), read by the same task's watchdog.
#[derive(Debug, Default)]
pub struct SendWatch {
    /// `turn << 1 | waiting`: `turn` counts hand-overs, so a watchdog can tell one long wait
    /// from two short ones.
    state: AtomicU64,
}

impl SendWatch {
    /// The body was handed to the connection (with its response head): it waits for its first
    /// poll.
    pub fn handed_over(&self) {
        let turn = (self.state.load(Ordering::Relaxed) >> 1).wrapping_add(1);
        self.state.store(turn << 1 | 1, Ordering::Relaxed);
    }

    /// The connection polls the body: whatever comes next, it is not waiting on the client.
    pub fn polling(&self) {
        let state = self.state.load(Ordering::Relaxed);
        if state & 1 == 1 {
            self.state.store(state & !1, Ordering::Relaxed);
        }
    }

    /// The body handed a frame over; `last` when nothing follows it.
    pub fn yielded(&self, last: bool) {
        if last {
            self.finished();
        } else {
            self.handed_over();
        }
    }

    /// The body ended or was dropped: nothing waits.
    pub fn finished(&self) {
        self.polling();
    }

    /// The hand-over the body waits after, if it waits.
    fn waiting(&self) -> Option<u64> {
        let state = self.state.load(Ordering::Relaxed);
        (state & 1 == 1).then_some(state >> 1)
    }
}

/// A [`SendWatch`] as it travels in a request's extensions, from the connection to the proxy,
/// which attaches it to the response body.
#[derive(Debug, Clone)]
pub struct StreamWatch(pub Arc<SendWatch>);

/// The timer of one watched body: fires once the body has waited `limit` after one hand-over.
#[derive(Debug)]
pub(super) struct StallTimer {
    limit: Duration,
    /// The hand-over being timed and when the timer first saw it waiting.
    seen: Option<(u64, Instant)>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl StallTimer {
    /// `limit` zero: never fires.
    pub(super) fn new(limit: Duration) -> Self {
        Self {
            limit,
            seen: None,
            sleep: None,
        }
    }

    /// Ready once `watch` has waited `limit` since the same hand-over. Call it after polling
    /// what drives the body, so the body's state is current.
    ///
    /// Every frame is a new hand-over, so the deadline moves with each one; the sleep is not
    /// moved with it (a timer-wheel reset per frame is the costliest thing on the path), it
    /// stays at the deadline it was armed for and, when it fires early, is armed once more for
    /// the deadline now in force: one timer operation per `limit`, not per frame.
    pub(super) fn poll_stalled(&mut self, watch: &SendWatch, cx: &mut Context<'_>) -> Poll<()> {
        if self.limit.is_zero() {
            return Poll::Pending;
        }
        let Some(turn) = watch.waiting() else {
            self.seen = None;
            return Poll::Pending;
        };
        let since = match self.seen {
            Some((seen, at)) if seen == turn => at,
            _ => {
                let now = Instant::now();
                self.seen = Some((turn, now));
                now
            }
        };
        let deadline = since + self.limit;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.is_elapsed() && sleep.deadline() < deadline {
            // Fired for an older hand-over while nothing polled it: arm it for this one.
            sleep.as_mut().reset(deadline);
        }
        loop {
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            // Early: the hand-over it was armed for is gone; wait out the one in force.
            sleep.as_mut().reset(deadline);
        }
    }
}

/// What one connection's parts share: the watch of the request its service saw last (taken by
/// the HTTP/2 stream task the service's future is spawned as), its HTTP/1 watch, and the count
/// of HTTP/2 streams in flight.
#[derive(Debug)]
pub(super) struct ConnStreams {
    /// Set by the service for an HTTP/2 request, taken by the executor right after (hyper
    /// calls the service, then spawns the stream's task, on the connection's task).
    next: Mutex<Option<Arc<SendWatch>>>,
    /// The one watch of HTTP/1 requests (one at a time per connection), timed by the
    /// connection's task.
    pub(super) http1: Arc<SendWatch>,
    /// HTTP/2 streams whose task is running.
    active: AtomicUsize,
    /// Starts and ends of streams, so idleness can tell a new quiet spell from an old one.
    changes: AtomicU64,
    /// Wakes the connection's task when a stream starts or ends.
    pub(super) changed: Notify,
    send_stall: Duration,
    faults: Arc<FaultCounters>,
    name: &'static str,
    /// The listener's connection slot: given back once the connection and every stream task
    /// it spawned are gone, so a drain waits for the streams too.
    _slot: OwnedSemaphorePermit,
    /// Counts the connection on its connection worker, when it runs on one, for as long.
    _worker: Option<OpenConnection>,
}

impl ConnStreams {
    pub(super) fn new(
        send_stall: Duration,
        faults: Arc<FaultCounters>,
        name: &'static str,
        slot: OwnedSemaphorePermit,
        worker: Option<OpenConnection>,
    ) -> Self {
        Self {
            next: Mutex::new(None),
            http1: Arc::default(),
            active: AtomicUsize::new(0),
            changes: AtomicU64::new(0),
            changed: Notify::new(),
            send_stall,
            faults,
            name,
            _slot: slot,
            _worker: worker,
        }
    }

    /// The watch for a request the service is called with.
    pub(super) fn watch_for(&self, version: http::Version) -> Arc<SendWatch> {
        if version == http::Version::HTTP_2 {
            let watch = Arc::new(SendWatch::default());
            *lock::lock(&self.next) = Some(Arc::clone(&watch));
            watch
        } else {
            self.http1.finished();
            Arc::clone(&self.http1)
        }
    }

    /// HTTP/2 streams in flight and how many starts and ends there have been.
    pub(super) fn activity(&self) -> (usize, u64) {
        (
            self.active.load(Ordering::Acquire),
            self.changes.load(Ordering::Acquire),
        )
    }

    pub(super) fn stalled(&self) {
        self.faults.add(Fault::SendStalled);
        tracing::debug!(
            listener = self.name,
            after = ?self.send_stall,
            "the client took nothing of a response for the send stall timeout; cancelled"
        );
    }

    pub(super) fn send_stall(&self) -> Duration {
        self.send_stall
    }

    fn stream_changed(&self, delta: isize) {
        if delta > 0 {
            self.active.fetch_add(1, Ordering::AcqRel);
        } else {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
        self.changes.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
    }
}

/// The executor of one connection's HTTP/2 stream tasks: each runs under its send-stall timer
/// and is counted while it runs.
#[derive(Debug, Clone)]
pub(super) struct StreamExecutor {
    pub(super) streams: Arc<ConnStreams>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        let watch = lock::lock(&self.streams.next).take();
        self.streams.stream_changed(1);
        tokio::spawn(Watched {
            inner: future,
            watch,
            timer: StallTimer::new(self.streams.send_stall),
            _active: Active(Arc::clone(&self.streams)),
        });
    }
}

/// Counts a stream as active while its task lives.
struct Active(Arc<ConnStreams>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.stream_changed(-1);
    }
}

pin_project! {
    /// An HTTP/2 stream's task, ended (dropping the response body) when its body has waited
    /// for the client longer than the send stall timeout.
    struct Watched<F> {
        #[pin]
        inner: F,
        watch: Option<Arc<SendWatch>>,
        timer: StallTimer,
        _active: Active,
    }
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.inner.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(watch) = this.watch.as_ref() else {
            return Poll::Pending;
        };
        if this.timer.poll_stalled(watch, cx).is_ready() {
            this._active.0.stalled();
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_waits_from_hand_over_to_poll() {
        let watch = SendWatch::default();
        assert_eq!(watch.waiting(), None);
        watch.handed_over();
        let first = watch.waiting().unwrap();
        watch.polling();
        assert_eq!(watch.waiting(), None);
        watch.yielded(false);
        let second = watch.waiting().unwrap();
        assert_ne!(first, second, "each hand-over is its own turn");
        watch.polling();
        watch.yielded(true);
        assert_eq!(watch.waiting(), None, "nothing waits after the last frame");
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_fires_after_one_long_wait_not_after_many_short_ones() {
        let watch = SendWatch::default();
        let mut timer = StallTimer::new(Duration::from_secs(1));
        let poll = |timer: &mut StallTimer, watch: &SendWatch| {
            let waker = futures_task_noop();
            let mut cx = Context::from_waker(&waker);
            timer.poll_stalled(watch, &mut cx).is_ready()
        };
        for _ in 0..5 {
            watch.handed_over();
            assert!(!poll(&mut timer, &watch));
            tokio::time::advance(Duration::from_millis(600)).await;
            watch.polling();
            assert!(!poll(&mut timer, &watch));
        }
        watch.handed_over();
        assert!(!poll(&mut timer, &watch));
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(poll(&mut timer, &watch));
    }

    fn futures_task_noop() -> std::task::Waker {
        std::task::Waker::noop().clone()
    }
}
