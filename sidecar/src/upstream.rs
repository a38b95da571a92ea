//! The pooled keep-alive connections from the sidecar to the app.
//!
//! The app is one endpoint (TCP or a Unix socket), so the pool is ours and
//! small instead of hyper-util's general-purpose client (which hashes a pool
//! key, boxes futures and hands every request through a channel):
//!
//! - HTTP/1.1: a LIFO stack of idle `http1::SendRequest` handles. The most
//!   recently used socket goes out first (warm, and the old ones age out).
//!   A connection goes back on the stack only once its response body ended
//!   cleanly; up to `upstreamPool.maxIdle` wait there, each for at most
//!   `upstreamPool.idleTimeout`, which must stay below the app's own
//!   keep-alive timeout so the proxy never reuses a socket the app is
//!   closing. If a pooled socket turns out closed before the request was
//!   written, the request goes again on a fresh connection.
//! - HTTP/2 (prior knowledge, for HTTP/2 and gRPC downstream requests): one
//!   shared multiplexed connection, replaced when it closes or refuses new
//!   streams (the app's GOAWAY), so streams stay multiplexed end to end.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::app::AppWatch;
use crate::config::{Endpoint, UpstreamPoolConfig};
use crate::error::{Error, Result};

/// What went wrong on the client's side of a request body, as the body
/// itself saw it. The proxy reads it when the app exchange fails: a failed
/// body is the client's fault, never the app's (see [`BodyWatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BodyFault {
    /// Over `limits.maxRequestBodyBytes` (413).
    TooLarge = 1,
    /// Slower than `limits.bodyReadTimeout` allows (408).
    Timeout = 2,
    /// Malformed framing: an invalid chunk size, bad chunk ends (400).
    BadBody = 3,
    /// The client closed or reset before the body was complete.
    Gone = 4,
}

impl BodyFault {
    fn from_u8(v: u8) -> Option<BodyFault> {
        match v {
            1 => Some(Self::TooLarge),
            2 => Some(Self::Timeout),
            3 => Some(Self::BadBody),
            4 => Some(Self::Gone),
            _ => None,
        }
    }
}

/// The proxy's view of its request body's fate; the body keeps writing
/// into it after it was handed to the app connection's task.
pub struct BodyWatch(Arc<BodyState>);

#[derive(Default)]
struct BodyState {
    fault: AtomicU8,
    /// The app connection asked for more and the client had nothing yet.
    waiting_on_client: AtomicBool,
}

impl BodyWatch {
    /// The first client-side fault of the body, if any.
    pub fn fault(&self) -> Option<BodyFault> {
        BodyFault::from_u8(self.0.fault.load(Ordering::Acquire))
    }

    /// Whether the body was, when last polled, waiting for the client's
    /// bytes (rather than the app not reading): a route timeout then is
    /// the client's slowness, not the app's.
    pub fn waiting_on_client(&self) -> bool {
        self.0.waiting_on_client.load(Ordering::Acquire)
    }
}

/// The error an [`UpstreamBody`] ends with; the app connection fails with
/// it, and the proxy tells the client's fault apart through [`BodyWatch`].
#[derive(Debug)]
pub struct BodyError {
    fault: BodyFault,
    source: Option<BoxError>,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.fault {
            BodyFault::TooLarge => "request body over limits.maxRequestBodyBytes",
            BodyFault::Timeout => "request body slower than limits.bodyReadTimeout allows",
            BodyFault::BadBody => "malformed request body",
            BodyFault::Gone => "client went away mid-body",
        };
        match &self.source {
            Some(source) => write!(f, "{what}: {source}"),
            None => f.write_str(what),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The body read time limit: the deadline is `timeout` after the start,
/// plus one second per `min_rate` bytes received. The timer is only made
/// when the body first has to wait for the client.
struct BodyDeadline {
    started: tokio::time::Instant,
    timeout: Duration,
    min_rate: u64,
    received: u64,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl BodyDeadline {
    fn deadline(&self) -> tokio::time::Instant {
        let earned = if self.min_rate == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(self.received as f64 / self.min_rate as f64)
        };
        self.started + self.timeout + earned
    }

    /// Ready once the deadline passed (re-armed while uploads earn time).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let deadline = self.deadline();
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.deadline() < deadline {
                sleep.as_mut().reset(deadline);
            }
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) if self.deadline() > tokio::time::Instant::now() => continue,
                other => return other,
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body as the client sends it: hyper's for HTTP/1, the h2
/// crate's stream for HTTP/2 (see http2.rs).
pub enum DownstreamBody {
    Http1(Incoming),
    Http2(crate::http2::H2Body),
}

/// A downstream body that failed, and whether the client simply went away.
pub struct DownstreamError {
    gone: bool,
    source: BoxError,
}

impl http_body::Body for DownstreamBody {
    type Data = bytes::Bytes;
    type Error = DownstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, DownstreamError>>> {
        match self.get_mut() {
            DownstreamBody::Http1(body) => Pin::new(body).poll_frame(cx).map_err(|err| {
                // hyper calls a body cut short by EOF or a reset
                // "incomplete"/"canceled"; anything else is bad framing.
                let gone = err.is_incomplete_message() || err.is_canceled();
                DownstreamError {
                    gone,
                    source: Box::new(err),
                }
            }),
            DownstreamBody::Http2(body) => Pin::new(body).poll_frame(cx).map_err(|err| {
                // The client's RST_STREAM, a GOAWAY or a broken socket is
                // a client gone; an error h2 found in the stream itself
                // (a length that does not add up) is a bad body.
                let gone = err.is_io() || err.is_go_away() || (err.is_reset() && err.is_remote());
                DownstreamError {
                    gone,
                    source: Box::new(err),
                }
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownstreamBody::Http1(body) => body.is_end_stream(),
            DownstreamBody::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            DownstreamBody::Http1(body) => body.size_hint(),
            DownstreamBody::Http2(body) => body.size_hint(),
        }
    }
}

/// What the proxy sends upstream: the downstream body, with the body
/// length limit and read time limit, and the fault it ended with recorded
/// for the proxy. Unboxed: one wrapper, no allocation unless it must wait.
pub struct UpstreamBody {
    inner: DownstreamBody,
    /// Bytes still allowed under `limits.maxRequestBodyBytes`.
    remaining: Option<u64>,
    deadline: Option<BodyDeadline>,
    state: Arc<BodyState>,
}

impl UpstreamBody {
    /// `limit`: most bytes allowed; `timeout`: (bodyReadTimeout, bodyMinRate).
    pub fn new(
        inner: DownstreamBody,
        limit: Option<u64>,
        timeout: Option<(Duration, u64)>,
    ) -> (UpstreamBody, BodyWatch) {
        let state = Arc::new(BodyState::default());
        let deadline = timeout
            .filter(|_| !http_body::Body::is_end_stream(&inner))
            .map(|(timeout, min_rate)| BodyDeadline {
                started: tokio::time::Instant::now(),
                timeout,
                min_rate,
                received: 0,
                sleep: None,
            });
        let body = UpstreamBody {
            inner,
            remaining: limit,
            deadline,
            state: state.clone(),
        };
        (body, BodyWatch(state))
    }

    fn fail(
        &mut self,
        fault: BodyFault,
        source: Option<BoxError>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, BodyError>>> {
        let _ =
            self.state
                .fault
                .compare_exchange(0, fault as u8, Ordering::AcqRel, Ordering::Acquire);
        self.state.waiting_on_client.store(false, Ordering::Release);
        self.deadline = None;
        Poll::Ready(Some(Err(BodyError { fault, source })))
    }
}

impl http_body::Body for UpstreamBody {
    type Data = bytes::Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let waiting = polled.is_pending();
        if this.state.waiting_on_client.load(Ordering::Relaxed) != waiting {
            this.state
                .waiting_on_client
                .store(waiting, Ordering::Release);
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if let Some(remaining) = this.remaining.as_mut() {
                        if n > *remaining {
                            return this.fail(BodyFault::TooLarge, None);
                        }
                        *remaining -= n;
                    }
                    if let Some(deadline) = this.deadline.as_mut() {
                        deadline.received += n;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                let fault = if err.gone {
                    BodyFault::Gone
                } else {
                    BodyFault::BadBody
                };
                this.fail(fault, Some(err.source))
            }
            Poll::Ready(None) => {
                this.deadline = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut()
                    && deadline.poll_expired(cx).is_ready()
                {
                    return this.fail(BodyFault::Timeout, None);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The authority (and Host for clients that sent none) used for a Unix
/// socket upstream, which has no host name of its own.
const UNIX_AUTHORITY: &str = "localhost";

/// A connected socket to the app.
pub enum UpstreamStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(s) => s.is_write_vectored(),
            Self::Unix(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// An idle HTTP/1 connection on the stack.
struct IdleConn {
    sender: http1::SendRequest<UpstreamBody>,
    since: Instant,
}

/// The HTTP/1 idle stack, shared with the response bodies that return
/// connections to it.
struct H1Pool {
    idle: Mutex<Vec<IdleConn>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl H1Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<IdleConn>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently returned live connection, if any. Expired and
    /// closed ones met on the way are dropped (which closes them).
    fn pop(&self) -> Option<http1::SendRequest<UpstreamBody>> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some(conn) = idle.pop() {
            if conn.sender.is_closed() {
                continue;
            }
            if now.saturating_duration_since(conn.since) >= self.idle_timeout {
                // Everything below is older still.
                idle.clear();
                return None;
            }
            return Some(conn.sender);
        }
        None
    }

    fn push(&self, sender: http1::SendRequest<UpstreamBody>) {
        if sender.is_closed() || self.max_idle == 0 {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= self.max_idle {
            return;
        }
        idle.push(IdleConn {
            sender,
            since: Instant::now(),
        });
    }

    /// Closes connections idle for longer than the timeout (the oldest sit
    /// at the bottom of the stack).
    fn evict_expired(&self) {
        let now = Instant::now();
        let mut idle = self.lock();
        let expired = idle
            .iter()
            .take_while(|c| now.saturating_duration_since(c.since) >= self.idle_timeout)
            .count();
        idle.drain(..expired);
        idle.retain(|c| !c.sender.is_closed());
    }
}

/// Hands an HTTP/1 connection back to the pool once the response body it
/// carries has ended cleanly. Dropped early (client gone, error), it drops
/// the connection instead: a half-read response leaves the socket unusable.
pub struct PoolReturn {
    pool: Arc<H1Pool>,
    sender: Option<http1::SendRequest<UpstreamBody>>,
}

impl PoolReturn {
    /// The response body ended cleanly.
    pub fn release(mut self) {
        if let Some(sender) = self.sender.take() {
            self.pool.push(sender);
        }
    }
}

/// A response from the app, plus the way its connection goes back to the
/// pool (HTTP/1 only).
pub struct UpstreamResponse {
    pub response: Response<Incoming>,
    pub pool_return: Option<PoolReturn>,
}

pub struct Upstream {
    endpoint: Endpoint,
    authority: Authority,
    host: HeaderValue,
    connect_timeout: Duration,
    h1: Arc<H1Pool>,
    /// Idle raw sockets of the HTTP/1.1 fast path (proxy/h1).
    raw: Arc<crate::proxy::h1::RawPool>,
    /// The shared HTTP/2 connection, if one is up, with its generation.
    h2: Mutex<Option<(u64, http2::SendRequest<UpstreamBody>)>>,
    h2_generation: AtomicU64,
    /// Held while a new HTTP/2 connection is made, so a burst of streams
    /// after a GOAWAY opens one connection, not one each.
    h2_connecting: tokio::sync::Mutex<()>,
    /// The app's reachability (one upstream only): a refused connect is
    /// held until the app is back (see app.rs).
    app: Option<Arc<AppWatch>>,
}

impl Upstream {
    pub fn new(
        endpoint: &Endpoint,
        pool: &UpstreamPoolConfig,
        app: Option<Arc<AppWatch>>,
    ) -> Result<Upstream> {
        let authority: Authority = match endpoint {
            Endpoint::Tcp(addr) => addr.to_string().parse().map_err(|e| {
                Error::Unsupported(format!("upstream: {addr} is not a URI authority: {e}"))
            })?,
            Endpoint::Unix(_) => Authority::from_static(UNIX_AUTHORITY),
        };
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| {
            Error::Unsupported(format!(
                "upstream: {authority} is not a Host header value: {e}"
            ))
        })?;
        let h1 = Arc::new(H1Pool {
            idle: Mutex::new(Vec::new()),
            max_idle: pool.max_idle,
            idle_timeout: pool.idle_timeout.get(),
        });
        spawn_reaper(&h1);
        let raw = crate::proxy::h1::RawPool::new(pool.max_idle, pool.idle_timeout.get());
        Ok(Upstream {
            endpoint: endpoint.clone(),
            authority,
            host,
            connect_timeout: pool.connect_timeout.get(),
            h1,
            raw,
            h2: Mutex::new(None),
            h2_generation: AtomicU64::new(0),
            h2_connecting: tokio::sync::Mutex::new(()),
            app,
        })
    }

    /// The app's address, for logs.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The authority of absolute request URIs (HTTP/2 `:authority` when the
    /// client sent none): `host:port`, or `localhost` for a Unix socket.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The Host header for an HTTP/1.0 client that sent none.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    pub fn scheme(&self) -> Scheme {
        Scheme::HTTP
    }

    /// Opens a new socket to the app. While the app refuses connections (its
    /// container is restarting) the caller is held until it is back, for at
    /// most `upstreamPool.holdTimeout`; then [`Error::AppDown`] (a 503).
    pub async fn connect(&self) -> Result<UpstreamStream> {
        let Some(app) = self.app.as_ref() else {
            return self.connect_once().await.map_err(|e| self.connect_error(e));
        };
        let started = tokio::time::Instant::now();
        let mut held = false;
        loop {
            match self.connect_once().await {
                Ok(stream) => {
                    app.observe(true);
                    if held {
                        app.hold_ended();
                        tracing::debug!(waited = ?started.elapsed(), "held request: the app is back, sending");
                    }
                    return Ok(stream);
                }
                Err(err) if crate::app::is_gone(&err) => {
                    app.observe(false);
                    if !app.holds() {
                        return Err(self.connect_error(err));
                    }
                    app.hold(started, !held).await?;
                    held = true;
                }
                Err(err) => return Err(self.connect_error(err)),
            }
        }
    }

    /// One connect, bounded by the connect timeout.
    async fn connect_once(&self) -> io::Result<UpstreamStream> {
        let connect = async {
            match &self.endpoint {
                Endpoint::Tcp(addr) => {
                    let stream = TcpStream::connect(addr).await?;
                    let _ = stream.set_nodelay(true);
                    // Detects an app that vanished without a FIN while the
                    // socket idles.
                    let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
                    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
                    Ok(UpstreamStream::Tcp(stream))
                }
                Endpoint::Unix(path) => UnixStream::connect(path).await.map(UpstreamStream::Unix),
            }
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(res) => res,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {} timed out", self.endpoint),
            )),
        }
    }

    fn connect_error(&self, source: io::Error) -> Error {
        Error::UpstreamConnect {
            endpoint: self.endpoint.to_string(),
            source,
        }
    }

    /// Sends an HTTP/1.1 request (origin-form URI) on a pooled connection,
    /// or a new one. Upgrades (WebSocket) work: such a connection is never
    /// pooled again.
    pub async fn send_h1(&self, req: Request<UpstreamBody>) -> Result<UpstreamResponse> {
        let res = self.send_h1_inner(req).await;
        self.note_lost(res.as_ref().err());
        res
    }

    /// The fast path's idle app connections.
    pub(crate) fn raw_pool(&self) -> &crate::proxy::h1::RawPool {
        &self.raw
    }

    /// The fast path lost a request the app had received (its connection
    /// died under it): counted, and the probe woken, as in `note_lost`.
    pub(crate) fn lost_in_flight(&self) {
        if let Some(app) = self.app.as_ref() {
            app.lost_in_flight();
        }
    }

    /// A request the app had received whose connection died is the app's
    /// loss (it died with it in flight): counted, and the probe woken.
    fn note_lost(&self, err: Option<&Error>) {
        if let (Some(app), Some(Error::Upstream(err))) = (self.app.as_ref(), err)
            && crate::app::is_lost_in_flight(err)
        {
            app.lost_in_flight();
        }
    }

    async fn send_h1_inner(&self, mut req: Request<UpstreamBody>) -> Result<UpstreamResponse> {
        // A pooled connection the app closed before our request was written
        // hands the request back; then it goes on a fresh connection. Each
        // pooled connection is tried once, so this ends.
        while let Some(mut sender) = self.h1.pop() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(response) => return Ok(self.h1_response(response, sender)),
                Err(err) => req = retry_or_fail(err)?,
            }
        }
        let mut sender = self.connect_h1().await?;
        match sender.try_send_request(req).await {
            Ok(response) => Ok(self.h1_response(response, sender)),
            Err(mut err) => {
                let _ = err.take_message();
                Err(Error::Upstream(err.into_error()))
            }
        }
    }

    fn h1_response(
        &self,
        response: Response<Incoming>,
        sender: http1::SendRequest<UpstreamBody>,
    ) -> UpstreamResponse {
        // A 101 turns the connection into a tunnel; it never comes back.
        let pool_return =
            (response.status() != http::StatusCode::SWITCHING_PROTOCOLS).then(|| PoolReturn {
                pool: self.h1.clone(),
                sender: Some(sender),
            });
        UpstreamResponse {
            response,
            pool_return,
        }
    }

    async fn connect_h1(&self) -> Result<http1::SendRequest<UpstreamBody>> {
        let stream = self.connect().await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Upstream)?;
        tokio::spawn(async move {
            if let Err(err) = conn.with_upgrades().await {
                tracing::debug!(error = %err, "upstream HTTP/1 connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Sends an HTTP/2 request (absolute URI) on the shared connection.
    pub async fn send_h2(&self, req: Request<UpstreamBody>) -> Result<Response<Incoming>> {
        let res = self.send_h2_inner(req).await;
        self.note_lost(res.as_ref().err());
        res
    }

    async fn send_h2_inner(&self, req: Request<UpstreamBody>) -> Result<Response<Incoming>> {
        let (id, mut sender) = self.h2_sender().await?;
        let req = match sender.ready().await {
            Ok(()) => match sender.try_send_request(req).await {
                Ok(response) => return Ok(response),
                Err(err) => retry_or_fail(err)?,
            },
            Err(_) => req,
        };
        // The connection closed or refused the stream before it was sent
        // (the app's GOAWAY): retire it and send once more on a new one.
        self.retire_h2(id);
        let (_, mut sender) = self.h2_sender().await?;
        sender.ready().await.map_err(Error::Upstream)?;
        match sender.try_send_request(req).await {
            Ok(response) => Ok(response),
            Err(mut err) => {
                let _ = err.take_message();
                Err(Error::Upstream(err.into_error()))
            }
        }
    }

    fn current_h2(&self) -> Option<(u64, http2::SendRequest<UpstreamBody>)> {
        let slot = self.h2.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .filter(|(_, s)| !s.is_closed())
            .map(|(id, s)| (*id, s.clone()))
    }

    /// Forgets connection `id` unless another request already replaced it.
    fn retire_h2(&self, id: u64) {
        let mut slot = self.h2.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|(current, _)| *current == id) {
            *slot = None;
        }
    }

    async fn h2_sender(&self) -> Result<(u64, http2::SendRequest<UpstreamBody>)> {
        if let Some(current) = self.current_h2() {
            return Ok(current);
        }
        let _connecting = self.h2_connecting.lock().await;
        if let Some(current) = self.current_h2() {
            return Ok(current);
        }
        let stream = self.connect().await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .adaptive_window(true)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Upstream)?;
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(error = %err, "upstream HTTP/2 connection ended with an error");
            }
        });
        let id = self.h2_generation.fetch_add(1, Ordering::Relaxed);
        *self.h2.lock().unwrap_or_else(PoisonError::into_inner) = Some((id, sender.clone()));
        Ok((id, sender))
    }
}

/// A request the connection gave back unsent may be retried; one it sent
/// (even partly) may not, because the app may have acted on it.
fn retry_or_fail(mut err: TrySendError<Request<UpstreamBody>>) -> Result<Request<UpstreamBody>> {
    match err.take_message() {
        Some(req) => {
            tracing::debug!(error = %err.error(), "pooled upstream connection was closed; retrying on another");
            Ok(req)
        }
        None => Err(Error::Upstream(err.into_error())),
    }
}

/// Closes idle connections past their timeout even when no request comes
/// to pop them. Holds the pool weakly, so it ends with the upstream.
fn spawn_reaper(pool: &Arc<H1Pool>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<H1Pool> = Arc::downgrade(pool);
    let period = (pool.idle_timeout / 2).max(Duration::from_millis(100));
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match weak.upgrade() {
                Some(pool) => pool.evict_expired(),
                None => return,
            }
        }
    });
}
