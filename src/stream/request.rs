//! What a metered request asks for, and usage injection into its body.
//!
//! The request body is read only on metered routes and only as far as needed: model, stream,
//! max tokens and `stream_options`. Injection edits the JSON text in place (insert or flip the
//! two `stream_options` flags) instead of re-serialising, so every other byte the client sent —
//! key order, spacing, unknown fields — reaches the upstream unchanged.
//!
//! Fields are read as the server reads them (last duplicate key wins, escaped key names
//! decoded: see [`super::json`]). Where tokentap cannot be sure how the server will read the
//! body — the walk over its top-level members stops before the closing brace, so a later
//! member could be one the server reads — it injects nothing, so it strips nothing either. (A
//! body the server's parser rejects outright gets an error answer, which is never rewritten.)

use super::json::{self, Span};
use super::rewrite::Injected;
use crate::base::Route;

/// Whether a request body carries `field` where an engine reads it: a member of the top-level
/// object, or of its `parameters` object (sglang's `/vertex_generate` hands those on as a
/// generate request), names compared as the engine's parser reads them (escapes decoded).
/// Fails closed: a body that is not one whole JSON value as this navigator reads it counts as
/// carrying the field when its bytes could hide it (the name itself, or any `\u` escape),
/// since the engine's parser (Python's, which also takes `NaN`) may read it.
pub fn carries_field(body: &[u8], field: &str) -> bool {
    let start = json::skip_ws(body, 0);
    let whole =
        json::value_end(body, start).is_some_and(|end| json::skip_ws(body, end) == body.len());
    if !whole {
        let hides = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        return hides(field.as_bytes()) || hides(b"\\u");
    }
    let key = field.as_bytes();
    json::member(body, start, key).is_some()
        || json::get(body, start, b"parameters")
            .is_some_and(|parameters| json::member(body, parameters.start, key).is_some())
}

/// The fields tokentap reads from a metered request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// `model` as sent (chat, completions, messages, responses); `/generate` has none.
    pub model: Option<String>,
    /// The client asked for a streamed response.
    pub stream: bool,
    /// The generation limit the client set, whichever field the route uses.
    pub max_tokens: Option<u64>,
    /// `stream_options.include_usage` is true.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` is true.
    pub continuous_usage: bool,
    /// sglang `rid` (a string), used by sweeps to abort their own streams.
    pub rid: Option<String>,
    /// Where the prompt is in the body (`messages`, `prompt`, `text`, `input_ids` or `input`,
    /// by route), for the workload capture's prefix fingerprint.
    pub prompt: Option<Span>,
    /// The request offered tools (a non-empty `tools` array): a tools list alone adds prefill
    /// time on some models, so such requests are told apart.
    pub with_tools: bool,
    /// The top-level integer `priority` (sglang and vLLM, every route that takes one).
    pub priority: Option<i64>,
    /// The top-level string members a session key can be read from, in
    /// `config::BODY_KEYS` order (`prompt_cache_key`, `session_id`, `user`): raw spans.
    pub session_fields: [Option<Span>; 3],
}

/// Reads the facts from a JSON request body; `None` if the body is not a JSON object.
pub fn inspect(route: Route, body: &[u8]) -> Option<RequestFacts> {
    let start = json::skip_ws(body, 0);
    if body.get(start) != Some(&b'{') || json::value_end(body, start).is_none() {
        return None;
    }
    // One walk over the top-level object for every field (the prompt may be megabytes).
    let [model, stream, max_completion_tokens, max_tokens, max_output_tokens, stream_options, sampling_params, rid, messages, prompt, text, input_ids, input, tools, priority, prompt_cache_key, session_id, user] =
        json::last_members(
            body,
            start,
            [
                b"model",
                b"stream",
                b"max_completion_tokens",
                b"max_tokens",
                b"max_output_tokens",
                b"stream_options",
                b"sampling_params",
                b"rid",
                b"messages",
                b"prompt",
                b"text",
                b"input_ids",
                b"input",
                b"tools",
                b"priority",
                b"prompt_cache_key",
                b"session_id",
                b"user",
            ],
        )
        .map(|member| member.map(|m| m.value));
    let is_true = |span: Option<Span>| span.is_some_and(|s| s.bytes(body) == b"true");
    let number = |span: Option<Span>| span.and_then(|s| json::as_u64(body, s));
    let option = |key: &[u8]| stream_options.and_then(|o| json::get(body, o.start, key));
    let max_tokens_field = max_tokens;
    let max_tokens = match route {
        Route::ChatCompletions => number(max_completion_tokens).or(number(max_tokens_field)),
        Route::Completions | Route::Messages => number(max_tokens_field),
        Route::Generate => {
            number(sampling_params.and_then(|p| json::get(body, p.start, b"max_new_tokens")))
        }
        Route::Responses => number(max_output_tokens),
    };
    Some(RequestFacts {
        model: model.and_then(|s| decode_string(body, s)),
        stream: is_true(stream),
        max_tokens,
        include_usage: is_true(option(b"include_usage")),
        continuous_usage: is_true(option(b"continuous_usage_stats")),
        rid: rid.and_then(|s| decode_string(body, s)),
        prompt: match route {
            Route::ChatCompletions | Route::Messages => messages,
            Route::Completions => prompt,
            Route::Generate => text.or(input_ids),
            Route::Responses => input,
        },
        with_tools: tools.is_some_and(|s| json::is_nonempty_array(body, s)),
        priority: priority.and_then(|s| json::as_i64(body, s)),
        session_fields: [prompt_cache_key, session_id, user]
            .map(|span| span.filter(|s| json::is_nonempty_string(body, *s))),
    })
}

fn decode_string(body: &[u8], span: Span) -> Option<String> {
    serde_json::from_slice::<String>(span.bytes(body)).ok()
}

/// What a server sends to a streamed request that asked for no usage, by server flag. The two
/// engines' flags differ, so tokentap must know which one it faces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerUsage {
    /// Usage only when the request asks (both engines' default).
    #[default]
    OnlyAsked,
    /// The final usage chunk to every stream; per-chunk usage still only when asked (sglang
    /// `--stream-response-default-include-usage`).
    Final,
    /// Usage on every chunk plus the final usage chunk to every stream, whatever the request
    /// asked (vLLM `--enable-force-include-usage`).
    EveryChunk,
}

/// What tokentap injects into a streamed request on `route` (the body to forward and what was
/// added), or `None` to forward it as sent. `server` is what the upstream sends unasked: what
/// the client gets without tokentap too, so tokentap neither counts it as added nor strips it.
pub fn injection(
    route: Route,
    body: &[u8],
    facts: &RequestFacts,
    server: ServerUsage,
) -> Option<(Vec<u8>, Injected)> {
    if !facts.stream || !route.accepts_stream_options() {
        return None;
    }
    // No `messages` / `prompt`: the server refuses the request, and sglang's validation error
    // repeats the whole body it was sent (pydantic's `missing` error), injected flags and all
    // (tests/fixtures/engines/sglang-0.5.23/invalid-request). There is nothing to count anyway.
    facts.prompt?;
    match server {
        // The server already sends exact per-chunk counts to every stream: adding anything
        // would only risk a difference from what the client gets direct.
        ServerUsage::EveryChunk => None,
        ServerUsage::Final if !facts.include_usage => {
            let mut facts = facts.clone();
            facts.include_usage = true;
            inject_usage(body, &facts)
        }
        ServerUsage::OnlyAsked if facts.continuous_usage && !facts.include_usage => {
            // The client asked for per-chunk usage only. sglang sends it (exact counts without
            // help); vLLM sends it only with include_usage, so adding include_usage would make
            // vLLM add usage the client would not have had, and nothing in the stream says which
            // engine it is. Forward as sent: on vLLM the counts are then approximate.
            None
        }
        ServerUsage::Final | ServerUsage::OnlyAsked => inject_usage(body, facts),
    }
}

/// Adds whatever of `stream_options.include_usage` / `continuous_usage_stats` the request
/// lacks. Returns the new body and what was added, or `None` when nothing needs adding (or the
/// body cannot be edited safely, in which case it is forwarded as sent).
pub fn inject_usage(body: &[u8], facts: &RequestFacts) -> Option<(Vec<u8>, Injected)> {
    let injected = Injected {
        include_usage: !facts.include_usage,
        continuous_usage: !facts.continuous_usage,
    };
    if !injected.any() {
        return None;
    }
    let start = json::skip_ws(body, 0);
    let end = json::value_end(body, start)?;
    // Every top-level member must have been read: if the walk stopped early (a member tokentap
    // cannot parse), a `stream_options` after it would be the server's and not ours to judge.
    let walked = json::members(body, start)
        .last()
        .map_or(start + 1, |member| member.value.end);
    if json::skip_ws(body, walked) + 1 != end {
        return None;
    }
    let wanted: &[(&[u8], bool)] = &[
        (b"include_usage", injected.include_usage),
        (b"continuous_usage_stats", injected.continuous_usage),
    ];
    let mut out = Vec::with_capacity(body.len() + 80);
    match json::member(body, start, b"stream_options") {
        Some(options) if body.get(options.value.start) == Some(&b'{') => {
            // Flip present-but-false flags, insert absent ones after the `{`.
            let mut edits: Vec<(usize, usize, Vec<u8>)> = Vec::new();
            let mut inserts = Vec::new();
            for (key, add) in wanted {
                if !add {
                    continue;
                }
                match json::get(body, options.value.start, key) {
                    Some(value) => edits.push((value.start, value.end, b"true".to_vec())),
                    None => {
                        inserts.push(b'"');
                        inserts.extend_from_slice(key);
                        inserts.extend_from_slice(b"\":true,");
                    }
                }
            }
            if !inserts.is_empty() {
                let open = options.value.start + 1;
                let first = json::skip_ws(body, open);
                if body.get(first) == Some(&b'}') {
                    inserts.pop(); // empty object: no trailing comma
                }
                edits.push((open, open, inserts));
            }
            edits.sort_by_key(|e| e.0);
            let mut cursor = 0;
            for (from, to, text) in edits {
                out.extend_from_slice(body.get(cursor..from)?);
                out.extend_from_slice(&text);
                cursor = to;
            }
            out.extend_from_slice(body.get(cursor..)?);
        }
        Some(options) => {
            // `"stream_options": null` (or something odd): replace the value.
            out.extend_from_slice(body.get(..options.value.start)?);
            out.extend_from_slice(b"{\"include_usage\":true,\"continuous_usage_stats\":true}");
            out.extend_from_slice(body.get(options.value.end..)?);
        }
        None => {
            let close = end - 1;
            let empty = json::members(body, start).next().is_none();
            out.extend_from_slice(body.get(..close)?);
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(b"\"stream_options\":{");
            if injected.include_usage {
                out.extend_from_slice(b"\"include_usage\":true");
            }
            if injected.continuous_usage {
                if injected.include_usage {
                    out.push(b',');
                }
                out.extend_from_slice(b"\"continuous_usage_stats\":true");
            }
            out.push(b'}');
            out.extend_from_slice(body.get(close..)?);
        }
    }
    Some((out, injected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_that_runs_code_is_found_however_it_is_written() {
        let field = "custom_logit_processor";
        for body in [
            r#"{"text":"hi","custom_logit_processor":"80049500"}"#,
            r#"{"text":"hi","custom\u005flogit_processor":"x"}"#,
            r#"{"parameters":{"custom_logit_processor":"x"},"instances":[]}"#,
            r#"{"a":NaN,"custom\u005flogit_processor":"x"}"#,
            r#"{"a":1,"custom_logit_processor":"x""#,
        ] {
            assert!(carries_field(body.as_bytes(), field), "{body}");
        }
        for body in [
            r#"{"messages":[{"role":"user","content":"what is custom_logit_processor in sglang?"}]}"#,
            r#"{"messages":[{"custom_logit_processor":"only the engine's top level counts"}]}"#,
            r#"{"text":"hi"}"#,
        ] {
            assert!(!carries_field(body.as_bytes(), field), "{body}");
        }
    }

    fn inject(body: &str) -> (String, Injected) {
        let facts = inspect(Route::ChatCompletions, body.as_bytes()).unwrap();
        let (out, injected) = inject_usage(body.as_bytes(), &facts).unwrap();
        let text = String::from_utf8(out).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["stream_options"]["include_usage"], true);
        assert_eq!(parsed["stream_options"]["continuous_usage_stats"], true);
        (text, injected)
    }

    #[test]
    fn injection_adds_only_what_neither_client_nor_server_provides() {
        let decide = |body: &str, server: ServerUsage| {
            let facts = inspect(Route::ChatCompletions, body.as_bytes()).unwrap();
            injection(Route::ChatCompletions, body.as_bytes(), &facts, server)
                .map(|(_, injected)| injected)
        };
        let plain = r#"{"stream":true,"messages":[]}"#;
        let both = Injected {
            include_usage: true,
            continuous_usage: true,
        };
        let continuous = Injected {
            include_usage: false,
            continuous_usage: true,
        };
        assert_eq!(decide(plain, ServerUsage::OnlyAsked), Some(both));
        assert_eq!(decide(plain, ServerUsage::Final), Some(continuous));
        let continuous_only =
            r#"{"stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[]}"#;
        assert_eq!(decide(continuous_only, ServerUsage::OnlyAsked), None);
        assert_eq!(decide(continuous_only, ServerUsage::Final), None);
        // vLLM --enable-force-include-usage already sends usage on every chunk: add nothing,
        // whatever the client asked, so nothing of the server's is stripped.
        let include_only =
            r#"{"stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
        for body in [plain, continuous_only, include_only] {
            assert_eq!(decide(body, ServerUsage::EveryChunk), None, "{body}");
        }
        assert_eq!(
            decide(r#"{"stream":false,"messages":[]}"#, ServerUsage::OnlyAsked),
            None
        );
        // No prompt: refused by the server, whose error may repeat the body it got.
        assert_eq!(
            decide(r#"{"stream":true,"model":"m"}"#, ServerUsage::OnlyAsked),
            None
        );
    }

    #[test]
    fn reads_the_fields_it_needs() {
        let facts = inspect(
            Route::ChatCompletions,
            br#"{"model":"step3p7","stream":true,"max_tokens":64,"messages":[],"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(facts.model.as_deref(), Some("step3p7"));
        assert!(facts.stream && facts.include_usage && !facts.continuous_usage);
        assert_eq!(facts.max_tokens, Some(64));
        let generate = inspect(
            Route::Generate,
            br#"{"input_ids":[1,2],"sampling_params":{"max_new_tokens":9},"stream":true,"rid":"r1"}"#,
        )
        .unwrap();
        assert_eq!(
            (generate.max_tokens, generate.rid.as_deref()),
            (Some(9), Some("r1"))
        );
        assert_eq!(inspect(Route::ChatCompletions, b"not json"), None);
        assert_eq!(inspect(Route::ChatCompletions, b"{\"a\":"), None);
    }

    #[test]
    fn appends_stream_options_without_touching_other_bytes() {
        let (text, injected) = inject(
            r#"{"model": "m",  "stream": true, "messages": [{"role":"user","content":"}"}]}"#,
        );
        assert_eq!(
            text,
            r#"{"model": "m",  "stream": true, "messages": [{"role":"user","content":"}"}],"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#
        );
        assert!(injected.include_usage && injected.continuous_usage);
    }

    #[test]
    fn completes_or_flips_existing_stream_options() {
        let (text, injected) = inject(r#"{"stream":true,"stream_options":{"include_usage":true}}"#);
        assert_eq!(
            text,
            r#"{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#
        );
        assert!(!injected.include_usage && injected.continuous_usage);
        let (text, _) = inject(r#"{"stream":true,"stream_options":{"include_usage":false}}"#);
        assert_eq!(
            text,
            r#"{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#
        );
        let (text, _) = inject(r#"{"stream":true,"stream_options":{}}"#);
        assert_eq!(
            text,
            r#"{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#
        );
        let (_, _) = inject(r#"{"stream":true,"stream_options":null}"#);
    }

    #[test]
    fn duplicate_keys_are_read_as_the_server_reads_them() {
        // Python's json keeps the last `stream_options`: the client asked for usage.
        let body =
            br#"{"stream":true,"stream_options":{},"stream_options":{"include_usage":true}}"#;
        let facts = inspect(Route::ChatCompletions, body).unwrap();
        assert!(facts.include_usage, "the last stream_options wins");
        let (edited, injected) = inject_usage(body, &facts).unwrap();
        assert!(
            !injected.include_usage,
            "the client's include_usage is never stripped"
        );
        assert!(injected.continuous_usage);
        assert_eq!(
            String::from_utf8(edited).unwrap(),
            r#"{"stream":true,"stream_options":{},"stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#
        );
        // The reverse order: the client's last word is no usage, so both are injected.
        let body =
            br#"{"stream":true,"stream_options":{"include_usage":true},"stream_options":{}}"#;
        let facts = inspect(Route::ChatCompletions, body).unwrap();
        assert!(!facts.include_usage);
        let (_, injected) = inject_usage(body, &facts).unwrap();
        assert!(injected.include_usage && injected.continuous_usage);
        // `"stream":false` after `"stream":true`: not a stream.
        let facts = inspect(Route::ChatCompletions, br#"{"stream":true,"stream":false}"#).unwrap();
        assert!(!facts.stream);
    }

    #[test]
    fn escaped_key_names_are_decoded() {
        let body = br#"{"stream":true,"stream\u005foptions":{"include\u005fusage":true}}"#;
        let facts = inspect(Route::ChatCompletions, body).unwrap();
        assert!(facts.include_usage);
        let (edited, injected) = inject_usage(body, &facts).unwrap();
        assert!(!injected.include_usage && injected.continuous_usage);
        let parsed: serde_json::Value = serde_json::from_slice(&edited).unwrap();
        assert_eq!(parsed["stream_options"]["include_usage"], true);
        assert_eq!(parsed["stream_options"]["continuous_usage_stats"], true);
        assert_eq!(
            parsed.as_object().unwrap().len(),
            2,
            "no second stream_options added"
        );
    }

    #[test]
    fn bodies_whose_members_cannot_all_be_read_are_left_alone() {
        for body in [
            &br#"{"stream":true,"a" 1,"stream_options":{"include_usage":false}}"#[..],
            br#"{"stream":true,"a":1,,"stream_options":{}}"#,
            br#"{"stream":true,5:1,"stream_options":{}}"#,
        ] {
            let facts = inspect(Route::ChatCompletions, body).unwrap();
            assert_eq!(
                inject_usage(body, &facts),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn nothing_to_add_when_the_client_asked_for_both() {
        let body = br#"{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#;
        let facts = inspect(Route::ChatCompletions, body).unwrap();
        assert_eq!(inject_usage(body, &facts), None);
    }
}
