//! `appReadiness`: the app's own HTTP readiness check, run by the sidecar
//! behind `/ready` (the webhook moves an app's `httpGet` readiness probe
//! there, so a pod has one readiness probe). `/ready` passes only while the
//! app's check passes, with the kubelet's thresholds. The check runs in the
//! background (`/ready` reads its verdict and never waits: see
//! probes_never_wait.rs), often while the app is not ready, so a starting
//! app turns the pod ready without a probe period's delay.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::free_port;
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use anyhow::{Context, Result, ensure};
use http::StatusCode;

fn check(port: u16, failure_threshold: u32) -> String {
    format!(
        r#"{{"port":{port},"path":"/healthz","periodSeconds":1,"failureThreshold":{failure_threshold}}}"#
    )
}

/// An app and a sidecar that checks it (`failureThreshold` as given), once
/// the first check has passed.
async fn ready_with_check(failure_threshold: u32) -> Result<(TestApp, Sidecar)> {
    let app = TestApp::start("a").await?;
    let json = check(app.addr.port(), failure_threshold);
    let sidecar =
        Sidecar::start_unready(SidecarSpec::to(&app).args(&["--app-readiness", &json])).await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;
    Ok((app, sidecar))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_apps_own_check_not_just_its_port() -> Result<()> {
    let (app, sidecar) = ready_with_check(1).await?;

    // The app still accepts connections, but its check fails: unready,
    // and the answer says which check failed.
    app.control.fail(Some("/healthz"));
    sidecar
        .wait_ready_status(StatusCode::SERVICE_UNAVAILABLE)
        .await?;
    let body = sidecar.admin_get("/ready").await?.text();
    ensure!(
        body.contains("GET /healthz") && body.contains("500"),
        "503 body: {body:?}"
    );

    // Baseline: without appReadiness the same failing app is "ready",
    // which is what the app's own probe on the app container used to catch.
    let plain = Sidecar::start(SidecarSpec::to(&app)).await?;
    ensure!(
        plain.ready_status().await == Some(StatusCode::OK),
        "without appReadiness /ready only checks the port"
    );

    app.control.fail(None);
    sidecar.wait_ready_status(StatusCode::OK).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failure_below_the_threshold_keeps_the_pod_ready() -> Result<()> {
    let (app, sidecar) = ready_with_check(3).await?;
    let checks = || app.control.received_for("healthz");
    app.control.fail(Some("/healthz"));
    // The check runs once a period (1 s) while the app is ready: after the
    // first and the second failure of three the pod is still ready...
    let first_failure = checks() + 1;
    wait_for_checks(&checks, first_failure + 1).await?;
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::OK),
        "ready after two failures of three"
    );
    // ...and the third turns it unready.
    sidecar
        .wait_ready_status(StatusCode::SERVICE_UNAVAILABLE)
        .await?;
    ensure!(
        checks() >= first_failure + 2,
        "unready before the third failure: {} checks",
        checks()
    );
    Ok(())
}

/// Waits until the app has received `n` checks (bounded: 200 rounds of
/// 50 ms, the check runs once a second).
async fn wait_for_checks(checks: &impl Fn() -> u64, n: u64) -> Result<()> {
    for _ in 0..200 {
        if checks() >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{} checks, waited for {n}", checks())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_starts_late_turns_the_pod_ready_without_a_probe_waiting() -> Result<()> {
    let addr = free_port()?;
    let json = check(addr.port(), 1);
    let sidecar =
        Sidecar::start_unready(SidecarSpec::new(addr).args(&["--app-readiness", &json])).await?;
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "ready without an app"
    );
    // The background check looks every 50 ms while the app is not up, so
    // the pod turns ready as soon as the app listens and passes.
    let _app = TestApp::start_on("a", addr).await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_check_is_refused_with_the_key_to_fix() -> Result<()> {
    let app = TestApp::start("a").await?;
    let err = Sidecar::start(
        SidecarSpec::to(&app).args(&["--app-readiness", r#"{"port":8080,"path":"healthz"}"#]),
    )
    .await
    .err()
    .context("a path without a slash was accepted")?;
    let text = format!("{err:#}");
    ensure!(text.contains("appReadiness.path"), "error: {text}");
    Ok(())
}
