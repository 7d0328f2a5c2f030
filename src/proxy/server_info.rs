//! An engine's server-info document (sglang's `/server_info` and `/get_server_info`, its
//! resolved server arguments; vLLM's development-mode `/server_info`, its configuration and
//! environment) as it is forwarded to clients: every member named as a credential masked, and
//! every credential in a command line or a configuration's text form it quotes. The forward
//! phase reads such an answer whole and hands on only what [`redact_secrets`] made of it.

use crate::matrix::redact::{redact_launch_command, REDACTED};

/// Whether a server argument or document member named `key` holds a credential. sglang
/// 0.5.23's server arguments (`arg_groups/fields/serving.py`, `sampling/watermarking/core.py`):
/// `api_key`, `admin_api_key`, `ssl_keyfile_password`, `watermark_key`, `watermark_key_b`,
/// `watermark_config`; vLLM's (`entrypoints/openai/cli_args.py`, `config/`): `api_key`,
/// `hf_token`, `ssl_keyfile_password`, the KV connectors' and loaders' `*_secret*`,
/// `*access_key*`. Matched by shape so that a renamed or added one is masked too; a count
/// (`max_total_tokens`) or a token *string* of the tokenizer (`fim_begin_token`) is not a
/// credential and stays.
pub fn is_secret_key(key: &str) -> bool {
    // An environment variable's name (vLLM's development-mode `/server_info` dumps the
    // environment): any that names a token, key, secret, password or credential.
    let env_name =
        key.bytes().any(|b| b.is_ascii_uppercase()) && !key.bytes().any(|b| b.is_ascii_lowercase());
    if env_name
        && [
            "TOKEN",
            "KEY",
            "SECRET",
            "PASS",
            "AUTH",
            "CRED",
            "SIGNATURE",
        ]
        .iter()
        .any(|part| key.contains(part))
    {
        return true;
    }
    let key = key
        .trim_start_matches('-')
        .to_ascii_lowercase()
        .replace('-', "_");
    const CONTAINS: [&str; 9] = [
        "api_key",
        "apikey",
        "password",
        "passwd",
        "secret",
        "access_key",
        "private_key",
        "credential",
        "watermark_key",
    ];
    const EXACT: [&str; 8] = [
        "token",
        "hf_token",
        "auth_token",
        "access_token",
        "bearer",
        "authorization",
        "watermark_config",
        "session_token",
    ];
    CONTAINS.iter().any(|part| key.contains(part))
        || EXACT.contains(&key.as_str())
        || key.ends_with("_auth_token")
        || key.ends_with("_access_token")
        || key.ends_with("_hf_token")
}

/// `document` with every credential masked: a member [`is_secret_key`] names keeps `null` (so
/// an unset one still reads unset) and has any other value replaced by `<redacted>`; every string
/// that reads as a command line goes through the matrix's launch-command redaction
/// (`matrix::redact`: `--api-key K`, `--api-key=K`, `HF_TOKEN=…`, headers, URL passwords) and
/// has each `name=value` word of a credential masked. At any depth.
pub fn redact_secrets(document: &mut serde_json::Value) {
    use serde_json::Value;
    match document {
        Value::Object(members) => {
            for (key, value) in members.iter_mut() {
                if is_secret_key(key) {
                    if !value.is_null() {
                        *value = Value::String(REDACTED.to_string());
                    }
                } else {
                    redact_secrets(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_secrets),
        Value::String(text) => {
            if text.contains("--") || text.contains('=') {
                // A launch command (`--api-key X`, `HF_TOKEN=…`, an `Authorization` header), then
                // a configuration's text form (`hf_token='…',`), word by word.
                let line = redact_launch_command(text);
                *text = line
                    .split(' ')
                    .map(redact_assignment)
                    .collect::<Vec<_>>()
                    .join(" ");
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// One word of a configuration's text form (`hf_token='abc',`, vLLM's `str(vllm_config)`)
/// with the value masked when the name is a credential's; else the word as it was.
fn redact_assignment(word: &str) -> std::borrow::Cow<'_, str> {
    match word.split_once('=') {
        Some((name, value)) if is_secret_key(name.trim_start_matches(['(', '{', '\'', '"'])) => {
            let tail = if value.ends_with(',') { "," } else { "" };
            format!("{name}={REDACTED}{tail}").into()
        }
        _ => word.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_masked_and_counts_kept() {
        for key in [
            "api_key",
            "admin_api_key",
            "ssl_keyfile_password",
            "watermark_key",
            "watermark_key_b",
            "watermark_config",
            "hf_token",
            "--api-key",
            "kv_connector_secret_key",
            "aws_secret_access_key",
            "HF_TOKEN",
            "GITHUB_TOKEN",
            "WANDB_API_KEY",
            "OPENAI_KEY",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "max_total_tokens",
            "fim_begin_token",
            "bucket_time_to_first_token",
            "tokenizer_path",
            "ssl_keyfile",
            "max_running_requests",
            "VLLM_CPU_KVCACHE_SPACE",
            "PATH",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
        let mut document = serde_json::json!({
            "api_key": "sk-1",
            "admin_api_key": null,
            "nested": [{"ssl_keyfile_password": "pw", "max_total_tokens": 5}],
            "launch_command": "python -m sglang.launch_server --model m --api-key sk-2  --admin-api-key=ad --port 1",
        });
        redact_secrets(&mut document);
        let text = document.to_string();
        for secret in ["sk-1", "sk-2", "pw", "=ad"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(document["admin_api_key"], serde_json::Value::Null);
        assert_eq!(document["nested"][0]["max_total_tokens"], 5);
        assert_eq!(
            document["launch_command"],
            "python -m sglang.launch_server --model m --api-key <redacted>  --admin-api-key=<redacted> --port 1"
        );
        // vLLM's text form of its configuration.
        let mut text = serde_json::json!({"vllm_config": "model='m', hf_token='hf_abc', seed=0"});
        redact_secrets(&mut text);
        let form = text["vllm_config"].as_str().unwrap_or_default();
        assert!(
            form.starts_with("model='m', hf_token=<redacted>") && form.ends_with("seed=0"),
            "{form}"
        );
        assert!(!form.contains("hf_abc"), "{form}");
    }
}
