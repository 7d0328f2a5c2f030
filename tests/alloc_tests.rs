//! The hot path allocates nothing per event: a counting allocator (per thread, so other tests
//! cannot disturb it) counts heap allocations while a metered body forwards a long stream,
//! and the count must not grow with the number of events.
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http_body::Body;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::Meter;
use tokentap::stream::rewrite::Injected;
use tokentap::stream::sample::{metered_chat_body, sglang_chat};

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

/// Allocations made while forwarding a stream of `events` events (setup excluded).
fn forward(meter: &Arc<Meter>, events: usize, injected: Injected, continuous: bool) -> u64 {
    let frames = sglang_chat(events, 3, continuous, injected.include_usage);
    let mut body = metered_chat_body(frames, meter, injected);
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
