//! Wire rendering: turns scheduler events into the exact bytes sglang (or vLLM, with
//! `--dialect vllm`) would send — SSE chunks with the servers' key order and null/omitted
//! fields (shared/reference/protocols.md, transcripts.md and the vLLM 0.32 captures), and
//! the non-streaming bodies.
//!
//! This module owns output text (filler words, reasoning split, stop strings) and JSON
//! shapes. The event-typed streams of `/v1/messages` and `/v1/responses` live in the child
//! modules `messages` and `responses`. It never touches the scheduler's state and never does I/O; JSON is written by
//! hand so key order is the servers' and no per-chunk `serde_json::Value` is built.
use std::fmt::Write as _;

use tokio::time::Instant;

pub use crate::base::json::push_json_string as push_json_str;

use super::scheduler::{Event, Finish};
use super::text::FillerText;
use super::Dialect;

mod messages;
mod responses;

pub use messages::{messages_error_body, messages_error_stream};

/// Which generation route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completion,
    Generate,
    /// Anthropic Messages (`/v1/messages`): `event:` lines, no `[DONE]`.
    Messages,
    /// OpenAI Responses (`/v1/responses`): `event:` lines, no `[DONE]`.
    Responses,
}

impl Route {
    /// Streams of this route are typed `event:` blocks ending without `data: [DONE]`.
    pub fn is_event_typed(self) -> bool {
        matches!(self, Route::Messages | Route::Responses)
    }
}

/// Everything about one request that shapes its output.
#[derive(Debug, Clone)]
pub struct OutputSpec {
    pub route: Route,
    pub dialect: Dialect,
    pub stream: bool,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub prompt_tokens: u64,
    /// Leading output tokens that are reasoning (0: no reasoning).
    pub reasoning_tokens: u64,
    pub stop: Vec<String>,
    pub eos_token_id: u32,
    pub enable_cache_report: bool,
    pub request_seed: u64,
    pub started: Instant,
    /// vLLM's `system_fingerprint`.
    pub fingerprint: String,
}

/// Why the output ended, as the client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    Eos(u32),
    StopString(String),
    Abort,
}

impl FinishReason {
    fn openai(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos(_) | FinishReason::StopString(_) => "stop",
            FinishReason::Abort => "abort",
        }
    }

    fn matched_json(&self, out: &mut String) {
        match self {
            FinishReason::Eos(id) => {
                let _ = write!(out, "{id}");
            }
            FinishReason::StopString(s) => push_json_str(out, s),
            _ => out.push_str("null"),
        }
    }
}

/// What happened after an event was rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Continue,
    /// The stream is complete (finish, usage and `[DONE]` written for streams).
    Done,
    /// The stream is complete because a stop string matched: the scheduler must be told.
    DoneByStopString,
}

/// Per-request output state.
#[derive(Debug)]
pub struct Renderer {
    spec: OutputSpec,
    text: FillerText,
    completion_tokens: u64,
    reasoning_emitted: u64,
    cached_tokens: u64,
    started_output: bool,
    /// Cumulative content (non-stream bodies and `/generate`).
    content: String,
    reasoning: String,
    output_ids: Vec<u32>,
    stop_tail: String,
    max_stop_len: usize,
    finish: Option<FinishReason>,
    /// Progress of a `/v1/messages` or `/v1/responses` stream (open blocks, sequence numbers).
    events: EventStreamState,
}

/// Where an event-typed stream is: which content block or output item is open.
#[derive(Debug, Default)]
struct EventStreamState {
    /// `message_start` / the first output item has been sent.
    started: bool,
    /// The open block or item, if any.
    open: Option<Block>,
    /// Index of the open (or next) Anthropic content block / Responses output item.
    index: u32,
    /// The reasoning block or item was opened at some point (Responses: it precedes the message).
    had_reasoning: bool,
    /// Responses `sequence_number` of the next event.
    sequence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Reasoning,
    Text,
}

impl Renderer {
    pub fn new(spec: OutputSpec) -> Renderer {
        let max_stop_len = spec.stop.iter().map(String::len).max().unwrap_or(0);
        Renderer {
            text: FillerText::new(spec.request_seed),
            spec,
            completion_tokens: 0,
            reasoning_emitted: 0,
            cached_tokens: 0,
            started_output: false,
            content: String::new(),
            reasoning: String::new(),
            output_ids: Vec::new(),
            stop_tail: String::new(),
            max_stop_len,
            finish: None,
            events: EventStreamState::default(),
        }
    }

    pub fn spec(&self) -> &OutputSpec {
        &self.spec
    }

    /// Render one scheduler event into `out` (SSE bytes when streaming; nothing when
    /// not streaming, where [`Renderer::body`] gives the whole response at the end).
    pub fn on_event(&mut self, event: Event, out: &mut String) -> Progress {
        let (new_tokens, cached_tokens, finish) = match event {
            Event::Output {
                new_tokens,
                cached_tokens,
                finish,
            } => (new_tokens, cached_tokens, finish),
            Event::Rejected { message } => {
                // Only reachable on routes whose headers are already out (vLLM, /generate,
                // /v1/messages, /v1/responses).
                if self.spec.stream {
                    match self.spec.route {
                        Route::Messages => self.messages_error(&message, out),
                        Route::Responses => self.responses_error(&message, out),
                        _ => {
                            self.stream_error(&message, out);
                            out.push_str("data: [DONE]\n\n");
                        }
                    }
                }
                return Progress::Done;
            }
        };
        self.cached_tokens = cached_tokens;
        let first = !self.started_output;
        self.started_output = true;

        // Produce the words of this step, split into reasoning and content.
        let mut reasoning_delta = String::new();
        let mut content_delta = String::new();
        let mut stopped: Option<String> = None;
        for _ in 0..new_tokens {
            let (word, id) = self.text.next_token();
            self.completion_tokens += 1;
            if self.spec.route == Route::Generate || !self.spec.stream {
                self.output_ids.push(id);
            }
            let into_reasoning = self.reasoning_emitted < self.spec.reasoning_tokens;
            let delta = if into_reasoning {
                self.reasoning_emitted += 1;
                &mut reasoning_delta
            } else {
                &mut content_delta
            };
            delta.push(' ');
            delta.push_str(word);
            if self.max_stop_len > 0 {
                self.stop_tail.push(' ');
                self.stop_tail.push_str(word);
                if let Some((stop, at)) = self
                    .spec
                    .stop
                    .iter()
                    .find_map(|s| self.stop_tail.find(s.as_str()).map(|at| (s.clone(), at)))
                {
                    // sglang trims the stop string (no_stop_trim=false) from the output.
                    let cut = self.stop_tail.len() - at;
                    let delta_len = delta.len();
                    delta.truncate(delta_len.saturating_sub(cut));
                    stopped = Some(stop);
                    break;
                }
                let keep = self.max_stop_len + 32;
                if self.stop_tail.len() > 2 * keep {
                    let drop = self.stop_tail.len() - keep;
                    self.stop_tail.drain(..drop);
                }
            }
        }
        let finish = match (&stopped, finish) {
            (Some(stop), _) => Some(FinishReason::StopString(stop.clone())),
            (None, Some(Finish::Length)) => Some(FinishReason::Length),
            (None, Some(Finish::Eos)) => Some(FinishReason::Eos(self.spec.eos_token_id)),
            (None, Some(Finish::Abort)) => Some(FinishReason::Abort),
            (None, None) => None,
        };
        let reasoning_count_after = self.reasoning_emitted;

        if !self.spec.stream || matches!(self.spec.route, Route::Generate | Route::Responses) {
            // Responses streams repeat the whole text in their `.done` events.
            self.reasoning.push_str(&reasoning_delta);
            self.content.push_str(&content_delta);
        }
        if self.spec.stream {
            match (self.spec.route, self.spec.dialect) {
                (Route::Chat, dialect) => self.chat_chunks(
                    dialect,
                    first,
                    &reasoning_delta,
                    &content_delta,
                    reasoning_count_after,
                    finish.as_ref(),
                    out,
                ),
                (Route::Completion, dialect) => {
                    let mut text = reasoning_delta;
                    text.push_str(&content_delta);
                    self.completion_chunk(dialect, &text, finish.as_ref(), out);
                }
                (Route::Generate, _) => self.generate_chunk(first, finish.as_ref(), out),
                (Route::Messages, _) => {
                    self.messages_events(&reasoning_delta, &content_delta, finish.as_ref(), out)
                }
                (Route::Responses, _) => {
                    self.responses_events(&reasoning_delta, &content_delta, finish.as_ref(), out)
                }
            }
        }
        match finish {
            Some(reason) => {
                self.finish = Some(reason);
                if self.spec.stream && !self.spec.route.is_event_typed() {
                    self.stream_tail(out);
                }
                if stopped.is_some() {
                    Progress::DoneByStopString
                } else {
                    Progress::Done
                }
            }
            None => Progress::Continue,
        }
    }

    fn chunk_head(&self, out: &mut String, object: &str) {
        out.push_str("data: ");
        self.object_head(out, object);
    }

    /// `{"id":…,"object":"<object>","created":…,"model":` — how every OpenAI-shaped body and
    /// chunk begins.
    fn object_head(&self, out: &mut String, object: &str) {
        out.push_str("{\"id\":");
        push_json_str(out, &self.spec.id);
        out.push_str(",\"object\":\"");
        out.push_str(object);
        let _ = write!(out, "\",\"created\":{},\"model\":", self.spec.created);
        push_json_str(out, &self.spec.model);
    }

    #[allow(clippy::too_many_arguments)]
    fn chat_chunks(
        &self,
        dialect: Dialect,
        first: bool,
        reasoning_delta: &str,
        content_delta: &str,
        reasoning_count_after: u64,
        finish: Option<&FinishReason>,
        out: &mut String,
    ) {
        let continuous = self.spec.continuous_usage;
        let total = self.completion_tokens;
        match dialect {
            Dialect::Sglang => {
                if first {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}\n\n");
                }
                if !reasoning_delta.is_empty() {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":");
                    push_json_str(out, reasoning_delta);
                    out.push_str(
                        "},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]",
                    );
                    if continuous {
                        let count = if content_delta.is_empty() {
                            total
                        } else {
                            reasoning_count_after.min(total)
                        };
                        out.push_str(",\"usage\":");
                        self.sglang_usage(out, count, false);
                    }
                    out.push_str("}\n\n");
                }
                if !content_delta.is_empty() {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":");
                    push_json_str(out, content_delta);
                    out.push_str(
                        "},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]",
                    );
                    if continuous {
                        out.push_str(",\"usage\":");
                        self.sglang_usage(out, total, false);
                    }
                    out.push_str("}\n\n");
                }
                if let Some(reason) = finish {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":\"");
                    out.push_str(reason.openai());
                    out.push_str("\",\"matched_stop\":");
                    reason.matched_json(out);
                    out.push_str("}]}\n\n");
                }
            }
            Dialect::Vllm => {
                let last_without_usage = finish.is_some() && !self.spec.include_usage;
                if first {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]");
                    if continuous {
                        out.push_str(",\"usage\":");
                        self.vllm_usage(out, 0, true);
                    }
                    out.push_str(",\"prompt_token_ids\":null,\"prompt_text\":null}\n\n");
                }
                // vLLM puts the finish reason on the last delta (which may be empty).
                let mut pieces: Vec<(&str, &str, u64)> = Vec::new();
                if !reasoning_delta.is_empty() {
                    let count = if content_delta.is_empty() {
                        total
                    } else {
                        reasoning_count_after.min(total)
                    };
                    pieces.push(("reasoning", reasoning_delta, count));
                }
                if !content_delta.is_empty() || (pieces.is_empty() && finish.is_some()) {
                    pieces.push(("content", content_delta, total));
                }
                let last = pieces.len().saturating_sub(1);
                for (i, (field, text, count)) in pieces.iter().enumerate() {
                    self.chunk_head(out, "chat.completion.chunk");
                    out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"");
                    out.push_str(field);
                    out.push_str("\":");
                    push_json_str(out, text);
                    out.push_str("},\"logprobs\":null,\"finish_reason\":");
                    match finish.filter(|_| i == last) {
                        Some(reason) => {
                            out.push('"');
                            out.push_str(reason.openai());
                            out.push_str("\",\"stop_reason\":");
                            match reason {
                                FinishReason::StopString(s) => push_json_str(out, s),
                                _ => out.push_str("null"),
                            }
                        }
                        None => out.push_str("null"),
                    }
                    out.push_str(",\"token_ids\":null}]");
                    if continuous {
                        out.push_str(",\"usage\":");
                        self.vllm_usage(out, *count, true);
                    }
                    if last_without_usage && i == last {
                        out.push_str(",\"system_fingerprint\":");
                        push_json_str(out, &self.spec.fingerprint);
                    }
                    out.push_str("}\n\n");
                }
            }
        }
    }

    fn completion_chunk(
        &self,
        dialect: Dialect,
        text: &str,
        finish: Option<&FinishReason>,
        out: &mut String,
    ) {
        let continuous = self.spec.continuous_usage;
        self.chunk_head(out, "text_completion");
        out.push_str(",\"choices\":[{\"index\":0,\"text\":");
        push_json_str(out, text);
        out.push_str(",\"logprobs\":null,\"finish_reason\":");
        match finish {
            Some(reason) => {
                out.push('"');
                out.push_str(reason.openai());
                out.push('"');
            }
            None => out.push_str("null"),
        }
        match dialect {
            Dialect::Sglang => {
                out.push_str(",\"matched_stop\":");
                match finish {
                    Some(reason) => reason.matched_json(out),
                    None => out.push_str("null"),
                }
                out.push_str("}],\"usage\":");
                if continuous {
                    self.sglang_usage(out, self.completion_tokens, false);
                } else {
                    out.push_str("null");
                }
            }
            Dialect::Vllm => {
                out.push_str(",\"stop_reason\":");
                match finish {
                    Some(FinishReason::StopString(s)) => push_json_str(out, s),
                    _ => out.push_str("null"),
                }
                out.push_str(",\"prompt_token_ids\":null,\"token_ids\":null}]");
                if continuous {
                    out.push_str(",\"usage\":");
                    self.vllm_usage(out, self.completion_tokens, true);
                }
                if finish.is_some() && !self.spec.include_usage {
                    out.push_str(",\"system_fingerprint\":");
                    push_json_str(out, &self.spec.fingerprint);
                }
            }
        }
        out.push_str("}\n\n");
    }

    fn generate_chunk(&self, first: bool, finish: Option<&FinishReason>, out: &mut String) {
        out.push_str("data: ");
        self.generate_object(out, first, finish);
        out.push_str("\n\n");
    }

    fn generate_object(&self, out: &mut String, first: bool, finish: Option<&FinishReason>) {
        out.push_str("{\"text\":");
        let mut text = self.reasoning.clone();
        text.push_str(&self.content);
        push_json_str(out, &text);
        out.push_str(",\"output_ids\":[");
        for (i, id) in self.output_ids.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{id}");
        }
        out.push_str("],\"meta_info\":{\"id\":");
        push_json_str(out, &self.spec.id);
        out.push_str(",\"finish_reason\":");
        match finish {
            None => out.push_str("null"),
            Some(FinishReason::Length) => {
                let _ = write!(
                    out,
                    "{{\"type\":\"length\",\"length\":{}}}",
                    self.completion_tokens
                );
            }
            Some(reason @ (FinishReason::Eos(_) | FinishReason::StopString(_))) => {
                out.push_str("{\"type\":\"stop\",\"matched\":");
                reason.matched_json(out);
                out.push('}');
            }
            Some(FinishReason::Abort) => out.push_str(
                "{\"type\":\"abort\",\"message\":null,\"status_code\":null,\"err_type\":null}",
            ),
        }
        let _ = write!(
            out,
            ",\"prompt_tokens\":{},\"weight_version\":\"default\",\"num_retractions\":0,\"reasoning_tokens\":{},\"completion_tokens\":{},\"cached_tokens\":{}",
            self.spec.prompt_tokens, 0, self.completion_tokens, self.cached_tokens
        );
        if first {
            let _ = write!(
                out,
                ",\"response_sent_to_client_ts\":{:.6}",
                unix_seconds_f64()
            );
        }
        if finish.is_some() {
            let e2e = Instant::now()
                .saturating_duration_since(self.spec.started)
                .as_secs_f64();
            let _ = write!(out, ",\"e2e_latency\":{e2e:.6}");
        }
        out.push_str("}}");
    }

    /// sglang `UsageInfo`; `exclude_none` drops the null details (final completions chunk).
    fn sglang_usage(&self, out: &mut String, completion: u64, exclude_none: bool) {
        let prompt = self.spec.prompt_tokens;
        let reasoning = self.reasoning_emitted.min(completion);
        let _ = write!(
            out,
            "{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}",
            prompt + completion
        );
        if self.spec.enable_cache_report {
            let _ = write!(
                out,
                ",\"prompt_tokens_details\":{{\"cached_tokens\":{}}}",
                self.cached_tokens
            );
        } else if !exclude_none {
            out.push_str(",\"prompt_tokens_details\":null");
        }
        let _ = write!(out, ",\"reasoning_tokens\":{reasoning}");
        if reasoning > 0 {
            let _ = write!(
                out,
                ",\"completion_tokens_details\":{{\"reasoning_tokens\":{reasoning}}}"
            );
        } else if !exclude_none {
            out.push_str(",\"completion_tokens_details\":null");
        }
        out.push('}');
    }

    /// vLLM `UsageInfo`: per-chunk usage keeps `completion_tokens_details: null`; the final
    /// usage chunk has only the three counts (and cached tokens when reported).
    fn vllm_usage(&self, out: &mut String, completion: u64, per_chunk: bool) {
        let prompt = self.spec.prompt_tokens;
        let _ = write!(
            out,
            "{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}",
            prompt + completion
        );
        if per_chunk {
            out.push_str(",\"completion_tokens_details\":null");
        } else if self.spec.enable_cache_report && self.cached_tokens > 0 {
            let _ = write!(
                out,
                ",\"prompt_tokens_details\":{{\"cached_tokens\":{}}}",
                self.cached_tokens
            );
        }
        out.push('}');
    }

    /// What a stream sends before any token: Responses' `response.created` and
    /// `response.in_progress` (its headers go out at once); nothing on other routes.
    pub fn stream_preamble(&mut self) -> String {
        let mut out = String::new();
        if self.spec.stream && self.spec.route == Route::Responses {
            self.responses_preamble(&mut out);
        }
        out
    }

    /// After the finish chunk: the usage chunk (when asked for) and `[DONE]`.
    fn stream_tail(&self, out: &mut String) {
        if self.spec.include_usage && self.spec.route != Route::Generate {
            let object = match self.spec.route {
                Route::Chat => "chat.completion.chunk",
                _ => "text_completion",
            };
            // (Event-typed routes never get here: their tails are in `messages`/`responses`.)
            self.chunk_head(out, object);
            out.push_str(",\"choices\":[],\"usage\":");
            match self.spec.dialect {
                Dialect::Sglang => {
                    let exclude_none = self.spec.route == Route::Completion;
                    self.sglang_usage(out, self.completion_tokens, exclude_none);
                }
                Dialect::Vllm => {
                    self.vllm_usage(out, self.completion_tokens, false);
                    out.push_str(",\"system_fingerprint\":");
                    push_json_str(out, &self.spec.fingerprint);
                }
            }
            out.push_str("}\n\n");
        }
        out.push_str("data: [DONE]\n\n");
    }

    fn stream_error(&self, message: &str, out: &mut String) {
        out.push_str("data: ");
        match self.spec.dialect {
            Dialect::Sglang => out.push_str("{\"error\": {\"message\": "),
            Dialect::Vllm => out.push_str("{\"error\": {\"message\": "),
        }
        push_json_str(out, message);
        out.push_str(", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}\n\n");
    }

    /// The whole non-streaming response body, once the request has finished.
    pub fn body(&self) -> String {
        let mut out = String::new();
        let finish = self.finish.clone().unwrap_or(FinishReason::Abort);
        let completion = self.completion_tokens;
        let prompt = self.spec.prompt_tokens;
        match (self.spec.route, self.spec.dialect) {
            (Route::Generate, _) => self.generate_object(&mut out, false, Some(&finish)),
            (Route::Messages, _) => self.messages_body(&mut out, &finish),
            (Route::Responses, _) => self.responses_body(&mut out, &finish),
            (Route::Chat, Dialect::Sglang) => {
                self.object_head(&mut out, "chat.completion");
                out.push_str(
                    ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
                );
                push_json_str(&mut out, &self.content);
                out.push_str(",\"reasoning_content\":");
                if self.spec.reasoning_tokens > 0 {
                    push_json_str(&mut out, &self.reasoning);
                } else {
                    out.push_str("null");
                }
                out.push_str(",\"tool_calls\":null},\"logprobs\":null,\"finish_reason\":\"");
                out.push_str(finish.openai());
                out.push_str("\",\"matched_stop\":");
                finish.matched_json(&mut out);
                out.push_str("}],\"usage\":");
                self.sglang_usage(&mut out, completion, false);
                out.push_str(",\"metadata\":{\"weight_version\":\"default\"}}");
            }
            (Route::Completion, Dialect::Sglang) => {
                self.object_head(&mut out, "text_completion");
                out.push_str(",\"choices\":[{\"index\":0,\"text\":");
                let mut text = self.reasoning.clone();
                text.push_str(&self.content);
                push_json_str(&mut out, &text);
                out.push_str(",\"logprobs\":null,\"finish_reason\":\"");
                out.push_str(finish.openai());
                out.push_str("\",\"matched_stop\":");
                finish.matched_json(&mut out);
                out.push_str("}],\"usage\":");
                self.sglang_usage(&mut out, completion, false);
                out.push('}');
            }
            (Route::Chat, Dialect::Vllm) => {
                self.object_head(&mut out, "chat.completion");
                out.push_str(
                    ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
                );
                push_json_str(&mut out, &self.content);
                out.push_str(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":");
                if self.spec.reasoning_tokens > 0 {
                    push_json_str(&mut out, &self.reasoning);
                } else {
                    out.push_str("null");
                }
                out.push_str("},\"logprobs\":null,\"finish_reason\":\"");
                out.push_str(finish.openai());
                out.push_str("\",\"stop_reason\":");
                match &finish {
                    FinishReason::StopString(s) => push_json_str(&mut out, s),
                    _ => out.push_str("null"),
                }
                out.push_str(",\"token_ids\":null,\"routed_experts\":null}],\"service_tier\":null,\"system_fingerprint\":");
                push_json_str(&mut out, &self.spec.fingerprint);
                let _ = write!(
                    out,
                    ",\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion},\"prompt_tokens_details\":null,\"completion_tokens_details\":null}}",
                    prompt + completion
                );
                out.push_str(",\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}");
            }
            (Route::Completion, Dialect::Vllm) => {
                self.object_head(&mut out, "text_completion");
                out.push_str(",\"choices\":[{\"index\":0,\"text\":");
                let mut text = self.reasoning.clone();
                text.push_str(&self.content);
                push_json_str(&mut out, &text);
                out.push_str(",\"logprobs\":null,\"finish_reason\":\"");
                out.push_str(finish.openai());
                out.push_str("\",\"stop_reason\":");
                match &finish {
                    FinishReason::StopString(s) => push_json_str(&mut out, s),
                    _ => out.push_str("null"),
                }
                out.push_str(",\"prompt_token_ids\":null,\"token_ids\":null}],\"service_tier\":null,\"system_fingerprint\":");
                push_json_str(&mut out, &self.spec.fingerprint);
                let _ = write!(
                    out,
                    ",\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion},\"prompt_tokens_details\":null}},\"kv_transfer_params\":null}}",
                    prompt + completion
                );
            }
        }
        out
    }
}

pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn unix_seconds_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(route: Route, dialect: Dialect) -> OutputSpec {
        OutputSpec {
            route,
            dialect,
            stream: true,
            id: "abc".into(),
            created: 1767225600,
            model: "m".into(),
            include_usage: true,
            continuous_usage: false,
            prompt_tokens: 12,
            reasoning_tokens: 0,
            stop: vec![],
            eos_token_id: 7,
            enable_cache_report: false,
            request_seed: 1,
            started: Instant::now(),
            fingerprint: "vllm-0.32.0-tokentap".into(),
        }
    }

    fn out(tokens: u32, finish: Option<Finish>) -> Event {
        Event::Output {
            new_tokens: tokens,
            cached_tokens: 0,
            finish,
        }
    }

    #[test]
    fn sglang_chat_stream_matches_the_reference_shape() {
        let mut r = Renderer::new(spec(Route::Chat, Dialect::Sglang));
        let mut s = String::new();
        assert_eq!(r.on_event(out(1, None), &mut s), Progress::Continue);
        assert_eq!(
            r.on_event(out(1, Some(Finish::Length)), &mut s),
            Progress::Done
        );
        let lines: Vec<&str> = s.split("\n\n").filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 6, "{s}");
        assert_eq!(lines[0], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}");
        assert!(lines[1].starts_with("data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":\" "));
        assert_eq!(lines[3], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":\"length\",\"matched_stop\":null}]}");
        assert_eq!(lines[4], "data: {\"id\":\"abc\",\"object\":\"chat.completion.chunk\",\"created\":1767225600,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":14,\"completion_tokens\":2,\"prompt_tokens_details\":null,\"reasoning_tokens\":0,\"completion_tokens_details\":null}}");
        assert_eq!(lines[5], "data: [DONE]");
        for line in &lines[..5] {
            let _: serde_json::Value = serde_json::from_str(&line[6..]).unwrap();
        }
    }

    #[test]
    fn stop_string_truncates_and_finishes() {
        let mut sp = spec(Route::Completion, Dialect::Sglang);
        sp.stop = vec![FILLER_PROBE.to_owned()];
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        let mut progress = Progress::Continue;
        for _ in 0..2000 {
            progress = r.on_event(out(3, None), &mut s);
            if progress != Progress::Continue {
                break;
            }
        }
        assert_eq!(progress, Progress::DoneByStopString);
        assert!(s.contains("\"finish_reason\":\"stop\",\"matched_stop\":\"model\""));
        assert!(!s.contains(" model\""));
    }

    const FILLER_PROBE: &str = "model";

    #[test]
    fn messages_stream_has_sglangs_event_shapes() {
        let mut sp = spec(Route::Messages, Dialect::Sglang);
        sp.id = "msg_1".into();
        sp.reasoning_tokens = 1;
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        assert!(r.stream_preamble().is_empty());
        r.on_event(out(1, None), &mut s);
        assert_eq!(
            r.on_event(out(1, Some(Finish::Length)), &mut s),
            Progress::Done
        );
        let blocks: Vec<&str> = s.split("\n\n").filter(|b| !b.is_empty()).collect();
        assert_eq!(blocks[0], "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"usage\":{\"input_tokens\":12,\"output_tokens\":0,\"cache_read_input_tokens\":0}}}");
        assert_eq!(blocks[1], "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"},\"index\":0}");
        assert!(blocks[2].starts_with("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\" "));
        assert_eq!(
            blocks[3],
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}"
        );
        assert!(blocks[4].ends_with("{\"type\":\"text\",\"text\":\"\"},\"index\":1}"));
        assert!(blocks[5].contains("{\"type\":\"text_delta\",\"text\":\" "));
        assert!(blocks[5].ends_with("\"},\"index\":1}"));
        assert_eq!(blocks[7], "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":12,\"output_tokens\":2,\"cache_read_input_tokens\":0}}");
        assert_eq!(
            blocks[8],
            "event: message_stop\ndata: {\"type\":\"message_stop\"}"
        );
        assert_eq!(blocks.len(), 9, "{s}");
        assert!(!s.contains("[DONE]"));
    }

    #[test]
    fn responses_stream_numbers_its_events() {
        let mut sp = spec(Route::Responses, Dialect::Sglang);
        sp.id = "resp_1".into();
        let mut r = Renderer::new(sp);
        let mut s = r.stream_preamble();
        assert!(s.starts_with("event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1767225600,\"model\":\"m\",\"output\":[],\"status\":\"in_progress\",\"incomplete_details\":null,\"usage\":null},\"sequence_number\":0,\"type\":\"response.created\"}\n\n"), "{s}");
        r.on_event(out(2, Some(Finish::Length)), &mut s);
        let blocks: Vec<&str> = s.split("\n\n").filter(|b| !b.is_empty()).collect();
        let kinds: Vec<&str> = blocks
            .iter()
            .map(|b| &b["event: ".len()..b.find('\n').unwrap()])
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, block) in blocks.iter().enumerate() {
            let data: serde_json::Value =
                serde_json::from_str(&block[block.find("data: ").unwrap() + 6..]).unwrap();
            assert_eq!(data["sequence_number"], i as u64);
            assert_eq!(data["type"], kinds[i]);
        }
        assert!(blocks[8].contains("\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":2,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":14}"));
        assert!(!s.contains("[DONE]"));
    }

    #[test]
    fn vllm_chat_stream_puts_finish_on_last_delta() {
        let mut sp = spec(Route::Chat, Dialect::Vllm);
        sp.include_usage = false;
        sp.id = "chatcmpl-1".into();
        let mut r = Renderer::new(sp);
        let mut s = String::new();
        r.on_event(out(1, None), &mut s);
        r.on_event(out(1, Some(Finish::Length)), &mut s);
        let lines: Vec<&str> = s.split("\n\n").filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 4, "{s}");
        assert!(lines[0]
            .ends_with("\"finish_reason\":null}],\"prompt_token_ids\":null,\"prompt_text\":null}"));
        assert!(lines[2].contains("\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":null}],\"system_fingerprint\":\"vllm-0.32.0-tokentap\"}"));
    }
}
