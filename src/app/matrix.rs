//! `tokentap matrix show|diff|import|capacity`: reads files, calls the pure renderers and the diff, writes
//! the result, and turns a failed gate into exit code 3. `matrix/` itself stays pure and never
//! decides an exit code.

use std::io::{IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::matrix::Format;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::matrix::diff::{self, DiffColumn, Gate};
use crate::matrix::file::load;

/// Exit code of `matrix diff` when the gate fails (1 is any other error, 2 a usage error).
pub const EXIT_GATE_FAILED: u8 = 3;

/// Render, compare and import speed-test matrices.
///
/// A matrix is read from any of three formats, detected from the content: a seed page's text
/// (first line `Speed test matrix`), tokentap's Markdown (first line `# Speed test matrix`) or
/// tokentap's JSON (schema `tokentap.matrix/v1`). The schema is documented in docs/matrix.md.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    #[command(subcommand)]
    pub command: MatrixCommand,
}

#[derive(Debug, Subcommand)]
pub enum MatrixCommand {
    /// Render a matrix as Markdown (like the seed page), JSON, CSV, an HTML report or SVG charts;
    /// with --store, list or render the production snapshots a proxy kept.
    Show(ShowArgs),
    /// Compare two matrices cell by cell (ratios B ÷ A), optionally gating a deployment in CI.
    ///
    /// Exit codes: 0 when the gate passes (or none is set), 3 when it fails, 1 when an input
    /// cannot be read, 2 for bad arguments.
    Diff(DiffArgs),
    /// Convert a seed page (or tokentap Markdown) into the JSON document.
    Import(ImportArgs),
    /// Capacity under an SLO: per context, the largest number of simultaneous requests whose
    /// cell meets the targets, the goodput and total tok/s there, and which target stops it.
    ///
    /// Works on any matrix: a sweep, a production window (`/matrix?format=json`), a fleet
    /// matrix, a seed page. Cells are judged by SLO attainment where they have it (the share of
    /// requests that met the targets they were measured against), else by their medians
    /// (--basis chooses: p90 or p99 tails, attainment only, medians only); the answer says
    /// which. Only Valid cells count: Low evidence, Off target, Over capacity and Error cells
    /// are listed as excluded.
    ///
    /// Examples:
    ///   tokentap matrix capacity sweep.json --slo ttft=2s,tbt=50ms
    ///   tokentap matrix capacity page.txt --slo tbt=30ms --basis p99 --format html -o cap.html
    Capacity(CapacityArgs),
}

/// The SLO of a capacity question, shared by `matrix capacity` and `matrix show`.
#[derive(Debug, Clone, Args)]
pub struct SloArgs {
    /// Latency targets: comma-separated ttft=, tbt=, e2e= with durations (500ms, 2s, 1m), as
    /// in the x-tokentap-slo header. End to end is estimated as TTFT + TBT × (output − 1).
    #[arg(long, value_name = "TARGETS")]
    pub slo: Option<String>,
    /// Share of requests that must meet the targets when a cell is judged by its SLO
    /// attainment (0–1).
    #[arg(long, value_name = "SHARE", default_value_t = 0.95)]
    pub attainment: f64,
    /// What a cell is judged by: auto (SLO attainment where the cell has it, else medians),
    /// attainment, median, p90 or p99.
    #[arg(long, value_name = "BASIS", default_value = "auto")]
    pub basis: String,
    /// Output tokens per request for the end-to-end estimate. Default: the matrix's max
    /// output tokens.
    #[arg(long, value_name = "N")]
    pub output_tokens: Option<u64>,
}

impl SloArgs {
    /// The query, or an error naming the flag.
    pub fn query(&self) -> anyhow::Result<Option<crate::matrix::capacity::CapacityQuery>> {
        use crate::matrix::capacity::{Basis, CapacityQuery, Targets};
        let Some(text) = &self.slo else {
            return Ok(None);
        };
        let parsed =
            crate::meter::slo::SloTargets::parse_header(text.as_bytes()).map_err(|error| {
                anyhow::anyhow!("--slo {text:?}: {error} (write e.g. ttft=2s,tbt=50ms)")
            })?;
        let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        let basis = Basis::parse(&self.basis).ok_or_else(|| {
            anyhow::anyhow!(
                "--basis {:?}: expected auto, attainment, median, p90 or p99",
                self.basis
            )
        })?;
        Ok(Some(CapacityQuery {
            targets: Targets {
                ttft_ms: ms(parsed.ttft),
                tbt_ms: ms(parsed.tbt),
                e2e_ms: ms(parsed.e2e),
            },
            attainment: self.attainment,
            basis,
            output_tokens: self.output_tokens,
        }))
    }
}

/// Output formats of `matrix capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CapacityFormat {
    /// A Markdown table, one row per context.
    Md,
    /// JSON (schema tokentap.capacity/v1).
    Json,
    /// A self-contained HTML page: the heat map with the capacity line, and the table.
    Html,
    /// Aligned columns for a terminal, at most 120 characters wide.
    Table,
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// The matrix file: seed page text, Markdown or JSON; `-` reads standard input.
    pub file: PathBuf,
    #[command(flatten)]
    pub slo: SloArgs,
    /// Output format. Default: `table` on a terminal, `md` in a pipe or with --output.
    #[arg(long, short, value_enum)]
    pub format: Option<CapacityFormat>,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Also advise the engine's own limits from the capacity and the measured prefill rate:
    /// the concurrency cap (sglang --max-running-requests, vLLM --max-num-seqs) and the queue
    /// caps (vLLM --max-num-queued-tokens and --max-num-queued-reqs, sglang
    /// --max-queued-requests), each with the figures it came from (docs/capacity.md). With
    /// --format json the advice alone (schema tokentap.engine-advice/v1); md and table: after
    /// the capacity.
    #[arg(long)]
    pub advise: bool,
}

/// The renderings `matrix show` offers.
pub const SHOW_FORMATS: [Format; 8] = Format::ALL;

/// Output formats of `matrix diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// Markdown: summary, status changes, ratio grid, every ratio of every cell.
    Md,
    /// JSON (schema tokentap.matrix-diff/v1).
    Json,
    /// A self-contained HTML page with the ratio grid as a heat map.
    Html,
    /// Aligned columns for a terminal (B ÷ A per cell), at most 120 characters wide.
    Table,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The matrix file: seed page text, Markdown or JSON; `-` reads standard input.
    /// Not needed with --store.
    #[arg(required_unless_present = "store", conflicts_with = "store")]
    pub file: Option<PathBuf>,
    /// Read the production-matrix snapshots of this store directory (the proxy's
    /// store.data_dir) instead of a file. Without --at: list them. Default: off.
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// With --store: render the latest snapshot taken at or before TIME (RFC 3339, e.g.
    /// 2025-06-01T12:00:00Z), or `latest`. Default: list the snapshots instead.
    #[arg(long, value_name = "TIME", requires = "store")]
    pub at: Option<String>,
    /// With --store: only snapshots of this served model. Default: every model.
    #[arg(long, value_name = "NAME", requires = "store")]
    pub model: Option<String>,
    /// With --store: the snapshots of one tenant's requests (`[tenants]`: a name of the
    /// allow list, or `other`). Default: every request.
    #[arg(long, value_name = "NAME", requires = "store")]
    pub tenant: Option<String>,
    /// Output format.
    /// table (the seed page's grid: contexts × concurrency, total tok/s over TTFT, at most 120
    /// columns), list (every figure of every cell, one row each), md (the seed page's layout;
    /// imports back), json, csv, html (heat map, charts, table), svg (charts) or llmd (llm-d
    /// benchmark reports, schema 0.2.1: a JSON array of one report per measured cell, tokentap's
    /// own figures under results.observability.tokentap; see docs/matrix.md).
    /// Default: table on a terminal, md when written to a pipe or a file.
    #[arg(long, short, value_parser = super::output::format_parser(&SHOW_FORMATS))]
    pub format: Option<Format>,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// With --format html (or md): draw each context's capacity under this SLO on the heat
    /// map (the capacity cell outlined, the cells beyond it hatched). See `matrix capacity`.
    #[command(flatten)]
    pub capacity: SloArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The baseline matrix A (seed text, Markdown or JSON).
    pub a: PathBuf,
    /// The matrix B compared with A; every ratio is B ÷ A.
    pub b: PathBuf,
    /// Output format. Default: `table` on a terminal, `md` in a pipe or with --output.
    #[arg(long, short, value_enum)]
    pub format: Option<DiffFormat>,
    /// Write the diff to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// The column whose geometric-mean ratio (over cells Valid in both) --fail-below and
    /// --fail-above check. Prefill columns use prefill rows Valid in both.
    #[arg(long, value_enum, default_value_t = DiffColumn::TotalTokS)]
    pub column: DiffColumn,
    /// Exit with code 3 when the geometric mean of the --column ratios B ÷ A is below R
    /// (e.g. 0.95: "B may be at most 5% slower"). Also fails when no cell is Valid in both.
    /// Default: not checked.
    #[arg(long, value_name = "R")]
    pub fail_below: Option<f64>,
    /// Exit with code 3 when the geometric mean of the --column ratios B ÷ A is above R
    /// (e.g. `--column ttft_ms --fail-above 1.1`). Default: not checked.
    #[arg(long, value_name = "R")]
    pub fail_above: Option<f64>,
    /// Exit with code 3 when any cell or prefill row changed status (e.g. Valid → Error, or
    /// present in only one matrix). Default: off.
    #[arg(long)]
    pub fail_on_status_change: bool,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The seed page text (or tokentap Markdown) to convert; `-` reads standard input.
    pub file: PathBuf,
    /// Write the JSON to this file instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

pub async fn run(args: MatrixArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        MatrixCommand::Show(args) => show(&args),
        MatrixCommand::Diff(args) => diff_command(&args),
        MatrixCommand::Import(args) => import(&args),
        MatrixCommand::Capacity(args) => capacity_command(&args),
    }
}

fn capacity_command(args: &CapacityArgs) -> anyhow::Result<ExitCode> {
    let query = args
        .slo
        .query()?
        .ok_or_else(|| anyhow::anyhow!("give the SLO with --slo, e.g. --slo ttft=2s,tbt=50ms"))?;
    let doc = load(&args.file)?;
    let report = crate::matrix::capacity::capacity(&doc, &query)?;
    let format = args
        .format
        .unwrap_or(if to_terminal(args.output.as_deref()) {
            CapacityFormat::Table
        } else {
            CapacityFormat::Md
        });
    if args.advise {
        use crate::matrix::advise::{advise, render_advice_json, render_advice_markdown};
        let advice = advise(&doc, &report);
        let text = match format {
            CapacityFormat::Json => render_advice_json(&advice),
            CapacityFormat::Md => format!(
                "{}\n{}",
                crate::matrix::capacity::render_capacity_markdown(&report),
                render_advice_markdown(&advice)
            ),
            CapacityFormat::Table => format!(
                "{}\n{}",
                crate::matrix::capacity::render_capacity_table(&report),
                render_advice_markdown(&advice)
            ),
            CapacityFormat::Html => {
                anyhow::bail!("--advise writes md, table or json, not html")
            }
        };
        write_output(args.output.as_deref(), &text)?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = match format {
        CapacityFormat::Md => crate::matrix::capacity::render_capacity_markdown(&report),
        CapacityFormat::Json => crate::matrix::capacity::render_capacity_json(&report),
        CapacityFormat::Html => crate::matrix::html::render_html_with_capacity(&doc, &report),
        CapacityFormat::Table => crate::matrix::capacity::render_capacity_table(&report),
    };
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}

/// Whether a rendering goes to a terminal (no `--output` file, stdout a terminal): there the
/// default is the aligned table within 120 columns, elsewhere Markdown, as `matrix show` does.
pub(super) fn to_terminal(output: Option<&Path>) -> bool {
    use std::io::IsTerminal as _;
    output.is_none() && std::io::stdout().is_terminal()
}

/// Writes a rendering to `output`, or to standard output (flushed) when there is none.
pub(super) fn write_output(output: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            // Names in a rendering came from upstreams and clients (served model ids, facts,
            // tenants): on standard output, their control characters are shown, never obeyed.
            // JSON escapes them itself.
            let machine = text.trim_start().starts_with(['{', '[']);
            let text = if machine {
                std::borrow::Cow::Borrowed(text)
            } else {
                crate::base::escape::terminal_safe(text, true)
            };
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .context("cannot write to standard output")
        }
    }
}

fn show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let doc = match (&args.file, &args.store) {
        (_, Some(dir)) => {
            match super::store::snapshot_for_show(
                dir,
                args.at.as_deref(),
                args.model.as_deref(),
                args.tenant.as_deref(),
            )? {
                Some(doc) => doc,
                None => {
                    let listing = super::store::list_snapshots(
                        dir,
                        args.model.as_deref(),
                        args.tenant.as_deref(),
                    )?;
                    write_output(args.output.as_deref(), &listing)?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        (Some(file), None) => load(file)?,
        (None, None) => anyhow::bail!("give a matrix file, or --store DIR"),
    };
    let capacity = match args.capacity.query()? {
        Some(query) => Some(crate::matrix::capacity::capacity(&doc, &query)?),
        None => None,
    };
    let format = args.format.unwrap_or_else(|| {
        if args.output.is_none() && std::io::stdout().is_terminal() {
            Format::Table
        } else {
            Format::Markdown
        }
    });
    let text = match (format, &capacity) {
        (Format::Markdown, Some(report)) => format!(
            "{}\n{}",
            format.render(&doc),
            crate::matrix::capacity::render_capacity_markdown(report).replacen("# ", "## ", 1)
        ),
        (Format::Html, Some(report)) => {
            crate::matrix::html::render_html_with_capacity(&doc, report)
        }
        (Format::Table | Format::List, Some(report)) => format!(
            "{}\n{}",
            format.render(&doc),
            crate::matrix::capacity::render_capacity_table(report)
        ),
        (format, _) => format.render(&doc),
    };
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}

fn import(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let doc = load(&args.file)?;
    write_output(args.output.as_deref(), &crate::matrix::render_json(&doc))?;
    Ok(ExitCode::SUCCESS)
}

fn diff_command(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    for (flag, value) in [
        ("--fail-below", args.fail_below),
        ("--fail-above", args.fail_above),
    ] {
        if let Some(value) = value {
            anyhow::ensure!(
                value.is_finite() && value > 0.0,
                "{flag} must be a positive ratio like 0.95, found {value}"
            );
        }
    }
    let a = load(&args.a)?;
    let b = load(&args.b)?;
    // A sweep shaped like production and one by the seed method answer different questions
    // (`matrix::doc::LIKE_PRODUCTION`): their figures are never set side by side.
    anyhow::ensure!(
        a.like_production() == b.like_production(),
        "{} was measured with requests shaped like production and {} with the seed method's identical warm streams: their figures answer different questions and are not compared (diff two matrices of the same shape)",
        if a.like_production() { args.a.display() } else { args.b.display() },
        if a.like_production() { args.b.display() } else { args.a.display() },
    );
    let mut result = diff::diff(&a, &b);
    result.a.label = args.a.display().to_string();
    result.b.label = args.b.display().to_string();
    let format = args
        .format
        .unwrap_or(if to_terminal(args.output.as_deref()) {
            DiffFormat::Table
        } else {
            DiffFormat::Md
        });
    let text = match format {
        DiffFormat::Md => diff::render_diff_markdown(&result),
        DiffFormat::Json => diff::render_diff_json(&result),
        DiffFormat::Html => crate::matrix::html::render_diff_html(&result),
        DiffFormat::Table => crate::matrix::table::render_diff_table(&result),
    };
    write_output(args.output.as_deref(), &text)?;
    let gate = Gate {
        column: args.column,
        fail_below: args.fail_below,
        fail_above: args.fail_above,
        fail_on_status_change: args.fail_on_status_change,
    };
    let failures = diff::evaluate_gate(&result, &gate);
    if failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for failure in &failures {
        eprintln!("gate failed: {failure}");
    }
    Ok(ExitCode::from(EXIT_GATE_FAILED))
}
