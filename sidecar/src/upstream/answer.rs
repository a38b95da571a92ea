//! The app's answer body, from whichever connection it came on: hyper's
//! HTTP/1 client, or an HTTP/2 stream read through h2 directly
//! (h2conn.rs).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::Error;
use crate::http2::H2Body;

pub enum AppBody {
    Http1(Incoming),
    Http2(H2Body),
}

impl Body for AppBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.get_mut() {
            AppBody::Http1(body) => Pin::new(body).poll_frame(cx).map_err(Error::Upstream),
            AppBody::Http2(body) => Pin::new(body).poll_frame(cx).map_err(Error::UpstreamH2),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AppBody::Http1(body) => body.is_end_stream(),
            AppBody::Http2(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AppBody::Http1(body) => body.size_hint(),
            AppBody::Http2(body) => body.size_hint(),
        }
    }
}
