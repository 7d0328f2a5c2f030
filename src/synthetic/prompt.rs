//! Prompts of exact token length with a unique per-run prefix.
//!
//! * **Token ids** (sglang and vLLM `/v1/completions` `prompt: [ids]`, sent verbatim with no
//!   BOS or template): 16 ids derived from the run id, then a body seeded by the run and the
//!   context, so no two contexts share more than the run prefix and no two runs share
//!   anything (every scout is cold). The ids are drawn from the served vocabulary: a pool
//!   harvested once per run from the server's own `/tokenize` of filler text (so a model with
//!   a 1,024-token vocabulary gets ids below 1,024), preferring ids below 10,000 so that a
//!   1M-token prompt stays near 5 MB of JSON, under the proxy's default parse limit. Without
//!   `/tokenize` the ids are 1000–9999 (valid in every common vocabulary), and `--prompt auto`
//!   falls back to text if the server refuses them.
//! * **Text**, for servers without token-id input: `[BENCH_<run>_CTX_<ctx>] ` and filler
//!   words, cut to the length the server's tokenizer says is exactly the target (a bracketed
//!   search on the character length; a few requests), or the closest below it. The tokenizer is
//!   the engine's (`base::engine`'s `tokenize`: `/tokenize` on sglang, vLLM and llama.cpp, each in
//!   its shape; a server it cannot name gets `/tokenize`, then `/extras/tokenize` as
//!   llama-cpp-python has it), else — a server
//!   with neither — the `prompt_tokens` the server reports for a probe request of the text.
//!
//! The prompt's JSON value is built once per context and shared by the scout and every stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use super::path::DataPath;
use crate::base::engine::Tokenize;
use crate::base::json::push_json_string;

/// Ids of the per-run prefix.
pub const RUN_PREFIX_TOKENS: usize = 16;
const ID_BASE: u64 = 1000;
const ID_SPAN: u64 = 9000;
/// Most `/tokenize` round trips spent calibrating one text prompt.
pub const MAX_CALIBRATION_ROUNDS: usize = 40;

/// A prompt ready to send: its JSON value and its token count (exact for token ids; what
/// `/tokenize` said for text).
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The `prompt` field's JSON text: `[1234,…]` or `"…"`.
    pub json: Arc<str>,
    pub tokens: u64,
    pub kind: PromptKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    TokenIds,
    Text,
}

/// A deterministic 64-bit mixer (splitmix64).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed from a run id.
pub fn run_seed(run_id: &str) -> u64 {
    run_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Fewest distinct ids a harvested pool must have to be used (the run prefix alone draws 16).
pub const MIN_POOL: usize = 16;
/// With at least this many harvested ids below 10,000, only those are used (short JSON).
const PREFERRED_SHORT_IDS: usize = 64;

/// `tokens` ids: the run prefix, then a body seeded by (run, context); drawn from `pool` (ids
/// the server's tokenizer produced) when there is one, else from 1000–9999.
pub fn token_ids<'a>(
    run_seed: u64,
    context: u64,
    tokens: u64,
    pool: Option<&'a [u64]>,
) -> impl Iterator<Item = u64> + 'a {
    let body_seed = mix(run_seed ^ mix(context));
    let pool = pool.filter(|p| !p.is_empty());
    (0..tokens).map(move |i| {
        let seed = if (i as usize) < RUN_PREFIX_TOKENS {
            mix(run_seed.wrapping_add(i))
        } else {
            mix(body_seed.wrapping_add(i))
        };
        match pool {
            Some(pool) => pool
                .get((seed % pool.len() as u64) as usize)
                .copied()
                .unwrap_or(ID_BASE),
            None => ID_BASE + seed % ID_SPAN,
        }
    })
}

/// The token-id prompt for `context`, `tokens` long, from `pool` (see [`token_ids`]).
pub fn token_id_prompt(run_seed: u64, context: u64, tokens: u64, pool: Option<&[u64]>) -> Prompt {
    use std::fmt::Write as _;
    let mut json = String::with_capacity(tokens as usize * 5 + 2);
    json.push('[');
    for (i, id) in token_ids(run_seed, context, tokens, pool).enumerate() {
        if i > 0 {
            json.push(',');
        }
        let _ = write!(json, "{id}");
    }
    json.push(']');
    Prompt {
        json: Arc::from(json),
        tokens,
        kind: PromptKind::TokenIds,
    }
}

const WORDS: [&str; 32] = [
    "river", "stone", "lantern", "orbit", "meadow", "copper", "signal", "harbor", "velvet",
    "engine", "glacier", "pepper", "thunder", "canvas", "marble", "falcon", "quartz", "willow",
    "ember", "tunnel", "saddle", "prism", "cobalt", "anchor", "violet", "summit", "ferry",
    "cinder", "maple", "rocket", "garnet", "lagoon",
];

/// The filler text of a run and context, cut at `chars` bytes (ASCII, so any cut is valid).
pub fn filler_text(run_id: &str, context: u64, chars: usize) -> String {
    let prefix = format!("[BENCH_{run_id}_CTX_{context}] ");
    let mut text = String::with_capacity(chars.max(prefix.len()) + 16);
    text.push_str(&prefix);
    let mut state = mix(run_seed(run_id) ^ mix(context));
    while text.len() < chars {
        state = mix(state);
        let word = WORDS
            .get((state % WORDS.len() as u64) as usize)
            .copied()
            .unwrap_or("word");
        text.push_str(word);
        text.push(if state >> 40 & 15 == 0 { '.' } else { ' ' });
    }
    text.truncate(chars.max(prefix.len()));
    text
}

/// Why a text prompt could not be calibrated.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error(
        "POST /tokenize (or /extras/tokenize) failed while calibrating a {target}-token prompt"
    )]
    Call {
        target: u64,
        #[source]
        source: super::client::CallError,
    },
    #[error("POST /tokenize (or /extras/tokenize) answered {status} while calibrating a {target}-token prompt: {body}")]
    Status {
        target: u64,
        status: u16,
        body: String,
    },
    #[error("the tokenizer answered without a token count (`count` or `tokens`)")]
    NoCount,
    #[error("a probe request to count a {target}-token prompt failed: {reason}")]
    Probe { target: u64, reason: String },
    #[error("the run prefix alone is {prefix} tokens, more than the {target} asked for")]
    TooShort { prefix: u64, target: u64 },
}

/// Counts the tokens of `text` with the server's tokenizer endpoint, through the proxy; a
/// server with none (both answer 404/405) counts it in a probe request's usage instead.
pub async fn tokenize(
    data_path: &dyn DataPath,
    tokenizers: &[Tokenize],
    model: &str,
    text: &str,
    target: u64,
) -> Result<u64, CalibrationError> {
    let value = match tokenize_value(data_path, tokenizers, model, text, target, true).await {
        Ok(value) => value,
        Err(CalibrationError::Status {
            status: 404 | 405, ..
        }) => return probe_prompt_tokens(data_path, model, text, target).await,
        Err(error) => return Err(error),
    };
    value
        .get("count")
        .and_then(Value::as_u64)
        .or_else(|| {
            value
                .get("tokens")
                .and_then(Value::as_array)
                .map(|t| t.len() as u64)
        })
        .ok_or(CalibrationError::NoCount)
}

/// Token ids of the served vocabulary, harvested from the server's `/tokenize` of this run's
/// filler text (without special tokens): distinct and sorted, only those below 10,000 when
/// there are enough of them. An error when the server cannot tokenize or gives too few ids.
pub async fn token_id_pool(
    data_path: &dyn DataPath,
    tokenizers: &[Tokenize],
    model: &str,
    run_id: &str,
) -> Result<Vec<u64>, CalibrationError> {
    // Filler words and digits: a few hundred distinct ids on a real tokenizer.
    let mut text = filler_text(run_id, 0, 3000);
    for n in 0..200u32 {
        text.push_str(&format!(" {n}{}", n * 7919 % 1000));
    }
    let value = tokenize_value(data_path, tokenizers, model, &text, 0, false).await?;
    let mut ids: Vec<u64> = value
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or(CalibrationError::NoCount)?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.iter().filter(|&&id| id < 10_000).count() >= PREFERRED_SHORT_IDS {
        ids.retain(|&id| id < 10_000);
    }
    if ids.len() < MIN_POOL {
        return Err(CalibrationError::NoCount);
    }
    Ok(ids)
}

/// `text` counted by the engine's tokenizer endpoints (`base::engine`'s `tokenize`), each tried
/// in turn while the one before answers 404 or 405 (no such endpoint); the answer's JSON.
async fn tokenize_value(
    data_path: &dyn DataPath,
    tokenizers: &[Tokenize],
    model: &str,
    text: &str,
    target: u64,
    special_tokens: bool,
) -> Result<Value, CalibrationError> {
    let mut last = CalibrationError::Status {
        target,
        status: 404,
        body: "no tokenizer endpoint".to_owned(),
    };
    for tokenizer in tokenizers {
        match tokenize_at(data_path, tokenizer, model, text, target, special_tokens).await {
            Err(
                error @ CalibrationError::Status {
                    status: 404 | 405, ..
                },
            ) => last = error,
            other => return other,
        }
    }
    Err(last)
}

/// `POST` of `text` to one tokenizer endpoint, in its shape; the answer's JSON.
async fn tokenize_at(
    data_path: &dyn DataPath,
    tokenizer: &Tokenize,
    model: &str,
    text: &str,
    target: u64,
    special_tokens: bool,
) -> Result<Value, CalibrationError> {
    let mut body = String::with_capacity(text.len() + 64);
    body.push_str("{\"model\":");
    push_json_string(&mut body, model);
    body.push_str(",\"");
    body.push_str(tokenizer.text_field);
    body.push_str("\":");
    push_json_string(&mut body, text);
    if let (false, Some(switch)) = (special_tokens, tokenizer.special_tokens_field) {
        body.push_str(",\"");
        body.push_str(switch);
        body.push_str("\":false");
    }
    body.push('}');
    let answer = data_path
        .call(
            Method::POST,
            tokenizer.route,
            Some(Bytes::from(body)),
            Duration::from_secs(60),
        )
        .await
        .map_err(|source| CalibrationError::Call { target, source })?;
    if !answer.ok() {
        let mut text = answer.text();
        text.truncate(300);
        return Err(CalibrationError::Status {
            target,
            status: answer.status.as_u16(),
            body: text,
        });
    }
    serde_json::from_slice(&answer.body).map_err(|_| CalibrationError::NoCount)
}

/// The prompt tokens the server reports for `text` in a one-token, unstreamed completion: the
/// count of last resort, for a server with no tokenizer endpoint (each probe is a prefill).
async fn probe_prompt_tokens(
    data_path: &dyn DataPath,
    model: &str,
    text: &str,
    target: u64,
) -> Result<u64, CalibrationError> {
    let mut body = String::with_capacity(text.len() + 96);
    body.push_str("{\"model\":");
    push_json_string(&mut body, model);
    body.push_str(",\"prompt\":");
    push_json_string(&mut body, text);
    body.push_str(",\"max_tokens\":1,\"temperature\":0,\"stream\":false}");
    let probe_failed = |reason: String| CalibrationError::Probe { target, reason };
    let answer = data_path
        .call(
            Method::POST,
            "/v1/completions",
            Some(Bytes::from(body)),
            // As long as a scout may take: a minute plus the prompt at 500 tok/s.
            Duration::from_secs(60 + target / 500),
        )
        .await
        .map_err(|error| probe_failed(error.to_string()))?;
    if !answer.ok() {
        let mut text = answer.text();
        text.truncate(300);
        return Err(probe_failed(format!(
            "HTTP {}: {text}",
            answer.status.as_u16()
        )));
    }
    answer
        .json()
        .and_then(|value| {
            value
                .pointer("/usage/prompt_tokens")
                .and_then(Value::as_u64)
        })
        .ok_or_else(|| probe_failed("no usage.prompt_tokens in the answer".to_owned()))
}

/// A text prompt whose tokenizer count is `target` (or the closest below it).
pub async fn calibrated_text_prompt(
    data_path: &dyn DataPath,
    tokenizers: &[Tokenize],
    model: &str,
    run_id: &str,
    context: u64,
    target: u64,
) -> Result<Prompt, CalibrationError> {
    let count = |chars: usize| {
        let text = filler_text(run_id, context, chars);
        async move {
            let tokens = tokenize(data_path, tokenizers, model, &text, target).await?;
            Ok::<_, CalibrationError>((text, tokens))
        }
    };
    // Bracket [low, high]: tokens(low) ≤ target < tokens(high).
    let prefix_len = filler_text(run_id, context, 0).len();
    let (prefix_text, prefix_tokens) = count(prefix_len).await?;
    if prefix_tokens > target {
        return Err(CalibrationError::TooShort {
            prefix: prefix_tokens,
            target,
        });
    }
    let mut best = (prefix_text, prefix_tokens);
    let mut low = (prefix_len, prefix_tokens);
    let mut high: Option<(usize, u64)> = None;
    let mut guess = (target as usize).saturating_mul(4).max(prefix_len + 1);
    for _ in 0..MAX_CALIBRATION_ROUNDS {
        if best.1 == target {
            break;
        }
        let (text, tokens) = count(guess).await?;
        if tokens <= target && tokens >= best.1 {
            best = (text, tokens);
        }
        if tokens <= target {
            low = (guess, tokens);
        } else {
            high = Some((guess, tokens));
        }
        guess = match high {
            None => {
                // Scale by the observed characters per token, overshooting a little.
                let per_token = guess as f64 / tokens.max(1) as f64;
                let wanted = (target as f64 * per_token * 1.02).ceil() as usize;
                wanted.max(guess + 1)
            }
            Some((high_len, high_tokens)) => {
                if high_len <= low.0 + 1 {
                    break;
                }
                // Interpolate inside the bracket, then keep strictly inside it.
                let span = high_tokens.saturating_sub(low.1).max(1) as f64;
                let fraction = target.saturating_sub(low.1) as f64 / span;
                let estimate = low.0 as f64 + fraction * (high_len - low.0) as f64;
                (estimate.round() as usize).clamp(low.0 + 1, high_len - 1)
            }
        };
    }
    let (text, tokens) = best;
    let mut json = String::with_capacity(text.len() + 2);
    push_json_string(&mut json, &text);
    Ok(Prompt {
        json: Arc::from(json),
        tokens,
        kind: PromptKind::Text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_prompts_share_only_the_run_prefix() {
        let seed = run_seed("run-a");
        let a: Vec<u64> = token_ids(seed, 8192, 64, None).collect();
        let b: Vec<u64> = token_ids(seed, 16384, 64, None).collect();
        let other_run: Vec<u64> = token_ids(run_seed("run-b"), 8192, 64, None).collect();
        assert_eq!(a[..RUN_PREFIX_TOKENS], b[..RUN_PREFIX_TOKENS]);
        assert_ne!(a[RUN_PREFIX_TOKENS..], b[RUN_PREFIX_TOKENS..]);
        assert_ne!(a[..RUN_PREFIX_TOKENS], other_run[..RUN_PREFIX_TOKENS]);
        assert!(a
            .iter()
            .all(|&id| (ID_BASE..ID_BASE + ID_SPAN).contains(&id)));
        let prompt = token_id_prompt(seed, 8192, 8192, None);
        let parsed: Vec<u64> = serde_json::from_str(&prompt.json).unwrap();
        assert_eq!(parsed.len(), 8192);
        assert_eq!(parsed[..64], a[..]);
        // A 1M-token prompt stays under the proxy's 8 MiB parse limit.
        let largest = token_id_prompt(seed, 1 << 20, (1 << 20) - 2, None);
        assert!(largest.json.len() < 8 << 20, "{}", largest.json.len());
    }

    #[test]
    fn pooled_ids_come_from_the_pool_only() {
        let pool: Vec<u64> = (0..40).map(|i| i * 25).collect(); // a 1,000-id vocabulary
        let seed = run_seed("run-a");
        let ids: Vec<u64> = token_ids(seed, 256, 512, Some(&pool)).collect();
        assert!(ids.iter().all(|id| pool.contains(id)));
        assert!(ids.iter().any(|&id| id != ids[0]), "not one id repeated");
        let other: Vec<u64> = token_ids(seed, 512, 512, Some(&pool)).collect();
        assert_eq!(ids[..RUN_PREFIX_TOKENS], other[..RUN_PREFIX_TOKENS]);
        assert_ne!(ids[RUN_PREFIX_TOKENS..], other[RUN_PREFIX_TOKENS..]);
    }

    #[test]
    fn filler_text_is_deterministic_ascii_with_the_prefix() {
        let text = filler_text("r1", 8192, 1000);
        assert_eq!(text.len(), 1000);
        assert!(text.is_ascii());
        assert!(text.starts_with("[BENCH_r1_CTX_8192] "));
        assert_eq!(text, filler_text("r1", 8192, 1000));
        assert!(filler_text("r1", 8192, 2000).starts_with(&text));
        assert_ne!(filler_text("r1", 16384, 1000), text);
    }
}
