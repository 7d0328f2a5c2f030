//! `tokentap demo`: the first command of the README. With no arguments it starts the simulator
//! (a seed profile) and the proxy in-process on loopback ephemeral ports, runs a short sweep
//! through the proxy's admin-side manager, then sends ordinary client traffic through the proxy's
//! data listener in two phases, each measured by its own production aggregator:
//!
//! * **steady**: a few sweep cells reproduced by plain clients (same prompt length, same number
//!   of streams, warm prompt); the report marks where they agree with the sweep within 5 %;
//! * **mixed**: a burst of cold prompts of many lengths at changing concurrency; the report puts
//!   each cell's measured prefill interference beside its gap to the sweep.
//!
//! Comparisons are made only between columns that mean the same on both sides, with their
//! definitions beside the tables. It writes an HTML report and says what to open and try next.
//!
//! Everything it starts is stopped before it returns (unless `--keep-running`, until Ctrl-C).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::output::OutputFormat;
use super::serve::ProxyServer;
use super::sweep::{follow_local, write_matrix};
use crate::aggregate::{ProductionMatrix, Window};
use crate::base::engine_metrics::LOAD_GAUGES;
use crate::base::escape::xml_escape;
use crate::base::exposition::sum_of;
use crate::base::Source;
use crate::config::ConfigLoader;
use crate::matrix::html::{
    facts_fragment, grid_fragment_on, heat_scale_max, measurements_fragment, page, prefill_fragment,
};
use crate::matrix::markdown::escape as md_escape;
use crate::matrix::side_by_side::{comparison_fragment, Axes};
use crate::matrix::table::{render_table, MAX_WIDTH};
use crate::matrix::units::{context_label, format_percent, MISSING};
use crate::matrix::{render_markdown, DecodeCell, MatrixDoc};
use crate::meter::Meter;
use crate::sim::{Profile, SimOptions, SimServer};
use crate::sweep::plan::{DurationValue, SweepRequest, TokensValue};
use crate::sweep::progress::ProgressLine;
use crate::sweep::status::SweepState;
use crate::synthetic::prompt::{filler_text, mix};
use crate::synthetic::{DataPath, ProxyPath, SinkScope};

/// The profile the demo simulates unless told otherwise (the seed page 003).
pub const DEMO_PROFILE: &str = "step-3.7-flash-fp8-4x-rtx-pro-6000";

/// Arguments of `tokentap demo` (the command's help text is on its `Command` variant).
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Simulator profile: a built-in name (`tokentap simulate --list-profiles`) or a profile
    /// TOML file. Default: the Step-3.7 profile calibrated from seed page 003.
    #[arg(long, value_name = "NAME|FILE", default_value = DEMO_PROFILE)]
    pub profile: String,
    /// Contexts of the short sweep, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "8K,16K,32K"
    )]
    pub contexts: Vec<String>,
    /// Concurrency levels of the short sweep, comma-separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,2,4,8"
    )]
    pub concurrency: Vec<u32>,
    /// Measurement window per cell.
    #[arg(long, value_name = "DURATION", default_value = "3s")]
    pub cell_duration: String,
    /// Ordinary ("production") requests of the mixed phase: chat and completions, streaming,
    /// cold prompts of 1.5K–24K tokens, at concurrency 1, 2, 4, 8.
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub requests: usize,
    /// How long each steady-phase cell's streams are held open.
    #[arg(long, value_name = "DURATION", default_value = "4s")]
    pub steady_duration: String,
    /// Directory for report.html, the matrices (json, md, html) and workload.jsonl (the
    /// production traffic as a trace, for `tokentap replay`).
    #[arg(long, value_name = "DIR", default_value = "tokentap-demo")]
    pub out: PathBuf,
    /// Simulator seed (same seed, same bytes).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Keep the simulator and proxy running after the report, until Ctrl-C, so the admin
    /// URLs stay open. Default: stop at the end.
    #[arg(long)]
    pub keep_running: bool,
    /// What is printed on stdout at the end (the sweep's matrix, then the steady and mixed
    /// comparisons): table (aligned, at most 120 columns), md or json. Default: table on a
    /// terminal, md otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Auto)]
    pub format: OutputFormat,
    /// Set a key of the demo proxy's configuration over the demo's own, e.g. --set
    /// slo.ttft=500ms (repeatable; see config/tokentap.toml).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

/// `tokentap demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let began = Instant::now();
    let steady_hold = crate::base::duration::parse_duration(&args.steady_duration)
        .map_err(|error| anyhow::anyhow!("--steady-duration: {error}"))?;
    let profile = Profile::load(&args.profile)
        .with_context(|| format!("loading simulator profile `{}`", args.profile))?;
    let profile_name = profile.model.served_model_name.clone();
    let source = profile.labels.source.clone();
    let sim = SimServer::start(
        profile,
        SimOptions {
            seed: args.seed,
            ..SimOptions::default()
        },
    )
    .await
    .context("starting the simulator")?;

    let token = format!(
        "demo-{:016x}",
        mix(std::process::id() as u64 ^ mix(began.elapsed().as_nanos() as u64 ^ 0x5eed))
            ^ mix(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0))
    );
    // The demo's phases last seconds and its steady clients go away rather than finish, so
    // its evidence rule asks for seconds and tokens, not completed requests (production's
    // default asks for 20 requests, 10 s and 500 tokens): a cell of a few tokens is still grey.
    let config_text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n[upstream]\nurl = \"{}\"\n[store]\ndata_dir = \"\"\n[workload]\ncapture = true\n[evidence]\nmin_requests = 0\nmin_measured_for = \"{}ms\"\nmin_output_tokens = 100\n",
        sim.base_url(),
        (steady_hold / 2).as_millis()
    );
    let config = ConfigLoader::new()
        .text(&config_text, "tokentap demo")?
        .set_args(&args.set)?
        .load()?;
    let server = ProxyServer::start(config).await?;

    eprintln!("tokentap demo");
    eprintln!(
        "  simulator  {}  ({profile_name}, calibrated from {source})",
        sim.base_url()
    );
    eprintln!(
        "  proxy      http://{}  (point clients here)",
        server.proxy_addr
    );
    eprintln!(
        "  admin      http://{}  (Prometheus /metrics; sweeps need: Authorization: Bearer {token})",
        server.admin_addr
    );

    // 1. The short sweep.
    let request = SweepRequest {
        contexts: Some(
            args.contexts
                .iter()
                .map(|c| TokensValue::Label(c.trim().to_owned()))
                .collect(),
        ),
        concurrency: Some(args.concurrency.clone()),
        cell_duration: Some(DurationValue::Text(args.cell_duration.clone())),
        ..SweepRequest::default()
    };
    let manager = Arc::clone(&server.admin.sweeps);
    let id = manager
        .start(request)
        .await
        .map_err(|error| anyhow::anyhow!(crate::proxy::error::error_chain(&error)))?;
    eprintln!();
    eprintln!(
        "1/4 Synthetic sweep {id}. While it runs:\n    curl -s -H 'Authorization: Bearer {token}' http://{}/sweeps/{id}",
        server.admin_addr
    );
    let status = follow_local(&manager, &id, true).await?;
    let Some(synthetic) = status.matrix.clone() else {
        anyhow::bail!(
            "the sweep ended {} without a matrix: {}",
            status.state.as_str(),
            status.error.unwrap_or_default()
        );
    };
    if status.state != SweepState::Finished {
        eprintln!("the sweep ended {}", status.state.as_str());
    }
    let model = synthetic
        .metadata
        .model
        .served_model
        .clone()
        .unwrap_or_else(|| profile_name.clone());

    // 2. Steady traffic: ordinary clients reproduce a few of the sweep's cells.
    let cells = steady_cells(&synthetic);
    eprintln!();
    eprintln!(
        "2/4 Steady traffic through http://{}: plain clients hold the streams of {} sweep cells (same prompt length, same number of streams, warm prompt) for {}",
        server.proxy_addr,
        cells.len(),
        args.steady_duration
    );
    let steady_phase = Phase::begin(&server);
    let mut steady_failures = 0;
    let mut progress = ProgressLine::new(true);
    for (done, &(context, concurrency)) in cells.iter().enumerate() {
        progress.message(
            &format!(
                "steady: {} × {concurrency}, {} streams for {}",
                context_label(context),
                concurrency,
                args.steady_duration
            ),
            Some((done, cells.len())),
        );
        wait_until_server_idle(&sim.base_url()).await;
        let (warm, failed) = steady_cell(
            &sim.base_url(),
            server.proxy_addr,
            &model,
            context,
            concurrency,
            steady_hold,
        )
        .await;
        if !warm || failed > 0 {
            steady_failures += 1;
            progress.done();
            eprintln!(
                "    {} × {concurrency}: {}{failed} streams failed",
                context_label(context),
                if warm {
                    ""
                } else {
                    "warming the prompt failed; "
                }
            );
        }
        wait_until_idle(&server.proxy.meter).await;
    }
    progress.done();
    wait_until_server_idle(&sim.base_url()).await;
    let steady = steady_phase.end(&model);

    // 3. Mixed traffic: cold prompts of many lengths at changing concurrency.
    eprintln!();
    eprintln!(
        "3/4 Mixed traffic: {} ordinary requests through http://{} (chat and completions, cold prompts of 1.5K–24K tokens, concurrency 1 → 8)",
        args.requests, server.proxy_addr
    );
    let mixed_phase = Phase::begin(&server);
    let mut progress = ProgressLine::new(true);
    let burst = burst(server.proxy_addr, &model, args.requests, &mut progress).await;
    progress.done();
    wait_until_idle(&server.proxy.meter).await;
    let mixed = mixed_phase.end(&model);
    eprintln!(
        "    {} answered 200, {} failed, in {:.1} s",
        burst.ok,
        burst.failed,
        burst.elapsed.as_secs_f64()
    );
    // Everything the proxy measured since start, as /matrix shows it.
    let production = server
        .production
        .matrix(Window::All, Some(&model), SystemTime::now());

    // 4. The matrices and the report.
    let report = DemoReport {
        synthetic: &synthetic,
        steady: steady.as_ref(),
        mixed: mixed.as_ref(),
        steady_cells: &cells,
    };
    match args.format.resolve() {
        OutputFormat::Table => {
            println!("{}", render_table(&synthetic));
            println!("{}", report.terminal());
        }
        OutputFormat::Json => println!("{}", report.json(production.as_ref())),
        _ => {
            println!("{}", render_markdown(&synthetic));
            println!("{}", report.markdown());
        }
    }
    let mut written = write_matrix(&args.out, "synthetic", &synthetic)?;
    for (stem, doc) in [
        ("production", production.as_ref()),
        ("steady", steady.as_ref()),
        ("mixed", mixed.as_ref()),
    ] {
        if let Some(doc) = doc {
            written.extend(write_matrix(&args.out, stem, doc)?);
        }
    }
    // The demo's production traffic as a trace, for `tokentap replay` (docs/what-if.md).
    if let Some(capture) = &server.admin.workload {
        let trace = capture.export(Duration::from_secs(24 * 3600)).await?;
        let path = args.out.join("workload.jsonl");
        std::fs::write(&path, trace.to_jsonl())
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    let report_path = args.out.join("report.html");
    std::fs::write(&report_path, report.html())
        .with_context(|| format!("cannot write {}", report_path.display()))?;
    eprintln!();
    eprintln!("4/4 Done in {:.0} s.", began.elapsed().as_secs_f64());
    eprintln!(
        "    Open {} in a browser (heat map, charts, both phases beside the sweep, every measurement).",
        report_path.display()
    );
    eprintln!("    Also written: {}", written.join(", "));
    eprintln!();
    eprintln!("Try next:");
    eprintln!("    tokentap serve --upstream http://YOUR-SGLANG:30000     # meter your own server; clients use :8000");
    eprintln!("    tokentap sweep --target http://YOUR-SGLANG:30000 --contexts 8K,32K --cell-duration 10s");
    eprintln!(
        "    tokentap matrix diff <seed page or matrix> {}   # compare two matrices cell by cell",
        args.out.join("synthetic.json").display()
    );
    eprintln!("    tokentap simulate --profile glm-5.3-flash-nvfp4-4x-rtx-pro-6000   # a simulated sglang on :30000");
    eprintln!("    tokentap demo --keep-running    # keep the proxy and admin API up to explore");

    if args.keep_running {
        eprintln!();
        eprintln!(
            "Still running: proxy http://{}, admin http://{} (token {token}). Ctrl-C stops.",
            server.proxy_addr, server.admin_addr
        );
        eprintln!(
            "    Open http://{}/login in a browser and give it the token: the live page, and a button that starts a sweep.",
            server.admin_addr
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    server.shutdown().await;
    sim.shutdown().await;
    Ok(
        if status.state == SweepState::Finished && burst.failed == 0 && steady_failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// How the burst went.
#[derive(Debug, Default)]
pub struct BurstSummary {
    pub ok: usize,
    pub failed: usize,
    pub elapsed: Duration,
}

/// Ordinary client traffic: four phases at concurrency 1, 2, 4 and 8; chat and completions,
/// streaming, cold prompts of about 1.5K to 24K tokens (the simulator counts 4 bytes a token),
/// 32 to 128 output tokens. All stream: the proxy sees a non-streaming response's first token
/// only at its end, so it would count as one long prefill in everyone's interference figure.
/// `progress` shows the requests answered so far (one live line on a terminal).
pub async fn burst(
    proxy: SocketAddr,
    model: &str,
    requests: usize,
    progress: &mut ProgressLine,
) -> BurstSummary {
    let began = Instant::now();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut summary = BurstSummary::default();
    let phases = [1usize, 2, 4, 8];
    let per_phase = requests.div_ceil(phases.len()).max(1);
    let mut sent = 0usize;
    for concurrency in phases {
        let mut running = JoinSet::new();
        let phase_end = (sent + per_phase).min(requests);
        while sent < phase_end || !running.is_empty() {
            while sent < phase_end && running.len() < concurrency {
                let index = sent;
                sent += 1;
                let client = client.clone();
                let body = burst_body(model, index);
                let path = if index % 2 == 0 {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                let uri = format!("http://{proxy}{path}");
                running.spawn(async move {
                    let request = Request::post(uri)
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(body)));
                    let Ok(request) = request else {
                        return false;
                    };
                    let exchange = async {
                        let response = client.request(request).await.ok()?;
                        let ok = response.status().is_success();
                        response.into_body().collect().await.ok()?;
                        Some(ok)
                    };
                    tokio::time::timeout(Duration::from_secs(120), exchange)
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or(false)
                });
            }
            match running.join_next().await {
                Some(Ok(true)) => summary.ok += 1,
                Some(_) => summary.failed += 1,
                None => {}
            }
            let answered = summary.ok + summary.failed;
            progress.message(
                // The part before " · elapsed" names the phase: plain output prints one line
                // per concurrency level, a terminal redraws the count.
                &format!(
                    "mixed: up to {concurrency} at once · elapsed {:.0} s, {answered} of {requests} answered",
                    began.elapsed().as_secs_f64()
                ),
                Some((answered, requests)),
            );
        }
    }
    summary.elapsed = began.elapsed();
    summary
}

fn burst_body(model: &str, index: usize) -> String {
    const SIZES: [usize; 5] = [1_500, 3_000, 6_000, 12_000, 24_000];
    const OUTPUTS: [u64; 3] = [32, 64, 128];
    let pick = mix(index as u64);
    let tokens = SIZES.get((pick % 5) as usize).copied().unwrap_or(1_500);
    let max_tokens = OUTPUTS.get((pick >> 8) as usize % 3).copied().unwrap_or(64);
    let text = filler_text(&format!("demo-user-{index}"), tokens as u64, tokens * 4);
    let text = serde_json::Value::String(text);
    let model = serde_json::Value::String(model.to_owned());
    if index % 2 == 0 {
        format!(
            "{{\"model\":{model},\"messages\":[{{\"role\":\"user\",\"content\":{text}}}],\"max_tokens\":{max_tokens},\"stream\":true}}"
        )
    } else {
        format!(
            "{{\"model\":{model},\"prompt\":{text},\"max_tokens\":{max_tokens},\"stream\":true}}"
        )
    }
}

/// The sweep cells the steady phase reproduces: 8K × 1, 8K × 4 and 16K × 2 when the sweep has
/// them valid (the default sweep does), else its first three valid cells.
pub fn steady_cells(synthetic: &MatrixDoc) -> Vec<(u64, u32)> {
    let valid = |context: u64, concurrency: u32| {
        synthetic
            .cell(context, concurrency)
            .is_some_and(|cell| cell.status.is_valid() && cell.per_request_tok_s.is_some())
    };
    let preferred: Vec<(u64, u32)> = [(8192, 1), (8192, 4), (16384, 2)]
        .into_iter()
        .filter(|&(context, concurrency)| valid(context, concurrency))
        .collect();
    if !preferred.is_empty() {
        return preferred;
    }
    synthetic
        .decode
        .iter()
        .filter(|cell| valid(cell.context_tokens, cell.concurrency))
        .map(|cell| (cell.context_tokens, cell.concurrency))
        .take(3)
        .collect()
}

/// One phase's own production aggregator, fed by the proxy's meter while the phase runs, so
/// each phase's cells hold only its own requests.
struct Phase {
    matrix: Arc<ProductionMatrix>,
    /// The aggregator's registration with the meter, removed when the phase ends or is dropped.
    scope: SinkScope,
}

impl Phase {
    fn begin(server: &ProxyServer) -> Phase {
        let matrix = ProductionMatrix::with_evidence(
            server.production.contexts().clone(),
            server.production.concurrency().clone(),
            Source::Production,
            server.production.evidence(),
        );
        let scope = ProxyPath::new(Arc::clone(&server.proxy)).collect(matrix.clone());
        Phase { matrix, scope }
    }

    fn end(self, model: &str) -> Option<MatrixDoc> {
        drop(self.scope);
        self.matrix
            .matrix(Window::All, Some(model), SystemTime::now())
    }
}

/// Waits (at most 10 s) until no production request is in flight, so one phase's last records
/// are published before the next begins and its streams do not count in the next one's
/// concurrency.
async fn wait_until_idle(meter: &Meter) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while meter.inflight(Source::Production) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most 10 s) until the simulator reports no running or queued request: the proxy
/// counts a stream out when its client goes away, the server a moment later, and a request it
/// still holds would count in the next cell's batch (as the sweep's drain barrier avoids).
async fn wait_until_server_idle(simulator: &str) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Ok(request) =
            Request::get(format!("{simulator}/metrics")).body(Full::new(Bytes::new()))
        else {
            return;
        };
        let page = async {
            let response = client.request(request).await.ok()?;
            let body = response.into_body().collect().await.ok()?.to_bytes();
            Some(String::from_utf8_lossy(&body).into_owned())
        };
        let Some(text) = tokio::time::timeout(Duration::from_secs(5), page)
            .await
            .ok()
            .flatten()
        else {
            return;
        };
        let held: f64 = LOAD_GAUGES
            .iter()
            .filter_map(|name| sum_of(&text, name))
            .sum();
        if held <= 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A token-id prompt of exactly `len` tokens: the same for every stream of a cell, so after
/// one warming request every stream hits the prompt cache, as the sweep's streams do.
fn steady_body(model: &str, len: u64, max_tokens: u64) -> String {
    let ids: Vec<String> = (0..len)
        .map(|i| (1000 + (i * 7919 + len) % 50_000).to_string())
        .collect();
    let model = serde_json::Value::String(model.to_owned());
    format!(
        "{{\"model\":{model},\"prompt\":[{}],\"max_tokens\":{max_tokens},\"ignore_eos\":true,\"stream\":true}}",
        ids.join(",")
    )
}

/// One steady cell: warms the prompt straight at the simulator (as the sweep's scout does, so
/// the warming request is not production traffic), then holds `concurrency` streams through the
/// proxy for `hold`, reading every byte, and goes away, as an application that cancels does.
/// Returns whether warming worked and how many streams failed.
async fn steady_cell(
    simulator: &str,
    proxy: SocketAddr,
    model: &str,
    context: u64,
    concurrency: u32,
    hold: Duration,
) -> (bool, usize) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let post = |uri: String, body: String| {
        Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
    };
    let warmed = match post(
        format!("{simulator}/v1/completions"),
        steady_body(model, context, 1),
    ) {
        Ok(request) => {
            let exchange = async {
                let response = client.request(request).await.ok()?;
                let ok = response.status().is_success();
                response.into_body().collect().await.ok()?;
                Some(ok)
            };
            tokio::time::timeout(Duration::from_secs(60), exchange)
                .await
                .ok()
                .flatten()
                .unwrap_or(false)
        }
        Err(_) => false,
    };
    let mut streams = JoinSet::new();
    for _ in 0..concurrency {
        let Ok(request) = post(
            format!("http://{proxy}/v1/completions"),
            steady_body(model, context, 4096),
        ) else {
            continue;
        };
        let client = client.clone();
        streams.spawn(async move {
            let Ok(response) = client.request(request).await else {
                return false;
            };
            if !response.status().is_success() {
                return false;
            }
            let mut body = response.into_body();
            let deadline = Instant::now() + hold;
            while let Ok(Some(frame)) = tokio::time::timeout_at(deadline, body.frame()).await {
                if frame.is_err() {
                    return false;
                }
            }
            true
        });
    }
    let mut failed = concurrency as usize - streams.len();
    while let Some(outcome) = streams.join_next().await {
        if !matches!(outcome, Ok(true)) {
            failed += 1;
        }
    }
    (warmed, failed)
}

/// Relative tolerance within which a steady cell agrees with the sweep.
pub const AGREEMENT: f64 = 0.05;

/// What the columns of the comparison tables mean; printed beside them.
pub const DEFINITIONS: [&str; 7] = [
    "Per-request tok/s: 1 ÷ TBT of one stream, median over the cell's streams.",
    "TBT: (last token − first token) ÷ (completion tokens − 1), median.",
    "TTFT: request head in → first token at the proxy, median. The sweep warms the prompt cache first; the steady clients warm theirs the same way, but their TTFT also holds the upload of their request body, which the sweep's in-process requests skip (on a busy machine it is the column that moves most); the mixed requests arrive cold, so their TTFT includes their prefill.",
    "Total tok/s (steady phase only): output tokens per second across the cell's simultaneous streams. It means the same on both sides only when every request of the cell has the same prompt length and runs through the whole window, as in the sweep and the steady phase; mixed traffic does not, so it is not compared there.",
    "Prefill overlap: the share of the cell's decode time (each request's first → last token) during which at least one other request to the same server was in prefill (head in → first token), measured by the proxy for every request.",
    "Mean per-request tok/s: decode tokens per request-second of decode, Total tok/s ÷ Average active requests; a server that pauses decoding while it prefills (chunked prefill, as the simulator models sglang) gives sweep × (1 − overlap): the sweep's undisturbed speed slowed by the stalls alone.",
    "Overlapping prefills: mean number of other requests' prefills that overlapped a request's decode.",
];

/// A column compared between the sweep and production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compared {
    PerRequest,
    Tbt,
    Ttft,
    Total,
}

impl Compared {
    fn of(self, cell: &DecodeCell) -> Option<f64> {
        match self {
            Compared::PerRequest => cell.per_request_tok_s,
            Compared::Tbt => cell.tbt_ms,
            Compared::Ttft => cell.ttft_ms,
            Compared::Total => cell.total_tok_s,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Compared::PerRequest => "per-request tok/s",
            Compared::Tbt => "TBT",
            Compared::Ttft => "TTFT",
            Compared::Total => "total tok/s",
        }
    }

    fn format(self, value: f64) -> String {
        match self {
            Compared::PerRequest | Compared::Total => format!("{value:.1}"),
            Compared::Tbt => format!("{value:.1} ms"),
            Compared::Ttft => format!("{value:.0} ms"),
        }
    }

    /// "sweep · production (×ratio)" and the ratio.
    fn pair(self, sweep: &DecodeCell, production: &DecodeCell) -> (String, Option<f64>) {
        match (self.of(sweep), self.of(production)) {
            (Some(a), Some(b)) if a > 0.0 => (
                format!("{} · {} (×{:.3})", self.format(a), self.format(b), b / a),
                Some(b / a),
            ),
            (a, b) => (
                format!(
                    "{} · {}",
                    a.map_or_else(|| MISSING.to_owned(), |v| self.format(v)),
                    b.map_or_else(|| MISSING.to_owned(), |v| self.format(v))
                ),
                None,
            ),
        }
    }
}

/// A production cell's mean per-request decode speed (decode tokens per request-second: Total
/// tok/s ÷ Average active requests) beside what the sweep's speed and the cell's prefill overlap
/// predict for a server that pauses decoding to prefill, with their ratio.
fn explained(sweep: &DecodeCell, production: &DecodeCell) -> String {
    let mean = production
        .total_tok_s
        .zip(production.average_active_requests)
        .filter(|(_, active)| *active > 0.0)
        .map(|(total, active)| total / active);
    let predicted = sweep
        .per_request_tok_s
        .zip(production.prefill_overlap_share)
        .map(|(speed, overlap)| speed * (1.0 - overlap));
    match (mean, predicted) {
        (Some(mean), Some(predicted)) if predicted > 0.0 => {
            format!("{mean:.1} · {predicted:.1} (×{:.3})", mean / predicted)
        }
        (mean, predicted) => format!(
            "{} · {}",
            mean.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}")),
            predicted.map_or_else(|| MISSING.to_owned(), |v| format!("{v:.1}"))
        ),
    }
}

fn interference_text(cell: &DecodeCell) -> (String, String) {
    (
        cell.prefill_overlap_share
            .map_or_else(|| MISSING.to_owned(), format_percent),
        cell.overlapping_prefills
            .map_or_else(|| MISSING.to_owned(), |v| format!("{v:.2}")),
    )
}

/// A report cell shortened for a terminal: no ` ms` (the header says it) and ratios with two
/// decimals without parentheses (`118.4 · 117.9 (×0.994)` → `118.4 · 117.9 ×0.99`).
fn compact(cell: &str) -> String {
    let text = cell.replace(" ms", "");
    let Some(open) = text.find("(×") else {
        return text;
    };
    let rest = &text[open + "(×".len()..];
    let Some(close) = rest.find(')') else {
        return text;
    };
    match rest[..close].parse::<f64>() {
        Ok(ratio) => format!("{}×{ratio:.2}{}", &text[..open], &rest[close + 1..]),
        Err(_) => text,
    }
}

/// A table as header and rows of plain text, rendered to Markdown or HTML.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextTable {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl TextTable {
    /// Aligned for a terminal under `header` (shorter names than the report's), at most
    /// [`MAX_WIDTH`] columns.
    fn terminal(&self, header: &[&str]) -> String {
        // Short names only while they name the report's columns one for one.
        let own: Vec<&str> = self.header.iter().map(String::as_str).collect();
        let header = if header.len() == own.len() {
            header
        } else {
            &own
        };
        let mut table = crate::matrix::table::TextTable::new(header);
        table.numeric = (1..header.len()).collect();
        table.rows = self
            .rows
            .iter()
            .map(|row| row.iter().map(|cell| compact(cell)).collect())
            .collect();
        table.render(MAX_WIDTH)
    }

    fn markdown(&self) -> String {
        let line = |cells: &[String]| {
            let escaped: Vec<String> = cells.iter().map(|c| md_escape(c)).collect();
            format!("| {} |\n", escaped.join(" | "))
        };
        let mut out = line(&self.header);
        out.push('|');
        for index in 0..self.header.len() {
            out.push_str(if index == 0 { "---|" } else { "---:|" });
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    fn html(&self) -> String {
        let mut out = String::from("<table class=\"measurements\"><thead><tr>");
        for column in &self.header {
            let _ = write!(out, "<th>{}</th>", xml_escape(column));
        }
        out.push_str("</tr></thead><tbody>");
        for row in &self.rows {
            out.push_str("<tr>");
            for (index, cell) in row.iter().enumerate() {
                let class = if index > 0 { " class=\"num\"" } else { "" };
                let _ = write!(out, "<td{class}>{}</td>", xml_escape(cell));
            }
            out.push_str("</tr>");
        }
        out.push_str("</tbody></table>");
        out
    }
}

/// The demo's findings: the sweep, and each phase's production cells beside it.
pub struct DemoReport<'a> {
    pub synthetic: &'a MatrixDoc,
    pub steady: Option<&'a MatrixDoc>,
    pub mixed: Option<&'a MatrixDoc>,
    pub steady_cells: &'a [(u64, u32)],
}

impl DemoReport<'_> {
    /// Steady cells beside the sweep's: per-request tok/s, TBT, TTFT and total tok/s, each
    /// marked ✓ within 5 %, and the cells' prefill overlap (≈ 0: nothing cold arrives).
    pub fn steady_table(&self) -> (TextTable, usize) {
        let mut table = TextTable {
            header: [
                "Cell",
                "Per-request tok/s sweep · production",
                "TBT",
                "TTFT",
                "Total tok/s",
                "Prefill overlap",
                "Within 5 %",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows: Vec::new(),
        };
        let mut agreeing = 0;
        for &(context, concurrency) in self.steady_cells {
            let label = format!("{} × {concurrency}", context_label(context));
            let sweep = self.synthetic.cell(context, concurrency);
            let production = self.steady.and_then(|doc| doc.cell(context, concurrency));
            let (Some(sweep), Some(production)) = (sweep, production) else {
                table.rows.push(vec![
                    label,
                    "no production cell (the streams failed or landed elsewhere)".to_owned(),
                ]);
                continue;
            };
            let mut row = vec![label];
            let mut outside = Vec::new();
            for column in [
                Compared::PerRequest,
                Compared::Tbt,
                Compared::Ttft,
                Compared::Total,
            ] {
                let (text, ratio) = column.pair(sweep, production);
                if !ratio.is_some_and(|r| (r - 1.0).abs() <= AGREEMENT) {
                    outside.push(column.name());
                }
                row.push(text);
            }
            row.push(interference_text(production).0);
            let all_within = outside.is_empty();
            row.push(if all_within {
                "✓".to_owned()
            } else {
                format!("✗ {}", outside.join(", "))
            });
            agreeing += usize::from(all_within);
            table.rows.push(row);
        }
        (table, agreeing)
    }

    /// Mixed cells beside the sweep's cell of the same context and concurrency: the columns that
    /// mean the same on both sides, and the cell's measured prefill interference.
    pub fn mixed_table(&self) -> TextTable {
        let mut table = TextTable {
            header: [
                "Cell",
                "Requests",
                "Per-request tok/s sweep · production",
                "Prefill overlap",
                "Overlapping prefills",
                "Mean per-request tok/s production · sweep × (1 − overlap)",
                "TBT",
                "TTFT",
            ]
            .map(str::to_owned)
            .to_vec(),
            rows: Vec::new(),
        };
        let Some(mixed) = self.mixed else {
            return table;
        };
        for production in &mixed.decode {
            let (context, concurrency) = (production.context_tokens, production.concurrency);
            let Some(sweep) = self
                .synthetic
                .cell(context, concurrency)
                .filter(|cell| cell.status.is_valid())
            else {
                continue;
            };
            let (overlap, overlapping) = interference_text(production);
            table.rows.push(vec![
                format!("{} × {concurrency}", context_label(context)),
                production
                    .completed_requests
                    .map_or_else(|| MISSING.to_owned(), |n| n.to_string()),
                Compared::PerRequest.pair(sweep, production).0,
                overlap,
                overlapping,
                explained(sweep, production),
                Compared::Tbt.pair(sweep, production).0,
                Compared::Ttft.pair(sweep, production).0,
            ]);
        }
        table
    }

    /// The comparison in Markdown, definitions under the tables.
    pub fn markdown(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mut out = String::from("## Steady traffic · the sweep\n\n");
        let _ = writeln!(
            out,
            "Plain clients reproduce sweep cells: same prompt length, same number of streams, warm prompt. {agreeing} of {} cells agree with the sweep within 5 % on every compared column.\n",
            self.steady_cells.len()
        );
        out.push_str(&steady.markdown());
        out.push_str("\n## Mixed traffic · the sweep\n\n");
        out.push_str("Cold prompts of many lengths at changing concurrency. Each request sits in the row of its prompt length and the column of its average number of active requests (prefilling ones included). Where the mean per-request speed matches sweep × (1 − overlap), the gap to the sweep is the time other requests' prefills held the decode up.\n\n");
        let mixed = self.mixed_table();
        if mixed.rows.is_empty() {
            out.push_str("No mixed cell shares a context and concurrency with the sweep.\n");
        } else {
            out.push_str(&mixed.markdown());
        }
        out.push_str("\nDefinitions (the same for the sweep and production):\n\n");
        for definition in DEFINITIONS {
            let _ = writeln!(out, "- {}", md_escape(definition));
        }
        out
    }

    /// The comparisons as aligned text for a terminal (`--format table`).
    pub fn terminal(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mut out = format!(
            "Steady traffic beside the sweep: {agreeing} of {} cells agree within 5 % on every compared column.\n\n",
            self.steady_cells.len()
        );
        out.push_str(&steady.terminal(&[
            "Cell",
            "Req tok/s sweep · prod",
            "TBT ms",
            "TTFT ms",
            "Total tok/s",
            "Overlap",
            "Within 5 %",
        ]));
        out.push_str("\nMixed traffic beside the sweep: cold prompts. Pref. = other requests' prefills overlapping a decode;\nwhere prod ≈ sweep × (1 − overlap), those prefills explain the gap.\n\n");
        let mixed = self.mixed_table();
        if mixed.rows.is_empty() {
            out.push_str("No mixed cell shares a context and concurrency with the sweep.\n");
        } else {
            out.push_str(&mixed.terminal(&[
                "Cell",
                "Reqs",
                "Req tok/s sweep · prod",
                "Overlap",
                "Pref.",
                "Prod · sweep×(1−ov)",
                "TBT ms",
                "TTFT ms",
            ]));
        }
        out
    }

    /// The demo's matrices as one JSON object (`--format json`): `synthetic`, and `production`,
    /// `steady`, `mixed` where measured.
    pub fn json(&self, production: Option<&MatrixDoc>) -> String {
        let value = serde_json::json!({
            "synthetic": self.synthetic,
            "production": production,
            "steady": self.steady,
            "mixed": self.mixed,
        });
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }

    /// The demo's HTML report: the sweep, both phases beside it, definitions, every measurement.
    pub fn html(&self) -> String {
        let (steady, agreeing) = self.steady_table();
        let mixed = self.mixed_table();
        let definitions: String = DEFINITIONS
            .iter()
            .map(|d| format!("<li>{}</li>", xml_escape(d)))
            .collect();
        let all = |doc: Option<&MatrixDoc>| {
            doc.map_or_else(
                || "<p class=\"note\">No request was measured.</p>".to_owned(),
                measurements_fragment,
            )
        };
        let shown: Vec<&MatrixDoc> = std::iter::once(self.synthetic)
            .chain(self.steady)
            .chain(self.mixed)
            .collect();
        let axes = Axes::union(&shown);
        let max = heat_scale_max(&shown);
        let heat = |doc: Option<&MatrixDoc>, id: &str, title: &str| {
            let grid = doc.map_or_else(
                || "<p class=\"note\">No request was measured.</p>".to_owned(),
                |doc| grid_fragment_on(doc, &axes, max),
            );
            format!("<div class=\"panel\" id=\"{id}\"><h3>{title}</h3>{grid}</div>")
        };
        let versus = |doc: Option<&MatrixDoc>| {
            doc.filter(|d| !d.decode.is_empty())
                .map_or_else(String::new, |doc| comparison_fragment(doc, self.synthetic))
        };
        let body = format!(
            "<h1>tokentap demo</h1><p class=\"note\">A simulated sglang server behind the tokentap proxy: a synthetic sweep, then ordinary traffic in two phases, all measured by the proxy's metering path. First: the steady traffic's cells ÷ the sweep's, on one grid.</p>{steady_versus}\
<div class=\"panels\">{sweep_heat}{steady_heat}{mixed_heat}</div>{facts}<h2>Synthetic sweep</h2>{prefill}\
<h2>Steady traffic · the sweep</h2><p class=\"note\">Plain clients reproduce sweep cells: same prompt length, same number of streams, warm prompt. {agreeing} of {cells} cells agree within 5 % on every compared column.</p><div class=\"scroll\">{steady}</div>\
<h2>Mixed traffic · the sweep</h2><p class=\"note\">Cold prompts of many lengths at changing concurrency. Each request sits in the row of its prompt length and the column of its average number of active requests (prefilling ones included). Where the mean per-request speed matches sweep × (1 − overlap), the gap to the sweep is the time other requests' prefills held the decode up.</p>{mixed_versus}<div class=\"scroll\">{mixed}</div>\
<h3>Definitions (the same for the sweep and production)</h3><ul class=\"note\">{definitions}</ul>\
<h2>Synthetic: all measurements</h2>{synthetic_all}<h2>Steady traffic: all measurements</h2>{steady_all}<h2>Mixed traffic: all measurements</h2>{mixed_all}",
            steady_versus = versus(self.steady),
            sweep_heat = heat(Some(self.synthetic), "synthetic", "Synthetic sweep"),
            steady_heat = heat(self.steady, "production", "Steady traffic (production)"),
            mixed_heat = heat(self.mixed, "mixed", "Mixed traffic (production)"),
            facts = facts_fragment(self.synthetic),
            prefill = prefill_fragment(self.synthetic),
            cells = self.steady_cells.len(),
            steady = steady.html(),
            mixed_versus = versus(self.mixed),
            mixed = mixed.html(),
            synthetic_all = measurements_fragment(self.synthetic),
            steady_all = all(self.steady),
            mixed_all = all(self.mixed),
        );
        page("tokentap demo", &body)
    }
}

#[cfg(test)]
mod terminal_tests {
    use super::compact;

    #[test]
    fn report_cells_shorten_for_a_terminal() {
        assert_eq!(compact("118.4 · 117.9 (×0.994)"), "118.4 · 117.9 ×0.99");
        assert_eq!(compact("192 ms · 2160 ms (×11.250)"), "192 · 2160 ×11.25");
        assert_eq!(compact("0.0%"), "0.0%");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(context: u64, concurrency: u32, speed: f64, overlap: Option<f64>) -> DecodeCell {
        let mut cell =
            DecodeCell::status_only(context, concurrency, crate::matrix::CellStatus::Valid);
        cell.per_request_tok_s = Some(speed);
        cell.tbt_ms = Some(1000.0 / speed);
        cell.ttft_ms = Some(100.0);
        cell.total_tok_s = Some(speed * f64::from(concurrency));
        cell.average_active_requests = Some(f64::from(concurrency));
        cell.prefill_overlap_share = overlap;
        cell.overlapping_prefills = overlap.map(|s| s * 10.0);
        cell
    }

    fn doc(cells: Vec<DecodeCell>) -> MatrixDoc {
        let mut doc = MatrixDoc::new(crate::matrix::Metadata::default());
        doc.decode = cells;
        doc
    }

    #[test]
    fn the_report_marks_agreement_and_puts_interference_beside_the_gap() {
        let synthetic = doc(vec![
            cell(8192, 1, 118.5, Some(0.0)),
            cell(8192, 4, 77.7, Some(0.01)),
            cell(16384, 2, 86.3, Some(0.0)),
        ]);
        assert_eq!(
            steady_cells(&synthetic),
            vec![(8192, 1), (8192, 4), (16384, 2)]
        );
        // 8K × 1 agrees (within 5 % everywhere); 8K × 4 is 10 % slow.
        let steady = doc(vec![
            cell(8192, 1, 117.0, Some(0.0)),
            cell(8192, 4, 70.0, Some(0.0)),
        ]);
        let mixed = doc(vec![
            cell(8192, 4, 40.0, Some(0.45)),
            cell(65536, 1, 50.0, None),
        ]);
        let cells = steady_cells(&synthetic);
        let report = DemoReport {
            synthetic: &synthetic,
            steady: Some(&steady),
            mixed: Some(&mixed),
            steady_cells: &cells,
        };
        let (table, agreeing) = report.steady_table();
        assert_eq!(agreeing, 1);
        assert_eq!(table.rows[0].last().unwrap(), "✓");
        assert_eq!(
            table.rows[1].last().unwrap(),
            "✗ per-request tok/s, TBT, total tok/s"
        );
        assert!(table.rows[2][1].starts_with("no production cell"));
        // Only cells the sweep also has are compared; 1 − overlap stands beside the ratio.
        let mixed_table = report.mixed_table();
        assert_eq!(mixed_table.rows.len(), 1);
        let row = &mixed_table.rows[0];
        assert_eq!(row[2], "77.7 · 40.0 (×0.515)");
        assert_eq!(row[3], "45.0%");
        // Mean 160 ÷ 4 = 40.0 against 77.7 × 0.55 = 42.7.
        assert_eq!(row[5], "40.0 · 42.7 (×0.936)");
        let md = report.markdown();
        assert!(md.contains("1 of 3 cells agree"), "{md}");
        assert!(
            md.contains("Prefill overlap: the share of the cell's decode time"),
            "{md}"
        );
        let html = report.html();
        assert!(html.contains("<td class=\"num\">45.0%</td>"), "{html}");
    }

    #[test]
    fn burst_bodies_are_json() {
        for index in 0..8 {
            let body = burst_body("m", index);
            let value: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(value["model"], "m");
            assert!(value["max_tokens"].as_u64().unwrap() >= 32);
        }
    }
}
