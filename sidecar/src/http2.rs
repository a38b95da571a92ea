//! Downstream HTTP/2, served on the h2 crate's server so the drain can
//! choose its frames per connection (docs/http2-drain.md).
//!
//! hyper's server has one way to end an HTTP/2 connection: GOAWAY(2^31-1),
//! PING, then GOAWAY(last stream) on the PING ack. Conforming clients
//! (hyper, Go, gRPC) need exactly that: the first GOAWAY stops them
//! opening streams before the server fixes its last stream id. Python's h2
//! (under httpx) moves its whole connection to CLOSED on the first GOAWAY
//! and then fails on the PING and on the responses of every stream still
//! in flight (python-hyper/h2#1181). For such a client the connection
//! instead stops dispatching new streams (they are held, unanswered),
//! lets the accepted ones finish, and then sends one GOAWAY naming the last
//! accepted stream as the very last frame before the close. The held
//! streams are above that id, so the app never saw them and the client
//! retries them elsewhere (httpcore 1.x does so on a new connection).
//!
//! Which client is which is read from its first SETTINGS frame (see
//! [`classify`]); `drain.http2GoAway` forces one behaviour for all.
//!
//! h2 cannot send a GOAWAY with a chosen last-stream-id, nor say when a
//! stream's last frame reached the socket, so [`FrameIo`] watches the
//! frames h2 writes: it notes each stream's final frame, rewrites the
//! last-stream-id of the final GOAWAY and drops anything h2 would write
//! after it.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use h2::server::{Connection, Handshake, SendResponse};
use h2::{Reason, RecvStream, SendStream};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::{Http2GoAway, LimitsConfig};
use crate::proxy::{ConnCtx, ProxyBody};

/// What hyper's server announces; kept so clients see the same limits.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUF: usize = 400 * 1024;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// The final GOAWAY must not race the client. Two races were measured
/// with httpcore 1.x, each losing a request now and then:
/// - a request loop between getting its response and writing its next
///   HEADERS fails the request (SEND_HEADERS in state CLOSED) if the
///   GOAWAY is read meanwhile. So the GOAWAY goes out only once no new
///   stream arrived and no stream end was written for this long: every
///   loop has then sent its next request, which is held.
/// - a task whose response was read by another task, but which waits for
///   the read lock behind a task blocked reading the socket, only runs
///   once more bytes arrive; if those are the GOAWAY it fails although
///   its response is there (httpcore checks for the GOAWAY before its
///   own events). So while waiting, PINGs (which the client answers and
///   otherwise ignores) keep its readers cycling, and the GOAWAY waits
///   for one PING round trip inside the quiet period.
const FINAL_QUIET: Duration = Duration::from_millis(250);
/// Between those PINGs.
const FINAL_PING_EVERY: Duration = Duration::from_millis(25);
/// A client that never goes quiet gets the final GOAWAY this long after
/// its accepted streams are done anyway.
const FINAL_QUIET_CAP: Duration = Duration::from_secs(2);
/// The client's ack of h2's shutdown PING is handed to h2 this much later
/// than it arrives: a client (the h2 crate's) can write that ack before the
/// HEADERS of a stream it opened just before it read the first GOAWAY, and
/// h2 fixes the final GOAWAY's last-stream-id on the ack, so that stream
/// would be refused. A PING ack has no ordering tie to other frames.
const SHUTDOWN_ACK_DELAY: Duration = Duration::from_millis(20);
/// h2's shutdown PING payload (h2 `frame::Ping::SHUTDOWN`).
const SHUTDOWN_PING: [u8; 8] = [0x0b, 0x7b, 0xa2, 0xf0, 0x8b, 0x9b, 0xfe, 0x54];
const FRAME_PING: u8 = 0x6;
const FLAG_ACK: u8 = 0x1;

/// After the close, read (and drop) what the client still sends for at
/// most this long, so unread bytes do not turn the close into a reset that
/// could destroy the GOAWAY in the client's receive buffer.
const LINGER: Duration = Duration::from_secs(1);

const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_END_STREAM: u8 = 0x1;
const PREFACE_LEN: usize = 24;
/// Longer SETTINGS are not python's h2 (it sends six entries).
const MAX_SNIFFED_SETTINGS: usize = 256;

/// The client kind, from its first SETTINGS frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientKind {
    /// Not known yet (the SETTINGS frame has not been read).
    Unknown = 0,
    /// Follows RFC 9113 §6.8 and gets the two-phase GOAWAY.
    Conforming = 1,
    /// Python's h2: fails on any frame after a GOAWAY.
    Strict = 2,
}

/// Python's h2 serialises its settings object in its own order, defaults
/// included: HEADER_TABLE_SIZE=4096, ENABLE_PUSH, INITIAL_WINDOW_SIZE=65535,
/// MAX_FRAME_SIZE=16384, then the rest. Other clients omit defaults (Go,
/// hyper/tonic, nghttp2) or send other values (browsers), and the h2 crate
/// orders by identifier, so the first four entries tell it apart.
/// Measured with httpcore 0.16.3/h2 4.1.0 and httpcore 1.0.9/h2 4.4.1.
pub(crate) fn classify(settings: &[u8]) -> ClientKind {
    let entries: Vec<(u16, u32)> = settings
        .chunks_exact(6)
        .map(|e| {
            (
                u16::from_be_bytes([e[0], e[1]]),
                u32::from_be_bytes([e[2], e[3], e[4], e[5]]),
            )
        })
        .collect();
    match entries.as_slice() {
        [(1, 4096), (2, _), (4, 65535), (5, 16384), ..] => ClientKind::Strict,
        _ => ClientKind::Conforming,
    }
}

/// State shared by the connection, its stream tasks and its [`FrameIo`].
#[derive(Default)]
struct Wire {
    kind: AtomicU8,
    /// Streams whose last frame was handed to h2 and not yet seen written.
    unwritten_ends: Mutex<HashSet<u32>>,
    /// Stream ends written so far (the quiet check watches it move).
    ends_written: AtomicU64,
    /// Accepted streams whose last frame has not been handed to h2 yet.
    open_streams: AtomicU32,
    /// The last-stream-id the final GOAWAY must carry, once set.
    final_id: AtomicU32,
    final_set: AtomicBool,
    /// Wakes the connection when a stream task ends.
    waker: AtomicWaker,
}

impl Wire {
    fn kind(&self) -> ClientKind {
        match self.kind.load(Ordering::Acquire) {
            1 => ClientKind::Conforming,
            2 => ClientKind::Strict,
            _ => ClientKind::Unknown,
        }
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.unwritten_ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Call before handing a stream's last frame to h2.
    fn expect_end(&self, id: u32) {
        self.ends().insert(id);
    }

    /// h2 refused the last frame (the stream is gone): nothing to wait for.
    fn forget_end(&self, id: u32) {
        self.ends().remove(&id);
    }

    fn end_written(&self, id: u32) {
        self.ends_written.fetch_add(1, Ordering::Relaxed);
        let mut ends = self.ends();
        if !ends.is_empty() {
            ends.remove(&id);
        }
    }

    fn all_ends_written(&self) -> bool {
        self.ends().is_empty()
    }
}

/// Where the writer is in the frame stream h2 produces.
#[derive(Clone, Copy, Default)]
struct FrameCursor {
    header: [u8; 9],
    header_len: u8,
    /// Payload bytes of the current frame still to come.
    remaining: u32,
    /// Payload bytes of the current frame already passed.
    offset: u32,
}

/// What one written byte range means.
#[derive(Default)]
struct Scan {
    /// Bytes up to and including the final GOAWAY (all of them if none).
    keep: usize,
    /// Where in the range the GOAWAY's last-stream-id bytes lie:
    /// (index in the range, index in the 4-byte id).
    patch: Vec<(usize, usize)>,
    /// The final GOAWAY ends inside the range.
    final_end: bool,
}

impl FrameCursor {
    fn kind(&self) -> u8 {
        self.header[3]
    }

    fn stream_id(&self) -> u32 {
        u32::from_be_bytes([
            self.header[5],
            self.header[6],
            self.header[7],
            self.header[8],
        ]) & 0x7fff_ffff
    }

    /// Walks `data`, calling `frame_end` at the end of each frame; with
    /// `patching`, records where a GOAWAY's id lies and stops after it.
    fn walk(&mut self, data: &[u8], patching: bool, mut frame_end: impl FnMut(&Self)) -> Scan {
        let mut scan = Scan::default();
        let mut i = 0;
        while i < data.len() {
            if usize::from(self.header_len) < self.header.len() {
                self.header[usize::from(self.header_len)] = data[i];
                self.header_len += 1;
                i += 1;
                if usize::from(self.header_len) == self.header.len() {
                    self.remaining =
                        u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]);
                    self.offset = 0;
                } else {
                    continue;
                }
            } else {
                let take = (self.remaining as usize).min(data.len() - i);
                if patching && self.kind() == FRAME_GOAWAY {
                    for k in 0..take {
                        let at = self.offset as usize + k;
                        if at < 4 {
                            scan.patch.push((i + k, at));
                        }
                    }
                }
                // `take` fits in u32: it is at most `remaining`.
                self.remaining -= take as u32;
                self.offset += take as u32;
                i += take;
            }
            if usize::from(self.header_len) == self.header.len() && self.remaining == 0 {
                frame_end(self);
                let goaway = self.kind() == FRAME_GOAWAY;
                self.header_len = 0;
                if patching && goaway {
                    scan.keep = i;
                    scan.final_end = true;
                    return scan;
                }
            }
        }
        scan.keep = data.len();
        scan
    }
}

/// The HTTP/2 socket as h2 sees it: notes the client's kind on the way in
/// and the server's frames on the way out (see the module docs).
struct FrameIo<T> {
    inner: T,
    wire: Arc<Wire>,
    /// The client's first bytes until its kind is known.
    sniff: Option<Vec<u8>>,
    out: FrameCursor,
    /// The final GOAWAY is out: h2's further writes go nowhere.
    sealed: bool,
    shut: bool,
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client's preface bytes still to skip before its frames.
    preface_left: usize,
    /// Where the reader is in the client's frames.
    inbound: FrameCursor,
    /// The shutdown PING's ack, held back (see [`SHUTDOWN_ACK_DELAY`]).
    held_ack: Option<([u8; 17], Pin<Box<tokio::time::Sleep>>)>,
}

impl<T> FrameIo<T> {
    fn new(inner: T, wire: Arc<Wire>) -> Self {
        FrameIo {
            inner,
            wire,
            sniff: Some(Vec::with_capacity(64)),
            out: FrameCursor::default(),
            sealed: false,
            shut: false,
            linger: None,
            preface_left: PREFACE_LEN,
            inbound: FrameCursor::default(),
            held_ack: None,
        }
    }

    fn sniffed(&mut self, data: &[u8]) {
        let Some(sniff) = self.sniff.as_mut() else {
            return;
        };
        let room = PREFACE_LEN + 9 + MAX_SNIFFED_SETTINGS - sniff.len();
        sniff.extend_from_slice(&data[..data.len().min(room)]);
        let kind = match sniff.get(PREFACE_LEN..PREFACE_LEN + 9) {
            None => return,
            Some(h) => {
                let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                if h[3] != FRAME_SETTINGS || len > MAX_SNIFFED_SETTINGS {
                    ClientKind::Conforming
                } else {
                    let start = PREFACE_LEN + 9;
                    match sniff.get(start..start + len) {
                        Some(settings) => classify(settings),
                        None => return,
                    }
                }
            }
        };
        self.wire.kind.store(kind as u8, Ordering::Release);
        self.sniff = None;
    }
}

impl<T> FrameIo<T> {
    /// Moves the cursor over bytes the socket took, noting stream ends.
    fn advance(&mut self, written: &[u8], patching: bool) -> Scan {
        let wire = &self.wire;
        self.out.walk(written, patching, |frame| {
            let ends = match frame.kind() {
                FRAME_DATA | FRAME_HEADERS => frame.header[4] & FLAG_END_STREAM != 0,
                FRAME_RST_STREAM => true,
                _ => false,
            };
            if ends {
                wire.end_written(frame.stream_id());
            }
        })
    }
}

impl<T> FrameIo<T> {
    /// Walks the bytes just read (`buf[from..]`), taking out an ack of the
    /// shutdown PING that lies whole in them; returns the new length.
    fn filter_inbound(&mut self, buf: &mut [u8], from: usize) -> usize {
        let mut end = buf.len();
        let mut i = from;
        let skip = self.preface_left.min(end - i);
        self.preface_left -= skip;
        i += skip;
        while i < end {
            let at_boundary = self.inbound.header_len == 0 && self.inbound.remaining == 0;
            if at_boundary
                && self.held_ack.is_none()
                && end - i >= 17
                && buf[i..i + 5] == [0, 0, 8, FRAME_PING, FLAG_ACK]
                && buf[i + 9..i + 17] == SHUTDOWN_PING
            {
                let mut ack = [0u8; 17];
                ack.copy_from_slice(&buf[i..i + 17]);
                buf.copy_within(i + 17..end, i);
                end -= 17;
                let release = Box::pin(tokio::time::sleep(SHUTDOWN_ACK_DELAY));
                self.held_ack = Some((ack, release));
                continue;
            }
            // Up to the end of the current header or payload, so every
            // frame start is looked at above. Never 0: a frame's end resets
            // the cursor within `walk`.
            let step = if usize::from(self.inbound.header_len) < 9 {
                9 - usize::from(self.inbound.header_len)
            } else {
                self.inbound.remaining as usize
            }
            .min(end - i);
            self.inbound.walk(&buf[i..i + step], false, |_| {});
            i += step;
        }
        end
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FrameIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A held ack goes to h2 once its delay is over, between frames.
        if let Some((ack, release)) = this.held_ack.as_mut()
            && this.inbound.header_len == 0
            && this.inbound.remaining == 0
            && buf.remaining() >= ack.len()
            && release.as_mut().poll(cx).is_ready()
        {
            buf.put_slice(&ack[..]);
            this.held_ack = None;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        let after = buf.filled().len();
        if after > before {
            if this.sniff.is_some() {
                let new = buf.filled()[before..].to_vec();
                this.sniffed(&new);
            }
            let kept = this.filter_inbound(buf.filled_mut(), before);
            buf.set_filled(kept);
            if kept == before {
                // All of it was the held ack: nothing for h2 yet, but the
                // read must not look like EOF.
                if let Some((_, release)) = this.held_ack.as_mut() {
                    let _ = release.as_mut().poll(cx);
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        res
    }
}

impl<T: AsyncWrite + AsyncRead + Unpin> AsyncWrite for FrameIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealed {
            // Nothing may follow the final GOAWAY.
            return Poll::Ready(Ok(buf.len()));
        }
        let patching = this.wire.final_set.load(Ordering::Acquire);
        // A dry run on a copy of the cursor: where the final GOAWAY's id
        // lies and where it ends; the real cursor only moves over what
        // the socket took.
        let mut dry = this.out;
        let plan = dry.walk(buf, patching, |_| {});
        let patched: Vec<u8>;
        let data = if plan.patch.is_empty() {
            &buf[..plan.keep]
        } else {
            // Once per connection: the final GOAWAY.
            let id = this.wire.final_id.load(Ordering::Acquire).to_be_bytes();
            let mut copy = buf[..plan.keep].to_vec();
            for &(at, k) in &plan.patch {
                if let Some(byte) = copy.get_mut(at) {
                    *byte = id[k];
                }
            }
            patched = copy;
            &patched[..]
        };
        let n = match Pin::new(&mut this.inner).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let done = this.advance(&buf[..n], patching);
        if done.final_end && n == plan.keep {
            this.sealed = true;
            // The rest of `buf` is dropped, as promised above.
            return Poll::Ready(Ok(buf.len()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealed || this.wire.final_set.load(Ordering::Acquire) {
            // The final GOAWAY may need rewriting (or is out): one slice
            // at a time, through the path that can.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return Pin::new(this).poll_write(cx, first);
        }
        let n = match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let mut left = n;
        for slice in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(slice.len());
            this.advance(&slice[..take], false);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            match Pin::new(&mut this.inner).poll_shutdown(cx) {
                Poll::Ready(Ok(())) => this.shut = true,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        // Lingering close: drain what the client still sends until it
        // closes too, or LINGER passes.
        let mut scratch = [0u8; 4096];
        loop {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        let linger = this
            .linger
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
        linger.as_mut().poll(cx).map(Ok)
    }
}

/// Why the connection is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The drain reached `Closing`.
    Drain,
    /// Idle past `limits.downstreamIdleTimeout`.
    Idle,
}

enum State<T> {
    Handshaking(Pin<Box<Handshake<FrameIo<T>, Bytes>>>),
    Serving(Box<Connection<FrameIo<T>, Bytes>>),
}

/// How far the connection's shutdown has got.
enum Shutdown {
    None,
    /// Asked for; waits for the handshake or the client's SETTINGS.
    Requested,
    /// The two-phase GOAWAY is under way (h2's graceful shutdown).
    TwoPhase,
    /// New streams held; waiting for the accepted ones to finish.
    Holding(Holding),
    /// The final GOAWAY is queued; the connection closes after it.
    Final,
}

struct Holding {
    /// Since when the accepted streams are all done and written.
    done_since: Option<tokio::time::Instant>,
    /// (held streams, stream ends written) when last looked at.
    seen: (usize, u64),
    quiet_since: tokio::time::Instant,
    /// The user PINGs (see [`FINAL_QUIET`]); None if h2 has none to give.
    pings: Option<h2::PingPong>,
    /// When the PING in flight went out.
    ping_sent: Option<tokio::time::Instant>,
    last_pong: Option<tokio::time::Instant>,
    tick: Pin<Box<tokio::time::Sleep>>,
}

/// One downstream HTTP/2 connection: a future that ends when the
/// connection does, and [`H2Conn::shutdown`] to start its end.
pub(crate) struct H2Conn<T> {
    state: State<T>,
    ctx: Arc<ConnCtx>,
    wire: Arc<Wire>,
    mode: Http2GoAway,
    shutdown: Shutdown,
    /// The highest stream id handed to the app.
    last_accepted: u32,
    /// Streams opened after the shutdown began: never dispatched, kept
    /// (unanswered) until the final GOAWAY, which names a lower id.
    held: Vec<(Request<RecvStream>, SendResponse<Bytes>)>,
}

impl<T> H2Conn<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    pub(crate) fn new(io: T, ctx: Arc<ConnCtx>, limits: &LimitsConfig, mode: Http2GoAway) -> Self {
        let wire = Arc::new(Wire::default());
        let mut builder = h2::server::Builder::new();
        builder
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONN_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_send_buffer_size(MAX_SEND_BUF)
            .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
            // Announced in SETTINGS; h2 answers REFUSED_STREAM past it (a
            // stream the app never saw, so the client may retry it).
            .max_concurrent_streams(limits.max_concurrent_streams);
        let handshake = builder.handshake(FrameIo::new(io, wire.clone()));
        H2Conn {
            state: State::Handshaking(Box::pin(handshake)),
            ctx,
            wire,
            mode,
            shutdown: Shutdown::None,
            last_accepted: 0,
            held: Vec::new(),
        }
    }

    /// Starts the end of the connection (idempotent): the two-phase
    /// GOAWAY or the held streams and final GOAWAY, per client kind.
    pub(crate) fn shutdown(&mut self, why: Ending) {
        if matches!(self.shutdown, Shutdown::None) {
            tracing::trace!(?why, "HTTP/2 connection shutdown requested");
            self.shutdown = Shutdown::Requested;
        }
    }

    /// Turns a requested shutdown into frames once the kind is known.
    fn start_shutdown(&mut self) {
        let State::Serving(conn) = &mut self.state else {
            return;
        };
        if !matches!(self.shutdown, Shutdown::Requested) {
            return;
        }
        let final_only = match (self.mode, self.wire.kind()) {
            (Http2GoAway::TwoPhase, _) => false,
            (Http2GoAway::FinalOnly, _) => true,
            (Http2GoAway::Auto, ClientKind::Strict) => true,
            (Http2GoAway::Auto, ClientKind::Conforming) => false,
            // The first frame of the client must be SETTINGS; until it is
            // read, neither sequence is known to be safe. The drain's
            // deadline bounds a client that never sends it.
            (Http2GoAway::Auto, ClientKind::Unknown) => return,
        };
        self.ctx.shared.metrics.http2_goaway(final_only);
        if final_only {
            let now = tokio::time::Instant::now();
            let pings = conn.ping_pong();
            self.shutdown = Shutdown::Holding(Holding {
                done_since: None,
                seen: self.activity(),
                quiet_since: now,
                pings,
                ping_sent: None,
                last_pong: None,
                tick: Box::pin(tokio::time::sleep(FINAL_QUIET)),
            });
        } else {
            conn.graceful_shutdown();
            self.shutdown = Shutdown::TwoPhase;
        }
    }

    fn activity(&self) -> (usize, u64) {
        (
            self.held.len(),
            self.wire.ends_written.load(Ordering::Relaxed),
        )
    }

    fn accept(&mut self, request: Request<RecvStream>, respond: SendResponse<Bytes>) {
        let id = respond.stream_id().as_u32();
        self.last_accepted = self.last_accepted.max(id);
        self.wire.open_streams.fetch_add(1, Ordering::AcqRel);
        let open = OpenStream(Some(self.wire.clone()));
        tokio::spawn(serve_stream(self.ctx.clone(), open, request, respond));
    }

    /// Holding: is it time for the final GOAWAY? Registers the wake-ups
    /// that will tell otherwise.
    fn poll_final_due(&mut self, cx: &mut Context<'_>) -> bool {
        self.wire.waker.register(cx.waker());
        let activity = self.activity();
        let Shutdown::Holding(hold) = &mut self.shutdown else {
            return false;
        };
        let now = tokio::time::Instant::now();
        if activity != hold.seen {
            hold.seen = activity;
            hold.quiet_since = now;
        }
        if hold.ping_sent.is_some()
            && let Some(pings) = hold.pings.as_mut()
        {
            match pings.poll_pong(cx) {
                Poll::Ready(Ok(_)) => {
                    hold.ping_sent = None;
                    hold.last_pong = Some(now);
                }
                // No more PINGs; the quiet period alone decides.
                Poll::Ready(Err(_)) => hold.pings = None,
                Poll::Pending => {}
            }
        }
        let streams_done =
            self.wire.open_streams.load(Ordering::Acquire) == 0 && self.wire.all_ends_written();
        let mut wake_at = (hold.quiet_since + FINAL_QUIET).max(now + Duration::from_millis(1));
        if !streams_done {
            hold.done_since = None;
        } else {
            let done_since = *hold.done_since.get_or_insert(now);
            let round_trip_in_quiet = match (&hold.pings, hold.last_pong) {
                (None, _) => true,
                (Some(_), Some(pong)) => pong >= hold.quiet_since && hold.ping_sent.is_none(),
                (Some(_), None) => false,
            };
            if (now - hold.quiet_since >= FINAL_QUIET && round_trip_in_quiet)
                || now - done_since >= FINAL_QUIET_CAP
            {
                return true;
            }
            wake_at = wake_at.min(done_since + FINAL_QUIET_CAP);
            if hold.ping_sent.is_none()
                && let Some(pings) = hold.pings.as_mut()
            {
                let due = hold.last_pong.map_or(now, |pong| pong + FINAL_PING_EVERY);
                if due <= now {
                    if pings.send_ping(h2::Ping::opaque()).is_ok() {
                        hold.ping_sent = Some(now);
                        // Registers this task for the PONG.
                        if let Poll::Ready(Ok(_)) = pings.poll_pong(cx) {
                            hold.ping_sent = None;
                            hold.last_pong = Some(now);
                        }
                    } else {
                        hold.pings = None;
                    }
                } else {
                    wake_at = wake_at.min(due);
                }
            }
        }
        // Check again then (the stream tasks and the PONG wake this task
        // earlier).
        hold.tick.as_mut().reset(wake_at);
        let _ = hold.tick.as_mut().poll(cx);
        false
    }
}

impl<T> Future for H2Conn<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<(), h2::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let State::Handshaking(handshake) = &mut this.state {
            match handshake.as_mut().poll(cx) {
                Poll::Ready(Ok(conn)) => this.state = State::Serving(Box::new(conn)),
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        loop {
            this.start_shutdown();
            let State::Serving(conn) = &mut this.state else {
                return Poll::Pending;
            };
            match this.shutdown {
                Shutdown::None | Shutdown::Requested | Shutdown::TwoPhase => {
                    match conn.poll_accept(cx) {
                        Poll::Ready(Some(Ok((request, respond)))) => {
                            this.accept(request, respond);
                        }
                        Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                        Poll::Ready(None) => return Poll::Ready(Ok(())),
                        Poll::Pending => {
                            // Reading the client's SETTINGS may have made
                            // a requested shutdown startable.
                            if matches!(this.shutdown, Shutdown::Requested)
                                && this.wire.kind() != ClientKind::Unknown
                            {
                                continue;
                            }
                            return Poll::Pending;
                        }
                    }
                }
                Shutdown::Holding(_) => {
                    // New streams are taken from h2 but never dispatched.
                    match conn.poll_accept(cx) {
                        // httpcore retries a stream above the GOAWAY's
                        // last-stream-id only when that id is not 0, so a
                        // connection that never had a stream serves its
                        // first one.
                        Poll::Ready(Some(Ok((request, respond)))) if this.last_accepted == 0 => {
                            this.accept(request, respond);
                            continue;
                        }
                        Poll::Ready(Some(Ok(stream))) => {
                            this.held.push(stream);
                            continue;
                        }
                        Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                        Poll::Ready(None) => return Poll::Ready(Ok(())),
                        Poll::Pending => {}
                    }
                    if !this.poll_final_due(cx) {
                        return Poll::Pending;
                    }
                    tracing::debug!(
                        last_stream = this.last_accepted,
                        held = this.held.len(),
                        kind = ?this.wire.kind(),
                        "HTTP/2: accepted streams done; final GOAWAY"
                    );
                    this.ctx
                        .shared
                        .metrics
                        .http2_held_streams(this.held.len() as u64);
                    this.wire
                        .final_id
                        .store(this.last_accepted, Ordering::Release);
                    this.wire.final_set.store(true, Ordering::Release);
                    if let State::Serving(conn) = &mut this.state {
                        conn.abrupt_shutdown(Reason::NO_ERROR);
                    }
                    this.shutdown = Shutdown::Final;
                }
                Shutdown::Final => return conn.poll_closed(cx),
            }
        }
    }
}

/// Counts an accepted stream until its last frame is handed to h2 (or
/// its task ends without one).
struct OpenStream(Option<Arc<Wire>>);

impl OpenStream {
    /// Call after [`Wire::expect_end`] and before handing the last frame
    /// to h2: the client may answer it with its next stream at once, and
    /// that one must not look like more concurrency than it has.
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

/// The request body of an HTTP/2 stream. Flow-control capacity goes back
/// to the client as each chunk is taken, as hyper does.
pub struct H2Body {
    recv: RecvStream,
    /// Content-Length still to come, for an exact size hint (the app's
    /// HTTP/1 request then carries a length instead of chunks).
    remaining: Option<u64>,
    data_done: bool,
}

impl H2Body {
    fn new(recv: RecvStream, headers: &HeaderMap) -> Self {
        let remaining = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        H2Body {
            recv,
            remaining,
            data_done: false,
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match this.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(remaining) = this.remaining.as_mut() {
                        *remaining = remaining.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(None) => this.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match this.recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(err)) => Poll::Ready(Some(Err(err))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.recv.is_end_stream() {
            return SizeHint::with_exact(0);
        }
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Connection-specific headers are malformed in HTTP/2 (RFC 9113 §8.2.2);
/// the proxy strips hop-by-hop headers already, this is the last guard.
fn strip_connection_headers(headers: &mut HeaderMap) {
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

/// A stream's bookkeeping for the final GOAWAY.
struct StreamEnd {
    open: OpenStream,
    wire: Arc<Wire>,
    id: u32,
}

impl StreamEnd {
    /// Before handing the stream's last frame to h2.
    fn ending(&mut self) {
        self.wire.expect_end(self.id);
        self.open.finish();
    }

    /// h2 refused the last frame (the stream is gone): nothing to await.
    fn refused(&self) {
        self.wire.forget_end(self.id);
    }
}

/// One stream: the proxy's answer, then its body into h2 with flow control.
async fn serve_stream(
    ctx: Arc<ConnCtx>,
    open: OpenStream,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let Some(wire) = open.0.clone() else {
        return;
    };
    let mut end = StreamEnd {
        open,
        wire,
        id: respond.stream_id().as_u32(),
    };
    let (parts, recv) = request.into_parts();
    let body = H2Body::new(recv, &parts.headers);
    let request = Request::from_parts(parts, crate::upstream::DownstreamBody::Http2(body));
    // A client that resets the stream while the app works: the request
    // future is dropped, which cancels the upstream call.
    let response = tokio::select! {
        response = crate::proxy::handle(ctx, request) => response,
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
    if body.is_end_stream() {
        end.ending();
        if respond.send_response(head, true).is_err() {
            end.refused();
        }
        return;
    }
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    pump(&mut end, &mut send, &mut body).await;
}

/// Sends the body; on the client's reset it stops (dropping the body
/// drops the app's response with it).
async fn pump(end: &mut StreamEnd, send: &mut SendStream<Bytes>, body: &mut ProxyBody) {
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            _ = std::future::poll_fn(|cx| send.poll_reset(cx)) => return,
        };
        match frame {
            None => {
                end.ending();
                if send.send_data(Bytes::new(), true).is_err() {
                    end.refused();
                }
                return;
            }
            Some(Err(err)) => {
                tracing::debug!(error = %err, "response body failed mid-stream; resetting the stream");
                end.ending();
                send.send_reset(Reason::INTERNAL_ERROR);
                return;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    // As hyper: wait for any send capacity, then queue the
                    // whole chunk (h2 bounds what it buffers per stream).
                    send.reserve_capacity(1);
                    if send.capacity() == 0 {
                        loop {
                            // A reset ends the wait like a closed stream.
                            let cap = std::future::poll_fn(|cx| {
                                if send.poll_reset(cx).is_ready() {
                                    return Poll::Ready(None);
                                }
                                send.poll_capacity(cx)
                            })
                            .await;
                            match cap {
                                Some(Ok(0)) => continue,
                                Some(Ok(_)) => break,
                                Some(Err(_)) | None => return,
                            }
                        }
                    }
                    let last = body.is_end_stream();
                    if last {
                        end.ending();
                    }
                    if send.send_data(data, last).is_err() {
                        end.refused();
                        return;
                    }
                    if last {
                        return;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        end.ending();
                        if send.send_trailers(trailers).is_err() {
                            end.refused();
                        }
                        return;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|&(id, v)| {
                let mut e = id.to_be_bytes().to_vec();
                e.extend_from_slice(&v.to_be_bytes());
                e
            })
            .collect()
    }

    #[test]
    fn python_h2_settings_are_recognised() {
        // As captured from httpx 0.23.3 and 0.28.1.
        let python = settings(&[
            (1, 4096),
            (2, 0),
            (4, 65535),
            (5, 16384),
            (3, 100),
            (6, 65536),
        ]);
        assert_eq!(classify(&python), ClientKind::Strict);
        // h2 crate (hyper, tonic): identifier order, no defaults.
        let hyper = settings(&[(2, 0), (4, 2 * 1024 * 1024), (5, 16384), (6, 16384)]);
        assert_eq!(classify(&hyper), ClientKind::Conforming);
        // Go's transport.
        let go = settings(&[(2, 0), (4, 4 << 20), (6, 10 << 20)]);
        assert_eq!(classify(&go), ClientKind::Conforming);
        assert_eq!(classify(&[]), ClientKind::Conforming);
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[tokio::test]
    async fn the_shutdown_ping_ack_is_taken_out_between_frames_and_others_pass() {
        let mut io = FrameIo::new((), Arc::new(Wire::default()));
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 0]));
        let settings_end = wire.len();
        wire.extend(frame(FRAME_PING, FLAG_ACK, 0, &SHUTDOWN_PING));
        let headers = frame(FRAME_HEADERS, 0x5, 3, &[0x82, 0x86]);
        wire.extend(&headers);
        // Read in two parts: the preface and SETTINGS, then the rest.
        let mut buf = wire.clone();
        let kept = io.filter_inbound(&mut buf[..settings_end], 0);
        assert_eq!(kept, settings_end);
        let kept = io.filter_inbound(&mut buf, settings_end);
        assert_eq!(&buf[..kept], [&wire[..settings_end], &headers[..]].concat());
        assert!(io.held_ack.is_some(), "the shutdown ack is held");

        // A user PING's ack passes where it is.
        let mut io = FrameIo::new((), Arc::new(Wire::default()));
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_PING, FLAG_ACK, 0, &[1; 8]));
        let mut buf = wire.clone();
        assert_eq!(io.filter_inbound(&mut buf, 0), wire.len());
        assert!(io.held_ack.is_none());
    }

    #[test]
    fn cursor_finds_stream_ends_and_the_goaway_id_across_splits() {
        let mut wire = frame(FRAME_DATA, 0, 1, b"abc");
        wire.extend(frame(FRAME_DATA, FLAG_END_STREAM, 1, b"d"));
        wire.extend(frame(FRAME_RST_STREAM, 0, 3, &[0, 0, 0, 2]));
        let goaway_at = wire.len();
        wire.extend(frame(FRAME_GOAWAY, 0, 0, &[0, 0, 0, 9, 0, 0, 0, 0]));
        wire.extend(frame(0x6, 0, 0, &[0; 8]));
        for split in 1..wire.len() {
            let mut cursor = FrameCursor::default();
            let mut ends = Vec::new();
            let mut patch = Vec::new();
            let mut keep = 0;
            for (offset, part) in [&wire[..split], &wire[split..]]
                .into_iter()
                .scan(0, |o, p| {
                    let at = *o;
                    *o += p.len();
                    Some((at, p))
                })
            {
                let scan = cursor.walk(part, true, |f| {
                    let end = match f.kind() {
                        FRAME_DATA | FRAME_HEADERS => f.header[4] & FLAG_END_STREAM != 0,
                        FRAME_RST_STREAM => true,
                        _ => false,
                    };
                    if end {
                        ends.push(f.stream_id());
                    }
                });
                patch.extend(scan.patch.iter().map(|&(i, k)| (offset + i, k)));
                keep = offset + scan.keep;
                if scan.final_end {
                    break;
                }
            }
            assert_eq!(ends, vec![1, 3], "split at {split}");
            let want: Vec<(usize, usize)> = (0..4).map(|k| (goaway_at + 9 + k, k)).collect();
            assert_eq!(patch, want, "split at {split}");
            assert_eq!(keep, goaway_at + 17, "split at {split}");
        }
    }
}
