//! Per-route isolation: a failing `/api` opens its own breaker
//! and leaves `/`'s alone. The baseline, both paths under one route, shows
//! what isolation prevents: the failing half takes the healthy half down.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::http::Pool;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use anyhow::{Result, ensure};
use hyper::StatusCode;

const BREAKER: &str =
    "{consecutiveFailures: 5, errorRatio: 0.5, minRequests: 10, openFor: 30s, maxOpenFor: 30s}";
const ROUNDS: u32 = 40;

struct Outcome {
    page_ok: u32,
    page_fallbacks: u32,
    api_fallbacks: u32,
}

/// Interleaves a failing `/api` call and a healthy `/page` call.
async fn interleave(sidecar: &InProcess, client: &Pool) -> Result<Outcome> {
    let mut outcome = Outcome {
        page_ok: 0,
        page_fallbacks: 0,
        api_fallbacks: 0,
    };
    for _ in 0..ROUNDS {
        let api = client.get(&sidecar.url("/api/orders")).await?;
        outcome.api_fallbacks += u32::from(api.fallback.is_some());
        let page = client.get(&sidecar.url("/page")).await?;
        match (page.status, page.fallback) {
            (StatusCode::OK, None) => outcome.page_ok += 1,
            (_, Some(_)) => outcome.page_fallbacks += 1,
            (status, None) => anyhow::bail!("/page answered {status}"),
        }
    }
    Ok(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_route_does_not_open_another_routes_breaker() -> Result<()> {
    let client = Pool::new();

    let app = TestApp::with_capacity(32, Duration::from_millis(1)).await?;
    app.control.fail(Some("/api"));
    let config = format!(
        "routes:\n  - {{name: api, match: {{pathPrefix: /api}}, circuitBreaker: {BREAKER}}}\n  - {{name: root, match: {{pathPrefix: /}}, circuitBreaker: {BREAKER}}}\n"
    );
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(&config)).await?;
    let isolated = interleave(&sidecar, &client).await?;
    let api = sidecar.route("api").await?;
    let root = sidecar.route("root").await?;
    let page_hits = app.control.received_for("page");
    drop(sidecar);

    // Baseline: one route for both paths.
    let shared_config = format!(
        "routes:\n  - {{name: shared, match: {{pathPrefix: /}}, circuitBreaker: {BREAKER}}}\n"
    );
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(&shared_config)).await?;
    let shared = interleave(&sidecar, &client).await?;

    println!(
        "isolated: /page {} ok, {} fallbacks; /api {} fallbacks\n\
         shared:   /page {} ok, {} fallbacks; /api {} fallbacks",
        isolated.page_ok,
        isolated.page_fallbacks,
        isolated.api_fallbacks,
        shared.page_ok,
        shared.page_fallbacks,
        shared.api_fallbacks
    );
    ensure!(
        api["breaker"]["state"] == "open",
        "the failing route opened: {api}"
    );
    ensure!(
        root["breaker"]["state"] == "closed",
        "the healthy route stayed closed: {root}"
    );
    ensure!(root["transitions"]["open"] == 0, "{root}");
    ensure!(
        isolated.page_ok == ROUNDS && page_hits == u64::from(ROUNDS),
        "every /page request served by the app"
    );
    ensure!(
        isolated.api_fallbacks >= ROUNDS - 5,
        "/api opened after 5 failures: {}",
        isolated.api_fallbacks
    );
    ensure!(
        shared.page_fallbacks >= ROUNDS / 2,
        "the baseline must show the damage: {}",
        shared.page_fallbacks
    );
    Ok(())
}
