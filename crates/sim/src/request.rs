//! What every generation API shares on the way in: which API a request speaks ([`Api`]), the
//! request after parsing ([`GenRequest`]), the error value a parse or check produces
//! ([`ApiError`]), and the pydantic-style field readers whose messages and error `type`s are the
//! ones sglang's and vLLM's request models produce. Each API's own parser lives in `api/`.
use bytes::Bytes;
use http::Request;
use http_body::Body;
use http_body_util::BodyExt;
use serde_json::Value;

use super::text;

/// Largest request body read (a 1M-token id prompt is about 8 MB of JSON).
const MAX_BODY_BYTES: usize = 64 << 20;

/// Which generation API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions (`/v1/chat/completions`).
    Chat,
    /// OpenAI text completions (`/v1/completions`).
    Completion,
    /// sglang's native `/generate`.
    Generate,
    /// Anthropic Messages (`/v1/messages`): `event:` lines, no `[DONE]`.
    Messages,
    /// OpenAI Responses (`/v1/responses`): `event:` lines, no `[DONE]`.
    Responses,
}

/// A generation request after parsing, before validation against the profile.
#[derive(Debug)]
pub struct GenRequest {
    pub prompt_tokens: u64,
    pub cache_key: u64,
    /// The prompt's block chain for the prefix cache.
    pub prefix: text::PrefixKeys,
    pub max_new_tokens: Option<i64>,
    pub min_new_tokens: u64,
    pub ignore_eos: bool,
    /// The request's `priority` (chat, completions, `/generate`); `None` when absent, and
    /// always on the APIs that do not read it.
    pub priority: Option<i64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub rid: Option<String>,
    pub model: Option<String>,
    pub reasoning: bool,
}

/// An error as the API's server reports it (the body is written by `error_body`).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub message: String,
    /// sglang `type` for OpenAI routes: `BadRequestError` for ValueErrors raised by the
    /// engine, `Bad Request` for request-schema violations.
    pub kind: &'static str,
    /// vLLM `param`.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// A ValueError raised by the engine.
    pub fn value(message: String) -> ApiError {
        ApiError {
            message,
            kind: "BadRequestError",
            param: None,
        }
    }

    /// A request-schema violation.
    pub fn schema(message: String) -> ApiError {
        ApiError {
            message,
            kind: "Bad Request",
            param: None,
        }
    }

    pub fn with_param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }
}

/// Read the whole body (bounded) and parse it as JSON, with pydantic's decode-error message.
pub async fn read_json<B>(request: Request<B>) -> Result<Value, ApiError>
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

/// A pydantic validation error on one body field.
pub fn schema_error(field: &str, kind: &str, msg: &str) -> ApiError {
    ApiError::schema(format!(
        "[{{'type': '{kind}', 'loc': ('body', '{field}'), 'msg': '{msg}'}}]"
    ))
}

/// The body must be a JSON object (pydantic's message for a request model).
pub fn require_object(body: &Value) -> Result<(), ApiError> {
    if body.is_object() {
        Ok(())
    } else {
        Err(ApiError::schema(
            "[{'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to extract fields from'}]".to_owned(),
        ))
    }
}

pub fn opt_bool(body: &Value, field: &str) -> Result<Option<bool>, ApiError> {
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

/// An integer field; a float with no fractional part is accepted, as pydantic does.
pub fn opt_int(body: &Value, field: &str) -> Result<Option<i64>, ApiError> {
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

pub fn opt_string(body: &Value, field: &str) -> Result<Option<String>, ApiError> {
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

/// Stop strings: one string or a list of strings; empty strings never match, so they are
/// dropped.
pub fn stop_strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
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

/// `messages` as (role, text) pairs: chat completions, Messages and `/tokenize` read them alike.
pub fn chat_messages(body: &Value) -> Result<Vec<(String, String)>, ApiError> {
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

/// The profile reasons unless the request turns thinking off (sglang's chat switch).
pub fn thinking_off(body: &Value) -> bool {
    body.get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool)
        == Some(false)
}

/// The first prompt token id at or past the vocabulary (`prompt` ids, one nested list, or
/// `input_ids`), as the engine checks it before generating.
pub fn out_of_vocabulary(body: &Value, vocab: u64) -> Option<u64> {
    let ids = body.get("prompt").or_else(|| body.get("input_ids"))?;
    let ids = match ids.as_array()? {
        items if items.first().is_some_and(Value::is_array) => items.first()?.as_array()?,
        items => items,
    };
    ids.iter().filter_map(Value::as_u64).find(|&id| id >= vocab)
}
