//! One HTTP/2 connection to the app, driven through the h2 crate directly.
//!
//! hyper's HTTP/2 client put a dispatcher between the caller and h2: every
//! request went through a channel to the dispatcher's task, which opened
//! the stream and handed the executor a future of its own to wait for the
//! response and pass it back through a oneshot (24% of a proxied h2c
//! request's instructions, inclusive; issue #39). Here the caller opens the
//! stream itself and awaits h2's response future in its own task; the
//! connection's task ([`ConnExec`]) runs only h2's connection and the
//! request bodies still being sent when their answer came.
//!
//! What hyper did and this keeps: its builder's defaults (100 streams until
//! the app's SETTINGS say otherwise, 16 KiB frames and header lists, 1 MiB
//! of send buffer per stream, no push), connection-specific request
//! headers stripped, `content-length` set from an exact body size, a
//! request body sent as the app's window allows (one byte reserved, then
//! the whole chunk, as its `PipeToSendStream`), a failed request body
//! resetting the stream with `INTERNAL_ERROR`, and a connection closed
//! when nobody holds it any more (h2 0.4 wakes its connection when the
//! last handle goes; hyper 1's channel for that predates it). A stream
//! the caller gives up on (its client reset, its timeout) is reset with
//! `CANCEL` when the response future and the body are dropped.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use h2::{Reason, SendStream};
use http::header::HeaderName;
use http::{HeaderValue, Method, Request, Response, header};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::UpstreamBody;
use super::exec::ConnExec;
use crate::http2::H2Body;

/// hyper's client defaults, kept (see the module's comment).
const MAX_SEND_STREAMS: usize = 100;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A handle on one app connection; clones share it. When the last one is
/// dropped the connection closes once its streams are done.
#[derive(Clone)]
pub(crate) struct H2Sender(Arc<Handle>);

struct Handle {
    send: SendRequest<Bytes>,
    exec: ConnExec,
    /// The connection ended, or refused a stream (GOAWAY, error); shared
    /// with the connection's future.
    closed: Arc<AtomicBool>,
}

/// A request the connection did not take.
pub(crate) enum SendError {
    /// Refused before any of it was written (the connection closed or
    /// is going away): it may go on another connection. Boxed: the rare
    /// case, and it keeps every request's result small.
    Unsent {
        req: Box<Request<UpstreamBody>>,
        err: h2::Error,
    },
    /// The stream failed (reset, refused, connection lost): whether it may
    /// go again is retry.rs's question.
    Failed(h2::Error),
}

impl H2Sender {
    /// Writes the preface on `io` and starts the connection's task with
    /// the given (stream, connection) receive windows.
    pub(crate) async fn handshake<T>(
        io: T,
        stream_window: u32,
        conn_window: u32,
    ) -> Result<H2Sender, h2::Error>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (send, conn) = h2::client::Builder::new()
            .initial_max_send_streams(MAX_SEND_STREAMS)
            .initial_window_size(stream_window)
            .initial_connection_window_size(conn_window)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await?;
        let closed = Arc::new(AtomicBool::new(false));
        let ended_flag = closed.clone();
        let exec = ConnExec::default();
        exec.run(Box::pin(async move {
            let ended = conn.await;
            ended_flag.store(true, Ordering::Release);
            if let Err(err) = ended {
                tracing::debug!(error = %err, "upstream HTTP/2 connection ended with an error");
            }
        }));
        Ok(H2Sender(Arc::new(Handle { send, exec, closed })))
    }

    /// The connection ended or refused a stream: new requests go elsewhere.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Sends `req` (absolute URI) and waits for the response head. The
    /// request body goes out from this future while it waits, and from the
    /// connection's task if it is still going when the answer comes.
    pub(crate) async fn send(
        &self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<H2Body>, SendError> {
        // A handle of its own: h2 allows each handle one stream waiting
        // for the app's concurrency limit, and queues the rest inside.
        let mut send = self.0.send.clone();
        if let Err(err) = poll_fn(|cx| send.poll_ready(cx)).await {
            self.0.closed.store(true, Ordering::Release);
            return Err(SendError::Unsent {
                req: Box::new(req),
                err,
            });
        }
        let (parts, body) = req.into_parts();
        let mut head = Request::from_parts(parts, ());
        // No connection-specific headers to strip: the one caller
        // (proxy/handler.rs, `upstream_request`) took every hop-by-hop
        // header out and left TE only as `trailers`; a second walk over the
        // names cost about 800 instructions a request. Should one slip
        // through, h2 refuses the request (MalformedHeaders) rather than
        // sending a malformed one.
        debug_assert!(!has_connection_headers(head.headers()));
        // A gRPC deadline differs on every call: indexed, each one would
        // enter the connection's HPACK table and evict another, and h2's
        // encoder walks every kept value of a name before inserting (about
        // 70 grpc-timeout values once the table is full). Never indexed,
        // it costs a literal and leaves the table alone.
        if let Some(timeout) = head.headers_mut().get_mut(&GRPC_TIMEOUT) {
            timeout.set_sensitive(true);
        }
        if let Some(len) = body.size_hint().exact()
            && (len != 0 || has_payload_semantics(head.method()))
            && !head.headers().contains_key(header::CONTENT_LENGTH)
        {
            head.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        let eos = body.is_end_stream();
        let (mut response, stream) = send.send_request(head, eos).map_err(SendError::Failed)?;
        drop(send);
        let mut pipe = (!eos).then_some(Pipe {
            body,
            stream,
            first: true,
        });
        let answer = poll_fn(|cx| {
            if let Some(p) = pipe.as_mut()
                && Pin::new(p).poll(cx).is_ready()
            {
                pipe = None;
            }
            Pin::new(&mut response).poll(cx)
        })
        .await
        .map_err(SendError::Failed)?;
        // The answer came before the body ended (a streaming call): the
        // rest of the body goes from the connection's task.
        if let Some(pipe) = pipe {
            self.0.exec.run(Box::pin(pipe));
        }
        let (parts, recv) = answer.into_parts();
        let body = H2Body::answer(recv, &parts.headers);
        Ok(Response::from_parts(parts, body))
    }
}

/// What h2 refuses to send (RFC 9113 §8.2.2).
#[cfg(debug_assertions)]
fn has_connection_headers(headers: &http::HeaderMap) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ]
    .iter()
    .any(|name| headers.contains_key(name))
        || headers.get(header::TE).is_some_and(|te| te != "trailers")
}

#[cfg(not(debug_assertions))]
fn has_connection_headers(_: &http::HeaderMap) -> bool {
    false
}

/// As hyper: a method whose request body has a meaning gets a
/// `content-length` even when it is 0.
fn has_payload_semantics(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::CONNECT
    )
}

/// A request body on its way to the app, as the app's window allows.
struct Pipe {
    body: UpstreamBody,
    stream: SendStream<Bytes>,
    /// No chunk sent yet: the first goes without waiting for the window.
    first: bool,
}

impl Future for Pipe {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            // Some window first (one byte asks for it), then the next
            // chunk whole: h2 queues what the window does not cover. Not
            // for the first chunk: the stream is still waiting to open
            // then, so there is never a window yet, and waiting for one
            // cost a wake-up and a poll of the whole request (a gRPC
            // call's one message, callgrind `PROFILE_LOAD=grpc`). h2 holds
            // that one chunk (at most a frame of the client's) until the
            // window comes, and the next waits for the window as before.
            let wait = !this.first && {
                this.stream.reserve_capacity(1);
                this.stream.capacity() == 0
            };
            if wait {
                loop {
                    match ready!(this.stream.poll_capacity(cx)) {
                        Some(Ok(0)) => {}
                        Some(Ok(_)) => break,
                        Some(Err(err)) => {
                            tracing::debug!(error = %err, "upstream HTTP/2 request body stopped");
                            return Poll::Ready(());
                        }
                        None => return Poll::Ready(()),
                    }
                }
            } else if this.stream.poll_reset(cx).is_ready() {
                // The app reset the stream: it wants no more.
                return Poll::Ready(());
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let eos = this.body.is_end_stream();
                        if data.is_empty() && !eos {
                            continue;
                        }
                        this.first = false;
                        if this.stream.send_data(data, eos).is_err() || eos {
                            return Poll::Ready(());
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            let _ = this.stream.send_trailers(trailers);
                            return Poll::Ready(());
                        }
                    }
                },
                Some(Err(err)) => {
                    // The client's body failed (its fault is recorded in
                    // its BodyWatch): the app must not take it as whole.
                    tracing::debug!(error = %err, "request body failed; resetting the app's stream");
                    this.stream.send_reset(Reason::INTERNAL_ERROR);
                    return Poll::Ready(());
                }
                None => {
                    let _ = this.stream.send_data(Bytes::new(), true);
                    return Poll::Ready(());
                }
            }
        }
    }
}

/// Both are polled through `Pin::new`: checked `Unpin` here, so a change
/// in h2 or in the body fails the build instead of needing a box.
const _: fn() = || {
    fn unpin<T: Unpin>() {}
    unpin::<ResponseFuture>();
    unpin::<UpstreamBody>();
};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A retired slot's app connection closes once nobody holds it (and
    /// its streams are done), not when the app closes it: a handle kept
    /// anywhere (the connection's own task, a clone) fails this.
    #[tokio::test]
    async fn the_connection_closes_when_the_last_handle_goes() {
        let (ours, app) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut conn = h2::server::handshake(app).await.expect("server handshake");
            while let Some(stream) = conn.accept().await {
                drop(stream);
            }
        });
        let sender = H2Sender::handshake(ours, 65_535, 65_535)
            .await
            .expect("client handshake");
        let other = sender.clone();
        // Let the connections exchange their SETTINGS.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!sender.is_closed());
        drop(sender);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!other.is_closed(), "a clone still holds it");
        drop(other);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the app connection stayed open with nobody holding it")
            .expect("server task");
    }
}
