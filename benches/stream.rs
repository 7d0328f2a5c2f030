//! The hot path, measured: SSE scanning + classification throughput, and the metered body
//! against the bare body over the same frames (the ratio is the metering overhead), plus heap
//! allocations per event counted by a counting allocator. Per request: reading a metered
//! request body (the baseline every metered request pays) against the same read plus the
//! workload capture's salted prefix fingerprint.
//!
//! Run: `cargo bench --bench stream` (see docs/benchmarks.md and scripts/bench.sh).
#![allow(
    unsafe_code,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "the counting global allocator (GlobalAlloc is unsafe to implement); tests and benches fail loudly on what they assert"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http_body::Body;
use tokentap::base::Route;
use tokentap::config::RoutePolicyConfig;
use tokentap::meter::buckets::{Ladder, DEFAULT_CONCURRENCY, DEFAULT_CONTEXTS};
use tokentap::meter::Meter;
use tokentap::proxy::answers::Answers;
use tokentap::proxy::routes::RoutePolicy;
use tokentap::stream::body::MeteredBody;
use tokentap::stream::classify::EventClassifier;
use tokentap::stream::fingerprint::PrefixSalt;
use tokentap::stream::request::inspect;
use tokentap::stream::rewrite::Injected;
use tokentap::stream::sample::{metered_chat_body, sglang_chat, Frames};
use tokentap::stream::sse::SseScanner;

/// Counts allocations so the bench can report allocations per event.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn drain<B: Body<Data = Bytes> + Unpin>(body: &mut B) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut bytes = 0;
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut *body).poll_frame(&mut cx) {
        if let Ok(data) = frame.into_data() {
            bytes += data.len();
        }
    }
    bytes
}

fn metered(frames: &[Bytes], meter: &Arc<Meter>, injected: Injected) -> MeteredBody<Frames> {
    metered_chat_body(frames.iter().cloned(), meter, injected)
}

fn meter() -> Arc<Meter> {
    Meter::new(
        Ladder::contexts(&DEFAULT_CONTEXTS).unwrap(),
        Ladder::concurrency(&DEFAULT_CONCURRENCY).unwrap(),
    )
}

/// Allocations per event of the steady state: a long stream minus a short one, so the
/// per-request setup cancels out.
fn allocations_per_event(injected: Injected, continuous: bool) -> f64 {
    let meter = meter();
    let count = |events: usize| {
        let frames = sglang_chat(events, 1, continuous, injected.include_usage);
        let mut body = metered(&frames, &meter, injected);
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        drain(&mut body);
        drop(body);
        ALLOCATIONS.load(Ordering::Relaxed) - before
    };
    let (short, long) = (count(100), count(4100));
    (long as f64 - short as f64) / 4000.0
}

fn bench(c: &mut Criterion) {
    const EVENTS: usize = 4096;
    let plain = sglang_chat(EVENTS, 1, false, false);
    let continuous = sglang_chat(EVENTS, 1, true, true);
    let bytes: usize = continuous.iter().map(Bytes::len).sum();

    let mut group = c.benchmark_group("scan+classify");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("sglang chat, continuous usage", |b| {
        b.iter(|| {
            let mut scanner = SseScanner::new(1 << 20);
            let mut classifier = EventClassifier::new(Route::ChatCompletions);
            let mut tokens = 0;
            for frame in &continuous {
                scanner.feed(frame, |block| {
                    if let Some(data) = block.event.data {
                        tokens += classifier.observe(block.event.name, data).tokens;
                    }
                });
            }
            tokens
        })
    });
    group.finish();

    let mut group = c.benchmark_group("body");
    group.throughput(Throughput::Elements(EVENTS as u64));
    let meter = meter();
    group.bench_function(BenchmarkId::new("bare", bytes), |b| {
        b.iter_batched(
            || Frames(continuous.iter().cloned().collect()),
            |mut body| drain(&mut body),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function(BenchmarkId::new("metered", bytes), |b| {
        b.iter_batched(
            || metered(&plain, &meter, Injected::default()),
            |mut body| drain(&mut body),
            criterion::BatchSize::SmallInput,
        )
    });
    // The same frames as the strip case below, asked for by the client: what a benchmark client
    // (or the overhead bench) costs, usage read on every event and nothing rewritten.
    group.bench_function(BenchmarkId::new("metered, usage asked", bytes), |b| {
        b.iter_batched(
            || metered(&continuous, &meter, Injected::default()),
            |mut body| drain(&mut body),
            criterion::BatchSize::SmallInput,
        )
    });
    let both = Injected {
        include_usage: true,
        continuous_usage: true,
    };
    group.bench_function(BenchmarkId::new("metered+strip usage", bytes), |b| {
        b.iter_batched(
            || metered(&continuous, &meter, both),
            |mut body| drain(&mut body),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();

    println!(
        "allocations per event: metered {:.4}, metered+strip usage {:.4}",
        allocations_per_event(Injected::default(), false),
        allocations_per_event(both, true)
    );
}

/// A chat request with an 8K-token prompt (≈ 32 KiB of text), as a client sends it.
fn chat_request() -> Vec<u8> {
    let words = [
        "river ", "stone ", "lantern ", "orbit ", "meadow ", "copper ",
    ];
    let mut text = String::new();
    let mut i = 0usize;
    while text.len() < 32 * 1024 {
        text.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    serde_json::json!({
        "model": "m",
        "stream": true,
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": text},
        ],
    })
    .to_string()
    .into_bytes()
}

fn bench_request(c: &mut Criterion) {
    let body = chat_request();
    let salt = PrefixSalt::from_secret(b"bench");
    let mut group = c.benchmark_group("request");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("inspect", body.len()), |b| {
        b.iter(|| inspect(Route::ChatCompletions, &body))
    });
    group.bench_function(BenchmarkId::new("inspect+fingerprint", body.len()), |b| {
        b.iter(|| {
            let facts = inspect(Route::ChatCompletions, &body)?;
            let prompt = facts.prompt?;
            Some(salt.fingerprint(prompt.bytes(&body)))
        })
    });
    // The default route policy's check, which every request passes (`proxy.routes = "safe"`:
    // the path against every engine's route table).
    // An upstream that has not said what it is: every table of every engine.
    let safe = RoutePolicy::from_config(&RoutePolicyConfig::Safe);
    let unknown = tokentap::proxy::answers::RouteFacts::default();
    group.bench_function("route check, /v1/chat/completions", |b| {
        b.iter(|| {
            safe.check(
                "POST",
                std::hint::black_box("/v1/chat/completions"),
                &unknown,
            )
        })
    });
    // Which engine a read's answers name, from vLLM 0.32's own metrics page: every POST asked
    // it until 2026-12-04 (the guard on fields run as code); now once per read.
    let page = include_str!("../tests/fixtures/engines/vllm-0.32.0/describe/metrics.txt");
    let answers = Answers {
        metrics: Some(page.to_owned()),
        ..Answers::default()
    };
    group.bench_function(
        BenchmarkId::new("engine of a read, vLLM metrics page", page.len()),
        |b| b.iter(|| answers.engine()),
    );
    group.finish();
}

criterion_group!(benches, bench, bench_request);
criterion_main!(benches);
