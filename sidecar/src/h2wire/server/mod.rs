//! The server side of the connection layer (RFC 9113 §5, §6, §8) on
//! [`super::frame`] and [`super::hpack`]: what the downstream HTTP/2 of
//! src/http2/ runs on instead of the h2 crate.
//!
//! Shape: one [`Connection`] owns the socket and is driven by one task
//! (`poll_accept`, then `poll_closed`). Each accepted stream hands out a
//! [`Respond`] (then a [`SendBody`]) and a [`RecvBody`], which may live in
//! other tasks: they share the streams' state with the connection through
//! one mutex ([`state::Shared`]), append what they send to its output
//! buffer (HEADERS are HPACK-encoded there, in wire order) and wake the
//! connection's task, which writes everything queued with one `write` per
//! wake-up.
//!
//! Memory: the read buffer exists only while a frame is partly read or a
//! stream is open; the write buffers are given back once flushed with no
//! stream open; a stream's state is dropped once it is closed and its
//! handles are gone. [`Connection::heap_bytes`] adds it all up.

mod body;
mod conn;
mod frames;
mod handles;
mod state;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_abuse;
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
