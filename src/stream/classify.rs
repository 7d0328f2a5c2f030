//! What one SSE event means for measurement, per route dialect.
//!
//! [`EventClassifier`] reads an event's `event:` name and JSON payload (through the
//! allocation-free navigator in [`super::json`]) and says whether it carried generated output,
//! how many tokens it carried, and what usage, error or end-of-stream facts it reported. It
//! keeps the little per-stream state a dialect needs (cumulative usage per choice, the length
//! of `/generate`'s cumulative text) in fixed arrays: no allocation, no I/O, no clock.
//!
//! First-token rule: only non-empty generated output counts — content,
//! reasoning/reasoning_content, tool_calls, completion text, `/generate` text growth,
//! `content_block_delta`, Responses `*.delta`. Role-only, empty, usage-only and keep-alive
//! events never count. Each output event also says whether it carried answer text or a
//! tool call (reasoning alone is neither), for the first answer and tool-call times.

use super::json::{self, Member, Span};
use crate::base::Route;
use crate::meter::Usage;

/// What one event means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventFacts {
    /// The event carried non-empty generated output (a "token event"): reasoning, answer
    /// text or a tool call.
    pub output: bool,
    /// Of which answer text (`content`, completion text, a Messages `text` delta, a Responses
    /// output-text delta): the first one is the time to the first answer token.
    pub answer: bool,
    /// Of which a tool-call delta (`tool_calls`, a Messages `input_json_delta`, a Responses
    /// function-call-arguments delta).
    pub tool_call: bool,
    /// Tokens this event carried. Exact when `exact`, else one per output event.
    pub tokens: u64,
    /// `tokens` came from usage differences, not from counting events.
    pub exact: bool,
    /// The stream's own end marker (`[DONE]`, `message_stop`, `response.completed`…).
    pub terminal: bool,
    /// An error event or an `{"error": …}` payload.
    pub error: bool,
    /// The error (or sglang `/generate`'s abort) says the engine refused the request for load:
    /// its status code is 429 or 503 (sglang's queue-full and priority-preemption aborts,
    /// vLLM's queue caps), or a Messages error is `overloaded_error`/`rate_limit_error`.
    pub shed: bool,
}

/// The counts an OpenAI `usage` object carries, read in one walk over its members (it is read
/// on every event of a stream with continuous usage: one lookup per field walked it six times).
/// Reasoning tokens: vLLM and OpenAI nest them in `completion_tokens_details`, sglang puts a
/// top-level `reasoning_tokens` in its usage (read only where the first is absent).
fn openai_usage(data: &[u8], usage: Span) -> Usage {
    let [prompt, completion, completion_details, reasoning, prompt_details] = json::last_members(
        data,
        usage.start,
        [
            b"prompt_tokens",
            b"completion_tokens",
            b"completion_tokens_details",
            b"reasoning_tokens",
            b"prompt_tokens_details",
        ],
    );
    let count = |member: Option<Member>| member.and_then(|m| json::as_u64(data, m.value));
    let nested = |member: Option<Member>, key: &[u8]| {
        member.and_then(|m| json::get(data, m.value.start, key))
    };
    // The nested figure wins when its member is there at all (even when not a count), as a
    // path lookup falling back to the top-level one did.
    let reasoning = nested(completion_details, b"reasoning_tokens")
        .or(reasoning.map(|m| m.value))
        .and_then(|s| json::as_u64(data, s));
    Usage {
        prompt_tokens: count(prompt),
        completion_tokens: count(completion),
        reasoning_tokens: reasoning,
        cached_tokens: nested(prompt_details, b"cached_tokens").and_then(|s| json::as_u64(data, s)),
    }
}

/// The most choices (`n`) tracked separately; further indices share the last slot, which
/// only makes their per-event counts approximate.
const MAX_CHOICES: usize = 8;

/// Per-stream interpretation state.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct EventClassifier {
    // Declaration order kept (`repr(C)`): what every event updates first, so an event of a
    // stream whose state is cold in the cache reads one or two lines of it.
    /// Output events counted, for when no usage ever arrives.
    output_events: u64,
    /// Sum of exact per-event token counts.
    exact_tokens: u64,
    route: Route,
    /// Every output event so far had an exact token count.
    all_exact: bool,
    error_seen: bool,
    /// An error event said the engine shed the request ([`EventFacts::shed`]).
    shed_seen: bool,
    terminal_seen: bool,
    /// A usage report with `choices: []` (or the dialect's final usage event) was seen.
    final_usage_seen: bool,
    /// Cumulative completion tokens per choice index, from per-chunk usage.
    cumulative: [u64; MAX_CHOICES],
    /// Usage as last reported; the final report wins.
    usage: Usage,
    /// Raw length of `/generate`'s cumulative text per index.
    generate_text_len: [usize; MAX_CHOICES],
}

impl EventClassifier {
    pub fn new(route: Route) -> Self {
        Self {
            route,
            cumulative: [0; MAX_CHOICES],
            generate_text_len: [0; MAX_CHOICES],
            usage: Usage::default(),
            final_usage_seen: false,
            output_events: 0,
            exact_tokens: 0,
            all_exact: true,
            error_seen: false,
            shed_seen: false,
            terminal_seen: false,
        }
    }

    pub fn route(&self) -> Route {
        self.route
    }

    /// Usage as reported so far (the upstream's last word).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Completion tokens: from usage when the upstream reported it, else the count of output
    /// events (then `completion_exact()` is false).
    pub fn completion_tokens(&self) -> u64 {
        match self.usage.completion_tokens {
            Some(n) => n,
            None if self.all_exact && self.exact_tokens > 0 => self.exact_tokens,
            None => self.output_events,
        }
    }

    /// True if `completion_tokens()` is an upstream count rather than an estimate.
    pub fn completion_exact(&self) -> bool {
        self.usage.completion_tokens.is_some() || (self.all_exact && self.exact_tokens > 0)
    }

    /// Every output event had an exact per-event token count (continuous usage stats).
    pub fn per_event_exact(&self) -> bool {
        self.all_exact && self.output_events > 0
    }

    pub fn error_seen(&self) -> bool {
        self.error_seen
    }

    /// An error event or body said the engine shed the request (status code 429 or 503 in
    /// it): the request's outcome is `shed`, not `upstream_error`.
    pub fn shed_seen(&self) -> bool {
        self.shed_seen
    }

    pub fn terminal_seen(&self) -> bool {
        self.terminal_seen
    }

    pub fn output_events(&self) -> u64 {
        self.output_events
    }

    /// Interprets one SSE event.
    pub fn observe(&mut self, name: &[u8], data: &[u8]) -> EventFacts {
        let data = trim(data);
        let mut facts = match self.route {
            Route::ChatCompletions | Route::Completions => self.openai(data),
            Route::Generate => self.generate(data),
            Route::Messages => self.messages(name, data),
            Route::Responses => self.responses(name, data),
        };
        if facts.output {
            self.output_events = self.output_events.saturating_add(1);
            if facts.exact {
                self.exact_tokens = self.exact_tokens.saturating_add(facts.tokens);
            } else {
                self.all_exact = false;
                facts.tokens = facts.tokens.max(1);
            }
        } else if facts.tokens > 0 && facts.exact {
            // Tokens that produced no visible text yet (held-back partial UTF-8, a swallowed
            // `<think>`): they still count as generated.
            self.exact_tokens = self.exact_tokens.saturating_add(facts.tokens);
        }
        self.error_seen |= facts.error;
        self.shed_seen |= facts.shed;
        self.terminal_seen |= facts.terminal;
        facts
    }

    /// Interprets a complete non-streamed JSON response body.
    pub fn observe_body(&mut self, body: &[u8]) {
        let body = trim(body);
        if let Some(error) = json::top(body, b"error").filter(|s| !json::is_null(body, *s)) {
            self.error_seen = true;
            self.shed_seen |= shed_error(body, error);
        }
        match self.route {
            Route::ChatCompletions | Route::Completions => {
                if let Some(usage) = json::top(body, b"usage") {
                    self.apply_openai_usage(openai_usage(body, usage));
                    self.final_usage_seen = true;
                }
            }
            Route::Generate => {
                // `/generate` answers an object, or an array of them for batches.
                let first = json::skip_ws(body, 0);
                if body.get(first) == Some(&b'[') {
                    let mut sum = Usage::default();
                    for element in json::elements(body, first) {
                        let u = generate_usage(body, element.start);
                        sum.prompt_tokens = add_opt(sum.prompt_tokens, u.prompt_tokens);
                        sum.completion_tokens = add_opt(sum.completion_tokens, u.completion_tokens);
                        sum.cached_tokens = add_opt(sum.cached_tokens, u.cached_tokens);
                    }
                    self.usage = sum;
                } else {
                    self.usage = generate_usage(body, first);
                }
            }
            Route::Messages => {
                if let Some(usage) = json::top(body, b"usage") {
                    self.read_anthropic_usage(body, usage);
                }
            }
            Route::Responses => {
                if let Some(usage) = json::top(body, b"usage") {
                    self.read_responses_usage(body, usage);
                }
            }
        }
    }

    fn openai(&mut self, data: &[u8]) -> EventFacts {
        let mut facts = EventFacts::default();
        if data == b"[DONE]" {
            facts.terminal = true;
            return facts;
        }
        // One pass over the top-level members: this runs for every event.
        let mut choices = None;
        let mut usage = None;
        for member in json::members(data, 0) {
            match member.key.bytes(data) {
                b"\"choices\"" => choices = Some(member.value),
                b"\"usage\"" if !json::is_null(data, member.value) => usage = Some(member.value),
                b"\"error\"" if !json::is_null(data, member.value) => {
                    facts.error = true;
                    facts.shed = shed_error(data, member.value);
                }
                _ => {}
            }
        }
        let mut index = 0usize;
        let mut has_choices = false;
        if let Some(choices) = choices {
            for choice in json::elements(data, choices.start) {
                has_choices = true;
                // One walk over the choice's members for everything read from it (each
                // lookup on its own walked them again, skipping the delta each time).
                let [index_member, delta, text] =
                    json::last_members(data, choice.start, [b"index", b"delta", b"text"]);
                if let Some(i) = index_member {
                    index = json::as_u64(data, i.value).map_or(0, |i| i as usize);
                }
                let kinds = self.choice_output(data, delta, text);
                facts.output |= kinds.output;
                facts.answer |= kinds.answer;
                facts.tool_call |= kinds.tool_call;
            }
        }
        if let Some(usage) = usage {
            let usage = openai_usage(data, usage);
            let completion = usage.completion_tokens;
            if has_choices {
                // Per-chunk (continuous) usage: cumulative for this choice index.
                if let Some(cumulative) = completion {
                    let slot = self.cumulative.get_mut(index.min(MAX_CHOICES - 1));
                    if let Some(slot) = slot {
                        facts.tokens = cumulative.saturating_sub(*slot);
                        facts.exact = true;
                        *slot = cumulative.max(*slot);
                    }
                }
                if !self.final_usage_seen {
                    self.apply_openai_usage(usage);
                    let sum = saturating_sum(&self.cumulative);
                    self.usage.completion_tokens = Some(sum);
                }
            } else {
                // The final usage chunk (`choices: []`): authoritative totals.
                self.apply_openai_usage(usage);
                self.final_usage_seen = true;
            }
        }
        facts
    }

    /// What output one choice of an OpenAI chunk carried, from its `delta` and `text` members.
    fn choice_output(
        &self,
        data: &[u8],
        delta: Option<Member>,
        text: Option<Member>,
    ) -> EventFacts {
        let mut kinds = EventFacts::default();
        match self.route {
            Route::Completions => {
                kinds.answer = text.is_some_and(|s| json::is_nonempty_string(data, s.value));
            }
            _ => {
                let Some(delta) = delta else {
                    return kinds;
                };
                for m in json::members(data, delta.value.start) {
                    match m.key.bytes(data) {
                        b"\"content\"" => kinds.answer |= json::is_nonempty_string(data, m.value),
                        b"\"reasoning_content\"" | b"\"reasoning\"" => {
                            kinds.output |= json::is_nonempty_string(data, m.value);
                        }
                        b"\"tool_calls\"" => {
                            kinds.tool_call |= json::is_nonempty_array(data, m.value);
                        }
                        _ => {}
                    }
                }
            }
        }
        kinds.output |= kinds.answer || kinds.tool_call;
        kinds
    }

    /// What a usage object said replaces what was known; what it left out stays.
    fn apply_openai_usage(&mut self, usage: Usage) {
        let known = &mut self.usage;
        known.prompt_tokens = usage.prompt_tokens.or(known.prompt_tokens);
        known.completion_tokens = usage.completion_tokens.or(known.completion_tokens);
        known.reasoning_tokens = usage.reasoning_tokens.or(known.reasoning_tokens);
        known.cached_tokens = usage.cached_tokens.or(known.cached_tokens);
    }

    fn generate(&mut self, data: &[u8]) -> EventFacts {
        let mut facts = EventFacts::default();
        if data == b"[DONE]" {
            facts.terminal = true;
            return facts;
        }
        if let Some(error) = json::top(data, b"error").filter(|s| !json::is_null(data, *s)) {
            facts.error = true;
            facts.shed = shed_error(data, error);
            return facts;
        }
        // sglang's abort of a request it shed after accepting it (queue full, preempted by a
        // higher priority request): `meta_info.finish_reason` `{"type":"abort",
        // "status_code":503,…}`.
        if let Some(reason) = json::path(data, 0, &[b"meta_info", b"finish_reason"]) {
            // Only a shed status makes it one: an abort the client asked for (`abort_request`,
            // the sweep's own) stays what it was.
            if json::get(data, reason.start, b"type")
                .is_some_and(|t| json::string_eq(data, t, b"abort"))
                && shed_error(data, reason)
            {
                facts.error = true;
                facts.shed = true;
            }
        }
        let index = json::top(data, b"index")
            .and_then(|s| json::as_u64(data, s))
            .map_or(0, |i| (i as usize).min(MAX_CHOICES - 1));
        let usage = generate_usage(data, 0);
        let text_len = json::top(data, b"text").and_then(|s| json::string_raw_len(data, s));
        if let Some(cumulative) = usage.completion_tokens {
            if let Some(slot) = self.cumulative.get_mut(index) {
                facts.tokens = cumulative.saturating_sub(*slot);
                facts.exact = true;
                *slot = cumulative.max(*slot);
            }
            let sum = saturating_sum(&self.cumulative);
            self.usage.completion_tokens = Some(sum);
        }
        if let Some(p) = usage.prompt_tokens {
            self.usage.prompt_tokens = Some(p);
        }
        if let Some(c) = usage.cached_tokens {
            self.usage.cached_tokens = Some(c);
        }
        if let (Some(len), Some(previous)) = (text_len, self.generate_text_len.get_mut(index)) {
            // Default sglang streams cumulative text; `--incremental-streaming-output` streams
            // deltas. Either way, new visible output shows as a non-empty text whose length
            // changed, or as new tokens alongside non-empty text.
            facts.output = len > 0 && (len != *previous || facts.tokens > 0);
            // `/generate` streams the text as generated, reasoning markers included: all of
            // it is answer text to its client.
            facts.answer = facts.output;
            *previous = len;
        }
        facts
    }

    fn messages(&mut self, name: &[u8], data: &[u8]) -> EventFacts {
        let mut facts = EventFacts::default();
        let kind = event_type(name, data);
        match kind {
            b"content_block_delta" => {
                if let Some(delta) = json::top(data, b"delta") {
                    for m in json::members(data, delta.start) {
                        let nonempty = || json::is_nonempty_string(data, m.value);
                        match m.key.bytes(data) {
                            b"\"text\"" => facts.answer |= nonempty(),
                            b"\"partial_json\"" => facts.tool_call |= nonempty(),
                            b"\"thinking\"" => facts.output |= nonempty(),
                            _ => {}
                        }
                    }
                    facts.output |= facts.answer || facts.tool_call;
                }
            }
            b"message_start" => {
                if let Some(usage) = json::path(data, 0, &[b"message", b"usage"]) {
                    self.read_anthropic_usage(data, usage);
                }
            }
            b"message_delta" => {
                if let Some(usage) = json::top(data, b"usage") {
                    self.read_anthropic_usage(data, usage);
                }
            }
            b"message_stop" => facts.terminal = true,
            b"error" => {
                facts.error = true;
                facts.shed = json::path(data, 0, &[b"error", b"type"]).is_some_and(|t| {
                    json::string_eq(data, t, b"overloaded_error")
                        || json::string_eq(data, t, b"rate_limit_error")
                });
            }
            _ => {}
        }
        facts
    }

    fn read_anthropic_usage(&mut self, data: &[u8], usage: Span) {
        let field =
            |key: &[u8]| json::get(data, usage.start, key).and_then(|s| json::as_u64(data, s));
        let cached = field(b"cache_read_input_tokens");
        if let Some(input) = field(b"input_tokens") {
            // sglang's and vLLM's Messages `input_tokens` is the whole prompt, cache reads
            // included (unlike Anthropic's own API, which counts them apart).
            self.usage.prompt_tokens = Some(input);
        }
        if let Some(output) = field(b"output_tokens") {
            self.usage.completion_tokens = Some(output);
        }
        if cached.is_some() {
            self.usage.cached_tokens = cached;
        }
    }

    fn responses(&mut self, name: &[u8], data: &[u8]) -> EventFacts {
        let mut facts = EventFacts::default();
        let kind = event_type(name, data);
        if kind.starts_with(b"response.") && kind.ends_with(b".delta") {
            facts.output =
                json::top(data, b"delta").is_some_and(|s| json::is_nonempty_string(data, s));
            if facts.output {
                let has = |part: &[u8]| kind.windows(part.len()).any(|w| w == part);
                if has(b"function_call") || has(b"custom_tool_call") || has(b"mcp_call") {
                    facts.tool_call = true;
                } else if !has(b"reasoning") {
                    // `response.output_text.delta`, `response.refusal.delta`, …
                    facts.answer = true;
                }
            }
        } else if matches!(
            kind,
            b"response.completed" | b"response.incomplete" | b"response.failed"
        ) {
            facts.terminal = true;
            facts.error = kind == b"response.failed";
            if let Some(usage) = json::path(data, 0, &[b"response", b"usage"]) {
                self.read_responses_usage(data, usage);
            }
        } else if kind == b"error" {
            facts.error = true;
        }
        facts
    }

    fn read_responses_usage(&mut self, data: &[u8], usage: Span) {
        let field =
            |key: &[u8]| json::get(data, usage.start, key).and_then(|s| json::as_u64(data, s));
        if let Some(input) = field(b"input_tokens") {
            self.usage.prompt_tokens = Some(input);
        }
        if let Some(output) = field(b"output_tokens") {
            self.usage.completion_tokens = Some(output);
        }
        if let Some(reasoning) = json::path(
            data,
            usage.start,
            &[b"output_tokens_details", b"reasoning_tokens"],
        )
        .and_then(|s| json::as_u64(data, s))
        {
            self.usage.reasoning_tokens = Some(reasoning);
        }
        if let Some(cached) = json::path(
            data,
            usage.start,
            &[b"input_tokens_details", b"cached_tokens"],
        )
        .and_then(|s| json::as_u64(data, s))
        {
            self.usage.cached_tokens = Some(cached);
        }
    }
}

/// `/generate`'s `meta_info` counts of the object at `start`.
fn generate_usage(data: &[u8], start: usize) -> Usage {
    let meta = json::get(data, start, b"meta_info");
    let field = |key: &[u8]| {
        meta.and_then(|m| json::get(data, m.start, key))
            .and_then(|s| json::as_u64(data, s))
    };
    Usage {
        prompt_tokens: field(b"prompt_tokens"),
        completion_tokens: field(b"completion_tokens"),
        cached_tokens: field(b"cached_tokens"),
        reasoning_tokens: None,
    }
}

/// Whether the error object (or abort finish reason) at `error` carries a shed status:
/// `code` or `status_code` 429 or 503, as a number or a string.
fn shed_error(data: &[u8], error: Span) -> bool {
    [b"code".as_slice(), b"status_code"].iter().any(|key| {
        json::get(data, error.start, key).is_some_and(|span| {
            json::as_u64(data, span).is_some_and(is_shed_status)
                || json::string_eq(data, span, b"429")
                || json::string_eq(data, span, b"503")
        })
    })
}

/// The HTTP statuses that mean the server refused the request for load: 429 Too Many Requests
/// and 503 Service Unavailable (with or without `Retry-After`).
pub fn is_shed_status(status: u64) -> bool {
    status == 429 || status == 503
}

fn add_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// The choices' cumulative counts together; a sum past u64::MAX stays at u64::MAX (the meter
/// then clamps it like any absurd count) instead of wrapping to a small number.
fn saturating_sum(counts: &[u64]) -> u64 {
    counts.iter().fold(0u64, |sum, &n| sum.saturating_add(n))
}

/// The event type: the `event:` field, else the payload's `"type"` string (without quotes).
fn event_type<'a>(name: &'a [u8], data: &'a [u8]) -> &'a [u8] {
    if !name.is_empty() {
        return name;
    }
    json::top(data, b"type")
        .map(|s| s.bytes(data))
        .filter(|raw| raw.len() >= 2 && raw.first() == Some(&b'"'))
        .and_then(|raw| raw.get(1..raw.len() - 1))
        .unwrap_or_default()
}

fn trim(data: &[u8]) -> &[u8] {
    let start = data
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(data.len());
    let end = data
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    data.get(start..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(route: Route, events: &[(&str, &str)]) -> (EventClassifier, Vec<EventFacts>) {
        let mut c = EventClassifier::new(route);
        let facts = events
            .iter()
            .map(|(name, data)| c.observe(name.as_bytes(), data.as_bytes()))
            .collect();
        (c, facts)
    }

    #[test]
    fn sglang_chat_role_chunk_is_not_output() {
        let (c, f) = run(
            Route::ChatCompletions,
            &[
                (
                    "",
                    r#"{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}]}"#,
                ),
                (
                    "",
                    r#"{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":null,"content":"Hello"},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":{"prompt_tokens":12,"total_tokens":13,"completion_tokens":1}}"#,
                ),
                (
                    "",
                    r#"{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":null,"content":"! How"},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}"#,
                ),
                (
                    "",
                    r#"{"id":"a","choices":[{"index":0,"delta":{"reasoning_content":null},"logprobs":null,"finish_reason":"length","matched_stop":null}]}"#,
                ),
                (
                    "",
                    r#"{"id":"a","choices":[],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#,
                ),
                ("", "[DONE]"),
            ],
        );
        let outputs: Vec<bool> = f.iter().map(|f| f.output).collect();
        assert_eq!(outputs, [false, true, true, false, false, false]);
        assert_eq!(f[1].tokens, 1);
        assert_eq!(f[2].tokens, 2);
        assert!(f[2].exact);
        assert!(f[5].terminal);
        assert_eq!(c.completion_tokens(), 3);
        assert!(c.completion_exact());
        assert!(c.per_event_exact());
        assert_eq!(
            c.usage(),
            Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(3),
                cached_tokens: Some(8),
                reasoning_tokens: None,
            }
        );
    }

    #[test]
    fn each_output_event_says_whether_it_carried_answer_text_or_a_tool_call() {
        let mut chat = EventClassifier::new(Route::ChatCompletions);
        let reasoning = chat.observe(
            b"",
            br#"{"choices":[{"index":0,"delta":{"reasoning_content":"Let"}}]}"#,
        );
        assert!(reasoning.output && !reasoning.answer && !reasoning.tool_call);
        let answer = chat.observe(
            b"",
            br#"{"choices":[{"index":0,"delta":{"reasoning_content":null,"content":"42"}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":4}}}"#,
        );
        assert!(answer.output && answer.answer && !answer.tool_call);
        assert_eq!(chat.usage().reasoning_tokens, Some(4));
        let tool = chat.observe(
            b"",
            br#"{"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
        );
        assert!(tool.output && tool.tool_call && !tool.answer);
        // A tool-call delta with an empty list and no content is no output at all.
        let empty = chat.observe(
            b"",
            br#"{"choices":[{"index":0,"delta":{"content":null,"tool_calls":[]}}]}"#,
        );
        assert!(!empty.output && !empty.answer && !empty.tool_call);
        // sglang reports reasoning tokens at the top of its usage.
        let mut sglang = EventClassifier::new(Route::ChatCompletions);
        sglang.observe(
            b"",
            br#"{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":40,"reasoning_tokens":25,"completion_tokens_details":null}}"#,
        );
        assert_eq!(sglang.usage().reasoning_tokens, Some(25));

        let mut messages = EventClassifier::new(Route::Messages);
        let thinking = messages.observe(
            b"content_block_delta",
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
        );
        assert!(thinking.output && !thinking.answer);
        let tool_input = messages.observe(
            b"content_block_delta",
            br#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
        );
        assert!(tool_input.tool_call && !tool_input.answer);

        let mut responses = EventClassifier::new(Route::Responses);
        let summary = responses.observe(
            b"response.reasoning_summary_text.delta",
            br#"{"type":"response.reasoning_summary_text.delta","delta":"x"}"#,
        );
        assert!(summary.output && !summary.answer && !summary.tool_call);
        let arguments = responses.observe(
            b"response.function_call_arguments.delta",
            br#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
        );
        assert!(arguments.tool_call && !arguments.answer);
        let text = responses.observe(
            b"response.output_text.delta",
            br#"{"type":"response.output_text.delta","delta":"Hi"}"#,
        );
        assert!(text.answer);
    }

    #[test]
    fn vllm_reasoning_and_tool_calls_count_as_output() {
        let (_, f) = run(
            Route::ChatCompletions,
            &[
                (
                    "",
                    r#"{"choices":[{"index":0,"delta":{"reasoning":"Okay"}}]}"#,
                ),
                (
                    "",
                    r#"{"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
                ),
                (
                    "",
                    r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}"#,
                ),
                ("", r#"{"choices":[{"index":0,"delta":{}}]}"#),
            ],
        );
        let outputs: Vec<bool> = f.iter().map(|f| f.output).collect();
        assert_eq!(outputs, [true, true, false, false]);
    }

    #[test]
    fn without_usage_the_count_is_approximate() {
        let (c, _) = run(
            Route::Completions,
            &[
                (
                    "",
                    r#"{"choices":[{"index":0,"text":" Paris"}],"usage":null}"#,
                ),
                ("", r#"{"choices":[{"index":0,"text":""}],"usage":null}"#),
                ("", r#"{"choices":[{"index":0,"text":"."}],"usage":null}"#),
                ("", "[DONE]"),
            ],
        );
        assert_eq!(c.completion_tokens(), 2);
        assert!(!c.completion_exact());
    }

    #[test]
    fn generate_cumulative_text_and_meta_info() {
        let (c, f) = run(
            Route::Generate,
            &[
                (
                    "",
                    r#"{"text":" Paris","output_ids":[1],"meta_info":{"prompt_tokens":7,"completion_tokens":1,"cached_tokens":0}}"#,
                ),
                (
                    "",
                    r#"{"text":" Paris. The","output_ids":[1,2,3],"meta_info":{"prompt_tokens":7,"completion_tokens":3,"cached_tokens":0}}"#,
                ),
                ("", "[DONE]"),
            ],
        );
        assert!(f[0].output && f[1].output);
        assert_eq!((f[0].tokens, f[1].tokens), (1, 2));
        assert_eq!(c.completion_tokens(), 3);
        assert_eq!(c.usage().prompt_tokens, Some(7));
    }

    #[test]
    fn messages_and_responses_events() {
        let (c, f) = run(
            Route::Messages,
            &[
                (
                    "message_start",
                    r#"{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":0}}}"#,
                ),
                (
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ),
                (
                    "content_block_delta",
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
                ),
                (
                    "message_delta",
                    r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
                ),
                ("message_stop", r#"{"type":"message_stop"}"#),
            ],
        );
        assert_eq!(f.iter().filter(|f| f.output).count(), 1);
        assert!(f[2].output && f[4].terminal);
        assert_eq!(c.usage().prompt_tokens, Some(12));
        assert_eq!(c.completion_tokens(), 2);

        let (c, f) = run(
            Route::Responses,
            &[
                (
                    "response.created",
                    r#"{"type":"response.created","response":{"status":"in_progress"}}"#,
                ),
                (
                    "response.output_text.delta",
                    r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
                ),
                (
                    "response.completed",
                    r#"{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":9}}}"#,
                ),
            ],
        );
        assert!(f[1].output && f[2].terminal && !f[0].output);
        assert_eq!(c.completion_tokens(), 9);
    }

    #[test]
    fn error_payloads_are_flagged() {
        let (c, f) = run(
            Route::ChatCompletions,
            &[(
                "",
                r#"{"error": {"object": "error", "message": "Generation aborted.", "code": 503}}"#,
            )],
        );
        assert!(f[0].error && c.error_seen());
    }

    #[test]
    fn errors_with_a_shed_status_are_shed() {
        // sglang's queue-full error event, vLLM's queue cap, a gateway's 429 as a string.
        for (route, name, data) in [
            (
                Route::ChatCompletions,
                "",
                r#"{"error": {"object": "error", "message": "The request queue is full.", "code": 503}}"#,
            ),
            (
                Route::Completions,
                "",
                r#"{"error":{"message":"The engine is currently busy and cannot accept new requests.","type":"QueueOverflowError","param":null,"code":503}}"#,
            ),
            (
                Route::ChatCompletions,
                "",
                r#"{"error":{"message":"slow down","code":"429"}}"#,
            ),
            (
                Route::Generate,
                "",
                r#"{"text":"","meta_info":{"id":"r","finish_reason":{"type":"abort","status_code":503,"message":"The request is aborted by a higher priority request."},"completion_tokens":0}}"#,
            ),
            (
                Route::Messages,
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
        ] {
            let (c, f) = run(route, &[(name, data)]);
            assert!(f[0].error && f[0].shed && c.shed_seen(), "{data}");
        }
        // A refused request (400) is an error, not a shed; a client's abort of /generate is
        // neither.
        let (c, _) = run(
            Route::ChatCompletions,
            &[("", r#"{"error": {"message": "too long", "code": 400}}"#)],
        );
        assert!(c.error_seen() && !c.shed_seen());
        let (c, _) = run(
            Route::Generate,
            &[(
                "",
                r#"{"text":"hi","meta_info":{"finish_reason":{"type":"abort","message":"Abort in waiting queue"}}}"#,
            )],
        );
        assert!(!c.error_seen() && !c.shed_seen());
        let mut body = EventClassifier::new(Route::ChatCompletions);
        body.observe_body(
            br#"{"error":{"message":"busy","type":"MaxQueuedTokensError","code":503}}"#,
        );
        assert!(body.shed_seen());
    }

    #[test]
    fn non_streamed_bodies() {
        let mut c = EventClassifier::new(Route::ChatCompletions);
        c.observe_body(br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":11,"total_tokens":19,"completion_tokens":8}}"#);
        assert_eq!(c.completion_tokens(), 8);
        assert_eq!(c.usage().prompt_tokens, Some(11));
    }
}
