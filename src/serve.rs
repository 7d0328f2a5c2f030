//! `tokentap serve`: placeholder until the proxy lands.
use std::process::ExitCode;

/// Arguments of `tokentap serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {}

pub async fn run(_args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tokentap serve` is not built yet")
}
