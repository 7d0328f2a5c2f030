//! The models each upstream serves, asked of its `/v1/models` at start and every minute (a
//! failing upstream is asked again sooner, backing off), direct, never on a request's path:
//! those names always get their own metric label (`ModelLabels`), whatever names clients
//! invent. Like the `/metrics` scrape, it is a background read of the upstream, and off for an
//! upstream whose `metrics_interval` is 0.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::service::Proxy;
use super::usage_unasked::get;

/// How often the lists are asked again once they answer.
const REFRESH: Duration = Duration::from_secs(60);
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// The `id`s of an OpenAI-style model list (`{"data": [{"id": …}]}`).
pub fn model_ids(list: &serde_json::Value) -> Vec<&str> {
    list.get("data")
        .and_then(serde_json::Value::as_array)
        .map(|models| {
            models
                .iter()
                .filter_map(|m| m.get("id").and_then(serde_json::Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// Marks the configured names served, then starts the refresher (it holds the proxy weakly,
/// so it ends with it).
pub fn spawn(proxy: &Arc<Proxy>) {
    for upstream in proxy.router.all() {
        proxy
            .models
            .serve(upstream.config.models.iter().map(String::as_str));
        proxy
            .models
            .serve(std::iter::once(upstream.config.default_model.as_str()));
    }
    if proxy
        .router
        .all()
        .iter()
        .any(|u| !u.config.metrics_interval.is_zero())
    {
        tokio::spawn(refresh_forever(Arc::downgrade(proxy)));
    }
}

async fn refresh_forever(proxy: Weak<Proxy>) {
    let mut retry = RETRY_FIRST;
    loop {
        let wait = {
            let Some(proxy) = proxy.upgrade() else {
                return;
            };
            let mut answered = true;
            for upstream in proxy.router.all() {
                if upstream.config.metrics_interval.is_zero() {
                    continue;
                }
                match get(upstream, "/v1/models").await {
                    Some((200, body)) => {
                        if let Ok(list) = serde_json::from_slice::<serde_json::Value>(&body) {
                            proxy.models.serve(model_ids(&list));
                        }
                    }
                    _ => answered = false,
                }
            }
            if answered {
                retry = RETRY_FIRST;
                REFRESH
            } else {
                let wait = retry;
                retry = (retry * 2).min(REFRESH);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}
