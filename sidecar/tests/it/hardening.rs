//! The sidecar tried as an attacker would, on loopback, with raw
//! sockets where the attack is in the framing. Each test shows one hole
//! closed: client faults stay out of the breaker and the upstream error
//! counter, slow bodies get 408, a client that stops reading is cut and its
//! app connection freed, a pipelined half head is timed, only listed
//! Upgrade protocols reach the app, X-Forwarded-Proto comes from the
//! connection, and connection caps hold while probes answer. Bad input
//! never crashes the process. The admin port's defences are in
//! admin_hardening.rs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::kit::app::TestApp;
use crate::kit::http::{
    get, raw_exchange, raw_expect, read_cut_answer, read_response, request, status_line,
};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::{WAIT, wait_for, within};

/// The client's fault (`what`) was not counted as the app's: no upstream
/// connect error.
async fn no_app_errors(sidecar: &InProcess, what: &str) -> Result<()> {
    let connect_errors = sidecar
        .metric("kubegrace_upstream_errors_total", "kind=\"connect\"")
        .await?;
    ensure!(
        connect_errors == 0.0,
        "{what} counted as upstream errors: {connect_errors}"
    );
    Ok(())
}

#[tokio::test]
async fn invalid_chunk_sizes_get_400_and_move_no_breaker_or_upstream_counter() -> Result<()> {
    let app = TestApp::start("a").await?;
    // Three failures in a row would open this breaker.
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(
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
        raw_expect(
            sidecar.listen,
            format!("{head}{body}").as_bytes(),
            400,
            &format!("chunked body {body:?}"),
        )
        .await?;
    }
    // A client that leaves mid-body: nothing to answer, nothing to blame.
    let mut gone = TcpStream::connect(sidecar.listen).await?;
    gone.write_all(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\nonly a part")
        .await?;
    drop(gone);

    no_app_errors(&sidecar, "client faults").await?;
    let bad = sidecar
        .metric("kubegrace_client_errors_total", "kind=\"bad_body\"")
        .await?;
    ensure!(
        bad >= bodies.len() as f64,
        "bad bodies counted {bad}, sent {}",
        bodies.len()
    );
    let route = sidecar.route("upload").await?;
    ensure!(
        route["breaker"]["state"] == "closed",
        "breaker moved: {route}"
    );
    ensure!(
        route["breaker"]["consecutiveFailures"] == 0 && route["breaker"]["window"]["failures"] == 0,
        "client faults counted against the app: {route}"
    );
    // The route still serves everyone else.
    raw_expect(
        sidecar.listen,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        200,
        "good upload",
    )
    .await?;
    sidecar
        .expect_ready(StatusCode::OK, "bad input hurt /ready")
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_trickling_body_gets_408() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&["--body-read-timeout", "1s"]).await?;
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
    let timeouts = sidecar
        .metric("kubegrace_client_timeouts_total", "kind=\"body_read\"")
        .await?;
    ensure!(timeouts >= 1.0, "body read timeout not counted");
    no_app_errors(&sidecar, "a slow client").await?;
    // A body at an honest pace still goes through.
    let ok = raw_exchange(
        sidecar.listen,
        b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    )
    .await?;
    ensure!(status_line(&ok).starts_with("HTTP/1.1 200"), "{ok}");
    Ok(())
}

/// More than every socket buffer on the way (app -> sidecar -> client)
/// holds, so a client that does not read stalls the sidecar's writes.
const BIG: usize = 48 << 20;

/// Sends one GET for the big answer and never reads it.
async fn stalled_reader(listen: SocketAddr) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect(listen).await?;
    tcp.write_all(format!("GET /big?bytes={BIG} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .await?;
    Ok(tcp)
}

/// The app's connection for the big answer went away before its end.
fn cut(app: &TestApp) -> bool {
    app.stats.big_cut.load(Ordering::SeqCst) > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_is_cut_and_its_app_connection_freed() -> Result<()> {
    // Baseline: with the write timeout off, the app connection stays held.
    let app = TestApp::start("big").await?;
    let sidecar =
        InProcess::start(SidecarSpec::new(app.addr).args(&["--write-timeout", "0s"])).await?;
    let _held = stalled_reader(sidecar.listen).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        !cut(&app),
        "baseline: the app connection ended although nothing cut the stalled reader"
    );
    drop(sidecar);

    let app = TestApp::start("big").await?;
    let sidecar =
        InProcess::start(SidecarSpec::new(app.addr).args(&["--write-timeout", "1s"])).await?;
    let mut tcp = stalled_reader(sidecar.listen).await?;
    wait_for("the app to see its connection closed", WAIT, || async {
        cut(&app).then_some(())
    })
    .await?;
    let cut = sidecar
        .metric("kubegrace_client_timeouts_total", "kind=\"write\"")
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

#[tokio::test]
async fn upgrade_h2c_never_reaches_the_app_websocket_does() -> Result<()> {
    let (app, sidecar) = InProcess::with_app(&[]).await?;
    raw_expect(sidecar.listen, b"GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 200, "h2c upgrade (a 101 is a tunnel around the proxy)").await?;
    let seen = app
        .last_head("/h2c")
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
        .last_head("/ws")
        .context("the app never got the websocket handshake")?;
    ensure!(
        seen.contains("upgrade: websocket") && !seen.contains("h2c"),
        "the app saw: {seen}"
    );
    let ignored = sidecar
        .metrics()
        .await?
        .get(r#"kubegrace_upgrades_total{result="ignored"}"#);
    ensure!(ignored == Some(1.0), "ignored upgrades: {ignored:?}");
    Ok(())
}

#[tokio::test]
async fn x_forwarded_proto_comes_from_the_connection_unless_hops_are_trusted() -> Result<()> {
    let app = TestApp::start("a").await?;
    let req =
        b"GET /proto HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: https\r\nConnection: close\r\n\r\n";
    let sidecar = InProcess::start(SidecarSpec::new(app.addr)).await?;
    raw_exchange(sidecar.listen, req).await?;
    let seen = app.last_head("/proto").context("no request")?;
    ensure!(
        seen.contains("x-forwarded-proto: http\r\n"),
        "untrusted client's proto kept: {seen}"
    );
    drop(sidecar);
    let sidecar =
        InProcess::start(SidecarSpec::new(app.addr).args(&["--trusted-hops", "1"])).await?;
    raw_exchange(sidecar.listen, req).await?;
    let seen = app.last_head("/proto").context("no request")?;
    ensure!(
        seen.contains("x-forwarded-proto: https\r\n"),
        "trusted balancer's proto lost: {seen}"
    );
    Ok(())
}

#[tokio::test]
async fn a_pipelined_half_head_is_cut_by_the_header_read_timeout() -> Result<()> {
    let (_app, sidecar) = InProcess::with_short_header_read_timeout().await?;
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
    let cut = "the half head to be cut";
    let (_read, _) = read_cut_answer(&mut reader, cut, Duration::from_secs(10)).await?;
    let cut = sidecar
        .metric("kubegrace_client_timeouts_total", "kind=\"header_read\"")
        .await?;
    ensure!(cut >= 1.0, "header timeout not counted");
    Ok(())
}

#[tokio::test]
async fn idle_keep_alive_after_each_body_kind_is_not_cut_by_the_header_timer() -> Result<()> {
    let (_app, sidecar) =
        InProcess::with_app_config("limits: {headerReadTimeout: 300ms}\n").await?;
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
    let (_app, sidecar) =
        InProcess::with_app(&["--max-connections", "3", "--admin-max-connections", "2"]).await?;
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
    let refused = sidecar
        .metric("kubegrace_connections_refused_total", "listener=\"proxy\"")
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
    let (_app, sidecar) =
        InProcess::with_app(&["--protocol", "tcp", "--tunnel-idle-timeout", "500ms"]).await?;
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
        let v = sidecar
            .metric("kubegrace_client_timeouts_total", "kind=\"tunnel_idle\"")
            .await
            .ok()?;
        (v >= 1.0).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn bad_input_never_takes_the_process_down() -> Result<()> {
    let (_app, sidecar) = InProcess::with_app(&[]).await?;
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
    no_app_errors(&sidecar, "bad input").await?;
    Ok(())
}
