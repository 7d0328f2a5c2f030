//! The verdict on top of the page: the headline first when availability is bad (the upstream
//! unavailable or the engine shedding: since when, the share, the last error), then per
//! model the clauses of `view::status` (availability, production against the SLO, beside the
//! sweep, headroom, drift, configuration), each linking to the figure it summarises on the
//! page and to the endpoint that serves it. Markup only.

use std::fmt::Write as _;

use crate::admin::view::Status;
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
        let _ = write!(
            out,
            "<div class=\"verdict-model\" data-model=\"{m}\" data-state=\"{state:?}\"><p><strong>{mark} <code>{m}</code></strong> (upstream <code>{u}</code>): {summary}</p><ul>",
            m = escape(&model.model),
            u = escape(&model.upstream),
            state = model.state,
            mark = model.state.mark(),
            summary = escape(&model.summary),
        );
        for clause in &model.clauses {
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
