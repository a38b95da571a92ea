//! `/ready` answers from state the sidecar keeps current in the
//! background: a burst of concurrent probes never queues behind the app's
//! own check, however slowly or quickly that check fails. (Before, the
//! check ran inside `/ready` under a lock: with a fast-failing check, 8
//! concurrent probes and one more, the last was answered after 5.9 s; the
//! kubelet gives up after 1 s.) And `GET /config` never shows the check's
//! header values.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::kit::app::TestApp;
use crate::kit::sidecar::{Sidecar, SidecarSpec};

/// A health endpoint on loopback: every request is counted when it
/// arrives, answered with `status` after `delay`, and counted again once
/// answered.
struct Health {
    port: u16,
    received: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Health {
    async fn start(status: u16, delay: Duration) -> Result<Health> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let received = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let (r, a) = (received.clone(), answered.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (r, a) = (r.clone(), a.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    r.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    let head = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
                    a.fetch_add(1, Ordering::SeqCst);
                    let _ = conn.write_all(head.as_bytes()).await;
                });
            }
        });
        Ok(Health {
            port,
            received,
            answered,
            task,
        })
    }

    fn check_json(&self, timeout_seconds: u32) -> String {
        format!(
            r#"{{"port":{},"path":"/healthz","timeoutSeconds":{timeout_seconds},"headers":[{{"name":"Authorization","value":"Bearer s3cr3t"}}]}}"#,
            self.port
        )
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The test app, a health endpoint answering `status` after `delay`, and
/// a sidecar (not waited ready) whose readiness checks of the app go to
/// that endpoint with `timeoutSeconds: timeout_seconds`.
async fn checked_app(
    status: u16,
    delay: Duration,
    timeout_seconds: u32,
) -> Result<(TestApp, Health, Sidecar)> {
    let app = TestApp::start("a").await?;
    let health = Health::start(status, delay).await?;
    let check = health.check_json(timeout_seconds);
    let sidecar =
        Sidecar::start_unready(SidecarSpec::to(&app).args(&["--app-readiness", &check])).await?;
    Ok((app, health, sidecar))
}

/// 8 concurrent `/ready`, then one more: every answer, as seen by `during`
/// (called when each answer arrives).
async fn burst(sidecar: &Sidecar, during: impl Fn() -> u64) -> Result<Vec<(StatusCode, u64)>> {
    let mut calls = Vec::new();
    for _ in 0..8 {
        calls.push(async {
            let resp = sidecar.admin_get("/ready").await?;
            Ok::<_, anyhow::Error>((resp.status, during()))
        });
    }
    let mut seen = Vec::new();
    for answer in futures_util::future::join_all(calls).await {
        seen.push(answer?);
    }
    let last = sidecar.admin_get("/ready").await?;
    seen.push((last.status, during()));
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_before_a_slow_app_check_could_answer() -> Result<()> {
    // Each check takes 4 s (within its 5 s timeout).
    let (_app, health, sidecar) = checked_app(200, Duration::from_secs(4), 5).await?;
    // Wait until a check is in flight, so the burst meets one.
    let received = health.received.clone();
    while received.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answered = health.answered.clone();
    let seen = burst(&sidecar, || answered.load(Ordering::SeqCst)).await?;
    // Every probe was answered while no check had been answered yet: none
    // of them waited for the app. Not ready, since no check passed yet.
    for (i, (status, checks_answered)) in seen.iter().enumerate() {
        ensure!(
            *checks_answered == 0,
            "probe {i} was answered only after the app answered a check: it waited ({seen:?})"
        );
        ensure!(
            *status == StatusCode::SERVICE_UNAVAILABLE,
            "probe {i}: {status}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_never_queue_behind_a_fast_failing_app_check() -> Result<()> {
    let (_app, health, sidecar) = checked_app(503, Duration::ZERO, 1).await?;
    let received = health.received.clone();
    let before = received.load(Ordering::SeqCst);
    let seen = burst(&sidecar, || received.load(Ordering::SeqCst)).await?;
    // A probe that ran the check itself retried it for 700 ms (14 checks)
    // and the others queued behind it. From state, the whole burst sees at
    // most the background's own few checks (one per 50 ms at this stage).
    let most = seen.iter().map(|(_, n)| n - before).max().unwrap_or(0);
    ensure!(
        most < 14,
        "{most} checks ran while 9 probes were answered: the probes ran them ({seen:?})"
    );
    for (i, (status, _)) in seen.iter().enumerate() {
        ensure!(
            *status == StatusCode::SERVICE_UNAVAILABLE,
            "probe {i}: {status}"
        );
    }
    let body = sidecar.admin_get("/ready").await?.text();
    ensure!(body.contains("status 503"), "the 503 says why: {body:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_never_shows_the_app_checks_header_values() -> Result<()> {
    let (_app, _health, sidecar) = checked_app(200, Duration::ZERO, 1).await?;
    for query in ["", "?format=yaml"] {
        let text = sidecar.admin_get(&format!("/config{query}")).await?.text();
        ensure!(
            !text.contains("s3cr3t"),
            "/config{query} shows the token: {text}"
        );
        ensure!(
            text.contains("Authorization") && text.contains("<redacted>"),
            "/config{query} names the header, hides its value: {text}"
        );
    }
    // The check itself still sends the real value.
    sidecar.wait_ready_status(StatusCode::OK).await?;
    Ok(())
}
