//! `tokentap simulate`: run the simulated sglang-compatible server from a built-in profile,
//! a profile file or a published matrix, print a profile, or measure the simulator's
//! schedule lag.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::sim::from_matrix::{self, FromMatrixOptions};
use crate::sim::{
    lag, serve, Dialect, Profile, QueueCaps, SimOptions, BUILTIN_PROFILES, DEFAULT_PROFILE,
};

/// Arguments of `tokentap simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Profile to simulate: a built-in name (see --list-profiles) or a path to a profile
    /// TOML file (format: docs/simulator.md).
    #[arg(long, value_name = "NAME|FILE", default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// Build the profile from a speed-test matrix instead of --profile: a seed page, or a
    /// tokentap matrix in JSON or Markdown. Prefill curve, decode grid, cache-hit TTFT, KV
    /// budget and context length are inferred as docs/simulator.md ("Profiles from a
    /// matrix") describes; see the result with --print-profile. Default: use --profile.
    #[arg(long, value_name = "SEED_OR_JSON", conflicts_with = "profile")]
    pub from_matrix: Option<std::path::PathBuf>,
    /// Mean tokens per decode step and stream (speculative decoding emits several tokens per
    /// SSE event); it changes how tokens are grouped into events, never the speed. Default:
    /// the profile's decode.tokens_per_step; with --from-matrix, 3 when the matrix's launch
    /// command enables speculative decoding, else 1.
    #[arg(long, value_name = "N")]
    pub tokens_per_event: Option<f64>,
    /// Address to listen on (HTTP/1.1 and h2c); the default is sglang's port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:30000")]
    pub listen: String,
    /// Seed for ids, output text and speculative accept lengths; the same seed and the
    /// same requests give the same bytes and timings.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Wire dialect: which server's bytes, headers timing and metric names to imitate.
    #[arg(long, value_enum, default_value_t = Dialect::Sglang)]
    pub dialect: Dialect,
    /// Serve under this model name instead of the profile's served_model_name (default:
    /// the profile's).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Like sglang's --enable-cache-report: report prompt_tokens_details.cached_tokens in
    /// usage. Default: off, as in sglang.
    #[arg(long)]
    pub enable_cache_report: bool,
    /// Serve a vocabulary of N token ids, like a tiny real model: /tokenize answers ids
    /// below N, and a prompt with an id of N or more is refused the way the dialect's
    /// server refuses it (vLLM: 200, then an error event in the stream). Default: no limit.
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<u64>,
    /// Like sglang's --stream-response-default-include-usage: send the final usage chunk to
    /// every stream, asked or not (and say so in /server_info). Default: off, as in sglang.
    #[arg(long)]
    pub stream_response_default_include_usage: bool,
    /// Never answer /server_info (and /get_server_info), as sglang's does while its scheduler
    /// does not answer internal-state requests. Default: answer.
    #[arg(long)]
    pub hang_server_info: bool,
    /// Present this engine version in /server_info and /version instead of the profile's
    /// (another release of the same deployment, for fingerprint tests). Default: the
    /// profile's `labels.engine_version`.
    #[arg(long, value_name = "VERSION")]
    pub engine_version: Option<String>,
    /// Like sglang's --enable-priority-scheduling: admit waiting requests by their `priority`
    /// field (chat, completions, /generate), ties by arrival; in the sglang dialect larger
    /// values first and requests without one last (the vLLM dialect: as --scheduling-policy
    /// priority); /server_info says so. Default: first come first served, as in both engines.
    #[arg(long)]
    pub enable_priority_scheduling: bool,
    /// Like sglang's --schedule-low-priority-values-first: with priority scheduling, smaller
    /// `priority` values go first (the vLLM dialect always does). Default: larger first.
    #[arg(long)]
    pub schedule_low_priority_values_first: bool,
    /// Like vLLM's --scheduling-policy: `priority` admits waiting requests by their
    /// `priority` field, smaller values first (a request without one counts as 0), ties by
    /// arrival; the same switch as --enable-priority-scheduling. Default: fcfs.
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = SchedulingPolicy::Fcfs)]
    pub scheduling_policy: SchedulingPolicy,
    /// Add or replace a server argument in /server_info, as KEY=VALUE (VALUE is JSON, else a
    /// string); repeatable: another configuration of the same profile, for fingerprint tests.
    #[arg(long = "server-arg", value_name = "KEY=VALUE", value_parser = parse_server_arg)]
    pub server_args: Vec<(String, String)>,
    /// Be this many times slower than the profile: every prefill and decode time multiplied
    /// (1.5: 1.5 times slower). Not visible in any answer. Default: 1.
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, value_parser = parse_slowdown)]
    pub slowdown: f64,
    /// Override the profile's KV capacity in tokens (max_total_num_tokens). Default: the
    /// profile's `capacity.kv_tokens`.
    #[arg(long, value_name = "TOKENS")]
    pub kv_tokens: Option<u64>,
    /// Override the profile's maximum number of admitted requests. Default: the profile's
    /// `capacity.max_running_requests`.
    #[arg(long, value_name = "N")]
    pub max_running_requests: Option<u32>,
    /// Like sglang's --max-queued-requests (sglang dialect) and vLLM's --max-num-queued-reqs
    /// (vLLM dialect): at most N requests wait; one arriving at a full queue is refused with
    /// the engine's 503 ("The request queue is full." / QueueOverflowError); in the sglang
    /// dialect with --enable-priority-scheduling, one preferred to the least-preferred waiting
    /// request aborts that one instead ("The request is aborted by a higher priority
    /// request."), as sglang does. Default: no cap.
    #[arg(long, value_name = "N", visible_alias = "max-num-queued-reqs")]
    pub max_queued_requests: Option<u64>,
    /// Like vLLM's --max-num-queued-tokens: at most N prompt tokens wait for prefill, the
    /// arriving request's included; over it the request is refused with 503
    /// (MaxQueuedTokensError). Default: no cap.
    #[arg(long, value_name = "N")]
    pub max_num_queued_tokens: Option<u64>,
    /// Print the names of the built-in profiles and exit.
    #[arg(long)]
    pub list_profiles: bool,
    /// Print the resolved profile as TOML and exit.
    #[arg(long)]
    pub print_profile: bool,
    /// Measure schedule lag instead of serving: run the simulator on one core with N
    /// concurrent streams from a client on another thread, then print lag p50/p99
    /// (docs/benchmarks.md). Uses --measure-seconds and --measure-context. Default: serve.
    #[arg(long, value_name = "N")]
    pub measure_lag: Option<usize>,
    /// With --measure-lag: seconds of steady streaming to measure.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub measure_seconds: f64,
    /// With --measure-lag: prompt length in tokens of every stream.
    #[arg(long, value_name = "TOKENS", default_value_t = 1024)]
    pub measure_context: u64,
}

/// The values of `--scheduling-policy`, vLLM's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulingPolicy {
    /// First come first served.
    Fcfs,
    /// By each request's `priority`, then arrival.
    Priority,
}

/// `tokentap simulate`.
pub async fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    if args.list_profiles {
        for (name, _) in BUILTIN_PROFILES {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (mut profile, inference) = match &args.from_matrix {
        Some(path) => {
            let doc =
                crate::matrix::load(path).context("reading the matrix given to --from-matrix")?;
            let options = FromMatrixOptions {
                tokens_per_event: args.tokens_per_event,
                origin: path.display().to_string(),
            };
            let (profile, inference) = from_matrix::profile_from_matrix(&doc, &options)
                .with_context(|| format!("building a simulator profile from {}", path.display()))?;
            (profile, Some(inference))
        }
        None => (
            Profile::load(&args.profile)
                .with_context(|| format!("loading simulator profile `{}`", args.profile))?,
            None,
        ),
    };
    if let Some(tokens) = args.tokens_per_event {
        profile.decode.tokens_per_step = tokens;
        profile.decode.accept_length_spread = profile
            .decode
            .accept_length_spread
            .min(from_matrix::accept_length_spread(tokens));
    }
    if let Some(kv) = args.kv_tokens {
        profile.capacity.kv_tokens = kv;
    }
    if let Some(n) = args.max_running_requests {
        profile.capacity.max_running_requests = n;
    }
    profile.validate().context(
        "the profile with --kv-tokens/--max-running-requests/--tokens-per-event applied",
    )?;
    if args.print_profile {
        if let Some(inference) = &inference {
            print!("{}", inference.toml_comment(&profile));
        }
        print!(
            "{}",
            profile.to_toml_string().context("rendering the profile")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let options = SimOptions {
        seed: args.seed,
        dialect: args.dialect,
        served_model_name: args.served_model_name.clone(),
        enable_cache_report: args.enable_cache_report,
        vocab_size: args.vocab_size,
        stream_response_default_include_usage: args.stream_response_default_include_usage,
        hang_server_info: args.hang_server_info,
        engine_version: args.engine_version.clone(),
        server_args: args.server_args.clone(),
        slowdown: args.slowdown,
        priority_scheduling: args.enable_priority_scheduling
            || args.scheduling_policy == SchedulingPolicy::Priority,
        low_priority_values_first: args.schedule_low_priority_values_first,
        queue_caps: QueueCaps {
            requests: args.max_queued_requests,
            tokens: args.max_num_queued_tokens,
            ..QueueCaps::default()
        },
    };
    if let Some(streams) = args.measure_lag {
        let report = lag::measure(
            profile,
            options,
            lag::LagPlan {
                streams,
                seconds: args.measure_seconds,
                context: args.measure_context,
            },
        )
        .await
        .context("measuring schedule lag")?;
        println!("{report}");
        return Ok(ExitCode::SUCCESS);
    }
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("binding the simulator listener on {}", args.listen))?;
    let addr = listener
        .local_addr()
        .context("reading the listener address")?;
    // The dialect as `--dialect` spells it (`sglang`, `vllm`), not its Rust name.
    let dialect = clap::ValueEnum::to_possible_value(&options.dialect).map_or_else(
        || format!("{:?}", options.dialect),
        |v| v.get_name().to_string(),
    );
    eprintln!(
        "tokentap simulate: {} ({dialect} dialect) listening on http://{addr}",
        profile.model.served_model_name
    );
    serve(listener, profile, options, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `--server-arg KEY=VALUE`.
fn parse_server_arg(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// `--slowdown FACTOR`: a finite number above 0.
fn parse_slowdown(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(factor) if factor.is_finite() && factor > 0.0 => Ok(factor),
        _ => Err(format!("`{text}` is not a factor above 0")),
    }
}
