//! The pooled keep-alive connections from the sidecar to the app.
//!
//! Two pools: HTTP/1.1 for HTTP/1 downstream requests, HTTP/2 (prior
//! knowledge) for HTTP/2 and gRPC downstream requests, so streams stay
//! multiplexed end to end. Both keep up to `upstreamPool.maxIdle` idle
//! connections, so after the first burst every request rides a warm socket,
//! and drop idle ones after `upstreamPool.idleTimeout`, which must stay below
//! the app's own keep-alive timeout (the proxy never reuses a socket the app
//! is closing).

use std::net::SocketAddr;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http_body_util::{Either, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{Endpoint, UpstreamPoolConfig};
use crate::error::{Error, Result};

/// What the proxy sends upstream: the downstream body, length-limited when
/// `limits.maxRequestBodyBytes` is set. `Either` keeps it unboxed.
pub type UpstreamBody = Either<Incoming, Limited<Incoming>>;

pub struct Upstream {
    addr: SocketAddr,
    authority: Authority,
    h1: Client<HttpConnector, UpstreamBody>,
    h2: Client<HttpConnector, UpstreamBody>,
}

impl Upstream {
    pub fn new(endpoint: &Endpoint, pool: &UpstreamPoolConfig) -> Result<Upstream> {
        let addr = match endpoint {
            Endpoint::Tcp(addr) => *addr,
            Endpoint::Unix(path) => {
                return Err(Error::Unsupported(format!(
                    "upstream: unix sockets ({}) are not supported yet; use host:port",
                    path.display()
                )));
            }
        };
        let authority: Authority = addr.to_string().parse().map_err(|e| {
            Error::Unsupported(format!("upstream: {addr} is not a URI authority: {e}"))
        })?;

        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(pool.connect_timeout.get()));
        connector.set_nodelay(true);
        // Detects an app that vanished without a FIN while the socket idles.
        connector.set_keepalive(Some(Duration::from_secs(30)));
        connector.enforce_http(true);

        let build = |http2: bool| {
            let mut b = Client::builder(TokioExecutor::new());
            b.pool_idle_timeout(pool.idle_timeout.get())
                .pool_max_idle_per_host(pool.max_idle)
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                // The client's Host header stays as the downstream sent it.
                .set_host(true)
                // A pooled socket the app closed between our checkout and our
                // write is retried on a fresh one (the body was not sent yet).
                .retry_canceled_requests(true);
            if http2 {
                b.http2_only(true).http2_adaptive_window(true);
            }
            b.build(connector.clone())
        };
        Ok(Upstream {
            addr,
            authority,
            h1: build(false),
            h2: build(true),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn scheme(&self) -> Scheme {
        Scheme::HTTP
    }

    pub fn h1(&self) -> &Client<HttpConnector, UpstreamBody> {
        &self.h1
    }

    pub fn h2(&self) -> &Client<HttpConnector, UpstreamBody> {
        &self.h2
    }
}
