//! The server side of the connection layer (RFC 9113 §5, §6, §8) on
//! [`super::frame`] and [`super::hpack`]: what the downstream HTTP/2 of
//! src/http2/ is to run on instead of the h2 crate (issue #39).
//!
//! Shape: one [`Connection`] owns the socket and is driven by one task
//! (`poll_accept`, then `poll_closed`). Each accepted stream hands out a
//! [`Respond`] (then a [`SendBody`]) and a [`RecvBody`], which may live in
//! other tasks: they share the streams' state with the connection through
//! one mutex (state.rs), append what they send to its output buffer
//! (HEADERS are HPACK-encoded there, so blocks reach the wire in the order
//! they were encoded) and wake the connection's task. That task reads
//! until the socket has nothing more, handles the frames, then moves the
//! DATA the windows allow into the same buffer and writes it all with one
//! `write`.
//!
//! Semantics the integration relies on:
//!
//! - `poll_accept`: Ready(Some(Ok)) per new request (already validated:
//!   §8.2/§8.3 for an intermediary; malformed ones are reset with
//!   PROTOCOL_ERROR and never seen); Ready(Some(Err)) once for a
//!   connection error (our GOAWAY flushed first, or the client's GOAWAY
//!   with an error code, `remote: true`), or an I/O error; Ready(None)
//!   when the client closed the socket, or after our or the client's
//!   GOAWAY once no stream is open (the socket is shut down first).
//! - Streams past SETTINGS_MAX_CONCURRENT_STREAMS, past our final GOAWAY's
//!   id, or arriving while the application still holds twice that many
//!   streams the client already reset, get REFUSED_STREAM (retryable).
//! - `graceful_shutdown`: GOAWAY(2^31-1) + PING; on the ACK, GOAWAY(last
//!   stream processed); later streams are refused with RST_STREAM.
//! - `final_goaway(n)`: streams above `n` are dropped without RST_STREAM
//!   (their handles get errors), GOAWAY(n) is written after whatever was
//!   queued, and nothing else: queued DATA not yet written for streams at
//!   or below `n` is not written either, so call it once
//!   `all_ends_written()`. Drive the close with `poll_closed`.
//! - `ends_written()`: streams whose END_STREAM or RST_STREAM has been
//!   written to the socket. `all_ends_written()`: every end decided (a
//!   handle queued END_STREAM or trailers, or a reset) is written, or can
//!   never be (the client reset the stream first).
//! - `send_data` fails once the stream holds `max_send_buffer` unsent
//!   bytes; `poll_writable` is Ready once less than one frame (the
//!   client's SETTINGS_MAX_FRAME_SIZE) is unsent.
//! - Dropping a `Respond` before `send_response`, or a `SendBody` before
//!   its end, resets the stream with CANCEL. Dropping the `RecvBody`
//!   gives its unread bytes back to the connection window; once the
//!   answer is complete a stream whose request has not ended is reset
//!   with NO_ERROR (§8.1).
//! - Abuse bounds: a header block is cut at 32 frames or
//!   `max_header_list_size * 1.5 + 4096` encoded bytes before HPACK runs;
//!   more than max(100, 2 * max_concurrent_streams) client resets a second
//!   of streams younger than 100 ms and unanswered, more than 100 empty
//!   DATA frames (net of non-empty ones), or more than
//!   `max_local_error_resets` streams reset for the client's errors end
//!   the connection with ENHANCE_YOUR_CALM; frames stop being read while
//!   64 KiB of output is unwritten (PING/SETTINGS floods from a client
//!   that reads nothing).
//!
//! Memory: the read buffer exists only while a frame is partly read or a
//! stream is open; the write buffers are given back once flushed with no
//! stream open; a stream's state is dropped once it is closed and its
//! handles are gone. [`Connection::heap_bytes`] adds it all up (about
//! 1 KiB for an idle connection, the connection struct included).

mod body;
mod conn;
mod frames;
mod handles;
mod state;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_abuse;
#[cfg(test)]
mod tests_fuzz;
#[cfg(test)]
mod tests_interop;

pub(crate) use body::RecvBody;
pub(crate) use handles::{Respond, SendBody};
pub(crate) use state::Connection;

use super::ErrorCode;

/// What we announce in our SETTINGS and enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerSettings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS; a stream past it is refused with
    /// REFUSED_STREAM before the application sees it (safe to retry).
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window.
    pub initial_window_size: u32,
    /// The connection's receive window, raised from 65,535 by a
    /// WINDOW_UPDATE on stream 0 right after our SETTINGS.
    pub connection_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE we accept.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request past it is reset
    /// (PROTOCOL_ERROR); its block is still decoded to keep HPACK in step.
    pub max_header_list_size: u32,
    /// Unsent answer bytes one stream may queue: past it `send_data` fails.
    pub max_send_buffer: usize,
    /// Streams we may reset because of the client's errors before the
    /// connection ends with GOAWAY(ENHANCE_YOUR_CALM).
    pub max_local_error_resets: usize,
}

impl Default for ServerSettings {
    /// The values src/http2/ uses.
    fn default() -> Self {
        Self {
            max_concurrent_streams: 100,
            initial_window_size: 256 << 10,
            connection_window_size: 1 << 20,
            max_frame_size: 16 << 10,
            max_header_list_size: 64 << 10,
            max_send_buffer: 400 << 10,
            max_local_error_resets: 1024,
        }
    }
}

/// Why a connection or a stream ended. Connection-level errors are the
/// ones `poll_accept`/`poll_closed` return; stream-level ones come from a
/// stream's handles.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The connection ended with a GOAWAY carrying `code`: sent by us
    /// (`remote` false) or received (`remote` true).
    #[error("HTTP/2 connection error {code:?} ({}): {reason}", if *remote { "from the client" } else { "sent" })]
    Connection {
        code: ErrorCode,
        reason: &'static str,
        remote: bool,
    },
    /// One stream was reset with `code`, by the client (`remote` true) or
    /// by us.
    #[error("HTTP/2 stream {id} reset {code:?} ({}): {reason}", if *remote { "by the client" } else { "by us" })]
    Stream {
        id: u32,
        code: ErrorCode,
        reason: &'static str,
        remote: bool,
    },
    /// The stream or the connection is gone (closed, or the connection
    /// ended) without a code addressed to this stream.
    #[error("HTTP/2 stream {id}: {reason}")]
    Closed { id: u32, reason: &'static str },
    #[error("HTTP/2 connection I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The code a GOAWAY or RST_STREAM carried, if any.
    pub(crate) fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Connection { code, .. } | Self::Stream { code, .. } => Some(*code),
            Self::Closed { .. } | Self::Io(_) => None,
        }
    }

    /// Whether the whole connection ended (not one stream).
    pub(crate) fn is_connection(&self) -> bool {
        matches!(self, Self::Connection { .. } | Self::Io(_))
    }
}
