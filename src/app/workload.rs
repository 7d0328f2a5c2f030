//! `tokentap workload export` (a captured trace from the store) and `tokentap workload convert`
//! (a trace in any known format → tokentap or Mooncake JSONL).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context as _;

use crate::store::{Store, FILE_NAME};

use crate::workload::capture::MAX_EXPORT_ROWS;
use crate::workload::export::{write_export, ExportRows};
use crate::workload::trace::Trace;
use crate::workload::{render, TraceFormat};

/// Arguments of `tokentap workload`.
#[derive(Debug, clap::Args)]
pub struct WorkloadArgs {
    #[command(subcommand)]
    pub command: WorkloadCommand,
}

/// The workload commands.
#[derive(Debug, clap::Subcommand)]
pub enum WorkloadCommand {
    /// Write the captured production workload (`[workload] capture = true`) as a trace.
    ///
    /// Example: `tokentap workload export --store tokentap-data --window 1h > trace.jsonl`
    Export(ExportArgs),
    /// Convert a trace (tokentap JSONL, Mooncake JSONL or the Azure CSV, detected) to
    /// tokentap or Mooncake JSONL.
    ///
    /// Example: `tokentap workload convert AzureLLMInferenceTrace_conv.csv --format tokentap`
    Convert(ConvertArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The proxy's store directory (store.data_dir).
    #[arg(long, value_name = "DIR", default_value = "tokentap-data")]
    pub store: PathBuf,
    /// How far back from now (`1h`, `30m`, `7d`).
    #[arg(long, default_value = "1h")]
    pub window: String,
    #[arg(long, value_enum, default_value = "tokentap")]
    pub format: TraceFormat,
    /// Write here instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The trace to read.
    pub input: PathBuf,
    #[arg(long, value_enum, default_value = "tokentap")]
    pub format: TraceFormat,
    /// Write here instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub async fn run(args: WorkloadArgs) -> anyhow::Result<ExitCode> {
    let (trace, format, output) = match args.command {
        WorkloadCommand::Export(args) => {
            let window = crate::base::duration::parse_duration(&args.window)
                .map_err(|m| anyhow::anyhow!("--window {:?}: {m}", args.window))?;
            let rows = tokio::task::spawn_blocking(move || export(&args, window)).await??;
            eprintln!("{rows} request(s)");
            return Ok(ExitCode::SUCCESS);
        }
        WorkloadCommand::Convert(args) => {
            let trace = read_trace_file(&args.input)?;
            (trace, args.format, args.output)
        }
    };
    let text = render(&trace, format);
    match output {
        Some(path) => std::fs::write(&path, text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    eprintln!("{} request(s)", trace.requests.len());
    Ok(ExitCode::SUCCESS)
}

/// Streams the store's capture to the output page by page (as `GET /workload` does: memory
/// stays bounded whatever the capture's size); returns the rows written.
fn export(args: &ExportArgs, window: std::time::Duration) -> anyhow::Result<u64> {
    use std::io::Write as _;
    let from = SystemTime::now()
        .checked_sub(window)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let store = open_existing(&args.store)?;
    let mut rows = ExportRows::Store(
        store
            .workload_reader(from, MAX_EXPORT_ROWS)
            .context("cannot read the captured workload")?,
    );
    let mut out: Box<dyn std::io::Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut failed = None;
    write_export(&mut rows, args.format, |chunk| {
        match out.write_all(chunk.as_bytes()) {
            Ok(()) => true,
            Err(error) => {
                failed = Some(error);
                false
            }
        }
    })
    .context("cannot read the captured workload")?;
    let written = match failed {
        Some(error) => Err(error),
        None => out.flush(),
    };
    written.with_context(|| match &args.output {
        Some(path) => format!("cannot write {}", path.display()),
        None => "cannot write to stdout".to_string(),
    })?;
    Ok(rows.rows())
}

/// Reads a trace file in any known format; errors name the file.
pub fn read_trace_file(path: &Path) -> anyhow::Result<Trace> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    crate::workload::read_trace(&text)
        .with_context(|| format!("{} is not a trace tokentap reads", path.display()))
}

fn open_existing(dir: &Path) -> anyhow::Result<Store> {
    anyhow::ensure!(
        dir.join(FILE_NAME).is_file(),
        "{} holds no {FILE_NAME}: point --store at the proxy's store.data_dir",
        dir.display()
    );
    Store::open(dir).with_context(|| format!("cannot open the store in {}", dir.display()))
}
