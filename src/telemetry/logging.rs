//! Logs on stderr, filtered by `RUST_LOG` (default `info`; a level and `target=level` directives): human-readable lines, coloured only
//! when stderr is a terminal (a pipe, a file or journald gets no ANSI codes), or one JSON object
//! per line (`--log-format json`, for a log shipper).
use std::io::IsTerminal;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event (timestamp, level, target, fields).
    Json,
}

/// The filter `RUST_LOG` asks for: a default level and per-target levels
/// (`info`, `warn,tokentap::sweep=debug`); `info` when it is unset or unreadable. Targets, not
/// `EnvFilter`: the same directives without span-field matching, and without the regex engine
/// `EnvFilter` compiles in (regex-automata and regex-syntax, among the slowest crates of a cold build).
fn filter() -> Targets {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|text| text.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

/// Install the global log subscriber once; later calls are no-ops.
pub fn init(format: LogFormat) {
    // The fmt builder stops at INFO unless told otherwise, whatever the filter layered on it
    // says: `RUST_LOG=debug` printed nothing. The filter below decides; the builder lets all
    // through to it.
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(LevelFilter::TRACE);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(filter())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .finish()
            .with(filter())
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_directives_read_as_targets() {
        let parsed: Targets = "warn,tokentap::sweep=debug".parse().unwrap();
        assert_eq!(parsed.default_level(), Some(LevelFilter::WARN));
        assert!(parsed.would_enable("tokentap::sweep::runner", &tracing::Level::DEBUG));
        assert!(!parsed.would_enable("tokentap::proxy", &tracing::Level::INFO));
        let bare: Targets = "info".parse().unwrap();
        assert_eq!(bare.default_level(), Some(LevelFilter::INFO));
    }
}
