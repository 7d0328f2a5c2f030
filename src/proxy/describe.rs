//! The one reader of an upstream's self-description: every engine's own routes as the engine
//! home declares them (`base::engine`: each engine's server info, with its older names asked
//! only when the newer is missing, its model info and its version), `/v1/models`, the routes it
//! publishes (`/openapi.json`, kept as its (method, path) list only) and the metrics page, asked
//! at once and direct (`ask`: each bounded by its deadline and size), so a question that never
//! answers costs its deadline and no more, and one that fails is only not known.
//!
//! One task per upstream reads it at start, every interval (`[fingerprint] interval`, else a
//! minute), and at once when the upstream answers again after failing; each read is
//! *published* on the upstream (`Upstream::description`): the latest answers and the engine they
//! name. Everything that wants to know what the server is reads that slot: the labels of served
//! models and the model of requests that name none, whether the server sends usage unasked,
//! the fingerprint (`upstream_identity`, which subscribes), and the sweep, which asks for a fresh
//! read at its start through its door (`synthetic::DataPath::describe`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::Value;

use super::answers::{model_ids, published_routes, Answers, RouteFacts};
use super::ask;
use super::service::Proxy;
use super::upstream::Upstream;
use crate::base::engine::{self, TableFit};
use crate::base::json::field_text;
use crate::config::UsageUnasked;

/// Asks `upstream` everything at once, each question within `deadline`; its metrics page only
/// when `with_metrics` (the fingerprint reads its `*_info` series, a sweep its gauges; the
/// scraper reads the page for the server's state on its own).
pub async fn read(upstream: &Upstream, deadline: Duration, with_metrics: bool) -> Answers {
    read_with(upstream, deadline, with_metrics, &|_: &[&str]| {}).await
}

/// [`read`], handing `served` the models the server serves as soon as its model list answers
/// (`/v1/models`, or the engine's model info naming its served model, whichever comes first
/// with a model; `/v1/models` when both do), without waiting for the slower questions.
async fn read_with(
    upstream: &Upstream,
    deadline: Duration,
    with_metrics: bool,
    served: &(dyn Fn(&[&str]) + Sync),
) -> Answers {
    let metrics_path = upstream.config.metrics_path.clone();
    let model_info_routes = engine::model_info_routes();
    let version_routes = engine::version_routes();
    // `/v1/models` answered with a model: the model info's name is not used then.
    let listed = AtomicBool::new(false);
    let (server_info, model_info, models, version, openapi, metrics) = tokio::join!(
        server_info(upstream, deadline),
        async {
            let info = first_json(upstream, &model_info_routes, deadline).await;
            let name = info.as_ref().and_then(|i| field_text(i, SERVED_MODEL_KEY));
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                if !listed.swap(true, Ordering::AcqRel) {
                    served(&[&name]);
                }
            }
            info
        },
        async {
            let models = json(upstream, "/v1/models", deadline).await;
            let ids = models.as_ref().map(model_ids).unwrap_or_default();
            if !ids.is_empty() {
                listed.store(true, Ordering::Release);
                served(&ids);
            }
            models
        },
        first_json(upstream, &version_routes, deadline),
        // FastAPI engines publish their routes here unless started without docs; a document
        // past `ask::MAX_BODY` is cut and not read, as any other answer would be.
        async {
            json(upstream, OPENAPI_ROUTE, deadline)
                .await
                .as_ref()
                .and_then(published_routes)
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
        published_routes: openapi,
    }
}

/// Where FastAPI servers (sglang's, vLLM's Python frontend) publish their routes.
const OPENAPI_ROUTE: &str = "/openapi.json";

/// The key of an engine's model info that names the model it serves (sglang's
/// `served_model_name`; its `model_path` is the weights, not what `/v1/models` lists).
const SERVED_MODEL_KEY: &str = "served_model_name";

/// Every engine's own route for one document (its model info, its version), asked at once:
/// the answer of the first route, in engine order, that gave 2xx JSON. Asked together, so the
/// routes of engines the server is not cost one deadline between them, not one each.
fn first_json<'a>(
    upstream: &'a Upstream,
    routes: &'a [&'static str],
    deadline: Duration,
) -> Pin<Box<dyn Future<Output = Option<Value>> + Send + 'a>> {
    Box::pin(async move {
        let (route, later) = routes.split_first()?;
        let (this, later) = tokio::join!(
            json(upstream, route, deadline),
            first_json(upstream, later, deadline)
        );
        this.or(later)
    })
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
    // The served models are published as soon as the model list answers: requests are
    // recorded under them from then on, and those that started before settle under them
    // when they end (`phase::start`), without waiting for the slower questions.
    let early = |models: &[&str]| serve_models(proxy, upstream, models);
    let answers = read_with(upstream, ask::DEADLINE, with_metrics, &early).await;
    if !answers.any() {
        upstream.identity.note_answer(false);
        upstream.first_read_over(false);
        return None;
    }
    let answers = match upstream.description() {
        Some(last) if !afresh && !upstream.identity.is_down() => answers.or_from(&last),
        _ => answers,
    };
    upstream.identity.clear_down();
    let answers = Arc::new(answers);
    apply(proxy, upstream, &answers);
    let routes_before = upstream.route_facts();
    upstream.publish_description(Arc::clone(&answers));
    let routes = upstream.route_facts();
    if routes != routes_before {
        say_routes(&upstream.name, &routes);
    }
    upstream.first_read_over(true);
    Some(answers)
}

/// What the proxy takes from a read: every served model gets its own label, and the served
/// list is what requests are recorded under (`service::recorded_model`: the one model, or the
/// served id the client's name matches); and, for `sends_usage_unasked = "auto"`, whether the
/// engine says it sends the final usage chunk unasked.
fn apply(proxy: &Proxy, upstream: &Upstream, answers: &Answers) {
    serve_models(proxy, upstream, &answers.model_ids());
    if upstream.config.sends_usage_unasked == UsageUnasked::Auto {
        if let Some(flag) = super::usage_unasked::from_answers(answers) {
            upstream.set_usage_unasked(flag);
        }
    }
}

/// How many of the routes no table classifies a log line names (the count says the rest).
pub const NAMED_IN_LOG: usize = 10;

/// Says, when a read finds it changed (the first read at start included), which route table
/// the upstream is held to — a warning when its version is outside every table's range — and
/// which routes it publishes that no table classifies (a warning naming the first
/// [`NAMED_IN_LOG`] and the count).
fn say_routes(upstream: &str, facts: &RouteFacts) {
    if let Some(served) = facts.served {
        let engine = served.engine.name();
        let version = facts.version.as_deref().unwrap_or("unknown");
        let table = served.table.version;
        let frontend = served.table.frontend.name;
        match served.fit {
            TableFit::Exact => tracing::info!(
                upstream,
                engine,
                version,
                table,
                frontend,
                "the upstream's routes are classified by its engine's route table for its version"
            ),
            TableFit::NewerThanNewest | TableFit::OlderThanOldest => {
                let why = if served.fit == TableFit::NewerThanNewest {
                    "newer than the newest route table tokentap has: its routes are classified by that table, and a route the newer release added is refused (403) unless proxy.routes opens it"
                } else {
                    "older than the oldest route table tokentap has: its routes are classified by that table"
                };
                tracing::warn!(
                    upstream,
                    engine,
                    version,
                    table,
                    frontend,
                    fit = served.fit.as_str(),
                    "the upstream's engine is {why}"
                );
            }
            TableFit::VersionUnknown => tracing::info!(
                upstream,
                engine,
                table,
                frontend,
                fit = served.fit.as_str(),
                "the upstream did not say its version: its routes are classified by its engine's newest route table"
            ),
        }
    }
    if let Some(unclassified) = facts.unclassified.as_ref().filter(|u| !u.is_empty()) {
        let mut routes: Vec<String> = unclassified
            .iter()
            .take(NAMED_IN_LOG)
            .map(ToString::to_string)
            .collect();
        let more = unclassified.len().saturating_sub(NAMED_IN_LOG);
        if more > 0 {
            routes.push(format!("and {more} more"));
        }
        tracing::warn!(
            upstream,
            count = unclassified.len(),
            routes = %routes.join(", "),
            "the upstream serves routes (its /openapi.json) that no route table of tokentap classifies: the data port refuses them (403) unless proxy.routes opens them (docs/operations.md, \"Routes\")"
        );
    }
}

/// Every served model gets its own label, and requests are recorded under them from now on.
fn serve_models(proxy: &Proxy, upstream: &Upstream, models: &[&str]) {
    proxy.models.serve(models.iter().copied());
    if !models.is_empty() && upstream.set_served_models(models) {
        tracing::info!(
            upstream = %upstream.name,
            models = %crate::base::escape::terminal_safe(&models.join(", "), false),
            "requests are recorded under the model the server serves (/v1/models), whatever name the client sends"
        );
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
            // The fingerprint follows each read when `[fingerprint] interval` is set
            // (`upstream_identity::spawn`, the same condition).
            upstream.await_first_read(fingerprinting);
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::base::engine::{
        register, Detection, Engine, EngineSpec, FingerprintKeys, Frontend, KvBudget, Metrics,
        RouteTable, SelfDescription, UsageReport,
    };
    use crate::config::ConfigLoader;
    use crate::net::faults::FaultCounters;

    /// An engine that describes itself on routes of its own and is otherwise invisible (no
    /// detection, metrics or routes), so registering it changes nothing else the tests of this
    /// binary see. Registered, it comes before the built-in engines.
    static SELF_DESCRIBING: EngineSpec = EngineSpec {
        name: "describe-test",
        detect: Detection {
            owned_by: &[],
            metric_prefix: None,
            by_self_description: false,
        },
        describe: SelfDescription {
            server_info: &[],
            model_info: Some("/describe-test/model"),
            version: Some("/describe-test/version"),
            version_key: None,
            model_path_key: None,
            models_root_is_path: false,
            context_length_key: None,
            max_input_key: None,
        },
        fingerprint: FingerprintKeys {
            names: &[],
            prefixes: &[],
        },
        metrics: Metrics {
            running: &[],
            queued: &[],
            kv_usage: &[],
            prefix_hit_rate: &[],
            prefix_hits: &[],
            prefix_queries: &[],
            cached_prompt_tokens: &[],
            prompt_tokens: &[],
            rank_label: None,
        },
        kv_budget: KvBudget::Unknown,
        usage: UsageReport {
            unasked_key: None,
            cache_report_flag: None,
        },
        abort: None,
        tokenize: &[],
        routes: &[RouteTable {
            version: "",
            frontend: Frontend::MAIN,
            parts: &[],
        }],
        code_fields: &[],
        priority: None,
        sessions: None,
    };

    /// A server that answers each `GET` by its path (`answer`: status and JSON body), one
    /// request per connection, and keeps the paths it was asked.
    async fn scripted(
        answer: fn(&str) -> (u16, &'static str),
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                    let (status, body) = answer(&path);
                    seen.lock().unwrap().push(path);
                    let response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        (url, asked)
    }

    fn upstream(url: &str) -> Upstream {
        let config = ConfigLoader::new()
            .text(
                &format!("[upstream]\nurl = \"{url}\"\nmax_connections = 8\n"),
                "test.toml",
            )
            .unwrap()
            .load()
            .unwrap();
        Upstream::new(
            config.upstreams[0].clone(),
            config.proxy.max_stream_buffer,
            Arc::new(FaultCounters::default()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn engines_after_the_first_are_described_through_their_own_routes() {
        register(&SELF_DESCRIBING);
        assert_eq!(
            Engine::all().first().map(|e| e.name()),
            Some("describe-test")
        );
        // Answers as sglang (model info) and vLLM (version) do; the registered engine's own
        // routes are missing here.
        let (url, asked) = scripted(|path| match path {
            "/model_info" => (200, r#"{"model_path":"/weights/m"}"#),
            "/version" => (200, r#"{"version":"0.11.0"}"#),
            _ => (404, r#"{"detail":"Not Found"}"#),
        })
        .await;
        let answers = read(&upstream(&url), Duration::from_secs(5), false).await;
        assert_eq!(
            answers.model_info,
            Some(json!({"model_path": "/weights/m"}))
        );
        assert_eq!(answers.version, Some(json!({"version": "0.11.0"})));
        let asked = asked.lock().unwrap().clone();
        for route in [
            "/describe-test/model",
            "/describe-test/version",
            "/model_info",
            "/version",
        ] {
            assert!(
                asked.iter().any(|p| p == route),
                "{route} not asked: {asked:?}"
            );
        }
    }

    #[tokio::test]
    async fn where_two_engines_answer_the_first_in_engine_order_is_kept() {
        register(&SELF_DESCRIBING);
        let (url, _) = scripted(|path| match path {
            "/describe-test/version" => (200, r#"{"version":"mine"}"#),
            "/version" => (200, r#"{"version":"0.11.0"}"#),
            "/describe-test/model" => (500, r#"{"detail":"broken"}"#),
            "/model_info" => (200, r#"{"model_path":"/weights/m"}"#),
            _ => (404, r#"{"detail":"Not Found"}"#),
        })
        .await;
        let answers = read(&upstream(&url), Duration::from_secs(5), false).await;
        assert_eq!(answers.version, Some(json!({"version": "mine"})));
        // An engine's route that fails leaves the next engine's answer.
        assert_eq!(
            answers.model_info,
            Some(json!({"model_path": "/weights/m"}))
        );
    }

    /// The engine a request asks of its upstream (the code-field guard, every POST) is the one
    /// the last published read names: worked out once per read, not per request, and a newer
    /// read replaces it.
    #[test]
    fn the_engine_follows_the_published_reads() {
        let upstream = upstream("http://127.0.0.1:9");
        assert!(upstream.engine().is_none(), "nothing read yet");
        let vllm = Answers {
            models: Some(json!({"data":[{"id":"m","owned_by":"me"}]})),
            metrics: Some("vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n".into()),
            ..Answers::default()
        };
        upstream.publish_description(Arc::new(vllm));
        assert_eq!(upstream.engine().map(|e| e.name()), Some("vllm"));
        let sglang = Answers {
            models: Some(json!({"data":[{"id":"m","owned_by":"sglang"}]})),
            ..Answers::default()
        };
        upstream.publish_description(Arc::new(sglang));
        assert_eq!(upstream.engine().map(|e| e.name()), Some("sglang"));
        upstream.publish_description(Arc::new(Answers::default()));
        assert!(upstream.engine().is_none(), "a read that names no engine");
    }

    /// Records held while the first read and its fingerprint are under way are published once
    /// both are over, in order; past the bound, or once settled, they are handed back.
    #[test]
    fn held_records_wait_for_the_first_read_and_its_fingerprint() {
        use crate::meter::labels::HeldRelease;
        use crate::proxy::upstream::MAX_HELD_RECORDS;
        use std::sync::Mutex;

        let upstream = upstream("http://127.0.0.1:9");
        let published = Arc::new(Mutex::new(Vec::new()));
        let release = |n: usize| {
            let published = Arc::clone(&published);
            HeldRelease::new(move || published.lock().unwrap().push(n))
        };
        // Settled from the start (nobody reads it): handed back to be published at once.
        assert!(upstream.hold_until_settled(release(0)).is_err());
        upstream.await_first_read(true);
        assert!(!upstream.labels_settled());
        for n in 1..=3 {
            assert!(upstream.hold_until_settled(release(n)).is_ok());
        }
        upstream.first_read_over(true);
        // The fingerprint has not followed yet.
        assert!(published.lock().unwrap().is_empty());
        upstream.identity_observed();
        assert_eq!(*published.lock().unwrap(), vec![1, 2, 3]);
        assert!(upstream.hold_until_settled(release(4)).is_err());

        // A first read nobody answers: no fingerprint will follow, what was held goes.
        published.lock().unwrap().clear();
        upstream.await_first_read(true);
        assert!(upstream.hold_until_settled(release(5)).is_ok());
        upstream.first_read_over(false);
        assert_eq!(*published.lock().unwrap(), vec![5]);

        // Bounded: past the bound a record is handed back; shutdown publishes the rest.
        published.lock().unwrap().clear();
        upstream.await_first_read(false);
        for n in 0..MAX_HELD_RECORDS {
            assert!(upstream.hold_until_settled(release(n)).is_ok());
        }
        assert!(upstream
            .hold_until_settled(release(MAX_HELD_RECORDS))
            .is_err());
        upstream.release_held_now();
        assert_eq!(published.lock().unwrap().len(), MAX_HELD_RECORDS);
    }
}
