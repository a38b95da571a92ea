//! The response body on its way to the client, and the request's
//! accounting that travels with it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::conn::activity::ConnCtx;
use super::grpc_health::HealthBody;
use crate::circuit::Permit;
use crate::upstream::{AppBody, PoolReturn};

/// A request's accounting (the sidecar's and its connection's), from its
/// start until its response body ends (or is dropped).
pub(super) struct RequestGuard {
    ctx: Arc<ConnCtx>,
    started: Instant,
}

impl RequestGuard {
    /// Counts a request started on the connection.
    pub(super) fn start(ctx: Arc<ConnCtx>) -> RequestGuard {
        let started = ctx.request_started();
        RequestGuard { ctx, started }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.ctx.request_ended(self.started);
    }
}

/// Travels with the response body; dropped when the body ends.
pub(super) struct Finish {
    _request: RequestGuard,
    _permit: Option<Permit>,
}

impl Finish {
    pub(super) fn new(request: RequestGuard, permit: Option<Permit>) -> Finish {
        Finish {
            _request: request,
            _permit: permit,
        }
    }
}

enum Inner {
    Upstream(AppBody),
    Local(Full<Bytes>),
    /// A gRPC health answer while draining (grpc_health.rs).
    Health(Box<HealthBody>),
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
    pub(super) fn local(body: Full<Bytes>, finish: Option<Finish>) -> ProxyBody {
        ProxyBody {
            inner: Inner::Local(body),
            finish,
            pool_return: None,
        }
    }

    /// A gRPC health answer: the sidecar's own, or the app's Watch stream
    /// it takes over when a drain starts. No pooled HTTP/1 connection
    /// travels with it: gRPC is HTTP/2.
    pub(super) fn health(body: HealthBody, finish: Option<Finish>) -> ProxyBody {
        ProxyBody {
            inner: Inner::Health(Box::new(body)),
            finish,
            pool_return: None,
        }
    }

    pub(super) fn upstream(
        body: AppBody,
        finish: Finish,
        pool_return: Option<PoolReturn>,
    ) -> ProxyBody {
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
        // The pooled connection first: an HTTP/2 answer has none, and
        // asking its body whether it ended takes h2's connection lock (on
        // every frame of a streamed answer).
        if self.pool_return.is_some()
            && let Inner::Upstream(body) = &self.inner
            && body.is_end_stream()
            && let Some(pool_return) = self.pool_return.take()
        {
            pool_return.release();
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = crate::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, crate::Error>>> {
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
            Inner::Health(body) => body.poll_frame(cx),
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
            Inner::Health(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream(body) => body.size_hint(),
            Inner::Local(body) => body.size_hint(),
            // A few short messages, or a stream with no known end.
            Inner::Health(_) => SizeHint::default(),
        }
    }
}
