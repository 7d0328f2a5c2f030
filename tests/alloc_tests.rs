//! The hot path allocates nothing per event: a counting allocator (per thread, so other tests
//! cannot disturb it) counts heap allocations while a metered body forwards a long stream,
//! and the count must not grow with the number of events.
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::record::Source;
use tokentap::meter::{Meter, RequestLabels};
use tokentap::stream::body::{MeteredBody, Metering, MeteringOptions};
use tokentap::stream::classify::Route;
use tokentap::stream::rewrite::Injected;
use tokentap::stream::sample::sglang_chat;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// Allocations made while forwarding a stream of `events` events (setup excluded).
fn forward(meter: &Arc<Meter>, events: usize, injected: Injected, continuous: bool) -> u64 {
    let frames: VecDeque<Bytes> = sglang_chat(events, 3, continuous, injected.include_usage).into();
    let request = meter.begin(
        RequestLabels {
            route: Route::ChatCompletions,
            source: Source::Production,
            model: Arc::from("m"),
            upstream: Arc::from("u"),
            tag: None,
        },
        tokio::time::Instant::now(),
    );
    let metering = Metering::new(
        request,
        MeteringOptions {
            route: Route::ChatCompletions,
            event_stream: true,
            injected,
            max_event_bytes: 1 << 20,
            max_body_bytes: 1 << 20,
        },
    );
    let mut body = MeteredBody::new(Frames(frames), Some(metering));
    let mut cx = Context::from_waker(Waker::noop());
    let before = allocations();
    let mut forwarded = 0;
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
        forwarded += frame.into_data().map_or(0, |d| d.len());
    }
    let during = allocations() - before;
    assert!(forwarded > 0);
    drop(body);
    during
}

#[test]
fn forwarding_allocates_nothing_per_event() {
    let meter = Meter::new(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    );
    let strip = Injected {
        include_usage: true,
        continuous_usage: true,
    };
    for (name, injected, continuous) in [
        ("metering only", Injected::default(), false),
        ("metering + usage stripping", strip, true),
    ] {
        let short = forward(&meter, 10, injected, continuous);
        let long = forward(&meter, 5_000, injected, continuous);
        assert_eq!(
            long,
            short,
            "{name}: 4,990 more events cost {} more allocations",
            long as i64 - short as i64
        );
    }
}
