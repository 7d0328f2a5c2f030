//! Secret redaction for launch commands stored in a matrix.
//!
//! A matrix is shared (pasted into issues, published), so the launch command it records must never
//! carry an API key. This module only rewrites text; it never logs what it removed.
//!
//! Redacted, case-insensitively, with the value replaced by `<redacted>`:
//! - flags whose name is a secret: `--api-key X`, `--api-key=X`, `--admin-api-key`, `--token`,
//!   `--hf-token`, `--auth-token`, any flag ending in `-key` or `-token` or containing `secret`,
//!   `password` or `passwd` (but not `--max-total-tokens` or `--kv-cache-dtype`: plurals and
//!   other words do not count);
//! - environment assignments `NAME=value` whose name ends in `_KEY`, `_TOKEN`, `_SECRET`,
//!   `_PASSWORD` or is `KEY`/`TOKEN`/`SECRET`/`PASSWORD` (`HF_TOKEN=…`, `OPENAI_API_KEY=…`);
//! - HTTP credentials in the text: `Authorization: Bearer X` (the scheme is kept), `X-Api-Key: X`;
//! - a password in a URL: `https://user:pass@host` → `https://user:<redacted>@host`.

/// What replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// Returns `command` with every secret it recognises replaced by `<redacted>`. Whitespace and
/// quoting are kept as they were; running it twice changes nothing more.
pub fn redact_launch_command(command: &str) -> String {
    let words = split_words(command);
    let mut out = String::with_capacity(command.len());
    let mut redact_next_word = false;
    let mut header_state = HeaderState::None;
    for piece in words {
        let Piece::Word(word) = piece else {
            if let Piece::Space(space) = piece {
                out.push_str(space);
            }
            continue;
        };
        if redact_next_word {
            redact_next_word = false;
            out.push_str(&replace_keeping_quotes(word));
            continue;
        }
        match header_state {
            HeaderState::AfterName => {
                if is_auth_scheme(word) {
                    header_state = HeaderState::AfterScheme;
                    out.push_str(word);
                } else {
                    header_state = HeaderState::None;
                    out.push_str(&replace_keeping_quotes(word));
                }
                continue;
            }
            HeaderState::AfterScheme => {
                header_state = HeaderState::None;
                out.push_str(&replace_keeping_quotes(word));
                continue;
            }
            HeaderState::None => {}
        }
        if let Some((redacted, next)) = redact_word(word) {
            out.push_str(&redacted);
            match next {
                Next::Nothing => {}
                Next::RedactValue => redact_next_word = true,
                Next::HeaderValue => header_state = HeaderState::AfterName,
                Next::HeaderCredential => header_state = HeaderState::AfterScheme,
            }
        } else {
            out.push_str(word);
        }
    }
    out
}

#[derive(Clone, Copy)]
enum HeaderState {
    None,
    AfterName,
    AfterScheme,
}

enum Next {
    Nothing,
    RedactValue,
    HeaderValue,
    HeaderCredential,
}

enum Piece<'a> {
    Word(&'a str),
    Space(&'a str),
}

/// Splits on unquoted whitespace; quoted runs (`'…'`, `"…"`) stay inside their word.
fn split_words(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut in_space = None::<bool>;
    let mut quote: Option<char> = None;
    for (index, ch) in text.char_indices() {
        let is_space = quote.is_none() && ch.is_whitespace();
        if let Some(previous) = in_space {
            if previous != is_space {
                let slice = &text[start..index];
                pieces.push(if previous {
                    Piece::Space(slice)
                } else {
                    Piece::Word(slice)
                });
                start = index;
            }
        }
        in_space = Some(is_space);
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(open), close) if open == close => quote = None,
            _ => {}
        }
    }
    if let Some(previous) = in_space {
        let slice = &text[start..];
        pieces.push(if previous {
            Piece::Space(slice)
        } else {
            Piece::Word(slice)
        });
    }
    pieces
}

/// `<redacted>` wrapped in whatever quotes `word` had around it.
fn replace_keeping_quotes(word: &str) -> String {
    let leading: String = word
        .chars()
        .take_while(|c| *c == '"' || *c == '\'')
        .collect();
    let trailing: String = {
        let mut chars: Vec<char> = word
            .chars()
            .rev()
            .take_while(|c| *c == '"' || *c == '\'')
            .collect();
        chars.reverse();
        chars.into_iter().collect()
    };
    if leading.len() + trailing.len() >= word.len() {
        return word.to_owned();
    }
    format!("{leading}{REDACTED}{trailing}")
}

fn is_auth_scheme(word: &str) -> bool {
    let bare = word.trim_matches(|c| c == '"' || c == '\'');
    ["bearer", "basic", "token", "digest"]
        .iter()
        .any(|scheme| bare.eq_ignore_ascii_case(scheme))
}

fn is_secret_flag_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase().replace('_', "-");
    name == "key"
        || name == "token"
        || name.ends_with("-key")
        || name.ends_with("-token")
        || name.contains("secret")
        || name.contains("password")
        || name.contains("passwd")
}

fn is_secret_env_name(name: &str) -> bool {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return false;
    }
    let upper = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD"]
        .iter()
        .any(|suffix| upper == *suffix || upper.ends_with(&format!("_{suffix}")))
}

/// Redacts within one word; `None` when the word holds no secret.
fn redact_word(word: &str) -> Option<(String, Next)> {
    let bare = word.trim_start_matches(['"', '\'']);
    let prefix = &word[..word.len() - bare.len()];
    // `--flag=value` and `--flag value`.
    if let Some(flag) = bare.strip_prefix("--").or_else(|| bare.strip_prefix('-')) {
        if let Some((name, value)) = flag.split_once('=') {
            if is_secret_flag_name(name) && !value.is_empty() && !value.contains(REDACTED) {
                let dashes = &bare[..bare.len() - flag.len()];
                return Some((
                    format!("{prefix}{dashes}{name}={}", replace_keeping_quotes(value)),
                    Next::Nothing,
                ));
            }
        } else if is_secret_flag_name(flag.trim_end_matches(['"', '\''])) {
            return Some((word.to_owned(), Next::RedactValue));
        }
    }
    // `NAME=value` environment assignments.
    if let Some((name, value)) = bare.split_once('=') {
        if is_secret_env_name(name) && !value.is_empty() && !value.contains(REDACTED) {
            return Some((
                format!("{prefix}{name}={}", replace_keeping_quotes(value)),
                Next::Nothing,
            ));
        }
    }
    // HTTP headers, possibly inside one quoted word: `"Authorization: Bearer sk-…"`.
    let lower = word.to_ascii_lowercase();
    for header in ["authorization:", "x-api-key:", "api-key:"] {
        if let Some(position) = lower.find(header) {
            let head_end = position + header.len();
            let rest = &word[head_end..];
            if rest.is_empty() {
                let next = if header == "authorization:" {
                    Next::HeaderValue
                } else {
                    Next::HeaderCredential
                };
                return Some((word.to_owned(), next));
            }
            return Some((
                format!("{}{}", &word[..head_end], redact_header_value(rest, header)),
                Next::Nothing,
            ));
        }
    }
    // `scheme://user:password@host`.
    if let Some(scheme_end) = word.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = word[authority_start..]
            .find('/')
            .map_or(word.len(), |offset| authority_start + offset);
        let authority = &word[authority_start..authority_end];
        if let Some(at) = authority.rfind('@') {
            if let Some(colon) = authority[..at].find(':') {
                let password = &authority[colon + 1..at];
                if !password.is_empty() && password != REDACTED {
                    return Some((
                        format!(
                            "{}{}:{REDACTED}{}",
                            &word[..authority_start],
                            &authority[..colon],
                            &word[authority_start + at..]
                        ),
                        Next::Nothing,
                    ));
                }
            }
        }
    }
    None
}

/// Redacts a header value that sits in the same word as its name: keeps leading spaces, the auth
/// scheme and closing quotes.
fn redact_header_value(rest: &str, header: &str) -> String {
    let trailing_quotes = rest.len() - rest.trim_end_matches(['"', '\'']).len();
    let (body, closing) = rest.split_at(rest.len() - trailing_quotes);
    let trimmed = body.trim_start();
    let leading_space = &body[..body.len() - trimmed.len()];
    if trimmed.is_empty() {
        return rest.to_owned();
    }
    let mut parts = trimmed.splitn(2, char::is_whitespace);
    let first = parts.next().unwrap_or_default();
    let second = parts.next();
    let value = match second {
        Some(credential) if header == "authorization:" && is_auth_scheme(first) => {
            if credential.trim() == REDACTED {
                return rest.to_owned();
            }
            format!("{first} {REDACTED}")
        }
        _ => {
            if trimmed == REDACTED {
                return rest.to_owned();
            }
            REDACTED.to_owned()
        }
    };
    format!("{leading_space}{value}{closing}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        assert_eq!(
            redact_launch_command("sglang serve --api-key sk-123 --port 8000"),
            "sglang serve --api-key <redacted> --port 8000"
        );
        assert_eq!(
            redact_launch_command("vllm serve m --api-key=sk-123 --hf-token hf_abc --max-total-tokens 100000 --kv-cache-dtype fp8"),
            "vllm serve m --api-key=<redacted> --hf-token <redacted> --max-total-tokens 100000 --kv-cache-dtype fp8"
        );
        assert_eq!(
            redact_launch_command("x --token \"a b c\" --admin_password 'p w' --speculative-num-draft-tokens 4"),
            "x --token \"<redacted>\" --admin_password '<redacted>' --speculative-num-draft-tokens 4"
        );
    }

    #[test]
    fn environment_headers_urls() {
        assert_eq!(
            redact_launch_command(
                "HF_TOKEN=hf_x OPENAI_API_KEY=sk CUDA_VISIBLE_DEVICES=0,1 sglang"
            ),
            "HF_TOKEN=<redacted> OPENAI_API_KEY=<redacted> CUDA_VISIBLE_DEVICES=0,1 sglang"
        );
        assert_eq!(
            redact_launch_command("curl -H \"Authorization: Bearer sk-1\" -H 'X-Api-Key: abc' http://u:pw@h:1/x"),
            "curl -H \"Authorization: Bearer <redacted>\" -H 'X-Api-Key: <redacted>' http://u:<redacted>@h:1/x"
        );
        assert_eq!(
            redact_launch_command("curl -H Authorization: Bearer sk-1 -d {}"),
            "curl -H Authorization: Bearer <redacted> -d {}"
        );
    }

    #[test]
    fn idempotent_and_keeps_whitespace() {
        let seed = "\"$HOME/env/bin/sglang\" serve --model-path m  --api-key <redacted>\n  --tp 4";
        assert_eq!(redact_launch_command(seed), seed);
        let once = redact_launch_command("A_KEY=1 --api-key 2 \"Authorization: Bearer 3\"");
        assert_eq!(redact_launch_command(&once), once);
        assert_eq!(redact_launch_command(""), "");
        assert_eq!(redact_launch_command("--api-key"), "--api-key");
    }
}
