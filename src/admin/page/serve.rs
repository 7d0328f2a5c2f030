//! Answers `GET /`: reads the query, gathers the page's documents from the view layer (the
//! production matrix, the latest sweep, the drift comparison, live headroom) and puts the page
//! together: the verdict (`verdict.rs`), the grids (`render.rs`), the filters (`slices.rs`) and
//! the configuration under the header, a logged-in browser's controls at the top (`header.rs`).

use std::time::SystemTime;

use http::{Request, Response, StatusCode};

use crate::admin::query::{check_slice, MatrixQuery};
use crate::admin::state::{json_error, respond, AdminState};
use crate::admin::view::{
    all_models, production_compare, production_matrix, production_matrix_sliced, status,
    synthetic_matrix, FingerprintChoice,
};
use crate::proxy::body::ResponseBody;

use super::header::{config_fragment, page_controls};
use super::render::render;

/// `GET /`.
pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let query = match MatrixQuery::parse(
        request.uri().query(),
        &["window", "model", "tenant", "priority"],
    ) {
        Ok(query) => query,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    let view = state.view();
    if let Err(message) = check_slice(view, &query) {
        return json_error(StatusCode::BAD_REQUEST, &message);
    }
    let production = production_matrix_sliced(
        view,
        query.window,
        query.model.as_deref(),
        FingerprintChoice::Current,
        &query.slice,
    );
    let synthetic = match synthetic_matrix(view).await {
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
    let drift = production_compare(view, query.window, query.model.as_deref(), None).ok();
    let answer = all_models(view, SystemTime::now());
    let capacity = crate::admin::view::CapacityWithAdvice {
        engine_advice: crate::admin::view::engine_advice(view, &answer),
        answer,
    };
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
            production_matrix(view, query.window, None)
                .and_then(|doc| doc.metadata.model.served_model)
        });
    let slices = super::slices::fragment(
        view,
        query.window,
        shown_model.as_deref(),
        &query.slice,
        SystemTime::now(),
    );
    // The one verdict first: every clause links to the figure below it.
    let verdict = super::verdict::fragment(&status(view, SystemTime::now()).await);
    let html = with_after_header(
        html,
        &format!("{verdict}{slices}{}", config_fragment(state)),
    );
    let html = match state.session_of(request) {
        Some(session) => with_controls(html, &page_controls(state, &session)),
        None => html,
    };
    respond(StatusCode::OK, "text/html; charset=utf-8", html)
}

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

/// The page with a logged-in browser's controls (`header::page_controls`) at the top of its
/// body.
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
