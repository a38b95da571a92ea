//! One HTTP/2 connection to the app, on the sidecar's own HTTP/2 client
//! (h2wire/client, issue #39).
//!
//! The caller opens the stream itself and awaits the answer in its own
//! task (hyper's client put a dispatcher task and two channels between
//! them: 24% of a proxied h2c request's instructions); the connection's
//! task ([`ConnExec`]) runs the connection and the request bodies still
//! being sent when their answer came.
//!
//! What hyper's client did and this keeps: its builder's defaults (100
//! streams until the app's SETTINGS say otherwise, 16 KiB frames and
//! header lists, 1 MiB of send buffer per stream, no push),
//! connection-specific request headers stripped, `content-length` set
//! from an exact body size, `grpc-timeout` never indexed in HPACK, a
//! request body sent as the app's window allows (a chunk is queued
//! whenever less than a frame waits unsent), a failed request body
//! resetting the stream with `INTERNAL_ERROR`, and a connection closed
//! when nobody holds it any more (the last [`H2Sender`] clone closes it:
//! our GOAWAY, then the end once its streams are done). A stream the
//! caller gives up on (its client reset, its timeout) is reset with
//! `CANCEL` when the response future and the body are dropped
//! (h2wire/client/handles.rs).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderValue, Method, Request, Response, header};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use super::answer::H2Body;
use super::exec::ConnExec;
use super::{SentRequest, UpstreamBody, unbox};
use crate::h2wire::ErrorCode;
use crate::h2wire::client::{ClientSettings, Connection, Error, SendBody, SendRequest};

/// hyper's client defaults, kept (see the module's comment).
const MAX_SEND_STREAMS: u32 = 100;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;

static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// A handle on one app connection; clones share it. When the last one is
/// dropped the connection closes once its streams are done.
#[derive(Clone)]
pub(crate) struct H2Sender(Arc<Handle>);

struct Handle {
    send: SendRequest,
    exec: ConnExec,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.send.close();
    }
}

/// A request the connection did not take.
pub(crate) enum SendError {
    /// Refused before any of it was written (the connection closed or
    /// is going away): it may go on another connection. Boxed: the rare
    /// case, and it keeps every request's result small.
    Unsent { req: SentRequest, err: Error },
    /// The stream failed (reset, refused, connection lost): whether it may
    /// go again is retry.rs's question.
    Failed(Error),
}

impl H2Sender {
    /// Starts the connection on `io` (its task writes the preface at once)
    /// with the given (stream, connection) receive windows.
    pub(crate) fn handshake<T>(io: T, stream_window: u32, conn_window: u32) -> H2Sender
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let settings = ClientSettings {
            initial_max_send_streams: MAX_SEND_STREAMS,
            initial_window_size: stream_window,
            connection_window_size: conn_window,
            max_frame_size: MAX_FRAME_SIZE,
            max_header_list_size: MAX_HEADER_LIST_SIZE,
            max_send_buffer: MAX_SEND_BUFFER,
            ..ClientSettings::default()
        };
        let (mut conn, send) = Connection::new(io, settings);
        let exec = ConnExec::default();
        exec.run(Box::pin(async move {
            if let Err(err) = poll_fn(|cx| conn.poll(cx)).await {
                tracing::debug!(error = %err, "upstream HTTP/2 connection ended with an error");
            }
        }));
        H2Sender(Arc::new(Handle { send, exec }))
    }

    /// The connection ended or takes no new stream (the app's GOAWAY):
    /// new requests go elsewhere.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.send.is_closed()
    }

    /// Sends `req` (absolute URI) and waits for the response head. The
    /// request body goes out from this future while it waits, and from the
    /// connection's task if it is still going when the answer comes.
    ///
    /// The request comes boxed and stays so until it is written (it goes
    /// back whole, in its box, if it was not): this future is part of
    /// every waiting stream's, and by value the request would stay in it,
    /// dead, for the whole wait.
    pub(crate) async fn send(&self, req: SentRequest) -> Result<Response<H2Body>, SendError> {
        let mut send = self.0.send.clone();
        if let Err(err) = poll_fn(|cx| send.poll_ready(cx)).await {
            return Err(SendError::Unsent { req, err });
        }
        let (parts, body) = unbox(req).into_parts();
        let mut head = Request::from_parts(parts, ());
        // No connection-specific headers to strip: the one caller
        // (proxy/handler.rs, `upstream_request`) took every hop-by-hop
        // header out and left TE only as `trailers`; should one slip
        // through, the client drops it (§8.2.2) rather than sending a
        // malformed request.
        debug_assert!(!has_connection_headers(head.headers()));
        // A gRPC deadline differs on every call: indexed, each one would
        // enter the connection's HPACK table and evict another. Never
        // indexed, it costs a literal and leaves the table alone.
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
        let (mut response, stream) = match send.send_request(&head, eos) {
            Ok(opened) => opened,
            // Nothing was written (the app's GOAWAY came since poll_ready,
            // or the connection ended): the request goes elsewhere whole.
            Err(err) => {
                let (parts, ()) = head.into_parts();
                return Err(SendError::Unsent {
                    req: Box::new(Request::from_parts(parts, body)),
                    err,
                });
            }
        };
        // Written: its header map (the whole request head) is not kept
        // for the wait.
        drop(head);
        drop(send);
        let mut pipe = stream.map(|stream| Pipe { body, stream });
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
        Ok(Response::from_parts(parts, H2Body::new(recv)))
    }
}

/// Connection-specific fields (RFC 9113 §8.2.2), which the client drops.
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
    stream: SendBody,
}

impl Future for Pipe {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            // Room for another chunk (less than a frame waits unsent), or
            // the stream can no longer send: the app reset it (it wants no
            // more) or the connection ended. The client registers this
            // task either way, so a reset wakes it while it waits on the
            // client's body below.
            if let Err(err) = ready!(this.stream.poll_writable(cx)) {
                tracing::debug!(error = %err, "upstream HTTP/2 request body stopped");
                return Poll::Ready(());
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let eos = this.body.is_end_stream();
                        if data.is_empty() && !eos {
                            continue;
                        }
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
                    this.stream.send_reset(ErrorCode::INTERNAL_ERROR);
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
/// in the client or in the body fails the build instead of needing a box.
const _: fn() = || {
    fn unpin<T: Unpin>() {}
    unpin::<crate::h2wire::client::ResponseFuture>();
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
        let sender = H2Sender::handshake(ours, 65_535, 65_535);
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
