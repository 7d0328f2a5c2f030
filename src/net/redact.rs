//! Redaction: the one way a URL or an engine's server arguments are shown to anyone.
//! Userinfo (`user:secret@`) and query values (`?api_key=…`) are secrets more often than not;
//! every URL tokentap prints, logs, traces, stores or answers goes through [`redact_url`] or is
//! stripped by [`without_userinfo`] before it is kept. An engine's server-info document (sglang's
//! `/server_info`, its resolved server arguments) is forwarded to clients only through
//! [`redact_secrets`]: every member named as a credential is masked, and so is the value of every
//! such flag in a command line it quotes (`launch_command`).

use http::uri::{Authority, Uri};

/// What stands in for a removed secret.
const MASK: &str = "***";

/// `text` with the userinfo of its authority and every query value replaced by `***`
/// (`http://u:p@h/x?key=v&flag` → `http://***@h/x?key=***&flag`). Works on any text, URL or
/// not, and never fails: text that is not a URL comes back with its query values masked.
pub fn redact_url(text: &str) -> String {
    let (before_query, query) = match text.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (text, None),
    };
    let mut out = String::with_capacity(text.len());
    match before_query.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            out.push_str(scheme);
            out.push_str("://");
            match authority.rsplit_once('@') {
                Some((_userinfo, host)) => {
                    out.push_str(MASK);
                    out.push('@');
                    out.push_str(host);
                }
                None => out.push_str(authority),
            }
            out.push_str(path);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query {
        let (query, fragment) = match query.split_once('#') {
            Some((query, fragment)) => (query, Some(fragment)),
            None => (query, None),
        };
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((key, _value)) => {
                    out.push_str(key);
                    out.push('=');
                    out.push_str(MASK);
                }
                None => out.push_str(pair),
            }
        }
        if let Some(fragment) = fragment {
            out.push('#');
            out.push_str(fragment);
        }
    }
    out
}

/// `uri` without userinfo in its authority; `None` if it had none. hyper never turns userinfo
/// into credentials (and HTTP/2 forbids it in `:authority`), so an upstream URL keeps only
/// what can be shown.
pub fn without_userinfo(uri: &Uri) -> Option<Uri> {
    let authority = uri.authority()?;
    let (_userinfo, host) = authority.as_str().rsplit_once('@')?;
    let mut parts = uri.clone().into_parts();
    parts.authority = Some(Authority::try_from(host).ok()?);
    Uri::from_parts(parts).ok()
}

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
/// an unset one still reads unset) and has any other value replaced by `***`; every string that
/// reads as a command line has the value of each credential flag masked (`--api-key K`,
/// `--api-key=K`). At any depth.
pub fn redact_secrets(document: &mut serde_json::Value) {
    use serde_json::Value;
    match document {
        Value::Object(members) => {
            for (key, value) in members.iter_mut() {
                if is_secret_key(key) {
                    if !value.is_null() {
                        *value = Value::String(MASK.to_string());
                    }
                } else {
                    redact_secrets(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_secrets),
        Value::String(text) => {
            if text.contains("--") || text.contains('=') {
                *text = redact_command_line(text);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A command line with the value of every credential flag masked, its words and spacing
/// otherwise as they were.
pub fn redact_command_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut mask_next = false;
    let mut rest = line;
    while !rest.is_empty() {
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, after) = rest.split_at(word_end);
        let space_end = after
            .find(|c: char| !c.is_whitespace())
            .unwrap_or(after.len());
        let (space, next) = after.split_at(space_end);
        if mask_next && !word.starts_with("--") {
            out.push_str(MASK);
            mask_next = false;
        } else if let Some(flag) = word.strip_prefix("--") {
            match flag.split_once('=') {
                Some((name, _value)) if is_secret_key(name) => {
                    out.push_str("--");
                    out.push_str(name);
                    out.push('=');
                    out.push_str(MASK);
                    mask_next = false;
                }
                Some(_) => {
                    out.push_str(word);
                    mask_next = false;
                }
                None => {
                    out.push_str(word);
                    mask_next = is_secret_key(flag);
                }
            }
        } else {
            out.push_str(&redact_assignment(word));
        }
        out.push_str(space);
        rest = next;
    }
    out
}

/// One word of a configuration's text form (`hf_token='abc',`, vLLM's `str(vllm_config)`)
/// with the value masked when the name is a credential's; else the word as it was.
fn redact_assignment(word: &str) -> std::borrow::Cow<'_, str> {
    match word.split_once('=') {
        Some((name, value)) if is_secret_key(name.trim_start_matches(['(', '{', '\'', '"'])) => {
            let tail = if value.ends_with(',') { "," } else { "" };
            format!("{name}={MASK}{tail}").into()
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
            "python -m sglang.launch_server --model m --api-key ***  --admin-api-key=*** --port 1"
        );
        // vLLM's text form of its configuration.
        let mut text = serde_json::json!({"vllm_config": "model='m', hf_token='hf_abc', seed=0"});
        redact_secrets(&mut text);
        assert_eq!(text["vllm_config"], "model='m', hf_token=***, seed=0");
    }

    #[test]
    fn userinfo_and_query_values_are_masked() {
        for (input, expected) in [
            ("http://user:secret@host:8000/v1", "http://***@host:8000/v1"),
            ("https://tok@h", "https://***@h"),
            ("http://h/p?api_key=s3cret&x", "http://h/p?api_key=***&x"),
            (
                "http://u:p@h/p?a=1&b=2#frag",
                "http://***@h/p?a=***&b=***#frag",
            ),
            ("http://host:1/no/creds", "http://host:1/no/creds"),
            ("not a url", "not a url"),
            ("", ""),
            ("http://a@b@c/x", "http://***@c/x"),
            ("http://h/path@not-userinfo", "http://h/path@not-userinfo"),
        ] {
            assert_eq!(redact_url(input), expected, "{input}");
            assert!(!redact_url(input).contains("secret"), "{input}");
        }
    }

    #[test]
    fn userinfo_is_stripped_from_uris() {
        let uri: Uri = "http://user:secret@127.0.0.1:9/base".parse().unwrap();
        let stripped = without_userinfo(&uri).unwrap();
        assert_eq!(stripped.to_string(), "http://127.0.0.1:9/base");
        let plain: Uri = "http://127.0.0.1:9/".parse().unwrap();
        assert_eq!(without_userinfo(&plain), None);
    }
}
