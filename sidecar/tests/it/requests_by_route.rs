//! `kubegrace_requests_total{route,code_class}` counts each answer on the
//! route that matched it, on both HTTP/1 paths and HTTP/2 (the hyper path's
//! handler), the route's own fallbacks included; an answer given before
//! any route was chosen (an escaped slash, refused with 400) counts under
//! `route=""`.

use anyhow::{Context, Result, ensure};
use http::StatusCode;

use crate::kit::app::TestApp;
use crate::kit::http::{get, h2_connect, h2_get};
use crate::kit::sidecar::{InProcess, SidecarSpec};

/// `lim`'s breaker opens on its first failure and stays open.
const CONFIG: &str = r#"
routes:
  - name: api
    match: {pathPrefix: /api}
  - name: lim
    match: {pathPrefix: /lim}
    circuitBreaker: {consecutiveFailures: 1, errorRatio: 0, openFor: 60s, maxOpenFor: 60s}
"#;

fn series(route: &str, class: &str) -> String {
    format!("kubegrace_requests_total{{route=\"{route}\",code_class=\"{class}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_counts_on_the_route_that_matched_it() -> Result<()> {
    let app = TestApp::start("app").await?;
    app.control.fail(Some("/lim"));
    let sidecar = InProcess::start(SidecarSpec::to(&app).config(CONFIG)).await?;

    // HTTP/1.1: two on `api`, one on the catch-all, and on `lim` the app's
    // 500 that opens the breaker, then the route's own 503.
    for path in ["/api/a", "/api/b", "/elsewhere"] {
        get(sidecar.listen, path)
            .await?
            .expect(StatusCode::OK, path)?;
    }
    for want in [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        get(sidecar.listen, "/lim/x")
            .await?
            .expect(want, "/lim/x")?;
    }

    // HTTP/2: one on `api`, a fallback on `lim`, and an escaped slash that
    // no route sees.
    let (mut send, _conn) = h2_connect(sidecar.listen).await?;
    for (path, want) in [
        ("/api/c", StatusCode::OK),
        ("/lim/y", StatusCode::SERVICE_UNAVAILABLE),
        ("/api%2fd", StatusCode::BAD_REQUEST),
    ] {
        send = send.ready().await.context("h2 ready")?;
        let (answer, _) = send.send_request(h2_get(path)?, true)?;
        let status = answer.await.context("h2 answer")?.status();
        ensure!(status == want, "h2 {path}: {status}, expected {want}");
    }

    let metrics = sidecar.metrics().await?;
    for (route, class, want) in [
        ("api", "2xx", 3.0),
        ("default", "2xx", 1.0),
        ("lim", "5xx", 3.0),
        ("", "4xx", 1.0),
        ("api", "5xx", 0.0),
        ("lim", "2xx", 0.0),
    ] {
        let name = series(route, class);
        let got = metrics.get(&name);
        ensure!(got == Some(want), "{name} is {got:?}, expected {want}");
    }
    ensure!(
        metrics.sum("kubegrace_requests_total") == Some(8.0),
        "every answer once: {:?}",
        metrics.sum("kubegrace_requests_total")
    );
    Ok(())
}
