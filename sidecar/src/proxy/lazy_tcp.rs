//! An accepted TCP connection that joins tokio's reactor (epoll) only when
//! one of its reads or writes would block.
//!
//! Why: registered at accept, as tokio's own `TcpListener::accept` does, a
//! connection pays an `epoll_ctl` add, tokio's registration, a second poll
//! of its task once epoll reports the first bytes, and at the end the
//! deregistration and a second `epoll_ctl`. A connection whose request is
//! already in the socket when it is first read, and whose answer fits in
//! the send buffer, needs none of that: read and written directly on the
//! non-blocking socket, it is served with `accept4`, `recvfrom`, `sendto`
//! and `close` alone. How often the request is already there depends on
//! load (bench/README.md, "Issue #14, fifth pass"): on a busy sidecar,
//! where accepted connections wait their turn, nearly always (0.12
//! `epoll_ctl` per one-request connection under `strace`, against 2.0);
//! on one with idle CPU, which reads a connection right after accepting
//! it, rarely, and the connection registers as before, having paid one
//! `recvfrom` that found nothing.
//!
//! A connection leaves the direct state at its first `WouldBlock` and
//! stays registered, so tokio's cooperative budget governs it from then
//! on; before that, every call returns without waiting.
//!
//! Correctness rests on one property of epoll: adding a socket that is
//! already readable or writable reports that readiness at once (the add
//! polls the socket), so a connection registered after a read or write
//! found `WouldBlock` cannot miss the bytes or the space that arrived in
//! between. tokio registers edge-triggered, which is what makes this
//! matter; the tests below make a read and a write wait across the
//! registration.

use std::io::{self, Write};
use std::net::TcpStream as StdTcpStream;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::socket::{Downstream, MSG_MORE};

/// An accepted TCP connection; see the module docs.
pub(crate) struct LazyTcp {
    state: State,
}

enum State {
    /// Not in the reactor: every call goes to the socket directly.
    Direct(StdTcpStream),
    /// In tokio's reactor since a call would have blocked.
    Registered(tokio::net::TcpStream),
    /// The registration failed; the socket is closed and every call fails.
    Failed,
}

impl LazyTcp {
    /// Wraps an accepted socket, which must be non-blocking (`accept4` with
    /// `SOCK_NONBLOCK`, as mio's accept does).
    pub(crate) fn new(stream: StdTcpStream) -> Self {
        LazyTcp {
            state: State::Direct(stream),
        }
    }

    /// Whether the connection has joined the reactor (it had to wait).
    #[cfg(test)]
    pub(crate) fn is_registered(&self) -> bool {
        matches!(self.state, State::Registered(_))
    }

    /// Joins tokio's reactor; a socket already registered stays as it is.
    /// Out of line: it runs once per connection, and the calls that find
    /// the socket registered go straight to tokio's stream.
    #[cold]
    #[inline(never)]
    fn registered(&mut self) -> io::Result<&mut tokio::net::TcpStream> {
        if let State::Direct(_) = self.state {
            let State::Direct(stream) = std::mem::replace(&mut self.state, State::Failed) else {
                return Err(failed());
            };
            // A failed registration (epoll out of memory or past
            // `max_user_watches`) drops the socket: the connection ends
            // with the error, as a failed accept would have ended it.
            self.state = State::Registered(tokio::net::TcpStream::from_std(stream)?);
        }
        match &mut self.state {
            State::Registered(stream) => Ok(stream),
            State::Direct(_) | State::Failed => Err(failed()),
        }
    }

    /// Runs `direct` on the unregistered socket; once it would block (or the
    /// socket was registered before), `registered` on tokio's stream, which
    /// waits for the readiness the registration reports. Both get `buf`,
    /// what the call reads into or writes from (both closures could not
    /// hold a read's `&mut ReadBuf` themselves).
    fn poll_io<B, R>(
        &mut self,
        cx: &mut Context<'_>,
        mut buf: B,
        mut direct: impl FnMut(&StdTcpStream, &mut B) -> io::Result<R>,
        registered: impl FnOnce(&mut tokio::net::TcpStream, &mut Context<'_>, B) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match &mut self.state {
            State::Registered(stream) => return registered(stream, cx, buf),
            State::Failed => return Poll::Ready(Err(failed())),
            State::Direct(stream) => loop {
                match direct(stream, &mut buf) {
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                    res => return Poll::Ready(res),
                }
            },
        }
        match self.registered() {
            Ok(stream) => registered(stream, cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

fn failed() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection could not join the reactor",
    )
}

impl AsyncRead for LazyTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().poll_io(
            cx,
            buf,
            |stream, buf| {
                // Into the caller's uninitialised space, as tokio's own
                // read does: zeroing it first (the safe `ReadBuf` way) cost
                // a sixth of a one-request connection's user-space
                // instructions (callgrind, bench/profile).
                #[allow(unsafe_code)]
                // SAFETY: `unfilled_mut` is unsafe because writing
                // uninitialised bytes into the space would falsify
                // `ReadBuf`'s record of what is initialised; `recv` writes
                // only bytes the kernel copied in, and `assume_init(n)`
                // marks exactly the `n` it reports.
                let n = unsafe {
                    let read = socket2::SockRef::from(stream).recv(buf.unfilled_mut());
                    if let Ok(n) = read {
                        buf.assume_init(n);
                    }
                    read
                }?;
                buf.advance(n);
                Ok(())
            },
            |stream, cx, buf| Pin::new(stream).poll_read(cx, buf),
        )
    }
}

impl AsyncWrite for LazyTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(
            cx,
            buf,
            |s, buf| (&*s).write(buf),
            |s, cx, buf| Pin::new(s).poll_write(cx, buf),
        )
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_io(
            cx,
            bufs,
            |s, bufs| (&*s).write_vectored(bufs),
            |s, cx, bufs| Pin::new(s).poll_write_vectored(cx, bufs),
        )
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // TCP keeps nothing in user space to flush.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            State::Direct(stream) => Poll::Ready(stream.shutdown(std::net::Shutdown::Write)),
            State::Registered(stream) => Pin::new(stream).poll_shutdown(cx),
            State::Failed => Poll::Ready(Err(failed())),
        }
    }
}

impl Downstream for LazyTcp {
    fn no_delay(&self) {
        let _ = match &self.state {
            State::Direct(stream) => stream.set_nodelay(true),
            State::Registered(stream) => stream.set_nodelay(true),
            State::Failed => Ok(()),
        };
    }

    #[cfg(target_os = "linux")]
    fn poll_write_last(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_io(
            cx,
            buf,
            |s, buf| socket2::SockRef::from(s).send_with_flags(buf, MSG_MORE),
            |s, cx, buf| s.poll_write_last(cx, buf),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair over loopback: the accepted side as the listener's
    /// accept loop gets it (non-blocking, unregistered) and the client.
    async fn pair() -> (LazyTcp, tokio::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().expect("accept");
        accepted.set_nonblocking(true).expect("nonblocking");
        (LazyTcp::new(accepted), client)
    }

    #[tokio::test]
    async fn an_exchange_that_never_waits_stays_out_of_the_reactor() {
        let (mut server, mut client) = pair().await;
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        // Loopback delivers within the send call; give the kernel a moment
        // anyway so the read below finds the request.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut buf = vec![0u8; 256];
        let n = server.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"GET / HTTP/1.1\r\n"));
        std::future::poll_fn(|cx| server.poll_write_last(cx, b"HTTP/1.1 204 No Content\r\n\r\n"))
            .await
            .expect("write");
        assert!(
            !server.is_registered(),
            "a read that found its bytes and a write that found room must not register"
        );
        drop(server);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("answer");
        assert_eq!(answer, b"HTTP/1.1 204 No Content\r\n\r\n");
    }

    #[tokio::test]
    async fn a_read_that_waits_registers_and_wakes_on_the_bytes() {
        let (mut server, mut client) = pair().await;
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let n = server.read(&mut buf).await.expect("read");
            (server, buf[..n].to_vec())
        });
        // The reader has found nothing and registered by now.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        client.write_all(b"late").await.expect("send");
        let (server, got) = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("the read must wake when the bytes arrive")
            .expect("join");
        assert_eq!(got, b"late");
        assert!(server.is_registered());
    }

    #[tokio::test]
    async fn bytes_that_arrive_while_registering_are_not_missed() {
        // The read that finds nothing, then the bytes, then the
        // registration: epoll's add must report the readiness that came
        // before it, or this read would wait forever (tokio is
        // edge-triggered).
        let (mut server, mut client) = pair().await;
        let mut buf = [0u8; 16];
        let State::Direct(stream) = &server.state else {
            panic!("a fresh connection starts direct");
        };
        let early = (&*stream).read(&mut buf);
        assert_eq!(
            early.map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::WouldBlock)
        );
        client.write_all(b"between").await.expect("send");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        server.registered().expect("register");
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), server.read(&mut buf))
            .await
            .expect("bytes that came before the registration must be reported")
            .expect("read");
        assert_eq!(&buf[..n], b"between");
    }

    #[tokio::test]
    async fn a_write_that_fills_the_socket_waits_for_room_and_finishes() {
        let (mut server, mut client) = pair().await;
        // More than the loopback socket buffers hold, so a write blocks
        // until the client reads.
        let total = 8 * 1024 * 1024;
        let writer = tokio::spawn(async move {
            let chunk = vec![7u8; 64 * 1024];
            let mut sent = 0;
            while sent < total {
                server.write_all(&chunk).await.expect("write");
                sent += chunk.len();
            }
            server.shutdown().await.expect("shutdown");
            server
        });
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        let read_all = async {
            loop {
                let n = client.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                assert!(buf[..n].iter().all(|&b| b == 7));
                got += n;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), read_all)
            .await
            .expect("the writer must wake when the client makes room");
        assert_eq!(got, total);
        let server = writer.await.expect("join");
        assert!(server.is_registered(), "8 MiB cannot fit without waiting");
    }

    #[tokio::test]
    async fn end_of_stream_reads_as_zero_while_direct() {
        let (mut server, client) = pair().await;
        drop(client);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let mut buf = [0u8; 8];
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(n, 0);
        assert!(!server.is_registered());
    }
}
