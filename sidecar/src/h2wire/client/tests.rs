//! Raw-frame tests: the test plays the app, writes its frames and reads
//! ours, for what a conforming server does not do on demand (GOAWAY with
//! streams above its last id, windows and header lists at and past their
//! bounds, SETTINGS values).

use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

use super::super::ErrorCode;
use super::super::frame::{self, Frame, FrameHeader, HEADER_LEN, MAX_WINDOW, Settings};
use super::super::hpack::{Encoder, EncoderOptions, FieldRef};
use super::super::shared::EMPTY_DATA_LIMIT;
use super::conn::{MAX_LOCAL_ERROR_RESETS, PREFACE};
use super::{ClientSettings, Connection, Error, SendRequest};

const T: Duration = Duration::from_secs(10);

struct App {
    io: DuplexStream,
    enc: Encoder,
}

impl App {
    async fn send(&mut self, f: Frame<'_>) {
        let mut out = Vec::new();
        f.write(&mut out);
        self.io.write_all(&out).await.expect("write");
    }

    async fn frame(&mut self) -> (FrameHeader, Vec<u8>) {
        let mut head = [0u8; HEADER_LEN];
        tokio::time::timeout(T, self.io.read_exact(&mut head))
            .await
            .expect("a frame in time")
            .expect("read");
        let h = FrameHeader::parse(&head);
        let mut payload = vec![0u8; h.len as usize];
        self.io.read_exact(&mut payload).await.expect("payload");
        (h, payload)
    }

    /// The next frame of `kind`, the others skipped.
    async fn next(&mut self, kind: u8) -> (FrameHeader, Vec<u8>) {
        loop {
            let (h, p) = self.frame().await;
            if h.kind == kind {
                return (h, p);
            }
        }
    }

    async fn data(&mut self, stream: u32, data: &[u8]) {
        let flow_len = data.len() as u32;
        self.send(Frame::Data {
            stream,
            end_stream: false,
            data,
            flow_len,
        })
        .await;
    }

    async fn answer(&mut self, stream: u32, fields: &[(&[u8], &[u8])], end_stream: bool) {
        let mut block = Vec::new();
        self.enc
            .encode(fields.iter().map(|(n, v)| FieldRef::new(n, v)), &mut block);
        let mut out = Vec::new();
        frame::write_header_block(stream, end_stream, &block, 16 << 10, &mut out);
        self.io.write_all(&out).await.expect("write");
    }
}

/// A client on one end of a pipe, the app's SETTINGS (`settings`) sent
/// and our preface read on the other.
async fn start(
    ours: ClientSettings,
    settings: Settings,
) -> (App, SendRequest, JoinHandle<Result<(), Error>>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (mut conn, send) = Connection::new(a, ours);
    let task = tokio::spawn(async move { poll_fn(|cx| conn.poll(cx)).await });
    let mut app = App {
        io: b,
        enc: Encoder::new(4096, EncoderOptions::default()),
    };
    let mut preface = [0u8; 24];
    app.io.read_exact(&mut preface).await.expect("preface");
    assert_eq!(&preface, PREFACE);
    app.send(Frame::Settings {
        ack: false,
        settings,
    })
    .await;
    (app, send, task)
}

/// After a GOAWAY: the last stream's answer comes with `status`, then the
/// connection ends cleanly.
pub(super) async fn last_answer_then_clean_end(
    resp: super::ResponseFuture,
    status: u16,
    task: JoinHandle<Result<(), Error>>,
) {
    let resp = tokio::time::timeout(T, resp)
        .await
        .expect("in time")
        .expect("answer");
    assert_eq!(resp.status(), status);
    drop(resp);
    let end = tokio::time::timeout(T, task)
        .await
        .expect("closes")
        .expect("task");
    assert!(end.is_ok(), "{end:?}");
}

/// The error the answer ends with (within [`T`]).
pub(super) async fn failure(resp: super::ResponseFuture) -> Error {
    match tokio::time::timeout(T, resp).await {
        Ok(Err(e)) => e,
        Ok(Ok(r)) => panic!("an answer ({}) where an error was expected", r.status()),
        Err(_) => panic!("neither answer nor error in time"),
    }
}

fn get() -> Request<()> {
    Request::get("http://app.test/x").body(()).expect("request")
}

async fn open(send: &mut SendRequest) -> super::ResponseFuture {
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    send.send_request(&get(), true).expect("send").0
}

#[tokio::test]
async fn streams_above_the_apps_goaway_are_never_processed_and_the_rest_finish() {
    let (mut app, mut send, task) = start(ClientSettings::default(), Settings::default()).await;
    let first = open(&mut send).await;
    let second = open(&mut send).await;
    assert_eq!((first.stream_id(), second.stream_id()), (1, 3));
    app.next(frame::HEADERS).await;
    app.next(frame::HEADERS).await;
    app.send(Frame::GoAway {
        last_stream: 1,
        code: ErrorCode::NO_ERROR,
        debug: b"",
    })
    .await;
    let err = failure(second).await;
    assert!(err.never_processed(), "{err}");
    // No new stream after a GOAWAY.
    let ready = poll_fn(|cx| Poll::Ready(send.poll_ready(cx))).await;
    assert!(matches!(ready, Poll::Ready(Err(_))));
    app.answer(1, &[(b":status", b"204")], true).await;
    last_answer_then_clean_end(first, 204, task).await;
}

#[tokio::test]
async fn a_refused_stream_is_never_processed_and_another_reset_is_not() {
    let (mut app, mut send, _task) = start(ClientSettings::default(), Settings::default()).await;
    let refused = open(&mut send).await;
    let cancelled = open(&mut send).await;
    app.send(Frame::RstStream {
        stream: 1,
        code: ErrorCode::REFUSED_STREAM,
    })
    .await;
    app.send(Frame::RstStream {
        stream: 3,
        code: ErrorCode::CANCEL,
    })
    .await;
    let a = failure(refused).await;
    let b = failure(cancelled).await;
    assert!(a.never_processed(), "{a}");
    assert!(!b.never_processed(), "{b}");
}

/// The answer's header list at our SETTINGS_MAX_HEADER_LIST_SIZE passes;
/// one octet more resets the stream (PROTOCOL_ERROR), the connection
/// stays.
#[tokio::test]
async fn the_answers_header_list_is_bounded_at_our_setting() {
    let ours = ClientSettings {
        max_header_list_size: 1000,
        ..ClientSettings::default()
    };
    let (mut app, mut send, _task) = start(ours, Settings::default()).await;
    // :status 200 is 7 + 3 + 32 octets; x-pad is 5 + len + 32.
    let at = vec![b'a'; 1000 - 42 - 37];
    let past = vec![b'a'; 1000 - 42 - 37 + 1];
    for (pad, ok) in [(&at, true), (&past, false), (&at, true)] {
        let resp = open(&mut send).await;
        let id = resp.stream_id();
        app.answer(id, &[(b":status", b"200"), (b"x-pad", pad)], true)
            .await;
        let got = tokio::time::timeout(T, resp).await.expect("in time");
        assert_eq!(got.is_ok(), ok, "pad {}", pad.len());
        if !ok {
            let (h, p) = app.next(frame::RST_STREAM).await;
            assert_eq!(h.stream, id);
            assert_eq!(p, ErrorCode::PROTOCOL_ERROR.0.to_be_bytes());
        }
    }
}

/// A connection window raised to 2^31-1 is fine; one more octet is a
/// FLOW_CONTROL_ERROR (§6.9.1): our GOAWAY, the connection ends.
#[tokio::test]
async fn the_apps_window_updates_are_bounded_at_two_to_the_31() {
    let (mut app, _send, task) = start(ClientSettings::default(), Settings::default()).await;
    app.send(Frame::WindowUpdate {
        stream: 0,
        increment: MAX_WINDOW - 65_535,
    })
    .await;
    still_up(&mut app).await;
    app.send(Frame::WindowUpdate {
        stream: 0,
        increment: 1,
    })
    .await;
    ends_with(&mut app, task, ErrorCode::FLOW_CONTROL_ERROR).await;
}

/// The connection is still up: a PING of the app's is answered, and no
/// GOAWAY of ours comes before the ACK.
async fn still_up(app: &mut App) {
    app.send(Frame::Ping {
        ack: false,
        data: *b"12345678",
    })
    .await;
    loop {
        let (h, _) = app.frame().await;
        assert_ne!(h.kind, frame::GOAWAY);
        if h.kind == frame::PING {
            break;
        }
    }
}

/// Our GOAWAY(`code`) comes and the connection ends with that error.
async fn ends_with(app: &mut App, task: JoinHandle<Result<(), Error>>, code: ErrorCode) {
    let (_, p) = app.next(frame::GOAWAY).await;
    assert_eq!(p[4..8], code.0.to_be_bytes());
    let end = tokio::time::timeout(T, task)
        .await
        .expect("ends")
        .expect("task");
    assert_eq!(end.err().and_then(|e| e.code()), Some(code));
}

/// Empty DATA frames without END_STREAM: [`EMPTY_DATA_LIMIT`] of them
/// (net of non-empty ones) pass, one more ends the connection with
/// ENHANCE_YOUR_CALM, as the server bounds its clients.
#[tokio::test]
async fn empty_data_from_the_app_is_bounded() {
    let (mut app, mut send, task) = start(ClientSettings::default(), Settings::default()).await;
    let _resp = open(&mut send).await;
    app.next(frame::HEADERS).await;
    app.answer(1, &[(b":status", b"200")], false).await;
    // One non-empty frame takes one off the count.
    app.data(1, b"").await;
    app.data(1, b"x").await;
    for _ in 0..EMPTY_DATA_LIMIT {
        app.data(1, b"").await;
    }
    still_up(&mut app).await;
    app.data(1, b"").await;
    ends_with(&mut app, task, ErrorCode::ENHANCE_YOUR_CALM).await;
}

/// Streams we reset for the app's errors (here answers without :status):
/// [`MAX_LOCAL_ERROR_RESETS`] of them pass, one more ends the connection
/// with ENHANCE_YOUR_CALM (h2's client had the same bound).
#[tokio::test]
async fn streams_reset_for_the_apps_errors_are_bounded() {
    let (mut app, mut send, task) = start(ClientSettings::default(), Settings::default()).await;
    let malformed = async |send: &mut SendRequest, app: &mut App| {
        let resp = open(send).await;
        app.answer(resp.stream_id(), &[(b"x-no-status", b"1")], true)
            .await;
        let err = failure(resp).await;
        assert_eq!(err.code(), Some(ErrorCode::PROTOCOL_ERROR), "{err}");
    };
    for _ in 0..MAX_LOCAL_ERROR_RESETS {
        malformed(&mut send, &mut app).await;
    }
    still_up(&mut app).await;
    let resp = open(&mut send).await;
    app.answer(resp.stream_id(), &[(b"x-no-status", b"1")], true)
        .await;
    ends_with(&mut app, task, ErrorCode::ENHANCE_YOUR_CALM).await;
}

/// The app's MAX_CONCURRENT_STREAMS holds `poll_ready`; a closed stream
/// frees the slot; ours caps a larger value.
#[tokio::test]
async fn the_apps_max_concurrent_streams_gates_poll_ready() {
    let settings = Settings {
        max_concurrent_streams: Some(1),
        ..Settings::default()
    };
    let (mut app, mut send, _task) = start(ClientSettings::default(), settings).await;
    // Our SETTINGS ACK says theirs were applied.
    app.next(frame::SETTINGS).await;
    loop {
        let (h, _) = app.frame().await;
        if h.kind == frame::SETTINGS && h.flags & frame::FLAG_ACK != 0 {
            break;
        }
    }
    let first = open(&mut send).await;
    let pending = poll_fn(|cx| Poll::Ready(send.poll_ready(cx).is_pending())).await;
    assert!(pending, "a second stream must wait");
    assert!(send.send_request(&get(), true).is_err());
    app.answer(1, &[(b":status", b"200")], true).await;
    let _ = tokio::time::timeout(T, first).await.expect("answer");
    tokio::time::timeout(T, poll_fn(|cx| send.poll_ready(cx)))
        .await
        .expect("a slot again")
        .expect("slot");
}

/// A response that §8.3 calls malformed resets its stream.
#[tokio::test]
async fn malformed_answers_reset_the_stream() {
    let (mut app, mut send, _task) = start(ClientSettings::default(), Settings::default()).await;
    let cases: [&[(&[u8], &[u8])]; 4] = [
        &[(b"x-no-status", b"1")],
        &[(b":status", b"200"), (b":path", b"/")],
        &[(b":status", b"20")],
        &[(b":status", b"200"), (b"connection", b"close")],
    ];
    for fields in cases {
        let resp = open(&mut send).await;
        let id = resp.stream_id();
        app.answer(id, fields, true).await;
        let err = failure(resp).await;
        assert_eq!(err.code(), Some(ErrorCode::PROTOCOL_ERROR), "{fields:?}");
        assert!(!err.never_processed());
    }
    // A push is refused: we announced it off.
    app.send(Frame::Settings {
        ack: false,
        settings: Settings {
            enable_push: Some(true),
            ..Settings::default()
        },
    })
    .await;
    let (_, p) = app.next(frame::GOAWAY).await;
    assert_eq!(p[4..8], ErrorCode::PROTOCOL_ERROR.0.to_be_bytes());
}

/// §8.1: the app answers whole before the request body ended, then resets
/// the stream with NO_ERROR (h2's and hyper's servers do on every early
/// answer, gRPC's included). The answer is read to its end, the reset no
/// error to its reader, and the request body goes no further. The data
/// was once dropped with the reset: a gRPC answer without its message.
#[tokio::test]
async fn a_whole_answer_then_reset_no_error_is_read_whole() {
    let (mut app, mut send, _task) = start(ClientSettings::default(), Settings::default()).await;
    poll_fn(|cx| send.poll_ready(cx)).await.expect("slot");
    let (resp, body) = send.send_request(&get(), false).expect("send");
    let mut body = body.expect("a request body");
    app.next(frame::HEADERS).await;
    app.answer(1, &[(b":status", b"200")], false).await;
    app.data(1, b"hello").await;
    app.answer(1, &[(b"grpc-status", b"0")], true).await;
    app.send(Frame::RstStream {
        stream: 1,
        code: ErrorCode::NO_ERROR,
    })
    .await;
    // The answer is not asked for before the reset is handled.
    tokio::time::timeout(T, async {
        while body
            .send_data(bytes::Bytes::from_static(b"x"), false)
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request body stops after the reset");
    let resp = tokio::time::timeout(T, resp)
        .await
        .expect("in time")
        .expect("answer");
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("the whole answer, no error");
    let trailers = got.trailers().cloned().unwrap_or_default();
    assert_eq!(got.to_bytes(), &b"hello"[..]);
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
}

/// The app closes the connection under an open stream (it crashed): the
/// stream fails with an I/O error, which app.rs counts as a request lost
/// in flight (as it did with h2's client), and not as never processed.
#[tokio::test]
async fn an_app_that_closes_under_an_open_stream_fails_it_with_an_io_error() {
    let (mut app, mut send, task) = start(ClientSettings::default(), Settings::default()).await;
    let resp = open(&mut send).await;
    app.next(frame::HEADERS).await;
    drop(app);
    let err = failure(resp).await;
    assert!(
        matches!(&err, Error::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof),
        "{err}"
    );
    assert!(!err.never_processed());
    assert!(crate::app::is_lost_in_flight(&crate::Error::upstream_h2(
        err
    )));
    let end = tokio::time::timeout(T, task).await.expect("ends");
    assert!(end.expect("task").is_err());
}

/// An app that floods PINGs and SETTINGS and reads nothing: the client
/// stops reading once 64 KiB of its answers wait unwritten (and the pipe
/// back is full), so the app's writes stall instead of our memory
/// growing; once the app reads, every answer comes.
#[tokio::test]
async fn ping_and_settings_floods_from_the_app_stop_at_the_unread_output() {
    let (mut app, _send, _task) = start(ClientSettings::default(), Settings::default()).await;
    let bytes = |f: Frame<'_>| {
        let mut b = Vec::new();
        f.write(&mut b);
        b
    };
    let ping = bytes(Frame::Ping {
        ack: false,
        data: *b"appflood",
    });
    let settings = bytes(Frame::Settings {
        ack: false,
        settings: Settings::default(),
    });
    let flood = [ping, settings].concat().repeat(256);
    // Whole chunks the client took; the write that stalls is given up.
    let mut taken = 0usize;
    while let Ok(written) =
        tokio::time::timeout(Duration::from_millis(300), app.io.write_all(&flood)).await
    {
        written.expect("write");
        taken += flood.len();
        assert!(
            taken < 8 << 20,
            "the client read {taken} bytes whose answers nobody read"
        );
    }
    // The pipe's 1 MiB each way, our 64 KiB backlog and read buffer.
    assert!(taken > 0 && taken < 4 << 20, "{taken} bytes taken");
    // A PING ACK (17 bytes) for every PING of the whole chunks taken.
    let want = taken / flood.len() * 256;
    let mut acks = 0;
    while acks < want {
        let (h, p) = app.frame().await;
        if h.kind == frame::PING && p == b"appflood" {
            acks += 1;
        }
    }
}
