//! What a request needs of its connection ([`ConnCtx`]), and the
//! connection's counters: bytes each way, requests in flight, and the
//! header timer's view of where an HTTP/1 message ends. The socket wrapper
//! (socket.rs) writes them; the timers (serve.rs, hyper.rs) and the
//! request paths read them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use http::header::{self, HeaderMap};

use crate::state::Shared;

/// What a request needs from its connection.
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Shared>,
    /// Its counters, inline: one allocation per connection for both.
    pub(crate) act: ConnActivity,
    /// The client's address, rendered once per connection for X-Forwarded-For.
    pub(in crate::proxy) peer_ip: crate::listen::ForwardedFor,
}

impl ConnCtx {
    /// Counts a request started on this connection (the sidecar's
    /// in-flight gauge, the connection's requests and in-flight count);
    /// [`ConnCtx::request_ended`] undoes it. Both request paths count
    /// through these two (handler.rs via body.rs's `RequestGuard`, the
    /// fast path via its `Scope`), so the accounting cannot differ.
    pub(in crate::proxy) fn request_started(&self) -> Instant {
        self.shared.metrics.request_started();
        self.act.inflight.fetch_add(1, Ordering::Relaxed);
        self.act.requests.fetch_add(1, Ordering::Relaxed);
        Instant::now()
    }

    /// Ends the accounting of a request started at `started`.
    pub(in crate::proxy) fn request_ended(&self, started: Instant) {
        self.act.inflight.fetch_sub(1, Ordering::Relaxed);
        self.shared.metrics.request_finished(started.elapsed());
    }
}

/// A stream offset not known (see [`ConnActivity::message_end`]).
const UNKNOWN: u64 = u64::MAX;
/// The last four bytes of a stream that ends a head (or a chunked body).
const CRLF_CRLF: u32 = u32::from_be_bytes(*b"\r\n\r\n");

/// Per-connection counters shared by the IO wrapper, the header timer and
/// the request path.
pub(crate) struct ConnActivity {
    /// Bytes read from the client: the idle check, the header timer and
    /// the HTTP/2 final GOAWAY's quiet check watch it move.
    pub(crate) bytes_read: AtomicU64,
    /// Bytes written to the client, and whether the last write had to
    /// wait for the client to read: the write timeout watches both.
    pub(super) bytes_written: AtomicU64,
    pub(super) write_blocked: AtomicBool,
    /// Requests (HTTP/2: streams) seen on this connection.
    pub(in crate::proxy) requests: AtomicU64,
    /// Requests whose response body has not ended yet.
    pub(in crate::proxy) inflight: AtomicU32,
    /// The header timer's view of pipelining (HTTP/1). While `head_scan`
    /// is on, the IO wrapper looks for the end of the head being read and
    /// stores its stream offset in `head_end`; the request path turns that
    /// into `message_end` (head plus Content-Length) so the timer of the
    /// next head can tell bytes already read past the previous message (a
    /// pipelined head, buffered inside hyper) from an idle connection.
    pub(super) head_scan: AtomicBool,
    pub(super) head_end: AtomicU64,
    message_end: AtomicU64,
    /// The last four bytes read, big-endian: a message without a known
    /// end (chunked) ended cleanly if the stream ends in CRLF CRLF.
    pub(super) tail: AtomicU32,
    /// What is written from now on is the connection's last: the socket
    /// closes right after it (see `Downstream::poll_write_last`, socket.rs).
    pub(crate) closing_after_write: AtomicBool,
}

impl ConnActivity {
    /// Fresh counters. `scan_first_head`: hyper's HTTP/1 server may serve
    /// the connection from its first request, so its header timer needs
    /// the first head's end. The fast path parses heads itself and HTTP/2
    /// has no heads to time; a connection the fast path hands to hyper
    /// later times its next head from the stream's tail instead (see
    /// [`ConnActivity::next_head_buffered`]). The scan looks at every byte
    /// read until the head ends: on a connection with one short request,
    /// a fortieth of the proxy's instructions.
    pub(super) fn new(scan_first_head: bool) -> Self {
        ConnActivity {
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            write_blocked: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            inflight: AtomicU32::new(0),
            // The first head starts at offset 0.
            head_scan: AtomicBool::new(scan_first_head),
            head_end: AtomicU64::new(UNKNOWN),
            message_end: AtomicU64::new(UNKNOWN),
            tail: AtomicU32::new(0),
            closing_after_write: AtomicBool::new(false),
        }
    }
}

impl ConnActivity {
    /// At the start of the wait for request head number 2, 3, ...: are
    /// bytes of it already read? Then its header timer must run at once.
    pub(super) fn next_head_buffered(&self) -> bool {
        let read = self.bytes_read.load(Ordering::Relaxed);
        let end = self.message_end.load(Ordering::Relaxed);
        let buffered = if end != UNKNOWN {
            read > end
        } else {
            // Without a known end, only a stream ending in CRLF CRLF is
            // surely between messages; a partial head never ends so.
            self.tail.load(Ordering::Relaxed) != CRLF_CRLF
        };
        self.head_end.store(UNKNOWN, Ordering::Relaxed);
        // The scan for this head's end is only right if it starts at the
        // head's first byte, i.e. nothing of it was read yet.
        self.head_scan.store(!buffered, Ordering::Relaxed);
        buffered
    }

    /// Remembers where this HTTP/1 request ends on the wire, for the header
    /// timer of the next one: the head's end (found by the IO wrapper) plus
    /// the Content-Length; unknown for chunked bodies (the stream tail tells).
    pub(in crate::proxy) fn note_message_end(&self, headers: &HeaderMap) {
        let head_end = self.head_end.swap(UNKNOWN, Ordering::Relaxed);
        let end = if head_end == UNKNOWN || headers.contains_key(header::TRANSFER_ENCODING) {
            UNKNOWN
        } else {
            let length = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            head_end.saturating_add(length)
        };
        self.message_end.store(end, Ordering::Relaxed);
    }
}
