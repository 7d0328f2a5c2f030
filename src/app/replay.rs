//! `tokentap replay TRACE`: a trace replayed open-loop against a server (`--target`) or an
//! embedded simulator (`--simulate PROFILE`, `--from-matrix MATRIX`), through an in-process
//! instance of the proxy's data path. Prints the replay's matrix and, with `--baseline`, its
//! diff against the original production cells; writes both. Ctrl-C stops cleanly (streams are
//! disconnected) and still writes what was measured.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use http::HeaderValue;
use tokio::sync::watch;

use super::output::OutputFormat;
use super::sweep::{write_matrix, EXIT_CANCELLED};
use crate::config::{Config, ConfigLoader};
use crate::matrix::diff::{diff, render_diff_json, render_diff_markdown};
use crate::proxy::Proxy;
use crate::sim::from_matrix::{profile_from_matrix, FromMatrixOptions};
use crate::sim::{Profile, SimOptions, SimServer};
use crate::sweep::progress::ProgressLine;

use super::workload::read_trace_file;
use crate::workload::replay::{replay, ReplayPlan, ReplayProgress};

/// Arguments of `tokentap replay`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("upstream").required(true).args(["target", "simulate", "from_matrix"])))]
pub struct ReplayArgs {
    /// The trace: tokentap JSONL (`tokentap workload export`), Mooncake JSONL or the Azure CSV.
    pub trace: PathBuf,
    /// Replay against this inference server.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// Replay against an embedded simulator of this profile (a built-in name or a TOML file).
    #[arg(long, value_name = "NAME|FILE")]
    pub simulate: Option<String>,
    /// Replay against an embedded simulator built from this matrix (a seed page, or a tokentap
    /// matrix in JSON or Markdown), as `tokentap simulate --from-matrix` builds it.
    #[arg(long, value_name = "MATRIX")]
    pub from_matrix: Option<PathBuf>,
    /// Arrival times are divided by this (2 = twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Send at most the first N requests.
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// Stop after this long (`90s`, `10m`); streams in flight are disconnected.
    #[arg(long, value_name = "DURATION")]
    pub max_duration: Option<String>,
    /// The model every request names. Default: the trace's first model, else the simulator's.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// SLO targets for every request, e.g. ttft=500ms,tbt=50ms (sent as x-tokentap-slo); the
    /// matrix then shows SLO attainment and goodput per cell.
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// The original production matrix (JSON from `/matrix?format=json`, or any matrix file):
    /// the replay is diffed against it (ratios are replay ÷ baseline).
    #[arg(long, value_name = "MATRIX")]
    pub baseline: Option<PathBuf>,
    /// Seeds the prompts (another seed shares no prompt block with this one's).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory for replay.{json,html,md} and diff.{md,json}. Default tokentap-replay.
    #[arg(long, value_name = "DIR", default_value = "tokentap-replay")]
    pub out: PathBuf,
    /// Configuration file: its upstream and metering sections (ladders, `[slo]`) apply.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// What is printed on stdout at the end (the replay's matrix, then the diff): table
    /// (aligned, at most 120 columns), md or json. Default: table on a terminal, md otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Auto)]
    pub format: OutputFormat,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Builds the data path from a configuration (`serve::build_proxy`; passed in by the command
/// layer, so this module does not import the wiring above it).
pub type BuildProxy = fn(&Config) -> anyhow::Result<Arc<Proxy>>;

/// `tokentap replay`.
pub async fn run(args: ReplayArgs, build_proxy: BuildProxy) -> anyhow::Result<ExitCode> {
    let trace = read_trace_file(&args.trace)?;
    anyhow::ensure!(
        !trace.requests.is_empty(),
        "{} holds no request",
        args.trace.display()
    );
    let baseline = match &args.baseline {
        Some(path) => Some(
            crate::matrix::load(path)
                .with_context(|| format!("reading the baseline matrix {}", path.display()))?,
        ),
        None => None,
    };
    let max_duration = match &args.max_duration {
        Some(text) => Some(
            crate::base::duration::parse_duration(text)
                .map_err(|m| anyhow::anyhow!("--max-duration {text:?}: {m}"))?,
        ),
        None => None,
    };
    if !(args.speed.is_finite() && args.speed > 0.0) {
        bail!("--speed must be a positive number, got {}", args.speed);
    }
    let slo_header = match &args.slo {
        Some(text) => Some(
            HeaderValue::from_str(text)
                .map_err(|_| anyhow::anyhow!("--slo {text:?}: not a header value"))?,
        ),
        None => None,
    };

    let (sim, sim_model) = start_simulator(&args).await?;
    let url = match (&sim, &args.target) {
        (Some(sim), _) => sim.base_url(),
        (None, Some(url)) => url.clone(),
        (None, None) => bail!("give --target, --simulate or --from-matrix"),
    };
    let mut loader = ConfigLoader::new();
    if let Some(path) = &args.config {
        loader = loader.file(path)?;
    }
    let config = loader
        .process_env()?
        .flag(
            "upstream",
            "url",
            toml::Value::String(url.clone()),
            "--target",
        )
        .load()?;
    let proxy = build_proxy(&config)?;

    let model = args
        .model
        .clone()
        .or_else(|| trace.requests.iter().find_map(|r| r.model.clone()))
        .or(sim_model)
        .context("the trace names no model: give --model")?;
    let plan = ReplayPlan {
        speed: args.speed,
        max_requests: args.max_requests,
        max_duration,
        model,
        slo_header,
        seed: args.seed,
    };
    let (stop_tx, stop) = watch::channel(false);
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop_tx.send(true);
        }
    });
    if !args.quiet {
        eprintln!(
            "tokentap replay: {} request(s) of {} at {}× against {} through an in-process proxy; Ctrl-C stops",
            plan.max_requests.unwrap_or(usize::MAX).min(trace.requests.len()),
            args.trace.display(),
            args.speed,
            crate::net::redact::redact_url(&url),
        );
    }
    let mut line = ProgressLine::new(!args.quiet);
    let report = replay(proxy, &trace, &plan, stop, |p| {
        line.message(&progress_text(&p), Some((p.finished, p.total)));
    })
    .await;
    line.done();
    ctrl_c.abort();
    if let Some(sim) = sim {
        sim.shutdown().await;
    }

    if report.failed > 0 {
        eprintln!(
            "tokentap replay: {} of {} stream(s) failed; the first: {}",
            report.failed,
            report.sent,
            report.first_failure.as_deref().unwrap_or("?")
        );
    }
    let Some(matrix) = report.matrix else {
        bail!("the replay recorded no request");
    };
    print!("{}", args.format.matrix(&matrix));
    let mut written = write_matrix(&args.out, "replay", &matrix)?;
    if let Some(baseline) = &baseline {
        let mut compared = diff(baseline, &matrix);
        compared.a.label = args
            .baseline
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        compared.b.label = "replay".into();
        let markdown = render_diff_markdown(&compared);
        print!("\n{}", args.format.diff(&compared));
        for (name, text) in [
            ("diff.md", markdown),
            ("diff.json", render_diff_json(&compared)),
        ] {
            let path = args.out.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path.display().to_string());
        }
    }
    eprintln!("tokentap replay: {}", written.join(", "));
    Ok(if report.stopped && max_duration.is_none() {
        ExitCode::from(EXIT_CANCELLED)
    } else {
        ExitCode::SUCCESS
    })
}

/// The simulator `--simulate` or `--from-matrix` asks for, and the model it serves.
async fn start_simulator(
    args: &ReplayArgs,
) -> anyhow::Result<(Option<crate::sim::SimHandle>, Option<String>)> {
    let profile = if let Some(name) = &args.simulate {
        Profile::load(name).with_context(|| format!("loading simulator profile `{name}`"))?
    } else if let Some(path) = &args.from_matrix {
        let doc = crate::matrix::load(path).context("reading the matrix given to --from-matrix")?;
        let options = FromMatrixOptions {
            tokens_per_event: None,
            origin: path.display().to_string(),
        };
        profile_from_matrix(&doc, &options)
            .with_context(|| format!("building a simulator profile from {}", path.display()))?
            .0
    } else {
        return Ok((None, None));
    };
    let model = profile.model.served_model_name.clone();
    let options = SimOptions {
        enable_cache_report: true,
        ..SimOptions::default()
    };
    let sim = SimServer::start(profile, options)
        .await
        .context("starting the embedded simulator")?;
    Ok((Some(sim), Some(model)))
}

fn progress_text(p: &ReplayProgress) -> String {
    // The part before " · elapsed" names the phase: without a terminal, one line per phase.
    let (phase, eta) = if p.sent < p.total {
        ("sending", p.span.saturating_sub(p.elapsed).as_secs_f64())
    } else {
        ("draining", 0.0)
    };
    format!(
        "replay {phase} · elapsed {:.0}s of {:.0}s: {}/{} sent, {} done · ETA {eta:.0}s",
        p.elapsed.as_secs_f64(),
        p.span.as_secs_f64(),
        p.sent,
        p.total,
        p.finished,
    )
}
