//! Abuse bounds, each at the bound (served) and one past it (refused),
//! and the drain's GOAWAY sequences, on raw frames.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::super::ErrorCode;
use super::super::frame::{self, Frame};
use super::ServerSettings;
use super::frames::{EMPTY_DATA_LIMIT, MAX_BLOCK_FRAMES};
use super::tests::{Client, Cmd, GET, ask, ends_cleanly, goaway_no_error, with};

const T: Duration = Duration::from_secs(5);

/// HEADERS plus `continuations` CONTINUATIONs, the block in the first.
fn split_block(c: &mut Client, id: u32, continuations: u32) {
    let block = c.encode(&GET);
    c.push(Frame::Headers {
        stream: id,
        end_stream: true,
        end_headers: continuations == 0,
        priority: None,
        block: &block,
    });
    for i in 1..=continuations {
        c.push(Frame::Continuation {
            stream: id,
            end_headers: i == continuations,
            block: b"",
        });
    }
}

#[tokio::test]
async fn continuation_flood_is_cut_at_the_frame_bound() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    split_block(&mut c, 1, MAX_BLOCK_FRAMES - 1);
    assert_eq!(c.status_of(1).await, "200");
    split_block(&mut c, 3, MAX_BLOCK_FRAMES);
    assert_eq!(c.goaway().await, Some(ErrorCode::ENHANCE_YOUR_CALM));
}

#[tokio::test]
async fn header_block_bytes_are_bounded_before_hpack() {
    let settings = with(|s| s.max_header_list_size = 4096);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    // 4096 + 2048 + 4096 bytes accepted; this junk would be a
    // COMPRESSION_ERROR if HPACK saw it.
    let junk = vec![0xffu8; 6000];
    c.push(Frame::Headers {
        stream: 1,
        end_stream: true,
        end_headers: false,
        priority: None,
        block: &junk,
    });
    c.push(Frame::Continuation {
        stream: 1,
        end_headers: false,
        block: &junk[..4240],
    });
    c.roundtrip_err().await;
    c.push(Frame::Continuation {
        stream: 1,
        end_headers: true,
        block: &junk[..1],
    });
    assert_eq!(c.goaway().await, Some(ErrorCode::ENHANCE_YOUR_CALM));
}

/// Opens `n` streams from `id` on and resets each at once.
fn open_and_reset(c: &mut Client, id: &mut u32, n: usize, fields: &[(&str, &str)]) {
    for _ in 0..n {
        c.headers(*id, false, fields);
        c.rst(*id, ErrorCode::CANCEL);
        *id += 2;
    }
}

#[tokio::test]
async fn rapid_reset_is_cut_past_its_budget() {
    let settings = with(|s| s.max_concurrent_streams = 50);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    // max(100, 2 * 50) resets of young unanswered streams a second; in
    // two rounds so the application lets go of the first in between.
    let mut id = 1;
    for _ in 0..2 {
        open_and_reset(&mut c, &mut id, 50, &GET);
        c.flush().await;
        c.roundtrip().await;
    }
    open_and_reset(&mut c, &mut id, 1, &GET);
    assert_eq!(c.goaway().await, Some(ErrorCode::ENHANCE_YOUR_CALM));
}

/// A client cancelling streams long after it opened them (deadlines) is
/// not rapid reset, however many.
#[tokio::test]
async fn late_resets_are_not_counted() {
    let (mut c, _cmds, _task) = Client::connect(with(|s| s.max_concurrent_streams = 60)).await;
    // Three rounds of 60 (past the budget of 120 if they counted).
    for first in [1, 121, 241] {
        let ids = (first..first + 120).step_by(2);
        for stream in ids.clone() {
            c.get(stream, false);
        }
        c.flush().await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        for stream in ids {
            c.rst(stream, ErrorCode::CANCEL);
        }
        c.roundtrip().await;
    }
}

/// Streams the client reset while the application still holds them
/// count against the concurrency twice over: past that, new streams are
/// refused until the application lets go.
#[tokio::test]
async fn streams_held_after_a_client_reset_are_bounded() {
    let settings = with(|s| s.max_concurrent_streams = 5);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    let held = [&GET[..], &[("x-drop", "hold")]].concat();
    let mut id = 1;
    open_and_reset(&mut c, &mut id, 10, &held);
    c.flush().await;
    c.roundtrip().await;
    c.get(id, true);
    assert_eq!(c.rst_of(id).await, Some(ErrorCode::REFUSED_STREAM));
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.get(id + 2, true);
    assert_eq!(c.status_of(id + 2).await, "200");
}

#[tokio::test]
async fn empty_data_flood_is_cut_past_its_bound() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    c.get(1, false);
    for _ in 0..EMPTY_DATA_LIMIT {
        c.data(1, false, b"");
    }
    c.flush().await;
    c.roundtrip().await;
    c.data(1, false, b"");
    assert_eq!(c.goaway().await, Some(ErrorCode::ENHANCE_YOUR_CALM));
}

#[tokio::test]
async fn errors_that_make_us_reset_are_bounded() {
    let settings = with(|s| s.max_local_error_resets = 5);
    let (mut c, _cmds, _task) = Client::connect(settings).await;
    let bad = [&GET[..], &[("Upper", "x")]].concat();
    // Five resets for malformed requests are tolerated, the sixth is not.
    for stream in [1, 3, 5, 7, 9] {
        c.headers(stream, true, &bad);
    }
    c.flush().await;
    c.roundtrip().await;
    c.headers(11, true, &bad);
    assert_eq!(c.goaway().await, Some(ErrorCode::ENHANCE_YOUR_CALM));
}

/// A client that floods PINGs and SETTINGS and reads nothing: the server
/// stops reading once its answers back up, so its memory stays bounded;
/// a client that reads gets every answer.
#[tokio::test]
async fn ping_and_settings_floods_are_bounded_by_the_unread_output() {
    let (mut c, cmds, _task) = Client::connect(Default::default()).await;
    let mut one = Vec::new();
    Frame::Ping {
        ack: false,
        data: *b"floodflo",
    }
    .write(&mut one);
    Frame::Settings {
        ack: false,
        settings: Default::default(),
    }
    .write(&mut one);
    let chunk = one.repeat(256);
    let mut sent = 0usize;
    let mut blocked = false;
    for _ in 0..2000 {
        match tokio::time::timeout(Duration::from_millis(200), c.io.write_all(&chunk)).await {
            Ok(r) => r.expect("write"),
            Err(_) => {
                blocked = true;
                break;
            }
        }
        sent += chunk.len();
    }
    assert!(
        blocked,
        "the server kept reading {sent} bytes whose answers nobody read"
    );
    let heap = ask(&cmds, Cmd::Heap).await;
    assert!(heap < 256 << 10, "heap {heap} bytes while flooded");
    assert!(
        sent < 4 << 20,
        "{sent} bytes taken before the server stopped"
    );

    // At the bound: the same frames from a client that reads.
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    let (mut rd, mut wr) = tokio::io::split(std::mem::replace(&mut c.io, tokio::io::duplex(1).0));
    let writer = tokio::spawn(async move {
        for _ in 0..40 {
            wr.write_all(&chunk).await.expect("write");
        }
    });
    let mut acks = 0;
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0usize;
    // 40 * 256 PING ACKs (17 bytes) and SETTINGS ACKs (9 bytes).
    let want = 40 * 256 * (17 + 9);
    while total < want {
        let n = tokio::time::timeout(T, tokio::io::AsyncReadExt::read(&mut rd, &mut buf))
            .await
            .expect("answers keep coming")
            .expect("read");
        assert!(n > 0, "EOF after {total} bytes");
        total += n;
        acks += 1;
    }
    assert!(acks > 0);
    writer.await.expect("writer");
}

/// A client that floods until the server stops reading, and only then
/// reads, all at once: the backed-up answers then go in one write, and
/// the server must read the rest of the flood after it (nothing else
/// wakes it: those bytes were in the socket before it stopped looking),
/// so every PING gets its ACK. A pipe of 1 MiB each way, as a loopback
/// socket's buffers, so one write can empty the backlog.
#[tokio::test]
async fn a_flood_read_late_is_answered_whole() {
    let (mut c, _cmds, _task) = Client::connect_piped(Default::default(), 1 << 20).await;
    let mut one = Vec::new();
    Frame::Ping {
        ack: false,
        data: *b"latelate",
    }
    .write(&mut one);
    let chunk = one.repeat(256);
    let mut sent = 0usize;
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(200), c.io.write_all(&chunk)).await
    {
        r.expect("write");
        sent += chunk.len();
        assert!(sent < 16 << 20, "the server never stopped reading");
    }
    // A PING ACK is 17 bytes, as the PING; nothing else is sent.
    let want = sent / chunk.len() * chunk.len();
    let mut got = 0usize;
    let mut buf = vec![0u8; 4 << 20];
    while got < want {
        let n = tokio::time::timeout(T, tokio::io::AsyncReadExt::read(&mut c.io, &mut buf))
            .await
            .unwrap_or_else(|_| panic!("{got} of {want} bytes of PING ACKs, then nothing"))
            .expect("read");
        assert!(n > 0, "EOF after {got} bytes");
        got += n;
    }
}

/// A connection with stream 1 open, the graceful shutdown's first step
/// read (GOAWAY(2^31-1) and the PING), then stream 3 opened and the PING
/// acknowledged (`end_stream`: both requests complete).
async fn graceful_ack_after_streams_1_and_3(
    end_stream: bool,
) -> (Client, tokio::task::JoinHandle<Result<(), super::Error>>) {
    let (mut c, cmds, task) = Client::connect(Default::default()).await;
    c.get(1, end_stream);
    c.flush().await;
    c.roundtrip().await;
    assert!(cmds.send(Cmd::Graceful).await.is_ok());
    let g = c.until(frame::GOAWAY, None).await;
    assert_eq!(g.frame(), goaway_no_error(frame::MAX_WINDOW));
    let p = c.until(frame::PING, None).await;
    let Frame::Ping { ack: false, data } = p.frame() else {
        panic!("PING")
    };
    c.get(3, end_stream);
    c.push(Frame::Ping { ack: true, data });
    c.flush().await;
    (c, task)
}

/// §6.8 two steps: GOAWAY(2^31-1) + PING; after the ACK, GOAWAY(last);
/// open streams finish, later ones are refused, then the connection ends.
#[tokio::test]
async fn graceful_shutdown_two_steps() {
    // A stream opened before the ACK is still processed.
    let (mut c, task) = graceful_ack_after_streams_1_and_3(false).await;
    let g = c.until(frame::GOAWAY, None).await;
    assert_eq!(g.frame(), goaway_no_error(3));
    c.get(5, true);
    assert_eq!(c.rst_of(5).await, Some(ErrorCode::REFUSED_STREAM));
    for id in [1, 3] {
        c.data(id, true, b"ab");
    }
    c.flush().await;
    let mut ended = 0;
    while let Some(f) = c.next().await {
        if let Frame::Data {
            end_stream: true, ..
        } = f.frame()
        {
            ended += 1;
        }
    }
    assert_eq!(ended, 2, "both streams answered before the close");
    ends_cleanly(task).await;
}

/// The graceful PING's ACK fixes the second GOAWAY's last-stream-id only
/// 100 ms after it came (and 50 ms after a stream opened meanwhile): a
/// client can write its ACK before the HEADERS of a stream it opened just
/// before it read the first GOAWAY (the h2 crate's client does), and that
/// stream must not be refused. Acted on at once, this test's stream 5
/// would get REFUSED_STREAM and the GOAWAY would name 3.
#[tokio::test]
async fn a_stream_opened_right_after_the_graceful_ack_is_still_served() {
    let (mut c, task) = graceful_ack_after_streams_1_and_3(true).await;
    // After the ACK, as a client whose request task runs late writes it.
    tokio::time::sleep(Duration::from_millis(30)).await;
    c.get(5, true);
    c.flush().await;
    let mut last = None;
    let mut answered = Vec::new();
    while let Some(f) = c.next().await {
        match f.frame() {
            Frame::GoAway { last_stream, .. } if last_stream != frame::MAX_WINDOW => {
                last = Some(last_stream);
            }
            Frame::RstStream { stream, code } => panic!("stream {stream} reset: {code:?}"),
            Frame::Data {
                stream,
                end_stream: true,
                ..
            } => answered.push(stream),
            _ => {}
        }
    }
    assert_eq!(
        last,
        Some(5),
        "the second GOAWAY names the stream sent after the ACK"
    );
    answered.sort_unstable();
    // Stream 1 was answered before the shutdown (read by `roundtrip`).
    assert_eq!(answered, [3, 5]);
    ends_cleanly(task).await;
}

/// One GOAWAY naming the last stream as the very last frame; streams
/// above it dropped without RST_STREAM.
#[tokio::test]
async fn final_goaway_is_the_last_frame() {
    let (mut c, cmds, task) = Client::connect(Default::default()).await;
    c.get(1, true);
    c.get(3, false);
    c.get(5, false);
    c.flush().await;
    c.until(frame::DATA, Some(1)).await;
    c.roundtrip().await;
    assert!(cmds.send(Cmd::Final(3)).await.is_ok());
    let mut last = None;
    while let Some(f) = c.next().await {
        assert_ne!(f.kind(), frame::RST_STREAM, "no RST for the dropped stream");
        last = Some(f);
    }
    let last = last.expect("a frame");
    assert_eq!(last.frame(), goaway_no_error(3));
    ends_cleanly(task).await;
}

#[tokio::test]
async fn user_ping_and_pong() {
    let (mut c, cmds, _task) = Client::connect(Default::default()).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    assert!(cmds.send(Cmd::Ping(tx)).await.is_ok());
    let p = c.until(frame::PING, None).await;
    let Frame::Ping { ack: false, data } = p.frame() else {
        panic!("PING")
    };
    assert!(
        !ask(&cmds, Cmd::Ping).await,
        "a second PING while one is out"
    );
    c.push(Frame::Ping { ack: true, data });
    c.flush().await;
    assert!(
        tokio::time::timeout(T, rx)
            .await
            .expect("pong in time")
            .expect("answer")
    );
}

#[tokio::test]
async fn dropped_handles_reset_their_streams() {
    let (mut c, cmds, _task) = Client::connect(Default::default()).await;
    // The Respond dropped unanswered: CANCEL.
    c.headers(1, true, &[&GET[..], &[("x-drop", "respond")]].concat());
    assert_eq!(c.rst_of(1).await, Some(ErrorCode::CANCEL));
    // The body dropped, the answer complete: RST(NO_ERROR) after it
    // (§8.1), and the body's unread bytes go back to the connection.
    c.headers(3, false, &[&GET[..], &[("x-drop", "body")]].concat());
    c.data(3, false, &[1; 1000]);
    assert_eq!(c.status_of(3).await, "200");
    assert_eq!(c.rst_of(3).await, Some(ErrorCode::NO_ERROR));
    c.roundtrip().await;
    let (written, all) = ask(&cmds, Cmd::Ends).await;
    assert_eq!(written, 2);
    assert!(all);
}

/// Frames the client sent before it saw our RST_STREAM are ignored, their
/// header blocks still decoded (HPACK in step).
#[tokio::test]
async fn frames_in_flight_after_our_reset_are_ignored() {
    let (mut c, _cmds, _task) = Client::connect(Default::default()).await;
    c.headers(1, false, &[&GET[..], &[("Upper", "x")]].concat());
    assert_eq!(c.rst_of(1).await, Some(ErrorCode::PROTOCOL_ERROR));
    c.data(1, false, b"late");
    c.headers(1, true, &[("x-trailer", "indexed-by-the-encoder")]);
    c.flush().await;
    c.roundtrip().await;
    c.headers(
        3,
        true,
        &[&GET[..], &[("x-trailer", "indexed-by-the-encoder")]].concat(),
    );
    assert_eq!(c.status_of(3).await, "200");
    // A stream that ended normally is another matter: §5.1 "closed".
    c.until(frame::DATA, Some(3)).await;
    c.headers(3, true, &GET);
    assert_eq!(c.goaway().await, Some(ErrorCode::STREAM_CLOSED));
}

#[tokio::test]
async fn client_goaway_with_an_error_ends_the_connection() {
    let (mut c, _cmds, task) = Client::connect(Default::default()).await;
    c.get(1, false);
    c.push(Frame::GoAway {
        last_stream: 0,
        code: ErrorCode::INTERNAL_ERROR,
        debug: b"bye",
    });
    c.flush().await;
    let end = tokio::time::timeout(T, task)
        .await
        .expect("ends")
        .expect("join");
    assert!(
        matches!(
            end,
            Err(super::Error::Connection {
                code: ErrorCode::INTERNAL_ERROR,
                remote: true,
                ..
            })
        ),
        "{end:?}"
    );
}

/// The socket wrapper of `one_write_per_wake_up`: counts `poll_write`s.
struct CountingIo {
    inner: tokio::io::DuplexStream,
    writes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tokio::io::AsyncRead for CountingIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountingIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Everything one read brings is answered with one `write`: the
/// handshake, SETTINGS ACK and 50 PING ACKs here.
#[tokio::test]
async fn one_write_per_wake_up() {
    use tokio::io::AsyncReadExt;
    let (mut client, server_io) = tokio::io::duplex(1 << 20);
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let io = CountingIo {
        inner: server_io,
        writes: writes.clone(),
    };
    let _server = tokio::spawn(async move {
        let mut conn = super::Connection::new(io, ServerSettings::default());
        while std::future::poll_fn(|cx| conn.poll_accept(cx))
            .await
            .is_some()
        {}
    });
    let mut out = super::conn::PREFACE.to_vec();
    Frame::Settings {
        ack: false,
        settings: Default::default(),
    }
    .write(&mut out);
    for i in 0..50u8 {
        Frame::Ping {
            ack: false,
            data: [i; 8],
        }
        .write(&mut out);
    }
    client.write_all(&out).await.expect("write");
    // SETTINGS 9 + 5 * 6, WINDOW_UPDATE 13, SETTINGS ACK 9, 50 * 17.
    let want = 9 + 30 + 13 + 9 + 50 * 17;
    let mut got = vec![0u8; want];
    tokio::time::timeout(T, client.read_exact(&mut got))
        .await
        .expect("answers in time")
        .expect("read");
    let n = writes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n <= 2, "{n} writes for one read's answers");
}
