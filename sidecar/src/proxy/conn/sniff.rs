//! The protocol sniff: the first bytes of a connection tell the HTTP/2
//! preface from HTTP/1.

use std::io;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the sniff reads at a time: a whole request head, most often (the
/// fast path's read buffer, which it becomes).
const SNIFF_READ: usize = crate::proxy::h1::READ_BUF;

/// Reads until the first bytes are, or cannot be, the HTTP/2 preface.
/// Returns whether they are, and the bytes read (replayed to the server).
pub(super) async fn sniff_h2<S: AsyncRead + Unpin>(io: &mut S) -> io::Result<(bool, BytesMut)> {
    // Read straight into the buffer that goes on (as the HTTP/1 fast
    // path's read buffer, or replayed in front of hyper and h2), not
    // through an array in this future: that array sat in every
    // connection task (moved on spawn and on completion), and the copies
    // cost three allocations per connection.
    let mut seen = crate::proxy::h1::first_read_buffer();
    loop {
        if seen.len() == seen.capacity() {
            seen.reserve(SNIFF_READ);
        }
        let n = io.read_buf(&mut seen).await?;
        if n == 0 {
            return Ok((false, seen));
        }
        let m = seen.len().min(H2_PREFACE.len());
        if seen[..m] != H2_PREFACE[..m] {
            return Ok((false, seen));
        }
        if m == H2_PREFACE.len() {
            return Ok((true, seen));
        }
    }
}
