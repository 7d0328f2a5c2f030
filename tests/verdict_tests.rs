#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Issue 44: the verdict an operator acts on. The simulator behind the proxy, a sweep on warm
//! prompts that meets the SLO at every concurrency, and production traffic of cold prompts
//! that misses the TTFT target: headroom never contradicts production (`GET /capacity`, the
//! gauges, the page), and the one verdict (`GET /status`, `tokentap status`, the top of the
//! page) names the worst cell. Every wait is bounded.
use crate::common;

use std::time::Duration;

use serde_json::{json, Value};
use tokentap::sim::{Profile, SimOptions, SimServer};

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
const MODEL: &str = "step3p7";

async fn admin(
    server: &tokentap::app::serve::ProxyServer,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let response = common::send(
        http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", server.admin_addr))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap(),
    )
    .await;
    let value = serde_json::from_slice(&response.bytes()).unwrap_or(Value::Null);
    (response.status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_headroom_where_production_misses_the_slo_and_the_verdict_names_the_worst_cell() {
    let profile = Profile::builtin(STEP).unwrap();
    let model = tokentap::sim::model::PerformanceModel::new(&profile);
    // A TTFT target twice a cold prefill of the prompt: every swept cell (warm prompts) meets
    // it, while four cold prefills at once queue past it; a TBT target every swept concurrency
    // meets. The sweep alone says "≥ 8 streams".
    let warm = model.cached_ttft(8192, 8).as_secs_f64() * 1000.0;
    let cold = model.prefill_time(7000, 8192).as_secs_f64() * 1000.0;
    assert!(cold > 2.0 * warm, "warm {warm:.0} ms, cold {cold:.0} ms");
    let ttft = 2.0 * cold;
    let tbt = 2.5 * model.decode_step_time(8192.0, 8).as_secs_f64() * 1000.0;
    let sim = SimServer::start(
        profile,
        SimOptions {
            seed: 44,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let (server, records) = common::proxy(
        &sim.base_url(),
        &format!(
            "[slo]\nttft = \"{ttft:.0}ms\"\ntbt = \"{tbt:.1}ms\"\n[capacity]\nwindow = \"1m\"\n[evidence]\nmin_requests = 3\nmin_measured_for = \"1s\"\nmin_output_tokens = 50\n"
        ),
    )
    .await;

    // The sweep, on warm prompts.
    let request: tokentap::sweep::SweepRequest = serde_json::from_value(
        json!({"contexts": ["8K"], "concurrency": [1, 2, 4, 8], "cell_duration": "1s"}),
    )
    .unwrap();
    let done = common::run_sweep(&server, request, Duration::from_secs(120)).await;
    assert_eq!(
        done.state,
        tokentap::sweep::SweepState::Finished,
        "{done:?}"
    );

    // Production: four streams at once, each prompt cold (its first token differs), three
    // after another in each slot.
    let tokens = (1.0 * model.per_request_tok_s(8192.0, 4)) as u64;
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let slots: Vec<_> = (0..4u32)
        .map(|slot| {
            let url = url.clone();
            tokio::spawn(async move {
                for round in 0..3u32 {
                    let first = 100 + slot * 10 + round;
                    let ids: Vec<String> = std::iter::once(first.to_string())
                        .chain((0..6999u32).map(|i| (1000 + (i * 7 + first) % 5000).to_string()))
                        .collect();
                    let body = format!(
                        r#"{{"model":"{MODEL}","prompt":[{}],"max_tokens":{tokens},"ignore_eos":true,"stream":true}}"#,
                        ids.join(",")
                    );
                    assert_eq!(common::post(&url, &body).await.status, 200);
                }
            })
        })
        .collect();
    for slot in slots {
        slot.await.unwrap();
    }
    records.wait_for(12).await;

    // 1. No headroom where production misses, whatever the sweep says; the cell, the target
    //    and its attainment named.
    let (code, answer) = admin(&server, "GET", "/capacity", "").await;
    assert_eq!(code, 200, "{answer}");
    let figures = &answer["models"][0];
    assert_eq!(figures["model"], MODEL, "{answer:#}");
    assert!(
        figures["capacity_from"]
            .as_str()
            .unwrap()
            .starts_with("sweep"),
        "{answer:#}"
    );
    // The sweep alone: every measured concurrency meets (before issue 44 the page said "≥ …
    // headroom" here).
    assert_eq!(
        figures["capacity"]["contexts"][0]["capacity"], 8,
        "{answer:#}"
    );
    // The engine's limits the sweep supports, beside the answer (issue 44.5).
    let advice = &answer["engine_advice"][0];
    assert_eq!(advice["model"], MODEL, "{answer:#}");
    assert!(advice["why_none"].is_null(), "{answer:#}");
    let running_cap = advice["advice"]["overall"]["max_running_requests"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("a running cap: {answer:#}"));
    assert!((1..=8).contains(&running_cap), "{answer:#}");
    let headroom = figures["headroom"]["headroom"].as_f64().unwrap();
    assert!(
        headroom <= 0.0,
        "no headroom where production misses: {answer:#}"
    );
    let worst = figures["production"]["worst"].clone();
    assert_eq!(worst["meets"], false, "{answer:#}");
    let worst_text = worst["text"].as_str().unwrap().to_owned();
    assert!(
        worst_text.starts_with("8K×")
            && worst_text.contains("TTFT ≤")
            && worst_text.ends_with("of requests"),
        "{worst_text}"
    );
    assert_eq!(
        figures["headroom"]["capacity_is_lower_bound"], false,
        "{answer:#}"
    );
    assert_eq!(figures["rests_on"], "production_misses", "{answer:#}");
    assert!(
        figures["rests_on_text"]
            .as_str()
            .unwrap()
            .contains(&worst_text),
        "{answer:#}"
    );
    eprintln!(
        "headroom {headroom}; {worst_text}; sweep alone: {}",
        figures["headroom"]["capacity"]
    );

    // The gauges say the same.
    tokentap::app::drift::refresh_capacity(&server.admin, &server.metrics.capacity);
    let metrics = server.metrics.render();
    let labels = format!("upstream=\"default\",model=\"{MODEL}\"");
    assert!(
        metrics.contains(&format!(
            "tokentap_capacity_headroom_basis{{{labels},rests_on=\"production_misses\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("tokentap_capacity_production_attainment_ratio{{{labels},context_bucket=\"8K\",concurrency_bucket=\"{}\",target=\"{}\"}} {}", worst["concurrency"], worst["target_ids"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect::<Vec<_>>().join(","), worst["attainment"])),
        "{worst:#}\n{metrics}"
    );
    assert!(
        !metrics.contains(&format!(
            "tokentap_capacity_streams{{{labels},context_bucket=\"8K\""
        )),
        "the sweep's boundary is no capacity where production misses: {metrics}"
    );
    let headroom_line = metrics
        .lines()
        .find(|l| l.starts_with("tokentap_capacity_headroom_ratio{"))
        .expect("the headroom gauge");
    let value: f64 = headroom_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value <= 0.0, "{headroom_line}");

    // 3. The one verdict: /status names the worst cell.
    let (code, status) = admin(&server, "GET", "/status", "").await;
    assert_eq!(code, 200, "{status}");
    let model_status = &status["models"][0];
    assert_eq!(model_status["state"], "bad", "{status:#}");
    let clauses = model_status["clauses"].as_array().unwrap();
    let keys: Vec<&str> = clauses.iter().map(|c| c["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "availability",
            "slo",
            "sweep",
            "headroom",
            "drift",
            "configuration"
        ],
        "{status:#}"
    );
    // The upstream answers and every request succeeded: availability is ok, not the headline.
    assert_eq!(clauses[0]["state"], "ok", "{status:#}");
    assert!(status["headline"].is_null(), "{status:#}");
    let slo = &clauses[1];
    assert_eq!(slo["state"], "bad", "{status:#}");
    assert!(
        slo["text"].as_str().unwrap().contains(&worst_text),
        "{status:#}"
    );
    assert_eq!(clauses[3]["state"], "bad", "{status:#}");
    assert_eq!(clauses[3]["page"], "/#headroom");
    assert_eq!(clauses[3]["endpoint"], "/capacity");

    // `tokentap status` reads it: the worst cell, every line within 120 columns.
    let admin_url = format!("http://{}", server.admin_addr);
    let (succeeded, text, errors) = tokio::task::spawn_blocking(move || {
        use std::io::Read as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
            .args(["status", "--admin", &admin_url])
            .env_remove("TOKENTAP_ADMIN__TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let Some(exit) = common::wait::child_exit(&mut child, Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("tokentap status did not answer within 60 s");
        };
        let (mut out, mut err) = (String::new(), String::new());
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (exit.success(), out, err)
    })
    .await
    .unwrap();
    assert!(succeeded, "{text}\n{errors}");
    // The worst cell's text may be wrapped: compare without line breaks.
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(joined.contains(&worst_text), "{text}");
    for line in text.lines() {
        assert!(
            line.chars().count() <= 120,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    eprintln!("{text}");

    // The page: the verdict on top, no headroom figure where production misses.
    let dir = std::env::temp_dir().join(format!("tokentap-verdict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let target = format!("http://{}/", server.admin_addr);
    let profile_dir = dir.join("profile");
    let dom =
        tokio::task::spawn_blocking(move || common::chromium::dump_dom(&target, &profile_dir))
            .await
            .unwrap();
    let verdict_at = dom.find("id=\"verdict\"").expect("the verdict");
    for below in [
        "id=\"production\"",
        "id=\"headroom\"",
        "id=\"configuration\"",
    ] {
        assert!(
            verdict_at < dom.find(below).unwrap(),
            "the verdict heads the page ({below})"
        );
    }
    let verdict = &dom[verdict_at..dom[verdict_at..].find("</section>").unwrap() + verdict_at];
    assert!(verdict.contains(&worst_text), "{verdict}");
    assert!(verdict.contains("href=\"#headroom\""), "{verdict}");
    let headroom_at = dom.find("id=\"headroom\"").unwrap();
    let headroom_section =
        &dom[headroom_at..dom[headroom_at..].find("</section>").unwrap() + headroom_at];
    assert!(
        headroom_section.contains("No headroom"),
        "{headroom_section}"
    );
    assert!(
        headroom_section.contains("data-rests-on=\"production_misses\""),
        "{headroom_section}"
    );
    assert!(
        !headroom_section.contains("% headroom"),
        "{headroom_section}"
    );
    // The engine advice on the page, the same running cap as /capacity's.
    let advice_at = dom
        .find("id=\"engine-advice\"")
        .expect("the engine advice on the page");
    let advice_section = &dom[advice_at..dom[advice_at..].find("</section>").unwrap() + advice_at];
    assert!(
        advice_section.contains(&format!(
            "data-flag=\"max-running-requests\" data-value=\"{running_cap}\""
        )),
        "{advice_section}"
    );
    assert!(
        advice_section.contains("--max-num-seqs"),
        "{advice_section}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await;
}

/// Issue 45.4, nothing silently empty: a `serve` without `[slo]` (the README's own line)
/// answers `GET /capacity` with the reason and the keys to set, before and after traffic, and
/// the page, `GET /status` and `tokentap status` say the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_without_slo_targets_names_the_keys_to_set() {
    let sim = SimServer::start(
        Profile::builtin(STEP).unwrap(),
        SimOptions {
            seed: 45,
            ..SimOptions::default()
        },
    )
    .await
    .unwrap();
    let (server, records) = common::proxy(&sim.base_url(), "").await;
    let names_the_keys = |text: &str| {
        ["slo.ttft", "slo.tbt", "slo.e2e", "--set slo.ttft="]
            .iter()
            .all(|key| text.contains(key))
    };

    // No traffic yet: no model, and the reason is the missing targets, not the missing load.
    let (code, answer) = admin(&server, "GET", "/capacity", "").await;
    assert_eq!(code, 200, "{answer:#}");
    assert_eq!(answer["models"], json!([]), "{answer:#}");
    let explain = answer["explain"].as_str().unwrap_or_default();
    assert!(
        explain.contains("no [slo] targets") && names_the_keys(explain),
        "{answer:#}"
    );

    // One production request: the model is unanswered, and its reason names the keys too.
    let url = format!("http://{}/v1/completions", server.proxy_addr);
    let body = format!(
        r#"{{"model":"{MODEL}","prompt":"hello","max_tokens":8,"ignore_eos":true,"stream":true}}"#
    );
    assert_eq!(common::post(&url, &body).await.status, 200);
    records.wait_for(1).await;
    let (_, answer) = admin(&server, "GET", "/capacity", "").await;
    assert_eq!(answer["models"], json!([]), "{answer:#}");
    let reason = answer["unanswered"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(names_the_keys(reason), "{answer:#}");
    assert!(
        names_the_keys(answer["explain"].as_str().unwrap_or_default()),
        "{answer:#}"
    );

    // The page's headroom section says it.
    let page = common::get(&format!("http://{}/", server.admin_addr)).await;
    assert_eq!(page.status, 200);
    let html = page.text();
    let section = html
        .split("id=\"headroom\"")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_default();
    assert!(names_the_keys(section), "{section}");

    // `GET /status` and `tokentap status`: the SLO clause names the keys.
    let (_, status) = admin(&server, "GET", "/status", "").await;
    let slo = &status["models"][0]["clauses"][1];
    assert_eq!(slo["key"], "slo", "{status:#}");
    assert!(
        names_the_keys(slo["text"].as_str().unwrap_or_default()),
        "{status:#}"
    );
    let admin_url = format!("http://{}", server.admin_addr);
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args(["status", "--admin", &admin_url])
                .env_remove("TOKENTAP_ADMIN__TOKEN")
                .output()
                .unwrap()
        }),
    )
    .await
    .expect("tokentap status answers within 60 s")
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains("slo.ttft") && joined.contains("slo.tbt"),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
