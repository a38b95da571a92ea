//! The preStop contract: `/drain?wait=true` answers 200 only once drained,
//! and always gets its answer out, even when SIGTERM arrives at the same
//! moment (classic sidecars: kubelet sends the sidecar SIGTERM while the
//! app's preStop is calling it). A hook that fails is a FailedPreStopHook
//! event on every rollout.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::{Response, finished_ok, spawn_get};
use crate::kit::pod::pre_stop;
use crate::kit::sidecar::Sidecar;
use crate::kit::sidecar::drain_flags;
use crate::kit::{app_busy, race_rounds, within};
use anyhow::{Result, ensure};
use http::StatusCode;
use tokio::task::JoinHandle;

const DRAIN: &[&str] = &drain_flags("100ms", "50ms", "2s", "10s");

/// The sidecar in front of an app that is working on one 1.5 s request,
/// and that request's answer to come.
async fn busy_with_one_request() -> Result<(TestApp, Sidecar, JoinHandle<Result<Response>>)> {
    let (app, sidecar) = Sidecar::with_app(DRAIN).await?;
    let work = spawn_get(sidecar.listen, "/work?ms=1500", Duration::from_secs(10));
    app_busy(&app, 1).await?;
    Ok((app, sidecar, work))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_answers_only_after_in_flight_work_completed() -> Result<()> {
    let (app, sidecar, work) = busy_with_one_request().await?;
    let hook = pre_stop(sidecar.admin, WAIT).await;
    // When the hook answers, the app must be done with the work (the
    // client may still be reading the last bytes of the answer).
    ensure!(
        app.stats.inflight.load(Ordering::SeqCst) == 0,
        "preStop answered while the app was still working on a request"
    );
    finished_ok(work).await?;
    ensure!(
        matches!(&hook, Ok(r) if r.status == StatusCode::OK),
        "preStop: {hook:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_gets_its_answer_when_sigterm_arrives_at_the_same_time() -> Result<()> {
    // The race is timing-dependent: try it a few times.
    const ROUNDS: usize = 10;
    race_rounds(ROUNDS, "preStop lost its answer", |round| async move {
        let (_app, mut sidecar) = Sidecar::with_app(DRAIN).await?;
        let admin = sidecar.admin;
        // Both orders: kubelet starts the two at the same time.
        if round % 2 == 1 {
            sidecar.signal("TERM")?;
        }
        let hook = tokio::spawn(async move { pre_stop(admin, WAIT).await });
        if round % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            sidecar.signal("TERM")?;
        }
        let hook = within("preStop", WAIT, hook).await??;
        let status = sidecar.wait_exit(WAIT).await?;
        ensure!(status.success(), "round {round}: exit {status}");
        Ok(match hook {
            Ok(r) if r.status == StatusCode::OK => None,
            other => Some(format!("round {round}: {other:?}")),
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_does_not_cut_work_in_flight() -> Result<()> {
    let (_app, mut sidecar, work) = busy_with_one_request().await?;
    sidecar.signal("TERM")?;
    sidecar.wait_phase(1.0).await?;
    // Impatient tooling sends it again; only SIGKILL is the hard stop.
    sidecar.signal("TERM")?;
    sidecar.signal("INT")?;
    finished_ok(work).await?;
    sidecar.exits_cleanly().await?;
    Ok(())
}
