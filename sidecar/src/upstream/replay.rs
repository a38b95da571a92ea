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
//! What is kept is copied into buffers of up to [`CHUNK`] bytes, never held
//! as the client's frames: a body sent in one-byte chunks would otherwise
//! keep one `Bytes` handle per byte (32 bytes each, plus the read buffers
//! they pin), about 2.4 MiB for a 64 KiB body. The buffers start small
//! ([`FIRST_CHUNK`]) and double: most bodies (a gRPC message, a form) are
//! far below a chunk, and a 16 KiB buffer taken and freed for each was
//! about 1,700 instructions a request (callgrind, `PROFILE_LOAD=grpc`).
//! A kept body holds at most about twice its payload, and
//! [`RetryBody::held_bytes`] says what it really holds. The copy is at most
//! `maxBodyBytes` per request.
//!
//! One attempt reads at a time: starting the next attempt supersedes the
//! previous one, whose body (if the old app connection still polls it)
//! ends with an error instead of stealing the client's bytes.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::body::{BodyError, LimitedBody};

type FrameResult = Option<Result<Frame<Bytes>, BodyError>>;

/// The size of the buffers a kept body is copied into: an HTTP/2 frame's
/// default size, so a replay sends whole frames.
const CHUNK: usize = 16 * 1024;

/// The first buffer's size unless the first frame is larger: small enough
/// for the allocator's per-thread cache.
const FIRST_CHUNK: usize = 256;

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
            frames_capacity: 0,
            tail: BytesMut::new(),
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
        kept.attempt = kept.attempt.saturating_add(1);
        // The new attempt replays everything kept, the partial chunk too.
        kept.flush();
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
    /// The data read from the client, in order, copied into chunks.
    frames: Vec<Bytes>,
    /// The capacity of the buffers behind `frames` (what they hold).
    frames_capacity: usize,
    /// The chunk being filled; moved to `frames` when full or replayed.
    tail: BytesMut,
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

impl RetryBody {
    /// The memory the kept body holds now: its buffers' capacity and the
    /// handles on them, not only the payload.
    pub fn held_bytes(&self) -> usize {
        lock(&self.kept).held_bytes()
    }
}

impl Kept {
    fn keep(&mut self, data: &Bytes) {
        if self.given_up {
            return;
        }
        if self.bytes.saturating_add(data.len()) > self.keep_bytes {
            // Too large to send again: stop keeping (and free what was).
            self.given_up = true;
            self.frames = Vec::new();
            self.frames_capacity = 0;
            self.tail = BytesMut::new();
            return;
        }
        self.bytes += data.len();
        let mut rest = &data[..];
        while !rest.is_empty() {
            if self.tail.capacity() == 0 {
                // As large as what is kept so far (so the buffers double),
                // or the data at hand, within a chunk and the limit.
                let size = rest
                    .len()
                    .max(self.frames_capacity)
                    .clamp(FIRST_CHUNK, CHUNK)
                    .min(self.keep_bytes);
                self.tail = BytesMut::with_capacity(size);
            }
            let room = self.tail.capacity() - self.tail.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.tail.extend_from_slice(now);
            rest = later;
            if self.tail.len() == self.tail.capacity() {
                self.flush();
            }
        }
    }

    /// Moves the chunk being filled to `frames`.
    fn flush(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let chunk = std::mem::take(&mut self.tail);
        self.frames_capacity += chunk.capacity();
        self.frames.push(chunk.freeze());
    }

    fn held_bytes(&self) -> usize {
        self.frames_capacity
            + self.tail.capacity()
            + self.frames.capacity() * std::mem::size_of::<Bytes>()
    }
}

fn lock(kept: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    use super::super::body::DownstreamBody;
    use super::*;

    const BODY: usize = 64 * 1024;

    /// What the server saw of one request body: frames from the client,
    /// bytes the kept body holds, and the body a retry replays.
    #[derive(Debug)]
    struct Seen {
        frames: usize,
        held: usize,
        replayed: Bytes,
    }

    async fn keep(req: hyper::Request<Incoming>) -> Seen {
        let (body, _watch) = LimitedBody::new(DownstreamBody::Http1(req.into_body()), None, None);
        let mut first = UpstreamBody::first(body, BODY);
        let retry = first.retry_handle().expect("kept");
        let mut frames = 0;
        while let Some(frame) = first.frame().await {
            frame.expect("frame");
            frames += 1;
        }
        let held = retry.held_bytes();
        let replayed = retry
            .next_attempt()
            .expect("retryable")
            .collect()
            .await
            .expect("replay")
            .to_bytes();
        Seen {
            frames,
            held,
            replayed,
        }
    }

    /// 64 KiB as 65536 one-byte chunks through hyper's HTTP/1 server: the
    /// kept body holds a small multiple of its payload. Holding each frame
    /// as it came, it held 65536 handles (2 MiB for the handles alone,
    /// 2.4 MiB with the buffers they pinned, as measured on the release
    /// sidecar) while counting 64 KiB.
    #[tokio::test]
    async fn a_body_in_one_byte_chunks_holds_about_its_size() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, mut rx) = mpsc::channel(1);
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let service = service_fn(move |req| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(keep(req).await).await;
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let mut request =
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..BODY {
            request.extend_from_slice(b"1\r\nx\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        client.write_all(&request).await.expect("write");
        let seen = rx.recv().await.expect("seen");
        let mut answer = [0u8; 64];
        let _ = client.read(&mut answer).await;
        server.abort();

        assert!(seen.frames > 1_000, "one-byte frames reached it: {seen:?}");
        assert_eq!(seen.replayed.len(), BODY);
        assert!(seen.replayed.iter().all(|b| *b == b'x'));
        // The payload, its chunks and the handles on them: 65,664 bytes.
        assert!(seen.held >= BODY, "{}", seen.held);
        assert!(seen.held <= 2 * BODY, "held {} for {BODY}", seen.held);
        eprintln!("64 KiB in {} frames holds {} bytes", seen.frames, seen.held);
    }

    #[test]
    fn a_body_past_the_limit_frees_what_it_kept() {
        let mut kept = Kept {
            client: None,
            frames: Vec::new(),
            frames_capacity: 0,
            tail: BytesMut::new(),
            trailers: None,
            ended: false,
            bytes: 0,
            keep_bytes: 10,
            given_up: false,
            attempt: 0,
        };
        kept.keep(&Bytes::from_static(b"12345"));
        assert_eq!(kept.held_bytes(), 10, "one chunk, capped at the limit");
        kept.keep(&Bytes::from_static(b"123456"));
        assert!(kept.given_up);
        assert_eq!(kept.held_bytes(), 0);
    }
}
