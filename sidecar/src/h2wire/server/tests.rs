//! The state machine fed raw frames: a scripted client writes frames and
//! reads what the server answers, over an in-memory pipe.

use std::future::poll_fn;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::super::ErrorCode;
use super::super::frame::{self, Frame, FrameHeader, HEADER_LEN, Settings};
use super::super::hpack::{Decoder, Encoder, EncoderOptions, FieldRef, HeaderBlock, Limits};
use super::conn::PREFACE;
use super::tests_interop::echo;
use super::{Connection, Error, ServerSettings};

const T: Duration = Duration::from_secs(5);

/// What a test asks of the server's connection between frames.
pub(super) enum Cmd {
    Heap(oneshot::Sender<usize>),
    Ends(oneshot::Sender<(u64, bool)>),
    Graceful,
    Final(u32),
    Ping(oneshot::Sender<bool>),
}

/// Runs a connection serving `echo`, taking commands between polls.
pub(super) fn spawn_server(
    io: DuplexStream,
    settings: ServerSettings,
) -> (mpsc::Sender<Cmd>, JoinHandle<Result<(), Error>>) {
    let (tx, mut rx) = mpsc::channel(8);
    let task = tokio::spawn(async move {
        let mut conn = Connection::new(io, settings);
        let mut pong: Option<oneshot::Sender<bool>> = None;
        loop {
            let want_pong = pong.is_some();
            let event = poll_fn(|cx| {
                if want_pong && conn.poll_pong(cx).is_ready() {
                    return std::task::Poll::Ready(None);
                }
                conn.poll_accept(cx).map(Some)
            });
            tokio::select! {
                next = event => match next {
                    None => {
                        if let Some(p) = pong.take() {
                            let _ = p.send(true);
                        }
                    }
                    Some(None) => return Ok(()),
                    Some(Some(Err(e))) => return Err(e),
                    Some(Some(Ok((req, respond)))) => {
                        tokio::spawn(echo(req, respond));
                    }
                },
                Some(cmd) = rx.recv() => match cmd {
                    Cmd::Heap(r) => {
                        println!("heap parts: {:?}", conn.heap_parts());
                        let _ = r.send(conn.heap_bytes());
                    }
                    Cmd::Ends(r) => { let _ = r.send((conn.ends_written(), conn.all_ends_written())); }
                    Cmd::Graceful => conn.graceful_shutdown(),
                    Cmd::Final(last) => {
                        conn.final_goaway(last);
                        return poll_fn(|cx| conn.poll_closed(cx)).await;
                    }
                    Cmd::Ping(r) => {
                        if conn.send_ping() {
                            pong = Some(r);
                        } else {
                            let _ = r.send(false);
                        }
                    }
                },
            }
        }
    });
    (tx, task)
}

pub(super) async fn ask<R>(
    cmds: &mpsc::Sender<Cmd>,
    make: impl FnOnce(oneshot::Sender<R>) -> Cmd,
) -> R {
    let (tx, rx) = oneshot::channel();
    assert!(cmds.send(make(tx)).await.is_ok(), "server gone");
    tokio::time::timeout(T, rx)
        .await
        .expect("in time")
        .expect("answer")
}

/// One frame as read.
pub(super) struct Owned {
    pub(super) header: FrameHeader,
    pub(super) payload: Vec<u8>,
}

impl Owned {
    pub(super) fn frame(&self) -> Frame<'_> {
        frame::parse(self.header, &self.payload).expect("the server's frame parses")
    }

    pub(super) fn kind(&self) -> u8 {
        self.header.kind
    }

    /// RST_STREAM's or GOAWAY's code.
    pub(super) fn code(&self) -> Option<ErrorCode> {
        match self.frame() {
            Frame::RstStream { code, .. } | Frame::GoAway { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A client written frame by frame.
pub(super) struct Client {
    pub(super) io: DuplexStream,
    pub(super) out: Vec<u8>,
    enc: Encoder,
    dec: Decoder,
    block: HeaderBlock,
    pub(super) server_settings: Option<Settings>,
}

impl Client {
    /// Preface and an empty SETTINGS written; the server's SETTINGS read
    /// and acknowledged.
    pub(super) async fn connect(
        settings: ServerSettings,
    ) -> (Self, mpsc::Sender<Cmd>, JoinHandle<Result<(), Error>>) {
        Self::connect_piped(settings, 64 << 10).await
    }

    /// As [`Client::connect`], with `pipe` bytes of buffer each way.
    pub(super) async fn connect_piped(
        settings: ServerSettings,
        pipe: usize,
    ) -> (Self, mpsc::Sender<Cmd>, JoinHandle<Result<(), Error>>) {
        let (client_io, server_io) = tokio::io::duplex(pipe);
        let (cmds, task) = spawn_server(server_io, settings);
        let mut c = Self {
            io: client_io,
            out: PREFACE.to_vec(),
            enc: Encoder::new(4096, EncoderOptions::default()),
            dec: Decoder::new(4096, Limits::default()),
            block: HeaderBlock::default(),
            server_settings: None,
        };
        c.push(Frame::Settings {
            ack: false,
            settings: Settings::default(),
        });
        c.flush().await;
        let first = c.next().await.expect("server SETTINGS");
        match first.frame() {
            Frame::Settings {
                ack: false,
                settings,
            } => c.server_settings = Some(settings),
            other => panic!("first frame {other:?}"),
        }
        c.push(Frame::Settings {
            ack: true,
            settings: Settings::default(),
        });
        c.flush().await;
        (c, cmds, task)
    }

    pub(super) fn push(&mut self, f: Frame<'_>) {
        f.write(&mut self.out);
    }

    pub(super) async fn flush(&mut self) {
        self.io.write_all(&self.out).await.expect("write");
        self.out.clear();
    }

    /// A header block with the given fields, as HEADERS (+CONTINUATION).
    pub(super) fn headers(&mut self, id: u32, end_stream: bool, fields: &[(&str, &str)]) {
        let block = self.encode(fields);
        frame::write_header_block(id, end_stream, &block, 16 << 10, &mut self.out);
    }

    /// A block encoded alone (for hand-made frame sequences).
    pub(super) fn encode(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        let fields = fields
            .iter()
            .map(|(n, v)| FieldRef::new(n.as_bytes(), v.as_bytes()));
        self.enc.encode(fields, &mut block);
        block
    }

    /// Flushes, reads until a frame of `kind` (on `stream`), its code.
    pub(super) async fn code_of(&mut self, kind: u8, stream: Option<u32>) -> Option<ErrorCode> {
        self.flush().await;
        self.until(kind, stream).await.code()
    }

    /// Flushes, reads until the response HEADERS on `id`, its :status.
    pub(super) async fn status_of(&mut self, id: u32) -> String {
        self.flush().await;
        let h = self.until(frame::HEADERS, Some(id)).await;
        self.decode(&h)
    }

    /// Flushes, reads until RST_STREAM on `id`, its code.
    pub(super) async fn rst_of(&mut self, id: u32) -> Option<ErrorCode> {
        self.code_of(frame::RST_STREAM, Some(id)).await
    }

    /// Flushes, reads until GOAWAY, its code.
    pub(super) async fn goaway(&mut self) -> Option<ErrorCode> {
        self.code_of(frame::GOAWAY, None).await
    }

    pub(super) fn rst(&mut self, stream: u32, code: ErrorCode) {
        self.push(Frame::RstStream { stream, code });
    }

    pub(super) fn window_update(&mut self, stream: u32, increment: u32) {
        self.push(Frame::WindowUpdate { stream, increment });
    }

    pub(super) fn data(&mut self, id: u32, end_stream: bool, data: &[u8]) {
        let flow_len = data.len() as u32;
        self.push(Frame::Data {
            stream: id,
            end_stream,
            data,
            flow_len,
        });
    }

    pub(super) fn get(&mut self, id: u32, end_stream: bool) {
        self.headers(id, end_stream, &GET);
    }

    /// The next frame; None at EOF. Panics after 5 s of silence.
    pub(super) async fn next(&mut self) -> Option<Owned> {
        let mut head = [0u8; HEADER_LEN];
        match tokio::time::timeout(T, self.io.read_exact(&mut head)).await {
            Err(_) => panic!("no frame in 5 s"),
            Ok(Err(_)) => return None,
            Ok(Ok(_)) => {}
        }
        let header = FrameHeader::parse(&head);
        let mut payload = vec![0; header.len as usize];
        tokio::time::timeout(T, self.io.read_exact(&mut payload))
            .await
            .expect("payload in time")
            .expect("payload");
        Some(Owned { header, payload })
    }

    /// Reads until a frame of `kind` (on `stream`, if given).
    pub(super) async fn until(&mut self, kind: u8, stream: Option<u32>) -> Owned {
        loop {
            let f = self.next().await.expect("a frame before EOF");
            if f.kind() == frame::HEADERS {
                self.decode(&f);
            }
            if f.kind() == kind && stream.is_none_or(|s| s == f.header.stream) {
                return f;
            }
        }
    }

    /// Decodes a response HEADERS (keeps HPACK in step); `:status`.
    pub(super) fn decode(&mut self, f: &Owned) -> String {
        let Frame::Headers { block, .. } = f.frame() else {
            panic!("not HEADERS");
        };
        self.dec.decode(block, &mut self.block).expect("decodes");
        self.block
            .iter()
            .find(|f| f.name == b":status")
            .map(|f| String::from_utf8_lossy(f.value).into_owned())
            .unwrap_or_default()
    }

    /// The value of `name` in the last decoded block.
    pub(super) fn field(&self, name: &str) -> Option<String> {
        self.block
            .iter()
            .find(|f| f.name == name.as_bytes())
            .map(|f| String::from_utf8_lossy(f.value).into_owned())
    }

    /// Flushes, then nothing but SETTINGS/WINDOW_UPDATE for 200 ms (no
    /// GOAWAY, no EOF): for a half-sent header block, where a PING would
    /// itself be an error.
    pub(super) async fn roundtrip_err(&mut self) {
        self.flush().await;
        loop {
            let mut head = [0u8; HEADER_LEN];
            let read =
                tokio::time::timeout(Duration::from_millis(200), self.io.read_exact(&mut head))
                    .await;
            let Ok(read) = read else {
                return;
            };
            read.expect("the connection is still open");
            let header = FrameHeader::parse(&head);
            let mut payload = vec![0; header.len as usize];
            self.io.read_exact(&mut payload).await.expect("payload");
            assert!(
                matches!(header.kind, frame::SETTINGS | frame::WINDOW_UPDATE),
                "unexpected frame {header:?}"
            );
        }
    }

    /// A PING answered: everything written before it was processed and
    /// the connection is alive.
    pub(super) async fn roundtrip(&mut self) {
        self.push(Frame::Ping {
            ack: false,
            data: *b"roundtr!",
        });
        self.flush().await;
        loop {
            let f = self.next().await.expect("PING ACK before EOF");
            if f.kind() == frame::HEADERS {
                self.decode(&f);
            }
            if f.kind() == frame::GOAWAY {
                panic!("GOAWAY {:?}", f.code());
            }
            if let Frame::Ping { ack: true, data } = f.frame()
                && data == *b"roundtr!"
            {
                return;
            }
        }
    }
}

/// The default settings changed by `f`.
pub(super) fn with(f: impl FnOnce(&mut ServerSettings)) -> ServerSettings {
    let mut s = ServerSettings::default();
    f(&mut s);
    s
}

/// GOAWAY(last, NO_ERROR) without debug data, as the drain sends it.
pub(super) fn goaway_no_error(last_stream: u32) -> Frame<'static> {
    Frame::GoAway {
        last_stream,
        code: ErrorCode::NO_ERROR,
        debug: b"",
    }
}

/// The server task ended without an error.
pub(super) async fn ends_cleanly(task: JoinHandle<Result<(), Error>>) {
    let end = tokio::time::timeout(T, task).await.expect("ends");
    let end = end.expect("join");
    assert!(end.is_ok(), "{end:?}");
}

pub(super) const GET: [(&str, &str); 4] = [
    (":method", "GET"),
    (":scheme", "http"),
    (":authority", "test.local"),
    (":path", "/x?y=1"),
];

#[tokio::test]
async fn handshake_settings_ping_and_a_request() {
    let settings = ServerSettings {
        max_concurrent_streams: 7,
        initial_window_size: 1000,
        ..ServerSettings::default()
    };
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    let s = c.server_settings.expect("settings");
    assert_eq!(s.max_concurrent_streams, Some(7));
    assert_eq!(s.initial_window_size, Some(1000));
    assert_eq!(s.enable_push, Some(false));
    assert_eq!(s.max_header_list_size, Some(64 << 10));
    let wu = c.until(frame::WINDOW_UPDATE, Some(0)).await;
    assert_eq!(
        wu.frame(),
        Frame::WindowUpdate {
            stream: 0,
            increment: (1 << 20) - 65_535
        }
    );
    c.until(frame::SETTINGS, None).await; // the ACK of ours
    c.roundtrip().await;
    c.get(1, true);
    assert_eq!(c.status_of(1).await, "200");
    assert_eq!(
        c.field("x-request").as_deref(),
        Some("GET http://test.local/x?y=1 HTTP/2.0")
    );
    let d = c.until(frame::DATA, Some(1)).await;
    assert!(matches!(
        d.frame(),
        Frame::Data {
            end_stream: true,
            data: [],
            ..
        }
    ));
}

/// Requests §8.2/§8.3 calls malformed: each reset with PROTOCOL_ERROR,
/// the connection goes on.
#[tokio::test]
async fn malformed_requests_are_stream_errors() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    let bad: Vec<Vec<(&str, &str)>> = vec![
        [&GET[..], &[("X-Upper", "1")]].concat(),
        [&GET[..], &[("connection", "close")]].concat(),
        [&GET[..], &[("te", "gzip")]].concat(),
        [&GET[..], &[("x", " padded")]].concat(),
        [&GET[..], &[(":unknown", "1")]].concat(),
        [&GET[..1], &GET[2..]].concat(), // no :scheme
        vec![GET[0], GET[1], GET[2]],    // no :path
        vec![
            (":method", "CONNECT"),
            (":authority", "a:1"),
            (":path", "/"),
        ],
        vec![GET[0], ("x", "1"), GET[1], GET[2], GET[3]], // pseudo after regular
        [&GET[..], &[(":path", "/again")]].concat(),
        [&GET[..], &[("content-length", "3")]].concat(), // END_STREAM with no body
    ];
    let mut id = 1;
    for fields in &bad {
        c.headers(id, true, fields);
        c.flush().await;
        let r = c.until(frame::RST_STREAM, Some(id)).await;
        assert_eq!(r.code(), Some(ErrorCode::PROTOCOL_ERROR), "{fields:?}");
        id += 2;
    }
    // te: trailers and CONNECT with :authority only are fine.
    c.headers(id, true, &[&GET[..], &[("te", "trailers")]].concat());
    assert_eq!(c.status_of(id).await, "200");
    c.headers(
        id + 2,
        true,
        &[(":method", "CONNECT"), (":authority", "example.com:443")],
    );
    assert_eq!(c.status_of(id + 2).await, "200");
}

#[tokio::test]
async fn content_length_must_match_the_data() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    c.headers(1, false, &[&GET[..], &[("content-length", "4")]].concat());
    c.data(1, true, b"abc");
    assert_eq!(c.rst_of(1).await, Some(ErrorCode::PROTOCOL_ERROR));
    c.headers(3, false, &[&GET[..], &[("content-length", "2")]].concat());
    c.data(3, false, b"abc");
    assert_eq!(c.rst_of(3).await, Some(ErrorCode::PROTOCOL_ERROR));
    c.headers(5, false, &[&GET[..], &[("content-length", "3")]].concat());
    c.data(5, true, b"abc");
    assert_eq!(c.status_of(5).await, "200");
    assert_eq!(c.field("x-len").as_deref(), Some("3"));
}

#[tokio::test]
async fn concurrency_limit_refuses_the_stream_past_it() {
    let settings = with(|s| s.max_concurrent_streams = 2);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    c.get(1, false);
    c.get(3, false);
    c.get(5, false);
    assert_eq!(c.rst_of(5).await, Some(ErrorCode::REFUSED_STREAM));
    // Ending stream 1 (the echo answers) makes room again.
    c.data(1, true, b"");
    c.flush().await;
    c.until(frame::DATA, Some(1)).await;
    c.get(7, true);
    assert_eq!(c.status_of(7).await, "200");
}

#[tokio::test]
async fn receive_window_is_enforced_at_its_bound() {
    let settings = with(|s| s.initial_window_size = 1000);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    c.until(frame::SETTINGS, None).await; // our SETTINGS acknowledged both ways
    let body = [7u8; 1001];
    c.get(1, false);
    c.data(1, true, &body[..1000]);
    c.get(3, false);
    c.data(3, true, &body);
    assert_eq!(c.rst_of(3).await, Some(ErrorCode::FLOW_CONTROL_ERROR));
    c.roundtrip().await;
}

#[tokio::test]
async fn send_window_follows_settings_and_window_updates() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    c.push(Frame::Settings {
        ack: false,
        settings: Settings {
            initial_window_size: Some(0),
            ..Settings::default()
        },
    });
    c.headers(1, false, &GET);
    let body = [1u8; 100];
    c.data(1, true, &body);
    assert_eq!(c.status_of(1).await, "200");
    c.roundtrip().await; // nothing on a zero window
    c.push(Frame::Settings {
        ack: false,
        settings: Settings {
            initial_window_size: Some(30),
            ..Settings::default()
        },
    });
    c.flush().await;
    let d = c.until(frame::DATA, Some(1)).await;
    assert_eq!(d.payload.len(), 30);
    c.window_update(1, 70);
    c.flush().await;
    let d = c.until(frame::DATA, Some(1)).await;
    assert_eq!(d.payload.len(), 70);
    assert!(matches!(
        d.frame(),
        Frame::Data {
            end_stream: true,
            ..
        }
    ));
    // Past 2^31-1: the stream's window, then the connection's.
    c.get(3, false);
    c.window_update(3, frame::MAX_WINDOW);
    assert_eq!(c.rst_of(3).await, Some(ErrorCode::FLOW_CONTROL_ERROR));
    c.window_update(0, frame::MAX_WINDOW);
    assert_eq!(c.goaway().await, Some(ErrorCode::FLOW_CONTROL_ERROR));
}

#[tokio::test]
async fn push_promise_from_a_client_ends_the_connection() {
    let (mut c, _cmds, task) = Client::connect(Default::default()).await;
    c.get(1, false);
    FrameHeader {
        len: 4,
        kind: frame::PUSH_PROMISE,
        flags: frame::FLAG_END_HEADERS,
        stream: 1,
    }
    .write(&mut c.out);
    c.out.extend_from_slice(&2u32.to_be_bytes());
    assert_eq!(c.goaway().await, Some(ErrorCode::PROTOCOL_ERROR));
    assert!(c.next().await.is_none(), "closed after the GOAWAY");
    let end = tokio::time::timeout(T, task)
        .await
        .expect("ends")
        .expect("join");
    assert!(matches!(
        end,
        Err(Error::Connection {
            code: ErrorCode::PROTOCOL_ERROR,
            ..
        })
    ));
}

#[tokio::test]
async fn oversized_header_list_resets_only_its_stream() {
    let settings = with(|s| s.max_header_list_size = 4096);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    let big = "v".repeat(4000);
    c.headers(1, true, &[&GET[..], &[("x-big", &big[..])]].concat());
    assert_eq!(c.rst_of(1).await, Some(ErrorCode::PROTOCOL_ERROR));
    let fits = "v".repeat(3000);
    c.headers(3, true, &[&GET[..], &[("x-big", &fits[..])]].concat());
    assert_eq!(c.status_of(3).await, "200");
}
