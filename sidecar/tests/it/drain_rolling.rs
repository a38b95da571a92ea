//! A rolling replacement under keep-alive load loses no request with the
//! sidecar, and loses some without it.
//!
//! Two pods serve; a third (the surge pod) starts and becomes ready; then
//! pod `a` is terminated the way kubelet does it while a constant-rate load
//! runs through a lagging balancer. The app is naive: on its termination
//! signal it is gone at once, in-flight requests included.
//!
//! Without the sidecar the balancer keeps sending new connections to `a` for
//! its propagation lag (routers learn late that a pod terminates) and the requests in flight when the app
//! died are reset: the baseline must lose requests, or the scenario proves
//! nothing. With the sidecar, readiness fails at once, the sidecar keeps
//! serving through the lag, moves keep-alive clients with `Connection:
//! close` (an HTTP/1 client cannot be told to move any other way), and only
//! lets the app die once drained. Both kubelet orders are covered: classic
//! sidecars get SIGTERM at the same time as the app's preStop, native
//! sidecars get it last.

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::balancer::Balancer;
use crate::kit::load::{Load, LoadReport, LoadSpec};
use crate::kit::pod::{Pod, Termination};
use crate::kit::sidecar::drain_flags;
use anyhow::{Result, ensure};

/// Routers learn about a terminating pod this late.
const LAG: Duration = Duration::from_millis(300);
/// Generous bounds for a loaded 2-core machine; never timing assertions.
const HOOK_LIMIT: Duration = Duration::from_secs(30);
const EXIT_LIMIT: Duration = Duration::from_secs(30);
/// minDelay is the known router lag with room to spare (as an operator
/// would set it); quiet alone cannot cover a lag when new connections
/// arrive at random gaps longer than `quiet`.
const DRAIN: &[&str] = &drain_flags("1s", "200ms", "5s", "3s");

struct Outcome {
    report: LoadReport,
    terminated: crate::kit::pod::Terminated,
    drain_summary: Option<(u64, u64)>,
    logs: String,
}

async fn rolling_replacement(how: Termination) -> Result<Outcome> {
    let sidecar = (how != Termination::Bare).then_some(DRAIN);
    let balancer = Balancer::new(LAG);
    let (mut a, b) = Pod::pair(&balancer, sidecar).await?;

    let load = Load::start(
        balancer.clone(),
        // ~30 new connections/s overall: routers keep sending some to the
        // terminating pod for the whole lag.
        LoadSpec {
            // Work long enough that every pod has requests in flight.
            path: "/work?ms=30".into(),
            ..LoadSpec::churning(300, 12)
        },
    );
    load.wait_more(150, WAIT).await?;

    // The surge pod of the new ReplicaSet comes up and becomes ready first.
    let c = Pod::start("c", sidecar).await?;
    c.register(&balancer);
    balancer.wait_routable("c", true, WAIT).await?;
    load.wait_more(150, WAIT).await?;

    let terminated = a.terminate(how, HOOK_LIMIT, EXIT_LIMIT).await?;
    // The rollout goes on: b and c carry the load after a is gone.
    balancer.wait_routable("a", false, WAIT).await?;
    load.wait_more(300, WAIT).await?;
    let report = load.stop().await?;
    let (drain_summary, logs) = match &a.sidecar {
        Some(s) => (s.drain_summary(), s.logs_text()),
        None => (None, String::new()),
    };
    drop((b, c));
    Ok(Outcome {
        report,
        terminated,
        drain_summary,
        logs,
    })
}

async fn zero_loss_against_baseline(how: Termination, label: &str) -> Result<()> {
    let _serial = crate::kit::timing_sensitive().await;
    let baseline = rolling_replacement(Termination::Bare).await?;
    let with = rolling_replacement(how).await?;
    println!(
        "rolling replacement, {label}: baseline without sidecar {} of {} requests failed {:?}; \
         with kubegrace {} of {} failed",
        baseline.report.failed(),
        baseline.report.sent,
        baseline.report.by_kind(),
        with.report.failed(),
        with.report.sent,
    );
    println!("  baseline: {}", baseline.report.summary());
    println!("  kubegrace: {}", with.report.summary());
    println!(
        "  kubegrace: pod a terminated in {:?}, preStop {:?}, exit {:?}, drain summary {:?}",
        with.terminated.took,
        with.terminated
            .pre_stop
            .as_ref()
            .map(|r| r.as_ref().map(|r| r.status)),
        with.terminated.sidecar_exit,
        with.drain_summary
    );

    // The scenario must be able to fail: a naive app behind a lagging
    // router loses requests.
    ensure!(
        baseline.report.failed() > 0,
        "the baseline lost nothing, so this scenario proves nothing: {}",
        baseline.report.summary()
    );
    ensure!(
        with.report.failed() == 0,
        "requests failed with the sidecar: {}\n{}\nsidecar logs:\n{}",
        with.report.summary(),
        with.report.failure_details(),
        with.logs
    );
    // The drain really happened on a pod that was serving.
    ensure!(
        with.report.ok_by_pod.get("a").copied().unwrap_or(0) > 0,
        "pod a never served: {}",
        with.report.summary()
    );
    ensure!(
        with.report.closes_by_pod.get("a").copied().unwrap_or(0) > 0,
        "no response from draining pod a carried Connection: close: {}",
        with.report.summary()
    );
    ensure!(
        with.terminated.pre_stop_ok(),
        "preStop /drain?wait=true did not answer 200: {:?}\nsidecar logs:\n{}",
        with.terminated.pre_stop,
        with.logs
    );
    ensure!(
        with.terminated.sidecar_exit.is_some_and(|s| s.success()),
        "sidecar did not exit 0 on SIGTERM: {:?}\nlogs:\n{}",
        with.terminated.sidecar_exit,
        with.logs
    );
    // Like http.Server.Shutdown's caller would log: what was drained and
    // what had to be cut. Nothing was cut here.
    match with.drain_summary {
        Some((_, forced)) => ensure!(
            forced == 0,
            "{forced} connections force-closed:\n{}",
            with.logs
        ),
        None => anyhow::bail!(
            "no exit log line like \"drained N connections in Xs, M force-closed\":\n{}",
            with.logs
        ),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_replacement_with_regular_container_sidecar_loses_nothing() -> Result<()> {
    zero_loss_against_baseline(
        Termination::RegularContainers,
        "regular containers (SIGTERM with preStop)",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_replacement_with_native_sidecar_loses_nothing() -> Result<()> {
    zero_loss_against_baseline(
        Termination::NativeSidecar,
        "native sidecar (preStop, app exits, then SIGTERM)",
    )
    .await
}
