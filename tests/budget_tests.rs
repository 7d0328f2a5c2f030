#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! Error budgets (docs/metrics.md, "Error budgets"): failed requests counted per model and per
//! cell, client aborts apart, and the burn-rate rules `tokentap rules` writes.
//!
//! * Through the real proxy, a scripted upstream on loopback fails some requests (a 500, a
//!   503, a stream broken off, no answer in time) and a client hangs up on another: `/metrics`
//!   counts each failure under its model and the cell its prompt put it in (the upstream
//!   counted no prompt for them: the cell comes from the prompt's size), client aborts under
//!   their own outcome, and availability = 1 − failed ÷ (all − client aborts) per model.
//! * `tokentap rules` for two models' `[slo]` writes rules `promtool check rules` accepts and
//!   unit tests `promtool test rules` passes: every alert fires in its firing case and stays
//!   quiet in its quiet ones.

use crate::common;
use crate::deploy_tests::yaml;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokentap::base::exposition;

/// Characters of a prompt the proxy estimates at about 15,000 tokens (bytes ÷ 4): the 16K
/// context bucket, whose cell is not the smallest one.
const BIG_PROMPT_CHARS: usize = 60_000;

fn chat(model: &str, marker: &str, prompt_chars: usize) -> String {
    let filler = "x".repeat(prompt_chars);
    format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"{marker} {filler}"}}]}}"#
    )
}

fn token(text: &str) -> Step {
    data(&format!(
        r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#
    ))
}

/// A complete stream: three tokens, the usage with the upstream's prompt count, `[DONE]`.
fn complete_stream(prompt_tokens: u64) -> Script {
    Script::sse(vec![
        token("a"),
        token("b"),
        token("c"),
        data(&format!(
            r#"{{"choices":[],"usage":{{"prompt_tokens":{prompt_tokens},"completion_tokens":3}}}}"#
        )),
        Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
    ])
}

/// What the scripted upstream does with each request, by the marker its prompt starts with.
fn script_for(received: &common::Received) -> Script {
    let body = String::from_utf8_lossy(&received.body);
    let has = |marker: &str| body.contains(&format!("\"{marker} "));
    if has("ok-big") {
        complete_stream(15_000)
    } else if has("ok-small") {
        complete_stream(100)
    } else if has("fail-500") {
        Script::json(
            500,
            r#"{"object":"error","message":"internal error","code":500}"#,
        )
    } else if has("fail-503") {
        Script::json(
            503,
            r#"{"object":"error","message":"overloaded","code":503}"#,
        )
    } else if has("broken") {
        // Two tokens, no usage, then the connection breaks: an upstream abort.
        let mut script = Script::sse(vec![token("a"), token("b")]);
        script.end = End::Reset;
        script
    } else if has("silent") {
        // No response head within upstream.response_timeout: a timeout.
        let mut script = complete_stream(15_000);
        script.head_delay = Duration::from_secs(3);
        script
    } else if has("hang") {
        let mut script = Script::sse(vec![token("a")]);
        script.end = End::Hang;
        script
    } else {
        Script::json(200, r#"{"object":"list","data":[]}"#)
    }
}

/// The value of `tokentap_requests_total` (or another counter) with exactly these labels among
/// its own, summed over the series that match.
fn counter(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition::samples(page)
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.label(k).as_deref() == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Failed requests: upstream errors, upstream aborts, upstream stalls, timeouts, shed.
const FAILURES: [&str; 5] = [
    "upstream_error",
    "upstream_aborted",
    "upstream_stalled",
    "timeout",
    "shed",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_in_their_models_cell_and_client_aborts_apart() {
    let upstream = ScriptedUpstream::start(script_for).await;
    // As `common::proxy`, with a head that has not come in 500 ms a timeout, and every
    // request judged (so failures show as missed in the SLO counters too).
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\nmetrics_interval = \"0\"\ndefault_model = \"default\"\nresponse_timeout = \"500ms\"\n[store]\ndata_dir = \"\"\n[fingerprint]\ninterval = \"0s\"\n[slo]\ne2e = \"1m\"\n",
        upstream.url()
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", server.proxy_addr);

    // model-a, prompts of about 15,000 tokens (16K): two complete streams, a 500, a stream
    // broken off, a timeout.
    for marker in ["ok-big", "ok-big", "fail-500", "broken", "silent"] {
        post(&url, &chat("model-a", marker, BIG_PROMPT_CHARS)).await;
    }
    // model-b, short prompts (8K): a complete stream, a 503, and a client that hangs up after
    // the first token.
    for marker in ["ok-small", "fail-503"] {
        post(&url, &chat("model-b", marker, 100)).await;
    }
    let request = Request::post(&url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat("model-b", "hang", 100))))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client().request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .unwrap();
    assert!(first.is_some(), "the first token");
    drop(body);

    let records = records.wait_for(8).await;
    let outcomes: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (&*r.labels.model, r.outcome.label()))
        .collect();
    for expected in [
        ("model-a", "upstream_error"),
        ("model-a", "upstream_aborted"),
        ("model-a", "timeout"),
        ("model-b", "shed"),
        ("model-b", "client_aborted"),
    ] {
        assert!(outcomes.contains(&expected), "{expected:?} in {outcomes:?}");
    }
    let page = get(&format!("http://{}/metrics", server.admin_addr))
        .await
        .text();
    let requests = |model: &str, context: &str, outcome: &str| {
        counter(
            &page,
            "tokentap_requests_total",
            &[
                ("model", model),
                ("source", "production"),
                ("context_bucket", context),
                ("concurrency_bucket", "1"),
                ("outcome", outcome),
            ],
        )
    };

    // Each failure in its model's own cell: the one its prompt's size put it in, although the
    // upstream counted no prompt for it (an error body, a stream without usage, no answer).
    assert_eq!(requests("model-a", "16K", "ok"), 2.0, "{page}");
    assert_eq!(requests("model-a", "16K", "upstream_error"), 1.0, "{page}");
    assert_eq!(
        requests("model-a", "16K", "upstream_aborted"),
        1.0,
        "{page}"
    );
    assert_eq!(requests("model-a", "16K", "timeout"), 1.0, "{page}");
    for outcome in FAILURES {
        assert_eq!(
            requests("model-a", "8K", outcome),
            0.0,
            "no model-a failure in a cell it was not in ({outcome}):\n{page}"
        );
    }
    assert_eq!(requests("model-b", "8K", "ok"), 1.0, "{page}");
    assert_eq!(requests("model-b", "8K", "shed"), 1.0, "{page}");
    // The client's hang-up is its own outcome, never a failure.
    assert_eq!(requests("model-b", "8K", "client_aborted"), 1.0, "{page}");
    for outcome in ["upstream_aborted", "upstream_stalled", "timeout"] {
        assert_eq!(
            requests("model-b", "8K", outcome),
            0.0,
            "{outcome}:\n{page}"
        );
    }

    // Availability per model, as the burn-rate rules compute it: 1 − failed ÷ (every request
    // but client aborts).
    let availability = |model: &str| {
        let all = counter(
            &page,
            "tokentap_requests_total",
            &[("model", model), ("source", "production")],
        );
        let aborted = counter(
            &page,
            "tokentap_requests_total",
            &[
                ("model", model),
                ("source", "production"),
                ("outcome", "client_aborted"),
            ],
        );
        let failed: f64 = FAILURES
            .iter()
            .map(|outcome| {
                counter(
                    &page,
                    "tokentap_requests_total",
                    &[
                        ("model", model),
                        ("source", "production"),
                        ("outcome", outcome),
                    ],
                )
            })
            .sum();
        1.0 - failed / (all - aborted)
    };
    assert!((availability("model-a") - 0.4).abs() < 1e-9, "{page}");
    assert!((availability("model-b") - 0.5).abs() < 1e-9, "{page}");

    // The SLO counters judge the failures missed, in the same cell.
    let slo = |model: &str, context: &str, verdict: &str| {
        counter(
            &page,
            "tokentap_slo_requests_total",
            &[
                ("model", model),
                ("source", "production"),
                ("context_bucket", context),
                ("slo", verdict),
            ],
        )
    };
    assert_eq!(slo("model-a", "16K", "met"), 2.0, "{page}");
    assert_eq!(slo("model-a", "16K", "missed"), 3.0, "{page}");
    assert_eq!(slo("model-a", "8K", "missed"), 0.0, "{page}");
    server.shutdown().await;
}

// ----------------------------------------------------------------------------- tokentap rules

fn tokentap(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(args)
        .env_remove("TOKENTAP_CONFIG")
        .env_remove("TOKENTAP_SLO__OBJECTIVE")
        .output()
        .unwrap()
}

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): it comes with Debian's `prometheus` package")
        });
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Every alert rule of a rules file: (alert name, its expression).
fn alerts(rules: &yaml::Yaml) -> Vec<(String, String)> {
    rules
        .at("groups")
        .unwrap()
        .seq()
        .iter()
        .flat_map(|group| group.at("rules").unwrap().seq().to_vec())
        .filter_map(|rule| {
            let name = rule.at("alert")?.as_str()?.to_string();
            Some((name, rule.str_at("expr").to_string()))
        })
        .collect()
}

#[test]
fn rules_for_two_models_pass_promtool_and_every_alert_fires_and_stays_quiet() {
    let _cores = common::cores::busy_blocking();
    let dir = TempDir::new("budget-rules");
    let config = dir.0.join("tokentap.toml");
    // Two models with their own targets (one with its own objective, its name full of regex
    // metacharacters), and default targets for every other model.
    std::fs::write(
        &config,
        "[slo]\nttft = \"2s\"\nobjective = 0.99\n\
         [slo.models.\"acme/fast-1.5+b\"]\nttft = \"500ms\"\nobjective = 0.999\n\
         [slo.models.\"acme/big\"]\ntbt = \"50ms\"\n",
    )
    .unwrap();
    // Into a folder that does not exist yet: the command makes it.
    let folder = dir.0.join("rules");
    let rules = folder.join("slo.rules.yml");
    let tests = folder.join("slo.rules.test.yml");
    let output = tokentap(&[
        "rules",
        "--config",
        config.to_str().unwrap(),
        "--output",
        rules.to_str().unwrap(),
        "--tests",
        tests.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");

    // Deterministic: the same configuration gives the same bytes, on stdout too.
    let stdout = tokentap(&["rules", "--config", config.to_str().unwrap()]);
    assert!(stdout.status.success(), "{stdout:?}");
    let text = std::fs::read_to_string(&rules).unwrap();
    assert_eq!(String::from_utf8(stdout.stdout).unwrap(), text);

    let (ok, said) = promtool(&["check", "rules", "slo.rules.yml"], &folder);
    assert!(ok, "promtool check rules:\n{said}\n{text}");
    let (ok, said) = promtool(&["test", "rules", "slo.rules.test.yml"], &folder);
    assert!(
        ok,
        "promtool test rules:\n{said}\n{}",
        std::fs::read_to_string(&tests).unwrap()
    );
    assert!(said.contains("SUCCESS"), "{said}");

    // Three scopes (each model, every other model) × two SLIs × fast and slow.
    let parsed = yaml::parse(&text, "slo.rules.yml").unwrap();
    let alerts = alerts(&parsed);
    let mut per_name: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, _) in &alerts {
        *per_name.entry(name.as_str()).or_default() += 1;
    }
    assert_eq!(
        per_name,
        BTreeMap::from([
            ("TokentapAvailabilityFastBurn", 3),
            ("TokentapAvailabilitySlowBurn", 3),
            ("TokentapSloAttainmentFastBurn", 3),
            ("TokentapSloAttainmentSlowBurn", 3),
        ]),
        "{text}"
    );
    // The workbook's pairs: 14.4x over 1h and 5m, 6x over 6h and 30m.
    for (name, expr) in &alerts {
        let (long, short, factor) = if name.contains("Fast") {
            ("ratio_rate1h", "ratio_rate5m", "14.4")
        } else {
            ("ratio_rate6h", "ratio_rate30m", "6")
        };
        assert!(
            expr.contains(long) && expr.contains(short) && expr.contains(&format!("> {factor}")),
            "{name}: {expr}"
        );
    }
    // Every other model: the two named ones left out, their names escaped as a regex.
    assert!(
        text.contains(r#"model!~"acme/big|acme/fast-1\\.5\\+b""#),
        "{text}"
    );

    // Every alert rule has a case where it fires and one where it does not.
    let test_text = std::fs::read_to_string(&tests).unwrap();
    let test_file = yaml::parse(&test_text, "slo.rules.test.yml").unwrap();
    let mut firing: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut quiet: BTreeMap<String, usize> = BTreeMap::new();
    for case in test_file.at("tests").unwrap().seq() {
        for check in case.at("alert_rule_test").unwrap().seq() {
            let name = check.str_at("alertname").to_string();
            let expected = check.at("exp_alerts").unwrap().seq();
            if expected.is_empty() {
                *quiet.entry(name.clone()).or_default() += 1;
            }
            for alert in expected {
                let model = alert.str_at("exp_labels.model").to_string();
                *firing.entry((name.clone(), model)).or_default() += 1;
            }
        }
    }
    for name in per_name.keys() {
        for model in ["acme/fast-1.5+b", "acme/big"] {
            assert_eq!(
                firing.get(&(name.to_string(), model.to_string())),
                Some(&1),
                "{name} for {model} fires in one case"
            );
        }
        assert_eq!(
            firing
                .keys()
                .filter(|(n, m)| n == name && !m.starts_with("acme/"))
                .count(),
            1,
            "{name} for every other model fires in one case"
        );
        assert!(
            quiet.get(*name).copied().unwrap_or(0) >= 3,
            "{name} stays quiet in a case for each scope"
        );
    }
}

#[test]
fn rules_refuse_an_objective_whose_fast_burn_could_never_fire() {
    let output = tokentap(&["rules", "--set", "slo.objective=0.9"]);
    assert!(!output.status.success(), "{output:?}");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("slo.objective"), "{said}");
    let without_targets = tokentap(&["rules"]);
    assert!(without_targets.status.success(), "{without_targets:?}");
    let text = String::from_utf8(without_targets.stdout).unwrap();
    // No latency targets: availability alone, for every model.
    assert!(text.contains("TokentapAvailabilityFastBurn"), "{text}");
    assert!(!text.contains("TokentapSloAttainmentFastBurn"), "{text}");
}
