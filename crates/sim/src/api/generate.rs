//! sglang's native `/generate`: its request (`text` or `input_ids`, `sampling_params`) and its
//! bytes — each SSE chunk carries the whole text and ids so far with `meta_info`, the stream
//! ends with `data: [DONE]`, and the non-streaming body is the last chunk's object.
use std::fmt::Write as _;

use serde_json::Value;
use tokio::time::Instant;

use crate::json_out::{push_json_str, unix_seconds_f64};
use crate::output::{FinishReason, Output, Step};
use crate::request::{opt_bool, opt_int, opt_string, stop_strings, ApiError, GenRequest};
use crate::text;

/// sglang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: i64 = 128;

/// Parse a `/generate` request. sglang reports its problems as ValueErrors, not schema errors.
pub fn parse(body: &Value, block_tokens: u64) -> Result<GenRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::value(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    let text = body.get("text").filter(|v| !v.is_null());
    let ids = body.get("input_ids").filter(|v| !v.is_null());
    let key = match (text, ids) {
        (Some(Value::String(s)), None) => text::text_prompt_key(s, block_tokens),
        (None, Some(ids)) => text::token_ids_key(ids, block_tokens).ok_or_else(|| {
            ApiError::value("input_ids must be a list of non-negative integers".to_owned())
        })?,
        (None, None) => {
            return Err(ApiError::value(
                "Either text, input_ids or input_embeds should be provided.".to_owned(),
            ))
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::value(
                "Either text, input_ids or input_embeds should be provided, not several."
                    .to_owned(),
            ))
        }
        (Some(_), None) => {
            return Err(ApiError::value("text must be a string".to_owned()));
        }
    };
    let empty = Value::Object(serde_json::Map::new());
    let params = body.get("sampling_params").unwrap_or(&empty);
    Ok(GenRequest {
        prompt_tokens: key.tokens,
        cache_key: key.cache_key,
        prefix: key.prefix,
        max_new_tokens: Some(opt_int(params, "max_new_tokens")?.unwrap_or(DEFAULT_MAX_NEW_TOKENS)),
        min_new_tokens: opt_int(params, "min_new_tokens")?.unwrap_or(0).max(0) as u64,
        ignore_eos: opt_bool(params, "ignore_eos")?.unwrap_or(false),
        // `GenerateReqInput.priority`: top level, beside `rid`, not a sampling parameter.
        priority: opt_int(body, "priority")?,
        stop: stop_strings(params.get("stop"), "stop")?,
        stream: opt_bool(body, "stream")?.unwrap_or(false),
        include_usage: false,
        continuous_usage: false,
        rid: opt_string(body, "rid")?,
        model: None,
        reasoning: false,
    })
}

/// The chunk of one scheduler step, and `[DONE]` after the last.
pub fn write_step(o: &Output, step: &Step, out: &mut String) {
    out.push_str("data: ");
    write_object(o, out, step.first, step.finish.as_ref());
    out.push_str("\n\n");
    if step.finish.is_some() {
        out.push_str("data: [DONE]\n\n");
    }
}

/// The whole non-streaming body, once the request has finished.
pub fn write_body(o: &Output, finish: &FinishReason, out: &mut String) {
    write_object(o, out, false, Some(finish));
}

fn write_object(o: &Output, out: &mut String, first: bool, finish: Option<&FinishReason>) {
    out.push_str("{\"text\":");
    push_json_str(out, &o.whole_text());
    out.push_str(",\"output_ids\":[");
    for (i, id) in o.output_ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{id}");
    }
    out.push_str("],\"meta_info\":{\"id\":");
    push_json_str(out, &o.spec.id);
    out.push_str(",\"finish_reason\":");
    match finish {
        None => out.push_str("null"),
        Some(FinishReason::Length) => {
            let _ = write!(
                out,
                "{{\"type\":\"length\",\"length\":{}}}",
                o.completion_tokens
            );
        }
        Some(reason @ (FinishReason::Eos(_) | FinishReason::StopString(_))) => {
            out.push_str("{\"type\":\"stop\",\"matched\":");
            reason.write_matched(out);
            out.push('}');
        }
        Some(FinishReason::Abort) => out.push_str(
            "{\"type\":\"abort\",\"message\":null,\"status_code\":null,\"err_type\":null}",
        ),
    }
    // `/generate` never separates reasoning, so its `reasoning_tokens` is always 0. sglang
    // 0.5.23 follows `cached_tokens` with `cached_tokens_details` (null without a hierarchical
    // cache) and the request's data-parallel rank (tests/fixtures/engines/sglang-0.5.23/).
    let _ = write!(
        out,
        ",\"prompt_tokens\":{},\"weight_version\":\"default\",\"num_retractions\":0,\"reasoning_tokens\":0,\"completion_tokens\":{},\"cached_tokens\":{},\"cached_tokens_details\":null,\"dp_rank\":0",
        o.spec.prompt_tokens, o.completion_tokens, o.cached_tokens
    );
    if first {
        let _ = write!(
            out,
            ",\"response_sent_to_client_ts\":{:.6}",
            unix_seconds_f64()
        );
    }
    if finish.is_some() {
        write_times(o, out);
    }
    out.push_str("}}");
}

/// The finished request's times, as sglang 0.5.23 ends `meta_info` with them
/// (tests/fixtures/engines/sglang-0.5.23/generate-*): its end-to-end latency, when it was
/// received and handed to the scheduler (one instant here: the simulator has no tokenizer
/// stage), the time to its first output (the whole answer's, not streamed), when the last
/// event was sent and the request finished, and, streamed, its decode rate after the first
/// token.
fn write_times(o: &Output, out: &mut String) {
    let now = Instant::now();
    let now_unix = unix_seconds_f64();
    let e2e = now.saturating_duration_since(o.spec.started).as_secs_f64();
    let received = now_unix - e2e;
    let first = match (o.spec.stream, o.first_output_at) {
        (true, Some(at)) => at.saturating_duration_since(o.spec.started).as_secs_f64(),
        _ => e2e,
    };
    let _ = write!(
        out,
        ",\"e2e_latency\":{e2e:.6},\"request_received_ts\":{received:.6},\"first_token_latency\":{first:.6},\"api_server_dispatch_finish_ts\":{received:.6}"
    );
    if o.spec.stream {
        let decoding = e2e - first;
        let rate = if decoding > 0.0 {
            o.completion_tokens.saturating_sub(1) as f64 / decoding
        } else {
            0.0
        };
        let _ = write!(
            out,
            ",\"response_sent_to_client_ts\":{now_unix:.6},\"request_finished_ts\":{now_unix:.6},\"decode_throughput\":{rate:.6}"
        );
    } else {
        let _ = write!(
            out,
            ",\"request_finished_ts\":{now_unix:.6},\"response_sent_to_client_ts\":{now_unix:.6}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_is_a_top_level_field_of_generate() {
        let body =
            serde_json::json!({"text": "hi", "priority": 4, "sampling_params": {"priority": 9}});
        assert_eq!(parse(&body, 16).unwrap().priority, Some(4));
        let bad = serde_json::json!({"text": "hi", "priority": [1]});
        assert!(parse(&bad, 16).is_err());
    }
}
