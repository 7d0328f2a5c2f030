//! The typed values of the raw configuration: durations, socket addresses, http(s) URLs and the
//! enums, each read and checked while it is deserialised, so a bad value fails with its key path
//! and origin (`serde_path_to_error` in `ConfigLoader::load`), in the words the configuration has
//! always used. Checks that need more than one value (zero where zero is not allowed, ranges,
//! cross-field rules) stay with each section's `from_raw`.

use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::base::duration::parse_duration;
use crate::matrix::capacity::Basis;

/// A duration as written: `30s`, `500ms`, or a bare `0` (which TOML and the environment layer
/// read as a number), parsed by `base::duration::parse_duration`.
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    // Untagged as it always was, so a value of another type fails in the same words.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Text(String),
        Number(i64),
    }
    let text = match Text::deserialize(deserializer)? {
        Text::Text(text) => text,
        Text::Number(n) => n.to_string(),
    };
    parse_duration(&text).map_err(D::Error::custom)
}

/// A listen address such as `127.0.0.1:8000`.
pub fn socket_addr<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse::<SocketAddr>().map_err(|e| {
        D::Error::custom(format!(
            "`{text}` is not an address like 127.0.0.1:8000: {e}"
        ))
    })
}

/// An `http://` or `https://` URL with a host.
pub fn http_uri<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Uri, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_http_uri(&text).map_err(D::Error::custom)
}

/// [`http_uri`], or none when absent or empty.
pub fn optional_http_uri<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Uri>, D::Error> {
    match Option::<String>::deserialize(deserializer)?.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => parse_http_uri(text).map(Some).map_err(D::Error::custom),
    }
}

fn parse_http_uri(text: &str) -> Result<Uri, String> {
    // Messages show the URL without its secrets: they end up in logs and terminals.
    let shown = crate::net::redact::redact_url(text);
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("`{shown}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") if uri.authority().is_some() => Ok(uri),
        _ => Err(format!(
            "`{shown}` must be an http:// or https:// URL with a host"
        )),
    }
}

/// `[capacity] basis`: `auto`, `attainment`, `median`, `p90` or `p99`.
pub fn basis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Basis, D::Error> {
    let text = String::deserialize(deserializer)?;
    Basis::parse(&text).ok_or_else(|| {
        D::Error::custom(format!(
            "`{text}`: expected auto, attainment, median, p90 or p99"
        ))
    })
}

/// Whether an upstream sends usage to streams that did not ask (`sends_usage_unasked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageUnasked {
    /// Ask the server where it says so (sglang `/server_info`: then [`Self::Final`]); until it
    /// answers, no.
    Auto,
    /// `"final"`: the final usage chunk only (sglang `--stream-response-default-include-usage`).
    Final,
    /// `"every_chunk"` (or its alias `"yes"`): usage on every chunk and a final usage chunk
    /// (vLLM `--enable-force-include-usage`). tokentap then adds nothing to streamed requests,
    /// which is byte-safe on either engine; `"final"` keeps exact per-chunk counts on sglang.
    EveryChunk,
    No,
}

impl<'de> Deserialize<'de> for UsageUnasked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "auto" => Ok(Self::Auto),
            "final" => Ok(Self::Final),
            "every_chunk" | "yes" => Ok(Self::EveryChunk),
            "no" => Ok(Self::No),
            other => Err(D::Error::custom(format!(
                "`{other}` must be \"auto\", \"final\", \"every_chunk\", \"yes\" or \"no\""
            ))),
        }
    }
}
