//! `rollout.pauseOnDrainLoss`: a rollout whose drains lose requests stops itself.
//!
//! On the real cluster: the chart installed with the local images, and twice the demo app
//! (three replicas, injected) behind a GraceRoute whose `drain.timeout` (4s) is shorter
//! than the app's requests: one request of a minute is started straight on every pod (its
//! sidecar's port), then the Deployment is rolled (`kubectl rollout restart`) under the
//! scenario's constant load. The route's `rollout.minReadySeconds: 15` spaces the
//! replacements, so the first old pod's drain report (its sidecar exits about
//! `maxDelay + timeout` after the pod's deletion) comes while two old pods still run.
//!
//! - With `rollout.pauseOnDrainLoss: true` the first lossy drain pauses the rollout: the
//!   route's `RolloutPaused` condition turns True (reason `DrainLoss`) naming one of the
//!   old pods, the Deployment has `spec.paused: true`, and once the pods already
//!   terminating are gone an old pod still runs: the rollout stopped short of the end.
//!   A `RolloutPaused` Warning Event is on the route.
//! - Without the option the same rollout runs to the end: every old pod replaced, the
//!   Deployment not paused, no `RolloutPaused` condition, while `status.lastDrains` shows
//!   the force-closed drains (the loss was there; only the option stops on it).
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use kubegrace_e2e::scenario::kit::{self, Session};
use kubegrace_e2e::scenario::{
    Action, Options, Patience, Progress, Scenario, events_for, graceroute_api, keep_from_env,
    with_install,
};
use serde_json::json;

const NAME: &str = "pauses";
/// Far beyond the drain timeout: each of these requests is cut by its pod's drain.
const LONG_MS: u64 = 60_000;
const SESSION_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_lossy_drain_pauses_the_rollout_only_with_pause_on_drain_loss() -> Result<()> {
    let test = "a_lossy_drain_pauses_the_rollout_only_with_pause_on_drain_loss";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let opts = Options::lossy_drain("kg-pause")?;
    let p = Progress::default();
    let (paused, ran) = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("pause-on").await?;
        let paused = rollout_pauses(&sc, &p).await?;
        let sc = run.scenario("pause-off").await?;
        let ran = rollout_runs_to_the_end(&sc, &p).await?;
        Ok((paused, ran))
    })
    .await?;

    eprintln!("with the option: {paused:?}");
    eprintln!("without it: {ran:?}");
    ensure!(
        paused.old_pods.contains(&paused.condition_pod),
        "the RolloutPaused condition names {:?}, not one of the old pods {:?}: {}",
        paused.condition_pod,
        paused.old_pods,
        paused.message
    );
    ensure!(paused.deployment_paused, "the Deployment is not paused");
    ensure!(
        !paused.old_running.is_empty(),
        "no old pod left running after the pause: the rollout went on to the end"
    );
    ensure!(
        paused.route_events >= 1,
        "no RolloutPaused Warning Event on the route"
    );
    ensure!(
        !ran.deployment_paused,
        "the Deployment was paused without the option"
    );
    ensure!(
        ran.condition.is_none(),
        "a RolloutPaused condition without the option: {:?}",
        ran.condition
    );
    ensure!(
        ran.force_closed >= 1,
        "no force-closed drain counted without the option: the loss this test needs did not happen"
    );
    Ok(())
}

#[derive(Debug)]
struct Paused {
    old_pods: BTreeSet<String>,
    condition_pod: String,
    message: String,
    deployment_paused: bool,
    /// Old pods still running (not terminating) once the terminating ones are gone.
    old_running: Vec<String>,
    route_events: usize,
}

#[derive(Debug)]
struct Ran {
    deployment_paused: bool,
    condition: Option<String>,
    force_closed: i64,
}

/// The route spec: replacements spaced by minReadySeconds, the option on or off.
fn route_spec(pause: bool) -> serde_json::Value {
    json!({"rollout": {"minReadySeconds": 15, "pauseOnDrainLoss": pause}})
}

async fn rollout_pauses(sc: &Scenario, p: &Progress) -> Result<Paused> {
    kit::deploy_with_route(sc, NAME, route_spec(true), p).await?;
    wait_min_ready_written(sc, p).await?;
    let (old_pods, long) = start_long_requests(sc, p).await?;
    let load = sc.start_load(NAME, p).await?;
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    p.step(format!("{NAME}: rollout restart (new pod template)"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    deployments
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&kubegrace_load::rollout::restart_patch(now)),
        )
        .await
        .with_context(|| format!("restarting Deployment {NAME}"))?;
    let routes = graceroute_api(&sc.client, &sc.namespace);
    let message = p
        .wait(
            "the route's RolloutPaused condition turns True",
            Patience::new(Duration::from_secs(180), Duration::from_millis(500)),
            || async {
                let route = routes.get(NAME).await.map_err(|e| format!("{e:#}"))?;
                let conditions = route.data["status"]["conditions"].clone();
                let paused = conditions
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "RolloutPaused")
                    .cloned();
                match paused {
                    Some(c) if c["status"] == "True" && c["reason"] == "DrainLoss" => {
                        Ok(c["message"].as_str().unwrap_or_default().to_string())
                    }
                    _ => Err(format!(
                        "RolloutPaused: {paused:?}; lastDrains: {}",
                        route.data["status"]["lastDrains"]
                    )),
                }
            },
        )
        .await;
    let summary = load.finish(p).await;
    let message = message?;
    p.step(format!("load during the paused rollout: {:?}", summary?));
    let condition_pod = message
        .split("pod ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    let deployment = deployments.get(NAME).await?;
    let deployment_paused = deployment.spec.as_ref().and_then(|s| s.paused) == Some(true);
    let old_running = old_pods_once_settled(sc, &old_pods, p).await?;
    let route_events = route_events(sc).await?;
    for task in long {
        task.abort();
    }
    Ok(Paused {
        old_pods,
        condition_pod,
        message,
        deployment_paused,
        old_running,
        route_events,
    })
}

async fn rollout_runs_to_the_end(sc: &Scenario, p: &Progress) -> Result<Ran> {
    kit::deploy_with_route(sc, NAME, route_spec(false), p).await?;
    wait_min_ready_written(sc, p).await?;
    let (_, long) = start_long_requests(sc, p).await?;
    // Waits until every old pod is replaced and gone: a pause would time this out.
    let rolled = sc.roll_under_load(NAME, Action::Restart, p).await?;
    p.step(format!("rollout without the option: {}", rolled.describe()));
    for task in long {
        let s = task.await.context("a long request's task")?;
        p.step(format!("long request: {s}"));
    }
    let last = kit::wait_last_drains(sc, NAME, 3, p).await?;
    let condition = last.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "RolloutPaused")
        .map(|c| c.to_string());
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let d = deployments.get(NAME).await?;
    Ok(Ran {
        deployment_paused: d.spec.as_ref().and_then(|s| s.paused) == Some(true),
        condition,
        force_closed: last.data["status"]["lastDrains"]["forceClosed"]
            .as_i64()
            .unwrap_or(0),
    })
}

/// Waits until the operator has written the route's `minReadySeconds` into the
/// Deployment: without it the replacements are not spaced and the rollout may end before
/// the first drain report.
async fn wait_min_ready_written(sc: &Scenario, p: &Progress) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    p.wait(
        "the operator writes minReadySeconds 15 into the Deployment",
        Patience::API_CHANGE,
        || async {
            let d = deployments.get(NAME).await.map_err(|e| format!("{e:#}"))?;
            let m = d.spec.as_ref().and_then(|s| s.min_ready_seconds);
            if m == Some(15) {
                Ok(())
            } else {
                Err(format!("minReadySeconds {m:?}"))
            }
        },
    )
    .await
}

/// Starts a long request on every ready pod (through its sidecar) and waits until each
/// app reports it in flight; returns the pods and the tasks, which end with the requests.
async fn start_long_requests(
    sc: &Scenario,
    p: &Progress,
) -> Result<(BTreeSet<String>, Vec<tokio::task::JoinHandle<Session>>)> {
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let ready = kit::ready_pods(&pods, NAME).await?;
    ensure!(!ready.is_empty(), "no ready pod of {NAME}");
    let mut names = BTreeSet::new();
    let mut tasks = Vec::new();
    for pod in ready {
        tasks.push(kit::start_long_request(&pod, LONG_MS, SESSION_TIMEOUT, p).await?);
        names.insert(pod.name);
    }
    Ok((names, tasks))
}

/// Waits until no pod of the app is terminating (the drains already under way at the
/// pause end), then lists the old pods still running: with the rollout paused, the
/// Deployment deletes no more of them.
async fn old_pods_once_settled(
    sc: &Scenario,
    old: &BTreeSet<String>,
    p: &Progress,
) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let lp = ListParams::default().labels(&format!("app={NAME}"));
    p.wait(
        "no pod of the paused rollout is terminating",
        Patience::new(Duration::from_secs(120), Duration::from_millis(500)),
        || async {
            let list = pods.list(&lp).await.map_err(|e| format!("{e:#}"))?;
            let terminating: Vec<String> = list
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_some())
                .map(ResourceExt::name_any)
                .collect();
            if terminating.is_empty() {
                Ok(list
                    .iter()
                    .map(ResourceExt::name_any)
                    .filter(|n| old.contains(n))
                    .collect())
            } else {
                Err(format!("terminating: {terminating:?}"))
            }
        },
    )
    .await
}

/// RolloutPaused Warning Events about the route.
async fn route_events(sc: &Scenario) -> Result<usize> {
    Ok(events_for(&sc.client, &sc.namespace, "RolloutPaused")
        .await?
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("GraceRoute"))
        .count())
}
