#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test fails loudly on what it asserts"
)]
//! The matrix document against the two published seed pages: exact import, round trips through
//! Markdown and JSON, diff, named errors for malformed input, the CLI and its exit codes, and the
//! HTML report and SVG charts rendered by headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;

use proptest::prelude::*;
use tokentap::matrix::diff::{diff, evaluate_gate, DiffColumn, Gate};
use tokentap::matrix::doc::{
    CellStatus, DecodeCell, Fact, MatrixDoc, Metadata, PrefillRow, Source,
};
use tokentap::matrix::{html, infer, markdown, parse_any, render_json, svg, ImportError};

const GLM: &str = "000_7bda87e292bd4f4e.txt";
const STEP: &str = "003_5c468af628b56f4a.txt";

fn seeds_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seeds");
    assert!(
        dir.is_dir(),
        "the seed pages are expected in {} (vendored copies of the published pages)",
        dir.display()
    );
    dir
}

fn seed_text(name: &str) -> String {
    std::fs::read_to_string(seeds_dir().join(name)).unwrap()
}

fn seed(name: &str) -> MatrixDoc {
    parse_any(&seed_text(name)).unwrap()
}

/// The whole error chain, as the CLI prints it.
fn chain(error: ImportError) -> String {
    format!("{:#}", anyhow::Error::new(error))
}

/// 1-based number of the first line of `text` that contains `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|line| line.contains(needle)).unwrap() + 1
}

#[allow(
    clippy::too_many_arguments,
    reason = "a test helper spelling out one matrix cell"
)]
fn assert_cell(
    doc: &MatrixDoc,
    context: u64,
    concurrency: u32,
    total: f64,
    per_request: f64,
    ttft: f64,
    tbt: f64,
    active: f64,
    completed: u64,
    output: u64,
) {
    let cell = doc.cell(context, concurrency).unwrap();
    assert_eq!(cell.status, CellStatus::Valid, "{context} × {concurrency}");
    assert_eq!(cell.total_tok_s, Some(total), "{context} × {concurrency}");
    assert_eq!(cell.per_request_tok_s, Some(per_request));
    assert_eq!(cell.ttft_ms, Some(ttft));
    assert_eq!(cell.tbt_ms, Some(tbt));
    assert_eq!(cell.average_active_requests, Some(active));
    assert_eq!(cell.completed_requests, Some(completed));
    assert_eq!(cell.output_tokens, Some(output));
    assert_eq!(cell.measured_for_s, Some(30.0));
}

fn assert_status_only(doc: &MatrixDoc, context: u64, concurrency: u32, status: CellStatus) {
    let cell = doc.cell(context, concurrency).unwrap();
    assert_eq!(cell, &DecodeCell::status_only(context, concurrency, status));
}

fn assert_prefill(doc: &MatrixDoc, context: u64, rate: f64, ttft: f64) {
    let row = doc.prefill_row(context).unwrap();
    assert_eq!(row.status, CellStatus::Valid);
    assert_eq!(row.requests_at_once, 1);
    assert_eq!(row.prompt_tok_s, Some(rate), "prefill {context}");
    assert_eq!(row.ttft_ms, Some(ttft));
    assert_eq!(row.completed_requests, Some(1));
}

const K: u64 = 1024;

#[test]
fn glm_seed_imports_every_value() {
    let doc = seed(GLM);
    let m = &doc.metadata;
    assert_eq!(m.model.display_name.as_deref(), Some("GLM-5.3-Flash-NVFP4"));
    assert_eq!(
        m.model.served_model.as_deref(),
        Some("nvidia/GLM-5.3-Flash-NVFP4")
    );
    assert_eq!(
        m.model.model_path.as_deref(),
        Some("nvidia/GLM-5.3-Flash-NVFP4")
    );
    assert_eq!(m.model.revision.as_deref(), Some("main"));
    assert_eq!(
        m.hardware.gpu.as_deref(),
        Some("RTX PRO 6000 Blackwell Server Edition")
    );
    assert_eq!(m.hardware.gpu_count, Some(4));
    assert_eq!(m.hardware.memory_per_gpu_gb, Some(96.0));
    assert_eq!(m.hardware.kind.as_deref(), Some("Discrete GPU"));
    assert_eq!(m.hardware.os.as_deref(), Some("linux"));
    assert_eq!(
        m.hardware.label, None,
        "the title's hardware part is derived"
    );
    assert_eq!(m.engine.name.as_deref(), Some("sglang"));
    assert_eq!(m.engine.version.as_deref(), Some("0.0.0.dev0"));
    assert_eq!(m.engine.quantization.as_deref(), Some("NVFP4"));
    assert_eq!(m.engine.backend.as_deref(), Some("cuda"));
    assert_eq!(
        m.engine.repository.as_deref(),
        Some("github.com/sgl-project/sglang")
    );
    assert_eq!(m.engine.build.as_deref(), Some("cuda-13.2"));
    assert_eq!(m.engine.commit.as_deref(), Some("4df49edcf00b"));
    assert_eq!(
        m.run.benchmark_tool.as_deref(),
        Some("llm-inference-bench v0.8.0")
    );
    assert_eq!(m.run.decode_test.as_deref(), Some("Fixed duration"));
    assert_eq!(
        m.run.prefill_mode.as_deref(),
        Some("Measured during decode warm-up")
    );
    assert_eq!(m.run.time_per_measurement_s, Some(30.0));
    assert_eq!(m.run.max_output_tokens, Some(4096));
    assert_eq!(m.run.source, Some(Source::Synthetic));
    let command = m.launch_command.as_deref().unwrap();
    assert!(command.starts_with(
        "\"$HOME/env_rtxpro6k-nvidia-glm53flash-dflash2-sglang-pr-38430/bin/sglang\" serve"
    ));
    assert!(command.contains("--api-key <redacted> --kv-cache-dtype fp8_e4m3"));
    assert!(command.ends_with("--quantization modelopt_fp4"));
    assert!(m.extra_facts.is_empty());

    assert_eq!(doc.prefill.len(), 9);
    assert_eq!(doc.decode.len(), 64);
    assert_eq!(
        doc.contexts(),
        vec![
            8 * K,
            16 * K,
            32 * K,
            64 * K,
            128 * K,
            256 * K,
            512 * K,
            1019 * K
        ]
    );
    assert_eq!(doc.concurrencies(), vec![1, 2, 4, 8, 16, 32, 64, 128]);
    assert_prefill(&doc, 8 * K, 11_400.0, 718.0);
    assert_prefill(&doc, 256 * K, 9_111.0, 28_276.0);
    assert_prefill(&doc, 1019 * K, 9_479.0, 108_126.0);
    assert_prefill(&doc, 1024 * K, 9_455.0, 108_938.0);
    assert_eq!(doc.prefill_row(1024 * K).unwrap().context_tokens, 1_048_576);
    assert_cell(&doc, 8 * K, 1, 170.4, 179.9, 34.0, 5.6, 1.0, 1, 5_110);
    assert_cell(&doc, 8 * K, 32, 1_335.0, 43.2, 446.0, 23.1, 32.0, 0, 40_028);
    assert_cell(&doc, 16 * K, 16, 935.2, 61.0, 216.0, 16.4, 16.0, 0, 28_041);
    assert_cell(&doc, 64 * K, 2, 262.4, 146.5, 107.0, 6.9, 1.9, 2, 7_869);
    assert_cell(&doc, 512 * K, 2, 262.3, 142.0, 74.0, 7.1, 2.0, 2, 7_870);
    assert_cell(&doc, 1019 * K, 1, 161.5, 166.1, 122.0, 6.0, 1.0, 1, 4_845);
    assert_eq!(doc.cell(1019 * K, 1).unwrap().context_tokens, 1_043_456);
    assert_status_only(&doc, 8 * K, 64, CellStatus::NotRun);
    assert_status_only(&doc, 16 * K, 64, CellStatus::NotRun);
    assert_status_only(&doc, 16 * K, 128, CellStatus::OverCapacity);
    assert_status_only(&doc, 128 * K, 64, CellStatus::OverCapacity);
    assert_status_only(&doc, 1019 * K, 2, CellStatus::OverCapacity);
    let valid = doc.decode.iter().filter(|c| c.status.is_valid()).count();
    let not_run = doc
        .decode
        .iter()
        .filter(|c| c.status == CellStatus::NotRun)
        .count();
    assert_eq!((valid, not_run), (33, 3));
}

#[test]
fn step_seed_imports_every_value() {
    let doc = seed(STEP);
    let m = &doc.metadata;
    assert_eq!(m.model.display_name.as_deref(), Some("Step-3.7-Flash-FP8"));
    assert_eq!(m.model.served_model.as_deref(), Some("step3p7"));
    assert_eq!(
        m.model.model_path.as_deref(),
        Some("stepfun-ai/Step-3.7-Flash-FP8")
    );
    assert_eq!(m.engine.version.as_deref(), Some("0.0.0.dev1+gf92199b56"));
    assert_eq!(m.engine.quantization.as_deref(), Some("FP8"));
    assert_eq!(m.engine.commit.as_deref(), Some("f92199b569d2"));
    assert_eq!(
        m.run.benchmark_tool.as_deref(),
        Some("llm-inference-bench v0.7.9")
    );
    assert_eq!(doc.prefill.len(), 7);
    assert_eq!(doc.decode.len(), 48);
    assert_eq!(doc.contexts().last(), Some(&(251 * K)));
    assert_prefill(&doc, 8 * K, 15_000.0, 547.0);
    assert_prefill(&doc, 128 * K, 12_700.0, 10_118.0);
    assert_prefill(&doc, 251 * K, 10_300.0, 24_375.0);
    assert_prefill(&doc, 256 * K, 10_100.0, 25_453.0);
    assert_cell(&doc, 8 * K, 1, 118.4, 118.5, 498.0, 8.4, 1.0, 0, 3_553);
    assert_cell(&doc, 8 * K, 32, 1_310.0, 41.5, 379.0, 24.1, 32.0, 0, 39_296);
    assert_cell(&doc, 32 * K, 16, 772.8, 48.6, 809.0, 20.6, 16.0, 0, 23_185);
    assert_cell(&doc, 128 * K, 1, 84.5, 84.5, 258.0, 11.8, 1.0, 0, 2_534);
    assert_cell(&doc, 128 * K, 4, 246.8, 62.1, 844.0, 16.1, 4.0, 0, 7_405);
    assert_cell(&doc, 251 * K, 2, 109.8, 55.2, 970.0, 18.1, 2.0, 0, 3_294);
    assert_status_only(&doc, 16 * K, 32, CellStatus::OverCapacity);
    assert_status_only(&doc, 8 * K, 64, CellStatus::OverCapacity);
    assert_status_only(&doc, 251 * K, 4, CellStatus::OverCapacity);
    assert_eq!(
        doc.decode
            .iter()
            .filter(|c| c.status == CellStatus::NotRun)
            .count(),
        0
    );
    assert_eq!(
        doc.decode.iter().filter(|c| c.status.is_valid()).count(),
        25
    );
}

#[test]
fn markdown_and_json_round_trips_are_exact() {
    for name in [GLM, STEP] {
        let doc = seed(name);
        let md = markdown::render_markdown(&doc);
        let from_md = parse_any(&md).unwrap();
        assert_eq!(from_md, doc, "{name}: seed → md → import");
        assert_eq!(
            markdown::render_markdown(&from_md),
            md,
            "{name}: md → import → md"
        );
        let json = render_json(&doc);
        assert_eq!(parse_any(&json).unwrap(), doc, "{name}: json → import");
        assert_eq!(render_json(&parse_any(&json).unwrap()), json);
        // Windows line endings and a byte-order mark do not matter.
        let crlf = format!("\u{feff}{}", md.replace('\n', "\r\n"));
        assert_eq!(parse_any(&crlf).unwrap(), doc);
    }
}

#[test]
fn markdown_looks_like_the_seed_page() {
    let md = markdown::render_markdown(&seed(GLM));
    for expected in [
        "# Speed test matrix\n\n**GLM-5.3-Flash-NVFP4 on RTX PRO 6000 Blackwell Server Edition 96GB ×4**\n",
        "sglang · 0.0.0.dev0 · NVFP4 · 8 contexts (8K–1019K) × 8 concurrency levels (1–128) · prefill at 8K, 16K, 32K, 64K, 128K, 256K, 512K, 1019K, 1024K\n",
        "- **VRAM:** 384 GB (4 × 96 GB)\n",
        "- **Max output:** 4,096 tokens\n",
        "| 256K | 9,111.0 | 28,276 ms |\n",
        "| 8K | 170.4<br>34 ms TTFT | 278.7<br>57 ms TTFT |",
        "| 1019K | 161.5<br>122 ms TTFT | Over capacity |",
        "| Sustained decode | 64K | 2 | Valid | 262.4 | 146.5 | 107 ms | 6.9 ms | 1.9 | 2 | 7,869 | 30.0 s |\n",
        "Over capacity: not run because this many requests at this context would exceed the server's KV cache. Not run: the benchmark skipped",
        "TTFT is measured after the benchmark warms the server's prompt cache, so it mostly excludes prefill.",
    ] {
        assert!(md.contains(expected), "missing {expected:?} in\n{md}");
    }
    // The seed's "All measurements" rows appear verbatim.
    let seed = seed_text(GLM);
    for line in seed
        .lines()
        .filter(|line| line.starts_with("| Sustained decode") || line.starts_with("| Prefill"))
    {
        assert!(
            md.contains(&format!("{line}\n")),
            "row {line:?} not reproduced"
        );
    }
}

#[test]
fn a_code_built_document_round_trips_through_markdown() {
    let mut metadata = Metadata::default();
    metadata.model.served_model = Some("sim/step".to_owned());
    metadata.run.source = Some(Source::Production);
    metadata.run.window_s = Some(3600.0);
    metadata.run.started_at = Some("2025-06-01T12:00:00Z".to_owned());
    metadata.run.ended_at = Some("2025-06-01T13:00:00.5+02:00".to_owned());
    metadata.run.sweep_id = Some("sw_01 | *x*".to_owned());
    metadata.notes = vec![
        "paused 40 s for production traffic at 16K × 8".to_owned(),
        "a|b <c> `d` _e_ #f".to_owned(),
    ];
    metadata.extra_facts.push(Fact {
        section: "Hardware".to_owned(),
        key: "CPU".to_owned(),
        value: "2 × Xeon [8480+]".to_owned(),
    });
    metadata.launch_command = Some(tokentap::matrix::redact_launch_command(
        "OPENAI_API_KEY=sk-1 vllm serve m --api-key sk-2 \\\n  --max-model-len 8192 # ```",
    ));
    let mut doc = MatrixDoc::new(metadata);
    doc.prefill.push(PrefillRow {
        context_tokens: 8192,
        requests_at_once: 1,
        status: CellStatus::Valid,
        prompt_tok_s: Some(12_345.678),
        ttft_ms: Some(663.51),
        completed_requests: Some(1),
        prompt_tokens: Some(8_190),
    });
    let mut cell = DecodeCell::status_only(8192, 4, CellStatus::Valid);
    cell.total_tok_s = Some(400.123);
    cell.per_request_tok_s = Some(100.04);
    cell.ttft_ms = Some(0.4);
    cell.tbt_ms = Some(9.96);
    cell.average_active_requests = Some(3.95);
    cell.completed_requests = Some(0);
    cell.output_tokens = Some(12_000);
    cell.measured_for_s = Some(30.02);
    cell.prompt_tokens = Some(8_192);
    cell.prefill_overlap_share = Some(0.1234);
    cell.overlapping_prefills = Some(1.5);
    cell.slo_attainment = Some(0.875);
    cell.goodput_tok_s = Some(350.1);
    doc.decode.push(cell);
    doc.decode.push(DecodeCell::status_only(
        8192,
        8,
        CellStatus::error("stream reset | after\n12 tokens <eof>"),
    ));
    doc.decode
        .push(DecodeCell::status_only(2000, 1, CellStatus::NotRun));
    doc.validate().unwrap();
    assert!(!doc
        .metadata
        .launch_command
        .as_deref()
        .unwrap()
        .contains("sk-"));

    let md = markdown::render_markdown(&doc);
    assert!(
        md.contains("| Prompt tokens | Prefill overlap | Overlapping prefills |"),
        "{md}"
    );
    assert!(
        md.contains("| Overlapping prefills | SLO attainment | Goodput tok/s |"),
        "{md}"
    );
    assert!(
        md.contains("| 8,192 | 12.3% | 1.50 | 87.5% | 350.1 |"),
        "{md}"
    );
    let imported = parse_any(&md).unwrap();
    assert_eq!(markdown::render_markdown(&imported), md);
    let cell = imported.cell(8192, 4).unwrap();
    assert!((cell.prefill_overlap_share.unwrap() - 0.123).abs() < 1e-12);
    assert_eq!(cell.overlapping_prefills, Some(1.5));
    assert_eq!(cell.slo_attainment, Some(0.875));
    assert_eq!(cell.goodput_tok_s, Some(350.1));
    let csv = tokentap::matrix::csv::render_csv(&doc);
    assert!(csv.contains(",0.875,350.1"), "{csv}");
    // A page written before the interference and SLO columns existed still imports, without
    // them.
    let mut older = doc.clone();
    for cell in &mut older.decode {
        cell.prefill_overlap_share = None;
        cell.overlapping_prefills = None;
        cell.slo_attainment = None;
        cell.goodput_tok_s = None;
    }
    let older_md = markdown::render_markdown(&older);
    assert!(!older_md.contains("Prefill overlap"), "{older_md}");
    assert!(!older_md.contains("SLO attainment"), "{older_md}");
    assert_eq!(
        markdown::render_markdown(&parse_any(&older_md).unwrap()),
        older_md
    );
    // Markdown keeps the page's precision; JSON keeps everything.
    assert_eq!(imported.cell(8192, 4).unwrap().total_tok_s, Some(400.1));
    assert_eq!(imported.metadata, doc.metadata);
    assert_eq!(imported.cell(8192, 8), doc.cell(8192, 8));
    assert_eq!(parse_any(&render_json(&doc)).unwrap(), doc);
}

#[test]
fn tails_evidence_statuses_and_production_in_flight_round_trip_through_every_format() {
    let mut doc = MatrixDoc::new(Metadata::default());
    doc.metadata.run.source = Some(Source::Synthetic);
    let mut cell = DecodeCell::status_only(8192, 1, CellStatus::OffTarget);
    cell.total_tok_s = Some(48.0);
    cell.ttft_ms = Some(210.0);
    cell.tbt_ms = Some(20.8);
    cell.average_active_requests = Some(5.0);
    cell.completed_requests = Some(0);
    cell.output_tokens = Some(1_440);
    cell.measured_for_s = Some(30.0);
    cell.production_in_flight = Some(4.0);
    cell.tails = tokentap::matrix::Tails::from_values([
        Some(412.0),
        Some(530.0),
        Some(21.4),
        Some(25.3),
        Some(22.0),
        None,
    ]);
    // The real-traffic groups: first answer and tool-call tokens, the prompt cache, the
    // tokens per decode step.
    cell.first_tokens = tokentap::matrix::FirstTokens::from_values([
        Some(900.0),
        Some(1200.0),
        None,
        Some(12.0),
        Some(1500.0),
        None,
        None,
        Some(3.0),
        Some(250.0),
        Some(3.0),
    ]);
    cell.prompt_cache = tokentap::matrix::PromptCache::from_values([
        Some(0.75),
        Some(120.0),
        Some(9.0),
        Some(800.0),
        Some(3.0),
    ]);
    cell.tokens_per_step = Some(2.75);
    let mut thin = DecodeCell::status_only(16384, 1, CellStatus::LowEvidence);
    thin.total_tok_s = Some(241.6);
    thin.completed_requests = Some(0);
    thin.output_tokens = Some(63);
    thin.measured_for_s = Some(0.3);
    doc.decode = vec![cell, thin];
    doc.validate().unwrap();
    let md = markdown::render_markdown(&doc);
    for needle in [
        "| TTFT p90 | TTFT p99 | TBT p90 | TBT p99 | ITL p90 | ITL p99 | Production in flight |",
        "| 412 ms | 530 ms | 21.4 ms | 25.3 ms | 22.0 ms | — | 4.0 |",
        "Off target<br>ran at 5.0",
        "Low evidence<br>n=0 · 63 tok · 0.3 s",
        "Low evidence: too few seconds or output tokens",
    ] {
        assert!(md.contains(needle), "{needle}\n{md}");
    }
    let imported = parse_any(&md).unwrap();
    assert_eq!(markdown::render_markdown(&imported), md);
    assert_eq!(imported.cell(8192, 1).unwrap().tails, doc.decode[0].tails);
    assert_eq!(imported.cell(8192, 1), doc.cell(8192, 1));
    for needle in [
        "Answer TTFT",
        "Tool-call TTFT p99",
        "Cached share",
        "Warm TTFT",
        "Tokens per step",
    ] {
        assert!(md.contains(needle), "{needle}\n{md}");
    }
    assert_eq!(
        imported.cell(16384, 1).unwrap().status,
        CellStatus::LowEvidence
    );
    let json = render_json(&doc);
    assert!(json.contains("\"status\": \"Off target\""), "{json}");
    assert!(
        !json.contains("itl_p99_ms"),
        "an absent tail is left out: {json}"
    );
    assert_eq!(parse_any(&json).unwrap(), doc);
    let csv = tokentap::matrix::csv::render_csv(&doc);
    // The tails and production in flight, then the (absent) first-token, prompt-cache and tokens-per-step columns.
    assert!(
        csv.contains(
            ",412,530,21.4,25.3,22,,4,900,1200,,12,1500,,,3,250,3,0.75,120,9,800,3,2.75\r\n"
        ),
        "{csv}"
    );
    // Neither enters a diff's ratios.
    let other = doc.clone();
    let compared = diff(&doc, &other);
    assert!(compared
        .decode
        .iter()
        .all(|c| c.ratios.total_tok_s.is_none()));
}

#[test]
fn the_diff_of_a_matrix_with_itself_is_one_everywhere() {
    for name in [GLM, STEP] {
        let doc = seed(name);
        let result = diff(&doc, &doc);
        assert_eq!(result.status_changes, 0);
        assert_eq!(result.decode.len(), doc.decode.len());
        for cell in &result.decode {
            assert!(!cell.status_changed);
            for column in DiffColumn::DECODE {
                let ratio = cell.ratios.get(column);
                if cell.status_a == Some(CellStatus::Valid) {
                    assert_eq!(
                        ratio,
                        Some(1.0),
                        "{name} {} × {} {column:?}",
                        cell.context_tokens,
                        cell.concurrency
                    );
                } else {
                    assert_eq!(ratio, None);
                }
            }
        }
        for row in &result.prefill {
            assert_eq!((row.prompt_tok_s, row.ttft_ms), (Some(1.0), Some(1.0)));
        }
        for summary in &result.summary {
            assert_eq!(
                summary.geometric_mean,
                Some(1.0),
                "{name} {:?}",
                summary.column
            );
            assert!(summary.cells > 0);
        }
        let gate = Gate {
            column: DiffColumn::TotalTokS,
            fail_below: Some(0.999),
            fail_above: Some(1.001),
            fail_on_status_change: true,
        };
        assert!(evaluate_gate(&result, &gate).is_empty());
    }
}

#[test]
fn diff_reports_ratios_status_changes_and_gates() {
    let a = seed(STEP);
    let mut b = a.clone();
    for cell in &mut b.decode {
        cell.total_tok_s = cell.total_tok_s.map(|v| v * 0.9);
        cell.ttft_ms = cell.ttft_ms.map(|v| v * 1.25);
    }
    let changed = b
        .decode
        .iter_mut()
        .find(|c| c.context_tokens == 8 * K && c.concurrency == 32)
        .unwrap();
    *changed = DecodeCell::status_only(8 * K, 32, CellStatus::error("stream reset"));
    let result = diff(&a, &b);
    let total = result.column_summary(DiffColumn::TotalTokS).unwrap();
    assert!((total.geometric_mean.unwrap() - 0.9).abs() < 1e-9);
    assert_eq!(total.cells, 24, "the changed cell is not Valid in both");
    let ttft = result.column_summary(DiffColumn::TtftMs).unwrap();
    assert!((ttft.geometric_mean.unwrap() - 1.25).abs() < 1e-9);
    assert_eq!(result.status_changes, 1);
    let cell = result.cell(8 * K, 32).unwrap();
    assert!(cell.status_changed);
    assert_eq!(
        cell.status_b,
        Some(CellStatus::Error("stream reset".to_owned()))
    );

    let mut gate = Gate {
        column: DiffColumn::TotalTokS,
        fail_below: Some(0.95),
        fail_above: None,
        fail_on_status_change: false,
    };
    let failures = evaluate_gate(&result, &gate);
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].contains("total_tok_s")
            && failures[0].contains("0.9000")
            && failures[0].contains("--fail-below 0.95"),
        "{failures:?}"
    );
    gate.fail_below = Some(0.85);
    assert!(evaluate_gate(&result, &gate).is_empty());
    gate.column = DiffColumn::TtftMs;
    gate.fail_below = None;
    gate.fail_above = Some(1.1);
    assert!(evaluate_gate(&result, &gate)[0].contains("above --fail-above 1.1"));
    gate.fail_above = None;
    gate.fail_on_status_change = true;
    assert!(evaluate_gate(&result, &gate)[0].contains("8K × 32: Valid → Error: stream reset"));

    let md = tokentap::matrix::diff::render_diff_markdown(&result);
    assert!(
        md.contains("| Total tok/s | 0.900 | 0.900 | 0.900 | 24 |"),
        "{md}"
    );
    assert!(md.contains("- **8K × 32:** Valid → Error: stream reset"));
    assert!(md.contains("| 8K | ×0.900 |"));
    let json: serde_json::Value =
        serde_json::from_str(&tokentap::matrix::diff::render_diff_json(&result)).unwrap();
    assert_eq!(json["schema"], "tokentap.matrix-diff/v1");
    assert_eq!(json["summary"][0]["column"], "total_tok_s");
}

#[test]
fn seeds_imply_their_kv_budget_and_context_length() {
    let step = seed(STEP);
    let budget = infer::kv_budget(&step).unwrap();
    // 32K × 16 ran: 16 × (32768 + 4096); 16K × 32 was over: 32 × (16384 + 4096).
    assert_eq!(
        (budget.at_least_tokens, budget.below_tokens),
        (589_824, Some(655_360))
    );
    assert_eq!(infer::context_length(&step), Some(262_144));
    let glm = seed(GLM);
    let budget = infer::kv_budget(&glm).unwrap();
    assert_eq!(
        (budget.at_least_tokens, budget.below_tokens),
        (1_179_648, Some(2_095_104))
    );
    assert!((1_179_648..2_095_104).contains(&budget.estimate_tokens()));
    assert_eq!(infer::context_length(&glm), Some(1_048_576));

    let mut broken = step.clone();
    broken
        .decode
        .iter_mut()
        .find(|c| c.context_tokens == 251 * K && c.concurrency == 4)
        .unwrap()
        .status = CellStatus::Error("x".to_owned());
    assert!(infer::kv_budget(&broken)
        .unwrap_err()
        .to_string()
        .contains("251K × 4"));
}

/// Replaces line `number` (1-based) of `text`.
fn with_line(text: &str, number: usize, replacement: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(index, line)| {
            if index + 1 == number {
                replacement
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn malformed_seed_text_gives_named_errors() {
    let text = seed_text(GLM);
    let row = line_of(&text, "| Sustained decode | 8K | 2 |");
    let original = text.lines().nth(row - 1).unwrap().to_owned();

    // Wrong column count.
    let broken = with_line(&text, row, &original.replace("| 57 ms ", ""));
    let error = chain(parse_any(&broken).unwrap_err());
    assert!(
        error.starts_with(&format!(
            "line {row}: All measurements row: expected 12 cells (Phase | Context"
        )),
        "{error}"
    );
    assert!(error.ends_with("found 11"), "{error}");

    // Unknown status.
    let broken = with_line(&text, row, &original.replace("Valid", "Fine"));
    let error = chain(parse_any(&broken).unwrap_err());
    assert_eq!(error, format!("line {row}: All measurements row: unknown status \"Fine\", expected Valid, Low evidence, Off target, Over capacity, Not run, Error: <reason> or Shed: <reason>"));

    // Bad number.
    let broken = with_line(&text, row, &original.replace("278.7", "27x.7"));
    let error = chain(parse_any(&broken).unwrap_err());
    assert_eq!(error, format!("line {row}: All measurements row: column \"Total tok/s\": expected a rate like 170.4, 9,111.0 or 11.4K, found \"27x.7\""));

    // A row cut off in the middle.
    let last = text.lines().count();
    let truncated: String = text
        .lines()
        .take(row - 1)
        .chain(["| Sustained decode | 8K | 2 | Valid | 278"])
        .collect::<Vec<_>>()
        .join("\n");
    let error = chain(parse_any(&truncated).unwrap_err());
    assert!(
        error.starts_with(&format!(
            "line {row}: expected a table row of 12 cells ending with `|`"
        )),
        "{error}"
    );
    assert!(row < last);

    // A table that stops after a complete row: the grid names the first cell without a row.
    let truncated: String = text.lines().take(row).collect::<Vec<_>>().join("\n");
    let error = chain(parse_any(&truncated).unwrap_err());
    let grid_row = line_of(&text, "| 8K | 170.434 ms TTFT");
    assert_eq!(error, format!("line {}: the grid column 4 has no row in the All measurements table (is the table truncated?)", grid_row - 2));
    // Truncated within the 16K rows: the grid names the first cell without a row.
    let row_16k = line_of(&text, "| Sustained decode | 16K | 4 |");
    let truncated: String = text.lines().take(row_16k).collect::<Vec<_>>().join("\n");
    let error = chain(parse_any(&truncated).unwrap_err());
    assert_eq!(error, format!("line {}: grid cell 8K × 4 has no row in the All measurements table (is the table truncated?)", grid_row + 1).replace("8K × 4", "16K × 8"));

    // A file that ends before the table.
    let truncated: String = text.lines().take(grid_row).collect::<Vec<_>>().join("\n");
    let error = chain(parse_any(&truncated).unwrap_err());
    assert_eq!(
        error,
        format!("line {grid_row}: the text ends here, expected the `All measurements` section")
    );

    // The grid disagrees with the table.
    let broken = with_line(
        &text,
        grid_row,
        &text
            .lines()
            .nth(grid_row - 1)
            .unwrap()
            .replace("170.434 ms TTFT", "170.435 ms TTFT"),
    );
    let error = chain(parse_any(&broken).unwrap_err());
    assert!(error.starts_with(&format!("line {grid_row}: grid cell 8K × 1 reads \"170.435 ms TTFT\", but the All measurements table (the source of truth) gives \"170.434 ms TTFT\"")), "{error}");

    // The prefill chart disagrees with the table.
    let prefill_line = line_of(&text, "256K context9,111");
    let broken = with_line(&text, prefill_line, "256K context9,11228,276 ms TTFT");
    let error = chain(parse_any(&broken).unwrap_err());
    assert!(
        error.starts_with(&format!(
            "line {prefill_line}: the prefill entry at 256K reads"
        )),
        "{error}"
    );

    // The summary line disagrees (a context missing from the table).
    let broken = with_line(
        &text,
        3,
        &text
            .lines()
            .nth(2)
            .unwrap()
            .replace("8 contexts", "9 contexts"),
    );
    assert!(chain(parse_any(&broken).unwrap_err()).starts_with("line 3: the summary line reads"));

    // A duplicated row.
    let broken = with_line(&text, row, &format!("{original}\n{original}"));
    assert_eq!(
        chain(parse_any(&broken).unwrap_err()),
        format!(
            "line {}: the decode cell 8K × 2 appears twice (first on line {row})",
            row + 1
        )
    );

    // A bad fact value.
    let max_output = line_of(&text, "- 4,096 tokens");
    let broken = with_line(&text, max_output, "- 4096 tokenz");
    assert_eq!(
        chain(parse_any(&broken).unwrap_err()),
        format!("line {max_output}: Run fact: Max output: expected a token count like 4,096 tokens, found \"4096 tokenz\"")
    );

    // Not a matrix at all.
    assert!(chain(parse_any("hello\n").unwrap_err()).starts_with("not a matrix document"));
}

#[test]
fn malformed_markdown_and_json_give_named_errors() {
    let md = markdown::render_markdown(&seed(STEP));
    let row = line_of(&md, "| Sustained decode | 16K | 4 |");
    let original = md.lines().nth(row - 1).unwrap().to_owned();
    let broken = with_line(&md, row, &original.replace("Valid", "Over capacity"));
    let error = chain(parse_any(&broken).unwrap_err());
    assert_eq!(error, format!("line {row}: All measurements row: decode cell 16384 × 4: a cell with status Over capacity carries measured figures; only Valid and Error cells may"), );

    let broken = with_line(&md, row, &original.replace("306.1", "400.0"));
    let grid_row = line_of(&md, "| 16K | 115.2<br>");
    let error = chain(parse_any(&broken).unwrap_err());
    assert!(
        error.starts_with(&format!(
            "line {grid_row}: this line differs from what the document implies"
        )),
        "{error}"
    );

    let json = render_json(&seed(STEP));
    let broken = json.replacen("\"Over capacity\"", "\"Overcapacity\"", 1);
    let error = chain(parse_any(&broken).unwrap_err());
    assert!(
        error.contains("at `decode[") && error.contains("unknown status \"Overcapacity\""),
        "{error}"
    );
    let broken = json.replacen("tokentap.matrix/v1", "tokentap.matrix/v9", 1);
    assert_eq!(
        chain(parse_any(&broken).unwrap_err()),
        "JSON schema is \"tokentap.matrix/v9\", this tokentap reads \"tokentap.matrix/v1\""
    );
    let broken = json.replacen("\"ttft_ms\": 498.0", "\"ttft_ms\": -498.0", 1);
    assert!(chain(parse_any(&broken).unwrap_err())
        .contains("ttft_ms must be a finite number ≥ 0, found -498"));
}

#[test]
fn a_leaked_secret_is_redacted_on_import() {
    let text = seed_text(STEP).replace(
        "--api-key <redacted>",
        "--api-key sk-live-123 --hf-token=hf_abc",
    );
    let doc = parse_any(&text).unwrap();
    let command = doc.metadata.launch_command.unwrap();
    assert!(
        command.contains("--api-key <redacted> --hf-token=<redacted>"),
        "{command}"
    );
    assert!(!command.contains("sk-live") && !command.contains("hf_abc"));
}

fn tokentap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tokentap"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tokentap-matrix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn cli_show_import_diff_and_exit_codes() {
    let dir = temp_dir("cli");
    let glm = seeds_dir().join(GLM);
    let step = seeds_dir().join(STEP);
    let md_path = dir.join("glm.md");
    let status = tokentap()
        .args(["matrix", "show"])
        .arg(&glm)
        .args(["--format", "md", "-o"])
        .arg(&md_path)
        .status()
        .unwrap();
    assert!(status.success());
    let json = tokentap()
        .args(["matrix", "import"])
        .arg(&md_path)
        .output()
        .unwrap();
    assert!(json.status.success());
    assert_eq!(
        parse_any(&String::from_utf8(json.stdout).unwrap()).unwrap(),
        seed(GLM)
    );
    for format in ["json", "csv", "html", "svg"] {
        let out = tokentap()
            .args(["matrix", "show"])
            .arg(&glm)
            .args(["--format", format])
            .output()
            .unwrap();
        assert!(out.status.success(), "{format}");
        assert!(!out.stdout.is_empty());
    }
    // llm-d benchmark reports: one per measured cell, as the library renders them (the
    // library's tests validate them against llm-d's schema).
    let llmd = tokentap()
        .args(["matrix", "show"])
        .arg(&glm)
        .args(["--format", "llmd"])
        .output()
        .unwrap();
    assert!(llmd.status.success());
    let reports: Vec<serde_json::Value> = serde_json::from_slice(&llmd.stdout).unwrap();
    assert_eq!(reports, tokentap::matrix::llmd::reports(&seed(GLM)));
    assert!(reports.len() > 20 && reports.iter().all(|r| r["version"] == "0.2.1"));

    let same = tokentap()
        .args(["matrix", "diff"])
        .arg(&glm)
        .arg(&md_path)
        .args([
            "--fail-below",
            "0.999",
            "--fail-above",
            "1.001",
            "--fail-on-status-change",
        ])
        .output()
        .unwrap();
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(String::from_utf8_lossy(&same.stdout)
        .contains("| Total tok/s | 1.000 | 1.000 | 1.000 | 33 |"));

    let worse = tokentap()
        .args(["matrix", "diff"])
        .arg(&glm)
        .arg(&step)
        .args(["--fail-below", "0.95", "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(worse.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&worse.stderr);
    assert!(
        stderr.contains("gate failed: geometric mean of total_tok_s ratios (B/A) over"),
        "{stderr}"
    );
    let diff_json: serde_json::Value = serde_json::from_slice(&worse.stdout).unwrap();
    assert!(diff_json["status_changes"].as_u64().unwrap() > 0);

    let bad = dir.join("bad.txt");
    let text = seed_text(STEP);
    let row = line_of(&text, "| Sustained decode | 8K | 4 |");
    std::fs::write(
        &bad,
        with_line(&text, row, "| Sustained decode | 8K | 4 | Valid |"),
    )
    .unwrap();
    let failed = tokentap()
        .args(["matrix", "show"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot import {}: line {row}: All measurements row: expected 12 cells",
            bad.display()
        )),
        "{stderr}"
    );

    let help = tokentap()
        .args(["matrix", "diff", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--fail-below",
        "--fail-above",
        "--column",
        "--fail-on-status-change",
        "--format",
        "--output",
    ] {
        assert!(help.contains(flag), "{flag} missing from\n{help}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs headless Chromium on `file` and returns the DOM it rendered.
fn chromium_dump_dom(file: &Path, profile: &Path) -> String {
    common::chromium::dump_dom(&format!("file://{}", file.display()), profile)
}

/// The text content (tags stripped, entities of our escaping decoded) of the first element whose
/// opening tag contains `marker`.
fn element_text(dom: &str, marker: &str, tag: &str) -> String {
    let start = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in the rendered DOM"));
    let open_end = start + dom[start..].find('>').unwrap() + 1;
    let close = open_end + dom[open_end..].find(&format!("</{tag}>")).unwrap();
    let mut text = String::new();
    let mut in_tag = false;
    for ch in dom[open_end..close].chars() {
        match ch {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

#[test]
fn html_report_and_svg_render_in_headless_chromium() {
    let _cores = common::cores::busy_blocking();
    let dir = temp_dir("chromium");
    let doc = seed(GLM);
    let report = html::render_html(&doc);
    assert!(!report.contains("<script"), "the report needs no script");
    assert!(
        !report.contains("src=") && !report.contains("href="),
        "the report loads nothing"
    );
    let html_path = dir.join("report.html");
    std::fs::write(&html_path, &report).unwrap();
    let dom = chromium_dump_dom(&html_path, &dir.join("profile-html"));

    let cell = |context: &str, concurrency: u32| {
        element_text(
            &dom,
            &format!("data-context=\"{context}\" data-concurrency=\"{concurrency}\""),
            "td",
        )
    };
    assert_eq!(cell("8K", 1), "170.4 34 ms TTFT");
    assert_eq!(cell("8K", 32), "1,335.0 446 ms TTFT");
    assert_eq!(cell("64K", 2), "262.4 107 ms TTFT");
    assert_eq!(cell("1019K", 1), "161.5 122 ms TTFT");
    assert_eq!(cell("8K", 64), "Not run");
    assert_eq!(cell("16K", 128), "Over capacity");
    assert_eq!(cell("1019K", 128), "Over capacity");
    assert!(dom.contains("data-status=\"over-capacity\""));
    assert_eq!(
        element_text(&dom, "class=\"title\"", "p"),
        "GLM-5.3-Flash-NVFP4 on RTX PRO 6000 Blackwell Server Edition 96GB ×4"
    );
    assert_eq!(
        element_text(&dom, "<tr data-context=\"1024K\"", "tr"),
        "1024K 9,455.0 108,938 ms"
    );
    let table = element_text(&dom, "class=\"measurements\"", "table");
    assert!(
        table.contains("Sustained decode 64K 2 Valid 262.4 146.5 107 ms 6.9 ms 1.9 2 7,869 30.0 s"),
        "{table}"
    );
    assert!(element_text(&dom, "class=\"launch\"", "pre").contains("--api-key <redacted>"));
    assert!(dom.contains("class=\"decode-chart\"") && dom.contains("class=\"prefill-chart\""));
    assert_eq!(
        dom.matches("<polyline").count(),
        8 + 1,
        "a line per context plus the prefill line"
    );

    // The SVG file is well-formed XML: Chromium's XML parser reports no error.
    let svg_path = dir.join("charts.svg");
    std::fs::write(&svg_path, svg::render_svg(&doc)).unwrap();
    let svg_dom = chromium_dump_dom(&svg_path, &dir.join("profile-svg"));
    assert!(
        !svg_dom.contains("parsererror") && !svg_dom.contains("error on line"),
        "{svg_dom}"
    );
    assert!(
        svg_dom.contains("1019K context") && svg_dom.contains("simultaneous requests (log2 scale)")
    );

    // The diff page's ratio grid.
    let mut b = doc.clone();
    b.decode
        .iter_mut()
        .for_each(|cell| cell.total_tok_s = cell.total_tok_s.map(|v| v * 1.1));
    if let Some(cell) = b
        .decode
        .iter_mut()
        .find(|c| c.context_tokens == 8192 && c.concurrency == 2)
    {
        *cell = DecodeCell::status_only(8192, 2, CellStatus::NotRun);
    }
    let diff_path = dir.join("diff.html");
    std::fs::write(&diff_path, html::render_diff_html(&diff(&doc, &b))).unwrap();
    let diff_dom = chromium_dump_dom(&diff_path, &dir.join("profile-diff"));
    assert_eq!(
        element_text(
            &diff_dom,
            "data-context=\"8K\" data-concurrency=\"1\"",
            "td"
        ),
        "×1.100"
    );
    assert_eq!(
        element_text(
            &diff_dom,
            "data-context=\"8K\" data-concurrency=\"64\"",
            "td"
        ),
        "Not run"
    );
    // A status change sits in no ratio cell: one word there, the change in the list below.
    assert_eq!(
        element_text(
            &diff_dom,
            "data-context=\"8K\" data-concurrency=\"2\"",
            "td"
        ),
        "status changed"
    );
    assert!(
        diff_dom.contains("<li>8K × 2: Valid → Not run</li>"),
        "{diff_dom}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Applies one mutation to `text`, never splitting a character.
fn mutate(text: &str, kind: u8, position: usize, payload: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let line = position % lines.len().max(1);
    match kind % 6 {
        0 => text
            .chars()
            .take(position % (text.chars().count() + 1))
            .collect(),
        1 => lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != line)
            .map(|(_, l)| *l)
            .collect::<Vec<_>>()
            .join("\n"),
        2 => lines
            .iter()
            .enumerate()
            .flat_map(|(i, l)| if i == line { vec![*l, *l] } else { vec![*l] })
            .collect::<Vec<_>>()
            .join("\n"),
        3 => {
            let mut chars: Vec<char> = text.chars().collect();
            if !chars.is_empty() {
                let at = position % chars.len();
                chars.splice(at..=at, payload.chars());
            }
            chars.into_iter().collect()
        }
        4 => {
            let mut chars: Vec<char> = text.chars().collect();
            let at = position % (chars.len() + 1);
            chars.splice(at..at, payload.chars());
            chars.into_iter().collect()
        }
        _ => {
            let mut owned: Vec<&str> = lines.clone();
            if owned.len() > 1 {
                let other = (line * 7 + 3) % owned.len();
                owned.swap(line, other);
            }
            owned.join("\n")
        }
    }
}

fn payloads() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("|".to_owned()),
        Just("—".to_owned()),
        Just("K".to_owned()),
        Just(",".to_owned()),
        Just(".".to_owned()),
        Just("\n".to_owned()),
        Just("×".to_owned()),
        Just("\\".to_owned()),
        Just("```".to_owned()),
        "[0-9|K,. —a-z]{0,6}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn import_never_panics_on_mutated_pages(seed_index in 0usize..2, markdown_form in any::<bool>(), steps in proptest::collection::vec((any::<u8>(), any::<usize>(), payloads()), 1..4)) {
        let mut text = seed_text([GLM, STEP][seed_index]);
        if markdown_form {
            text = markdown::render_markdown(&parse_any(&text).unwrap());
        }
        for (kind, position, payload) in &steps {
            text = mutate(&text, *kind, *position, payload);
        }
        // Either outcome is fine; a panic is not. What imports must validate and round-trip.
        if let Ok(doc) = parse_any(&text) {
            prop_assert!(doc.validate().is_ok());
            let md = markdown::render_markdown(&doc);
            prop_assert_eq!(markdown::render_markdown(&parse_any(&md).unwrap()), md);
        }
    }

    #[test]
    fn any_valid_document_round_trips(doc in documents()) {
        prop_assume!(doc.validate().is_ok());
        let md = markdown::render_markdown(&doc);
        let imported = parse_any(&md);
        prop_assert!(imported.is_ok(), "{:?}\n{}", imported.err().map(chain), md);
        let imported = imported.unwrap();
        prop_assert_eq!(markdown::render_markdown(&imported), md);
        prop_assert_eq!(parse_any(&render_json(&doc)).unwrap(), doc.clone());
        let _ = (html::render_html(&doc), svg::render_svg(&doc), tokentap::matrix::csv::render_csv(&doc));
    }
}

fn text_value() -> impl Strategy<Value = String> {
    "[A-Za-z0-9|<>*_`#\\[\\]\\\\:.×· -]{1,16}"
        .prop_map(|s| s.trim().to_owned())
        .prop_filter("non-empty", |s| !s.is_empty())
}

fn number() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        (0.0f64..2e6).prop_map(Some),
        (0.0f64..20.0).prop_map(Some),
        Just(Some(0.0))
    ]
}

fn status() -> impl Strategy<Value = CellStatus> {
    prop_oneof![
        Just(CellStatus::Valid),
        Just(CellStatus::OverCapacity),
        Just(CellStatus::NotRun),
        text_value().prop_map(|reason| CellStatus::error(&reason)),
    ]
}

fn documents() -> impl Strategy<Value = MatrixDoc> {
    let cells = proptest::collection::vec(
        (
            1u64..40,
            0u32..8,
            status(),
            number(),
            number(),
            number(),
            number(),
            proptest::option::of(0u64..100_000),
            any::<bool>(),
        ),
        0..12,
    );
    let prefill = proptest::collection::vec(
        (
            1u64..40,
            status(),
            number(),
            number(),
            proptest::option::of(0u64..5),
        ),
        0..5,
    );
    let texts = proptest::collection::vec(proptest::option::of(text_value()), 8);
    (
        cells,
        prefill,
        texts,
        proptest::option::of(1u32..9),
        proptest::option::of(1u64..100_000),
    )
        .prop_map(|(cells, prefill, texts, gpu_count, max_output)| {
            let mut metadata = Metadata::default();
            metadata.model.display_name = texts[0].clone();
            metadata.model.served_model = texts[1].clone();
            metadata.hardware.gpu = texts[2].clone();
            metadata.hardware.gpu_count = gpu_count;
            metadata.hardware.memory_per_gpu_gb = gpu_count.map(|n| f64::from(n) * 1.5);
            metadata.engine.name = texts[3].clone();
            metadata.engine.version = texts[4].clone();
            metadata.run.benchmark_tool = texts[5].clone();
            metadata.run.max_output_tokens = max_output;
            if let Some(note) = texts[6].clone() {
                metadata.notes.push(note);
            }
            metadata.launch_command = texts[7]
                .clone()
                .map(|c| tokentap::matrix::redact_launch_command(&format!("serve {c}\n  --tp 2")));
            let mut doc = MatrixDoc::new(metadata);
            for (context, status, rate, ttft, completed) in prefill {
                let figures = matches!(status, CellStatus::Valid | CellStatus::Error(_));
                doc.prefill.push(PrefillRow {
                    context_tokens: context * 1024,
                    requests_at_once: 1,
                    status,
                    prompt_tok_s: rate.filter(|_| figures),
                    ttft_ms: ttft.filter(|_| figures),
                    completed_requests: completed.filter(|_| figures),
                    prompt_tokens: None,
                });
            }
            for (context, power, status, total, per_request, ttft, tbt, output, odd_context) in
                cells
            {
                let context_tokens = if odd_context {
                    context * 1000 + 7
                } else {
                    context * 1024
                };
                let mut cell = DecodeCell::status_only(context_tokens, 1 << power, status.clone());
                if matches!(status, CellStatus::Valid | CellStatus::Error(_)) {
                    cell.total_tok_s = total;
                    cell.per_request_tok_s = per_request;
                    cell.ttft_ms = ttft;
                    cell.tbt_ms = tbt;
                    cell.average_active_requests = total.map(|t| t % 50.0);
                    cell.completed_requests = output.map(|o| o % 7);
                    cell.output_tokens = output;
                    cell.measured_for_s = ttft.map(|_| 30.0);
                    cell.prompt_tokens = output.filter(|o| o % 3 == 0);
                    // Prefill interference (optional columns), on some cells only.
                    cell.prefill_overlap_share = ttft
                        .filter(|_| output.is_some_and(|o| o % 2 == 0))
                        .map(|t| (t % 1000.0) / 1000.0);
                    cell.overlapping_prefills =
                        cell.prefill_overlap_share.and(total.map(|t| t % 9.0));
                    // SLO attainment and goodput (optional columns), on other cells.
                    cell.slo_attainment = tbt
                        .filter(|_| output.is_some_and(|o| o % 5 < 2))
                        .map(|t| (t % 100.0) / 100.0);
                    cell.goodput_tok_s = cell.slo_attainment.and(total.map(|t| t / 2.0));
                }
                doc.decode.push(cell);
            }
            doc.prefill.dedup_by_key(|row| row.context_tokens);
            doc.sort();
            doc.prefill.dedup_by_key(|row| row.context_tokens);
            doc.decode
                .dedup_by_key(|cell| (cell.context_tokens, cell.concurrency));
            doc
        })
}

#[test]
fn the_server_state_columns_round_trip_and_older_documents_still_read() {
    use tokentap::matrix::doc::ServerState;
    let mut doc = MatrixDoc::new(Metadata::default());
    let mut cell = DecodeCell::status_only(8192, 4, CellStatus::Valid);
    cell.total_tok_s = Some(300.0);
    cell.server_state = Some(ServerState {
        running_requests: Some(3.96),
        queued_requests: Some(0.0),
        kv_cache_usage: Some(0.053),
        prefix_cache_hit_rate: None,
    });
    doc.decode.push(cell);
    doc.decode
        .push(DecodeCell::status_only(8192, 8, CellStatus::NotRun));
    doc.validate().unwrap();

    let md = markdown::render_markdown(&doc);
    assert!(
        md.contains("| Server running | Server queued | KV cache usage | Prefix cache hits |"),
        "{md}"
    );
    assert!(md.contains("| 4.0 | 0.0 | 5.3% | — |"), "{md}");
    let imported = parse_any(&md).unwrap();
    assert_eq!(markdown::render_markdown(&imported), md);
    let state = imported.cell(8192, 4).unwrap().server_state.unwrap();
    assert_eq!(state.running_requests, Some(4.0));
    assert_eq!(state.prefix_cache_hit_rate, None);
    assert!(imported.cell(8192, 8).unwrap().server_state.is_none());
    // JSON keeps everything, and leaves out what is absent.
    let json = render_json(&doc);
    assert_eq!(parse_any(&json).unwrap(), doc);
    assert!(!json.contains("prefix_cache_hit_rate"), "{json}");
    assert_eq!(json.matches("\"server_state\"").count(), 1, "{json}");
    let html = html::render_html(&doc);
    assert!(html.contains("KV cache usage"), "{html}");
    let csv = tokentap::matrix::csv::render_csv(&doc);
    // The server state, then the (absent) tails, production-in-flight and first-token, prompt-cache and tokens-per-step columns.
    assert!(
        csv.contains(&format!(",3.96,0,0.053,{}\r\n", ",".repeat(23))),
        "{csv}"
    );
    // A document without the field (older, or unscraped) reads as before and renders without
    // the columns; a negative figure is refused.
    let mut older = doc.clone();
    older.decode[0].server_state = None;
    let older_json = render_json(&older);
    assert!(!older_json.contains("server_state"));
    assert_eq!(parse_any(&older_json).unwrap(), older);
    assert!(!markdown::render_markdown(&older).contains("Server running"));
    let mut bad = doc.clone();
    bad.decode[0].server_state = Some(ServerState {
        queued_requests: Some(-1.0),
        ..ServerState::default()
    });
    assert!(bad.validate().is_err());
}

/// `matrix capacity --advise` on a seed page: every figure of the advice is what the page's own
/// cells and prefill rows give by the arithmetic of docs/capacity.md ("Advice for the engine's
/// limits"), worked here by hand from the seed's figures.
#[test]
fn cli_advises_the_engines_limits_from_a_seed_pages_figures() {
    let (ttft_target, tbt_target) = (2000.0_f64, 30.0_f64);
    let out = tokentap()
        .args(["matrix", "capacity"])
        .arg(seeds_dir().join(GLM))
        .args(["--slo", "ttft=2s,tbt=30ms", "--advise", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let advice: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(advice["schema"], "tokentap.engine-advice/v1");
    let doc = seed(GLM);
    let mut running_slo_limited: Vec<(u64, u64)> = Vec::new();
    let mut running_any: Vec<(u64, u64)> = Vec::new();
    let mut queued_tokens: Vec<(u64, u64)> = Vec::new();
    let contexts = advice["contexts"].as_array().unwrap();
    assert_eq!(contexts.len(), doc.contexts().len());
    for context in doc.contexts() {
        // The capacity by hand: valid cells by concurrency, the last that meets both targets
        // before the first that misses one.
        let mut cells: Vec<_> = doc
            .decode
            .iter()
            .filter(|c| c.context_tokens == context && c.status == CellStatus::Valid)
            .collect();
        cells.sort_by_key(|c| c.concurrency);
        let mut capacity = None;
        let mut missed = false;
        for cell in &cells {
            let meets = cell.ttft_ms.unwrap() <= ttft_target && cell.tbt_ms.unwrap() <= tbt_target;
            if !meets {
                missed = true;
                capacity.get_or_insert(0);
                break;
            }
            capacity = Some(cell.concurrency);
        }
        let got = contexts
            .iter()
            .find(|c| c["context_tokens"] == context)
            .unwrap();
        assert_eq!(
            got["capacity"].as_u64(),
            capacity.map(u64::from),
            "{context}"
        );
        assert_eq!(got["limited_by_slo"], missed, "{context}");
        let Some(capacity) = capacity.filter(|c| *c > 0) else {
            assert!(got["max_running_requests"].is_null(), "{context}");
            continue;
        };
        assert_eq!(got["max_running_requests"], capacity, "{context}");
        running_any.push((u64::from(capacity), context));
        if missed {
            running_slo_limited.push((u64::from(capacity), context));
        }
        let prefill = doc
            .prefill
            .iter()
            .find(|row| row.context_tokens == context)
            .and_then(|row| row.prompt_tok_s)
            .unwrap();
        let ttft_at_capacity = cells
            .iter()
            .find(|c| c.concurrency == capacity)
            .and_then(|c| c.ttft_ms)
            .unwrap();
        let tokens = ((ttft_target - ttft_at_capacity).max(0.0) / 1000.0 * prefill).floor() as u64;
        assert_eq!(got["prefill_tok_s"].as_f64(), Some(prefill), "{context}");
        assert_eq!(
            got["ttft_at_capacity_ms"].as_f64(),
            Some(ttft_at_capacity),
            "{context}"
        );
        assert_eq!(got["max_num_queued_tokens"], tokens, "{context}");
        assert_eq!(got["max_queued_requests"], tokens / context, "{context}");
        queued_tokens.push((tokens, context));
    }
    // Engine-wide: the smallest SLO-limited capacity (else the largest), the smallest token
    // budget, and that budget in prompts of the shortest context.
    let running = running_slo_limited
        .iter()
        .min()
        .or_else(|| running_any.iter().max())
        .copied()
        .unwrap();
    assert_eq!(
        advice["overall"]["max_running_requests"],
        serde_json::json!([running.0, running.1])
    );
    let tokens = *queued_tokens.iter().min().unwrap();
    assert_eq!(
        advice["overall"]["max_num_queued_tokens"],
        serde_json::json!([tokens.0, tokens.1])
    );
    let shortest = doc.contexts().into_iter().min().unwrap();
    assert_eq!(
        advice["overall"]["max_queued_requests"],
        serde_json::json!([tokens.0 / shortest, shortest])
    );
    // The Markdown names each flag with its value.
    let md = tokentap()
        .args(["matrix", "capacity"])
        .arg(seeds_dir().join(GLM))
        .args(["--slo", "ttft=2s,tbt=30ms", "--advise"])
        .output()
        .unwrap();
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(
        md.contains(&format!("vLLM `--max-num-queued-tokens`: {}", tokens.0)),
        "{md}"
    );
}
