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
    /// Run a synthetic matrix sweep against a server (--target) or a running proxy (--admin).
    Sweep(crate::sweep::cli::SweepArgs),
    /// Simulator + proxy + a short sweep + ordinary traffic, then both matrices and a report.
    Demo(crate::sweep::demo::DemoArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The sweep and the demo talk to a person on stderr: their logs stay at warnings unless
    // RUST_LOG asks for more (set before any thread exists).
    if matches!(cli.command, Command::Sweep(_) | Command::Demo(_))
        && std::env::var_os("RUST_LOG").is_none()
    {
        std::env::set_var("RUST_LOG", "warn");
    }
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
            Command::Sweep(args) => crate::sweep::cli::run(args).await,
            Command::Demo(args) => crate::sweep::demo::run(args).await,
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
