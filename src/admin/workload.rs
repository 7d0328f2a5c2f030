//! `GET /workload?window=1h&format=tokentap|mooncake`: the captured production workload as a
//! trace (docs/workload.md); 404 with a hint when `[workload] capture` is off.
//!
//! The export streams: a blocking task reads the capture page by page on a read-only
//! connection of its own (never the store's mutex, so the page and `/matrix` answer while it
//! runs) and hands each chunk to the response through a channel of
//! [`EXPORT_CHANNEL_CHUNKS`]: a slow client makes the reader wait, a client that stops reading
//! is cut at the admin listener's send-stall deadline, one that hangs up stops the reader. At
//! most `workload.max_exports` run at once; one more is answered 503 with `Retry-After`,
//! counted in `tokentap_workload_exports_refused_total` (docs/operations.md).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use tokio::sync::mpsc;

use crate::net::streams::StreamWatch;
use crate::proxy::body::ResponseBody;
use crate::proxy::timeout::BrokenOff;
use crate::workload::export::{write_export, EXPORT_CHANNEL_CHUNKS};
use crate::workload::TraceFormat;

use super::state::{json_error, AdminState};

const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// What a refused export is told to wait before asking again.
pub const RETRY_AFTER_SECONDS: u32 = 5;

pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let Some(capture) = &state.workload else {
        return json_error(
            StatusCode::NOT_FOUND,
            "the workload capture is off: set [workload] capture = true",
        );
    };
    let mut window = DEFAULT_WINDOW;
    let mut format = TraceFormat::Tokentap;
    for pair in request.uri().query().unwrap_or("").split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "" => {}
            "window" => match crate::base::duration::parse_duration(value) {
                Ok(w) => window = w,
                Err(m) => return json_error(StatusCode::BAD_REQUEST, &format!("window: {m}")),
            },
            "format" => {
                format = match value {
                    "tokentap" => TraceFormat::Tokentap,
                    "mooncake" => TraceFormat::Mooncake,
                    "aiperf" => TraceFormat::Aiperf,
                    "bailian" => TraceFormat::Bailian,
                    _ => {
                        return json_error(
                            StatusCode::BAD_REQUEST,
                            "format: one of tokentap, mooncake, aiperf, bailian",
                        )
                    }
                }
            }
            _ => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    "unknown parameter: /workload takes window and format",
                )
            }
        }
    }
    let slot = match capture.export_slot() {
        Ok(slot) => slot,
        Err(max) => {
            let mut response = json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "{max} workload export(s) already running, the most at once \
                     (workload.max_exports = {max}); retry when one has finished"
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            return response;
        }
    };
    let mut rows = match capture.export_rows(window).await {
        Ok(rows) => rows,
        Err(error) => {
            return json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot read the captured workload: {error:#}"),
            )
        }
    };
    let (sender, chunks) = mpsc::channel::<Result<Bytes, BrokenOff>>(EXPORT_CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        // The slot is held until the last row is written or the client has gone.
        let _slot = slot;
        let written = write_export(&mut rows, format, |chunk| {
            sender.blocking_send(Ok(Bytes::from(chunk))).is_ok()
        });
        if let Err(error) = written {
            tracing::warn!(error = %error, "the workload export broke off: cannot read the capture");
            let _ = sender.blocking_send(Err(BrokenOff));
        }
    });
    let watch = request
        .extensions()
        .get::<StreamWatch>()
        .map(|StreamWatch(watch)| std::sync::Arc::clone(watch));
    let mut response = Response::new(ResponseBody::channel(chunks, watch));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    response
}
