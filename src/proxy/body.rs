//! The two body types of the data path: what goes to the upstream (`request_body`, re-exported) and what goes to the
//! client (the upstream's answer, or one tokentap writes: whole, or streamed from a channel). Both are enums, not boxed trait objects, so the common cases cost no allocation.

use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

pub use super::request_body::{DynBody, RequestBody};
use super::timeout::{BrokenOff, IdleError, UpstreamBody};
use crate::net::streams::SendWatch;
use crate::stream::body::MeteredBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// The body sent to the client.
// Nearly every response is `Upstream`: boxing it to shrink the rare `Local` would cost an
// allocation per request.
#[allow(clippy::large_enum_variant)]
pub enum ResponseBody {
    /// The upstream's body under its idle timeout, measured on metered routes, telling the
    /// connection's send-stall timer whether it waits for the client (`net::streams`).
    Upstream(MeteredBody<UpstreamBody>, Option<Watched>),
    /// An answer tokentap wrote itself (errors, admin pages).
    Local(Option<Bytes>),
    /// An answer tokentap writes as it goes (the admin's streamed `/workload` export): chunks
    /// from a small bounded channel, so a client that reads slowly makes the producer wait; an
    /// `Err` breaks the response off. Watched like `Upstream`, so a client that stops reading
    /// is cut at the send-stall deadline (and the producer, its channel closed, stops).
    Channel(mpsc::Receiver<Result<Bytes, BrokenOff>>, Option<Watched>),
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResponseBody::Upstream(..) => f.write_str("Upstream"),
            ResponseBody::Local(b) => f
                .debug_tuple("Local")
                .field(&b.as_ref().map(Bytes::len))
                .finish(),
            ResponseBody::Channel(..) => f.write_str("Channel"),
        }
    }
}

impl ResponseBody {
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        ResponseBody::Local(Some(bytes.into()))
    }

    /// The upstream's body, handed to the connection now; `watch` (from the request's
    /// connection) learns when it waits for the client.
    pub fn upstream(body: MeteredBody<UpstreamBody>, watch: Option<Arc<SendWatch>>) -> Self {
        let watch = watch.filter(|_| !body.is_end_stream()).map(|watch| {
            watch.handed_over();
            Watched(watch)
        });
        ResponseBody::Upstream(body, watch)
    }

    /// A body fed by `chunks`; `watch` (from the request's connection) as for
    /// [`ResponseBody::upstream`].
    pub fn channel(
        chunks: mpsc::Receiver<Result<Bytes, BrokenOff>>,
        watch: Option<Arc<SendWatch>>,
    ) -> Self {
        let watch = watch.map(|watch| {
            watch.handed_over();
            Watched(watch)
        });
        ResponseBody::Channel(chunks, watch)
    }
}

/// A response body's send watch, told the body is finished when it is dropped.
#[derive(Debug)]
pub struct Watched(Arc<SendWatch>);

impl Drop for Watched {
    fn drop(&mut self) {
        self.0.finished();
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = IdleError<hyper::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream(body, watch) => {
                let Some(Watched(watch)) = watch else {
                    return Pin::new(body).poll_frame(cx);
                };
                watch.polling();
                let polled = Pin::new(&mut *body).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(_))) => watch.yielded(body.is_end_stream()),
                    Poll::Ready(_) => watch.finished(),
                    Poll::Pending => {}
                }
                polled
            }
            ResponseBody::Local(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            ResponseBody::Channel(chunks, watch) => {
                if let Some(Watched(watch)) = watch {
                    watch.polling();
                }
                let polled = chunks.poll_recv(cx);
                let finished = |watch: &Option<Watched>| {
                    if let Some(Watched(watch)) = watch {
                        watch.finished();
                    }
                };
                match polled {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Some(Ok(bytes))) => {
                        if let Some(Watched(watch)) = watch {
                            watch.yielded(false);
                        }
                        Poll::Ready(Some(Ok(Frame::data(bytes))))
                    }
                    Poll::Ready(Some(Err(broken))) => {
                        finished(watch);
                        Poll::Ready(Some(Err(IdleError::BrokenOff(broken))))
                    }
                    Poll::Ready(None) => {
                        finished(watch);
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream(body, _) => body.is_end_stream(),
            ResponseBody::Local(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            ResponseBody::Channel(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream(body, _) => body.size_hint(),
            ResponseBody::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ResponseBody::Channel(..) => SizeHint::new(),
        }
    }
}
