//! The app listens on a Unix socket (`--upstream unix:/path`).
//!
//! The test app (HTTP/1.1 + h2c + WebSocket) on a Unix socket, the sidecar
//! in front of it on loopback TCP (the binary where it is killed or
//! signalled), real clients: keep-alive
//! requests reuse one pooled app connection and keep the client's Host;
//! an h2c gRPC-style call keeps its trailers; a WebSocket upgrade passes
//! through; a drain lets in-flight requests finish, where killing the proxy
//! outright (the baseline) loses them.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

use crate::kit::app::TestApp;
use crate::kit::http::websocket;
use crate::kit::http::{connect, header, send};
use crate::kit::sidecar::{InProcess, Sidecar, SidecarSpec};
use crate::kit::{WAIT, scratch_dir, wait_for, within};

/// The app on a Unix socket in a fresh directory.
async fn unix_app(tag: &str) -> Result<TestApp> {
    TestApp::start_unix("unix", &scratch_dir(tag)?.join("app.sock")).await
}

/// The app on a Unix socket and the sidecar in front of it.
async fn unix_app_behind_sidecar(tag: &str) -> Result<(TestApp, InProcess)> {
    let app = unix_app(tag).await?;
    let sidecar = InProcess::start(SidecarSpec::to(&app).fast_drain("2s")).await?;
    Ok((app, sidecar))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_reuses_one_app_connection_and_keeps_the_host() -> Result<()> {
    let (app, sidecar) = unix_app_behind_sidecar("unix-h1").await?;

    let mut client = connect(sidecar.listen).await?;
    let mut conns = BTreeSet::new();
    for i in 0..20 {
        let resp = send(&mut client, "/work").await?;
        ensure!(
            resp.status == StatusCode::OK,
            "request {i}: {}",
            resp.status
        );
        ensure!(
            resp.text() == "ok unix\n",
            "request {i}: body {:?}",
            resp.text()
        );
        ensure!(
            resp.header("x-seen-host") == "app.test",
            "the app saw Host {:?}, not the client's",
            resp.header("x-seen-host")
        );
        ensure!(
            resp.header("x-seen-xff") == "127.0.0.1",
            "the app saw X-Forwarded-For {:?}",
            resp.header("x-seen-xff")
        );
        ensure!(resp.header("x-seen-version") == "HTTP/1.1");
        conns.insert(resp.header("x-conn"));
    }
    // Sequential requests ride one warm app connection, not one each.
    ensure!(
        conns.len() == 1,
        "20 sequential requests used {} app connections: {conns:?}",
        conns.len()
    );
    ensure!(app.served() == 20, "app served {}", app.served());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_grpc_style_call_keeps_its_trailers() -> Result<()> {
    let (_app, sidecar) = unix_app_behind_sidecar("unix-h2").await?;

    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    // A gRPC message frame: uncompressed flag, 4-byte length, payload.
    let message = Bytes::from_static(b"\x00\x00\x00\x00\x05hello");
    let req = Request::post(format!(
        "http://{}/kubegrace.test.Echo/Unary",
        sidecar.listen
    ))
    .header(http::header::CONTENT_TYPE, "application/grpc")
    .header(http::header::TE, "trailers")
    .body(Full::new(message.clone()))?;
    let resp = within("gRPC call", WAIT, sender.send_request(req)).await??;
    ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
    ensure!(
        header(resp.headers(), "x-seen-version") == "HTTP/2.0",
        "the app saw {:?}; HTTP/2 must stay HTTP/2 end to end",
        header(resp.headers(), "x-seen-version")
    );
    ensure!(
        header(resp.headers(), "x-seen-host") == sidecar.listen.to_string(),
        "the app saw :authority {:?}",
        header(resp.headers(), "x-seen-host")
    );
    let collected = within("gRPC body", WAIT, resp.into_body().collect()).await??;
    let trailers = collected.trailers().cloned().context("no trailers")?;
    ensure!(
        trailers.get("grpc-status").map(|v| v.as_bytes()) == Some(&b"0"[..]),
        "trailers {trailers:?}"
    );
    ensure!(collected.to_bytes() == message, "echo differs");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_passes_through() -> Result<()> {
    let (_app, sidecar) = unix_app_behind_sidecar("unix-ws").await?;

    let mut ws = websocket(sidecar.listen).await?;
    for i in 0..5 {
        let text = format!("message {i}");
        ws.send(Message::text(text.clone())).await?;
        let echo = within("echo", WAIT, ws.next()).await?.context("closed")??;
        ensure!(echo == Message::text(text), "unexpected echo {echo:?}");
    }
    ws.close(None).await?;
    // The tunnel's app connection is not pooled: a plain request afterwards
    // still works on its own connection.
    let mut client = connect(sidecar.listen).await?;
    let resp = send(&mut client, "/after").await?;
    ensure!(resp.status == StatusCode::OK);
    Ok(())
}

/// Sends `n` slow requests on separate keep-alive connections and returns
/// their tasks once the app has all of them in hand.
async fn slow_requests(
    listen: SocketAddr,
    app: &TestApp,
    n: usize,
) -> Result<Vec<tokio::task::JoinHandle<Result<StatusCode>>>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut client = connect(listen).await?;
        tasks.push(tokio::spawn(async move {
            let resp = send(&mut client, "/work?ms=1500").await?;
            Ok(resp.status)
        }));
    }
    // All of them reached the app and are in its hands now.
    wait_for("the slow requests to reach the app", WAIT, || {
        let all_there = app.inflight() >= n as i64;
        async move { all_there.then_some(()) }
    })
    .await?;
    Ok(tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_in_flight_requests_finish_where_a_kill_loses_them() -> Result<()> {
    const N: usize = 8;
    let app = unix_app("unix-drain").await?;
    let spec = SidecarSpec::to(&app).fast_drain("2s");

    // Baseline: the proxy killed outright loses every request in flight.
    let mut killed = Sidecar::start_unready(spec.clone()).await?;
    let tasks = slow_requests(killed.listen, &app, N).await?;
    killed.kill()?;
    let mut lost = 0;
    for task in tasks {
        if !matches!(task.await?, Ok(StatusCode::OK)) {
            lost += 1;
        }
    }
    ensure!(
        lost == N,
        "baseline: a killed proxy lost {lost} of {N}, expected all"
    );
    // The app is done with the orphaned requests before the second round.
    wait_for("the app to let go of the orphaned requests", WAIT, || {
        let idle = app.inflight() == 0;
        async move { idle.then_some(()) }
    })
    .await?;

    // With the drain: SIGTERM while the same requests are in flight.
    let mut sidecar = Sidecar::start_unready(spec).await?;
    let tasks = slow_requests(sidecar.listen, &app, N).await?;
    sidecar.signal("TERM")?;
    let mut ok = 0;
    for task in tasks {
        match within("in-flight request", WAIT, task).await?? {
            Ok(StatusCode::OK) => ok += 1,
            other => eprintln!("in-flight request ended with {other:?}"),
        }
    }
    ensure!(ok == N, "drain: {ok} of {N} in-flight requests succeeded");
    let exit = sidecar.wait_exit(WAIT).await?;
    if !exit.success() {
        bail!("sidecar exited with {exit}; logs:\n{}", sidecar.logs_text());
    }
    Ok(())
}
