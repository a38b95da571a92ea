//! Work longer than the drain timeout is cut at the timeout, counted, and
//! the process still exits in time with status 0: the drain is bounded, and
//! nothing keeps the pod alive past it.
//!
//! Like Go's `http.Server.Shutdown(ctx)`, the wait is bounded by a
//! configurable timeout; unlike it, the sidecar says what it left behind:
//! the exit line reads "drained N connections in Xs, M force-closed".

use std::time::{Duration, Instant};

use crate::kit::WAIT;
use crate::kit::http::spawn_get;
use crate::kit::sidecar::Sidecar;
use crate::kit::sidecar::drain_flags;
use crate::kit::{app_busy, race_rounds, within};
use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::{Method, Request, StatusCode};

const MAX_DELAY: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_secs(1);
/// Room for a loaded machine; what matters is that the exit is bounded.
const MARGIN: Duration = Duration::from_secs(20);

const DRAIN: &[&str] = &drain_flags("200ms", "100ms", "1s", "1s");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_longer_than_the_drain_timeout_is_cut_and_the_exit_is_bounded() -> Result<()> {
    let (app, mut sidecar) = Sidecar::with_app(DRAIN).await?;
    let listen = sidecar.listen;
    // 60s of work: far beyond any drain timeout.
    let long = spawn_get(listen, "/work?ms=60000", Duration::from_secs(60));
    app_busy(&app, 1).await?;

    let started = Instant::now();
    sidecar.signal("TERM")?;
    let status = sidecar.wait_exit(MAX_DELAY + TIMEOUT + MARGIN).await?;
    let took = started.elapsed();
    ensure!(status.success(), "exit {status}:\n{}", sidecar.logs_text());

    // The client is not left hanging: its request ends, and not as a success.
    let outcome = within("the cut request to end", WAIT, long).await??;
    // An error means the connection was closed under it: cut.
    if let Ok(resp) = &outcome {
        ensure!(
            resp.status != StatusCode::OK,
            "the long request was not cut: {} {:?}",
            resp.status,
            resp.text()
        );
    }
    let (drained, forced) = sidecar.drain_summary().with_context(|| {
        format!(
            "no \"drained N connections in Xs, M force-closed\" line:\n{}",
            sidecar.logs_text()
        )
    })?;
    println!(
        "long request: exited 0 after {took:?} (bound {:?}); summary: drained {drained} connections, {forced} force-closed; client saw {:?}",
        MAX_DELAY + TIMEOUT + MARGIN,
        outcome
            .as_ref()
            .map(|r| r.status)
            .map_err(|e| format!("{e:#}"))
    );
    ensure!(
        forced == 1,
        "expected exactly the long request's connection force-closed, got {forced}"
    );
    ensure!(drained >= 1, "the summary counts no connection at all");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_h1_and_h2_work_is_counted_in_the_metrics_and_pre_stop_still_answers() -> Result<()> {
    let (app, mut sidecar) = Sidecar::with_app(DRAIN).await?;
    let listen = sidecar.listen;
    let h1 = spawn_get(listen, "/work?ms=60000", Duration::from_secs(60));
    // An HTTP/2 stream on its own connection, also far longer than the timeout.
    let tcp = tokio::net::TcpStream::connect(listen).await?;
    let (mut h2, conn) = h2::client::handshake(tcp).await.context("h2 handshake")?;
    tokio::spawn(conn);
    let req = Request::get("http://app.test/work?ms=60000")
        .body(())
        .context("request")?;
    let (h2_resp, _) = h2.send_request(req, true)?;
    let h2_stream = tokio::spawn(async move {
        let resp = h2_resp.await?;
        let mut body = resp.into_body();
        while let Some(chunk) = body.data().await {
            chunk?;
        }
        Ok::<_, h2::Error>(Bytes::new())
    });
    app_busy(&app, 2).await?;

    // The preStop hook: it must answer (not hang) once the timeout cut the work.
    let pre_stop = sidecar.admin(Method::GET, "/drain?wait=true").await?;
    ensure!(
        pre_stop.status == StatusCode::OK,
        "preStop answered {}: {}",
        pre_stop.status,
        pre_stop.text()
    );
    let metrics = sidecar.metrics().await?;
    metrics.expect(
        "kubegrace_drain_phase",
        3.0,
        "preStop answered before Drained",
    )?;
    metrics.expect(
        "kubegrace_drain_force_closed_total",
        2.0,
        "expected both connections force-closed",
    )?;
    metrics.expect(
        "kubegrace_inflight_requests",
        0.0,
        "requests still in flight after the drain",
    )?;
    ensure!(
        metrics
            .sum("kubegrace_drain_seconds")
            .is_some_and(|s| s > 0.0),
        "no drain duration: {:?}",
        metrics.series
    );
    let h1 = within("the cut HTTP/1 request to end", WAIT, h1).await??;
    if let Ok(resp) = &h1
        && resp.status == StatusCode::OK
    {
        bail!("the HTTP/1 request was not cut");
    }
    match within("the cut HTTP/2 stream to end", WAIT, h2_stream).await? {
        Ok(Ok(_)) => bail!("the HTTP/2 stream was not cut"),
        Ok(Err(e)) => println!("h2 stream cut with {e}"),
        Err(e) => bail!("h2 task failed: {e}"),
    }
    sidecar.signal("TERM")?;
    sidecar.exits_cleanly().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_line_names_what_started_the_drain() -> Result<()> {
    // Recording the trigger races with the drain's own task: try a few times.
    const ROUNDS: usize = 6;
    let lost = "the exit line did not name the signal";
    race_rounds(ROUNDS, lost, |round| async move {
        let (_app, mut sidecar) = Sidecar::with_app(&[
            "--drain-min-delay",
            "50ms",
            "--drain-quiet",
            "50ms",
            "--drain-timeout",
            "1s",
        ])
        .await?;
        let signal = if round % 2 == 0 { "TERM" } else { "INT" };
        sidecar.signal(signal)?;
        let status = sidecar.wait_exit(WAIT).await?;
        ensure!(status.success(), "round {round}: exit {status}");
        let line = sidecar
            .logs()
            .into_iter()
            .find(|l| l.contains("force-closed"))
            .with_context(|| format!("round {round}: no exit line:\n{}", sidecar.logs_text()))?;
        Ok((!line.contains(&format!("SIG{signal}"))).then_some(line))
    })
    .await
}
