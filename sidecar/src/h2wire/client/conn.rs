//! The connection's task: the socket, reading and handling the app's
//! frames, and one write per wake-up.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::ErrorCode;
use super::super::frame::{self, Frame, FrameHeader, HEADER_LEN, MAX_WINDOW, Scope, Settings};
use super::super::hpack::{Decoder, Encoder, EncoderOptions, HeaderBlock};
use super::super::shared::{
    Assembly, Counted, EmptyData, IdMap, OutBuf, Windows, goaway, header_decoder, poll_read_frame,
    register, spare_room,
};
use super::super::validate::{self, Invalid, Names};
use super::state::{Head, OUT_HIGH, Shared, SharedRef, Stream, lock};
use super::{ABOVE_GOAWAY, ClientSettings, Error, SendRequest};
use crate::spare::{self, OutClass, ReadClass};

pub(super) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Streams we may reset for the app's errors before the connection ends
/// with GOAWAY(ENHANCE_YOUR_CALM): h2's client took 1024 (h2conn.rs set it).
pub(super) const MAX_LOCAL_ERROR_RESETS: usize = 1024;
pub(super) const USER_PING: [u8; 8] = *b"kg-cping";
/// Reads per wake-up before the write: an app that keeps the socket full
/// still sees our WINDOW_UPDATEs and requests go out.
const MAX_READS: usize = 8;

type ConnError = (ErrorCode, &'static str);

/// A client-side HTTP/2 connection. See the module doc (mod.rs).
pub(crate) struct Connection<T> {
    io: T,
    shared: SharedRef,
    rbuf: BytesMut,
    decoder: Decoder,
    block: HeaderBlock,
    names: Names,
    assembling: Option<Assembly>,
    wbuf: OutBuf,
    /// The app's first SETTINGS came.
    got_settings: bool,
    empty_data: EmptyData,
    /// A connection error: our GOAWAY is queued; reported once flushed.
    closing: Option<Error>,
    finished: bool,
    _counted: Counted,
}

/// `id` is odd and below `next_id`: a stream we opened.
fn check_id(id: u32, next_id: u32) -> Result<(), ConnError> {
    if id.is_multiple_of(2) || id >= next_id {
        return Err((
            ErrorCode::PROTOCOL_ERROR,
            "frame on a stream we never opened",
        ));
    }
    Ok(())
}

impl<T: AsyncRead + AsyncWrite + Unpin> Connection<T> {
    /// The preface, our SETTINGS and the connection WINDOW_UPDATE are
    /// queued; requests may be queued at once (§3.4 lets the client send
    /// before the app's SETTINGS).
    pub fn new(io: T, mut settings: ClientSettings) -> (Self, SendRequest) {
        settings.initial_window_size = settings.initial_window_size.min(MAX_WINDOW);
        settings.max_frame_size = settings
            .max_frame_size
            .clamp(frame::DEFAULT_MAX_FRAME_SIZE, frame::MAX_FRAME_SIZE_LIMIT);
        settings.max_concurrent_streams = settings.max_concurrent_streams.max(1);
        settings.connection_window_size = settings.connection_window_size.clamp(65_535, MAX_WINDOW);
        let mut out = spare::take_out(OutClass::Http2);
        out.extend_from_slice(PREFACE);
        Frame::Settings {
            ack: false,
            settings: Settings {
                enable_push: Some(false),
                initial_window_size: Some(settings.initial_window_size),
                max_frame_size: Some(settings.max_frame_size),
                max_header_list_size: Some(settings.max_header_list_size),
                ..Settings::default()
            },
        }
        .write(&mut out);
        if settings.connection_window_size > 65_535 {
            Frame::WindowUpdate {
                stream: 0,
                increment: settings.connection_window_size - 65_535,
            }
            .write(&mut out);
        }
        let shared = Shared {
            streams: IdMap::default(),
            open: 0,
            next_id: 1,
            // §5.1.2: no limit until the app's SETTINGS say one; ours holds.
            max_open: settings
                .initial_max_send_streams
                .min(settings.max_concurrent_streams) as usize,
            out,
            ready: VecDeque::new(),
            encoder: Encoder::new(4096, EncoderOptions::default()),
            block: Vec::new(),
            win: Windows::new(settings.connection_window_size),
            peer_max_frame: frame::DEFAULT_MAX_FRAME_SIZE,
            settings,
            goaway: None,
            local_close: false,
            local_error_resets: 0,
            dead_io: None,
            dead: None,
            conn_waker: None,
            slot_wakers: Vec::new(),
            pong_waker: None,
            ping_out: false,
        };
        let shared = Arc::new(Mutex::new(shared));
        let conn = Self {
            io,
            shared: shared.clone(),
            rbuf: BytesMut::new(),
            decoder: header_decoder(settings.max_header_list_size),
            block: HeaderBlock::default(),
            names: Names::default(),
            assembling: None,
            wbuf: OutBuf::default(),
            got_settings: false,
            empty_data: EmptyData::default(),
            closing: None,
            finished: false,
            _counted: Counted::new(),
        };
        (conn, SendRequest { shared })
    }

    /// Drives the connection: Ready(Ok) once it ended cleanly (the app's
    /// GOAWAY and no stream left, or the app closed the socket with no
    /// stream open), Ready(Err) for a connection error (ours, flushed
    /// first, or the app's GOAWAY with an error code) or an I/O error.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        {
            let mut sh = lock(&self.shared);
            register(&mut sh.conn_waker, cx);
            if sh.out.capacity() == 0 {
                sh.out = spare::take_out(OutClass::Http2);
            }
        }
        let mut reads = 0;
        loop {
            if self.closing.is_none()
                && let Err(e) = self.process()
            {
                self.fail(e);
            }
            // Not while our output backs up (an app that reads nothing
            // cannot make us buffer its PING answers): once it is written,
            // the loop comes back to read.
            let backed_up = self.backlog() >= OUT_HIGH;
            if self.closing.is_none() && reads < MAX_READS && !backed_up {
                match self.poll_read(cx) {
                    Poll::Ready(Ok(0)) => {
                        let open = lock(&self.shared).open;
                        if open == 0 {
                            self.finish(None, "the app closed the connection");
                            return Poll::Ready(Ok(()));
                        }
                        let eof = std::io::ErrorKind::UnexpectedEof;
                        self.finish_io(eof, "the app closed the connection");
                        return Poll::Ready(Err(Error::Io(eof.into())));
                    }
                    Poll::Ready(Ok(_)) => {
                        reads += 1;
                        continue;
                    }
                    Poll::Ready(Err(e)) => {
                        self.finish_io(e.kind(), "I/O error");
                        return Poll::Ready(Err(Error::Io(e)));
                    }
                    Poll::Pending => {}
                }
            }
            let flushed = match self.poll_write(cx) {
                Ok(f) => f,
                Err(e) => {
                    self.finish_io(e.kind(), "I/O error");
                    return Poll::Ready(Err(Error::Io(e)));
                }
            };
            let done = self.closing.is_some() || {
                let sh = lock(&self.shared);
                (sh.goaway.is_some() || sh.local_close) && sh.open == 0
            };
            if done {
                if !flushed {
                    return Poll::Pending;
                }
                if Pin::new(&mut self.io).poll_shutdown(cx).is_pending() {
                    return Poll::Pending;
                }
                let err = self.closing.take();
                self.finish(None, "connection closed");
                return Poll::Ready(err.map_or(Ok(()), Err));
            }
            if flushed && backed_up && self.closing.is_none() {
                // The read was skipped and nothing else would wake us.
                continue;
            }
            if flushed && reads >= MAX_READS {
                // The read budget ran out with bytes maybe left: come back.
                cx.waker().wake_by_ref();
            }
            self.release_idle();
            return Poll::Pending;
        }
    }

    fn backlog(&self) -> usize {
        self.wbuf.unwritten() + lock(&self.shared).out.len()
    }

    fn release_idle(&mut self) {
        if self.rbuf.is_empty() && lock(&self.shared).open == 0 {
            spare::give_bytes(
                ReadClass::Http2Client,
                std::mem::take(&mut self.rbuf),
                spare_room(),
            );
            self.block = HeaderBlock::default();
        }
    }

    fn finish(&mut self, code: Option<ErrorCode>, reason: &'static str) {
        self.finished = true;
        lock(&self.shared).kill(code, false, reason);
    }

    /// The socket failed (or closed with streams open): the handles get
    /// an I/O error of `kind`.
    fn finish_io(&mut self, kind: std::io::ErrorKind, reason: &'static str) {
        lock(&self.shared).dead_io = Some(kind);
        self.finish(None, reason);
    }

    /// A connection error of ours: GOAWAY(code) as the last frame. We
    /// accept no pushed streams: the last one we processed is 0.
    fn fail(&mut self, (code, reason): ConnError) {
        let mut sh = lock(&self.shared);
        self.closing = Some(goaway(&mut sh.out, 0, code, reason));
        sh.kill(Some(code), false, reason);
    }

    fn poll_write(&mut self, cx: &mut Context<'_>) -> std::io::Result<bool> {
        loop {
            if self.wbuf.unwritten() == 0 {
                let mut guard = lock(&self.shared);
                let sh = &mut *guard;
                sh.fill();
                if sh.out.is_empty() {
                    break;
                }
                self.wbuf.refill(&mut sh.out);
            }
            match self.wbuf.poll_drain(&mut self.io, cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(r) => r?,
            }
        }
        if Pin::new(&mut self.io).poll_flush(cx).is_pending() {
            return Ok(false);
        }
        let mut sh = lock(&self.shared);
        let idle = sh.open == 0;
        self.wbuf.flushed(idle);
        if idle {
            if sh.out.is_empty() {
                spare::give_out(OutClass::Http2, std::mem::take(&mut sh.out), spare_room());
            }
            sh.block = Vec::new();
        }
        Ok(true)
    }

    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        poll_read_frame(Pin::new(&mut self.io), &mut self.rbuf, cx)
    }

    /// Handles every whole frame in the read buffer; past
    /// [`MAX_LOCAL_ERROR_RESETS`] streams reset for the app's errors, the
    /// connection ends (as h2's client did, and our server does).
    fn process(&mut self) -> Result<(), ConnError> {
        let handled = self.process_frames();
        let sh = lock(&self.shared);
        if sh.local_error_resets > MAX_LOCAL_ERROR_RESETS {
            return Err((
                ErrorCode::ENHANCE_YOUR_CALM,
                "too many streams reset for the app's errors",
            ));
        }
        handled
    }

    fn process_frames(&mut self) -> Result<(), ConnError> {
        let max_frame = lock(&self.shared).settings.max_frame_size;
        loop {
            if self.rbuf.len() < HEADER_LEN {
                return Ok(());
            }
            let mut head = [0u8; HEADER_LEN];
            head.copy_from_slice(&self.rbuf[..HEADER_LEN]);
            let header = FrameHeader::parse(&head);
            header.check(max_frame).map_err(|e| (e.code, e.reason))?;
            let total = HEADER_LEN + header.len as usize;
            if self.rbuf.len() < total {
                return Ok(());
            }
            // DATA payloads are handed to bodies as slices of this one
            // buffer: no copy.
            let mut bytes = self.rbuf.split_to(total).freeze();
            let payload = bytes.split_off(HEADER_LEN);
            if !self.got_settings && header.kind != frame::SETTINGS {
                return Err((ErrorCode::PROTOCOL_ERROR, "first frame is not SETTINGS"));
            }
            if let Some(a) = &self.assembling
                && (header.kind != frame::CONTINUATION || header.stream != a.stream)
            {
                return Err((ErrorCode::PROTOCOL_ERROR, "frame inside a header block"));
            }
            match frame::parse(header, &payload) {
                Ok(f) => self.handle(f, &payload)?,
                Err(e) => match e.scope {
                    Scope::Connection => return Err((e.code, e.reason)),
                    Scope::Stream(id) => {
                        lock(&self.shared).error_reset(id, e.code, e.reason);
                    }
                },
            }
        }
    }

    fn handle(&mut self, f: Frame<'_>, payload: &Bytes) -> Result<(), ConnError> {
        match f {
            Frame::Settings { ack, settings } => self.on_settings(ack, settings),
            Frame::Ping { ack, data } => {
                let mut sh = lock(&self.shared);
                if !ack {
                    Frame::Ping { ack: true, data }.write(&mut sh.out);
                } else if data == USER_PING && sh.ping_out {
                    sh.ping_out = false;
                    if let Some(w) = sh.pong_waker.take() {
                        w.wake();
                    }
                }
                Ok(())
            }
            f @ Frame::Headers { .. } => self.on_headers(f),
            Frame::Continuation {
                end_headers, block, ..
            } => {
                let max = Assembly::max_bytes(lock(&self.shared).settings.max_header_list_size);
                match Assembly::add(&mut self.assembling, end_headers, block, max)? {
                    Some(a) => self.on_block(a.stream, a.end_stream, &a.buf),
                    None => Ok(()),
                }
            }
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => self.on_data(stream, end_stream, payload.slice_ref(data), flow_len),
            Frame::RstStream { stream, code } => {
                self.check_id(stream)?;
                let reason = if code == ErrorCode::REFUSED_STREAM {
                    "refused by the app: never processed"
                } else {
                    "reset by the app"
                };
                lock(&self.shared).reset_stream(stream, code, true, reason);
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => {
                let mut sh = lock(&self.shared);
                if stream == 0 {
                    sh.win.conn_send += i64::from(increment);
                    if sh.win.conn_send > i64::from(MAX_WINDOW) {
                        return Err((ErrorCode::FLOW_CONTROL_ERROR, "connection window overflow"));
                    }
                    sh.schedule_all();
                    return Ok(());
                }
                let next = sh.next_id;
                let Some(s) = sh.streams.get_mut(&stream) else {
                    // Ours, closed since: a late update; never ours: wrong.
                    return check_id(stream, next);
                };
                s.tx.window += i64::from(increment);
                if s.tx.window > i64::from(MAX_WINDOW) {
                    sh.error_reset(
                        stream,
                        ErrorCode::FLOW_CONTROL_ERROR,
                        "stream window overflow",
                    );
                } else {
                    sh.schedule(stream);
                }
                Ok(())
            }
            Frame::GoAway {
                last_stream, code, ..
            } => {
                let mut sh = lock(&self.shared);
                let last = sh.goaway.map_or(last_stream, |l| l.min(last_stream));
                sh.goaway = Some(last);
                let above: Vec<u32> = sh.streams.keys().copied().filter(|id| *id > last).collect();
                for id in above {
                    sh.reset_stream(id, ErrorCode::REFUSED_STREAM, true, ABOVE_GOAWAY);
                }
                sh.wake_slots();
                if code != ErrorCode::NO_ERROR {
                    drop(sh);
                    self.closing = Some(Error::Connection {
                        code,
                        reason: "GOAWAY from the app",
                        remote: true,
                    });
                    lock(&self.shared).kill(Some(code), true, "GOAWAY from the app");
                }
                Ok(())
            }
            Frame::Priority { .. } | Frame::Unknown { .. } => Ok(()),
        }
    }

    /// The start of an answer's head or trailers.
    fn on_headers(&mut self, f: Frame<'_>) -> Result<(), ConnError> {
        let Frame::Headers {
            stream,
            end_stream,
            end_headers,
            block,
            ..
        } = f
        else {
            return Ok(());
        };
        self.check_id(stream)?;
        if end_headers {
            return self.on_block(stream, end_stream, block);
        }
        let max = Assembly::max_bytes(lock(&self.shared).settings.max_header_list_size);
        self.assembling = Some(Assembly::start(stream, end_stream, block, max)?);
        Ok(())
    }

    /// A stream id the app may name: odd, one we opened (§5.1.1);
    /// PUSH_PROMISE is refused before this (we announce push off).
    fn check_id(&self, id: u32) -> Result<(), ConnError> {
        check_id(id, lock(&self.shared).next_id)
    }

    fn on_settings(&mut self, ack: bool, s: Settings) -> Result<(), ConnError> {
        if ack {
            return Ok(());
        }
        self.got_settings = true;
        let mut sh = lock(&self.shared);
        if s.enable_push == Some(true) {
            return Err((
                ErrorCode::PROTOCOL_ERROR,
                "SETTINGS_ENABLE_PUSH=1 from a server",
            ));
        }
        if let Some(n) = s.max_concurrent_streams {
            let ours = sh.settings.max_concurrent_streams;
            sh.max_open = n.min(ours) as usize;
            sh.wake_slots();
        }
        if let Some(n) = s.initial_window_size
            && !sh.set_peer_initial_window(n)
        {
            return Err((ErrorCode::FLOW_CONTROL_ERROR, "initial window overflow"));
        }
        if let Some(n) = s.max_frame_size {
            sh.peer_max_frame = n;
        }
        if let Some(n) = s.header_table_size {
            sh.encoder.set_peer_settings_size(n as usize);
        }
        Frame::Settings {
            ack: true,
            settings: Settings::default(),
        }
        .write(&mut sh.out);
        Ok(())
    }

    fn on_data(&mut self, id: u32, end: bool, data: Bytes, flow: u32) -> Result<(), ConnError> {
        self.empty_data.count(data.len(), end)?;
        self.check_id(id)?;
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        sh.win.conn_recv -= i64::from(flow);
        if sh.win.conn_recv < 0 {
            return Err((ErrorCode::FLOW_CONTROL_ERROR, "connection window exceeded"));
        }
        // Padding is nobody's to read: its window goes back at once.
        let pad = flow - data.len() as u32;
        let Some(s) = sh.streams.get_mut(&id) else {
            // A stream we reset: its window is given back.
            sh.release_conn(flow);
            return Ok(());
        };
        if s.reset.is_some() || s.rx.end || s.rx.dropped {
            sh.release_conn(flow);
            return Ok(());
        }
        if !matches!(s.head, Head::Taken | Head::Ready(_)) {
            sh.error_reset(id, ErrorCode::PROTOCOL_ERROR, "DATA before the answer");
            sh.release_conn(flow);
            return Ok(());
        }
        s.rx.window -= i64::from(flow);
        if s.rx.window < 0 {
            sh.error_reset(id, ErrorCode::FLOW_CONTROL_ERROR, "stream window exceeded");
            sh.release_conn(flow);
            return Ok(());
        }
        s.rx.total += data.len() as u64;
        let over =
            s.rx.content_length
                .is_some_and(|l| s.rx.total > l || (end && s.rx.total != l));
        if over {
            sh.error_reset(
                id,
                ErrorCode::PROTOCOL_ERROR,
                "body differs from content-length",
            );
            sh.release_conn(flow);
            return Ok(());
        }
        if !data.is_empty() {
            s.rx.data.push_back(data);
        }
        s.rx.end = end;
        if let Some(w) = s.rx.waker.take() {
            w.wake();
        }
        if end {
            sh.gc(id);
        }
        if pad > 0 {
            sh.release_conn(pad);
        }
        Ok(())
    }

    /// A whole header block: the answer's head, or its trailers.
    fn on_block(&mut self, id: u32, end_stream: bool, block: &[u8]) -> Result<(), ConnError> {
        // Decoded whatever becomes of the stream: the table must stay in
        // step with the app's.
        let decoded = self.decoder.decode(block, &mut self.block);
        let mut guard = lock(&self.shared);
        let sh = &mut *guard;
        if let Err(e) = decoded {
            if e.ends_connection() {
                return Err((e.code(), "HPACK block could not be decoded"));
            }
            sh.error_reset(id, e.code(), "answer's header list too large");
            return Ok(());
        }
        let Some(s) = sh.streams.get_mut(&id) else {
            return Ok(());
        };
        if s.reset.is_some() {
            return Ok(());
        }
        if s.rx.end {
            sh.error_reset(id, ErrorCode::STREAM_CLOSED, "HEADERS after END_STREAM");
            return Ok(());
        }
        let taken = if matches!(s.head, Head::Waiting) {
            answer_head(s, &self.block, &mut self.names, end_stream)
        } else {
            answer_trailers(s, &self.block, &mut self.names, end_stream)
        };
        match taken {
            Err(reason) => sh.error_reset(id, ErrorCode::PROTOCOL_ERROR, reason),
            Ok(false) => {}
            Ok(true) => {
                s.rx.end = end_stream;
                s.wake_all();
                if end_stream {
                    sh.gc(id);
                }
            }
        }
        Ok(())
    }
}

/// The answer's head into `s`: Ok(false) for an interim (1xx) one, which
/// §8.1 says a final one follows; Err for a malformed one (§8.3).
fn answer_head(
    s: &mut Stream,
    block: &HeaderBlock,
    names: &mut Names,
    end_stream: bool,
) -> Result<bool, Invalid> {
    let (status, headers, content_length) = validate::response(block, names)?;
    if status.is_informational() {
        if end_stream || status == http::StatusCode::SWITCHING_PROTOCOLS {
            return Err("1xx answer ending the stream, or 101");
        }
        return Ok(false);
    }
    if end_stream && content_length.is_some_and(|l| l != 0) {
        return Err("body differs from content-length");
    }
    let mut head = http::Response::new(());
    *head.status_mut() = status;
    *head.version_mut() = http::Version::HTTP_2;
    *head.headers_mut() = headers;
    s.head = Head::Ready(head);
    s.rx.content_length = content_length;
    Ok(true)
}

/// The answer's trailers into `s` (§8.1: they end the stream).
fn answer_trailers(
    s: &mut Stream,
    block: &HeaderBlock,
    names: &mut Names,
    end_stream: bool,
) -> Result<bool, Invalid> {
    if !end_stream {
        return Err("trailers without END_STREAM");
    }
    let trailers = validate::trailers(block, names)?;
    if s.rx.content_length.is_some_and(|l| l != s.rx.total) {
        return Err("body differs from content-length");
    }
    s.rx.trailers = Some(trailers);
    Ok(true)
}
