//! The drain report outlives the process: on exit the sidecar binary writes
//! it as JSON to `--termination-log` (in a pod, the container's termination
//! message, which the operator reads after the pod is gone). A drain that
//! cuts a request says so; the baseline, a drain whose request finishes in
//! time, says it cut nothing.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::http::spawn_get;
use crate::kit::sidecar::{Sidecar, SidecarSpec, drain_flags};
use crate::kit::{WAIT, app_busy, scratch_dir, within};
use anyhow::{Context, Result, ensure};
use kubegrace_sidecar_api::cli::flag;
use kubegrace_sidecar_api::report::{DrainOutcome, KIND, MAX_BYTES};

const DRAIN: &[&str] = &drain_flags("200ms", "100ms", "1s", "1s");
/// Room for a loaded machine; the drain itself ends after about 2 s.
const EXIT: Duration = Duration::from_secs(30);

/// Runs one request of `work_ms` through a sidecar, sends SIGTERM while it
/// is in flight, and returns the report the sidecar left in its file.
async fn drain_with_one_request(work_ms: u64) -> Result<DrainOutcome> {
    let dir = scratch_dir("report")?;
    let file = dir.join("termination-log");
    let file_arg = file.display().to_string();
    let app = TestApp::start("a").await?;
    let mut args = DRAIN.to_vec();
    args.extend([flag::TERMINATION_LOG, file_arg.as_str()]);
    let mut sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(&args)).await?;
    let request = spawn_get(
        sidecar.listen,
        &format!("/work?ms={work_ms}"),
        Duration::from_secs(60),
    );
    app_busy(&app, 1).await?;
    sidecar.signal("TERM")?;
    let status = sidecar.wait_exit(EXIT).await?;
    ensure!(status.success(), "exit {status}:\n{}", sidecar.logs_text());
    let _ = within("the request to end", WAIT, request).await?;
    let text = std::fs::read(&file)
        .with_context(|| format!("no report in {}:\n{}", file.display(), sidecar.logs_text()))?;
    ensure!(text.len() < MAX_BYTES, "{} bytes", text.len());
    let report: DrainOutcome = serde_json::from_slice(&text)
        .with_context(|| format!("not a report: {}", String::from_utf8_lossy(&text)))?;
    println!("{}", String::from_utf8_lossy(&text));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_file_counts_a_request_cut_at_the_drain_timeout() -> Result<()> {
    let report = drain_with_one_request(60_000).await?;
    ensure!(
        report.kind == KIND && report.trigger == "SIGTERM",
        "{report:?}"
    );
    ensure!(
        (
            report.inflight_at_trigger,
            report.force_closed,
            report.requests_cut
        ) == (1, 1, 1),
        "want 1 in flight at the trigger, 1 connection force-closed, 1 request cut: {report:?}"
    );
    ensure!(!report.is_clean(), "{report:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_file_of_a_drain_that_finished_its_work_is_clean() -> Result<()> {
    // 300 ms of work: done long before the 1 s drain timeout.
    let report = drain_with_one_request(300).await?;
    ensure!(
        (report.inflight_at_trigger, report.requests_finished) == (1, 1),
        "want the request in flight at the trigger, and finished: {report:?}"
    );
    ensure!(
        report.is_clean() && report.force_closed == 0 && report.requests_cut == 0,
        "{report:?}"
    );
    Ok(())
}
