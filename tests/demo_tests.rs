//! `tokentap demo` shows what tokentap promises (issue 11, point 3): a small demo run end to end
//! (sweep, steady phase, mixed phase), then its written matrices are checked — the steady cells
//! agree with the sweep within 5 % on the columns that mean the same on both sides, and the
//! mixed cells carry their measured prefill interference, which predicts their mean speed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]

use std::process::ExitCode;

use crate::common;

use tokentap::app::demo::{run, steady_cells, DemoArgs, DEMO_PROFILE};
use tokentap::matrix::{load, DecodeCell, MatrixDoc};

fn within(got: Option<f64>, want: Option<f64>, tolerance: f64) -> bool {
    match (got, want) {
        (Some(got), Some(want)) if want > 0.0 => (got / want - 1.0).abs() <= tolerance,
        _ => false,
    }
}

fn cell(doc: &MatrixDoc, context: u64, concurrency: u32) -> &DecodeCell {
    doc.cell(context, concurrency)
        .unwrap_or_else(|| panic!("no cell {context} × {concurrency}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_demo_shows_steady_agreement_and_measured_interference() {
    let _cores = common::cores::for_timing().await;
    let out = std::env::temp_dir().join(format!("tokentap-demo-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = DemoArgs {
        profile: DEMO_PROFILE.to_owned(),
        contexts: vec!["8K".to_owned()],
        concurrency: vec![1, 4, 8],
        cell_duration: "2s".to_owned(),
        requests: 16,
        steady_duration: "3s".to_owned(),
        out: out.clone(),
        seed: 0,
        keep_running: false,
        format: tokentap::app::output::OutputFormat::Table,
        set: Vec::new(),
        sim_slowdown: 1.0,
    };
    let code = run(args).await.unwrap();
    assert_eq!(code, ExitCode::SUCCESS);
    let synthetic = load(&out.join("synthetic.json")).unwrap();
    let steady = load(&out.join("steady.json")).unwrap();
    let mixed = load(&out.join("mixed.json")).unwrap();
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("Steady traffic · the sweep"));
    // The report leads with production ÷ sweep on one grid, and draws production's heat maps
    // on the sweep's axes — unless this machine was too busy to keep the simulator's timing,
    // when the demo says so and withholds the comparison (tests below simulate that case).
    if report.contains("id=\"too-busy\"") {
        eprintln!("the machine was too busy for the simulator: the comparison is withheld");
        assert!(!report.contains("id=\"comparison\""));
    } else {
        let grid = report.find("id=\"comparison\"").expect("the shared grid");
        assert!(grid < report.find("<h2>Synthetic sweep</h2>").unwrap());
        assert!(report[grid..].contains("data-ratio=\""));
    }
    assert!(report.contains("id=\"production\"") && report.contains("id=\"mixed\""));
    for thin in mixed
        .decode
        .iter()
        .filter(|c| c.status == tokentap::matrix::CellStatus::LowEvidence)
    {
        let label = tokentap::matrix::units::context_label(thin.context_tokens);
        let needle = format!(
            "data-context=\"{label}\" data-concurrency=\"{}\" data-status=\"low-evidence\" title=",
            thin.concurrency
        );
        assert!(report.contains(&needle), "{needle} drawn grey, uncoloured");
    }
    // In headless Chromium no table overflows at 1400 or 800 px; screenshots for a person.
    let shots = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    for width in [1400, 800] {
        let (html, dir) = (report.clone(), out.clone());
        let (scroll, client, bad) =
            tokio::task::spawn_blocking(move || common::chromium::layout(&html, &dir, width))
                .await
                .unwrap();
        assert!(
            scroll <= client,
            "{width} px: the report scrolls sideways ({scroll} > {client})"
        );
        assert!(bad.is_empty(), "{width} px: tables overflow: {bad:?}");
        let (target, profile, png) = (
            format!("file://{}", out.join("report.html").display()),
            out.join(format!("shot-{width}")),
            shots.join(format!("demo-report-{width}.png")),
        );
        tokio::task::spawn_blocking(move || {
            common::chromium::screenshot(&target, &profile, width, &png)
        })
        .await
        .unwrap();
    }

    // The steady phase reproduced 8K × 1 and 8K × 4 (16K × 2 is not in this sweep).
    let cells = steady_cells(&synthetic);
    assert_eq!(cells, vec![(8192, 1), (8192, 4)]);
    for (context, concurrency) in cells {
        let (want, got) = (
            cell(&synthetic, context, concurrency),
            cell(&steady, context, concurrency),
        );
        assert!(
            got.status.is_valid(),
            "steady cells rest on enough evidence: {got:?}"
        );
        // TTFT is a cache hit of a few hundred ms, the median of a handful of requests, and an
        // ordinary client's TTFT also holds its body upload, which the sweep's in-process
        // requests skip: on a loaded 2-core machine it has moved by up to 14 % between runs
        // while the decode figures stayed within 1 %. It gets the wider tolerance.
        for (column, got, want, tolerance) in [
            (
                "per-request tok/s",
                got.per_request_tok_s,
                want.per_request_tok_s,
                0.05,
            ),
            ("TBT", got.tbt_ms, want.tbt_ms, 0.05),
            ("TTFT", got.ttft_ms, want.ttft_ms, 0.20),
            ("total tok/s", got.total_tok_s, want.total_tok_s, 0.05),
        ] {
            assert!(
                within(got, want, tolerance),
                "{context} × {concurrency} {column}: steady {got:?}, sweep {want:?}"
            );
        }
        // Nothing cold arrives in the steady phase.
        assert!(got.prefill_overlap_share.unwrap() < 0.05, "{got:?}");
    }

    // The mixed phase: every cell measured its interference; where cold prefills overlapped
    // decoding, the cell's mean speed is what the sweep's speed and the overlap predict.
    let mut interfered = 0;
    for production in &mixed.decode {
        let Some(share) = production.prefill_overlap_share else {
            continue;
        };
        let Some(sweep) = synthetic.cell(production.context_tokens, production.concurrency) else {
            continue;
        };
        if share < 0.1 {
            continue;
        }
        interfered += 1;
        let mean = production.total_tok_s.unwrap() / production.average_active_requests.unwrap();
        let predicted = sweep.per_request_tok_s.unwrap() * (1.0 - share);
        eprintln!(
            "mixed {} × {}: overlap {share:.3}, mean {mean:.1} tok/s, predicted {predicted:.1}",
            production.context_tokens, production.concurrency
        );
        assert!(
            within(Some(mean), Some(predicted), 0.15),
            "{production:?} against {sweep:?}"
        );
    }
    assert!(
        interfered > 0,
        "no mixed cell saw interference:\n{mixed:#?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// A machine too busy for the simulator's timing (simulated: every step 1.6 times slower than
/// the profile calibrated from the seed): the demo says so, by how much, and presents no
/// comparison as a finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_on_a_machine_that_misses_the_simulators_timing_says_so() {
    let out = std::env::temp_dir().join(format!("tokentap-demo-busy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = tokio::task::spawn_blocking({
        let out = out.clone();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tokentap"))
                .args([
                    "demo",
                    "--contexts",
                    "8K",
                    "--concurrency",
                    "1,2",
                    "--cell-duration",
                    "1s",
                    "--requests",
                    "4",
                    "--steady-duration",
                    "1s",
                    "--format",
                    "table",
                    "--sim-slowdown",
                    "1.6",
                    "--out",
                ])
                .arg(&out)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning: This machine was too busy for the simulator to keep its timing"),
        "{stderr}"
    );
    // By how much: 1 ÷ 1.6 is 37.5 % slower; the machine's own load adds to it.
    let off: f64 = stderr
        .replace('\n', " ")
        .split("per-request tok/s (1 ÷ TBT) ")
        .nth(1)
        .and_then(|rest| rest.split(" %").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure: {stderr}"));
    assert!((30.0..=80.0).contains(&off), "{off} % in {stderr}");
    assert!(
        stdout.contains("WARNING: This machine was too busy"),
        "{stdout}"
    );
    assert!(stdout.contains("Not judged"), "{stdout}");
    assert!(
        !stdout.contains(" ✓"),
        "no verdict on a busy machine: {stdout}"
    );
    assert!(stdout.lines().all(|l| l.chars().count() <= 120), "{stdout}");
    let report = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(report.contains("id=\"too-busy\""), "{report}");
    assert!(!report.contains("id=\"comparison\""), "{report}");
    let _ = std::fs::remove_dir_all(&out);
}
