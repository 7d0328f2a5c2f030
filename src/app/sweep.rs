//! `tokentap sweep`: standalone (`--target URL`, through an in-process instance of the proxy's
//! data path) or on a running proxy (`--admin URL`, through its admin API). Shows progress
//! with the current cell and an ETA on stderr, then prints the matrix on stdout (`--format`:
//! an aligned table on a terminal, Markdown otherwise) and writes it as JSON, HTML and Markdown
//! files. Ctrl-C cancels the sweep (its streams are
//! aborted) and still writes what was measured.

use crate::base::error::error_chain as chain;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::output::{indented_wrap, OutputFormat};
use crate::config::{Config, ConfigLoader};
use crate::matrix::{html::render_html, render_json, render_markdown, MatrixDoc};
use crate::sweep::manager::SweepManager;
use crate::sweep::plan::{DurationValue, PromptMode, SweepRequest, TokensValue};
use crate::sweep::progress::ProgressLine;
use crate::sweep::status::{SweepState, SweepStatus};

/// Exit code when the sweep was cancelled (Ctrl-C), as shells report SIGINT.
pub const EXIT_CANCELLED: u8 = 130;

/// Arguments of `tokentap sweep` (the command's help text is on its `Command` variant).
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("server").required(true).args(["target", "admin"])))]
pub struct SweepArgs {
    /// Sweep this inference server directly, through an in-process instance of the proxy's
    /// metering path (nothing is listening). Either --target or --admin is required.
    #[arg(long, value_name = "URL", conflicts_with = "admin")]
    pub target: Option<String>,
    /// Start the sweep on a running `tokentap serve` through its admin API (e.g.
    /// http://127.0.0.1:9464) and follow it; production traffic keeps flowing and the
    /// proxy's production guard applies. Several URLs, comma-separated, sweep a fleet: the
    /// replicas one at a time, each through its own sidecar (and its own guard), then each
    /// replica's matrix and the spread per cell (min, median, max ÷ median) are printed.
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    /// Bearer token of the admin API (that proxy's admin.token). Default: the
    /// TOKENTAP_ADMIN__TOKEN environment variable.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TOKENTAP_ADMIN__TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// With --admin: follow the sweep with this id instead of starting one.
    #[arg(long, value_name = "ID", requires = "admin")]
    pub follow: Option<String>,
    /// Decode contexts, comma-separated (8K = 8192 tokens). Default: 8K doubling up to the
    /// top context (context length − max output − 1024), plus the top context, and a prefill
    /// row at the full context length.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub contexts: Vec<String>,
    /// Concurrency levels, comma-separated. Default 1,2,4,8,16,32,64,128.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub concurrency: Vec<u32>,
    /// Measurement window per cell (500ms, 30s, 2m). Default sweep.cell_duration (30s).
    #[arg(long, value_name = "DURATION")]
    pub cell_duration: Option<String>,
    /// max_tokens of every decode stream. Default sweep.max_output (4096).
    #[arg(long, value_name = "TOKENS")]
    pub max_output: Option<u64>,
    /// KV budget in tokens for the Over-capacity rule. Default: what the server reports
    /// (sglang /server_info max_total_num_tokens, vLLM cache_config_info), else
    /// sweep.kv_budget_tokens; 0 skips nothing.
    #[arg(long, value_name = "TOKENS")]
    pub kv_budget: Option<u64>,
    /// Cap the default context ladder at this context (e.g. 64K). Default: no cap.
    #[arg(long, value_name = "TOKENS")]
    pub max_context: Option<String>,
    /// Measure prefill at the full context length too (true/false). Default: true with the
    /// default ladder and no --max-context, false otherwise.
    #[arg(long, value_name = "BOOL")]
    pub full_context_prefill: Option<bool>,
    /// The model to request. Default: the first model of the server's /v1/models.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// How exact-length prompts are made. Default auto (token ids, else text calibrated with
    /// /tokenize).
    #[arg(long, value_enum, value_name = "MODE")]
    pub prompt: Option<PromptMode>,
    /// SLO targets for the sweep's streams, e.g. ttft=500ms,tbt=50ms,e2e=30s (sent as the
    /// x-tokentap-slo header, replacing the configured `[slo]` targets); the matrix then shows
    /// SLO attainment and goodput per cell. Default: the configured targets, if any.
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// Search each context for its capacity under --slo instead of running the whole
    /// concurrency ladder: bracket by doubling, then bisect on the ladder (the KV budget bounds
    /// it), measuring only the cells the answer needs; prints the boundary per context with
    /// the cells it measured (docs/capacity.md). Needs --slo.
    #[arg(long, requires = "slo")]
    pub find_capacity: bool,
    /// With --find-capacity: the share of a cell's streams that must meet the SLO (0–1).
    /// Default 0.95.
    #[arg(long, value_name = "SHARE", requires = "find_capacity")]
    pub attainment: Option<f64>,
    /// With --find-capacity: what a cell is judged by: auto (its streams' SLO attainment),
    /// attainment, median, p90 or p99. Default auto.
    #[arg(long, value_name = "BASIS", requires = "find_capacity")]
    pub capacity_basis: Option<String>,
    /// Directory for matrix.json, matrix.html and matrix.md. Default: the store's folder,
    /// <store.data_dir>/sweeps/tokentap-sweep-ID (the sweep's id), or a temporary folder when
    /// no store is configured; the path is printed.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Configuration file: its sweep section gives the defaults; with --target its upstream and
    /// metering sections apply too.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Set any key of config/tokentap.toml for this run, e.g. --set sweep.production_guard=8
    /// (repeatable; over the file and the environment). With --admin only the sweep section's
    /// defaults matter: the proxy's own configuration applies there.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// What is printed on stdout at the end: table (aligned, at most 120 columns), list, md
    /// (the seed page's layout), json or llmd (llm-d benchmark reports, one per measured cell).
    /// Default: table on a terminal, md otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Auto)]
    pub format: OutputFormat,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Show what the sweep would do — its cells, largest prompt, KV cache use and expected
    /// duration — and start nothing (with --admin: POST /sweeps?dry_run=true).
    #[arg(long, conflicts_with = "follow")]
    pub dry_run: bool,
    /// Start even while production requests are in flight through the proxy (a start is
    /// refused then, with the count): the sweep slows them, and its cells show the production
    /// they ran beside. Better: drain the replica first.
    #[arg(long)]
    pub beside_production: bool,
    /// Shape the cells like production's traffic of the model: per context, the cached share
    /// of the prompt production shows, the rest cold and unique per request, output lengths
    /// drawn from production's (needs production through the proxy: --admin). Its cells are
    /// labelled like-production and never compared with seed-method sweeps. --find-capacity
    /// uses it when production has evidence; --seed-method keeps the seed tool's shape.
    #[arg(long, conflicts_with = "seed_method")]
    pub like_production: bool,
    /// With --find-capacity: measure with the seed tool's identical warm streams even when
    /// production has evidence for the model.
    #[arg(long)]
    pub seed_method: bool,
}

impl SweepArgs {
    /// The sweep plan these flags describe.
    pub fn request(&self) -> SweepRequest {
        SweepRequest {
            contexts: (!self.contexts.is_empty()).then(|| {
                self.contexts
                    .iter()
                    .map(|c| TokensValue::Label(c.trim().to_owned()))
                    .collect()
            }),
            concurrency: (!self.concurrency.is_empty()).then(|| self.concurrency.clone()),
            cell_duration: self.cell_duration.clone().map(DurationValue::Text),
            max_output: self.max_output,
            kv_budget_tokens: self.kv_budget,
            max_context: self.max_context.clone().map(TokensValue::Label),
            full_context_prefill: self.full_context_prefill,
            model: self.model.clone(),
            prompt: self.prompt,
            slo: self.slo.clone(),
            find_capacity: self.find_capacity.then_some(true),
            attainment: self.attainment,
            capacity_basis: self.capacity_basis.clone(),
            beside_production: self.beside_production.then_some(true),
            like_production: if self.like_production {
                Some(true)
            } else if self.seed_method {
                Some(false)
            } else {
                None
            },
        }
    }

    fn load_config(&self) -> anyhow::Result<Config> {
        let mut loader = ConfigLoader::new();
        if let Some(path) = &self.config {
            loader = loader.file(path)?;
        }
        loader = loader.process_env()?.set_args(&self.set)?;
        if let Some(url) = &self.target {
            loader = loader.flag(
                "upstream",
                "url",
                toml::Value::String(url.clone()),
                "--target",
            );
        }
        Ok(loader.load()?)
    }
}

/// `tokentap sweep`.
pub async fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let admins = args.admin.as_deref().map(admin_urls).unwrap_or_default();
    if args.dry_run {
        return dry_run(&args, &admins).await;
    }
    if admins.len() > 1 {
        return run_fleet(&args, &admins).await;
    }
    let status = match admins.first() {
        Some(admin) => run_remote(&args, admin).await?,
        None => run_local(&args).await?,
    };
    finish(&args, &status)
}

/// `tokentap sweep --dry-run`: each server's plan preview (the in-process proxy's with
/// --target, each admin's otherwise), printed, nothing started.
async fn dry_run(args: &SweepArgs, admins: &[String]) -> anyhow::Result<ExitCode> {
    let mut previews = Vec::new();
    if admins.is_empty() {
        let config = args.load_config()?;
        check_target(&config).await?;
        let proxy = super::proxy::build_proxy(&config)?;
        let manager = SweepManager::in_memory(
            crate::synthetic::ProxyPath::shared(proxy),
            config.sweep.clone(),
        );
        let preview = manager
            .preview(&args.request())
            .await
            .map_err(|error| anyhow::anyhow!("{}", chain(&error)))?;
        previews.push((args.target.clone().unwrap_or_default(), preview));
    }
    for url in admins {
        let admin = Admin::new(url, args.token.clone());
        let plan = serde_json::to_string(&args.request())?;
        let (status, body) = admin
            .send(Method::POST, "/sweeps?dry_run=true", Some(plan))
            .await?;
        if status != StatusCode::OK {
            return Err(admin.refusal(&Method::POST, "/sweeps?dry_run=true", status, &body));
        }
        let preview: crate::sweep::PlanPreview =
            serde_json::from_slice(&body).with_context(|| {
                format!(
                    "{}/sweeps?dry_run=true: not a preview this tokentap reads",
                    admin.base
                )
            })?;
        previews.push((crate::net::redact::redact_url(url), preview));
    }
    if args.format.machine() {
        let out: Vec<serde_json::Value> = previews
            .iter()
            .map(|(server, preview)| serde_json::json!({"server": server, "preview": preview}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for (server, preview) in &previews {
            println!("Dry run against {server}: nothing was started.");
            // Within 120 columns: a long line (a note, production in flight) is broken
            // between words, its continuation indented under it.
            for line in preview.lines() {
                print!("{}", indented_wrap(&line, "  ", "    ", 120));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The admin URLs of `--admin` (comma-separated, blanks dropped).
pub fn admin_urls(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `tokentap sweep --admin URL1,URL2,…`: the replicas one at a time through their own
/// sidecars, then each replica's matrix and the spread per cell. Ctrl-C cancels the running
/// replica's sweep and sweeps no further replica. Exit code 0 when every replica finished with
/// a measurement, 130 when cancelled, 1 otherwise.
async fn run_fleet(args: &SweepArgs, admins: &[String]) -> anyhow::Result<ExitCode> {
    use crate::fleet::spread::{fleet_spread, render_spread_json, render_spread_markdown};
    if args.follow.is_some() {
        bail!("--follow follows one sweep: give one --admin URL with it");
    }
    let mut replicas: Vec<(String, SweepStatus)> = Vec::new();
    let mut failures = Vec::new();
    let mut cancelled = false;
    for (i, admin) in admins.iter().enumerate() {
        if !args.quiet {
            eprintln!(
                "tokentap sweep: replica {} of {}: {}",
                i + 1,
                admins.len(),
                crate::net::redact::redact_url(admin)
            );
        }
        match run_remote(args, admin).await {
            Ok(status) => {
                let state = status.state;
                replicas.push((admin.clone(), status));
                if state == SweepState::Cancelled {
                    cancelled = true;
                    break;
                }
            }
            Err(error) => failures.push(format!(
                "{}: {error:#}",
                crate::net::redact::redact_url(admin)
            )),
        }
    }
    let docs: Vec<(String, MatrixDoc)> = replicas
        .iter()
        .filter_map(|(admin, status)| {
            Some((
                crate::net::redact::redact_url(admin),
                status.matrix.clone()?,
            ))
        })
        .collect();
    let spread = fleet_spread(&docs);
    let dir = args.out.clone().unwrap_or_else(|| {
        default_out(
            args,
            &format!(
                "fleet-{}",
                replicas.first().map_or("none", |(_, s)| s.id.as_str())
            ),
        )
    });
    let mut written = Vec::new();
    for (i, (_, status)) in replicas.iter().enumerate() {
        if let Some(matrix) = &status.matrix {
            written.extend(write_matrix(&dir, &format!("replica-{}", i + 1), matrix)?);
        }
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    for (name, text) in [
        ("spread.json", render_spread_json(&spread)),
        ("spread.md", render_spread_markdown(&spread)),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    if args.format.resolve() == OutputFormat::Llmd {
        // One array of every replica's reports (each replica's sweep is its own experiment).
        let reports: Vec<serde_json::Value> = replicas
            .iter()
            .filter_map(|(_, status)| status.matrix.as_ref())
            .flat_map(crate::matrix::llmd::reports)
            .collect();
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else if args.format.resolve() == OutputFormat::Json {
        let replicas_json: Vec<serde_json::Value> = replicas
            .iter()
            .map(|(admin, status)| {
                serde_json::json!({
                    "admin": crate::net::redact::redact_url(admin),
                    "sweep_id": status.id,
                    "state": status.state.as_str(),
                    "matrix": status.matrix,
                })
            })
            .collect();
        let out = serde_json::json!({
            "schema": "tokentap.fleet-sweep/v1",
            "replicas": replicas_json,
            "failures": failures,
            "spread": spread,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for (i, (admin, status)) in replicas.iter().enumerate() {
            println!(
                "## Replica R{}: {} (sweep {}, {})\n",
                i + 1,
                crate::net::redact::redact_url(admin),
                status.id,
                status.state.as_str()
            );
            if let Some(matrix) = &status.matrix {
                println!("{}", crate::matrix::render_markdown(matrix));
            }
        }
        print!("{}", render_spread_markdown(&spread));
    }
    print_written(&written);
    for failure in &failures {
        eprintln!("tokentap sweep: {failure}");
    }
    let all_measured = replicas.len() == admins.len()
        && replicas.iter().all(|(_, status)| {
            status.state == SweepState::Finished
                && status.matrix.as_ref().is_some_and(|m| {
                    m.prefill.iter().any(|r| r.status.is_valid())
                        || m.decode.iter().any(|c| c.status.is_valid())
                })
        });
    Ok(if cancelled {
        ExitCode::from(EXIT_CANCELLED)
    } else if all_measured {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Prints the matrix and writes the files; the exit code says how the sweep ended (0 finished
/// with at least one valid measurement, 130 cancelled, 1 otherwise).
fn finish(args: &SweepArgs, status: &SweepStatus) -> anyhow::Result<ExitCode> {
    let Some(matrix) = &status.matrix else {
        bail!(
            "sweep {} {}: {}",
            status.id,
            status.state.as_str(),
            status.error.as_deref().unwrap_or("no matrix")
        );
    };
    print!("{}", args.format.matrix(matrix));
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| default_out(args, &status.id));
    let mut written = write_matrix(&dir, "matrix", matrix)?;
    if let Some(report) = &status.capacity {
        print!(
            "\n{}",
            crate::matrix::capacity::render_capacity_markdown(report)
        );
        let path = dir.join("capacity.json");
        std::fs::write(&path, crate::matrix::capacity::render_capacity_json(report))
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    print_written(&written);
    let measured = matrix.prefill.iter().any(|r| r.status.is_valid())
        || matrix.decode.iter().any(|c| c.status.is_valid());
    Ok(match status.state {
        SweepState::Finished if measured => ExitCode::SUCCESS,
        SweepState::Finished => {
            eprintln!("tokentap sweep: no measurement succeeded (every row is an Error)");
            ExitCode::FAILURE
        }
        SweepState::Cancelled => ExitCode::from(EXIT_CANCELLED),
        _ => ExitCode::FAILURE,
    })
}

/// The files written, one path a line: a long path is never wrapped in the middle of a name
/// among others on a 120-column terminal.
fn print_written(written: &[String]) {
    eprintln!("tokentap sweep: wrote");
    for path in written {
        eprintln!("  {path}");
    }
}

/// Where a sweep's files go without `--out`: under the configured store's folder
/// (`<store.data_dir>/sweeps/<id>`, the default `tokentap-data/` is git-ignored in a checkout),
/// else a temporary folder; never loose in the current directory. The path is printed.
fn default_out(args: &SweepArgs, id: &str) -> PathBuf {
    let name = format!("tokentap-sweep-{id}");
    match args.load_config().ok().and_then(|c| c.store.data_dir) {
        Some(data_dir) => data_dir.join("sweeps").join(name),
        None => std::env::temp_dir().join(name),
    }
}

/// Writes `<dir>/<stem>.{json,html,md}` and returns the paths.
pub fn write_matrix(dir: &Path, stem: &str, matrix: &MatrixDoc) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    let mut written = Vec::new();
    for (extension, text) in [
        ("json", render_json(matrix)),
        ("html", render_html(matrix)),
        ("md", render_markdown(matrix)),
    ] {
        let path = dir.join(format!("{stem}.{extension}"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

/// Longest interval at which `tokentap sweep --target` reads the server's own state between the
/// sweep's own looks at its load (each asks the scraper for a read: `synthetic::server_load`), and
/// for a server whose running gauge the sweep does not know (then it never looks): at the 5 s
/// default a 10 s cell carried the previous cell's state for up to half its window.
const SWEEP_METRICS_INTERVAL: Duration = Duration::from_secs(1);

async fn run_local(args: &SweepArgs) -> anyhow::Result<SweepStatus> {
    let mut config = args.load_config()?;
    for upstream in &mut config.upstreams {
        if !upstream.metrics_interval.is_zero() {
            upstream.metrics_interval = upstream.metrics_interval.min(SWEEP_METRICS_INTERVAL);
        }
    }
    check_target(&config).await?;
    let proxy = super::proxy::build_proxy(&config)?;
    // The server's own state beside each cell, as `tokentap serve` has it (the scrapers end
    // with the proxy).
    crate::upstream_metrics::spawn_scrapers(&proxy.router, &proxy.meter);
    let manager = SweepManager::in_memory(
        crate::synthetic::ProxyPath::shared(proxy),
        config.sweep.clone(),
    );
    let id = manager
        .start(args.request())
        .await
        .map_err(|error| anyhow::anyhow!("{}", chain(&error)))?;
    if !args.quiet {
        eprintln!(
            "tokentap sweep {id}: {} through an in-process proxy; Ctrl-C cancels",
            config
                .upstreams
                .first()
                .map(|u| u.url.to_string())
                .unwrap_or_default()
        );
    }
    follow_local(&manager, &id, !args.quiet).await
}

/// Before a `--target` sweep, one TCP connection to the inference server (the first
/// upstream, which `--target` sets), within its `connect_timeout`: a server that is not there
/// is said once — its URL, why, what to check — instead of through the in-process proxy's
/// readers and scrapers, each of which would warn about it first.
pub(super) async fn check_target(config: &Config) -> anyhow::Result<()> {
    let Some(upstream) = config.upstreams.first() else {
        return Ok(());
    };
    let url = &upstream.url;
    let shown = crate::net::redact::redact_url(&url.to_string());
    let shown = shown.trim_end_matches('/');
    let Some(host) = url.host() else {
        return Ok(());
    };
    // `[::1]` in a URL, `::1` to connect.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_u16().unwrap_or(match url.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    let wait = upstream.connect_timeout;
    let check = "is the inference server up, and is this its port? (sglang listens on 30000 by default, vLLM on 8000)";
    match tokio::time::timeout(wait, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => not_a_tokentap_admin(url, shown).await,
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
            bail!("nothing is listening at {shown} (connection refused): {check}")
        }
        Ok(Err(error)) => bail!("cannot connect to {shown} ({error}): {check}"),
        Err(_) => bail!(
            "{shown} did not accept a connection within {wait:?} (upstream.connect_timeout): {check}"
        ),
    }
}

/// A `--target` that is a tokentap admin listener (it answers `/v1/models` with its own
/// "no admin endpoint" 404) is said to be one, with the flag that takes it; anything else goes
/// on (the sweep's own reads then say what the server is).
async fn not_a_tokentap_admin(url: &http::Uri, shown: &str) -> anyhow::Result<()> {
    if url.scheme_str() != Some("http") {
        return Ok(());
    }
    let probe = Admin::new(&url.to_string(), None);
    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        probe.send(Method::GET, "/v1/models", None),
    )
    .await;
    let Ok(Ok((status, body))) = answer else {
        return Ok(());
    };
    let admins_own = status == StatusCode::NOT_FOUND
        && Admin::tokentap_message(&body).is_some_and(|m| m.starts_with("no admin endpoint"));
    if admins_own {
        bail!(
            "{shown} is a tokentap admin listener, not an inference server (it answered 404 \"no admin endpoint /v1/models\"): use --admin {shown} to sweep through that proxy, or give --target the inference server's URL (sglang listens on 30000 by default, vLLM on 8000)"
        );
    }
    Ok(())
}

/// Follows a sweep of `manager` to its end, cancelling it on Ctrl-C.
pub async fn follow_local(
    manager: &Arc<SweepManager>,
    id: &str,
    show_progress: bool,
) -> anyhow::Result<SweepStatus> {
    let mut progress = ProgressLine::new(show_progress);
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut cancelled = false;
    loop {
        let Some(status) = manager.get(id) else {
            bail!("sweep {id} vanished");
        };
        progress.show(&status);
        if !status.state.is_active() {
            progress.done();
            return Ok(status);
        }
        let mut changes = manager.subscribe(id);
        tokio::select! {
            _ = async {
                match changes.as_mut() {
                    Some(changes) => { let _ = changes.changed().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
            _ = ticker.tick() => {}
            _ = tokio::signal::ctrl_c(), if !cancelled => {
                cancelled = true;
                progress.done();
                eprintln!("cancelling sweep {id} …");
                let _ = manager.cancel(id);
            }
        }
    }
}

/// Nothing answered at the admin address: the whole message, without the exchange's prefix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConnectFailed(String);

/// A small client of a remote admin API (also used by `tokentap reference`).
pub struct Admin {
    pub base: String,
    token: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Admin {
    pub fn new(base: &str, token: Option<String>) -> Self {
        let base = base.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_owned()
        } else {
            format!("http://{base}")
        };
        Self {
            base,
            token,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let url = format!("{}{path}", self.base);
        // Messages show the URL without userinfo or query values.
        let shown = crate::net::redact::redact_url(&url);
        let mut builder = Request::builder().method(method.clone()).uri(&url);
        if let Some(token) = &self.token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .with_context(|| format!("{shown} is not a usable URL"))?;
        let base = crate::net::redact::redact_url(&self.base);
        let exchange = async {
            let response = self.client.request(request).await.map_err(|error| {
                if error.is_connect() {
                    // The usual mistake: nothing there, or the wrong port; say which address
                    // --admin wants rather than hyper's chain.
                    anyhow::Error::new(ConnectFailed(format!(
                        "cannot connect to {base} ({}): is `tokentap serve` running there? --admin takes the proxy's admin listener (admin.listen, default 127.0.0.1:9464)",
                        crate::base::error::error_chain(&error)
                            .rsplit(": ")
                            .next()
                            .unwrap_or("connection failed")
                    )))
                } else {
                    anyhow::Error::new(error)
                }
            })?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, anyhow::Error>((status, body))
        };
        match tokio::time::timeout(Duration::from_secs(30), exchange).await {
            Err(_) => anyhow::bail!("{method} {shown}: no answer within 30 s"),
            Ok(Err(error)) if error.is::<ConnectFailed>() => Err(error),
            Ok(result) => result.with_context(|| format!("{method} {shown}")),
        }
    }

    /// The error for an answer to `method path` other than the one wanted: what the admin
    /// API said, or, for a 404 or 405 not in tokentap's error shape (tokentap's admin answers
    /// every refusal as `{"error": {"message": …}}`, its "no sweep …" and "no reference …"
    /// included), that `base` is not a tokentap admin listener at all — an inference server
    /// or the proxy's data port given as `--admin` — and which flag takes what.
    pub fn refusal(
        &self,
        method: &Method,
        path: &str,
        status: StatusCode,
        body: &[u8],
    ) -> anyhow::Error {
        let message = Admin::message(body);
        let base = crate::net::redact::redact_url(&self.base);
        let unknown_route = matches!(
            status,
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
        );
        if let Some(admin) = Admin::data_listener_answer(body) {
            // The data port knew the route for tokentap's own: --admin names the wrong port.
            let there = admin.map_or_else(
                || "its admin.listen (default 127.0.0.1:9464)".to_owned(),
                |a| terminal_safe_line(&a),
            );
            return anyhow::anyhow!(
                "{base} is tokentap's data listener (it forwards to the engine), not its admin listener: --admin takes the admin listener, {there}"
            );
        }
        let tokentaps_own = Admin::tokentap_message(body).is_some();
        if unknown_route && !tokentaps_own {
            let said: String = message.trim().chars().take(200).collect();
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            return anyhow::anyhow!(
                "{base} is not a tokentap admin listener (it answered {} to {method} {path}{said}); --admin takes the proxy's admin address (default 127.0.0.1:9464), --target takes the inference server",
                status.as_u16()
            );
        }
        anyhow::anyhow!(
            "{}{path} answered {status}: {message}",
            crate::net::redact::redact_url(&self.base)
        )
    }

    /// The error message of an admin answer: tokentap's own, else the body as text.
    pub fn message(body: &[u8]) -> String {
        Admin::tokentap_message(body).unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
    }

    /// Whether `body` is the data port's 403 for an admin route
    /// (`proxy::error::ADMIN_ROUTE_KIND`), and the admin listener it names.
    fn data_listener_answer(body: &[u8]) -> Option<Option<String>> {
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        let error = value.get("error")?;
        (error.get("type")?.as_str()? == crate::proxy::error::ADMIN_ROUTE_KIND).then(|| {
            error
                .get("admin")
                .and_then(|a| a.as_str())
                .map(str::to_owned)
        })
    }

    /// The message of an error body in tokentap's shape (`{"error": {"message": …}}`), if it
    /// is one.
    fn tokentap_message(body: &[u8]) -> Option<String> {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()?
            .get("error")?
            .get("message")?
            .as_str()
            .map(str::to_owned)
    }
}

/// A server's word on one printable line, bounded (it came over the network).
fn terminal_safe_line(text: &str) -> String {
    crate::base::escape::terminal_safe(text, false)
        .chars()
        .take(200)
        .collect()
}

async fn run_remote(args: &SweepArgs, admin_url: &str) -> anyhow::Result<SweepStatus> {
    let admin = Admin::new(admin_url, args.token.clone());
    let id = match &args.follow {
        Some(id) => id.clone(),
        None => {
            let plan = serde_json::to_string(&args.request())?;
            let (status, body) = admin.send(Method::POST, "/sweeps", Some(plan)).await?;
            if status != StatusCode::ACCEPTED {
                return Err(admin.refusal(&Method::POST, "/sweeps", status, &body));
            }
            let answer: serde_json::Value = serde_json::from_slice(&body).with_context(|| {
                format!("{}/sweeps answered something that is not JSON", admin.base)
            })?;
            answer
                .get("id")
                .and_then(|i| i.as_str())
                .map(str::to_owned)
                .with_context(|| format!("{}/sweeps answered without an id", admin.base))?
        }
    };
    if !args.quiet {
        eprintln!("tokentap sweep {id} on {}; Ctrl-C cancels it", admin.base);
    }
    let mut progress = ProgressLine::new(!args.quiet);
    let mut cancelled = false;
    let path = format!("/sweeps/{id}");
    loop {
        let (code, body) = admin.send(Method::GET, &path, None).await?;
        if code != StatusCode::OK {
            return Err(admin.refusal(&Method::GET, &path, code, &body));
        }
        let status: SweepStatus = serde_json::from_slice(&body).with_context(|| {
            format!(
                "{}{path}: not a sweep status this tokentap reads",
                admin.base
            )
        })?;
        progress.show(&status);
        if !status.state.is_active() {
            progress.done();
            return Ok(status);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c(), if !cancelled => {
                cancelled = true;
                progress.done();
                eprintln!("cancelling sweep {id} …");
                let (code, body) = admin.send(Method::DELETE, &path, None).await?;
                if !code.is_success() {
                    eprintln!("cancel answered {code}: {}", Admin::message(&body));
                }
            }
        }
    }
}
