//! The demo's first step: the simulator (a seed profile) and the proxy in-process on loopback
//! ephemeral ports, the proxy configured as a value (the demo's own keys, then `--set`), and the
//! lines that say where each one listens.

use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use super::args::DemoArgs;
use crate::app::serve::ProxyServer;
use crate::config::{Config, ConfigError, ConfigLoader};
use crate::sim::{Profile, SimHandle, SimOptions, SimServer};
use crate::synthetic::prompt::mix;

/// What the demo runs: the simulator, the proxy in front of it, and the admin token.
pub struct Demo {
    pub sim: SimHandle,
    pub server: ProxyServer,
    /// The admin API's bearer token, made up for this run.
    pub token: String,
    /// The simulated model's served name (the sweep's when it names none).
    pub profile_name: String,
    /// The profile the simulator runs, calibrated from a seed page: what the sweep should give.
    pub profile: Profile,
}

/// Starts the simulator and the proxy and prints their addresses.
pub async fn start(args: &DemoArgs, began: Instant, steady_hold: Duration) -> anyhow::Result<Demo> {
    let profile = Profile::load(&args.profile)
        .with_context(|| format!("loading simulator profile `{}`", args.profile))?;
    let profile_name = profile.model.served_model_name.clone();
    let source = profile.labels.source.clone();
    let sim = SimServer::start(
        profile.clone(),
        SimOptions {
            seed: args.seed,
            slowdown: args.sim_slowdown,
            ..SimOptions::default()
        },
    )
    .await
    .context("starting the simulator")?;

    let token = format!(
        "demo-{:016x}",
        mix(std::process::id() as u64 ^ mix(began.elapsed().as_nanos() as u64 ^ 0x5eed))
            ^ mix(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0))
    );
    let config = config(&sim.base_url(), &token, steady_hold, &args.set)?;
    let server = ProxyServer::start(config).await?;

    eprintln!("tokentap demo");
    eprintln!(
        "  simulator  {}  ({profile_name}, calibrated from {source})",
        sim.base_url()
    );
    eprintln!(
        "  proxy      http://{}  (point clients here)",
        server.proxy_addr
    );
    eprintln!(
        "  admin      http://{}  (Prometheus /metrics; sweeps need: Authorization: Bearer {token})",
        server.admin_addr
    );
    Ok(Demo {
        sim,
        server,
        token,
        profile_name,
        profile,
    })
}

/// The demo proxy's configuration: loopback listeners on ephemeral ports, the admin token, the
/// simulator upstream, no store on disk, the workload captured; then the user's `--set` keys.
/// Errors name the demo's own keys as `config file tokentap demo`.
fn config(
    simulator: &str,
    token: &str,
    steady_hold: Duration,
    set: &[String],
) -> Result<Config, ConfigError> {
    let mut table = toml::Table::new();
    let mut put = |section: &str, key: &str, value: toml::Value| {
        if let toml::Value::Table(keys) = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        {
            keys.insert(key.to_owned(), value);
        }
    };
    put("proxy", "listen", "127.0.0.1:0".into());
    put("admin", "listen", "127.0.0.1:0".into());
    put("admin", "token", token.into());
    put("upstream", "url", simulator.into());
    put("store", "data_dir", "".into());
    put("workload", "capture", true.into());
    // The demo's phases last seconds and its steady clients go away rather than finish, so
    // its evidence rule asks for seconds and tokens, not completed requests (production's
    // default asks for 20 requests, 10 s and 500 tokens): a cell of a few tokens is still grey.
    put("evidence", "min_requests", toml::Value::Integer(0));
    put(
        "evidence",
        "min_measured_for",
        format!("{}ms", (steady_hold / 2).as_millis()).into(),
    );
    put("evidence", "min_output_tokens", toml::Value::Integer(100));
    ConfigLoader::new()
        .base(table, "tokentap demo")
        .set_args(set)?
        .load()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration built as a value is the one the demo wrote as TOML text before, and
    /// errors still name the demo's own keys `config file tokentap demo`.
    #[test]
    fn the_demo_config_is_the_text_it_replaced() {
        let (url, token, hold) = (
            "http://127.0.0.1:4321",
            "demo-0123456789abcdef",
            Duration::from_secs(4),
        );
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n[upstream]\nurl = \"{url}\"\n[store]\ndata_dir = \"\"\n[workload]\ncapture = true\n[evidence]\nmin_requests = 0\nmin_measured_for = \"{}ms\"\nmin_output_tokens = 100\n",
            (hold / 2).as_millis()
        );
        let set = ["slo.ttft=500ms".to_owned()];
        let from_text = ConfigLoader::new()
            .text(&text, "tokentap demo")
            .unwrap()
            .set_args(&set)
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(config(url, token, hold, &set).unwrap(), from_text);
        let error = config(
            url,
            token,
            hold,
            &["proxy.http2_keep_alive_timeout=0".to_owned()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("flag --set proxy.http2_keep_alive_timeout: "),
            "{error}"
        );
        let error = config("ftp://x", token, hold, &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            "config file tokentap demo: key `upstream.url`: `ftp://x` must be an http:// or https:// URL with a host"
        );
    }
}
