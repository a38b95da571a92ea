//! The keep-alive idle race: an app that closes idle keep-alive
//! connections (Node.js' keepAliveTimeout) loses the request that arrives
//! on a connection just as it gives up on it. A client that reuses
//! connections for about the app's idle timeout hits that window; the
//! sidecar's upstream pool must drop idle connections before the app does
//! (`upstreamPool.idleTimeout` below the app's), so downstream clients
//! never see it.

use std::time::Duration;

use crate::kit::app::TestApp;
use crate::kit::sidecar::{InProcess, SidecarSpec};
use anyhow::{Result, ensure};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The app's keep-alive timeout (Node's 5s, scaled down).
const APP_IDLE: Duration = Duration::from_millis(100);
const CLIENTS: u32 = 8;
const REQUESTS_PER_CLIENT: u32 = 40;
/// Runs of the direct baseline, at most, until one loses a request.
const BASELINE_TRIES: u32 = 3;

#[derive(Debug, Default)]
struct Tally {
    sent: u32,
    failed: u32,
    details: Vec<String>,
}

/// `CLIENTS` keep-alive clients, each pausing about the app's idle timeout
/// (a few ms either side) between requests; a failed connection is
/// replaced, and the failure counted.
async fn run_clients(addr: std::net::SocketAddr) -> Result<Tally> {
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut conn = None;
            for i in 0..REQUESTS_PER_CLIENT {
                // Sweep the pause across the app's timeout, -4ms..+3ms.
                let jitter = ((i + client) % 8) as i64 - 4;
                let pause = APP_IDLE.as_millis() as i64 + jitter;
                tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                if conn.as_ref().is_none_or(
                    |c: &hyper::client::conn::http1::SendRequest<Empty<Bytes>>| c.is_closed(),
                ) {
                    let tcp = TcpStream::connect(addr).await?;
                    let (sender, driver) =
                        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
                    tokio::spawn(driver);
                    conn = Some(sender);
                }
                let Some(sender) = conn.as_mut() else {
                    continue;
                };
                tally.sent += 1;
                let req = Request::get("/")
                    .header("host", "app")
                    .body(Empty::<Bytes>::new())?;
                let outcome = async {
                    sender.ready().await?;
                    let resp = sender.send_request(req).await?;
                    let status = resp.status();
                    resp.into_body().collect().await?;
                    Ok::<_, hyper::Error>(status)
                }
                .await;
                match outcome {
                    Ok(status) if status.is_success() => {}
                    Ok(status) => {
                        tally.failed += 1;
                        tally.details.push(format!("status {status}"));
                    }
                    Err(e) => {
                        tally.failed += 1;
                        tally.details.push(format!("{e}"));
                        conn = None;
                    }
                }
            }
            Ok::<_, anyhow::Error>(tally)
        }));
    }
    let mut total = Tally::default();
    for task in tasks {
        let part = tokio::time::timeout(Duration::from_secs(60), task).await???;
        total.sent += part.sent;
        total.failed += part.failed;
        total.details.extend(part.details);
    }
    Ok(total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_pool_idle_timeout_below_the_apps_hides_the_keep_alive_race() -> Result<()> {
    // The race is a few milliseconds wide: alone among the timing-sensitive tests.
    let _timing = crate::kit::timing_sensitive().await;
    // Baseline: clients straight to the app. The window is a few
    // milliseconds wide, and on a loaded machine the clients' pauses
    // stretch past it; up to three tries show the loss (the sidecar's
    // run below gets one).
    let mut direct = Tally::default();
    let mut direct_idle_closes = 0;
    for _ in 0..BASELINE_TRIES {
        let app = TestApp::start_idle_closing(APP_IDLE).await?;
        let run = run_clients(app.addr).await?;
        direct_idle_closes += app.idle_closes();
        direct.sent += run.sent;
        direct.failed += run.failed;
        direct.details.extend(run.details);
        if direct.failed > 0 {
            break;
        }
    }

    // Through the sidecar with its default pool (idle 4s, longer than the app's).
    let app = TestApp::start_idle_closing(APP_IDLE).await?;
    let sidecar = InProcess::start(SidecarSpec::new(app.addr)).await?;
    let default_pool = run_clients(sidecar.listen).await?;
    drop((sidecar, app));

    // Through the sidecar with the pool idle timeout below the app's.
    let app = TestApp::start_idle_closing(APP_IDLE).await?;
    let sidecar =
        InProcess::start(SidecarSpec::new(app.addr).config("upstreamPool: {idleTimeout: 50ms}\n"))
            .await?;
    let tuned = run_clients(sidecar.listen).await?;
    let tuned_idle_closes = app.idle_closes();
    let tuned_connections = app
        .stats
        .connections
        .load(std::sync::atomic::Ordering::SeqCst);

    println!(
        "keep-alive race: direct {}/{} failed ({direct_idle_closes} idle closes by the app) {:?}; \
         sidecar default pool {}/{} failed {:?}; sidecar pool idle 50ms {}/{} failed ({tuned_connections} upstream connections, \
         {tuned_idle_closes} idle closes by the app)",
        direct.failed,
        direct.sent,
        direct.details.iter().take(3).collect::<Vec<_>>(),
        default_pool.failed,
        default_pool.sent,
        default_pool.details.iter().take(3).collect::<Vec<_>>(),
        tuned.failed,
        tuned.sent
    );
    // The race is real: a plain keep-alive client loses requests to it.
    ensure!(
        direct.failed > 0,
        "the direct baseline lost nothing ({} idle closes), so this proves nothing",
        direct_idle_closes
    );
    // The default pool (4s) is meant for apps idling out after 5s (Node);
    // it is reported above, not asserted, against this 100ms app.
    ensure!(
        tuned.failed == 0,
        "requests failed through a sidecar whose pool idles out first: {:?}",
        tuned.details
    );
    // And not by giving up on keep-alive: connections are still reused (one per request
    // would be `sent`). About 127 for 320 on a quiet machine; 160 when two builds shared
    // the two cores, since the clients' pauses stretch past the pool's 50ms; the bound
    // leaves room for that and still fails a pool that never reuses.
    ensure!(
        tuned_connections < u64::from(tuned.sent) * 3 / 4,
        "the sidecar opened {tuned_connections} upstream connections for {} requests",
        tuned.sent
    );
    Ok(())
}
