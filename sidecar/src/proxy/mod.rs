//! Serving downstream connections and forwarding their requests to the app.
//!
//! One task per connection. The first bytes tell HTTP/2 prior knowledge
//! (the preface) from HTTP/1.1: HTTP/1.1 (with upgrades) is served by
//! hyper, HTTP/2 by the h2 crate directly (http2.rs), so the drain can pick
//! its frames per client. Each task selects on the drain watch: at
//! `Closing` HTTP/1 closes once idle and HTTP/2 gets its GOAWAY sequence;
//! at the deadline the task drops the connection and counts it.
//!
//! Per request the cost is kept to atomics and header edits: no lock, no
//! boxing of bodies, and the route table and config come from one lock-free
//! snapshot load.
//!
//! The request path, in order, one module (proxy/*.rs) a step:
//!
//! 1. `conn`: the accepted socket is counted (bytes, heads, writes),
//!    sniffed for the HTTP/2 preface and served by the HTTP/1 fast path
//!    (`h1`), hyper (HTTP/1.1) or http2.rs, under the header-read, idle and
//!    write timers and the drain. When the fast path meets a request it
//!    does not serve, it gives the socket back and `conn` hands it to
//!    hyper: the dependencies run one way, `conn` -> `h1`, `handler`.
//! 2. `handler` (hyper's types) and `h1` (bytes): each request is counted,
//!    and `decide` decides, the same for both: its route (by method, host
//!    and normalized path), a declared body over the limit (413), and its
//!    route's circuit (a permit, or the fallback answer); the paths only
//!    carry that out. Then it goes to the app within the route's timeout;
//!    failures become local answers (408, 400, 502, 503, 504) counted as
//!    the client's or the app's.
//! 3. `headers`: on the way, hop-by-hop headers come off both the request
//!    and the response, `X-Forwarded-*` and `Host` are set, and only allowed
//!    upgrades pass. The rules themselves are `rules`' (and the path routes
//!    match is `path`'s), which the HTTP/1 fast path (`h1`) asks too, as it
//!    asks `local` how the proxy's own answers are framed.
//! 4. `body`: the response body streams to the client, carrying the
//!    request's accounting and circuit permit until its last frame.
//! 5. `tunnel`: after a `101 Switching Protocols`, both upgraded
//!    connections are joined and left to the drain's deadline.

mod body;
pub(crate) mod conn;
mod decide;
mod grpc_health;
pub(crate) mod h1;
mod handler;
mod headers;
mod lazy_tcp;
mod local;
mod path;
mod rules;
mod tunnel;

pub use body::ProxyBody;
pub(crate) use conn::{ConnCtx, Downstream, over_connection_cap, serve_connection};
pub(crate) use handler::handle;
pub(crate) use lazy_tcp::LazyTcp;
