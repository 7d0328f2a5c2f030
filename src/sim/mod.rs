//! The simulated sglang-compatible server (`tokentap simulate`). Placeholder.
use std::process::ExitCode;

/// Arguments of `tokentap simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

pub async fn run(_args: SimulateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tokentap simulate` is not built yet")
}
