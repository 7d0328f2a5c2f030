//! The engine's non-generation routes: `/v1/models`, `/server_info`, `/model_info`,
//! `/version`, `/tokenize` and `/abort_request`, in the dialect's shapes.
use std::fmt::Write as _;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Body;
use serde_json::{json, Value};

use super::error_body::Reply;
use super::json_out::push_json_str;
use super::options::Dialect;
use super::request::{chat_messages, read_json, Api, ApiError};
use super::scheduler::Command;
use super::state::AppState;
use super::text;

/// `/tokenize` errors are written as the chat API's are.
const TOKENIZE_ERRORS_AS: Api = Api::Chat;

/// `/v1/models`. Written by hand: sglang's and vLLM's key order (serde_json's map would sort
/// keys).
pub fn models(state: &AppState) -> Reply {
    let name = state.served_model_name();
    let context = state.profile.model.context_length;
    let created = state.started_unix;
    let mut out = String::from("{\"object\":\"list\",\"data\":[{\"id\":");
    push_json_str(&mut out, name);
    let _ = write!(
        out,
        ",\"object\":\"model\",\"created\":{created},\"owned_by\":"
    );
    match state.options.dialect {
        Dialect::Sglang => {
            out.push_str("\"sglang\",\"root\":");
            push_json_str(&mut out, name);
            let _ = write!(out, ",\"parent\":null,\"max_model_len\":{context}}}]}}");
        }
        Dialect::Vllm => {
            out.push_str("\"vllm\",\"root\":");
            push_json_str(&mut out, &state.profile.model.model_path);
            let _ = write!(
                out,
                ",\"parent\":null,\"max_model_len\":{context},\"permission\":[{{\"id\":\"modelperm-{}\",\"object\":\"model_permission\",\"created\":{created},\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,\"is_blocking\":false}}]}}]}}",
                state.hex_id(u64::MAX, 16)
            );
        }
    }
    Reply::json(StatusCode::OK, out)
}

/// A command that starts this simulated server: `tokentap simulate --profile NAME` with the
/// built-in profile's name (what `--list-profiles` shows, not the served model's), else the
/// process's own command line when it is `tokentap simulate …`; `null` when neither is known
/// (a profile built in code), never a command that would not run.
fn launch_command(profile: &super::profile::Profile) -> Value {
    use std::sync::OnceLock;
    static BUILTINS: OnceLock<Vec<(String, &'static str)>> = OnceLock::new();
    let builtins = BUILTINS.get_or_init(|| {
        super::profile::BUILTIN_PROFILES
            .iter()
            .filter_map(|(name, _)| {
                let builtin = super::profile::Profile::builtin(name).ok()?;
                Some((builtin.model.served_model_name, *name))
            })
            .collect()
    });
    if let Some((_, name)) = builtins
        .iter()
        .find(|(served, _)| *served == profile.model.served_model_name)
    {
        return Value::String(format!("tokentap simulate --profile {name}"));
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "simulate") {
        let mut command = vec!["tokentap".to_owned()];
        command.extend(args.into_iter().skip(1));
        return Value::String(command.join(" "));
    }
    Value::Null
}

/// `/server_info` (`/get_server_info`): sglang's server arguments and scheduler state.
pub fn server_info(state: &AppState) -> Reply {
    let p = &state.profile;
    let stats = *state.scheduler.stats.borrow();
    let speculative = if p.labels.speculative_algorithm.is_empty() {
        Value::Null
    } else {
        Value::String(p.labels.speculative_algorithm.clone())
    };
    let mut value = json!({
        "model_path": p.model.model_path,
        "served_model_name": state.served_model_name(),
        "context_length": p.model.context_length,
        "chunked_prefill_size": p.capacity.chunked_prefill_size,
        "max_running_requests": p.capacity.max_running_requests,
        "max_total_tokens": p.capacity.kv_tokens,
        "tp_size": p.labels.gpu_count.max(1),
        "quantization": p.labels.quantization,
        "speculative_algorithm": speculative,
        "stream_interval": 1,
        "enable_cache_report": state.options.enable_cache_report,
        "stream_response_default_include_usage": state.options.stream_response_default_include_usage,
        "enable_priority_scheduling": state.options.priority_scheduling,
        "schedule_low_priority_values_first": state.options.low_priority_values_first,
        "random_seed": state.options.seed,
        "launch_command": launch_command(p),
        "status": "ready",
        "max_total_num_tokens": p.capacity.kv_tokens,
        "max_req_input_len": state.max_request_input_tokens(),
        "internal_states": [{
            "effective_max_running_requests_per_dp": p.capacity.max_running_requests,
            "last_gen_throughput": stats.gen_throughput,
            "avg_spec_accept_length": if p.labels.speculative_algorithm.is_empty() { Value::Null } else { json!(p.decode.tokens_per_step) },
            "memory_usage": {"token_capacity": p.capacity.kv_tokens},
        }],
        "version": state.options.engine_version(&p.labels.engine_version),
        "frontend": "tokentap-simulate",
        "tokentap_profile": {
            "engine": p.labels.engine,
            "hardware": p.labels.hardware,
            "gpu_count": p.labels.gpu_count,
            "source": p.labels.source,
        },
    });
    if let Some(map) = value.as_object_mut() {
        for (key, raw) in &state.options.server_args {
            let arg = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()));
            map.insert(key.clone(), arg);
        }
    }
    Reply::json(StatusCode::OK, value.to_string())
}

/// `/model_info` (`/get_model_info`).
pub fn model_info(state: &AppState) -> Reply {
    let p = &state.profile;
    let value = json!({
        "model_path": p.model.model_path,
        "served_model_name": state.served_model_name(),
        "tokenizer_path": p.model.model_path,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": if p.model.reasoning { json!("simulated") } else { Value::Null },
        "tool_call_parser": null,
        "disaggregation_mode": "null",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "simulated",
        "architectures": ["TokentapSimulatedForCausalLM"],
    });
    Reply::json(StatusCode::OK, value.to_string())
}

/// `/version`.
pub fn version(state: &AppState) -> Reply {
    let value =
        json!({"version": state.options.engine_version(&state.profile.labels.engine_version)});
    Reply::json(StatusCode::OK, value.to_string())
}

/// `/abort_request`: by `rid`, or every request with `abort_all`. Always 200 with no body,
/// as sglang answers whether or not the rid exists.
pub async fn abort_request<B>(state: &AppState, request: Request<B>) -> Reply
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.reply(Dialect::Sglang, Api::Chat),
    };
    let abort_all = body
        .get("abort_all")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let command = if abort_all {
        Some(Command::AbortAll)
    } else {
        body.get("rid")
            .and_then(Value::as_str)
            .map(|rid| Command::AbortRid(rid.to_owned()))
    };
    if let Some(command) = command {
        let _ = state.scheduler.commands.send(command);
    }
    Reply::json(StatusCode::OK, String::new())
}

/// `/tokenize` (`/v1/tokenize`): the ids of a text prompt (or of each of a list of texts) or
/// of a conversation, under the same rules the generation APIs count by.
pub async fn tokenize<B>(state: &AppState, request: Request<B>) -> Reply
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let dialect = state.options.dialect;
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.reply(dialect, TOKENIZE_ERRORS_AS),
    };
    let tokens: Vec<u64> =
        match (body.get("prompt"), body.get("messages")) {
            (Some(Value::String(s)), None) => text::text_token_ids(s),
            (Some(Value::Array(items)), None) if items.iter().all(Value::is_string) => items
                .iter()
                .filter_map(Value::as_str)
                .flat_map(text::text_token_ids)
                .collect(),
            (None, Some(_)) => match chat_messages(&body) {
                Ok(messages) => text::chat_prompt(&messages).1,
                Err(error) => return error.reply(dialect, TOKENIZE_ERRORS_AS),
            },
            _ => return ApiError::value(
                "Exactly one of `prompt` (a string or list of strings) or `messages` is required."
                    .to_owned(),
            )
            .reply(dialect, TOKENIZE_ERRORS_AS),
        };
    let tokens: Vec<u64> = match state.options.vocab_size {
        Some(vocab) if vocab > 0 => tokens.into_iter().map(|id| id % vocab).collect(),
        _ => tokens,
    };
    let count = tokens.len();
    let max_model_len = state.profile.model.context_length;
    let mut list = String::with_capacity(tokens.len() * 7 + 2);
    list.push('[');
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{token}");
    }
    list.push(']');
    // sglang's and vLLM's key order differ; both are kept.
    let out = match dialect {
        Dialect::Sglang => {
            format!("{{\"tokens\":{list},\"count\":{count},\"max_model_len\":{max_model_len}}}")
        }
        Dialect::Vllm => format!(
            "{{\"count\":{count},\"max_model_len\":{max_model_len},\"tokens\":{list},\"token_strs\":null}}"
        ),
    };
    Reply::json(StatusCode::OK, out)
}

#[cfg(test)]
mod launch_tests {
    use super::*;

    #[test]
    fn the_launch_command_names_a_profile_that_loads() {
        for (name, _) in crate::profile::BUILTIN_PROFILES {
            let profile = crate::profile::Profile::builtin(name).unwrap();
            let Value::String(command) = launch_command(&profile) else {
                panic!("no launch command for {name}");
            };
            let given = command
                .strip_prefix("tokentap simulate --profile ")
                .unwrap_or_else(|| panic!("{command}"));
            assert_eq!(
                crate::profile::Profile::load(given).unwrap(),
                profile,
                "{command}"
            );
        }
        // A profile built in code (not a built-in, not from the command line): no command.
        let mut custom =
            crate::profile::Profile::builtin(crate::profile::BUILTIN_PROFILES[0].0).unwrap();
        custom.model.served_model_name = "made-in-code".to_owned();
        assert_eq!(launch_command(&custom), Value::Null);
    }
}
