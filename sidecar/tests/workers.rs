//! `--workers N`: N listening sockets on one port (`SO_REUSEPORT`), each
//! with its own accept loop. All of them are handed to the new process on
//! an upgrade (no request lost), and all of them close when the drain
//! reaches `Closing` while an in-flight request still finishes.

mod common;
mod outside_support;
mod upgrade_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::apps::TestApp;
use outside_support::listening_sockets;
use upgrade_support::{Load, Proc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_listeners_are_handed_over_and_all_drained() -> Result<()> {
    let app = TestApp::start("app").await?;
    let mut proc = Proc::start(app.addr, &["--workers", "3"]).await?;
    let port = proc.listen.port();
    ensure!(
        listening_sockets(port) == 3,
        "3 listeners on port {port}, found {}; logs:\n{}",
        listening_sockets(port),
        proc.logs()
    );

    let load = Load::start(proc.listen, 4, 4);
    load.wait_more(200).await?;
    let old = proc.pid().context("pid")?;
    let (ok, out) = proc.upgrade_command().await?;
    ensure!(ok, "upgrade failed: {out}\nlogs:\n{}", proc.logs());
    let new = proc.wait_pid(|p| p != old).await?;
    proc.wait_gone(old).await?;
    load.wait_more(200).await?;
    let counts = load.stop().await;
    ensure!(
        counts.failed.load(Ordering::Relaxed) == 0 && counts.refused.load(Ordering::Relaxed) == 0,
        "upgrade with 3 workers lost requests: {}",
        counts.summary()
    );
    ensure!(
        listening_sockets(port) == 3,
        "the new process serves on the same 3 sockets, found {}; logs:\n{}",
        listening_sockets(port),
        proc.logs()
    );

    // SIGTERM with a request in flight: every listener closes at Closing,
    // the request still completes.
    let listen = proc.listen;
    let slow = tokio::spawn(async move { common::http::get(listen, "/work?ms=3000").await });
    common::wait_for(
        "the slow request at the app",
        Duration::from_secs(10),
        || async { (app.inflight() > 0).then_some(()) },
    )
    .await?;
    proc.signal(new, "TERM")?;
    common::wait_for(
        "all 3 listeners closed",
        Duration::from_secs(10),
        || async { (listening_sockets(port) == 0).then_some(()) },
    )
    .await
    .with_context(|| proc.logs())?;
    ensure!(
        upgrade_support::alive(new),
        "still finishing the in-flight request"
    );
    let resp = slow.await.context("join")??;
    ensure!(resp.status.is_success(), "in-flight: {}", resp.status);
    proc.wait_gone(new).await?;
    Ok(())
}
