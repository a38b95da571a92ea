//! One HTTP/2 stream: the request body from the client, the proxy's
//! answer back into h2 with flow control, and the bookkeeping the final
//! GOAWAY needs.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body::{Body, Frame};

use super::wire::Wire;
use crate::h2wire::ErrorCode;
use crate::h2wire::server::{RecvBody, Respond, SendBody};
use crate::proxy::{ConnCtx, ProxyBody};
use crate::upstream::Affinity;

/// Counts an accepted stream until its last frame is handed to h2 (or
/// its task ends without one).
pub(super) struct OpenStream(pub(super) Option<Arc<Wire>>);

impl OpenStream {
    /// Call before queueing the stream's last frame: the client may answer
    /// it with its next stream at once, and that one must not look like
    /// more concurrency than it has.
    fn finish(&mut self) {
        if let Some(wire) = self.0.take() {
            wire.open_streams.fetch_sub(1, Ordering::AcqRel);
            wire.waker.wake();
        }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.finish();
    }
}

static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Connection-specific headers are malformed in HTTP/2 (RFC 9113 §8.2.2);
/// the proxy strips hop-by-hop headers already, this is the last guard.
/// One walk over the names first (standard names compare as enum tags):
/// they are almost never there, and five hashed removals on every answer
/// cost about 550 instructions (callgrind, `PROFILE_LOAD=h2c`).
fn strip_connection_headers(headers: &mut HeaderMap) {
    let suspect = headers.keys().any(|name| {
        name == header::CONNECTION
            || name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::TE
            || name == KEEP_ALIVE
            || name == PROXY_CONNECTION
    });
    if !suspect {
        return;
    }
    headers.remove(header::CONNECTION);
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(header::TRANSFER_ENCODING);
    headers.remove(header::UPGRADE);
    if headers
        .get(header::TE)
        .is_some_and(|te| te.as_bytes() != b"trailers")
    {
        headers.remove(header::TE);
    }
}

/// One stream: the proxy's answer, then its body to the client with flow
/// control. Not an `async fn`: the request is turned into the proxy's
/// before the future is made, so the future keeps one copy of it (dead
/// once sent on, but laid out for the stream's whole life), not the
/// argument and its parts beside it.
pub(super) fn serve_stream(
    ctx: Arc<ConnCtx>,
    mut open: OpenStream,
    request: Request<RecvBody>,
    mut respond: Respond,
) -> impl Future<Output = ()> {
    let wire = open.0.clone();
    let (parts, body) = request.into_parts();
    // The answer to a HEAD has no body whatever the app sends (RFC 9110
    // 9.3.2): its head goes out as the stream's end. An app that sends DATA
    // anyway (hyper's HTTP/2 server does) would otherwise fail the stream
    // in the app client's content-length check and the client would get a
    // reset instead of its answer.
    let head_request = parts.method == http::Method::HEAD;
    let request = Box::new(Request::from_parts(
        parts,
        crate::upstream::DownstreamBody::Http2(body),
    ));
    async move {
        let Some(wire) = wire else {
            return;
        };
        // A client that resets the stream while the app works: the request
        // future is dropped, which cancels the upstream call. The shared app
        // connection's count holds until the answer is sent (upstream/h2.rs).
        let on_shared = wire.share();
        let affinity = Affinity::new(wire.upstream.clone(), on_shared.is_some());
        let shared = ctx.shared.clone();
        // Inline, not boxed: this future is already in a box of its own
        // (http2/conn.rs), and the request's future (several KiB) and the
        // answer's pump below are never alive together, so they share its
        // bytes. Boxed apart, a stream held both sizes (bench/README.md, "HTTP/2
        // memory").
        let response = tokio::select! {
            response = crate::upstream::with_affinity(
                affinity.clone(),
                crate::proxy::handle(ctx, request),
            ) => response,
            _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => return,
        };
        let (mut parts, mut body) = response.into_parts();
        strip_connection_headers(&mut parts.headers);
        // As hyper's server: a body of known length announces it.
        if !parts.headers.contains_key(header::CONTENT_LENGTH)
            && let Some(len) = body.size_hint().exact()
            && !matches!(
                parts.status,
                http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
            )
        {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        let head = Response::from_parts(parts, ());
        if body.is_end_stream() || head_request {
            // Counted done before the last frame is queued: the client may
            // answer it with its next stream at once, and that one must not
            // look like more concurrency than it has.
            open.finish();
            let _ = respond.send_response(head, true);
            return;
        }
        let Ok(mut send) = respond.send_response(head, false) else {
            return;
        };
        if pump(&mut open, &wire, &mut send, &mut body, &affinity).await == Pumped::WriteTimeout {
            shared.metrics.http2_stream_write_timeout();
        }
    }
}

/// How a response body's pump ended.
#[derive(PartialEq, Eq)]
enum Pumped {
    /// Sent to its end, failed, or the client reset the stream.
    Done,
    /// The client gave no send capacity for `limits.writeTimeout`: reset.
    WriteTimeout,
}

/// What waiting for send capacity came to.
enum Capacity {
    Some,
    /// The stream is gone (reset, closed).
    Gone,
    /// None came within the limit.
    TimedOut,
}

/// Waits until the client's windows took what the stream queued, at most
/// `limit` (zero: no limit).
async fn capacity(send: &mut SendBody, limit: Duration) -> Capacity {
    let wait = async {
        match std::future::poll_fn(|cx| send.poll_writable(cx)).await {
            Ok(()) => Capacity::Some,
            Err(_) => Capacity::Gone,
        }
    };
    if limit.is_zero() {
        return wait.await;
    }
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or(Capacity::TimedOut)
}

/// How long a stream may wait for its client's window before its
/// connection counts as withholding it (upstream/h2.rs): far above a
/// reading client's round trip, far below `limits.writeTimeout`.
const WITHHELD_AFTER: Duration = Duration::from_millis(100);

/// Waits for send capacity as [`capacity`] does; past [`WITHHELD_AFTER`]
/// the connection's next streams go on its own app connection, and the
/// stream counts as holding the shared one (if it is on it) while it waits.
async fn withheld(
    wire: &Wire,
    send: &mut SendBody,
    limit: Duration,
    affinity: &Affinity,
) -> Capacity {
    let first = if limit.is_zero() {
        WITHHELD_AFTER
    } else {
        limit.min(WITHHELD_AFTER)
    };
    match capacity(send, first).await {
        Capacity::TimedOut => {}
        other => return other,
    }
    let rest = if limit.is_zero() {
        Duration::ZERO
    } else {
        match limit.checked_sub(first) {
            Some(rest) if !rest.is_zero() => rest,
            // The write timeout itself has passed.
            _ => return Capacity::TimedOut,
        }
    };
    wire.window_withheld();
    let _stalled = affinity.stalled();
    capacity(send, rest).await
}

/// A chunk of an answer below this is small: the small chunks the body
/// has at hand together go out as one DATA frame (see [`gather`]).
const SMALL_CHUNK: usize = 1024;
/// The most one gathered chunk holds: one frame of 16 KiB.
const GATHER_MAX: usize = 16 * 1024;
/// The first buffer of a gathered chunk, when its parts need less: a
/// burst of gRPC messages fits.
const GATHER_FIRST: usize = 1024;

/// What came after the data [`gather`] returns.
enum After {
    /// Not looked at (a large chunk goes as it is).
    Unknown,
    /// Nothing yet: the body waits for the app.
    Pending,
    /// The body ended: the data is its last.
    Ended,
    /// A frame that did not join the data (trailers, a large chunk, an
    /// error): it goes next.
    Next(BodyFrame),
}
/// Joins the small chunks the body has at hand after `first` into one,
/// up to [`GATHER_MAX`] bytes: an app streaming small messages (gRPC, its
/// bursts of replies) then costs one DATA frame per burst to the client,
/// not one per message (h2's `send_data`, its queueing and its write of a
/// frame were most of what relaying a message cost), as HAProxy's and
/// nginx's buffers do. Only what is already there is joined, so no chunk
/// waits for another; the messages in a gRPC stream are framed by their
/// own length prefixes, never by HTTP/2's frames. Tells also whether the
/// body ended right after, so the last DATA frame carries END_STREAM
/// without asking h2 again.
fn gather(first: Bytes, body: &mut ProxyBody, cx: &mut Context<'_>) -> (Bytes, After) {
    let mut joined: Option<BytesMut> = None;
    let after = loop {
        let len = joined.as_ref().map_or(first.len(), BytesMut::len);
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => break After::Pending,
            Poll::Ready(None) => break After::Ended,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(more) if more.len() < SMALL_CHUNK && len + more.len() <= GATHER_MAX => {
                    let buf = joined.get_or_insert_with(|| {
                        let mut buf = BytesMut::with_capacity(GATHER_FIRST.max(len + more.len()));
                        buf.extend_from_slice(&first);
                        buf
                    });
                    buf.extend_from_slice(&more);
                }
                Ok(more) => break After::Next(Some(Ok(Frame::data(more)))),
                Err(frame) => break After::Next(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(err))) => break After::Next(Some(Err(err))),
        }
    };
    (joined.map_or(first, BytesMut::freeze), after)
}

/// What polling a response body gives.
type BodyFrame = Option<Result<Frame<Bytes>, crate::Error>>;

/// The body's next frame, or `None` once the client reset the stream.
/// The body first: a frame at hand goes out (and `send_data` fails on a
/// reset stream), so the reset is looked at (and the wake-up for it
/// registered) only while the body has nothing.
fn next_frame(
    body: &mut ProxyBody,
    send: &mut SendBody,
    cx: &mut Context<'_>,
) -> Poll<Option<BodyFrame>> {
    match Pin::new(body).poll_frame(cx) {
        Poll::Ready(frame) => Poll::Ready(Some(frame)),
        Poll::Pending => send.poll_reset(cx).map(|_| None),
    }
}

/// Sends the body; on the client's reset it stops (dropping the body
/// drops the app's response with it). A client that gives no window for
/// `limits.writeTimeout` gets RST_STREAM(CANCEL): its unread answer would
/// otherwise hold a share of the app connection's window and the stream
/// forever (the connection's own write timeout never fires while the
/// client answers PINGs).
async fn pump(
    open: &mut OpenStream,
    wire: &Wire,
    send: &mut SendBody,
    body: &mut ProxyBody,
    affinity: &Affinity,
) -> Pumped {
    let write_timeout = wire.write_timeout;
    // A frame [`gather`] took that goes next.
    let mut taken: Option<BodyFrame> = None;
    loop {
        let frame = match taken.take() {
            Some(frame) => frame,
            None => match std::future::poll_fn(|cx| next_frame(body, send, cx)).await {
                Some(frame) => frame,
                None => return Pumped::Done,
            },
        };
        match frame {
            None => {
                open.finish();
                let _ = send.send_data(Bytes::new(), true);
                return Pumped::Done;
            }
            Some(Err(err)) => {
                tracing::debug!(error = %err, "response body failed mid-stream; resetting the stream");
                open.finish();
                send.send_reset(ErrorCode::INTERNAL_ERROR);
                return Pumped::Done;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    // What was queued before must have gone to the client
                    // (less than a frame left): the stream holds at most
                    // that and one chunk for a client that stops reading.
                    let writable =
                        std::future::poll_fn(|cx| Poll::Ready(send.poll_writable(cx))).await;
                    match writable {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(_)) => return Pumped::Done,
                        Poll::Pending => {
                            match withheld(wire, send, write_timeout, affinity).await {
                                Capacity::Some => {}
                                Capacity::TimedOut => {
                                    tracing::debug!(
                                        ?write_timeout,
                                        "HTTP/2 client gave no window for limits.writeTimeout; resetting the stream"
                                    );
                                    open.finish();
                                    send.send_reset(ErrorCode::CANCEL);
                                    return Pumped::WriteTimeout;
                                }
                                Capacity::Gone => return Pumped::Done,
                            }
                        }
                    }
                    // Gathered after the wait, not before: nothing awaits
                    // between the body's end (which ends the request's
                    // accounting, proxy/body.rs) and its last frame being
                    // queued, and what came meanwhile joins.
                    // Not for a body whose declared length is all here:
                    // it has nothing more to join, and looking costs more
                    // than asking whether it ended.
                    let (data, after) =
                        if data.len() < SMALL_CHUNK && body.size_hint().exact() != Some(0) {
                            let mut first = Some(data);
                            std::future::poll_fn(|cx| {
                                Poll::Ready(gather(first.take().unwrap_or_default(), body, cx))
                            })
                            .await
                        } else {
                            (data, After::Unknown)
                        };
                    let last = match after {
                        After::Ended => true,
                        After::Unknown => body.is_end_stream(),
                        After::Pending => false,
                        After::Next(frame) => {
                            taken = Some(frame);
                            false
                        }
                    };
                    if last {
                        open.finish();
                    }
                    if send.send_data(data, last).is_err() || last {
                        return Pumped::Done;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        open.finish();
                        let _ = send.send_trailers(trailers);
                        return Pumped::Done;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<A, F: std::future::Future>(_f: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every stream's future is moved into its box once, when it is
    /// accepted (it runs inside its connection's task, http2/conn.rs), and
    /// that box is most of what an open stream costs beyond h2's own
    /// state. The request's future (several KiB) and the answer's pump are
    /// alive one after the other, so the stream's future is the request's
    /// and a few hundred bytes: boxed apart, an open stream held both
    /// (1,520 and 4,368 bytes in a release build, bench/h2heap; 5,008
    /// together).
    #[test]
    fn a_stream_costs_its_request_future_and_little_more() {
        let stream = future_size(|(c, o, r, s)| serve_stream(c, o, r, s));
        let request = future_size(|(c, r)| crate::proxy::handle(c, r));
        // Inline: one allocation a stream, not two.
        assert!(
            stream >= request,
            "the request's future ({request} bytes) is not inside the stream's ({stream})"
        );
        // And the pump and the stream's own state mostly in its shadow
        // (664 bytes over it in a debug build, as here, and in a release
        // build).
        assert!(
            stream <= request + 1024,
            "the stream's future is {stream} bytes, its request's {request}"
        );
        // The whole of it is most of an open stream's memory (issue #39
        // item 3: 7.1 KiB a stream against HAProxy's 7.5, bench/README.md).
        // 2,048 bytes with rustc 1.95, debug and release alike; it was
        // 4,896 while each level of the send held the request by value
        // (proxy/handler.rs, upstream/client.rs: not `async fn`s, the
        // request boxed). The bound leaves room for a compiler's layout.
        assert!(
            stream <= 2560,
            "the stream's future grew to {stream} bytes (2,048 with rustc 1.95): \
             a level of the send keeping the request by value again?"
        );
    }
}
