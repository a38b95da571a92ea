//! HTTP/2 clients share one app connection, and a client seen withholding
//! its window is moved to an app connection of its own (issue #39,
//! sidecar/src/upstream/h2.rs).
//!
//! With `KUBEGRACE_TEST_H2_SHARE_ALL=1` (nobody is moved) the move test
//! fails: the withholding client's later streams stay on the shared
//! connection.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::StatusCode;
use tokio::net::TcpStream;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{h2_get, h2_read_body};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::{wait_for, within};

/// Bound of one request of the normal client.
const ONE_REQUEST: Duration = Duration::from_secs(10);

/// A GET read to its end; the app connection that served it (`x-conn`).
async fn app_conn_of(send: &mut h2::client::SendRequest<Bytes>, path: &str) -> Result<String> {
    let exchange = async {
        let (resp, _) = send.send_request(h2_get(path)?, true)?;
        let resp = resp.await?;
        ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
        let conn = resp
            .headers()
            .get("x-conn")
            .and_then(|v| v.to_str().ok())
            .context("the answer has no x-conn")?
            .to_string();
        h2_read_body(resp.into_body()).await?;
        Ok::<_, anyhow::Error>(conn)
    };
    within(&format!("GET {path}"), ONE_REQUEST, exchange).await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_withholds_its_window_moves_to_an_app_connection_of_its_own() -> Result<()> {
    let app = TestApp::start("app").await?;
    let sidecar = InProcess::start(SidecarSpec::to(&app)).await?;

    // Two clients: one app connection between them. The normal one gives
    // windows larger than all it reads, so it never waits for one.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut normal, normal_conn) = h2::client::Builder::new()
        .initial_window_size(16 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake(tcp)
        .await
        .context("h2 handshake")?;
    let _normal_conn = tokio::spawn(normal_conn);
    // The other one keeps h2's default stream window (64 KiB) but has room
    // in its connection window for answers beside the one it leaves unread.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut other, other_conn) = h2::client::Builder::new()
        .initial_connection_window_size(16 << 20)
        .handshake(tcp)
        .await
        .context("h2 handshake")?;
    let other_conn = tokio::spawn(other_conn);
    let shared = app_conn_of(&mut normal, "/work").await?;
    ensure!(
        app_conn_of(&mut other, "/work").await? == shared,
        "two HTTP/2 clients did not share the app connection"
    );

    // The other client opens a large answer and reads none of it: its
    // stream waits for its window (its default 64 KiB), on the shared
    // connection.
    let (resp, _) = other.send_request(h2_get("/big?bytes=16777216")?, true)?;
    let resp = within("the unread answer's head", WAIT, resp).await??;
    ensure!(resp.status() == StatusCode::OK, "{}", resp.status());
    let unread = resp.into_body();

    // Its next streams go on an app connection of its own.
    let moved = wait_for("the withholding client moved", WAIT, || {
        let mut other = other.clone();
        let shared = shared.clone();
        async move {
            let conn = app_conn_of(&mut other, "/work").await.ok()?;
            (conn != shared).then_some(conn)
        }
    })
    .await?;
    ensure!(moved != shared);

    // The normal client stays on the shared connection, and its answers,
    // larger than a stream window, complete.
    for round in 0..8 {
        let conn = app_conn_of(&mut normal, "/big?bytes=262144").await?;
        ensure!(
            conn == shared,
            "round {round}: the normal client moved to {conn}"
        );
    }
    ensure!(
        !other_conn.is_finished() && !unread.is_end_stream(),
        "the withholding client's connection or stream ended early"
    );
    Ok(())
}
