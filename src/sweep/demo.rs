//! `tokentap demo`: the first command of the README. With no arguments it starts the simulator
//! (a seed profile) and the proxy in-process on loopback ephemeral ports, runs a short sweep
//! through the proxy's admin-side manager, sends a burst of mixed ordinary requests through the
//! proxy's data listener, prints the synthetic matrix and the production figures side by side,
//! writes an HTML report, and says what to open and what to try next.
//!
//! Everything it starts is stopped before it returns (unless `--keep-running`, until Ctrl-C).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::cli::{follow_local, write_matrix};
use super::plan::{DurationValue, SweepRequest, TokensValue};
use super::prompt::{filler_text, mix};
use super::status::SweepState;
use crate::aggregate::Window;
use crate::config::ConfigLoader;
use crate::matrix::diff::diff;
use crate::matrix::html::{
    facts_fragment, grid_fragment, measurements_fragment, page, prefill_fragment,
    ratio_grid_fragment,
};
use crate::matrix::units::context_label;
use crate::matrix::{render_markdown, MatrixDoc};
use crate::serve::ProxyServer;
use crate::sim::{Profile, SimOptions, SimServer};

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
    /// Ordinary ("production") requests sent through the proxy after the sweep: chat and
    /// completions, streaming and not, prompts of 1.5K–24K tokens, at concurrency 1, 2, 4, 8.
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub requests: usize,
    /// Directory for report.html and the synthetic matrix (json, md, html).
    #[arg(long, value_name = "DIR", default_value = "tokentap-demo")]
    pub out: PathBuf,
    /// Simulator seed (same seed, same bytes).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Keep the simulator and proxy running after the report, until Ctrl-C, so the admin
    /// URLs stay open. Default: stop at the end.
    #[arg(long)]
    pub keep_running: bool,
}

/// `tokentap demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let began = Instant::now();
    let profile = Profile::load(&args.profile)
        .with_context(|| format!("loading simulator profile `{}`", args.profile))?;
    let profile_name = profile.model.served_model_name.clone();
    let source = profile.labels.source.clone();
    let sim = SimServer::start(
        profile,
        SimOptions {
            seed: args.seed,
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
    let config_text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{token}\"\n[upstream]\nurl = \"{}\"\n[store]\ndata_dir = \"\"\n",
        sim.base_url()
    );
    let config = ConfigLoader::new()
        .text(&config_text, "tokentap demo")?
        .load()?;
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

    // 1. The short sweep.
    let request = SweepRequest {
        contexts: Some(
            args.contexts
                .iter()
                .map(|c| TokensValue::Label(c.trim().to_owned()))
                .collect(),
        ),
        concurrency: Some(args.concurrency.clone()),
        cell_duration: Some(DurationValue::Text(args.cell_duration.clone())),
        ..SweepRequest::default()
    };
    let manager = Arc::clone(&server.admin.sweeps);
    let id = manager
        .start(request)
        .await
        .map_err(|error| anyhow::anyhow!(crate::proxy::error::error_chain(&error)))?;
    eprintln!();
    eprintln!(
        "1/3 Synthetic sweep {id}. While it runs:\n    curl -s -H 'Authorization: Bearer {token}' http://{}/sweeps/{id}",
        server.admin_addr
    );
    let status = follow_local(&manager, &id, true).await?;
    let Some(synthetic) = status.matrix.clone() else {
        anyhow::bail!(
            "the sweep ended {} without a matrix: {}",
            status.state.as_str(),
            status.error.unwrap_or_default()
        );
    };
    if status.state != SweepState::Finished {
        eprintln!("the sweep ended {}", status.state.as_str());
    }
    let model = synthetic
        .metadata
        .model
        .served_model
        .clone()
        .unwrap_or_else(|| profile_name.clone());

    // 2. The burst of ordinary traffic.
    eprintln!();
    eprintln!(
        "2/3 {} ordinary requests through http://{} (chat and completions, streaming and not, concurrency 1 → 8)",
        args.requests, server.proxy_addr
    );
    let burst = burst(server.proxy_addr, &model, args.requests).await;
    eprintln!(
        "    {} answered 200, {} failed, in {:.1} s",
        burst.ok,
        burst.failed,
        burst.elapsed.as_secs_f64()
    );
    // The production matrix: the proxy's aggregator over everything since start.
    let production = server
        .production
        .matrix(Window::All, Some(&model), SystemTime::now());

    // 3. The matrices and the report.
    println!("{}", render_markdown(&synthetic));
    println!("{}", side_by_side_markdown(&synthetic, production.as_ref()));
    let mut written = write_matrix(&args.out, "synthetic", &synthetic)?;
    if let Some(production) = &production {
        written.extend(write_matrix(&args.out, "production", production)?);
    }
    let report = args.out.join("report.html");
    std::fs::write(&report, report_html(&synthetic, production.as_ref()))
        .with_context(|| format!("cannot write {}", report.display()))?;
    eprintln!();
    eprintln!("3/3 Done in {:.0} s.", began.elapsed().as_secs_f64());
    eprintln!(
        "    Open {} in a browser (heat map, charts, every measurement).",
        report.display()
    );
    eprintln!("    Also written: {}", written.join(", "));
    eprintln!();
    eprintln!("Try next:");
    eprintln!("    tokentap serve --upstream http://YOUR-SGLANG:30000     # meter your own server; clients use :8000");
    eprintln!("    tokentap sweep --target http://YOUR-SGLANG:30000 --contexts 8K,32K --cell-duration 10s");
    eprintln!(
        "    tokentap matrix diff <seed page or matrix> {}   # compare two matrices cell by cell",
        args.out.join("synthetic.json").display()
    );
    eprintln!("    tokentap simulate --profile glm-5.3-flash-nvfp4-4x-rtx-pro-6000   # a simulated sglang on :30000");
    eprintln!("    tokentap demo --keep-running    # keep the proxy and admin API up to explore");

    if args.keep_running {
        eprintln!();
        eprintln!(
            "Still running: proxy http://{}, admin http://{} (token {token}). Ctrl-C stops.",
            server.proxy_addr, server.admin_addr
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    server.shutdown().await;
    sim.shutdown().await;
    Ok(
        if status.state == SweepState::Finished && burst.failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// How the burst went.
#[derive(Debug, Default)]
pub struct BurstSummary {
    pub ok: usize,
    pub failed: usize,
    pub elapsed: Duration,
}

/// Ordinary client traffic: four phases at concurrency 1, 2, 4 and 8; chat and completions,
/// streaming and not, prompts of about 1.5K to 24K tokens (the simulator counts 4 bytes a
/// token), 32 to 128 output tokens.
pub async fn burst(proxy: SocketAddr, model: &str, requests: usize) -> BurstSummary {
    let began = Instant::now();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut summary = BurstSummary::default();
    let phases = [1usize, 2, 4, 8];
    let per_phase = requests.div_ceil(phases.len()).max(1);
    let mut sent = 0usize;
    for concurrency in phases {
        let mut running = JoinSet::new();
        let phase_end = (sent + per_phase).min(requests);
        while sent < phase_end || !running.is_empty() {
            while sent < phase_end && running.len() < concurrency {
                let index = sent;
                sent += 1;
                let client = client.clone();
                let body = burst_body(model, index);
                let path = if index % 2 == 0 {
                    "/v1/chat/completions"
                } else {
                    "/v1/completions"
                };
                let uri = format!("http://{proxy}{path}");
                running.spawn(async move {
                    let request = Request::post(uri)
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(body)));
                    let Ok(request) = request else {
                        return false;
                    };
                    let exchange = async {
                        let response = client.request(request).await.ok()?;
                        let ok = response.status().is_success();
                        response.into_body().collect().await.ok()?;
                        Some(ok)
                    };
                    tokio::time::timeout(Duration::from_secs(120), exchange)
                        .await
                        .ok()
                        .flatten()
                        .unwrap_or(false)
                });
            }
            match running.join_next().await {
                Some(Ok(true)) => summary.ok += 1,
                Some(_) => summary.failed += 1,
                None => {}
            }
        }
    }
    summary.elapsed = began.elapsed();
    summary
}

fn burst_body(model: &str, index: usize) -> String {
    const SIZES: [usize; 5] = [1_500, 3_000, 6_000, 12_000, 24_000];
    const OUTPUTS: [u64; 3] = [32, 64, 128];
    let pick = mix(index as u64);
    let tokens = SIZES.get((pick % 5) as usize).copied().unwrap_or(1_500);
    let max_tokens = OUTPUTS.get((pick >> 8) as usize % 3).copied().unwrap_or(64);
    let stream = (pick >> 16) % 3 != 0;
    let text = filler_text(&format!("demo-user-{index}"), tokens as u64, tokens * 4);
    let text = serde_json::Value::String(text);
    let model = serde_json::Value::String(model.to_owned());
    if index % 2 == 0 {
        format!(
            "{{\"model\":{model},\"messages\":[{{\"role\":\"user\",\"content\":{text}}}],\"max_tokens\":{max_tokens},\"stream\":{stream}}}"
        )
    } else {
        format!(
            "{{\"model\":{model},\"prompt\":{text},\"max_tokens\":{max_tokens},\"stream\":{stream}}}"
        )
    }
}

fn rate(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.1}"))
}

/// Per-request tok/s, synthetic · production, by context × concurrency: the rows and columns
/// of both documents together.
pub fn side_by_side_markdown(synthetic: &MatrixDoc, production: Option<&MatrixDoc>) -> String {
    let mut contexts = synthetic.contexts();
    let mut levels = synthetic.concurrencies();
    if let Some(production) = production {
        contexts.extend(production.contexts());
        levels.extend(production.concurrencies());
    }
    contexts.sort_unstable();
    contexts.dedup();
    levels.sort_unstable();
    levels.dedup();
    let mut out = String::from(
        "## Synthetic sweep · production traffic\n\nPer-request tok/s, synthetic · production. Production requests sit in the row of their prompt length (up to the context) and the column of their average number of active requests. The sweep's streams hit the prompt cache; the ordinary requests arrive with cold prompts whose prefill stalls everyone's decode, so production runs slower where requests overlap.\n\n| Context |",
    );
    for level in &levels {
        let _ = write!(out, " {level} |");
    }
    out.push_str("\n|---|");
    for _ in &levels {
        out.push_str("---:|");
    }
    out.push('\n');
    let figure = |doc: Option<&MatrixDoc>, context: u64, level: u32| match doc
        .and_then(|d| d.cell(context, level))
    {
        Some(cell) if cell.status.is_valid() => rate(cell.per_request_tok_s),
        Some(cell) => cell.status.to_string(),
        None => "—".to_owned(),
    };
    for context in contexts {
        let _ = write!(out, "| {} |", context_label(context));
        for &level in &levels {
            let _ = write!(
                out,
                " {} · {} |",
                figure(Some(synthetic), context, level),
                figure(production, context, level)
            );
        }
        out.push('\n');
    }
    if production.is_none() {
        out.push_str("\nNo production request was measured.\n");
    }
    out
}

/// The demo's report: both matrices side by side, their ratio, and every measurement.
pub fn report_html(synthetic: &MatrixDoc, production: Option<&MatrixDoc>) -> String {
    let production_panel = match production {
        Some(doc) => grid_fragment(doc),
        None => "<p class=\"note\">No production request was measured.</p>".to_owned(),
    };
    let ratio = production
        .map(|doc| {
            format!(
                "<p class=\"note\">A = synthetic, B = production. The sweep's streams hit the prompt cache; the ordinary requests arrive cold and their prefill stalls everyone's decode, so production runs slower at higher concurrency.</p>{}",
                ratio_grid_fragment(&diff(synthetic, doc))
            )
        })
        .unwrap_or_default();
    let production_table = production.map(measurements_fragment).unwrap_or_default();
    let body = format!(
        "<h1>tokentap demo</h1><p class=\"note\">A simulated sglang server behind the tokentap proxy: a synthetic sweep and ordinary traffic, both measured by the proxy's metering path.</p>{}<div style=\"display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start\"><div><h2>Synthetic sweep</h2>{}</div><div><h2>Production traffic</h2>{}</div></div>{ratio}{}<h2>Synthetic: all measurements</h2>{}<h2>Production: all measurements</h2>{production_table}",
        facts_fragment(synthetic),
        grid_fragment(synthetic),
        production_panel,
        prefill_fragment(synthetic),
        measurements_fragment(synthetic),
    );
    page("tokentap demo", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_bodies_are_json() {
        for index in 0..8 {
            let body = burst_body("m", index);
            let value: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(value["model"], "m");
            assert!(value["max_tokens"].as_u64().unwrap() >= 32);
        }
    }
}
