//! The demo app, as a real process on loopback, driven by real clients: HTTP/1.1 and h2c on
//! one port, gRPC, WebSocket, streamed bodies, the fault switch, `/stats`, bad input, and
//! what SIGTERM does (exit at once, cutting in-flight work; or ignore it).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use kubegrace_e2e::local_app::LocalApp;
use kubegrace_e2e::scenario::kit::{self, stat};

const T: Duration = Duration::from_secs(10);

/// The demo app on a free loopback port, named demo-0; killed when dropped.
async fn start_app(extra: &[&str]) -> Result<LocalApp> {
    LocalApp::start(env!("CARGO_BIN_EXE_kubegrace-demo-app"), "demo-0", extra).await
}

#[tokio::test]
async fn http1_and_h2c_share_the_port() -> Result<()> {
    let app = start_app(&[]).await?;
    let (status, _, body) = kit::http1(&app.addr, "GET", "/", T).await?;
    ensure!(status == 200 && body == "pod=demo-0\n", "{status} {body:?}");
    let (status, body) = kit::h2_get(&app.addr, "/delay?ms=20", T).await?;
    ensure!(
        status == 200 && body == "pod=demo-0 delayed_ms=20\n",
        "{status} {body:?}"
    );
    let (status, _, body) = kit::http1(&app.addr, "POST", "/api/orders", T).await?;
    ensure!(
        status == 200 && body == "pod=demo-0 path=/api/orders\n",
        "{status} {body:?}"
    );
    Ok(())
}

#[tokio::test]
async fn streams_grpc_and_websocket_run_to_the_end() -> Result<()> {
    let app = start_app(&[]).await?;
    let (stream, grpc, ws) = tokio::join!(
        kit::http_stream(&app.addr, 5, 20, T),
        kit::grpc_stream(&app.addr, 4, 20, T),
        kit::websocket(&app.addr, 5, Duration::from_millis(20), T),
    );
    for s in [&stream, &grpc, &ws] {
        ensure!(s.finished(), "{s}");
        ensure!(s.pod.as_deref() == Some("demo-0"), "{s}");
    }
    // Binary frames echo too (the kit's session speaks text).
    let request = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://{}/ws", app.addr),
    )?;
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await?;
    use futures_util::{SinkExt, StreamExt};
    let payload = vec![0u8, 1, 2, 255];
    ws.send(tokio_tungstenite::tungstenite::Message::binary(
        payload.clone(),
    ))
    .await?;
    match ws.next().await {
        Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(b))) if b[..] == payload[..] => {}
        other => bail!("binary echo: {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn the_fault_switch_fails_app_paths_and_stats_count_them() -> Result<()> {
    let app = start_app(&[]).await?;
    for _ in 0..3 {
        kit::http1(&app.addr, "GET", "/api/a", T).await?;
    }
    let stats = kit::app_stats(&app.addr).await?;
    ensure!(stat(&stats, "/api", "requests") == 3, "{stats}");
    ensure!(stat(&stats, "/api", "inflight") == 0, "{stats}");

    // Scoped to /api: other paths keep working.
    let (status, _, body) = kit::http1(&app.addr, "POST", "/fault?status=503&path=/api", T).await?;
    ensure!(status == 200, "{status} {body}");
    let (status, _, body) = kit::http1(&app.addr, "GET", "/api/a", T).await?;
    ensure!(
        status == 503 && body.contains("fault=503"),
        "{status} {body}"
    );
    let (status, _, _) = kit::http1(&app.addr, "GET", "/", T).await?;
    ensure!(status == 200, "/ under an /api fault: {status}");

    // Everywhere: gRPC answers UNAVAILABLE; probes and control endpoints never fault.
    kit::set_fault(&app.addr, Some(500)).await?;
    let (status, _, _) = kit::http1(&app.addr, "GET", "/", T).await?;
    ensure!(status == 500, "/ under a global fault: {status}");
    let grpc = kit::grpc_stream(&app.addr, 2, 0, T).await;
    ensure!(
        !grpc.finished()
            && grpc
                .error
                .as_deref()
                .is_some_and(|e| e.contains("Unavailable")),
        "{grpc}"
    );
    let (status, _, _) = kit::http1(&app.addr, "GET", "/healthz", T).await?;
    ensure!(status == 200, "/healthz under a fault: {status}");
    let stats = kit::app_stats(&app.addr).await?;
    ensure!(stats["fault"]["status"] == 500, "{stats}");
    ensure!(stat(&stats, "/api", "requests") == 4, "{stats}");
    ensure!(stat(&stats, "/", "requests") == 2, "{stats}");
    ensure!(
        stat(&stats, "grpc /kubegrace.demo.Echo/Stream", "requests") == 1,
        "{stats}"
    );

    kit::set_fault(&app.addr, None).await?;
    let (status, _, _) = kit::http1(&app.addr, "GET", "/api/a", T).await?;
    ensure!(status == 200, "after the fault is off: {status}");
    let stats = kit::app_stats(&app.addr).await?;
    ensure!(stats["fault"].is_null(), "{stats}");
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_a_4xx() -> Result<()> {
    let app = start_app(&[]).await?;
    for (method, path, want) in [
        ("GET", "/delay?ms=soon", 400),
        ("GET", "/stream?chunks=-1", 400),
        ("POST", "/fault?status=abc", 400),
        ("POST", "/fault?status=200", 400),
        ("POST", "/fault?status=503&path=api", 400),
        ("PUT", "/fault", 405),
        ("POST", "/stats", 405),
        ("DELETE", "/api/x", 405),
        ("GET", "/ws", 400),
        ("GET", "/nowhere", 404),
    ] {
        let (status, _, body) = kit::http1(&app.addr, method, path, T).await?;
        ensure!(
            status == want,
            "{method} {path}: {status} {body:?}, want {want}"
        );
    }
    // Still serving.
    let (status, _, _) = kit::http1(&app.addr, "GET", "/", T).await?;
    ensure!(status == 200);
    Ok(())
}

#[tokio::test]
async fn sigterm_exits_at_once_and_cuts_what_is_in_flight() -> Result<()> {
    let mut app = start_app(&[]).await?;
    let addr = app.addr.clone();
    let long = tokio::spawn(async move { kit::long_request(&addr, 30_000, T).await });
    let addr = app.addr.clone();
    let ws = tokio::spawn(async move {
        kit::websocket(
            &addr,
            100,
            Duration::from_millis(100),
            Duration::from_secs(30),
        )
        .await
    });
    // In flight: the app itself says so.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let s = kit::app_stats(&app.addr).await?;
        if stat(&s, "/delay", "inflight") == 1 && stat(&s, "/ws", "inflight") == 1 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "never in flight: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.sigterm()?;
    let status = tokio::time::timeout(T, app.child().wait())
        .await
        .context("the app did not exit on SIGTERM")??;
    ensure!(status.success(), "exit status {status}");
    let (long, ws) = (long.await?, ws.await?);
    ensure!(!long.finished() && long.error.is_some(), "{long}");
    ensure!(!ws.finished() && ws.error.is_some(), "{ws}");
    Ok(())
}

#[tokio::test]
async fn sigterm_ignored_keeps_serving() -> Result<()> {
    let app = start_app(&["--on-sigterm", "ignore"]).await?;
    let addr = app.addr.clone();
    let long = tokio::spawn(async move { kit::long_request(&addr, 300, T).await });
    let deadline = tokio::time::Instant::now() + T;
    while stat(&kit::app_stats(&app.addr).await?, "/delay", "inflight") == 0 {
        ensure!(tokio::time::Instant::now() < deadline, "never in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.sigterm()?;
    let long = long.await?;
    ensure!(long.finished(), "{long}");
    let (status, _, _) = kit::http1(&app.addr, "GET", "/", T).await?;
    ensure!(status == 200);
    Ok(())
}

/// A failing liveness check is all the switch breaks: `/livez` answers 500, everything else
/// keeps serving, and switching it back restores `/livez`.
#[tokio::test]
async fn the_demo_apps_liveness_switch_fails_only_livez() -> Result<()> {
    let app = start_app(&[]).await?;
    let addr = app.addr.as_str();
    ensure!(kit::http1(addr, "GET", "/livez", T).await?.0 == 200);
    ensure!(kit::http1(addr, "POST", "/liveness?fail", T).await?.0 == 200);
    ensure!(kit::http1(addr, "GET", "/livez", T).await?.0 == 500);
    // Everything else keeps serving: a deadlocked health checker, not a dead app.
    ensure!(kit::http1(addr, "GET", "/", T).await?.0 == 200);
    ensure!(kit::http1(addr, "GET", "/healthz", T).await?.0 == 200);
    ensure!(kit::http1(addr, "GET", "/liveness?fail", T).await?.0 == 405);
    ensure!(kit::http1(addr, "POST", "/liveness", T).await?.0 == 400);
    ensure!(kit::http1(addr, "POST", "/liveness?ok", T).await?.0 == 200);
    ensure!(kit::http1(addr, "GET", "/livez", T).await?.0 == 200);
    Ok(())
}
