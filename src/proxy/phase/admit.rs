//! The admit phase: where a request goes and whether it may. Its upstream (a `path_prefix`,
//! else the default) and its path there; the route policy (`proxy.routes`), and never a
//! tunnel; whether it is on a metered route; and which field run as code its body is checked
//! for (`proxy.code_fields`), with the 403 that refuses it.

use std::sync::Arc;

use http::request::Parts;
use http::{Method, Request};

use crate::base::engine::CodeField;
use crate::base::Route;
use crate::config::CodeFields;
use crate::net::faults::Fault;
use crate::proxy::error::ProxyError;
use crate::proxy::routes::{self, Internal, Refused};
use crate::proxy::service::{Proxy, Synthetic};
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
}

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
        let (upstream, upstream_path) = match self.router.by_path(&path) {
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
        let route = (parts.method == Method::POST)
            .then(|| Route::from_path(&upstream_path))
            .flatten();
        // A field its engine runs as code is looked for where that engine reads it: the body
        // of such a route is read even when it is not metered.
        let code_field = (!internal && parts.method == Method::POST)
            .then(|| self.code_field(&upstream, &upstream_path))
            .flatten();
        let admitted = Admitted {
            parts,
            upstream,
            upstream_path,
            path,
            synthetic,
            internal,
            route,
            code_field,
        };
        Ok((admitted, body))
    }

    /// The answer to a path the route policy does not forward (counted).
    fn route_refused(&self, refused: Refused) -> ProxyError {
        let error = match refused {
            Refused::Route { path, why } => {
                self.faults.add(Fault::RouteRefused);
                ProxyError::RouteRefused { path, why }
            }
            Refused::Unreadable { target, why } => {
                self.faults.add(Fault::PathUnreadable);
                ProxyError::BadPath { target, why }
            }
        };
        tracing::debug!(%error, "route refused");
        error
    }

    /// The field run as code that a request to `path` may carry, when its upstream's engine
    /// reads it there (any engine's, while the upstream has not said what it is), unless
    /// `proxy.code_fields = "forward"`.
    fn code_field(&self, upstream: &Upstream, path: &str) -> Option<(&'static str, CodeField)> {
        if self.code_fields == CodeFields::Forward {
            return None;
        }
        let path = routes::normalise(path).ok()?;
        let engine = upstream.engine().map(|engine| engine.spec().name);
        let found = crate::base::engine::code_fields(&path)
            .find(|(declared_by, _)| engine.is_none_or(|engine| engine == *declared_by));
        found
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
        tracing::debug!(%error, "a field run as code refused");
        error
    }
}
