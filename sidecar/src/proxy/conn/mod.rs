//! The connection: one task per accepted socket, from the protocol sniff
//! to the end of the connection, with the timers that guard it (header
//! read, idle, write) and the drain's shutdown and deadline. One file a job:
//!
//! - `serve`: the connection's task: sniff, pick who serves it, and run it
//!   under the timers and the drain; the fast path's hand-over to hyper.
//! - `sniff`: the HTTP/2 preface or not.
//! - `socket`: the downstream socket ([`Downstream`]), counted, and the
//!   bytes read ahead replayed in front of a server (`Rewind`).
//! - `activity`: what a request needs of its connection (`ConnCtx`): the
//!   counters the socket writes and the timers read, the client's address.
//! - `served`: what serves a connection (`Served`), and how it ended
//!   (`Outcome`); the h2 server's side of it.
//! - `hyper`: HTTP/1 by hyper, with its header-read timer.
//! - `woken`: the drain watch polled only when it has news.
//!
//! Imports go one way: the request paths (handler.rs, h1/) use
//! `activity`, `served` and `socket`, which import nothing of theirs; only
//! `serve` (and `sniff`, for the fast path's buffer) reach into h1/, and
//! `hyper` into handler.rs. The fast path never calls hyper: its future
//! ends with the socket (`Outcome::ToHyper`) and `serve` hands it over.

use crate::state::Shared;

// What the request paths (handler.rs, h1/) use of a connection: files
// that import nothing of those paths, so no import runs back to them.
pub(super) mod activity;
pub(super) mod served;
pub(super) mod socket;

mod hyper;
mod serve;
mod sniff;
pub(crate) mod woken;

pub(crate) use activity::ConnCtx;
pub(crate) use serve::serve_connection;
pub(crate) use socket::Downstream;

/// Past `limits.maxConnections` a new connection is closed at once (the
/// caller drops it), so the sockets, tasks and app connections already
/// open keep what they have. The admin port has its own limit.
pub(crate) fn over_connection_cap(shared: &Shared) -> bool {
    let cap = shared.live.load().config.limits.max_connections;
    if cap == 0 || shared.drain.open_connections() < cap {
        return false;
    }
    shared.metrics.connection_refused("proxy");
    tracing::debug!(
        limit = cap,
        "limits.maxConnections reached; closing a new connection"
    );
    true
}
