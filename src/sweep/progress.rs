//! Progress on stderr for `tokentap sweep` and `tokentap demo`.
//!
//! On a terminal: one line redrawn in place by `indicatif` (a bar of measurements done, then the
//! status line), cut to the terminal's width so it never wraps, redraws rate-limited. Otherwise
//! (a pipe, a log file, CI): one plain line per cell (and per pause or state change), not one
//! per phase or per second, so the output stays readable when it is kept.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::status::SweepStatus;

/// The progress display of one command. Nothing is printed when it is disabled (`--quiet`).
#[derive(Debug)]
pub struct ProgressLine {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Off,
    /// The live line; `None` between [`ProgressLine::done`] and the next update.
    Terminal(Option<ProgressBar>),
    /// One line per phase; `last` is the phase of the line written last.
    Plain {
        out: PlainOut,
        last: String,
    },
}

/// Where plain lines go: stderr, or a buffer in tests.
enum PlainOut {
    Stderr,
    #[cfg(test)]
    Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

impl std::fmt::Debug for PlainOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlainOut")
    }
}

impl ProgressLine {
    /// A live line when stderr is a terminal, plain lines otherwise; nothing when `!enabled`.
    pub fn new(enabled: bool) -> Self {
        let mode = if !enabled {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Terminal(None)
        } else {
            Mode::Plain {
                out: PlainOut::Stderr,
                last: String::new(),
            }
        };
        Self { mode }
    }

    /// Shows a sweep's status: its measurements as the bar, its status line as the message.
    pub fn show(&mut self, status: &SweepStatus) {
        let progress = &status.progress;
        self.update(
            &status.progress_line(),
            Some((progress.measurements_done, progress.measurements_total)),
        );
    }

    /// Shows a line of a phase that has no sweep status (`done` of `total` steps, if counted).
    pub fn message(&mut self, line: &str, steps: Option<(usize, usize)>) {
        self.update(line, steps);
    }

    fn update(&mut self, line: &str, steps: Option<(usize, usize)>) {
        match &mut self.mode {
            Mode::Off => {}
            Mode::Terminal(bar) => {
                let bar = bar.get_or_insert_with(live_bar);
                if let Some((done, total)) = steps {
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                }
                bar.set_message(line.to_owned());
            }
            Mode::Plain { out, last } => {
                let key = phase_key(line);
                // A line that names no cell between two cells of the same state ("running ·
                // 3/4 measurements") is no news either.
                let between_cells = !key.contains(" · ") && last.starts_with(&format!("{key} · "));
                if key != *last && !between_cells {
                    *last = key;
                    out.write_line(line);
                }
            }
        }
    }

    /// Ends the live line, leaving its last state on screen, so that what is printed next
    /// starts on a line of its own. The next update starts a new line.
    pub fn done(&mut self) {
        if let Mode::Terminal(bar) = &mut self.mode {
            if let Some(bar) = bar.take() {
                bar.finish();
                // indicatif leaves the cursor after the last column of the finished line and
                // counts on the terminal to wrap; a terminal that defers the wrap would put
                // what comes next on the same line.
                if !bar.is_hidden() {
                    let _ = writeln!(std::io::stderr().lock());
                }
            }
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        self.done();
    }
}

impl PlainOut {
    fn write_line(&self, line: &str) {
        match self {
            // A closed stderr is no reason to stop a sweep.
            PlainOut::Stderr => {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            }
            #[cfg(test)]
            PlainOut::Buffer(buffer) => {
                if let Ok(mut buffer) = buffer.lock() {
                    let _ = writeln!(buffer, "{line}");
                }
            }
        }
    }
}

/// The live line on stderr: a spinner (it moves while a long cell gives no news), a bar of the
/// steps done, and the message cut to what is left of the terminal's width.
fn live_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} [{bar:20}] {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

/// What identifies a cell in a status line: the line without its clocks (`· ETA …`,
/// `· elapsed …`), which change every second, its count of measurements done (it moves when a
/// cell ends, while the line still names that cell) and the cell's phase (warm-up, window,
/// drain), so a plain log gets one line per cell. A pause or a new state is news, and stays.
fn phase_key(line: &str) -> String {
    let line = line.split(" · ETA").next().unwrap_or(line);
    let line = line.split(" · elapsed").next().unwrap_or(line);
    line.split(" · ")
        .filter(|part| !part.ends_with(" measurements"))
        .map(|part| {
            [" warm-up", " window", " drain"]
                .iter()
                .find_map(|phase| part.strip_suffix(phase))
                .unwrap_or(part)
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on what it asserts")]
    use super::*;
    use std::sync::{Arc, Mutex};

    fn plain() -> (ProgressLine, Arc<Mutex<Vec<u8>>>) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let line = ProgressLine {
            mode: Mode::Plain {
                out: PlainOut::Buffer(Arc::clone(&buffer)),
                last: String::new(),
            },
        };
        (line, buffer)
    }

    #[test]
    fn without_a_terminal_one_line_per_cell_not_per_phase_or_tick() {
        let (mut progress, buffer) = plain();
        for line in [
            "running · 1K × 1 warm-up · 0/4 measurements · elapsed 1s",
            "running · 1K × 1 warm-up · 0/4 measurements · elapsed 2s",
            "running · 1K × 1 window · 0/4 measurements · ETA 30s · elapsed 3s",
            "running · 1K × 1 window · 0/4 measurements · ETA 29s · elapsed 4s",
            "running · 1K × 1 drain · 1/4 measurements · ETA 25s · elapsed 8s",
            "running · 1/4 measurements · ETA 25s · elapsed 8s",
            "running · 1K × 1 (paused for production traffic) · 1/4 measurements · elapsed 9s",
            "running · 1K × 2 warm-up · 1/4 measurements · ETA 20s · elapsed 11s",
            "running · 1K × 2 window · 1/4 measurements · ETA 20s · elapsed 12s",
        ] {
            progress.message(line, None);
        }
        progress.done();
        progress.message("finished · 4/4 measurements · elapsed 40s", None);
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "running · 1K × 1 warm-up · 0/4 measurements · elapsed 1s",
                "running · 1K × 1 (paused for production traffic) · 1/4 measurements · elapsed 9s",
                "running · 1K × 2 warm-up · 1/4 measurements · ETA 20s · elapsed 11s",
                "finished · 4/4 measurements · elapsed 40s",
            ]
        );
        assert!(!text.contains('\r') && !text.contains('\u{1b}'), "{text:?}");
    }

    #[test]
    fn disabled_prints_nothing_and_hidden_bars_do_not_fail() {
        let mut off = ProgressLine::new(false);
        off.message("x", Some((1, 2)));
        off.done();
        // The live mode's calls on a bar drawing nowhere (no terminal under the test runner).
        let mut live = ProgressLine {
            mode: Mode::Terminal(Some(ProgressBar::hidden())),
        };
        live.message("running", Some((1, 4)));
        live.done();
        live.message("again", Some((5, 4)));
        live.done();
    }
}
