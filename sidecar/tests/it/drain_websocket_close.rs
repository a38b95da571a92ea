//! `drain.websocketClose: goingAway`: at the drain deadline a WebSocket
//! gets Close 1001 (Going Away) toward the client and toward the app, each
//! at a frame boundary, then the close handshake, then the TCP close; the
//! sessions' closes are spread over `drain.websocketCloseWindow`. Each test
//! runs the same session with `cut` as its baseline: the TCP connection is
//! cut at the deadline, no Close frame, the frame in flight is lost.

use std::time::Instant;

use anyhow::{Result, bail, ensure};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::kit::app::TestApp;
use crate::kit::http::{echoing_websocket, websocket};
use crate::kit::sidecar::{InProcess, SidecarSpec, drain_flags};
use crate::kit::{WAIT, timing_sensitive, within};

/// Closing starts 100-300 ms after the trigger; the deadline is 1 s later.
const DRAIN: [&str; 8] = drain_flags("100ms", "100ms", "300ms", "1s");
const GOING_AWAY: u16 = 1001;

/// The same with a 3 s deadline, for sessions whose handshake has to move
/// a large frame first: a busy machine must not turn them into timeouts.
const LONG_DRAIN: [&str; 8] = drain_flags("100ms", "100ms", "300ms", "3s");

fn spec(app: &TestApp, mode: &str, window: &str, wait: &str) -> SidecarSpec {
    spec_with(app, &DRAIN, mode, window, wait)
}

fn spec_with(app: &TestApp, drain: &[&str], mode: &str, window: &str, wait: &str) -> SidecarSpec {
    SidecarSpec::new(app.addr).args(drain).args(&[
        "--drain-websocket-close",
        mode,
        "--drain-websocket-close-window",
        window,
        "--drain-websocket-close-wait",
        wait,
    ])
}

/// How a client's WebSocket ended: the Close code it was sent, or how the
/// stream ended without one.
#[derive(Debug, PartialEq)]
enum ClientEnd {
    Close(u16),
    NoCloseFrame(String),
}

/// Reads (bounded) until the server's Close or the end of the stream;
/// after a Close, polls on so tungstenite sends its reply.
async fn read_to_end(
    ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>,
) -> Result<(ClientEnd, Instant)> {
    for _ in 0..1000 {
        match within("the next message", WAIT, ws.next()).await? {
            Some(Ok(Message::Close(frame))) => {
                let at = Instant::now();
                let code = frame.map_or(0, |f| u16::from(f.code));
                // The reply goes out on the next poll; then the stream ends.
                let _ = within("the end after the close", WAIT, ws.next()).await;
                return Ok((ClientEnd::Close(code), at));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Ok((ClientEnd::NoCloseFrame(e.to_string()), Instant::now())),
            None => return Ok((ClientEnd::NoCloseFrame("EOF".into()), Instant::now())),
        }
    }
    bail!("1000 messages and no end")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_gets_going_away_both_ways_at_the_deadline_and_a_cut_without() -> Result<()> {
    let mut seen = Vec::new();
    for mode in ["cut", "goingAway"] {
        let app = TestApp::start("a").await?;
        let sidecar = InProcess::start(spec(&app, mode, "300ms", "900ms")).await?;
        let mut ws = echoing_websocket(sidecar.listen).await?;

        sidecar.start_drain().await?;
        let (client_end, _) = read_to_end(&mut ws).await?;
        sidecar.wait_phase(3.0).await?;
        let app_codes = app
            .stats
            .ws_close_codes
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        let metrics = sidecar.metrics().await?;
        let forced = metrics.counted("kubegrace_drain_force_closed_total");
        let clean = metrics.counted_with("kubegrace_websocket_closes_total", "outcome=\"clean\"");
        println!(
            "{mode}: client {client_end:?}, app saw Close codes {app_codes:?}, force-closed {forced}, clean closes {clean}"
        );
        seen.push((mode, client_end, app_codes, forced, clean));
    }
    let [
        (_, cut_client, cut_app, cut_forced, _),
        (_, client, app, forced, clean),
    ] = seen.as_slice()
    else {
        bail!("two runs expected")
    };
    // Baseline: the deadline cuts the connection; nobody gets a Close.
    ensure!(
        matches!(cut_client, ClientEnd::NoCloseFrame(_)),
        "baseline: the client got {cut_client:?}"
    );
    ensure!(cut_app.is_empty(), "baseline: the app saw {cut_app:?}");
    ensure!(*cut_forced >= 1.0, "baseline: nothing force-closed");
    // goingAway: 1001 both ways, the handshake completed, nothing cut.
    ensure!(
        *client == ClientEnd::Close(GOING_AWAY),
        "the client got {client:?}"
    );
    ensure!(app == &[GOING_AWAY], "the app saw Close codes {app:?}");
    ensure!(*clean == 1.0, "clean closes counted: {clean}");
    ensure!(*forced == 0.0, "force-closed {forced}");
    Ok(())
}

/// A client that speaks WebSocket byte by byte, to hold a frame half sent.
struct RawClient {
    tcp: TcpStream,
    /// Bytes read and not yet parsed into frames.
    pending: Vec<u8>,
}

impl RawClient {
    async fn connect(addr: std::net::SocketAddr) -> Result<Self> {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.write_all(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await?;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let byte = within("the 101", WAIT, tcp.read_u8()).await??;
            head.push(byte);
            ensure!(head.len() < 4096, "no end of the answer head");
        }
        let text = String::from_utf8_lossy(&head);
        ensure!(
            text.starts_with("HTTP/1.1 101"),
            "handshake answered {text}"
        );
        Ok(Self {
            tcp,
            pending: Vec::new(),
        })
    }

    /// The next frame from the server (unmasked): (opcode, payload), or
    /// `None` once the connection ended.
    async fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>> {
        loop {
            if let Some((frame, used)) = parse_server_frame(&self.pending) {
                self.pending.drain(..used);
                return Ok(Some(frame));
            }
            let mut buf = [0u8; 16 * 1024];
            match within("a frame", WAIT, self.tcp.read(&mut buf)).await? {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// Reads until the connection ends (bounded), dropping what comes.
    async fn until_closed(&mut self) -> Result<()> {
        for _ in 0..10_000 {
            if self.next_frame().await?.is_none() {
                return Ok(());
            }
        }
        bail!("the connection never ended")
    }
}

fn parse_server_frame(buf: &[u8]) -> Option<((u8, Vec<u8>), usize)> {
    let [b0, b1, rest @ ..] = buf else {
        return None;
    };
    let (len, head) = match b1 & 0x7f {
        126 => (
            usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?])),
            4,
        ),
        127 => (
            usize::try_from(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?)).ok()?,
            10,
        ),
        n => (usize::from(n), 2),
    };
    let payload = buf.get(head..head + len)?;
    Some(((b0 & 0x0f, payload.to_vec()), head + len))
}

/// A client frame: FIN, `opcode`, masked with `key`.
fn client_frame(opcode: u8, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&key);
    f.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
    f
}

/// What one half-sent-frame session showed.
#[derive(Debug)]
struct HalfFrameRun {
    /// The first frame the client got after the drain: (opcode, Close code).
    client_got: Option<(u8, Option<u16>)>,
    app_messages: u64,
    app_codes: Vec<u16>,
    outcome_clean: f64,
    outcome_mid_frame: f64,
    forced: f64,
}

/// The client sends the header and half the payload of a 256 KiB binary
/// message, then the drain starts. With `finish`, the client sends the
/// rest once it got the sidecar's Close (so the frame is in flight at the
/// close point), then its Close reply.
async fn half_frame_session(mode: &str, finish: bool) -> Result<HalfFrameRun> {
    let app = TestApp::start("a").await?;
    let sidecar = InProcess::start(spec_with(&app, &LONG_DRAIN, mode, "100ms", "2500ms")).await?;
    let mut client = RawClient::connect(sidecar.listen).await?;
    let payload: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let frame = client_frame(0x2, &payload, [0x11, 0x22, 0x33, 0x44]);
    let half = frame.len() / 2;
    client.tcp.write_all(&frame[..half]).await?;

    sidecar.start_drain().await?;
    let client_got = match client.next_frame().await? {
        Some((opcode, body)) => {
            let code = (body.len() >= 2).then(|| u16::from_be_bytes([body[0], body[1]]));
            Some((opcode, code))
        }
        None => None,
    };
    if finish && client_got.is_some() {
        client.tcp.write_all(&frame[half..]).await?;
        let reply = client_frame(0x8, &GOING_AWAY.to_be_bytes(), [5, 6, 7, 8]);
        client.tcp.write_all(&reply).await?;
    }
    client.until_closed().await?;
    sidecar.wait_phase(3.0).await?;
    let metrics = sidecar.metrics().await?;
    let outcome = |o: &str| {
        metrics
            .with_label(
                "kubegrace_websocket_closes_total",
                &format!("outcome=\"{o}\""),
            )
            .unwrap_or(0.0)
    };
    let run = HalfFrameRun {
        client_got,
        app_messages: app
            .stats
            .ws_echoed
            .load(std::sync::atomic::Ordering::SeqCst),
        app_codes: app
            .stats
            .ws_close_codes
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default(),
        outcome_clean: outcome("clean"),
        outcome_mid_frame: outcome("mid_frame"),
        forced: metrics.counted("kubegrace_drain_force_closed_total"),
    };
    println!("{mode} (finish {finish}): {run:?}");
    Ok(run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_in_flight_at_the_close_point_reaches_the_app_whole_before_the_close() -> Result<()>
{
    // Baseline: the deadline cuts the half-sent message; the app never
    // gets it, and gets no Close.
    let cut = half_frame_session("cut", true).await?;
    ensure!(cut.client_got.is_none(), "baseline: the client got {cut:?}");
    ensure!(cut.app_messages == 0, "baseline: the app got the message");
    ensure!(cut.app_codes.is_empty(), "baseline: the app saw {cut:?}");
    ensure!(cut.forced >= 1.0, "baseline: nothing force-closed");

    // goingAway: the client gets its Close at once (its direction is
    // between frames), the app gets the whole message and then the Close.
    let run = half_frame_session("goingAway", true).await?;
    ensure!(
        run.client_got == Some((0x8, Some(GOING_AWAY))),
        "the client got {run:?}"
    );
    ensure!(
        run.app_messages == 1,
        "the message did not reach the app whole: {run:?}"
    );
    ensure!(run.app_codes == [GOING_AWAY], "the app saw {run:?}");
    ensure!(run.outcome_clean == 1.0 && run.forced == 0.0, "{run:?}");

    // A frame that never ends: the app's direction gives up after the
    // wait (no Close in the middle of the frame), the client still got its
    // Close, and the session is counted as a mid-frame give-up.
    let stuck = half_frame_session("goingAway", false).await?;
    ensure!(
        stuck.client_got == Some((0x8, Some(GOING_AWAY))),
        "the client got {stuck:?}"
    );
    ensure!(
        stuck.app_messages == 0 && stuck.app_codes.is_empty(),
        "the app saw something: {stuck:?}"
    );
    ensure!(stuck.outcome_mid_frame == 1.0, "{stuck:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closes_of_200_sessions_are_spread_over_the_window() -> Result<()> {
    const SESSIONS: usize = 200;
    const BUCKET_MS: u128 = 100;
    let _alone = timing_sensitive().await;
    let app = TestApp::start("a").await?;
    // Timeout 2 s, window 1.5 s, wait 400 ms: each session sends its Close
    // 0.5 s to 1.6 s after Closing starts (100-300 ms after the trigger).
    let spec = SidecarSpec::new(app.addr)
        .args(&drain_flags("100ms", "100ms", "300ms", "2s"))
        .args(&[
            "--drain-websocket-close-window",
            "1500ms",
            "--drain-websocket-close-wait",
            "400ms",
        ]);
    let sidecar = InProcess::start(spec).await?;
    let mut sessions = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        sessions.push(websocket(sidecar.listen).await?);
    }
    let trigger = Instant::now();
    sidecar.start_drain().await?;
    let readers: Vec<_> = sessions
        .into_iter()
        .map(|mut ws| tokio::spawn(async move { read_to_end(&mut ws).await }))
        .collect();
    let mut offsets_ms = Vec::with_capacity(SESSIONS);
    for reader in readers {
        let (end, at) = reader.await??;
        ensure!(
            end == ClientEnd::Close(GOING_AWAY),
            "a session ended with {end:?}"
        );
        offsets_ms.push(at.duration_since(trigger).as_millis());
    }
    offsets_ms.sort_unstable();
    let mut histogram = std::collections::BTreeMap::new();
    for ms in &offsets_ms {
        *histogram.entry(ms / BUCKET_MS * BUCKET_MS).or_insert(0u32) += 1;
    }
    println!("Close 1001 received, ms after the trigger (100 ms buckets):");
    for (bucket, n) in &histogram {
        println!("{bucket:>5} ms {n:>4} {}", "#".repeat(*n as usize));
    }
    sidecar.wait_phase(3.0).await?;
    let closes = sidecar.metrics().await?;
    let counted = closes.counted("kubegrace_websocket_closes_total");
    let clean = closes.counted_with("kubegrace_websocket_closes_total", "outcome=\"clean\"");
    println!("closes counted {counted}, of which clean {clean}");

    // Not bunched: the 1.1 s the closes may span hold 11 buckets; uniform
    // picks fill nearly all of them.
    ensure!(
        histogram.len() >= 8,
        "the closes are bunched in {} buckets: {histogram:?}",
        histogram.len()
    );
    // All inside the window plus generous slack: after the window's start
    // (0.6 s at the earliest), before the deadline (2.3 s at the latest).
    let (first, last) = (offsets_ms[0], offsets_ms[SESSIONS - 1]);
    ensure!(
        first >= 400 && last <= 3300,
        "closes from {first} ms to {last} ms after the trigger"
    );
    // Every session was closed by the drain (a reply slower than the wait
    // on a loaded machine counts as no_reply: the outcome is not the
    // subject here).
    ensure!(counted == SESSIONS as f64, "closes counted: {counted}");
    sidecar
        .expect_nothing_force_closed("every session closed in time")
        .await?;
    Ok(())
}

/// An app that answers any request with `101` to the `kgtest` protocol,
/// then echoes bytes: an upgrade that is not WebSocket.
async fn kgtest_app() -> Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    match tcp.read_u8().await {
                        Ok(byte) => head.push(byte),
                        Err(_) => return,
                    }
                }
                let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: kgtest\r\nConnection: Upgrade\r\n\r\n";
                if tcp.write_all(answer).await.is_err() {
                    return;
                }
                let (mut r, mut w) = tcp.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_websocket_upgrade_is_still_cut_at_the_deadline() -> Result<()> {
    let app = kgtest_app().await?;
    // goingAway is the default: the other upgrade must not see it.
    let sidecar = InProcess::start(
        SidecarSpec::new(app)
            .args(&DRAIN)
            .args(&["--upgrade-protocols", "websocket,kgtest"]),
    )
    .await?;
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    tcp.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nUpgrade: kgtest\r\nConnection: Upgrade\r\n\r\n")
        .await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(within("the 101", WAIT, tcp.read_u8()).await??);
        ensure!(head.len() < 4096, "no end of the answer head");
    }
    let text = String::from_utf8_lossy(&head);
    ensure!(text.starts_with("HTTP/1.1 101"), "answered {text}");
    // Bytes shaped like a WebSocket text frame: a tunnel does not care.
    let frame_like = [0x81, 0x05, b'h', b'e', b'l', b'l', b'o'];
    tcp.write_all(&frame_like).await?;
    let mut echo = [0u8; 7];
    within("the echo", WAIT, tcp.read_exact(&mut echo)).await??;
    ensure!(echo == frame_like, "echo {echo:?}");

    sidecar.start_drain().await?;
    let mut after = Vec::new();
    let end = within("the cut", WAIT, tcp.read_to_end(&mut after)).await?;
    println!(
        "kgtest upgrade after the drain: {} bytes, then {end:?}",
        after.len()
    );
    ensure!(after.is_empty(), "the tunnel got bytes injected: {after:?}");
    sidecar.wait_phase(3.0).await?;
    let metrics = sidecar.metrics().await?;
    metrics.expect_cut_at_least(1.0, "the upgrade was not cut at the deadline")?;
    metrics.expect("kubegrace_websocket_closes_total", 0.0, "no WebSocket here")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_through_tcp_mode_is_still_cut_at_the_deadline() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = InProcess::start(
        SidecarSpec::new(app.addr)
            .args(&DRAIN)
            .args(&["--protocol", "tcp"]),
    )
    .await?;
    let mut ws = echoing_websocket(sidecar.listen).await?;

    sidecar.start_drain().await?;
    let (end, _) = read_to_end(&mut ws).await?;
    println!("WebSocket through TCP mode: {end:?}");
    ensure!(
        matches!(end, ClientEnd::NoCloseFrame(_)),
        "TCP mode sent {end:?}"
    );
    sidecar.wait_phase(3.0).await?;
    let metrics = sidecar.metrics().await?;
    metrics.expect_cut_at_least(1.0, "the TCP connection was not cut at the deadline")?;
    metrics.expect(
        "kubegrace_websocket_closes_total",
        0.0,
        "TCP mode sends no Close",
    )?;
    Ok(())
}
