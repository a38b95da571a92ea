//! The state the connection's task shares with the streams' handles, under
//! one mutex: the streams, the output buffer (so HEADERS are encoded in
//! the order they reach the wire) and the send windows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use super::super::shared::{SendQueue, write_trailers};

/// The streams by id (the client picks the ids, but at most twice the
/// concurrent-stream limit are in the map at once).
pub(super) type StreamMap = super::super::shared::IdMap<Stream>;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use std::time::{Duration, Instant};

use super::super::ErrorCode;
use super::super::frame::{Frame, MAX_WINDOW};
use super::super::hpack::{Decoder, Encoder, HeaderBlock};
use super::conn::Accepted;
use super::{Error, ServerSettings};

/// Output queued past this stops the reading of frames (a client that
/// reads nothing cannot make us buffer its PING and SETTINGS answers) and
/// the filling of DATA for this wake-up.
pub(super) const OUT_HIGH: usize = 64 << 10;

pub(super) type SharedRef = Arc<Mutex<Shared>>;

/// Locks, ignoring poisoning: no code under this lock panics on input,
/// and a handle in another task must never panic because one did.
pub(super) fn lock(shared: &SharedRef) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// No response yet.
    Idle,
    /// Headers sent; data may follow.
    Open,
    /// The end is queued (after the queued data and trailers).
    Ending,
    /// The last frame (END_STREAM or RST) is in the output.
    Done,
}

pub(super) struct Stream {
    /// Reset (by whom, with what): the stream is over both ways.
    pub(super) reset: Option<(ErrorCode, bool)>,
    /// Handles alive (Respond, SendBody, RecvBody).
    pub(super) handles: u8,
    /// When its HEADERS came (rapid-reset accounting).
    pub(super) opened: Instant,
    // Receive side.
    pub(super) recv: VecDeque<Bytes>,
    /// END_STREAM came: the body ends once `recv` is drained.
    pub(super) recv_end: bool,
    pub(super) body_dropped: bool,
    pub(super) content_length: Option<u64>,
    /// What the client may still send on this stream.
    pub(super) recv_window: i64,
    /// Taken by the body, not yet given back with a WINDOW_UPDATE.
    pub(super) recv_unreleased: u32,
    /// DATA bytes received (content-length check) and taken (size_hint).
    pub(super) recv_total: u64,
    pub(super) recv_taken: u64,
    pub(super) recv_trailers: Option<HeaderMap>,
    pub(super) body_waker: Option<Waker>,
    // Send side.
    pub(super) send_state: SendState,
    pub(super) tx: SendQueue,
    pub(super) reset_waker: Option<Waker>,
    /// In `Shared::ready` already.
    pub(super) scheduled: bool,
    /// Counted in `Shared::open`.
    pub(super) counted: bool,
}

impl Stream {
    pub(super) fn new(recv_window: u32, send_window: u32, opened: Instant) -> Self {
        Self {
            opened,
            recv: VecDeque::new(),
            recv_end: false,
            recv_trailers: None,
            recv_window: i64::from(recv_window),
            recv_unreleased: 0,
            content_length: None,
            recv_total: 0,
            recv_taken: 0,
            body_waker: None,
            body_dropped: false,
            tx: SendQueue::new(send_window),
            send_state: SendState::Idle,
            scheduled: false,
            reset_waker: None,
            reset: None,
            counted: true,
            handles: 0,
        }
    }

    /// Closed as §5.1 sees it: no more frames either way.
    pub(super) fn closed(&self) -> bool {
        self.reset.is_some() || (self.recv_end && self.send_state == SendState::Done)
    }

    fn heap_bytes(&self) -> usize {
        self.recv.capacity() * size_of::<Bytes>()
            + self.tx.data.capacity() * size_of::<Bytes>()
            + self.recv.iter().map(Bytes::len).sum::<usize>()
            + self.tx.queued
    }

    pub(super) fn wake_all(&mut self) {
        for w in [
            self.body_waker.take(),
            self.tx.writable.take(),
            self.reset_waker.take(),
        ]
        .into_iter()
        .flatten()
        {
            w.wake();
        }
    }
}

/// Why the connection no longer takes frames from handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sealed {
    Open,
    /// Our final GOAWAY is queued: nothing may follow it.
    FinalGoaway,
    /// The connection ended (error, EOF): handles get this reason.
    Dead(Option<ErrorCode>, &'static str),
}

pub(super) struct Shared {
    pub(super) streams: StreamMap,
    /// Streams not closed (what SETTINGS_MAX_CONCURRENT_STREAMS counts).
    pub(super) open: usize,
    /// Frames queued, not yet taken by the writer.
    pub(super) out: Vec<u8>,
    pub(super) ends: Ends,
    /// Streams with something to send, round robin.
    pub(super) ready: VecDeque<u32>,
    pub(super) encoder: Encoder,
    /// Scratch for one header block.
    pub(super) block: Vec<u8>,
    pub(super) win: super::super::shared::Windows,
    pub(super) peer_max_frame: u32,
    /// Our SETTINGS_INITIAL_WINDOW_SIZE and connection window.
    pub(super) stream_window: u32,
    pub(super) conn_window: u32,
    pub(super) max_send_buffer: usize,
    pub(super) sealed: Sealed,
    pub(super) conn_waker: Option<Waker>,
    /// Streams we reset because of the client's errors.
    pub(super) local_error_resets: usize,
    /// The last streams we reset: frames the client sent before it saw
    /// the RST_STREAM are ignored (§5.1 "closed"), not errors.
    pub(super) recent_resets: VecDeque<u32>,
}

/// Streams' last frames (END_STREAM or RST_STREAM), counted for the drain.
#[derive(Default)]
pub(super) struct Ends {
    /// In `out`, not yet taken by the writer.
    pub(super) in_out: u64,
    /// Decided: queued by a handle, or a reset.
    pub(super) queued: u64,
    /// Decided but never to be written (the client reset the stream
    /// first, the connection ended, or a final GOAWAY dropped it).
    pub(super) dropped: u64,
}

impl Ends {
    /// Every end decided has reached the socket (`written` of them) or
    /// never will.
    pub(super) fn all_written(&self, written: u64) -> bool {
        self.queued <= written + self.dropped
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Preface,
    FirstSettings,
    Running,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GoAway {
    None,
    /// GOAWAY(2^31-1) and the PING sent; waiting for the PING's ACK.
    PingSent,
    /// The real GOAWAY sent with this last stream id.
    Sent(u32),
    /// `final_goaway`: nothing more is written.
    Final,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UserPing {
    None,
    Sent,
    Acked,
}

/// A server-side HTTP/2 connection. See the module doc (mod.rs).
pub(crate) struct Connection<T> {
    pub(super) io: T,
    /// Streams, output and send windows, shared with the handles.
    pub(super) shared: SharedRef,
    pub(super) settings: ServerSettings,
    pub(super) rd: ReadSide,
    pub(super) wr: WriteSide,
    /// What the client did to the connection as a whole.
    pub(super) peer: Peer,
    /// Requests decoded, not yet returned by `poll_accept`.
    pub(super) accepted: VecDeque<Accepted>,
    pub(super) drain: Drain,
    pub(super) abuse: Abuse,
    /// A connection error: GOAWAY queued, reported once flushed.
    pub(super) closing: Option<Error>,
    pub(super) shut_down: bool,
    /// Over: `poll_accept` says Ready(None) from now on.
    pub(super) finished: bool,
    pub(super) _counted: super::conn::Counted,
}

/// The read side: bytes, header blocks, HPACK.
pub(super) struct ReadSide {
    /// Read data, frames taken from the front; reads go into its spare
    /// room.
    pub(super) buf: BytesMut,
    pub(super) decoder: Decoder,
    /// The decoded block of the request being built (reused).
    pub(super) block: HeaderBlock,
    /// Field names outside the standard set, allocated once a connection.
    pub(super) names: super::super::validate::Names,
    pub(super) assembling: Option<super::super::shared::Assembly>,
}

/// The buffer being written, and the streams' ends in it.
pub(super) struct WriteSide {
    pub(super) out: super::super::shared::OutBuf,
    /// Streams' last frames in `buf`: counted written once it is.
    pub(super) ends_in_buf: u64,
    pub(super) ends_written: u64,
}

pub(super) struct Peer {
    pub(super) phase: Phase,
    /// The payload of its first SETTINGS frame.
    pub(super) first_settings: Option<Box<[u8]>>,
    /// It acknowledged our SETTINGS.
    pub(super) acked_ours: bool,
    /// Highest stream id it opened (§5.1.1).
    pub(super) last_id: u32,
    pub(super) goaway_seen: bool,
}

impl Peer {
    pub(super) fn new() -> Self {
        Self {
            phase: Phase::Preface,
            first_settings: None,
            acked_ours: false,
            last_id: 0,
            goaway_seen: false,
        }
    }
}

/// The drain's side: our GOAWAY steps and user PINGs.
pub(super) struct Drain {
    pub(super) goaway: GoAway,
    pub(super) user_ping: UserPing,
    pub(super) pong_waker: Option<Waker>,
    /// The graceful PING's ACK, not acted on yet (see [`HeldAck`]).
    pub(super) held_ack: Option<HeldAck>,
    /// After our close: how long the client's last bytes are still read
    /// (see `Connection::poll_linger`).
    pub(super) linger: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Drain {
    pub(super) fn new() -> Self {
        Self {
            goaway: GoAway::None,
            user_ping: UserPing::None,
            pong_waker: None,
            held_ack: None,
            linger: None,
        }
    }
}

/// The ACK of the graceful shutdown's PING fixes the last-stream-id of the
/// second GOAWAY, so it is acted on [`HeldAck::DELAY`] after it arrives: a
/// client (the h2 crate's) can write that ACK before the HEADERS of a
/// stream it opened just before it read the first GOAWAY, and that stream
/// would otherwise be refused. A PING ACK has no ordering tie to other
/// frames. 20 ms lost a hyper request (1 of 1,813) on a machine whose both
/// cores were busy: the client's request task ran that much later than its
/// connection task (docs/http2-drain.md).
pub(super) struct HeldAck {
    arrived: tokio::time::Instant,
    pub(super) release: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl HeldAck {
    pub(super) const DELAY: std::time::Duration = std::time::Duration::from_millis(100);
    /// A stream opened while the ACK is held is evidence that the client is
    /// still writing what it queued before it read the first GOAWAY: the
    /// ACK waits until this long after the latest one...
    const QUIET: std::time::Duration = std::time::Duration::from_millis(50);
    /// ...but never longer than this after it arrived (a client that keeps
    /// opening streams regardless is not waited for).
    const MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(1);

    pub(super) fn new() -> Self {
        HeldAck {
            arrived: tokio::time::Instant::now(),
            release: Box::pin(tokio::time::sleep(Self::DELAY)),
        }
    }

    /// A stream opened while held: acted on no sooner than the quiet
    /// period after it, within the longest hold.
    pub(super) fn stream_opened(&mut self) {
        let latest = self.arrived + Self::MAX_HOLD;
        let quiet = (tokio::time::Instant::now() + Self::QUIET).min(latest);
        if quiet > self.release.deadline() {
            self.release.as_mut().reset(quiet);
        }
    }
}

pub(super) struct Abuse {
    /// Rapid reset (CVE-2023-44487): client resets of unanswered streams
    /// in the current one-second window.
    pub(super) remote_resets: usize,
    pub(super) resets_since: Instant,
    /// Empty DATA frames without END_STREAM, less one per non-empty one.
    pub(super) empty_data: super::super::shared::EmptyData,
}

impl Abuse {
    pub(super) fn new() -> Self {
        Self {
            remote_resets: 0,
            resets_since: Instant::now(),
            empty_data: Default::default(),
        }
    }

    /// Counts a rapid reset at `now`: false once more than `limit` came
    /// within the current one-second window.
    pub(super) fn rapid_reset(&mut self, now: Instant, limit: usize) -> bool {
        if now.duration_since(self.resets_since) > RESET_WINDOW {
            self.resets_since = now;
            self.remote_resets = 0;
        }
        self.remote_resets += 1;
        self.remote_resets <= limit
    }
}

/// The window rapid resets are counted in.
const RESET_WINDOW: Duration = Duration::from_secs(1);

/// How many reset stream ids are remembered.
const RECENT_RESETS: usize = 32;

impl Shared {
    pub(super) fn wake_conn(&mut self) {
        if let Some(w) = self.conn_waker.take() {
            w.wake();
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.streams.capacity() * (size_of::<(u32, Stream)>() + 1)
            + self.streams.values().map(Stream::heap_bytes).sum::<usize>()
            + self.out.capacity()
            + self.block.capacity()
            + self.ready.capacity() * size_of::<u32>()
            + self.recent_resets.capacity() * size_of::<u32>()
            + self.encoder.memory()
    }

    /// Marks `id`'s end as decided (once per stream).
    fn end_decided(&mut self) {
        self.ends.queued += 1;
    }

    /// Appends RST_STREAM(code) for `id` and ends the stream both ways.
    /// `local_error`: the reset answers the client's error (counted
    /// against `max_local_error_resets`).
    pub(super) fn reset_stream(&mut self, id: u32, code: ErrorCode, local_error: bool) {
        if local_error {
            self.local_error_resets += 1;
        }
        let writable = self.sealed == Sealed::Open;
        if self.recent_resets.len() == RECENT_RESETS {
            self.recent_resets.pop_front();
        }
        self.recent_resets.push_back(id);
        let Some(s) = self.streams.get_mut(&id) else {
            if writable {
                Frame::RstStream { stream: id, code }.write(&mut self.out);
            }
            return;
        };
        if s.reset.is_some() {
            return;
        }
        let first_end = s.send_state != SendState::Done;
        let was_ending = s.send_state == SendState::Ending;
        s.reset = Some((code, false));
        s.send_state = SendState::Done;
        s.tx.data.clear();
        s.tx.queued = 0;
        s.tx.trailers = None;
        s.wake_all();
        if writable {
            Frame::RstStream { stream: id, code }.write(&mut self.out);
        }
        if first_end {
            if !was_ending {
                self.end_decided();
            }
            if writable {
                self.ends.in_out += 1;
            } else {
                self.ends.dropped += 1;
            }
        }
        self.release_body(id);
        self.gc(id);
        self.wake_conn();
    }

    /// Whether we reset `id` lately (its frames in flight are ignored).
    pub(super) fn reset_lately(&self, id: u32) -> bool {
        self.recent_resets.contains(&id)
    }

    /// A frame on a stream the client itself reset (§5.1 closed): only
    /// RST_STREAM(STREAM_CLOSED) is written, the stream is over already.
    pub(super) fn closed_stream_frame(&mut self, id: u32) {
        self.local_error_resets += 1;
        if self.sealed == Sealed::Open {
            Frame::RstStream {
                stream: id,
                code: ErrorCode::STREAM_CLOSED,
            }
            .write(&mut self.out);
        }
    }

    /// The client reset `id`: nothing more is sent on it.
    pub(super) fn remote_reset(&mut self, id: u32, code: ErrorCode) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.reset.is_some() {
            return;
        }
        if s.send_state == SendState::Ending {
            self.ends.dropped += 1;
        }
        s.reset = Some((code, true));
        s.tx.data.clear();
        s.tx.queued = 0;
        s.tx.trailers = None;
        s.wake_all();
        self.release_body(id);
        self.gc(id);
    }

    /// Gives back the connection window the stream's unread data holds:
    /// nobody will read it (reset, or the body was dropped).
    pub(super) fn release_body(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !(s.body_dropped || s.reset.is_some()) {
            return;
        }
        let unread: usize = s.recv.drain(..).map(|b| b.len()).sum();
        s.recv = VecDeque::new();
        let unread = u32::try_from(unread).unwrap_or(u32::MAX);
        self.release_conn(unread);
    }

    /// `n` bytes of the connection window are free again; a WINDOW_UPDATE
    /// goes out once half the window is.
    pub(super) fn release_conn(&mut self, n: u32) {
        let out = (self.sealed == Sealed::Open).then_some(&mut self.out);
        if self.win.release(n, self.conn_window, out) {
            self.wake_conn();
        }
    }

    /// Drops the stream's state once it is closed and no handle is left.
    pub(super) fn gc(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.counted && s.closed() {
            s.counted = false;
            self.open = self.open.saturating_sub(1);
        }
        if s.closed() && s.handles == 0 {
            self.streams.remove(&id);
            if self.streams.is_empty() {
                // A burst of streams leaves a big table behind otherwise,
                // and an idle connection holds no stream state at all
                // (a stream is ~400 bytes: the table is allocated again
                // by the next request).
                self.streams = StreamMap::default();
            }
        }
    }

    /// Puts `id` in the round robin if it has something to write.
    pub(super) fn schedule(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id)
            && !s.scheduled
            && s.reset.is_none()
            && (s.send_state == SendState::Ending || (s.tx.queued > 0 && s.tx.window > 0))
        {
            s.scheduled = true;
            self.ready.push_back(id);
        }
    }

    /// The writer's turn: moves DATA (and trailers) of ready streams into
    /// `out` as the windows allow, one frame per stream per round.
    pub(super) fn fill(&mut self) {
        if self.sealed != Sealed::Open {
            return;
        }
        while self.out.len() < OUT_HIGH {
            let Some(id) = self.ready.pop_front() else {
                break;
            };
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.scheduled = false;
            if s.reset.is_some() || s.send_state == SendState::Done {
                continue;
            }
            let ending = s.send_state == SendState::Ending;
            let Some(last) = s.tx.write_frame(
                id,
                ending,
                &mut self.win.conn_send,
                self.peer_max_frame,
                &mut self.out,
            ) else {
                // Blocked on a window: a WINDOW_UPDATE schedules it again.
                continue;
            };
            if last {
                if let Some(trailers) = s.tx.trailers.take() {
                    write_trailers(
                        id,
                        &trailers,
                        &mut self.encoder,
                        &mut self.block,
                        self.peer_max_frame,
                        &mut self.out,
                    );
                }
                self.finish_send(id);
            } else {
                self.schedule(id);
            }
        }
    }

    /// The stream's END_STREAM is in `out`.
    pub(super) fn finish_send(&mut self, id: u32) {
        self.ends.in_out += 1;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.send_state = SendState::Done;
        s.tx.data = VecDeque::new();
        if let Some(w) = s.tx.writable.take() {
            w.wake();
        }
        // §8.1: the answer is complete and nobody reads the rest of the
        // request: ask the client to stop sending it, without error.
        if s.body_dropped && !s.recv_end {
            s.reset = Some((ErrorCode::NO_ERROR, false));
            Frame::RstStream {
                stream: id,
                code: ErrorCode::NO_ERROR,
            }
            .write(&mut self.out);
        }
        self.gc(id);
    }

    /// Applies a new SETTINGS_INITIAL_WINDOW_SIZE to every stream's send
    /// window (§6.9.2); false if one would pass 2^31-1.
    pub(super) fn set_peer_initial_window(&mut self, size: u32) -> bool {
        let delta = i64::from(size) - i64::from(self.win.peer_initial);
        self.win.peer_initial = size;
        for s in self.streams.values_mut() {
            s.tx.window += delta;
            if s.tx.window > i64::from(MAX_WINDOW) {
                return false;
            }
        }
        if delta > 0 {
            self.schedule_all();
        }
        true
    }

    /// After a window grew for all streams: every stream with data may
    /// have waited on it.
    pub(super) fn schedule_all(&mut self) {
        let Self { streams, ready, .. } = self;
        for (id, s) in streams.iter_mut() {
            let sendable =
                s.send_state == SendState::Ending || (s.tx.queued > 0 && s.tx.window > 0);
            if !s.scheduled && s.reset.is_none() && sendable {
                s.scheduled = true;
                ready.push_back(*id);
            }
        }
    }

    /// The connection ended: every handle learns it.
    pub(super) fn kill(&mut self, code: Option<ErrorCode>, reason: &'static str) {
        if matches!(self.sealed, Sealed::Dead(..)) {
            return;
        }
        self.sealed = Sealed::Dead(code, reason);
        for s in self.streams.values_mut() {
            if s.send_state == SendState::Ending {
                self.ends.dropped += 1;
            }
            s.wake_all();
        }
    }
}

pub(super) use super::super::shared::field;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::super::super::shared::IdHasher;

    /// Client stream ids are odd and consecutive: their hashes must still
    /// spread over hashbrown's bucket bits (low) and tag bits (high 7).
    #[test]
    fn stream_ids_spread_over_buckets_and_tags() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let hashes: Vec<u64> = (0..512u32).map(|i| build.hash_one(2 * i + 1)).collect();
        let buckets: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h & 511).collect();
        let tags: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(buckets.len() > 300, "{} of 512 buckets used", buckets.len());
        assert!(tags.len() > 100, "{} of 128 tags used", tags.len());
    }
}
