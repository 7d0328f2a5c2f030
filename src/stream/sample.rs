//! Sample event streams in the exact shapes sglang sends, one frame per event as its HTTP
//! server writes them, and the metered body around a prepared upstream body. Used by the
//! benchmarks, the allocation tests, the replay tests and the examples in docs.

use bytes::Bytes;

/// An sglang `/v1/chat/completions` stream: role chunk, `events` content chunks of
/// `tokens_per_event` tokens each, finish chunk, the usage chunk when `include_usage`, and
/// `[DONE]`. With `continuous_usage` every content chunk carries cumulative usage.
pub fn sglang_chat(
    events: usize,
    tokens_per_event: u64,
    continuous_usage: bool,
    include_usage: bool,
) -> Vec<Bytes> {
    const ID: &str = "9c1e4b7f2a6d4e1f8b3a5c7d9e0f1a2b";
    let head = format!(
        r#"data: {{"id":"{ID}","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":["#
    );
    let usage = |completion: u64| {
        format!(
            r#""usage":{{"prompt_tokens":8192,"total_tokens":{},"completion_tokens":{completion},"prompt_tokens_details":null,"reasoning_tokens":0,"completion_tokens_details":null}}"#,
            8192 + completion
        )
    };
    let mut frames = Vec::with_capacity(events + 4);
    frames.push(Bytes::from(format!(
        r#"{head}{{"index":0,"delta":{{"reasoning_content":null,"role":"assistant","content":""}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]}}"#
    ) + "\n\n"));
    let words = [
        " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog",
    ];
    let mut completion = 0;
    for i in 0..events {
        completion += tokens_per_event;
        let text: String = (0..tokens_per_event)
            .map(|t| words[(i + t as usize) % words.len()])
            .collect();
        let tail = if continuous_usage {
            format!(",{}", usage(completion))
        } else {
            String::new()
        };
        frames.push(Bytes::from(format!(
            r#"{head}{{"index":0,"delta":{{"reasoning_content":null,"content":"{text}"}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]{tail}}}"#
        ) + "\n\n"));
    }
    frames.push(Bytes::from(format!(
        r#"{head}{{"index":0,"delta":{{"reasoning_content":null}},"logprobs":null,"finish_reason":"length","matched_stop":null}}]}}"#
    ) + "\n\n"));
    if include_usage {
        frames.push(Bytes::from(format!(
            r#"data: {{"id":"{ID}","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B","choices":[],{}}}"#,
            usage(completion)
        ) + "\n\n"));
    }
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// A body that yields prepared frames and is always ready: the upstream of benchmarks and
/// allocation tests, where sockets would only add noise.
#[derive(Debug, Default)]
pub struct Frames(pub std::collections::VecDeque<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// A production chat-completions request on `meter`, its response body `frames` wrapped in the
/// metering body exactly as the proxy wraps an upstream's body.
pub fn metered_chat_body(
    frames: impl IntoIterator<Item = Bytes>,
    meter: &std::sync::Arc<crate::meter::Meter>,
    injected: super::rewrite::Injected,
) -> super::body::MeteredBody<Frames> {
    metered_body(
        crate::base::Route::ChatCompletions,
        200,
        true,
        frames,
        meter,
        injected,
    )
}

/// A production request on `route` whose upstream answered `status` with `frames` (an event
/// stream when `event_stream`), wrapped in the metering body exactly as the proxy wraps an
/// upstream's body: the replay tests feed real engine captures through it.
pub fn metered_body(
    route: crate::base::Route,
    status: u16,
    event_stream: bool,
    frames: impl IntoIterator<Item = Bytes>,
    meter: &std::sync::Arc<crate::meter::Meter>,
    injected: super::rewrite::Injected,
) -> super::body::MeteredBody<Frames> {
    use super::body::{MeteredBody, Metering, MeteringOptions};
    let mut request = meter.begin(
        crate::meter::RequestLabels {
            route,
            source: crate::base::Source::Production,
            model: std::sync::Arc::from("m"),
            asked_model: None,
            upstream: std::sync::Arc::from("u"),
            tag: None,
            fingerprint: crate::meter::identity::FingerprintId::UNKNOWN,
            slice: Default::default(),
        },
        tokio::time::Instant::now(),
    );
    request.set_status(status);
    let metering = Metering::new(
        request,
        MeteringOptions {
            route,
            event_stream,
            injected,
            max_event_bytes: 1 << 16,
            max_body_bytes: 1 << 16,
            encoded: false,
            timing: None,
            held_budget: None,
            length: None,
        },
    );
    MeteredBody::new(Frames(frames.into_iter().collect()), Some(metering))
}
