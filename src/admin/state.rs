//! What the admin endpoints share: [`AdminState`] (what they read; [`AdminState::view`], the
//! part the view layer reads), the credential checks (the bearer token, throttled per client
//! address; browser sessions; the `Host` check that keeps a token-less admin to loopback
//! names), the small response helpers, and the hyper service that hands requests to the route
//! table (`routes.rs`). The session table's types (`sessions.rs`) are re-exported here: an
//! endpoint file imports only `state`, `query` and `view`.

use std::convert::Infallible;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body::Body;

use super::sessions;
pub use super::sessions::{
    cookie_id, Attempt, ClientAddr, Judged, LoginFailure, SessionView, Sessions, COOKIE,
    MAX_CLIENTS, MAX_DELAY,
};
use super::view::{CapacitySettings, View};
use crate::aggregate::ProductionMatrix;
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;
use crate::proxy::Proxy;
use crate::store::Store;
use crate::sweep::LatestMatrix;
use crate::telemetry::prometheus::PrometheusMetrics;

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
    pub capacity: CapacitySettings,
    /// Browser sessions (`/login`), used only when `token` is set; also the failed-credential
    /// record that throttles logins and bearer tokens per client address.
    pub sessions: Sessions,
    /// `admin.allowed_hosts`: without a token, the `Host` names answered besides loopback.
    pub allowed_hosts: Vec<String>,
    /// Whether the upstreams answer (`/readyz`), probed at most once a second.
    pub readiness: crate::proxy::readiness::ReadinessProbe,
    /// The login bodies being read now, from clients not yet known to be anyone.
    pub login_bodies: LoginBodies,
}

/// Login forms read at once, at most: past it a login is answered `503` at once and its
/// connection closed, so slow bodies cannot hold the listener's connections
/// (`admin.max_connections`) that `/healthz`, `/readyz` and `/metrics` need.
pub const MAX_LOGIN_BODIES: usize = 8;

/// Largest login or form body read.
pub const MAX_FORM_BYTES: usize = 4 << 10;

/// How long a login form may take to arrive (a few hundred bytes).
pub const LOGIN_BODY_DEADLINE: Duration = Duration::from_secs(5);

/// How long any other request body of the admin listener may take to arrive (a sweep plan, a
/// reference matrix: callers that passed the credential check).
pub const BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The bounded slots for login bodies being read ([`MAX_LOGIN_BODIES`]).
#[derive(Debug)]
pub struct LoginBodies(tokio::sync::Semaphore);

impl Default for LoginBodies {
    fn default() -> Self {
        Self(tokio::sync::Semaphore::new(MAX_LOGIN_BODIES))
    }
}

/// What a refused request sent: no credential at all, or a wrong one (told apart in the 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    Missing,
    Wrong,
}

/// The answer to a wrong credential sent from an address still waiting after failures (or
/// past the listener's budget of failed checks): `429`, with how long in `Retry-After`.
pub fn too_many(left: std::time::Duration) -> Response<ResponseBody> {
    let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let mut response = json_error(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("too many wrong admin credentials: try again in {seconds} s"),
    );
    if let Ok(value) = HeaderValue::try_from(seconds.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
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

/// The request body, read up to `limit` bytes within [`BODY_DEADLINE`]; a 400 naming `what`
/// and the limit otherwise (a 408 when it came too slowly).
pub async fn read_body<B>(
    request: Request<B>,
    limit: usize,
    what: &str,
) -> Result<Bytes, Response<ResponseBody>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    read_body_within(request, limit, what, BODY_DEADLINE).await
}

async fn read_body_within<B>(
    request: Request<B>,
    limit: usize,
    what: &str,
    deadline: Duration,
) -> Result<Bytes, Response<ResponseBody>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use http_body_util::{BodyExt, Limited};
    let read = Limited::new(request.into_body(), limit).collect();
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) => Err(json_error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read {what} (at most {limit} bytes): {error}"),
        )),
        Err(_elapsed) => Err(closing(json_error(
            StatusCode::REQUEST_TIMEOUT,
            &format!("{what} did not arrive within {} s", deadline.as_secs()),
        ))),
    }
}

/// `response` with its connection closed after it (a request whose body is left unread).
fn closing(mut response: Response<ResponseBody>) -> Response<ResponseBody> {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
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
    /// A login form, read in one of [`MAX_LOGIN_BODIES`] slots within [`LOGIN_BODY_DEADLINE`]:
    /// with every slot taken, `503` at once (the connection closed).
    pub async fn read_form<B>(
        &self,
        request: Request<B>,
        what: &str,
    ) -> Result<Bytes, Response<ResponseBody>>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let Ok(_slot) = self.login_bodies.0.try_acquire() else {
            let mut response = closing(json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "too many logins are being read ({MAX_LOGIN_BODIES}): try again in a second"
                ),
            ));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(response);
        };
        read_body_within(request, MAX_FORM_BYTES, what, LOGIN_BODY_DEADLINE).await
    }

    /// The part of the state the view layer reads: figures, no credentials.
    pub fn view(&self) -> View<'_> {
        View {
            proxy: &self.proxy,
            production: &self.production,
            synthetic: &self.synthetic,
            store: &self.store,
            drift: &self.drift,
            capacity: &self.capacity,
            readiness: &self.readiness,
        }
    }

    /// True if the request may read: it carries the configured bearer token or a live browser
    /// session (or no token is configured).
    pub fn authorized<B>(&self, request: &Request<B>) -> bool {
        if self.token.is_none() {
            return true;
        }
        self.bearer_ok(request) || self.session_of(request).is_some()
    }

    /// The live session this request's cookie names, when a token is configured.
    pub fn session_of<B>(&self, request: &Request<B>) -> Option<SessionView> {
        self.token.as_ref()?;
        self.sessions.find(sessions::cookie_id(request)?)
    }

    /// True only if a token is configured and the request carries it as a bearer token (writes
    /// need this; a browser session is not enough).
    pub fn authorized_strict<B>(&self, request: &Request<B>) -> bool {
        self.bearer_ok(request)
    }

    /// A bearer token is judged once per request, before routing, under the throttle
    /// (`Sessions::judge`): while its address waits after failures (1 s, 2 s, … up to 30 s), or
    /// once the listener's budget of failed checks for this second is spent, it is not compared
    /// at all, right or wrong (`429` with `Retry-After`); else a wrong one is a failure (`401`,
    /// and the address waits). `None`: go on (no token configured, no bearer sent, or the right
    /// one).
    pub(super) fn check_bearer<B>(&self, request: &Request<B>) -> Option<Response<ResponseBody>> {
        let token = self.token.as_deref()?;
        let given = bearer(request)?;
        let client = request.extensions().get::<ClientAddr>().map(|c| c.0);
        match self.sessions.judge(client, || {
            constant_time_eq(given.as_bytes(), token.as_bytes())
        }) {
            Judged::Right => None,
            Judged::Throttled(left) => {
                self.metrics
                    .count_login_failure(LoginFailure::Throttled.label());
                Some(too_many(left))
            }
            Judged::Wrong(wait) => {
                self.metrics
                    .count_login_failure(LoginFailure::BadToken.label());
                tracing::warn!(client = ?client, wait_s = wait.as_secs(), "wrong admin bearer token");
                Some(unauthorized(Credential::Wrong))
            }
        }
    }

    /// Whether the request's `Host` (or HTTP/2 authority) is a loopback name or address, or
    /// one of `admin.allowed_hosts`. A request without one (HTTP/1.0) is allowed: browsers
    /// always send it.
    pub(super) fn host_allowed<B>(&self, request: &Request<B>) -> bool {
        let Some(host) = request_host(request) else {
            return true;
        };
        let host = host.to_ascii_lowercase();
        let name = host_name(&host);
        name == "localhost"
            || name.ends_with(".localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || self.allowed_hosts.iter().any(|allowed| allowed == name)
    }

    fn bearer_ok<B>(&self, request: &Request<B>) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        bearer(request).is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
    }
}

/// The `Host` a request named: the header, else the URI's authority (HTTP/2).
fn request_host<B>(request: &Request<B>) -> Option<&str> {
    match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok().or(Some("")),
        None => request.uri().authority().map(|a| a.as_str()),
    }
}

/// A `Host` without its port (`[::1]:9464` → `::1`, `localhost:9464` → `localhost`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The answer to a request whose `Host` is not the admin's (no token configured).
pub(super) fn misdirected_host<B>(request: &Request<B>) -> Response<ResponseBody> {
    let host = request_host(request).unwrap_or("");
    json_error(
        StatusCode::FORBIDDEN,
        &format!(
            "the admin answers only to loopback names and addresses while no admin.token is set, not to Host `{}`; add that name to admin.allowed_hosts (or set admin.token) if you reach tokentap by it",
            host.chars().take(100).collect::<String>()
        ),
    )
}

pub fn unauthorized(credential: Credential) -> Response<ResponseBody> {
    let message = match credential {
        Credential::Missing => {
            "this admin endpoint needs the admin token and none was sent: send `Authorization: Bearer <admin.token>` (tokentap's own commands send --token or the TOKENTAP_ADMIN__TOKEN environment variable; a browser: log in at /login)"
        }
        Credential::Wrong => {
            "the admin token sent is not this proxy's admin.token (tokentap's own commands send --token or the TOKENTAP_ADMIN__TOKEN environment variable: check its value; a browser: log in at /login)"
        }
    };
    let mut response = json_error(StatusCode::UNAUTHORIZED, message);
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

pub(super) fn bearer<B>(request: &Request<B>) -> Option<&str> {
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
            request.extensions_mut().insert(ClientAddr(peer.ip()));
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
