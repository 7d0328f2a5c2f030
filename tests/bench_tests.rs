#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! `tokentap bench`, the overhead self-check, run as a user runs it: the built binary against
//! its embedded simulator and against a server given with `--target`. The figures are checked
//! for sanity (every stream accounted for, CPU and memory measured, one verdict), never for
//! speed: timing bars are the benchmark's business (docs/benchmarks.md).

use std::process::{Command, Output, Stdio};

use tokentap::sim::{Profile, SimOptions, SimServer};

use crate::common::cores;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .arg("bench")
        .args(args)
        .env_remove("TOKENTAP_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Against the embedded simulator every proxied stream is compared frame for frame with the
/// same stream sent direct; the JSON report accounts for all of them and measures the child
/// proxy's CPU and memory.
#[test]
fn the_self_check_reports_every_figure_against_the_embedded_simulator() {
    let _cores = cores::busy_blocking();
    let output = bench(&[
        "--streams",
        "12",
        "--tokens",
        "16",
        "--rounds",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&output.stdout)));
    let passed = report["passed"].as_bool().unwrap();
    assert_eq!(
        output.status.code(),
        Some(if passed { 0 } else { 3 }),
        "{report:#}\n{stderr}"
    );
    let frames = &report["frames"];
    assert_eq!(frames["streams"], 24, "{report:#}");
    assert_eq!(frames["intact"], 24, "{report:#}");
    assert_eq!(frames["altered"], 0);
    assert_eq!(frames["failed"], 0);
    assert_eq!(frames["compared_with_direct"], true);
    assert_eq!(report["direct_failed"], 0);
    assert!(report["upstream"]
        .as_str()
        .unwrap()
        .starts_with("embedded simulator"));
    // 12 streams × (role + at least one content event + usage + [DONE]) × 2 rounds at least.
    assert!(report["events"].as_u64().unwrap() >= 24 * 4, "{report:#}");
    for path in ["direct", "proxied"] {
        let figures = &report[path];
        for key in ["ttft_p50_ms", "ttft_p99_ms", "gap_p50_ms", "gap_p99_ms"] {
            let value = figures[key].as_f64().unwrap();
            assert!(value > 0.0 && value < 60_000.0, "{path}.{key} = {value}");
        }
        assert!(figures["ttft_p99_ms"].as_f64() >= figures["ttft_p50_ms"].as_f64());
    }
    if cfg!(target_os = "linux") {
        let cpu = report["cpu_us_per_event"].as_f64().unwrap();
        assert!((0.0..100_000.0).contains(&cpu), "{cpu}");
        let kib = report["kib_per_stream"].as_f64().unwrap();
        assert!((0.0..100_000.0).contains(&kib), "{kib}");
    }
    assert_eq!(
        report["direct_ttft_p50_ms_by_round"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("within the bars") || verdict.starts_with("OVER"),
        "{verdict}"
    );
    assert!(verdict.contains("24 of 24 streams intact"), "{verdict}");
}

/// With `--target` the same comparison runs against that server (here a simulator in this
/// process standing for a real engine): the table fits 120 columns and ends with the verdict.
/// A target that does not answer is named.
#[test]
fn the_self_check_measures_in_front_of_a_target_and_names_a_dead_one() {
    let _cores = cores::busy_blocking();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sim = runtime
        .block_on(SimServer::start(
            Profile::builtin(tokentap::sim::DEFAULT_PROFILE).unwrap(),
            SimOptions::default(),
        ))
        .unwrap();
    let target = sim.base_url();
    let output = bench(&[
        "--target",
        &target,
        "--streams",
        "6",
        "--tokens",
        "12",
        "--rounds",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains(&format!("upstream {target}")), "{stdout}");
    assert!(
        stdout.contains("6 intact, 0 altered, 0 failed of 6 through tokentap"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: "), "{stdout}");
    assert!(
        stdout.lines().all(|line| line.chars().count() <= 120),
        "{stdout}"
    );
    runtime.block_on(sim.shutdown());

    let dead = bench(&[
        "--target",
        "http://127.0.0.1:9",
        "--streams",
        "2",
        "--rounds",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&dead.stderr);
    assert_eq!(dead.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("http://127.0.0.1:9/v1/models did not answer"),
        "{stderr}"
    );
}
