//! The request body as an `http_body::Body`, readable from any task.
//! Each chunk's flow-control window goes back as it is taken: a
//! WINDOW_UPDATE for the stream once half its window is taken, for the
//! connection once half of that is (state.rs), written by the
//! connection's task, which is woken for it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame as BodyFrame, SizeHint};

use super::super::ErrorCode;
use super::super::shared::RecvWindow;
use super::Error;
use super::state::{Sealed, SharedRef, lock};

type BodyResult = Result<BodyFrame<Bytes>, Error>;

pub(crate) struct RecvBody {
    pub(super) shared: SharedRef,
    pub(super) id: u32,
    /// Nothing more to read (END_STREAM came with the HEADERS, or the
    /// end was taken): no lock to take.
    pub(super) ended: bool,
}

impl RecvBody {
    pub fn stream_id(&self) -> u32 {
        self.id
    }
}

impl http_body::Body for RecvBody {
    type Error = Error;
    type Data = Bytes;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<BodyResult>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let id = this.id;
        let mut guard = lock(&this.shared);
        let sh = &mut *guard;
        let sealed = sh.sealed;
        let stream_window = sh.stream_window;
        let Some(s) = sh.streams.get_mut(&id) else {
            return Poll::Ready(Some(Err(Error::Closed {
                id,
                reason: "stream closed before its body ended",
            })));
        };
        if let Some((code, remote)) = s.reset {
            // A reset after END_STREAM with NO_ERROR is the §8.1 early
            // answer: the body itself was complete.
            if !(s.recv_end && s.recv.is_empty() && code == ErrorCode::NO_ERROR) {
                return Poll::Ready(Some(Err(Error::Stream {
                    id,
                    code,
                    reason: "stream reset before its body ended",
                    remote,
                })));
            }
        }
        let taken = RecvWindow {
            chunks: &mut s.recv,
            unreleased: &mut s.recv_unreleased,
            window: &mut s.recv_window,
            ended: s.recv_end,
            initial: stream_window,
        }
        .take(id, (sealed == Sealed::Open).then_some(&mut sh.out));
        if let Some((chunk, wrote)) = taken {
            let n = chunk.len() as u32;
            s.recv_taken += u64::from(n);
            if wrote {
                sh.wake_conn();
            }
            sh.release_conn(n);
            return Poll::Ready(Some(Ok(BodyFrame::data(chunk))));
        }
        if s.recv_end {
            this.ended = true;
            return Poll::Ready(s.recv_trailers.take().map(|t| Ok(BodyFrame::trailers(t))));
        }
        if let Sealed::Dead(code, reason) = sealed {
            return Poll::Ready(Some(Err(match code {
                Some(code) => Error::Connection {
                    code,
                    reason,
                    remote: false,
                },
                None => Error::Closed { id, reason },
            })));
        }
        s.body_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        if self.ended {
            return true;
        }
        let sh = lock(&self.shared);
        sh.streams
            .get(&self.id)
            .is_some_and(|s| s.recv_end && s.recv.is_empty() && s.recv_trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended {
            return SizeHint::with_exact(0);
        }
        let sh = lock(&self.shared);
        match sh.streams.get(&self.id) {
            Some(s) => match s.content_length {
                Some(len) if len >= s.recv_taken => SizeHint::with_exact(len - s.recv_taken),
                _ => SizeHint::default(),
            },
            None => SizeHint::default(),
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        let mut sh = lock(&self.shared);
        let Some(s) = sh.streams.get_mut(&self.id) else {
            return;
        };
        s.handles = s.handles.saturating_sub(1);
        s.body_dropped = true;
        s.body_waker = None;
        let early =
            !s.recv_end && s.reset.is_none() && s.send_state == super::state::SendState::Done;
        sh.release_body(self.id);
        if early {
            // §8.1: the answer is complete; the rest of the request is
            // not wanted.
            sh.reset_stream(self.id, ErrorCode::NO_ERROR, false);
        }
        sh.gc(self.id);
    }
}
