//! `GET /matrix?source=production|synthetic&window=…&format=json|md|csv|html|svg|llmd&model=…`:
//! the production matrix over a window, or the latest synthetic one, in any rendering.
//! `compare=reference` (json, md, html; `upstream=` to choose the reference's upstream) gives
//! the production window ÷ the pinned reference per cell instead (`matrix::compare`).
//! `fingerprint=current|all|ID` chooses which of the upstream's configurations the
//! production matrix covers (default `current`: the one it runs now, plus requests from
//! before it was first read); the document's metadata is filled from that configuration's
//! facts. `compare=previous` gives the current configuration's cells ÷ the previous one's
//! (`matrix::diff`). `tenant=NAME` and `priority=BAND` narrow the production matrix to one
//! tenant's requests (`[tenants]`) or one band of the requests' `priority` field.
//!
//! The documents come from the view layer (`view`); this file chooses which to render and
//! renders it through `matrix::*`.

use std::sync::Arc;

use http::{header, Request, Response, StatusCode};

use crate::base::Source;
use crate::matrix::Format;
use crate::meter::identity::ConfigEntry;
use crate::proxy::body::ResponseBody;

use super::query::{check_slice, MatrixQuery, OFFERED};
use super::state::{json_error, respond, AdminState};
use super::view::{
    production_compare, production_matrix_of, production_matrix_sliced, routed_upstream,
    synthetic_matrix, FingerprintChoice, View, NO_SWEEP,
};

/// `GET /matrix`.
pub async fn handle<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    let view = state.view();
    let query = match MatrixQuery::parse(
        request.uri().query(),
        &[
            "source",
            "window",
            "format",
            "model",
            "compare",
            "upstream",
            "fingerprint",
            "tenant",
            "priority",
        ],
    ) {
        Ok(query) => query,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    if let Err(message) = check_slice(view, &query) {
        return json_error(StatusCode::BAD_REQUEST, &message);
    }
    let format = query.format.unwrap_or_else(|| {
        Format::from_accept(
            request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            &OFFERED,
        )
        .unwrap_or(Format::Json)
    });
    if query.compare_reference {
        if query.source == Source::Synthetic {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=reference compares the production matrix; leave out source=synthetic",
            );
        }
        return compare_reference(view, &query, format);
    }
    if query.compare_previous {
        if query.source == Source::Synthetic {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=previous compares the production matrix; leave out source=synthetic",
            );
        }
        return compare_previous(view, &query, format);
    }
    let doc = match query.source {
        Source::Production => {
            match production_matrix_sliced(
                view,
                query.window,
                query.model.as_deref(),
                query.fingerprint,
                &query.slice,
            ) {
                Some(doc) => Arc::new(doc),
                None => {
                    return json_error(
                        StatusCode::NOT_FOUND,
                        &format!(
                            "no production request of model `{}` ended in the window ({})",
                            query.model.as_deref().unwrap_or(""),
                            query.window.label()
                        ),
                    )
                }
            }
        }
        Source::Synthetic => match synthetic_matrix(view).await {
            Ok(Some(doc)) => doc,
            Ok(None) => return json_error(StatusCode::NOT_FOUND, NO_SWEEP),
            Err(error) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "store read failed"
                );
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot read the latest sweep from the store: {error}"),
                );
            }
        },
    };
    respond(StatusCode::OK, format.content_type(), format.render(&doc))
}

/// `compare=previous`: the routed upstream's current configuration's production cells ÷ its
/// previous configuration's, over the window.
fn compare_previous(view: View<'_>, query: &MatrixQuery, format: Format) -> Response<ResponseBody> {
    let model = query.model.as_deref();
    let upstream = routed_upstream(view, model);
    let Some(current) = upstream.identity.current_config() else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "upstream `{}` has no known configuration now ({}): nothing to compare",
                upstream.name,
                upstream.identity.current()
            ),
        );
    };
    let Some(previous) = upstream.identity.previous_config() else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "upstream `{}` has run one configuration ({}) since tokentap started: there is no previous one to compare with",
                upstream.name, current.id
            ),
        );
    };
    let side = |entry: &ConfigEntry| {
        production_matrix_of(view, query.window, model, FingerprintChoice::Id(entry.id))
            .filter(|doc| !doc.decode.is_empty() || !doc.prefill.is_empty())
    };
    let (Some(before), Some(after)) = (side(&previous), side(&current)) else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "no production requests of both configurations (previous {}, current {}) ended in the window ({}): widen it with window=24h",
                previous.id,
                current.id,
                query.window.label()
            ),
        );
    };
    let mut diff = crate::matrix::diff::diff(&before, &after);
    diff.a.label = format!(
        "previous configuration {} ({} {})",
        previous.id,
        previous.engine(),
        previous.version()
    );
    diff.b.label = format!(
        "current configuration {} ({} {})",
        current.id,
        current.engine(),
        current.version()
    );
    let text = match format {
        Format::Json => crate::matrix::diff::render_diff_json(&diff),
        Format::Markdown => crate::matrix::diff::render_diff_markdown(&diff),
        Format::Html => crate::matrix::html::render_diff_html(&diff),
        Format::Csv | Format::Svg | Format::Table | Format::List | Format::Llmd => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=previous renders as json, md or html",
            )
        }
    };
    respond(StatusCode::OK, format.content_type(), text)
}

fn compare_reference(
    view: View<'_>,
    query: &MatrixQuery,
    format: Format,
) -> Response<ResponseBody> {
    use crate::matrix::compare::{
        render_compare_html, render_compare_json, render_compare_markdown,
    };
    let compared = match production_compare(
        view,
        query.window,
        query.model.as_deref(),
        query.upstream.as_deref(),
    ) {
        Ok(compared) => compared,
        Err((status, message)) => return json_error(status, &message),
    };
    let text = match format {
        Format::Json => render_compare_json(&compared),
        Format::Markdown => render_compare_markdown(&compared),
        Format::Html => render_compare_html(&compared),
        Format::Csv | Format::Svg | Format::Table | Format::List | Format::Llmd => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "compare=reference renders as json, md or html",
            )
        }
    };
    respond(StatusCode::OK, format.content_type(), text)
}
