//! The downstream socket: TCP or Unix ([`Downstream`]), wrapped to count
//! what moves on it ([`CountingIo`]) and, once something was read ahead of
//! a server, to replay those bytes first ([`Rewind`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::{ConnActivity, ConnCtx};

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
pub(in crate::proxy) const MSG_MORE: i32 = 0x8000;

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
pub(super) struct CountingIo<T> {
    inner: T,
    /// The connection's context, for its activity counters (one allocation
    /// per connection holds both).
    ctx: Arc<ConnCtx>,
    reads: ReadCount,
    /// Bytes written so far (see [`ReadCount::read`]).
    written: u64,
    /// Nagle's algorithm is still on: it goes off before the second
    /// write (see [`CountingIo::before_write`]).
    delay_on: bool,
    wrote: bool,
}

impl<T> CountingIo<T> {
    pub(super) fn new(inner: T, ctx: Arc<ConnCtx>) -> Self {
        CountingIo {
            inner,
            ctx,
            reads: ReadCount::default(),
            written: 0,
            delay_on: true,
            wrote: false,
        }
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

/// The read side's counters.
#[derive(Default)]
struct ReadCount {
    /// Bytes read so far. [`CountingIo`] is its socket's only reader and
    /// writer, so the shared counters (this one and `written`) are stored,
    /// not added to: a plain store instead of a locked instruction per
    /// read and write.
    read: u64,
    /// How much of CRLF CRLF the head scan has matched.
    scan_state: u8,
}

impl ReadCount {
    /// Book-keeping for the new bytes `data`.
    fn saw(&mut self, act: &ConnActivity, data: &[u8]) {
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
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let CountingIo {
            inner, ctx, reads, ..
        } = self.get_mut();
        crate::passthrough::poll_read_seen(inner, cx, buf, |_, new| {
            if !new.is_empty() {
                reads.saw(&ctx.act, new);
            }
        })
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
    crate::passthrough::write_through!(inner, flush_and_shutdown);
}

/// The downstream socket with the bytes the protocol sniff (or the
/// HTTP/1 fast path) took replayed in front.
pub(crate) struct Rewind<T> {
    pre: Bytes,
    inner: T,
}

impl<T> Rewind<T> {
    pub(crate) fn new(pre: Bytes, inner: T) -> Self {
        Rewind { pre, inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Rewind { pre, inner } = self.get_mut();
        if !pre.is_empty() {
            let n = pre.len().min(buf.remaining());
            buf.put_slice(&pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    crate::passthrough::write_through!(inner);
}
