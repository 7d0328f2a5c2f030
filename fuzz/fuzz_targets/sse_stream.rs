//! Any bytes, split anywhere, through the metering body with usage stripping on: no panic, and
//! with nothing injected the client receives exactly the input.
#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::Body as _;
use libfuzzer_sys::fuzz_target;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::Meter;
use tokentap::stream::rewrite::Injected;
use tokentap::stream::body::MeteredBody;
use tokentap::stream::sample::{metered_chat_body, Frames};

fn drain(frames: Vec<Bytes>, injected: Injected) -> Vec<u8> {
    let Ok(contexts) = Ladder::contexts(&DEFAULT_CONTEXTS) else { return Vec::new() };
    let Ok(concurrency) = Ladder::concurrency(&DEFAULT_CONCURRENCY) else { return Vec::new() };
    let meter = Meter::new(contexts, concurrency);
    let body = metered_chat_body(frames, &meter, injected);
    poll_all(body)
}

fn poll_all(mut body: MeteredBody<Frames>) -> Vec<u8> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
        }
    }
    out
}

fuzz_target!(|input: &[u8]| {
    // The first byte chooses the split points: cut after every `step` bytes.
    let Some((&step, data)) = input.split_first() else { return };
    let step = usize::from(step.max(1));
    let frames: Vec<Bytes> = data.chunks(step).map(Bytes::copy_from_slice).collect();
    assert_eq!(drain(frames.clone(), Injected::default()), data);
    let _ = drain(frames, Injected { include_usage: true, continuous_usage: true });
});
