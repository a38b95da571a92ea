//! The state the connection's task shares with the streams' handles under
//! one mutex: the streams, the output buffer and the windows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use http_body::Frame as BodyFrame;

use super::super::shared::{RecvWindow, SendQueue, Windows, register, write_trailers};

use bytes::Bytes;
use http::HeaderMap;

use super::super::ErrorCode;
use super::super::frame::{Frame, MAX_WINDOW};
use super::super::hpack::Encoder;
use super::super::shared::IdMap;
use super::{ClientSettings, Error};

/// Output queued past this stops the filling of DATA for this round and
/// the reading of frames (an app that reads nothing cannot make us buffer
/// its PING answers).
pub(super) const OUT_HIGH: usize = 64 << 10;

pub(super) type SharedRef = Arc<Mutex<Shared>>;

pub(super) type BodyResult = Result<BodyFrame<Bytes>, Error>;

/// Locks, ignoring poisoning: no code under this lock panics on input.
pub(super) fn lock(shared: &SharedRef) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// Data may follow.
    Open,
    /// The end is queued (after the queued data and trailers).
    Ending,
    /// END_STREAM (or RST_STREAM) is in the output.
    Done,
}

/// Where the answer's head is.
pub(super) enum Head {
    Waiting,
    Ready(http::Response<()>),
    Taken,
}

/// The answer's side of a stream, as the connection fills it and the
/// body reads it.
pub(super) struct Answer {
    /// DATA received and not read yet.
    pub(super) data: VecDeque<Bytes>,
    /// END_STREAM came.
    pub(super) end: bool,
    pub(super) trailers: Option<HeaderMap>,
    /// What the app may still send on the stream.
    pub(super) window: i64,
    /// Read and not given back to the app yet.
    pub(super) unreleased: u32,
    /// The reader's task.
    pub(super) waker: Option<Waker>,
    /// Bytes received, read or not.
    pub(super) total: u64,
    /// The answer's content-length: a body longer or shorter is reset.
    pub(super) content_length: Option<u64>,
    /// Nobody reads it any more: what comes is dropped, its window given
    /// back.
    pub(super) dropped: bool,
}

impl Answer {
    fn new(window: u32) -> Self {
        Self {
            data: VecDeque::new(),
            trailers: None,
            waker: None,
            content_length: None,
            end: false,
            dropped: false,
            window: i64::from(window),
            unreleased: 0,
            total: 0,
        }
    }
}

pub(super) struct Stream {
    /// Reset (code, by the app?, why): over both ways.
    pub(super) reset: Option<(ErrorCode, bool, &'static str)>,
    /// Handles alive (ResponseFuture or RecvBody, SendBody).
    pub(super) handles: u8,
    pub(super) head: Head,
    pub(super) head_waker: Option<Waker>,
    pub(super) rx: Answer,
    /// The request's side: its state, then the data and trailers queued.
    pub(super) send_state: SendState,
    pub(super) tx: SendQueue,
    pub(super) scheduled: bool,
    /// Counted in `Shared::open`.
    pub(super) counted: bool,
}

impl Stream {
    pub(super) fn new(recv_window: u32, send_window: u32, end_of_stream: bool) -> Self {
        Self {
            reset: None,
            handles: 0,
            head: Head::Waiting,
            head_waker: None,
            rx: Answer::new(recv_window),
            send_state: if end_of_stream {
                SendState::Done
            } else {
                SendState::Open
            },
            tx: SendQueue::new(send_window),
            scheduled: false,
            counted: true,
        }
    }

    /// The app ended its answer and then reset the stream with NO_ERROR
    /// (§8.1: it wants no more of the request): the answer is whole and
    /// is read to its end, the reset no error to its reader.
    pub(super) fn complete_answer_kept(&self) -> bool {
        self.rx.end
            && !self.rx.dropped
            && matches!(self.reset, Some((ErrorCode::NO_ERROR, true, _)))
    }

    pub(super) fn closed(&self) -> bool {
        self.reset.is_some() || (self.rx.end && self.send_state == SendState::Done)
    }

    pub(super) fn wake_all(&mut self) {
        for w in [
            self.head_waker.take(),
            self.rx.waker.take(),
            self.tx.writable.take(),
        ]
        .into_iter()
        .flatten()
        {
            w.wake();
        }
    }
}

pub(super) struct Shared {
    pub(super) streams: IdMap<Stream>,
    /// Streams not closed (what the app's MAX_CONCURRENT_STREAMS counts).
    pub(super) open: usize,
    pub(super) next_id: u32,
    /// The app's SETTINGS_MAX_CONCURRENT_STREAMS within ours.
    pub(super) max_open: usize,
    /// Frames queued for the connection's task to write.
    pub(super) out: Vec<u8>,
    pub(super) ready: VecDeque<u32>,
    pub(super) encoder: Encoder,
    pub(super) block: Vec<u8>,
    /// The largest frame the app takes (its SETTINGS).
    pub(super) peer_max_frame: u32,
    pub(super) win: Windows,
    pub(super) settings: ClientSettings,
    /// The app's GOAWAY came (its last-stream-id): no new streams.
    pub(super) goaway: Option<u32>,
    /// [`super::SendRequest::close`]: our GOAWAY is queued, no stream
    /// opens, the connection ends when the open ones are done.
    pub(super) local_close: bool,
    /// Streams we reset for the app's errors.
    pub(super) local_error_resets: usize,
    /// The connection ended on the socket (an I/O error, or the app closed
    /// it with streams open): handles get an I/O error of this kind.
    pub(super) dead_io: Option<std::io::ErrorKind>,
    /// The connection ended: handles get this.
    pub(super) dead: Option<(Option<ErrorCode>, bool, &'static str)>,
    pub(super) conn_waker: Option<Waker>,
    /// `poll_ready` callers waiting for a slot.
    pub(super) slot_wakers: Vec<Waker>,
    pub(super) pong_waker: Option<Waker>,
    pub(super) ping_out: bool,
}

impl Shared {
    pub(super) fn wake_conn(&mut self) {
        if let Some(w) = self.conn_waker.take() {
            w.wake();
        }
    }

    pub(super) fn wake_slots(&mut self) {
        for w in self.slot_wakers.drain(..) {
            w.wake();
        }
    }

    /// The error a handle gets once the connection ended.
    pub(super) fn dead_error(&self, id: u32) -> Option<Error> {
        if let Some(kind) = self.dead_io {
            // The socket failed or closed under open streams: the app may
            // have had them (app.rs counts such a loss, as with h2).
            return Some(Error::Io(kind.into()));
        }
        self.dead.map(|(code, remote, reason)| match code {
            Some(code) => Error::Connection {
                code,
                reason,
                remote,
            },
            None => Error::Closed { id, reason },
        })
    }

    /// Ends `id` both ways: `remote` when the app reset it (or it lies
    /// above the app's GOAWAY); an RST_STREAM is written when it is ours.
    pub(super) fn reset_stream(
        &mut self,
        id: u32,
        code: ErrorCode,
        remote: bool,
        reason: &'static str,
    ) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if s.reset.is_some() {
            return;
        }
        let already_done = s.closed();
        s.reset = Some((code, remote, reason));
        s.send_state = SendState::Done;
        s.tx.data.clear();
        s.tx.queued = 0;
        s.tx.trailers = None;
        s.wake_all();
        if !remote && !already_done && self.dead.is_none() {
            Frame::RstStream { stream: id, code }.write(&mut self.out);
            self.wake_conn();
        }
        self.release_body(id);
        self.gc(id);
    }

    /// Resets `id` for the app's error (a malformed answer, a window
    /// exceeded): counted against conn.rs's `MAX_LOCAL_ERROR_RESETS`.
    pub(super) fn error_reset(&mut self, id: u32, code: ErrorCode, reason: &'static str) {
        self.local_error_resets += 1;
        self.reset_stream(id, code, false, reason);
    }

    /// The next frame of stream `id`'s answer body for its reader: data
    /// (its window given back as it goes), the trailers, the end
    /// (`ended` set, after which the stream is not looked at again) or
    /// the error; `cx`'s task is woken when there is more.
    pub(super) fn poll_body(
        &mut self,
        id: u32,
        ended: &mut bool,
        cx: &Context<'_>,
    ) -> Poll<Option<BodyResult>> {
        if *ended {
            return Poll::Ready(None);
        }
        let dead = self.dead_error(id);
        let initial = self.settings.initial_window_size;
        let s = match self.streams.get_mut(&id) {
            Some(s) => s,
            None => {
                return Poll::Ready(Some(Err(Error::Closed {
                    id,
                    reason: "stream closed before its body ended",
                })));
            }
        };
        match s.reset {
            Some((code, remote, reason)) if !s.complete_answer_kept() => {
                let failed = Error::Stream {
                    id,
                    code,
                    reason,
                    remote,
                };
                return Poll::Ready(Some(Err(failed)));
            }
            _ => {}
        }
        let window = RecvWindow {
            chunks: &mut s.rx.data,
            unreleased: &mut s.rx.unreleased,
            window: &mut s.rx.window,
            ended: s.rx.end,
            initial,
        };
        if let Some((chunk, wrote)) = window.take(id, dead.is_none().then_some(&mut self.out)) {
            if wrote {
                self.wake_conn();
            }
            self.release_conn(chunk.len() as u32);
            return Poll::Ready(Some(Ok(BodyFrame::data(chunk))));
        }
        if s.rx.end {
            *ended = true;
            return Poll::Ready(s.rx.trailers.take().map(|t| Ok(BodyFrame::trailers(t))));
        }
        if let Some(e) = dead {
            return Poll::Ready(Some(Err(e)));
        }
        register(&mut s.rx.waker, cx);
        Poll::Pending
    }

    /// Gives back the connection window the stream's unread data holds.
    pub(super) fn release_body(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !(s.rx.dropped || s.reset.is_some()) || s.complete_answer_kept() {
            return;
        }
        let unread: usize = s.rx.data.drain(..).map(|b| b.len()).sum();
        self.release_conn(u32::try_from(unread).unwrap_or(u32::MAX));
    }

    /// `n` bytes of the connection window are free again; a WINDOW_UPDATE
    /// goes once half the window is.
    pub(super) fn release_conn(&mut self, n: u32) {
        let window = self.settings.connection_window_size;
        let out = self.dead.is_none().then_some(&mut self.out);
        if self.win.release(n, window, out) {
            self.wake_conn();
        }
    }

    /// Drops the stream's state once it is closed and no handle is left;
    /// a closed stream frees its slot at once.
    pub(super) fn gc(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let closed = s.closed();
        let handles = s.handles;
        if s.counted && closed {
            s.counted = false;
            self.open = self.open.saturating_sub(1);
            self.wake_slots();
            // The connection may be waiting for the last stream to close.
            self.wake_conn();
        }
        if closed && handles == 0 {
            self.streams.remove(&id);
            if self.streams.is_empty() {
                self.streams = IdMap::default();
            }
        }
    }

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

    /// Moves DATA (and trailers) of ready streams into `out` as the
    /// windows allow, one frame per stream per turn (round robin).
    pub(super) fn fill(&mut self) {
        if self.dead.is_some() {
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
                if let Some(s) = self.streams.get_mut(&id) {
                    s.send_state = SendState::Done;
                    s.tx.data = VecDeque::new();
                }
                self.gc(id);
            } else {
                self.schedule(id);
            }
        }
    }

    /// A new SETTINGS_INITIAL_WINDOW_SIZE from the app (§6.9.2); false
    /// if a stream's window would pass 2^31-1.
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

    /// The connection ended: every handle learns it.
    pub(super) fn kill(&mut self, code: Option<ErrorCode>, remote: bool, reason: &'static str) {
        if self.dead.is_some() {
            return;
        }
        self.dead = Some((code, remote, reason));
        for s in self.streams.values_mut() {
            s.wake_all();
        }
        self.wake_slots();
        if let Some(w) = self.pong_waker.take() {
            w.wake();
        }
    }
}
