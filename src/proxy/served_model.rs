//! The models each upstream serves, from its `/v1/models`, asked in the background at start and
//! again every [`REFRESH`] (a restart may load another model), each question within
//! `ask::DEADLINE`, never on a request's path. Two uses of one answer:
//!
//! * the requests that name no model (sglang `/generate`) are recorded under the first model
//!   of the list; a configured `default_model` wins, and until the server has answered such
//!   requests are recorded under [`UNKNOWN_MODEL`];
//! * every model the upstreams serve (and the configured `models` and `default_model`) always
//!   gets its own metric label (`ModelLabels`), whatever names clients invent.
//!
//! An upstream is asked when it has no `default_model`, or when its `metrics_interval` is not
//! 0 (like the `/metrics` scrape, the list is a background read of the upstream).

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::ask::{get, DEADLINE};
use super::service::Proxy;
use super::upstream::Upstream;

/// How often an answered upstream is asked again.
pub const REFRESH: Duration = Duration::from_secs(60);
/// First wait after an upstream did not answer; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
pub use super::upstream::UNKNOWN_MODEL;

/// The first model id of a `/v1/models` answer (OpenAI's list: `{"data":[{"id":…},…]}`).
pub fn first_model(body: &[u8]) -> Option<String> {
    let models: serde_json::Value = serde_json::from_slice(body).ok()?;
    let id = models
        .get("data")?
        .as_array()?
        .first()?
        .get("id")?
        .as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// The `id`s of an OpenAI-style model list (`{"data": [{"id": …}]}`).
pub fn model_ids(list: &serde_json::Value) -> Vec<&str> {
    list.get("data")
        .and_then(serde_json::Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(serde_json::Value::as_str))
                .filter(|id| !id.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Asks `upstream` once: its model list, `None` when it did not answer one.
pub async fn ask(upstream: &Upstream) -> Option<Vec<String>> {
    match get(upstream, "/v1/models", DEADLINE).await {
        Some((200, body)) => {
            let list: serde_json::Value = serde_json::from_slice(&body).ok()?;
            Some(model_ids(&list).into_iter().map(str::to_owned).collect())
        }
        _ => None,
    }
}

/// Marks the configured names served, then starts one background task per upstream that is to
/// be asked. Each holds the proxy weakly, so it ends when the proxy is dropped.
pub fn spawn(proxy: &Arc<Proxy>) {
    for (index, upstream) in proxy.router.all().iter().enumerate() {
        proxy
            .models
            .serve(upstream.config.models.iter().map(String::as_str));
        if let Some(model) = &upstream.default_model {
            proxy.models.serve(std::iter::once(&**model));
        }
        if upstream.default_model.is_none() || !upstream.config.metrics_interval.is_zero() {
            tokio::spawn(discover_forever(Arc::downgrade(proxy), index));
        }
    }
}

async fn discover_forever(proxy: Weak<Proxy>, index: usize) {
    let mut retry = RETRY_FIRST;
    loop {
        let wait = {
            let Some(proxy) = proxy.upgrade() else {
                return;
            };
            let Some(upstream) = proxy.router.all().get(index).cloned() else {
                return;
            };
            match ask(&upstream).await {
                Some(models) => {
                    proxy.models.serve(models.iter().map(String::as_str));
                    if let Some(first) = models.first().filter(|_| upstream.default_model.is_none())
                    {
                        if upstream.set_served_model(first) {
                            tracing::info!(
                                upstream = %upstream.name,
                                model = %first,
                                "requests that name no model are recorded under the server's model (/v1/models)"
                            );
                        }
                    }
                    retry = RETRY_FIRST;
                    REFRESH
                }
                None => {
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
    fn reads_the_first_model_of_a_list_and_nothing_else() {
        let sglang = br#"{"object":"list","data":[{"id":"tiny-llama","object":"model","created":1,"owned_by":"sglang","root":"/m","parent":null,"max_model_len":512}]}"#;
        assert_eq!(first_model(sglang).as_deref(), Some("tiny-llama"));
        let two = br#"{"data":[{"id":"a"},{"id":"b"}]}"#;
        assert_eq!(first_model(two).as_deref(), Some("a"));
        for body in [
            &b"{}"[..],
            b"{\"data\":[]}",
            b"{\"data\":[{\"id\":\"\"}]}",
            b"{\"data\":[{\"id\":7}]}",
            b"[1,2]",
            b"not json",
            b"",
        ] {
            assert_eq!(first_model(body), None, "{}", String::from_utf8_lossy(body));
        }
    }
}
