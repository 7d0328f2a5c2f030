//! `GET /workload?window=1h&format=tokentap|mooncake`: the captured production workload as a
//! trace (docs/workload.md); 404 with a hint when `[workload] capture` is off.

use std::time::Duration;

use http::{Request, StatusCode};

use crate::proxy::body::ResponseBody;
use crate::workload::{render, TraceFormat};

use super::{json_error, respond, AdminState};

const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> http::Response<ResponseBody> {
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
                    _ => {
                        return json_error(
                            StatusCode::BAD_REQUEST,
                            "format: one of tokentap, mooncake",
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
    match capture.export(window).await {
        Ok(trace) => respond(
            StatusCode::OK,
            "application/x-ndjson",
            render(&trace, format),
        ),
        Err(error) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot read the captured workload: {error:#}"),
        ),
    }
}
