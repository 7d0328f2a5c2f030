//! The arguments of `tokentap serve` and the configuration layers they name: the file
//! (`--config`), the environment, `--set`, then the flags.

use std::path::PathBuf;

use crate::config::{Config, ConfigLoader};

/// Arguments of `tokentap serve`.
///
/// Example: `tokentap serve --upstream http://127.0.0.1:30000` puts tokentap on 0.0.0.0:8000
/// in front of an sglang server; point clients at port 8000 and Prometheus at
/// http://127.0.0.1:9464/metrics.
#[allow(
    rustdoc::invalid_html_tags,
    reason = "`<SECTION>` is a command-line placeholder"
)]
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The inference server to forward to (sets upstream.url). Default http://127.0.0.1:30000.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Data listener address (sets proxy.listen). Default 0.0.0.0:8000.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin listener for /metrics, /healthz, /readyz, /matrix, /sweeps (sets admin.listen).
    /// Default 127.0.0.1:9464; anything but loopback needs admin.token.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// TOML configuration file (see config/tokentap.toml for every key). Environment
    /// variables TOKENTAP_<SECTION>__<KEY> override it; these flags override both.
    #[arg(long, short = 'c', value_name = "FILE", env = "TOKENTAP_CONFIG")]
    pub config: Option<PathBuf>,
    /// Set any key of config/tokentap.toml, e.g. --set proxy.listen=0.0.0.0:8100 --set
    /// slo.ttft=500ms (repeatable; over the file and the environment, under the flags above;
    /// keep secrets such as admin.token in the environment or the file, not on a command line
    /// others can read). A list of several upstreams (`[[upstreams]]`) is written in the file.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
}

/// The configuration file (`--config`), the environment and `--set`, layered as every command
/// that reads tokentap's configuration does.
pub fn config_layers(
    file: Option<&std::path::Path>,
    set: &[String],
) -> anyhow::Result<ConfigLoader> {
    let mut loader = ConfigLoader::new();
    if let Some(path) = file {
        loader = loader.file(path)?;
    }
    Ok(loader.process_env()?.set_args(set)?)
}

impl ServeArgs {
    /// Loads the configuration layers these arguments name.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut loader = config_layers(self.config.as_deref(), &self.set)?;
        if let Some(url) = &self.upstream {
            loader = loader.flag(
                "upstream",
                "url",
                toml::Value::String(url.clone()),
                "--upstream",
            );
        }
        if let Some(listen) = &self.listen {
            loader = loader.flag(
                "proxy",
                "listen",
                toml::Value::String(listen.clone()),
                "--listen",
            );
        }
        if let Some(admin) = &self.admin {
            loader = loader.flag(
                "admin",
                "listen",
                toml::Value::String(admin.clone()),
                "--admin",
            );
        }
        Ok(loader.load()?)
    }
}
