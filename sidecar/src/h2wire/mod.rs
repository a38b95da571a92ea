//! The sidecar's own HTTP/2 codec, written from RFC 9113 (HTTP/2) and RFC
//! 7541 (HPACK). Clients' connections run on its server side
//! ([`server`], driven by src/http2/); the connections to the app still run
//! on the h2 crate's client (src/upstream/), the next part to move: its
//! replacement, [`client`], exists and is tested but is not wired in yet.
//!
//! Why a codec of our own (issue #39): profiles of the h2 path put HPACK
//! encode (13%) and decode (9%), memcpy (14%) and `http::HeaderMap`
//! building among the top costs, and an idle h2 connection holds 16 KiB of
//! write and 8 KiB of read buffer for its whole life (21.9 KiB against
//! nginx's and HAProxy's 6.5 KiB). The HTTP/1.1 path already left hyper for
//! the same reasons (src/proxy/h1/).
//!
//! What exists:
//!
//! - [`hpack`]: the HPACK decoder and encoder. The decoder writes a header
//!   block into one reusable buffer as byte ranges (no allocation per
//!   header, no `HeaderMap`), bounds every integer, string and the decoded
//!   list size, and enforces the table size we advertised. The encoder
//!   indexes a small set of repeated fields (:authority, content-type,
//!   grpc-status, gRPC method paths...), never indexes sensitive or
//!   per-request values, and by default Huffman-codes a string only when
//!   shorter.
//! - [`server`]: the server connection layer on both: stream states,
//!   header-block assembly with its bounds, flow control both ways, field
//!   validation for an intermediary, the drain's GOAWAY sequences, abuse
//!   limits, buffers sized by use (server/mod.rs lists the semantics).
//! - [`client`]: the client connection layer: requests with bodies and
//!   trailers, answers checked (§8.3), flow control both ways, the app's
//!   REFUSED_STREAM and streams above its GOAWAY reported as never
//!   processed (retryable), its MAX_CONCURRENT_STREAMS as stream slots,
//!   PING, the same abuse bounds as the server's. shared.rs holds what
//!   both sides use (the send queue and DATA writer, the receive and
//!   connection windows, the frame read and the write buffer, header-block
//!   assembly, the empty-DATA bound, the stream-id map); validate.rs the
//!   field checks of requests, answers and trailers.
//! - [`frame`]: frame headers and every RFC 9113 §6 frame type, parsed from
//!   a payload slice (borrowing, no copies) and written into a buffer, with
//!   the length, stream-id, padding and per-setting checks of §4 and §6,
//!   each violation named with the error code and whether it ends the
//!   connection or one stream; [`frame::write_header_block`] splits a
//!   block into HEADERS and CONTINUATIONs.
//!
//! The tests: RFC 7541 Appendix C both ways (decoder output and table, and
//! the encoder's exact bytes), every bound at its limit and one past it,
//! properties (HPACK round trips with the tables in step, arbitrary bytes
//! never panic), and interop_tests.rs, where the h2 crate is the client
//! and this code the server.
//!
//! The server layer covers items 1 to 7 below for the server side, the
//! client layer those that apply to a client. The list, as written before
//! the server layer:
//!
//! 1. Stream states (§5.1): idle/open/half-closed/closed per stream id,
//!    the monotonic stream-id rule, MAX_CONCURRENT_STREAMS and REFUSED_STREAM.
//! 2. Header block assembly: HEADERS + CONTINUATION on one stream with
//!    nothing interleaved (§6.10), with a CONTINUATION-flood limit (bytes and
//!    frames per block, CVE-2024-27316 class) before HPACK ever runs.
//! 3. Flow control (§5.2, §6.9): connection and stream windows, window
//!    overflow as FLOW_CONTROL_ERROR, the initial-window change applied to
//!    open streams.
//! 4. Abuse limits: rapid reset (CVE-2023-44487: RST_STREAM or refused
//!    streams per interval), SETTINGS/PING floods, empty DATA frames.
//! 5. Field validation for an intermediary (§8.2): lowercase names, no
//!    connection-specific fields, pseudo-headers first and once, CR/LF/NUL
//!    in values; the decoder's [`hpack::HeaderBlock`] is the input.
//! 6. The drain's GOAWAY choices of src/http2/ (mod.rs: the two-step GOAWAY
//!    with PING for conforming clients, one final GOAWAY naming the last
//!    accepted stream for Python's h2), now written directly instead of
//!    rewriting what h2 emits (http2/frame_io.rs).
//! 7. Buffers sized by use: read into a small buffer and grow only for a
//!    frame that needs it, so an idle connection holds a few hundred bytes.

// Parts of the codec that only the tests use (error codes neither side
// sends, encoder options, table and memory accessors); imports are
// checked.
#![allow(dead_code)]

pub(crate) mod client;
pub(crate) mod frame;
pub(crate) mod hpack;
pub(crate) mod server;
mod shared;
mod validate;

#[cfg(test)]
mod frame_tests;
#[cfg(test)]
mod interop_tests;

/// An HTTP/2 error code (RFC 9113 §7). Codes this endpoint does not know
/// are kept as they came: §7 says they must not trigger special behaviour,
/// and a GOAWAY's code is passed on in logs as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ErrorCode(pub(crate) u32);

impl ErrorCode {
    pub(crate) const NO_ERROR: Self = Self(0x0);
    pub(crate) const PROTOCOL_ERROR: Self = Self(0x1);
    pub(crate) const INTERNAL_ERROR: Self = Self(0x2);
    pub(crate) const FLOW_CONTROL_ERROR: Self = Self(0x3);
    pub(crate) const SETTINGS_TIMEOUT: Self = Self(0x4);
    pub(crate) const STREAM_CLOSED: Self = Self(0x5);
    pub(crate) const FRAME_SIZE_ERROR: Self = Self(0x6);
    pub(crate) const REFUSED_STREAM: Self = Self(0x7);
    pub(crate) const CANCEL: Self = Self(0x8);
    pub(crate) const COMPRESSION_ERROR: Self = Self(0x9);
    pub(crate) const CONNECT_ERROR: Self = Self(0xa);
    pub(crate) const ENHANCE_YOUR_CALM: Self = Self(0xb);
    pub(crate) const INADEQUATE_SECURITY: Self = Self(0xc);
    pub(crate) const HTTP_1_1_REQUIRED: Self = Self(0xd);
}
