//! Logs on stderr, filtered by `RUST_LOG` (default `info`): human-readable lines, coloured only
//! when stderr is a terminal (a pipe, a file or journald gets no ANSI codes), or one JSON object
//! per line (`--log-format json`, for a log shipper).
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event (timestamp, level, target, fields).
    Json,
}

/// Install the global log subscriber once; later calls are no-ops.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}
