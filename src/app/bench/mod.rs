//! `tokentap bench`: the overhead self-check an operator runs on their own machine, with nothing
//! installed. The same streams go direct to an upstream (the embedded simulator, or `--target`)
//! and through a `tokentap serve` child with the given configuration, in interleaved rounds;
//! the report is what the proxy added (TTFT and inter-frame gap, p50 and p99), the streams that
//! came through intact, its CPU per forwarded event and memory per stream, and one verdict
//! against the product's bars where this machine can judge them.

mod child;
mod client;
mod figures;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};

use self::child::ProxyChild;
use self::client::{Round, StreamSample};
use self::figures::{Added, Intact, PathFigures, Report};
use crate::app::demo::http;
use crate::sim::{Profile, SimHandle, SimOptions, SimServer, DEFAULT_PROFILE};

/// Arguments of `tokentap bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Concurrent streams in each round.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub streams: u32,
    /// Tokens each stream asks for (max_tokens, with ignore_eos).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub tokens: u32,
    /// Interleaved rounds (direct and through tokentap each, the order alternating). The
    /// figures pool every round; the noise check compares them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Measure in front of this server instead of the embedded simulator (its /v1/models must
    /// answer; streams are compared frame for frame with direct only on the simulator).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// The model to ask for. Default: the upstream's first /v1/models entry.
    #[arg(long)]
    pub model: Option<String>,
    /// Simulator profile when there is no --target (`tokentap simulate --list-profiles`).
    #[arg(long, default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// The proxy's configuration file, as `tokentap serve --config` reads it (its listeners are
    /// moved to loopback ports and its store is left off).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Any key of config/tokentap.toml for the proxy, as `tokentap serve --set` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let sim = match &args.target {
        Some(_) => None,
        None => {
            let profile = Profile::load(&args.profile)
                .with_context(|| format!("loading simulator profile `{}`", args.profile))?;
            Some(
                SimServer::start(profile, SimOptions::default())
                    .await
                    .context("starting the simulator")?,
            )
        }
    };
    let upstream = match (&args.target, &sim) {
        (Some(target), _) => target.trim_end_matches('/').to_owned(),
        (None, Some(sim)) => sim.base_url(),
        (None, None) => bail!("no upstream"),
    };
    let model = match &args.model {
        Some(model) => model.clone(),
        None => first_model(&upstream).await?,
    };
    let proxy = ProxyChild::start(&upstream, args.config.as_deref(), &args.set).await?;
    if !args.json {
        eprintln!(
            "tokentap bench: measuring direct {upstream} and through tokentap {} ({} rounds)…",
            proxy.base_url, args.rounds
        );
    }
    let report = measure(&args, &upstream, &model, &proxy, sim.as_ref()).await;
    drop(proxy);
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

/// The warm-up, the interleaved rounds, and the report.
async fn measure(
    args: &BenchArgs,
    upstream: &str,
    model: &str,
    proxy: &ProxyChild,
    sim: Option<&SimHandle>,
) -> anyhow::Result<Report> {
    let round = |base_url| Round {
        base_url,
        model,
        streams: args.streams,
        tokens: args.tokens,
    };
    // Warm both paths (connections, the proxy's first-use allocations, the simulator's cache)
    // with a few streams, so the first measured round is not the cold one.
    let warm = Round {
        streams: args.streams.min(8),
        ..round(upstream)
    };
    let warm_proxy = Round {
        streams: args.streams.min(8),
        ..round(&proxy.base_url)
    };
    let warmed = warm.run().await;
    if warmed.iter().all(|s| !s.complete) {
        bail!(
            "no stream to {upstream} completed (model `{model}`): {}",
            warmed
                .first()
                .and_then(|s| s.error.clone())
                .unwrap_or_default()
        );
    }
    // The warm-up's peak is the baseline of the memory figure: what the proxy holds with a few
    // streams open, its fixed growth (allocator arenas, first-use buffers) included.
    let (_, warm_peak) = with_peak_memory(proxy, warm_proxy.run()).await;
    let marginal_streams = f64::from(args.streams.saturating_sub(warm_proxy.streams).max(1));

    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    let mut direct_p50_by_round = Vec::new();
    let (mut cpu, mut events) = (Duration::ZERO, 0u64);
    let mut cpu_known = true;
    let mut peak_kib_per_stream: Option<f64> = None;
    for index in 0..args.rounds {
        let direct_first = index % 2 == 0;
        if direct_first {
            direct_p50_by_round.push(direct_round(&round(upstream), &mut direct).await);
        }
        let before = proxy.cpu_time();
        let (samples, peak) = with_peak_memory(proxy, round(&proxy.base_url).run()).await;
        match (before, proxy.cpu_time()) {
            (Some(before), Some(after)) => cpu += after.saturating_sub(before),
            _ => cpu_known = false,
        }
        events += samples.iter().map(|s| s.events).sum::<u64>();
        if let (Some(baseline), Some(peak)) = (warm_peak, peak) {
            let kib = peak.saturating_sub(baseline) as f64 / 1024.0 / marginal_streams;
            peak_kib_per_stream = Some(peak_kib_per_stream.map_or(kib, |k: f64| k.max(kib)));
        }
        proxied.extend(samples);
        if !direct_first {
            direct_p50_by_round.push(direct_round(&round(upstream), &mut direct).await);
        }
        if let Some(sim) = sim {
            crate::app::demo::wait_until_server_idle(&sim.base_url()).await;
        }
    }
    let (direct_figures, proxied_figures) = (PathFigures::of(&direct), PathFigures::of(&proxied));
    Ok(Report {
        upstream: match sim {
            Some(_) => format!("embedded simulator ({})", args.profile),
            None => upstream.to_owned(),
        },
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        streams: args.streams,
        tokens: args.tokens,
        rounds: args.rounds,
        direct: direct_figures,
        proxied: proxied_figures,
        added: Added::between(&direct_figures, &proxied_figures),
        frames: Intact::judge(&proxied, &direct, sim.is_some()),
        direct_failed: direct.iter().filter(|s| !s.complete).count() as u64,
        events,
        cpu_us_per_event: (cpu_known && events > 0)
            .then(|| cpu.as_secs_f64() * 1e6 / events as f64),
        kib_per_stream: peak_kib_per_stream,
        direct_ttft_p50_ms_by_round: direct_p50_by_round,
        noise: None,
        verdict: String::new(),
        over: Vec::new(),
        notes: Vec::new(),
        passed: false,
    }
    .judge())
}

/// One direct round, its samples kept; returns its TTFT p50 (the noise check's figure).
async fn direct_round(round: &Round<'_>, all: &mut Vec<StreamSample>) -> f64 {
    let samples = round.run().await;
    let p50 = PathFigures::of(&samples).ttft_p50_ms;
    all.extend(samples);
    p50
}

/// Runs `work` while sampling the proxy's resident memory every 10 ms; the peak seen.
async fn with_peak_memory<T>(
    proxy: &ProxyChild,
    work: impl std::future::Future<Output = T>,
) -> (T, Option<u64>) {
    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = async {
        while !done.load(Ordering::Relaxed) {
            if let Some(bytes) = proxy.resident_bytes() {
                peak.fetch_max(bytes, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let work = async {
        let output = work.await;
        done.store(true, Ordering::Relaxed);
        output
    };
    let (output, ()) = tokio::join!(work, sampler);
    let peak = peak.load(Ordering::Relaxed);
    (output, (peak > 0).then_some(peak))
}

/// The upstream's first model (`GET /v1/models`).
async fn first_model(upstream: &str) -> anyhow::Result<String> {
    let client = http::client();
    let url = format!("{upstream}/v1/models");
    let request = http::get(&url).with_context(|| format!("bad upstream URL {upstream}"))?;
    let Some((status, body)) = http::exchange(&client, request, Duration::from_secs(10)).await
    else {
        bail!("{url} did not answer: is the server running there?");
    };
    if !status.is_success() {
        bail!("{url} answered {status}: name the model with --model");
    }
    let models: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("{url} answered no JSON"))?;
    models
        .get("data")
        .and_then(|data| data.get(0))
        .and_then(|model| model.get("id"))
        .and_then(|id| id.as_str())
        .map(str::to_owned)
        .with_context(|| format!("{url} lists no model: name one with --model"))
}
