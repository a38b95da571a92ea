//! The route table as the proxy uses it: select, admit, record, fallback,
//! reload. Time is paused, so every wait is deterministic.

use std::time::Duration;

use http::{Method, StatusCode};

use super::*;
use crate::cli::config_from_yaml;

fn table(yaml: &str) -> RouteTable {
    let config = config_from_yaml(yaml).expect("valid config");
    RouteTable::new(&config.routes)
}

fn routes(yaml: &str) -> Vec<RouteConfig> {
    config_from_yaml(yaml).expect("valid config").routes
}

/// The table's `/metrics` part, checked to hold each of `series`.
fn metrics_with(table: &RouteTable, series: &[&str]) -> String {
    let mut metrics = String::new();
    table.render_metrics(&mut metrics);
    for line in series {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    metrics
}

const TWO_ROUTES: &str = r#"
routes:
  - name: api
    match: {pathPrefix: /api}
    timeout: 2s
    circuitBreaker: {maxConcurrent: 2, maxQueue: 1, queueTimeout: 100ms, consecutiveFailures: 3, errorRatio: 0, openFor: 1s, maxOpenFor: 4s}
    fallback: {status: 503, contentType: application/json, body: '{"error":"busy"}'}
  - name: writes
    match: {methods: [POST]}
"#;

#[test]
fn first_match_wins_and_the_default_catches_the_rest() {
    let table = table(TWO_ROUTES);
    assert_eq!(table.select(&Method::POST, None, "/api/x").name(), "api");
    assert_eq!(table.select(&Method::POST, None, "/other").name(), "writes");
    assert_eq!(
        table.select(&Method::GET, Some("h"), "/other").name(),
        CATCH_ALL_ROUTE
    );
    let api = table.select(&Method::GET, None, "/api");
    assert_eq!(api.timeout(), Some(Duration::from_secs(2)));
    assert_eq!(table.select(&Method::GET, None, "/").timeout(), None);
}

#[test]
fn a_configured_default_route_sets_the_catch_alls_policy() {
    let table = table(
        "routes: [{name: default, match: {path: /never}, circuitBreaker: {maxConcurrent: 3}}, {name: api, match: {pathPrefix: /api}}]",
    );
    let fallthrough = table.select(&Method::GET, None, "/x");
    assert_eq!(fallthrough.name(), CATCH_ALL_ROUTE);
    assert!(fallthrough.guard.is_some());
    assert_eq!(table.select(&Method::GET, None, "/api").name(), "api");
    assert_eq!(
        table.snapshot()["routes"].as_array().map(Vec::len),
        Some(2),
        "listed once"
    );
}

#[tokio::test(start_paused = true)]
async fn the_fast_path_admits_everything_and_counts_inflight() {
    let table = table(TWO_ROUTES);
    let route = table.select(&Method::GET, None, "/");
    let permits: Vec<Permit> = futures_util::future::join_all((0..100).map(|_| route.admit()))
        .await
        .into_iter()
        .map(|permit| permit.expect("no limit on the default route"))
        .collect();
    assert_eq!(route.inflight(), 100);
    drop(permits);
    assert_eq!(route.inflight(), 0);
}

#[tokio::test(start_paused = true)]
async fn overload_queues_then_rejects_and_every_rejection_says_why() {
    let table = table(TWO_ROUTES);
    let api = table.select(&Method::GET, None, "/api");
    let _a = api.admit().await.expect("slot 1");
    let _b = api.admit().await.expect("slot 2");
    let queued = {
        let api = api.clone();
        tokio::spawn(async move { api.admit().await.map(drop) })
    };
    tokio::task::yield_now().await;
    let full = api.admit().await.err().expect("queue of 1 is full");
    assert_eq!(full, Rejection::QueueFull);
    assert_eq!(
        queued.await.expect("task").err(),
        Some(Rejection::QueueTimeout)
    );

    let response = api.fallback(&full);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        response.headers()[crate::config::FALLBACK_HEADER],
        "queue_full"
    );
    assert_eq!(response.headers()["content-type"], "application/json");

    let metrics = metrics_with(
        &table,
        &[
            "kubegrace_rejected_requests_total{route=\"api\",reason=\"queue_full\"} 1",
            "kubegrace_rejected_requests_total{route=\"api\",reason=\"queue_timeout\"} 1",
            "kubegrace_concurrency_limit{route=\"api\"} 2",
            "kubegrace_route_inflight_requests{route=\"api\"} 2",
            "kubegrace_route_inflight_requests{route=\"default\"} 0",
        ],
    );
    assert!(
        !metrics.contains("kubegrace_breaker_state{route=\"default\"}"),
        "no breaker, no series"
    );
}

/// Admits one request and records the outcome.
async fn call(route: &Arc<Route>, outcome: UpstreamOutcome) -> Result<(), Rejection> {
    let mut permit = route.admit().await?;
    permit.record(outcome);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn failures_open_the_breaker_and_a_good_probe_closes_it() {
    let table = table(TWO_ROUTES);
    let api = table.select(&Method::GET, None, "/api");
    let error = UpstreamOutcome::Status(StatusCode::BAD_GATEWAY);
    for _ in 0..3 {
        call(&api, error).await.expect("closed");
    }
    let Err(rejection) = call(&api, UpstreamOutcome::Status(StatusCode::OK)).await else {
        panic!("three failures in a row open the breaker");
    };
    assert_eq!(rejection.reason(), "breaker_open");
    let response = api.fallback(&rejection);
    let retry_after = response.headers()["retry-after"]
        .to_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        retry_after == "1" || retry_after == "2",
        "a 1s open period with up to 10% jitter, rounded up: {retry_after}"
    );
    assert_eq!(table.snapshot()["routes"][0]["breaker"]["state"], "open");

    tokio::time::advance(Duration::from_millis(1200)).await;
    let mut probe = api.admit().await.expect("the probe goes through");
    assert_eq!(
        api.admit().await.err().map(|r| r.reason()),
        Some("breaker_open"),
        "one probe at a time"
    );
    probe.record(UpstreamOutcome::Status(StatusCode::OK));
    drop(probe);
    call(&api, UpstreamOutcome::Status(StatusCode::OK))
        .await
        .expect("closed again");

    let snapshot = table.snapshot();
    let transitions = &snapshot["routes"][0]["transitions"];
    assert_eq!(
        (
            transitions["open"].as_u64(),
            transitions["half_open"].as_u64(),
            transitions["closed"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
}

#[tokio::test(start_paused = true)]
async fn four_hundreds_and_cancellations_never_count() {
    let table = table(TWO_ROUTES);
    let api = table.select(&Method::GET, None, "/api");
    for _ in 0..10 {
        call(&api, UpstreamOutcome::Status(StatusCode::NOT_FOUND))
            .await
            .expect("4xx is not a failure");
        call(&api, UpstreamOutcome::Cancelled)
            .await
            .expect("cancelled is not a failure");
        // Dropped without an outcome: the drain or the client cut it.
        drop(api.admit().await.expect("admitted"));
    }
    assert_eq!(table.snapshot()["routes"][0]["breaker"]["state"], "closed");
}

#[tokio::test(start_paused = true)]
async fn only_the_first_record_counts() {
    let table = table(TWO_ROUTES);
    let api = table.select(&Method::GET, None, "/api");
    for _ in 0..3 {
        let mut permit = api.admit().await.expect("closed");
        permit.record(UpstreamOutcome::Status(StatusCode::OK));
        permit.record(UpstreamOutcome::ConnectError);
        permit.record(UpstreamOutcome::Timeout);
    }
    assert_eq!(
        table.snapshot()["routes"][0]["breaker"]["consecutiveFailures"],
        0
    );
}

#[tokio::test(start_paused = true)]
async fn fail_on_decides_what_counts() {
    let table = table(
        "routes: [{name: strict, circuitBreaker: {consecutiveFailures: 2, errorRatio: 0}, failOn: [503]}]",
    );
    let route = table.select(&Method::GET, None, "/");
    for _ in 0..5 {
        call(
            &route,
            UpstreamOutcome::Status(StatusCode::INTERNAL_SERVER_ERROR),
        )
        .await
        .expect("500 is not listed");
        call(&route, UpstreamOutcome::Timeout)
            .await
            .expect("timeout is not listed");
    }
    call(
        &route,
        UpstreamOutcome::Status(StatusCode::SERVICE_UNAVAILABLE),
    )
    .await
    .expect("first 503");
    call(
        &route,
        UpstreamOutcome::Status(StatusCode::SERVICE_UNAVAILABLE),
    )
    .await
    .expect("second 503 opens");
    assert!(
        call(&route, UpstreamOutcome::Status(StatusCode::OK))
            .await
            .is_err()
    );
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_state_only_when_breaker_settings_are_unchanged() {
    let old = table(TWO_ROUTES);
    let api = old.select(&Method::GET, None, "/api");
    for _ in 0..3 {
        call(&api, UpstreamOutcome::ConnectError)
            .await
            .expect("closed");
    }
    // Same breaker, different timeout and fallback: the breaker stays open.
    let same_breaker = old.reconfigure(&routes(&TWO_ROUTES.replace("timeout: 2s", "timeout: 3s")));
    let api = same_breaker.select(&Method::GET, None, "/api");
    assert_eq!(api.timeout(), Some(Duration::from_secs(3)));
    assert!(api.admit().await.is_err(), "still open after the reload");

    // A changed breaker starts fresh, but the counters carry on.
    let changed = same_breaker.reconfigure(&routes(
        &TWO_ROUTES.replace("maxConcurrent: 2", "maxConcurrent: 5"),
    ));
    let api = changed.select(&Method::GET, None, "/api");
    call(&api, UpstreamOutcome::Status(StatusCode::OK))
        .await
        .expect("fresh breaker is closed");
    metrics_with(
        &changed,
        &[
            "kubegrace_breaker_transitions_total{route=\"api\",to=\"open\"} 1",
            "kubegrace_concurrency_limit{route=\"api\"} 5",
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_queued_while_the_breaker_opens_is_rejected_once_it_gets_a_slot() {
    let table = table(
        "routes: [{name: one, circuitBreaker: {maxConcurrent: 1, maxQueue: 4, queueTimeout: 5s, consecutiveFailures: 1, errorRatio: 0}}]",
    );
    let route = table.select(&Method::GET, None, "/");
    let mut running = route.admit().await.expect("slot");
    let queued = {
        let route = route.clone();
        tokio::spawn(async move { route.admit().await.map(drop) })
    };
    tokio::task::yield_now().await;
    running.record(UpstreamOutcome::Timeout);
    drop(running);
    let outcome = queued.await.expect("task");
    assert!(
        matches!(outcome, Err(Rejection::BreakerOpen { .. })),
        "{outcome:?}"
    );
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    assert_eq!(retry_after_secs(Duration::ZERO), 1);
    assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
    assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
    assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
}

/// What `select` + `admit` + `record` + drop cost per request, with and
/// without a breaker. Not a test of behaviour: run it by hand with
/// `cargo test --release -p kubegrace-sidecar --lib hot_path -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "timing only; run by hand in release mode"]
async fn hot_path_cost() {
    let table = table(
        r#"
routes:
  - {name: static, match: {pathPrefix: /static, methods: [GET]}}
  - {name: guarded, match: {pathPrefix: /guarded}, circuitBreaker: {maxConcurrent: 64}}
  - {name: adaptive, match: {pathPrefix: /adaptive}, circuitBreaker: {maxConcurrent: 64, adaptive: true, minConcurrent: 2}}
"#,
    );
    const ROUNDS: u32 = 200_000;
    for path in ["/static/app.js", "/other", "/guarded/x", "/adaptive/x"] {
        let started = std::time::Instant::now();
        for _ in 0..ROUNDS {
            let route = table.select(&Method::GET, Some("example.com:8080"), path);
            let mut permit = route.admit().await.expect("sequential requests fit");
            permit.record(UpstreamOutcome::Status(StatusCode::OK));
        }
        let per_request = started.elapsed() / ROUNDS;
        println!("{path:>16}: {per_request:?} per request");
    }
}

#[test]
fn every_rejection_reason_has_its_own_counter() {
    let all = [
        Rejection::BreakerOpen {
            retry_after: Duration::ZERO,
        },
        Rejection::QueueFull,
        Rejection::QueueTimeout,
    ];
    assert_eq!(all.map(|r| r.reason()), Rejection::REASONS);
}
