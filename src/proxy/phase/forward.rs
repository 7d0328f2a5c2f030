//! The forward phase: the request sent to its upstream (its head rebuilt for it: the upstream's
//! URI and HTTP version, hop-by-hop headers and the client's `Host` dropped) within the
//! upstream's response timeout, and the answer handed on — a metered request's through the
//! metering body. Upstream response bodies are under the upstream's idle timeout; a stall ends
//! them as `upstream_stalled`. An upstream that gives no answer is the fail phase's.
//!
//! A client may get its request's own timing back (`metering.server_timing`: on request, by a
//! header, or always): a stream as a trailer where the client takes trailers (HTTP/2, or
//! HTTP/1.1 with `TE: trailers`, announced by `Trailer: Server-Timing`), else as a final SSE
//! comment; a non-streamed answer as a `Server-Timing` header, for which its body is read whole
//! first (up to `metering.max_parse_bytes`; a longer one is forwarded as it is, without it).

use std::sync::Arc;

use bytes::BytesMut;
use http::{header, HeaderValue, Method, Request, Response, Version};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::admit::{Admitted, SessionCall, SessionKind};
use super::fail::fail;
use super::start::MeteredRequest;
use crate::net::faults::Fault;
use crate::net::streams::{SendWatch, StreamWatch};
use crate::proxy::body::{RequestBody, ResponseBody};
use crate::proxy::connector::at_capacity;
use crate::proxy::error::{error_chain, ProxyError};
use crate::proxy::headers::{announces_trailer, is_event_stream, remove_hop_by_hop};
use crate::proxy::server_info::redact_secrets;
use crate::proxy::service::Proxy;
use crate::proxy::sessions::{opened_id, Remembered, MAX_OPEN_ANSWER, MAX_SESSIONS};
use crate::proxy::timeout::{is_stall, IdleTimeout, UpstreamBody};
use crate::proxy::upstream::Upstream;
use crate::stream::body::{MeteredBody, Metering, MeteringOptions};
use crate::stream::rewrite::Injected;
use crate::stream::timing::{TimingDelivery, SERVER_TIMING};

impl Proxy {
    /// The forward phase: the request sent to its upstream, and the upstream's answer handed
    /// on, measured on the way when the request is metered; or tokentap's own answer when the
    /// upstream gave none.
    pub(crate) async fn forward(
        &self,
        admitted: Admitted,
        body: RequestBody,
        mut metered: Option<MeteredRequest>,
    ) -> Response<ResponseBody> {
        let Admitted {
            mut parts,
            upstream,
            upstream_path,
            redact,
            session,
            ..
        } = admitted;
        let path_and_query = match parts.uri.query() {
            Some(query) => format!("{upstream_path}?{query}"),
            None => upstream_path,
        };
        parts.uri = match upstream.uri(&path_and_query) {
            Ok(uri) => uri,
            Err(error) => {
                let error = ProxyError::BadUpstreamUri {
                    upstream: Arc::clone(&upstream.name),
                    cause: error.to_string(),
                };
                return fail(error, metered);
            }
        };
        parts.version = if upstream.config.http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        remove_hop_by_hop(&mut parts.headers);
        // The client addressed tokentap; the upstream gets its own authority.
        parts.headers.remove(header::HOST);
        // The connection's send-stall watch, for the response body (not for a HEAD answer:
        // hyper never polls that body).
        let watch = parts
            .extensions
            .remove::<StreamWatch>()
            .filter(|_| parts.method != Method::HEAD)
            .map(|StreamWatch(watch)| watch);
        parts.extensions = http::Extensions::new();
        let request = Request::from_parts(parts, body);

        if let Some(m) = metered.as_mut() {
            m.meter.upstream_sent(Instant::now());
        }
        let call = upstream.send(request);
        let timeout = upstream.config.response_timeout;
        let result = if timeout.is_zero() {
            Ok(call.await)
        } else {
            tokio::time::timeout(timeout, call).await
        };
        let response = match result {
            Ok(Ok(response)) => response,
            Ok(Err(error)) if is_stall(&*error) => {
                // The client's streamed body went silent while hyper was sending it.
                return fail(self.body_stalled(), metered);
            }
            Ok(Err(error)) if at_capacity(&*error).is_some() => {
                let error = ProxyError::Busy {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    cause: at_capacity(&*error)
                        .map(|full| full.to_string())
                        .unwrap_or_default(),
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream connection limit");
                return fail(error, metered);
            }
            Ok(Err(error)) => {
                let error = ProxyError::Upstream {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    cause: error_chain(&*error),
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream request failed");
                return fail(error, metered);
            }
            Err(_elapsed) => {
                self.faults.add(Fault::UpstreamTimeout);
                let error = ProxyError::Timeout {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    after: timeout,
                };
                tracing::warn!(upstream = %upstream.name, %error, "upstream timed out");
                return fail(error, metered);
            }
        };

        let (mut parts, incoming) = response.into_parts();
        let incoming = IdleTimeout::new(incoming, upstream.config.stream_idle_timeout)
            .counted(&self.faults, Fault::UpstreamStalled)
            .counting_breaks(Fault::UpstreamAborted);
        remove_hop_by_hop(&mut parts.headers);
        if redact {
            return self.redacted(parts, incoming, &upstream).await;
        }
        if let Some(call) = session.filter(|_| parts.status.is_success()) {
            match call.kind {
                SessionKind::Open => {
                    return self
                        .session_opened(parts, incoming, &upstream, call, watch)
                        .await;
                }
                SessionKind::Close => {
                    if let Some(id) = &call.closing {
                        self.sessions.closed(&upstream.name, id);
                    }
                }
                SessionKind::Continue => {}
            }
        }
        let (metering, delivery) = metered
            .map(|metered| self.meter_response(metered, &mut parts, &upstream))
            .unzip();
        let delivery = delivery.flatten();
        let body = MeteredBody::new(incoming, metering);
        if delivery == Some(TimingDelivery::Header) {
            return self.with_timing_header(parts, body, watch).await;
        }
        Response::from_parts(parts, ResponseBody::upstream(body, watch))
    }

    /// An engine's server-info answer with every credential in it masked: read whole (up to
    /// `metering.max_parse_bytes`, under the upstream's idle timeout), then forwarded as JSON.
    /// One that cannot be read as a JSON document, or is longer, is not forwarded at all (a
    /// 502 naming why): what it holds could not be checked.
    async fn redacted(
        &self,
        mut parts: http::response::Parts,
        incoming: UpstreamBody,
        upstream: &Upstream,
    ) -> Response<ResponseBody> {
        let limit = self.metering.max_parse_bytes;
        let read = http_body_util::Limited::new(incoming, limit)
            .collect()
            .await;
        let document = match read {
            Ok(collected) => serde_json::from_slice::<serde_json::Value>(&collected.to_bytes())
                .map_err(|error| format!("not a JSON document ({error})")),
            Err(error) => Err(format!(
                "not read whole within metering.max_parse_bytes ({limit} bytes): {}",
                error_chain(error.as_ref())
            )),
        };
        let mut document = match document {
            Ok(document) => document,
            Err(why) => {
                let error = ProxyError::Upstream {
                    upstream: Arc::clone(&upstream.name),
                    url: upstream.url(),
                    cause: format!(
                        "its server-info answer is forwarded only with its credentials masked, and this one was {why}"
                    ),
                };
                tracing::warn!(upstream = %upstream.name, %error, "server info not forwarded");
                return error.into_response();
            }
        };
        redact_secrets(&mut document);
        let body = document.to_string();
        parts.headers.remove(header::CONTENT_ENCODING);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(length) = HeaderValue::try_from(body.len().to_string()) {
            parts.headers.insert(header::CONTENT_LENGTH, length);
        }
        Response::from_parts(parts, ResponseBody::local(body))
    }

    /// An engine's answer to a session open, handed on as it came once read (at most
    /// [`MAX_OPEN_ANSWER`] bytes, under the upstream's idle timeout): the session it names is
    /// remembered with the caller that opened it. A longer answer, or one that names no session,
    /// is handed on unread past what was read.
    async fn session_opened(
        &self,
        parts: http::response::Parts,
        incoming: UpstreamBody,
        upstream: &Upstream,
        call: SessionCall,
        watch: Option<Arc<SendWatch>>,
    ) -> Response<ResponseBody> {
        let mut body = MeteredBody::new(incoming, None);
        let mut read = BytesMut::new();
        let end = loop {
            match body.frame().await {
                None => break None,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if read.len() + data.len() <= MAX_OPEN_ANSWER => {
                        read.extend_from_slice(&data);
                    }
                    Ok(data) => {
                        return Response::from_parts(
                            parts,
                            ResponseBody::upstream_after(read.freeze(), data, body, watch),
                        );
                    }
                    Err(frame) => break frame.into_trailers().ok().map(Ok),
                },
                Some(Err(error)) => break Some(Err(error)),
            }
        };
        let read = read.freeze();
        if let (None, Some(id), Some(caller)) = (&end, opened_id(&read), call.caller) {
            let remembered = self
                .sessions
                .opened(&upstream.name, &id, caller, Instant::now());
            if remembered == Remembered::Full {
                self.faults.add(Fault::SessionUntracked);
                tracing::debug!(
                    upstream = %upstream.name,
                    max = MAX_SESSIONS,
                    "a session was opened while the table of their owners was full: any caller may close it"
                );
            }
        }
        Response::from_parts(parts, ResponseBody::held(read, end, watch))
    }

    /// The metering of a metered request's response, and where its timing goes when its client
    /// asked for it; the head made to fit (the trailer announced, a length the rewriting would
    /// break removed).
    fn meter_response(
        &self,
        metered: MeteredRequest,
        parts: &mut http::response::Parts,
        upstream: &Upstream,
    ) -> (Box<Metering>, Option<TimingDelivery>) {
        let MeteredRequest {
            mut meter,
            route,
            injected,
            timing,
        } = metered;
        meter.response_head(Instant::now(), parts.status.as_u16());
        let event_stream = is_event_stream(&parts.headers);
        // Compressed although asked not to be: passed through untouched, counts
        // approximate, nothing stripped.
        let encoded = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        if encoded {
            tracing::debug!(upstream = %upstream.name, "a metered response is content-encoded: forwarded unread");
        }
        let delivery = timing.and_then(|ask| match (event_stream, ask.trailers) {
            (false, _) => Some(TimingDelivery::Header),
            (true, true) => Some(TimingDelivery::Trailer),
            // A comment cannot be appended to compressed bytes.
            (true, false) => (!encoded).then_some(TimingDelivery::Comment),
        });
        if delivery == Some(TimingDelivery::Trailer)
            && !announces_trailer(&parts.headers, SERVER_TIMING.as_str())
        {
            // hyper's HTTP/1 server sends only the trailer fields the head announces;
            // once, when the upstream announced its own already.
            parts
                .headers
                .append(header::TRAILER, HeaderValue::from_static("server-timing"));
        }
        let metering = Metering::new(
            meter,
            MeteringOptions {
                route,
                event_stream,
                injected: if event_stream {
                    injected
                } else {
                    Injected::default()
                },
                max_event_bytes: self.metering.max_event_bytes,
                max_body_bytes: self.metering.max_parse_bytes,
                encoded,
                timing: delivery,
                held_budget: Some(Arc::clone(&self.held_budget)),
                length: parts
                    .headers
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok()),
            },
        );
        if metering.rewrites() {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        (metering, delivery)
    }

    /// A non-streamed answer with the request's `Server-Timing` in its head: the body is read
    /// whole first (its record is published at its end), into the one copy metering keeps
    /// anyway, up to `metering.max_parse_bytes` and within the held-answer budget
    /// (`metering.max_held_bytes`). A longer one, or one the budget cannot hold, is forwarded as
    /// it is, without the header: what was held, then the rest as it comes. One that breaks off
    /// is forwarded up to the break, then broken, without it. The upstream's idle timeout
    /// bounds the wait.
    async fn with_timing_header(
        &self,
        mut parts: http::response::Parts,
        mut body: MeteredBody<UpstreamBody>,
        watch: Option<Arc<SendWatch>>,
    ) -> Response<ResponseBody> {
        let end = loop {
            match body.frame().await {
                None => break None,
                Some(Ok(frame)) => match frame.into_data() {
                    // Its bytes are in the held copy: this frame itself is dropped.
                    Ok(_) if body.holds_for_client() => {}
                    Ok(data) => {
                        tracing::debug!(
                            limit = self.metering.max_parse_bytes,
                            held = self.held_budget.held(),
                            "a non-streamed answer over the parse limit or the held-answer budget: forwarded without Server-Timing"
                        );
                        // What was held goes out as it is (its share of the budget kept
                        // until written), never copied again beside this frame.
                        let held = body.take_held();
                        return Response::from_parts(
                            parts,
                            ResponseBody::upstream_after(held, data, body, watch),
                        );
                    }
                    Err(frame) => break frame.into_trailers().ok().map(Ok),
                },
                Some(Err(error)) => break Some(Err(error)),
            }
        };
        if !matches!(end, Some(Err(_))) {
            if let Some(value) = body
                .take_server_timing()
                .and_then(|value| HeaderValue::try_from(value).ok())
            {
                // Beside the upstream's own entries, never in their place.
                parts.headers.append(SERVER_TIMING, value);
            }
        }
        Response::from_parts(parts, ResponseBody::held(body.take_held(), end, watch))
    }
}
