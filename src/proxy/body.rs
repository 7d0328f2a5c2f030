//! The two body types of the data path: what goes to the upstream (`request_body`, re-exported) and what goes to the
//! client (the upstream's answer — as it streams, or read whole first when its head carries the request's
//! `Server-Timing` — or one tokentap writes: whole, or streamed from a channel). Both are enums, not boxed trait
//! objects, so the common cases cost no allocation.

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

/// The error of every body the client is sent: the upstream's, under its idle timeout.
pub type BodyError = IdleError<crate::proxy::inline_pool::UpstreamBodyError>;

/// The body sent to the client: its source, handed to the connection in pieces.
#[derive(Debug)]
pub struct ResponseBody {
    source: Source,
    /// What is left of a frame larger than [`PIECE_BYTES`], handed next.
    rest: Option<Bytes>,
    /// The upstream's frame that came after a held copy (`upstream_after`), handed once
    /// `rest` is out: the copy goes out as it is, still counted in the held budget until
    /// written, instead of being copied again beside it.
    then: Option<Bytes>,
    /// Bytes handed since the body last answered `Pending`.
    unflushed: usize,
    /// The error that broke the source off, held for one `Pending` (see `poll_frame`).
    broken: Option<IdleError<crate::proxy::inline_pool::UpstreamBodyError>>,
}

/// The largest piece of a frame handed to the connection at once, and how much is handed
/// before the body answers `Pending` once (waking itself), so hyper writes out what it holds
/// before it takes more. With flattened writes (`net::ServerOptions::flatten_writes`) hyper
/// copies each piece into the connection's write buffer, which keeps whatever capacity it
/// grew to: a piece and its chunk framing fit the 8 KiB it starts with. A stream of small
/// events answers `Pending` between them anyway; only large bodies are cut and paced.
pub const PIECE_BYTES: usize = 8 * 1024 - 64;

/// Where the client's body comes from.
// Nearly every response is `Upstream`: boxing it to shrink the rare `Local` would cost an
// allocation per request.
#[allow(
    clippy::large_enum_variant,
    reason = "nearly every response is the large variant: boxing it would cost an allocation per request"
)]
enum Source {
    /// The upstream's body under its idle timeout, measured on metered routes, telling the
    /// connection's send-stall timer whether it waits for the client (`net::streams`).
    Upstream(MeteredBody<UpstreamBody>, Option<Watched>),
    /// An answer tokentap wrote itself (errors, admin pages).
    Local(Option<Bytes>),
    /// The end of an upstream answer that was read whole before its head was sent (its bytes
    /// are handed first, as `rest`): the upstream's trailers, or the error that broke it off.
    /// Watched like `Upstream`.
    Held(Option<Result<http::HeaderMap, BodyError>>, Option<Watched>),
    /// An answer tokentap writes as it goes (the admin's streamed `/workload` export): chunks
    /// from a small bounded channel, so a client that reads slowly makes the producer wait; an
    /// `Err` breaks the response off. Watched like `Upstream`, so a client that stops reading
    /// is cut at the send-stall deadline (and the producer, its channel closed, stops).
    Channel(mpsc::Receiver<Result<Bytes, BrokenOff>>, Option<Watched>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Upstream(..) => f.write_str("Upstream"),
            Source::Local(b) => f
                .debug_tuple("Local")
                .field(&b.as_ref().map(Bytes::len))
                .finish(),
            Source::Held(..) => f.write_str("Held"),
            Source::Channel(..) => f.write_str("Channel"),
        }
    }
}

impl ResponseBody {
    fn from_source(source: Source) -> Self {
        Self {
            source,
            rest: None,
            then: None,
            unflushed: 0,
            broken: None,
        }
    }

    pub fn local(bytes: impl Into<Bytes>) -> Self {
        Self::from_source(Source::Local(Some(bytes.into())))
    }

    /// The upstream's body, handed to the connection now; `watch` (from the request's
    /// connection) learns when it waits for the client.
    pub fn upstream(body: MeteredBody<UpstreamBody>, watch: Option<Arc<SendWatch>>) -> Self {
        let watch = watch.filter(|_| !body.is_end_stream()).map(|watch| {
            watch.handed_over();
            Watched(watch)
        });
        Self::from_source(Source::Upstream(body, watch))
    }

    /// An upstream answer read whole (`bytes`), then `end`: its trailers, or the error that
    /// broke it off. `watch` as for [`ResponseBody::upstream`].
    pub fn held(
        bytes: Bytes,
        end: Option<Result<http::HeaderMap, BodyError>>,
        watch: Option<Arc<SendWatch>>,
    ) -> Self {
        let watch = watch
            .filter(|_| !bytes.is_empty() || end.is_some())
            .map(|watch| {
                watch.handed_over();
                Watched(watch)
            });
        let mut body = Self::from_source(Source::Held(end, watch));
        body.rest = Some(bytes).filter(|b| !b.is_empty());
        body
    }

    /// The upstream's body of which `read` and then `then` were already read: those bytes
    /// first, then the rest as it streams. `watch` as for [`ResponseBody::upstream`].
    pub fn upstream_after(
        read: Bytes,
        then: Bytes,
        body: MeteredBody<UpstreamBody>,
        watch: Option<Arc<SendWatch>>,
    ) -> Self {
        let watch = watch
            .filter(|_| !read.is_empty() || !then.is_empty() || !body.is_end_stream())
            .map(|watch| {
                watch.handed_over();
                Watched(watch)
            });
        let mut response = Self::from_source(Source::Upstream(body, watch));
        response.rest = Some(read).filter(|b| !b.is_empty());
        response.then = Some(then).filter(|b| !b.is_empty());
        response
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
        Self::from_source(Source::Channel(chunks, watch))
    }

    /// The first [`PIECE_BYTES`] of `data`, keeping the rest for the next poll.
    fn piece(&mut self, mut data: Bytes) -> Bytes {
        if data.len() > PIECE_BYTES {
            self.rest = Some(data.split_off(PIECE_BYTES));
        }
        self.unflushed += data.len();
        data
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
    type Error = IdleError<crate::proxy::inline_pool::UpstreamBodyError>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(error) = this.broken.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if this.unflushed >= PIECE_BYTES {
            // Let the connection write out what it holds first (see `PIECE_BYTES`).
            this.unflushed = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let frame = match this.rest.take().or_else(|| this.then.take()) {
            Some(rest) => {
                this.source.polling();
                Frame::data(this.piece(rest))
            }
            None => match this.source.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => Frame::data(this.piece(data)),
                    Err(frame) => frame,
                },
                Poll::Pending => {
                    this.unflushed = 0;
                    return Poll::Pending;
                }
                // A truncation is forwarded as one: the head and what arrived, then the
                // break. hyper's HTTP/1 server drops what it holds unwritten when a body
                // fails, and a close read together with the last bytes fails the body in the
                // same poll that handed them: the error waits one `Pending` (the task woken at
                // once), in which the connection writes out the head and the data first.
                Poll::Ready(Some(Err(error))) => {
                    this.broken = Some(error);
                    this.unflushed = 0;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                done => return done,
            },
        };
        let last = this.is_end_stream();
        this.source.yielded(last);
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none()
            && self.then.is_none()
            && self.broken.is_none()
            && self.source.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = [&self.rest, &self.then]
            .into_iter()
            .flatten()
            .map(|bytes| bytes.len() as u64)
            .sum::<u64>();
        let source = self.source.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(source.lower().saturating_add(rest));
        if let Some(upper) = source.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

impl Source {
    fn watch(&self) -> Option<&SendWatch> {
        match self {
            Source::Upstream(_, watch) | Source::Channel(_, watch) | Source::Held(_, watch) => {
                watch.as_ref().map(|Watched(watch)| &**watch)
            }
            Source::Local(_) => None,
        }
    }

    /// The connection asks for the next frame: it is not waiting on the client.
    fn polling(&self) {
        if let Some(watch) = self.watch() {
            watch.polling();
        }
    }

    /// A frame was handed over; `last` when nothing follows it.
    fn yielded(&self, last: bool) {
        if let Some(watch) = self.watch() {
            watch.yielded(last);
        }
    }

    /// The end of the body, or the error that breaks it off.
    fn finished(&self) {
        if let Some(watch) = self.watch() {
            watch.finished();
        }
    }

    /// The source's next frame; the send watch told that the connection polls, and when the
    /// body ends (the caller tells it about frames, once it knows whether more follow).
    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, IdleError<crate::proxy::inline_pool::UpstreamBodyError>>>>
    {
        self.polling();
        let polled = match self {
            Source::Upstream(body, _) => Pin::new(body).poll_frame(cx),
            Source::Local(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Source::Held(end, _) => Poll::Ready(end.take().map(|end| end.map(Frame::trailers))),
            Source::Channel(chunks, _) => match chunks.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Poll::Ready(Some(Err(broken))) => {
                    Poll::Ready(Some(Err(IdleError::BrokenOff(broken))))
                }
                Poll::Ready(None) => Poll::Ready(None),
            },
        };
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.finished();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Source::Upstream(body, _) => body.is_end_stream(),
            Source::Local(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Source::Held(end, _) => end.is_none(),
            Source::Channel(..) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Upstream(body, _) => body.size_hint(),
            Source::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Source::Held(None, _) => SizeHint::with_exact(0),
            Source::Held(Some(_), _) | Source::Channel(..) => SizeHint::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    #[derive(Default)]
    struct CountedWakes(AtomicUsize);

    impl Wake for CountedWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What a connection sees polling `body` until it ends: each poll's data (`None` for a
    /// `Pending`), asserting that the body woke itself before each `Pending`.
    fn poll_all(body: &mut ResponseBody) -> Vec<Option<Bytes>> {
        let wakes = Arc::new(CountedWakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut seen = Vec::new();
        for _ in 0..1000 {
            match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => seen.push(Some(data)),
                    Err(_) => panic!("a trailers frame from a data-only body"),
                },
                Poll::Ready(Some(Err(_))) => panic!("an error from a body that has none"),
                Poll::Ready(None) => return seen,
                Poll::Pending => {
                    let before = seen.iter().filter(|s| s.is_none()).count();
                    assert_eq!(
                        wakes.0.load(Ordering::Relaxed),
                        before + 1,
                        "a paced Pending wakes the body at once"
                    );
                    seen.push(None);
                }
            }
        }
        panic!("the body did not end in 1000 polls")
    }

    #[test]
    fn a_large_frame_is_handed_in_pieces_with_a_write_out_between_them() {
        let page: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut body = ResponseBody::local(page.clone());
        assert_eq!(body.size_hint().exact(), Some(100_000));
        let seen = poll_all(&mut body);
        let pieces: Vec<&Bytes> = seen.iter().flatten().collect();
        assert!(pieces.iter().all(|piece| piece.len() <= PIECE_BYTES));
        assert_eq!(pieces.len(), 100_000usize.div_ceil(PIECE_BYTES));
        let whole: Vec<u8> = pieces
            .iter()
            .flat_map(|piece| piece.iter().copied())
            .collect();
        assert_eq!(whole, page, "the pieces are the frame, in order");
        // Piece, write-out, piece, write-out, … : every full piece is followed by a Pending.
        for pair in seen.windows(2) {
            if let [Some(piece), next] = pair {
                assert_eq!(next.is_none(), piece.len() == PIECE_BYTES, "{seen:?}");
            }
        }
    }

    #[test]
    fn the_body_ends_only_after_its_last_piece_and_its_hint_counts_what_is_held() {
        let mut body = ResponseBody::local(vec![7u8; PIECE_BYTES + 10]);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let Poll::Ready(Some(Ok(first))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("the first piece")
        };
        assert_eq!(first.into_data().map(|d| d.len()).ok(), Some(PIECE_BYTES));
        assert!(!body.is_end_stream(), "10 bytes are still held");
        assert_eq!(body.size_hint().exact(), Some(10));
        assert!(Pin::new(&mut body).poll_frame(&mut cx).is_pending());
        let Poll::Ready(Some(Ok(last))) = Pin::new(&mut body).poll_frame(&mut cx) else {
            panic!("the last piece")
        };
        assert_eq!(last.into_data().map(|d| d.len()).ok(), Some(10));
        assert!(body.is_end_stream());
    }

    #[test]
    fn small_frames_pass_whole_and_are_paced_only_once_they_add_up() {
        let (send, chunks) = mpsc::channel(8);
        for _ in 0..3 {
            assert!(send.try_send(Ok(Bytes::from(vec![1u8; 3000]))).is_ok());
        }
        drop(send);
        let mut body = ResponseBody::channel(chunks, None);
        let seen = poll_all(&mut body);
        let lengths: Vec<Option<usize>> = seen.iter().map(|s| s.as_ref().map(Bytes::len)).collect();
        // 3,000 + 3,000 stay under a piece; the third frame crosses it, and a write-out follows.
        assert_eq!(lengths, vec![Some(3000), Some(3000), Some(3000), None]);
    }
}
