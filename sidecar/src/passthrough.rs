//! The write half of a wrapper that only watches (or replays) what is read:
//! every `AsyncWrite` method forwarded to one field, inline, so the wrapper
//! costs nothing on the write path. One macro rather than one generic
//! wrapper because each wrapper's read side is its own (a replay, a sniff,
//! a counter) and several keep state beside the stream.

/// Forwards `AsyncWrite` to `self.$field`, inside an `impl AsyncWrite for`
/// block: `write_through!(inner);` forwards every method;
/// `write_through!(inner, flush_and_shutdown);` only those two, for a
/// wrapper whose writes do their own bookkeeping.
macro_rules! write_through {
    ($field:ident) => {
        #[inline]
        fn poll_write(
            self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
            buf: &[u8],
        ) -> ::std::task::Poll<::std::io::Result<usize>> {
            ::tokio::io::AsyncWrite::poll_write(
                ::std::pin::Pin::new(&mut self.get_mut().$field),
                cx,
                buf,
            )
        }

        #[inline]
        fn poll_write_vectored(
            self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
            bufs: &[::std::io::IoSlice<'_>],
        ) -> ::std::task::Poll<::std::io::Result<usize>> {
            ::tokio::io::AsyncWrite::poll_write_vectored(
                ::std::pin::Pin::new(&mut self.get_mut().$field),
                cx,
                bufs,
            )
        }

        #[inline]
        fn is_write_vectored(&self) -> bool {
            ::tokio::io::AsyncWrite::is_write_vectored(&self.$field)
        }

        $crate::passthrough::write_through!($field, flush_and_shutdown);
    };
    ($field:ident, flush_and_shutdown) => {
        #[inline]
        fn poll_flush(
            self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
        ) -> ::std::task::Poll<::std::io::Result<()>> {
            ::tokio::io::AsyncWrite::poll_flush(
                ::std::pin::Pin::new(&mut self.get_mut().$field),
                cx,
            )
        }

        #[inline]
        fn poll_shutdown(
            self: ::std::pin::Pin<&mut Self>,
            cx: &mut ::std::task::Context<'_>,
        ) -> ::std::task::Poll<::std::io::Result<()>> {
            ::tokio::io::AsyncWrite::poll_shutdown(
                ::std::pin::Pin::new(&mut self.get_mut().$field),
                cx,
            )
        }
    };
}

pub(crate) use write_through;
