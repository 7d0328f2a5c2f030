//! Whether an upstream sends usage to streams that did not ask for it, and asking it.
//!
//! sglang `--stream-response-default-include-usage` sends the final usage chunk to every stream;
//! vLLM `--enable-force-include-usage` sends usage on every chunk and the final usage chunk to
//! every stream. tokentap must then leave that usage to the client (it is the server's, not
//! tokentap's injection): the proxy passes [`Upstream::server_usage`] to
//! `stream::request::injection`. The setting is per upstream (`sends_usage_unasked`: `"final"`,
//! `"every_chunk"`); with `"auto"` a background task asks sglang, which says so in
//! `/server_info` (`/get_server_info` before 0.4.7) as `stream_response_default_include_usage`
//! (meaning `"final"`), at start and every [`RECHECK`] (a restart may change the flag). vLLM
//! does not expose its flag over HTTP: there `"auto"` stays no, and the operator sets
//! `"every_chunk"`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::ask::{get, DEADLINE};
use super::upstream::{Router, Upstream};
use crate::config::UsageUnasked;

/// How often an answered upstream is asked again.
pub const RECHECK: Duration = Duration::from_secs(600);
/// First wait after an upstream did not answer; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// What one ask found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// The server said (sglang): the flag's value.
    Said(bool),
    /// The server answered but does not say (not sglang, or an sglang without the flag).
    Silent,
    /// No answer (down, starting, timed out).
    NoAnswer,
}

/// Reads the flag from a server-info document.
pub fn from_server_info(info: &serde_json::Value) -> Discovery {
    match info
        .get("stream_response_default_include_usage")
        .and_then(serde_json::Value::as_bool)
    {
        Some(flag) => Discovery::Said(flag),
        None => Discovery::Silent,
    }
}

/// Asks `upstream` once, direct (not through the proxy: routing could send the question to
/// another upstream), each question within [`DEADLINE`]: sglang's answer waits on its
/// scheduler, which may not answer at all. The older name `/get_server_info` is asked only when
/// `/server_info` answered something else than 200 (an sglang before 0.4.7 has no
/// `/server_info`; a later one serves both from one handler, so one that did not answer the
/// first would not answer the second, and asking it logs a deprecation warning).
pub async fn ask(upstream: &Upstream) -> Discovery {
    let mut answered = false;
    for path in ["/server_info", "/get_server_info"] {
        match get(upstream, path, DEADLINE).await {
            Some((200, body)) => {
                return serde_json::from_slice(&body)
                    .map_or(Discovery::Silent, |info| from_server_info(&info));
            }
            Some(_) => answered = true,
            None => break,
        }
    }
    if answered {
        Discovery::Silent
    } else {
        Discovery::NoAnswer
    }
}

/// Starts one background task per `"auto"` upstream. Each holds only a weak reference, so it
/// ends when the proxy is dropped.
pub fn spawn_discovery(router: &Router) {
    for upstream in router.all() {
        if upstream.config.sends_usage_unasked != UsageUnasked::Auto {
            continue;
        }
        let weak = Arc::downgrade(upstream);
        tokio::spawn(discover_forever(weak));
    }
}

async fn discover_forever(upstream: Weak<Upstream>) {
    let mut retry = RETRY_FIRST;
    loop {
        let wait = {
            let Some(upstream) = upstream.upgrade() else {
                return;
            };
            match ask(&upstream).await {
                Discovery::Said(flag) => {
                    let before = upstream.usage_unasked.swap(flag, Ordering::Relaxed);
                    if before != flag {
                        tracing::info!(
                            upstream = %upstream.name,
                            sends_usage_unasked = flag,
                            "the server says whether it sends usage unasked (stream_response_default_include_usage)"
                        );
                    }
                    retry = RETRY_FIRST;
                    RECHECK
                }
                Discovery::Silent => {
                    retry = RETRY_FIRST;
                    RECHECK
                }
                Discovery::NoAnswer => {
                    let wait = retry;
                    retry = (retry * 2).min(RETRY_MAX);
                    wait
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sglangs_flag_and_nothing_else() {
        let said = |v: serde_json::Value| from_server_info(&v);
        assert_eq!(
            said(
                serde_json::json!({"stream_response_default_include_usage": true, "version": "0.5.6"})
            ),
            Discovery::Said(true)
        );
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": false})),
            Discovery::Said(false)
        );
        assert_eq!(
            said(serde_json::json!({"version": "0.4.0"})),
            Discovery::Silent
        );
        assert_eq!(
            said(serde_json::json!({"stream_response_default_include_usage": "yes"})),
            Discovery::Silent
        );
    }
}
