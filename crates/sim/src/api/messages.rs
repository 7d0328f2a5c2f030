//! Anthropic Messages (`/v1/messages`), as sglang's translation layer serves it
//! (`entrypoints/anthropic/serving.py`): the request (`AnthropicMessagesRequest`) and the bytes,
//! pydantic `model_dump_json(exclude_none)`, so keys come in the models' field order:
//! `message_start` at the first token (with `usage.input_tokens`), a `thinking` block then a
//! `text` block, `message_delta` with the stop reason and usage, `message_stop`, and no
//! `data: [DONE]`.
//!
//! Reasoning goes into a `thinking` block (Anthropic's extended-thinking shape; sglang's
//! non-streaming conversion builds the same block).
use std::fmt::Write as _;

use http::StatusCode;
use serde_json::Value;

use crate::error_body::{error_body, ErrorShape, Reply};
use crate::json_out::push_json_str;
use crate::options::Dialect;
use crate::output::{Block, FinishReason, Output, Step};
use crate::request::{
    chat_messages, opt_bool, opt_int, opt_string, require_object, schema_error, stop_strings,
    thinking_off, ApiError, GenRequest,
};
use crate::text;

/// `/v1/messages` (sglang's `AnthropicMessagesRequest`): `model`, `messages` and a positive
/// `max_tokens` are required; `system` becomes a system message; `stop_sequences` are stop
/// strings; `thinking: {"type": "disabled"}` turns reasoning off. `ignore_eos` is honoured as
/// an extension so benchmarks can fix the output length.
pub fn parse(body: &Value, block_tokens: u64) -> Result<GenRequest, ApiError> {
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
    messages.extend(chat_messages(body)?);
    let key = text::chat_prompt_key(&messages, block_tokens);
    let thinking_disabled = body
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        == Some("disabled");
    Ok(GenRequest {
        prompt_tokens: key.tokens,
        cache_key: key.cache_key,
        prefix: key.prefix,
        max_new_tokens: Some(max_tokens),
        min_new_tokens: 0,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        priority: None,
        stop: stop_strings(body.get("stop_sequences"), "stop_sequences")?,
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: None,
        model: opt_string(body, "model")?,
        reasoning: !thinking_disabled && !thinking_off(body),
    })
}

/// `/v1/messages` when the engine refuses the request (over-long prompt or output): sglang
/// validates lengths inside generation, after its translator has started the response, so a
/// stream gets status 200 and an `error` event, and a non-streaming request a 500
/// `internal_error` (its translator does not recognise the chat layer's error). The vLLM
/// dialect answers 400 with the engine's message.
pub fn engine_error(dialect: Dialect, stream: bool, message: &str) -> Reply {
    match (dialect, stream) {
        (Dialect::Sglang, true) => {
            let mut out = String::new();
            write_error_events(dialect, message, &mut out);
            Reply::event_stream(out)
        }
        (Dialect::Sglang, false) => Reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            error_body(
                ErrorShape::Anthropic {
                    kind: "internal_error",
                },
                "Internal processing error",
            ),
        ),
        (Dialect::Vllm, _) => Reply::json(
            StatusCode::BAD_REQUEST,
            error_body(
                ErrorShape::Anthropic {
                    kind: "invalid_request_error",
                },
                message,
            ),
        ),
    }
}

/// Where a `/v1/messages` stream is: which content block is open.
#[derive(Debug, Default)]
pub struct MessagesStream {
    /// `message_start` has been sent.
    started: bool,
    /// The open block, if any.
    open: Option<Block>,
    /// Index of the open (or next) content block.
    index: u32,
}

impl MessagesStream {
    /// The events of one scheduler step.
    pub fn write_step(&mut self, o: &Output, step: &Step, out: &mut String) {
        if !self.started {
            self.started = true;
            message_start(o, out);
        }
        if !step.reasoning_delta.is_empty() {
            self.open_block(Block::Reasoning, out);
            let index = self.index;
            event(out, "content_block_delta", |out| {
                out.push_str("\"delta\":{\"type\":\"thinking_delta\",\"thinking\":");
                push_json_str(out, &step.reasoning_delta);
                let _ = write!(out, "}},\"index\":{index}");
            });
        }
        if !step.content_delta.is_empty() {
            self.open_block(Block::Text, out);
            let index = self.index;
            event(out, "content_block_delta", |out| {
                out.push_str("\"delta\":{\"type\":\"text_delta\",\"text\":");
                push_json_str(out, &step.content_delta);
                let _ = write!(out, "}},\"index\":{index}");
            });
        }
        if let Some(reason) = &step.finish {
            self.close_block(out);
            event(out, "message_delta", |out| {
                out.push_str("\"delta\":{\"stop_reason\":\"");
                out.push_str(stop_reason(reason));
                out.push_str("\"},\"usage\":");
                write_usage(o, o.completion_tokens, out);
            });
            event(out, "message_stop", |_| {});
        }
    }

    fn open_block(&mut self, kind: Block, out: &mut String) {
        if self.open == Some(kind) {
            return;
        }
        if self.open.is_some() {
            self.close_block(out);
            self.index += 1;
        }
        self.open = Some(kind);
        let index = self.index;
        event(out, "content_block_start", |out| {
            out.push_str(match kind {
                Block::Reasoning => "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}",
                Block::Text => "\"content_block\":{\"type\":\"text\",\"text\":\"\"}",
            });
            let _ = write!(out, ",\"index\":{index}");
        });
    }

    fn close_block(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            let index = self.index;
            event(out, "content_block_stop", |out| {
                let _ = write!(out, "\"index\":{index}");
            });
        }
    }
}

/// sglang's `STOP_REASON_MAP` (`stop`→`end_turn`, `length`→`max_tokens`, anything else →
/// `end_turn`, so stop strings and aborts read `end_turn` too).
fn stop_reason(finish: &FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "max_tokens",
        _ => "end_turn",
    }
}

fn message_start(o: &Output, out: &mut String) {
    event(out, "message_start", |out| {
        out.push_str("\"message\":{\"id\":");
        push_json_str(out, &o.spec.id);
        out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
        push_json_str(out, &o.spec.model);
        out.push_str(",\"usage\":");
        write_usage(o, 0, out);
        out.push('}');
    });
}

/// sglang's `AnthropicUsage` (`cache_read_input_tokens` is always set, 0 without
/// `--enable-cache-report`); vLLM's carries only the two counts.
fn write_usage(o: &Output, output_tokens: u64, out: &mut String) {
    let _ = write!(
        out,
        "{{\"input_tokens\":{},\"output_tokens\":{output_tokens}",
        o.spec.prompt_tokens
    );
    if o.spec.dialect == Dialect::Sglang {
        let cached = if o.spec.enable_cache_report {
            o.cached_tokens
        } else {
            0
        };
        let _ = write!(out, ",\"cache_read_input_tokens\":{cached}");
    }
    out.push('}');
}

/// The non-streaming `/v1/messages` body.
pub fn write_body(o: &Output, finish: &FinishReason, out: &mut String) {
    out.push_str("{\"id\":");
    push_json_str(out, &o.spec.id);
    out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
    let mut first = true;
    if !o.reasoning.is_empty() {
        out.push_str("{\"type\":\"thinking\",\"thinking\":");
        push_json_str(out, &o.reasoning);
        out.push_str(",\"signature\":\"dummy-signature\"}");
        first = false;
    }
    if !o.content.is_empty() {
        if !first {
            out.push(',');
        }
        out.push_str("{\"type\":\"text\",\"text\":");
        push_json_str(out, &o.content);
        out.push('}');
    }
    out.push_str("],\"model\":");
    push_json_str(out, &o.spec.model);
    out.push_str(",\"stop_reason\":\"");
    out.push_str(stop_reason(finish));
    out.push_str("\",\"usage\":");
    write_usage(o, o.completion_tokens, out);
    out.push('}');
}

/// What a `/v1/messages` stream carries when the engine refuses the request after the headers
/// went out (sglang validates lengths inside generation, so an over-long prompt arrives this
/// way): sglang's translator cannot parse the chat stream's `{"error": …}` chunk and reports a
/// generic `api_error`, then closes the message with zero usage. The vLLM dialect keeps the
/// engine's message.
pub fn write_error_events(dialect: Dialect, message: &str, out: &mut String) {
    event(out, "error", |out| {
        out.push_str("\"error\":{\"type\":\"api_error\",\"message\":");
        match dialect {
            Dialect::Sglang => push_json_str(out, "Stream processing error"),
            Dialect::Vllm => push_json_str(out, message),
        }
        out.push('}');
    });
    event(out, "message_delta", |out| {
        out.push_str("\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":");
        out.push_str(match dialect {
            Dialect::Sglang => {
                "{\"input_tokens\":0,\"output_tokens\":0,\"cache_read_input_tokens\":0}"
            }
            Dialect::Vllm => "{\"input_tokens\":0,\"output_tokens\":0}",
        });
    });
    event(out, "message_stop", |_| {});
}

/// `event: <kind>\ndata: {"type":"<kind>",<fields>}\n\n` (the `type` field comes first in
/// sglang's `AnthropicStreamEvent`).
fn event(out: &mut String, kind: &str, fields: impl FnOnce(&mut String)) {
    out.push_str("event: ");
    out.push_str(kind);
    out.push_str("\ndata: {\"type\":\"");
    out.push_str(kind);
    out.push('"');
    let before = out.len();
    out.push(',');
    fields(out);
    if out.len() == before + 1 {
        out.truncate(before);
    }
    out.push_str("}\n\n");
}
