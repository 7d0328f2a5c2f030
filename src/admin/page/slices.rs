//! The page's slice filters (tenant, priority band, any registered dimension; above the
//! matrices), and the per-priority table (collapsed, below them): for each cell, TTFT
//! (any token and first answer token) and TBT of each priority band the window's requests
//! sent — whether priority scheduling helps, read off one table. Figures come from the
//! production matrix of each band (`admin::view`); nothing here computes them.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::SystemTime;

use crate::admin::query::query_escape;
use crate::admin::view::{production_matrix_sliced, routed_upstream, FingerprintChoice, View};
use crate::aggregate::Window;
use crate::base::escape::xml_escape as escape;
use crate::matrix::doc::{DecodeCell, MatrixDoc};
use crate::matrix::units::{context_label, format_ms_tenths, format_ms_whole};
use crate::meter::labels::{dimensions, SliceFilter, SliceValue, PRIORITY, TENANT};
use crate::meter::priority::PriorityBand;

/// The page's slice markup: the filters go above the matrices, the per-priority table (collapsed)
/// below them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SliceFragments {
    /// The filter links of each slice dimension in play (`<section id="slices">`).
    pub filters: String,
    /// The per-priority table, collapsed under `<details id="by-priority">`; empty when the
    /// window's requests sent no `priority`.
    pub by_priority: String,
}

/// The filter links of each slice dimension in play and, when the window's requests sent a
/// `priority`, the per-priority table, for `model` (the one the page's production side
/// shows); both empty when no dimension is in play, or no model had traffic.
pub fn fragment(
    view: View<'_>,
    window: Window,
    model: Option<&str>,
    slice: &SliceFilter,
    now: SystemTime,
) -> SliceFragments {
    let Some(model) = model.map(str::to_owned) else {
        return SliceFragments::default();
    };
    let seen = view.production.slicings(window, &model, now);
    let tenants_on = view.proxy.tenants.enabled();
    if !tenants_on && seen.by_dimension.is_empty() && slice.is_all() {
        return SliceFragments::default();
    }
    let link = |filter: &SliceFilter| {
        let mut href = format!("/?window={}&model={}", window.label(), query_escape(&model));
        for (name, value) in filter.parameters() {
            let _ = write!(href, "&{name}={}", query_escape(value));
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
    for dimension in dimensions() {
        let mut values: Vec<(String, u64)> = seen
            .values(dimension.name)
            .iter()
            .map(|(value, n)| (value.to_string(), *n))
            .collect();
        if dimension.name == TENANT.name {
            if !tenants_on {
                continue;
            }
            // Every counted tenant is offered, with or without traffic in the window.
            for name in view.proxy.tenants.names() {
                if !values.iter().any(|(seen, _)| seen == name) {
                    values.push((name.to_owned(), 0));
                }
            }
        }
        let asked = slice.get(dimension.name);
        if values.is_empty() && asked.is_none() {
            continue;
        }
        let _ = write!(
            out,
            "<p class=\"windows\" id=\"{}-filter\">{}: ",
            dimension.name,
            escape(&title(dimension.name))
        );
        out.push_str(&anchor(
            link(&slice.with(dimension, None)),
            "all",
            asked.is_none(),
        ));
        for (value, n) in &values {
            out.push_str(&anchor(
                link(&slice.with(dimension, Some(SliceValue::from(value.as_str())))),
                &format!("{value} ({n})"),
                asked == Some(value.as_str()),
            ));
        }
        out.push_str("</p>");
    }
    out.push_str("</section>");
    let bands: Vec<PriorityBand> = seen
        .values(PRIORITY.name)
        .iter()
        .filter_map(|(value, _)| PriorityBand::parse(value.as_str()))
        .collect();
    let by_priority = if bands.is_empty() {
        String::new()
    } else {
        let bands: Vec<(PriorityBand, MatrixDoc)> = bands
            .into_iter()
            .filter_map(|band| {
                let only = slice.with(&PRIORITY, Some(SliceValue::Named(band.label())));
                production_matrix_sliced(
                    view,
                    window,
                    Some(&model),
                    FingerprintChoice::Current,
                    &only,
                )
                .map(|doc| (band, doc))
            })
            .collect();
        let engine = routed_upstream(view, Some(&model)).engine();
        let how = engine.and_then(|e| e.spec().priority.map(|p| p.describe(e.name())));
        priority_table(&bands, how.as_deref())
    };
    SliceFragments {
        filters: out,
        by_priority,
    }
}

/// A dimension's name as a heading ("tenant" → "Tenant").
fn title(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Per cell, each band's TTFT (any, answer) and TBT medians with their request counts.
fn priority_table(bands: &[(PriorityBand, MatrixDoc)], how: Option<&str>) -> String {
    // Collapsed: the matrices lead the page; the bands are one click away (issue 45.5).
    let mut out = format!(
        "<details id=\"by-priority\"><summary>By priority: {} bands</summary><p class=\"note\">Median TTFT (first token of any kind · first answer token) and TBT per cell, for each band of the requests' <code>priority</code> field (n: completed requests).",
        bands.len()
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
    // Whole milliseconds with separators from 100 ms (`1,083 ms`), tenths below (`5.6 ms`).
    let ms = |value: Option<f64>| {
        value.map_or_else(
            || "—".to_owned(),
            |v| {
                if v >= 100.0 {
                    format_ms_whole(v)
                } else {
                    format_ms_tenths(v)
                }
            },
        )
    };
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
    out.push_str("</tbody></table></div></details>");
    out
}
