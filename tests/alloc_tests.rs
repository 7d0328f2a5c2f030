//! The hot path allocates nothing per event. A counting allocator counts heap allocations
//! while a stream is forwarded, and the count must not grow with the number of events (beyond
//! what a request makes once, whenever it comes: its histograms' bucket arrays): per
//! thread, while a metered body forwards a long stream (the metering alone); process-wide,
//! while a whole `tokentap serve` proxy forwards a stream from a raw TCP upstream to a raw
//! TCP client over loopback, event by event (hyper's two connections, the runtime and the
//! metering together; the upstream and the client allocate nothing per event themselves).
#![allow(
    unsafe_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "the counting global allocator (GlobalAlloc is unsafe to implement); tests and benches fail loudly on what they assert"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http_body::Body;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::Meter;
use tokentap::stream::rewrite::Injected;
use tokentap::stream::sample::{metered_chat_body, sglang_chat};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Every thread's allocations.
static ALL_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The process-wide count is disturbed by any other test running: one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALL_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALL_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
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

/// Allocations a request's metering may make late, once each: its two histograms' arrays.
const HISTOGRAM_ARRAYS: u64 = 2;

#[test]
fn forwarding_allocates_nothing_per_event() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
        // A request's two histograms (inter-token gap, time per frame) each allocate their
        // bucket array once, when a value first falls outside the bucket their values were
        // staged in (`meter::timeline::LocalHistogram`): the times here are real, so a longer
        // stream may need one the short one never did. Once per request, never per event.
        assert!(
            long <= short + HISTOGRAM_ARRAYS,
            "{name}: 4,990 more events cost {} more allocations ({short} for 10 events, {long} for 5,000)",
            long as i64 - short as i64
        );
    }
}

/// One streamed chat completion through a running proxy, event by event: the upstream writes
/// event `i + 1` only once the client has received event `i`, so every event is a read, a
/// frame and a write of its own. Answers the process's allocations between the client's
/// first and last content event.
async fn proxy_one_stream(
    proxy: std::net::SocketAddr,
    upstream: &TcpListener,
    events: usize,
) -> u64 {
    let received = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(Notify::new());
    // Built before the measurement: the upstream's chunks and the client's request.
    let chunks: Vec<Vec<u8>> = (0..events)
        .map(|i| {
            let data = format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}},\"finish_reason\":null}}]}}\n\n"
            );
            format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
        })
        .collect();
    let tail = {
        let finish = format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{events},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
            events + 5
        );
        format!("{:x}\r\n{finish}\r\n0\r\n\r\n", finish.len()).into_bytes()
    };
    let body = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );

    let mut client = TcpStream::connect(proxy).await.unwrap();
    client.set_nodelay(true).unwrap();
    client.write_all(request.as_bytes()).await.unwrap();

    let serving = {
        let (received, progress) = (Arc::clone(&received), Arc::clone(&progress));
        let (mut conn, _) = upstream.accept().await.unwrap();
        async move {
            conn.set_nodelay(true).unwrap();
            let mut head = vec![0u8; 64 * 1024];
            let mut got = 0;
            // The request whole: its head and its body end with the JSON's last brace.
            while !head[..got].ends_with(b"}]}") {
                let n = conn.read(&mut head[got..]).await.unwrap();
                assert!(n > 0, "the proxy closed before the request was whole");
                got += n;
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            for (i, chunk) in chunks.iter().enumerate() {
                while received.load(Ordering::Acquire) < i {
                    let notified = progress.notified();
                    if received.load(Ordering::Acquire) >= i {
                        break;
                    }
                    notified.await;
                }
                conn.write_all(chunk).await.unwrap();
            }
            while received.load(Ordering::Acquire) < events {
                let notified = progress.notified();
                if received.load(Ordering::Acquire) >= events {
                    break;
                }
                notified.await;
            }
            conn.write_all(&tail).await.unwrap();
            // Closed once the caller is done: each stream comes on a connection of its own.
            conn
        }
    };
    let upstream_task = tokio::spawn(serving);

    // Count content events as they arrive (each ends in a blank line), allocating nothing.
    let mut buffer = vec![0u8; 64 * 1024];
    let (mut events_seen, mut newlines, mut before) = (0usize, 0u8, 0u64);
    let mut after = None;
    let mut in_head = true;
    let mut total_blocks = 0usize;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(20), client.read(&mut buffer))
            .await
            .expect("the stream stalled")
            .unwrap();
        assert!(
            n > 0,
            "the proxy closed the stream after {events_seen} events"
        );
        for &byte in &buffer[..n] {
            match byte {
                b'\n' => newlines += 1,
                b'\r' => {}
                _ => newlines = 0,
            }
            if newlines == 2 {
                newlines = 0;
                if in_head {
                    in_head = false;
                    continue;
                }
                total_blocks += 1;
                if total_blocks <= events {
                    events_seen = total_blocks;
                    if events_seen == 1 {
                        before = ALL_ALLOCATIONS.load(Ordering::Relaxed);
                    }
                    if events_seen == events {
                        after = Some(ALL_ALLOCATIONS.load(Ordering::Relaxed));
                    }
                    received.store(events_seen, Ordering::Release);
                    progress.notify_one();
                }
            }
        }
        // The finish chunk, the usage chunk and [DONE] follow the content events.
        if total_blocks >= events + 3 {
            break;
        }
    }
    let _kept = upstream_task.await.unwrap();
    after.unwrap() - before
}

#[test]
fn a_proxied_stream_allocates_nothing_per_event() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // On the shared runtime, and with the connection on a worker of its own (`proxy.workers`).
    runtime.block_on(proxied_stream_allocates_nothing_per_event(0));
    runtime.block_on(proxied_stream_allocates_nothing_per_event(1));
}

async fn proxied_stream_allocates_nothing_per_event(workers: usize) {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = tokentap::config::ConfigLoader::new()
        .text(
            &format!(
                "[proxy]\nworkers = {workers}\n[upstream]\nurl = \"http://{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"m\"\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"0s\"\n",
                upstream.local_addr().unwrap()
            ),
            "test.toml",
        )
        .unwrap()
        .load()
        .unwrap();
    let server = tokentap::app::serve::ProxyServer::start_on(
        config,
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .await
    .unwrap();
    // A first stream warms what is made once (the pool's connection, the meter's cells).
    proxy_one_stream(server.proxy_addr, &upstream, 20).await;
    let short = proxy_one_stream(server.proxy_addr, &upstream, 20).await;
    let long = proxy_one_stream(server.proxy_addr, &upstream, 2_020).await;
    // Per event, hyper once allocated a fresh 8 KiB read buffer and its shared header (two
    // allocations per event: 4,000 here). What remains may be background work that ran
    // during the longer stream (timers, not events): well under one allocation per 20 events.
    assert!(
        long <= short + 100,
        "workers = {workers}: 2,000 more events cost {} more allocations ({short} for 20 events, {long} for 2,020)",
        long as i64 - short as i64
    );
}
