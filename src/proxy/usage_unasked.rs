//! Whether an upstream sends usage to streams that did not ask for it, and asking it.
//!
//! sglang `--stream-response-default-include-usage` sends the final usage chunk to every stream;
//! vLLM `--enable-force-include-usage` sends usage on every chunk and the final usage chunk to
//! every stream. tokentap must then leave that usage to the client (it is the server's, not
//! tokentap's injection): the proxy passes [`Upstream::server_usage`] to
//! `stream::request::injection`. The setting is per upstream (`sends_usage_unasked`: `"final"`,
//! `"every_chunk"`); with `"auto"` a background task asks sglang, which says so in
//! `/server_info` (`/get_server_info` before 0.4.7) as `stream_response_default_include_usage`
//! (meaning `"final"`), at start and every [`RECHECK`] (a restart may change the flag). vLLM
//! does not expose its flag over HTTP: there `"auto"` stays no, and the operator sets
//! `"every_chunk"`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request};
use http_body_util::BodyExt;

use super::body::RequestBody;
use super::upstream::{Router, Upstream};
use crate::config::UsageUnasked;

/// How often an answered upstream is asked again.
pub const RECHECK: Duration = Duration::from_secs(600);
/// First wait after an upstream did not answer; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);
/// Longest wait for one answer, and the largest body read (sglang's server info is ~20 KB).
const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BODY: usize = 1 << 20;

/// What one ask found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// The server said (sglang): the flag's value.
    Said(bool),
    /// The server answered but does not say (not sglang, or an sglang without the flag).
    Silent,
    /// No answer (down, starting, timed out).
    NoAnswer,
}

/// Reads the flag from a server-info document.
pub fn from_server_info(info: &serde_json::Value) -> Discovery {
    match info
        .get("stream_response_default_include_usage")
        .and_then(serde_json::Value::as_bool)
    {
        Some(flag) => Discovery::Said(flag),
        None => Discovery::Silent,
    }
}

/// Asks `upstream` once, direct (not through the proxy: routing could send the question to
/// another upstream).
pub async fn ask(upstream: &Upstream) -> Discovery {
    let mut answered = false;
    for path in ["/server_info", "/get_server_info"] {
        match get(upstream, path).await {
            Some((200, body)) => {
                return serde_json::from_slice(&body)
                    .map_or(Discovery::Silent, |info| from_server_info(&info));
            }
            Some(_) => answered = true,
            None => {}
        }
    }
    if answered {
        Discovery::Silent
    } else {
        Discovery::NoAnswer
    }
}

/// `GET path` on the upstream: status and body (cut at [`MAX_BODY`]), `None` on any failure.
pub(super) async fn get(upstream: &Upstream, path: &str) -> Option<(u16, Bytes)> {
    let uri = upstream.uri(path).ok()?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .body(RequestBody::Full(None))
        .ok()?;
    let exchange = async {
        let response = upstream.client.request(request).await.ok()?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut bytes = BytesMut::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.ok()?.into_data() {
                let room = MAX_BODY.saturating_sub(bytes.len());
                bytes.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
                if bytes.len() >= MAX_BODY {
                    break;
                }
            }
        }
        Some((status, bytes.freeze()))
    };
    tokio::time::timeout(TIMEOUT, exchange).await.ok().flatten()
}

/// Starts one background task per `"auto"` upstream. Each holds only a weak reference, so it
/// ends when the proxy is dropped.
pub fn spawn_discovery(router: &Router) {
    for upstream in router.all() {
        if upstream.config.sends_usage_unasked != UsageUnasked::Auto {
            continue;
        }
        let weak = Arc::downgrade(upstream);
        tokio::spawn(discover_forever(weak));
    }
}

async fn discover_forever(upstream: Weak<Upstream>) {
    let mut retry = RETRY_FIRST;
    loop {
        let wait = {
            let Some(upstream) = upstream.upgrade() else {
                return;
            };
            match ask(&upstream).await {
                Discovery::Said(flag) => {
                    let before = upstream.usage_unasked.swap(flag, Ordering::Relaxed);
                    if before != flag {
                        tracing::info!(
                            upstream = %upstream.name,
                            sends_usage_unasked = flag,
                            "the server says whether it sends usage unasked (stream_response_default_include_usage)"
                        );
                    }
                    retry = RETRY_FIRST;
                    RECHECK
                }
                Discovery::Silent => {
                    retry = RETRY_FIRST;
                    RECHECK
                }
                Discovery::NoAnswer => {
                    let wait = retry;
                    retry = (retry * 2).min(RETRY_MAX);
                    wait
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sglangs_flag_and_nothing_else() {
        let said = |v: serde_json::Value| from_server_info(&v);
        assert_eq!(
            said(
                serde_json::json!({"stream_response_default_include_usage": true, "version": "0.5.6"})
            ),
            Discovery::Said(true)
        );
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": false})),
            Discovery::Said(false)
        );
        assert_eq!(
            said(serde_json::json!({"version": "0.4.0"})),
            Discovery::Silent
        );
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": "yes"})),
            Discovery::Silent
        );
    }
}
