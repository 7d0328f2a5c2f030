//! The admin listener: health, readiness, Prometheus metrics, the matrix (`matrix`), the page
//! (`page`), live headroom (`capacity`), the captured workload (`workload`), the sweep API (`sweeps`) and the reference API
//! (`reference`); starting sweeps and pinning references always need the token. Bound to loopback by
//! default; with `admin.token` set, everything but `/healthz` and `/readyz` needs
//! `Authorization: Bearer <token>`, or, for reading (`GET`) and the page's own sweep form, a
//! browser session from `POST /login` (`session`). A browser asking for HTML without either is
//! sent to the login form.
//!
//! This file routes and checks the token; each endpoint family lives in its own file.

pub mod capacity;
pub mod matrix;
pub mod page;
pub mod query;
pub mod reference;
pub mod session;
pub mod workload;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;

use crate::aggregate::ProductionMatrix;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;
use crate::proxy::Proxy;
use crate::store::Store;
use crate::sweep::LatestMatrix;
use crate::telemetry::prometheus::PrometheusMetrics;

pub mod sweeps;

/// What the admin endpoints read.
#[derive(Debug)]
pub struct AdminState {
    pub proxy: Arc<Proxy>,
    pub metrics: Arc<PrometheusMetrics>,
    pub token: Option<String>,
    /// Starts, follows and lists synthetic sweeps (`/sweeps…`).
    pub sweeps: Arc<crate::sweep::SweepManager>,
    /// Set when shutdown begins: readiness turns 503 so load balancers drain us.
    pub draining: AtomicBool,
    /// The production matrix aggregator (a sink of the proxy's meter).
    pub production: Arc<ProductionMatrix>,
    /// The latest synthetic matrix; the sweep engine fills it.
    pub synthetic: LatestMatrix,
    /// The SQLite store, when `store.data_dir` is set.
    pub store: Option<Arc<Store>>,
    /// The pinned reference matrices and the drift settings (`/reference`, `?compare=`).
    pub drift: Arc<crate::aggregate::drift::Drift>,
    /// The workload capture, when `[workload] capture` is on (`/workload`).
    pub workload: Option<Arc<crate::workload::WorkloadCapture>>,
    /// How live headroom is computed (`/capacity`, the page, the capacity gauges).
    pub capacity: capacity::CapacitySettings,
    /// Browser sessions (`/login`), used only when `token` is set.
    pub sessions: session::Sessions,
}

/// A plain response with a content type.
pub fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::local(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON error in the same shape the data path uses.
pub fn json_error(status: StatusCode, message: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({"error": {"message": message, "code": status.as_u16()}});
    respond(status, "application/json", body.to_string())
}

/// The request body, read up to `limit` bytes; a 400 naming `what` and the limit otherwise.
pub async fn read_body<B>(
    request: Request<B>,
    limit: usize,
    what: &str,
) -> Result<Bytes, Response<ResponseBody>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use http_body_util::{BodyExt, Limited};
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => Err(json_error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read {what} (at most {limit} bytes): {error}"),
        )),
    }
}

/// `value` as pretty JSON with a trailing newline (a 500 naming the problem if it cannot be
/// rendered).
pub fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<ResponseBody> {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            respond(status, "application/json", text)
        }
        Err(error) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot render the answer: {error}"),
        ),
    }
}

/// Compares without an early exit, so response timing reveals nothing about the token.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl AdminState {
    /// True if the request may read: it carries the configured bearer token or a live browser
    /// session (or no token is configured).
    pub fn authorized<B>(&self, request: &Request<B>) -> bool {
        if self.token.is_none() {
            return true;
        }
        self.bearer_ok(request) || session::session_of(self, request).is_some()
    }

    /// True only if a token is configured and the request carries it as a bearer token (writes
    /// need this; a browser session is not enough).
    pub fn authorized_strict<B>(&self, request: &Request<B>) -> bool {
        self.bearer_ok(request)
    }

    fn bearer_ok<B>(&self, request: &Request<B>) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        bearer(request).is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
    }

    pub async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let path = request.uri().path().to_string();
        match (request.method(), path.as_str()) {
            (&Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
            (&Method::GET, "/readyz") => {
                if self.draining.load(Ordering::Relaxed) {
                    respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
                } else {
                    respond(StatusCode::OK, "text/plain", "ready\n")
                }
            }
            (_, path) if session::owns(path) => session::handle(&self, request).await,
            _ if !self.authorized(&request) && session::wants_html(&request) => {
                session::see_other("/login")
            }
            (_, path) if sweeps::owns(path) => sweeps::handle(&self, request).await,
            (_, path) if reference::owns(path) => reference::handle(&self, request).await,
            _ if !self.authorized(&request) => unauthorized(),
            (&Method::GET, "/metrics") => {
                let mut text = self.metrics.render();
                if let Some(latest) = self.synthetic.get() {
                    crate::telemetry::sweep::render_into(&latest, &mut text);
                }
                respond(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text,
                )
            }
            (&Method::GET, "/matrix") => matrix::handle(&self, &request).await,
            (&Method::GET, "/workload") => workload::handle(&self, &request).await,
            (&Method::GET, "/capacity") => capacity::handle(&self),
            (&Method::GET, "/") => page::handle(&self, &request).await,
            _ => json_error(StatusCode::NOT_FOUND, &format!("no admin endpoint {path}")),
        }
    }
}

pub fn unauthorized() -> Response<ResponseBody> {
    let mut response = json_error(
        StatusCode::UNAUTHORIZED,
        "this admin endpoint needs `Authorization: Bearer <admin.token>` (a browser: log in at /login)",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn bearer<B>(request: &Request<B>) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Adapts the admin state to hyper's per-connection service; `peer` is the connection's client
/// (failed logins are slowed per address).
pub fn service(
    state: Arc<AdminState>,
    peer: Option<std::net::SocketAddr>,
) -> impl hyper::service::Service<
    Request<hyper::body::Incoming>,
    Response = Response<ResponseBody>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<ResponseBody>, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        let state = Arc::clone(&state);
        if let Some(peer) = peer {
            request
                .extensions_mut()
                .insert(session::ClientAddr(peer.ip()));
        }
        async move { Ok::<_, Infallible>(state.handle(request).await) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
