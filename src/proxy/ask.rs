//! Asking an upstream about itself: one `GET` sent direct (not through the proxy, whose routing
//! could send the question to another upstream), bounded by a deadline and a body size. The
//! background tasks that read the server's self-description (`describe`, the one reader)
//! share it, so none of them can stall on a server that never answers.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request};
use http_body_util::BodyExt;

use super::body::RequestBody;
use super::upstream::Upstream;

/// Longest wait for one answer, head and body together. sglang answers `/server_info` only
/// after a round trip to its scheduler, which a busy (or, in the conformance stack, a fake)
/// scheduler may never make; everything else it answers from the HTTP process at once.
pub const DEADLINE: Duration = Duration::from_secs(3);
/// The largest body read (sglang's server info is ~20 KB).
pub const MAX_BODY: usize = 1 << 20;

/// `GET path` on the upstream: the status of its response head, received within `deadline`
/// (the body is not read: the connection is closed); `None` on any failure or past it.
pub async fn head(upstream: &Upstream, path: &str, deadline: Duration) -> Option<u16> {
    let uri = upstream.uri(path).ok()?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .body(RequestBody::Full(None))
        .ok()?;
    let response = tokio::time::timeout(deadline, upstream.send(request))
        .await
        .ok()?
        .ok()?;
    Some(response.status().as_u16())
}

/// `GET path` on the upstream: status and body (cut at [`MAX_BODY`]); `None` on any failure or
/// past `deadline`.
pub async fn get(upstream: &Upstream, path: &str, deadline: Duration) -> Option<(u16, Bytes)> {
    let uri = upstream.uri(path).ok()?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .body(RequestBody::Full(None))
        .ok()?;
    let exchange = async {
        let response = upstream.send(request).await.ok()?;
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
    tokio::time::timeout(deadline, exchange)
        .await
        .ok()
        .flatten()
}
