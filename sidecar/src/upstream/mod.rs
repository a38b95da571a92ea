//! Everything between the sidecar and the app: the pooled keep-alive
//! connections to one app instance ([`client`]), and the choice between
//! several instances ([`slots`]).
//!
//! The app is one endpoint (TCP or a Unix socket), so the pool is ours and
//! small instead of hyper-util's general-purpose client (which hashes a pool
//! key, boxes futures and hands every request through a channel):
//!
//! - HTTP/1.1: a LIFO stack of idle `http1::SendRequest` handles
//!   ([`idle`], shared with the fast path's raw sockets). A connection goes
//!   back on the stack only once its response body ended cleanly. If a
//!   pooled socket turns out closed before the request was written, the
//!   request goes again on a fresh connection.
//! - HTTP/2 (prior knowledge, for HTTP/2 and gRPC downstream requests): one
//!   multiplexed connection per upstream shared by the downstream
//!   connections, with windows that keep unread answers from stalling the
//!   others, and a connection of its own for a downstream connection seen
//!   withholding its window ([`h2`]); each replaced when it closes or
//!   refuses new streams (the app's GOAWAY). The client is the h2 crate's
//!   own, driven directly ([`h2conn`]): a request opens its stream and
//!   waits for the answer in its own task; the connection, and request
//!   bodies still going when their answer came, run in one task
//!   ([`exec`]).
//!   An app that answers the HTTP/2 preface as HTTP/1.1 gets HTTP/2
//!   requests as HTTP/1.1 ([`downgrade`]); gRPC gets a clear error.
//!
//! The request body on its way ([`body`]) carries the body limits and
//! remembers whose fault a failed body was; it is kept ([`replay`]) so
//! that a request the app never saw can go again ([`retry`]). A connection to the app is a TCP or Unix socket ([`stream`]).

mod answer;
mod body;
mod client;
mod downgrade;
mod exec;
mod h2;
mod h2conn;
pub(crate) mod idle;
mod replay;
pub mod retry;
pub mod slots;
mod stream;

pub use answer::{AppBody, H2Body};
pub use body::{BodyError, BodyFault, BodyWatch, DownstreamBody, LimitedBody};
pub use client::{PoolReturn, Upstream, UpstreamResponse};
pub use downgrade::protocol_mismatch_response;
pub use h2::{Affinity, H2Slot, SHARED_STREAMS_PER_CLIENT, Stalled, share_all, with_affinity};
pub use replay::{RetryBody, UpstreamBody};
pub use stream::UpstreamStream;

/// A request on its way to the app, boxed: each level of the send
/// (handler's attempt and retries, the app connection's choice) is a
/// future nested in every waiting HTTP/2 stream's, and one holding the
/// request by value keeps its 344 bytes there after handing it on.
pub type SentRequest = Box<http::Request<UpstreamBody>>;

/// A request out of its box, the box freed now: `*boxed` alone frees it
/// only when the binding's scope ends, after the wait for the answer.
#[allow(clippy::boxed_local, reason = "taking the box is the point")]
pub(crate) fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}
