//! What a user does to a running app with the operator, under constant load:
//!
//! - annotate: `kubectl annotate deployment web kubegrace.io/inject=enabled`: the operator
//!   rolls the pods, they come back with the sidecar; removing the annotation rolls them
//!   back out.
//! - edit the route: the sidecars reload the new GraceRoute config (ConfigMap volume)
//!   without a restart, and the route's status shows the new config hash.
//! - kill the operator: operator pods killed (grace period 0) in the middle of a rollout:
//!   no failed request, every new pod injected, the other replica takes the Lease.
//! - the finalizer (after annotate, on its route): a route without a `rollout` block holds
//!   none; a `rollout` block adds it before the Deployment is written; deleting the route
//!   restores the Deployment and lets the route go.
//!
//! One chart install (two operator replicas, `failurePolicy: Fail`) for the three flows;
//! each flow has its own temporary labelled namespace, deleted at the end. All three run,
//! then every finding is reported together. The load runs where `KUBEGRACE_E2E_LOAD_FROM`
//! says (this process by default, `job` for a loadgen Job; see
//! `kubegrace_e2e::scenario::LoadMode`).
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kubegrace_e2e::scenario::{
    Action, Options, Patience, Progress, RunResult, Scenario, WITH, all_containers, has_sidecar,
    keep_from_env, with_install,
};
use kubegrace_sidecar_api::cli::env;
use kubegrace_sidecar_api::{admin, keys, pod};
use serde_json::json;

/// The Deployment the annotate flow opts in: plain at first.
const WEB: &str = "web";
/// The drain.quiet value the route edit switches to (this test starts from 1s). `quiet` is
/// not part of the time budget, so the edit changes no pod template and rolls nothing.
const NEW_QUIET: &str = "800ms";

#[tokio::test]
async fn annotate_edit_route_and_kill_the_operator_under_load() -> Result<()> {
    let test = "annotate_edit_route_and_kill_the_operator_under_load";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let mut opts = Options::new("kg-e2e-ops").with_load_from_env()?;
    // The chart's default; the kill flow kills one replica while the other serves.
    opts.operator_replicas = 2;
    let p = Progress::default();
    let (report, failures) = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let annotate = run.scenario("annotate").await?;
        let reload = run.scenario("reload").await?;
        let kill = run.scenario("opkill").await?;
        // Everything is created up front, so the three apps start side by side.
        annotate.create_route(WEB, &p).await?;
        annotate.create_app(WEB, false, &p).await?;
        for sc in [&reload, &kill] {
            sc.create_route(WITH, &p).await?;
            sc.create_app(WITH, true, &p).await?;
        }
        let mut report = Vec::new();
        let mut failures = Vec::new();
        let annotated = annotate_flow(&annotate, &p).await;
        for (flow, result) in [
            ("annotate", annotated),
            ("finalizer", finalizer_flow(&annotate, &p).await),
            ("edit GraceRoute", edit_route_flow(&reload, &p).await),
            ("kill operator", kill_operator_flow(&kill, &p).await),
        ] {
            match result {
                Ok(lines) => report.extend(lines.into_iter().map(|l| format!("{flow}: {l}"))),
                Err(e) => failures.push(format!("{flow}: {e:#}")),
            }
        }
        Ok((report, failures))
    })
    .await?;
    for line in &report {
        eprintln!("{line}");
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// The failed requests of `run` attributed to one of `pods`.
fn failed_on(run: &RunResult, pods: &BTreeSet<String>) -> u64 {
    run.summary
        .by_pod
        .iter()
        .filter(|(pod, _)| pods.contains(*pod))
        .map(|(_, k)| k.failed)
        .sum()
}

fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// Annotating the Deployment rolls in the sidecar, removing the annotation rolls it out.
/// The pods the annotation replaces are the plain ones: they die the naive way
/// (the demo app exits at once on SIGTERM), so the requests they had in flight can fail;
/// that is the loss kubegrace exists to prevent, and it is reported, not hidden. What must
/// hold: the new pods are injected and lose nothing, and the roll that takes the sidecar
/// out again (old pods with the sidecar, which drain) loses nothing at all.
async fn annotate_flow(sc: &Scenario, p: &Progress) -> Result<Vec<String>> {
    sc.wait_budget_applied(WEB, p).await?;
    sc.settle(WEB, false, p).await?;
    let plain = names(&sc.app_pods(WEB).await?);

    let inject = sc.roll_under_load(WEB, Action::Inject(true), p).await?;
    sc.settle(WEB, true, p)
        .await
        .context("after kubegrace.io/inject=enabled")?;
    let injected_pods = sc.app_pods(WEB).await?;
    let injected = names(&injected_pods);
    ensure!(
        injected_pods.iter().all(has_sidecar) && injected.is_disjoint(&plain),
        "after the annotation, pods {injected:?} (before: {plain:?}) are not all new and injected"
    );
    for pod in &injected_pods {
        readiness_moved_to_sidecar(pod)?;
    }
    let on_injected = failed_on(&inject, &injected);

    let remove = sc.roll_under_load(WEB, Action::Inject(false), p).await?;
    sc.settle(WEB, false, p)
        .await
        .context("after removing kubegrace.io/inject")?;
    let bare_pods = sc.app_pods(WEB).await?;
    ensure!(
        bare_pods.iter().all(|p| !has_sidecar(p)) && names(&bare_pods).is_disjoint(&injected),
        "after removing the annotation, pods {:?} still have the sidecar or were not replaced",
        names(&bare_pods)
    );

    let lines = vec![
        format!(
            "inject roll (old pods plain): {}; failed on the new injected pods: {on_injected}",
            inject.describe()
        ),
        format!(
            "removal roll (old pods with the sidecar, draining): {}",
            remove.describe()
        ),
    ];
    for l in &lines {
        p.step(l);
    }
    ensure!(
        on_injected == 0,
        "{on_injected} requests failed on injected pods during the inject roll: {:?}",
        inject.summary.by_detail
    );
    ensure!(
        remove.summary.failed == 0,
        "{} of {} requests failed while the sidecar was rolled back out: {:?}",
        remove.summary.failed,
        remove.summary.requests,
        remove.summary.by_detail
    );
    Ok(lines)
}

/// One readiness probe per pod: the app's `httpGet` probe left the app
/// container and runs inside the sidecar's `/ready` (the sidecar got it as
/// `KUBEGRACE_APP_READINESS`, and the pod says so in its annotation).
fn readiness_moved_to_sidecar(injected: &Pod) -> Result<()> {
    let name = injected.metadata.name.as_deref().unwrap_or("?");
    let annotation = injected
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::APP_READINESS));
    ensure!(
        annotation.map(String::as_str) == Some(keys::APP_READINESS_IN_SIDECAR),
        "pod {name}: {} is {annotation:?}, want {:?}",
        keys::APP_READINESS,
        keys::APP_READINESS_IN_SIDECAR
    );
    let containers = all_containers(injected);
    let probed: Vec<&str> = containers
        .iter()
        .filter(|c| c.readiness_probe.is_some())
        .map(|c| c.name.as_str())
        .collect();
    ensure!(
        probed == [pod::CONTAINER],
        "pod {name}: readiness probes on {probed:?}, want only the sidecar's"
    );
    let carried = containers
        .iter()
        .filter(|c| c.name == pod::CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .any(|e| {
            e.name == env::APP_READINESS
                && e.value.as_deref().is_some_and(|v| v.contains("/healthz"))
        });
    ensure!(
        carried,
        "pod {name}: the sidecar has no {} with the app's /healthz check",
        env::APP_READINESS
    );
    Ok(())
}

/// What must not change when a route is edited: pod UID and every container's restart
/// count (the native sidecar is an init container), by pod name.
fn identity(pods: &[Pod]) -> BTreeMap<String, (String, Vec<(String, i32)>)> {
    pods.iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            let uid = p.metadata.uid.clone().unwrap_or_default();
            let status = p.status.clone().unwrap_or_default();
            let restarts = kubegrace_e2e::container_statuses(&status)
                .map(|c| (c.name.clone(), c.restart_count))
                .collect();
            Some((name, (uid, restarts)))
        })
        .collect()
}

fn route_api(sc: &Scenario) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubegrace.io", "v1alpha1", "GraceRoute"),
        "graceroutes",
    );
    Api::namespaced_with(sc.client.clone(), &sc.namespace, &ar)
}

/// `drain.quiet` and the successful reload count in a sidecar's `GET /config`.
async fn sidecar_config(sc: &Scenario, pod: &str) -> Result<(String, u64)> {
    let body = sc.admin_get(pod, admin::path::CONFIG).await?;
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("/config of {pod}: {body}"))?;
    let quiet = v["config"]["drain"]["quiet"]
        .as_str()
        .with_context(|| format!("/config of {pod} has no config.drain.quiet: {body}"))?
        .to_owned();
    Ok((quiet, v["source"]["reloads"].as_u64().unwrap_or(0)))
}

/// Editing the GraceRoute reaches every sidecar by hot reload: no pod restarts, the route's
/// status shows the new config hash.
async fn edit_route_flow(sc: &Scenario, p: &Progress) -> Result<Vec<String>> {
    sc.wait_budget_applied(WITH, p).await?;
    sc.settle(WITH, true, p).await?;
    let routes = route_api(sc);
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let pods_before = sc.app_pods(WITH).await?;
    let before = identity(&pods_before);
    let generation_before = deployments.get(WITH).await?.metadata.generation;
    let route = routes.get(WITH).await?;
    let hash_before = route.data["status"]["configHash"]
        .as_str()
        .context("the route's status has no configHash")?
        .to_owned();
    let mut reloads_before = BTreeMap::new();
    for pod in before.keys() {
        let (quiet, reloads) = sidecar_config(sc, pod).await?;
        ensure!(
            quiet != NEW_QUIET,
            "{pod} already has drain.quiet {NEW_QUIET}"
        );
        reloads_before.insert(pod.clone(), reloads);
    }

    let load = sc.start_load(WITH, p).await?;
    let edited = async {
        tokio::time::sleep(sc.opts.load.lead_in).await;
        p.step(format!(
            "GraceRoute {WITH}: drain.quiet {} -> {NEW_QUIET} (merge patch, as kubectl edit)",
            sc.opts.drain.quiet
        ));
        let patched = routes
            .patch(
                WITH,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"drain": {"quiet": NEW_QUIET}}})),
            )
            .await
            .context("patching the GraceRoute")?;
        let generation = patched.metadata.generation.unwrap_or(0);
        let hash_after = p
            .wait(
                "the route's status: new generation observed, new config hash",
                Patience::API_CHANGE,
                || async {
                    let r = routes.get(WITH).await.map_err(|e| e.to_string())?;
                    let observed = r.data["status"]["observedGeneration"].as_i64();
                    let hash = r.data["status"]["configHash"].as_str().unwrap_or_default();
                    if observed >= Some(generation) && hash != hash_before {
                        Ok(hash.to_owned())
                    } else {
                        Err(format!(
                            "observedGeneration {observed:?}, configHash {hash}"
                        ))
                    }
                },
            )
            .await?;
        // The kubelet refreshes ConfigMap volumes on its sync loop (about a minute).
        p.wait(
            &format!("every sidecar's /config showing drain.quiet {NEW_QUIET}"),
            Patience::new(Duration::from_secs(150), Duration::from_secs(1)),
            || async {
                let mut old = Vec::new();
                for pod in before.keys() {
                    match sidecar_config(sc, pod).await {
                        Ok((quiet, _)) if quiet == NEW_QUIET => {}
                        Ok((quiet, _)) => old.push(format!("{pod}: {quiet}")),
                        Err(e) => old.push(format!("{pod}: {e:#}")),
                    }
                }
                if old.is_empty() {
                    Ok(())
                } else {
                    Err(old.join(", "))
                }
            },
        )
        .await?;
        Ok::<_, anyhow::Error>(hash_after)
    }
    .await;
    let summary = load.finish(p).await?;
    let hash_after = edited?;

    let pods_after = sc.app_pods(WITH).await?;
    let after = identity(&pods_after);
    let generation_after = deployments.get(WITH).await?.metadata.generation;
    let mut reloaded = Vec::new();
    for (pod, n) in &reloads_before {
        let (_, reloads) = sidecar_config(sc, pod).await?;
        reloaded.push(format!("{pod} reloads {n} -> {reloads}"));
        ensure!(
            reloads > *n,
            "{pod}: the new config is in force but no reload was counted ({n} -> {reloads})"
        );
    }
    let line = format!(
        "config hash {hash_before} -> {hash_after}; {}; pods and restart counts unchanged: {}; \
         load: {} requests, {} failed {:?}",
        reloaded.join(", "),
        before == after,
        summary.requests,
        summary.failed,
        summary.by_detail
    );
    p.step(&line);
    ensure!(
        before == after,
        "the route edit restarted or replaced pods: before {before:?}, after {after:?}"
    );
    ensure!(
        generation_before == generation_after,
        "the route edit changed the Deployment (generation {generation_before:?} -> {generation_after:?})"
    );
    ensure!(
        pods_after
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none()),
        "a pod is terminating after the route edit"
    );
    ensure!(
        summary.failed == 0,
        "{} of {} requests failed while the sidecars reloaded: {:?}",
        summary.failed,
        summary.requests,
        summary.by_detail
    );
    Ok(vec![line])
}

/// Operator pods killed mid-rollout: no request fails, every new pod is injected, the
/// other replica takes the Lease.
async fn kill_operator_flow(sc: &Scenario, p: &Progress) -> Result<Vec<String>> {
    sc.wait_budget_applied(WITH, p).await?;
    sc.settle(WITH, true, p).await?;
    let before = names(&sc.app_pods(WITH).await?);
    let run = sc
        .roll_under_load(WITH, Action::RestartKillingOperator, p)
        .await?;
    // Every pod the rollout created went through the webhook (failurePolicy Fail: a pod
    // the webhook could not see was refused and created again by the ReplicaSet).
    sc.settle(WITH, true, p)
        .await
        .context("after the rollout with operator pods killed")?;
    let after = sc.app_pods(WITH).await?;
    ensure!(
        after.iter().all(has_sidecar) && names(&after).is_disjoint(&before),
        "after the rollout, pods {:?} are not all new and injected",
        names(&after)
    );
    let killed = run.operator_pods_killed.clone();
    let holder = p
        .wait(
            "the operator back: 2 ready replicas, the Lease held by a live one",
            Patience::new(Duration::from_secs(120), Duration::from_millis(500)),
            || async {
                let (pods, holder) = sc.operator_pods().await.map_err(|e| format!("{e:#}"))?;
                let ready: Vec<&String> = pods.iter().filter(|(_, r)| *r).map(|(n, _)| n).collect();
                // The operator's Lease identity is its pod name plus a per-process
                // suffix (`<pod>-<hex>`), so a restarted container is a new holder.
                let held_by = |h: &str, pod: &str| {
                    h == pod
                        || h.strip_prefix(pod)
                            .is_some_and(|rest| rest.starts_with('-'))
                };
                match holder {
                    Some(h)
                        if ready.len() == 2
                            && ready.iter().any(|pod| held_by(&h, pod))
                            && !killed.iter().any(|pod| held_by(&h, pod)) =>
                    {
                        Ok(h)
                    }
                    other => Err(format!("ready {ready:?}, Lease holder {other:?}")),
                }
            },
        )
        .await?;
    let line = format!(
        "operator pods killed {killed:?}, Lease now held by {holder}; {}",
        run.describe()
    );
    p.step(&line);
    ensure!(
        !run.operator_pods_killed.is_empty(),
        "no operator pod was killed during the rollout"
    );
    ensure!(
        run.summary.failed == 0,
        "{} of {} requests failed during the rollout with operator pods killed: {:?}",
        run.summary.failed,
        run.summary.requests,
        run.summary.by_detail
    );
    Ok(vec![line])
}

/// `kubegrace.io/cleanup` is held only while the route has written into its Deployment:
/// none on a route without a `rollout` block (so it never hangs in Terminating when the
/// operator is removed first), added before the block's first write, and released after
/// the deletion restored the Deployment.
async fn finalizer_flow(sc: &Scenario, p: &Progress) -> Result<Vec<String>> {
    const FINALIZER: &str = "kubegrace.io/cleanup";
    const MIN_READY: i32 = 7;
    let routes = route_api(sc);
    let deployments: Api<Deployment> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let holds = |r: &DynamicObject| {
        r.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    };
    let reconciled = |r: &DynamicObject| {
        r.data["status"]["observedGeneration"].as_i64() == r.metadata.generation
    };
    let original = deployments
        .get(WEB)
        .await?
        .spec
        .and_then(|s| s.min_ready_seconds);
    let route = p
        .wait("the route reconciled", Patience::API_CHANGE, || async {
            let r = routes.get(WEB).await.map_err(|e| e.to_string())?;
            if reconciled(&r) {
                Ok(r)
            } else {
                Err("observedGeneration behind".into())
            }
        })
        .await?;
    ensure!(
        !holds(&route),
        "a route without a rollout block holds {FINALIZER}: {:?}",
        route.metadata.finalizers
    );

    routes
        .patch(
            WEB,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rollout": {"minReadySeconds": MIN_READY}}})),
        )
        .await?;
    p.wait(
        "minReadySeconds written into the Deployment",
        Patience::API_CHANGE,
        || async {
            let d = deployments.get(WEB).await.map_err(|e| e.to_string())?;
            let now = d.spec.and_then(|s| s.min_ready_seconds);
            if now == Some(MIN_READY) {
                Ok(())
            } else {
                Err(format!("minReadySeconds {now:?}"))
            }
        },
    )
    .await?;
    // Added before the write, so it is there once the write is.
    let route = routes.get(WEB).await?;
    ensure!(
        holds(&route),
        "the route wrote into its Deployment without {FINALIZER}: {:?}",
        route.metadata.finalizers
    );

    routes.delete(WEB, &Default::default()).await?;
    p.wait("the route gone", Patience::API_CHANGE, || async {
        match routes.get_opt(WEB).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(r) => Err(format!(
                "still there, finalizers {:?}",
                r.metadata.finalizers
            )),
        }
    })
    .await?;
    let restored = deployments
        .get(WEB)
        .await?
        .spec
        .and_then(|s| s.min_ready_seconds);
    ensure!(
        restored.unwrap_or(0) == original.unwrap_or(0),
        "minReadySeconds {restored:?} after the route's deletion, was {original:?}"
    );
    let line = format!(
        "no finalizer without a rollout block; held once it wrote minReadySeconds {MIN_READY}; deleted route gone, minReadySeconds back to {restored:?}"
    );
    p.step(&line);
    Ok(vec![line])
}
