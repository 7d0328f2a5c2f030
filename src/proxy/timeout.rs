//! Idle timeouts on bodies: the longest silence tolerated between frames of a client's
//! request body or an upstream's response body.
//!
//! Silence is counted only while someone is waiting for the body: from the first poll that
//! finds it empty after a frame. Time during which nobody polled (the other side was slow to
//! take what came before: a slow client reading a stream, a slow upstream reading an upload)
//! is backpressure, not a stall. Per frame the cost is one clock read when the body next
//! waits; the timer is created the first time the body waits (one allocation per body, keeping
//! the body `Unpin`) and moved later lazily, which is lock-free in tokio. When the silence
//! exceeds the limit the body ends with [`Stalled`], which the metering body records as its own
//! outcome and hyper turns into an aborted response (the client sees the bytes sent so far,
//! then a broken stream, never a clean end).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::box_error::BoxError;
use crate::meter::record::Outcome;
use crate::net::faults::{Fault, FaultCounters};
use crate::stream::body::BodyFailure;

/// A body went silent for longer than its idle timeout.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no data for {after:?} (idle timeout)")]
pub struct Stalled {
    pub after: Duration,
}

/// A body tokentap produces itself (a streamed admin export) broke off: what came before it
/// is not the whole answer.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the body broke off: its producer failed")]
pub struct BrokenOff;

/// The error of a body under an idle timeout: its own, or the stall; or a body tokentap
/// produces that broke off.
#[derive(Debug, thiserror::Error)]
pub enum IdleError<E> {
    #[error(transparent)]
    Inner(E),
    #[error(transparent)]
    Stalled(Stalled),
    #[error(transparent)]
    BrokenOff(BrokenOff),
}

impl IdleError<BoxError> {
    /// What a client body's errors become: a stall keeps its type, so [`is_stall`] finds it.
    pub fn into_box(self) -> BoxError {
        match self {
            IdleError::Inner(error) => error,
            IdleError::Stalled(stalled) => Box::new(stalled),
            IdleError::BrokenOff(broken) => Box::new(broken),
        }
    }
}

impl<E> BodyFailure for IdleError<E> {
    fn outcome(&self) -> Outcome {
        match self {
            IdleError::Inner(_) | IdleError::BrokenOff(_) => Outcome::UpstreamAborted,
            IdleError::Stalled(_) => Outcome::UpstreamStalled,
        }
    }
}

/// Whether `error` or one of its sources is a [`Stalled`] body (a client body stalled while
/// hyper was sending it upstream comes back wrapped in the client's error).
pub fn is_stall(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<Stalled>() {
            return true;
        }
        current = error.source();
    }
    false
}

/// The upstream's response body under its `stream_idle_timeout`.
pub type UpstreamBody = IdleTimeout<super::inline_pool::DrivenBody>;

pin_project! {
    /// `inner`, ended with [`Stalled`] when no frame arrives for `idle` (zero: never).
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        timer: Option<Pin<Box<Sleep>>>,
        // The deadline the timer is armed for and the waker it was last polled with, kept
        // here (not read from the boxed timer, another cache line per event): while the same
        // task waits on a timer that has not fired, polling it again would only register the
        // same waker once more.
        armed: Option<(Instant, Waker)>,
        idle: Duration,
        // When the current wait began (`None` while frames are coming).
        waiting_since: Option<Instant>,
        stalled: bool,
        // Where a stall is counted, and as which fault.
        faults: Option<(Arc<FaultCounters>, Fault)>,
        // The fault an error of the inner body counts as (an upstream body broken off), if any.
        broken: Option<Fault>,
    }
}

impl<B> IdleTimeout<B> {
    /// Must be polled inside a tokio runtime (the timer registers with it).
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            timer: None,
            armed: None,
            idle,
            waiting_since: None,
            stalled: false,
            faults: None,
            broken: None,
        }
    }

    /// Counts a stall as `fault` in `faults`.
    pub fn counted(mut self, faults: &Arc<FaultCounters>, fault: Fault) -> Self {
        self.faults = Some((Arc::clone(faults), fault));
        self
    }

    /// Also counts an error of the inner body (with [`IdleTimeout::counted`]'s counters) as
    /// `fault`: an upstream body that broke off.
    pub fn counting_breaks(mut self, fault: Fault) -> Self {
        self.broken = Some(fault);
        self
    }
}

impl<B: Body<Data = Bytes>> Body for IdleTimeout<B> {
    type Data = Bytes;
    type Error = IdleError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if *this.stalled {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) {
            *this.waiting_since = None;
            if let (Some(Err(_)), Some((faults, _)), Some(broken)) =
                (&frame, this.faults.as_ref(), *this.broken)
            {
                faults.add(broken);
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(IdleError::Inner)));
        }
        if this.idle.is_zero() {
            return Poll::Pending;
        }
        let fresh = this.waiting_since.is_none();
        let since = *this.waiting_since.get_or_insert_with(Instant::now);
        let deadline = since + *this.idle;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // Every event ends in this wait; a poll of the timer takes a coop budget unit and
        // re-registers the waker, so it is skipped while the task that already waits on it
        // polls again and it has not fired: a timer fires only once its deadline has passed.
        // At the start of a wait `since` is now; a later poll of the same wait (hyper polls
        // the body once more after each flush) reads the clock, which is cheaper than the
        // boxed timer's state (a cache line of its own, cold by the next event).
        if let Some((at, waker)) = this.armed.as_ref() {
            let unfired = if fresh {
                since < *at
            } else {
                Instant::now() < *at
            };
            if unfired && waker.will_wake(cx.waker()) {
                return Poll::Pending;
            }
        }
        // The deadline moves with every frame; the timer does not (a timer-wheel reset per
        // frame costs more than the rest of the frame's path): armed for an older gap, it
        // fires early and is armed once more for the gap in force.
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                let at = timer.deadline();
                match this.armed.as_mut() {
                    Some((armed_at, waker)) if waker.will_wake(cx.waker()) => *armed_at = at,
                    _ => *this.armed = Some((at, cx.waker().clone())),
                }
                return Poll::Pending;
            }
            if timer.deadline() >= deadline {
                break;
            }
            timer.as_mut().reset(deadline);
        }
        *this.stalled = true;
        if let Some((faults, fault)) = this.faults.as_ref() {
            faults.add(*fault);
        }
        Poll::Ready(Some(Err(IdleError::Stalled(Stalled { after: *this.idle }))))
    }

    fn is_end_stream(&self) -> bool {
        self.stalled || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::task::ready;

    use http_body_util::BodyExt;

    use super::*;

    /// Yields its frames, each after a pause, then ends.
    struct Paced {
        frames: VecDeque<(Duration, &'static str)>,
        timer: Option<Pin<Box<Sleep>>>,
    }

    impl Body for Paced {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let Some(&(pause, text)) = self.frames.front() else {
                return Poll::Ready(None);
            };
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
            ready!(timer.as_mut().poll(cx));
            self.timer = None;
            self.frames.pop_front();
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(text.as_bytes())))))
        }
    }

    fn paced(frames: &[(u64, &'static str)]) -> Paced {
        Paced {
            frames: frames
                .iter()
                .map(|&(ms, text)| (Duration::from_millis(ms), text))
                .collect(),
            timer: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gaps_under_the_limit_pass_however_long_the_body() {
        let frames: Vec<(u64, &str)> = (0..50).map(|_| (900, "x")).collect();
        let body = IdleTimeout::new(paced(&frames), Duration::from_secs(1));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_gap_ends_the_body_with_a_stall_after_what_came_before() {
        let mut body = IdleTimeout::new(
            paced(&[(10, "a"), (10, "b"), (5_000, "never")]),
            Duration::from_secs(2),
        );
        let mut seen = Vec::new();
        let start = Instant::now();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => seen.push(frame.into_data().unwrap()),
                Some(Err(error)) => break error,
                None => panic!("ended without a stall"),
            }
        };
        assert_eq!(seen, ["a", "b"]);
        assert!(matches!(error, IdleError::Stalled(_)));
        assert_eq!(error.outcome(), Outcome::UpstreamStalled);
        // Paused time: exactly the last frame (20 ms) plus the idle limit.
        assert_eq!(start.elapsed(), Duration::from_millis(2_020));
        assert!(body.frame().await.is_none(), "nothing after the stall");
    }

    #[tokio::test(start_paused = true)]
    async fn the_timer_armed_for_an_older_gap_still_ends_the_body_on_time() {
        // Gaps just under the limit: the timer, armed at the first wait, fires during later
        // waits and is armed again; the waits in between skip polling it. The long gap must
        // still end the body exactly one limit after the last frame, not earlier or later.
        let mut frames: Vec<(u64, &str)> = (0..7).map(|_| (700, "x")).collect();
        frames.push((10_000, "never"));
        let mut body = IdleTimeout::new(paced(&frames), Duration::from_secs(1));
        let start = Instant::now();
        let mut seen = 0;
        let error = loop {
            match body.frame().await {
                Some(Ok(_)) => seen += 1,
                Some(Err(error)) => break error,
                None => panic!("ended without a stall"),
            }
        };
        assert_eq!(seen, 7);
        assert!(matches!(error, IdleError::Stalled(_)));
        assert_eq!(start.elapsed(), Duration::from_millis(7 * 700 + 1_000));
    }

    #[tokio::test(start_paused = true)]
    async fn time_nobody_waited_is_backpressure_not_silence() {
        let mut body = IdleTimeout::new(paced(&[(10, "a"), (1_500, "b")]), Duration::from_secs(1));
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "a"
        );
        // The reader is busy for 5 s (longer than the idle limit) before asking again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(
            matches!(error, IdleError::Stalled(_)),
            "1.5 s of waiting is a stall"
        );
        let mut body = IdleTimeout::new(paced(&[(10, "a"), (900, "b")]), Duration::from_secs(1));
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "a"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "b",
            "0.9 s of waiting after 5 s of not asking is not a stall"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_means_no_timeout() {
        let body = IdleTimeout::new(paced(&[(3_600_000, "late")]), Duration::ZERO);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "late");
    }

    #[test]
    fn stalls_are_found_through_error_sources() {
        let stalled = IdleError::Stalled(Stalled {
            after: Duration::from_secs(1),
        })
        .into_box();
        assert!(is_stall(stalled.as_ref()));
        let other = IdleError::Inner(BoxError::from(std::io::Error::other("reset"))).into_box();
        assert!(!is_stall(other.as_ref()));
    }
}
