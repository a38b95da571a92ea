//! `appReadiness`: the app's own HTTP readiness check, run by the sidecar
//! behind `/ready` (the webhook moves an app's `httpGet` readiness probe
//! there, so a pod has one readiness probe). `/ready` passes only while the
//! app's check passes, with the kubelet's thresholds, and the first pass of
//! a starting app is answered in the same `/ready` call that saw it.

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
    let before = app.control.received_for("healthz");
    app.control.fail(Some("/healthz"));
    // Play the kubelet: one probe a period (1 s). A ready verdict holds for
    // the period, so each of these probes runs exactly one check; failures
    // one and two of three keep the pod ready, the third turns it unready.
    let mut seen = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        seen.push(sidecar.ready_status().await);
    }
    let ok = Some(StatusCode::OK);
    ensure!(
        seen == [ok, ok, Some(StatusCode::SERVICE_UNAVAILABLE)],
        "failureThreshold 3: expected 200, 200, 503, got {seen:?}"
    );
    ensure!(
        app.control.received_for("healthz") == before + 3,
        "one check per probe period, got {} checks for 3 probes",
        app.control.received_for("healthz") - before
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_starts_late_is_ready_in_the_probe_that_sees_it() -> Result<()> {
    let addr = free_port()?;
    let json = check(addr.port(), 1);
    let sidecar =
        Sidecar::start_unready(SidecarSpec::new(addr).args(&["--app-readiness", &json])).await?;
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
        "ready without an app"
    );
    // The app starts while one /ready call is waiting for it: that call
    // answers 200 (no second probe period), as the kubelet's first probe
    // of a new pod usually comes before the app listens.
    let probe = sidecar.admin_get("/ready");
    let start_app = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        TestApp::start_on("a", addr).await
    };
    let (answer, app) = tokio::join!(probe, start_app);
    let _app = app?;
    let answer = answer?;
    ensure!(
        answer.status == StatusCode::OK,
        "the /ready call that saw the app come up answered {} {:?}",
        answer.status,
        answer.text()
    );
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
