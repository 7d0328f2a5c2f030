//! The simulator's response body: a whole buffer ([`Reply`]), or an SSE stream rendered as the
//! scheduler's events arrive. A stream's [`CancelGuard`] frees the request in the scheduler
//! the moment the body is dropped (client gone), so its batch slot and KV reservation are
//! released on the spot.
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::error_body::{Reply, EVENT_STREAM};
use super::output::Progress;
use super::render::Renderer;
use super::scheduler::{Command, Event};

/// The response body: a whole buffer, or an SSE stream rendered as events arrive.
#[derive(Debug)]
pub enum SimBody {
    Full(Option<Bytes>),
    Stream(Box<SseBody>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(stream) => stream.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(bytes) => bytes.is_none(),
            SimBody::Stream(stream) => stream.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

impl From<Reply> for Response<SimBody> {
    fn from(reply: Reply) -> Response<SimBody> {
        let mut response = Response::new(SimBody::Full(Some(Bytes::from(reply.body))));
        *response.status_mut() = reply.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(reply.content_type),
        );
        response
    }
}

/// Frees the request in the scheduler when dropped before the scheduler finished it.
#[derive(Debug)]
pub struct CancelGuard {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl CancelGuard {
    pub fn new(id: u64, commands: mpsc::UnboundedSender<Command>) -> CancelGuard {
        CancelGuard {
            id,
            commands,
            armed: true,
        }
    }

    /// The scheduler already let go of the request (finished, rejected, or gone).
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Tell the scheduler to drop the request now (a stop string matched, or the client left).
    pub fn fire(&mut self) {
        if self.armed {
            self.armed = false;
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }

    /// Apply what rendering an event said about the request's end.
    pub fn after(&mut self, progress: Progress) {
        match progress {
            Progress::Continue => {}
            Progress::Done => self.disarm(),
            Progress::DoneByStopString => self.fire(),
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.fire();
    }
}

/// An SSE stream: drains every event queued for the request into one frame per poll.
#[derive(Debug)]
pub struct SseBody {
    /// Bytes to send before any event (Responses' `response.created`).
    preamble: Option<String>,
    events: mpsc::UnboundedReceiver<Event>,
    renderer: Renderer,
    pending: Option<Event>,
    done: bool,
    guard: CancelGuard,
}

impl SseBody {
    /// A streaming response; `pending` is an event already taken from `events` (sglang holds
    /// its status line until the first token exists).
    pub fn response(
        events: mpsc::UnboundedReceiver<Event>,
        mut renderer: Renderer,
        pending: Option<Event>,
        guard: CancelGuard,
    ) -> Response<SimBody> {
        let preamble = Some(renderer.stream_preamble()).filter(|p| !p.is_empty());
        let body = SseBody {
            preamble,
            events,
            renderer,
            pending,
            done: false,
            guard,
        };
        let mut response = Response::new(SimBody::Stream(Box::new(body)));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(EVENT_STREAM),
        );
        response
    }

    fn render(&mut self, event: Event, out: &mut String) {
        let progress = self.renderer.on_event(event, out);
        if progress != Progress::Continue {
            self.done = true;
        }
        self.guard.after(progress);
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done && self.pending.is_none() {
            return Poll::Ready(None);
        }
        let mut out = self.preamble.take().unwrap_or_default();
        if let Some(event) = self.pending.take() {
            self.render(event, &mut out);
        }
        while !self.done {
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => self.render(event, &mut out),
                Poll::Ready(None) => {
                    // The scheduler is gone (server shutting down): end the stream.
                    self.done = true;
                    self.guard.disarm();
                }
                Poll::Pending => break,
            }
        }
        if out.is_empty() {
            if self.done {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        } else {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
        }
    }
}
