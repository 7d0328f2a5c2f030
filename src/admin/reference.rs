//! The reference API on the admin listener: the matrix production is compared with, one per
//! upstream and model.
//!
//! | route | does |
//! |---|---|
//! | `PUT /reference?upstream=&model=` | pin: body `{"from":"latest-sweep"}`, or a matrix (seed page text, Markdown or JSON); `source=` names where it came from |
//! | `GET /reference` | every pinned reference (provenance only) |
//! | `GET /reference?upstream=&model=` | one reference with its matrix; `format=md\|html\|json` renders the matrix alone |
//! | `DELETE /reference?upstream=&model=` | unpin |
//!
//! `model` defaults to the matrix's served model, `upstream` to the one the router sends that
//! model to. Pinning and unpinning always need the bearer token, like starting a sweep (the route
//! table, `routes.rs`, checks it before these handlers run). The
//! store keeps what is pinned across restarts; without a store (`store.data_dir = ""`) a pin
//! lasts until the process ends, and the answer says so.

use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use serde::Serialize;

use super::query::{percent_decode, MATRIX_ALONE};
use super::state::{json_error, json_response, respond, AdminState};
use super::view::resolve_upstream;
use crate::aggregate::drift::reference_info;
use crate::matrix::compare::{Reference, ReferenceInfo};
use crate::matrix::doc::{CellStatus, MatrixDoc};
use crate::matrix::import::{detect_format, parse_any, InputFormat};
use crate::matrix::units::context_label;
use crate::matrix::Format;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;
use crate::sweep::SweepState;

/// Largest matrix accepted in a PUT body (a full 8 × 8 seed page is a few kB).
pub const MAX_REFERENCE_BYTES: usize = 4 << 20;

/// Longest `source=` text kept.
const MAX_SOURCE_CHARS: usize = 200;

/// The query of a reference request.
#[derive(Debug, Default, PartialEq)]
struct ReferenceQuery {
    upstream: Option<String>,
    model: Option<String>,
    source: Option<String>,
    format: Option<String>,
}

fn parse_query(query: Option<&str>) -> Result<ReferenceQuery, String> {
    let mut parsed = ReferenceQuery::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)
            .ok_or_else(|| format!("query parameter `{key}` is not valid percent-encoded UTF-8"))?;
        let value = (!value.is_empty()).then_some(value);
        match key {
            "upstream" => parsed.upstream = value,
            "model" => parsed.model = value,
            "source" => parsed.source = value,
            "format" => parsed.format = value,
            other => {
                return Err(format!(
                    "unknown query parameter `{other}`; /reference takes upstream, model, source (PUT) and format (GET)"
                ))
            }
        }
    }
    Ok(parsed)
}

/// A reference as the API answers it.
#[derive(Debug, Serialize)]
struct ReferenceAnswer<'a> {
    #[serde(flatten)]
    info: ReferenceInfo,
    decode_cells: usize,
    /// Whether the store keeps it across restarts.
    kept: bool,
    /// What the pinned matrix holds that will not be compared (cells Off target or Low
    /// evidence): pinned all the same, said out loud.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    matrix: Option<&'a MatrixDoc>,
}

/// A warning per cell of `matrix` whose figures are shown but not trusted: drift never
/// compares with them.
fn pin_warnings(matrix: &MatrixDoc) -> Vec<String> {
    matrix
        .decode
        .iter()
        .filter(|cell| cell.status.is_caveated())
        .map(|cell| {
            let why = match cell.status {
                CellStatus::OffTarget => format!(
                    "it did not run at its concurrency (average active {}{}; see the sweep's notes)",
                    cell.average_active_requests
                        .map_or_else(|| "unknown".to_owned(), |a| format!("{a:.1}")),
                    cell.production_in_flight
                        .map_or_else(String::new, |p| format!(", {p:.1} production requests in flight"))
                ),
                _ => "it rests on too little traffic".to_owned(),
            };
            format!(
                "cell {} × {} is {}: {why}; drift will not compare it",
                context_label(cell.context_tokens),
                cell.concurrency,
                cell.status
            )
        })
        .collect()
}

/// Serves a request to `/reference`.
/// `GET /reference`: every pinned reference, or one with its matrix.
pub fn show<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    match parse_query(request.uri().query()) {
        Ok(query) => show_query(state, &query),
        Err(message) => json_error(StatusCode::BAD_REQUEST, &message),
    }
}

/// `PUT /reference`: pins a reference.
pub async fn pin<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match parse_query(request.uri().query()) {
        Ok(query) => pin_query(state, query, request).await,
        Err(message) => json_error(StatusCode::BAD_REQUEST, &message),
    }
}

/// `DELETE /reference`: unpins one.
pub async fn unpin<B>(state: &AdminState, request: &Request<B>) -> Response<ResponseBody> {
    match parse_query(request.uri().query()) {
        Ok(query) => unpin_query(state, &query).await,
        Err(message) => json_error(StatusCode::BAD_REQUEST, &message),
    }
}

/// The matrix of the newest finished sweep, and its id.
fn latest_sweep(state: &AdminState) -> Option<(String, MatrixDoc)> {
    state
        .sweeps
        .list()
        .into_iter()
        .filter(|s| s.state == SweepState::Finished)
        .find_map(|s| {
            let matrix = state.sweeps.get(&s.id)?.matrix?;
            Some((s.id, matrix))
        })
}

/// Whether a body asks for a pin from somewhere (`{"from": …}`) rather than carrying a matrix.
fn from_clause(body: &[u8]) -> Option<Result<String, String>> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let from = object.get("from")?;
    if object.len() > 1 {
        return Some(Err("a {\"from\": …} body takes no other member".to_owned()));
    }
    Some(
        from.as_str()
            .map(str::to_owned)
            .ok_or_else(|| "`from` must be a string: \"latest-sweep\"".to_owned()),
    )
}

async fn pin_query<B>(
    state: &AdminState,
    query: ReferenceQuery,
    request: Request<B>,
) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let body = match super::state::read_body(request, MAX_REFERENCE_BYTES, "the reference").await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let from = from_clause(&body);
    let from_sweep = matches!(&from, Some(Ok(from)) if from == "latest-sweep");
    let (matrix, source) = match from {
        Some(Ok(from)) if from == "latest-sweep" => match latest_sweep(state) {
            Some((id, matrix)) => (matrix, format!("latest-sweep {id}")),
            None => {
                return json_error(
                    StatusCode::CONFLICT,
                    "no sweep has finished yet: run one (`tokentap sweep --admin URL`) or pin a matrix document",
                )
            }
        },
        Some(Ok(other)) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("`from` is {other:?}; the only one is \"latest-sweep\" (or send a matrix as the body)"),
            )
        }
        Some(Err(message)) => return json_error(StatusCode::BAD_REQUEST, &message),
        None => {
            let Ok(text) = std::str::from_utf8(&body) else {
                return json_error(StatusCode::BAD_REQUEST, "the reference is not UTF-8 text");
            };
            let kind = match detect_format(text) {
                Ok(InputFormat::Json) => "JSON matrix",
                Ok(InputFormat::SeedText) => "imported seed page",
                Ok(InputFormat::Markdown) => "imported Markdown page",
                Err(error) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("the body is neither {{\"from\":\"latest-sweep\"}} nor a matrix: {error}"),
                    )
                }
            };
            match parse_any(text) {
                Ok(matrix) => (matrix, kind.to_owned()),
                Err(error) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("the matrix does not read: {error}"),
                    )
                }
            }
        }
    };
    if matrix.decode.is_empty() {
        return json_error(
            StatusCode::BAD_REQUEST,
            "the matrix has no Sustained decode cell to compare with",
        );
    }
    let model = match query
        .model
        .or_else(|| matrix.metadata.model.served_model.clone())
    {
        Some(model) => model,
        None => return json_error(
            StatusCode::BAD_REQUEST,
            "the matrix names no served model: give the model production traffic uses as ?model=",
        ),
    };
    // A sweep measured one model: pinning it for another would compare unlike with unlike.
    // (A page may name its model differently from what clients send, so only sweeps are held
    // to this.)
    if let (true, Some(swept)) = (from_sweep, matrix.metadata.model.served_model.as_deref()) {
        if swept != model {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("the latest sweep measured model `{swept}`, not `{model}`"),
            );
        }
    }
    let upstream = match resolve_upstream(state.view(), query.upstream.as_deref(), &model) {
        Ok(upstream) => upstream,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    let source = match query.source {
        // Shown on pages and in logs: one printable line.
        Some(given) => given
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_SOURCE_CHARS)
            .collect(),
        None => source,
    };
    let reference = Reference {
        upstream,
        model,
        source,
        pinned_at: SystemTime::now(),
        matrix,
    };
    let kept = if let Some(store) = state.store.clone() {
        let row = reference.clone();
        match tokio::task::spawn_blocking(move || store.put_reference(&row)).await {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot keep the reference in the store: {error}"),
                )
            }
            Err(error) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("the store write stopped: {error}"),
                )
            }
        }
    } else {
        false
    };
    let warnings = pin_warnings(&reference.matrix);
    for warning in &warnings {
        tracing::warn!(upstream = %reference.upstream, model = %reference.model, "pinned reference: {warning}");
    }
    let answer = ReferenceAnswer {
        info: reference_info(&reference),
        decode_cells: reference.matrix.decode.len(),
        kept,
        warnings,
        matrix: None,
    };
    tracing::info!(
        upstream = %answer.info.upstream,
        model = %answer.info.model,
        source = %answer.info.source,
        "reference matrix pinned"
    );
    let response = json_response(StatusCode::OK, &answer);
    state.drift.pin(reference);
    response
}

fn show_query(state: &AdminState, query: &ReferenceQuery) -> Response<ResponseBody> {
    let kept = state.store.is_some();
    let Some(model) = query.model.as_deref() else {
        let references = state.drift.references();
        let mut list = Vec::new();
        for reference in &references {
            if query
                .upstream
                .as_deref()
                .is_some_and(|u| u != reference.upstream)
            {
                continue;
            }
            list.push(ReferenceAnswer {
                info: reference_info(reference),
                decode_cells: reference.matrix.decode.len(),
                kept,
                warnings: pin_warnings(&reference.matrix),
                matrix: None,
            });
        }
        return json_response(StatusCode::OK, &list);
    };
    let upstream = match resolve_upstream(state.view(), query.upstream.as_deref(), model) {
        Ok(upstream) => upstream,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    let Some(reference) = state.drift.reference(&upstream, model) else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!("no reference is pinned for upstream `{upstream}` and model `{model}`: pin one with `tokentap reference pin` (PUT /reference)"),
        );
    };
    match query.format.as_deref() {
        None | Some("status") => json_response(
            StatusCode::OK,
            &ReferenceAnswer {
                info: reference_info(&reference),
                decode_cells: reference.matrix.decode.len(),
                kept,
                warnings: pin_warnings(&reference.matrix),
                matrix: Some(&reference.matrix),
            },
        ),
        Some(name) => match Format::parse_among(name, &MATRIX_ALONE) {
            Ok(format) => respond(
                StatusCode::OK,
                format.content_type(),
                format.render(&reference.matrix),
            ),
            Err(message) => json_error(
                StatusCode::BAD_REQUEST,
                &format!("{message} (or status, the default)"),
            ),
        },
    }
}

async fn unpin_query(state: &AdminState, query: &ReferenceQuery) -> Response<ResponseBody> {
    let Some(model) = query.model.clone() else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "say which reference to unpin with ?model= (and ?upstream= when the router does not choose it)",
        );
    };
    let upstream = match resolve_upstream(state.view(), query.upstream.as_deref(), &model) {
        Ok(upstream) => upstream,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    let mut found = state.drift.unpin(&upstream, &model);
    if let Some(store) = state.store.clone() {
        let (u, m) = (upstream.clone(), model.clone());
        match tokio::task::spawn_blocking(move || store.delete_reference(&u, &m)).await {
            Ok(Ok(deleted)) => found |= deleted,
            Ok(Err(error)) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot remove the reference from the store: {error}"),
                )
            }
            Err(error) => {
                return json_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("the store write stopped: {error}"),
                )
            }
        }
    }
    if found {
        json_response(
            StatusCode::OK,
            &serde_json::json!({"upstream": upstream, "model": model, "state": "unpinned"}),
        )
    } else {
        json_error(
            StatusCode::NOT_FOUND,
            &format!("no reference is pinned for upstream `{upstream}` and model `{model}`"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_from_clauses_parse() {
        let q = parse_query(Some("upstream=a&model=x%2Fy&source=file+r.json")).unwrap();
        assert_eq!(q.upstream.as_deref(), Some("a"));
        assert_eq!(q.model.as_deref(), Some("x/y"));
        assert_eq!(q.source.as_deref(), Some("file r.json"));
        assert!(parse_query(Some("colour=red"))
            .unwrap_err()
            .contains("colour"));
        assert_eq!(
            from_clause(br#"{"from":"latest-sweep"}"#),
            Some(Ok("latest-sweep".to_owned()))
        );
        assert!(matches!(from_clause(br#"{"from":1}"#), Some(Err(_))));
        assert!(matches!(
            from_clause(br#"{"from":"x","y":1}"#),
            Some(Err(_))
        ));
        assert_eq!(from_clause(br#"{"schema":"tokentap.matrix/v1"}"#), None);
        assert_eq!(from_clause(b"Speed test matrix"), None);
    }
}
