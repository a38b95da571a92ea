//! Serving downstream connections and forwarding their requests to the app.
//!
//! One task per connection. The first bytes tell HTTP/2 prior knowledge
//! (the preface) from HTTP/1.1: HTTP/1.1 (with upgrades) is served by
//! hyper, HTTP/2 by the h2 crate directly (http2.rs), so the drain can pick
//! its frames per client. Each task selects on the drain watch: at
//! `Closing` HTTP/1 closes once idle and HTTP/2 gets its GOAWAY sequence;
//! at the deadline the task drops the connection and counts it.
//!
//! Per request the cost is kept to atomics and header edits: no lock, no
//! boxing of bodies, and the route table and config come from one lock-free
//! snapshot load.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::circuit::{Permit, UpstreamOutcome};
use crate::config::{LimitsConfig, Protocol};
use crate::drain::{ConnGuard, Phase};
use crate::http2::{Ending, H2Conn};
use crate::metrics::{ClientError, ClientTimeout};
use crate::state::Shared;
use crate::upstream::{BodyFault, DownstreamBody, PoolReturn, UpstreamBody, UpstreamResponse};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

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
    requests: AtomicU64,
    /// Requests whose response body has not ended yet.
    inflight: AtomicU32,
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
}

impl Default for ConnActivity {
    fn default() -> Self {
        ConnActivity {
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            write_blocked: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            inflight: AtomicU32::new(0),
            // The first head starts at offset 0.
            head_scan: AtomicBool::new(true),
            head_end: AtomicU64::new(UNKNOWN),
            message_end: AtomicU64::new(UNKNOWN),
            tail: AtomicU32::new(0),
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
}

/// The downstream socket, counting bytes read and written. Everything
/// else passes through.
struct CountingIo<T> {
    inner: T,
    act: Arc<ConnActivity>,
    /// Bytes read so far (this wrapper is the only reader).
    read: u64,
    /// How much of CRLF CRLF the head scan has matched.
    scan_state: u8,
}

impl<T> CountingIo<T> {
    fn new(inner: T, act: Arc<ConnActivity>) -> Self {
        CountingIo {
            inner,
            act,
            read: 0,
            scan_state: 0,
        }
    }

    /// Book-keeping for `n` new bytes at the end of `data`.
    fn saw(&mut self, data: &[u8]) {
        let act = &self.act;
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

    fn wrote(&self, res: &Poll<io::Result<usize>>) {
        match res {
            Poll::Ready(Ok(n)) => {
                self.act
                    .bytes_written
                    .fetch_add(*n as u64, Ordering::Relaxed);
                self.act.write_blocked.store(false, Ordering::Relaxed);
            }
            Poll::Pending => self.act.write_blocked.store(true, Ordering::Relaxed),
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

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let res = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(&res);
        res
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
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
    act: Arc<ConnActivity>,
    shared: Arc<Shared>,
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        // The first request of a connection is timed from the start, like
        // nginx's client_header_timeout: a client that connects and says
        // nothing is the slowloris case.
        let first = self.act.requests.load(Ordering::Relaxed) == 0;
        let now = first || self.act.next_head_buffered();
        let seen = self.act.bytes_read.load(Ordering::Relaxed);
        Box::pin(HeadSleep {
            act: self.act.clone(),
            shared: self.shared.clone(),
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
    act: Arc<ConnActivity>,
    shared: Arc<Shared>,
    seen: u64,
    duration: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for HeadSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.sleep.is_none() {
            if this.act.bytes_read.load(Ordering::Relaxed) == this.seen {
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
                    this.shared
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
fn http1_builder(
    limits: &LimitsConfig,
    act: &Arc<ConnActivity>,
    shared: &Arc<Shared>,
) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(HeadTimer {
            act: act.clone(),
            shared: shared.clone(),
        })
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

/// Reads until the first bytes are, or cannot be, the HTTP/2 preface.
/// Returns whether they are, and the bytes read (replayed to the server).
async fn sniff_h2<S: AsyncRead + Unpin>(io: &mut S) -> io::Result<(bool, Vec<u8>)> {
    let mut seen = Vec::with_capacity(H2_PREFACE.len());
    let mut chunk = [0u8; 1024];
    loop {
        let n = io.read(&mut chunk).await?;
        if n == 0 {
            return Ok((false, seen));
        }
        seen.extend_from_slice(&chunk[..n]);
        let m = seen.len().min(H2_PREFACE.len());
        if seen[..m] != H2_PREFACE[..m] {
            return Ok((false, seen));
        }
        if m == H2_PREFACE.len() {
            return Ok((true, seen));
        }
    }
}

/// The downstream socket with the bytes the protocol sniff took replayed
/// in front.
struct Rewind<T> {
    pre: Bytes,
    inner: T,
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

type BoxError = Box<dyn StdError + Send + Sync>;

/// A connection being served, whatever its protocol: runs until the
/// connection ends; `shutdown` starts a graceful end.
trait Served: Future<Output = Result<(), BoxError>> + Send {
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
    pub(crate) act: Arc<ConnActivity>,
    /// The client's address, rendered once per connection for X-Forwarded-For.
    peer_ip: HeaderValue,
}

/// Serves one accepted downstream connection until it closes, the drain
/// closes it, or the drain deadline cuts it.
pub(crate) async fn serve_connection<S>(
    shared: Arc<Shared>,
    stream: S,
    peer: crate::listen::Peer,
    mut guard: ConnGuard,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let live = shared.live.load();
    let protocol = live.config.protocol;
    let limits = live.config.limits;
    let go_away = live.config.drain.http2_go_away;
    drop(live);

    let act = Arc::new(ConnActivity::default());
    let peer_ip = HeaderValue::try_from(peer.forwarded_for())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
    let ctx = Arc::new(ConnCtx {
        shared: shared.clone(),
        act: act.clone(),
        peer_ip,
    });
    let mut io = CountingIo::new(stream, act.clone());
    let mut drain_rx = shared.drain.subscribe();
    // Before the protocol is known (the first 24 bytes, the length of the
    // HTTP/2 preface) hyper's HTTP/1 header timer is not running yet, so a
    // client that connects and says nothing (or half a word) is cut here.
    let first_deadline = tokio::time::Instant::now() + limits.header_read_timeout.get();
    let (h2, pre) = match protocol {
        Protocol::Http1 => (false, Vec::new()),
        Protocol::Http2 => (true, Vec::new()),
        Protocol::Auto | Protocol::Tcp => tokio::select! {
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
    let io = Rewind {
        pre: Bytes::from(pre),
        inner: io,
    };
    let mut conn: Pin<Box<dyn Served>> = if h2 {
        Box::pin(H2Served(H2Conn::new(io, ctx, &limits, go_away)))
    } else {
        let service = service_fn(move |req: Request<Incoming>| {
            let ctx = ctx.clone();
            async move { Ok::<_, Infallible>(handle(ctx, req.map(DownstreamBody::Http1)).await) }
        });
        let conn = http1_builder(&limits, &act, &shared)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        Box::pin(Http1Served { conn })
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
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(err) = res {
                    tracing::debug!(%peer, error = %err, "downstream connection ended with an error");
                }
                break;
            }
            changed = drain_rx.changed() => {
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
            _ = tokio::time::sleep_until(first_deadline), if !first_checked => {
                first_checked = true;
                if act.requests.load(Ordering::Relaxed) == 0 && act.bytes_read.load(Ordering::Relaxed) < 24 {
                    shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                    tracing::debug!(%peer, "no request head within the header read timeout; closing");
                    break;
                }
            }
            _ = tokio::time::sleep_until(next_write_tick), if !write_timeout.is_zero() => {
                let now = tokio::time::Instant::now();
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
            _ = tokio::time::sleep_until(next_tick), if !shutting_down && !idle_timeout.is_zero() => {
                let now = tokio::time::Instant::now();
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
                }
            }
            _ = sleep_until_opt(idle_close_deadline), if idle_close_deadline.is_some() => {
                tracing::debug!(%peer, "idle close not acknowledged in time; dropping the connection");
                shared.metrics.idle_close_cut();
                break;
            }
        }
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

/// Ends a request's accounting when its response body ends (or is dropped).
struct RequestGuard {
    ctx: Arc<ConnCtx>,
    started: Instant,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.ctx.act.inflight.fetch_sub(1, Ordering::Relaxed);
        self.ctx
            .shared
            .metrics
            .request_finished(self.started.elapsed());
    }
}

/// A circuit permit that records `Cancelled` if the request is dropped
/// before the app answered (client gone, drain deadline): a drain never
/// counts as a breaker failure.
struct PermitSlot(Option<Permit>);

impl PermitSlot {
    fn record(&mut self, outcome: UpstreamOutcome) -> Option<Permit> {
        let mut permit = self.0.take()?;
        permit.record(outcome);
        Some(permit)
    }
}

impl Drop for PermitSlot {
    fn drop(&mut self) {
        if let Some(permit) = self.0.as_mut() {
            permit.record(UpstreamOutcome::Cancelled);
        }
    }
}

/// Travels with the response body; dropped when the body ends.
struct Finish {
    _request: RequestGuard,
    _permit: Option<Permit>,
}

enum Inner {
    Upstream(Incoming),
    Local(Full<Bytes>),
}

/// The body sent downstream: the app's streamed body or one the proxy made.
/// It carries the request's accounting and circuit permit, released the
/// moment the last frame is out.
pub struct ProxyBody {
    inner: Inner,
    finish: Option<Finish>,
    /// The app connection this body is read from, handed back to the pool
    /// once the body has been read to its end.
    pool_return: Option<PoolReturn>,
}

impl ProxyBody {
    fn local(body: Full<Bytes>, finish: Option<Finish>) -> ProxyBody {
        ProxyBody {
            inner: Inner::Local(body),
            finish,
            pool_return: None,
        }
    }

    fn upstream(body: Incoming, finish: Finish, pool_return: Option<PoolReturn>) -> ProxyBody {
        let mut body = ProxyBody {
            inner: Inner::Upstream(body),
            finish: Some(finish),
            pool_return,
        };
        // An empty body (204, HEAD, Content-Length: 0) is never polled.
        body.release_if_read();
        body
    }

    /// Hands the app connection back once the whole body came off it. The
    /// server stops polling as soon as `is_end_stream` says so, so this
    /// cannot wait for the final `None`.
    fn release_if_read(&mut self) {
        if let Inner::Upstream(body) = &self.inner
            && body.is_end_stream()
            && let Some(pool_return) = self.pool_return.take()
        {
            pool_return.release();
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let res = match &mut this.inner {
            Inner::Upstream(body) => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(None) => {
                    if let Some(pool_return) = this.pool_return.take() {
                        pool_return.release();
                    }
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Ok(frame))) => {
                    this.release_if_read();
                    Poll::Ready(Some(Ok(frame)))
                }
                other => other,
            },
            Inner::Local(body) => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        };
        if matches!(res, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.finish = None;
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream(body) => body.is_end_stream(),
            Inner::Local(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream(body) => body.size_hint(),
            Inner::Local(body) => body.size_hint(),
        }
    }
}

fn local_response(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Does a `Connection` header list this token?
fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Which hop-by-hop headers a message carries, found in one pass.
#[derive(Default)]
struct HopByHop {
    connection: bool,
    keep_alive: bool,
    proxy_connection: bool,
    transfer_encoding: bool,
    proxy_authenticate: bool,
    expect: bool,
    te: bool,
    upgrade: bool,
}

impl HopByHop {
    fn scan(headers: &HeaderMap) -> HopByHop {
        let mut found = HopByHop::default();
        // Standard names compare as enum tags, so this walk is cheap; most
        // requests carry none of these and are done after it.
        for name in headers.keys() {
            if name == header::CONNECTION {
                found.connection = true;
            } else if name == header::TRANSFER_ENCODING {
                found.transfer_encoding = true;
            } else if name == header::TE {
                found.te = true;
            } else if name == header::UPGRADE {
                found.upgrade = true;
            } else if name == header::EXPECT {
                found.expect = true;
            } else if name == header::PROXY_AUTHENTICATE {
                found.proxy_authenticate = true;
            } else if name == KEEP_ALIVE {
                found.keep_alive = true;
            } else if name == PROXY_CONNECTION {
                found.proxy_connection = true;
            }
        }
        found
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1) and whatever `Connection`
/// names. With `upgrade`, `Upgrade` survives and `Connection: upgrade` is
/// set again so the app sees the handshake.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let found = HopByHop::scan(headers);
    if found.connection {
        // Only tokens beyond the usual ones cost an allocation.
        let extra: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| {
                !t.is_empty()
                    && !t.eq_ignore_ascii_case("close")
                    && !t.eq_ignore_ascii_case("keep-alive")
                    && !t.eq_ignore_ascii_case("upgrade")
            })
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in extra {
            // `te: trailers` is end to end for gRPC even if a client lists it.
            if name != header::TE {
                headers.remove(name);
            }
        }
        headers.remove(header::CONNECTION);
    }
    if found.keep_alive {
        headers.remove(&KEEP_ALIVE);
    }
    if found.proxy_connection {
        headers.remove(&PROXY_CONNECTION);
    }
    if found.transfer_encoding {
        headers.remove(header::TRANSFER_ENCODING);
    }
    if found.proxy_authenticate {
        headers.remove(header::PROXY_AUTHENTICATE);
    }
    if found.expect {
        // The proxy answers `Expect: 100-continue` itself when it reads the body.
        headers.remove(header::EXPECT);
    }
    if found.te
        && let Some(te) = headers.get(header::TE)
    {
        // Only "trailers" may cross (HTTP/2 forbids anything else).
        let trailers = te
            .to_str()
            .map(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
            .unwrap_or(false);
        if trailers {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        } else {
            headers.remove(header::TE);
        }
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else if found.upgrade {
        headers.remove(header::UPGRADE);
    }
}

/// Remembers where this HTTP/1 request ends on the wire, for the header
/// timer of the next one: the head's end (found by the IO wrapper) plus
/// the Content-Length; unknown for chunked bodies (the stream tail tells).
fn note_message_end(act: &ConnActivity, headers: &HeaderMap) {
    let head_end = act.head_end.swap(UNKNOWN, Ordering::Relaxed);
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
    act.message_end.store(end, Ordering::Relaxed);
}

/// Keeps only the `Upgrade` protocols in `allowed` (names compared
/// without case and without `/version`); false when none is left.
fn allow_upgrade(headers: &mut HeaderMap, allowed: &[String]) -> bool {
    let offered: Vec<&str> = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let kept: Vec<&str> = offered
        .iter()
        .copied()
        .filter(|p| {
            let name = p.split('/').next().unwrap_or(p).trim();
            allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
        .collect();
    if kept.is_empty() {
        return false;
    }
    if kept.len() != offered.len() {
        match HeaderValue::from_str(&kept.join(", ")) {
            Ok(value) => {
                headers.insert(header::UPGRADE, value);
            }
            Err(_) => return false,
        }
    }
    true
}

/// The answer to a request whose body failed on the client's side. It is
/// counted as the client's (never an upstream error, never a breaker
/// failure); a client that left gets nothing, as there is nobody to read it.
fn client_fault(
    ctx: &ConnCtx,
    version: Version,
    fault: BodyFault,
    mut permit: PermitSlot,
    request: RequestGuard,
) -> Response<ProxyBody> {
    let metrics = &ctx.shared.metrics;
    let (status, text) = match fault {
        BodyFault::TooLarge => {
            metrics.body_too_large();
            (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n")
        }
        BodyFault::Timeout => {
            metrics.client_timeout(ClientTimeout::BodyRead);
            (
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time\n",
            )
        }
        BodyFault::BadBody => {
            metrics.client_error(ClientError::BadBody);
            (StatusCode::BAD_REQUEST, "malformed request body\n")
        }
        BodyFault::Gone => {
            metrics.client_error(ClientError::Gone);
            (StatusCode::BAD_REQUEST, "request body incomplete\n")
        }
    };
    let permit = permit.record(UpstreamOutcome::ClientFault);
    let mut resp = local_response(status, text);
    // The rest of the body cannot be trusted to frame the next request.
    if version != Version::HTTP_2 {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    respond_local(ctx, version, resp, request, permit)
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

/// Adds `Connection: close` to HTTP/1 responses while draining, so
/// keep-alive clients move to other pods before the listener closes.
fn finish_response<B>(ctx: &ConnCtx, version: Version, resp: &mut Response<B>) {
    ctx.shared.metrics.response(resp.status());
    if version != Version::HTTP_2
        && resp.status() != StatusCode::SWITCHING_PROTOCOLS
        && ctx.shared.drain.phase() != Phase::Serving
    {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

pub(crate) async fn handle(
    ctx: Arc<ConnCtx>,
    mut req: Request<DownstreamBody>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let shared = ctx.shared.clone();
    shared.metrics.request_started();
    ctx.act.inflight.fetch_add(1, Ordering::Relaxed);
    ctx.act.requests.fetch_add(1, Ordering::Relaxed);
    let request_guard = RequestGuard {
        ctx: ctx.clone(),
        started,
    };
    let live = shared.live.load_full();
    let version = req.version();
    if version != Version::HTTP_2 {
        note_message_end(&ctx.act, req.headers());
    }

    // 413 before anything is sent upstream when the length is declared.
    let max_body = live.config.limits.max_request_body_bytes;
    if max_body > 0
        && let Some(len) = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        && len > max_body
    {
        shared.metrics.body_too_large();
        let mut resp = local_response(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        // The unread body would otherwise be drained by hyper first.
        if version != Version::HTTP_2 {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return respond_local(&ctx, version, resp, request_guard, None);
    }

    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let route = live.routes.select(req.method(), host, req.uri().path());
    let permit = match route.admit().await {
        Ok(permit) => permit,
        Err(rejection) => {
            shared.metrics.circuit_rejection();
            tracing::debug!(
                route = route.name(),
                reason = rejection.reason(),
                "request rejected by the circuit"
            );
            let resp = route.fallback(&rejection);
            return respond_local(&ctx, version, resp, request_guard, None);
        }
    };
    let mut permit = PermitSlot(Some(permit));

    let asks_upgrade = version == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && connection_has(req.headers(), "upgrade");
    let wants_upgrade =
        asks_upgrade && allow_upgrade(req.headers_mut(), &live.config.upgrade_protocols);
    if asks_upgrade && !wants_upgrade {
        // Answered as a server that does not speak the protocol would:
        // the request goes on as a plain one, without Upgrade.
        shared.metrics.upgrade_ignored();
        req.headers_mut().remove(&HTTP2_SETTINGS);
    }
    let downstream_upgrade = wants_upgrade.then(|| hyper::upgrade::on(&mut req));

    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, wants_upgrade);
    match parts.headers.get_mut(&X_FORWARDED_FOR) {
        Some(existing) => {
            let mut joined = Vec::with_capacity(existing.len() + 2 + ctx.peer_ip.len());
            joined.extend_from_slice(existing.as_bytes());
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(ctx.peer_ip.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&joined) {
                *existing = v;
            }
        }
        None => {
            parts
                .headers
                .insert(X_FORWARDED_FOR.clone(), ctx.peer_ip.clone());
        }
    }
    // The sidecar itself only ever speaks cleartext. A client's own
    // "https" is believed only with `forwarded.trustedHops` (a
    // TLS-terminating balancer in front), or any client could claim it.
    if live.config.forwarded.trusted_hops == 0 || !parts.headers.contains_key(&X_FORWARDED_PROTO) {
        parts
            .headers
            .insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
    // The app sees the host the client asked for (HTTP/2 carries it as
    // :authority, an HTTP/1 app needs Host); only a client that named none
    // (HTTP/1.0) gets the upstream's, as hyper's client would set.
    let upstream = shared.upstreams.pick();
    if !parts.headers.contains_key(header::HOST) {
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| upstream.host().clone());
        parts.headers.insert(header::HOST, host);
    }

    let h2 = version == Version::HTTP_2;
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let uri = if h2 {
        // HTTP/2 needs an absolute URI (:scheme, :authority, :path).
        let mut uri_parts = http::uri::Parts::default();
        uri_parts.scheme = Some(upstream.scheme());
        uri_parts.authority = Some(
            parts
                .uri
                .authority()
                .cloned()
                .unwrap_or_else(|| upstream.authority().clone()),
        );
        uri_parts.path_and_query = Some(path_and_query);
        Uri::from_parts(uri_parts)
    } else {
        // HTTP/1.1 to the app in origin form, as a client talks to a server.
        Ok(Uri::from(path_and_query))
    };
    parts.uri = match uri {
        Ok(uri) => uri,
        Err(_) => {
            let resp = local_response(StatusCode::BAD_REQUEST, "bad request target\n");
            permit.record(UpstreamOutcome::Cancelled);
            return respond_local(&ctx, version, resp, request_guard, None);
        }
    };
    parts.version = if h2 {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
    let limits = &live.config.limits;
    // HTTP/2 streams (gRPC client streaming) may idle for long by design;
    // the trickling-body guard is for HTTP/1, where a slow body holds a
    // whole connection and an app connection.
    let body_timeout = (!h2 && !wants_upgrade && !limits.body_read_timeout.get().is_zero())
        .then(|| (limits.body_read_timeout.get(), limits.body_min_rate));
    let (body, body_watch) =
        UpstreamBody::new(body, (max_body > 0).then_some(max_body), body_timeout);
    let upstream_req = Request::from_parts(parts, body);
    let send = async {
        if h2 {
            upstream
                .send_h2(upstream_req)
                .await
                .map(|response| UpstreamResponse {
                    response,
                    pool_return: None,
                })
        } else {
            upstream.send_h1(upstream_req).await
        }
    };
    let result = match route.timeout() {
        Some(limit) => match tokio::time::timeout(limit, send).await {
            Ok(r) => r,
            Err(_) => {
                // Still waiting for the client's body: its slowness, not the app's.
                if let Some(fault) = body_watch
                    .fault()
                    .or_else(|| body_watch.waiting_on_client().then_some(BodyFault::Timeout))
                {
                    return client_fault(&ctx, version, fault, permit, request_guard);
                }
                shared.metrics.upstream_timeout();
                let permit = permit.record(UpstreamOutcome::Timeout);
                let resp = local_response(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n");
                return respond_local(&ctx, version, resp, request_guard, permit);
            }
        },
        None => send.await,
    };

    let (mut resp, pool_return) = match result {
        Ok(UpstreamResponse {
            response,
            pool_return,
        }) => (response, pool_return),
        Err(err) => {
            // The request body failed on the client's side (limit, time,
            // framing, client gone): the app did nothing wrong.
            if let Some(fault) = body_watch.fault() {
                tracing::debug!(error = %err, source = ?err.source(), "request body failed on the client's side");
                return client_fault(&ctx, version, fault, permit, request_guard);
            }
            // The app is restarting and did not come back within the hold
            // (app.rs): 503 + Retry-After, and no breaker failure.
            if let Some(resp) = crate::app::hold_expired_response(&err) {
                let permit = permit.record(UpstreamOutcome::Cancelled);
                return respond_local(&ctx, version, resp, request_guard, permit);
            }
            shared.metrics.upstream_error();
            tracing::debug!(error = %err, source = ?err.source(), "upstream request failed");
            let permit = permit.record(UpstreamOutcome::ConnectError);
            let resp = local_response(StatusCode::BAD_GATEWAY, "upstream unavailable\n");
            return respond_local(&ctx, version, resp, request_guard, permit);
        }
    };
    let permit = permit.record(UpstreamOutcome::Status(resp.status()));

    let upgraded = resp.status() == StatusCode::SWITCHING_PROTOCOLS && downstream_upgrade.is_some();
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS && !upgraded {
        // The app switched protocols nobody asked it to (or one not
        // allowed): never hand the client a raw tunnel past the proxy.
        shared.metrics.upstream_error();
        let resp = local_response(
            StatusCode::BAD_GATEWAY,
            "upstream switched protocols unasked\n",
        );
        return respond_local(&ctx, version, resp, request_guard, permit);
    }
    if let (true, Some(downstream)) = (upgraded, downstream_upgrade) {
        let upstream = hyper::upgrade::on(&mut resp);
        spawn_tunnel(shared.clone(), downstream, upstream);
    }
    strip_hop_by_hop(resp.headers_mut(), upgraded);
    // Answer in the client's HTTP version, not the app's (an HTTP/1.0 app
    // must not turn off keep-alive for HTTP/1.1 clients).
    *resp.version_mut() = version;
    finish_response(&ctx, version, &mut resp);
    resp.map(|body| {
        ProxyBody::upstream(
            body,
            Finish {
                _request: request_guard,
                _permit: permit,
            },
            pool_return,
        )
    })
}

fn respond_local(
    ctx: &ConnCtx,
    version: Version,
    mut resp: Response<Full<Bytes>>,
    request: RequestGuard,
    permit: Option<Permit>,
) -> Response<ProxyBody> {
    finish_response(ctx, version, &mut resp);
    resp.map(|body| {
        ProxyBody::local(
            body,
            Some(Finish {
                _request: request,
                _permit: permit,
            }),
        )
    })
}

/// Joins an upgraded downstream connection (WebSocket, ...) to the app's
/// upgraded connection. The tunnel counts as an open connection for the
/// drain: it is left alone until the deadline, then closed and counted.
fn spawn_tunnel(
    shared: Arc<Shared>,
    downstream: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
) {
    let mut guard = shared.drain.track();
    shared.metrics.upgrade();
    tokio::spawn(async move {
        let (down, up) = match tokio::try_join!(downstream, upstream) {
            Ok(pair) => pair,
            Err(err) => {
                tracing::debug!(error = %err, "upgrade did not complete");
                return;
            }
        };
        let mut down = TokioIo::new(down);
        let mut up = TokioIo::new(up);
        let mut drain_rx = shared.drain.subscribe();
        let idle = shared.live.load().config.limits.tunnel_idle_timeout.get();
        tokio::select! {
            end = crate::tcp::copy_with_idle(&mut down, &mut up, idle) => match end {
                crate::tcp::TunnelEnd::Closed(Err(err)) => {
                    tracing::debug!(error = %err, "upgraded connection ended with an error");
                }
                crate::tcp::TunnelEnd::Closed(Ok(_)) => {}
                crate::tcp::TunnelEnd::Idle => {
                    shared.metrics.client_timeout(ClientTimeout::TunnelIdle);
                    tracing::debug!("upgraded connection idle past limits.tunnelIdleTimeout; closing");
                }
            },
            _ = drain_rx.wait_for(|s| s.force_close) => {
                tracing::debug!("drain deadline: closing upgraded connection");
                guard.mark_forced();
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_connection_tokens_with_them() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-end-to-end", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert!(h.get("keep-alive").is_none());
        assert!(h.get(header::UPGRADE).is_none());
        assert_eq!(
            h.get(header::TE).map(|v| v.as_bytes()),
            Some(&b"trailers"[..])
        );
        assert!(h.get("x-end-to-end").is_some());
    }

    #[test]
    fn upgrade_handshake_survives_stripping() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(connection_has(&h, "upgrade"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(
            h.get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            h.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
    }
}
