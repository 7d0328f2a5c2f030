//! Command-line entry: argument parsing and dispatch to each command's `run`.
//!
//! Each command's arguments live in its own module of `app`; this file only wires them
//! together, builds the tokio runtime and turns errors into exit codes.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::telemetry::logging::LogFormat;

/// tokentap: a metering reverse proxy for sglang, vLLM and any OpenAI-compatible server.
///
/// It forwards every request untouched, reads streamed responses as they pass and measures
/// time to first token, time between tokens, tok/s and prefill tok/s by prompt length and
/// live concurrency. On demand it runs a synthetic matrix sweep through the same path.
///
/// Start with `tokentap demo`: it runs everything on an embedded simulator.
#[derive(Debug, Parser)]
#[command(name = "tokentap", version = VERSION, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines on stderr: text (coloured only on a terminal) or json (one object per line).
    /// RUST_LOG filters them (default info; warn for sweep, demo and replay).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

/// `tokentap --version`: the package version and the git commit it was built from (`build.rs`;
/// `unknown` when built without git, e.g. in the Docker image without its build argument).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOKENTAP_GIT_COMMIT"),
    ")"
);

/// Arguments of `tokentap completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The commands. Their help texts write `<PLACEHOLDER>` as command-line help does (not HTML).
#[allow(
    rustdoc::invalid_html_tags,
    reason = "`<SECTION>` is a command-line placeholder in the help text"
)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the metering proxy in front of an upstream inference server.
    ///
    /// Clients talk to the data listener exactly as they talked to the upstream; every request is
    /// forwarded untouched. Generation requests (/v1/chat/completions, /v1/completions, sglang
    /// /generate, /v1/messages, /v1/responses) are measured as their responses stream past.
    /// Prometheus scrapes http://<admin>/metrics; the admin page at http://<admin>/ shows the
    /// production matrix beside the latest synthetic sweep.
    ///
    /// Example: `tokentap serve --upstream http://127.0.0.1:30000` (sglang on :30000, tokentap on
    /// :8000, admin on 127.0.0.1:9464; vLLM also listens on 8000: add --listen 0.0.0.0:8100).
    /// Every setting is documented in config/tokentap.toml and can be given as
    /// `TOKENTAP_<SECTION>__<KEY>` in the environment (e.g. TOKENTAP_ADMIN__TOKEN) or as --set
    /// section.key=value. With admin.token set, a browser opens the page after logging in at
    /// http://<admin>/login.
    /// SIGTERM or Ctrl-C stops accepting and lets streams finish within proxy.shutdown_grace.
    Serve(super::serve::ServeArgs),
    /// Run a simulated sglang-compatible server (the embedded default upstream).
    Simulate(super::simulate::SimulateArgs),
    /// Render, compare and import speed-test matrices.
    Matrix(super::matrix::MatrixArgs),
    /// Run a synthetic matrix sweep against a server (--target) or a running proxy (--admin)
    ///
    /// The seed pages' methodology, measured by the proxy's own metering path. For each
    /// context (ascending) one scout request (max_tokens 1, cold prompt) gives the prefill row
    /// and warms the prompt cache; then for each concurrency C, C identical streams
    /// (ignore_eos, max_tokens = max output) run until the server reports C running, then for
    /// a fixed window (streams that finish are restarted), then are aborted (sglang
    /// /abort_request by rid, else a disconnect) and the server drains. Cells whose
    /// C × (context + max output) exceeds the KV budget are Over capacity. A progress line with
    /// an ETA goes to stderr (one line per cell when stderr is not a terminal); the matrix is
    /// printed on stdout (--format: an aligned table on a terminal, Markdown otherwise) and
    /// written as JSON, HTML and Markdown. Ctrl-C cancels (streams are aborted) and writes
    /// what was measured.
    ///
    /// Examples:
    ///   tokentap sweep --target http://127.0.0.1:30000 --contexts 8K,32K --cell-duration 10s
    ///   tokentap sweep --admin http://127.0.0.1:9464 --token "$TOKEN"
    ///   tokentap sweep --admin http://10.0.0.11:9464,http://10.0.0.12:9464 --token "$TOKEN"
    ///     (a fleet: one replica at a time, then the spread per cell; docs/fleet.md)
    #[command(verbatim_doc_comment)]
    Sweep(super::sweep::SweepArgs),
    /// Start here: simulator + proxy + a short sweep + ordinary traffic, then both matrices.
    ///
    /// Starts a simulated sglang server (a profile calibrated from a published matrix) and the
    /// proxy in front of it on loopback, runs a short synthetic sweep through the proxy, then
    /// sends ordinary requests through its data listener: steady streams that reproduce a few
    /// sweep cells (the report marks their agreement within 5 %), then a burst of cold prompts
    /// (the report puts each cell's measured prefill interference beside its gap to the
    /// sweep). Writes an HTML report and tells you what to open and what to try next. About a
    /// minute and a half with the defaults.
    Demo(super::demo::DemoArgs),
    /// Pin, show or clear the reference matrix production is compared with (drift)
    ///
    /// A reference is kept per upstream and model in the proxy's store (it survives restarts).
    /// Once pinned, /matrix?compare=reference gives production ÷ reference per cell, the page
    /// shows the drift grid, and /metrics exports tokentap_drift_ratio for every cell in
    /// drift.window that meets the evidence rule (its TTFT ratio from evidence.min_requests
    /// completed requests).
    ///
    /// Examples:
    ///   tokentap reference pin --from latest-sweep --token "$TOKEN"
    ///   tokentap reference pin --file glm-8xB200.md --model nvidia/GLM-5.3-Flash-NVFP4 --token "$TOKEN"
    ///   tokentap reference show --model nvidia/GLM-5.3-Flash-NVFP4 --format md
    ///   tokentap reference clear --model nvidia/GLM-5.3-Flash-NVFP4 --token "$TOKEN"
    #[command(verbatim_doc_comment)]
    Reference(super::reference::ReferenceArgs),
    /// Read the fleet's matrix back from Prometheus, Thanos or Mimir (per configuration
    /// fingerprint) and compare a canary with its baseline on live traffic (docs/fleet.md).
    Fleet(super::fleet::FleetArgs),
    /// Export the captured production workload, or convert a public trace (Azure CSV,
    /// Mooncake JSONL) to tokentap's trace format (docs/workload.md).
    Workload(super::workload::WorkloadArgs),
    /// Replay a trace open-loop against a server or an embedded simulator: what-if.
    ///
    /// Requests go out at their recorded arrival times (÷ --speed) through an in-process proxy,
    /// tagged synthetic: exact-length prompts that share the recorded prefix blocks, max_tokens
    /// = the recorded output with ignore_eos. Prints the replay's matrix and, with --baseline,
    /// its diff against the original production matrix. Ctrl-C stops and writes what was
    /// measured. With --find-speed --slo: the largest speed-up at which the traffic still
    /// meets the SLO on that deployment (docs/what-if.md).
    ///
    /// Examples:
    ///   tokentap replay trace.jsonl --target http://127.0.0.1:30000 --baseline production.json
    ///   tokentap replay trace.jsonl --from-matrix other-deployment.md --speed 2
    ///   tokentap replay trace.jsonl --from-matrix other-deployment.md --find-speed --slo ttft=2s,tbt=50ms
    #[command(verbatim_doc_comment)]
    Replay(super::replay::ReplayArgs),
    /// Print Prometheus alerts on the `[slo]` error budgets: multiwindow, multi-burn-rate.
    ///
    /// Reads the configuration as `tokentap serve` does (--config, the environment, --set) and
    /// prints rule groups (YAML) for each model with an `[slo.models."<model>"]` table and for
    /// every other model: the burn rate of its error budget (1 - `[slo]` objective) on
    /// availability (failed requests, client aborts left out) and on SLO attainment (requests
    /// that met their targets; where targets are set), recorded over 5m, 30m, 1h and 6h, and
    /// the SRE workbook's alerts: 14.4x over 1h and 5m (severity page), 6x over 6h and 30m
    /// (ticket). --tests writes promtool unit tests in which every alert fires once and stays
    /// quiet twice (docs/metrics.md, "Error budgets"; docs/operations.md installs them).
    ///
    /// Examples:
    ///   tokentap rules --config tokentap.toml > tokentap-slo.rules.yml
    ///   tokentap rules --config tokentap.toml --output rules/tokentap-slo.rules.yml \
    ///     --tests rules/tokentap-slo.rules.test.yml && promtool test rules rules/tokentap-slo.rules.test.yml
    #[command(verbatim_doc_comment)]
    Rules(super::rules::RulesArgs),
    /// Tenants (`[tenants]`): print the hash a `[tenants.keys]` entry takes for an API key.
    ///
    /// Requests are counted per tenant when `[tenants]` names a header or maps API-key hashes
    /// to tenant names; keys are never stored or shown, only their SHA-256 (docs/metrics.md,
    /// "Tenants").
    ///
    /// Example:
    ///   printf %s "$API_KEY" | tokentap tenants hash-key
    #[command(verbatim_doc_comment)]
    Tenants(super::tenants::TenantsArgs),
    /// The one verdict of a running proxy, per model: does production meet the SLO (the worst
    /// cell and its attainment), does it agree with the sweep, how much headroom is left and
    /// what it rests on, drift against the reference, a configuration change in the window.
    /// Reads GET /status on the admin listener; every line within 120 columns.
    ///
    /// Example:
    ///   tokentap status --admin http://127.0.0.1:9464 --token "$TOKEN"
    #[command(verbatim_doc_comment)]
    Status(super::status::StatusArgs),
    /// Check tokentap's overhead on this machine: the same streams direct and through a proxy.
    ///
    /// Starts the embedded simulator (or uses --target) and `tokentap serve` with your
    /// configuration (--config, --set) in a child process on loopback, then runs interleaved
    /// rounds of concurrent streams direct and through it. Reports what the proxy added to time
    /// to first token and to the gap between frames (p50, p99), how many streams came through
    /// intact (against the simulator: frame for frame as direct), the proxy's CPU per event and
    /// memory per stream, and one verdict against the bars in docs/benchmarks.md (latency is
    /// judged on 8 or more cores and quiet rounds only). Exit status 3 when a bar is missed.
    /// Nothing is installed or written; about 15 seconds with the defaults.
    ///
    /// Examples:
    ///   tokentap bench
    ///   tokentap bench --config tokentap.toml --streams 500 --json
    ///   tokentap bench --target http://127.0.0.1:30000 --tokens 128
    #[command(verbatim_doc_comment)]
    Bench(super::bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    ///
    /// Examples:
    ///   tokentap completions bash > ~/.local/share/bash-completion/completions/tokentap
    ///   tokentap completions zsh > ~/.zfunc/_tokentap   # with fpath+=~/.zfunc in ~/.zshrc
    ///   tokentap completions fish > ~/.config/fish/completions/tokentap.fish
    #[command(verbatim_doc_comment)]
    Completions(CompletionsArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions(args) = &cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(args.shell, &mut command, "tokentap", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    // The sweep and the demo talk to a person on stderr: their logs stay at warnings unless
    // RUST_LOG asks for more (set before any thread exists).
    if matches!(
        cli.command,
        Command::Sweep(_) | Command::Demo(_) | Command::Replay(_) | Command::Bench(_)
    ) && std::env::var_os("RUST_LOG").is_none()
    {
        std::env::set_var("RUST_LOG", "warn");
    }
    crate::telemetry::logging::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => super::serve::run(args).await,
            Command::Simulate(args) => super::simulate::run(args).await,
            Command::Matrix(args) => super::matrix::run(args).await,
            Command::Sweep(args) => super::sweep::run(args).await,
            Command::Demo(args) => super::demo::run(args).await,
            Command::Reference(args) => super::reference::run(args).await,
            Command::Workload(args) => super::workload::run(args).await,
            Command::Fleet(args) => super::fleet::run(args).await,
            Command::Replay(args) => super::replay::run(args).await,
            Command::Rules(args) => super::rules::run(args),
            Command::Tenants(args) => super::tenants::run(args),
            Command::Status(args) => super::status::run(args).await,
            Command::Bench(args) => super::bench::run(args).await,
            Command::Completions(_) => Ok(ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
