//! The adaptive limit follows the app's capacity.
//!
//! An open-loop client offers a steady rate the app handles comfortably;
//! midway the app's capacity halves, so the same rate is now 1.7x what it
//! can serve. With `adaptive: true` the limit drops to the new capacity
//! within seconds and the latency of admitted requests stays bounded (the
//! excess gets fallbacks). The baseline, the same run through a route
//! without a limiter, shows what that prevents: the app's queue grows every
//! second and so does latency.

use std::time::{Duration, Instant};

use crate::kit::app::TestApp;
use crate::kit::http::{Pool, quantile};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::timing_sensitive;
use anyhow::{Result, ensure};
use hyper::StatusCode;

const CAPACITY: u32 = 16;
const HALVED: u32 = 6;
const SERVICE: Duration = Duration::from_millis(40);
/// 62% of the initial capacity (400/s), 167% of the halved one (150/s).
const RATE_PER_SEC: u32 = 250;
const BEFORE_HALVING: Duration = Duration::from_secs(3);
const AFTER_HALVING: Duration = Duration::from_secs(5);

const CONFIG: &str = r#"
routes:
  - name: adaptive
    match: {pathPrefix: /adaptive}
    circuitBreaker:
      adaptive: true
      minConcurrent: 2
      maxConcurrent: 200
      maxQueue: 10
      queueTimeout: 50ms
      errorRatio: 0
      consecutiveFailures: 0
  - name: unlimited
    match: {pathPrefix: /unlimited}
"#;

struct Sample {
    /// When the request was sent, from the start of the run.
    sent_at: Duration,
    status: StatusCode,
    fallback: bool,
    latency: Duration,
}

struct Run {
    samples: Vec<Sample>,
    /// (time since start, limit) as `/breakers` reported it.
    limits: Vec<(Duration, u64)>,
}

/// Sends `RATE_PER_SEC` requests a second, open loop (a request is sent
/// on schedule whether or not earlier ones finished), halving the app's
/// capacity after `BEFORE_HALVING`.
async fn run(
    app: &TestApp,
    sidecar: &InProcess,
    client: &Pool,
    path: &str,
    route: &str,
) -> Result<Run> {
    let started = Instant::now();
    let total = BEFORE_HALVING + AFTER_HALVING;
    let count = RATE_PER_SEC * u32::try_from(total.as_secs())?;
    let interval = Duration::from_secs(1) / RATE_PER_SEC;

    let poller = {
        let (client, admin_url, route) = (
            client.clone(),
            format!("http://{}/breakers", sidecar.admin),
            route.to_string(),
        );
        tokio::spawn(async move {
            let mut limits = Vec::new();
            while started.elapsed() < total {
                if let Ok(reply) = client.get(&admin_url).await
                    && let Ok(json) = serde_json::from_str::<serde_json::Value>(&reply.body)
                    && let Some(limit) = json["routes"]
                        .as_array()
                        .and_then(|routes| routes.iter().find(|r| r["name"] == route.as_str()))
                        .and_then(|r| r["limiter"]["limit"].as_u64())
                {
                    limits.push((started.elapsed(), limit));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            limits
        })
    };

    let mut requests = Vec::with_capacity(count as usize);
    let mut halved = false;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..count {
        ticker.tick().await;
        if !halved && started.elapsed() >= BEFORE_HALVING {
            app.control.set_capacity(HALVED);
            halved = true;
        }
        let (client, url) = (client.clone(), sidecar.url(path));
        let sent_at = started.elapsed();
        requests.push(tokio::spawn(async move {
            let reply = client.get(&url).await?;
            anyhow::Ok(Sample {
                sent_at,
                status: reply.status,
                fallback: reply.fallback.is_some(),
                latency: reply.latency,
            })
        }));
    }
    let mut samples = Vec::with_capacity(requests.len());
    for request in requests {
        samples.push(request.await??);
    }
    Ok(Run {
        samples,
        limits: poller.await?,
    })
}

/// p50 latency of admitted (200) requests sent within [from, to).
fn admitted_p50(run: &Run, from: Duration, to: Duration) -> Duration {
    let mut latencies: Vec<Duration> = run
        .samples
        .iter()
        .filter(|s| {
            s.status == StatusCode::OK && !s.fallback && s.sent_at >= from && s.sent_at < to
        })
        .map(|s| s.latency)
        .collect();
    quantile(&mut latencies, 0.5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_follows_capacity_and_keeps_latency_bounded() -> Result<()> {
    // Latency comparisons: alone among the timing-sensitive tests.
    let _timing = timing_sensitive().await;
    let client = Pool::new();
    let end = BEFORE_HALVING + AFTER_HALVING;
    let first_second_after = (BEFORE_HALVING, BEFORE_HALVING + Duration::from_secs(1));
    let last_two_seconds = (end - Duration::from_secs(2), end);

    // With the adaptive limiter.
    let app = TestApp::with_capacity(CAPACITY, SERVICE).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(CONFIG)).await?;
    let adaptive = run(&app, &sidecar, &client, "/adaptive/work", "adaptive").await?;
    let adaptive_late = admitted_p50(&adaptive, last_two_seconds.0, last_two_seconds.1);
    let ok = adaptive
        .samples
        .iter()
        .filter(|s| s.status == StatusCode::OK && !s.fallback)
        .count();
    let shed = adaptive.samples.iter().filter(|s| s.fallback).count();
    let other = adaptive.samples.len() - ok - shed;
    // A new route warms up without a limit: nothing may be shed while the
    // app still has capacity to spare (a new pod in a rollout).
    let shed_before_halving = adaptive
        .samples
        .iter()
        .filter(|s| s.fallback && s.sent_at < BEFORE_HALVING)
        .count();
    let limit_before = adaptive
        .limits
        .iter()
        .filter(|(at, _)| *at < BEFORE_HALVING && *at >= Duration::from_secs(2))
        .map(|(_, l)| *l)
        .max()
        .unwrap_or(0);
    let limit_late: Vec<u64> = adaptive
        .limits
        .iter()
        .filter(|(at, _)| *at >= last_two_seconds.0)
        .map(|(_, l)| *l)
        .collect();
    let followed_after = adaptive
        .limits
        .iter()
        .find(|(at, limit)| *at >= BEFORE_HALVING && *limit <= u64::from(3 * HALVED))
        .map(|(at, _)| *at - BEFORE_HALVING);
    drop(sidecar);
    drop(app);

    // Baseline: the same load without a limiter.
    let app = TestApp::with_capacity(CAPACITY, SERVICE).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(CONFIG)).await?;
    let baseline = run(&app, &sidecar, &client, "/unlimited/work", "unlimited").await?;
    let baseline_early = admitted_p50(&baseline, first_second_after.0, first_second_after.1);
    let baseline_late = admitted_p50(&baseline, last_two_seconds.0, last_two_seconds.1);
    let baseline_ok = baseline
        .samples
        .iter()
        .filter(|s| s.status == StatusCode::OK)
        .count();

    println!(
        "adaptive: {ok} ok, {shed} shed ({shed_before_halving} before halving), {other} other; limit before halving {limit_before}, \
         late {limit_late:?}, followed within {followed_after:?}; admitted p50 in the last 2s {adaptive_late:?}\n\
         baseline: {baseline_ok} ok; p50 just after halving {baseline_early:?}, in the last 2s {baseline_late:?}"
    );
    println!(
        "adaptive limit trace: {:?}",
        adaptive
            .limits
            .iter()
            .map(|(at, l)| (at.as_millis(), *l))
            .collect::<Vec<_>>()
    );

    ensure!(other == 0, "only 200s and fallbacks: {other} other answers");
    // A CPU stall on this shared machine can look like queueing to the
    // gradient for a moment, so a handful of early sheds is noise; a limiter
    // that throttles healthy traffic sheds far more than 2% of it.
    let sent_before_halving = adaptive
        .samples
        .iter()
        .filter(|s| s.sent_at < BEFORE_HALVING)
        .count();
    ensure!(
        shed_before_halving * 50 <= sent_before_halving,
        "{shed_before_halving} of {sent_before_halving} shed while the app had capacity to spare (over 2%)"
    );
    ensure!(
        baseline_ok == baseline.samples.len(),
        "the baseline serves everything, eventually"
    );
    // The limit found the first capacity and followed it down.
    ensure!(
        limit_before >= u64::from(HALVED) + 2,
        "the limit never grew: {limit_before}"
    );
    let followed = followed_after.is_some_and(|after| after <= Duration::from_secs(4));
    ensure!(
        followed,
        "the limit did not reach <= {} within 4s of the halving: {:?}",
        3 * HALVED,
        adaptive.limits
    );
    ensure!(
        limit_late.iter().all(|l| *l <= u64::from(3 * HALVED)),
        "the limit stays near the new capacity: {limit_late:?}"
    );
    ensure!(
        shed > 0,
        "1.7x the capacity offered: something must be shed"
    );
    // Admitted latency stays bounded; without the limiter it grows.
    ensure!(
        adaptive_late < SERVICE * 6,
        "admitted latency bounded near the app's own: {adaptive_late:?} vs service {SERVICE:?}"
    );
    ensure!(
        baseline_late > baseline_early * 2,
        "the baseline's latency keeps growing: {baseline_early:?} -> {baseline_late:?}"
    );
    ensure!(
        baseline_late > adaptive_late * 4,
        "the limiter must beat the baseline clearly: {baseline_late:?} vs {adaptive_late:?}"
    );
    Ok(())
}
