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
//!
//! One file per step, in order: `start.rs` (the simulator and the proxy, configured as a value),
//! `sweep.rs`, `steady.rs`, `mixed.rs` (each traffic phase measured by its own aggregator,
//! `phase.rs`), `finish.rs` (the report shown and written); `report.rs` and `table.rs` render
//! it; `http.rs` is the one client exchange every plain request goes through.

mod finish;
mod http;
mod mixed;
mod phase;
mod report;
mod start;
mod steady;
mod sweep;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use tokio::time::Instant;

use super::output::OutputFormat;
use crate::aggregate::Window;
use crate::sweep::status::SweepState;

pub use mixed::{burst, BurstSummary};
pub use report::{DemoReport, AGREEMENT, DEFINITIONS};
pub use steady::steady_cells;
pub use table::TextTable;

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

/// `tokentap demo`: its steps in order.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let began = Instant::now();
    let steady_hold = crate::base::duration::parse_duration(&args.steady_duration)
        .map_err(|error| anyhow::anyhow!("--steady-duration: {error}"))?;
    let demo = start::start(&args, began, steady_hold).await?;
    // 1. The short sweep.
    let sweep = sweep::sweep(&demo, &args).await?;
    // 2. Steady traffic: ordinary clients reproduce a few of the sweep's cells.
    let cells = steady_cells(&sweep.synthetic);
    let steady = steady::steady(
        &demo,
        &sweep.model,
        &cells,
        steady_hold,
        &args.steady_duration,
    )
    .await;
    // 3. Mixed traffic: cold prompts of many lengths at changing concurrency.
    let mixed = mixed::mixed(&demo, &sweep.model, args.requests).await;
    // Everything the proxy measured since start, as /matrix shows it.
    let production =
        demo.server
            .production
            .matrix(Window::All, Some(&sweep.model), SystemTime::now());
    // 4. The matrices and the report.
    let report = DemoReport {
        synthetic: &sweep.synthetic,
        steady: steady.matrix.as_ref(),
        mixed: mixed.matrix.as_ref(),
        steady_cells: &cells,
    };
    finish::finish(&args, &demo, began, &report, production.as_ref()).await?;

    if args.keep_running {
        eprintln!();
        eprintln!(
            "Still running: proxy http://{}, admin http://{} (token {}). Ctrl-C stops.",
            demo.server.proxy_addr, demo.server.admin_addr, demo.token
        );
        eprintln!(
            "    Open http://{}/login in a browser and give it the token: the live page, and a button that starts a sweep.",
            demo.server.admin_addr
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    demo.server.shutdown().await;
    demo.sim.shutdown().await;
    Ok(
        if sweep.state == SweepState::Finished && mixed.burst.failed == 0 && steady.failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
