//! A connected socket to the app, TCP or Unix.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

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

impl UpstreamStream {
    /// Whether an idle socket still looks open: it has nothing to read, so
    /// EOF or bytes mean the app closed it or broke the protocol. The
    /// reactor's readiness answers without a syscall in the usual case
    /// (nothing happened since the last response was read); only a socket
    /// marked readable is read to find out.
    pub(crate) fn looks_open(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let ready = match self {
            Self::Tcp(s) => s.poll_read_ready(&mut cx),
            Self::Unix(s) => s.poll_read_ready(&mut cx),
        };
        match ready {
            Poll::Pending => return true,
            Poll::Ready(Err(_)) => return false,
            Poll::Ready(Ok(())) => {}
        }
        let mut probe = [0u8; 1];
        let res = match self {
            Self::Tcp(s) => s.try_read(&mut probe),
            Self::Unix(s) => s.try_read(&mut probe),
        };
        matches!(res, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}
