//! Wrappers that only watch (or replay) what is read and pass writes
//! straight through, inline, so they cost nothing on the write path:
//!
//! - [`Watched`]: a stream plus a [`ReadWatch`] that sees every completed
//!   read (the upstream HTTP/2 sniff, the tunnel's idle counter), and
//!   [`poll_read_seen`], the read it and the downstream byte counter share;
//! - [`write_through!`]: the forwarding `AsyncWrite` methods for a wrapper
//!   whose read side is its own (a replay of sniffed bytes, a counter that
//!   also watches writes).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a [`Watched`] stream calls after each read that completed.
pub(crate) trait ReadWatch {
    /// `res`: how the read ended; `new`: the bytes it added to the buffer
    /// (none at EOF and on error).
    fn saw(&mut self, res: &io::Result<()>, new: &[u8]);
}

/// A stream whose reads a [`ReadWatch`] sees; writes go straight through.
pub(crate) struct Watched<T, W> {
    pub(crate) inner: T,
    pub(crate) watch: W,
}

impl<T: AsyncRead + Unpin, W: ReadWatch + Unpin> AsyncRead for Watched<T, W> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Watched { inner, watch } = self.get_mut();
        poll_read_seen(inner, cx, buf, |res, new| watch.saw(res, new))
    }
}

/// Polls a read of `inner` into `buf`; once it completes, `saw` gets how
/// it ended and the bytes it added (none at EOF and on error). The one
/// place that works out which bytes a read added, for every wrapper that
/// watches its reads.
#[inline]
pub(crate) fn poll_read_seen<T: AsyncRead + Unpin>(
    inner: &mut T,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
    saw: impl FnOnce(&io::Result<()>, &[u8]),
) -> Poll<io::Result<()>> {
    let before = buf.filled().len();
    let res = Pin::new(inner).poll_read(cx, buf);
    if let Poll::Ready(done) = &res {
        // A read only adds to what is filled: `before` is in range.
        saw(done, buf.filled().get(before..).unwrap_or_default());
    }
    res
}

/// Forwards `AsyncWrite` to `self.$field`, inside an `impl AsyncWrite for`
/// block: `write_through!(inner);` forwards every method;
/// `write_through!(inner, flush_and_shutdown);` only those two, for a
/// wrapper whose writes do their own bookkeeping.
macro_rules! write_through {
    // One method: the same call on the field, the arguments passed on.
    (@forward $field:ident, $method:ident($($arg:ident: $ty:ty),*) -> $out:ty) => {
        #[inline]
        fn $method(
            self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
            $($arg: $ty),*
        ) -> ::std::task::Poll<::std::io::Result<$out>> {
            let field = ::std::pin::Pin::new(&mut self.get_mut().$field);
            ::tokio::io::AsyncWrite::$method(field, cx $(, $arg)*)
        }
    };
    ($field:ident) => {
        $crate::passthrough::write_through!(@forward $field, poll_write(buf: &[u8]) -> usize);
        $crate::passthrough::write_through!(
            @forward $field,
            poll_write_vectored(bufs: &[::std::io::IoSlice<'_>]) -> usize
        );

        #[inline]
        fn is_write_vectored(&self) -> bool {
            ::tokio::io::AsyncWrite::is_write_vectored(&self.$field)
        }

        $crate::passthrough::write_through!($field, flush_and_shutdown);
    };
    ($field:ident, flush_and_shutdown) => {
        $crate::passthrough::write_through!(@forward $field, poll_flush() -> ());
        $crate::passthrough::write_through!(@forward $field, poll_shutdown() -> ());
    };
}

pub(crate) use write_through;

impl<T: AsyncWrite + Unpin, W: Unpin> AsyncWrite for Watched<T, W> {
    write_through!(inner);
}
