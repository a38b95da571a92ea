//! The app starts failing: the breaker opens after exactly the
//! configured evidence, fallbacks are served fast, the app sees only probe
//! traffic while the breaker is open, and once the app recovers the breaker
//! closes. A route without a breaker, hit the same way, is the baseline: the
//! app sees every one of its requests.

use std::time::{Duration, Instant};

use crate::kit::app::TestApp;
use crate::kit::http::{Pool, quantile};
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::{timing_sensitive, wait_for};
use anyhow::{Result, ensure};
use hyper::StatusCode;

const CONFIG: &str = r#"
routes:
  - name: api
    match: {pathPrefix: /api}
    circuitBreaker:
      maxConcurrent: 64
      maxQueue: 64
      queueTimeout: 1s
      errorRatio: 0.5
      minRequests: 20
      window: 30s
      consecutiveFailures: 0
      openFor: 1s
      maxOpenFor: 2s
      halfOpenProbes: 1
    fallback: {status: 503, contentType: application/json, body: '{"degraded":true}'}
  - name: plain
    match: {pathPrefix: /plain}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_on_evidence_serves_fallbacks_and_closes_on_recovery() -> Result<()> {
    // Latency comparisons: alone among the timing-sensitive tests.
    let _timing = timing_sensitive().await;
    let app = TestApp::with_capacity(64, Duration::from_millis(2)).await?;
    app.control
        .fail_delay_ms
        .store(100, std::sync::atomic::Ordering::Relaxed);
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(CONFIG)).await?;
    let client = Pool::new();

    // Healthy: 10 good requests, below minRequests on their own.
    for _ in 0..10 {
        let reply = client.get(&sidecar.url("/api/items")).await?;
        reply.expect(StatusCode::OK, "healthy app")?;
    }
    ensure!(sidecar.route("api").await?["breaker"]["state"] == "closed");

    // The app fails. Sequential requests: with 10 successes in the window
    // the ratio reaches 0.5 at the 10th failure (20 requests = minRequests),
    // so exactly 10 failures reach the app before the first fallback.
    app.control.fail(Some("/api"));
    let before = app.control.received_for("api");
    let mut failures_seen = 0;
    let mut failure_latencies = Vec::new();
    let first_fallback = loop {
        let reply = client.get(&sidecar.url("/api/items")).await?;
        if reply.fallback.is_some() {
            break reply;
        }
        reply.expect(StatusCode::INTERNAL_SERVER_ERROR, "failing app")?;
        failure_latencies.push(reply.latency);
        failures_seen += 1;
        ensure!(failures_seen <= 50, "the breaker never opened");
    };
    ensure!(
        failures_seen == 10,
        "opened after {failures_seen} failures, configured evidence is 10"
    );
    ensure!(
        app.control.received_for("api") - before == 10,
        "the app saw more than the evidence"
    );
    ensure!(first_fallback.status == StatusCode::SERVICE_UNAVAILABLE);
    ensure!(
        first_fallback.body == r#"{"degraded":true}"#,
        "body {:?}",
        first_fallback.body
    );
    ensure!(first_fallback.fallback.as_deref() == Some("breaker_open"));
    ensure!(
        matches!(first_fallback.retry_after, Some(1..=3)),
        "Retry-After {:?}",
        first_fallback.retry_after
    );

    // While open (the app still failing): a steady stream of requests for
    // ~2.5s. Each open period lets one probe through, which fails and
    // reopens it; everything else is a fallback. The baseline route without
    // a breaker takes the same stream and hands all of it to the app.
    let api_before = app.control.received_for("api");
    let plain_before = app.control.received_for("plain");
    let started = Instant::now();
    let (mut fallbacks, mut to_app, mut plain_sent) = (0u32, 0u32, 0u32);
    let mut fallback_latencies = Vec::new();
    while started.elapsed() < Duration::from_millis(2500) && fallbacks + to_app < 2000 {
        let reply = client.get(&sidecar.url("/api/items")).await?;
        if reply.fallback.is_some() {
            ensure!(
                reply.retry_after.is_some_and(|s| s >= 1),
                "every rejection carries Retry-After"
            );
            fallbacks += 1;
            fallback_latencies.push(reply.latency);
        } else {
            to_app += 1;
        }
        client.get(&sidecar.url("/plain/items")).await?;
        plain_sent += 1;
    }
    let api_hits = app.control.received_for("api") - api_before;
    let plain_hits = app.control.received_for("plain") - plain_before;
    let api = sidecar.route("api").await?;
    let probes_allowed = api["transitions"]["half_open"].as_u64().unwrap_or(0);
    println!(
        "while open: {fallbacks} fallbacks, {to_app} reached the app ({api_hits} by the app's count), \
         {probes_allowed} half-open periods; baseline route: {plain_hits}/{plain_sent} reached the app"
    );
    ensure!(
        fallbacks >= 20,
        "too few requests while open to judge: {fallbacks}"
    );
    ensure!(
        api_hits == u64::from(to_app) && api_hits <= probes_allowed,
        "only probes may reach the app while open: {api_hits} requests, {probes_allowed} probes"
    );
    ensure!(
        plain_hits == u64::from(plain_sent),
        "the baseline route sends everything to the app"
    );
    let fallback_p50 = quantile(&mut fallback_latencies, 0.5);
    let failure_p50 = quantile(&mut failure_latencies, 0.5);
    println!("fallback p50 {fallback_p50:?}, failing-app p50 {failure_p50:?}");
    ensure!(
        fallback_p50 * 4 < failure_p50,
        "fallbacks must be much faster than the failing app: {fallback_p50:?} vs {failure_p50:?}"
    );

    let metrics = sidecar.metrics().await?;
    let rejected = metrics.rejected("api", "breaker_open");
    let client_saw = f64::from(fallbacks + 1);
    ensure!(
        rejected == Some(client_saw),
        "metric {rejected:?}, client saw {client_saw}: each counted once"
    );

    // The app recovers: keep a trickle of traffic so a probe can go through,
    // and wait for the breaker to close.
    app.control.fail(None);
    wait_for(
        "the breaker to close after recovery",
        Duration::from_secs(15),
        || {
            let (client, sidecar) = (&client, &sidecar);
            async move {
                let reply = client.get(&sidecar.url("/api/items")).await.ok()?;
                (reply.status == StatusCode::OK && reply.fallback.is_none()).then_some(())
            }
        },
    )
    .await?;
    for _ in 0..20 {
        let reply = client.get(&sidecar.url("/api/items")).await?;
        reply.expect(StatusCode::OK, "closed breaker, healthy app")?;
    }
    let api = sidecar.route("api").await?;
    ensure!(api["breaker"]["state"] == "closed", "{api}");
    ensure!(api["transitions"]["closed"].as_u64() >= Some(1), "{api}");
    let metrics = sidecar.metrics().await?;
    ensure!(
        metrics.get(r#"kubegrace_breaker_state{route="api"}"#) == Some(0.0),
        "{:?}",
        metrics.series
    );
    Ok(())
}
