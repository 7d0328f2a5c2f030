//! The prepare phase: a body read whole, inspected and made ready for the upstream. A field run
//! as code refuses it; a metered route's JSON gives the request's facts (a body that is not a
//! JSON object is forwarded as it came, unmetered); a request no path prefix routed goes to the
//! upstream that serves its model; its prompt is fingerprinted for the workload capture; usage
//! options are injected (`metering.inject_usage`); and the response is asked for uncompressed.
//! A close or a continuation of an engine session another caller opened is refused
//! (`proxy::sessions`).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue};
use tokio::time::Instant;

use super::admit::{Admitted, SessionCall, SessionKind};
use crate::base::Route;
use crate::proxy::body::RequestBody;
use crate::proxy::code_fields::{decompressed, decompressed_by_engine};
use crate::proxy::error::ProxyError;
use crate::proxy::service::{Proxy, Step};
use crate::proxy::sessions::{close_id, continued_id, Naming};
use crate::stream::request::{carries_field, injection, inspect, RequestFacts};
use crate::stream::rewrite::Injected;

/// What the prepare phase learnt of a metered request and did to it.
pub(crate) struct Prepared {
    pub(crate) route: Route,
    pub(crate) facts: RequestFacts,
    /// What was injected into the body, to be stripped from the response.
    pub(crate) injected: Injected,
    /// The prompt's salted prefix block ids (empty unless the workload capture is on).
    pub(crate) prefix_blocks: Vec<u64>,
    /// The request as a turn of its session (production requests, `[sessions]` on).
    pub(crate) turn: Option<crate::meter::conversation::Turn>,
}

impl Proxy {
    /// The prepare phase: the body to forward and what was learnt of it; or the body to
    /// forward as it came, unmetered; or the 403 for a field run as code.
    pub(crate) fn prepare(&self, admitted: &mut Admitted, bytes: Bytes) -> Step<(Bytes, Prepared)> {
        // A compressed body is forwarded as it came, unmetered: only the engine reads it
        // decompressed.
        let metered = admitted
            .route
            .filter(|_| !admitted.compressed)
            .and_then(|route| Some((route, inspect(route, &bytes)?)));
        // The upstream it goes to first (by its model, where no path prefix routed it), then
        // the check for a field run as code by that upstream's engine.
        if let Some(model) = metered
            .as_ref()
            .and_then(|(_, facts)| facts.model.as_deref())
        {
            if self.router.by_path(&admitted.path).is_none() {
                if let Some(by_model) = self.router.by_model(model) {
                    admitted.upstream = Arc::clone(by_model);
                }
            }
        }
        if admitted.code_field.is_some() {
            let found = self.code_field(Some(&admitted.upstream), &admitted.upstream_path);
            if let Some(found @ (_, field)) = found {
                let carries = if admitted.compressed {
                    match decompressed(&bytes, self.metering.max_parse_bytes) {
                        Ok(body) => carries_field(&body, field.field),
                        Err(why) => return Step::Answer(self.refuse_unchecked(found, why)),
                    }
                } else {
                    carries_field(&bytes, field.field)
                };
                if carries {
                    return Step::Answer(self.refuse_code_field(found));
                }
            }
        }
        if let Some(call) = admitted.session.as_mut().filter(|call| call.reads_body()) {
            let check = self.check_session(
                call,
                &admitted.upstream.name,
                &admitted.path,
                &admitted.parts.headers,
                &bytes,
            );
            if let Err(refused) = check {
                return Step::Answer(refused);
            }
        }
        let Some((route, facts)) = metered else {
            // Read only to be checked for a field run as code or a session, or not a JSON
            // object (the upstream will say what it thinks of it): forwarded as it came,
            // unmetered.
            return Step::Unmetered(RequestBody::Full(Some(bytes)));
        };

        // Once per request, on the body as the client sent it (injection moves spans).
        let prefix_blocks = match (&self.prefix_salt, facts.prompt, &admitted.synthetic) {
            (Some(salt), Some(prompt), None) => salt.fingerprint(prompt.bytes(&bytes)),
            _ => Vec::new(),
        };
        let turn = match (&self.turns, &admitted.synthetic, admitted.internal) {
            (Some(turns), None, false) => {
                turns.turn(&admitted.parts.headers, &bytes, &facts, Instant::now())
            }
            _ => None,
        };
        let mut bytes = bytes;
        let mut injected = Injected::default();
        if self.metering.inject_usage {
            let server_usage = admitted.upstream.server_usage();
            if let Some((edited, added)) = injection(route, &bytes, &facts, server_usage) {
                bytes = Bytes::from(edited);
                injected = added;
                if let Ok(length) = HeaderValue::try_from(bytes.len().to_string()) {
                    admitted
                        .parts
                        .headers
                        .insert(header::CONTENT_LENGTH, length);
                }
            }
        }

        // The response is read as it passes (events, or the JSON body's usage): ask for it
        // uncompressed. `identity` is always acceptable to the client; a compressed stream
        // could be neither metered nor stripped of what tokentap injected.
        admitted.parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let prepared = Prepared {
            route,
            facts,
            injected,
            prefix_blocks,
            turn,
        };
        Step::Next((bytes, prepared))
    }

    /// A close or a continuation of a session checked against who opened it: refused when
    /// another caller did, or when its body cannot be read for the session it names; a close
    /// of the caller's own session remembers which, to forget it once the engine closed it.
    fn check_session(
        &self,
        call: &mut SessionCall,
        upstream: &str,
        path: &str,
        headers: &HeaderMap,
        bytes: &[u8],
    ) -> Result<(), ProxyError> {
        // sglang decompresses a body sent so before any route reads it.
        let inflated;
        let body: &[u8] = if decompressed_by_engine(headers) {
            match decompressed(bytes, self.metering.max_parse_bytes) {
                Ok(body) => {
                    inflated = body;
                    &inflated
                }
                Err(why) => {
                    let why = format!(
                        "its body is sent `x-body-compressed: zstd` and cannot be read: {why}"
                    );
                    return Err(self.refuse_session(call, path, why));
                }
            }
        } else {
            bytes
        };
        let named = match call.kind {
            SessionKind::Open => return Ok(()),
            SessionKind::Close => close_id(body, call.sessions.close_id_field),
            // A generation body this reader cannot take whole is refused only where its bytes
            // could hide a session (the engine's parser, Python's, takes `NaN` too), as a field
            // run as code is.
            SessionKind::Continue => continued_id(body, &call.sessions).or_else(|why| {
                let hides = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
                if hides(call.sessions.params_field.as_bytes()) || hides(b"\\u") {
                    Err(why)
                } else {
                    Ok(None)
                }
            }),
        };
        let id = match named {
            Ok(Some(id)) => id,
            Ok(None) => return Ok(()),
            Err(why) => return Err(self.refuse_session(call, path, why.to_string())),
        };
        match self
            .sessions
            .naming(upstream, &id, call.caller, Instant::now())
        {
            Naming::Unseen => Ok(()),
            Naming::Own => {
                if call.kind == SessionKind::Close {
                    call.closing = Some(id);
                }
                Ok(())
            }
            Naming::Other => {
                let why = "the session it names was opened through tokentap by another caller"
                    .to_string();
                Err(self.refuse_session(call, path, why))
            }
        }
    }
}
