//! The bound on connections to one upstream: every connection the pooled client opens holds
//! one of `upstream.max_connections` slots for as long as it is open (in use, idle in the pool
//! or still connecting). A request that needs one more when all are taken waits up to the
//! upstream's `connect_timeout` for one to close, then fails with [`AtCapacity`] (answered 503,
//! `fault="upstream_connection_limit"`). So however many streams clients open and reset, the
//! descriptors tokentap holds towards an upstream stay at most this many.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::box_error::BoxError;
use crate::net::faults::{Fault, FaultCounters};

/// No connection slot to the upstream came free in time.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("all {limit} connections to the upstream are open (upstream.max_connections); none came free within {waited:?}")]
pub struct AtCapacity {
    pub limit: usize,
    pub waited: Duration,
}

/// Whether `error` or one of its sources is [`AtCapacity`].
pub fn at_capacity(error: &(dyn std::error::Error + 'static)) -> Option<AtCapacity> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(full) = error.downcast_ref::<AtCapacity>() {
            return Some(*full);
        }
        current = error.source();
    }
    None
}

/// One of `slots` (`limit` in all) for a new connection, waiting up to `wait` (zero: forever)
/// for one to come free; a wait that runs out is counted as
/// `fault="upstream_connection_limit"`. Both upstream clients (this connector and
/// `inline_pool`) open connections through it.
pub async fn acquire_slot(
    slots: &Arc<Semaphore>,
    limit: usize,
    wait: Duration,
    faults: &FaultCounters,
) -> Result<OwnedSemaphorePermit, AtCapacity> {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        return Ok(slot);
    }
    let waiting = Arc::clone(slots).acquire_owned();
    let acquired = if wait.is_zero() {
        Ok(waiting.await)
    } else {
        tokio::time::timeout(wait, waiting).await
    };
    match acquired {
        Ok(Ok(slot)) => Ok(slot),
        _ => {
            faults.add(Fault::UpstreamConnectionLimit);
            Err(AtCapacity {
                limit,
                waited: wait,
            })
        }
    }
}

/// `inner`, each connection it opens holding a slot.
#[derive(Debug, Clone)]
pub struct Limited<C> {
    inner: C,
    slots: Arc<Semaphore>,
    limit: usize,
    wait: Duration,
    faults: Arc<FaultCounters>,
}

impl<C> Limited<C> {
    /// At most `limit` connections; a new one waits up to `wait` (zero: forever) for a slot.
    pub fn new(inner: C, limit: usize, wait: Duration, faults: Arc<FaultCounters>) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            wait,
            faults,
        }
    }
}

impl<C> tower::Service<Uri> for Limited<C>
where
    C: tower::Service<Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    type Response = Slotted<C::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let slots = Arc::clone(&self.slots);
        let (limit, wait) = (self.limit, self.wait);
        let faults = Arc::clone(&self.faults);
        // The clone is the one `poll_ready` was called on, as tower asks.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let slot = acquire_slot(&slots, limit, wait, &faults).await?;
            let io = inner.call(uri).await.map_err(Into::into)?;
            Ok(Slotted::new(io, slot))
        })
    }
}

/// A connection holding its slot until it closes.
#[derive(Debug)]
pub struct Slotted<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
}

impl<T> Slotted<T> {
    /// `io`, holding `slot` until it is dropped (`proxy::inline_pool` opens its own).
    pub fn new(io: T, slot: OwnedSemaphorePermit) -> Self {
        Self { io, _slot: slot }
    }
}

impl<T: Connection> Connection for Slotted<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl<T: Read + Unpin> Read for Slotted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Slotted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}
