//! The page's tenant and priority filters, and the per-priority table: for each cell, TTFT
//! (any token and first answer token) and TBT of each priority band the window's requests
//! sent — whether priority scheduling helps, read off one table. Figures come from the
//! production matrix of each band (`admin::matrix`); nothing here computes them.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::SystemTime;

use crate::aggregate::Window;
use crate::base::escape::xml_escape as escape;
use crate::matrix::doc::{DecodeCell, MatrixDoc};
use crate::matrix::units::context_label;
use crate::meter::priority::PriorityBand;

use super::matrix::{production_matrix_sliced, routed_upstream, FingerprintChoice, TrafficSlice};
use super::query::query_escape;
use super::state::AdminState;

/// The filter links and, when the window's requests sent a `priority`, the per-priority
/// table, for `model` (the one the page's production side shows); empty when neither tenants
/// nor priorities are in play, or no model had traffic.
pub fn fragment(
    state: &AdminState,
    window: Window,
    model: Option<&str>,
    slice: &TrafficSlice,
    now: SystemTime,
) -> String {
    let Some(model) = model.map(str::to_owned) else {
        return String::new();
    };
    let seen = state.production.slicings(window, &model, now);
    let tenants_on = state.proxy.tenants.enabled();
    if !tenants_on && seen.priorities.is_empty() && slice.is_all() {
        return String::new();
    }
    let link = |tenant: Option<&str>, priority: Option<PriorityBand>| {
        let mut href = format!("/?window={}&model={}", window.label(), query_escape(&model));
        if let Some(tenant) = tenant {
            let _ = write!(href, "&tenant={}", query_escape(tenant));
        }
        if let Some(priority) = priority {
            let _ = write!(href, "&priority={}", query_escape(priority.label()));
        }
        escape(&href)
    };
    let anchor = |href: String, text: &str, current: bool| {
        format!(
            "<a href=\"{href}\"{}>{}</a>",
            if current { " class=\"current\"" } else { "" },
            escape(text)
        )
    };
    let mut out = String::from("<section id=\"slices\">");
    if tenants_on {
        out.push_str("<p class=\"windows\" id=\"tenant-filter\">Tenant: ");
        out.push_str(&anchor(
            link(None, slice.priority),
            "all",
            slice.tenant.is_none(),
        ));
        let mut names: Vec<(String, u64)> = seen
            .tenants
            .iter()
            .map(|(name, n)| (name.to_string(), *n))
            .collect();
        for name in state.proxy.tenants.names() {
            if !names.iter().any(|(seen, _)| seen == name) {
                names.push((name.to_owned(), 0));
            }
        }
        for (name, n) in &names {
            out.push_str(&anchor(
                link(Some(name), slice.priority),
                &format!("{name} ({n})"),
                slice.tenant.as_deref() == Some(name.as_str()),
            ));
        }
        out.push_str("</p>");
    }
    if !seen.priorities.is_empty() || slice.priority.is_some() {
        out.push_str("<p class=\"windows\" id=\"priority-filter\">Priority: ");
        out.push_str(&anchor(
            link(slice.tenant.as_deref(), None),
            "all",
            slice.priority.is_none(),
        ));
        for (band, n) in &seen.priorities {
            out.push_str(&anchor(
                link(slice.tenant.as_deref(), Some(*band)),
                &format!("{band} ({n})"),
                slice.priority == Some(*band),
            ));
        }
        out.push_str("</p>");
    }
    if !seen.priorities.is_empty() {
        let bands: Vec<(PriorityBand, MatrixDoc)> = seen
            .priorities
            .iter()
            .filter_map(|(band, _)| {
                let only = TrafficSlice {
                    tenant: slice.tenant.clone(),
                    priority: Some(*band),
                };
                production_matrix_sliced(
                    state,
                    window,
                    Some(&model),
                    FingerprintChoice::Current,
                    &only,
                )
                .map(|doc| (*band, doc))
            })
            .collect();
        let engine = routed_upstream(state, Some(&model)).engine();
        let how = engine.and_then(|e| e.spec().priority.map(|p| p.describe(e.name())));
        out.push_str(&priority_table(&bands, how.as_deref()));
    }
    out.push_str("</section>");
    out
}

/// Per cell, each band's TTFT (any, answer) and TBT medians with their request counts.
fn priority_table(bands: &[(PriorityBand, MatrixDoc)], how: Option<&str>) -> String {
    let mut out = String::from(
        "<div id=\"by-priority\"><h2>By priority</h2><p class=\"note\">Median TTFT (first token of any kind · first answer token) and TBT per cell, for each band of the requests' <code>priority</code> field (n: completed requests).",
    );
    if let Some(how) = how {
        let _ = write!(out, " {}", escape(how));
    }
    out.push_str("</p><div class=\"scroll\"><table class=\"measurements\"><thead><tr><th>Context</th><th>Concurrency</th>");
    for (band, _) in bands {
        let _ = write!(
            out,
            "<th>priority {b}: TTFT</th><th>priority {b}: answer TTFT</th><th>priority {b}: TBT</th><th>n</th>",
            b = escape(band.label())
        );
    }
    out.push_str("</tr></thead><tbody>");
    let cells: BTreeSet<(u64, u32)> = bands
        .iter()
        .flat_map(|(_, doc)| doc.decode.iter().map(|c| (c.context_tokens, c.concurrency)))
        .collect();
    let ms = |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |v| format!("{v:.1} ms"));
    for (context, concurrency) in cells {
        let _ = write!(
            out,
            "<tr data-context=\"{context}\" data-concurrency=\"{concurrency}\"><th>{}</th><td class=\"num\">{concurrency}</td>",
            escape(&context_label(context))
        );
        for (band, doc) in bands {
            let cell: Option<&DecodeCell> = doc
                .decode
                .iter()
                .find(|c| c.context_tokens == context && c.concurrency == concurrency);
            let answer = cell
                .and_then(|c| c.first_tokens.as_ref())
                .and_then(|f| f.answer_ttft_ms);
            let _ = write!(
                out,
                "<td class=\"num\" data-priority=\"{b}\" data-ttft-ms=\"{}\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>",
                cell.and_then(|c| c.ttft_ms).map_or_else(String::new, |v| v.to_string()),
                escape(&ms(cell.and_then(|c| c.ttft_ms))),
                escape(&ms(answer)),
                escape(&ms(cell.and_then(|c| c.tbt_ms))),
                cell.and_then(|c| c.completed_requests).unwrap_or(0),
                b = escape(band.label()),
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div></div>");
    out
}
