//! `GET /matrix?view=sessions`: what sessions do to the server, per model, since start — turns
//! by what came before them, the end-to-start gap distribution and the KV-retention curve (the
//! cached share the engine reported beside the share the previous turn had sent, by gap bin),
//! with the gap beyond which the prefix is lost named as the deployment's effective retention
//! (`meter::turn_stats`). JSON (`tokentap.sessions/v1`) or Markdown (`format=md`).

use http::{header, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::meter::conversation::After;
use crate::meter::turn_stats::{gap_label, ModelSessions, Retention, LOST_BELOW, MIN_TURNS};
use crate::proxy::body::ResponseBody;

use super::state::{json_error, respond, AdminState};

/// Whether a `/matrix` query asks for this view.
pub fn asks_for_sessions(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "view=sessions")
}

/// `GET /matrix?view=sessions[&model=M][&format=json|md]`.
pub fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let mut model = None;
    let mut markdown = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/markdown"));
    for pair in request.uri().query().unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match (key, value) {
            ("view", "sessions") => {}
            ("model", name) => model = Some(percent_decoded(name)),
            ("format", "json") => markdown = false,
            ("format", "md" | "markdown") => markdown = true,
            ("format", other) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("view=sessions has format json or md, not `{other}`"),
                )
            }
            (other, _) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    &format!("view=sessions takes model and format, not `{other}`"),
                )
            }
        }
    }
    let Some(turns) = &state.proxy.turns else {
        return json_error(
            StatusCode::NOT_FOUND,
            "sessions are off ([sessions] enabled = false): no request is a turn of anything",
        );
    };
    let models: Vec<_> = turns
        .stats()
        .snapshot()
        .into_iter()
        .filter(|(name, _)| model.as_deref().is_none_or(|m| m == &**name))
        .collect();
    let live = turns.table().len();
    if markdown {
        return respond(
            StatusCode::OK,
            "text/markdown; charset=utf-8",
            markdown_of(live, &models),
        );
    }
    let doc = json!({
        "schema": "tokentap.sessions/v1",
        "since": "start",
        "sessions_kept": live,
        "lost_below": LOST_BELOW,
        "min_turns": MIN_TURNS,
        "models": models.iter().map(|(name, figures)| model_json(name, figures)).collect::<Vec<_>>(),
    });
    respond(StatusCode::OK, "application/json", doc.to_string())
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|b| char::from(*b).to_digit(16))
                .and_then(|d| u8::try_from(d).ok())
        };
        match (byte, hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push(high * 16 + low);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn retention_json(retention: Retention) -> Value {
    match retention {
        Retention::Unknown => json!({"state": "unknown"}),
        Retention::Kept { up_to } => json!({"state": "kept", "kept_up_to": up_to}),
        Retention::Lost {
            kept_up_to,
            lost_from,
        } => json!({"state": "lost", "kept_up_to": kept_up_to, "lost_from": lost_from}),
    }
}

/// The retention in words.
pub fn retention_text(retention: Retention) -> String {
    match retention {
        Retention::Unknown => format!(
            "unknown: no gap bin has {MIN_TURNS} turns that resent an earlier turn's prompt with \
             their usage"
        ),
        Retention::Kept { up_to } => {
            format!("prefixes kept for every gap seen with evidence (up to {up_to})")
        }
        Retention::Lost {
            kept_up_to: Some(kept),
            lost_from,
        } => format!(
            "prefixes kept after gaps up to {kept}, lost after gaps in the bin up to {lost_from} \
             (realized cached share below half the theoretical)"
        ),
        Retention::Lost {
            kept_up_to: None,
            lost_from,
        } => format!(
            "prefixes lost already after gaps up to {lost_from} (realized cached share below \
             half the theoretical)"
        ),
    }
}

fn model_json(name: &str, figures: &ModelSessions) -> Value {
    let turns: serde_json::Map<String, Value> = After::ALL
        .iter()
        .zip(figures.turns)
        .map(|(after, count)| (after.label().to_owned(), json!(count)))
        .collect();
    let bins: Vec<Value> = figures
        .bins
        .iter()
        .enumerate()
        .map(|(bin, figures)| {
            json!({
                "gap_le": gap_label(bin),
                "user_turns": figures.turns[0],
                "tool_turns": figures.turns[1],
                "counted_turns": figures.counted,
                "prompt_tokens": figures.prompt_tokens,
                "cached_tokens": figures.cached_tokens,
                "realized_cached_share": figures.realized_share(),
                "theoretical_share": figures.theoretical_share(),
                "mean_ttft_seconds": figures.mean_ttft(),
            })
        })
        .collect();
    let retention = figures.retention();
    json!({
        "model": name,
        "sessions": figures.sessions(),
        "turns": turns,
        "max_turn": figures.max_turn,
        "retention": retention_json(retention),
        "retention_text": retention_text(retention),
        "gap_bins": bins,
    })
}

fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{:.1} %", v * 100.0))
}

fn markdown_of(live: usize, models: &[(std::sync::Arc<str>, ModelSessions)]) -> String {
    let mut out = format!("# Sessions (since start)\n\nSessions kept now: {live}\n");
    if models.is_empty() {
        out.push_str("\nNo production request has been a turn of a session yet.\n");
    }
    for (name, figures) in models {
        let [first, user, tool, overlap] = figures.turns;
        out.push_str(&format!(
            "\n## {name}\n\nSessions: {first} · turns after a user: {user} · after a tool: {tool} \
             · overlapping: {overlap} · longest session: {} turns\n\nRetention: {}\n\n\
             | gap ≤ | user turns | tool turns | realized cached | theoretical | mean TTFT |\n\
             |---|---:|---:|---:|---:|---:|\n",
            figures.max_turn,
            retention_text(figures.retention()),
        ));
        for (bin, row) in figures.bins.iter().enumerate() {
            if row.turns == [0, 0] {
                continue;
            }
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                gap_label(bin),
                row.turns[0],
                row.turns[1],
                share(row.realized_share()),
                share(row.theoretical_share()),
                row.mean_ttft()
                    .map_or_else(|| "–".to_owned(), |s| format!("{:.0} ms", s * 1000.0)),
            ));
        }
    }
    out
}
