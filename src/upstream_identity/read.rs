//! One read of an upstream: `/server_info` (its older name `/get_server_info` only when the
//! first is missing), `/model_info`, `/v1/models`, `/version` and the metrics page, asked at
//! once and direct (`proxy::ask`: each bounded by its deadline and size), so a question that
//! never answers costs its deadline and no more.

use std::time::Duration;

use serde_json::Value;

use super::facts::Answers;
use crate::proxy::ask;
use crate::proxy::upstream::Upstream;

/// Asks `upstream` everything at once, each question within `deadline`.
pub async fn read(upstream: &Upstream, deadline: Duration) -> Answers {
    let metrics_path = upstream.config.metrics_path.clone();
    let (server_info, model_info, models, version, metrics) = tokio::join!(
        server_info(upstream, deadline),
        json(upstream, "/model_info", deadline),
        json(upstream, "/v1/models", deadline),
        json(upstream, "/version", deadline),
        text(upstream, &metrics_path, deadline),
    );
    Answers {
        server_info,
        model_info,
        models,
        version,
        metrics,
    }
}

async fn server_info(upstream: &Upstream, deadline: Duration) -> Option<Value> {
    match ask::get(upstream, "/server_info", deadline).await {
        Some((status, body)) if (200..300).contains(&status) => parse(&body),
        // Missing (an sglang before 0.4.7): its older name. A timeout is not asked again.
        Some(_) => json(upstream, "/get_server_info", deadline).await,
        None => None,
    }
}

async fn json(upstream: &Upstream, path: &str, deadline: Duration) -> Option<Value> {
    let (status, body) = ask::get(upstream, path, deadline).await?;
    (200..300).contains(&status).then(|| parse(&body)).flatten()
}

async fn text(upstream: &Upstream, path: &str, deadline: Duration) -> Option<String> {
    let (status, body) = ask::get(upstream, path, deadline).await?;
    if !(200..300).contains(&status) {
        return None;
    }
    String::from_utf8(body.to_vec()).ok()
}

/// A JSON object, or nothing.
fn parse(body: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
}
