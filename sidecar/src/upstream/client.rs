//! The client to one app instance: connects (holding requests while the
//! app restarts), pools HTTP/1 connections, and keeps a shared HTTP/2
//! connection plus one for each downstream connection moved off it, or
//! sends HTTP/2 requests as HTTP/1.1 to an app that does not speak HTTP/2
//! (see [`super::h2`]).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

use super::downgrade::{is_grpc, to_http1};
use super::h2::{AppProtocol, H2Slot, Route, SNIFF_TIMEOUT, Sniff, affinity};
use super::h2conn::{H2Sender, SendError};
use super::idle::{IdleConn, IdleStack};
use super::{AppBody, UpstreamBody, UpstreamStream};
use crate::app::AppWatch;
use crate::config::{Endpoint, UpstreamPoolConfig};
use crate::error::{Error, Result};

/// The authority (and Host for clients that sent none) used for a Unix
/// socket upstream, which has no host name of its own.
const UNIX_AUTHORITY: &str = "localhost";

type H1Sender = http1::SendRequest<UpstreamBody>;

impl IdleConn for H1Sender {
    fn looks_open(&self) -> bool {
        !self.is_closed()
    }
}

/// Hands an HTTP/1 connection back to the pool once the response body it
/// carries has ended cleanly. Dropped early (client gone, error), it drops
/// the connection instead: a half-read response leaves the socket unusable.
pub struct PoolReturn {
    pool: Arc<IdleStack<H1Sender>>,
    sender: Option<H1Sender>,
}

impl PoolReturn {
    /// The response body ended cleanly.
    pub fn release(mut self) {
        if let Some(sender) = self.sender.take().filter(|s| !s.is_closed()) {
            self.pool.push(sender);
        }
    }

    /// For an answer whose body nobody will report the end of (an HTTP/2
    /// request sent as HTTP/1.1, whose response travels as hyper's
    /// `Incoming`): hyper's connection is ready for the next request only
    /// once this response was read to its end; a body dropped early closes
    /// the connection, and it is not pooled.
    fn release_when_read(mut self) {
        if let Some(mut sender) = self.sender.take() {
            let pool = self.pool.clone();
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.push(sender);
                }
            });
        }
    }
}

/// Each upstream's id, so a downstream connection's HTTP/2 slot knows which
/// app instance its connection goes to.
static NEXT_UPSTREAM_ID: AtomicU64 = AtomicU64::new(0);

/// A response from the app, plus the way its connection goes back to the
/// pool (HTTP/1 only).
pub struct UpstreamResponse {
    pub response: Response<AppBody>,
    pub pool_return: Option<PoolReturn>,
}

pub struct Upstream {
    id: u64,
    endpoint: Endpoint,
    authority: Authority,
    host: HeaderValue,
    connect_timeout: Duration,
    h1: Arc<IdleStack<H1Sender>>,
    /// Idle raw sockets of the HTTP/1.1 fast path (proxy/h1).
    raw: crate::proxy::h1::RawPool,
    /// The HTTP/2 connection shared by downstream connections (and used
    /// by requests that come with no placement).
    h2: H2Slot,
    h2_generation: AtomicU64,
    /// Whether the app speaks HTTP/2.
    protocol: AppProtocol,
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
        let h1 = IdleStack::new(pool.max_idle, pool.idle_timeout.get());
        let raw = crate::proxy::h1::RawPool::new(pool.max_idle, pool.idle_timeout.get());
        Ok(Upstream {
            id: NEXT_UPSTREAM_ID.fetch_add(1, Ordering::Relaxed),
            endpoint: endpoint.clone(),
            authority,
            host,
            connect_timeout: pool.connect_timeout.get(),
            h1,
            raw,
            h2: H2Slot::shared(),
            h2_generation: AtomicU64::new(0),
            protocol: AppProtocol::default(),
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
        if let (Some(app), Some(err)) = (self.app.as_ref(), err)
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
        // Boxed: see send_h2_inner.
        let mut sender = Box::pin(self.connect_h1()).await?;
        match sender.try_send_request(req).await {
            Ok(response) => Ok(self.h1_response(response, sender)),
            Err(mut err) => {
                let _ = err.take_message();
                Err(Error::Upstream(err.into_error()))
            }
        }
    }

    fn h1_response(&self, response: Response<Incoming>, sender: H1Sender) -> UpstreamResponse {
        // A 101 turns the connection into a tunnel; it never comes back.
        let pool_return =
            (response.status() != http::StatusCode::SWITCHING_PROTOCOLS).then(|| PoolReturn {
                pool: self.h1.clone(),
                sender: Some(sender),
            });
        UpstreamResponse {
            response: response.map(AppBody::Http1),
            pool_return,
        }
    }

    async fn connect_h1(&self) -> Result<H1Sender> {
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

    /// Sends an HTTP/2 request (absolute URI): on the app connection of
    /// the downstream connection it came on, or as HTTP/1.1 to an app that
    /// does not speak HTTP/2.
    ///
    /// Not an `async fn`: one would keep the request (344 bytes) in its
    /// state for the whole wait after handing it on.
    pub fn send_h2(
        &self,
        req: super::SentRequest,
    ) -> impl Future<Output = Result<Response<AppBody>>> + '_ {
        use futures_util::FutureExt;
        self.send_h2_inner(req).map(|res| {
            self.note_lost(res.as_ref().err());
            res
        })
    }

    // The hot path (an open connection, the request sent once) is the only
    // one inlined here: connecting, the second try and HTTP/1.1 to the app
    // are boxed, because this future is part of every HTTP/2 stream's
    // future, which is moved into its box when the stream is accepted (its
    // size was once most of a request's cost).
    async fn send_h2_inner(&self, req: super::SentRequest) -> Result<Response<AppBody>> {
        // Read when first polled: the stream's affinity is a task-local
        // set around the request's future (http2/stream.rs).
        let affinity = affinity();
        let slot = match affinity.as_deref() {
            Some(affinity) => affinity.slot(&self.h2),
            None => &self.h2,
        };
        let (id, sender) = match slot.current(self.id) {
            Some(current) => current,
            None => match Box::pin(self.h2_sender(slot)).await? {
                Some(current) => current,
                None => return Box::pin(self.send_as_http1(super::unbox(req))).await,
            },
        };
        let req = match sender.send(req).await {
            Ok(response) => return Ok(response.map(AppBody::Http2)),
            Err(SendError::Unsent { req, err }) => {
                tracing::debug!(error = %err, "upstream HTTP/2 connection refused the stream; sending on a new one");
                req
            }
            Err(SendError::Failed(err)) => return Err(Error::upstream_h2(err)),
        };
        // The connection closed or refused the stream before it was sent
        // (the app's GOAWAY): retire it and send once more on a new one.
        slot.retire(id);
        Box::pin(self.send_h2_again(slot, req)).await
    }

    async fn send_h2_again(
        &self,
        slot: &H2Slot,
        req: super::SentRequest,
    ) -> Result<Response<AppBody>> {
        let Some((_, sender)) = self.h2_sender(slot).await? else {
            return self.send_as_http1(super::unbox(req)).await;
        };
        match sender.send(req).await {
            Ok(response) => Ok(response.map(AppBody::Http2)),
            Err(SendError::Unsent { err, .. } | SendError::Failed(err)) => {
                Err(Error::upstream_h2(err))
            }
        }
    }

    /// An HTTP/2 request to an app that answered the preface as HTTP/1.1.
    async fn send_as_http1(&self, req: Request<UpstreamBody>) -> Result<Response<AppBody>> {
        if is_grpc(req.headers()) {
            return Err(Error::UpstreamProtocol {
                endpoint: self.endpoint.to_string(),
                reason: "the app speaks HTTP/1.1 only; gRPC needs HTTP/2 to the app",
            });
        }
        let answer = self.send_h1_inner(to_http1(req, &self.host)).await?;
        if let Some(pool_return) = answer.pool_return {
            pool_return.release_when_read();
        }
        Ok(answer.response)
    }

    /// The slot's open connection, or a new one; `None` when the app speaks
    /// HTTP/1.1 only.
    async fn h2_sender(&self, slot: &H2Slot) -> Result<Option<(u64, H2Sender)>> {
        if let Some(current) = slot.current(self.id) {
            return Ok(Some(current));
        }
        if self.protocol.route() == Route::Http1 {
            return Ok(None);
        }
        let _asking = self.protocol.asking();
        let _connecting = slot.connecting.lock().await;
        if let Some(current) = slot.current(self.id) {
            return Ok(Some(current));
        }
        let stream = self.connect().await?;
        let (stream, heard) = Sniff::new(stream);
        // Fixed windows, not an adaptive one (which keeps the stream
        // window equal to the connection's): see super::h2.
        let (stream_window, conn_window) = slot.windows();
        let sender = H2Sender::handshake(stream, stream_window, conn_window);
        // The connection's task writes the preface at once; the app's
        // first bytes say whether it is an HTTP/2 server. A closed channel
        // is a connection that ended before any answer.
        let heard = match tokio::time::timeout(SNIFF_TIMEOUT, heard).await {
            Ok(heard) => Some(heard.unwrap_or(super::h2::Heard::Closed)),
            Err(_) => None,
        };
        if !self.protocol.learn(heard) {
            return Ok(None);
        }
        let id = self.h2_generation.fetch_add(1, Ordering::Relaxed);
        slot.install(self.id, id, sender.clone());
        Ok(Some((id, sender)))
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
