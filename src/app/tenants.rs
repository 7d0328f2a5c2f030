//! `tokentap tenants hash-key`: the hash `[tenants.keys]` takes for an API key read from
//! standard input, so an operator maps keys to tenants without writing a key into the file.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context as _;

/// Arguments of `tokentap tenants`.
#[derive(Debug, clap::Args)]
pub struct TenantsArgs {
    #[command(subcommand)]
    pub command: TenantsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantsCommand {
    /// Print `sha256:<64 hex>` for the API key on standard input (one trailing newline is
    /// ignored), the form a `[tenants.keys]` entry takes.
    ///
    /// Example:
    ///   printf %s "$API_KEY" | tokentap tenants hash-key
    #[command(verbatim_doc_comment)]
    HashKey,
}

pub fn run(args: TenantsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TenantsCommand::HashKey => {
            let mut key = Vec::new();
            std::io::stdin()
                .take(64 * 1024)
                .read_to_end(&mut key)
                .context("cannot read the key from standard input")?;
            let key = key.strip_suffix(b"\n").unwrap_or(&key);
            let key = key.strip_suffix(b"\r").unwrap_or(key);
            anyhow::ensure!(
                !key.is_empty(),
                "no key on standard input: pipe one in, e.g. printf %s \"$API_KEY\" | tokentap tenants hash-key"
            );
            println!("{}", crate::proxy::tenants::key_hash(key));
            Ok(ExitCode::SUCCESS)
        }
    }
}
