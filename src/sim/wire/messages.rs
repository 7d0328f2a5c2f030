//! Anthropic Messages (`/v1/messages`) bytes, as sglang's translation layer produces them from
//! its chat stream (`entrypoints/anthropic/serving.py`, pydantic `model_dump_json(exclude_none)`,
//! so keys come in the models' field order): `message_start` at the first token (with
//! `usage.input_tokens`), a `thinking` block then a `text` block, `message_delta` with the stop
//! reason and usage, `message_stop`, and no `data: [DONE]`.
//!
//! Reasoning goes into a `thinking` block (Anthropic's extended-thinking shape; sglang's
//! non-streaming conversion builds the same block). Pure rendering, like the rest of `wire`.
use std::fmt::Write as _;

use super::{push_json_str, Block, FinishReason, Renderer};
use crate::sim::Dialect;

impl FinishReason {
    /// sglang's `STOP_REASON_MAP` (`stop`→`end_turn`, `length`→`max_tokens`, anything else →
    /// `end_turn`, so stop strings and aborts read `end_turn` too).
    fn anthropic(&self) -> &'static str {
        match self {
            FinishReason::Length => "max_tokens",
            _ => "end_turn",
        }
    }
}

impl Renderer {
    /// The events of one scheduler output on `/v1/messages`.
    pub(super) fn messages_events(
        &mut self,
        reasoning_delta: &str,
        content_delta: &str,
        finish: Option<&FinishReason>,
        out: &mut String,
    ) {
        if !self.events.started {
            self.events.started = true;
            self.message_start(out);
        }
        if !reasoning_delta.is_empty() {
            self.open_block(Block::Reasoning, out);
            let index = self.events.index;
            event(out, "content_block_delta", |out| {
                out.push_str("\"delta\":{\"type\":\"thinking_delta\",\"thinking\":");
                push_json_str(out, reasoning_delta);
                let _ = write!(out, "}},\"index\":{index}");
            });
        }
        if !content_delta.is_empty() {
            self.open_block(Block::Text, out);
            let index = self.events.index;
            event(out, "content_block_delta", |out| {
                out.push_str("\"delta\":{\"type\":\"text_delta\",\"text\":");
                push_json_str(out, content_delta);
                let _ = write!(out, "}},\"index\":{index}");
            });
        }
        if let Some(reason) = finish {
            self.close_block(out);
            let usage = self.anthropic_usage(self.completion_tokens);
            event(out, "message_delta", |out| {
                out.push_str("\"delta\":{\"stop_reason\":\"");
                out.push_str(reason.anthropic());
                out.push_str("\"},\"usage\":");
                out.push_str(&usage);
            });
            event(out, "message_stop", |_| {});
        }
    }

    fn message_start(&self, out: &mut String) {
        let usage = self.anthropic_usage(0);
        event(out, "message_start", |out| {
            out.push_str("\"message\":{\"id\":");
            push_json_str(out, &self.spec.id);
            out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
            push_json_str(out, &self.spec.model);
            out.push_str(",\"usage\":");
            out.push_str(&usage);
            out.push('}');
        });
    }

    fn open_block(&mut self, kind: Block, out: &mut String) {
        if self.events.open == Some(kind) {
            return;
        }
        if self.events.open.is_some() {
            self.close_block(out);
            self.events.index += 1;
        }
        self.events.open = Some(kind);
        self.events.had_reasoning |= kind == Block::Reasoning;
        let index = self.events.index;
        event(out, "content_block_start", |out| {
            out.push_str(match kind {
                Block::Reasoning => "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}",
                Block::Text => "\"content_block\":{\"type\":\"text\",\"text\":\"\"}",
            });
            let _ = write!(out, ",\"index\":{index}");
        });
    }

    fn close_block(&mut self, out: &mut String) {
        if self.events.open.take().is_some() {
            let index = self.events.index;
            event(out, "content_block_stop", |out| {
                let _ = write!(out, "\"index\":{index}");
            });
        }
    }

    /// sglang's `AnthropicUsage` (`cache_read_input_tokens` is always set, 0 without
    /// `--enable-cache-report`); vLLM's carries only the two counts.
    fn anthropic_usage(&self, output_tokens: u64) -> String {
        let mut usage = format!(
            "{{\"input_tokens\":{},\"output_tokens\":{output_tokens}",
            self.spec.prompt_tokens
        );
        if self.spec.dialect == Dialect::Sglang {
            let cached = if self.spec.enable_cache_report {
                self.cached_tokens
            } else {
                0
            };
            let _ = write!(usage, ",\"cache_read_input_tokens\":{cached}");
        }
        usage.push('}');
        usage
    }

    /// A stream that failed after its headers were sent (see [`messages_error_stream`]).
    pub(super) fn messages_error(&mut self, message: &str, out: &mut String) {
        out.push_str(&messages_error_stream(self.spec.dialect, message));
    }

    /// The non-streaming `/v1/messages` body.
    pub(super) fn messages_body(&self, out: &mut String, finish: &FinishReason) {
        out.push_str("{\"id\":");
        push_json_str(out, &self.spec.id);
        out.push_str(",\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
        let mut first = true;
        if !self.reasoning.is_empty() {
            out.push_str("{\"type\":\"thinking\",\"thinking\":");
            push_json_str(out, &self.reasoning);
            out.push_str(",\"signature\":\"dummy-signature\"}");
            first = false;
        }
        if !self.content.is_empty() {
            if !first {
                out.push(',');
            }
            out.push_str("{\"type\":\"text\",\"text\":");
            push_json_str(out, &self.content);
            out.push('}');
        }
        out.push_str("],\"model\":");
        push_json_str(out, &self.spec.model);
        out.push_str(",\"stop_reason\":\"");
        out.push_str(finish.anthropic());
        out.push_str("\",\"usage\":");
        out.push_str(&self.anthropic_usage(self.completion_tokens));
        out.push('}');
    }
}

/// What a `/v1/messages` stream carries when the engine refuses the request after the headers
/// went out (sglang validates lengths inside generation, so an over-long prompt arrives this
/// way): sglang's translator cannot parse the chat stream's `{"error": …}` chunk and reports a
/// generic `api_error`, then closes the message with zero usage. The vLLM dialect keeps the
/// engine's message.
pub fn messages_error_stream(dialect: Dialect, message: &str) -> String {
    let mut out = String::new();
    event(&mut out, "error", |out| {
        out.push_str("\"error\":{\"type\":\"api_error\",\"message\":");
        match dialect {
            Dialect::Sglang => push_json_str(out, "Stream processing error"),
            Dialect::Vllm => push_json_str(out, message),
        }
        out.push('}');
    });
    event(&mut out, "message_delta", |out| {
        out.push_str("\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":");
        out.push_str(match dialect {
            Dialect::Sglang => {
                "{\"input_tokens\":0,\"output_tokens\":0,\"cache_read_input_tokens\":0}"
            }
            Dialect::Vllm => "{\"input_tokens\":0,\"output_tokens\":0}",
        });
    });
    event(&mut out, "message_stop", |_| {});
    out
}

/// The non-streaming error body of `/v1/messages` (`AnthropicErrorResponse`).
pub fn messages_error_body(kind: &str, message: &str) -> String {
    let mut out = String::from("{\"type\":\"error\",\"error\":{\"type\":");
    push_json_str(&mut out, kind);
    out.push_str(",\"message\":");
    push_json_str(&mut out, message);
    out.push_str("}}");
    out
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
