//! Readiness is the sidecar's first drain signal and its health signal:
//! `/ready` is 503 while the app is unreachable, 200 once it is, and 503 at
//! once when a drain starts, while the data path keeps serving (refusing
//! work early is as bad as dying early). `/live` stays 200
//! throughout: a draining or app-less sidecar must not be restarted.
//!
//! With `drain.readiness: stayServing` (`--drain-readiness`) `/ready` stays
//! 200 through the grace phase instead (the endpoint stays serving while
//! terminating) and fails once the listener closes or the app is gone;
//! everything else about the drain is unchanged.

use std::net::SocketAddr;
use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{get, request};
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use crate::kit::{app_busy, free_port, within};
use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

async fn live(sidecar: &Sidecar) -> Result<StatusCode> {
    Ok(sidecar.admin_get("/live").await?.status)
}

/// In the grace phase with stayServing and the app up `/ready` passes;
/// once the app is gone it fails.
async fn app_goes_away_in_the_grace_phase(sidecar: &Sidecar, app: TestApp) -> Result<()> {
    ensure!(
        sidecar.ready_status().await == Some(StatusCode::OK),
        "/ready failed in the grace phase with stayServing and the app up"
    );
    app.kill().await;
    drop(app);
    sidecar
        .wait_ready_status(StatusCode::SERVICE_UNAVAILABLE)
        .await
}

/// `/ready` fails (503) while `/live` still answers 200.
async fn unready_but_live(sidecar: &Sidecar, when: &str) -> Result<()> {
    sidecar
        .wait_ready_status(StatusCode::SERVICE_UNAVAILABLE)
        .await?;
    ensure!(
        live(sidecar).await? == StatusCode::OK,
        "/live failed {when}"
    );
    Ok(())
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
    unready_but_live(&sidecar, "without an app").await?;

    // The app comes up.
    let app = TestApp::start_on("a", app_addr).await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;

    // The app goes away, and comes back.
    app.kill().await;
    drop(app);
    unready_but_live(&sidecar, "when the app went away").await?;
    let _app = TestApp::start_on("a", app_addr).await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;

    // Drain: readiness fails on the very next probe, no waiting.
    sidecar.start_drain().await?;
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
        resp.expect(StatusCode::OK, "draining sidecar")?;
        ensure!(
            resp.connection_close(),
            "a response while draining lacks Connection: close"
        );
    }
    let metrics = sidecar.metrics().await?;
    metrics.expect("kubegrace_drain_phase", 1.0, "expected the grace phase (1)")?;
    Ok(())
}

/// How the drain of a stayServing test starts.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// The preStop hook's way: a provisional drain; the process stays up.
    Admin,
    /// The pod's end: the process exits once drained.
    Sigterm,
}

/// The grace phase is long enough (minDelay 3s) for several probes; then
/// quiet ends it once the test stops opening connections.
const STAY_SERVING: &[&str] = &[
    "--drain-readiness",
    "stayServing",
    "--drain-min-delay",
    "3s",
    "--drain-quiet",
    "300ms",
    "--drain-max-delay",
    "15s",
    "--drain-timeout",
    "20s",
];

/// One GET on an open keep-alive connection: (status, Connection: close?).
async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> Result<(StatusCode, bool)> {
    let req = Request::get(path)
        .header(http::header::HOST, "a")
        .body(Empty::<Bytes>::new())?;
    let resp = within(path, WAIT, sender.send_request(req)).await??;
    let close = resp
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.eq_ignore_ascii_case("close")));
    let status = resp.status();
    resp.into_body().collect().await?;
    Ok((status, close))
}

async fn drain_phase(sidecar: &Sidecar) -> Option<f64> {
    sidecar.metrics().await.ok()?.sum("kubegrace_drain_phase")
}

async fn stay_serving_holds_ready_through_the_grace_phase_only(trigger: Trigger) -> Result<()> {
    let (app, mut sidecar) = Sidecar::with_app(STAY_SERVING).await?;
    let metrics = sidecar.metrics().await?;
    ensure!(
        metrics.with_label("kubegrace_drain_readiness", "mode=\"stay_serving\"") == Some(1.0)
            && metrics.with_label("kubegrace_drain_readiness", "mode=\"fail_fast\"") == Some(0.0),
        "the mode in force is not exposed: {:?}",
        metrics.series
    );

    // A keep-alive client, kept open across the trigger.
    let tcp = TcpStream::connect(sidecar.listen).await?;
    let (mut keep_alive, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let (status, close) = send(&mut keep_alive, "/work").await?;
    ensure!(
        status == StatusCode::OK && !close,
        "before the drain: {status}, close={close}"
    );

    // A request that is still at the app when the listener closes.
    let listen = sidecar.listen;
    let slow =
        tokio::spawn(async move { request(listen, Method::GET, "/work?ms=8000", &[], WAIT).await });
    app_busy(&app, 1).await?;

    match trigger {
        Trigger::Admin => {
            sidecar.start_drain().await?;
        }
        Trigger::Sigterm => sidecar.signal("TERM")?,
    }
    sidecar.wait_phase(1.0).await?;

    // The grace phase: /ready stays 200. A probe counts only when the phase
    // was Draining both before and after it (a drain never goes back here).
    let mut probes_in_grace = 0;
    let mut moved_clients = false;
    loop {
        let before = drain_phase(&sidecar).await;
        let ready = sidecar.ready_status().await;
        let after = drain_phase(&sidecar).await;
        if before != Some(1.0) || after != Some(1.0) {
            break;
        }
        ensure!(
            ready == Some(StatusCode::OK),
            "/ready answered {ready:?} in the grace phase with stayServing ({trigger:?})"
        );
        probes_in_grace += 1;
        if !moved_clients {
            // The rest of the drain is unchanged: the keep-alive client is
            // told to go, and a new connection is still served.
            let (status, close) = send(&mut keep_alive, "/work").await?;
            ensure!(
                status == StatusCode::OK && close,
                "keep-alive request in the grace phase: {status}, close={close}"
            );
            let resp = get(sidecar.listen, "/work").await?;
            ensure!(
                resp.status == StatusCode::OK && resp.connection_close(),
                "new connection in the grace phase: {}, close={}",
                resp.status,
                resp.connection_close()
            );
            moved_clients = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        moved_clients && probes_in_grace >= 3,
        "only {probes_in_grace} probes fell in the grace phase: proves nothing"
    );

    // The listener is closed from Closing on: /ready must fail.
    sidecar.wait_phase(2.0).await?;
    let ready = sidecar.ready_status().await;
    ensure!(
        ready != Some(StatusCode::OK),
        "/ready answered 200 after the listener closed ({trigger:?})"
    );
    ensure!(
        app.inflight() >= 1,
        "the slow request finished before Closing: proves nothing about in-flight work"
    );
    let resp = within("the slow request", WAIT, slow)
        .await??
        .context("the slow request was cut")?;
    resp.expect(StatusCode::OK, "the in-flight request")?;

    match trigger {
        Trigger::Admin => {
            sidecar.wait_phase(3.0).await?;
            ensure!(
                sidecar.ready_status().await == Some(StatusCode::SERVICE_UNAVAILABLE),
                "/ready is not 503 once drained"
            );
            sidecar
                .expect_nothing_force_closed("work was force-closed")
                .await?;
        }
        Trigger::Sigterm => {
            let status = sidecar.wait_exit(WAIT).await?;
            ensure!(status.success(), "exit status {status}");
            let summary = sidecar.drain_summary();
            ensure!(
                summary.is_some_and(|(_, forced)| forced == 0),
                "expected a drain summary with nothing force-closed: {summary:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stay_serving_keeps_ready_through_a_drain_started_on_the_admin_port() -> Result<()> {
    stay_serving_holds_ready_through_the_grace_phase_only(Trigger::Admin).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stay_serving_keeps_ready_through_a_sigterm_drain() -> Result<()> {
    stay_serving_holds_ready_through_the_grace_phase_only(Trigger::Sigterm).await
}

/// An app and a stayServing sidecar in front of it whose grace phase lasts
/// longer than any of these tests: (the app's address, the app, the sidecar).
async fn stay_serving_with_a_long_grace_phase() -> Result<(SocketAddr, TestApp, Sidecar)> {
    let app_addr = free_port()?;
    let app = TestApp::start_on("a", app_addr).await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app_addr).args(&[
        "--drain-readiness",
        "stayServing",
        "--drain-min-delay",
        "20s",
        "--drain-max-delay",
        "30s",
    ]))
    .await?;
    Ok((app_addr, app, sidecar))
}

/// The preStop drain of an app container restart: the app goes away while
/// the drain is still in its grace phase. The upstream is gone, so /ready
/// fails as with failFast; the resume brings it back with the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stay_serving_fails_ready_once_the_app_is_gone_and_resumes_with_it() -> Result<()> {
    let (app_addr, app, sidecar) = stay_serving_with_a_long_grace_phase().await?;
    sidecar.start_drain().await?;
    app_goes_away_in_the_grace_phase(&sidecar, app).await?;
    ensure!(
        drain_phase(&sidecar).await == Some(1.0),
        "expected the grace phase (1) while the app is gone"
    );

    let _app = TestApp::start_on("a", app_addr).await?;
    sidecar
        .wait_metric("kubegrace_drain_phase", WAIT, |p| p == 0.0)
        .await?;
    sidecar.wait_ready_status(StatusCode::OK).await?;
    Ok(())
}

/// An exit drain never resumes, so an app that goes away and comes back in
/// its grace phase must not turn the endpoint serving again: once the app
/// was seen gone, /ready fails for the rest of the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stay_serving_stays_unready_after_the_app_flapped_in_a_sigterm_drain() -> Result<()> {
    let (app_addr, app, sidecar) = stay_serving_with_a_long_grace_phase().await?;
    sidecar.signal("TERM")?;
    sidecar.wait_phase(1.0).await?;
    app_goes_away_in_the_grace_phase(&sidecar, app).await?;
    let _app = TestApp::start_on("a", app_addr).await?;
    sidecar
        .wait_metric("kubegrace_app_up", WAIT, |up| up == 1.0)
        .await?;
    ensure!(
        drain_phase(&sidecar).await == Some(1.0),
        "expected the grace phase (1): an exit drain does not resume"
    );
    let ready = sidecar.ready_status().await;
    ensure!(
        ready == Some(StatusCode::SERVICE_UNAVAILABLE),
        "/ready answered {ready:?} after the app came back in an exit drain"
    );
    Ok(())
}
