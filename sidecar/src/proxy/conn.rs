//! The connection: one task per accepted socket, from the protocol sniff
//! to the end of the connection, with the timers that guard it (header
//! read, idle, write) and the drain's shutdown and deadline.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::Request;
use http::header::{self, HeaderMap};
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::handler::handle;
use crate::config::{LimitsConfig, Protocol};
use crate::drain::{ConnGuard, Phase};
use crate::http2::{Ending, H2Conn};
use crate::metrics::ClientTimeout;
use crate::state::Shared;
use crate::upstream::DownstreamBody;

/// A stream offset not known (see [`ConnActivity::message_end`]).
const UNKNOWN: u64 = u64::MAX;
/// The last four bytes of a stream that ends a head (or a chunked body).
const CRLF_CRLF: u32 = u32::from_be_bytes(*b"\r\n\r\n");

/// Per-connection counters shared by the IO wrapper, the header timer and
/// the request path.
pub(crate) struct ConnActivity {
    /// Bytes read from the client: the idle check, the header timer and
    /// the HTTP/2 final GOAWAY's quiet check watch it move.
    pub(crate) bytes_read: AtomicU64,
    /// Bytes written to the client, and whether the last write had to
    /// wait for the client to read: the write timeout watches both.
    bytes_written: AtomicU64,
    write_blocked: AtomicBool,
    /// Requests (HTTP/2: streams) seen on this connection.
    pub(super) requests: AtomicU64,
    /// Requests whose response body has not ended yet.
    pub(super) inflight: AtomicU32,
    /// The header timer's view of pipelining (HTTP/1). While `head_scan`
    /// is on, the IO wrapper looks for the end of the head being read and
    /// stores its stream offset in `head_end`; the request path turns that
    /// into `message_end` (head plus Content-Length) so the timer of the
    /// next head can tell bytes already read past the previous message (a
    /// pipelined head, buffered inside hyper) from an idle connection.
    head_scan: AtomicBool,
    head_end: AtomicU64,
    message_end: AtomicU64,
    /// The last four bytes read, big-endian: a message without a known
    /// end (chunked) ended cleanly if the stream ends in CRLF CRLF.
    tail: AtomicU32,
    /// What is written from now on is the connection's last: the socket
    /// closes right after it (see [`Downstream::poll_write_last`]).
    pub(crate) closing_after_write: AtomicBool,
}

impl ConnActivity {
    /// Fresh counters. `scan_first_head`: hyper's HTTP/1 server may serve
    /// the connection from its first request, so its header timer needs
    /// the first head's end. The fast path parses heads itself and HTTP/2
    /// has no heads to time; a connection the fast path hands to hyper
    /// later times its next head from the stream's tail instead (see
    /// [`ConnActivity::next_head_buffered`]). The scan looks at every byte
    /// read until the head ends: on a connection with one short request,
    /// a fortieth of the proxy's instructions.
    fn new(scan_first_head: bool) -> Self {
        ConnActivity {
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            write_blocked: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            inflight: AtomicU32::new(0),
            // The first head starts at offset 0.
            head_scan: AtomicBool::new(scan_first_head),
            head_end: AtomicU64::new(UNKNOWN),
            message_end: AtomicU64::new(UNKNOWN),
            tail: AtomicU32::new(0),
            closing_after_write: AtomicBool::new(false),
        }
    }
}

impl ConnActivity {
    /// At the start of the wait for request head number 2, 3, ...: are
    /// bytes of it already read? Then its header timer must run at once.
    fn next_head_buffered(&self) -> bool {
        let read = self.bytes_read.load(Ordering::Relaxed);
        let end = self.message_end.load(Ordering::Relaxed);
        let buffered = if end != UNKNOWN {
            read > end
        } else {
            // Without a known end, only a stream ending in CRLF CRLF is
            // surely between messages; a partial head never ends so.
            self.tail.load(Ordering::Relaxed) != CRLF_CRLF
        };
        self.head_end.store(UNKNOWN, Ordering::Relaxed);
        // The scan for this head's end is only right if it starts at the
        // head's first byte, i.e. nothing of it was read yet.
        self.head_scan.store(!buffered, Ordering::Relaxed);
        buffered
    }

    /// Remembers where this HTTP/1 request ends on the wire, for the header
    /// timer of the next one: the head's end (found by the IO wrapper) plus
    /// the Content-Length; unknown for chunked bodies (the stream tail tells).
    pub(super) fn note_message_end(&self, headers: &HeaderMap) {
        let head_end = self.head_end.swap(UNKNOWN, Ordering::Relaxed);
        let end = if head_end == UNKNOWN || headers.contains_key(header::TRANSFER_ENCODING) {
            UNKNOWN
        } else {
            let length = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            head_end.saturating_add(length)
        };
        self.message_end.store(end, Ordering::Relaxed);
    }
}

/// A downstream socket: TCP or Unix.
pub(crate) trait Downstream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Turns Nagle's algorithm off (TCP); nothing to do on a Unix socket.
    fn no_delay(&self);

    /// A write after which the socket is closed at once, with nothing
    /// left to read: TCP sends it with `MSG_MORE`, so the kernel holds the
    /// bytes back and the close sends them with its FIN in one segment.
    /// That is one loopback segment fewer per connection, which the
    /// closing side pays for (its transmit and the receiver's processing
    /// run on the sender's CPU): about a tenth of a one-request
    /// connection's CPU time (bench/README.md, "Issue #14, third pass").
    /// The close must follow: until it does, the bytes wait.
    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write(cx, buf)
    }
}

/// `MSG_MORE` from Linux's `<sys/socket.h>` (the sidecar has no libc
/// binding of its own; socket2 takes the flags as an integer).
#[cfg(target_os = "linux")]
pub(super) const MSG_MORE: i32 = 0x8000;

impl Downstream for tokio::net::TcpStream {
    fn no_delay(&self) {
        let _ = self.set_nodelay(true);
    }

    #[cfg(target_os = "linux")]
    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.poll_write_ready(cx))?;
            let sent = self.try_io(tokio::io::Interest::WRITABLE, || {
                socket2::SockRef::from(&*self).send_with_flags(buf, MSG_MORE)
            });
            match sent {
                // Readiness was stale; `try_io` cleared it.
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                res => return Poll::Ready(res),
            }
        }
    }
}

impl Downstream for tokio::net::UnixStream {
    fn no_delay(&self) {}
}

/// The downstream socket, counting bytes read and written. Everything
/// else passes through.
struct CountingIo<T> {
    inner: T,
    /// The connection's context, for its activity counters (one allocation
    /// per connection holds both).
    ctx: Arc<ConnCtx>,
    /// Bytes read and written so far (this wrapper is the only reader
    /// and writer): the shared counters are stored, not added to, which
    /// is a plain store instead of a locked instruction per read and write.
    read: u64,
    written: u64,
    /// How much of CRLF CRLF the head scan has matched.
    scan_state: u8,
    /// Nagle's algorithm is still on: it goes off before the second
    /// write (see [`CountingIo::before_write`]).
    delay_on: bool,
    wrote: bool,
}

impl<T> CountingIo<T> {
    fn new(inner: T, ctx: Arc<ConnCtx>) -> Self {
        CountingIo {
            inner,
            ctx,
            read: 0,
            written: 0,
            scan_state: 0,
            delay_on: true,
            wrote: false,
        }
    }

    /// Book-keeping for `n` new bytes at the end of `data`.
    fn saw(&mut self, data: &[u8]) {
        let act = &self.ctx.act;
        if act.head_scan.load(Ordering::Relaxed) {
            for (i, &b) in data.iter().enumerate() {
                self.scan_state = match (self.scan_state, b) {
                    (0 | 2, b'\r') => self.scan_state + 1,
                    (1, b'\n') => 2,
                    (3, b'\n') => 4,
                    (_, b'\r') => 1,
                    _ => 0,
                };
                if self.scan_state == 4 {
                    self.scan_state = 0;
                    act.head_end
                        .store(self.read + i as u64 + 1, Ordering::Relaxed);
                    act.head_scan.store(false, Ordering::Relaxed);
                    break;
                }
            }
        } else {
            self.scan_state = 0;
        }
        let mut tail = act.tail.load(Ordering::Relaxed);
        for &b in data.iter().rev().take(4).rev() {
            tail = (tail << 8) | u32::from(b);
        }
        act.tail.store(tail, Ordering::Relaxed);
        self.read += data.len() as u64;
        act.bytes_read.store(self.read, Ordering::Relaxed);
    }

    fn wrote(&mut self, res: &Poll<io::Result<usize>>) {
        match res {
            Poll::Ready(Ok(n)) => {
                self.wrote = true;
                self.written += *n as u64;
                self.ctx
                    .act
                    .bytes_written
                    .store(self.written, Ordering::Relaxed);
                self.ctx.act.write_blocked.store(false, Ordering::Relaxed);
            }
            Poll::Pending => self.ctx.act.write_blocked.store(true, Ordering::Relaxed),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let filled = &buf.filled()[before..];
            this.saw(filled);
        }
        res
    }
}

impl<T: Downstream> CountingIo<T> {
    /// Nagle's algorithm holds a small segment back only while an earlier
    /// small one is unacknowledged, so the first write of a connection
    /// always leaves at once: `TCP_NODELAY` is needed from the second
    /// write on. Set then, not at accept, a connection with one answer
    /// (one request, `Connection: close`) saves the `setsockopt`, as in
    /// nginx, which sets it only when a connection is kept alive.
    fn before_write(&mut self) {
        if self.delay_on && self.wrote {
            self.inner.no_delay();
            self.delay_on = false;
        }
    }
}

impl<T: Downstream> AsyncWrite for CountingIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.before_write();
        let res = if this.ctx.act.closing_after_write.load(Ordering::Relaxed) {
            this.inner.poll_write_last(cx, buf)
        } else {
            Pin::new(&mut this.inner).poll_write(cx, buf)
        };
        this.wrote(&res);
        res
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.before_write();
        let res = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(&res);
        res
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// hyper's HTTP/1 header-read timer, with one change: on a kept-alive
/// connection the clock only starts when the next request's first byte
/// arrives. hyper starts it as soon as it waits for the next head, which
/// would close every keep-alive connection idle for `headerReadTimeout`
/// and race clients reusing it; idle connections are the idle timeout's job.
/// "Arrives" includes bytes hyper already buffered: a pipelined head sent
/// half in the packet of the previous request is timed from the moment
/// hyper starts waiting for it (see [`ConnActivity::next_head_buffered`]).
#[derive(Clone)]
struct HeadTimer {
    ctx: Arc<ConnCtx>,
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        // The first request of a connection is timed from the start, like
        // nginx's client_header_timeout: a client that connects and says
        // nothing is the slowloris case.
        let act = &self.ctx.act;
        let first = act.requests.load(Ordering::Relaxed) == 0;
        let now = first || act.next_head_buffered();
        let seen = act.bytes_read.load(Ordering::Relaxed);
        Box::pin(HeadSleep {
            ctx: self.ctx.clone(),
            seen,
            duration,
            sleep: now.then(|| Box::pin(tokio::time::sleep(duration))),
        })
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep(deadline.saturating_duration_since(Instant::now()))
    }
}

struct HeadSleep {
    ctx: Arc<ConnCtx>,
    seen: u64,
    duration: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for HeadSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.sleep.is_none() {
            if this.ctx.act.bytes_read.load(Ordering::Relaxed) == this.seen {
                // No byte of a new request yet. hyper polls us again after
                // every read, so no wake-up needs registering here.
                return Poll::Pending;
            }
            this.sleep = Some(Box::pin(tokio::time::sleep(this.duration)));
        }
        match this.sleep.as_mut() {
            Some(sleep) => {
                let res = sleep.as_mut().poll(cx);
                if res.is_ready() {
                    this.ctx
                        .shared
                        .metrics
                        .client_timeout(ClientTimeout::HeaderRead);
                }
                res
            }
            None => Poll::Pending,
        }
    }
}

impl hyper::rt::Sleep for HeadSleep {}

/// hyper's HTTP/1 server with the limits in force.
fn http1_builder(limits: &LimitsConfig, ctx: &Arc<ConnCtx>) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(HeadTimer { ctx: ctx.clone() })
        .header_read_timeout(limits.header_read_timeout.get())
        .max_headers(limits.max_headers)
        // hyper answers 431 when the head outgrows the read buffer; its
        // floor is 8 KiB.
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the sniff reads at a time: a whole request head, most often (the
/// fast path's read buffer, which it becomes).
const SNIFF_READ: usize = super::h1::READ_BUF;

/// Reads until the first bytes are, or cannot be, the HTTP/2 preface.
/// Returns whether they are, and the bytes read (replayed to the server).
async fn sniff_h2<S: AsyncRead + Unpin>(io: &mut S) -> io::Result<(bool, BytesMut)> {
    // Read straight into the buffer that goes on (as the HTTP/1 fast
    // path's read buffer, or replayed in front of hyper and h2), not
    // through an array in this future: that array sat in every
    // connection task (moved on spawn and on completion), and the copies
    // cost three allocations per connection.
    let mut seen = super::h1::first_read_buffer();
    loop {
        if seen.len() == seen.capacity() {
            seen.reserve(SNIFF_READ);
        }
        let n = io.read_buf(&mut seen).await?;
        if n == 0 {
            return Ok((false, seen));
        }
        let m = seen.len().min(H2_PREFACE.len());
        if seen[..m] != H2_PREFACE[..m] {
            return Ok((false, seen));
        }
        if m == H2_PREFACE.len() {
            return Ok((true, seen));
        }
    }
}

/// The downstream socket with the bytes the protocol sniff (or the
/// HTTP/1 fast path) took replayed in front.
pub(super) struct Rewind<T> {
    pre: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    pub(super) fn new(pre: Bytes, inner: T) -> Self {
        Rewind { pre, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

pub(super) type BoxError = Box<dyn StdError + Send + Sync>;

/// A connection being served, whatever its protocol: runs until the
/// connection ends; `shutdown` starts a graceful end.
pub(super) trait Served: Future<Output = Result<(), BoxError>> + Send {
    fn shutdown(self: Pin<&mut Self>, why: Ending);
}

pin_project_lite::pin_project! {
    struct Http1Served<C> {
        #[pin]
        conn: C,
    }
}

impl<I, S, B> Future for Http1Served<hyper::server::conn::http1::UpgradeableConnection<I, S>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Result<(), BoxError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().conn.poll(cx).map_err(Into::into)
    }
}

impl<I, S, B> Served for Http1Served<hyper::server::conn::http1::UpgradeableConnection<I, S>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    Self: Send,
{
    fn shutdown(self: Pin<&mut Self>, _why: Ending) {
        // HTTP/1 closes once the response in flight is out.
        self.project().conn.graceful_shutdown();
    }
}

/// The HTTP/2 connection, its error boxed like hyper's.
struct H2Served<T>(H2Conn<T>);

impl<T> Future for H2Served<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<(), BoxError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().0).poll(cx).map_err(Into::into)
    }
}

impl<T> Served for H2Served<T>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn shutdown(self: Pin<&mut Self>, why: Ending) {
        self.get_mut().0.shutdown(why);
    }
}

/// What a request needs from its connection.
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Shared>,
    /// Its counters, inline: one allocation per connection for both.
    pub(crate) act: ConnActivity,
    /// The client's address, rendered once per connection for X-Forwarded-For.
    pub(super) peer_ip: crate::listen::ForwardedFor,
}

/// Serves one accepted downstream connection until it closes, the drain
/// closes it, or the drain deadline cuts it.
pub(crate) async fn serve_connection<S: Downstream>(
    shared: Arc<Shared>,
    stream: S,
    peer: crate::listen::Peer,
    mut guard: ConnGuard,
) {
    let live = shared.live.load();
    let protocol = live.config.protocol;
    let limits = live.config.limits;
    let go_away = live.config.drain.http2_go_away;
    let fast_path = live.config.proxy.http1_fast_path;
    drop(live);

    let peer_ip = peer.forwarded_for_text();
    let ctx = Arc::new(ConnCtx {
        shared: shared.clone(),
        act: ConnActivity::new(!fast_path && protocol != Protocol::Http2),
        peer_ip,
    });
    // The drain, idle and write checks below read the counters.
    let watched = ctx.clone();
    let act = &watched.act;
    let mut io = CountingIo::new(stream, ctx.clone());
    let mut drain_rx = shared.drain.subscribe();
    // Before the protocol is known (the first 24 bytes, the length of the
    // HTTP/2 preface) hyper's HTTP/1 header timer is not running yet, so a
    // client that connects and says nothing (or half a word) is cut here.
    let first_deadline = tokio::time::Instant::now() + limits.header_read_timeout.get();
    let (h2, pre) = match protocol {
        Protocol::Http1 => (false, BytesMut::new()),
        Protocol::Http2 => (true, BytesMut::new()),
        // Biased, the read first: bytes already there need no timer.
        Protocol::Auto | Protocol::Tcp => tokio::select! {
            biased;
            sniffed = sniff_h2(&mut io) => match sniffed {
                Ok(found) => found,
                Err(err) => {
                    tracing::debug!(%peer, error = %err, "downstream connection failed before its first request");
                    return;
                }
            },
            _ = tokio::time::sleep_until(first_deadline) => {
                shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                tracing::debug!(%peer, "no request head within the header read timeout; closing");
                return;
            }
            // Nothing of a request yet: closing is the graceful path (as
            // hyper-util's auto server cancels a connection still reading
            // its version).
            _ = drain_rx.wait_for(|s| s.phase >= Phase::Closing) => {
                tracing::debug!(%peer, "closing: connection without a request closed");
                return;
            }
        },
    };
    let mut conn: Pin<Box<dyn Served>> = if h2 {
        let io = Rewind::new(pre.freeze(), io);
        Box::pin(H2Served(H2Conn::new(io, ctx, &limits, go_away)))
    } else if fast_path {
        super::h1::serve(io, pre, ctx, limits)
    } else {
        hyper_http1(Rewind::new(pre.freeze(), io), ctx, &limits)
    };

    let mut shutting_down = false;
    // A connection accepted in the instant the listener closed still gets
    // the graceful path.
    if drain_rx.borrow_and_update().phase >= Phase::Closing {
        conn.as_mut().shutdown(Ending::Drain);
        shutting_down = true;
    }

    // Idle check: close a connection with nothing in flight that has not
    // sent a byte for `downstreamIdleTimeout` (checked in quarters, so the
    // close lands between 1x and 1.25x the timeout).
    let idle_timeout = limits.downstream_idle_timeout.get();
    let tick = (idle_timeout / 4).max(Duration::from_millis(50));
    let mut next_tick = tokio::time::Instant::now() + tick;
    let mut last_bytes = 0u64;
    let mut quiet_since = tokio::time::Instant::now();
    let mut first_checked = false;
    // An idle close that does not finish (an HTTP/2 client that never acks
    // the shutdown PING keeps hyper waiting for it) is cut after this. The
    // drain has its own bound: the deadline's force close below.
    let mut idle_close_deadline: Option<tokio::time::Instant> = None;
    // Write timeout: a client that takes no byte for `writeTimeout` while
    // a write waits on it is cut; dropping the connection drops the
    // response body and with it the app connection it streams from.
    let write_timeout = limits.write_timeout.get();
    let write_tick = (write_timeout / 4).max(Duration::from_millis(50));
    let mut next_write_tick = tokio::time::Instant::now() + write_tick;
    let mut last_written = 0u64;
    let mut write_progress_at = tokio::time::Instant::now();

    loop {
        // One timer for the four deadlines (the first head, the write and
        // idle checks, the idle close's bound), not one each: a
        // registration in tokio's timer wheel and its removal per deadline
        // were about a twentieth of a one-request connection's
        // instructions (bench/README.md). Whatever is due when it fires is
        // handled below, in the same way as before.
        let wake_at = [
            (!first_checked).then_some(first_deadline),
            (!write_timeout.is_zero()).then_some(next_write_tick),
            (!shutting_down && !idle_timeout.is_zero()).then_some(next_tick),
            idle_close_deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        tokio::select! {
            biased;
            res = conn.as_mut() => {
                if let Err(err) = res {
                    tracing::debug!(%peer, error = %err, "downstream connection ended with an error");
                }
                break;
            }
            changed = PolledWhenWoken::new(drain_rx.changed()) => {
                if changed.is_err() {
                    break;
                }
                let state = *drain_rx.borrow_and_update();
                if state.force_close {
                    tracing::debug!(%peer, "drain deadline: force-closing connection");
                    guard.mark_forced();
                    break;
                }
                if state.phase >= Phase::Closing && !shutting_down {
                    conn.as_mut().shutdown(Ending::Drain);
                    shutting_down = true;
                }
            }
            _ = sleep_until_opt(wake_at), if wake_at.is_some() => {
                // Due: every deadline at or before the one slept for.
                let due = |at: tokio::time::Instant| wake_at.is_some_and(|w| at <= w);
                let now = tokio::time::Instant::now();
                if !first_checked && due(first_deadline) {
                    first_checked = true;
                    if act.requests.load(Ordering::Relaxed) == 0 && act.bytes_read.load(Ordering::Relaxed) < 24 {
                        shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                        tracing::debug!(%peer, "no request head within the header read timeout; closing");
                        break;
                    }
                }
                if !write_timeout.is_zero() && due(next_write_tick) {
                    next_write_tick = now + write_tick;
                    let written = act.bytes_written.load(Ordering::Relaxed);
                    if written != last_written || !act.write_blocked.load(Ordering::Relaxed) {
                        last_written = written;
                        write_progress_at = now;
                    } else if now - write_progress_at >= write_timeout {
                        shared.metrics.client_timeout(ClientTimeout::Write);
                        tracing::debug!(%peer, "client read nothing for limits.writeTimeout; closing");
                        break;
                    }
                }
                if !shutting_down && !idle_timeout.is_zero() && due(next_tick) {
                    next_tick = now + tick;
                    let bytes = act.bytes_read.load(Ordering::Relaxed);
                    if bytes != last_bytes || act.inflight.load(Ordering::Relaxed) > 0 {
                        last_bytes = bytes;
                        quiet_since = now;
                    } else if now - quiet_since >= idle_timeout {
                        tracing::debug!(%peer, "closing idle downstream connection");
                        conn.as_mut().shutdown(Ending::Idle);
                        shutting_down = true;
                        idle_close_deadline = Some(now + limits.header_read_timeout.get());
                        continue;
                    }
                }
                if idle_close_deadline.is_some_and(due) {
                    tracing::debug!(%peer, "idle close not acknowledged in time; dropping the connection");
                    shared.metrics.idle_close_cut();
                    break;
                }
            }
        }
    }
}

/// An HTTP/1 connection served by hyper (with upgrades).
pub(super) fn hyper_http1<I>(
    io: I,
    ctx: Arc<ConnCtx>,
    limits: &LimitsConfig,
) -> Pin<Box<dyn Served>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let builder = http1_builder(limits, &ctx);
    let service = service_fn(move |req: Request<Incoming>| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(handle(ctx, req.map(DownstreamBody::Http1)).await) }
    });
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    Box::pin(Http1Served { conn })
}

pin_project_lite::pin_project! {
    /// A future polled only when it asked to be: its waker is a flag that
    /// wakes the task. `select!` polls every branch on every wake of the
    /// connection's task, two or more per request, and a waiting watch
    /// `changed()` locks the channel's waiter list on each poll to refresh
    /// its waker: a lock and unlock per wake, 0.3-0.4% of a keep-alive
    /// request's CPU (bench/README.md, "seventh pass"). Between its own
    /// wakes a future has nothing new to say (the `Future` contract), so
    /// skipping those polls is exact whatever the inner future does,
    /// spurious wakes and tokio's budget (which wakes the waker it was
    /// given) included. Checking the channel's version instead is not: a
    /// wake-up left over from the change just handled can use up the
    /// registration, and the force close was then missed.
    struct PolledWhenWoken<F> {
        flag: Arc<WokenFlag>,
        inner_waker: std::task::Waker,
        // The task waker the flag forwards to, to notice a new one.
        task_waker: Option<std::task::Waker>,
        #[pin]
        inner: F,
    }
}

struct WokenFlag {
    woken: AtomicBool,
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for WokenFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl<F> PolledWhenWoken<F> {
    fn new(inner: F) -> Self {
        let flag = Arc::new(WokenFlag {
            // The first poll always reaches the inner future.
            woken: AtomicBool::new(true),
            task: std::sync::Mutex::new(None),
        });
        PolledWhenWoken {
            inner_waker: std::task::Waker::from(flag.clone()),
            flag,
            task_waker: None,
            inner,
        }
    }
}

impl<F: Future> Future for PolledWhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if !this
            .task_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // Set before the check below, so a wake from now on reaches it.
            *this
                .flag
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
            *this.task_waker = Some(cx.waker().clone());
        }
        // A plain load first: most polls find it unset, and a wake racing
        // with it wakes the task again.
        if !this.flag.woken.load(Ordering::Acquire)
            || !this.flag.woken.swap(false, Ordering::AcqRel)
        {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.inner_waker))
    }
}

/// Sleeps until `at`, or forever without one (a disabled `select!` branch
/// still builds its future).
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Past `limits.maxConnections` a new connection is closed at once (the
/// caller drops it), so the sockets, tasks and app connections already
/// open keep what they have. The admin port has its own limit.
pub(crate) fn over_connection_cap(shared: &Shared) -> bool {
    let cap = shared.live.load().config.limits.max_connections;
    if cap == 0 || shared.drain.open_connections() < cap {
        return false;
    }
    shared.metrics.connection_refused("proxy");
    tracing::debug!(
        limit = cap,
        "limits.maxConnections reached; closing a new connection"
    );
    true
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    use tokio::sync::watch;

    use super::*;
    use crate::drain::DrainState;

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    pin_project_lite::pin_project! {
        /// The inner future, counting its polls.
        struct CountPolls<'a, F> {
            polls: &'a AtomicUsize,
            #[pin]
            inner: F,
        }
    }

    impl<F: Future> Future for CountPolls<'_, F> {
        type Output = F::Output;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            let this = self.project();
            this.polls.fetch_add(1, Ordering::SeqCst);
            this.inner.poll(cx)
        }
    }

    fn state(phase: Phase) -> DrainState {
        DrainState {
            phase,
            force_close: false,
            exit: false,
        }
    }

    #[test]
    fn a_waiting_drain_watch_is_polled_again_only_for_news() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let polls = AtomicUsize::new(0);
        let gated = PolledWhenWoken::new(CountPolls {
            polls: &polls,
            inner: rx.changed(),
        });
        let mut gated = std::pin::pin!(gated);
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(gated.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll registers");
        // The connection's other branches woke the task: no news here.
        for _ in 0..3 {
            assert!(gated.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "not woken, not polled");

        // The future moved to another task: the change wakes that one.
        let other = Arc::new(CountWakes(AtomicUsize::new(0)));
        let other_waker = std::task::Waker::from(other.clone());
        assert!(
            gated
                .as_mut()
                .poll(&mut Context::from_waker(&other_waker))
                .is_pending()
        );
        tx.send_replace(state(Phase::Closing));
        assert_eq!(
            other.0.load(Ordering::SeqCst),
            1,
            "the change woke the task"
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "not the old one");
        let done = gated.as_mut().poll(&mut Context::from_waker(&other_waker));
        assert!(matches!(done, Poll::Ready(Ok(()))), "{done:?}");
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    /// A future woken with nothing to report (a wake-up left over from the
    /// change just handled, as a watch's waiter list can give) must still
    /// be polled, to register again: the force close a connection missed
    /// when the gate checked the channel's version instead.
    #[test]
    fn a_spurious_wake_still_reaches_the_inner_future() {
        struct Manual {
            waker: Arc<std::sync::Mutex<Option<std::task::Waker>>>,
            ready: Arc<AtomicBool>,
        }
        impl Future for Manual {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                if self.ready.load(Ordering::SeqCst) {
                    return Poll::Ready(());
                }
                // Registers anew on every poll, and a wake uses it up.
                *self
                    .waker
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let registered = Arc::new(std::sync::Mutex::new(None::<std::task::Waker>));
        let ready = Arc::new(AtomicBool::new(false));
        let take = |r: &Arc<std::sync::Mutex<Option<std::task::Waker>>>| {
            r.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take()
        };
        let mut gated = std::pin::pin!(PolledWhenWoken::new(Manual {
            waker: registered.clone(),
            ready: ready.clone(),
        }));
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());

        // A spurious wake, with nothing new.
        take(&registered).expect("registered").wake();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        // It registered again, so the real news still wakes the task.
        ready.store(true, Ordering::SeqCst);
        take(&registered)
            .expect("the spurious wake's poll registered again")
            .wake();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert!(gated.as_mut().poll(&mut cx).is_ready());
    }

    /// Out of tokio's budget, `changed()` answers `Pending` without joining
    /// the channel's waiters, and wakes the waker it was given: the flag,
    /// so the task comes back and the next poll (in budget) joins them.
    #[tokio::test(flavor = "current_thread")]
    async fn a_watch_first_polled_out_of_budget_still_hears_the_change() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut gated = std::pin::pin!(PolledWhenWoken::new(rx.changed()));
        std::future::poll_fn(|cx| {
            // Spend the task's budget, as a connection's I/O can.
            loop {
                let spend = std::pin::pin!(tokio::task::coop::consume_budget());
                if spend.poll(cx).is_pending() {
                    break;
                }
            }
            assert!(!tokio::task::coop::has_budget_remaining());
            assert!(
                gated
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            Poll::Ready(())
        })
        .await;
        // tokio defers a budget wake to the scheduler's next turn.
        tokio::task::yield_now().await;
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "told to come back");
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        tx.send_replace(state(Phase::Closing));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            2,
            "the change must wake the task"
        );
        let done = gated.as_mut().poll(&mut cx);
        assert!(matches!(done, Poll::Ready(Ok(()))), "{done:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_loop_sees_every_change() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        // Each change the loop handled, so the next is sent only after it:
        // every change then takes a select of its own, as in a connection.
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = std::future::pending::<()>() => {}
                    changed = PolledWhenWoken::new(rx.changed()) => {
                        if changed.is_err() {
                            return;
                        }
                        let s = *rx.borrow_and_update();
                        let _ = seen_tx.send((s.phase, s.force_close));
                        if s.force_close {
                            return;
                        }
                    }
                }
            }
        });
        let sends = [
            (Phase::Draining, false),
            (Phase::Closing, false),
            (Phase::Closing, true),
        ];
        for (phase, force_close) in sends {
            tx.send_replace(DrainState {
                phase,
                force_close,
                exit: false,
            });
            let seen = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv()).await;
            assert_eq!(
                seen,
                Ok(Some((phase, force_close))),
                "the loop missed a change"
            );
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_ok()
        );
    }

    #[test]
    fn a_closed_drain_watch_is_news_too() {
        let (tx, mut rx) = watch::channel(state(Phase::Serving));
        let mut gated = std::pin::pin!(PolledWhenWoken::new(rx.changed()));
        let waker = std::task::Waker::from(Arc::new(CountWakes(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        assert!(gated.as_mut().poll(&mut cx).is_pending());
        drop(tx);
        assert!(matches!(gated.as_mut().poll(&mut cx), Poll::Ready(Err(_))));
    }
}
