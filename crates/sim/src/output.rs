//! One request's output, whatever the API: the words of each scheduler step (filler text,
//! split into reasoning and content), stop-string matching, the running counts, and why the
//! output ended. The API modules turn a [`Step`] into their bytes; this module writes none.
use std::fmt::Write as _;

use tokio::time::Instant;

use super::json_out::push_json_str;
use super::options::Dialect;
use super::request::Api;
use super::scheduler::Finish;
use super::text::FillerText;

/// Everything about one request that shapes its output.
#[derive(Debug, Clone)]
pub struct OutputSpec {
    pub api: Api,
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
    /// The OpenAI `finish_reason`.
    pub fn openai(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos(_) | FinishReason::StopString(_) => "stop",
            FinishReason::Abort => "abort",
        }
    }

    /// sglang's `matched_stop` / `matched`: the EOS id, the stop string, or `null`.
    pub fn write_matched(&self, out: &mut String) {
        match self {
            FinishReason::Eos(id) => {
                let _ = write!(out, "{id}");
            }
            FinishReason::StopString(s) => push_json_str(out, s),
            _ => out.push_str("null"),
        }
    }

    /// vLLM's `stop_reason`: the stop string, or `null`.
    pub fn write_stop_reason(&self, out: &mut String) {
        match self {
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

/// A kind of output: the reasoning block/item or the text block/item of event-typed APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Reasoning,
    Text,
}

/// The words one scheduler step produced.
#[derive(Debug, Default)]
pub struct Step {
    /// The first step of the request (the role chunk goes with it).
    pub first: bool,
    pub reasoning_delta: String,
    pub content_delta: String,
    /// Reasoning tokens emitted so far, after this step.
    pub reasoning_count_after: u64,
    pub finish: Option<FinishReason>,
    /// A stop string ended the output (the scheduler still holds the request).
    pub stopped: bool,
}

/// Per-request output state shared by every API.
#[derive(Debug)]
pub struct Output {
    pub spec: OutputSpec,
    text: FillerText,
    pub completion_tokens: u64,
    pub reasoning_emitted: u64,
    pub cached_tokens: u64,
    started_output: bool,
    /// When the first scheduler output was produced (sglang's `/generate` reports the time to
    /// it as `first_token_latency`).
    pub first_output_at: Option<Instant>,
    /// Cumulative content (non-stream bodies, `/generate`, Responses' `.done` events).
    pub content: String,
    pub reasoning: String,
    pub output_ids: Vec<u32>,
    stop_tail: String,
    max_stop_len: usize,
    pub finish: Option<FinishReason>,
}

impl Output {
    pub fn new(spec: OutputSpec) -> Output {
        let max_stop_len = spec.stop.iter().map(String::len).max().unwrap_or(0);
        Output {
            text: FillerText::new(spec.request_seed),
            spec,
            completion_tokens: 0,
            reasoning_emitted: 0,
            cached_tokens: 0,
            started_output: false,
            first_output_at: None,
            content: String::new(),
            reasoning: String::new(),
            output_ids: Vec::new(),
            stop_tail: String::new(),
            max_stop_len,
            finish: None,
        }
    }

    /// Produce the words of one scheduler output of `new_tokens` tokens.
    pub fn advance(&mut self, new_tokens: u32, cached_tokens: u64, finish: Option<Finish>) -> Step {
        self.cached_tokens = cached_tokens;
        let first = !self.started_output;
        self.started_output = true;
        if first {
            self.first_output_at = Some(Instant::now());
        }

        let mut reasoning_delta = String::new();
        let mut content_delta = String::new();
        let mut stopped: Option<String> = None;
        let keeps_ids = self.spec.api == Api::Generate || !self.spec.stream;
        for _ in 0..new_tokens {
            let (word, id) = self.text.next_token();
            self.completion_tokens += 1;
            if keeps_ids {
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
                // Keep enough tail to match the longest stop string across steps, trimmed
                // in batches so the tail is not shifted on every word.
                let keep = self.max_stop_len + 32;
                if self.stop_tail.len() > 2 * keep {
                    let drop = self.stop_tail.len() - keep;
                    self.stop_tail.drain(..drop);
                }
            }
        }
        let stopped_by_string = stopped.is_some();
        let finish = match (stopped, finish) {
            (Some(stop), _) => Some(FinishReason::StopString(stop)),
            (None, Some(Finish::Length)) => Some(FinishReason::Length),
            (None, Some(Finish::Eos)) => Some(FinishReason::Eos(self.spec.eos_token_id)),
            (None, Some(Finish::Abort)) => Some(FinishReason::Abort),
            (None, None) => None,
        };
        if !self.spec.stream || matches!(self.spec.api, Api::Generate | Api::Responses) {
            // Whole bodies, `/generate` chunks and Responses' `.done` events repeat the whole
            // text so far.
            self.reasoning.push_str(&reasoning_delta);
            self.content.push_str(&content_delta);
        }
        Step {
            first,
            reasoning_delta,
            content_delta,
            reasoning_count_after: self.reasoning_emitted,
            finish,
            stopped: stopped_by_string,
        }
    }

    /// Reasoning followed by content: the text of APIs that do not separate them.
    pub fn whole_text(&self) -> String {
        let mut text = self.reasoning.clone();
        text.push_str(&self.content);
        text
    }
}
