//! `tokentap matrix show|diff|import`. Placeholder.
use std::process::ExitCode;

/// Arguments of `tokentap matrix`.
#[derive(Debug, clap::Args)]
pub struct MatrixArgs {}

pub async fn run(_args: MatrixArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tokentap matrix` is not built yet")
}
