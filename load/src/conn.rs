//! Connection pools: keep-alive HTTP/1.1 and multiplexed HTTP/2 (h2c prior knowledge).
//!
//! The pools behave like a real client, because the point is to measure what a real client
//! sees during a rollout:
//! - connections are reused (keep-alive / multiplexing), and a connection the server closed
//!   is replaced by a new TCP connect through the Service address (kube-proxy picks a new
//!   endpoint for it);
//! - the only retry is the one every real client does: a request that was **never written**
//!   because the reused connection had been closed by the server between requests is sent on
//!   a new connection. hyper's `try_send_request` hands such a request back, so "never
//!   written" is known, not guessed. A request written and then cut is a failure (`reset`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::outcome::{
    ConnInfo, Failure, Phase, Reason, RequestCtx, classify_error, classify_status, pod_from_body,
};
use super::target::Target;

/// Connection counters of a pool, reported in the summary.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// TCP connections opened.
    pub connects: AtomicU64,
    /// Requests moved to a new connection because the reused one had been closed by the
    /// server before the request was written (not failures; see the module doc).
    pub stale_reconnects: AtomicU64,
}

/// How many times one request may move to another connection before it is written. Each
/// move needs the server to have closed a connection, so this only bounds pathological loops.
const MAX_SEND_ATTEMPTS: usize = 4;

const USER_AGENT: &str = "kubegrace-loadgen";

/// A pool of at most `size` keep-alive HTTP/1.1 connections, one request at a time on each.
/// A request waits (phase `Pool`) when every connection is busy, like a client with a
/// connection limit per host.
type H1Conn = (http1::SendRequest<Empty<Bytes>>, Arc<ConnInfo>);

pub struct Http1Pool {
    target: Target,
    idle: std::sync::Mutex<Vec<H1Conn>>,
    slots: tokio::sync::Semaphore,
    stats: Arc<ConnStats>,
}

impl Http1Pool {
    pub fn new(target: Target, size: usize, stats: Arc<ConnStats>) -> Self {
        Http1Pool {
            target,
            idle: std::sync::Mutex::new(Vec::with_capacity(size)),
            slots: tokio::sync::Semaphore::new(size.max(1)),
            stats,
        }
    }

    /// One GET of `path`; the response body is read to the end.
    pub async fn get(&self, path: &str, ctx: &RequestCtx) -> Result<(), Failure> {
        ctx.set(Phase::Pool);
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Failure::new(Reason::Other, "pool closed"))?;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let ((mut sender, info), reused) = match self.take_idle() {
                Some(conn) => (conn, true),
                None => {
                    ctx.set(Phase::Connect);
                    (self.connect().await?, false)
                }
            };
            if reused && sender.ready().await.is_err() {
                // Closed by the server while idle; nothing was written on it.
                self.stats.stale_reconnects.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            ctx.use_conn(&info);
            ctx.set(Phase::Response);
            let req = Request::get(path)
                .header(http::header::HOST, self.target.authority.as_str())
                .header(http::header::USER_AGENT, USER_AGENT)
                .body(Empty::<Bytes>::new())
                .map_err(|e| Failure::new(Reason::Other, format!("building request: {e}")))?;
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let status = read_answer(resp, ctx).await?;
                    self.put_idle((sender, info));
                    return classify_status(status);
                }
                Err(mut e) => {
                    if e.take_message().is_some() && reused && attempts < MAX_SEND_ATTEMPTS {
                        self.stats.stale_reconnects.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let mut failure = classify_error(e.error());
                    if reused && failure.reason == Reason::Reset {
                        // Written on a connection that had served earlier requests. With a
                        // near-zero latency that is the keep-alive idle race (the server
                        // closed it as the request arrived); the tag keeps it apart from
                        // failures of fresh connections in `by_detail`.
                        failure.detail.push_str(" (reused keep-alive connection)");
                    }
                    return Err(failure);
                }
            }
        }
    }

    fn take_idle(&self) -> Option<H1Conn> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(conn) = idle.pop() {
            if !conn.0.is_closed() {
                return Some(conn);
            }
            self.stats.stale_reconnects.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    fn put_idle(&self, conn: H1Conn) {
        // hyper closes the connection itself after `Connection: close`; don't keep it then.
        if !conn.0.is_closed() {
            self.idle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(conn);
        }
    }

    async fn connect(&self) -> Result<H1Conn, Failure> {
        let stream = self.target.connect(&self.stats.connects).await?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| classify_error(&e))?;
        // The connection's own error also reaches the request that was on it; nothing to do here.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok((sender, Arc::new(ConnInfo::default())))
    }
}

/// Reads an answer's body to its end and notes the pod it names; returns the status, or
/// how the body failed.
async fn read_answer(resp: Response<Incoming>, ctx: &RequestCtx) -> Result<u16, Failure> {
    let status = resp.status().as_u16();
    ctx.set(Phase::Body);
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| classify_error(&e))?
        .to_bytes();
    ctx.answered(pod_from_body(&body));
    Ok(status)
}

/// The request body type of the HTTP/2 pool: tonic's body, so plain HTTP/2 requests
/// (empty body) and gRPC calls share one pool implementation.
pub type H2Body = tonic::body::Body;

type H2Conn = (http2::SendRequest<H2Body>, Arc<ConnInfo>);

/// `size` multiplexed HTTP/2 connections (h2c prior knowledge); requests go round-robin.
pub struct Http2Pool {
    target: Target,
    slots: Vec<tokio::sync::Mutex<Option<H2Conn>>>,
    next: AtomicUsize,
    stats: Arc<ConnStats>,
}

impl Http2Pool {
    pub fn new(target: Target, size: usize, stats: Arc<ConnStats>) -> Self {
        let slots = (0..size.max(1))
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        Http2Pool {
            target,
            slots,
            next: AtomicUsize::new(0),
            stats,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// One GET of `path`; the response body is read to the end.
    pub async fn get(&self, path: &str, ctx: &RequestCtx) -> Result<(), Failure> {
        let uri = format!("http://{}{path}", self.target.authority);
        let req = Request::get(uri)
            .header(http::header::USER_AGENT, USER_AGENT)
            .body(H2Body::default())
            .map_err(|e| Failure::new(Reason::Other, format!("building request: {e}")))?;
        let resp = self.send(req, ctx).await?;
        classify_status(read_answer(resp, ctx).await?)
    }

    /// Sends one request and returns the response head (the body is the caller's).
    pub async fn send(
        &self,
        mut req: Request<H2Body>,
        ctx: &RequestCtx,
    ) -> Result<Response<Incoming>, Failure> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (mut sender, info, reused) = self.sender(ctx).await?;
            ctx.use_conn(&info);
            ctx.set(Phase::Response);
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    // Never written: the connection was going away (GOAWAY, close) before
                    // this request got a stream. Same rule as HTTP/1: only a reused one.
                    Some(unsent) if reused && attempts < MAX_SEND_ATTEMPTS => {
                        self.stats.stale_reconnects.fetch_add(1, Ordering::Relaxed);
                        req = unsent;
                    }
                    _ => return Err(classify_error(e.error())),
                },
            }
        }
    }

    /// A usable connection of the next slot, opened if the slot has none or its connection
    /// was closed (GOAWAY or EOF). Returns whether it was reused.
    async fn sender(
        &self,
        ctx: &RequestCtx,
    ) -> Result<(http2::SendRequest<H2Body>, Arc<ConnInfo>, bool), Failure> {
        // The slot lock is only contended while another request opens its connection, so
        // waiting for it is waiting for a connect.
        ctx.set(Phase::Connect);
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[i].lock().await;
        if let Some((sender, info)) = slot.as_ref() {
            if !sender.is_closed() {
                return Ok((sender.clone(), info.clone(), true));
            }
            self.stats.stale_reconnects.fetch_add(1, Ordering::Relaxed);
            *slot = None;
        }
        let stream = self.target.connect(&self.stats.connects).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| classify_error(&e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let info = Arc::new(ConnInfo::default());
        *slot = Some((sender.clone(), info.clone()));
        Ok((sender, info, false))
    }
}
