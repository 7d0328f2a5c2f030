//! `tokentap replay TRACE`: a trace replayed open-loop against a server (`--target`) or an
//! embedded simulator (`--simulate PROFILE`, `--from-matrix MATRIX`), through an in-process
//! instance of the proxy's data path. Prints the replay's matrix and, with `--baseline`, its
//! diff against the original production cells; writes both. Ctrl-C stops cleanly (streams are
//! disconnected) and still writes what was measured. With `--find-speed --slo …`, replays the
//! trace at the speeds `workload::speed` proposes and reports the largest speed-up at which the
//! SLO still holds on that deployment. A trace that names no model is replayed with the one the
//! server's `/v1/models` lists (as `tokentap sweep` asks it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use http::HeaderValue;
use tokio::sync::watch;
use tokio::time::Instant;

use super::output::{indented_wrap, OutputFormat};
use super::proxy::build_proxy;
use super::sweep::{write_matrix, EXIT_CANCELLED};
use crate::config::{Config, ConfigLoader};
use crate::matrix::diff::{diff, render_diff_json, render_diff_markdown, MatrixDiff};
use crate::matrix::{EvidenceRule, MatrixDoc};
use crate::meter::slo::SloTargets;
use crate::proxy::ask::DEADLINE as DISCOVERY_TIMEOUT;
use crate::proxy::Proxy;
use crate::sim::from_matrix::{profile_from_matrix, FromMatrixOptions};
use crate::sim::{Profile, SimHandle, SimOptions, SimServer};
use crate::sweep::discover::discover;
use crate::sweep::progress::ProgressLine;
use crate::synthetic::{LoadGauges, ProxyPath, ServerLoad};
use crate::workload::Trace;

use super::workload::read_trace_file;
use crate::workload::replay::{replay, ReplayPlan, ReplayProgress, ReplayReport};
use crate::workload::speed::{speed, SearchBounds, SpeedReport, SpeedSearch, SpeedTrial};

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
    /// Stop after this long (`90s`, `10m`); streams in flight are disconnected. With
    /// --find-speed it bounds each replay (default: the trace's span at that speed + 60 s).
    #[arg(long, value_name = "DURATION")]
    pub max_duration: Option<String>,
    /// The model every request names. Default: the trace's first model, else the simulator's,
    /// else the first one the server's /v1/models lists.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// SLO targets for every request, e.g. ttft=500ms,tbt=50ms (sent as x-tokentap-slo); the
    /// matrix then shows SLO attainment and goodput per cell.
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// Search for the largest speed-up (from --speed, doubling up to --max-speed, then
    /// bisecting) at which the share of requests meeting every --slo target stays at or above
    /// --attainment. Reports that speed, the step above it where the SLO fails, and every
    /// replay run; writes the matrix of the fastest passing replay.
    #[arg(long, requires = "slo")]
    pub find_speed: bool,
    /// With --find-speed: the share of requests that must meet every target.
    #[arg(long, value_name = "SHARE", default_value_t = 0.95)]
    pub attainment: f64,
    /// With --find-speed: the highest speed tried.
    #[arg(long, value_name = "FACTOR", default_value_t = 64.0)]
    pub max_speed: f64,
    /// With --find-speed: bisection stops when the failing speed is within this fraction of
    /// the passing one (0.1: within 10 %).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1)]
    pub resolution: f64,
    /// The original production matrix (JSON from `/matrix?format=json`, or any matrix file):
    /// the replay is diffed against it (ratios are replay ÷ baseline).
    #[arg(long, value_name = "MATRIX")]
    pub baseline: Option<PathBuf>,
    /// Seeds the prompts (another seed shares no prompt block with this one's).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory for replay.{json,html,md}, diff.{md,json} and find-speed.{md,json}.
    #[arg(long, value_name = "DIR", default_value = "tokentap-replay")]
    pub out: PathBuf,
    /// Configuration file: its upstream and metering sections (ladders, `[slo]`) apply.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// What is printed on stdout at the end (the replay's matrix, then the diff; with
    /// --find-speed its summary): table (aligned, at most 120 columns), list, md, json (the
    /// matrix tokentap.matrix/v1, the search tokentap.find-speed/v1) or llmd (the matrix as
    /// llm-d benchmark reports, one per measured cell; the diff and the search as json).
    /// Default: table on a terminal, md otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Auto)]
    pub format: OutputFormat,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// How long a --find-speed replay may run past the trace's last arrival before the streams
/// still in flight are disconnected (they are then judged on what they saw).
const DRAIN_ALLOWANCE: Duration = Duration::from_secs(60);

/// Longest wait, between two --find-speed replays against --target, for the server to finish
/// what the previous replay left running.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// `tokentap replay`.
pub async fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
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
    // Parsed here as the proxy will parse the header, so a bad value is an error now rather
    // than a header the proxy ignores.
    let slo = match &args.slo {
        Some(text) => Some(
            SloTargets::parse_header(text.as_bytes())
                .map_err(|e| anyhow::anyhow!("--slo {text:?}: {e}"))?,
        ),
        None => None,
    };
    let slo_header = match &args.slo {
        Some(text) => Some(
            HeaderValue::from_str(text)
                .map_err(|_| anyhow::anyhow!("--slo {text:?}: not a header value"))?,
        ),
        None => None,
    };
    let deployment = Deployment::from_args(&args)?;

    let (stop_tx, stop) = watch::channel(false);
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = stop_tx.send(true);
        }
    });
    let common = Common {
        args: &args,
        trace: &trace,
        deployment: &deployment,
        stop,
    };
    let result = match (args.find_speed, slo) {
        (true, Some(slo)) => {
            find_speed(&common, &slo, slo_header, max_duration, baseline.as_ref()).await
        }
        (true, None) => Err(anyhow::anyhow!("--find-speed needs --slo")),
        (false, _) => replay_once(&common, slo_header, max_duration, baseline.as_ref()).await,
    };
    ctrl_c.abort();
    result
}

/// What both ways of running share.
struct Common<'a> {
    args: &'a ReplayArgs,
    trace: &'a Trace,
    deployment: &'a Deployment,
    stop: watch::Receiver<bool>,
}

impl Common<'_> {
    /// The in-process proxy in front of `url`, configured like `tokentap serve` would be, and
    /// the evidence rule its replay matrix is judged by (`[evidence]`). A `--target` where
    /// nothing listens is said once, before the proxy's readers would each warn about it.
    async fn proxy(&self, url: &str) -> anyhow::Result<(Arc<Proxy>, EvidenceRule)> {
        let config = self.config(url)?;
        if self.deployment.target.is_some() {
            super::sweep::check_target(&config).await?;
        }
        Ok((build_proxy(&config)?, config.evidence))
    }

    /// The configuration of the in-process proxy in front of `url`.
    fn config(&self, url: &str) -> anyhow::Result<Config> {
        let mut loader = ConfigLoader::new();
        if let Some(path) = &self.args.config {
            loader = loader.file(path)?;
        }
        let config = loader
            .process_env()?
            .flag(
                "upstream",
                "url",
                toml::Value::String(url.to_owned()),
                "--target",
            )
            .load()?;
        Ok(config)
    }

    /// The model every request names: `--model`, the trace's, the simulator's, else the first
    /// model the server lists.
    async fn model(&self, proxy: &Arc<Proxy>, url: &str) -> anyhow::Result<String> {
        if let Some(model) = self
            .args
            .model
            .clone()
            .or_else(|| self.trace.requests.iter().find_map(|r| r.model.clone()))
            .or_else(|| self.deployment.served_model())
        {
            return Ok(model);
        }
        served_model(proxy).await.map_err(|why| {
            anyhow::anyhow!(
                "the trace names no model and {}/v1/models did not name one ({why}): give \
                 --model NAME, or point --target at a server that lists its model at /v1/models",
                crate::net::redact::redact_url(url).trim_end_matches('/')
            )
        })
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The first model the server lists (as `tokentap sweep` discovers it: one read of the
/// upstream, `proxy::describe`), or why there is none.
async fn served_model(proxy: &Arc<Proxy>) -> Result<String, String> {
    let facts = discover(&ProxyPath::new(Arc::clone(proxy))).await;
    if !facts.answered {
        return Err("it answered nothing".to_owned());
    }
    facts
        .served_model
        .ok_or_else(|| "it lists no model".to_owned())
}

/// One replay at `--speed`: the matrix, and the diff against `--baseline`.
async fn replay_once(
    common: &Common<'_>,
    slo_header: Option<HeaderValue>,
    max_duration: Option<Duration>,
    baseline: Option<&MatrixDoc>,
) -> anyhow::Result<ExitCode> {
    let args = common.args;
    let (sim, url) = common.deployment.start().await?;
    let (proxy, evidence) = common.proxy(&url).await?;
    let model = match common.model(&proxy, &url).await {
        Ok(model) => model,
        Err(error) => {
            if let Some(sim) = sim {
                sim.shutdown().await;
            }
            return Err(error);
        }
    };
    let plan = ReplayPlan {
        speed: args.speed,
        max_requests: args.max_requests,
        max_duration,
        model,
        slo_header,
        seed: args.seed,
        evidence,
    };
    if !args.quiet {
        // Broken between words within 120 columns (a long trace path or URL).
        eprint!(
            "{}",
            indented_wrap(
                &format!(
                    "tokentap replay: {} request(s) of {} at {}× against {} through an in-process proxy; Ctrl-C stops",
                    planned(common.trace, &plan),
                    args.trace.display(),
                    args.speed,
                    crate::net::redact::redact_url(&url),
                ),
                "",
                "  ",
                120
            )
        );
    }
    let report = replay_at(common, proxy, &plan, "").await;
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
    warn_failures(&report);
    let Some(matrix) = report.matrix else {
        bail!("the replay recorded no request");
    };
    print!("{}", args.format.matrix(&matrix));
    let mut written = write_matrix(&args.out, "replay", &matrix)?;
    if let Some(baseline) = baseline {
        let compared = write_diff(args, baseline, &matrix, &mut written)?;
        print!("\n{}", args.format.diff(&compared));
    }
    print_written(&written);
    Ok(if report.stopped && max_duration.is_none() {
        ExitCode::from(EXIT_CANCELLED)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--find-speed`: replays at the speeds the search proposes, each against a fresh simulator
/// (or, with `--target`, once the server has finished the previous replay's requests), each
/// with its own prompt seed so that no replay hits the prefix cache of another.
///
/// Requests are judged by the proxy: the targets travel as `x-tokentap-slo` on every request
/// and each record carries its verdict, as production's do. That is one judge for the search,
/// the replay's matrix (SLO attainment per cell) and production, rather than a second reading
/// of the records that could drift from it; the tally only counts verdicts (and judges each
/// target alone, with the same `SloTargets::judge`, to say which one limits).
async fn find_speed(
    common: &Common<'_>,
    slo: &SloTargets,
    slo_header: Option<HeaderValue>,
    max_duration: Option<Duration>,
    baseline: Option<&MatrixDoc>,
) -> anyhow::Result<ExitCode> {
    let args = common.args;
    if !(args.attainment.is_finite() && args.attainment > 0.0 && args.attainment <= 1.0) {
        bail!("--attainment must be in (0, 1], got {}", args.attainment);
    }
    if !(args.max_speed.is_finite() && args.max_speed >= args.speed) {
        bail!(
            "--max-speed must be at least --speed ({}), got {}",
            args.speed,
            args.max_speed
        );
    }
    if !(args.resolution.is_finite() && args.resolution > 0.0) {
        bail!("--resolution must be positive, got {}", args.resolution);
    }
    let bounds = SearchBounds {
        start: args.speed,
        cap: args.max_speed,
        floor: args.speed / 16.0,
        resolution: args.resolution,
    };
    let mut search = SpeedSearch::new(bounds);
    let mut trials: Vec<SpeedTrial> = Vec::new();
    let mut fastest_held: Option<(f64, MatrixDoc)> = None;
    let mut model = args.model.clone();
    let mut settle: Option<ServerLoad> = None;
    let mut cancelled = false;
    let span_ms = common
        .trace
        .requests
        .get(
            ..args
                .max_requests
                .unwrap_or(usize::MAX)
                .min(common.trace.requests.len()),
        )
        .and_then(|r| r.last())
        .map_or(0, |r| r.at_ms);
    if !args.quiet {
        eprint!(
            "{}",
            indented_wrap(
                &format!(
                    "tokentap replay --find-speed: {} against {}, at most {} replays",
                    args.trace.display(),
                    common.deployment.label,
                    bounds.max_replays()
                ),
                "",
                "  ",
                120
            )
        );
    }
    while let Some(at) = search.next() {
        if trials.len() >= bounds.max_replays() {
            break;
        }
        if common.stopped() {
            cancelled = true;
            break;
        }
        let (sim, url) = common.deployment.start().await?;
        let (proxy, evidence) = common.proxy(&url).await?;
        if sim.is_none() {
            // The same server replay after replay: wait until it has finished the last one.
            if settle.is_none() {
                let facts = discover(&ProxyPath::new(Arc::clone(&proxy))).await;
                let metrics = facts.engine.map(|engine| engine.spec().metrics);
                settle = metrics
                    .and_then(|m| m.running.first().copied())
                    .map(|running| ServerLoad {
                        path: ProxyPath::shared(Arc::clone(&proxy)),
                        model: Arc::from(facts.served_model.as_deref().unwrap_or_default()),
                        gauges: LoadGauges {
                            running,
                            queued: metrics.and_then(|m| m.queued.first().copied()),
                            timeout: DISCOVERY_TIMEOUT,
                        },
                    });
            } else if let Some(load) = &settle {
                wait_idle(load).await;
            }
        }
        let resolved = match &model {
            Some(model) => Ok(model.clone()),
            None => common.model(&proxy, &url).await,
        };
        let name = match resolved {
            Ok(name) => name,
            Err(error) => {
                if let Some(sim) = sim {
                    sim.shutdown().await;
                }
                return Err(error);
            }
        };
        model = Some(name.clone());
        let bound = max_duration.unwrap_or_else(|| {
            Duration::from_secs_f64(span_ms as f64 / 1000.0 / at) + DRAIN_ALLOWANCE
        });
        let plan = ReplayPlan {
            speed: at,
            max_requests: args.max_requests,
            max_duration: Some(bound),
            model: name,
            slo_header: slo_header.clone(),
            seed: args.seed.wrapping_add(trials.len() as u64),
            evidence,
        };
        let started = Instant::now();
        let report = replay_at(common, proxy, &plan, &format!("{}× ", speed(at))).await;
        if let Some(sim) = sim {
            sim.shutdown().await;
        }
        if common.stopped() {
            // Ctrl-C: this replay was cut short; it is not a measurement.
            cancelled = true;
            break;
        }
        warn_failures(&report);
        let mut trial = SpeedTrial::new(
            at,
            planned(common.trace, &plan),
            report.sent,
            &report.tally,
            args.attainment,
        );
        trial.failed = report.failed;
        trial.stopped = report.stopped;
        trial.seconds = started.elapsed().as_secs_f64();
        if !args.quiet {
            eprintln!(
                "tokentap replay --find-speed: {}×: attainment {:.1} % ({} of {}), TTFT p95 {} ms: {}",
                speed(at),
                trial.attainment * 100.0,
                trial.met,
                trial.requests,
                trial
                    .ttft_p95_ms
                    .map_or("—".to_owned(), |ms| format!("{ms:.0}")),
                if trial.held { "holds" } else { "fails" },
            );
        }
        search.record(at, trial.held);
        if trial.held && fastest_held.as_ref().is_none_or(|(s, _)| at > *s) {
            if let Some(matrix) = report.matrix {
                fastest_held = Some((at, matrix));
            }
        }
        trials.push(trial);
    }

    let mut summary = SpeedReport::new(
        &search,
        trials,
        args.trace.display().to_string(),
        common.deployment.label.clone(),
        slo,
        args.attainment,
    );
    summary.stopped = cancelled;
    let markdown = summary.render_markdown();
    let json = summary.render_json();
    // The search's summary: its JSON, the aligned table (table, list) or Markdown.
    if args.format.machine() {
        print!("{json}");
    } else if matches!(
        args.format.resolve(),
        OutputFormat::Table | OutputFormat::List
    ) {
        print!("{}", summary.render_table());
    } else {
        print!("{markdown}");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create the output directory {}", args.out.display()))?;
    let mut written = Vec::new();
    for (name, text) in [("find-speed.md", &markdown), ("find-speed.json", &json)] {
        let path = args.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    match &fastest_held {
        Some((_, matrix)) => {
            written.extend(write_matrix(&args.out, "replay", matrix)?);
            if let Some(baseline) = baseline {
                write_diff(args, baseline, matrix, &mut written)?;
            }
        }
        None => eprintln!(
            "tokentap replay --find-speed: no replay met the SLO, so no replay matrix is written"
        ),
    }
    print_written(&written);
    Ok(if cancelled {
        ExitCode::from(EXIT_CANCELLED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs one replay with its progress line (`prefix` names the speed during a search).
async fn replay_at(
    common: &Common<'_>,
    proxy: Arc<Proxy>,
    plan: &ReplayPlan,
    prefix: &str,
) -> ReplayReport {
    let mut line = ProgressLine::new(!common.args.quiet);
    let report = replay(
        ProxyPath::shared(proxy),
        common.trace,
        plan,
        common.stop.clone(),
        |p| {
            line.message(
                &format!("{prefix}{}", progress_text(&p)),
                Some((p.finished, p.total)),
            );
        },
    )
    .await;
    line.done();
    report
}

/// Waits (at most [`SETTLE_LIMIT`]) until the server runs and queues nothing.
async fn wait_idle(load: &ServerLoad) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    while Instant::now() < deadline {
        match load.read().await {
            Some((running, queued)) if running + queued >= 0.5 => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            _ => return,
        }
    }
}

/// Requests the plan sends when nothing stops it.
fn planned(trace: &Trace, plan: &ReplayPlan) -> usize {
    plan.max_requests
        .unwrap_or(usize::MAX)
        .min(trace.requests.len())
}

fn warn_failures(report: &ReplayReport) {
    if report.failed > 0 {
        eprintln!(
            "tokentap replay: {} of {} stream(s) failed; the first: {}",
            report.failed,
            report.sent,
            report.first_failure.as_deref().unwrap_or("?")
        );
    }
}

/// Writes diff.{md,json} (replay ÷ baseline) and returns the Markdown.
fn write_diff(
    args: &ReplayArgs,
    baseline: &MatrixDoc,
    matrix: &MatrixDoc,
    written: &mut Vec<String>,
) -> anyhow::Result<MatrixDiff> {
    let mut compared = diff(baseline, matrix);
    compared.a.label = args
        .baseline
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    compared.b.label = "replay".into();
    for (name, text) in [
        ("diff.md", render_diff_markdown(&compared)),
        ("diff.json", render_diff_json(&compared)),
    ] {
        let path = args.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(compared)
}

/// What the replay runs against: a server, or a simulator profile started per replay.
struct Deployment {
    target: Option<String>,
    profile: Option<Profile>,
    /// How the reports name it.
    label: String,
}

impl Deployment {
    /// The deployment `--target`, `--simulate` or `--from-matrix` names.
    fn from_args(args: &ReplayArgs) -> anyhow::Result<Self> {
        if let Some(name) = &args.simulate {
            let profile = Profile::load(name)
                .with_context(|| format!("loading simulator profile `{name}`"))?;
            return Ok(Self {
                target: None,
                profile: Some(profile),
                label: format!("simulator of profile {name}"),
            });
        }
        if let Some(path) = &args.from_matrix {
            let doc =
                crate::matrix::load(path).context("reading the matrix given to --from-matrix")?;
            let options = FromMatrixOptions {
                tokens_per_event: None,
                origin: path.display().to_string(),
            };
            let profile = profile_from_matrix(&doc, &options)
                .with_context(|| format!("building a simulator profile from {}", path.display()))?
                .0;
            return Ok(Self {
                target: None,
                profile: Some(profile),
                label: format!("simulator built from {}", path.display()),
            });
        }
        match &args.target {
            Some(url) => Ok(Self {
                target: Some(url.clone()),
                profile: None,
                label: crate::net::redact::redact_url(url),
            }),
            None => bail!("give --target, --simulate or --from-matrix"),
        }
    }

    /// The model the simulator serves (`None` for a server).
    fn served_model(&self) -> Option<String> {
        self.profile
            .as_ref()
            .map(|p| p.model.served_model_name.clone())
    }

    /// A fresh simulator (with its URL), or the server's URL.
    async fn start(&self) -> anyhow::Result<(Option<SimHandle>, String)> {
        match (&self.profile, &self.target) {
            (Some(profile), _) => {
                let options = SimOptions {
                    enable_cache_report: true,
                    ..SimOptions::default()
                };
                let sim = SimServer::start(profile.clone(), options)
                    .await
                    .context("starting the embedded simulator")?;
                let url = sim.base_url();
                Ok((Some(sim), url))
            }
            (None, Some(url)) => Ok((None, url.clone())),
            (None, None) => bail!("give --target, --simulate or --from-matrix"),
        }
    }
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

/// The files written, one path a line on stderr: a long path is never wrapped in the middle
/// of a name among others on a 120-column terminal (as `tokentap sweep` prints them).
fn print_written(written: &[String]) {
    eprintln!("tokentap replay: wrote");
    for path in written {
        eprintln!("  {path}");
    }
}
