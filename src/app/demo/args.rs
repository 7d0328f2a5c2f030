//! `tokentap demo`'s arguments.

use std::path::PathBuf;

use crate::app::output::OutputFormat;

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
    /// comparisons): table (aligned, at most 120 columns), list, md, json, or llmd (every
    /// matrix of the demo as llm-d benchmark reports, one array). Default: table on a
    /// terminal, md otherwise.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = OutputFormat::Auto)]
    pub format: OutputFormat,
    /// Set a key of the demo proxy's configuration over the demo's own, e.g. --set
    /// slo.ttft=500ms (repeatable; see config/tokentap.toml).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Multiply every simulated prefill and decode time by this (tests: a machine too busy for
    /// the simulator's timing, without loading one).
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, hide = true)]
    pub sim_slowdown: f64,
}
