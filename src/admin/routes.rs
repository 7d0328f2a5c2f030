//! The admin listener's routes as a table: each route's method, path, who may use it and its
//! handler. Access is checked here, from the table, before any handler runs: a route's place in
//! the file decides nothing (linkerd's admin checks access per route the same way). A test walks
//! the table (`tests/admin_tests.rs`) and asserts every route's access without credentials, with
//! a browser session and with the bearer token.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;

use super::state::{
    bearer, json_error, misdirected_host, respond, unauthorized, AdminState, Credential,
};
use super::{capacity, conversations, matrix, page, reference, session, status, sweeps, workload};
use crate::proxy::body::ResponseBody;
use crate::proxy::BoxError;

/// Who may use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, whatever the `Host` and whatever credential comes along (none is checked): the
    /// health and readiness probes, which a load balancer sends by the node's address, and
    /// whose stale token must not count as a failed credential.
    Probe,
    /// Anyone: the login form and its posts (the `Host` check and a sent bearer token's check
    /// still apply).
    Open,
    /// The bearer token or a browser session from `/login` (anyone while no `admin.token` is
    /// set, on loopback names only). A browser without either is sent to the login form.
    Read,
    /// The bearer token, always (refused with 403 while no `admin.token` is set): starting and
    /// cancelling sweeps, pinning references.
    Write,
    /// A browser session and the session's CSRF field: the page's own forms (the handler checks
    /// the field; without a session it is sent to the login form).
    Form,
}

/// A route's path: exact, or every path under a prefix ending in `/` (`/sweeps/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePath {
    Exact(&'static str),
    Under(&'static str),
}

impl RoutePath {
    fn matches(self, path: &str) -> bool {
        match self {
            RoutePath::Exact(exact) => path == exact,
            RoutePath::Under(prefix) => {
                path.len() > prefix.len()
                    && path.starts_with(prefix)
                    && !path[prefix.len()..].contains('/')
            }
        }
    }

    /// A concrete path of the route (a made-up id under a prefix), for tests walking the table.
    pub fn example(self) -> String {
        match self {
            RoutePath::Exact(exact) => exact.to_owned(),
            RoutePath::Under(prefix) => format!("{prefix}0-0000"),
        }
    }
}

/// What answers a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    Healthz,
    Readyz,
    LoginForm,
    Login,
    Logout,
    PageSweep,
    Metrics,
    Matrix,
    Workload,
    Capacity,
    Status,
    Page,
    SweepList,
    SweepStart,
    SweepShow,
    SweepCancel,
    ReferenceShow,
    ReferencePin,
    ReferenceUnpin,
}

/// One route of the admin listener.
#[derive(Debug, Clone)]
pub struct AdminRoute {
    pub method: Method,
    pub path: RoutePath,
    pub access: Access,
    pub handler: Handler,
}

const fn route(method: Method, path: RoutePath, access: Access, handler: Handler) -> AdminRoute {
    AdminRoute {
        method,
        path,
        access,
        handler,
    }
}

use Access::{Form, Open, Probe, Read, Write};
use RoutePath::{Exact, Under};

/// Every route of the admin listener.
pub const ROUTES: &[AdminRoute] = &[
    route(Method::GET, Exact("/healthz"), Probe, Handler::Healthz),
    route(Method::GET, Exact("/readyz"), Probe, Handler::Readyz),
    route(Method::GET, Exact("/login"), Open, Handler::LoginForm),
    route(Method::POST, Exact("/login"), Open, Handler::Login),
    route(Method::POST, Exact("/logout"), Open, Handler::Logout),
    route(Method::POST, Exact("/page/sweep"), Form, Handler::PageSweep),
    route(Method::GET, Exact("/"), Read, Handler::Page),
    route(Method::GET, Exact("/metrics"), Read, Handler::Metrics),
    route(Method::GET, Exact("/matrix"), Read, Handler::Matrix),
    route(Method::GET, Exact("/workload"), Read, Handler::Workload),
    route(Method::GET, Exact("/capacity"), Read, Handler::Capacity),
    route(Method::GET, Exact("/status"), Read, Handler::Status),
    route(Method::GET, Exact("/sweeps"), Read, Handler::SweepList),
    route(Method::POST, Exact("/sweeps"), Write, Handler::SweepStart),
    route(Method::GET, Under("/sweeps/"), Read, Handler::SweepShow),
    route(
        Method::DELETE,
        Under("/sweeps/"),
        Write,
        Handler::SweepCancel,
    ),
    route(
        Method::GET,
        Exact("/reference"),
        Read,
        Handler::ReferenceShow,
    ),
    route(
        Method::PUT,
        Exact("/reference"),
        Write,
        Handler::ReferencePin,
    ),
    route(
        Method::DELETE,
        Exact("/reference"),
        Write,
        Handler::ReferenceUnpin,
    ),
];

/// The route of `method` and `path`; else the methods the path takes (empty: no such path).
pub fn find(method: &Method, path: &str) -> Result<&'static AdminRoute, Vec<&'static str>> {
    let on_path: Vec<&'static AdminRoute> =
        ROUTES.iter().filter(|r| r.path.matches(path)).collect();
    on_path
        .iter()
        .find(|r| r.method == *method)
        .copied()
        .ok_or_else(|| on_path.iter().map(|r| r.method.as_str()).collect())
}

/// The path as the table compares it: without a trailing slash (but `/` itself).
fn normalised(path: &str) -> &str {
    if path.len() > 1 {
        path.trim_end_matches('/')
    } else {
        path
    }
}

impl AdminState {
    /// Answers one admin request: the `Host` check (no token), the bearer token's check (every
    /// request that carries one, throttled per address), the route's access from the table,
    /// then its handler. A `Probe` route skips the first two.
    pub async fn handle<B>(self: Arc<Self>, request: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let path = normalised(request.uri().path()).to_owned();
        let found = find(request.method(), &path);
        let probe = matches!(found, Ok(route) if route.access == Access::Probe);
        if !probe {
            if self.token.is_none() && !self.host_allowed(&request) {
                return misdirected_host(&request);
            }
            if self.token.is_some() && bearer(&request).is_some() {
                if let Some(refused) = self.check_bearer(&request) {
                    return refused;
                }
            }
        }
        let route = match found {
            Ok(route) => route,
            Err(allowed) if allowed.is_empty() => {
                return json_error(StatusCode::NOT_FOUND, &format!("no admin endpoint {path}"));
            }
            Err(allowed) => {
                let allowed = allowed.join(", ");
                let mut response = json_error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &format!("{} is not allowed on {path}: {allowed}", request.method()),
                );
                if let Ok(value) = HeaderValue::try_from(allowed) {
                    response.headers_mut().insert(header::ALLOW, value);
                }
                return response;
            }
        };
        if let Some(refused) = self.refused(route, &request) {
            return refused;
        }
        self.dispatch(route.handler, request, &path).await
    }

    /// Why `request` may not use `route`, as its answer; `None` when it may.
    fn refused<B>(
        &self,
        route: &AdminRoute,
        request: &Request<B>,
    ) -> Option<Response<ResponseBody>> {
        match route.access {
            Access::Probe | Access::Open | Access::Form => None,
            Access::Read if self.authorized(request) => None,
            Access::Read if session::wants_html(request) => Some(session::see_other("/login")),
            Access::Read => Some(unauthorized(sent(request))),
            Access::Write if self.token.is_none() => Some(json_error(
                StatusCode::FORBIDDEN,
                &format!(
                    "{} {} needs the bearer token, and admin.token (TOKENTAP_ADMIN__TOKEN) is not set",
                    route.method,
                    request.uri().path()
                ),
            )),
            Access::Write if self.authorized_strict(request) => None,
            Access::Write => Some(unauthorized(sent(request))),
        }
    }

    async fn dispatch<B>(
        self: Arc<Self>,
        handler: Handler,
        request: Request<B>,
        path: &str,
    ) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let id = || path.rsplit('/').next().unwrap_or("").to_owned();
        match handler {
            Handler::Healthz => respond(StatusCode::OK, "text/plain", "ok\n"),
            Handler::Readyz => {
                if self.draining.load(Ordering::Relaxed) {
                    respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n")
                } else {
                    readiness(&self).await
                }
            }
            Handler::LoginForm => session::login_form(&self),
            Handler::Login => session::login(&self, request).await,
            Handler::Logout => session::logout(&self, &request),
            Handler::PageSweep => session::sweep_form(&self, request).await,
            Handler::Metrics => {
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
            Handler::Matrix if conversations::asks_for_sessions(request.uri().query()) => {
                conversations::handle(&self, &request)
            }
            Handler::Matrix => matrix::handle(&self, &request).await,
            Handler::Workload => workload::handle(&self, &request).await,
            Handler::Capacity => capacity::handle(&self),
            Handler::Status => status::handle(&self).await,
            Handler::Page => page::handle(&self, &request).await,
            Handler::SweepList => sweeps::list(&self),
            Handler::SweepStart => sweeps::start(&self, request).await,
            Handler::SweepShow => sweeps::show(&self, &id(), request.uri().query().unwrap_or("")),
            Handler::SweepCancel => sweeps::cancel(&self, &id()),
            Handler::ReferenceShow => reference::show(&self, &request),
            Handler::ReferencePin => reference::pin(&self, request).await,
            Handler::ReferenceUnpin => reference::unpin(&self, &request).await,
        }
    }
}

/// Whether a refused request sent a credential (a bearer token or a session cookie): a wrong
/// one was judged before routing; here a request without one is told it sent none.
fn sent<B>(request: &Request<B>) -> Credential {
    if bearer(request).is_some() || super::sessions::cookie_id(request).is_some() {
        Credential::Wrong
    } else {
        Credential::Missing
    }
}

/// `/readyz` while not draining: 200 `ready` while at least one upstream answers, else 503
/// naming each upstream — so Kubernetes keeps a sidecar whose engine is loading, or dead, out
/// of the Service until it answers.
async fn readiness(state: &AdminState) -> Response<ResponseBody> {
    let upstreams = state.readiness.upstreams(&state.proxy).await;
    if upstreams.iter().any(|u| u.answering) {
        return respond(StatusCode::OK, "text/plain", "ready\n");
    }
    let mut body = String::from("not ready: no upstream answers\n");
    for upstream in upstreams.iter() {
        body.push_str(&format!(
            "upstream {} at {}: not answering\n",
            upstream.name, upstream.url
        ));
    }
    respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_port_knows_every_admin_route_no_engine_serves() {
        // `/` and `/metrics` are the engine's too: the data port forwards them.
        for route in ROUTES {
            let path = route.path.example();
            let known = crate::proxy::routes::is_admin_path(&path);
            assert_eq!(known, path != "/" && path != "/metrics", "{path}");
        }
    }

    #[test]
    fn every_path_finds_its_route_or_the_methods_it_takes() {
        assert_eq!(find(&Method::GET, "/metrics").unwrap().access, Access::Read);
        assert_eq!(
            find(&Method::GET, "/healthz").unwrap().access,
            Access::Probe
        );
        assert_eq!(find(&Method::GET, "/readyz").unwrap().access, Access::Probe);
        assert_eq!(find(&Method::GET, "/login").unwrap().access, Access::Open);
        assert_eq!(
            find(&Method::POST, "/sweeps").unwrap().access,
            Access::Write
        );
        assert_eq!(
            find(&Method::GET, "/sweeps/abc").unwrap().handler,
            Handler::SweepShow
        );
        assert_eq!(
            find(&Method::DELETE, "/sweeps/abc").unwrap().access,
            Access::Write
        );
        assert!(find(&Method::GET, "/sweeps/a/b").unwrap_err().is_empty());
        assert_eq!(find(&Method::POST, "/metrics").unwrap_err(), ["GET"]);
        assert!(find(&Method::GET, "/nope").unwrap_err().is_empty());
        // Every route is reachable by its own example path, and no two routes share a method
        // and a path.
        for route in ROUTES {
            let found = find(&route.method, &route.path.example()).unwrap();
            assert_eq!(found.handler, route.handler, "{route:?}");
        }
    }
}
