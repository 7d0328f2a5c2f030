//! The admit phase: where a request goes and whether it may. Its upstream (a `path_prefix`,
//! else the default) and its path there; the route policy (`proxy.routes`), and never a
//! tunnel; whether it is on a metered route; and which field run as code its body is checked
//! for (`proxy.code_fields`), with the 403 that refuses it.

use std::sync::Arc;

use http::request::Parts;
use http::{Method, Request};

use crate::base::engine::{CodeField, Sessions};
use crate::base::Route;
use crate::config::CodeFields;
use crate::net::faults::Fault;
use crate::proxy::code_fields::decompressed_by_engine;
use crate::proxy::error::ProxyError;
use crate::proxy::routes::{self, Internal, NotForwarded, Refused};
use crate::proxy::service::{Proxy, Synthetic};
use crate::proxy::sessions::Caller;
use crate::proxy::upstream::Upstream;

/// A request let in: its head, where it goes, and what it is.
pub(crate) struct Admitted {
    pub(crate) parts: Parts,
    /// By path prefix, else the default (a metered request may still go by its model: the
    /// prepare phase).
    pub(crate) upstream: Arc<Upstream>,
    /// The path at the upstream (a matched prefix stripped).
    pub(crate) upstream_path: String,
    /// The path as the client sent it.
    pub(crate) path: String,
    /// Set on a sweep's own request.
    pub(crate) synthetic: Option<Synthetic>,
    /// tokentap's own request (a sweep's included): not held to the route policy.
    pub(crate) internal: bool,
    /// The metered route it is on (a POST to a generation endpoint).
    pub(crate) route: Option<Route>,
    /// The field run as code its body is checked for, and the engine that declares it.
    pub(crate) code_field: Option<(&'static str, CodeField)>,
    /// A GET of an engine's server-info document (its resolved server arguments): the answer
    /// is forwarded with every credential in it masked (`net::redact::redact_secrets`).
    pub(crate) redact: bool,
    /// Its body is sent compressed for the engine to decompress (`x-body-compressed: zstd`):
    /// checked decompressed, and not metered.
    pub(crate) compressed: bool,
    /// It opens, closes or continues an engine session: who sent it, and what is checked.
    pub(crate) session: Option<SessionCall>,
}

/// A request on one of an engine's session routes (`proxy::sessions`).
pub(crate) struct SessionCall {
    pub(crate) kind: SessionKind,
    pub(crate) engine: &'static str,
    pub(crate) sessions: Sessions,
    pub(crate) caller: Option<Caller>,
    /// The session a close names, once its body was read: forgotten when the engine closed it.
    pub(crate) closing: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionKind {
    /// Its answer names the session opened, remembered with its caller.
    Open,
    /// Its body names the session to close: refused when another caller opened it.
    Close,
    /// A generation request whose body may continue a session: refused when another caller
    /// opened it.
    Continue,
}

impl SessionCall {
    /// Its body is read whole first, to find the session it names.
    pub(crate) fn reads_body(&self) -> bool {
        self.kind != SessionKind::Open
    }
}

/// Whether `path` (as the engine will route it) is any engine's server-info document: sglang's
/// `/server_info` (`/get_server_info`), which hands out its resolved server arguments, API keys
/// included; vLLM's `/server_info` under `VLLM_SERVER_DEV_MODE=1`, its configuration.
fn answers_server_args(path: &str) -> bool {
    // Every such route ends so (`/server_info`, `/get_server_info`): other GETs (health
    // probes, the model list) pass without the lookup.
    if !path.contains("server_info") {
        return false;
    }
    let Ok(path) = routes::normalise(path) else {
        return false;
    };
    crate::base::engine::Engine::all()
        .into_iter()
        .any(|engine| engine.spec().describe.server_info.contains(&&*path))
        || &*path == VLLM_DEV_SERVER_INFO
}

/// vLLM's server info, which exists only in its development mode (not one of its
/// self-description routes: tokentap does not ask it).
const VLLM_DEV_SERVER_INFO: &str = "/server_info";

impl Proxy {
    /// The admit phase: the request let in, with its body still unread, or the answer that
    /// refuses it.
    pub(crate) fn admit<B>(&self, request: Request<B>) -> Result<(Admitted, B), ProxyError> {
        if request.method() == Method::CONNECT {
            // A tunnel, not a request for the upstream: the client's mistake, not the
            // upstream's failure (HTTP/1 `CONNECT host:port`, HTTP/2 extended CONNECT alike).
            return Err(ProxyError::Method { method: "CONNECT" });
        }
        let (mut parts, body) = request.into_parts();
        let synthetic = parts.extensions.remove::<Synthetic>();
        let internal = parts.extensions.remove::<Internal>().is_some() || synthetic.is_some();
        let path = parts.uri.path().to_string();
        let by_path = self.router.by_path(&path);
        let (upstream, upstream_path) = match by_path {
            Some((upstream, rest)) => (Arc::clone(upstream), rest.to_string()),
            None => (Arc::clone(self.router.default_upstream()), path.clone()),
        };
        if !internal {
            // The path the engine will route, as it will route it.
            // Held to the route table of the upstream's engine version and frontend.
            let facts = upstream.route_facts();
            if let Err(refused) = self
                .routes
                .check(parts.method.as_str(), &upstream_path, &facts)
            {
                return Err(self.route_refused(refused));
            }
        }
        // sglang registers its generation routes for PUT as well as POST (`/generate`,
        // `/encode`, `/classify`, `/v1/rerank`): a PUT is metered and checked as a POST is.
        let carries_body = matches!(parts.method, Method::POST | Method::PUT);
        let route = carries_body
            .then(|| Route::from_path(&upstream_path))
            .flatten();
        // A field its engine runs as code is looked for where that engine reads it: the body
        // of such a route is read even when it is not metered. A request no path prefix
        // routed may still go to another upstream by its `model` (the prepare phase): until
        // then any engine's field is looked for, and the prepare phase judges by the engine
        // of the upstream it goes to.
        let by_model_later = by_path.is_none() && self.router.routes_by_model();
        let code_field = (!internal && carries_body)
            .then(|| {
                let engine_of = (!by_model_later).then_some(&*upstream);
                self.code_field(engine_of, &upstream_path)
            })
            .flatten();
        let compressed = code_field.is_some() && decompressed_by_engine(&parts.headers);
        let session = (!internal)
            .then(|| {
                let engine_of = (!by_model_later).then_some(&*upstream);
                self.session_call(engine_of, &parts, &upstream_path)
            })
            .flatten();
        let redact = parts.method == Method::GET && answers_server_args(&upstream_path);
        let admitted = Admitted {
            parts,
            upstream,
            upstream_path,
            path,
            synthetic,
            internal,
            route,
            code_field,
            compressed,
            redact,
            session,
        };
        Ok((admitted, body))
    }

    /// The answer to a path the route policy does not forward (counted).
    fn route_refused(&self, refused: Refused) -> ProxyError {
        let error = match refused {
            Refused::Route {
                path,
                why: NotForwarded::Admin,
            } => {
                self.faults.add(Fault::RouteRefused);
                ProxyError::AdminRoute {
                    path,
                    admin: self.admin_address.get().cloned(),
                }
            }
            Refused::Route { path, why } => {
                self.faults.add(Fault::RouteRefused);
                ProxyError::RouteRefused { path, why }
            }
            Refused::Unreadable { target, why } => {
                self.faults.add(Fault::PathUnreadable);
                ProxyError::BadPath { target, why }
            }
        };
        let path = match &error {
            ProxyError::RouteRefused { path, .. } | ProxyError::AdminRoute { path, .. } => {
                path.as_str()
            }
            ProxyError::BadPath { target, .. } => target.as_str(),
            _ => "",
        };
        self.refusals.note("route_refused", path, &error);
        error
    }

    /// The field run as code that a request to `path` may carry, when the engine of `upstream`
    /// reads it there (any engine's, while the upstream has not said what it is or is not
    /// known yet), unless `proxy.code_fields = "forward"`.
    pub(crate) fn code_field(
        &self,
        upstream: Option<&Upstream>,
        path: &str,
    ) -> Option<(&'static str, CodeField)> {
        if self.code_fields == CodeFields::Forward {
            return None;
        }
        let path = routes::normalise(path).ok()?;
        let engine = upstream
            .and_then(Upstream::engine)
            .map(|engine| engine.spec().name);
        let found = crate::base::engine::code_fields(&path)
            .find(|(declared_by, _)| engine.is_none_or(|engine| engine == *declared_by));
        found
    }

    /// What a request to `path` is to the sessions of the engine of `upstream` (any engine's,
    /// while it has not said what it is): an open, a close, a generation request that may
    /// continue one (looked at only while some session is remembered), or none.
    fn session_call(
        &self,
        upstream: Option<&Upstream>,
        parts: &Parts,
        path: &str,
    ) -> Option<SessionCall> {
        let path = routes::normalise(path).ok()?;
        let engine = upstream
            .and_then(Upstream::engine)
            .map(|engine| engine.spec().name);
        let carries_body = matches!(parts.method, Method::POST | Method::PUT);
        let (engine, sessions, kind) = crate::base::engine::sessions()
            .filter(|(declared_by, _)| engine.is_none_or(|engine| engine == *declared_by))
            .find_map(|(engine, sessions)| {
                let kind = if *path == *sessions.open {
                    SessionKind::Open
                } else if *path == *sessions.close {
                    SessionKind::Close
                } else if carries_body
                    && sessions.params_routes.contains(&&*path)
                    && !self.sessions.is_empty()
                {
                    SessionKind::Continue
                } else {
                    return None;
                };
                Some((engine, sessions, kind))
            })?;
        let caller = Caller::of(&parts.headers, &self.tenants);
        // A session opened by no caller cannot be told from anyone's: nothing to remember.
        if kind == SessionKind::Open && caller.is_none() {
            return None;
        }
        Some(SessionCall {
            kind,
            engine,
            sessions,
            caller,
            closing: None,
        })
    }

    /// The 403 for a close or a continuation of another caller's session, or of a session
    /// tokentap cannot read from the body (counted).
    pub(crate) fn refuse_session(&self, call: &SessionCall, path: &str, why: String) -> ProxyError {
        self.faults.add(Fault::SessionRefused);
        let error = ProxyError::SessionRefused {
            route: path.to_string(),
            engine: call.engine,
            why,
        };
        self.refusals.note("session_refused", path, &error);
        error
    }

    /// The 403 for a compressed body that cannot be checked for a field run as code (counted
    /// as one refused).
    pub(crate) fn refuse_unchecked(
        &self,
        (engine, field): (&'static str, CodeField),
        why: String,
    ) -> ProxyError {
        self.faults.add(Fault::CodeFieldRefused);
        let error = ProxyError::CompressedUnchecked {
            field: field.field,
            engine,
            opened_by: field.opened_by,
            why,
        };
        self.refusals
            .note("code_field_refused", "x-body-compressed", &error);
        error
    }

    /// The 403 for a body carrying a field run as code (counted).
    pub(crate) fn refuse_code_field(
        &self,
        (engine, field): (&'static str, CodeField),
    ) -> ProxyError {
        self.faults.add(Fault::CodeFieldRefused);
        let error = ProxyError::CodeField {
            field: field.field,
            engine,
            opened_by: field.opened_by,
        };
        self.refusals
            .note("code_field_refused", field.field, &error);
        error
    }
}
