//! The connection: the socket, the read and write loops, and the public
//! API the integration (src/http2/) calls. Frame handling is frames.rs.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::super::ErrorCode;
use super::super::frame::{self, Frame, MAX_WINDOW, Settings};
use super::super::hpack::{Encoder, EncoderOptions, HeaderBlock};
use super::state::{
    Abuse, Connection, Drain, Ends, GoAway, OUT_HIGH, Peer, ReadSide, Sealed, Shared, StreamMap,
    UserPing, WriteSide, lock,
};
use super::{Error, RecvBody, Respond, ServerSettings};
use crate::spare::{self, OutClass, ReadClass};

pub(super) use super::super::shared::{Counted, poll_read_frame, spare_room};
use super::super::shared::{OutBuf, Windows, goaway, header_decoder, register};

pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// After the close, the client's last bytes are read for at most this long
/// (see `poll_linger`).
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
/// PING payloads of ours, told apart in the ACKs.
pub(super) const GRACEFUL_PING: [u8; 8] = *b"kg-drain";
pub(super) const USER_PING: [u8; 8] = *b"kg-ping!";
/// Write rounds per wake-up before yielding to other tasks.
const WRITE_ROUNDS: usize = 4;
/// Reads per write round: a client that keeps the socket full still sees
/// its answers (and WINDOW_UPDATEs) go out.
const MAX_READS: usize = 8;

pub(super) type Accepted = (http::Request<RecvBody>, Respond);

/// Queues a PING of ours.
fn ping(out: &mut Vec<u8>, data: [u8; 8]) {
    Frame::Ping { ack: false, data }.write(out);
}

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// Our SETTINGS and the connection WINDOW_UPDATE are queued here and
    /// written at the first poll; the preface is read there too.
    pub fn new(io: T, mut settings: ServerSettings) -> Self {
        // What the protocol allows (§6.5.2): what we enforce is what we
        // announce.
        settings.initial_window_size = settings.initial_window_size.min(MAX_WINDOW);
        settings.max_frame_size = settings
            .max_frame_size
            .clamp(frame::DEFAULT_MAX_FRAME_SIZE, frame::MAX_FRAME_SIZE_LIMIT);
        settings.max_concurrent_streams = settings.max_concurrent_streams.max(1);
        let mut out = Vec::new();
        Frame::Settings {
            ack: false,
            settings: Settings {
                enable_push: Some(false),
                max_concurrent_streams: Some(settings.max_concurrent_streams),
                initial_window_size: Some(settings.initial_window_size),
                max_frame_size: Some(settings.max_frame_size),
                max_header_list_size: Some(settings.max_header_list_size),
                ..Settings::default()
            },
        }
        .write(&mut out);
        let conn_window = settings.connection_window_size.clamp(65_535, MAX_WINDOW);
        if conn_window > 65_535 {
            Frame::WindowUpdate {
                stream: 0,
                increment: conn_window - 65_535,
            }
            .write(&mut out);
        }
        let shared = Shared {
            streams: StreamMap::default(),
            open: 0,
            out,
            ends: Ends::default(),
            ready: VecDeque::new(),
            encoder: Encoder::new(4096, EncoderOptions::default()),
            block: Vec::new(),
            win: Windows::new(conn_window),
            conn_window,
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE,
            stream_window: settings.initial_window_size,
            max_send_buffer: settings.max_send_buffer,
            sealed: Sealed::Open,
            conn_waker: None,
            local_error_resets: 0,
            recent_resets: VecDeque::new(),
        };
        Self {
            io,
            shared: Arc::new(Mutex::new(shared)),
            settings,
            rd: ReadSide {
                buf: BytesMut::new(),
                decoder: header_decoder(settings.max_header_list_size),
                block: HeaderBlock::default(),
                names: Default::default(),
                assembling: None,
            },
            wr: WriteSide {
                out: OutBuf::default(),
                ends_in_buf: 0,
                ends_written: 0,
            },
            peer: Peer::new(),
            accepted: VecDeque::new(),
            drain: Drain::new(),
            abuse: Abuse::new(),
            closing: None,
            shut_down: false,
            finished: false,
            _counted: Counted::new(),
        }
    }

    /// Drives everything and yields new streams; Ready(None) once the
    /// connection ended cleanly, Ready(Some(Err)) once for an error.
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Accepted, Error>>> {
        self.poll_drive(cx)
    }

    /// Drives the connection without accepting: streams that arrive are
    /// refused (REFUSED_STREAM). Ready once it closed.
    pub fn poll_closed(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            match self.poll_drive(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(Some(Ok((_, mut respond)))) => {
                    respond.send_reset(ErrorCode::REFUSED_STREAM);
                }
            }
        }
    }

    pub fn client_settings(&self) -> Option<&[u8]> {
        self.peer.first_settings.as_deref()
    }

    /// §6.8 two steps: GOAWAY(2^31-1, NO_ERROR) and a PING now; the
    /// GOAWAY naming the last stream processed once the PING's ACK comes.
    pub fn graceful_shutdown(&mut self) {
        if self.drain.goaway != GoAway::None || self.closing.is_some() {
            return;
        }
        let mut sh = lock(&self.shared);
        if sh.sealed != Sealed::Open {
            return;
        }
        Frame::GoAway {
            last_stream: MAX_WINDOW,
            code: ErrorCode::NO_ERROR,
            debug: b"",
        }
        .write(&mut sh.out);
        ping(&mut sh.out, GRACEFUL_PING);
        self.drain.goaway = GoAway::PingSent;
        sh.wake_conn();
    }

    pub fn send_ping(&mut self) -> bool {
        if self.drain.user_ping == UserPing::Sent || self.closing.is_some() {
            return false;
        }
        let mut sh = lock(&self.shared);
        if sh.sealed != Sealed::Open {
            return false;
        }
        ping(&mut sh.out, USER_PING);
        self.drain.user_ping = UserPing::Sent;
        sh.wake_conn();
        true
    }

    /// Ready once the ACK of the last `send_ping` came (at once if no PING
    /// is outstanding). Needs the connection driven meanwhile.
    pub fn poll_pong(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.drain.user_ping == UserPing::Sent && self.closing.is_none() && !self.finished {
            self.drain.pong_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(())
    }

    /// Queues GOAWAY(last_stream_id, NO_ERROR) as the last frame: streams
    /// above it are dropped without RST, nothing is written after it, and
    /// the connection closes once it is flushed (drive with poll_closed).
    pub fn final_goaway(&mut self, last_stream_id: u32) {
        if self.drain.goaway == GoAway::Final || self.closing.is_some() {
            return;
        }
        let mut sh = lock(&self.shared);
        if matches!(sh.sealed, Sealed::Dead(..)) {
            return;
        }
        sh.sealed = Sealed::FinalGoaway;
        let above: Vec<u32> = sh
            .streams
            .keys()
            .copied()
            .filter(|id| *id > last_stream_id)
            .collect();
        for id in above {
            sh.reset_stream(id, ErrorCode::CANCEL, false);
        }
        Frame::GoAway {
            last_stream: last_stream_id,
            code: ErrorCode::NO_ERROR,
            debug: b"",
        }
        .write(&mut sh.out);
        self.drain.goaway = GoAway::Final;
        sh.wake_conn();
    }

    pub fn ends_written(&self) -> u64 {
        self.wr.ends_written
    }

    pub fn all_ends_written(&self) -> bool {
        lock(&self.shared).ends.all_written(self.wr.ends_written)
    }

    pub fn heap_bytes(&self) -> usize {
        let sh = lock(&self.shared);
        // The connection itself counts too: it lives in a spawned task's
        // future, on the heap.
        size_of::<Self>()
            + size_of::<Mutex<Shared>>()
            + 2 * size_of::<usize>()
            + sh.heap_bytes()
            + self.rd.buf.capacity()
            + self.wr.out.buf.capacity()
            + self.rd.decoder.memory()
            + self.rd.block.capacity()
            + self.rd.names.heap_bytes()
            + self.rd.assembling.as_ref().map_or(0, |a| a.buf.capacity())
            + self.peer.first_settings.as_ref().map_or(0, |s| s.len())
            + self.accepted.capacity() * size_of::<Accepted>()
    }

    #[cfg(test)]
    pub(super) fn heap_parts(&self) -> Vec<(&'static str, usize)> {
        let sh = lock(&self.shared);
        vec![
            ("streams", sh.streams.capacity()),
            ("out", sh.out.capacity()),
            ("block", sh.block.capacity()),
            ("ready", sh.ready.capacity()),
            ("encoder", sh.encoder.memory()),
            ("read_buf", self.rd.buf.capacity()),
            ("writing", self.wr.out.buf.capacity()),
            ("decoder", self.rd.decoder.memory()),
            ("hblock", self.rd.block.capacity()),
            ("accepted", self.accepted.capacity()),
        ]
    }

    fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Accepted, Error>>> {
        {
            let mut sh = lock(&self.shared);
            register(&mut sh.conn_waker, cx);
            if sh.out.capacity() == 0 {
                sh.out = spare::take_out(OutClass::Http2);
            }
        }
        // Reads until the socket has nothing more (or the output backs
        // up), handling frames as they come, then one write of all that
        // was queued: one `write` per wake-up unless DATA is still ready.
        let mut reads = 0;
        let mut rounds = 0;
        let mut read_skipped = false;
        loop {
            if let Some(a) = self.accepted.pop_front() {
                return Poll::Ready(Some(Ok(a)));
            }
            if self.finished {
                return Poll::Ready(None);
            }
            if self.closing.is_none() && self.drain.goaway != GoAway::Final {
                if let Err(e) = self.process() {
                    self.fail(e);
                }
                self.poll_held_ack(cx);
                if !self.accepted.is_empty() {
                    continue;
                }
            }
            let ending = self.closing.is_some() || self.drain.goaway == GoAway::Final;
            // Not reading while the output is backed up: once it is
            // written, the read must be tried again from here, since
            // bytes already in the socket wake nothing.
            let backed_up = self.backlog() >= OUT_HIGH;
            read_skipped |= !ending && reads < MAX_READS && backed_up;
            if !ending && reads < MAX_READS && !backed_up {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) => {
                        // Best effort: what is queued may still reach a
                        // client that only closed its sending side.
                        let _ = self.poll_write(cx);
                        self.finish(None, "the client closed the connection");
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Ok(_)) => {
                        reads += 1;
                        continue;
                    }
                    Poll::Ready(Err(e)) => {
                        self.finish(None, "I/O error");
                        return Poll::Ready(Some(Err(Error::Io(e))));
                    }
                    Poll::Pending => {}
                }
            }
            let flushed = match self.poll_write(cx) {
                Ok(f) => f,
                Err(e) => {
                    self.finish(None, "I/O error");
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
            };
            rounds += 1;
            if ending || self.should_close() {
                if !flushed {
                    return Poll::Pending;
                }
                if !self.shut_down {
                    match Pin::new(&mut self.io).poll_shutdown(cx) {
                        Poll::Pending => return Poll::Pending,
                        // The peer may be gone already: nothing to report.
                        Poll::Ready(_) => self.shut_down = true,
                    }
                }
                if self.poll_linger(cx).is_pending() {
                    return Poll::Pending;
                }
                let err = self.closing.take();
                self.finish(None, "connection closed");
                return Poll::Ready(err.map(Err));
            }
            // More to do without waiting for the socket: DATA the round's
            // output cap left in the queue, or reads cut by their budget.
            let more = flushed
                && (reads >= MAX_READS
                    || std::mem::take(&mut read_skipped)
                    || !lock(&self.shared).ready.is_empty());
            if more {
                if rounds < WRITE_ROUNDS {
                    reads = 0;
                    continue;
                }
                // Other tasks get their turn; this one comes back.
                cx.waker().wake_by_ref();
            }
            self.release_idle();
            return Poll::Pending;
        }
    }

    /// The graceful shutdown's second GOAWAY, once the hold on the PING's
    /// ACK is over ([`HeldAck`]); registers the wake-up for it otherwise.
    fn poll_held_ack(&mut self, cx: &mut Context<'_>) {
        let Some(held) = self.drain.held_ack.as_mut() else {
            return;
        };
        if held.release.as_mut().poll(cx).is_pending() || self.drain.goaway != GoAway::PingSent {
            return;
        }
        self.drain.held_ack = None;
        Frame::GoAway {
            last_stream: self.peer.last_id,
            code: ErrorCode::NO_ERROR,
            debug: b"",
        }
        .write(&mut lock(&self.shared).out);
        self.drain.goaway = GoAway::Sent(self.peer.last_id);
    }

    /// After our side is shut: reads (and drops) what the client still
    /// sends until it closes too, for at most [`LINGER`]. Closing with
    /// unread bytes makes the kernel send a reset, which can destroy the
    /// GOAWAY still in the client's receive buffer.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let linger = self
            .drain
            .linger
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
        let mut scratch = [0u8; 1024];
        // A client that keeps sending gets this much a turn, then the
        // other tasks theirs; the limit still ends it.
        for _ in 0..64 {
            let mut rb = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => continue,
                // The client closed, or the socket failed: done.
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => return linger.as_mut().poll(cx),
            }
        }
        if linger.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Output not yet written to the socket.
    fn backlog(&self) -> usize {
        self.wr.out.unwritten() + lock(&self.shared).out.len()
    }

    /// Nothing buffered, no stream open: the read-side buffers go back
    /// (the write side does the same once flushed, in poll_write).
    fn release_idle(&mut self) {
        if self.rd.buf.is_empty() && self.accepted.is_empty() && lock(&self.shared).open == 0 {
            spare::give_bytes(
                ReadClass::Http2Client,
                std::mem::take(&mut self.rd.buf),
                spare_room(),
            );
            self.rd.block = HeaderBlock::default();
            self.accepted = VecDeque::new();
        }
    }

    /// After a GOAWAY (ours or the client's) with nothing open.
    fn should_close(&self) -> bool {
        let going = matches!(self.drain.goaway, GoAway::Sent(_)) || self.peer.goaway_seen;
        going && lock(&self.shared).open == 0 && self.accepted.is_empty()
    }

    /// The connection is over: handles learn it.
    pub(super) fn finish(&mut self, code: Option<ErrorCode>, reason: &'static str) {
        self.finished = true;
        lock(&self.shared).kill(code, reason);
        if let Some(w) = self.drain.pong_waker.take() {
            w.wake();
        }
    }

    /// A connection error: GOAWAY(code) queued as the last frame.
    pub(super) fn fail(&mut self, (code, reason): (ErrorCode, &'static str)) {
        let mut sh = lock(&self.shared);
        self.closing = Some(goaway(&mut sh.out, self.peer.last_id, code, reason));
        sh.kill(Some(code), reason);
    }

    /// Writes what is queued; Ok(true) once all of it reached the socket.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> std::io::Result<bool> {
        loop {
            if self.wr.out.unwritten() == 0 {
                let mut guard = lock(&self.shared);
                let sh = &mut *guard;
                sh.fill();
                if sh.out.is_empty() {
                    break;
                }
                self.wr.out.refill(&mut sh.out);
                self.wr.ends_in_buf += sh.ends.in_out;
                sh.ends.in_out = 0;
            }
            match self.wr.out.poll_drain(&mut self.io, cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(r) => r?,
            }
            self.wr.ends_written += self.wr.ends_in_buf;
            self.wr.ends_in_buf = 0;
        }
        if Pin::new(&mut self.io).poll_flush(cx).is_pending() {
            return Ok(false);
        }
        let mut sh = lock(&self.shared);
        // Idle: the buffers go back (to this thread's spare stack when of
        // its size); the next burst takes them again.
        let idle = sh.open == 0 || self.wr.out.buf.capacity() > 2 * OUT_HIGH;
        self.wr.out.flushed(idle);
        if idle {
            if sh.out.is_empty() {
                spare::give_out(OutClass::Http2, std::mem::take(&mut sh.out), spare_room());
            }
            if sh.open == 0 {
                sh.block = Vec::new();
                if sh.ready.is_empty() {
                    sh.ready = Default::default();
                }
            }
        }
        Ok(true)
    }

    /// One read for the frame being read ([`poll_read_frame`]).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        poll_read_frame(Pin::new(&mut self.io), &mut self.rd.buf, cx)
    }
}
