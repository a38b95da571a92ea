//! `--workers N`: N listening sockets on one port (`SO_REUSEPORT`), each
//! with its own accept loop. All of them are handed to the new process on
//! an upgrade (no request lost), and all of them close when the drain
//! reaches `Closing` while an in-flight request still finishes.

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::listening_sockets;
use crate::kit::load::Load;
use crate::kit::upgrade::Upgradable;
use anyhow::{Context, Result, ensure};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_listeners_are_handed_over_and_all_drained() -> Result<()> {
    let app = TestApp::start("app").await?;
    let mut proc = Upgradable::start(app.addr, &["--workers", "3"]).await?;
    let port = proc.listen.port();
    ensure!(
        listening_sockets(port) == 3,
        "3 listeners on port {port}, found {}; logs:\n{}",
        listening_sockets(port),
        proc.logs()
    );

    let load = Load::against(proc.listen, 4, 4);
    load.wait_ok(200, WAIT).await?;
    let old = proc.pid().context("pid")?;
    let (ok, out) = proc.upgrade_command().await?;
    ensure!(ok, "upgrade failed: {out}\nlogs:\n{}", proc.logs());
    let new = proc.wait_pid(|p| p != old).await?;
    proc.wait_gone(old).await?;
    load.wait_ok(200, WAIT).await?;
    let counts = load.stop().await?;
    counts.ensure_lost_nothing("upgrade with 3 workers")?;
    ensure!(
        listening_sockets(port) == 3,
        "the new process serves on the same 3 sockets, found {}; logs:\n{}",
        listening_sockets(port),
        proc.logs()
    );

    // SIGTERM with a request in flight: every listener closes at Closing,
    // the request still completes.
    let listen = proc.listen;
    let slow = tokio::spawn(async move { crate::kit::http::get(listen, "/work?ms=3000").await });
    crate::kit::wait_for(
        "the slow request at the app",
        Duration::from_secs(10),
        || async { (app.inflight() > 0).then_some(()) },
    )
    .await?;
    proc.signal(new, "TERM")?;
    crate::kit::wait_for(
        "all 3 listeners closed",
        Duration::from_secs(10),
        || async { (listening_sockets(port) == 0).then_some(()) },
    )
    .await
    .with_context(|| proc.logs())?;
    ensure!(
        crate::kit::alive(new),
        "still finishing the in-flight request"
    );
    let resp = slow.await.context("join")??;
    ensure!(resp.status.is_success(), "in-flight: {}", resp.status);
    proc.wait_gone(new).await?;
    Ok(())
}
