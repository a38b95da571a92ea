//! HTTP/1 served by hyper (with upgrades): the server's builder under the
//! limits in force, its header-read timer, and the hand-over target of the
//! fast path (h1/), which ends with an [`Outcome::ToHyper`] that serve.rs
//! passes here.

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Request;
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::activity::ConnCtx;
use super::served::{BoxError, Outcome, Served};
use crate::config::LimitsConfig;
use crate::http2::Ending;
use crate::metrics::ClientTimeout;
use crate::proxy::handler::handle;
use crate::upstream::DownstreamBody;

/// hyper's HTTP/1 header-read timer, with one change: on a kept-alive
/// connection the clock only starts when the next request's first byte
/// arrives. hyper starts it as soon as it waits for the next head, which
/// would close every keep-alive connection idle for `headerReadTimeout`
/// and race clients reusing it; idle connections are the idle timeout's job.
/// "Arrives" includes bytes hyper already buffered: a pipelined head sent
/// half in the packet of the previous request is timed from the moment
/// hyper starts waiting for it (see `ConnActivity::next_head_buffered`).
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

/// An HTTP/1 connection served by hyper (with upgrades).
/// `T`: the socket under `io`, which the connection's [`Outcome`] speaks of.
pub(super) fn hyper_http1<I, T>(
    io: I,
    ctx: Arc<ConnCtx>,
    limits: &LimitsConfig,
) -> Pin<Box<dyn Served<T>>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: 'static,
{
    let builder = http1_builder(limits, &ctx);
    let service = service_fn(move |req: Request<Incoming>| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(handle(ctx, Box::new(req.map(DownstreamBody::Http1))).await) }
    });
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    Box::pin(Http1Served {
        conn,
        socket: PhantomData,
    })
}

pin_project_lite::pin_project! {
    /// hyper's HTTP/1 connection as a [`Served`]. `T`: the socket the
    /// connection's [`Outcome`] speaks of (hyper never hands over).
    struct Http1Served<C, T> {
        #[pin]
        conn: C,
        socket: PhantomData<fn() -> T>,
    }
}

/// hyper's HTTP/1 connection (with upgrades), its bounds named once for
/// the two impls of [`Http1Served`].
trait Http1Conn: Future<Output = hyper::Result<()>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Http1Conn for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    #[inline]
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<C: Http1Conn, T> Future for Http1Served<C, T> {
    type Output = Result<Outcome<T>, BoxError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .conn
            .poll(cx)
            .map(|res| res.map(|()| Outcome::Done).map_err(Into::into))
    }
}

impl<C: Http1Conn, T> Served<T> for Http1Served<C, T>
where
    Self: Send,
{
    fn shutdown(self: Pin<&mut Self>, _why: Ending) {
        // HTTP/1 closes once the response in flight is out.
        self.project().conn.graceful_shutdown();
    }
}
