//! Downstream HTTP/2, served on the sidecar's own codec so the drain can
//! choose its frames per connection (docs/http2-drain.md).
//!
//! hyper's server has one way to end an HTTP/2 connection: GOAWAY(2^31-1),
//! PING, then GOAWAY(last stream) on the PING ack. Conforming clients
//! (hyper, Go, gRPC) need exactly that: the first GOAWAY stops them
//! opening streams before the server fixes its last stream id. Python's h2
//! (under httpx) moves its whole connection to CLOSED on the first GOAWAY
//! and then fails on the PING and on the responses of every stream still
//! in flight (python-hyper/h2#1181). For such a client the connection
//! instead stops dispatching new streams (they are held, unanswered),
//! lets the accepted ones finish, and then sends one GOAWAY naming the last
//! accepted stream as the very last frame before the close. The held
//! streams are above that id, so the app never saw them and the client
//! retries them elsewhere (httpcore 1.x does so on a new connection).
//!
//! Which client is which is read from its first SETTINGS frame (see
//! [`classify`](client::classify)); `drain.http2GoAway` forces one behaviour for all.
//!
//! The connection runs on the sidecar's own HTTP/2 codec
//! ([`crate::h2wire::server`]), which writes each GOAWAY with the
//! last-stream-id the drain chooses and says when every stream's last frame
//! reached the socket.
//!
//! The parts: [`client`] tells the two kinds of client apart, [`wire`] is
//! what the connection and its streams share, [`conn`] drives one
//! connection and its end, and [`stream`] serves one stream.

mod client;
mod conn;
mod stream;
mod wire;

pub(crate) use conn::{Ending, H2Conn};
