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
