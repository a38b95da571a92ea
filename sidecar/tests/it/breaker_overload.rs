//! Overload: the app serves C requests at once; clients offer
//! 3C. Through a route limited to C (small queue, short queue timeout) the
//! admitted requests keep the app's latency and the excess gets the
//! fallback fast. Through a route without a limit (the baseline) the app
//! holds 3C at once and every request waits three times as long. Nothing
//! hangs and every request is counted exactly once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::kit::app::{AppControl, TestApp};
use crate::kit::http::{Pool, quantile};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::{timing_sensitive, wait_for};
use anyhow::{Result, ensure};
use hyper::StatusCode;

const CAPACITY: u32 = 8;
const SERVICE: Duration = Duration::from_millis(100);
const WORKERS: u32 = 3 * CAPACITY;
const REQUESTS_PER_WORKER: u32 = 15;

const CONFIG: &str = r#"
routes:
  - name: limited
    match: {pathPrefix: /limited}
    circuitBreaker: {maxConcurrent: 8, maxQueue: 8, queueTimeout: 25ms, errorRatio: 0, consecutiveFailures: 0}
  - name: unlimited
    match: {pathPrefix: /unlimited}
"#;

#[derive(Default)]
struct Tally {
    ok: u32,
    fallback_queue_full: u32,
    fallback_queue_timeout: u32,
    other: u32,
    ok_latencies: Vec<Duration>,
    fallback_latencies: Vec<Duration>,
}

/// `WORKERS` closed-loop clients, each sending `REQUESTS_PER_WORKER`
/// requests one after the other. A client that got a fallback pauses
/// briefly, as a client honouring back-pressure would, instead of spinning.
async fn offer_load(client: &Pool, url: String) -> Result<Tally> {
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (client, url) = (client.clone(), url.clone());
        workers.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            for _ in 0..REQUESTS_PER_WORKER {
                let reply = client.get(&url).await?;
                let rejected = reply.fallback.is_some();
                replies.push(reply);
                if rejected {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
            anyhow::Ok(replies)
        }));
    }
    let mut tally = Tally::default();
    for worker in workers {
        for reply in worker.await?? {
            match (reply.status, reply.fallback.as_deref()) {
                (StatusCode::OK, None) => {
                    tally.ok += 1;
                    tally.ok_latencies.push(reply.latency);
                }
                (StatusCode::SERVICE_UNAVAILABLE, Some(reason)) => {
                    ensure!(
                        reply.retry_after.is_some_and(|s| s >= 1),
                        "rejection without Retry-After"
                    );
                    match reason {
                        "queue_full" => tally.fallback_queue_full += 1,
                        "queue_timeout" => tally.fallback_queue_timeout += 1,
                        _ => tally.other += 1,
                    }
                    tally.fallback_latencies.push(reply.latency);
                }
                _ => tally.other += 1,
            }
        }
    }
    Ok(tally)
}

/// Offers the load to `url` and says what the app went through: the
/// tally, the most requests inside the app at once, the requests it got.
async fn measure(control: &AppControl, client: &Pool, url: String) -> Result<(Tally, u32, u64)> {
    control.reset_peak();
    let before = control.received.load(Ordering::Relaxed);
    let tally = offer_load(client, url).await?;
    let peak = control.peak_inside.load(Ordering::Relaxed);
    Ok((
        tally,
        peak,
        control.received.load(Ordering::Relaxed) - before,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_load_gets_fast_fallbacks_and_admitted_requests_keep_their_latency() -> Result<()> {
    // Latency comparisons: alone among the timing-sensitive tests.
    let _timing = timing_sensitive().await;
    let app = TestApp::with_capacity(CAPACITY, SERVICE).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(CONFIG)).await?;
    let client = Pool::new();
    let control = Arc::clone(&app.control);

    // Baseline: no limit. The app holds all 3C requests at once.
    let (mut baseline, baseline_peak, baseline_received) =
        measure(&control, &client, sidecar.url("/unlimited/work")).await?;
    let baseline_p50 = quantile(&mut baseline.ok_latencies, 0.5);

    // Limited to C: the app never holds more than C.
    let (mut limited, limited_peak, limited_received) =
        measure(&control, &client, sidecar.url("/limited/work")).await?;
    let limited_p50 = quantile(&mut limited.ok_latencies, 0.5);
    let limited_p90 = quantile(&mut limited.ok_latencies, 0.9);
    let fallback_p50 = quantile(&mut limited.fallback_latencies, 0.5);
    let fallbacks = limited.fallback_queue_full + limited.fallback_queue_timeout;

    println!(
        "baseline: {} ok, p50 {baseline_p50:?}, app peak {baseline_peak} in flight\n\
         limited:  {} ok, p50 {limited_p50:?} p90 {limited_p90:?}, {} queue_full + {} queue_timeout fallbacks \
         (p50 {fallback_p50:?}), app peak {limited_peak} in flight",
        baseline.ok, limited.ok, limited.fallback_queue_full, limited.fallback_queue_timeout
    );

    let offered = WORKERS * REQUESTS_PER_WORKER;
    // Nothing lost, nothing counted twice.
    ensure!(
        baseline.ok == offered && baseline.other == 0,
        "baseline: every request served"
    );
    ensure!(
        baseline_received == u64::from(offered),
        "baseline: the app saw each request once"
    );
    ensure!(
        limited.other == 0,
        "limited: only 200s and fallbacks, got {} others",
        limited.other
    );
    ensure!(
        limited.ok + fallbacks == offered,
        "limited: every request answered once"
    );
    ensure!(
        limited_received == u64::from(limited.ok),
        "limited: the app saw exactly the admitted requests"
    );
    ensure!(
        fallbacks >= offered / 4,
        "3C offered to C: a good part must be shed, only {fallbacks} were"
    );
    ensure!(
        limited.fallback_queue_full > 0,
        "the queue of 8 must overflow under 24 clients"
    );

    // The limit holds at the app and keeps latency where the app has it.
    ensure!(
        limited_peak <= CAPACITY,
        "the app held {limited_peak} > {CAPACITY} at once"
    );
    ensure!(
        baseline_peak >= 2 * CAPACITY,
        "the baseline must overload the app ({baseline_peak})"
    );
    ensure!(
        limited_p50 < SERVICE * 2,
        "admitted requests keep about the app's latency: p50 {limited_p50:?} vs service {SERVICE:?}"
    );
    ensure!(
        baseline_p50 > limited_p50 * 2,
        "without the limit requests wait for each other: {baseline_p50:?} vs {limited_p50:?}"
    );
    ensure!(
        fallback_p50 * 2 < limited_p50,
        "fallbacks are fast: {fallback_p50:?} vs {limited_p50:?}"
    );

    // The sidecar's own books agree and nothing is left in flight or queued.
    let metrics = sidecar.metrics().await?;
    let full = metrics.rejected("limited", "queue_full");
    let timeout = metrics.rejected("limited", "queue_timeout");
    ensure!(
        full == Some(f64::from(limited.fallback_queue_full)),
        "queue_full metric {full:?}"
    );
    ensure!(
        timeout == Some(f64::from(limited.fallback_queue_timeout)),
        "queue_timeout metric {timeout:?}"
    );
    let route = wait_for("the limited route to empty", Duration::from_secs(5), || {
        let sidecar = &sidecar;
        async move {
            let route = sidecar.route("limited").await.ok()?;
            (route["inflight"] == 0 && route["limiter"]["queued"] == 0).then_some(route)
        }
    })
    .await?;
    ensure!(route["limiter"]["limit"] == CAPACITY, "{route}");
    Ok(())
}
