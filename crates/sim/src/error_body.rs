//! Every error body the simulator sends, written in one place ([`write_error`]) in the shape
//! of the server and API it imitates, and [`Reply`], a whole response (status, content type,
//! bytes) before it becomes an HTTP response. Pure: no I/O, no response types.
use http::StatusCode;

use super::json_out::push_json_str;
use super::options::{Dialect, ShedCause};
use super::request::{Api, ApiError};

/// `application/json`.
pub const JSON: &str = "application/json";
/// The content type of every SSE stream.
pub const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";

/// A whole (not streamed) response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn json(status: StatusCode, body: String) -> Reply {
        Reply {
            status,
            content_type: JSON,
            body,
        }
    }

    /// A stream whose every event is known at once (errors found after the status line).
    pub fn event_stream(body: String) -> Reply {
        Reply {
            status: StatusCode::OK,
            content_type: EVENT_STREAM,
            body,
        }
    }

    /// 404 as FastAPI writes it.
    pub fn not_found() -> Reply {
        Reply::json(
            StatusCode::NOT_FOUND,
            error_body(ErrorShape::Detail, "Not Found"),
        )
    }

    /// 405 as FastAPI writes it.
    pub fn method_not_allowed() -> Reply {
        Reply::json(
            StatusCode::METHOD_NOT_ALLOWED,
            error_body(ErrorShape::Detail, "Method Not Allowed"),
        )
    }

    /// 503: the scheduler is gone (the server is shutting down).
    pub fn shutting_down() -> Reply {
        Reply::json(
            StatusCode::SERVICE_UNAVAILABLE,
            error_body(ErrorShape::Unavailable, "the simulator is shutting down"),
        )
    }
}

/// The JSON shapes of an error, one per server convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// sglang's native `/generate`: `{"error":{"message":…}}`.
    SglangNative,
    /// The error event of sglang's streamed `/generate` (the request was refused after the
    /// status line): `{"error":{"message":…,"type":"invalid_request_error","code":400,
    /// "retryable":false}}` (tests/fixtures/engines/sglang-0.5.23/too-long-generate-stream).
    SglangNativeStream,
    /// sglang's OpenAI-compatible `ErrorResponse`: `{"object":"error","message":…,"type":…,
    /// "param":null,"code":400}`.
    SglangOpenAi { kind: &'static str },
    /// vLLM's `ErrorResponse`: `{"error":{"message":…,"type":"BadRequestError","param":…,
    /// "code":400}}`.
    Vllm { param: Option<&'static str> },
    /// The error event inside an OpenAI-shaped stream: vLLM's fields through a plain
    /// `json.dumps`, so with a space after every separator.
    StreamEvent,
    /// Anthropic's `AnthropicErrorResponse`: `{"type":"error","error":{"type":…,"message":…}}`.
    Anthropic { kind: &'static str },
    /// FastAPI's `{"detail":…}`.
    Detail,
    /// The simulator's own 503, in serde_json's sorted key order.
    Unavailable,
}

/// The error body of `shape` carrying `message`.
pub fn error_body(shape: ErrorShape, message: &str) -> String {
    let mut out = String::new();
    write_error(&mut out, shape, message);
    out
}

/// Append the error body of `shape` carrying `message` to `out`.
pub fn write_error(out: &mut String, shape: ErrorShape, message: &str) {
    match shape {
        ErrorShape::SglangNative => {
            out.push_str("{\"error\":{\"message\":");
            push_json_str(out, message);
            out.push_str("}}");
        }
        ErrorShape::SglangNativeStream => {
            out.push_str("{\"error\":{\"message\":");
            push_json_str(out, message);
            out.push_str(",\"type\":\"invalid_request_error\",\"code\":400,\"retryable\":false}}");
        }
        ErrorShape::SglangOpenAi { kind } => {
            out.push_str("{\"object\":\"error\",\"message\":");
            push_json_str(out, message);
            out.push_str(",\"type\":");
            push_json_str(out, kind);
            out.push_str(",\"param\":null,\"code\":400}");
        }
        ErrorShape::Vllm { param } => {
            out.push_str("{\"error\":{\"message\":");
            push_json_str(out, message);
            out.push_str(",\"type\":\"BadRequestError\",\"param\":");
            match param {
                Some(p) => push_json_str(out, p),
                None => out.push_str("null"),
            }
            out.push_str(",\"code\":400}}");
        }
        ErrorShape::StreamEvent => {
            out.push_str("{\"error\": {\"message\": ");
            push_json_str(out, message);
            out.push_str(", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}");
        }
        ErrorShape::Anthropic { kind } => {
            out.push_str("{\"type\":\"error\",\"error\":{\"type\":");
            push_json_str(out, kind);
            out.push_str(",\"message\":");
            push_json_str(out, message);
            out.push_str("}}");
        }
        ErrorShape::Detail => {
            out.push_str("{\"detail\":");
            push_json_str(out, message);
            out.push('}');
        }
        ErrorShape::Unavailable => {
            out.push_str("{\"code\":503,\"message\":");
            push_json_str(out, message);
            out.push_str(",\"object\":\"error\",\"param\":null,\"type\":\"ServiceUnavailable\"}");
        }
    }
}

/// `data: {"error": …}` and `data: [DONE]`: how an OpenAI-shaped stream that already sent
/// its status line reports a refused request.
pub fn write_stream_error(out: &mut String, message: &str) {
    out.push_str("data: ");
    write_error(out, ErrorShape::StreamEvent, message);
    out.push_str("\n\ndata: [DONE]\n\n");
}

/// sglang's streamed `/generate` refusing a request (too long for the context): status 200,
/// the error event, `data: [DONE]`.
pub fn sglang_generate_stream_error(message: &str) -> Reply {
    let mut out = String::from("data: ");
    write_error(&mut out, ErrorShape::SglangNativeStream, message);
    out.push_str("\n\ndata: [DONE]\n\n");
    Reply::event_stream(out)
}

/// sglang's message for a request aborted at a full waiting queue (`_abort_on_queued_limit`).
pub const SGLANG_QUEUE_FULL: &str = "The request queue is full.";
/// sglang's message for the least-preferred waiting request, aborted at a full queue for a
/// preferred arrival under priority scheduling (`_abort_on_queued_limit`).
pub const SGLANG_PREFERRED_ARRIVAL: &str = "The request is aborted by a higher priority request.";
/// vLLM 0.32's `QueueOverflowError` (`--max-num-queued-reqs`).
pub const VLLM_QUEUE_OVERFLOW: &str = "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.";
/// vLLM 0.32's `MaxQueuedTokensError` (`--max-num-queued-tokens`); the reference quotes its
/// first sentence, the second is the queue-overflow one's.
pub const VLLM_MAX_QUEUED_TOKENS: &str = "The engine has reached its prefill token backlog limit. Please try again later or on a different instance.";

/// The 503 an engine answers a request its queue cap refused (protocols.md §10): sglang
/// `/generate` `{"error":{"message":"The request queue is full."}}`, sglang's OpenAI-compatible
/// routes its `ErrorResponse` with `type` the status as text (`create_error_response(…,
/// err_type=str(status))`), vLLM its `ErrorResponse` with the exception's name as `type`.
pub fn shed_reply(dialect: Dialect, api: Api, cause: ShedCause) -> Reply {
    let mut body = String::new();
    let sglang_message = match cause {
        ShedCause::PreferredArrival => SGLANG_PREFERRED_ARRIVAL,
        ShedCause::QueuedRequests | ShedCause::QueuedTokens => SGLANG_QUEUE_FULL,
    };
    match (dialect, api) {
        (Dialect::Sglang, Api::Generate) => {
            write_error(&mut body, ErrorShape::SglangNative, sglang_message)
        }
        (Dialect::Sglang, _) => {
            body.push_str("{\"object\":\"error\",\"message\":");
            push_json_str(&mut body, sglang_message);
            body.push_str(",\"type\":\"503\",\"param\":null,\"code\":503}");
        }
        (Dialect::Vllm, _) => {
            let (kind, message) = match cause {
                // vLLM aborts no waiting request for another: only its queue cap is reached.
                ShedCause::QueuedRequests | ShedCause::PreferredArrival => {
                    ("QueueOverflowError", VLLM_QUEUE_OVERFLOW)
                }
                ShedCause::QueuedTokens => ("MaxQueuedTokensError", VLLM_MAX_QUEUED_TOKENS),
            };
            body.push_str("{\"error\":{\"message\":");
            push_json_str(&mut body, message);
            body.push_str(",\"type\":");
            push_json_str(&mut body, kind);
            body.push_str(",\"param\":null,\"code\":503}}");
        }
    }
    Reply::json(StatusCode::SERVICE_UNAVAILABLE, body)
}

impl ApiError {
    /// The 400 the API's server sends for this error.
    pub fn reply(&self, dialect: Dialect, api: Api) -> Reply {
        let shape = match (dialect, api) {
            (Dialect::Sglang, Api::Generate) => ErrorShape::SglangNative,
            (Dialect::Sglang, _) => ErrorShape::SglangOpenAi { kind: self.kind },
            (Dialect::Vllm, _) => ErrorShape::Vllm { param: self.param },
        };
        Reply::json(StatusCode::BAD_REQUEST, error_body(shape, &self.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_503_body_keeps_serde_jsons_sorted_key_order() {
        let json = serde_json::json!({"object": "error", "message": "the simulator is shutting down", "type": "ServiceUnavailable", "param": null, "code": 503});
        assert_eq!(Reply::shutting_down().body, json.to_string());
    }

    #[test]
    fn a_shed_request_gets_the_engines_503() {
        let sglang = shed_reply(Dialect::Sglang, Api::Chat, ShedCause::QueuedRequests);
        assert_eq!(sglang.status, StatusCode::SERVICE_UNAVAILABLE);
        let json: serde_json::Value = serde_json::from_str(&sglang.body).unwrap();
        assert_eq!(json["message"], SGLANG_QUEUE_FULL);
        assert_eq!(json["code"], 503);
        let native = shed_reply(Dialect::Sglang, Api::Generate, ShedCause::QueuedRequests);
        assert_eq!(
            native.body,
            "{\"error\":{\"message\":\"The request queue is full.\"}}"
        );
        let vllm = shed_reply(Dialect::Vllm, Api::Completion, ShedCause::QueuedTokens);
        let json: serde_json::Value = serde_json::from_str(&vllm.body).unwrap();
        assert_eq!(json["error"]["type"], "MaxQueuedTokensError");
        assert_eq!(json["error"]["code"], 503);
    }

    #[test]
    fn the_stream_error_event_is_what_json_dumps_writes() {
        let message = "Token id 9 is out of \"vocabulary\"\n";
        let quoted = serde_json::to_string(message).unwrap_or_default();
        let mut out = String::new();
        write_stream_error(&mut out, message);
        assert_eq!(out, format!("data: {{\"error\": {{\"message\": {quoted}, \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}}}\n\ndata: [DONE]\n\n"));
    }
}
