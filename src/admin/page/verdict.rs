//! The verdict on top of the page: the headline first when availability is bad (the upstream
//! unavailable or the engine shedding: since when, the share, the last error), then per
//! model the clauses of `view::status` (availability, production against the SLO, beside the
//! sweep, headroom, drift, configuration), each linking to the figure it summarises on the
//! page and to the endpoint that serves it (an ok availability clause is a word beside the
//! upstream, its text on hover, so the matrices stay above the fold). Markup only.

use std::fmt::Write as _;

use crate::admin::view::{State, Status};
use crate::base::escape::xml_escape as escape;

/// The verdict section (empty models: the note).
pub fn fragment(status: &Status) -> String {
    let mut out = String::from("<section id=\"verdict\" class=\"verdict\"><h2>Verdict</h2>");
    if let Some(headline) = &status.headline {
        let _ = write!(
            out,
            "<p class=\"headline\" data-clause=\"{key}\" data-state=\"{state:?}\"><strong>{mark} {text}</strong> · <a href=\"{endpoint}\"><code>{endpoint}</code></a></p>",
            key = headline.key,
            state = headline.state,
            mark = headline.state.mark(),
            text = escape(&headline.text),
            endpoint = escape(&headline.endpoint),
        );
    }
    let _ = write!(
        out,
        "<p class=\"note\">Over the last {} (<a href=\"/status\">/status</a>, <code>tokentap status</code>).</p>",
        escape(&status.window)
    );
    if let Some(note) = &status.note {
        let _ = write!(out, "<p class=\"empty\">{}</p>", escape(note));
    }
    for model in &status.models {
        // An ok availability clause takes no line of its own (the matrices stay above the
        // fold): a word beside the upstream, its text on hover. A bad one is a line, and the
        // headline above.
        let available = model
            .clauses
            .iter()
            .find(|c| c.key == "availability" && c.state == State::Ok)
            .map_or_else(String::new, |c| {
                format!(
                    ", <span data-clause=\"availability\" data-state=\"{:?}\" title=\"{}\">{} answering</span>",
                    c.state,
                    escape(&c.text),
                    c.state.mark()
                )
            });
        let _ = write!(
            out,
            "<div class=\"verdict-model\" data-model=\"{m}\" data-state=\"{state:?}\"><p><strong>{mark} <code>{m}</code></strong> (upstream <code>{u}</code>{available}): {summary}</p><ul>",
            m = escape(&model.model),
            u = escape(&model.upstream),
            state = model.state,
            mark = model.state.mark(),
            summary = escape(&model.summary),
        );
        for clause in &model.clauses {
            if clause.key == "availability" && clause.state == State::Ok {
                continue;
            }
            // The page's own anchor, kept on this page (its query included).
            let anchor = clause.page.trim_start_matches('/');
            let _ = write!(
                out,
                "<li data-clause=\"{key}\" data-state=\"{state:?}\">{mark} <a href=\"{anchor}\">{text}</a> · <a href=\"{endpoint}\"><code>{endpoint}</code></a></li>",
                key = clause.key,
                state = clause.state,
                mark = clause.state.mark(),
                anchor = escape(anchor),
                text = escape(&clause.text),
                endpoint = escape(&clause.endpoint),
            );
        }
        out.push_str("</ul></div>");
    }
    out.push_str("</section>");
    out
}
