//! Idle connections must not hold a drain hostage: once the
//! grace phase ends, idle HTTP/1 keep-alives are closed, idle HTTP/2
//! connections get GOAWAY and close, and a connection that never sent a
//! byte is closed too. None of them waits for the drain timeout or counts as
//! force-closed. The drain timeout here is 10 minutes, so a sidecar that
//! waits on any of them fails the 30s bound below.

use crate::kit::WAIT;
use crate::kit::sidecar::Sidecar;
use crate::kit::sidecar::drain_flags;
use crate::kit::within;
use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const DRAIN: &[&str] = &drain_flags("300ms", "200ms", "3s", "10m");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_when_closing_without_waiting_for_the_timeout() -> Result<()> {
    let (_app, mut sidecar) = Sidecar::with_app(DRAIN).await?;

    // HTTP/1.1 keep-alive, used once, then idle.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut h1, h1_conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let h1_conn = tokio::spawn(h1_conn);
    let req = Request::get("/work")
        .header("host", "a")
        .body(Empty::<Bytes>::new())?;
    let resp = h1.send_request(req).await?;
    ensure!(resp.status() == StatusCode::OK, "h1 got {}", resp.status());
    resp.into_body().collect().await?;

    // HTTP/2 (prior knowledge), used once, then idle.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut h2, h2_conn) = h2::client::handshake(tcp).await.context("h2 handshake")?;
    let h2_conn = tokio::spawn(h2_conn);
    let (resp, _) = h2.send_request(Request::get("http://a/work").body(())?, true)?;
    let resp = within("h2 response", WAIT, resp).await??;
    ensure!(resp.status() == StatusCode::OK, "h2 got {}", resp.status());

    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(sidecar.listen).await?;

    sidecar
        .wait_metric("kubegrace_open_connections", WAIT, |n| n >= 3.0)
        .await?;
    sidecar.start_drain().await?;

    sidecar.wait_phase(3.0).await.context(
        "the drain never finished: an idle connection is holding it until the 10m timeout",
    )?;
    within("the idle HTTP/1 connection to close", WAIT, h1_conn)
        .await??
        .context("h1 connection ended with an error")?;
    within("the idle HTTP/2 connection to close", WAIT, h2_conn)
        .await??
        .context("h2 connection ended with an error")?;
    let mut buf = Vec::new();
    within(
        "the silent connection to close",
        WAIT,
        silent.read_to_end(&mut buf),
    )
    .await?
    .ok();
    let metrics = sidecar.metrics().await?;
    metrics.expect(
        "kubegrace_drain_force_closed_total",
        0.0,
        "idle connections were counted as force-closed",
    )?;
    metrics.expect_no_open_connections()?;

    // SIGINT behaves like SIGTERM: already drained, so exit 0 at once.
    sidecar.signal("INT")?;
    sidecar.exits_cleanly().await?;
    Ok(())
}
