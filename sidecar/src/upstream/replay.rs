//! The request body as the app gets it, kept for a retry.
//!
//! A request the app never saw (its HTTP/2 stream refused, or above the
//! last stream id of the app's GOAWAY) may go again, whatever its method;
//! but by then the app connection has already taken some of the client's
//! body. So the body frames sent are kept, up to `retryBudget.maxBodyBytes`,
//! and a retry's body replays them before it reads on from the client. A
//! body larger than that is passed on without being kept, and its request
//! is not retried.
//!
//! One attempt reads at a time: starting the next attempt supersedes the
//! previous one, whose body (if the old app connection still polls it)
//! ends with an error instead of stealing the client's bytes.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::body::{BodyError, LimitedBody};

type FrameResult = Option<Result<Frame<Bytes>, BodyError>>;

/// What goes to the app: the client's body directly (no retry possible),
/// or one attempt's view of a kept body.
pub enum UpstreamBody {
    Direct(LimitedBody),
    Replay(ReplayBody),
}

impl UpstreamBody {
    /// The body of the first attempt. With `keep_bytes` above zero, the
    /// frames are kept (up to that many bytes) so that a retry can send
    /// them again; [`UpstreamBody::retry_handle`] gives the way back in.
    pub fn first(body: LimitedBody, keep_bytes: usize) -> UpstreamBody {
        if keep_bytes == 0 {
            return UpstreamBody::Direct(body);
        }
        let ended = body.is_end_stream();
        let size_hint = body.size_hint();
        let kept = Kept {
            client: (!ended).then_some(body),
            frames: Vec::new(),
            trailers: None,
            ended,
            bytes: 0,
            keep_bytes,
            given_up: false,
            attempt: 0,
        };
        UpstreamBody::Replay(ReplayBody {
            kept: Arc::new(Mutex::new(kept)),
            size_hint,
            attempt: 0,
            next_frame: 0,
            trailers_sent: false,
        })
    }

    /// The handle that makes the next attempt's body, if this body is kept.
    pub fn retry_handle(&self) -> Option<RetryBody> {
        match self {
            UpstreamBody::Direct(_) => None,
            UpstreamBody::Replay(body) => Some(RetryBody {
                kept: body.kept.clone(),
                size_hint: body.size_hint,
            }),
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FrameResult> {
        match self.get_mut() {
            UpstreamBody::Direct(body) => Pin::new(body).poll_frame(cx),
            UpstreamBody::Replay(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Direct(body) => body.is_end_stream(),
            UpstreamBody::Replay(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Direct(body) => body.size_hint(),
            UpstreamBody::Replay(body) => body.size_hint,
        }
    }
}

/// Makes the body of the next attempt of one request.
pub struct RetryBody {
    kept: Arc<Mutex<Kept>>,
    size_hint: SizeHint,
}

impl RetryBody {
    /// The next attempt's body, which supersedes every earlier one; `None`
    /// when the body cannot be sent again (it outgrew what is kept, or the
    /// client's body failed).
    pub fn next_attempt(&self) -> Option<UpstreamBody> {
        let mut kept = lock(&self.kept);
        if kept.given_up {
            return None;
        }
        kept.attempt += 1;
        Some(UpstreamBody::Replay(ReplayBody {
            kept: self.kept.clone(),
            size_hint: self.size_hint,
            attempt: kept.attempt,
            next_frame: 0,
            trailers_sent: false,
        }))
    }
}

/// The client's body and what of it was sent so far, shared by the
/// attempts of one request.
struct Kept {
    /// The client's body, until it ended.
    client: Option<LimitedBody>,
    /// The data frames read from the client, in order.
    frames: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    /// The client's body ended (no more frames than these).
    ended: bool,
    bytes: usize,
    keep_bytes: usize,
    /// Too large to keep, or failed: no retry.
    given_up: bool,
    /// The attempt allowed to read; earlier ones are superseded.
    attempt: u32,
}

/// One attempt's view of a kept body: the kept frames first, then the
/// client's, each read from the client kept on the way.
pub struct ReplayBody {
    kept: Arc<Mutex<Kept>>,
    size_hint: SizeHint,
    attempt: u32,
    /// Index of the next kept frame this attempt sends.
    next_frame: usize,
    trailers_sent: bool,
}

impl ReplayBody {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<FrameResult> {
        let shared = self.kept.clone();
        let mut kept = lock(&shared);
        if kept.attempt != self.attempt {
            return Poll::Ready(Some(Err(BodyError::superseded())));
        }
        if let Some(data) = kept.frames.get(self.next_frame) {
            self.next_frame += 1;
            return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
        }
        // A client body that says it ended is not polled again (an HTTP/2
        // request body may never answer a poll past its END_STREAM).
        if kept.client.as_ref().is_some_and(Body::is_end_stream) {
            kept.ended = true;
            kept.client = None;
        }
        if kept.ended {
            return Poll::Ready(self.trailers(&kept));
        }
        let Some(client) = kept.client.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(client).poll_frame(cx);
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                kept.ended = true;
                kept.client = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(err))) => {
                // The client's fault (recorded in its BodyWatch): never retried.
                kept.given_up = true;
                Poll::Ready(Some(Err(err)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => {
                        kept.keep(&data);
                        self.next_frame = kept.frames.len();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Err(frame) => frame,
                };
                if let Some(trailers) = frame.trailers_ref() {
                    kept.trailers = Some(trailers.clone());
                    self.trailers_sent = true;
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    /// After the kept data: the trailers once, then the end.
    fn trailers(&mut self, kept: &Kept) -> FrameResult {
        if self.trailers_sent {
            return None;
        }
        self.trailers_sent = true;
        kept.trailers.clone().map(|t| Ok(Frame::trailers(t)))
    }

    fn is_end_stream(&self) -> bool {
        let kept = lock(&self.kept);
        if self.next_frame < kept.frames.len() {
            return false;
        }
        if kept.ended {
            return self.trailers_sent || kept.trailers.is_none();
        }
        // Passed through: the client's body says (so the last DATA frame
        // carries END_STREAM, as without a kept body).
        kept.client.as_ref().is_some_and(Body::is_end_stream)
    }
}

impl Kept {
    fn keep(&mut self, data: &Bytes) {
        if self.given_up {
            return;
        }
        if self.bytes + data.len() > self.keep_bytes {
            // Too large to send again: stop keeping (and free what was).
            self.given_up = true;
            self.frames = Vec::new();
            return;
        }
        self.bytes += data.len();
        self.frames.push(data.clone());
    }
}

fn lock(kept: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(PoisonError::into_inner)
}
