//! A connection being served, whatever serves it (hyper, the HTTP/1 fast
//! path, the h2 server): one trait, so serve.rs runs every one under the
//! same timers and drain, and learns from its end whether the fast path
//! handed the connection on to hyper.

use std::error::Error as StdError;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};

use super::socket::Rewind;
use crate::http2::{Ending, H2Conn};

pub(crate) type BoxError = Box<dyn StdError + Send + Sync>;

/// How a served connection's future ended. `T`: the socket.
pub(crate) enum Outcome<T> {
    /// The connection is over (closed, cut, timed out).
    Done,
    /// The fast path met a request it does not serve, between messages:
    /// hyper serves the rest of the connection, the bytes read and not
    /// consumed replayed first. serve.rs makes the hand-over; the fast
    /// path never calls hyper itself.
    ToHyper(Rewind<T>),
}

/// A connection being served: runs until the connection ends (or is
/// handed over); `shutdown` starts a graceful end.
pub(crate) trait Served<T>: Future<Output = Result<Outcome<T>, BoxError>> + Send {
    fn shutdown(self: Pin<&mut Self>, why: Ending);
}

/// The HTTP/2 connection, its error boxed like hyper's. `T`: the socket
/// the connection's [`Outcome`] speaks of (h2 never hands over).
pub(super) struct H2Served<X, T> {
    conn: H2Conn<X>,
    socket: PhantomData<fn() -> T>,
}

impl<X, T> H2Served<X, T> {
    pub(super) fn new(conn: H2Conn<X>) -> Self {
        H2Served {
            conn,
            socket: PhantomData,
        }
    }
}

impl<X, T> Future for H2Served<X, T>
where
    X: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<Outcome<T>, BoxError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.get_mut().conn)
            .poll(cx)
            .map(|res| res.map(|()| Outcome::Done).map_err(Into::into))
    }
}

impl<X, T> Served<T> for H2Served<X, T>
where
    X: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    fn shutdown(self: Pin<&mut Self>, why: Ending) {
        self.get_mut().conn.shutdown(why);
    }
}
