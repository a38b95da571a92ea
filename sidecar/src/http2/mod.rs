//! Downstream HTTP/2, served on the h2 crate's server so the drain can
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
//! h2 cannot send a GOAWAY with a chosen last-stream-id, nor say when a
//! stream's last frame reached the socket, so [`FrameIo`](frame_io::FrameIo) watches the
//! frames h2 writes: it notes each stream's final frame, rewrites the
//! last-stream-id of the final GOAWAY and drops anything h2 would write
//! after it.
//!
//! The parts: [`client`] tells the two kinds of client apart, [`frames`]
//! reads frame headers out of a byte stream, [`frame_io`] is the socket as
//! h2 sees it, [`wire`] is what the connection, its streams and the socket
//! share, [`conn`] drives one connection and its end, and [`stream`] serves
//! one stream.

mod client;
mod conn;
mod frame_io;
mod frames;
mod stream;
mod wire;

pub(crate) use conn::{Ending, H2Conn};
pub use stream::H2Body;
