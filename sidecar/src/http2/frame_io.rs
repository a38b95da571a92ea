//! The HTTP/2 socket as h2 sees it (see the module docs of [`super`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::client::{ClientKind, classify};
use super::frames::{FLAG_ACK, FRAME_HEADERS, FRAME_PING, FRAME_SETTINGS, FrameCursor, Scan};
use super::wire::Wire;

/// The client's ack of h2's shutdown PING is handed to h2 at least this
/// much later than it arrives: a client (the h2 crate's) can write that
/// ack before the HEADERS of a stream it opened just before it read the
/// first GOAWAY, and h2 fixes the final GOAWAY's last-stream-id on the ack,
/// so that stream would be refused. A PING ack has no ordering tie to other
/// frames. 20 ms lost a hyper request (1 of 1,813) on a machine whose both
/// cores were busy with a benchmark beside the test: the client's request
/// task ran that much later than its connection task.
const SHUTDOWN_ACK_DELAY: Duration = Duration::from_millis(100);
/// A stream opened while the ack is held is evidence that the client is
/// still writing what it queued before it read the GOAWAY: the ack waits
/// until this long after the latest one...
const SHUTDOWN_ACK_QUIET: Duration = Duration::from_millis(50);
/// ...but never longer than this after it arrived (a client that keeps
/// opening streams regardless is not waited for).
const SHUTDOWN_ACK_MAX_HOLD: Duration = Duration::from_secs(1);
/// h2's shutdown PING payload (h2 `frame::Ping::SHUTDOWN`).
const SHUTDOWN_PING: [u8; 8] = [0x0b, 0x7b, 0xa2, 0xf0, 0x8b, 0x9b, 0xfe, 0x54];

/// After the close, read (and drop) what the client still sends for at
/// most this long, so unread bytes do not turn the close into a reset that
/// could destroy the GOAWAY in the client's receive buffer.
const LINGER: Duration = Duration::from_secs(1);

const PREFACE_LEN: usize = 24;
/// Longer SETTINGS are not python's h2 (it sends six entries).
const MAX_SNIFFED_SETTINGS: usize = 256;

/// The HTTP/2 socket as h2 sees it: notes the client's kind on the way in
/// and the server's frames on the way out (see the module docs).
pub(super) struct FrameIo<T> {
    inner: T,
    wire: Arc<Wire>,
    /// The client's first bytes until its kind is known.
    sniff: Option<Vec<u8>>,
    out: FrameCursor,
    /// The final GOAWAY is out: h2's further writes go nowhere.
    sealed: bool,
    shut: bool,
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client's preface bytes still to skip before its frames.
    preface_left: usize,
    /// Where the reader is in the client's frames.
    inbound: FrameCursor,
    /// The shutdown PING's ack, held back (see [`SHUTDOWN_ACK_DELAY`]).
    held_ack: Option<HeldAck>,
}

/// The client's ack of the shutdown PING while it is kept from h2.
struct HeldAck {
    frame: [u8; 17],
    arrived: tokio::time::Instant,
    release: Pin<Box<tokio::time::Sleep>>,
}

impl HeldAck {
    fn new(frame: [u8; 17]) -> Self {
        HeldAck {
            frame,
            arrived: tokio::time::Instant::now(),
            release: Box::pin(tokio::time::sleep(SHUTDOWN_ACK_DELAY)),
        }
    }

    /// A stream opened while held: release no sooner than the quiet
    /// period after it, within the longest hold.
    fn stream_opened(&mut self) {
        let latest = self.arrived + SHUTDOWN_ACK_MAX_HOLD;
        let quiet = (tokio::time::Instant::now() + SHUTDOWN_ACK_QUIET).min(latest);
        if quiet > self.release.deadline() {
            self.release.as_mut().reset(quiet);
        }
    }
}

impl<T> FrameIo<T> {
    pub(super) fn new(inner: T, wire: Arc<Wire>) -> Self {
        FrameIo {
            inner,
            wire,
            sniff: Some(Vec::with_capacity(64)),
            out: FrameCursor::default(),
            sealed: false,
            shut: false,
            linger: None,
            preface_left: PREFACE_LEN,
            inbound: FrameCursor::default(),
            held_ack: None,
        }
    }

    fn sniffed(&mut self, data: &[u8]) {
        let Some(sniff) = self.sniff.as_mut() else {
            return;
        };
        let room = PREFACE_LEN + 9 + MAX_SNIFFED_SETTINGS - sniff.len();
        sniff.extend_from_slice(&data[..data.len().min(room)]);
        let kind = match sniff.get(PREFACE_LEN..PREFACE_LEN + 9) {
            None => return,
            Some(h) => {
                let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                if h[3] != FRAME_SETTINGS || len > MAX_SNIFFED_SETTINGS {
                    ClientKind::Conforming
                } else {
                    let start = PREFACE_LEN + 9;
                    match sniff.get(start..start + len) {
                        Some(settings) => classify(settings),
                        None => return,
                    }
                }
            }
        };
        self.wire.kind.store(kind as u8, Ordering::Release);
        self.sniff = None;
    }
}

impl<T> FrameIo<T> {
    /// Moves the cursor over bytes the socket took, noting stream ends.
    fn advance(&mut self, written: &[u8], patching: bool) -> Scan {
        let wire = &self.wire;
        self.out.walk(written, patching, |frame| {
            if frame.ends_stream() {
                wire.end_written(frame.stream_id());
            }
        })
    }
}

impl<T> FrameIo<T> {
    /// Walks the bytes just read (`buf[from..]`), taking out an ack of the
    /// shutdown PING that lies whole in them; returns the new length.
    fn filter_inbound(&mut self, buf: &mut [u8], from: usize) -> usize {
        let mut end = buf.len();
        let mut i = from;
        let skip = self.preface_left.min(end - i);
        self.preface_left -= skip;
        i += skip;
        while i < end {
            let at_boundary = self.inbound.header_len == 0 && self.inbound.remaining == 0;
            if at_boundary
                && self.held_ack.is_none()
                && end - i >= 17
                && buf[i..i + 5] == [0, 0, 8, FRAME_PING, FLAG_ACK]
                && buf[i + 9..i + 17] == SHUTDOWN_PING
            {
                let mut ack = [0u8; 17];
                ack.copy_from_slice(&buf[i..i + 17]);
                buf.copy_within(i + 17..end, i);
                end -= 17;
                self.held_ack = Some(HeldAck::new(ack));
                continue;
            }
            // Up to the end of the current header or payload, so every
            // frame start is looked at above. Never 0: a frame's end resets
            // the cursor within `walk`.
            let step = if usize::from(self.inbound.header_len) < 9 {
                9 - usize::from(self.inbound.header_len)
            } else {
                self.inbound.remaining as usize
            }
            .min(end - i);
            let mut opened_stream = false;
            self.inbound.walk(&buf[i..i + step], false, |frame| {
                opened_stream |= frame.kind() == FRAME_HEADERS;
            });
            if opened_stream && let Some(held) = self.held_ack.as_mut() {
                held.stream_opened();
            }
            i += step;
        }
        end
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FrameIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A held ack goes to h2 once its delay is over, between frames.
        if let Some(held) = this.held_ack.as_mut()
            && this.inbound.header_len == 0
            && this.inbound.remaining == 0
            && buf.remaining() >= held.frame.len()
            && held.release.as_mut().poll(cx).is_ready()
        {
            buf.put_slice(&held.frame[..]);
            this.held_ack = None;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        let after = buf.filled().len();
        if after > before {
            if this.sniff.is_some() {
                let new = buf.filled()[before..].to_vec();
                this.sniffed(&new);
            }
            let kept = this.filter_inbound(buf.filled_mut(), before);
            buf.set_filled(kept);
            if kept == before {
                // All of it was the held ack: nothing for h2 yet, but the
                // read must not look like EOF.
                if let Some(held) = this.held_ack.as_mut() {
                    let _ = held.release.as_mut().poll(cx);
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        res
    }
}

impl<T: AsyncWrite + AsyncRead + Unpin> AsyncWrite for FrameIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealed {
            // Nothing may follow the final GOAWAY.
            return Poll::Ready(Ok(buf.len()));
        }
        let patching = this.wire.final_set.load(Ordering::Acquire);
        // A dry run on a copy of the cursor: where the final GOAWAY's id
        // lies and where it ends; the real cursor only moves over what
        // the socket took.
        let mut dry = this.out;
        let plan = dry.walk(buf, patching, |_| {});
        let patched: Vec<u8>;
        let data = if plan.patch.is_empty() {
            &buf[..plan.keep]
        } else {
            // Once per connection: the final GOAWAY.
            let id = this.wire.final_id.load(Ordering::Acquire).to_be_bytes();
            let mut copy = buf[..plan.keep].to_vec();
            for &(at, k) in &plan.patch {
                if let Some(byte) = copy.get_mut(at) {
                    *byte = id[k];
                }
            }
            patched = copy;
            &patched[..]
        };
        let n = match Pin::new(&mut this.inner).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let done = this.advance(&buf[..n], patching);
        if done.final_end && n == plan.keep {
            this.sealed = true;
            // The rest of `buf` is dropped, as promised above.
            return Poll::Ready(Ok(buf.len()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.sealed || this.wire.final_set.load(Ordering::Acquire) {
            // The final GOAWAY may need rewriting (or is out): one slice
            // at a time, through the path that can.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return Pin::new(this).poll_write(cx, first);
        }
        let n = match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        let mut left = n;
        for slice in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(slice.len());
            this.advance(&slice[..take], false);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            match Pin::new(&mut this.inner).poll_shutdown(cx) {
                Poll::Ready(Ok(())) => this.shut = true,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        // Lingering close: drain what the client still sends until it
        // closes too, or LINGER passes.
        let mut scratch = [0u8; 4096];
        loop {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        let linger = this
            .linger
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
        linger.as_mut().poll(cx).map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http2::frames::frame;

    #[tokio::test]
    async fn the_shutdown_ping_ack_is_taken_out_between_frames_and_others_pass() {
        let mut io = FrameIo::new((), Arc::new(Wire::default()));
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 0]));
        let settings_end = wire.len();
        wire.extend(frame(FRAME_PING, FLAG_ACK, 0, &SHUTDOWN_PING));
        let headers = frame(FRAME_HEADERS, 0x5, 3, &[0x82, 0x86]);
        wire.extend(&headers);
        // Read in two parts: the preface and SETTINGS, then the rest.
        let mut buf = wire.clone();
        let kept = io.filter_inbound(&mut buf[..settings_end], 0);
        assert_eq!(kept, settings_end);
        let kept = io.filter_inbound(&mut buf, settings_end);
        assert_eq!(&buf[..kept], [&wire[..settings_end], &headers[..]].concat());
        assert!(io.held_ack.is_some(), "the shutdown ack is held");

        // A user PING's ack passes where it is.
        let mut io = FrameIo::new((), Arc::new(Wire::default()));
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_PING, FLAG_ACK, 0, &[1; 8]));
        let mut buf = wire.clone();
        assert_eq!(io.filter_inbound(&mut buf, 0), wire.len());
        assert!(io.held_ack.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn streams_opened_while_the_ack_is_held_keep_it_held_a_while() {
        let mut io = FrameIo::new((), Arc::new(Wire::default()));
        let mut wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        wire.extend(frame(FRAME_PING, FLAG_ACK, 0, &SHUTDOWN_PING));
        let mut buf = wire.clone();
        io.filter_inbound(&mut buf, 0);
        let held = io.held_ack.as_ref().expect("held");
        let first_release = held.release.deadline();
        assert_eq!(first_release, held.arrived + SHUTDOWN_ACK_DELAY);

        // A stream 90 ms after the ack: released 50 ms after it, not at 100.
        tokio::time::advance(Duration::from_millis(90)).await;
        let mut headers = frame(FRAME_HEADERS, 0x5, 3, &[0x82, 0x86]);
        let len = headers.len();
        assert_eq!(io.filter_inbound(&mut headers, 0), len, "HEADERS pass");
        let held = io.held_ack.as_ref().expect("held");
        assert_eq!(
            held.release.deadline(),
            held.arrived + Duration::from_millis(90) + SHUTDOWN_ACK_QUIET
        );

        // Streams forever: never held past the longest hold.
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(40)).await;
            let mut headers = frame(FRAME_HEADERS, 0x5, 5, &[0x82, 0x86]);
            io.filter_inbound(&mut headers, 0);
        }
        let held = io.held_ack.as_ref().expect("held");
        assert_eq!(
            held.release.deadline(),
            held.arrived + SHUTDOWN_ACK_MAX_HOLD
        );
    }
}
