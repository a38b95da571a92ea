//! Long requests and streams in flight when their pod is deleted.
//!
//! On the real cluster: the chart installed with the local images, the demo app deployed
//! twice (one replica each): `demo-with` annotated `kubegrace.io/inject=enabled` with a
//! GraceRoute, `demo-without` plain (the app exits at once on SIGTERM, like a naive app).
//! For each, from this host straight to the pod (the port the Service targets, which is
//! the sidecar when injected), start
//! - two HTTP/1.1 requests that take 8 s (`/delay?ms=8000`),
//! - one streamed HTTP/1.1 body (16 chunks, one every 500 ms),
//! - one gRPC server stream (16 replies, one every 500 ms, over h2c),
//! - one WebSocket session (16 messages, one every 500 ms, each echoed, then a clean
//!   close),
//!
//! wait until the app itself reports all of them in flight (`/stats` on its own port), then
//! delete the pod. With kubegrace every one of them finishes (the preStop hook holds the
//! app's SIGTERM until the sidecar has drained); without it every one is cut. Both are
//! asserted, and each exchange is printed with how far it got.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, Client};
use kubegrace_e2e::scenario::kit::{self, Session, stat};
use kubegrace_e2e::scenario::{
    Options, Patience, Progress, WITH, WITHOUT, keep_from_env, with_install,
};
use kubegrace_e2e::wait_deleted;

/// Each exchange lasts about this long, well past the pod's deletion.
const DELAY_MS: u64 = 8_000;
const UNITS: usize = 16;
const EVERY_MS: u64 = 500;
/// Bound of one exchange (it normally ends after ~8 s, or when cut).
const SESSION_TIMEOUT: Duration = Duration::from_secs(45);

#[tokio::test]
async fn long_requests_and_streams_in_flight_at_termination_finish_with_kubegrace_and_are_cut_without()
-> Result<()> {
    let test = "long_requests_and_streams_in_flight_at_termination_finish_with_kubegrace_and_are_cut_without";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-inflight");
    opts.replicas = 1;
    // Closing waits for in-flight work up to `timeout`: longer than the exchanges.
    opts.drain.timeout = "20s".into();
    let p = Progress::default();
    let (with, without) = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("rollout").await?;
        sc.deploy(&p).await?;
        let with = delete_pod_in_flight(&client, &sc.namespace, WITH, true, &p).await?;
        let without = delete_pod_in_flight(&client, &sc.namespace, WITHOUT, false, &p).await?;
        Ok((with, without))
    })
    .await?;

    let finished = |s: &[Session]| s.iter().filter(|s| s.finished()).count();
    eprintln!(
        "with kubegrace:    {}/{} exchanges finished",
        finished(&with),
        with.len()
    );
    for s in &with {
        eprintln!("  {s}");
    }
    eprintln!(
        "without kubegrace: {}/{} exchanges finished",
        finished(&without),
        without.len()
    );
    for s in &without {
        eprintln!("  {s}");
    }
    ensure!(
        with.iter().all(Session::finished),
        "with kubegrace, exchanges in flight at the pod's deletion were cut: {with:#?}"
    );
    ensure!(
        without.iter().all(|s| !s.finished()),
        "without kubegrace some exchanges survived the pod's deletion, so the baseline does \
         not show the cut: {without:#?}"
    );
    Ok(())
}

/// Starts the long exchanges on the only pod of `app`, waits until the app reports all of
/// them in flight, deletes the pod, and returns how each exchange ended. With kubegrace it
/// also waits until the pod is gone (its termination really happened under the exchanges).
async fn delete_pod_in_flight(
    client: &Client,
    namespace: &str,
    app: &str,
    kubegrace: bool,
    p: &Progress,
) -> Result<Vec<Session>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let ready = kit::ready_pods(&pods, app).await?;
    ensure!(ready.len() == 1, "{app}: want one ready pod, got {ready:?}");
    let pod = ready.into_iter().next().context("no pod")?;
    ensure!(
        pod.admin_port.is_some() == kubegrace,
        "{app}: pod {} has sidecar admin port {:?}",
        pod.name,
        pod.admin_port
    );
    let front = pod.front();
    p.step(format!(
        "{app}: starting long exchanges on pod {} via {front} (app on {})",
        pod.name,
        pod.app()
    ));

    let every = Duration::from_millis(EVERY_MS);
    let sessions = vec![
        tokio::spawn({
            let a = front.clone();
            async move { kit::long_request(&a, DELAY_MS, SESSION_TIMEOUT).await }
        }),
        tokio::spawn({
            let a = front.clone();
            async move { kit::long_request(&a, DELAY_MS, SESSION_TIMEOUT).await }
        }),
        tokio::spawn({
            let a = front.clone();
            async move { kit::http_stream(&a, UNITS, EVERY_MS, SESSION_TIMEOUT).await }
        }),
        tokio::spawn({
            let a = front.clone();
            async move { kit::grpc_stream(&a, UNITS as u32, EVERY_MS as u32, SESSION_TIMEOUT).await }
        }),
        tokio::spawn({
            let a = front.clone();
            async move { kit::websocket(&a, UNITS, every, SESSION_TIMEOUT).await }
        }),
    ];

    let app_addr = pod.app();
    let in_flight = p
        .wait(
            &format!("{app}: the app reports every exchange in flight"),
            Patience::new(Duration::from_secs(20), Duration::from_millis(100)),
            || async {
                let s = kit::app_stats(&app_addr)
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                let now = [
                    ("/delay", stat(&s, "/delay", "inflight"), 2),
                    ("/stream", stat(&s, "/stream", "inflight"), 1),
                    (
                        "grpc stream",
                        stat(&s, "grpc /kubegrace.demo.Echo/Stream", "inflight"),
                        1,
                    ),
                    ("/ws", stat(&s, "/ws", "inflight"), 1),
                ];
                if now.iter().all(|(_, n, want)| n >= want) {
                    Ok(now)
                } else {
                    Err(format!("in flight: {now:?}"))
                }
            },
        )
        .await;
    if let Err(e) = in_flight {
        for s in sessions {
            s.abort();
        }
        return Err(e);
    }

    p.step(format!(
        "{app}: deleting pod {} with all of them in flight",
        pod.name
    ));
    pods.delete(&pod.name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting pod {}", pod.name))?;

    let mut out = Vec::new();
    for s in sessions {
        let session = s.await.context("session task")?;
        p.step(format!("{app}: {session}"));
        if let Some(served_by) = &session.pod {
            ensure!(
                *served_by == pod.name,
                "{app}: {} was served by {served_by}, not the deleted pod {}",
                session.kind,
                pod.name
            );
        }
        out.push(session);
    }
    if kubegrace {
        // The grace period is computed from the route's drain timers (about 30 s here).
        wait_deleted(&pods, &pod.name, &pod.uid, Duration::from_secs(60)).await?;
        p.step(format!("{app}: pod {} is gone", pod.name));
    }
    Ok(out)
}
