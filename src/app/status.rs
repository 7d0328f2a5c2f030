//! `tokentap status`: the one verdict of a running proxy (`GET /status` on its admin listener,
//! through the same client as `tokentap reference` and `sweep --admin`), printed for a
//! terminal — first the headline when the verdict has one (an upstream unavailable or the
//! engine shedding: since when, the share, the last error), then per model its state and the
//! clause to act on first, then every clause (availability, SLO, sweep, headroom, drift,
//! configuration) with the figure it cites; then, per upstream, the route
//! table it is held to and the routes it serves that no table classifies — every line within
//! [`WIDTH`] columns. `--format json` prints the answer as it came.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use http::Method;
use serde_json::Value;

use super::sweep::Admin;
use crate::admin::view::NAMED_IN_STATUS;
use crate::base::escape::terminal_safe;

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
    // An unavailable or shedding upstream is the first line, before anything else.
    if let Some(text) = status["headline"]["text"].as_str() {
        wrap(
            &mut out,
            &format!("{} ", mark(&status["headline"]["state"])),
            "  ",
            text,
        );
    }
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
        // The headline's words once: a model whose summary it is points up to it.
        let summary = model["summary"].as_str().unwrap_or("");
        let summary = if !summary.is_empty() && status["headline"]["text"].as_str() == Some(summary)
        {
            "the headline above"
        } else {
            summary
        };
        wrap(&mut out, "", "    ", &format!("{head}{summary}"));
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
    render_routes(&mut out, status);
    out
}

/// The longest route name printed (a path the engine publishes: a hostile one may be long).
const MAX_ROUTE_CHARS: usize = 100;

/// One printable line of at most `max` characters: the upstream's names and paths reach the
/// terminal escaped (`terminal_safe`), never a line of their own.
fn one_line(text: &str, max: usize) -> String {
    let safe = terminal_safe(text, false);
    if safe.chars().count() <= max {
        return safe.into_owned();
    }
    let mut cut: String = safe.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The routes section: per upstream, the route table its self-description picked (the
/// version it said and how that fits the table) and the routes it publishes that no table
/// classifies, at most [`NAMED_IN_STATUS`] named (the count says the rest).
fn render_routes(out: &mut String, status: &Value) {
    let Some(routes) = status["routes"].as_array().filter(|r| !r.is_empty()) else {
        return;
    };
    out.push('\n');
    out.push_str("routes (the table each upstream is held to on the data port):\n");
    for clause in routes {
        let upstream = one_line(clause["upstream"].as_str().unwrap_or("?"), 40);
        let first = format!("  {} {upstream}: ", mark(&clause["state"]));
        let mut text = match (clause["engine"].as_str(), clause["table"].as_str()) {
            (Some(engine), Some(table)) => {
                let said = clause["version"]
                    .as_str()
                    .map_or_else(|| "no version said".to_string(), |v| one_line(v, 40));
                let frontend = one_line(clause["frontend"].as_str().unwrap_or("?"), 40);
                let fit = match clause["fit"].as_str() {
                    Some("newer_than_newest") => ", newer than the newest table",
                    Some("older_than_oldest") => ", older than the oldest table",
                    Some("version_unknown") => ", the newest table",
                    _ => "",
                };
                format!(
                    "{} {said}: route table {} ({frontend} frontend){fit}",
                    one_line(engine, 40),
                    one_line(table, 40)
                )
            }
            // Not described yet: the server's own words.
            _ => one_line(clause["text"].as_str().unwrap_or(""), 400),
        };
        let named: Vec<String> = clause["unclassified"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .take(NAMED_IN_STATUS)
            .map(|route| one_line(route, MAX_ROUTE_CHARS))
            .collect();
        let count = clause["unclassified_count"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(named.len())
            .max(named.len());
        if count > 0 {
            let more = count - named.len();
            let _ = write!(
                text,
                "; {count} route{} it serves that no table classifies, refused unless proxy.routes opens them: {}{}",
                if count == 1 { "" } else { "s" },
                named.join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            );
        } else if clause["unclassified_count"].is_null() && clause["table"].is_string() {
            text.push_str("; it publishes no route list");
        } else if clause["table"].is_string() {
            text.push_str("; every route it publishes is classified");
        }
        wrap(out, &first, "      ", &text);
    }
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

    #[test]
    fn the_headline_is_the_first_line() {
        let status = serde_json::json!({
            "window": "5m",
            "headline": {
                "key": "availability",
                "state": "bad",
                "text": "unavailable since 2026-01-01T12:00:03Z: upstream `default` (http://127.0.0.1:30000) does not answer (GET /v1/models, as /readyz asks: not ready); 10 of 12 requests in the window failed",
                "page": "/#verdict",
                "endpoint": "/readyz"
            },
            "models": [],
            "note": "no production request ended in the window"
        });
        let text = render(&status, "http://127.0.0.1:9464");
        assert!(
            text.starts_with("✗ unavailable since 2026-01-01T12:00:03Z"),
            "{text}"
        );
        assert!(text.lines().nth(1).unwrap().starts_with("  "), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
    }

    #[test]
    fn the_routes_section_names_the_table_and_a_bounded_escaped_list() {
        let hostile = "POST /x\u{1b}]52;c;aGk=\u{7}\n✗ forged line";
        let mut unclassified: Vec<String> = vec![hostile.to_string(), "GET /y".repeat(100)];
        unclassified.extend((0..20).map(|n| format!("POST /r{n}")));
        let status = serde_json::json!({
            "window": "5m",
            "models": [],
            "routes": [
                {
                    "upstream": "default",
                    "state": "warn",
                    "text": "…",
                    "engine": "vllm",
                    "version": "0.34.0",
                    "table": "0.34",
                    "frontend": "python",
                    "fit": "exact",
                    "unclassified_count": 25,
                    "unclassified": unclassified,
                },
                {
                    "upstream": "b",
                    "state": "ok",
                    "text": "0.5.23: held to sglang's route table for 0.5.23 (main frontend)",
                    "engine": "sglang",
                    "version": "0.5.23",
                    "table": "0.5.23",
                    "frontend": "main",
                    "fit": "exact",
                    "unclassified_count": 0,
                    "unclassified": [],
                },
                {
                    "upstream": "c",
                    "state": "unknown",
                    "text": "the upstream has not said what it is",
                    "unclassified": [],
                }
            ]
        });
        let text = render(&status, "http://127.0.0.1:9464");
        assert!(
            text.contains(
                "! default: vllm 0.34.0: route table 0.34 (python frontend); 25 routes it serves"
            ),
            "{text}"
        );
        assert!(text.contains("POST /r7"), "{text}");
        assert!(!text.contains("POST /r8,"), "ten named: {text}");
        assert!(text.contains("and 15 more"), "{text}");
        assert!(
            text.contains("✓ b: sglang 0.5.23: route table 0.5.23 (main frontend); every route"),
            "{text}"
        );
        assert!(
            text.contains("? c: the upstream has not said what it is"),
            "{text}"
        );
        // The hostile name is one escaped word: no escape byte, no line of its own.
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("✗ forged")), "{text}");
        assert!(text.contains("\\u{1b}]52"), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "{line}");
        }
    }
}
