//! The handles of the client side: [`SendRequest`] opens streams,
//! [`ResponseFuture`] waits for the answer's head, [`SendBody`] sends the
//! request's data and trailers, [`RecvBody`] reads the answer's. Any task
//! may hold them; what they send goes into the connection's output under
//! the shared lock and the connection's task is woken to write it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::SizeHint;

use super::super::ErrorCode;
use super::super::frame::{self, Frame, MAX_WINDOW};
use super::super::hpack::FieldRef;
use super::super::shared::{field, register};
use super::Error;
use super::state::{Head, SendState, Shared, SharedRef, Stream, lock};
use crate::spare::{self, OutClass};

/// Request fields §8.2.2 forbids in HTTP/2: dropped rather than sent.
fn connection_specific(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "host"
    )
}

/// Whether new streams may open now; the error otherwise.
fn check_open(sh: &Shared) -> Result<(), Error> {
    if let Some(e) = sh.dead_error(0) {
        return Err(e);
    }
    if sh.goaway.is_some() {
        return Err(Error::Closed {
            id: 0,
            reason: "the app sent GOAWAY: no new streams on this connection",
        });
    }
    if sh.local_close {
        return Err(Error::Closed {
            id: 0,
            reason: "connection closing: no new streams",
        });
    }
    if sh.next_id > MAX_WINDOW {
        return Err(Error::Closed {
            id: 0,
            reason: "stream ids exhausted on this connection",
        });
    }
    Ok(())
}

/// The stream `id` if it may still send.
fn sendable(sh: &mut Shared, id: u32) -> Result<&mut Stream, Error> {
    if let Some(e) = sh.dead_error(id) {
        return Err(e);
    }
    let s = sh.streams.get_mut(&id).ok_or(Error::Closed {
        id,
        reason: "stream closed",
    })?;
    if let Some((code, remote, reason)) = s.reset {
        return Err(Error::Stream {
            id,
            code,
            reason,
            remote,
        });
    }
    if s.send_state != SendState::Open {
        return Err(Error::Closed {
            id,
            reason: "request body already ended",
        });
    }
    Ok(s)
}

/// A handle of stream `id` is gone: `end` marks the stream and names why
/// it must be reset (CANCEL), if it must; unread data gives its window
/// back and the stream's state goes once nothing holds it.
fn drop_handle(shared: &SharedRef, id: u32, end: impl FnOnce(&mut Stream) -> Option<&'static str>) {
    let mut sh = lock(shared);
    let Some(s) = sh.streams.get_mut(&id) else {
        return;
    };
    s.handles = s.handles.saturating_sub(1);
    if let Some(reason) = end(s) {
        sh.reset_stream(id, ErrorCode::CANCEL, false, reason);
    }
    sh.release_body(id);
    sh.gc(id);
}

/// Opens streams on one connection; cloneable.
#[derive(Clone)]
pub(crate) struct SendRequest {
    pub(super) shared: SharedRef,
}

impl SendRequest {
    /// Ready(Ok) once a stream may open under the app's
    /// MAX_CONCURRENT_STREAMS; Ready(Err) once the connection can open no
    /// more (ended, or the app's GOAWAY came).
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut sh = lock(&self.shared);
        check_open(&sh)?;
        if sh.open < sh.max_open {
            return Poll::Ready(Ok(()));
        }
        if !sh.slot_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            sh.slot_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Opens a stream: HEADERS (and CONTINUATIONs) queued, END_STREAM on
    /// them if `end_of_stream`, else a [`SendBody`] for the rest. The URI
    /// must carry scheme and authority (or a `host` field gives the
    /// authority); connection-specific fields are dropped (§8.2.2).
    pub fn send_request(
        &mut self,
        req: &http::Request<()>,
        end_of_stream: bool,
    ) -> Result<(ResponseFuture, Option<SendBody>), Error> {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        check_open(sh)?;
        if sh.open >= sh.max_open {
            return Err(Error::Closed {
                id: 0,
                reason: "no stream slot (poll_ready first)",
            });
        }
        let uri = req.uri();
        let scheme = uri.scheme_str().unwrap_or("http");
        let authority = match uri.authority() {
            Some(a) => a.as_str().as_bytes(),
            None => req
                .headers()
                .get(http::header::HOST)
                .map_or(&b""[..], |h| h.as_bytes()),
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let method = req.method().as_str();
        let id = sh.next_id;
        sh.block.clear();
        let pseudo = [
            FieldRef::new(b":method", method.as_bytes()),
            FieldRef::new(b":scheme", scheme.as_bytes()),
            FieldRef::new(b":authority", authority),
            FieldRef::new(b":path", path.as_bytes()),
        ];
        let fields = pseudo.into_iter().chain(
            req.headers()
                .iter()
                .filter(|(k, _)| !connection_specific(k))
                .filter(|(k, v)| *k != http::header::TE || v.as_bytes() == b"trailers")
                .map(|(k, v)| field(k, v)),
        );
        sh.encoder.encode(fields, &mut sh.block);
        if sh.out.capacity() == 0 {
            // Given back while the connection was idle (conn.rs): a spare
            // one rather than one grown from nothing frame by frame.
            sh.out = spare::take_out(OutClass::Http2);
        }
        frame::write_header_block(id, end_of_stream, &sh.block, sh.peer_max_frame, &mut sh.out);
        sh.next_id += 2;
        sh.open += 1;
        let mut s = Stream::new(
            sh.settings.initial_window_size,
            sh.win.peer_initial,
            end_of_stream,
        );
        s.handles = if end_of_stream { 1 } else { 2 };
        sh.streams.insert(id, s);
        sh.wake_conn();
        drop(guard);
        let body = (!end_of_stream).then(|| SendBody {
            shared: self.shared.clone(),
            id,
        });
        Ok((
            ResponseFuture {
                shared: self.shared.clone(),
                id,
            },
            body,
        ))
    }

    /// The connection takes no new stream: it ended, the app sent
    /// GOAWAY, or [`SendRequest::close`] was called.
    pub fn is_closed(&self) -> bool {
        check_open(&lock(&self.shared)).is_err()
    }

    /// Nobody will open streams here any more (the last holder is gone):
    /// a GOAWAY of ours goes out, and the connection ends once its open
    /// streams are done.
    pub fn close(&self) {
        let mut sh = lock(&self.shared);
        if sh.local_close || sh.dead.is_some() {
            return;
        }
        sh.local_close = true;
        // Our last-stream-id names the app's streams we processed: none
        // (push is off). The app goes on with ours that are open.
        Frame::GoAway {
            last_stream: 0,
            code: ErrorCode::NO_ERROR,
            debug: b"",
        }
        .write(&mut sh.out);
        sh.wake_slots();
        sh.wake_conn();
    }

    /// Queues a PING of ours (keep-alive); false while one is out or once
    /// the connection ended.
    pub fn send_ping(&self) -> bool {
        let mut sh = lock(&self.shared);
        if sh.ping_out || sh.dead.is_some() {
            return false;
        }
        Frame::Ping {
            ack: false,
            data: super::conn::USER_PING,
        }
        .write(&mut sh.out);
        sh.ping_out = true;
        sh.wake_conn();
        true
    }

    /// Ready(true) once the ACK of the last `send_ping` came, Ready(false)
    /// if the connection ended first.
    pub fn poll_pong(&self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut sh = lock(&self.shared);
        if sh.dead.is_some() {
            return Poll::Ready(false);
        }
        if !sh.ping_out {
            return Poll::Ready(true);
        }
        sh.pong_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The answer's head; then [`RecvBody`] its body.
pub(crate) struct ResponseFuture {
    shared: SharedRef,
    id: u32,
}

impl ResponseFuture {
    pub fn stream_id(&self) -> u32 {
        self.id
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<RecvBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let dead = sh.dead_error(id);
        let Some(s) = sh.streams.get_mut(&id) else {
            return Poll::Ready(Err(Error::Closed {
                id,
                reason: "stream closed before its answer",
            }));
        };
        if matches!(s.head, Head::Ready(_)) {
            let Head::Ready(head) = std::mem::replace(&mut s.head, Head::Taken) else {
                return Poll::Pending;
            };
            // The handle count carries over from this future to the body.
            let body = RecvBody {
                shared: self.shared.clone(),
                id,
                ended: false,
            };
            return Poll::Ready(Ok(head.map(|()| body)));
        }
        if let Some((code, remote, reason)) = s.reset {
            return Poll::Ready(Err(Error::Stream {
                id,
                code,
                reason,
                remote,
            }));
        }
        if let Some(e) = dead {
            return Poll::Ready(Err(e));
        }
        s.head_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        drop_handle(&self.shared, self.id, |s| {
            if matches!(s.head, Head::Taken) {
                // The body holds the count now.
                s.handles += 1;
                return None;
            }
            s.rx.dropped = true;
            // Nobody waits for the answer: the app may stop.
            (!s.closed()).then_some("response dropped")
        });
    }
}

/// Sends the request's data and trailers.
pub(crate) struct SendBody {
    shared: SharedRef,
    id: u32,
}

impl SendBody {
    /// Queues `data`, END_STREAM after it if `end_of_stream`. Fails once
    /// the stream holds `max_send_buffer` unsent bytes (wait on
    /// `poll_writable`).
    pub fn send_data(&mut self, data: Bytes, end_of_stream: bool) -> Result<(), Error> {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let max = sh.settings.max_send_buffer;
        let s = sendable(sh, self.id)?;
        if s.tx.queued + data.len() > max && !data.is_empty() && s.tx.queued > 0 {
            return Err(Error::Closed {
                id: self.id,
                reason: "send buffer full (poll_writable first)",
            });
        }
        s.tx.queued += data.len();
        if !data.is_empty() {
            s.tx.data.push_back(data);
        }
        if end_of_stream {
            s.send_state = SendState::Ending;
        }
        sh.schedule(self.id);
        sh.wake_conn();
        Ok(())
    }

    /// Ends the request with trailers (after the queued data).
    pub fn send_trailers(&mut self, trailers: HeaderMap) -> Result<(), Error> {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let s = sendable(sh, self.id)?;
        s.tx.trailers = Some(trailers);
        s.send_state = SendState::Ending;
        sh.schedule(self.id);
        sh.wake_conn();
        Ok(())
    }

    /// Ready(Ok) once less than one frame of data is unsent, Ready(Err)
    /// once the stream can no longer send (the app reset it, the
    /// connection ended). The waker stays registered when Ready(Ok): a
    /// sender waiting on its own source of data learns of a reset too.
    pub fn poll_writable(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let frame = sh.peer_max_frame as usize;
        let s = sendable(sh, self.id)?;
        register(&mut s.tx.writable, cx);
        if s.tx.queued >= frame {
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    /// Resets the stream with `code`.
    pub fn send_reset(&mut self, code: ErrorCode) {
        lock(&self.shared).reset_stream(self.id, code, false, "reset by us");
    }
}

impl Drop for SendBody {
    fn drop(&mut self) {
        drop_handle(&self.shared, self.id, |s| {
            // Dropped without an end: the app must not wait for one.
            (s.reset.is_none() && s.send_state == SendState::Open).then_some("request body dropped")
        });
    }
}

use super::state::BodyResult;

/// The answer's body; trailers come as its last frame.
pub(crate) struct RecvBody {
    shared: SharedRef,
    id: u32,
    ended: bool,
}

impl http_body::Body for RecvBody {
    type Error = Error;
    type Data = Bytes;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<BodyResult>> {
        let this = self.get_mut();
        lock(&this.shared).poll_body(this.id, &mut this.ended, cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            || lock(&self.shared)
                .streams
                .get(&self.id)
                .is_some_and(|s| s.rx.end && s.rx.data.is_empty() && s.rx.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        let sh = lock(&self.shared);
        match sh.streams.get(&self.id).and_then(|s| s.rx.content_length) {
            Some(len) if !self.ended => {
                let s = &sh.streams[&self.id];
                let read = s.rx.total - s.rx.data.iter().map(|b| b.len() as u64).sum::<u64>();
                SizeHint::with_exact(len.saturating_sub(read))
            }
            _ if self.ended => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for RecvBody {
    fn drop(&mut self) {
        drop_handle(&self.shared, self.id, |s| {
            s.rx.dropped = true;
            s.rx.waker = None;
            // Nobody reads the rest: the app may stop sending it.
            (!s.closed() && !s.rx.end).then_some("response body dropped")
        });
    }
}
