//! OpenAI Responses (`/v1/responses`): the request (`input` as a string or items,
//! `instructions`, `max_output_tokens`, `request_id`) and the bytes — `event: <type>` blocks
//! whose JSON carries `type` and `sequence_number`, no `data: [DONE]`. Event payloads keep the
//! field order of the `openai` Python types sglang and vLLM serialize (alphabetical); the
//! `response` object carries the fields a client needs (id, object, created_at, model, output,
//! status, incomplete_details, usage), a subset of the servers' full object.
//!
//! Sequence: `response.created` and `response.in_progress` at once (the headers go out with
//! them), then per output item `response.output_item.added` (+ `response.content_part.added`
//! for the message), `response.reasoning_text.delta` / `response.output_text.delta` per
//! scheduler step, the matching `.done` events, and `response.completed` with the usage.
use std::fmt::Write as _;

use serde_json::Value;

use crate::json_out::push_json_str;
use crate::output::{Block, FinishReason, Output, Step};
use crate::request::{
    opt_bool, opt_int, opt_string, require_object, schema_error, thinking_off, ApiError, GenRequest,
};
use crate::text;

/// `/v1/responses`: `input` (a string, or a list of message items whose `content` is a string
/// or text parts), optional `instructions` (a system message), `max_output_tokens`, `stream`,
/// `request_id` (the response id). `ignore_eos` and `min_tokens` are honoured as extensions.
pub fn parse(body: &Value, block_tokens: u64) -> Result<GenRequest, ApiError> {
    require_object(body)?;
    let mut messages = Vec::new();
    if let Some(instructions) = opt_string(body, "instructions")? {
        messages.push(("system".to_owned(), instructions));
    }
    let not_input = || {
        schema_error(
            "input",
            "union_type",
            "Input should be a valid string or a list of input items",
        )
    };
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
                    _ => return Err(not_input()),
                }
            }
        }
        Some(_) => return Err(not_input()),
    }
    let key = text::chat_prompt_key(&messages, block_tokens);
    Ok(GenRequest {
        prompt_tokens: key.tokens,
        cache_key: key.cache_key,
        prefix: key.prefix,
        max_new_tokens: opt_int(body, "max_output_tokens")?,
        min_new_tokens: opt_int(body, "min_tokens")?.unwrap_or(0).max(0) as u64,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        priority: None,
        stop: Vec::new(),
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: opt_string(body, "request_id")?,
        model: opt_string(body, "model")?,
        reasoning: !thinking_off(body),
    })
}

/// Where a `/v1/responses` stream is: which output item is open, the next sequence number.
#[derive(Debug, Default)]
pub struct ResponsesStream {
    /// The open item, if any.
    open: Option<Block>,
    /// Index of the open (or next) output item.
    index: u32,
    /// The reasoning item was opened at some point (it precedes the message).
    had_reasoning: bool,
    /// `sequence_number` of the next event.
    sequence: u64,
}

impl ResponsesStream {
    /// `response.created` and `response.in_progress`, sent before any token.
    pub fn write_preamble(&mut self, o: &Output, out: &mut String) {
        let response = self.response_object(o, "in_progress", None);
        let fields = format!("\"response\":{response}");
        self.event(out, "response.created", &fields, "");
        self.event(out, "response.in_progress", &fields, "");
    }

    /// The events of one scheduler step.
    pub fn write_step(&mut self, o: &Output, step: &Step, out: &mut String) {
        if !step.reasoning_delta.is_empty() {
            self.open_item(o, Block::Reasoning, out);
            let mut fields = String::from("\"content_index\":0,\"delta\":");
            push_json_str(&mut fields, &step.reasoning_delta);
            fields.push_str(",\"item_id\":");
            push_json_str(&mut fields, &item_id(o, Block::Reasoning));
            let _ = write!(fields, ",\"output_index\":{}", self.index);
            self.event(out, "response.reasoning_text.delta", &fields, "");
        }
        if !step.content_delta.is_empty() {
            self.open_item(o, Block::Text, out);
            let mut fields = String::from("\"content_index\":0,\"delta\":");
            push_json_str(&mut fields, &step.content_delta);
            fields.push_str(",\"item_id\":");
            push_json_str(&mut fields, &item_id(o, Block::Text));
            let _ = write!(fields, ",\"logprobs\":[],\"output_index\":{}", self.index);
            self.event(out, "response.output_text.delta", &fields, "");
        }
        if let Some(reason) = &step.finish {
            self.close_item(o, out);
            let response = self.response_object(o, status(reason), Some(reason));
            self.event(
                out,
                "response.completed",
                &format!("\"response\":{response}"),
                "",
            );
        }
    }

    /// A stream that failed after its headers were sent: the Responses `error` event.
    pub fn write_error(&mut self, message: &str, out: &mut String) {
        let mut fields = String::from("\"code\":null,\"message\":");
        push_json_str(&mut fields, message);
        fields.push_str(",\"param\":null");
        self.event(out, "error", &fields, "");
    }

    fn open_item(&mut self, o: &Output, kind: Block, out: &mut String) {
        if self.open == Some(kind) {
            return;
        }
        if self.open.is_some() {
            self.close_item(o, out);
            self.index += 1;
        }
        self.open = Some(kind);
        self.had_reasoning |= kind == Block::Reasoning;
        let index = self.index;
        let id = item_id(o, kind);
        let item = match kind {
            Block::Reasoning => reasoning_item(&id, None),
            Block::Text => message_item(&id, None),
        };
        self.event(
            out,
            "response.output_item.added",
            &format!("\"item\":{item},\"output_index\":{index}"),
            "",
        );
        if kind == Block::Text {
            let mut fields = String::from("\"content_index\":0,\"item_id\":");
            push_json_str(&mut fields, &id);
            let _ = write!(
                fields,
                ",\"output_index\":{index},\"part\":{}",
                output_text("")
            );
            self.event(out, "response.content_part.added", &fields, "");
        }
    }

    fn close_item(&mut self, o: &Output, out: &mut String) {
        let Some(kind) = self.open.take() else {
            return;
        };
        let index = self.index;
        let id = item_id(o, kind);
        let mut head = String::from("\"content_index\":0,\"item_id\":");
        push_json_str(&mut head, &id);
        let mut text = String::from("\"text\":");
        match kind {
            Block::Reasoning => {
                push_json_str(&mut text, &o.reasoning);
                let _ = write!(head, ",\"output_index\":{index}");
                self.event(out, "response.reasoning_text.done", &head, &text);
                let item = reasoning_item(&id, Some(&o.reasoning));
                self.event(
                    out,
                    "response.output_item.done",
                    &format!("\"item\":{item},\"output_index\":{index}"),
                    "",
                );
            }
            Block::Text => {
                push_json_str(&mut text, &o.content);
                let mut fields = head.clone();
                let _ = write!(fields, ",\"logprobs\":[],\"output_index\":{index}");
                self.event(out, "response.output_text.done", &fields, &text);
                let _ = write!(
                    head,
                    ",\"output_index\":{index},\"part\":{}",
                    output_text(&o.content)
                );
                self.event(out, "response.content_part.done", &head, "");
                let item = message_item(&id, Some(&o.content));
                self.event(
                    out,
                    "response.output_item.done",
                    &format!("\"item\":{item},\"output_index\":{index}"),
                    "",
                );
            }
        }
    }

    /// `event: <kind>\ndata: {<before>,"sequence_number":N,<after>,"type":"<kind>"}`.
    fn event(&mut self, out: &mut String, kind: &str, before: &str, after: &str) {
        let sequence = self.sequence;
        self.sequence += 1;
        out.push_str("event: ");
        out.push_str(kind);
        out.push_str("\ndata: {");
        out.push_str(before);
        if !before.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "\"sequence_number\":{sequence},");
        if !after.is_empty() {
            out.push_str(after);
            out.push(',');
        }
        out.push_str("\"type\":\"");
        out.push_str(kind);
        out.push_str("\"}\n\n");
    }

    /// The `response` object; `finish` set once the request has ended (output and usage).
    fn response_object(&self, o: &Output, status: &str, finish: Option<&FinishReason>) -> String {
        response_object(o, self.had_reasoning, status, finish)
    }
}

/// The non-streaming `/v1/responses` body: the finished response object.
pub fn write_body(o: &Output, finish: &FinishReason, out: &mut String) {
    out.push_str(&response_object(o, false, status(finish), Some(finish)));
}

/// The `response` object; `finish` set once the request has ended (output and usage). A
/// reasoning item is listed when one was streamed, even if it ended empty.
fn response_object(
    o: &Output,
    had_reasoning: bool,
    status: &str,
    finish: Option<&FinishReason>,
) -> String {
    let mut out = String::from("{\"id\":");
    push_json_str(&mut out, &o.spec.id);
    let _ = write!(
        out,
        ",\"object\":\"response\",\"created_at\":{},\"model\":",
        o.spec.created
    );
    push_json_str(&mut out, &o.spec.model);
    out.push_str(",\"output\":[");
    if finish.is_some() {
        let mut items = Vec::new();
        if had_reasoning || !o.reasoning.is_empty() {
            items.push(reasoning_item(
                &item_id(o, Block::Reasoning),
                Some(&o.reasoning),
            ));
        }
        if !o.content.is_empty() {
            items.push(message_item(&item_id(o, Block::Text), Some(&o.content)));
        }
        out.push_str(&items.join(","));
    }
    out.push_str("],\"status\":\"");
    out.push_str(status);
    out.push_str("\",\"incomplete_details\":");
    match finish {
        Some(FinishReason::Length) => out.push_str("{\"reason\":\"max_output_tokens\"}"),
        _ => out.push_str("null"),
    }
    out.push_str(",\"usage\":");
    match finish {
        None => out.push_str("null"),
        Some(_) => {
            let (prompt, completion) = (o.spec.prompt_tokens, o.completion_tokens);
            let cached = if o.spec.enable_cache_report {
                o.cached_tokens
            } else {
                0
            };
            let _ = write!(
                out,
                "{{\"input_tokens\":{prompt},\"input_tokens_details\":{{\"cached_tokens\":{cached}}},\"output_tokens\":{completion},\"output_tokens_details\":{{\"reasoning_tokens\":{}}},\"total_tokens\":{}}}",
                o.reasoning_emitted.min(completion),
                prompt + completion
            );
        }
    }
    out.push('}');
    out
}

/// Output item ids share the response id's random part: `rs_…` and `msg_…`.
fn item_id(o: &Output, kind: Block) -> String {
    let tail = o
        .spec
        .id
        .strip_prefix("resp_")
        .unwrap_or(o.spec.id.as_str());
    match kind {
        Block::Reasoning => format!("rs_{tail}"),
        Block::Text => format!("msg_{tail}"),
    }
}

/// `completed`, or `incomplete` when `max_output_tokens` cut the answer, or `cancelled` when it
/// was aborted.
fn status(finish: &FinishReason) -> &'static str {
    match finish {
        FinishReason::Length => "incomplete",
        FinishReason::Abort => "cancelled",
        _ => "completed",
    }
}

fn output_text(text: &str) -> String {
    let mut out = String::from("{\"annotations\":[],\"text\":");
    push_json_str(&mut out, text);
    out.push_str(",\"type\":\"output_text\",\"logprobs\":null}");
    out
}

/// A message output item; `text` is `None` while it is in progress.
fn message_item(id: &str, text: Option<&str>) -> String {
    let mut out = String::from("{\"id\":");
    push_json_str(&mut out, id);
    out.push_str(",\"content\":[");
    if let Some(text) = text {
        out.push_str(&output_text(text));
    }
    out.push_str("],\"role\":\"assistant\",\"status\":\"");
    out.push_str(if text.is_some() {
        "completed"
    } else {
        "in_progress"
    });
    out.push_str("\",\"type\":\"message\"}");
    out
}

/// A reasoning output item; `text` is `None` while it is in progress.
fn reasoning_item(id: &str, text: Option<&str>) -> String {
    let mut out = String::from("{\"id\":");
    push_json_str(&mut out, id);
    out.push_str(",\"summary\":[],\"type\":\"reasoning\",\"content\":[");
    if let Some(text) = text {
        out.push_str("{\"text\":");
        push_json_str(&mut out, text);
        out.push_str(",\"type\":\"reasoning_text\"}");
    }
    out.push_str("],\"encrypted_content\":null,\"status\":\"");
    out.push_str(if text.is_some() {
        "completed"
    } else {
        "in_progress"
    });
    out.push_str("\"}");
    out
}
