//! The sidecar tried as an attacker would, on loopback, with raw
//! sockets where the attack is in the framing. Each test shows one hole
//! closed: client faults stay out of the breaker and the upstream error
//! counter, slow bodies get 408, a client that stops reading is cut and its
//! app connection freed, a pipelined half head is timed, only listed
//! Upgrade protocols reach the app, X-Forwarded-Proto comes from the
//! connection, connection caps hold while probes answer, and the admin
//! port refuses unsafe starts. Bad input never crashes the process.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use common::apps::TestApp;
use common::http::{get, request};
use common::sidecar::{BIN, Sidecar, SidecarSpec, run_to_exit};
use common::{wait_for, within};
use http::{Method, StatusCode};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(30);
const EX_USAGE: i32 = 64;

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// Writes `bytes` on a fresh connection and reads until the server closes
/// it (bounded); returns what came back.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Result<String> {
    let mut tcp = TcpStream::connect(addr).await?;
    let _ = tcp.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = within(
        "the server to answer and close",
        WAIT,
        tcp.read_to_end(&mut out),
    )
    .await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Reads one HTTP/1.1 response with a Content-Length body off `reader`.
async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Result<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            bail!("connection closed mid-response; got {head:?}");
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    Ok(head)
}

async fn metric(sidecar: &Sidecar, name: &str, label: &str) -> Result<f64> {
    let metrics = sidecar.metrics().await?;
    metrics
        .with_label(name, label)
        .with_context(|| format!("no {name}{{{label}}} in {:?}", metrics.series))
}

async fn breaker_state(sidecar: &Sidecar, route: &str) -> Result<serde_json::Value> {
    let resp = sidecar.admin_get("/breakers").await?;
    let v: serde_json::Value = serde_json::from_slice(&resp.body)?;
    v["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["name"] == route).cloned())
        .with_context(|| format!("no route {route} in {v}"))
}

#[tokio::test]
async fn invalid_chunk_sizes_get_400_and_move_no_breaker_or_upstream_counter() -> Result<()> {
    let app = TestApp::start("a").await?;
    // Three failures in a row would open this breaker.
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).config(
        "routes:\n  - name: upload\n    match: {pathPrefix: /upload}\n    circuitBreaker: {consecutiveFailures: 3, errorRatio: 0}\n",
    ))
    .await?;
    let head = "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    let bodies = [
        "zz\r\nhello\r\n0\r\n\r\n".to_string(),
        "123456789012345678901\r\nhello\r\n0\r\n\r\n".to_string(),
        "5\r\nhelloXX0\r\n\r\n".to_string(),
        "zz\r\n".to_string(),
        "-1\r\nx\r\n0\r\n\r\n".to_string(),
    ];
    for body in &bodies {
        let answer = raw_exchange(sidecar.listen, format!("{head}{body}").as_bytes()).await?;
        ensure!(
            status_line(&answer).starts_with("HTTP/1.1 400"),
            "chunked body {body:?} got {:?}",
            status_line(&answer)
        );
    }
    // A client that leaves mid-body: nothing to answer, nothing to blame.
    let mut gone = TcpStream::connect(sidecar.listen).await?;
    gone.write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\nonly a part")
        .await?;
    drop(gone);

    let connect_errors = metric(
        &sidecar,
        "kubegrace_upstream_errors_total",
        "kind=\"connect\"",
    )
    .await?;
    ensure!(
        connect_errors == 0.0,
        "client faults counted as upstream errors: {connect_errors}"
    );
    let bad = metric(
        &sidecar,
        "kubegrace_client_errors_total",
        "kind=\"bad_body\"",
    )
    .await?;
    ensure!(
        bad >= bodies.len() as f64,
        "bad bodies counted {bad}, sent {}",
        bodies.len()
    );
    let route = breaker_state(&sidecar, "upload").await?;
    ensure!(
        route["breaker"]["state"] == "closed",
        "breaker moved: {route}"
    );
    ensure!(
        route["breaker"]["consecutiveFailures"] == 0 && route["breaker"]["window"]["failures"] == 0,
        "client faults counted against the app: {route}"
    );
    // The route still serves everyone else.
    let ok = raw_exchange(
        sidecar.listen,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await?;
    ensure!(
        status_line(&ok).starts_with("HTTP/1.1 200"),
        "good upload got {:?}",
        status_line(&ok)
    );
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::OK),
        "bad input hurt /ready"
    );
    Ok(())
}

#[tokio::test]
async fn a_trickling_body_gets_408() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).args(&["--body-read-timeout", "1s"])).await?;
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (rd, mut wr) = tcp.into_split();
    wr.write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
        .await?;
    // One byte every 200ms: 100 bytes would take 20s.
    let trickle = tokio::spawn(async move {
        for i in 0..100u32 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr.write_all(b"x").await.is_err() {
                return Some(i);
            }
        }
        None
    });
    let mut reader = BufReader::new(rd);
    let head = within(
        "the 408",
        Duration::from_secs(15),
        read_response(&mut reader),
    )
    .await??;
    ensure!(
        status_line(&head).starts_with("HTTP/1.1 408"),
        "a trickling body got {head:?}"
    );
    trickle.abort();
    let timeouts = metric(
        &sidecar,
        "kubegrace_client_timeouts_total",
        "kind=\"body_read\"",
    )
    .await?;
    ensure!(timeouts >= 1.0, "body read timeout not counted");
    let connect_errors = metric(
        &sidecar,
        "kubegrace_upstream_errors_total",
        "kind=\"connect\"",
    )
    .await?;
    ensure!(
        connect_errors == 0.0,
        "a slow client counted as an app error"
    );
    // A body at an honest pace still goes through.
    let ok = raw_exchange(
        sidecar.listen,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await?;
    ensure!(status_line(&ok).starts_with("HTTP/1.1 200"), "{ok}");
    Ok(())
}

/// An app that answers every request with `size` bytes and notes when the
/// sidecar's connection to it goes away.
struct BigApp {
    addr: SocketAddr,
    closed: Arc<AtomicBool>,
}

impl BigApp {
    async fn start(size: usize) -> Result<BigApp> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        tokio::spawn(async move {
            // Only the first connection matters (the proxy's /ready checks
            // connect and leave without a request).
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let flag = flag.clone();
                tokio::spawn(async move {
                    let (rd, mut wr) = stream.into_split();
                    let mut rd = BufReader::new(rd);
                    let mut line = String::new();
                    // Wait for a request; probes send none.
                    match rd.read_line(&mut line).await {
                        Ok(n) if n > 0 => {}
                        _ => return,
                    }
                    loop {
                        line.clear();
                        match rd.read_line(&mut line).await {
                            Ok(n) if n > 0 && line != "\r\n" => continue,
                            _ => break,
                        }
                    }
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n");
                    let chunk = vec![b'b'; 64 * 1024];
                    let mut ok = wr.write_all(head.as_bytes()).await.is_ok();
                    let mut sent = 0;
                    while ok && sent < size {
                        ok = wr
                            .write_all(&chunk[..chunk.len().min(size - sent)])
                            .await
                            .is_ok();
                        sent += chunk.len();
                    }
                    if ok {
                        // Everything fit in the buffers: the close shows as EOF.
                        let mut rest = Vec::new();
                        let _ = rd.read_to_end(&mut rest).await;
                    }
                    flag.store(true, Ordering::SeqCst);
                });
            }
        });
        Ok(BigApp { addr, closed })
    }
}

/// More than every socket buffer on the way (app -> sidecar -> client)
/// holds, so a client that does not read stalls the sidecar's writes.
const BIG: usize = 48 << 20;

/// Sends one GET for the big answer and never reads it.
async fn stalled_reader(listen: SocketAddr) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect(listen).await?;
    tcp.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .await?;
    Ok(tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_is_cut_and_its_app_connection_freed() -> Result<()> {
    // Baseline: with the write timeout off, the app connection stays held.
    let app = BigApp::start(BIG).await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).args(&["--write-timeout", "0s"])).await?;
    let _held = stalled_reader(sidecar.listen).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        !app.closed.load(Ordering::SeqCst),
        "baseline: the app connection ended although nothing cut the stalled reader"
    );
    drop(sidecar);

    let app = BigApp::start(BIG).await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).args(&["--write-timeout", "1s"])).await?;
    let mut tcp = stalled_reader(sidecar.listen).await?;
    wait_for("the app to see its connection closed", WAIT, || async {
        app.closed.load(Ordering::SeqCst).then_some(())
    })
    .await
    .with_context(|| sidecar.logs_text())?;
    let cut = metric(
        &sidecar,
        "kubegrace_client_timeouts_total",
        "kind=\"write\"",
    )
    .await?;
    ensure!(cut >= 1.0, "write timeout not counted");
    // The client sees the end of the connection, short of 16 MiB.
    let mut got = Vec::new();
    let _ = within("the cut client to see EOF", WAIT, tcp.read_to_end(&mut got)).await?;
    ensure!(
        got.len() < BIG,
        "the whole answer arrived ({} bytes)",
        got.len()
    );
    ensure!(sidecar.ready_status().await == Some(StatusCode::OK));
    Ok(())
}

/// An app that records every request head it gets and grants any Upgrade
/// (as an app that would hand out an h2c tunnel does).
struct RecordingApp {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RecordingApp {
    async fn start() -> Result<RecordingApp> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let (rd, mut wr) = stream.into_split();
                    let mut rd = BufReader::new(rd);
                    loop {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            match rd.read_line(&mut line).await {
                                Ok(n) if n > 0 => {}
                                _ => return,
                            }
                            head.push_str(&line);
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let lower = head.to_ascii_lowercase();
                        if let Ok(mut heads) = seen.lock() {
                            heads.push(lower.clone());
                        }
                        let upgrade = lower
                            .lines()
                            .find_map(|l| l.strip_prefix("upgrade:").map(|v| v.trim().to_string()));
                        if let Some(protocol) = upgrade {
                            let answer = format!(
                                "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: {protocol}\r\n\r\n"
                            );
                            let _ = wr.write_all(answer.as_bytes()).await;
                            // A raw tunnel from here on: echo.
                            let _ = tokio::io::copy(&mut rd, &mut wr).await;
                            return;
                        }
                        if wr
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Ok(RecordingApp { addr, heads })
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn last_for(&self, path: &str) -> Option<String> {
        self.heads()
            .into_iter()
            .rev()
            .find(|h| h.starts_with(&format!("get {path} ")))
    }
}

#[tokio::test]
async fn upgrade_h2c_never_reaches_the_app_websocket_does() -> Result<()> {
    let app = RecordingApp::start().await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    let answer = raw_exchange(
        sidecar.listen,
        b"GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    )
    .await?;
    ensure!(
        status_line(&answer).starts_with("HTTP/1.1 200"),
        "h2c upgrade answered {:?} (a 101 is a tunnel around the proxy)",
        status_line(&answer)
    );
    let seen = app
        .last_for("/h2c")
        .context("the app never got the plain request")?;
    ensure!(
        !seen.contains("upgrade:") && !seen.contains("http2-settings"),
        "the app saw: {seen}"
    );
    // Several offers: only the allowed one survives.
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    tcp.write_all(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        .await?;
    let mut reader = BufReader::new(tcp);
    let head = within("the websocket 101", WAIT, read_response(&mut reader)).await??;
    ensure!(
        status_line(&head).starts_with("HTTP/1.1 101"),
        "websocket got {head:?}"
    );
    let seen = app
        .last_for("/ws")
        .context("the app never got the websocket handshake")?;
    ensure!(
        seen.contains("upgrade: websocket") && !seen.contains("h2c"),
        "the app saw: {seen}"
    );
    let ignored = sidecar
        .metrics()
        .await?
        .sum("kubegrace_upgrades_ignored_total");
    ensure!(ignored == Some(1.0), "ignored upgrades: {ignored:?}");
    Ok(())
}

#[tokio::test]
async fn x_forwarded_proto_comes_from_the_connection_unless_hops_are_trusted() -> Result<()> {
    let app = RecordingApp::start().await?;
    let req =
        b"GET /proto HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: https\r\nConnection: close\r\n\r\n";
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    raw_exchange(sidecar.listen, req).await?;
    let seen = app.last_for("/proto").context("no request")?;
    ensure!(
        seen.contains("x-forwarded-proto: http\r\n"),
        "untrusted client's proto kept: {seen}"
    );
    drop(sidecar);
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&["--trusted-hops", "1"])).await?;
    raw_exchange(sidecar.listen, req).await?;
    let seen = app.last_for("/proto").context("no request")?;
    ensure!(
        seen.contains("x-forwarded-proto: https\r\n"),
        "trusted balancer's proto lost: {seen}"
    );
    Ok(())
}

#[tokio::test]
async fn a_pipelined_half_head_is_cut_by_the_header_read_timeout() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).config("limits: {headerReadTimeout: 500ms}\n"))
            .await?;
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    tcp.set_nodelay(true)?;
    // One write, so one packet: a whole head and half of the next one.
    tcp.write_all(
        b"GET /work HTTP/1.1\r\nHost: a\r\n\r\nGET /work HTTP/1.1\r\nHost: a\r\nX-Half: ",
    )
    .await?;
    let mut reader = BufReader::new(tcp);
    let head = within("the first answer", WAIT, read_response(&mut reader)).await??;
    ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
    // Before the fix this lived until the idle timeout (120s).
    let mut rest = Vec::new();
    let _ = within(
        "the half head to be cut",
        Duration::from_secs(10),
        reader.read_to_end(&mut rest),
    )
    .await?;
    let rest = String::from_utf8_lossy(&rest);
    ensure!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 408"),
        "got {rest:?}"
    );
    let cut = metric(
        &sidecar,
        "kubegrace_client_timeouts_total",
        "kind=\"header_read\"",
    )
    .await?;
    ensure!(cut >= 1.0, "header timeout not counted");
    Ok(())
}

#[tokio::test]
async fn idle_keep_alive_after_each_body_kind_is_not_cut_by_the_header_timer() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar =
        Sidecar::start(SidecarSpec::new(app.addr).config("limits: {headerReadTimeout: 300ms}\n"))
            .await?;
    let requests: [&[u8]; 3] = [
        b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ];
    for first in requests {
        let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
        tcp.get_mut().write_all(first).await?;
        let head = within("answer 1", WAIT, read_response(&mut tcp)).await??;
        ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
        // Idle for 4x the header timeout: only the idle timeout may close it.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        tcp.get_mut()
            .write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n")
            .await?;
        let head = within("answer 2", WAIT, read_response(&mut tcp))
            .await?
            .with_context(|| {
                format!(
                    "kept-alive connection closed after {:?}",
                    String::from_utf8_lossy(first)
                )
            })?;
        ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_caps_hold_while_probes_and_open_connections_work() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&[
        "--max-connections",
        "3",
        "--admin-max-connections",
        "2",
    ]))
    .await?;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut tcp = BufReader::new(TcpStream::connect(sidecar.listen).await?);
        tcp.get_mut()
            .write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n")
            .await?;
        let head = within("an answer", WAIT, read_response(&mut tcp)).await??;
        ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
        open.push(tcp);
    }
    // The fourth is closed at once, with no answer.
    let answer = raw_exchange(sidecar.listen, b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n").await?;
    ensure!(
        answer.is_empty(),
        "a connection past the cap got {answer:?}"
    );
    let refused = metric(
        &sidecar,
        "kubegrace_connections_refused_total",
        "listener=\"proxy\"",
    )
    .await?;
    ensure!(refused >= 1.0, "refusal not counted");
    // Probes and the open connections keep working.
    ensure!(sidecar.ready_status().await == Some(StatusCode::OK));
    for tcp in &mut open {
        tcp.get_mut()
            .write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n")
            .await?;
        let head = within("an answer on an open connection", WAIT, read_response(tcp)).await??;
        ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
    }
    // One leaves, and a new connection gets its place.
    drop(open.pop());
    wait_for("a new connection under the cap", WAIT, || async {
        get(sidecar.listen, "/work")
            .await
            .ok()
            .filter(|r| r.status == StatusCode::OK)
    })
    .await?;

    // The admin port past its cap: probes still answer, the rest does not.
    let _idle_admin = (
        TcpStream::connect(sidecar.admin).await?,
        TcpStream::connect(sidecar.admin).await?,
    );
    wait_for(
        "the admin port to count two open connections",
        WAIT,
        || async {
            let resp = request(sidecar.admin, Method::GET, "/metrics", &[], WAIT)
                .await
                .ok()?;
            (resp.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
        },
    )
    .await?;
    for path in ["/ready", "/live"] {
        let resp = request(sidecar.admin, Method::GET, path, &[], WAIT).await?;
        ensure!(
            resp.status == StatusCode::OK,
            "{path} past the admin cap: {}",
            resp.status
        );
    }
    Ok(())
}

#[tokio::test]
async fn tcp_mode_closes_idle_connections() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&[
        "--protocol",
        "tcp",
        "--tunnel-idle-timeout",
        "500ms",
    ]))
    .await?;
    let mut tcp = TcpStream::connect(sidecar.listen).await?;
    // Traffic keeps it open...
    tcp.write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n")
        .await?;
    let mut reader = BufReader::new(tcp);
    let head = within(
        "an answer through the tunnel",
        WAIT,
        read_response(&mut reader),
    )
    .await??;
    ensure!(status_line(&head).starts_with("HTTP/1.1 200"), "{head}");
    // ... silence closes it (the app's own idle timeout is far longer).
    let mut rest = Vec::new();
    within(
        "the idle tunnel to close",
        Duration::from_secs(10),
        reader.read_to_end(&mut rest),
    )
    .await??;
    wait_for("the idle close to be counted", WAIT, || async {
        let v = metric(
            &sidecar,
            "kubegrace_client_timeouts_total",
            "kind=\"tunnel_idle\"",
        )
        .await
        .ok()?;
        (v >= 1.0).then_some(())
    })
    .await?;
    Ok(())
}

/// Spawns the binary with `args` and extra environment, to completion.
async fn run_env(args: &[&str], env: &[(&str, &str)]) -> Result<(Option<i32>, String)> {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("KUBEGRACE_") || key == "LISTEN_FDS" || key == "SERVER_STARTER_PORT" {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    let out = within("the binary to exit", WAIT, cmd.output()).await??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code(), text))
}

/// Starts the binary until its ready line, then kills it: did it start?
async fn starts(args: &[&str]) -> Result<String> {
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("KUBEGRACE_DRAIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = within("the ready line", WAIT, async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("kubegrace-sidecar ready") {
                return Ok(line);
            }
        }
        bail!("exited before it was ready")
    })
    .await?;
    let _ = child.kill().await;
    line
}

#[tokio::test]
async fn an_exposed_admin_port_needs_a_token_or_the_explicit_flag() -> Result<()> {
    let base = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"];
    let mut args = base.to_vec();
    args.extend(["--admin", "0.0.0.0:0"]);
    let (code, output) = run_env(&args, &[]).await?;
    ensure!(
        code == Some(EX_USAGE),
        "exposed admin without a token: exit {code:?}\n{output}"
    );
    ensure!(
        output.contains("admin")
            && output.contains("--drain-token")
            && output.contains("--admin-insecure"),
        "the message does not say what to fix:\n{output}"
    );
    // The environment twin of the admin address is refused the same way.
    let (code, output) = run_env(&base, &[("KUBEGRACE_ADMIN", "0.0.0.0:0")]).await?;
    ensure!(
        code == Some(EX_USAGE),
        "KUBEGRACE_ADMIN exposed: exit {code:?}\n{output}"
    );

    let mut with_token = args.clone();
    with_token.extend(["--drain-token", "t0ken"]);
    starts(&with_token).await?;
    let mut insecure = args.clone();
    insecure.push("--admin-insecure");
    starts(&insecure).await?;
    // The default admin address is loopback (the config in force shows it).
    let (code, output) = run_to_exit(&["--help"], WAIT).await?;
    ensure!(
        code.success() && output.contains("127.0.0.1:15180"),
        "{output}"
    );
    Ok(())
}

#[tokio::test]
async fn tokenless_admin_refuses_browsers_and_upgrades() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    let limit = Duration::from_secs(10);
    let resp = request(sidecar.admin, Method::POST, "/upgrade", &[], limit).await?;
    ensure!(
        resp.status == StatusCode::FORBIDDEN,
        "tokenless /upgrade: {}",
        resp.status
    );
    ensure!(resp.text().contains("--drain-token"), "{}", resp.text());
    for headers in [
        &[
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "no-cors"),
        ][..],
        &[("Origin", "https://evil.example")][..],
        &[("Host", "rebound.evil.example:15020")][..],
    ] {
        for method in [Method::GET, Method::POST] {
            let resp = request(sidecar.admin, method.clone(), "/drain", headers, limit).await?;
            ensure!(
                resp.status == StatusCode::FORBIDDEN,
                "{method} /drain with {headers:?}: {}",
                resp.status
            );
        }
    }
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::OK),
        "a browser-made request drained the sidecar"
    );
    // A plain client on loopback (curl, a script) still drains.
    let resp = request(sidecar.admin, Method::GET, "/drain", &[], limit).await?;
    ensure!(
        resp.status == StatusCode::ACCEPTED,
        "plain GET /drain: {}",
        resp.status
    );
    Ok(())
}

#[tokio::test]
async fn the_prestop_drain_with_the_token_works_past_the_admin_cap() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&[
        "--drain-token",
        "pod-token",
        "--admin-max-connections",
        "1",
    ]))
    .await?;
    let _idle_admin = TcpStream::connect(sidecar.admin).await?;
    let limit = Duration::from_secs(10);
    wait_for("the admin cap to be reached", WAIT, || async {
        let resp = request(sidecar.admin, Method::GET, "/config", &[], limit)
            .await
            .ok()?;
        (resp.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await?;
    // Without the token the preStop path is not let through...
    let resp = request(sidecar.admin, Method::GET, "/drain", &[], limit).await?;
    ensure!(
        resp.status == StatusCode::SERVICE_UNAVAILABLE,
        "tokenless /drain past the cap: {}",
        resp.status
    );
    // ... with it, it is (the kubelet's preStop GET with the injected header).
    let resp = request(
        sidecar.admin,
        Method::GET,
        "/drain",
        &[("X-Kubegrace-Drain-Token", "pod-token")],
        limit,
    )
    .await?;
    ensure!(
        resp.status == StatusCode::ACCEPTED,
        "preStop /drain past the cap: {}",
        resp.status
    );
    ensure!(sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE));
    Ok(())
}

#[tokio::test]
async fn server_starter_port_naming_one_fd_twice_is_refused() -> Result<()> {
    let args = ["--upstream", "127.0.0.1:9", "--admin", "127.0.0.1:0"];
    let (code, output) = run_env(
        &args,
        &[("SERVER_STARTER_PORT", "127.0.0.1:8080=7;127.0.0.1:15020=7")],
    )
    .await?;
    ensure!(code == Some(EX_USAGE), "exit {code:?}\n{output}");
    ensure!(output.contains("names fd 7 twice"), "{output}");
    Ok(())
}

#[tokio::test]
async fn bad_input_never_takes_the_process_down() -> Result<()> {
    let app = TestApp::start("a").await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr)).await?;
    let served = Arc::new(AtomicU64::new(0));
    let attacks: [&[u8]; 6] = [
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: \r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: ,,,\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: \xff\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    ];
    for attack in attacks {
        // Whatever comes back within 3s; a kept-alive answer stays open.
        let mut tcp = TcpStream::connect(sidecar.listen).await?;
        let _ = tcp.write_all(attack).await;
        let mut buf = vec![0; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), tcp.read(&mut buf))
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or(0);
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        let status = status_line(&answer).to_string();
        ensure!(
            answer.is_empty()
                || status.starts_with("HTTP/1.1 4")
                || status.starts_with("HTTP/1.1 2"),
            "{:?} got {status:?}",
            String::from_utf8_lossy(attack)
        );
        if get(sidecar.listen, "/work").await?.status == StatusCode::OK {
            served.fetch_add(1, Ordering::Relaxed);
        }
    }
    ensure!(
        served.load(Ordering::Relaxed) == attacks.len() as u64,
        "the proxy stopped serving"
    );
    let errors = metric(
        &sidecar,
        "kubegrace_upstream_errors_total",
        "kind=\"connect\"",
    )
    .await?;
    ensure!(
        errors == 0.0,
        "bad input counted as upstream errors: {errors}"
    );
    Ok(())
}
