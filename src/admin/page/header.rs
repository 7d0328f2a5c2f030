//! What the page shows around its matrices: each upstream's configuration and its changes
//! (below the matrices), and a logged-in browser's controls — log out in the header; the
//! running sweep or the sweep preview button with the synthetic matrix.

use std::fmt::Write as _;

use crate::admin::state::{AdminState, SessionView};
use crate::base::escape::xml_escape as escape;
use crate::base::wallclock::format_rfc3339;

/// Each upstream's configuration and its change markers (newest first): when, from which
/// fingerprint to which, and what changed, field by field.
pub fn config_fragment(state: &AdminState) -> String {
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

/// A logged-in browser's log-out button, at the top right of the page's header.
pub fn logout_form(session: &SessionView) -> String {
    format!(
        "<form id=\"logout\" class=\"logout\" method=\"post\" action=\"/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\" class=\"secondary\">Log out</button></form>",
        escape(&session.csrf)
    )
}

/// A logged-in browser's sweep controls, under the synthetic matrix: the sweep running now
/// (if any), with how far it is, how long it has waited for production and a Cancel button;
/// else the button that previews a sweep (`POST /page/sweep`: the preview page has the plan's
/// fields and the start). Each form carries the session's CSRF token.
pub fn sweep_controls(state: &AdminState, session: &SessionView) -> String {
    let csrf = escape(&session.csrf);
    let mut out = String::from("<section id=\"session\" class=\"session sweep-controls\">");
    let running = state
        .sweeps
        .list()
        .into_iter()
        .find(|s| s.state.is_active())
        .and_then(|summary| state.sweeps.get(&summary.id));
    match running {
        Some(running) => {
            let _ = write!(
                out,
                "<p class=\"note\" id=\"sweep-running\">Sweep <a href=\"/sweeps/{id}\">{id}</a>: {line}.</p><form id=\"cancel-sweep\" method=\"post\" action=\"/page/sweep\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"cancel\"><input type=\"hidden\" name=\"id\" value=\"{id}\"><button type=\"submit\">Cancel the sweep</button></form>",
                id = escape(&running.id),
                line = escape(&running.progress_line()),
            );
        }
        None => {
            // The fields (contexts, concurrency, cell duration, like production) are on the
            // preview page, which does not reload itself: this page does every few seconds, and
            // would wipe what was being typed.
            let _ = write!(
                out,
                "<form id=\"preview-sweep\" class=\"sweep-form\" method=\"post\" action=\"/page/sweep\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><input type=\"hidden\" name=\"action\" value=\"preview\"><button type=\"submit\">Preview a sweep…</button> <span class=\"note\">the default plan first; change its contexts, concurrency, cell duration and shape on the preview, then start it there</span></form>"
            );
        }
    }
    out.push_str("</section>");
    out
}
