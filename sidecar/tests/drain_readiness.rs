//! Readiness is the sidecar's first drain signal and its health signal:
//! `/ready` is 503 while the app is unreachable, 200 once it is, and 503 at
//! once when a drain starts, while the data path keeps serving (refusing
//! work early is as bad as dying early). `/live` stays 200
//! throughout: a draining or app-less sidecar must not be restarted.

mod common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::apps::TestApp;
use common::http::get;
use common::sidecar::{Sidecar, SidecarSpec};
use common::{free_port, wait_for};
use http::{Method, StatusCode};

const WAIT: Duration = Duration::from_secs(30);

async fn wait_ready_status(sidecar: &Sidecar, want: StatusCode) -> Result<()> {
    wait_for(&format!("/ready to answer {want}"), WAIT, || async {
        (sidecar.ready_status().await == Some(want)).then_some(())
    })
    .await
    .with_context(|| sidecar.logs_text())
}

async fn live(sidecar: &Sidecar) -> Result<StatusCode> {
    Ok(sidecar.admin_get("/live").await?.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_app_and_fails_at_once_on_drain_while_serving_goes_on() -> Result<()> {
    let app_addr = free_port()?;
    let sidecar = Sidecar::start_unready(SidecarSpec::new(app_addr).args(&[
        "--drain-min-delay",
        "5s",
        "--drain-max-delay",
        "10s",
    ]))
    .await?;

    // No app yet.
    wait_ready_status(&sidecar, StatusCode::SERVICE_UNAVAILABLE).await?;
    ensure!(
        live(&sidecar).await? == StatusCode::OK,
        "/live failed without an app"
    );

    // The app comes up.
    let app = TestApp::start_on("a", app_addr).await?;
    wait_ready_status(&sidecar, StatusCode::OK).await?;

    // The app goes away, and comes back.
    app.kill().await;
    drop(app);
    wait_ready_status(&sidecar, StatusCode::SERVICE_UNAVAILABLE).await?;
    ensure!(
        live(&sidecar).await? == StatusCode::OK,
        "/live failed when the app went away"
    );
    let _app = TestApp::start_on("a", app_addr).await?;
    wait_ready_status(&sidecar, StatusCode::OK).await?;

    // Drain: readiness fails on the very next probe, no waiting.
    let resp = sidecar.admin(Method::POST, "/drain").await?;
    ensure!(
        resp.status == StatusCode::ACCEPTED,
        "/drain answered {}",
        resp.status
    );
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "/ready still passes right after /drain"
    );
    ensure!(
        live(&sidecar).await? == StatusCode::OK,
        "/live failed while draining"
    );
    // ... while the data path still takes new connections and requests
    // (minDelay is 5s: this is the grace phase).
    for _ in 0..5 {
        let resp = get(sidecar.listen, "/work").await?;
        ensure!(
            resp.status == StatusCode::OK,
            "draining sidecar answered {}",
            resp.status
        );
        ensure!(
            resp.connection_close(),
            "a response while draining lacks Connection: close"
        );
    }
    let metrics = sidecar.metrics().await?;
    ensure!(
        metrics.sum("kubegrace_drain_phase") == Some(1.0),
        "expected the grace phase (1): {:?}",
        metrics.series
    );
    Ok(())
}
