//! End-to-end: a container restart inside a pod that stays must never make the pod
//! worse, with the sidecar native (an init container) or classic (a regular container).
//!
//! 1. The app's restart by kubelet after a failed livenessProbe, under constant load
//!    through the Service: the demo app (3 replicas, livenessProbe on `/livez`) with and
//!    without kubegrace, and ONE pod's app switched to fail its liveness
//!    (`POST /liveness?fail` on its own port). kubelet runs the injected preStop
//!    (`/drain?wait=true`), kills the app, starts it again. Asserted: the app container's
//!    restartCount is 1, the pod is Ready again after the app is (the sidecar resumed by
//!    itself: `kubegrace_drain_resumes_total` 1), the load saw 0 failed requests; without
//!    kubegrace the same restart fails requests (> 0). Run twice: the chart's
//!    `sidecar.mode` native and classic.
//! 2. The sidecar's own restart (restarted by kubelet, native and classic): its container is
//!    killed with `crictl stop --timeout 0` (SIGKILL, as an OOM kill or a crash; the local
//!    cluster's crictl is on PATH after `eval "$(e2e/cluster/env)"`); the pod comes back
//!    Ready and serves through the sidecar, the sidecar's restartCount is 1 and the app's 0.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::PostParams;
use kube::{Api, Client};
use kubegrace_e2e::load::Summary;
use kubegrace_e2e::scenario::kit::{self, PodAddr};
use kubegrace_e2e::scenario::restart::{
    a_ready_pod, kill_container, restart_options, restart_under_load, restarts, sidecar_metric,
};
use kubegrace_e2e::scenario::{
    self, Options, Patience, Progress, Scenario, keep_from_env, pod_ready, with_install,
};
use kubegrace_sidecar_api::{keys, pod};

const WITH: &str = "live-with";
const WITHOUT: &str = "live-without";
const SIDECAR: &str = pod::CONTAINER;

/// The demo app's Deployment with a livenessProbe on `/livez`: two failures a second
/// apart and kubelet restarts the container.
fn deployment_with_liveness(name: &str, replicas: i32, kubegrace: bool) -> Result<Deployment> {
    let mut d = serde_json::to_value(scenario::deployment(name, replicas, kubegrace)?)?;
    d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = serde_json::json!({
        "httpGet": {"path": "/livez", "port": "http"},
        "periodSeconds": 1, "failureThreshold": 2, "timeoutSeconds": 1,
    });
    Ok(serde_json::from_value(d)?)
}

async fn create(sc: &Scenario, name: &str, replicas: i32, kubegrace: bool) -> Result<()> {
    let post = PostParams::default();
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    deployments
        .create(&post, &deployment_with_liveness(name, replicas, kubegrace)?)
        .await
        .with_context(|| format!("creating Deployment {name}"))?;
    let services: Api<Service> = Api::namespaced(sc.client.clone(), &sc.namespace);
    services
        .create(&post, &scenario::service(name)?)
        .await
        .with_context(|| format!("creating Service {name}"))?;
    Ok(())
}

/// Restarts one pod's app through its liveness probe under load on the Service; returns
/// the load's summary and the pod that restarted.
async fn liveness_restart_under_load(
    sc: &Scenario,
    name: &str,
    p: &Progress,
) -> Result<(Summary, PodAddr)> {
    let r = restart_under_load(
        sc,
        name,
        "app",
        Duration::from_secs(60),
        p,
        async |victim| {
            p.step(format!(
                "{name}: POST /liveness?fail on pod {}'s app ({})",
                victim.name,
                victim.app()
            ));
            let (status, _, body) = kit::http1(
                &victim.app(),
                "POST",
                "/liveness?fail",
                Duration::from_secs(3),
            )
            .await?;
            ensure!(status == 200, "/liveness?fail: {status} {body}");
            Ok(())
        },
    )
    .await?;
    Ok((r.summary, r.victim))
}

#[tokio::test]
async fn an_app_liveness_restart_under_load_loses_nothing_with_kubegrace_and_fails_requests_without()
-> Result<()> {
    let test = "an_app_liveness_restart_under_load_loses_nothing_with_kubegrace_and_fails_requests_without";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    liveness_restart_with_and_without(client, "native").await
}

/// The same with the sidecar as a regular container beside the app (the order of
/// clusters without native sidecars): kubelet restarts only the app; the sidecar, which
/// ran the same provisional drain, resumes by itself.
#[tokio::test]
async fn with_a_classic_sidecar_an_app_liveness_restart_under_load_loses_nothing() -> Result<()> {
    let test = "with_a_classic_sidecar_an_app_liveness_restart_under_load_loses_nothing";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    liveness_restart_with_and_without(client, "classic").await
}

/// One pod's app restarted by its liveness probe under load, with kubegrace (sidecar in
/// `mode`: `native` or `classic`) and without; asserts zero loss with, loss without.
async fn liveness_restart_with_and_without(client: Client, mode: &str) -> Result<()> {
    let opts = restart_options(&format!("kg-restart-{mode}"), mode)?;
    let p = Progress::default();
    let outcome = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("restart").await?;
        sc.create_route(WITH, &p).await?;
        create(&sc, WITH, opts.replicas, true).await?;
        create(&sc, WITHOUT, opts.replicas, false).await?;
        sc.settle(WITH, true, &p).await?;
        sc.settle(WITHOUT, false, &p).await?;
        let (with, victim) = liveness_restart_under_load(&sc, WITH, &p).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
        let app_restarts = restarts(&pods, &victim.name, "app").await?;
        let sidecar_restarts = restarts(&pods, &victim.name, SIDECAR).await?;
        let placed = pods
            .get(&victim.name)
            .await?
            .metadata
            .annotations
            .unwrap_or_default()
            .get(keys::SIDECAR_MODE)
            .cloned()
            .unwrap_or_default();
        let want = if mode == "classic" {
            "container"
        } else {
            "native"
        };
        ensure!(
            placed == want,
            "pod {} has kubegrace.io/sidecar-mode {placed:?}, expected {want:?} for mode {mode}",
            victim.name
        );
        let admin = victim
            .admin()
            .context("the injected pod has no admin port")?;
        let resumes = sidecar_metric(&admin, "kubegrace_drain_resumes_total").await?;
        let (without, bare) = liveness_restart_under_load(&sc, WITHOUT, &p).await?;
        let bare_restarts = restarts(&pods, &bare.name, "app").await?;
        Ok((
            with,
            without,
            app_restarts,
            sidecar_restarts,
            resumes,
            bare_restarts,
        ))
    })
    .await;
    let (with, without, app_restarts, sidecar_restarts, resumes, bare_restarts) = outcome?;
    eprintln!(
        "app liveness restart under load: with kubegrace {} of {} failed; without {} of {} failed {:?}",
        with.failed, with.requests, without.failed, without.requests, without.by_detail
    );
    for (label, summary) in [("with", &with), ("without", &without)] {
        let per_pod: Vec<String> = summary
            .by_pod
            .iter()
            .map(|(pod, k)| format!("{pod} {}/{}", k.failed, k.requests))
            .collect();
        eprintln!("  {label}: failed/sent per pod: {}", per_pod.join(", "));
    }
    ensure!(app_restarts == 1, "the app restarted {app_restarts} times");
    ensure!(
        bare_restarts == 1,
        "the bare app restarted {bare_restarts} times"
    );
    ensure!(
        sidecar_restarts == 0,
        "the sidecar restarted {sidecar_restarts} times: the pod was not saved by a resume"
    );
    ensure!(resumes == 1.0, "kubegrace_drain_resumes_total {resumes}");
    ensure!(
        with.failed == 0,
        "with kubegrace {} of {} requests failed across the restart: {:?}",
        with.failed,
        with.requests,
        with.by_detail
    );
    ensure!(
        without.failed > 0,
        "without kubegrace the restart failed nothing ({} sent): the baseline shows nothing",
        without.requests
    );
    Ok(())
}

#[tokio::test]
async fn the_sidecars_own_restart_comes_back_ready_and_serves() -> Result<()> {
    let test = "the_sidecars_own_restart_comes_back_ready_and_serves";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    // Both placements: kubelet restarts a native sidecar as an init container with
    // `restartPolicy: Always` and a classic one as an ordinary container of the pod.
    for mode in ["classic", "native"] {
        sidecar_restart(&client, mode).await?;
    }
    Ok(())
}

async fn sidecar_restart(client: &Client, mode: &str) -> Result<()> {
    let mut opts = Options::new(&format!("kg-screstart-{mode}"));
    opts.chart_values.push(("sidecar.mode".into(), mode.into()));
    opts.replicas = 1;
    let p = Progress::default();
    let outcome = with_install(client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario(&format!("screstart-{mode}")).await?;
        sc.create_route(WITH, &p).await?;
        create(&sc, WITH, 1, true).await?;
        sc.settle(WITH, true, &p).await?;
        sidecar_kill_and_back(client, &sc, &p).await
    })
    .await;
    outcome.with_context(|| format!("sidecar.mode={mode}"))
}

async fn sidecar_kill_and_back(client: &Client, sc: &Scenario, p: &Progress) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
    let pod = a_ready_pod(&pods, WITH).await?;
    p.step(format!(
        "pod {}: crictl stop --timeout 0 on its {SIDECAR} container (SIGKILL)",
        pod.name
    ));
    kill_container(&sc.namespace, &pod.name, SIDECAR).await?;
    p.wait(
        &format!("pod {}: kubelet restarted the sidecar", pod.name),
        Patience::new(Duration::from_secs(60), Duration::from_millis(200)),
        || async {
            match restarts(&pods, &pod.name, SIDECAR).await {
                Ok(n) if n >= 1 => Ok(()),
                Ok(n) => Err(format!("restartCount {n}")),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await?;
    p.wait(
        &format!(
            "pod {} Ready again and serving through the sidecar",
            pod.name
        ),
        Patience::new(Duration::from_secs(60), Duration::from_millis(200)),
        || async {
            let now = pods.get(&pod.name).await.map_err(|e| e.to_string())?;
            if !pod_ready(&now) {
                return Err("not ready".to_owned());
            }
            match kit::http1(&pod.front(), "GET", "/", Duration::from_secs(3)).await {
                Ok((200, _, body)) if body.starts_with("pod=") => Ok(()),
                Ok((status, _, body)) => Err(format!("{status} {}", body.trim())),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await?;
    let sidecar = restarts(&pods, &pod.name, SIDECAR).await?;
    let app = restarts(&pods, &pod.name, "app").await?;
    ensure!(sidecar == 1, "the sidecar restarted {sidecar} times");
    ensure!(
        app == 0,
        "the app restarted {app} times: the sidecar's restart took it along"
    );
    let admin = pod.admin().context("no admin port")?;
    let phase = sidecar_metric(&admin, "kubegrace_drain_phase").await?;
    ensure!(
        phase == 0.0,
        "the restarted sidecar is in drain phase {phase}"
    );
    Ok(())
}
