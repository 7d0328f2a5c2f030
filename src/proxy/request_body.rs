//! The body sent to the upstream: the client's, fully read or streamed on. Its own file so that
//! the upstream clients (`inline_pool`) can name it without reaching the response side.

use std::pin::Pin;
use std::task::{Context, Poll};

use super::box_error::BoxError;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// A streamed client body of any type (one allocation per request that needs it).
pub type DynBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

/// The body sent upstream.
pub enum RequestBody {
    /// Fully read (metered routes read up to the parse limit): sent as one frame.
    Full(Option<Bytes>),
    /// Streamed from the client as it arrives, after `prefix` (what was read while looking
    /// for the end of a body that turned out to exceed the parse limit).
    Stream {
        prefix: Option<Bytes>,
        rest: DynBody,
    },
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestBody::Full(bytes) => f
                .debug_tuple("Full")
                .field(&bytes.as_ref().map(Bytes::len))
                .finish(),
            RequestBody::Stream { .. } => f.write_str("Stream"),
        }
    }
}

impl RequestBody {
    pub fn empty() -> Self {
        RequestBody::Full(None)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Full(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            RequestBody::Stream { prefix, rest } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                rest.as_mut().poll_frame(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Full(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            RequestBody::Stream { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            RequestBody::Stream { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
        }
    }
}
