//! The one reader of an upstream's self-description: every engine's server-info route
//! (`base::engine`, with its older names asked only when the newer is missing), model info,
//! `/v1/models`, version and the metrics page, asked at once and direct (`ask`: each bounded by
//! its deadline and size), so a question that never answers costs its deadline and no more.
//!
//! One task per upstream reads it at start, every interval (`[fingerprint] interval`, else a
//! minute), and at once when the upstream answers again after failing; each read is
//! *published* on the upstream (`Upstream::description`): the latest answers and the engine they
//! name. Everything that wants to know what the server is reads that slot: the labels of served
//! models and the model of requests that name none, whether the server sends usage unasked,
//! the fingerprint (`upstream_identity`, which subscribes), and the sweep, which asks for a fresh
//! read at its start through its door (`synthetic::DataPath::describe`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::Value;

use super::answers::Answers;
use super::ask;
use super::service::Proxy;
use super::upstream::Upstream;
use crate::base::engine::{self, Engine};
use crate::config::UsageUnasked;

/// Asks `upstream` everything at once, each question within `deadline`; its metrics page only
/// when `with_metrics` (the fingerprint reads its `*_info` series, a sweep its gauges; the
/// scraper reads the page for the server's state on its own).
pub async fn read(upstream: &Upstream, deadline: Duration, with_metrics: bool) -> Answers {
    let metrics_path = upstream.config.metrics_path.clone();
    let model_info_route = Engine::all()
        .into_iter()
        .find_map(|e| e.spec().describe.model_info);
    let version_route = Engine::all()
        .into_iter()
        .find_map(|e| e.spec().describe.version);
    let (server_info, model_info, models, version, metrics) = tokio::join!(
        server_info(upstream, deadline),
        async {
            match model_info_route {
                Some(route) => json(upstream, route, deadline).await,
                None => None,
            }
        },
        json(upstream, "/v1/models", deadline),
        async {
            match version_route {
                Some(route) => json(upstream, route, deadline).await,
                None => None,
            }
        },
        async {
            if with_metrics {
                text(upstream, &metrics_path, deadline).await
            } else {
                None
            }
        },
    );
    Answers {
        server_info,
        model_info,
        models,
        version,
        metrics,
    }
}

/// The first engine's server info that answers: each engine's routes in order, an older name
/// only when the newer answered something other than 2xx (missing there); a route that did not
/// answer in time is not followed by its older name (a later server serves both from one
/// handler).
async fn server_info(upstream: &Upstream, deadline: Duration) -> Option<(&'static str, Value)> {
    for routes in engine::server_info_routes() {
        for route in routes {
            match ask::get(upstream, route, deadline).await {
                Some((status, body)) if (200..300).contains(&status) => {
                    if let Some(info) = parse(&body) {
                        return Some((route, info));
                    }
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
    }
    None
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

/// How often an upstream is read when no `[fingerprint] interval` says otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// First wait after an upstream answered nothing; doubled up to the interval (at most 30 s).
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Reads `upstream` now (its metrics page too when `with_metrics`) and publishes the answers
/// (merged with the last read's, unless `afresh`); the answers, or `None` when nothing answered.
pub async fn read_now(
    proxy: &Proxy,
    upstream: &Upstream,
    afresh: bool,
    with_metrics: bool,
) -> Option<Arc<Answers>> {
    let answers = read(upstream, ask::DEADLINE, with_metrics).await;
    if !answers.any() {
        upstream.identity.note_answer(false);
        return None;
    }
    let answers = match upstream.description() {
        Some(last) if !afresh && !upstream.identity.is_down() => answers.or_from(&last),
        _ => answers,
    };
    upstream.identity.clear_down();
    let answers = Arc::new(answers);
    apply(proxy, upstream, &answers);
    upstream.publish_description(Arc::clone(&answers));
    Some(answers)
}

/// What the proxy takes from a read: every served model gets its own label, and the served
/// list is what requests are recorded under (`service::recorded_model`: the one model, or the
/// served id the client's name matches); and, for `sends_usage_unasked = "auto"`, whether the
/// engine says it sends the final usage chunk unasked.
fn apply(proxy: &Proxy, upstream: &Upstream, answers: &Answers) {
    let models = answers.model_ids();
    proxy.models.serve(models.iter().copied());
    if !models.is_empty() && upstream.set_served_models(&models) {
        tracing::info!(
            upstream = %upstream.name,
            models = %models.join(", "),
            "requests are recorded under the model the server serves (/v1/models), whatever name the client sends"
        );
    }
    if upstream.config.sends_usage_unasked == UsageUnasked::Auto {
        if let Some(flag) = super::usage_unasked::from_answers(answers) {
            upstream.set_usage_unasked(flag);
        }
    }
}

/// Whether `upstream` is read in the background: for its served models (what requests are
/// recorded under; not read when `default_model` is configured and nothing else asks), for its
/// fingerprint, for its usage flag (`"auto"`), or beside its `/metrics` scrape.
pub fn wanted(upstream: &Upstream, fingerprint_interval: Duration) -> bool {
    !fingerprint_interval.is_zero()
        || upstream.default_model.is_none()
        || upstream.config.sends_usage_unasked == UsageUnasked::Auto
        || !upstream.config.metrics_interval.is_zero()
}

/// Marks the configured names served, then starts one reader per upstream that is to be read
/// (`wanted`), every `fingerprint_interval` (zero: [`DEFAULT_INTERVAL`], without the metrics
/// page, which only the fingerprint needs). Each holds the proxy weakly, so it ends when the
/// proxy is dropped.
pub fn spawn(proxy: &Arc<Proxy>, fingerprint_interval: Duration) {
    let fingerprinting = !fingerprint_interval.is_zero();
    let interval = if fingerprinting {
        fingerprint_interval
    } else {
        DEFAULT_INTERVAL
    };
    for (index, upstream) in proxy.router.all().iter().enumerate() {
        proxy
            .models
            .serve(upstream.config.models.iter().map(String::as_str));
        if let Some(model) = &upstream.default_model {
            proxy.models.serve(std::iter::once(&**model));
        }
        if wanted(upstream, fingerprint_interval) {
            tokio::spawn(read_forever(
                Arc::downgrade(proxy),
                index,
                interval,
                fingerprinting,
            ));
        }
    }
}

async fn read_forever(proxy: Weak<Proxy>, index: usize, interval: Duration, with_metrics: bool) {
    let mut retry = RETRY_FIRST;
    // Woken because the upstream answered after failing: read everything afresh.
    let mut afresh = false;
    loop {
        let (wait, identity) = {
            let Some(proxy) = proxy.upgrade() else {
                return;
            };
            let Some(upstream) = proxy.router.all().get(index).cloned() else {
                return;
            };
            let identity = Arc::clone(&upstream.identity);
            match read_now(&proxy, &upstream, afresh, with_metrics).await {
                Some(_) => {
                    retry = RETRY_FIRST;
                    (interval, identity)
                }
                None => {
                    let wait = retry.min(interval);
                    retry = (retry * 2).min(RETRY_MAX);
                    (wait, identity)
                }
            }
        };
        afresh = tokio::select! {
            () = tokio::time::sleep(wait) => false,
            () = identity.back() => true,
        };
    }
}
