//! The app's answer body, from whichever connection it came on: hyper's
//! HTTP/1 client, or an HTTP/2 stream of the crate's own client
//! (h2conn.rs).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::Error;
use crate::h2wire::client::RecvBody;

/// The app's HTTP/2 answer body: the client's [`RecvBody`] gives the
/// app its window back as the chunks are taken (a WINDOW_UPDATE once half
/// a window is), which upstream/h2.rs counts on, and yields the trailers
/// as its last frame. A wrapper: the client's types are the crate's own.
pub struct H2Body(RecvBody);

impl H2Body {
    pub(crate) fn new(body: RecvBody) -> Self {
        Self(body)
    }
}

pub enum AppBody {
    Http1(Incoming),
    Http2(H2Body),
}

/// The same call on whichever body it is.
macro_rules! either {
    ($body:expr, $b:ident => $call:expr) => {
        match $body {
            AppBody::Http1($b) => $call,
            AppBody::Http2(H2Body($b)) => $call,
        }
    };
}

impl Body for AppBody {
    type Data = Bytes;
    type Error = Error;

    fn is_end_stream(&self) -> bool {
        either!(self, b => b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        either!(self, b => b.size_hint())
    }

    /// Each connection's error kept as it is, in the crate's error.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            AppBody::Http1(b) => Pin::new(b).poll_frame(cx).map_err(Error::Upstream),
            AppBody::Http2(b) => Pin::new(&mut b.0)
                .poll_frame(cx)
                .map_err(Error::upstream_h2),
        }
    }
}
