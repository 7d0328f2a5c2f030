//! Small requests through the proxy's own data path: server facts, `/metrics` scrapes,
//! `/abort_request`, `/tokenize`. They pass through [`Proxy::handle`] like any client's (the
//! seed tool learned the hard way that a proxy must pass `/metrics` and `/get_server_info`
//! through), with a timeout and a cap on the body read.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::proxy::Proxy;

/// Largest body read from a control request (a `/metrics` page or server info).
pub const MAX_CONTROL_BODY: usize = 4 << 20;

/// Why a control request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{method} {path}: no answer within {after:?}")]
    Timeout {
        method: Method,
        path: String,
        after: Duration,
    },
    #[error("{method} {path}: the response body broke off")]
    Body {
        method: Method,
        path: String,
        #[source]
        source: crate::proxy::timeout::IdleError<crate::proxy::inline_pool::UpstreamBodyError>,
    },
    #[error("{method} {path}: cannot build the request")]
    Build {
        method: Method,
        path: String,
        #[source]
        source: http::Error,
    },
}

/// An answer: status and body (cut at [`MAX_CONTROL_BODY`]).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    pub fn ok(&self) -> bool {
        self.status.is_success()
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        if !self.ok() {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request through the proxy and reads the answer (bounded in time and size).
pub async fn call(
    proxy: &Arc<Proxy>,
    method: Method,
    path: &str,
    body: Option<Bytes>,
    timeout: Duration,
) -> Result<Answer, CallError> {
    let mut builder = Request::builder().method(method.clone()).uri(path);
    if body.is_some() {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    // tokentap's own call: not a client's, so the route policy does not apply.
    builder = builder.extension(crate::proxy::routes::Internal);
    let request = builder
        .body(Full::new(body.unwrap_or_default()))
        .map_err(|source| CallError::Build {
            method: method.clone(),
            path: path.to_owned(),
            source,
        })?;
    let exchange = async {
        let response = Arc::clone(proxy).handle(request).await;
        let status = response.status();
        let mut body = response.into_body();
        let mut bytes = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|source| CallError::Body {
                method: method.clone(),
                path: path.to_owned(),
                source,
            })?;
            if let Ok(data) = frame.into_data() {
                let room = MAX_CONTROL_BODY.saturating_sub(bytes.len());
                bytes.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
                if bytes.len() >= MAX_CONTROL_BODY {
                    break;
                }
            }
        }
        Ok(Answer {
            status,
            body: bytes.freeze(),
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(CallError::Timeout {
            method,
            path: path.to_owned(),
            after: timeout,
        }),
    }
}

/// `GET path`, `None` on any failure or non-2xx status.
pub async fn get_ok(proxy: &Arc<Proxy>, path: &str, timeout: Duration) -> Option<Answer> {
    call(proxy, Method::GET, path, None, timeout)
        .await
        .ok()
        .filter(Answer::ok)
}
