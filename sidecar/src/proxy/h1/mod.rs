//! The HTTP/1.1 fast path: plain request/response exchanges relayed as
//! bytes, the way nginx and HAProxy do it, instead of through hyper's
//! server and client and the owned `http` types between them.
//!
//! Per connection: one read buffer and one write buffer. Per request:
//!
//! 1. `head`: the request head is parsed in place (httparse over the read
//!    buffer); the route, the breaker and the drain policy are decided from
//!    its slices, and the head the app gets is written, rewritten, into the
//!    write buffer (hop-by-hop and `Connection`-listed headers out,
//!    `X-Forwarded-*` and `Host` in).
//! 2. `exchange`: an app connection comes off the LIFO pool (`pool`) or is
//!    opened (with the app-restart hold); the head and the body bytes
//!    already read go in one write, the rest of the body is relayed by its
//!    framing (Content-Length, or chunked followed by `chunked`'s framer)
//!    under the body limits; the response head is parsed and rewritten the
//!    same way (`Connection: close` while draining) and its body relayed by
//!    its framing. A clean end puts the app connection back on the pool.
//!
//! Allocation: buffers come from and go back to per-thread spare stacks
//! (`crate::spare`), and the exchange's state lives in a heap slot reused from
//! request to request (`slot`), so an idle connection holds neither and a
//! busy one does not go to malloc per request.
//!
//! What this path does not serve goes to hyper, with the bytes already
//! read replayed in front ([`Rewind`]): HTTP/1.0, upgrades (WebSocket,
//! h2c), `Expect`, CONNECT, absolute-form targets, Transfer-Encoding other
//! than exactly `chunked`, heads over 100 headers when the limit allows
//! more. The switch from then on is for the rest of the connection, and
//! happens only between messages, so no byte is read twice. HTTP/2 never
//! comes here (conn/sniff.rs tells it first).
//!
//! Every guarantee of the hyper path holds here and is tested on both:
//! 400/413/431 and the header, body and write timers, smuggling refusals
//! (conflicting or duplicate Content-Length, CL with TE, bad chunk sizes,
//! obs-fold, bare LF in chunk framing), drain accounting, breaker
//! outcomes and metrics.

mod chunked;
mod exchange;
#[cfg(test)]
mod fuzz;
pub(super) mod head;
mod pool;
mod slot;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::spare::{self, OutClass, ReadClass};
pub(crate) use pool::RawPool;

use super::conn::activity::ConnCtx;
use super::conn::served::{BoxError, Outcome, Served};
use super::conn::socket::Rewind;
use crate::config::LimitsConfig;
use crate::http2::Ending;
use crate::metrics::ClientTimeout;

/// The read buffer of a connection with a request coming in; grows for
/// bigger heads.
pub(crate) const READ_BUF: usize = 4096;
/// An app connection's read buffer while an exchange is on (pooled
/// connections give it back): what a body relay reads at a time, so the
/// relay's `reserve` finds it big enough.
const APP_READ: usize = exchange::READ_CHUNK;
const _: () = assert!(APP_READ == spare::APP_READ);
/// What an idle connection reads into before it takes a read buffer: a
/// keep-alive connection spends most of its life waiting for its next
/// request, and 10,000 of them holding 5 KiB of empty buffers each is
/// 50 MiB of nothing (nginx frees its buffers the same way between
/// requests). Most heads fit in one such read.
const FIRST_READ: usize = 256;

/// The connection's end as the connection loop asks for it. One task
/// polls both sides (the loop in conn/serve.rs polls this path's future), so
/// one waker slot is enough: registering it is a compare of wakers, where
/// a `Notify` waiter was a locked list insert and removal per request.
#[derive(Default)]
struct Control {
    /// 0: none; 1: drain; 2: idle.
    ending: AtomicU8,
    waker: AtomicWaker,
}

impl Control {
    fn ending(&self) -> Option<Ending> {
        match self.ending.load(Ordering::Acquire) {
            1 => Some(Ending::Drain),
            2 => Some(Ending::Idle),
            _ => None,
        }
    }

    fn ask(&self, why: Ending) {
        let code = match why {
            Ending::Drain => 1,
            Ending::Idle => 2,
        };
        self.ending.store(code, Ordering::Release);
        self.waker.wake();
    }

    /// Ready once an ending was asked for.
    async fn asked(&self) {
        std::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.ending().is_some() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

pin_project_lite::pin_project! {
    /// The connection's future and its control, in one allocation.
    struct FastServed<F> {
        #[pin]
        run: F,
        ctl: Arc<Control>,
    }
}

impl<F, T> Future for FastServed<F>
where
    F: Future<Output = Result<Outcome<T>, BoxError>>,
{
    type Output = Result<Outcome<T>, BoxError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().run.poll(cx)
    }
}

impl<F, T> Served<T> for FastServed<F>
where
    F: Future<Output = Result<Outcome<T>, BoxError>> + Send,
{
    fn shutdown(self: Pin<&mut Self>, why: Ending) {
        self.ctl.ask(why);
    }
}

/// Serves an HTTP/1 connection on the fast path until it ends, or until it
/// meets a request this path does not serve: then the future ends with
/// [`Outcome::ToHyper`], and conn/serve.rs hands the socket to hyper.
/// `read` holds what was already read from the client (the protocol
/// sniff's bytes): it becomes the connection's read buffer.
pub(super) fn serve<T>(
    io: T,
    read: BytesMut,
    ctx: Arc<ConnCtx>,
    limits: LimitsConfig,
) -> Pin<Box<dyn Served<T>>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ctl = Arc::new(Control::default());
    let run = run(io, read, ctx, limits, ctl.clone());
    Box::pin(FastServed { run, ctl })
}

/// What to do with the connection after one exchange.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    KeepAlive,
    /// Close cleanly (the last answer said so).
    Close,
    /// Close after an error answer, reading (and dropping) what the client
    /// still sends for a moment, so the answer is not lost to a reset.
    Linger,
    /// Drop at once: the exchange broke mid-message.
    Abort,
    /// The head in the buffer is hyper's.
    Fallback,
}

/// The client side of a connection: its socket and buffers.
struct Client<T> {
    io: T,
    /// Bytes read from the client not yet consumed.
    buf: BytesMut,
    /// Heads being written (to the app, then to the client).
    out: Vec<u8>,
}

impl<T: AsyncRead + Unpin> Client<T> {
    /// Between requests: gives the buffers back (to the spare stacks, or
    /// the allocator) unless the next request's bytes are already in
    /// (pipelined).
    fn release_idle_buffers(&mut self, open: usize) {
        if self.buf.is_empty() {
            spare::give_bytes(ReadClass::Http1Client, std::mem::take(&mut self.buf), open);
        }
        spare::give_out(OutClass::Http1, std::mem::take(&mut self.out), open);
    }
}

/// Gives the spare buffers this thread keeps beyond `open` (the connections
/// open now) back to the allocator (memory.rs, after a spike).
pub(crate) fn release_spare_buffers(open: usize) {
    spare::release(open);
    slot::release(open);
}

/// Drops the first `n` bytes of a read buffer. When that is all of them it
/// is cleared instead, which keeps its start and so its whole capacity: an
/// `advance` moves the start, and the next `reserve` (or giving the buffer
/// back, spare.rs) has to take that room back, once per request.
pub(super) fn consume(buf: &mut BytesMut, n: usize) {
    if n == buf.len() {
        buf.clear();
    } else {
        buf.advance(n);
    }
}

/// The read buffer for a new connection's first bytes (the protocol
/// sniff's), which the fast path keeps as the connection's read buffer.
pub(super) fn first_read_buffer() -> BytesMut {
    spare::take_bytes(ReadClass::Http1Client)
}

/// Reads from the client into its read buffer; a connection whose buffers
/// were released reads into a small scratch first and takes its buffers
/// only once bytes arrive.
async fn read_more<T: AsyncRead + Unpin>(client: &mut Client<T>) -> std::io::Result<usize> {
    if client.buf.capacity() > 0 {
        return client.io.read_buf(&mut client.buf).await;
    }
    let mut first = [0u8; FIRST_READ];
    let n = client.io.read(&mut first).await?;
    if n > 0 {
        client.buf = spare::take_bytes(ReadClass::Http1Client);
        client.buf.extend_from_slice(&first[..n]);
        client.out = spare::take_out(OutClass::Http1);
    }
    Ok(n)
}

async fn run<T>(
    io: T,
    read: BytesMut,
    ctx: Arc<ConnCtx>,
    limits: LimitsConfig,
    ctl: Arc<Control>,
) -> Result<Outcome<T>, BoxError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Bytes already read take their write buffer as `read_more` would.
    let out = if read.is_empty() {
        Vec::new()
    } else {
        spare::take_out(OutClass::Http1)
    };
    let mut client = Client { io, buf: read, out };
    match exchanges(&mut client, &ctx, &limits, &ctl).await {
        Ok(Ended::Closed) => {
            let open = ctx.shared.drain.open_connections();
            spare::give_bytes(ReadClass::Http1Client, client.buf, open);
            spare::give_out(OutClass::Http1, client.out, open);
            Ok(Outcome::Done)
        }
        Ok(Ended::Fallback) => {
            // hyper serves the rest of the connection, the unconsumed
            // bytes replayed first: conn/serve.rs hands it over, and
            // passes on an ending already asked of this path.
            spare::give_out(
                OutClass::Http1,
                client.out,
                ctx.shared.drain.open_connections(),
            );
            Ok(Outcome::ToHyper(Rewind::new(
                client.buf.freeze(),
                client.io,
            )))
        }
        Err(err) => Err(err),
    }
}

/// How the fast path's part of a connection ended.
enum Ended {
    /// The connection is done (closed, cut or timed out).
    Closed,
    /// The head in the buffer is hyper's.
    Fallback,
}

/// Serves the connection's exchanges until it ends or a head is hyper's.
async fn exchanges<T>(
    client: &mut Client<T>,
    ctx: &Arc<ConnCtx>,
    limits: &LimitsConfig,
    ctl: &Control,
) -> Result<Ended, BoxError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = tokio::time::Instant::now();
    let header_timeout = limits.header_read_timeout.get();
    let mut first = true;
    loop {
        // The header timer: the first head is timed from the connection's
        // start, later ones from their first byte (an idle keep-alive
        // connection is the idle timer's business).
        let mut deadline = first.then_some(started + header_timeout);
        first = false;
        let next = loop {
            if client.buf.is_empty() && ctl.ending().is_some() {
                // Nothing of a request yet: closing is the graceful path.
                return Ok(Ended::Closed);
            }
            if !client.buf.is_empty() {
                // `None`: the head is not complete yet. On the heap: the
                // exchange's state (896 bytes, `-Zprint-type-sizes`) is held
                // only while a request is on, not by every idle connection;
                // in a slot reused from request to request (slot.rs).
                let exchange = slot::Pooled::new(
                    exchange::try_request(client, ctx, limits, ctl),
                    ctx.shared.drain.open_connections(),
                );
                if let Some(next) = exchange.await {
                    break next;
                }
                // Part of a head: its timer starts now, microseconds after
                // the read that brought its first bytes. Started only here,
                // not after every read: most heads come whole in one read,
                // and a clock read per request was a tenth of the path's
                // own time (bench/README.md, "seventh pass").
                if deadline.is_none() {
                    deadline = Some(tokio::time::Instant::now() + header_timeout);
                }
            }
            // Biased, the read first: the first head is often already in
            // (the protocol sniff read it), and then neither the timer nor
            // the notify waiter is registered only to be dropped.
            let read = tokio::select! {
                biased;
                read = read_more(client) => read,
                _ = sleep_until_opt(deadline), if deadline.is_some() => {
                    ctx.shared.metrics.client_timeout(ClientTimeout::HeaderRead);
                    tracing::debug!("no request head within the header read timeout; closing");
                    return Ok(Ended::Closed);
                }
                _ = ctl.asked(), if client.buf.is_empty() => continue,
            };
            match read {
                Ok(0) => return Ok(Ended::Closed),
                Ok(_) => {}
                Err(err) => return Err(err.into()),
            }
        };
        match next {
            Next::KeepAlive => {
                if ctl.ending().is_some() {
                    return Ok(Ended::Closed);
                }
                client.release_idle_buffers(ctx.shared.drain.open_connections());
            }
            // The answer is written: dropping the socket (close) sends the
            // FIN after it, as a shutdown first would, one syscall fewer
            // per connection (nginx closes the same way). A request whose
            // body was left unread ends in `Linger` instead.
            Next::Close => return Ok(Ended::Closed),
            Next::Linger => {
                linger(&mut client.io).await;
                return Ok(Ended::Closed);
            }
            Next::Abort => return Ok(Ended::Closed),
            Next::Fallback => return Ok(Ended::Fallback),
        }
    }
}

/// How long, and how much, a connection closed after an error answer
/// reads on (nginx's lingering close).
const LINGER_TIME: std::time::Duration = std::time::Duration::from_millis(300);
const LINGER_BYTES: usize = 256 * 1024;

/// Half-closes and drops what the client still sends, briefly: closing a
/// socket with unread bytes resets it, and a reset can destroy the answer
/// before the client reads it.
async fn linger<T: AsyncRead + AsyncWrite + Unpin>(io: &mut T) {
    if io.shutdown().await.is_err() {
        return;
    }
    // On the heap: an array here would sit in every connection's state.
    let mut scratch = vec![0u8; 4096];
    let mut read = 0;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while read < LINGER_BYTES {
            match io.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
