//! The sweep API on the admin listener:
//!
//! | route | does |
//! |---|---|
//! | `POST /sweeps` | start a sweep (JSON plan, may be empty): 202 + id; 409 while one runs or while production requests are in flight (unless the plan says `beside_production`); 400 names the bad field |
//! | `POST /sweeps?dry_run=true` | what that sweep would do, nothing started: 200 + the preview (cells, largest prompt, KV use, expected duration, the plan); any spelling of the key previews unless its value is false, 0, no or off, and any other query is a 400 |
//! | `GET /sweeps` | every sweep, newest first |
//! | `GET /sweeps/{id}` | state, progress, ETA, plan, partial matrix; `?format=md\|html\|json` renders the matrix alone |
//! | `DELETE /sweeps/{id}` | cancel: the streams are aborted within a second |
//!
//! Starting and cancelling always need the bearer token (`admin.token`): without one
//! configured, sweeps are refused (403). Reading follows the admin listener's usual rule. The
//! route table (`routes.rs`) checks both before these handlers run.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::Body;

use super::query::{percent_decode, MATRIX_ALONE};
use super::state::{json_error, json_response, respond, AdminState};
use crate::matrix::Format;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;
use crate::sweep::{CancelError, StartError, SweepRequest};

/// Largest sweep plan accepted.
pub const MAX_PLAN_BYTES: usize = 64 << 10;

/// `GET /sweeps`: every sweep, newest first.
pub fn list(state: &AdminState) -> Response<ResponseBody> {
    json_response(StatusCode::OK, &state.sweeps.list())
}

/// `DELETE /sweeps/{id}`: cancels the running sweep `id`.
pub fn cancel(state: &AdminState, id: &str) -> Response<ResponseBody> {
    match state.sweeps.cancel(id) {
        Ok(()) => json_response(
            StatusCode::ACCEPTED,
            &serde_json::json!({"id": id, "state": "cancelling"}),
        ),
        Err(error @ CancelError::Unknown { .. }) => {
            json_error(StatusCode::NOT_FOUND, &error.to_string())
        }
        Err(error @ CancelError::NotRunning { .. }) => {
            json_error(StatusCode::CONFLICT, &error.to_string())
        }
    }
}

/// The request's sweep plan (an empty body is the default plan), or the 400 naming the field.
async fn read_plan<B>(request: Request<B>) -> Result<SweepRequest, Response<ResponseBody>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let body = super::state::read_body(request, MAX_PLAN_BYTES, "the sweep plan").await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(SweepRequest::default());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        json_error(
            StatusCode::BAD_REQUEST,
            &format!("sweep plan, at `{}`: {}", error.path(), error.inner()),
        )
    })
}

async fn preview<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let plan = match read_plan(request).await {
        Ok(plan) => plan,
        Err(response) => return response,
    };
    match state.sweeps.preview(&plan).await {
        Ok(preview) => json_response(StatusCode::OK, &preview),
        Err(error) => start_error(error),
    }
}

/// How a sweep that did not start is answered.
pub fn start_error(error: StartError) -> Response<ResponseBody> {
    match error {
        error @ (StartError::Busy { .. } | StartError::ProductionInFlight { .. }) => {
            json_error(StatusCode::CONFLICT, &error.to_string())
        }
        error @ StartError::Interrupted { .. } => {
            json_error(StatusCode::SERVICE_UNAVAILABLE, &error.to_string())
        }
        StartError::Plan(error) => json_error(
            StatusCode::BAD_REQUEST,
            &format!("the sweep plan cannot run: {error}"),
        ),
    }
}

/// `POST /sweeps`: starts a sweep; with `?dry_run=true` answers its preview instead.
pub async fn start<B>(state: &AdminState, request: Request<B>) -> Response<ResponseBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let dry_run = match dry_run(request.uri().query().unwrap_or("")) {
        Ok(dry_run) => dry_run,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    if dry_run {
        return preview(state, request).await;
    }
    let plan = match read_plan(request).await {
        Ok(plan) => plan,
        Err(response) => return response,
    };
    match state.sweeps.start(plan).await {
        Ok(id) => {
            let location = format!("/sweeps/{id}");
            let mut response = json_response(
                StatusCode::ACCEPTED,
                &serde_json::json!({"id": id, "url": location}),
            );
            if let Ok(value) = HeaderValue::try_from(location) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            response
        }
        Err(error) => start_error(error),
    }
}

/// Whether `POST /sweeps`' query asks for a preview. It fails closed: the key is read in any
/// spelling a client may send (case, `-` for `_`, percent-encoded), and previews unless its
/// value is a clear false (`false`, `0`, `no`, `off`: any case); a bare key or a true value
/// previews. A value that is neither, or any other key, is a 400 naming what is accepted, so a
/// misspelt preview never starts a sweep.
fn dry_run(query: &str) -> Result<bool, String> {
    const ACCEPTED: &str = "POST /sweeps takes one query key, `dry_run` (`?dry_run=true` previews; false, 0, no or off starts the sweep)";
    let mut dry_run = false;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        let key = percent_decode(key).map(|key| key.trim().to_ascii_lowercase().replace('-', "_"));
        let value = percent_decode(value).map(|v| v.trim().to_ascii_lowercase());
        let shown = |text: &str| text.chars().take(64).collect::<String>();
        if key.as_deref() != Some("dry_run") {
            return Err(format!("unknown query key `{}`: {ACCEPTED}", shown(pair)));
        }
        match value.as_deref() {
            Some("" | "true" | "1" | "yes" | "on") => dry_run = true,
            Some("false" | "0" | "no" | "off") => {}
            _ => {
                return Err(format!(
                    "`{}`: dry_run is true or false; {ACCEPTED}",
                    shown(pair)
                ))
            }
        }
    }
    Ok(dry_run)
}

/// `GET /sweeps/{id}`: its status, or its matrix rendered (`?format=`).
pub fn show(state: &AdminState, id: &str, query: &str) -> Response<ResponseBody> {
    let Some(status) = state.sweeps.get(id) else {
        return json_error(StatusCode::NOT_FOUND, &format!("no sweep {id}"));
    };
    let format = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("format="))
        .unwrap_or("");
    if format.is_empty() || format == "status" {
        return json_response(StatusCode::OK, &status);
    }
    let Some(matrix) = status.matrix.as_ref() else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!("sweep {id} has no matrix yet ({})", status.state.as_str()),
        );
    };
    match Format::parse_among(format, &MATRIX_ALONE) {
        Ok(format) => respond(StatusCode::OK, format.content_type(), format.render(matrix)),
        Err(message) => json_error(
            StatusCode::BAD_REQUEST,
            &format!("{message} (or status, the default)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::dry_run;

    #[test]
    fn every_spelling_of_dry_run_previews_and_nothing_unknown_starts_a_sweep() {
        for query in [
            "dry_run",
            "dry_run=true",
            "dry_run=1",
            "dry_run=True",
            "dry_run=TRUE",
            "dry_run=yes",
            "dry_run=on",
            "dry-run=true",
            "DRY_RUN=true",
            "Dry-Run",
            "dry%5Frun=true",
            "%64ry_run=%54rue",
            "dry_run=",
            "dry_run=false&dry_run=true",
            "&dry_run&",
        ] {
            assert_eq!(dry_run(query), Ok(true), "{query}");
        }
        for query in [
            "",
            "&",
            "dry_run=false",
            "dry_run=0",
            "DRY-RUN=False",
            "dry_run=off",
        ] {
            assert_eq!(dry_run(query), Ok(false), "{query}");
        }
        for query in [
            "dry_run=maybe",
            "dryrun=true",
            "preview=true",
            "dry_run=%FF",
            "dry_run=%zz",
            "x",
        ] {
            let error = dry_run(query).unwrap_err();
            assert!(error.contains("dry_run"), "{query}: {error}");
        }
    }
}
