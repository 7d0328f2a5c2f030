//! `tokentap fleet matrix|compare`: the fleet matrix and the canary comparison read back from
//! a PromQL store (Prometheus, Thanos, Mimir) that scrapes every replica's sidecar
//! (`fleet::matrix`, `fleet::compare`), rendered with the matrix renderers; a failed
//! `--fail-below` gate exits with code 3 like `matrix diff`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};

use super::matrix::{write_output, EXIT_GATE_FAILED};
use crate::base::Source;
use crate::fleet::compare::{
    compare, render_compare_json, render_compare_markdown, render_compare_table,
};
use crate::fleet::matrix::{fleet_matrix, mean_ttft_ms, FleetQuery};
use crate::fleet::promql::{quote, PromClient};
use crate::matrix::EvidenceRule;
use crate::matrix::Format;
use crate::meter::priority::PriorityBand;

/// Read the fleet's matrix back from Prometheus (or Thanos, Mimir: anything that speaks
/// PromQL), per configuration fingerprint, and compare a canary with its baseline.
#[derive(Debug, Args)]
pub struct FleetArgs {
    #[command(subcommand)]
    pub command: FleetCommand,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per command; boxing would only move the allocation"
)]
pub enum FleetCommand {
    /// The fleet matrix: every replica's production cells summed in PromQL over a window.
    ///
    /// Examples:
    ///   tokentap fleet matrix --prometheus http://prometheus:9090 --window 1h
    ///   tokentap fleet matrix --prometheus http://prometheus:9090 --fingerprint 3f2a9c01b7de --format html -o fleet.html
    #[command(verbatim_doc_comment)]
    Matrix(MatrixArgs),
    /// Canary comparison: per cell, candidate ÷ baseline fingerprint over the same window.
    ///
    /// Each side's request count is shown; a cell where either side has too few requests
    /// (the evidence rule, --min-requests) gets no ratio and is marked. Exit code 3 when
    /// --fail-below is set and the geometric mean of the decode tok/s per stream ratios (Total
    /// tok/s ÷ average active requests) is below it.
    ///
    /// Example:
    ///   tokentap fleet compare --prometheus http://prometheus:9090 --baseline 3f2a9c01b7de --candidate 91c0d2e4aa10 --window 1h
    #[command(verbatim_doc_comment)]
    Compare(CompareArgs),
}

/// Where the fleet's series are and which of them.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The PromQL HTTP API's base URL (Prometheus, Thanos Query, Mimir's
    /// http://host/prometheus); /api/v1/query is appended.
    #[arg(long, value_name = "URL")]
    pub prometheus: String,
    /// The window every figure covers, ending now (30s, 5m, 1h, 1d), or at --at.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub window: String,
    /// Where the window ends instead of now: an RFC 3339 time (2026-12-01T14:00:00Z) or Unix
    /// seconds. For looking back at an incident, or matching a recording rule's evaluation.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// The served model. Default: the only model with requests in the window.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Production or synthetic traffic.
    #[arg(long, value_enum, default_value_t = TrafficSource::Production)]
    pub source: TrafficSource,
    /// More PromQL label matchers for every series, e.g. --match 'cluster="eu-1"'
    /// (repeatable).
    #[arg(long = "match", value_name = "MATCHER")]
    pub matchers: Vec<String>,
    /// Only one tenant's requests (the `tenant` label the sidecars write with `[tenants]`
    /// on: a name of their allow list, or `other`).
    #[arg(long, value_name = "NAME")]
    pub tenant: Option<String>,
    /// Only requests whose `priority` fell in this band: negative, 0, 1-9 or 10+ (the
    /// `priority` label).
    #[arg(long, value_name = "BAND", value_parser = priority_band)]
    pub priority: Option<PriorityBand>,
    /// A cell with fewer completed requests in the window is Low evidence: shown grey, never in
    /// a ratio. Default 20 (the `[evidence]` default).
    #[arg(long, value_name = "N")]
    pub min_requests: Option<u64>,
    /// Bearer token sent to the PromQL endpoint. Default: TOKENTAP_PROMETHEUS_TOKEN.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TOKENTAP_PROMETHEUS_TOKEN",
        hide_env_values = true
    )]
    pub prometheus_token: Option<String>,
    /// A header sent with every query, `Name: value` (e.g. 'X-Scope-OrgID: tenant' for
    /// Mimir; repeatable).
    #[arg(long = "header", value_name = "HEADER")]
    pub headers: Vec<String>,
    /// Longest wait for one query's answer.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub timeout: String,
}

/// `--source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TrafficSource {
    Production,
    Synthetic,
}

/// The renderings `fleet matrix` offers.
pub const MATRIX_FORMATS: [Format; 8] = Format::ALL;

/// Output formats of `fleet compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    /// One row per cell: each side's requests and the ratios.
    Md,
    /// The same rows aligned for a terminal, at most 120 columns.
    Table,
    /// JSON (schema tokentap.fleet-compare/v1).
    Json,
    /// The matrix diff's HTML page (ratio grid as a heat map; baseline = A, candidate = B).
    Html,
}

#[derive(Debug, Args)]
pub struct MatrixArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Only replicas of this configuration fingerprint (the `fingerprint` label).
    #[arg(long, value_name = "ID")]
    pub fingerprint: Option<String>,
    /// md, json, csv, html, svg, table, list or llmd (as `matrix show`). Default: `table` on a
    /// terminal, `md` in a pipe or with --output.
    #[arg(long, short, value_parser = super::output::format_parser(&MATRIX_FORMATS))]
    pub format: Option<Format>,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The fingerprint the fleet runs now.
    #[arg(long, value_name = "ID")]
    pub baseline: String,
    /// The fingerprint being rolled out (the canary).
    #[arg(long, value_name = "ID")]
    pub candidate: String,
    /// Output format. Default: `table` on a terminal, `md` in a pipe or with --output.
    #[arg(long, short, value_enum)]
    pub format: Option<CompareFormat>,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Exit with code 3 when the geometric mean of decode tok/s per stream (Total tok/s ÷ average
    /// active requests) candidate ÷ baseline is below R (e.g. 0.95), or when no cell has enough traffic on both sides.
    #[arg(long, value_name = "R")]
    pub fail_below: Option<f64>,
}

impl SourceArgs {
    /// The instant every query is evaluated at: `--at`, else now.
    fn instant(&self) -> anyhow::Result<SystemTime> {
        let Some(text) = &self.at else {
            return Ok(SystemTime::now());
        };
        parse_instant(text).ok_or_else(|| {
            anyhow::anyhow!(
                "--at {text:?}: expected an RFC 3339 time like 2026-12-01T14:00:00Z or Unix seconds like 1796133600"
            )
        })
    }

    fn client(&self) -> anyhow::Result<PromClient> {
        let timeout = crate::base::duration::parse_duration(&self.timeout)
            .map_err(|e| anyhow::anyhow!("--timeout {:?}: {e}", self.timeout))?;
        Ok(PromClient::new(
            &self.prometheus,
            self.prometheus_token.as_deref(),
            &self.headers,
            timeout.max(Duration::from_millis(100)),
        )?)
    }

    fn query(&self, fingerprint: Option<String>) -> anyhow::Result<FleetQuery> {
        let window = crate::base::duration::parse_duration(&self.window)
            .map_err(|e| anyhow::anyhow!("--window {:?}: {e}", self.window))?;
        let mut evidence = EvidenceRule::default();
        if let Some(n) = self.min_requests {
            evidence.min_requests = n;
        }
        Ok(FleetQuery {
            model: self.model.clone(),
            source: match self.source {
                TrafficSource::Production => Source::Production,
                TrafficSource::Synthetic => Source::Synthetic,
            },
            fingerprint,
            matchers: self
                .matchers
                .iter()
                .cloned()
                .chain(
                    self.tenant
                        .as_deref()
                        .map(|t| format!("tenant={}", quote(t))),
                )
                .chain(self.priority.map(|p| format!("priority=\"{}\"", p.label())))
                .collect(),
            window,
            evidence,
        })
    }
}

/// `--priority`: a band's label, or an integer (its band).
fn priority_band(text: &str) -> Result<PriorityBand, String> {
    PriorityBand::parse(text).ok_or_else(|| {
        format!(
            "`{text}` is not a priority band: expected {} or an integer",
            PriorityBand::ALL.map(PriorityBand::label).join(", ")
        )
    })
}

/// `--at`: RFC 3339, or Unix seconds (a fraction allowed, as Prometheus writes them).
fn parse_instant(text: &str) -> Option<SystemTime> {
    if let Some(time) = crate::base::wallclock::parse_rfc3339(text) {
        return Some(time);
    }
    let seconds: f64 = text.trim().parse().ok()?;
    // Up to the year 9999; beyond that it is a typo, not a time.
    if !(0.0..=253_402_300_799.0).contains(&seconds) {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a count of replicas, far below u32::MAX"
    )]
    let millis = (seconds * 1000.0).round() as i64;
    Some(crate::base::wallclock::from_unix_millis(millis))
}

pub async fn run(args: FleetArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        FleetCommand::Matrix(args) => matrix(&args).await,
        FleetCommand::Compare(args) => compare_command(&args).await,
    }
}

async fn matrix(args: &MatrixArgs) -> anyhow::Result<ExitCode> {
    let client = args.source.client()?;
    let query = args.source.query(args.fingerprint.clone())?;
    let doc = fleet_matrix(&client, &query, args.source.instant()?).await?;
    let format = args
        .format
        .unwrap_or(if super::matrix::to_terminal(args.output.as_deref()) {
            Format::Table
        } else {
            Format::Markdown
        });
    let text = format.render(&doc);
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}

async fn compare_command(args: &CompareArgs) -> anyhow::Result<ExitCode> {
    if let Some(value) = args.fail_below {
        anyhow::ensure!(
            value.is_finite() && value > 0.0,
            "--fail-below must be a positive ratio like 0.95, found {value}"
        );
    }
    let client = args.source.client()?;
    // Both sides at the same instant, so they cover the same window.
    let now = args.source.instant()?;
    let baseline = fleet_matrix(
        &client,
        &args.source.query(Some(args.baseline.clone()))?,
        now,
    )
    .await
    .with_context(|| format!("baseline {}", args.baseline))?;
    let candidate = fleet_matrix(
        &client,
        &args.source.query(Some(args.candidate.clone()))?,
        now,
    )
    .await
    .with_context(|| format!("candidate {}", args.candidate))?;
    let baseline_means = mean_ttft_ms(
        &client,
        &args.source.query(Some(args.baseline.clone()))?,
        &baseline,
        now,
    )
    .await?;
    let candidate_means = mean_ttft_ms(
        &client,
        &args.source.query(Some(args.candidate.clone()))?,
        &candidate,
        now,
    )
    .await?;
    let result = compare(
        &baseline,
        &candidate,
        &args.baseline,
        &args.candidate,
        Some((&baseline_means, &candidate_means)),
    );
    let format = args
        .format
        .unwrap_or(if super::matrix::to_terminal(args.output.as_deref()) {
            CompareFormat::Table
        } else {
            CompareFormat::Md
        });
    let text = match format {
        CompareFormat::Md => render_compare_markdown(&result),
        CompareFormat::Table => render_compare_table(&result),
        CompareFormat::Json => render_compare_json(&result),
        CompareFormat::Html => crate::matrix::html::render_diff_html(&result.diff),
    };
    write_output(args.output.as_deref(), &text)?;
    if let Some(threshold) = args.fail_below {
        match result.decode_tok_s_per_stream {
            Some(mean) if mean >= threshold => {}
            Some(mean) => {
                eprintln!("gate failed: decode tok/s per stream candidate ÷ baseline is {mean:.3}, below {threshold}");
                return Ok(ExitCode::from(EXIT_GATE_FAILED));
            }
            None => {
                eprintln!("gate failed: no cell has enough traffic on both sides");
                return Ok(ExitCode::from(EXIT_GATE_FAILED));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::parse_instant;
    use crate::base::wallclock::unix_millis;

    #[test]
    fn tenant_and_priority_become_matchers_of_every_query() {
        use clap::Parser as _;
        let cli = crate::app::cli::Cli::try_parse_from([
            "tokentap",
            "fleet",
            "matrix",
            "--prometheus",
            "http://127.0.0.1:9090",
            "--match",
            "cluster=\"eu\"",
            "--tenant",
            "se\"arch",
            "--priority",
            "12",
        ])
        .unwrap();
        let crate::app::cli::Command::Fleet(fleet) = cli.command else {
            panic!("not the fleet command");
        };
        let super::FleetCommand::Matrix(args) = fleet.command else {
            panic!("not fleet matrix");
        };
        let query = args.source.query(None).unwrap();
        assert_eq!(
            query.selector(Some("m")),
            r#"source="production",model="m",cluster="eu",tenant="se\"arch",priority="10+""#
        );
        let refused = crate::app::cli::Cli::try_parse_from([
            "tokentap",
            "fleet",
            "matrix",
            "--prometheus",
            "http://127.0.0.1:9090",
            "--priority",
            "urgent",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("expected negative, 0, 1-9, 10+ or an integer"),
            "{refused}"
        );
    }

    #[test]
    fn at_takes_rfc3339_and_unix_seconds() {
        let rfc = parse_instant("2026-12-01T14:00:00Z").map(unix_millis);
        assert_eq!(rfc, Some(1_796_133_600_000));
        assert_eq!(parse_instant("1796133600").map(unix_millis), rfc);
        assert_eq!(
            parse_instant(" 1796133600.25 ").map(unix_millis),
            Some(1_796_133_600_250)
        );
        for bad in [
            "",
            "yesterday",
            "-5",
            "1e30",
            "NaN",
            "inf",
            "2026-13-01T00:00:00Z",
        ] {
            assert_eq!(parse_instant(bad), None, "{bad:?}");
        }
    }
}
