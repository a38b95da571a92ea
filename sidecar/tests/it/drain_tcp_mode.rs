//! Raw TCP mode (`--protocol tcp`) cannot see requests, so it drains by
//! connection: new connections are still taken during the grace phase,
//! refused once closing, and whatever is still open at the drain timeout is
//! closed and counted. The process still exits 0.

use crate::kit::WAIT;
use crate::kit::sidecar::Sidecar;
use crate::kit::{wait_for, within};
use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const DRAIN: &[&str] = &[
    "--protocol",
    "tcp",
    "--drain-min-delay",
    "300ms",
    "--drain-quiet",
    "200ms",
    "--drain-max-delay",
    "3s",
    "--drain-timeout",
    "1s",
];

async fn connect(addr: std::net::SocketAddr) -> Result<SendRequest<Empty<Bytes>>> {
    let tcp = TcpStream::connect(addr).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn get_on(sender: &mut SendRequest<Empty<Bytes>>, path: &str) -> Result<StatusCode> {
    sender.ready().await?;
    let req = Request::get(path)
        .header("host", "a")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    resp.into_body().collect().await?;
    Ok(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_mode_drains_by_connection_and_counts_what_it_cuts() -> Result<()> {
    let (app, mut sidecar) = Sidecar::with_app(DRAIN).await?;

    let mut a = connect(sidecar.listen).await?;
    ensure!(
        get_on(&mut a, "/work").await? == StatusCode::OK,
        "passthrough failed"
    );
    // Work far longer than the drain timeout, in flight on `a`.
    let long = tokio::spawn(async move { get_on(&mut a, "/work?ms=60000").await });
    wait_for("the long work to reach the app", WAIT, || async {
        (app.inflight() >= 1).then_some(())
    })
    .await?;

    sidecar.start_drain().await?;
    // Grace phase: a new connection is still taken and served.
    let mut b = connect(sidecar.listen).await?;
    ensure!(
        get_on(&mut b, "/work").await? == StatusCode::OK,
        "a new connection during the grace phase was not served"
    );
    let phase = sidecar.metrics().await?.sum("kubegrace_drain_phase");
    ensure!(
        phase == Some(1.0),
        "expected still in the grace phase, got {phase:?}"
    );

    // Closing: the listener is gone.
    sidecar.wait_phase(2.0).await?;
    wait_for("new connections to be refused", WAIT, || async {
        TcpStream::connect(sidecar.listen)
            .await
            .is_err()
            .then_some(())
    })
    .await?;

    // At the timeout, what is still open is cut and counted.
    let outcome = within("the long work to be cut", WAIT, long)
        .await?
        .context("task")?;
    ensure!(
        !matches!(outcome, Ok(StatusCode::OK)),
        "the long work was not cut: {outcome:?}"
    );
    sidecar.wait_phase(3.0).await?;
    let metrics = sidecar.metrics().await?;
    let forced = metrics.expect_cut_at_least(1.0, "nothing counted as force-closed")?;
    drop(b);
    sidecar.signal("TERM")?;
    sidecar.exits_cleanly().await?;
    println!("tcp mode: {forced} connections force-closed at the timeout");
    Ok(())
}
