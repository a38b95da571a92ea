//! Draining and breaking compose: requests the drain cuts at its deadline
//! are cancellations, never breaker failures. The route's breaker opens on
//! a single failure, so one miscounted cut would open it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::http::Pool;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use crate::kit::wait_for;
use anyhow::{Context, Result, ensure};

const CONFIG: &str = r#"
drain: {minDelay: 0s, quiet: 100ms, maxDelay: 1s, timeout: 500ms}
routes:
  - name: slow
    match: {pathPrefix: /slow}
    circuitBreaker: {consecutiveFailures: 1, errorRatio: 0}
"#;

const IN_FLIGHT: u32 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cut_by_the_drain_never_count_as_failures() -> Result<()> {
    let client = Pool::new();
    // Requests take far longer than the drain's timeout.
    let app = TestApp::with_capacity(32, Duration::from_secs(30)).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr).config(CONFIG)).await?;

    let mut requests = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (client, url) = (client.clone(), sidecar.url("/slow/report"));
        requests.push(tokio::spawn(async move { client.get(&url).await }));
    }
    wait_for(
        "the slow requests to reach the app",
        Duration::from_secs(10),
        || async { (app.control.inside.load(Ordering::Relaxed) == IN_FLIGHT).then_some(()) },
    )
    .await?;

    let drain = client
        .get(&format!("http://{}/drain", sidecar.admin))
        .await?;
    ensure!(
        drain.status.is_success(),
        "/drain answered {}",
        drain.status
    );
    // Cut by the drain: each request ends without any answer (its
    // connection dropped at the drain's deadline), and the drain counts
    // each connection it cut as force-closed. An answer of any status (a
    // 502 or 503 of the sidecar's) would be something other than a cut.
    for request in requests {
        if let Ok(reply) = request.await.context("request task")? {
            anyhow::bail!(
                "a request was answered {} instead of cut by the drain",
                reply.status
            );
        }
    }
    let forced = sidecar
        .wait_metric("kubegrace_drain_force_closed_total", WAIT, |n| {
            n >= f64::from(IN_FLIGHT)
        })
        .await?;
    ensure!(
        forced == f64::from(IN_FLIGHT),
        "the drain counted {forced} connections force-closed, it cut {IN_FLIGHT}"
    );

    let route = wait_for(
        "the cut requests to be released",
        Duration::from_secs(10),
        || async {
            let route = sidecar.route("slow").await.ok()?;
            (route["inflight"] == 0).then_some(route)
        },
    )
    .await?;
    println!("after the drain: {route}");
    ensure!(
        route["breaker"]["state"] == "closed",
        "a drain is not the app's failure: {route}"
    );
    ensure!(route["breaker"]["window"]["failures"] == 0, "{route}");
    ensure!(route["breaker"]["consecutiveFailures"] == 0, "{route}");
    Ok(())
}
