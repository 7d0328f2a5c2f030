//! `GET /status`: the one verdict per model as JSON (`view::status`: production against the
//! SLO, production beside the sweep, headroom and what it rests on, drift against the
//! reference, a configuration change in the window), each clause linking to the figure it
//! summarises. `tokentap status` prints it; the page shows it on top.

use std::time::SystemTime;

use http::StatusCode;

use crate::proxy::body::ResponseBody;

use super::state::{json_response, AdminState};

/// `GET /status`.
pub async fn handle(state: &AdminState) -> http::Response<ResponseBody> {
    json_response(
        StatusCode::OK,
        &super::view::status(state.view(), SystemTime::now()).await,
    )
}
