//! The client side of the connection layer (RFC 9113 §5, §6, §8): what
//! the connections to the app run on (src/upstream/h2conn.rs; issue #39,
//! in place of the h2 crate's client).
//!
//! Shape, as on the server side: one [`Connection`] owns the socket and is
//! driven by one task (`poll` until it is Ready). [`SendRequest`] is
//! cloneable and opens streams from any task; each gives a
//! [`ResponseFuture`] (then a [`RecvBody`]) and, unless the request ended
//! with its HEADERS, a [`SendBody`]. They share the streams with the
//! connection through one mutex (state.rs), append HEADERS (HPACK-encoded
//! there, so blocks reach the wire in the order they were encoded) to its
//! output and wake its task, which reads until the socket has nothing
//! more, handles the frames, moves the DATA the windows allow into the
//! same buffer and writes it all with one `write`.
//!
//! Semantics src/upstream/ relies on:
//!
//! - `SendRequest::poll_ready`: Ready(Ok) while fewer streams are open
//!   than the app's SETTINGS_MAX_CONCURRENT_STREAMS (capped by ours,
//!   [`ClientSettings::max_concurrent_streams`]); `send_request` without a
//!   slot fails (nothing is sent).
//! - Retryable failures, told apart by [`Error::never_processed`]: a
//!   stream the app reset with REFUSED_STREAM, and streams above the
//!   last-stream-id of the app's GOAWAY (§6.8: not processed). After a
//!   GOAWAY no stream is opened; `poll` is Ready once the streams at or
//!   below its id are done.
//! - Responses are checked (§8.3.2 and the §8.2 field rules); a malformed
//!   one resets the stream with PROTOCOL_ERROR and its handles get the
//!   error. 1xx heads are skipped (a 101, or a 1xx ending the stream, is
//!   malformed). Trailers come as the body's last frame. An answer the
//!   app ends and then resets with NO_ERROR (§8.1) is read whole.
//! - Flow control both ways: the app's windows bound what `SendBody`
//!   writes; our receive windows are given back as the body is read (a
//!   WINDOW_UPDATE once half a window is taken).
//! - Bounds on what the app controls: the header list
//!   ([`ClientSettings::max_header_list_size`], a block cut at 32 frames
//!   or 1.5x that plus 4 KiB before HPACK runs), windows past 2^31-1
//!   (FLOW_CONTROL_ERROR), its MAX_CONCURRENT_STREAMS (capped by ours),
//!   SETTINGS_MAX_FRAME_SIZE (checked by frame.rs), ENABLE_PUSH=1 and
//!   PUSH_PROMISE (PROTOCOL_ERROR: we announce push off), more than 100
//!   empty DATA frames net of non-empty ones or more than 1024 streams
//!   reset for its errors (ENHANCE_YOUR_CALM); frames stop being read
//!   while 64 KiB of our output is unwritten (PING/SETTINGS floods).
//! - `SendRequest::close` (the last holder gone): our GOAWAY, no new
//!   stream, the connection ends once the open ones are done.
//! - PING: answered; `send_ping`/`poll_pong` for the keep-alive.

mod conn;
mod handles;
mod state;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_interop;

pub(crate) use super::server::Error;
pub(crate) use conn::Connection;
pub(crate) use handles::{RecvBody, ResponseFuture, SendBody, SendRequest};

use super::ErrorCode;

/// What we announce in our SETTINGS and enforce on the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientSettings {
    /// The most streams we open at once, whatever the app allows.
    pub max_concurrent_streams: u32,
    /// The most before the app's SETTINGS name its limit (§5.1.2 sets
    /// none; hyper's client assumed 100), capped by the above.
    pub initial_max_send_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    pub initial_window_size: u32,
    /// The connection's receive window (a WINDOW_UPDATE after SETTINGS).
    pub connection_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE we accept.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a response past it is reset.
    pub max_header_list_size: u32,
    /// Unsent request bytes one stream may queue: past it `send_data`
    /// fails.
    pub max_send_buffer: usize,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 1024,
            initial_max_send_streams: u32::MAX,
            initial_window_size: 256 << 10,
            connection_window_size: 1 << 20,
            max_frame_size: 16 << 10,
            max_header_list_size: 64 << 10,
            max_send_buffer: 400 << 10,
        }
    }
}

/// Reason given to streams above the app's GOAWAY: matched by
/// [`Error::never_processed`].
pub(crate) const ABOVE_GOAWAY: &str = "above the app's GOAWAY last-stream-id: never processed";

impl Error {
    /// The app never processed the request (REFUSED_STREAM, or a stream
    /// above its GOAWAY's last-stream-id): safe to send again, on another
    /// connection.
    pub(crate) fn never_processed(&self) -> bool {
        matches!(
            self,
            Error::Stream {
                code: ErrorCode::REFUSED_STREAM,
                remote: true,
                ..
            }
        )
    }
}
