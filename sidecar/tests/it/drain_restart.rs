//! A sidecar restarted in the middle of a drain carries it on (issue #37
//! item 2): a crash or an OOM kill while the pod terminates, or (Kubernetes
//! 1.37, KEP-4438) the kubelet restarting a native sidecar during
//! termination without running preStop again. The restarted process finds
//! the drain in its journal (`--state-dir`, the pod's emptyDir) and is not
//! ready, and an exit drain ends the process again, instead of the sidecar
//! serving as if the pod were new. The baseline, without a state
//! directory, is the restarted sidecar reporting ready on a pod that is
//! going away.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use http::StatusCode;

use crate::kit::app::TestApp;
use crate::kit::scratch_dir;
use crate::kit::sidecar::{Sidecar, SidecarSpec, drain_flags};

/// Long enough that the drain is still under way when the first process
/// is killed and the second one starts: 3 s of grace at the least.
const DRAIN: &[&str] = &drain_flags("3s", "1s", "20s", "10s");

/// Starts a sidecar, stops it as the kubelet does (with `prestop`: the preStop drain,
/// then SIGTERM, the end of a pod; without: SIGTERM alone, an in-place restart of every
/// container), kills the process mid-drain and starts a new one on the same command
/// line: the new one.
/// With `journal` (the state directory), the kill waits until the journal holds the SIGTERM's
/// exit drain: after a preStop drain the sidecar is unready already, so readiness says nothing
/// about the signal, and under load a kill sent at once landed before it was handled (the next
/// process then carried on the preStop's drain, which waits for a SIGTERM, and never exited).
async fn killed_mid_drain_then_restarted(
    spec: SidecarSpec,
    prestop: bool,
    journal: Option<&Path>,
) -> Result<Sidecar> {
    let mut first = Sidecar::start(spec.clone()).await?;
    first.ensure_serving().await?;
    if prestop {
        first.start_drain().await?;
    }
    first.signal("TERM")?;
    first
        .wait_ready_status(StatusCode::SERVICE_UNAVAILABLE)
        .await?;
    if let (true, Some(dir)) = (prestop, journal) {
        exit_drain_journaled(dir).await?;
    }
    first.kill()?;
    first.wait_exit(Duration::from_secs(10)).await?;
    Sidecar::start_unready(spec).await
}

/// Waits (10 s at most) until the journal in `dir` records an exit drain.
async fn exit_drain_journaled(dir: &Path) -> Result<()> {
    let path = dir.join("drain.json");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let entry: Option<serde_json::Value> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if entry.is_some_and(|e| e["exit"] == true) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the journal {} never recorded the SIGTERM's exit drain",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_mid_drain_carries_the_drain_on_after_a_restart() -> Result<()> {
    let app = TestApp::start("app").await?;
    let state = scratch_dir("state")?;
    let spec = SidecarSpec::to(&app)
        .args(DRAIN)
        .args(&["--state-dir", &state.display().to_string()]);
    let mut second = killed_mid_drain_then_restarted(spec.clone(), true, Some(&state)).await?;
    second
        .expect_ready(
            StatusCode::SERVICE_UNAVAILABLE,
            "a sidecar restarted mid-drain must not report ready",
        )
        .await?;
    // The exit drain ends the process again, by itself, well within its
    // deadline (20 s + 10 s + 5 s from the preStop drain).
    second.exits_cleanly().await?;
    let logs = second.logs_text();
    ensure!(
        logs.contains("carrying it on"),
        "the restarted sidecar did not say it carried the drain on: {logs}"
    );
    // A clean exit leaves nothing to carry on: a container started again
    // now (an in-place restart, not the end of the pod) serves at once.
    ensure!(
        !state.join("drain.json").exists(),
        "the journal outlived the clean exit"
    );
    let third = Sidecar::start(spec).await?;
    third.ensure_serving().await
}

/// The baseline: the same kill and restart without a state directory
/// gives a sidecar that reports ready on a pod that is going away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_directory_a_restarted_sidecar_serves_as_if_new() -> Result<()> {
    let app = TestApp::start("app").await?;
    let second =
        killed_mid_drain_then_restarted(SidecarSpec::to(&app).args(DRAIN), true, None).await?;
    second.wait_ready_status(StatusCode::OK).await?;
    second.ensure_serving().await
}

/// A provisional drain (the preStop hook, or `/drain`) carried on stays
/// drained and does not exit: the kubelet's SIGTERM, which comes after the
/// app's exit for a native sidecar, is what ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carried_on_provisional_drain_waits_for_sigterm() -> Result<()> {
    let app = TestApp::start("app").await?;
    let state = scratch_dir("state")?;
    let spec = SidecarSpec::to(&app)
        .args(&drain_flags("100ms", "50ms", "2s", "10s"))
        .args(&["--state-dir", &state.display().to_string()]);
    let mut first = Sidecar::start(spec.clone()).await?;
    first.start_drain().await?;
    first.kill()?;
    first.wait_exit(Duration::from_secs(10)).await?;
    let mut second = Sidecar::start_unready(spec).await?;
    second
        .expect_ready(
            StatusCode::SERVICE_UNAVAILABLE,
            "a sidecar restarted mid-drain must not report ready",
        )
        .await?;
    second.wait_phase(3.0).await?;
    ensure!(
        second.wait_exit(Duration::from_secs(1)).await.is_err(),
        "a provisional drain carried on must not end the process"
    );
    second.signal("TERM")?;
    second.exits_cleanly().await
}

/// The kubelet's in-place restart of every container (`RestartAllContainers`,
/// KEP-5532) sends SIGTERM with no preStop and kills two seconds later; the
/// pod stays and its containers start again. A sidecar that carried that
/// drain on would not serve and would exit again until the deadline. So a
/// SIGTERM that finds the sidecar serving leaves no journal, and the next
/// process serves at once (with the journal it was not ready and exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigterm_without_prestop_and_a_kill_the_next_process_serves_at_once() -> Result<()>
{
    let app = TestApp::start("app").await?;
    let state = scratch_dir("state")?;
    let spec = SidecarSpec::to(&app)
        .args(DRAIN)
        .args(&["--state-dir", &state.display().to_string()]);
    let second = killed_mid_drain_then_restarted(spec, false, Some(&state)).await?;
    ensure!(
        !state.join("drain.json").exists(),
        "a SIGTERM with no preStop before it left a drain journal"
    );
    second.wait_ready_status(StatusCode::OK).await?;
    second.ensure_serving().await
}
