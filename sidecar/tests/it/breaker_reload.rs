//! Breaker state across a config reload: a reload that leaves a route's
//! `circuitBreaker` settings alone keeps the live breaker (an open breaker
//! stays open); one that changes them starts the route afresh.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::http::Pool;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wait_for;
use anyhow::{Context, Result, ensure};

fn config(timeout: &str, max_concurrent: u32) -> String {
    format!(
        "routes:\n  - name: api\n    match: {{pathPrefix: /api}}\n    timeout: {timeout}\n    circuitBreaker: \
         {{maxConcurrent: {max_concurrent}, consecutiveFailures: 3, errorRatio: 0, openFor: 1m, maxOpenFor: 1m}}\n"
    )
}

/// Rewrites the config file and reloads it (what SIGHUP does).
fn reload(sidecar: &InProcess, text: &str) -> Result<()> {
    std::fs::write(sidecar.config_path.as_ref().context("config file")?, text)?;
    sidecar.lib().reload();
    Ok(())
}

async fn wait_for_route(
    sidecar: &InProcess,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    wait_for(what, Duration::from_secs(10), || async {
        let route = sidecar.route("api").await.ok()?;
        check(&route).then_some(route)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_survives_a_reload_that_does_not_touch_it() -> Result<()> {
    let client = Pool::new();
    let app = TestApp::with_capacity(32, Duration::from_millis(1)).await?;
    app.control.fail(Some("/api"));
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(&config("5s", 50))).await?;
    for _ in 0..3 {
        client.get(&sidecar.url("/api/x")).await?;
    }
    let reply = client.get(&sidecar.url("/api/x")).await?;
    ensure!(
        reply.fallback.as_deref() == Some("breaker_open"),
        "three failures open the breaker"
    );

    // Same breaker, other timeout: still open.
    reload(&sidecar, &config("7s", 50))?;
    let route = wait_for_route(&sidecar, "the new timeout", |r| r["timeoutMs"] == 7000).await?;
    ensure!(
        route["breaker"]["state"] == "open",
        "reload must not close the breaker: {route}"
    );
    let reply = client.get(&sidecar.url("/api/x")).await?;
    ensure!(
        reply.fallback.as_deref() == Some("breaker_open"),
        "still serving fallbacks"
    );
    ensure!(
        app.control.received_for("api") == 3,
        "the app saw only the three failures"
    );

    // Changed breaker settings: a fresh, closed breaker with the new limit.
    reload(&sidecar, &config("7s", 60))?;
    let route = wait_for_route(&sidecar, "the new limit", |r| r["limiter"]["limit"] == 60).await?;
    ensure!(
        route["breaker"]["state"] == "closed",
        "new settings, new breaker: {route}"
    );
    ensure!(
        route["transitions"]["open"] == 1,
        "counters carry on across the reload: {route}"
    );
    Ok(())
}
