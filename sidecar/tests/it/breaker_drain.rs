//! Draining and breaking compose: requests the drain cuts at its deadline
//! are cancellations, never breaker failures. The route's breaker opens on
//! a single failure, so one miscounted cut would open it.

use std::sync::atomic::Ordering;
use std::time::Duration;

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
    let mut cut = 0;
    for request in requests {
        match request.await.context("request task")? {
            Ok(reply) if reply.status.is_success() => {
                anyhow::bail!("a 30s request finished within the drain")
            }
            _ => cut += 1,
        }
    }
    ensure!(cut == IN_FLIGHT);

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
