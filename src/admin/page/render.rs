//! The page's grids and tables for given documents (pure): the header, then what leads (the
//! verdict, the filters), the ratio grid, the two heat maps on shared axes and one colour
//! scale (the sweep controls under the synthetic one), live headroom, the drift grid, the
//! details (per-priority table, configuration) and the production "All measurements" table.

use std::fmt::Write as _;
use std::time::SystemTime;

use crate::admin::query::query_escape;
use crate::admin::view::{CapacityAnswer, CapacityWithAdvice, ModelAdvice, RestsOn, NO_SWEEP};
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

/// How often the page reloads itself.
pub const REFRESH_SECONDS: u32 = 10;

/// Windows offered as links.
const WINDOW_LINKS: [&str; 6] = ["5m", "15m", "1h", "6h", "24h", "all"];

/// Extra layout for the two panels side by side (the matrix stylesheet does the rest).
const PAGE_STYLE: &str = "<style>.panel>h2{margin-top:8px}.windows a{margin-right:8px}.windows a.current{font-weight:700;text-decoration:none;color:inherit}.empty{color:#57606a;font-style:italic}.header{position:relative}.header .summary{margin-bottom:4px}.logout{position:absolute;top:0;right:0;margin:0}button{font:inherit;font-size:13px;padding:5px 14px;border-radius:6px;border:1px solid #1f6feb;background:#1f6feb;color:#fff;cursor:pointer}button.secondary{background:#f6f8fa;color:#1b1f24;border-color:#d0d7de}.sweep-controls{margin-top:12px;padding:8px 10px;border:1px solid #d0d7de;border-radius:6px;background:#f6f8fa}.sweep-controls form{margin:0}.sweep-form label{margin-right:10px;font-size:12px;white-space:nowrap}.sweep-form input[type=text]{width:11em;font:inherit;font-size:12px;padding:3px}.verdict h2{margin-top:12px}.verdict ul{margin:2px 0 4px}.verdict .headline{margin:4px 0 8px;padding:6px 10px;border:1px solid #cf222e;border-radius:6px;background:#ffebe9;color:#82071e}#slices .windows{margin:2px 0}details{margin:12px 0}details>summary{cursor:pointer;font-weight:600}</style>";

/// The documents the page shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct PageDocs<'a> {
    pub production: Option<&'a MatrixDoc>,
    pub synthetic: Option<&'a MatrixDoc>,
    pub drift: Option<&'a MatrixCompare>,
    pub capacity: Option<&'a CapacityWithAdvice>,
}

/// The markup the page places around its matrices (an empty string leaves its place empty).
/// The matrices lead: what a person reads before them is the verdict and the filters, no more.
#[derive(Debug, Clone, Copy, Default)]
pub struct PageFragments<'a> {
    /// In the header, top right: a logged-in browser's log-out button.
    pub logout: &'a str,
    /// Between the header and the matrices: the verdict and the slice filters.
    pub lead: &'a str,
    /// Under the synthetic matrix: a logged-in browser's sweep controls.
    pub sweep_controls: &'a str,
    /// Below the matrices, headroom and drift: the per-priority table, the configuration.
    pub details: &'a str,
}

/// The page for these documents and fragments (pure; `now` is printed as the refresh time).
pub fn render(
    docs: &PageDocs<'_>,
    fragments: &PageFragments<'_>,
    window: Window,
    model: Option<&str>,
    now: SystemTime,
) -> String {
    let PageDocs {
        production,
        synthetic,
        drift,
        capacity,
    } = *docs;
    let advice = capacity.map_or(&[][..], |c| c.engine_advice.as_slice());
    let capacity = capacity.map(|c| &c.answer);
    let mut body = String::new();
    let _ = write!(
        body,
        "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">{PAGE_STYLE}<section class=\"header\"><h1>tokentap · live speed-test matrix</h1>{}<p class=\"summary\">Production traffic over the last <strong>{}</strong>{} beside the latest synthetic sweep. Updated {} and every {REFRESH_SECONDS} s.</p><p class=\"windows\">Window: ",
        fragments.logout,
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
    body.push_str(fragments.lead);

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
    body.push_str(fragments.sweep_controls);
    body.push_str("</div></div>");

    if let Some(answer) =
        capacity.filter(|a| !a.models.is_empty() || !a.unanswered.is_empty() || a.explain.is_some())
    {
        body.push_str(&headroom_fragment(answer));
    }
    if !advice.is_empty() {
        body.push_str(&advice_fragment(advice));
    }
    if let Some(compared) = drift {
        body.push_str("<div id=\"drift\">");
        body.push_str(&drift_grid_fragment(compared));
        body.push_str("</div>");
    }
    body.push_str(fragments.details);
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
        let misses = model.rests_on == RestsOn::ProductionMisses;
        if misses {
            // Production's verdict overrules the sweep: no headroom, and the cell that says so.
            let _ = write!(
                out,
                "<p class=\"headroom-figure\" data-model=\"{}\" data-headroom=\"{}\" data-lower-bound=\"false\" data-rests-on=\"{}\"><strong>No headroom</strong> for <code>{}</code>: {}. {}{:.1} production streams decoding on average over the last {}; the sweep ({}) alone would allow {} streams, on warm prompts.</p>",
                escape(&model.model),
                figures.headroom.map_or_else(String::new, |h| h.to_string()),
                model.rests_on.label(),
                escape(&model.model),
                escape(&model.rests_on_text),
                escape(&running),
                figures.load,
                escape(&model.window),
                escape(&model.capacity_from),
                figures
                    .capacity
                    .map_or_else(|| "unknown".to_owned(), |c| format!("{c:.1}")),
            );
        } else {
            let _ = write!(
                out,
                "<p class=\"headroom-figure\" data-model=\"{}\" data-headroom=\"{}\" data-lower-bound=\"{}\" data-rests-on=\"{}\"><strong>{}</strong> headroom for <code>{}</code>: {}{:.1} production streams decoding on average over the last {}, against a capacity of {} streams for this context mix ({}; {}{}). Rests on {}.</p>",
                escape(&model.model),
                figures.headroom.map_or_else(String::new, |h| h.to_string()),
                figures.capacity_is_lower_bound,
                model.rests_on.label(),
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
                },
                escape(&model.rests_on_text),
            );
        }
        out.push_str("<div class=\"scroll\"><table class=\"measurements\"><thead><tr><th>Context</th><th>Load (streams)</th><th>Share</th><th>Capacity</th><th>Headroom</th><th>Rests on</th></tr></thead><tbody>");
        for context in &figures.contexts {
            let basis = model
                .contexts_rest_on
                .iter()
                .find(|b| b.context_tokens == context.context_tokens);
            let overruled = basis.is_some_and(|b| b.rests_on == RestsOn::ProductionMisses);
            let _ = write!(
                out,
                "<tr data-context=\"{}\" data-rests-on=\"{}\"><th>{}</th><td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                context.context_tokens,
                basis.map_or("", |b| b.rests_on.label()),
                escape(&context_label(context.context_tokens)),
                context.load,
                escape(&format_percent(context.share)),
                escape(&context.capacity.map_or_else(
                    || "—".to_owned(),
                    |c| match (overruled, context.capacity_is_lower_bound) {
                        (true, true) => format!("sweep: ≥ {c}, overruled by production"),
                        (true, false) => format!("sweep: {c}, overruled by production"),
                        (false, true) => format!("≥ {c}"),
                        (false, false) => c.to_string(),
                    }
                )),
                escape(&if overruled {
                    "none".to_owned()
                } else {
                    context.headroom.map_or_else(
                        || "—".to_owned(),
                        |h| if context.capacity_is_lower_bound {
                            format!("≥ {}", format_percent(h))
                        } else {
                            format_percent(h)
                        },
                    )
                }),
                escape(basis.map_or("", |b| b.text.as_str())),
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
    if let Some(explain) = &answer.explain {
        let _ = write!(
            out,
            "<p class=\"note\" id=\"headroom-explain\">No headroom figure: {}</p>",
            escape(explain)
        );
    }
    out.push_str("</section>");
    out
}

/// The engine's limits the sweep supports under the SLO, per model (`GET /capacity`'s
/// `engine_advice`; `tokentap matrix capacity --advise` prints the same per context).
fn advice_fragment(advice: &[ModelAdvice]) -> String {
    let mut out = String::from(
        "<section class=\"engine-advice\" id=\"engine-advice\"><h2>Engine limits advised</h2>",
    );
    for model in advice {
        let Some(engine) = &model.advice else {
            let _ = write!(
                out,
                "<p class=\"empty\" data-model=\"{}\">{}: {}</p>",
                escape(&model.model),
                escape(&model.model),
                escape(model.why_none.as_deref().unwrap_or("no advice"))
            );
            continue;
        };
        let _ = write!(
            out,
            "<p>For <code>{}</code> under {}, from the latest sweep's capacity and measured prefill rate (docs/capacity.md):</p><ul data-model=\"{}\">",
            escape(&model.model),
            escape(&engine.targets.describe()),
            escape(&model.model)
        );
        let overall = &engine.overall;
        for (flag, names, value) in [
            (
                "max-running-requests",
                "sglang <code>--max-running-requests</code>, vLLM <code>--max-num-seqs</code>",
                overall.max_running_requests.map(|(v, c)| (u64::from(v), c)),
            ),
            (
                "max-num-queued-tokens",
                "vLLM <code>--max-num-queued-tokens</code>",
                overall.max_num_queued_tokens,
            ),
            (
                "max-queued-requests",
                "sglang <code>--max-queued-requests</code>, vLLM <code>--max-num-queued-reqs</code>",
                overall.max_queued_requests,
            ),
        ] {
            match value {
                Some((value, context)) => {
                    let _ = write!(
                        out,
                        "<li data-flag=\"{flag}\" data-value=\"{value}\">{names}: <strong>{value}</strong> (set by {})</li>",
                        escape(&context_label(context))
                    );
                }
                None => {
                    let _ = write!(
                        out,
                        "<li data-flag=\"{flag}\">{names}: — (no context gives it)</li>"
                    );
                }
            }
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
    out
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
