//! The model an upstream serves, for the requests that name none (sglang `/generate`): the first
//! model of its `/v1/models`, asked in the background at start and again every [`REFRESH`] (a
//! restart may load another model), each question within `ask::DEADLINE`. A configured
//! `default_model` wins and nothing is asked; until the server has answered, such requests are
//! recorded under [`UNKNOWN_MODEL`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::ask::{get, DEADLINE};
use super::upstream::{Router, Upstream};

/// How often an answered upstream is asked again.
pub const REFRESH: Duration = Duration::from_secs(60);
/// First wait after an upstream did not answer; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The label of a request that names no model while neither the configuration nor the server
/// says one.
pub const UNKNOWN_MODEL: &str = "default";

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

/// Asks `upstream` once; `None` when it did not answer a model list.
pub async fn ask(upstream: &Upstream) -> Option<String> {
    match get(upstream, "/v1/models", DEADLINE).await {
        Some((200, body)) => first_model(&body),
        _ => None,
    }
}

/// Starts one background task per upstream without a configured `default_model`. Each holds
/// only a weak reference, so it ends when the proxy is dropped.
pub fn spawn_discovery(router: &Router) {
    for upstream in router.all() {
        if upstream.default_model.is_some() {
            continue;
        }
        tokio::spawn(discover_forever(Arc::downgrade(upstream)));
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
                Some(model) => {
                    if upstream.set_served_model(&model) {
                        tracing::info!(
                            upstream = %upstream.name,
                            model = %model,
                            "requests that name no model are recorded under the server's model (/v1/models)"
                        );
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
