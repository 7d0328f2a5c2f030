//! Answers `GET /`: reads the query, gathers the page's documents from the view layer (the
//! production matrix, the latest sweep, the drift comparison, live headroom) and puts the page
//! together: the verdict (`verdict.rs`) and the filters (`slices.rs`) lead, then the grids
//! (`render.rs`) with a logged-in browser's sweep controls under the synthetic one
//! (`header.rs`); the per-priority table and the configuration come below them.

use std::time::SystemTime;

use http::{Request, Response, StatusCode};

use crate::admin::query::{check_slice, MatrixQuery};
use crate::admin::state::{json_error, respond, AdminState};
use crate::admin::view::{
    all_models, production_compare, production_matrix, production_matrix_sliced, status,
    synthetic_matrix, FingerprintChoice,
};
use crate::proxy::body::ResponseBody;

use super::header::{config_fragment, logout_form, sweep_controls};
use super::render::{render, PageDocs, PageFragments};

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
    // The one verdict first: every clause links to the figure below it. Then the filters,
    // then the matrices; the tables with little to say in a glance come after them.
    let verdict = super::verdict::fragment(&status(view, SystemTime::now()).await);
    let lead = format!("{verdict}{}", slices.filters);
    let details = format!("{}{}", slices.by_priority, config_fragment(state));
    let session = state.session_of(request);
    let (logout, sweep_controls) = match &session {
        Some(session) => (logout_form(session), sweep_controls(state, session)),
        None => (String::new(), String::new()),
    };
    let html = render(
        &PageDocs {
            production: production.as_ref(),
            synthetic: synthetic.as_deref(),
            drift: drift.as_ref(),
            capacity: Some(&capacity),
        },
        &PageFragments {
            logout: &logout,
            lead: &lead,
            sweep_controls: &sweep_controls,
            details: &details,
        },
        query.window,
        query.model.as_deref(),
        SystemTime::now(),
    );
    respond(StatusCode::OK, "text/html; charset=utf-8", html)
}
