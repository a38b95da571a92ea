//! An upgraded WebSocket at the drain deadline (`drain.websocketClose:
//! goingAway`): instead of a TCP cut, each peer gets a Close frame with
//! 1001 (Going Away), the close handshake runs for at most
//! `drain.websocketCloseWait`, then the TCP connection closes.
//!
//! The sidecar is the server to the client and the client to the app, so
//! the Close toward the app is masked with a fresh random key (RFC 6455
//! §5.3) and the one toward the client is not. Each is written at a frame
//! boundary of its direction ([`frames`]); a direction inside a frame at
//! the close point gets its Close right after that frame, or none if the
//! frame does not end within the wait.
//!
//! The sessions do not all close at the deadline: each picks a random
//! point in `drain.websocketCloseWindow`, which ends at the deadline (less
//! the handshake wait, so every handshake fits), and a thousand clients
//! reconnect over the window instead of in the same millisecond.
//!
//! Other upgrades and TCP mode keep the plain tunnel ([`crate::tunnel`]).

mod frames;
mod relay;

pub(crate) use relay::{SessionEnd, run};
