//! The one place where data-path failures become HTTP answers.
//!
//! tokentap answers for itself only when the upstream could not: 502 when it is unreachable
//! or broke before answering, 504 when it did not answer in time, 400 when the client's body
//! could not be read or its target cannot be read as the engine would, 408 when it did not
//! arrive in time, 405 for `CONNECT` (a tunnel, never proxied), 403 for a route or a field
//! `proxy.routes` / `proxy.code_fields` do not forward, or for another caller's engine session
//! (`proxy::sessions`). The JSON body names the upstream and the cause so an operator can act
//! on it; it never echoes request headers (API keys stay out of responses and logs).

use std::sync::Arc;
use std::time::Duration;

use http::{header, Response, StatusCode};

use super::body::ResponseBody;
use super::box_error::BoxError;
use super::routes::NotForwarded;
use crate::meter::record::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream `{upstream}` ({url}) failed: {cause}")]
    Upstream {
        upstream: Arc<str>,
        url: String,
        cause: String,
    },
    #[error("upstream `{upstream}` ({url}) sent no response head within {after:?}")]
    Timeout {
        upstream: Arc<str>,
        url: String,
        after: Duration,
    },
    #[error("upstream `{upstream}` ({url}) is busy: {cause}")]
    Busy {
        upstream: Arc<str>,
        url: String,
        cause: String,
    },
    #[error("cannot build the upstream request for `{upstream}`: {cause}")]
    BadUpstreamUri { upstream: Arc<str>, cause: String },
    #[error("{method} is not proxied: tokentap forwards requests, not tunnels")]
    Method { method: &'static str },
    #[error("cannot read the request body: {cause}")]
    ClientBody { cause: String },
    #[error("the request body was not received in time ({after:?} {limit})")]
    BodyTimeout {
        after: Duration,
        /// Which limit: the idle gap or the whole metered body.
        limit: &'static str,
    },
    #[error("`{path}` is {} and is not forwarded from the data port; an operator opens it with proxy.routes (for instance routes = [\"safe\", \"{path}\"]), or calls the engine directly", refused_because(*why))]
    RouteRefused {
        /// The path as the engine would route it.
        path: String,
        why: NotForwarded,
    },
    #[error("`{path}` is a route of tokentap's admin listener, and this is tokentap's data listener, which forwards to the engine: the admin listener is {}; send `{path}` there (`tokentap status --admin URL` takes that address)", admin.as_deref().unwrap_or("at admin.listen (default 127.0.0.1:9464)"))]
    AdminRoute {
        path: String,
        /// The admin listener as bound (`http://127.0.0.1:9464`), when known.
        admin: Option<String>,
    },
    #[error("cannot read the request target `{target}` as the engine would: {why}")]
    BadPath { target: String, why: &'static str },
    #[error("the request carries `{field}`, which {engine} runs as code (with {opened_by}); it is not forwarded from the data port unless proxy.code_fields = \"forward\"")]
    CodeField {
        field: &'static str,
        engine: &'static str,
        opened_by: &'static str,
    },
    #[error("the request body is sent `x-body-compressed: zstd`, which {engine} decompresses before reading it, and tokentap cannot check it for `{field}` (run as code with {opened_by}): {why}; it is not forwarded from the data port unless proxy.code_fields = \"forward\"")]
    CompressedUnchecked {
        field: &'static str,
        engine: &'static str,
        opened_by: &'static str,
        why: String,
    },
    #[error("{why}; {engine} lets any caller that names a session close or continue it, so tokentap forwards a close of a session (`{route}`) or a request continuing one only from the caller that opened it through tokentap (the same tenant, else the same credential)")]
    SessionRefused {
        route: String,
        engine: &'static str,
        why: String,
    },
}

/// The reason a path is not forwarded, as the 403 says it.
fn refused_because(why: NotForwarded) -> String {
    match why {
        NotForwarded::Control(engine) => format!("a control route of {engine}"),
        NotForwarded::Unknown => {
            "not a route of any engine tokentap knows (sglang, vLLM, llama.cpp, the OpenAI API)"
                .to_string()
        }
        NotForwarded::Unclassified(served) => {
            let table = served.map_or_else(String::new, |served| {
                format!(
                    " (the upstream is held to {}'s table for {}, {} frontend)",
                    served.engine, served.table.version, served.table.frontend.name
                )
            });
            format!(
                "a route the engine serves (its /openapi.json lists it) that no route table of tokentap classifies{table}, so it cannot tell whether it is a client's"
            )
        }
        NotForwarded::NotListed => "not in proxy.routes".to_string(),
        NotForwarded::Admin => "a route of tokentap's admin listener".to_string(),
    }
}

pub use crate::base::error::error_chain;

/// The `type` of the 403 answering an admin route on the data port (`tokentap status
/// --admin` pointed at the data port reads it).
pub const ADMIN_ROUTE_KIND: &str = "admin_route_on_data_port";

impl ProxyError {
    pub fn client_body(error: BoxError) -> Self {
        ProxyError::ClientBody {
            cause: error_chain(error.as_ref()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Upstream { .. } | ProxyError::BadUpstreamUri { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ClientBody { .. } => StatusCode::BAD_REQUEST,
            ProxyError::Method { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::RouteRefused { .. }
            | ProxyError::AdminRoute { .. }
            | ProxyError::CodeField { .. }
            | ProxyError::CompressedUnchecked { .. }
            | ProxyError::SessionRefused { .. } => StatusCode::FORBIDDEN,
            ProxyError::BadPath { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// How a metered request that failed this way is recorded.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::Timeout { .. } => Outcome::Timeout,
            ProxyError::ClientBody { .. }
            | ProxyError::BodyTimeout { .. }
            | ProxyError::Method { .. }
            | ProxyError::RouteRefused { .. }
            | ProxyError::AdminRoute { .. }
            | ProxyError::BadPath { .. }
            | ProxyError::CodeField { .. }
            | ProxyError::CompressedUnchecked { .. }
            | ProxyError::SessionRefused { .. } => Outcome::ClientAborted,
            _ => Outcome::UpstreamError,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ProxyError::Upstream { .. } => "upstream_unavailable",
            ProxyError::Timeout { .. } => "upstream_timeout",
            ProxyError::Busy { .. } => "upstream_connection_limit",
            ProxyError::BadUpstreamUri { .. } => "bad_upstream_uri",
            ProxyError::ClientBody { .. } => "bad_request_body",
            ProxyError::BodyTimeout { .. } => "request_body_timeout",
            ProxyError::Method { .. } => "method_not_allowed",
            ProxyError::RouteRefused { .. } => "route_refused",
            ProxyError::AdminRoute { .. } => ADMIN_ROUTE_KIND,
            ProxyError::BadPath { .. } => "bad_request_target",
            ProxyError::CodeField { .. } | ProxyError::CompressedUnchecked { .. } => {
                "code_field_refused"
            }
            ProxyError::SessionRefused { .. } => "session_refused",
        }
    }

    fn upstream(&self) -> Option<&str> {
        match self {
            ProxyError::Upstream { upstream, .. }
            | ProxyError::Timeout { upstream, .. }
            | ProxyError::Busy { upstream, .. }
            | ProxyError::BadUpstreamUri { upstream, .. } => Some(upstream),
            ProxyError::ClientBody { .. }
            | ProxyError::BodyTimeout { .. }
            | ProxyError::Method { .. }
            | ProxyError::RouteRefused { .. }
            | ProxyError::AdminRoute { .. }
            | ProxyError::BadPath { .. }
            | ProxyError::CodeField { .. }
            | ProxyError::CompressedUnchecked { .. }
            | ProxyError::SessionRefused { .. } => None,
        }
    }

    /// An OpenAI-style error object, so clients' error handling works unchanged.
    pub fn into_response(self) -> Response<ResponseBody> {
        let status = self.status();
        let mut body = serde_json::json!({
            "error": {
                "message": format!("tokentap: {self}"),
                "type": self.kind(),
                "upstream": self.upstream(),
                "code": status.as_u16(),
            }
        });
        if let (
            ProxyError::AdminRoute {
                admin: Some(admin), ..
            },
            Some(error),
        ) = (&self, body.get_mut("error").and_then(|e| e.as_object_mut()))
        {
            error.insert("admin".to_owned(), serde_json::Value::from(admin.as_str()));
        }
        let mut response = Response::new(ResponseBody::local(body.to_string()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        response
    }
}
