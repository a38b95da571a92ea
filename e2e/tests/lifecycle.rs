//! End-to-end on the Kubernetes versions that bring new ways for a pod's containers to
//! stop (issue #37): `make lifecycle-test` runs this on a local cluster of Kubernetes
//! 1.37.2. It is not in the default cluster suite: each test needs the version named in
//! it and FAILS (never skips) on an older API server.
//!
//! 1. An in-place restart of every container (`restartPolicyRules` with action
//!    `RestartAllContainers`, KEP-5532, beta and on by default from 1.36): the app
//!    container is killed with SIGKILL (`crictl stop --timeout 0`: exit code 137, as an OOM
//!    kill) and its rule restarts the whole pod in place, with no preStop and two seconds
//!    of grace for the others. Asserted with kubegrace, in both sidecar placements: the
//!    restarted sidecar serves the pod again at once (it exits no second time: a sidecar
//!    that carried the killed process's drain on would) and the pod is Ready again; what
//!    the load lost is only what the mechanism leaves (the app's own in-flight requests,
//!    answered 502, and connections refused before a request was sent), never a request
//!    cut mid-way or left unanswered. Without kubegrace some requests fail (the baseline).
//! 2. An in-place resize that restarts the app (`resizePolicy: RestartContainer`,
//!    KEP-1287, from 1.33): the kubelet runs the app's preStop and restarts it; the pod
//!    comes back Ready and the load loses nothing with kubegrace, and some without.
//! 3. A native sidecar killed (SIGKILL) in the middle of its pod's drain: whether or not
//!    the kubelet restarts it during the termination (KEP-4438), the pod is never Ready
//!    again after the kill and is gone within its grace period; a restarted sidecar says
//!    it carried the drain on. What the kubelet did is printed.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, LogParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use kubegrace_e2e::scenario::restart::{
    Restarted, a_ready_pod, kill_container, restart_options, restart_under_load, restarts,
    running_container_id, sidecar_metric,
};
use kubegrace_e2e::scenario::{
    self, Patience, Progress, Scenario, keep_from_env, pod_ready, with_install,
};
use kubegrace_sidecar_api::pod;
use serde_json::{Value, json};

const SIDECAR: &str = pod::CONTAINER;

/// Fails unless the API server is at least 1.`minor` (what `feature` needs).
async fn require_minor(client: &Client, minor: u32, feature: &str) -> Result<()> {
    let info = client.apiserver_version().await?;
    let digits: String = info
        .minor
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let have: u32 = digits
        .parse()
        .with_context(|| format!("API server minor version {:?}", info.minor))?;
    ensure!(
        info.major == "1" && have >= minor,
        "{feature} needs Kubernetes 1.{minor} or later; this API server is {}: run this test \
         with `make lifecycle-test` (Kubernetes 1.37.2)",
        info.git_version
    );
    Ok(())
}

/// Creates Deployment `name` (and its Service) from the demo app's manifest with
/// `edit` applied to its app container. Sent as JSON as written, so fields newer than the
/// client's typed API reach the API server; an error when the server drops them.
async fn create_edited(
    sc: &Scenario,
    name: &str,
    replicas: i32,
    kubegrace: bool,
    field: &str,
    edit: impl Fn(&mut Value),
) -> Result<()> {
    let mut d = serde_json::to_value(scenario::deployment(name, replicas, kubegrace)?)?;
    edit(&mut d["spec"]["template"]["spec"]["containers"][0]);
    let api: Api<DynamicObject> = Api::namespaced_with(
        sc.client.clone(),
        &sc.namespace,
        &ApiResource::erase::<Deployment>(&()),
    );
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(d)?)
        .await
        .with_context(|| format!("creating Deployment {name}"))?;
    let kept = &created.data["spec"]["template"]["spec"]["containers"][0][field];
    ensure!(
        !kept.is_null(),
        "the API server dropped the app container's {field}: its feature gate is off here"
    );
    let services: Api<Service> = Api::namespaced(sc.client.clone(), &sc.namespace);
    services
        .create(&PostParams::default(), &scenario::service(name)?)
        .await
        .with_context(|| format!("creating Service {name}"))?;
    Ok(())
}

/// The route for `with`, then both Deployments (`with` injected, `without` bare, three
/// replicas each) with `edit` applied, settled.
async fn with_and_without(
    sc: &Scenario,
    [with, without]: [&str; 2],
    field: &str,
    edit: impl Fn(&mut Value),
    p: &Progress,
) -> Result<()> {
    sc.create_route(with, p).await?;
    for (name, kubegrace) in [(with, true), (without, false)] {
        create_edited(sc, name, 3, kubegrace, field, &edit).await?;
        sc.settle(name, kubegrace, p).await?;
    }
    Ok(())
}

fn report(what: &str, with: &Restarted, without: &Restarted) {
    eprintln!(
        "measured: {what}: with kubegrace {} of {} failed, Ready again after {:.1}s; without {} of {} \
         failed, Ready again after {:.1}s",
        with.summary.failed,
        with.summary.requests,
        with.ready_after.as_secs_f64(),
        without.summary.failed,
        without.summary.requests,
        without.ready_after.as_secs_f64(),
    );
    for (label, r) in [("with", with), ("without", without)] {
        eprintln!(
            "measured:   {label}: failures by kind: {:?}",
            r.summary.by_detail
        );
    }
}

const RESTART_WITH: &str = "inplace-with";
const RESTART_WITHOUT: &str = "inplace-without";

/// The app container's rule: exit code 137 (SIGKILL: an OOM kill, or `crictl stop`)
/// restarts every container of the pod in place.
fn restart_all_on_kill(app: &mut Value) {
    app["restartPolicy"] = json!("Always");
    app["restartPolicyRules"] = json!([{
        "action": "RestartAllContainers",
        "exitCodes": {"operator": "In", "values": [137]},
    }]);
}

/// Both placements: a native sidecar is an init container the kubelet starts before the
/// app, a classic one a container beside it.
#[tokio::test]
async fn an_in_place_restart_of_every_container_serves_again_at_once() -> Result<()> {
    let test = "an_in_place_restart_of_every_container_serves_again_at_once";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    require_minor(&client, 36, "RestartAllContainers (KEP-5532)").await?;
    for mode in ["native", "classic"] {
        restart_all_with_and_without(&client, mode).await?;
    }
    Ok(())
}

async fn restart_all_with_and_without(client: &Client, mode: &str) -> Result<()> {
    let opts = restart_options(&format!("kg-inplace-{mode}"), mode)?;
    let p = Progress::default();
    let patience = Duration::from_secs(90);
    let outcome = with_install(client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("inplace").await?;
        let pair = [RESTART_WITH, RESTART_WITHOUT];
        with_and_without(&sc, pair, "restartPolicyRules", restart_all_on_kill, &p).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
        let mut sidecar_before = None;
        let with = restart_under_load(&sc, RESTART_WITH, "app", patience, &p, async |victim| {
            sidecar_before = running_container_id(&pods.get(&victim.name).await?, SIDECAR);
            p.step(format!(
                "{RESTART_WITH}: SIGKILL pod {}'s app (exit 137: RestartAllContainers)",
                victim.name
            ));
            kill_container(&sc.namespace, &victim.name, "app").await
        })
        .await?;
        let sidecar_before = sidecar_before.context("the victim had no running sidecar")?;
        let after = pods.get(&with.victim.name).await?;
        ensure!(pod_ready(&after), "pod {} is not Ready", with.victim.name);
        let sidecar_now = running_container_id(&after, SIDECAR)
            .with_context(|| format!("pod {}: the sidecar is not running", with.victim.name))?;
        ensure!(
            sidecar_now != sidecar_before,
            "the sidecar was not restarted with the app: this was not RestartAllContainers"
        );
        // A sidecar that carried the killed process's drain on would have exited again by
        // itself: its last termination would then be a container other than the one the
        // kubelet killed.
        let status = after.status.clone().unwrap_or_default();
        let exited_again = kubegrace_e2e::container_statuses(&status)
            .find(|c| c.name == SIDECAR)
            .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
            .and_then(|t| t.container_id.clone())
            .filter(|id| *id != sidecar_before);
        ensure!(
            exited_again.is_none(),
            "the restarted sidecar {} exited again by itself (it carried a drain on)",
            exited_again.unwrap_or_default()
        );
        let admin = with.victim.admin().context("no admin port")?;
        let phase = sidecar_metric(&admin, "kubegrace_drain_phase").await?;
        ensure!(
            phase == 0.0,
            "the restarted sidecar is in drain phase {phase}"
        );
        let without = restart_under_load(&sc, RESTART_WITHOUT, "app", patience, &p, async |v| {
            p.step(format!("{RESTART_WITHOUT}: SIGKILL pod {}'s app", v.name));
            kill_container(&sc.namespace, &v.name, "app").await
        })
        .await?;
        Ok((with, without))
    })
    .await;
    let (with, without) = outcome.with_context(|| format!("sidecar.mode={mode}"))?;
    report(&format!("RestartAllContainers ({mode})"), &with, &without);
    ensure!(
        without.summary.failed > 0,
        "without kubegrace the in-place restart failed nothing ({} sent): the baseline shows \
         nothing",
        without.summary.requests
    );
    // What the mechanism leaves to lose: the requests the app held when it died (502,
    // counted by the sidecar) and new connections refused in the moment between the
    // killed sidecar closing its listener and the next one binding (never sent, so any
    // client may retry them). Nothing is cut mid-way and nothing waits for no answer.
    let cut: Vec<(&String, &u64)> = with
        .summary
        .by_detail
        .iter()
        .filter(|(detail, _)| !detail.starts_with("http_5xx") && !detail.starts_with("refused"))
        .collect();
    ensure!(
        cut.is_empty(),
        "with kubegrace some requests were cut or left without an answer: {cut:?}"
    );
    Ok(())
}

const RESIZE_WITH: &str = "resize-with";
const RESIZE_WITHOUT: &str = "resize-without";

/// The app container's memory, and the policy that restarts it when that changes.
fn restart_on_memory_resize(app: &mut Value) {
    app["resources"] = json!({
        "requests": {"cpu": "20m", "memory": "32Mi"},
        "limits": {"memory": "64Mi"},
    });
    app["resizePolicy"] = json!([
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
    ]);
}

/// Resizes the app container's memory limit of `pod` through the `resize` subresource.
async fn resize_memory(pods: &Api<Pod>, pod: &str, limit: &str) -> Result<()> {
    let patch = json!({"spec": {"containers": [{
        "name": "app",
        "resources": {"requests": {"memory": "32Mi"}, "limits": {"memory": limit}},
    }]}});
    pods.patch_subresource(
        "resize",
        pod,
        &PatchParams::default(),
        &Patch::Strategic(patch),
    )
    .await
    .with_context(|| format!("resizing pod {pod}'s app to {limit}"))?;
    Ok(())
}

#[tokio::test]
async fn an_in_place_resize_that_restarts_the_app_loses_nothing_with_kubegrace() -> Result<()> {
    let test = "an_in_place_resize_that_restarts_the_app_loses_nothing_with_kubegrace";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    require_minor(&client, 33, "in-place resize (KEP-1287)").await?;
    let opts = restart_options("kg-resize", "native")?;
    let p = Progress::default();
    let patience = Duration::from_secs(90);
    let outcome = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("resize").await?;
        let pair = [RESIZE_WITH, RESIZE_WITHOUT];
        with_and_without(&sc, pair, "resizePolicy", restart_on_memory_resize, &p).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
        let mut runs = Vec::new();
        for name in [RESIZE_WITH, RESIZE_WITHOUT] {
            let r = restart_under_load(&sc, name, "app", patience, &p, async |victim| {
                p.step(format!(
                    "{name}: resize pod {}'s app memory to 96Mi",
                    victim.name
                ));
                resize_memory(&pods, &victim.name, "96Mi").await
            })
            .await?;
            runs.push(r);
        }
        let (Some(without), Some(with)) = (runs.pop(), runs.pop()) else {
            bail!("two runs expected");
        };
        let sidecar_restarts = restarts(&pods, &with.victim.name, SIDECAR).await?;
        ensure!(
            sidecar_restarts == 0,
            "the sidecar restarted {sidecar_restarts} times"
        );
        let admin = with.victim.admin().context("no admin port")?;
        let resumes = sidecar_metric(&admin, "kubegrace_drain_resumes_total").await?;
        ensure!(
            resumes == 1.0,
            "kubegrace_drain_resumes_total {resumes}: the preStop drain did not resume"
        );
        Ok((with, without))
    })
    .await;
    let (with, without) = outcome?;
    report("in-place resize, RestartContainer", &with, &without);
    ensure!(
        with.summary.failed == 0,
        "with kubegrace {} of {} requests failed across the resize: {:?}",
        with.summary.failed,
        with.summary.requests,
        with.summary.by_detail
    );
    ensure!(
        without.summary.failed > 0,
        "without kubegrace the resize failed nothing ({} sent): the baseline shows nothing",
        without.summary.requests
    );
    Ok(())
}

const KILLED: &str = "killed-mid-drain";

#[tokio::test]
async fn a_native_sidecar_killed_mid_drain_never_serves_again() -> Result<()> {
    let test = "a_native_sidecar_killed_mid_drain_never_serves_again";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    require_minor(
        &client,
        37,
        "restarting native sidecars during termination (KEP-4438)",
    )
    .await?;
    let mut opts = restart_options("kg-killed", "native")?;
    opts.replicas = 2;
    let p = Progress::default();
    let outcome = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let sc = run.scenario("killed").await?;
        sc.create_route(KILLED, &p).await?;
        sc.create_app(KILLED, true, &p).await?;
        sc.settle(KILLED, true, &p).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &sc.namespace);
        let victim = a_ready_pod(&pods, KILLED).await?;
        let grace = pods
            .get(&victim.name)
            .await?
            .spec
            .and_then(|s| s.termination_grace_period_seconds)
            .context("no terminationGracePeriodSeconds")?;
        let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let load = sc.start_load(KILLED, &p).await?;
        let watched = async {
            let deleted = Instant::now();
            pods.delete(&victim.name, &DeleteParams::default()).await?;
            let admin = victim.admin().context("no admin port")?;
            p.wait(
                &format!("pod {}: the sidecar drains", victim.name),
                Patience::new(Duration::from_secs(10), Duration::from_millis(100)),
                || async {
                    match sidecar_metric(&admin, "kubegrace_drain_phase").await {
                        Ok(phase) if phase >= 1.0 => Ok(()),
                        Ok(phase) => Err(format!("phase {phase}")),
                        Err(e) => Err(format!("{e:#}")),
                    }
                },
            )
            .await?;
            p.step(format!(
                "pod {}: SIGKILL its sidecar mid-drain",
                victim.name
            ));
            kill_container(&sc.namespace, &victim.name, SIDECAR).await?;
            let killed = Instant::now();
            let mut restarted = 0;
            // The pod's Ready condition lags the kill: what must never happen
            // is Ready again after the kubelet has seen it not ready.
            let mut seen_not_ready = false;
            let mut ready_after_kill = false;
            let mut logs = String::new();
            loop {
                let Some(pod) = pods.get_opt(&victim.name).await? else {
                    break;
                };
                let ready = pod_ready(&pod);
                ready_after_kill |= seen_not_ready && ready;
                seen_not_ready |= !ready;
                let status = pod.status.clone().unwrap_or_default();
                let count = kubegrace_e2e::container_statuses(&status)
                    .find(|c| c.name == SIDECAR)
                    .map_or(0, |c| c.restart_count);
                if count > restarted {
                    restarted = count;
                }
                if restarted > 0 && logs.is_empty() {
                    let lp = LogParams {
                        container: Some(SIDECAR.into()),
                        ..LogParams::default()
                    };
                    logs = pods.logs(&victim.name, &lp).await.unwrap_or_default();
                }
                ensure!(
                    deleted.elapsed() < grace + Duration::from_secs(30),
                    "pod {} still exists {:.0}s after its deletion (grace period {}s)",
                    victim.name,
                    deleted.elapsed().as_secs_f64(),
                    grace.as_secs()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok::<_, anyhow::Error>((
                deleted.elapsed(),
                killed.elapsed(),
                restarted,
                ready_after_kill,
                logs,
            ))
        }
        .await;
        let summary = load.finish(&p).await?;
        let (gone_after, gone_after_kill, restarted, ready_after_kill, logs) = watched?;
        Ok((
            summary,
            grace,
            gone_after,
            gone_after_kill,
            restarted,
            ready_after_kill,
            logs,
        ))
    })
    .await;
    let (summary, grace, gone_after, gone_after_kill, restarted, ready_after_kill, logs) = outcome?;
    eprintln!(
        "measured: native sidecar killed mid-drain: the kubelet restarted it {restarted} time(s) during \
         the termination; pod gone {:.1}s after its deletion ({:.1}s after the kill, grace \
         period {}s); load {} of {} failed {:?}",
        gone_after.as_secs_f64(),
        gone_after_kill.as_secs_f64(),
        grace.as_secs(),
        summary.failed,
        summary.requests,
        summary.by_detail
    );
    ensure!(
        !ready_after_kill,
        "the pod turned Ready again after its sidecar was killed mid-drain"
    );
    ensure!(
        gone_after <= grace + Duration::from_secs(5),
        "the pod outlived its grace period ({}s) by more than 5s: {:.1}s",
        grace.as_secs(),
        gone_after.as_secs_f64()
    );
    if restarted > 0 && !logs.is_empty() {
        ensure!(
            logs.contains("carrying it on"),
            "the restarted sidecar did not carry the drain on: {logs}"
        );
    }
    Ok(())
}
