//! Focused in-process checks of the proxy core: HTTP/1 keep-alive through
//! the proxy, upstream pool reuse, `Connection: close` while draining, the
//! limits, the header read timeout, and 502 while the app is down.
//! The big drain scenarios live in drain_*.rs; the command line's contract
//! (exit 64, environment twins) in bad_input.rs.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, ensure};
use http::{Method, StatusCode};
use kubegrace_sidecar::drain::Phase;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::kit::app::TestApp;
use crate::kit::http::{Sender, connect, raw_exchange, request, send};
use crate::kit::sidecar::{InProcess, SidecarSpec, drain_flags};
use crate::kit::{WAIT, wait_for};

/// Quick drain timers: 200ms minimum grace, 100ms quiet, 5s at most.
const DRAIN: &[&str] = &drain_flags("200ms", "100ms", "5s", "5s");

async fn sidecar(upstream: SocketAddr, config: Option<&str>) -> Result<InProcess> {
    let mut spec = SidecarSpec::new(upstream).args(DRAIN);
    if let Some(yaml) = config {
        spec = spec.config(yaml);
    }
    InProcess::start(spec).await
}

/// Waits (bounded) for a condition of the sidecar's own state.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    wait_for(what, WAIT, || {
        let done = cond();
        async move { done.then_some(()) }
    })
    .await
}

/// A GET on a kept-alive connection: (status, headers, body).
async fn get(sender: &mut Sender, path: &str) -> Result<(StatusCode, http::HeaderMap, String)> {
    let resp = send(sender, path).await?;
    Ok((resp.status, resp.headers.clone(), resp.text()))
}

/// The admin port as curl or the kubelet call it (the address as Host: a
/// tokenless admin port refuses a host name on /drain, DNS rebinding).
async fn admin_get(admin: SocketAddr, path: &str) -> Result<(StatusCode, String)> {
    let resp = request(admin, Method::GET, path, &[], WAIT).await?;
    Ok((resp.status, resp.text()))
}

#[tokio::test]
async fn keep_alive_connections_carry_many_requests() -> Result<()> {
    let app = TestApp::start("app").await?;
    let sidecar = sidecar(app.addr, None).await?;
    let mut sender = connect(sidecar.listen).await?;
    for i in 0..20 {
        let (status, headers, body) = get(&mut sender, &format!("/item/{i}")).await?;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ok\n", "/item/{i} reached the app");
        assert_eq!(headers["x-seen-xff"], "127.0.0.1");
        assert!(
            headers.get("connection").is_none(),
            "no close while serving"
        );
    }
    assert_eq!(
        sidecar.lib().drain().connections_total(),
        1,
        "one downstream connection for 20 requests"
    );
    assert_eq!(
        app.used_connections() as u64,
        1,
        "one upstream connection reused"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_reuses_pooled_upstream_connections() -> Result<()> {
    let app = TestApp::start("app").await?;
    let sidecar = sidecar(app.addr, None).await?;
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 50;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let addr = sidecar.listen;
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await?;
            for i in 0..PER_CLIENT {
                let (status, _, _) = get(&mut sender, &format!("/c{c}/{i}")).await?;
                anyhow::ensure!(status == StatusCode::OK, "status {status}");
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let upstream = app.used_connections() as u64;
    // 400 requests, at most 8 at a time: the pool must stay near 8
    // connections, nowhere near one per request.
    assert!(
        upstream <= 2 * CLIENTS as u64,
        "{upstream} upstream connections for {} requests",
        CLIENTS * PER_CLIENT
    );
    Ok(())
}

#[tokio::test]
async fn draining_closes_http1_keep_alive_and_fails_readiness() -> Result<()> {
    let app = TestApp::start("app").await?;
    // A long grace, so the test sees the Draining phase for sure.
    let sidecar = InProcess::start(
        SidecarSpec::new(app.addr).args(&drain_flags("30s", "100ms", "60s", "5s")),
    )
    .await?;
    let (status, _) = admin_get(sidecar.admin, "/ready").await?;
    assert_eq!(status, StatusCode::OK);

    let mut sender = connect(sidecar.listen).await?;
    let (_, headers, _) = get(&mut sender, "/before").await?;
    assert!(headers.get("connection").is_none());

    let (status, _) = admin_get(sidecar.admin, "/drain").await?;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(sidecar.lib().drain().phase(), Phase::Draining);
    let (status, _) = admin_get(sidecar.admin, "/ready").await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // The kept-alive connection still works once more, and is told to go.
    let (status, headers, _) = get(&mut sender, "/during").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    // New connections are still served while draining (routers lag).
    let mut fresh = connect(sidecar.listen).await?;
    let (status, headers, _) = get(&mut fresh, "/new").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    Ok(())
}

#[tokio::test]
async fn shutdown_drains_and_reports() -> Result<()> {
    let app = TestApp::start("app").await?;
    let mut sidecar = sidecar(app.addr, None).await?;
    let mut sender = connect(sidecar.listen).await?;
    get(&mut sender, "/one").await?;
    sidecar.shutdown();
    let drain = sidecar.lib().drain().clone();
    let report = sidecar.wait(Duration::from_secs(20)).await?;
    assert_eq!(report.force_closed, 0, "{report}");
    assert_eq!(drain.phase(), Phase::Drained);
    assert_eq!(drain.open_connections(), 0);
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_4xx_not_a_crash() -> Result<()> {
    let app = TestApp::start("app").await?;
    let config = "limits: {maxHeaderBytes: 8192, maxRequestBodyBytes: 16}\n";
    let sidecar = sidecar(app.addr, Some(config)).await?;
    let addr = sidecar.listen;

    let answer = raw_exchange(addr, b"GARBAGE\r\n\r\n").await?;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    let big = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let answer = raw_exchange(addr, big.as_bytes()).await?;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let answer = raw_exchange(
        addr,
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\n0123456789",
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    let answer = raw_exchange(
        addr,
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n",
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // Still alive and serving.
    let mut sender = connect(addr).await?;
    let (status, _, _) = get(&mut sender, "/after").await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}

/// Sends `opening` on a fresh connection and fails unless the proxy closes
/// it within 10s.
async fn sent_and_closed(sidecar: &InProcess, opening: &[u8]) -> Result<()> {
    let mut stream = TcpStream::connect(sidecar.listen).await?;
    stream.write_all(opening).await?;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
    ensure!(
        read.is_ok(),
        "the proxy did not close a connection that opened with {opening:?}"
    );
    Ok(())
}

/// A sidecar in front of a fresh app, with `limits.headerReadTimeout`.
async fn with_header_timeout(timeout: &str) -> Result<(TestApp, InProcess)> {
    let app = TestApp::start("app").await?;
    let config = format!("limits: {{headerReadTimeout: {timeout}}}\n");
    let sidecar = sidecar(app.addr, Some(&config)).await?;
    Ok((app, sidecar))
}

/// Waits (bounded) until the sidecar holds no client connection.
async fn no_connections_left(sidecar: &InProcess) -> Result<()> {
    wait_until("connections closed", || {
        sidecar.lib().drain().open_connections() == 0
    })
    .await
}

#[tokio::test]
async fn a_silent_client_is_cut_at_the_header_read_timeout() -> Result<()> {
    let (_app, sidecar) = with_header_timeout("300ms").await?;
    sent_and_closed(&sidecar, b"GET / HTTP/1.1\r\nhost: x\r\n").await?;
    no_connections_left(&sidecar).await?;
    Ok(())
}

#[tokio::test]
async fn a_client_that_never_speaks_is_cut_at_the_header_read_timeout() -> Result<()> {
    let (_app, sidecar) = with_header_timeout("300ms").await?;
    for opening in [&b""[..], &b"GE"[..]] {
        sent_and_closed(&sidecar, opening).await?;
    }
    no_connections_left(&sidecar).await?;
    Ok(())
}

#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_timeout() -> Result<()> {
    let (_app, sidecar) = with_header_timeout("100ms").await?;
    let mut sender = connect(sidecar.listen).await?;
    get(&mut sender, "/one").await?;
    // Idle for several header timeouts: an idle connection is not a slow head.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, _) = get(&mut sender, "/two").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sidecar.lib().drain().connections_total(), 1);
    Ok(())
}

#[tokio::test]
async fn app_down_means_502_and_not_ready() -> Result<()> {
    // Bind then drop: a port nothing listens on.
    let dead = TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    // Holding off (the default holds for the app to come back, then 503:
    // app_restart.rs).
    let sidecar = InProcess::start_unready(
        SidecarSpec::new(dead)
            .args(DRAIN)
            .args(&["--upstream-hold-timeout", "0s"]),
    )
    .await?;
    let mut sender = connect(sidecar.listen).await?;
    let (status, _, _) = get(&mut sender, "/").await?;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, body) = admin_get(sidecar.admin, "/ready").await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    Ok(())
}
