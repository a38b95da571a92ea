//! HTTP/2 and gRPC streams in flight when the drain starts complete; the
//! client is told with GOAWAY and moves its new streams to a new connection;
//! no stream is reset before the drain timeout (GOAWAY stops new streams, it
//! must not cut the old ones).

use std::time::Duration;

use crate::kit::WAIT;
use crate::kit::app::TestApp;
use crate::kit::grpc::{ProstCodec, TICKS_PATH, Tick, TicksRequest};
use crate::kit::http::{h2_connect, h2_get, h2_read_body};
use crate::kit::sidecar::drain_flags;
use crate::kit::sidecar::{Sidecar, SidecarSpec};
use crate::kit::within;
use anyhow::{Context, Result, bail, ensure};
use http::StatusCode;

/// Streams last ~1.5s; the drain timeout is well above that, so nothing may
/// be cut.
const DRAIN: &[&str] = &drain_flags("300ms", "200ms", "3s", "10s");

/// A pod: app `name` behind a sidecar. The tests drain pod "a"; new
/// streams move to pod "b".
async fn pod(name: &str) -> Result<(TestApp, Sidecar)> {
    let app = TestApp::start(name).await?;
    let sidecar = Sidecar::start(SidecarSpec::new(app.addr).args(DRAIN)).await?;
    Ok((app, sidecar))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_in_flight_complete_and_new_streams_move_after_goaway() -> Result<()> {
    let (_app_a, a) = pod("a").await?;
    let (_app_b, b) = pod("b").await?;

    let (mut send, conn) = h2_connect(a.listen).await?;
    // In flight when the drain starts: bodies half sent, and heads not yet sent.
    let mut streaming = Vec::new();
    for _ in 0..3 {
        let (resp, _) = send.send_request(h2_get("/stream?chunks=15&ms=100")?, true)?;
        streaming.push(resp);
    }
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (resp, _) = send.send_request(h2_get("/work?ms=1500")?, true)?;
        waiting.push(tokio::spawn(async move {
            let resp = resp.await?;
            let status = resp.status();
            let body = h2_read_body(resp.into_body()).await?;
            Ok::<_, h2::Error>((status, body))
        }));
    }
    let mut bodies = Vec::new();
    for resp in streaming {
        let resp = within("stream head", WAIT, resp).await??;
        ensure!(
            resp.status() == StatusCode::OK,
            "stream answered {}",
            resp.status()
        );
        let mut body = resp.into_body();
        // The first chunk proves the stream is mid-body.
        let first = within("first chunk", WAIT, body.data())
            .await?
            .context("stream ended early")??;
        let _ = body.flow_control().release_capacity(first.len());
        bodies.push(tokio::spawn(async move {
            let mut all = first.to_vec();
            all.extend(h2_read_body(body).await?);
            Ok::<_, h2::Error>(all)
        }));
    }

    a.start_drain().await?;

    // Keep opening short streams on the old connection, like a client with
    // a steady trickle of calls: each must succeed until GOAWAY arrives;
    // after it, new streams go to a new connection (pod b).
    let mut served_while_draining = 0;
    let goaway = loop {
        match send.send_request(h2_get("/work")?, true) {
            Ok((resp, _)) => {
                let resp = within("short stream while draining", WAIT, resp)
                    .await?
                    .context("a new stream sent before GOAWAY was reset")?;
                ensure!(
                    resp.status() == StatusCode::OK,
                    "short stream answered {}",
                    resp.status()
                );
                h2_read_body(resp.into_body())
                    .await
                    .context("short stream body reset")?;
                served_while_draining += 1;
            }
            Err(e) if e.is_go_away() => break e,
            Err(e) => bail!("new stream refused without GOAWAY: {e} ({e:?})"),
        }
        ensure!(
            served_while_draining < 2_000,
            "no GOAWAY after {served_while_draining} streams"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    ensure!(
        goaway.reason() == Some(h2::Reason::NO_ERROR),
        "GOAWAY was not graceful: {goaway:?}"
    );
    let (mut send_b, _conn_b) = h2_connect(b.listen).await?;
    let (resp, _) = send_b.send_request(h2_get("/work")?, true)?;
    let resp = within("stream on the new connection", WAIT, resp).await??;
    ensure!(
        resp.status() == StatusCode::OK,
        "pod b answered {}",
        resp.status()
    );

    // Every stream that was in flight completes, none reset.
    for body in bodies {
        let body = within("in-flight stream", WAIT, body)
            .await??
            .context("in-flight stream was reset")?;
        let text = String::from_utf8_lossy(&body);
        ensure!(text.lines().count() == 15, "stream was cut short: {text:?}");
    }
    for resp in waiting {
        let (status, body) = within("in-flight request", WAIT, resp)
            .await??
            .context("in-flight request was reset")?;
        ensure!(
            status == StatusCode::OK,
            "in-flight request answered {status}"
        );
        ensure!(
            body.starts_with(b"ok a"),
            "unexpected body {:?}",
            String::from_utf8_lossy(&body)
        );
    }
    // Then the server closes the connection cleanly.
    within("old connection to close", WAIT, conn)
        .await??
        .context("old connection ended with an error")?;

    a.wait_phase(3.0).await?;
    a.expect_nothing_force_closed("streams were force-closed")
        .await?;
    println!(
        "h2: {served_while_draining} new streams served on the old connection between the drain trigger and GOAWAY"
    );
    drop(b);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_server_streams_in_flight_complete_on_sigterm() -> Result<()> {
    let (_app, mut sidecar) = Sidecar::with_app(DRAIN).await?;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.listen))?
        .connect()
        .await
        .context("gRPC connect through the sidecar")?;
    const TICKS: u32 = 20;
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut client = tonic::client::Grpc::new(channel.clone());
        within("gRPC client ready", WAIT, client.ready()).await??;
        let request = tonic::Request::new(TicksRequest {
            count: TICKS,
            interval_ms: 75,
        });
        let response = within(
            "gRPC call",
            WAIT,
            client.server_streaming(
                request,
                http::uri::PathAndQuery::from_static(TICKS_PATH),
                ProstCodec::<TicksRequest, Tick>::default(),
            ),
        )
        .await??;
        let mut stream = response.into_inner();
        // The first message proves the stream is in flight.
        let first = within("first tick", WAIT, stream.message())
            .await??
            .context("no first tick")?;
        calls.push(tokio::spawn(async move {
            let mut seqs = vec![first.seq];
            while let Some(tick) = stream.message().await? {
                seqs.push(tick.seq);
            }
            Ok::<_, tonic::Status>(seqs)
        }));
    }

    sidecar.signal("TERM")?;
    for call in calls {
        let seqs = within("gRPC stream", WAIT, call)
            .await??
            .map_err(|status| anyhow::anyhow!("gRPC stream failed: {status:?}"))?;
        ensure!(
            seqs == (0..TICKS).collect::<Vec<_>>(),
            "stream was cut or reordered: {seqs:?}"
        );
    }
    sidecar.exits_cleanly().await?;
    match sidecar.drain_summary() {
        Some((_, 0)) => Ok(()),
        other => bail!("drain summary {other:?}; logs:\n{}", sidecar.logs_text()),
    }
}

/// Many streams opened concurrently while GOAWAY goes out: with a two-phase
/// GOAWAY the client learns to stop before the server fixes its last stream
/// id, so no stream the client opened is refused or reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_concurrent_streams_across_goaway_are_never_refused() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    let (_app_a, a) = pod("a").await?;
    let (_app_b, b) = pod("b").await?;
    let (send_a, conn_a) = h2_connect(a.listen).await?;
    let b_listen = b.listen;

    const WORKERS: u32 = 8;
    const PER_WORKER: u32 = 80;
    let done = Arc::new(AtomicU32::new(0));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let mut send = send_a.clone();
        let done = done.clone();
        workers.push(tokio::spawn(async move {
            let mut on_b = false;
            let mut failures = Vec::new();
            let mut served = [0u32; 2];
            for _ in 0..PER_WORKER {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let req = h2_get("/work?ms=10")?;
                let sent = match send.clone().ready().await {
                    Ok(mut ready) => ready.send_request(req, true),
                    Err(e) => Err(e),
                };
                let resp = match sent {
                    Ok((resp, _)) => resp,
                    Err(e) if e.is_go_away() && !on_b => {
                        // Told to go away before opening: move, like a client should.
                        let (send_b, _) = h2_connect(b_listen).await?;
                        send = send_b;
                        on_b = true;
                        let (resp, _) = send.send_request(h2_get("/work?ms=10")?, true)?;
                        resp
                    }
                    Err(e) => {
                        failures.push(format!("open: {e}"));
                        continue;
                    }
                };
                match tokio::time::timeout(WAIT, resp).await {
                    Ok(Ok(r)) if r.status() == StatusCode::OK => {
                        match h2_read_body(r.into_body()).await {
                            Ok(_) => served[usize::from(on_b)] += 1,
                            Err(e) => failures.push(format!("body: {e}")),
                        }
                    }
                    Ok(Ok(r)) => failures.push(format!("status {}", r.status())),
                    Ok(Err(e)) => failures.push(format!("stream: {e} ({e:?})")),
                    Err(_) => failures.push("timeout".into()),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, anyhow::Error>((served, failures))
        }));
    }
    crate::kit::wait_for("warm-up streams", WAIT, || async {
        (done.load(Ordering::SeqCst) >= 100).then_some(())
    })
    .await?;
    a.start_drain().await?;

    let mut failures = Vec::new();
    let mut served = [0u32; 2];
    for worker in workers {
        let (s, f) = within("h2 worker", WAIT * 2, worker).await???;
        served[0] += s[0];
        served[1] += s[1];
        failures.extend(f);
    }
    println!(
        "h2 concurrent: {} streams on the draining pod, {} moved to pod b, {} failed {:?}",
        served[0],
        served[1],
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(
        failures.is_empty(),
        "streams failed across GOAWAY: {failures:?}"
    );
    ensure!(
        served[1] > 0,
        "no worker ever moved to pod b: GOAWAY never came"
    );
    within("old connection to close", WAIT, conn_a)
        .await??
        .context("old connection ended with an error")?;
    Ok(())
}
