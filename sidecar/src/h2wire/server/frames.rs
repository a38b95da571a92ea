//! Frame handling (RFC 9113 §5, §6): stream states, header blocks, flow
//! control on receipt, and the abuse limits.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::ErrorCode;
use super::super::frame::{
    self, Frame, FrameError, FrameHeader, HEADER_LEN, MAX_WINDOW, Scope, Settings,
};
use super::super::shared::Assembly;
use super::super::validate;
use super::Error;
use super::body::RecvBody;
use super::conn::{GRACEFUL_PING, PREFACE, USER_PING};
use super::handles::Respond;
use super::state::{Connection, GoAway, Phase, SendState, UserPing};
use super::state::{HeldAck, Sealed, Stream, lock};

/// A connection error: the GOAWAY's code and debug text.
pub(super) type ConnError = (ErrorCode, &'static str);

/// Empty DATA frames without END_STREAM tolerated (net of non-empty ones).
/// Frames one header block may span (HEADERS included).
#[cfg(test)]
pub(super) use super::super::shared::{EMPTY_DATA_LIMIT, MAX_BLOCK_FRAMES};
/// A client reset this soon after the stream opened counts as rapid.
const RAPID_RESET_AGE: Duration = Duration::from_millis(100);

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// Client resets of unanswered streams allowed per second.
    pub(super) fn remote_reset_limit(&self) -> usize {
        (2 * self.settings.max_concurrent_streams as usize).max(100)
    }

    /// Encoded header block bytes accepted before HPACK runs: the list
    /// limit plus slack (HPACK rarely encodes larger than it decodes).
    pub(super) fn max_block_bytes(&self) -> usize {
        Assembly::max_bytes(self.settings.max_header_list_size)
    }

    /// Handles every complete frame in the read buffer.
    pub(super) fn process(&mut self) -> Result<(), ConnError> {
        if self.peer.phase == Phase::Preface {
            let n = self.rd.buf.len().min(PREFACE.len());
            if self.rd.buf[..n] != PREFACE[..n] {
                return Err((ErrorCode::PROTOCOL_ERROR, "not the HTTP/2 preface"));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            let _ = self.rd.buf.split_to(PREFACE.len());
            self.peer.phase = Phase::FirstSettings;
        }
        while self.rd.buf.len() >= HEADER_LEN {
            let mut head = [0u8; HEADER_LEN];
            head.copy_from_slice(&self.rd.buf[..HEADER_LEN]);
            let header = FrameHeader::parse(&head);
            // Stream-scoped shape errors are answered once the frame is
            // whole (on_frame), so its payload is skipped.
            if let Err(e) = header.check(self.settings.max_frame_size)
                && e.scope == Scope::Connection
            {
                return Err((e.code, e.reason));
            }
            let total = HEADER_LEN + header.len as usize;
            if self.rd.buf.len() < total {
                break;
            }
            let buf = self.rd.buf.split_to(total);
            self.on_frame(header, buf)?;
            let sh = lock(&self.shared);
            if sh.local_error_resets > self.settings.max_local_error_resets {
                return Err((
                    ErrorCode::ENHANCE_YOUR_CALM,
                    "too many streams reset for errors",
                ));
            }
            if sh.sealed != Sealed::Open || self.closing.is_some() {
                break;
            }
        }
        Ok(())
    }

    fn on_frame(&mut self, header: FrameHeader, buf: BytesMut) -> Result<(), ConnError> {
        if self.peer.phase == Phase::FirstSettings {
            if header.kind != frame::SETTINGS || header.flags & frame::FLAG_ACK != 0 {
                return Err((ErrorCode::PROTOCOL_ERROR, "first frame not SETTINGS"));
            }
            self.peer.first_settings = Some(buf[HEADER_LEN..].into());
            self.peer.phase = Phase::Running;
        }
        if let Some(a) = &self.rd.assembling
            && (header.kind != frame::CONTINUATION || header.stream != a.stream)
        {
            return Err((ErrorCode::PROTOCOL_ERROR, "frame inside a header block"));
        }
        let payload = &buf[HEADER_LEN..];
        let parsed = match frame::parse(header, payload) {
            Ok(f) => f,
            Err(FrameError {
                scope: Scope::Stream(id),
                code,
                ..
            }) => {
                self.check_idle(id)?;
                lock(&self.shared).reset_stream(id, code, true);
                return Ok(());
            }
            Err(e) => return Err((e.code, e.reason)),
        };
        match parsed {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => {
                let at = HEADER_LEN + usize::from(header.flags & frame::FLAG_PADDED != 0);
                let len = data.len();
                self.on_data(stream, end_stream, flow_len, buf, at, len)
            }
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                block,
                ..
            } => {
                if stream % 2 == 0 {
                    return Err((ErrorCode::PROTOCOL_ERROR, "even stream id from a client"));
                }
                if end_headers {
                    return self.on_block(stream, end_stream, block);
                }
                let max = self.max_block_bytes();
                self.rd.assembling = Some(Assembly::start(stream, end_stream, block, max)?);
                Ok(())
            }
            Frame::Continuation {
                end_headers, block, ..
            } => {
                let max = self.max_block_bytes();
                match Assembly::add(&mut self.rd.assembling, end_headers, block, max)? {
                    Some(a) => self.on_block(a.stream, a.end_stream, &a.buf),
                    None => Ok(()),
                }
            }
            // Validated by the parser; RFC 9113 deprecates the scheme.
            Frame::Priority { .. } | Frame::Unknown { .. } => Ok(()),
            Frame::RstStream { stream, code } => self.on_rst(stream, code),
            Frame::Settings { ack, settings } => self.on_settings(ack, settings),
            Frame::Ping { ack, data } => {
                self.on_ping(ack, data);
                Ok(())
            }
            Frame::GoAway { code, .. } => {
                self.peer.goaway_seen = true;
                if code != ErrorCode::NO_ERROR {
                    // The client gives up on the connection: nothing more
                    // is sent, its streams end with the client's code.
                    let reason = "the client sent GOAWAY with an error";
                    lock(&self.shared).kill(Some(code), reason);
                    self.closing = Some(Error::Connection {
                        code,
                        reason,
                        remote: true,
                    });
                }
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => self.on_window_update(stream, increment),
        }
    }

    /// §5.1: a frame other than HEADERS/PRIORITY on an idle stream.
    fn check_idle(&self, id: u32) -> Result<(), ConnError> {
        if id > self.peer.last_id {
            return Err((ErrorCode::PROTOCOL_ERROR, "frame on an idle stream"));
        }
        Ok(())
    }

    fn on_data(
        &mut self,
        id: u32,
        end_stream: bool,
        flow_len: u32,
        buf: BytesMut,
        at: usize,
        len: usize,
    ) -> Result<(), ConnError> {
        self.check_idle(id)?;
        self.abuse.empty_data.count(len, end_stream)?;
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        sh.win.conn_recv -= i64::from(flow_len);
        if sh.win.conn_recv < 0 {
            return Err((
                ErrorCode::FLOW_CONTROL_ERROR,
                "DATA past the connection window",
            ));
        }
        let Some(s) = sh.streams.get_mut(&id) else {
            // Closed (§5.1): ignored if we reset it (the client may not
            // know yet), else a stream error.
            sh.release_conn(flow_len);
            if !sh.reset_lately(id) {
                sh.reset_stream(id, ErrorCode::STREAM_CLOSED, false);
            }
            return Ok(());
        };
        if let Some((_, remote)) = s.reset {
            sh.release_conn(flow_len);
            if remote {
                sh.closed_stream_frame(id);
            }
            return Ok(());
        }
        if s.recv_end {
            sh.release_conn(flow_len);
            sh.reset_stream(id, ErrorCode::STREAM_CLOSED, true);
            return Ok(());
        }
        s.recv_window -= i64::from(flow_len);
        if s.recv_window < 0 {
            sh.release_conn(flow_len);
            sh.reset_stream(id, ErrorCode::FLOW_CONTROL_ERROR, true);
            return Ok(());
        }
        s.recv_total += len as u64;
        if let Some(cl) = s.content_length
            && (s.recv_total > cl || (end_stream && s.recv_total != cl))
        {
            sh.release_conn(flow_len);
            sh.reset_stream(id, ErrorCode::PROTOCOL_ERROR, true);
            return Ok(());
        }
        let padding = flow_len - len as u32;
        if padding > 0 && !end_stream {
            // Padding is nobody's to read: its window goes back now.
            s.recv_window += i64::from(padding);
            Frame::WindowUpdate {
                stream: id,
                increment: padding,
            }
            .write(&mut sh.out);
        }
        let dropped = s.body_dropped;
        if len > 0 && !dropped {
            s.recv.push_back(buf.freeze().slice(at..at + len));
        }
        if end_stream {
            s.recv_end = true;
        }
        if let Some(w) = s.body_waker.take() {
            w.wake();
        }
        let released = if dropped { flow_len } else { padding };
        if released > 0 {
            sh.release_conn(released);
        }
        if end_stream {
            sh.gc(id);
        }
        Ok(())
    }

    /// A complete header block: a request, trailers, or an error.
    fn on_block(&mut self, id: u32, end_stream: bool, block: &[u8]) -> Result<(), ConnError> {
        let new = id > self.peer.last_id;
        let (existing, reset_lately) = if new {
            (false, false)
        } else {
            let sh = lock(&self.shared);
            (sh.streams.contains_key(&id), sh.reset_lately(id))
        };
        if !new && !existing && !reset_lately {
            return Err((ErrorCode::STREAM_CLOSED, "HEADERS on a closed stream"));
        }
        // Decoded first whatever happens next: HPACK must stay in step.
        let decoded = self.rd.decoder.decode(block, &mut self.rd.block);
        if new {
            self.peer.last_id = id;
            if let Some(held) = self.drain.held_ack.as_mut() {
                held.stream_opened();
            }
        }
        if let Err(e) = decoded {
            if e.ends_connection() {
                return Err((e.code(), "HPACK decoding failed"));
            }
            lock(&self.shared).reset_stream(id, e.code(), true);
            return Ok(());
        }
        if new {
            self.on_request(id, end_stream);
            return Ok(());
        }
        let mut sh = lock(&self.shared);
        let Some(s) = sh.streams.get_mut(&id) else {
            return Ok(());
        };
        if let Some((_, remote)) = s.reset {
            // Ours: the client may not have seen it yet (frames in flight).
            if remote {
                sh.closed_stream_frame(id);
            }
            return Ok(());
        }
        if s.recv_end {
            sh.reset_stream(id, ErrorCode::STREAM_CLOSED, true);
            return Ok(());
        }
        if !end_stream {
            sh.reset_stream(id, ErrorCode::PROTOCOL_ERROR, true);
            return Ok(());
        }
        let cl_ok = s.content_length.is_none_or(|cl| cl == s.recv_total);
        match validate::trailers(&self.rd.block, &mut self.rd.names) {
            Ok(t) if cl_ok => {
                s.recv_trailers = Some(t);
                s.recv_end = true;
                if let Some(w) = s.body_waker.take() {
                    w.wake();
                }
                sh.gc(id);
            }
            _ => sh.reset_stream(id, ErrorCode::PROTOCOL_ERROR, true),
        }
        Ok(())
    }

    fn on_request(&mut self, id: u32, end_stream: bool) {
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        let refuse = match self.drain.goaway {
            GoAway::Sent(last) => id > last,
            GoAway::Final => true,
            GoAway::None | GoAway::PingSent => self.peer.goaway_seen,
        };
        if refuse {
            sh.reset_stream(id, ErrorCode::REFUSED_STREAM, false);
            return;
        }
        let max = self.settings.max_concurrent_streams as usize;
        if sh.open >= max {
            sh.reset_stream(id, ErrorCode::REFUSED_STREAM, true);
            return;
        }
        if sh.streams.len() >= 2 * max {
            // The application still works on as many streams again that
            // the client already reset (rapid reset's real cost): no new
            // work until it lets go. Safe to retry, not the client's error.
            sh.reset_stream(id, ErrorCode::REFUSED_STREAM, false);
            return;
        }
        let head = match validate::request(&self.rd.block, &mut self.rd.names) {
            Ok(h) if !(end_stream && h.content_length.is_some_and(|cl| cl != 0)) => h,
            _ => {
                sh.reset_stream(id, ErrorCode::PROTOCOL_ERROR, true);
                return;
            }
        };
        let recv_window = if self.peer.acked_ours {
            sh.stream_window
        } else {
            // Until our SETTINGS is acknowledged the client may use 65,535.
            sh.stream_window.max(65_535)
        };
        let mut s = Stream::new(recv_window, sh.win.peer_initial, Instant::now());
        s.recv_end = end_stream;
        s.content_length = head.content_length;
        s.handles = 2;
        sh.streams.insert(id, s);
        sh.open += 1;
        let body = RecvBody {
            shared: self.shared.clone(),
            id,
            ended: end_stream,
        };
        let respond = Respond {
            shared: self.shared.clone(),
            id,
        };
        let req = http::Request::from_parts(head.parts, body);
        self.accepted.push_back((req, respond));
    }

    fn on_rst(&mut self, id: u32, code: ErrorCode) -> Result<(), ConnError> {
        self.check_idle(id)?;
        let mut sh = lock(&self.shared);
        let now = Instant::now();
        // Rapid reset opens and resets at once; a client cancelling on a
        // deadline does so long after, and is not counted.
        let rapid = sh.streams.get(&id).is_some_and(|s| {
            s.reset.is_none()
                && s.send_state != SendState::Done
                && now.duration_since(s.opened) < RAPID_RESET_AGE
        });
        sh.remote_reset(id, code);
        drop(sh);
        if rapid && !self.abuse.rapid_reset(now, self.remote_reset_limit()) {
            return Err((
                ErrorCode::ENHANCE_YOUR_CALM,
                "too many streams reset by the client",
            ));
        }
        Ok(())
    }

    fn on_settings(&mut self, ack: bool, settings: Settings) -> Result<(), ConnError> {
        if ack {
            self.peer.acked_ours = true;
            return Ok(());
        }
        let mut sh = lock(&self.shared);
        if let Some(size) = settings.header_table_size {
            sh.encoder.set_peer_settings_size(size as usize);
        }
        if let Some(size) = settings.max_frame_size {
            sh.peer_max_frame = size;
        }
        if let Some(size) = settings.initial_window_size
            && !sh.set_peer_initial_window(size)
        {
            return Err((
                ErrorCode::FLOW_CONTROL_ERROR,
                "SETTINGS_INITIAL_WINDOW_SIZE overflows a window",
            ));
        }
        Frame::Settings {
            ack: true,
            settings: Settings::default(),
        }
        .write(&mut sh.out);
        Ok(())
    }

    fn on_ping(&mut self, ack: bool, data: [u8; 8]) {
        if !ack {
            Frame::Ping { ack: true, data }.write(&mut lock(&self.shared).out);
            return;
        }
        if data == GRACEFUL_PING && self.drain.goaway == GoAway::PingSent {
            // The second GOAWAY goes out once the hold is over
            // (poll_held_ack).
            if self.drain.held_ack.is_none() {
                self.drain.held_ack = Some(HeldAck::new());
            }
        } else if data == USER_PING && self.drain.user_ping == UserPing::Sent {
            self.drain.user_ping = UserPing::Acked;
            if let Some(w) = self.drain.pong_waker.take() {
                w.wake();
            }
        }
    }

    fn on_window_update(&mut self, id: u32, increment: u32) -> Result<(), ConnError> {
        let mut sh = lock(&self.shared);
        if id == 0 {
            sh.win.conn_send += i64::from(increment);
            if sh.win.conn_send > i64::from(MAX_WINDOW) {
                return Err((
                    ErrorCode::FLOW_CONTROL_ERROR,
                    "connection window over 2^31-1",
                ));
            }
            sh.schedule_all();
            return Ok(());
        }
        drop(sh);
        self.check_idle(id)?;
        let mut sh = lock(&self.shared);
        let Some(s) = sh.streams.get_mut(&id) else {
            return Ok(());
        };
        s.tx.window += i64::from(increment);
        if s.tx.window > i64::from(MAX_WINDOW) {
            sh.reset_stream(id, ErrorCode::FLOW_CONTROL_ERROR, true);
            return Ok(());
        }
        sh.schedule(id);
        Ok(())
    }
}
