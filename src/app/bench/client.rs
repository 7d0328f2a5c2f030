//! The self-check's client: N concurrent streamed chat completions to one base URL, each read
//! event by event as it arrives, and what each stream saw (status, time to the first content
//! event, the gaps between content events, a digest of its content in order, `[DONE]`).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long one stream may take before it counts as failed.
const STREAM_LIMIT: Duration = Duration::from_secs(120);

/// What one stream saw.
#[derive(Debug, Clone, Default)]
pub struct StreamSample {
    /// Which stream of the round (its prompt names it, so the same index asks the same thing).
    pub index: u32,
    /// 200, the events parsed, `[DONE]` arrived, within the time limit.
    pub complete: bool,
    /// Request sent → first event with content.
    pub ttft: Option<Duration>,
    /// Between consecutive events with content.
    pub gaps: Vec<Duration>,
    /// Every SSE event (`data:` payload), `[DONE]` included: what the proxy forwarded.
    pub events: u64,
    /// Events with content.
    pub content_events: u64,
    /// FNV-1a of the content deltas, in order: a lost, repeated or reordered frame changes it.
    pub content_digest: u64,
    /// Why the stream is not complete, when it is not.
    pub error: Option<String>,
}

/// One round's streams to one base URL.
pub struct Round<'a> {
    pub base_url: &'a str,
    pub model: &'a str,
    pub streams: u32,
    pub tokens: u32,
}

impl Round<'_> {
    /// Starts every stream at once and waits for all of them.
    pub async fn run(&self) -> Vec<StreamSample> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let uri = format!(
            "{}/v1/chat/completions",
            self.base_url.trim_end_matches('/')
        );
        let mut tasks = JoinSet::new();
        for index in 0..self.streams {
            let body = request_body(self.model, index, self.tokens);
            let (client, uri) = (client.clone(), uri.clone());
            tasks.spawn(async move {
                match tokio::time::timeout(STREAM_LIMIT, one_stream(&client, &uri, body, index))
                    .await
                {
                    Ok(sample) => sample,
                    Err(_) => StreamSample {
                        index,
                        error: Some(format!("no [DONE] within {}s", STREAM_LIMIT.as_secs())),
                        ..StreamSample::default()
                    },
                }
            });
        }
        let mut samples = Vec::with_capacity(self.streams as usize);
        while let Some(joined) = tasks.join_next().await {
            if let Ok(sample) = joined {
                samples.push(sample);
            }
        }
        samples.sort_by_key(|sample| sample.index);
        samples
    }
}

/// The chat request of stream `index`: a prompt that names the stream (the same index asks the
/// same question on every path), `max_tokens` with `ignore_eos` so every stream runs its length,
/// greedy, usage asked.
pub fn request_body(model: &str, index: u32, tokens: u32) -> String {
    let model = serde_json::Value::String(model.to_owned());
    format!(
        "{{\"model\":{model},\"messages\":[{{\"role\":\"user\",\"content\":\"tokentap bench, stream {index}: count slowly.\"}}],\"max_tokens\":{tokens},\"ignore_eos\":true,\"temperature\":0,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"
    )
}

async fn one_stream(
    client: &Client<HttpConnector, Full<Bytes>>,
    uri: &str,
    body: String,
    index: u32,
) -> StreamSample {
    let mut sample = StreamSample {
        index,
        content_digest: FNV_OFFSET,
        ..StreamSample::default()
    };
    let request = match Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
    {
        Ok(request) => request,
        Err(error) => {
            sample.error = Some(format!("bad request URL {uri}: {error}"));
            return sample;
        }
    };
    let sent = Instant::now();
    let response = match client.request(request).await {
        Ok(response) => response,
        Err(error) => {
            sample.error = Some(format!("request failed: {error}"));
            return sample;
        }
    };
    if response.status() != StatusCode::OK {
        sample.error = Some(format!("status {}", response.status()));
        return sample;
    }
    let mut body = response.into_body();
    let mut reader = EventReader::default();
    let mut last_content: Option<Instant> = None;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                sample.error = Some(format!("body failed: {error}"));
                return sample;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let arrived = Instant::now();
        reader.push(&data);
        while let Some(payload) = reader.next_payload() {
            sample.events += 1;
            if payload.as_ref() == b"[DONE]" {
                done = true;
                continue;
            }
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(&payload) else {
                sample.error = Some("an event that is not JSON".to_owned());
                return sample;
            };
            let Some(content) = content_of(&event).filter(|text| !text.is_empty()) else {
                continue;
            };
            sample.content_events += 1;
            sample.content_digest = fnv1a(sample.content_digest, content.as_bytes());
            // A separator, so "ab"+"c" and "a"+"bc" differ.
            sample.content_digest = fnv1a(sample.content_digest, &[0xff]);
            match last_content {
                None => sample.ttft = Some(arrived - sent),
                Some(previous) => sample.gaps.push(arrived - previous),
            }
            last_content = Some(arrived);
        }
    }
    if done && sample.content_events == 0 {
        sample.error = Some("the stream carried no generated text".to_owned());
    } else if done {
        sample.complete = true;
    } else {
        sample.error = Some("the stream ended without [DONE]".to_owned());
    }
    sample
}

/// The generated text of an event: a chat chunk's `choices[0].delta` content or reasoning
/// (sglang's and vLLM's reasoning parsers stream thinking as `reasoning_content` or
/// `reasoning`), or a completion's `choices[0].text`.
fn content_of(event: &serde_json::Value) -> Option<&str> {
    let choice = event.get("choices")?.get(0)?;
    fn text(value: Option<&serde_json::Value>) -> Option<&str> {
        value
            .and_then(|v| v.as_str())
            .filter(|text| !text.is_empty())
    }
    match choice.get("delta") {
        Some(delta) => text(delta.get("content"))
            .or_else(|| text(delta.get("reasoning_content")))
            .or_else(|| text(delta.get("reasoning"))),
        None => text(choice.get("text")),
    }
}

/// Splits an SSE byte stream into its `data:` payloads, across any frame boundaries.
#[derive(Default)]
struct EventReader {
    pending: BytesMut,
}

impl EventReader {
    fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next complete event's `data:` payload (events without one are skipped).
    fn next_payload(&mut self) -> Option<Bytes> {
        loop {
            let end = self.pending.windows(2).position(|w| w == b"\n\n")?;
            let event = self.pending.split_to(end + 2).freeze();
            let data = event
                .split(|&byte| byte == b'\n')
                .find_map(|line| line.strip_prefix(b"data:"))
                .map(|payload| payload.trim_ascii());
            if let Some(payload) = data {
                return Some(event.slice_ref(payload));
            }
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events split anywhere between frames come out whole, in order; events without data are
    /// skipped.
    #[test]
    fn events_are_read_across_any_frame_split() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut reader = EventReader::default();
            let mut payloads = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                reader.push(part);
                while let Some(payload) = reader.next_payload() {
                    payloads.push(payload);
                }
            }
            assert_eq!(
                payloads,
                [
                    Bytes::from_static(b"{\"a\":1}"),
                    Bytes::from_static(b"[DONE]")
                ],
                "split at {split}"
            );
        }
    }

    #[test]
    fn content_comes_from_chat_deltas_and_completion_text() {
        let chat: serde_json::Value =
            serde_json::from_str(r#"{"choices":[{"delta":{"content":"hi"}}]}"#).unwrap();
        let text: serde_json::Value =
            serde_json::from_str(r#"{"choices":[{"text":"yo"}]}"#).unwrap();
        let usage: serde_json::Value =
            serde_json::from_str(r#"{"choices":[],"usage":{"completion_tokens":3}}"#).unwrap();
        let thinking: serde_json::Value = serde_json::from_str(
            r#"{"choices":[{"delta":{"reasoning_content":" count","content":null}}]}"#,
        )
        .unwrap();
        let role: serde_json::Value =
            serde_json::from_str(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#)
                .unwrap();
        assert_eq!(content_of(&thinking), Some(" count"));
        assert_eq!(content_of(&role), None);
        assert_eq!(content_of(&chat), Some("hi"));
        assert_eq!(content_of(&text), Some("yo"));
        assert_eq!(content_of(&usage), None);
    }
}
