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
/// read as a number), parsed by `base::duration::parse_duration`. A bare number other than 0
/// fails as having no unit, whichever layer wrote it.
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = deserializer.deserialize_any(DurationText)?;
    parse_duration(&text).map_err(D::Error::custom)
}

/// A duration's text as written, unparsed: a string, or a number as TOML and the environment
/// and `--set` layers read `500` (so `500` fails the same way from a file, a variable or a
/// flag: it has no unit); absent stays `None`. The `[slo]` targets, parsed by their section.
pub fn duration_text<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    deserializer.deserialize_any(DurationText).map(Some)
}

/// Reads a duration's text: a string, or an integer or float written as its digits; anything
/// else fails saying what a duration looks like.
struct DurationText;

impl serde::de::Visitor<'_> for DurationText {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a duration such as 500ms, 30s or 5m")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<String, E> {
        Ok(text.to_owned())
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<String, E> {
        Ok(n.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<String, E> {
        Ok(n.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<String, E> {
        Ok(n.to_string())
    }
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

/// `proxy.code_fields`: what the data port does with request fields an engine runs as code
/// (sglang's `custom_logit_processor`, `base::engine::CodeField`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeFields {
    /// Refused with a 403 naming the setting and the engine's flag.
    #[default]
    Refuse,
    /// Forwarded (for an engine started with the flag on purpose, behind trusted clients).
    Forward,
}

impl<'de> Deserialize<'de> for CodeFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "refuse" => Ok(Self::Refuse),
            "forward" => Ok(Self::Forward),
            other => Err(D::Error::custom(format!(
                "`{other}` must be \"refuse\" (the default) or \"forward\""
            ))),
        }
    }
}

/// `[metering] server_timing`: when a request's own timing is handed back to its client
/// (`Server-Timing`, docs/metrics.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerTiming {
    /// Never: the client's bytes stay the upstream's.
    #[default]
    Off,
    /// When the request carries the header `server_timing_header` names.
    OnRequest,
    /// For every metered request from a client.
    Always,
}

impl<'de> Deserialize<'de> for ServerTiming {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            "off" => Ok(Self::Off),
            "on_request" => Ok(Self::OnRequest),
            "always" => Ok(Self::Always),
            other => Err(D::Error::custom(format!(
                "`{other}` must be \"off\", \"on_request\" or \"always\""
            ))),
        }
    }
}
