//! What the server and client sides share: the stream map's hasher, the
//! field conversion for the encoder, the count of open connections the
//! spare buffer stacks are bounded by.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use std::collections::VecDeque;
use std::task::Waker;

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite};

use super::ErrorCode;
use super::frame::{self, FrameHeader, HEADER_LEN};
use super::hpack::{Decoder, Encoder, FieldRef, Limits};
use super::server::Error;
use crate::spare::{self, OutClass, ReadClass};

/// Bytes asked of the socket per read beyond what the current frame needs.
const READ_CHUNK: usize = 16 << 10;
/// Less room than this left in the read buffer: a new one is taken rather
/// than reading a few bytes per call.
const MIN_READ: usize = 1024;

/// Stream ids as keys. Looked up for every frame and every handle call
/// (about 27 hashes a gRPC call), where SipHash cost about 100 instructions
/// each. The client picks the ids, but at most twice the concurrent-stream
/// limit are in the map at once, so even ids chosen to collide cost a
/// short scan, never more.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// One multiplication (Fibonacci hashing), its high half folded into the
/// low one so that both hashbrown's bucket bits and its tag bits vary.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b) ^ (self.0 as u32).rotate_left(8));
        }
    }

    fn write_u32(&mut self, n: u32) {
        let h = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Connections open, on all threads: the spare stacks keep no more of
/// these buffers than that (so the last connection to close leaves at most
/// one behind), and at most [`H2_SPARE`] each.
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// A spare stack's most HTTP/2 buffers (16 KiB each): a few busy
/// connections turning idle and busy again reuse them; thousands of idle
/// ones hold none.
const H2_SPARE: usize = 16;

pub(crate) fn spare_room() -> usize {
    OPEN.load(Ordering::Relaxed).min(H2_SPARE)
}

/// Counts a connection in [`OPEN`] while it lives.
pub(crate) struct Counted(());

impl Counted {
    pub(crate) fn new() -> Self {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Counted(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) fn field<'a>(name: &'a http::HeaderName, value: &'a http::HeaderValue) -> FieldRef<'a> {
    let f = FieldRef::new(name.as_str().as_bytes(), value.as_bytes());
    if value.is_sensitive() {
        f.sensitive()
    } else {
        f
    }
}

/// One read into `buf`'s spare room (never zero-filled), sized for the
/// frame being read. The buffer comes from this thread's spare stack
/// (spare.rs) when the connection has none, and goes back there when it
/// goes idle: taking one from malloc and zeroing it on every idle-to-busy
/// turn was about 4,000 instructions a gRPC call (callgrind,
/// `PROFILE_LOAD=grpc`).
pub(crate) fn poll_read_frame<T: AsyncRead>(
    io: Pin<&mut T>,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    let have = buf.len();
    let need = if have < HEADER_LEN {
        HEADER_LEN - have
    } else {
        let b = &*buf;
        let len = u32::from_be_bytes([0, b[0], b[1], b[2]]);
        (HEADER_LEN + len as usize).saturating_sub(have)
    };
    if buf.capacity() == 0 {
        *buf = spare::take_bytes(ReadClass::Http2Client);
    }
    let room = buf.capacity() - have;
    if room < need || room < MIN_READ {
        // In place when no DATA payload still shares the allocation
        // (the consumed front is taken back), else a new one; the
        // partial frame moves over either way.
        buf.reserve(need.max(MIN_READ).max(READ_CHUNK.saturating_sub(have)));
    }
    tokio_util::io::poll_read_buf(io, cx, buf)
}

/// A stream's sending side: the data queued, its trailers, its window.
pub(crate) struct SendQueue {
    pub(crate) data: VecDeque<Bytes>,
    pub(crate) queued: usize,
    pub(crate) trailers: Option<HeaderMap>,
    pub(crate) window: i64,
    pub(crate) writable: Option<Waker>,
}

impl SendQueue {
    pub(crate) fn new(window: u32) -> Self {
        Self {
            data: VecDeque::new(),
            queued: 0,
            trailers: None,
            window: i64::from(window),
            writable: None,
        }
    }

    /// Writes one DATA frame of stream `id` into `out`, as much as the
    /// stream's window, the connection's (`conn_send`) and the peer's
    /// frame size allow; END_STREAM on it when `ending`, it carries the
    /// last of the data and no trailers follow. None if a window blocks
    /// it, else whether it was the last (trailers, if any, go next).
    pub(crate) fn write_frame(
        &mut self,
        id: u32,
        ending: bool,
        conn_send: &mut i64,
        peer_max_frame: u32,
        out: &mut Vec<u8>,
    ) -> Option<bool> {
        let room = self.window.min(*conn_send).min(i64::from(peer_max_frame));
        let n = usize::try_from(room).unwrap_or(0).min(self.queued);
        if n == 0 && !(self.queued == 0 && ending) {
            return None;
        }
        let last = ending && n == self.queued;
        let end_stream = last && self.trailers.is_none();
        FrameHeader {
            len: n as u32,
            kind: frame::DATA,
            flags: if end_stream {
                frame::FLAG_END_STREAM
            } else {
                0
            },
            stream: id,
        }
        .write(out);
        let mut left = n;
        while left > 0 {
            let Some(front) = self.data.front_mut() else {
                break;
            };
            let take = left.min(front.len());
            out.extend_from_slice(&front[..take]);
            front.advance(take);
            if front.is_empty() {
                self.data.pop_front();
            }
            left -= take;
        }
        self.queued -= n;
        self.window -= n as i64;
        *conn_send -= n as i64;
        if self.queued < peer_max_frame as usize
            && let Some(w) = self.writable.take()
        {
            w.wake();
        }
        Some(last)
    }
}

/// Encodes `trailers` and writes them as the stream's last HEADERS (and
/// CONTINUATIONs).
pub(crate) fn write_trailers(
    id: u32,
    trailers: &HeaderMap,
    encoder: &mut Encoder,
    block: &mut Vec<u8>,
    peer_max_frame: u32,
    out: &mut Vec<u8>,
) {
    block.clear();
    encoder.encode(trailers.iter().map(|(k, v)| field(k, v)), block);
    frame::write_header_block(id, true, block, peer_max_frame, out);
}

/// A stream's receiving side as its reader sees it: the chunks come in,
/// the window the reader has taken and not given back yet.
pub(crate) struct RecvWindow<'a> {
    pub(crate) chunks: &'a mut VecDeque<Bytes>,
    pub(crate) unreleased: &'a mut u32,
    pub(crate) window: &'a mut i64,
    /// END_STREAM came: nothing more is sent, no window goes back.
    pub(crate) ended: bool,
    /// SETTINGS_INITIAL_WINDOW_SIZE we announced.
    pub(crate) initial: u32,
}

impl RecvWindow<'_> {
    /// The reader's next chunk. Its window goes back to the stream once
    /// half the initial window is taken (one WINDOW_UPDATE, written into
    /// `out` when there is one: None once the connection is over); the
    /// connection's is the caller's (`release_conn` on both sides).
    /// Returns the chunk and whether a frame was written.
    pub(crate) fn take(self, id: u32, out: Option<&mut Vec<u8>>) -> Option<(Bytes, bool)> {
        let chunk = self.chunks.pop_front()?;
        if self.chunks.is_empty() {
            // An idle stream holds no queue's buffer.
            *self.chunks = VecDeque::new();
        }
        *self.unreleased += chunk.len() as u32;
        if self.ended || *self.unreleased < self.initial / 2 {
            return Some((chunk, false));
        }
        let increment = (*self.unreleased).min(frame::MAX_WINDOW);
        *self.window += i64::from(increment);
        *self.unreleased = 0;
        let Some(out) = out else {
            return Some((chunk, false));
        };
        frame::Frame::WindowUpdate {
            stream: id,
            increment,
        }
        .write(out);
        Some((chunk, true))
    }
}

/// The buffer on its way to the socket and how much of it is written.
/// Everything queued (`out` under the shared lock, DATA the windows allow
/// included) is swapped in whole and written with as few writes as the
/// socket takes; a partly written buffer is finished first while new
/// frames wait in `out` (no copy, and the unread output of a peer that
/// does not read stays within two buffers).
#[derive(Default)]
pub(crate) struct OutBuf {
    pub(crate) buf: Vec<u8>,
    pub(crate) written: usize,
}

impl OutBuf {
    /// Bytes not yet in the socket.
    pub(crate) fn unwritten(&self) -> usize {
        self.buf.len() - self.written
    }

    /// Takes `out` as the next buffer to write, an empty one left there.
    pub(crate) fn refill(&mut self, out: &mut Vec<u8>) {
        self.buf.clear();
        self.written = 0;
        if self.buf.capacity() == 0 {
            self.buf = spare::take_out(OutClass::Http2);
        }
        std::mem::swap(&mut self.buf, out);
    }

    /// Writes the rest: Ready(Ok) once all of it is in the socket.
    pub(crate) fn poll_drain<T: AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.written < self.buf.len() {
            match ready!(Pin::new(&mut *io).poll_write(cx, &self.buf[self.written..])) {
                Ok(0) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => self.written += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// All of it flushed: emptied, and its memory back to the spare stack
    /// if `give_back` (an idle connection holds no write buffer).
    pub(crate) fn flushed(&mut self, give_back: bool) {
        self.buf.clear();
        self.written = 0;
        if give_back {
            spare::give_out(OutClass::Http2, std::mem::take(&mut self.buf), spare_room());
        }
    }
}

/// A connection error of ours: GOAWAY(code) queued in `out` as the last
/// frame (naming `last_stream`, the peer's last stream we processed), and
/// the error the connection ends with once it is flushed.
pub(crate) fn goaway(
    out: &mut Vec<u8>,
    last_stream: u32,
    code: ErrorCode,
    reason: &'static str,
) -> Error {
    frame::Frame::GoAway {
        last_stream,
        code,
        debug: reason.as_bytes(),
    }
    .write(out);
    Error::Connection {
        code,
        reason,
        remote: false,
    }
}

/// The HPACK decoder of a connection that announced
/// `max_header_list_size`: no string and no decoded list past it, the
/// table at the default 4,096 octets we never raise.
pub(crate) fn header_decoder(max_header_list_size: u32) -> Decoder {
    let list = max_header_list_size as usize;
    Decoder::new(
        4096,
        Limits {
            max_string_len: list,
            max_list_size: list,
        },
    )
}

/// Puts `cx`'s task in `slot` unless it is there already (a clone is an
/// atomic increment, and the old waker's drop another).
pub(crate) fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

/// Frames one header block may take (CONTINUATION flood, CVE-2024-27316
/// class): cut before HPACK ever runs.
pub(crate) const MAX_BLOCK_FRAMES: u32 = 32;

type ConnError = (ErrorCode, &'static str);

/// A header block spread over HEADERS and CONTINUATIONs (§6.10), bounded
/// at [`MAX_BLOCK_FRAMES`] frames and `max` bytes: for a header list of
/// `max_header_list_size`, 1.5 times it plus 4 KiB (HPACK's literals and
/// Huffman codes can make a block somewhat larger than the list).
pub(crate) struct Assembly {
    pub(crate) stream: u32,
    pub(crate) end_stream: bool,
    pub(crate) buf: Vec<u8>,
    frames: u32,
}

impl Assembly {
    pub(crate) fn max_bytes(max_header_list_size: u32) -> usize {
        let list = max_header_list_size as usize;
        list + list / 2 + 4096
    }

    /// A HEADERS frame without END_HEADERS: the block's start.
    pub(crate) fn start(
        stream: u32,
        end_stream: bool,
        block: &[u8],
        max: usize,
    ) -> Result<Self, ConnError> {
        if block.len() > max {
            return Err((ErrorCode::ENHANCE_YOUR_CALM, "header block too large"));
        }
        Ok(Self {
            stream,
            end_stream,
            buf: block.to_vec(),
            frames: 1,
        })
    }

    /// A CONTINUATION added to the block being assembled: the whole block
    /// once END_HEADERS came.
    pub(crate) fn add(
        assembling: &mut Option<Self>,
        end_headers: bool,
        block: &[u8],
        max: usize,
    ) -> Result<Option<Self>, ConnError> {
        let Some(a) = assembling.as_mut() else {
            return Err((ErrorCode::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
        };
        a.frames += 1;
        if a.frames > MAX_BLOCK_FRAMES || a.buf.len() + block.len() > max {
            return Err((
                ErrorCode::ENHANCE_YOUR_CALM,
                "header block too large or in too many frames",
            ));
        }
        a.buf.extend_from_slice(block);
        Ok(if end_headers { assembling.take() } else { None })
    }
}

/// Empty DATA frames without END_STREAM a peer may send, net of
/// non-empty ones: each costs a frame's handling and carries nothing.
pub(crate) const EMPTY_DATA_LIMIT: u32 = 100;

/// The count against [`EMPTY_DATA_LIMIT`].
#[derive(Default)]
pub(crate) struct EmptyData(u32);

impl EmptyData {
    /// A DATA frame of `len` bytes: Err (ENHANCE_YOUR_CALM) once the
    /// empty ones are past the limit.
    pub(crate) fn count(&mut self, len: usize, end_stream: bool) -> Result<(), ConnError> {
        if len == 0 && !end_stream {
            self.0 += 1;
            if self.0 > EMPTY_DATA_LIMIT {
                return Err((ErrorCode::ENHANCE_YOUR_CALM, "too many empty DATA frames"));
            }
        } else if len > 0 {
            self.0 = self.0.saturating_sub(1);
        }
        Ok(())
    }
}

impl Windows {
    /// `n` bytes of the connection window are free again (readers took
    /// them, or they were dropped unread); once half of `conn_window` is,
    /// a WINDOW_UPDATE goes into `out` (None: the connection is over) and
    /// true says the writer must be woken.
    pub(crate) fn release(&mut self, n: u32, conn_window: u32, out: Option<&mut Vec<u8>>) -> bool {
        self.conn_unreleased = self.conn_unreleased.saturating_add(n);
        let Some(out) = out else {
            return false;
        };
        if self.conn_unreleased < conn_window / 2 {
            return false;
        }
        let increment = self.conn_unreleased.min(frame::MAX_WINDOW);
        frame::Frame::WindowUpdate {
            stream: 0,
            increment,
        }
        .write(out);
        self.conn_recv += i64::from(increment);
        self.conn_unreleased = 0;
        true
    }

    /// §6.9.2: 65,535 both ways until SETTINGS and WINDOW_UPDATE say more;
    /// ours raised to `conn_window` by the WINDOW_UPDATE we send first.
    pub(crate) fn new(conn_window: u32) -> Self {
        Self {
            peer_initial: 65_535,
            conn_send: 65_535,
            conn_recv: i64::from(conn_window),
            conn_unreleased: 0,
        }
    }
}

/// A connection's windows: the peer's initial stream window (its
/// SETTINGS), what we may still send on the connection, what the peer may
/// still send on it, and what readers took and we have not given back
/// yet (a WINDOW_UPDATE goes once it is half the connection window).
pub(crate) struct Windows {
    pub(crate) peer_initial: u32,
    pub(crate) conn_send: i64,
    pub(crate) conn_recv: i64,
    pub(crate) conn_unreleased: u32,
}
