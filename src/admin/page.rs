//! `GET /`: the admin page — production ÷ the latest sweep on one grid (shared axes, a fixed
//! scale around ×1, the "why" in each cell), then the two heat maps on the same axes and
//! colour scale, one self-contained HTML document (inline CSS, no scripts, no external
//! assets) that reloads itself every [`REFRESH_SECONDS`] with a meta refresh, so everything is
//! in the DOM without JavaScript. Query: `window=` (1m … 24h, `all`), `model=`, and `tenant=`,
//! `priority=` (the production side narrowed to one tenant or priority band; the filters and
//! the per-priority table are `slices.rs`). Below the
//! grids: the drift grid (production ÷ the reference pinned for the model,
//! when one is) and the production "All measurements" table (prefill rows included).
//! Under the header: each upstream's configuration (fingerprint, engine, version) and, when it
//! changed since start, a marker with the time and the field-by-field difference of the facts
//! (`config_fragment`).
//!
//! Builds only markup around `matrix::html` fragments; figures come from `admin::matrix`.

use std::fmt::Write as _;
use std::time::SystemTime;

use http::{Request, Response, StatusCode};

use crate::aggregate::Window;
use crate::base::escape::xml_escape as escape;
use crate::base::wallclock::format_rfc3339;
use crate::matrix::compare::{ratio_grid_fragment as drift_grid_fragment, MatrixCompare};
use crate::matrix::doc::MatrixDoc;
use crate::matrix::html::{
    grid_fragment_marked, grid_fragment_on, heat_scale_max, measurements_fragment, page,
};
use crate::matrix::side_by_side::{comparison_fragment, Axes};
use crate::matrix::units::{context_label, format_percent};
use crate::proxy::body::ResponseBody;

use super::capacity::CapacityAnswer;
use super::matrix::{
    check_slice, production_matrix, production_matrix_sliced, synthetic_matrix, FingerprintChoice,
    MatrixQuery, NO_SWEEP,
};
use super::query::query_escape;
use super::state::{json_error, respond, AdminState};

/// How often the page reloads itself.
pub const REFRESH_SECONDS: u32 = 10;

/// Windows offered as links.
const WINDOW_LINKS: [&str; 6] = ["5m", "15m", "1h", "6h", "24h", "all"];

/// Extra layout for the two panels side by side (the matrix stylesheet does the rest).
const PAGE_STYLE: &str = "<style>.panel>h2{margin-top:8px}.windows a{margin-right:8px}.windows a.current{font-weight:700;text-decoration:none;color:inherit}.empty{color:#57606a;font-style:italic}</style>";

/// `GET /`.
pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let query = match MatrixQuery::parse(
        request.uri().query(),
        &["window", "model", "tenant", "priority"],
    ) {
        Ok(query) => query,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    if let Err(message) = check_slice(state, &query) {
        return json_error(StatusCode::BAD_REQUEST, &message);
    }
    let production = production_matrix_sliced(
        state,
        query.window,
        query.model.as_deref(),
        FingerprintChoice::Current,
        &query.slice,
    );
    let synthetic = match synthetic_matrix(state).await {
        Ok(doc) => doc,
        Err(error) => {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "store read failed"
            );
            None
        }
    };
    // No reference pinned (or no traffic) simply leaves the drift grid out.
    let drift =
        super::matrix::production_compare(state, query.window, query.model.as_deref(), None).ok();
    let capacity = super::capacity::all_models(state, SystemTime::now());
    let html = render(
        production.as_ref(),
        synthetic.as_deref(),
        drift.as_ref(),
        Some(&capacity),
        query.window,
        query.model.as_deref(),
        SystemTime::now(),
    );
    // The model the production side shows (the busiest one when none is named).
    // A slice with no traffic in the window names no model: then the window's busiest.
    let shown_model = query
        .model
        .clone()
        .or_else(|| {
            production
                .as_ref()
                .and_then(|doc| doc.metadata.model.served_model.clone())
        })
        .or_else(|| {
            production_matrix(state, query.window, None)
                .and_then(|doc| doc.metadata.model.served_model)
        });
    let slices = super::slices::fragment(
        state,
        query.window,
        shown_model.as_deref(),
        &query.slice,
        SystemTime::now(),
    );
    let html = with_after_header(html, &format!("{slices}{}", config_fragment(state)));
    let html = match super::session::session_of(state, request) {
        Some(session) => with_controls(html, &super::session::page_controls(state, &session)),
        None => html,
    };
    respond(StatusCode::OK, "text/html; charset=utf-8", html)
}

/// The page for these documents (pure; `now` is printed as the refresh time).
pub fn render(
    production: Option<&MatrixDoc>,
    synthetic: Option<&MatrixDoc>,
    drift: Option<&MatrixCompare>,
    capacity: Option<&CapacityAnswer>,
    window: Window,
    model: Option<&str>,
    now: SystemTime,
) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">{PAGE_STYLE}<section class=\"header\"><h1>tokentap · live speed-test matrix</h1><p class=\"summary\">Production traffic over the last <strong>{}</strong>{} beside the latest synthetic sweep. Updated {} and every {REFRESH_SECONDS} s.</p><p class=\"windows\">Window: ",
        escape(&window_text(window)),
        model.map_or_else(String::new, |m| format!(" (model <code>{}</code>)", escape(m))),
        escape(&format_rfc3339(now)),
    );
    let model_param = model.map_or_else(String::new, |m| format!("&model={}", query_escape(m)));
    for link in WINDOW_LINKS {
        let current = Window::parse(link).is_ok_and(|w| w == window);
        let _ = write!(
            body,
            "<a href=\"/?window={link}{}\"{}>{link}</a>",
            escape(&model_param),
            if current { " class=\"current\"" } else { "" }
        );
    }
    body.push_str("</p></section>");

    let production_cells = production.filter(|d| !d.decode.is_empty());
    // Production beside the sweep leads: one grid on shared axes, a fixed scale around ×1.
    if let (Some(production), Some(synthetic)) = (production_cells, synthetic) {
        body.push_str("<div id=\"ratio\">");
        body.push_str(&comparison_fragment(production, synthetic));
        body.push_str("</div>");
    }
    // Both heat maps on the same rows, columns and colour scale.
    let shown: Vec<&MatrixDoc> = production_cells.into_iter().chain(synthetic).collect();
    let axes = Axes::union(&shown);
    let max = heat_scale_max(&shown);
    body.push_str("<div class=\"panels\">");
    body.push_str("<div class=\"panel\" id=\"production\"><h2>Production</h2>");
    match production {
        Some(doc) if !doc.decode.is_empty() || !doc.prefill.is_empty() => {
            let _ = write!(body, "<p class=\"note\">{}</p>", escape(&doc_line(doc)));
            body.push_str(&grid_fragment_on(doc, &axes, max));
        }
        Some(doc) => {
            let _ = write!(
                body,
                "<p class=\"empty\">{}</p>",
                escape(
                    doc.metadata
                        .notes
                        .first()
                        .map_or("No production traffic yet.", String::as_str)
                )
            );
        }
        None => {
            let _ = write!(
                body,
                "<p class=\"empty\">No production request of model {} ended in the window.</p>",
                escape(model.unwrap_or(""))
            );
        }
    }
    body.push_str("</div><div class=\"panel\" id=\"synthetic\"><h2>Synthetic</h2>");
    // The capacity line of the sweep's own model, when the headroom was judged on this sweep.
    let line = synthetic.and_then(|doc| {
        let model = doc.metadata.model.served_model.as_deref()?;
        capacity?
            .models
            .iter()
            .find(|m| m.model == model && m.capacity_from.starts_with("sweep"))
            .map(|m| &m.capacity)
    });
    match synthetic {
        Some(doc) => {
            let _ = write!(body, "<p class=\"note\">{}</p>", escape(&doc_line(doc)));
            body.push_str(&grid_fragment_marked(doc, &axes, max, line));
            if line.is_some() {
                body.push_str("<p class=\"legend\">Outlined: each context's capacity under the [slo] targets; hatched: beyond it.</p>");
            }
        }
        None => {
            let _ = write!(body, "<p class=\"empty\">{}</p>", escape(NO_SWEEP));
        }
    }
    body.push_str("</div></div>");

    if let Some(answer) = capacity.filter(|a| !a.models.is_empty() || !a.unanswered.is_empty()) {
        body.push_str(&headroom_fragment(answer));
    }
    if let Some(compared) = drift {
        body.push_str("<div id=\"drift\">");
        body.push_str(&drift_grid_fragment(compared));
        body.push_str("</div>");
    }
    if let Some(doc) = production.filter(|d| !d.decode.is_empty()) {
        body.push_str("<div id=\"production-table\">");
        body.push_str(&measurements_fragment(doc));
        if !doc.metadata.notes.is_empty() {
            body.push_str("<ul class=\"notes\">");
            for note in crate::matrix::notes::collapsed(&doc.metadata.notes) {
                let _ = write!(body, "<li>{}</li>", escape(&note));
            }
            body.push_str("</ul>");
        }
        body.push_str("</div>");
    }
    page("tokentap · live matrix", &body)
}

/// Live headroom per model: the figure, the load, the capacity it is judged by, per context.
fn headroom_fragment(answer: &CapacityAnswer) -> String {
    let mut out =
        String::from("<section class=\"headroom\" id=\"headroom\"><h2>Headroom under the SLO</h2>");
    for model in &answer.models {
        let figures = &model.headroom;
        // A sweep that never saw a cell miss gives only a lower bound: "at least", never exact.
        let at_least = if figures.capacity_is_lower_bound {
            "≥ "
        } else {
            ""
        };
        let running = figures.running_now.map_or_else(String::new, |n| {
            format!(
                "{n} {} running now; ",
                if n == 1 { "request" } else { "requests" }
            )
        });
        let _ = write!(
            out,
            "<p class=\"headroom-figure\" data-model=\"{}\" data-headroom=\"{}\" data-lower-bound=\"{}\"><strong>{}</strong> headroom for <code>{}</code>: {}{:.1} production streams decoding on average over the last {}, against a capacity of {} streams for this context mix ({}; {}{}).</p>",
            escape(&model.model),
            figures.headroom.map_or_else(String::new, |h| h.to_string()),
            figures.capacity_is_lower_bound,
            escape(&figures.headroom.map_or_else(
                || "unknown".to_owned(),
                |h| format!("{at_least}{}", format_percent(h))
            )),
            escape(&model.model),
            escape(&running),
            figures.load,
            escape(&model.window),
            figures
                .capacity
                .map_or_else(|| "unknown".to_owned(), |c| format!("{at_least}{c:.1}")),
            escape(&model.capacity.targets.describe()),
            escape(&model.capacity_from),
            if figures.covered_share < 0.999 {
                format!(", covering {} of the load", format_percent(figures.covered_share))
            } else {
                String::new()
            }
        );
        out.push_str("<div class=\"scroll\"><table class=\"measurements\"><thead><tr><th>Context</th><th>Load (streams)</th><th>Share</th><th>Capacity</th><th>Headroom</th></tr></thead><tbody>");
        for context in &figures.contexts {
            let _ = write!(
                out,
                "<tr><th>{}</th><td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                escape(&context_label(context.context_tokens)),
                context.load,
                escape(&format_percent(context.share)),
                escape(&context.capacity.map_or_else(
                    || "—".to_owned(),
                    |c| if context.capacity_is_lower_bound { format!("≥ {c}") } else { c.to_string() }
                )),
                escape(&context.headroom.map_or_else(
                    || "—".to_owned(),
                    |h| if context.capacity_is_lower_bound {
                        format!("≥ {}", format_percent(h))
                    } else {
                        format_percent(h)
                    }
                ))
            );
        }
        out.push_str("</tbody></table></div>");
    }
    for missing in &answer.unanswered {
        let _ = write!(
            out,
            "<p class=\"note\">No headroom for <code>{}</code>: {}</p>",
            escape(&missing.model),
            escape(&missing.reason)
        );
    }
    out.push_str("</section>");
    out
}

/// The page with a logged-in browser's controls (`session::page_controls`) at the top of its
/// body.
/// `fragment` right after the page's header section.
fn with_after_header(html: String, fragment: &str) -> String {
    const HEADER_END: &str = "</p></section>";
    match html.find(HEADER_END) {
        Some(at) => {
            let at = at + HEADER_END.len();
            let mut out = String::with_capacity(html.len() + fragment.len());
            out.push_str(&html[..at]);
            out.push_str(fragment);
            out.push_str(&html[at..]);
            out
        }
        None => html,
    }
}

/// Each upstream's configuration and its change markers (newest first): when, from which
/// fingerprint to which, and what changed, field by field.
fn config_fragment(state: &AdminState) -> String {
    use crate::upstream_identity::facts::diff;
    let mut out = String::from("<section id=\"configuration\"><h2>Configuration</h2>");
    for upstream in state.proxy.meter.identities().all() {
        let current = upstream.current();
        let configs = upstream.configs();
        let _ = write!(
            out,
            "<p class=\"note\">Upstream <code>{}</code>: fingerprint <code class=\"fingerprint\">{}</code>",
            escape(&upstream.upstream),
            escape(&current.to_string())
        );
        if let Some(entry) = configs.iter().find(|c| c.id == current) {
            let _ = write!(
                out,
                " · {} {} · since {}",
                escape(entry.engine()),
                escape(entry.version()),
                escape(&format_rfc3339(entry.since))
            );
        }
        if upstream.is_flapping() {
            out.push_str(" · <strong>flapping</strong>: the configuration changes more than 6 times an hour; no new fingerprint is minted until it settles");
        }
        out.push_str("</p>");
        for entry in configs.iter().rev() {
            let Some(previous) = entry
                .previous
                .and_then(|p| configs.iter().find(|c| c.id == p))
            else {
                continue;
            };
            let _ = write!(
                out,
                "<div class=\"config-change\" data-fingerprint=\"{id}\" data-previous=\"{prev}\"><p><strong>Configuration changed</strong> at {at}: <code>{prev}</code> → <code>{id}</code> (<a href=\"/matrix?compare=previous&amp;format=html\">current ÷ previous</a>)</p><table class=\"measurements\"><thead><tr><th>Fact</th><th>Before</th><th>After</th></tr></thead><tbody>",
                id = escape(&entry.id.to_string()),
                prev = escape(&previous.id.to_string()),
                at = escape(&format_rfc3339(entry.since)),
            );
            for change in diff(&previous.facts, &entry.facts) {
                let _ = write!(
                    out,
                    "<tr><td>{}{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&change.key),
                    if change.hashed {
                        ""
                    } else {
                        " (not in the fingerprint)"
                    },
                    escape(change.before.as_deref().unwrap_or("(absent)")),
                    escape(change.after.as_deref().unwrap_or("(absent)")),
                );
            }
            out.push_str("</tbody></table></div>");
        }
    }
    out.push_str("</section>");
    out
}

fn with_controls(html: String, controls: &str) -> String {
    match html.find("<body>\n") {
        Some(at) => {
            let at = at + "<body>\n".len();
            let mut out = String::with_capacity(html.len() + controls.len());
            out.push_str(&html[..at]);
            out.push_str(controls);
            out.push_str(&html[at..]);
            out
        }
        None => html,
    }
}

fn window_text(window: Window) -> String {
    match window {
        Window::All => "time since start".to_owned(),
        Window::Last(_) => window.label(),
    }
}

/// One line naming what a document is: model, source, window or sweep.
fn doc_line(doc: &MatrixDoc) -> String {
    let run = &doc.metadata.run;
    let mut parts = vec![crate::matrix::page::title(&doc.metadata)];
    if let Some(id) = &run.sweep_id {
        parts.push(format!("sweep {id}"));
    }
    match (&run.started_at, &run.ended_at) {
        (Some(from), Some(to)) => parts.push(format!("{from} → {to}")),
        (Some(from), None) => parts.push(format!("from {from}")),
        _ => {}
    }
    parts.join(" · ")
}
