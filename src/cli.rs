//! Command-line entry: argument parsing and dispatch to each command's `run`.
//!
//! Each command's arguments live in the module that owns the command; this file only
//! wires them together, builds the tokio runtime and turns errors into exit codes.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tokentap: a metering reverse proxy for sglang, vLLM and any OpenAI-compatible server.
///
/// It forwards every request untouched, reads streamed responses as they pass and measures
/// time to first token, time between tokens, tok/s and prefill tok/s by prompt length and
/// live concurrency. On demand it runs a synthetic matrix sweep through the same path.
///
/// Start with `tokentap demo`: it runs everything on an embedded simulator.
#[derive(Debug, Parser)]
#[command(name = "tokentap", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

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
    /// :8000, admin on 127.0.0.1:9464). Every setting is documented in config/tokentap.toml and can
    /// be given as TOKENTAP_<SECTION>__<KEY> in the environment (e.g. TOKENTAP_ADMIN__TOKEN).
    /// SIGTERM or Ctrl-C stops accepting and lets streams finish within proxy.shutdown_grace.
    Serve(crate::serve::ServeArgs),
    /// Run a simulated sglang-compatible server (the embedded default upstream).
    Simulate(crate::sim::SimulateArgs),
    /// Render, compare and import speed-test matrices.
    Matrix(crate::matrix::cli::MatrixArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::telemetry::logging::init();
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
            Command::Serve(args) => crate::serve::run(args).await,
            Command::Simulate(args) => crate::sim::run(args).await,
            Command::Matrix(args) => crate::matrix::cli::run(args).await,
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
