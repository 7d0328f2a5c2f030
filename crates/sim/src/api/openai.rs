//! The OpenAI-compatible APIs, `/v1/chat/completions` and `/v1/completions`: their request
//! parsing (sglang's `ChatCompletionRequest` / `CompletionRequest` rules, or vLLM's) and their
//! bytes — SSE chunks with the servers' key order and null/omitted fields, the usage chunk,
//! `data: [DONE]`, and the non-streaming bodies.
use std::fmt::Write as _;

use serde_json::Value;

use crate::json_out::push_json_str;
use crate::options::Dialect;
use crate::output::{FinishReason, Output, Step};
use crate::request::{
    chat_messages, opt_bool, opt_int, opt_string, require_object, schema_error, stop_strings,
    thinking_off, Api, ApiError, GenRequest,
};
use crate::text;

/// What `max_tokens` is on `/v1/completions` when the request does not say (OpenAI's default).
const COMPLETION_DEFAULT_MAX_TOKENS: i64 = 16;

const ONE_PROMPT_ONLY: &str =
    "tokentap simulate serves one prompt per request; batched prompts are not supported";

/// Parse a chat (`api` = [`Api::Chat`]) or completions request.
/// `block_tokens` is the prefix cache's block size.
pub fn parse(
    body: &Value,
    api: Api,
    dialect: Dialect,
    block_tokens: u64,
) -> Result<GenRequest, ApiError> {
    require_object(body)?;
    let key = match api {
        Api::Chat => {
            if let Some(ids) = body.get("input_ids").filter(|v| !v.is_null()) {
                text::token_ids_key(ids, block_tokens).ok_or_else(|| {
                    schema_error(
                        "input_ids",
                        "list_type",
                        "Input should be a valid list of integers",
                    )
                })?
            } else {
                text::chat_prompt_key(&chat_messages(body)?, block_tokens)
            }
        }
        _ => completion_prompt(body, block_tokens)?,
    };
    let max_new_tokens = match api {
        Api::Chat => match opt_int(body, "max_completion_tokens")? {
            Some(v) => Some(v),
            None => opt_int(body, "max_tokens")?,
        },
        _ => Some(opt_int(body, "max_tokens")?.unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS)),
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
        prompt_tokens: key.tokens,
        cache_key: key.cache_key,
        prefix: key.prefix,
        max_new_tokens,
        min_new_tokens,
        ignore_eos: opt_bool(body, "ignore_eos")?.unwrap_or(false),
        // An integer in both servers' request models (sglang `Optional[int]`, vLLM `int = 0`):
        // anything else is their pydantic `int_type` error.
        priority: opt_int(body, "priority")?,
        stop: stop_strings(body.get("stop"), "stop")?,
        stream,
        include_usage,
        continuous_usage,
        rid: opt_string(body, "rid")?,
        model: opt_string(body, "model")?,
        reasoning: api == Api::Chat && separate && !thinking_off(body),
    })
}

/// The `prompt` of `/v1/completions`: a string, token ids, or a one-element list of either.
fn completion_prompt(body: &Value, block_tokens: u64) -> Result<text::PromptKey, ApiError> {
    let Some(prompt) = body.get("prompt") else {
        return Err(schema_error("prompt", "missing", "Field required"));
    };
    match prompt {
        Value::String(s) => Ok(text::text_prompt_key(s, block_tokens)),
        Value::Array(items) if items.first().is_some_and(Value::is_array) => {
            let [ids] = items.as_slice() else {
                return Err(ApiError::value(ONE_PROMPT_ONLY.to_owned()));
            };
            text::token_ids_key(ids, block_tokens).ok_or_else(|| {
                schema_error(
                    "prompt",
                    "list_type",
                    "Input should be a valid list of integers",
                )
            })
        }
        Value::Array(items) if items.first().is_some_and(Value::is_string) => {
            let [text] = items.as_slice() else {
                return Err(ApiError::value(ONE_PROMPT_ONLY.to_owned()));
            };
            Ok(text::text_prompt_key(
                text.as_str().unwrap_or_default(),
                block_tokens,
            ))
        }
        other => text::token_ids_key(other, block_tokens).ok_or_else(|| {
            schema_error(
                "prompt",
                "union_type",
                "Input should be a valid string or a list of integers",
            )
        }),
    }
}

fn object_name(api: Api, stream: bool) -> &'static str {
    match (api, stream) {
        (Api::Chat, true) => "chat.completion.chunk",
        (Api::Chat, false) => "chat.completion",
        (_, _) => "text_completion",
    }
}

/// The chunks of one scheduler step, and after the finish chunk the usage chunk (when asked
/// for) and `[DONE]`.
pub fn write_step(o: &Output, step: &Step, out: &mut String) {
    match o.spec.api {
        Api::Chat => chat_chunks(o, step, out),
        _ => {
            let mut text = step.reasoning_delta.clone();
            text.push_str(&step.content_delta);
            completion_chunk(o, &text, step.finish.as_ref(), out);
        }
    }
    if step.finish.is_some() {
        stream_tail(o, out);
    }
}

fn chunk_head(o: &Output, out: &mut String) {
    out.push_str("data: ");
    object_head(o, out, object_name(o.spec.api, true));
}

/// `{"id":…,"object":"<object>","created":…,"model":` — how every OpenAI-shaped body and
/// chunk begins.
fn object_head(o: &Output, out: &mut String, object: &str) {
    out.push_str("{\"id\":");
    push_json_str(out, &o.spec.id);
    out.push_str(",\"object\":\"");
    out.push_str(object);
    let _ = write!(out, "\",\"created\":{},\"model\":", o.spec.created);
    push_json_str(out, &o.spec.model);
}

fn chat_chunks(o: &Output, step: &Step, out: &mut String) {
    let continuous = o.spec.continuous_usage;
    let total = o.completion_tokens;
    let (reasoning_delta, content_delta) = (step.reasoning_delta.as_str(), &step.content_delta);
    let finish = step.finish.as_ref();
    // Usage on a reasoning chunk counts only the reasoning when content follows in this step.
    let reasoning_count = if content_delta.is_empty() {
        total
    } else {
        step.reasoning_count_after.min(total)
    };
    match o.spec.dialect {
        Dialect::Sglang => {
            if step.first {
                chunk_head(o, out);
                out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]}\n\n");
            }
            if !reasoning_delta.is_empty() {
                chunk_head(o, out);
                out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":");
                push_json_str(out, reasoning_delta);
                out.push_str("},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]");
                if continuous {
                    out.push_str(",\"usage\":");
                    sglang_usage(o, out, reasoning_count, false);
                }
                out.push_str("}\n\n");
            }
            if !content_delta.is_empty() {
                chunk_head(o, out);
                out.push_str(
                    ",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null,\"content\":",
                );
                push_json_str(out, content_delta);
                out.push_str("},\"logprobs\":null,\"finish_reason\":null,\"matched_stop\":null}]");
                if continuous {
                    out.push_str(",\"usage\":");
                    sglang_usage(o, out, total, false);
                }
                out.push_str("}\n\n");
            }
            if let Some(reason) = finish {
                chunk_head(o, out);
                out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":null},\"logprobs\":null,\"finish_reason\":\"");
                out.push_str(reason.openai());
                out.push_str("\",\"matched_stop\":");
                reason.write_matched(out);
                out.push_str("}]}\n\n");
            }
        }
        Dialect::Vllm => {
            let last_without_usage = finish.is_some() && !o.spec.include_usage;
            if step.first {
                chunk_head(o, out);
                out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]");
                if continuous {
                    out.push_str(",\"usage\":");
                    vllm_usage(o, out, 0, true);
                }
                out.push_str(",\"prompt_token_ids\":null,\"prompt_text\":null}\n\n");
            }
            // vLLM puts the finish reason on the last delta (which may be empty).
            let mut pieces: [Option<(&str, &str, u64)>; 2] = [None, None];
            if !reasoning_delta.is_empty() {
                pieces[0] = Some(("reasoning", reasoning_delta, reasoning_count));
            }
            if !content_delta.is_empty() || (pieces[0].is_none() && finish.is_some()) {
                pieces[1] = Some(("content", content_delta, total));
            }
            let last = pieces.iter().rposition(Option::is_some);
            for (i, (field, text, count)) in pieces
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.map(|p| (i, p)))
            {
                let is_last = Some(i) == last;
                chunk_head(o, out);
                out.push_str(",\"choices\":[{\"index\":0,\"delta\":{\"");
                out.push_str(field);
                out.push_str("\":");
                push_json_str(out, text);
                out.push_str("},\"logprobs\":null,\"finish_reason\":");
                match finish.filter(|_| is_last) {
                    Some(reason) => {
                        out.push('"');
                        out.push_str(reason.openai());
                        out.push_str("\",\"stop_reason\":");
                        reason.write_stop_reason(out);
                    }
                    None => out.push_str("null"),
                }
                out.push_str(",\"token_ids\":null}]");
                if continuous {
                    out.push_str(",\"usage\":");
                    vllm_usage(o, out, count, true);
                }
                if last_without_usage && is_last {
                    out.push_str(",\"system_fingerprint\":");
                    push_json_str(out, &o.spec.fingerprint);
                }
                out.push_str("}\n\n");
            }
        }
    }
}

fn completion_chunk(o: &Output, text: &str, finish: Option<&FinishReason>, out: &mut String) {
    let continuous = o.spec.continuous_usage;
    chunk_head(o, out);
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
    match o.spec.dialect {
        Dialect::Sglang => {
            out.push_str(",\"matched_stop\":");
            match finish {
                Some(reason) => reason.write_matched(out),
                None => out.push_str("null"),
            }
            out.push_str("}],\"usage\":");
            if continuous {
                sglang_usage(o, out, o.completion_tokens, false);
            } else {
                out.push_str("null");
            }
        }
        Dialect::Vllm => {
            out.push_str(",\"stop_reason\":");
            match finish {
                Some(reason) => reason.write_stop_reason(out),
                None => out.push_str("null"),
            }
            out.push_str(",\"prompt_token_ids\":null,\"token_ids\":null}]");
            if continuous {
                out.push_str(",\"usage\":");
                vllm_usage(o, out, o.completion_tokens, true);
            }
            if finish.is_some() && !o.spec.include_usage {
                out.push_str(",\"system_fingerprint\":");
                push_json_str(out, &o.spec.fingerprint);
            }
        }
    }
    out.push_str("}\n\n");
}

/// After the finish chunk: the usage chunk (when asked for) and `[DONE]`.
fn stream_tail(o: &Output, out: &mut String) {
    if o.spec.include_usage {
        chunk_head(o, out);
        out.push_str(",\"choices\":[],\"usage\":");
        match o.spec.dialect {
            Dialect::Sglang => {
                // sglang's completions usage chunk is dumped with `exclude_none`.
                let exclude_none = o.spec.api == Api::Completion;
                sglang_usage(o, out, o.completion_tokens, exclude_none);
            }
            Dialect::Vllm => {
                vllm_usage(o, out, o.completion_tokens, false);
                out.push_str(",\"system_fingerprint\":");
                push_json_str(out, &o.spec.fingerprint);
            }
        }
        out.push_str("}\n\n");
    }
    out.push_str("data: [DONE]\n\n");
}

/// The whole non-streaming body, once the request has finished.
pub fn write_body(o: &Output, finish: &FinishReason, out: &mut String) {
    let completion = o.completion_tokens;
    let prompt = o.spec.prompt_tokens;
    object_head(o, out, object_name(o.spec.api, false));
    match (o.spec.api, o.spec.dialect) {
        (Api::Chat, Dialect::Sglang) => {
            out.push_str(
                ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
            );
            push_json_str(out, &o.content);
            out.push_str(",\"reasoning_content\":");
            write_reasoning(o, out);
            // sglang 0.5.23 leaves `tool_calls` out when there are none
            // (tests/fixtures/engines/sglang-0.5.23/chat-nonstream).
            out.push_str("},\"logprobs\":null,\"finish_reason\":\"");
            out.push_str(finish.openai());
            out.push_str("\",\"matched_stop\":");
            finish.write_matched(out);
            out.push_str("}],\"usage\":");
            sglang_usage(o, out, completion, false);
            out.push_str(",\"metadata\":{\"weight_version\":\"default\"}}");
        }
        (_, Dialect::Sglang) => {
            out.push_str(",\"choices\":[{\"index\":0,\"text\":");
            push_json_str(out, &o.whole_text());
            out.push_str(",\"logprobs\":null,\"finish_reason\":\"");
            out.push_str(finish.openai());
            out.push_str("\",\"matched_stop\":");
            finish.write_matched(out);
            out.push_str("}],\"usage\":");
            sglang_usage(o, out, completion, false);
            // Completions carry the weight version too (sglang-0.5.23/completions-nonstream).
            out.push_str(",\"metadata\":{\"weight_version\":\"default\"}}");
        }
        (Api::Chat, Dialect::Vllm) => {
            out.push_str(
                ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
            );
            push_json_str(out, &o.content);
            out.push_str(",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":");
            write_reasoning(o, out);
            out.push_str("},\"logprobs\":null,\"finish_reason\":\"");
            out.push_str(finish.openai());
            out.push_str("\",\"stop_reason\":");
            finish.write_stop_reason(out);
            out.push_str(",\"token_ids\":null,\"routed_experts\":null}],\"service_tier\":null,\"system_fingerprint\":");
            push_json_str(out, &o.spec.fingerprint);
            let _ = write!(
                out,
                ",\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion},\"prompt_tokens_details\":null,\"completion_tokens_details\":null}}",
                prompt + completion
            );
            out.push_str(",\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}");
        }
        (_, Dialect::Vllm) => {
            out.push_str(",\"choices\":[{\"index\":0,\"text\":");
            push_json_str(out, &o.whole_text());
            out.push_str(",\"logprobs\":null,\"finish_reason\":\"");
            out.push_str(finish.openai());
            out.push_str("\",\"stop_reason\":");
            finish.write_stop_reason(out);
            out.push_str(",\"prompt_token_ids\":null,\"token_ids\":null}],\"service_tier\":null,\"system_fingerprint\":");
            push_json_str(out, &o.spec.fingerprint);
            let _ = write!(
                out,
                ",\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion},\"prompt_tokens_details\":null}},\"kv_transfer_params\":null}}",
                prompt + completion
            );
        }
    }
}

/// The reasoning text, or `null` when the request does not reason.
fn write_reasoning(o: &Output, out: &mut String) {
    if o.spec.reasoning_tokens > 0 {
        push_json_str(out, &o.reasoning);
    } else {
        out.push_str("null");
    }
}

/// sglang `UsageInfo`; `exclude_none` drops the null details (final completions chunk).
fn sglang_usage(o: &Output, out: &mut String, completion: u64, exclude_none: bool) {
    let prompt = o.spec.prompt_tokens;
    let reasoning = o.reasoning_emitted.min(completion);
    let _ = write!(
        out,
        "{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}",
        prompt + completion
    );
    if o.spec.enable_cache_report {
        let _ = write!(
            out,
            ",\"prompt_tokens_details\":{{\"cached_tokens\":{}}}",
            o.cached_tokens
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
fn vllm_usage(o: &Output, out: &mut String, completion: u64, per_chunk: bool) {
    let prompt = o.spec.prompt_tokens;
    let _ = write!(
        out,
        "{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}",
        prompt + completion
    );
    if per_chunk {
        out.push_str(",\"completion_tokens_details\":null");
    } else if o.spec.enable_cache_report && o.cached_tokens > 0 {
        let _ = write!(
            out,
            ",\"prompt_tokens_details\":{{\"cached_tokens\":{}}}",
            o.cached_tokens
        );
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Dialect;

    fn chat(extra: Value) -> Value {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    }

    #[test]
    fn priority_is_read_as_an_integer() {
        for dialect in [Dialect::Sglang, Dialect::Vllm] {
            let parsed = parse(
                &chat(serde_json::json!({"priority": -3})),
                Api::Chat,
                dialect,
                16,
            );
            assert_eq!(parsed.unwrap().priority, Some(-3));
            let absent = parse(&chat(serde_json::json!({})), Api::Chat, dialect, 16);
            assert_eq!(absent.unwrap().priority, None);
            let completion = serde_json::json!({"prompt": "hi", "priority": 7});
            let parsed = parse(&completion, Api::Completion, dialect, 16);
            assert_eq!(parsed.unwrap().priority, Some(7));
        }
    }

    #[test]
    fn a_priority_that_is_not_an_integer_is_the_request_models_400() {
        let bad = parse(
            &chat(serde_json::json!({"priority": "high"})),
            Api::Chat,
            Dialect::Vllm,
            16,
        );
        let error = bad.err().unwrap();
        assert_eq!(
            error.message,
            "[{'type': 'int_type', 'loc': ('body', 'priority'), 'msg': 'Input should be a valid integer'}]"
        );
        let reply = error.reply(Dialect::Vllm, Api::Chat);
        assert_eq!(reply.status, http::StatusCode::BAD_REQUEST);
        let fraction = parse(
            &chat(serde_json::json!({"priority": 1.5})),
            Api::Chat,
            Dialect::Sglang,
            16,
        );
        assert!(fraction.err().unwrap().message.contains("int_from_float"));
    }
}
