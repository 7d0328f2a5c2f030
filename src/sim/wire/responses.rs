//! OpenAI Responses (`/v1/responses`) bytes: `event: <type>` blocks whose JSON carries `type` and
//! `sequence_number`, no `data: [DONE]`. Event payloads keep the field order of the `openai`
//! Python types sglang and vLLM serialize (alphabetical); the `response` object carries the
//! fields a client needs (id, object, created_at, model, output, status, incomplete_details,
//! usage), a subset of the servers' full object.
//!
//! Sequence: `response.created` and `response.in_progress` at once (the headers go out with
//! them), then per output item `response.output_item.added` (+ `response.content_part.added`
//! for the message), `response.reasoning_text.delta` / `response.output_text.delta` per
//! scheduler step, the matching `.done` events, and `response.completed` with the usage.
use std::fmt::Write as _;

use super::{push_json_str, Block, FinishReason, Renderer};

impl Renderer {
    /// `response.created` and `response.in_progress`, sent before any token.
    pub(super) fn responses_preamble(&mut self, out: &mut String) {
        let response = self.response_object("in_progress", None);
        self.responses_event(
            out,
            "response.created",
            &format!("\"response\":{response}"),
            "",
        );
        self.responses_event(
            out,
            "response.in_progress",
            &format!("\"response\":{response}"),
            "",
        );
    }

    /// The events of one scheduler output on `/v1/responses`.
    pub(super) fn responses_events(
        &mut self,
        reasoning_delta: &str,
        content_delta: &str,
        finish: Option<&FinishReason>,
        out: &mut String,
    ) {
        if !reasoning_delta.is_empty() {
            self.open_item(Block::Reasoning, out);
            let mut fields = String::from("\"content_index\":0,\"delta\":");
            push_json_str(&mut fields, reasoning_delta);
            fields.push_str(",\"item_id\":");
            push_json_str(&mut fields, &self.item_id(Block::Reasoning));
            let _ = write!(fields, ",\"output_index\":{}", self.events.index);
            self.responses_event(out, "response.reasoning_text.delta", &fields, "");
        }
        if !content_delta.is_empty() {
            self.open_item(Block::Text, out);
            let mut fields = String::from("\"content_index\":0,\"delta\":");
            push_json_str(&mut fields, content_delta);
            fields.push_str(",\"item_id\":");
            push_json_str(&mut fields, &self.item_id(Block::Text));
            let _ = write!(
                fields,
                ",\"logprobs\":[],\"output_index\":{}",
                self.events.index
            );
            self.responses_event(out, "response.output_text.delta", &fields, "");
        }
        if let Some(reason) = finish {
            self.close_item(out);
            let response = self.response_object(status(reason), Some(reason));
            self.responses_event(
                out,
                "response.completed",
                &format!("\"response\":{response}"),
                "",
            );
        }
    }

    fn open_item(&mut self, kind: Block, out: &mut String) {
        if self.events.open == Some(kind) {
            return;
        }
        if self.events.open.is_some() {
            self.close_item(out);
            self.events.index += 1;
        }
        self.events.open = Some(kind);
        self.events.had_reasoning |= kind == Block::Reasoning;
        let index = self.events.index;
        let id = self.item_id(kind);
        let item = match kind {
            Block::Reasoning => reasoning_item(&id, None),
            Block::Text => message_item(&id, None),
        };
        self.responses_event(
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
            self.responses_event(out, "response.content_part.added", &fields, "");
        }
    }

    fn close_item(&mut self, out: &mut String) {
        let Some(kind) = self.events.open.take() else {
            return;
        };
        let index = self.events.index;
        let id = self.item_id(kind);
        let mut head = String::from("\"content_index\":0,\"item_id\":");
        push_json_str(&mut head, &id);
        let mut text = String::from("\"text\":");
        match kind {
            Block::Reasoning => {
                push_json_str(&mut text, &self.reasoning);
                let _ = write!(head, ",\"output_index\":{index}");
                self.responses_event(out, "response.reasoning_text.done", &head, &text);
                let item = reasoning_item(&id, Some(&self.reasoning));
                self.responses_event(
                    out,
                    "response.output_item.done",
                    &format!("\"item\":{item},\"output_index\":{index}"),
                    "",
                );
            }
            Block::Text => {
                push_json_str(&mut text, &self.content);
                let mut fields = head.clone();
                let _ = write!(fields, ",\"logprobs\":[],\"output_index\":{index}");
                self.responses_event(out, "response.output_text.done", &fields, &text);
                let _ = write!(
                    head,
                    ",\"output_index\":{index},\"part\":{}",
                    output_text(&self.content)
                );
                self.responses_event(out, "response.content_part.done", &head, "");
                let item = message_item(&id, Some(&self.content));
                self.responses_event(
                    out,
                    "response.output_item.done",
                    &format!("\"item\":{item},\"output_index\":{index}"),
                    "",
                );
            }
        }
    }

    /// `event: <kind>\ndata: {<before>,"sequence_number":N,<after>,"type":"<kind>"}`.
    fn responses_event(&mut self, out: &mut String, kind: &str, before: &str, after: &str) {
        let sequence = self.events.sequence;
        self.events.sequence += 1;
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

    /// Output item ids share the response id's random part: `rs_…` and `msg_…`.
    fn item_id(&self, kind: Block) -> String {
        let tail = self
            .spec
            .id
            .strip_prefix("resp_")
            .unwrap_or(self.spec.id.as_str());
        match kind {
            Block::Reasoning => format!("rs_{tail}"),
            Block::Text => format!("msg_{tail}"),
        }
    }

    /// The `response` object; `finish` set once the request has ended (output and usage).
    fn response_object(&self, status: &str, finish: Option<&FinishReason>) -> String {
        let mut out = String::from("{\"id\":");
        push_json_str(&mut out, &self.spec.id);
        let _ = write!(
            out,
            ",\"object\":\"response\",\"created_at\":{},\"model\":",
            self.spec.created
        );
        push_json_str(&mut out, &self.spec.model);
        out.push_str(",\"output\":[");
        if finish.is_some() {
            let mut items = Vec::new();
            if self.events.had_reasoning || !self.reasoning.is_empty() {
                items.push(reasoning_item(
                    &self.item_id(Block::Reasoning),
                    Some(&self.reasoning),
                ));
            }
            if !self.content.is_empty() {
                items.push(message_item(
                    &self.item_id(Block::Text),
                    Some(&self.content),
                ));
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
                let (prompt, completion) = (self.spec.prompt_tokens, self.completion_tokens);
                let cached = if self.spec.enable_cache_report {
                    self.cached_tokens
                } else {
                    0
                };
                let _ = write!(
                    out,
                    "{{\"input_tokens\":{prompt},\"input_tokens_details\":{{\"cached_tokens\":{cached}}},\"output_tokens\":{completion},\"output_tokens_details\":{{\"reasoning_tokens\":{}}},\"total_tokens\":{}}}",
                    self.reasoning_emitted.min(completion),
                    prompt + completion
                );
            }
        }
        out.push('}');
        out
    }

    /// A stream that failed after its headers were sent: the Responses `error` event.
    pub(super) fn responses_error(&mut self, message: &str, out: &mut String) {
        let mut fields = String::from("\"code\":null,\"message\":");
        push_json_str(&mut fields, message);
        fields.push_str(",\"param\":null");
        self.responses_event(out, "error", &fields, "");
    }

    /// The non-streaming `/v1/responses` body: the finished response object.
    pub(super) fn responses_body(&self, out: &mut String, finish: &FinishReason) {
        out.push_str(&self.response_object(status(finish), Some(finish)));
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
