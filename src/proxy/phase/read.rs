//! The read phase: the client's body within the body limits. Every body is under the idle
//! timeout (`proxy.body_idle_timeout`); one the admit phase wants read (a metered route's, one
//! checked for a field run as code, or one that may name an engine session) is read whole first, up to `metering.max_parse_bytes`,
//! within the buffer budget (`BodyBudget`, `metering.max_buffered_bytes`) and in all within
//! `proxy.body_read_timeout`. A longer one is forwarded as it streams, unmetered, and guarded
//! for the field as it streams.

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::sync::SemaphorePermit;

use super::admit::{Admitted, SessionKind};
use crate::net::faults::Fault;
use crate::proxy::body::{DynBody, RequestBody};
use crate::proxy::box_error::BoxError;
use crate::proxy::code_fields::{FieldScanner, GuardedBody};
use crate::proxy::error::ProxyError;
use crate::proxy::service::{BodyBudget, Proxy, Step};
use crate::proxy::timeout::{is_stall, IdleError, IdleTimeout};

/// A body read as far as the parse limit and the buffer budget allow.
enum ReadBody<'a> {
    /// The whole body, and the share of the budget it holds: kept until the upstream has
    /// answered (it has read the body by then), so bodies forwarded to a hung upstream count
    /// as much as bodies being read.
    Complete(Bytes, Option<SemaphorePermit<'a>>),
    /// Longer than the limit, or than the budget allowed: what was read, and the rest still
    /// streaming.
    TooLong(Bytes, DynBody),
}

async fn read_limited(
    mut body: DynBody,
    limit: usize,
    budget: &BodyBudget,
) -> Result<ReadBody<'_>, BoxError> {
    let mut held = None;
    let mut buffer = BytesMut::new();
    let mut first: Option<Bytes> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // request trailers: nothing to meter
        };
        if first.is_none() && buffer.is_empty() {
            first = Some(data); // the common single-frame body: no copy
        } else {
            if let Some(first) = first.take() {
                buffer.extend_from_slice(&first);
            }
            buffer.extend_from_slice(&data);
        }
        let read = first.as_ref().map_or(buffer.len(), Bytes::len);
        if read > limit || !budget.cover(&mut held, read) {
            let prefix = first.unwrap_or_else(|| buffer.freeze());
            return Ok(ReadBody::TooLong(prefix, body));
        }
    }
    Ok(ReadBody::Complete(
        first.unwrap_or_else(|| buffer.freeze()),
        held,
    ))
}

impl Proxy {
    /// The read phase: the body read whole, with the share of the buffer budget it holds (to be
    /// held until the request is answered); or the body to forward as it streams, unmetered; or
    /// the answer to a body that failed, stalled, came too slowly or carries a field run as
    /// code.
    pub(crate) async fn read<'p, B>(
        &'p self,
        admitted: &Admitted,
        body: B,
    ) -> Step<(Bytes, Option<SemaphorePermit<'p>>)>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let body = self.client_body(body);
        let session = admitted.session.as_ref().filter(|call| call.reads_body());
        if admitted.route.is_none() && admitted.code_field.is_none() && session.is_none() {
            return Step::Unmetered(RequestBody::Stream {
                prefix: None,
                rest: body,
            });
        }
        let read = read_limited(body, self.metering.max_parse_bytes, &self.body_budget);
        let read = match tokio::time::timeout(self.limits.metered_total, read).await {
            Err(_elapsed) => {
                self.faults.add(Fault::BodyReadTimeout);
                let error = ProxyError::BodyTimeout {
                    after: self.limits.metered_total,
                    limit: "in all, proxy.body_read_timeout",
                };
                tracing::debug!(path = admitted.path, %error, "request body too slow");
                return Step::Answer(error);
            }
            Ok(read) => read,
        };
        match read {
            Ok(ReadBody::Complete(bytes, held)) => Step::Next((bytes, held)),
            Ok(ReadBody::TooLong(prefix, rest)) => {
                // A close names its session in a few bytes: one too long to read is no
                // client's. (A generation request too long to read is forwarded unchecked for a
                // session it continues: docs/operations.md, "Sessions".)
                if let Some(call) = session.filter(|call| call.kind == SessionKind::Close) {
                    let why = format!(
                        "its body is longer than metering.max_parse_bytes ({} bytes) or the buffer budget, so tokentap cannot tell which session it names",
                        self.metering.max_parse_bytes
                    );
                    return Step::Answer(self.refuse_session(call, &admitted.path, why));
                }
                // Too long to be read whole first: what was read is scanned now, the rest as it
                // streams (a field found there cuts the body off before its end).
                let rest = match admitted.code_field {
                    None => rest,
                    Some(found) if admitted.compressed => {
                        let why = format!(
                            "longer than metering.max_parse_bytes ({} bytes) or the buffer budget, so it cannot be read whole first",
                            self.metering.max_parse_bytes
                        );
                        return Step::Answer(self.refuse_unchecked(found, why));
                    }
                    Some(found @ (engine, field)) => {
                        let mut scanner = FieldScanner::new(&field);
                        if scanner.feed(&prefix) {
                            return Step::Answer(self.refuse_code_field(found));
                        }
                        Box::pin(GuardedBody::new(rest, scanner, engine))
                    }
                };
                tracing::debug!(
                    path = admitted.path,
                    limit = self.metering.max_parse_bytes,
                    "request body over the parse limit or the buffer budget: forwarded unmetered"
                );
                Step::Unmetered(RequestBody::Stream {
                    prefix: Some(prefix),
                    rest,
                })
            }
            Err(error) if is_stall(error.as_ref()) => Step::Answer(self.body_stalled()),
            Err(error) => Step::Answer(ProxyError::client_body(error)),
        }
    }

    /// The client's body under the idle timeout, boxed once for either use (read for metering
    /// or streamed upstream).
    fn client_body<B>(&self, body: B) -> DynBody
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Box::pin(
            IdleTimeout::new(body.map_err(Into::into), self.limits.idle)
                .counted(&self.faults, Fault::BodyIdleTimeout)
                .map_err(IdleError::into_box),
        )
    }

    /// The answer to a request body that went silent (counted where it stalled).
    pub(crate) fn body_stalled(&self) -> ProxyError {
        ProxyError::BodyTimeout {
            after: self.limits.idle,
            limit: "between frames, proxy.body_idle_timeout",
        }
    }
}
