#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The workload capture end to end: ordinary clients stream through the real proxy to the
//! simulator with `[workload] capture = true`; the admin listener's `/workload` and
//! `tokentap workload export --store` must give back each request's shape, the prefix sharing
//! between prompts, and no text. The trace readers take arbitrary bytes without panicking.

use crate::common;

use common::*;
use proptest::prelude::*;
use serde_json::json;
use tokentap::sim::{Profile, SimServer};
use tokentap::workload::Trace;

const STEP: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";
/// A word that must never appear in a trace.
const SECRET: &str = "zanzibar";

fn chat(system: &str, user: &str, max_tokens: u64) -> String {
    json!({
        "model": "step",
        "stream": true,
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
    })
    .to_string()
}

async fn send_three(proxy: std::net::SocketAddr) -> Vec<String> {
    // A and B share a long system prompt (several fingerprint blocks); C shares nothing.
    let shared = format!("{SECRET} ").repeat(1200);
    let other = "lorem ipsum ".repeat(900);
    let bodies = vec![
        chat(&shared, "first question", 8),
        chat(&shared, "second question", 12),
        chat(&other, "third question", 16),
    ];
    let url = format!("http://{proxy}/v1/chat/completions");
    for body in &bodies {
        let response = post(&url, body).await;
        assert_eq!(response.status, 200, "{}", response.text());
    }
    bodies
}

fn check_trace(trace: &Trace) {
    assert_eq!(trace.header.schema, "tokentap.workload/v2");
    assert_eq!(trace.header.origin, "capture");
    assert_eq!(trace.requests.len(), 3, "{trace:#?}");
    let [a, b, c] = [&trace.requests[0], &trace.requests[1], &trace.requests[2]];
    assert_eq!(
        [a.output_tokens, b.output_tokens, c.output_tokens],
        [8, 12, 16]
    );
    assert_eq!([a.max_tokens, c.max_tokens], [Some(8), Some(16)]);
    assert!(a.at_ms <= b.at_ms && b.at_ms <= c.at_ms);
    for request in &trace.requests {
        assert!(request.prompt_tokens > 1000, "{request:?}");
        assert_eq!(request.route.as_deref(), Some("chat_completions"));
        assert_eq!(request.outcome.as_deref(), Some("ok"));
        assert!(request.stream);
        assert!(!request.hash_ids.is_empty());
    }
    // The shared system prompt is several 2 KiB blocks: A and B share them, then part.
    assert!(
        a.hash_ids.len() >= 3 && b.hash_ids.len() >= 3,
        "{a:?} {b:?}"
    );
    assert_eq!(a.hash_ids[..2], b.hash_ids[..2]);
    assert_ne!(a.hash_ids.last(), b.hash_ids.last());
    assert!(c.hash_ids.iter().all(|id| !a.hash_ids.contains(id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_shapes_and_prefix_sharing_come_back_from_the_admin_listener() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), Default::default())
        .await
        .unwrap();
    let (server, records) = proxy(&sim.base_url(), "[workload]\ncapture = true\n").await;
    send_three(server.proxy_addr).await;
    records.wait_for(3).await;

    let admin = format!("http://{}", server.admin_addr);
    let response = get(&format!("{admin}/workload?window=1h")).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.text();
    assert!(
        !text.contains(SECRET) && !text.contains("question"),
        "{text}"
    );
    let trace = tokentap::workload::read_trace(&text).unwrap();
    check_trace(&trace);
    // Prompt tokens are the upstream's counts, as the records have them.
    let records = records.wait_for(3).await;
    let mut counted: Vec<u64> = records.iter().map(|r| r.tokens.prompt.unwrap()).collect();
    let mut traced: Vec<u64> = trace.requests.iter().map(|r| r.prompt_tokens).collect();
    counted.sort_unstable();
    traced.sort_unstable();
    assert_eq!(counted, traced);

    let mooncake = get(&format!("{admin}/workload?window=1h&format=mooncake")).await;
    let again = tokentap::workload::read_trace(&mooncake.text()).unwrap();
    assert_eq!(again.header.origin, "mooncake");
    assert_eq!(again.requests.len(), 3);
    assert_eq!(again.requests[1].hash_ids, trace.requests[1].hash_ids);

    assert_eq!(
        get(&format!("{admin}/workload?window=soon")).await.status,
        400
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_is_off_by_default_and_fingerprints_nothing() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), Default::default())
        .await
        .unwrap();
    let (server, records) = proxy(&sim.base_url(), "").await;
    send_three(server.proxy_addr).await;
    let records = records.wait_for(3).await;
    assert!(records.iter().all(|r| r.prefix_blocks.is_empty()));
    let response = get(&format!("http://{}/workload", server.admin_addr)).await;
    assert_eq!(response.status, 404);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_the_capture_for_the_export_command() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), Default::default())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("tokentap-workload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (server, records) = proxy_from_config(&format!(
        "[upstream]\nurl = \"{}\"\nsends_usage_unasked = \"no\"\n[store]\ndata_dir = \"{}\"\n\
         [workload]\ncapture = true\nmax_requests = 2\n",
        sim.base_url(),
        dir.display()
    ))
    .await;
    send_three(server.proxy_addr).await;
    records.wait_for(3).await;
    // Shutdown flushes the writer: everything captured is in the store when it returns.
    server.shutdown().await;

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(["workload", "export", "--window", "1h", "--store"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let trace = tokentap::workload::read_trace(&String::from_utf8(output.stdout).unwrap()).unwrap();
    // max_requests = 2: the oldest row was pruned.
    assert_eq!(trace.requests.len(), 2, "{trace:#?}");
    assert_eq!(trace.requests[1].output_tokens, 16);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_convert_command_reads_the_azure_csv_and_writes_mooncake() {
    let dir = std::env::temp_dir().join(format!("tokentap-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("azure.csv");
    std::fs::write(
        &csv,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.6805900,374,44\n\
         2023-11-16 18:15:50.9951690,396,109\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(["workload", "convert", "--format", "mooncake"])
        .arg(&csv)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        first,
        json!({"timestamp": 0.0, "input_length": 374, "output_length": 44, "hash_ids": []})
    );
    assert_eq!(
        tokentap::workload::read_trace(&text).unwrap().requests[1].at_ms,
        4315
    );
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn trace_readers_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = tokentap::workload::read_trace(&text);
        let _ = tokentap::workload::read_trace(&format!("TIMESTAMP,ContextTokens,GeneratedTokens\n{text}"));
        let _ = tokentap::workload::read_trace(&format!("{{\"schema\":\"tokentap.workload/v1\",\"block_tokens\":0,\"origin\":\"x\",\"requests\":1}}\n{text}"));
    }

    #[test]
    fn trace_readers_never_panic_on_near_valid_lines(
        timestamp in "[-0-9.e+]{0,12}|2023-11-16 18:15:46\\.[0-9]{0,9}[Z+-]?[0-9:]{0,6}",
        a in "[-0-9]{0,22}",
        b in "[-0-9a-z]{0,22}",
    ) {
        let _ = tokentap::workload::read_trace(&format!("{{\"timestamp\": {timestamp}, \"input_length\": {a}, \"output_length\": {b}, \"hash_ids\": [{a}]}}"));
        let _ = tokentap::workload::read_trace(&format!("TIMESTAMP,ContextTokens,GeneratedTokens\n{timestamp},{a},{b}\n"));
    }
}

/// `tokentap replay` end to end against its embedded simulator: a Mooncake trace whose last
/// request is due in ten minutes, bounded by `--max-duration`, diffed against a baseline.
#[test]
fn the_replay_command_is_bounded_and_writes_its_matrix_and_diff() {
    let dir = std::env::temp_dir().join(format!("tokentap-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 2000, \"output_length\": 40, \"hash_ids\": [0, 1, 2, 3]}\n\
         {\"timestamp\": 100, \"input_length\": 2000, \"output_length\": 40, \"hash_ids\": [0, 1, 5, 6]}\n\
         {\"timestamp\": 600000, \"input_length\": 2000, \"output_length\": 40, \"hash_ids\": [9]}\n",
    )
    .unwrap();
    let out = dir.join("out");
    let replay = |extra: &[&str]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
            .arg("replay")
            .arg(&trace)
            .args([
                "--simulate",
                STEP,
                "--quiet",
                "--max-duration",
                "8s",
                "--out",
            ])
            .arg(&out)
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Bounded: the last request is due in ten minutes; --max-duration must end it first.
        if let Some(status) =
            common::wait::child_exit(&mut child, std::time::Duration::from_secs(60))
        {
            let output = child.wait_with_output().unwrap();
            return (status, String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let _ = child.kill();
        panic!("tokentap replay did not stop within 60 s");
    };
    let (status, stdout) = replay(&[]);
    assert!(status.success(), "{status:?}\n{stdout}");
    let matrix = tokentap::matrix::load(&out.join("replay.json")).unwrap();
    let completed: u64 = matrix
        .prefill
        .iter()
        .filter_map(|row| row.completed_requests)
        .sum();
    assert_eq!(completed, 2, "{stdout}");

    // Against itself as the baseline: every common cell's ratio is written.
    let (status, stdout) = replay(&["--baseline", out.join("replay.json").to_str().unwrap()]);
    assert!(status.success(), "{status:?}\n{stdout}");
    assert!(stdout.contains("# Matrix diff"), "{stdout}");
    assert!(out.join("diff.json").is_file());

    // As aligned tables for a terminal: the matrix, then the diff, within 120 columns.
    let (status, stdout) = replay(&[
        "--baseline",
        out.join("replay.json").to_str().unwrap(),
        "--format",
        "list",
    ]);
    assert!(status.success(), "{status:?}\n{stdout}");
    assert!(
        stdout.contains("Prefill  At once") && stdout.contains("Each figure is B ÷ A"),
        "{stdout}"
    );
    assert!(!stdout.contains('|'), "{stdout}");
    assert!(stdout.lines().all(|l| l.chars().count() <= 120), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `tokentap ARGS…` to its end (bounded: at most `limit_s`), returning status, stdout
/// and stderr.
fn tokentap_bounded(
    args: &[&std::ffi::OsStr],
    limit_s: u64,
) -> (std::process::ExitStatus, String, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if common::wait::child_exit(&mut child, std::time::Duration::from_secs(limit_s)).is_some() {
        let output = child.wait_with_output().unwrap();
        return (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
    }
    let _ = child.kill();
    panic!("tokentap {args:?} did not stop within {limit_s} s");
}

/// `replay --find-speed`: sixteen cold 1,500-token prompts 250 ms apart. On the Step-3.7
/// simulator a prompt prefills in about 100 ms, so at 1× each TTFT is ~0.1 s and the TTFT ≤
/// 250 ms target holds; from about 2.5× (arrivals closer than a prefill) prompts queue and it
/// fails. The search must report a speed at which the SLO holds and the measured step above it,
/// within the resolution, at which it does not, with every replay it ran.
#[test]
fn replay_find_speed_reports_the_speed_up_at_which_the_slo_still_holds_and_the_step_above() {
    let dir = std::env::temp_dir().join(format!("tokentap-find-speed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    let lines: String = (0..16)
        .map(|i| {
            format!(
                "{{\"timestamp\": {}, \"input_length\": 1500, \"output_length\": 20, \"hash_ids\": [{}, {}, {}]}}\n",
                i * 250,
                3 * i,
                3 * i + 1,
                3 * i + 2
            )
        })
        .collect();
    std::fs::write(&trace, lines).unwrap();
    let out = dir.join("out");
    let (status, stdout, stderr) = tokentap_bounded(
        &[
            "replay".as_ref(),
            trace.as_os_str(),
            "--simulate".as_ref(),
            STEP.as_ref(),
            "--find-speed".as_ref(),
            "--slo".as_ref(),
            "ttft=250ms".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
            "--quiet".as_ref(),
            "--out".as_ref(),
            out.as_os_str(),
        ],
        300,
    );
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["schema"], "tokentap.find-speed/v1");
    let (holds, fails) = (&report["holds"], &report["fails"]);
    let speed = |t: &serde_json::Value| t["speed"].as_f64().unwrap();
    let attainment = |t: &serde_json::Value| t["attainment"].as_f64().unwrap();
    assert!(
        holds.is_object() && fails.is_object(),
        "{}",
        serde_json::to_string_pretty(&report).unwrap()
    );
    assert!(speed(holds) >= 1.0 && attainment(holds) >= 0.95, "{holds}");
    assert!(
        speed(fails) > speed(holds) && speed(fails) <= speed(holds) * 1.1 + 1e-9,
        "{report}"
    );
    assert!(attainment(fails) < 0.95, "{fails}");
    assert_eq!(report["limited_by"], "ttft");
    let replays = report["replays"].as_array().unwrap();
    assert!(replays.len() <= 10, "{replays:?}");
    assert_eq!(replays[0]["speed"], 1.0);
    for trial in replays {
        assert_eq!(trial["requests"], 16);
        assert_eq!(
            trial["held"],
            trial["speed"].as_f64() <= holds["speed"].as_f64()
        );
        assert!(trial["ttft_p95_ms"].as_f64().is_some(), "{trial}");
    }
    // The matrix written is the fastest passing replay's: all sixteen requests.
    let matrix = tokentap::matrix::load(&out.join("replay.json")).unwrap();
    let completed: u64 = matrix
        .prefill
        .iter()
        .filter_map(|row| row.completed_requests)
        .sum();
    assert_eq!(completed, 16);
    let summary = std::fs::read_to_string(out.join("find-speed.md")).unwrap();
    assert!(summary.contains("This traffic could grow"), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Mooncake trace names no model: `replay --target` asks the server's `/v1/models` and
/// replays with the model it serves; with no server there, the error names both fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mooncake_trace_without_a_model_replays_against_a_target_with_its_served_model() {
    let sim = SimServer::start(Profile::builtin(STEP).unwrap(), Default::default())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("tokentap-target-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 8, \"hash_ids\": [0, 1]}\n\
         {\"timestamp\": 50, \"input_length\": 1000, \"output_length\": 8, \"hash_ids\": [0, 2]}\n",
    )
    .unwrap();
    let out = dir.join("out");
    let run = |url: String| {
        let (trace, out) = (trace.clone(), out.clone());
        tokio::task::spawn_blocking(move || {
            tokentap_bounded(
                &[
                    "replay".as_ref(),
                    trace.as_os_str(),
                    "--target".as_ref(),
                    url.as_ref(),
                    "--quiet".as_ref(),
                    "--max-duration".as_ref(),
                    "30s".as_ref(),
                    "--out".as_ref(),
                    out.as_os_str(),
                ],
                60,
            )
        })
    };
    let (status, stdout, stderr) = run(sim.base_url()).await.unwrap();
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    let matrix = tokentap::matrix::load(&out.join("replay.json")).unwrap();
    let completed: u64 = matrix
        .prefill
        .iter()
        .filter_map(|row| row.completed_requests)
        .sum();
    assert_eq!(completed, 2, "{stdout}");
    assert_eq!(
        matrix.metadata.model.served_model.as_deref(),
        Some("step3p7"),
        "{stdout}"
    );
    sim.shutdown().await;

    // Something listens but lists no model: the trace names none either, so say how to give it.
    let silent = crate::common::ScriptedUpstream::start(|_| {
        crate::common::Script::json(404, r#"{"detail":"Not Found"}"#)
    })
    .await;
    let (status, _, stderr) = run(silent.url()).await.unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("the trace names no model")
            && stderr.contains("/v1/models")
            && stderr.contains("--model"),
        "{stderr}"
    );
    // Nothing listens there any more: said before anything is asked.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (status, _, stderr) = run(format!("http://{closed}")).await.unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("nothing is listening at http://{closed}")),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
