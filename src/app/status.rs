//! `tokentap status`: the one verdict of a running proxy (`GET /status` on its admin listener,
//! through the same client as `tokentap reference` and `sweep --admin`), printed for a
//! terminal — per model, its state and the clause to act on first, then every clause (SLO,
//! sweep, headroom, drift, configuration) with the figure it cites — every line within
//! [`WIDTH`] columns. `--format json` prints the answer as it came.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use http::Method;
use serde_json::Value;

use super::sweep::Admin;

/// The widest line printed.
pub const WIDTH: usize = 120;

/// Arguments of `tokentap status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The admin API of the running `tokentap serve` (its admin.listen).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9464")]
    pub admin: String,
    /// Bearer token of the admin API (that proxy's admin.token). Default: the
    /// TOKENTAP_ADMIN__TOKEN environment variable.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TOKENTAP_ADMIN__TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// `text` for a terminal, `json` as the endpoint answers.
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
}

/// Runs the command: exit 0 whatever the verdict says (the verdict is the output).
pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(&args.admin, args.token.clone());
    let (status, answer) = admin.send(Method::GET, "/status", None).await?;
    if !status.is_success() {
        return Err(admin.refusal(&Method::GET, "/status", status, &answer));
    }
    match args.format {
        StatusFormat::Json => print!("{}", String::from_utf8_lossy(&answer)),
        StatusFormat::Text => {
            let value: Value = serde_json::from_slice(&answer)
                .map_err(|e| anyhow::anyhow!("{}/status answered no JSON: {e}", admin.base))?;
            // Served model ids and facts came from the upstream: shown, never obeyed.
            let text = render(&value, &admin.base);
            print!("{}", crate::base::escape::terminal_safe(&text, true));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `text` wrapped at word boundaries: the first line after `first`, the rest after `rest`,
/// every line within [`WIDTH`] columns (a word longer than a line is cut).
fn wrap(out: &mut String, first: &str, rest: &str, text: &str) {
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        let mut word = word.to_owned();
        let used = line.chars().count();
        let needed = word.chars().count() + usize::from(!empty);
        if !empty && used + needed > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        let room = WIDTH.saturating_sub(line.chars().count() + usize::from(!empty));
        if word.chars().count() > room {
            word = word.chars().take(room).collect();
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(&word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

fn mark(state: &Value) -> &'static str {
    match state.as_str() {
        Some("ok") => "✓",
        Some("warn") => "!",
        Some("bad") => "✗",
        _ => "?",
    }
}

/// The terminal rendering of a `/status` answer.
pub fn render(status: &Value, base: &str) -> String {
    let mut out = String::new();
    let window = status["window"].as_str().unwrap_or("?");
    wrap(
        &mut out,
        "",
        "  ",
        &format!("tokentap status of {base}, over the last {window}"),
    );
    if let Some(note) = status["note"].as_str() {
        wrap(&mut out, "  ", "  ", note);
    }
    for model in status["models"].as_array().into_iter().flatten() {
        out.push('\n');
        let head = format!(
            "{} {} (upstream {}): ",
            mark(&model["state"]),
            model["model"].as_str().unwrap_or("?"),
            model["upstream"].as_str().unwrap_or("?"),
        );
        wrap(
            &mut out,
            "",
            "    ",
            &format!("{head}{}", model["summary"].as_str().unwrap_or("")),
        );
        for clause in model["clauses"].as_array().into_iter().flatten() {
            let key = clause["key"].as_str().unwrap_or("?");
            let first = format!("  {} {key:<13} ", mark(&clause["state"]));
            let rest = " ".repeat(18);
            let mut text = clause["text"].as_str().unwrap_or("").to_owned();
            let _ = write!(
                text,
                " [{}{} · {}]",
                base,
                clause["endpoint"].as_str().unwrap_or(""),
                clause["page"].as_str().unwrap_or("")
            );
            wrap(&mut out, &first, &rest, &text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_fits_and_long_words_are_cut() {
        let status = serde_json::json!({
            "window": "5m",
            "models": [{
                "model": "m",
                "upstream": "default",
                "state": "bad",
                "summary": "no headroom: production misses the SLO (32K×4 meets TTFT ≤ 2 s on 84.8% of requests; objective 99.0%), whatever the sweep says",
                "clauses": [{
                    "key": "slo",
                    "state": "bad",
                    "text": format!("production misses the SLO {}", "x".repeat(300)),
                    "page": "/#production",
                    "endpoint": "/matrix?model=m&window=5m&source=production"
                }]
            }]
        });
        let text = render(&status, "http://127.0.0.1:9464");
        assert!(text.contains("32K×4 meets TTFT ≤ 2 s on 84.8%"), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
    }
}
