//! The answer side of a stream: [`Respond`] sends the response head,
//! [`SendBody`] its data and trailers. Both may live in any task; what
//! they send goes into the connection's output under the shared lock and
//! the connection's task is woken to write it.

use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;

use super::super::ErrorCode;
use super::super::frame;
use super::super::hpack::FieldRef;
use super::Error;
use super::state::{Sealed, SendState, Shared, SharedRef, Stream, field, lock};

/// Response fields §8.2.2 forbids in HTTP/2: dropped rather than sent.
fn connection_specific(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    )
}

/// Whether `id` may still send; the error a handle returns otherwise.
fn check_send(shared: &Shared, id: u32) -> Result<(), Error> {
    if let Sealed::Dead(code, reason) = shared.sealed {
        return Err(match code {
            Some(code) => Error::Connection {
                code,
                reason,
                remote: false,
            },
            None => Error::Closed { id, reason },
        });
    }
    if shared.sealed == Sealed::FinalGoaway {
        return Err(Error::Closed {
            id,
            reason: "the connection sent its final GOAWAY",
        });
    }
    match shared.streams.get(&id) {
        None => Err(Error::Closed {
            id,
            reason: "stream closed",
        }),
        Some(s) => match s.reset {
            Some((code, remote)) => Err(Error::Stream {
                id,
                code,
                reason: "stream reset",
                remote,
            }),
            None => Ok(()),
        },
    }
}

/// The stream `id`, if it may still send and is in `state`.
fn sendable<'a>(
    shared: &'a mut Shared,
    id: u32,
    state: SendState,
    wrong_state: &'static str,
) -> Result<&'a mut Stream, Error> {
    check_send(shared, id)?;
    let gone = Error::Closed {
        id,
        reason: "stream closed",
    };
    let s = shared.streams.get_mut(&id).ok_or(gone)?;
    if s.send_state != state {
        return Err(Error::Closed {
            id,
            reason: wrong_state,
        });
    }
    Ok(s)
}

fn poll_reset(shared: &SharedRef, id: u32, cx: &mut Context<'_>) -> Poll<ErrorCode> {
    let mut sh = lock(shared);
    if let Sealed::Dead(code, _) = sh.sealed {
        return Poll::Ready(code.unwrap_or(ErrorCode::CANCEL));
    }
    match sh.streams.get_mut(&id) {
        None => Poll::Ready(ErrorCode::STREAM_CLOSED),
        Some(s) => match s.reset {
            Some((code, _)) => Poll::Ready(code),
            None => {
                s.reset_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        },
    }
}

fn drop_handle(shared: &SharedRef, id: u32, cancel_unless: impl Fn(SendState) -> bool) {
    let mut sh = lock(shared);
    let Some(s) = sh.streams.get_mut(&id) else {
        return;
    };
    s.handles = s.handles.saturating_sub(1);
    if s.reset.is_none() && !cancel_unless(s.send_state) {
        // Dropped without an end: the client must not wait for one.
        sh.reset_stream(id, ErrorCode::CANCEL, false);
    }
    sh.gc(id);
}

/// Sends the response of one stream.
pub(crate) struct Respond {
    pub(super) shared: SharedRef,
    pub(super) id: u32,
}

impl Respond {
    pub fn stream_id(&self) -> u32 {
        self.id
    }

    /// Queues the HEADERS (with CONTINUATIONs as the client's frame size
    /// needs), END_STREAM on it if `end_of_stream`. Connection-specific
    /// fields in `head` are dropped (§8.2.2).
    pub fn send_response(
        &mut self,
        head: http::Response<()>,
        end_of_stream: bool,
    ) -> Result<SendBody, Error> {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let s = sendable(sh, self.id, SendState::Idle, "response already sent")?;
        s.send_state = if end_of_stream {
            SendState::Ending
        } else {
            SendState::Open
        };
        s.handles += 1;
        let status = head.status();
        let status = status.as_str().as_bytes();
        sh.block.clear();
        let fields = std::iter::once(FieldRef::new(b":status", status)).chain(
            head.headers()
                .iter()
                .filter(|(k, _)| !connection_specific(k))
                .map(|(k, v)| field(k, v)),
        );
        sh.encoder.encode(fields, &mut sh.block);
        frame::write_header_block(
            self.id,
            end_of_stream,
            &sh.block,
            sh.peer_max_frame,
            &mut sh.out,
        );
        if sh.block.capacity() > 4096 {
            sh.block = Vec::new();
        }
        if end_of_stream {
            sh.ends.queued += 1;
            sh.finish_send(self.id);
        }
        sh.wake_conn();
        Ok(SendBody {
            shared: self.shared.clone(),
            id: self.id,
        })
    }

    /// Ready with the code once the client reset the stream (or the
    /// connection ended: its code, else CANCEL; STREAM_CLOSED once the
    /// stream is gone).
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<ErrorCode> {
        poll_reset(&self.shared, self.id, cx)
    }

    pub fn send_reset(&mut self, code: ErrorCode) {
        lock(&self.shared).reset_stream(self.id, code, false);
    }
}

impl Drop for Respond {
    fn drop(&mut self) {
        // Without a response sent (state Idle) the stream is cancelled.
        drop_handle(&self.shared, self.id, |st| st != SendState::Idle);
    }
}

/// Sends a response's body and trailers.
pub(crate) struct SendBody {
    shared: SharedRef,
    id: u32,
}

impl SendBody {
    pub fn stream_id(&self) -> u32 {
        self.id
    }

    /// Queues `data` (written as the client's windows allow), then
    /// END_STREAM if `end_of_stream`. Fails if the stream is gone, ended,
    /// or already holds `max_send_buffer` unsent bytes.
    pub fn send_data(&mut self, data: Bytes, end_of_stream: bool) -> Result<(), Error> {
        let mut sh = lock(&self.shared);
        let max = sh.max_send_buffer;
        let s = sendable(&mut sh, self.id, SendState::Open, "body already ended")?;
        if s.tx.queued >= max {
            return Err(Error::Closed {
                id: self.id,
                reason: "send buffer full (wait for poll_writable)",
            });
        }
        if !data.is_empty() {
            s.tx.queued += data.len();
            s.tx.data.push_back(data);
        }
        if end_of_stream {
            s.send_state = SendState::Ending;
            sh.ends.queued += 1;
        }
        sh.schedule(self.id);
        sh.wake_conn();
        Ok(())
    }

    /// Ready(Ok) once fewer than one frame's worth of bytes wait unsent;
    /// Ready(Err) once the stream is reset or the connection gone.
    pub fn poll_writable(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut sh = lock(&self.shared);
        if let Err(e) = check_send(&sh, self.id) {
            return Poll::Ready(Err(e));
        }
        let limit = sh.peer_max_frame as usize;
        let Some(s) = sh.streams.get_mut(&self.id) else {
            return Poll::Ready(Err(Error::Closed {
                id: self.id,
                reason: "stream closed",
            }));
        };
        if s.tx.queued < limit {
            return Poll::Ready(Ok(()));
        }
        s.tx.writable = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Queues the trailers, which end the stream after the queued data.
    pub fn send_trailers(&mut self, trailers: HeaderMap) -> Result<(), Error> {
        let mut sh = lock(&self.shared);
        let s = sendable(&mut sh, self.id, SendState::Open, "trailers after the end")?;
        s.tx.trailers = Some(trailers);
        s.send_state = SendState::Ending;
        sh.ends.queued += 1;
        sh.schedule(self.id);
        sh.wake_conn();
        Ok(())
    }

    pub fn send_reset(&mut self, code: ErrorCode) {
        lock(&self.shared).reset_stream(self.id, code, false);
    }

    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<ErrorCode> {
        poll_reset(&self.shared, self.id, cx)
    }
}

impl Drop for SendBody {
    fn drop(&mut self) {
        drop_handle(&self.shared, self.id, |st| {
            matches!(st, SendState::Ending | SendState::Done)
        });
    }
}
