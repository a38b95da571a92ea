//! Situations every real cluster has, on the real cluster:
//!
//! - a Service that targets the app's port *number* bypasses the sidecar: the route says
//!   so (`Degraded`/`ServiceBypassesSidecar` naming the Service and the fix, an Event), the
//!   validating webhook warns at `kubectl apply` time, and a named Service is not reported;
//! - GitOps: the same manifest applied twice with client-side `kubectl apply` and twice
//!   with `helm upgrade` (a tiny chart written here) makes no extra ReplicaSet, and the
//!   pods still get the route's time budget (set per pod by the webhook);
//! - a pod that already listens on Istio's 15020 and on our default admin and listener
//!   ports is injected on the next free ones, all containers Ready, served by the sidecar;
//! - `drain.readiness: stayServing` (for `externalTrafficPolicy: Local` load balancers):
//!   a deleted pod's endpoint stays `serving: true, terminating: true` in its
//!   EndpointSlice through the drain's grace phase, while with the default `failFast` the
//!   same pod's endpoint stops serving within a probe period or two.
//!
//! One chart install for all four. Skipped (with a message) outside the cluster tier.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kubegrace_e2e::demo_image;
use kubegrace_e2e::scenario::{
    APP_PORT, Options, Patience, Progress, Scenario, WITH, demo_container, graceroute_api,
    has_sidecar, keep_from_env, route_condition, service, with_install,
};
use kubegrace_sidecar_api::{admin, keys, pod};
use serde_json::json;

#[tokio::test]
async fn bypassing_services_gitops_reapplies_and_taken_ports_are_handled() -> Result<()> {
    let test = "bypassing_services_gitops_reapplies_and_taken_ports_are_handled";
    let client = kubegrace_e2e::cluster_or_skip!(test);
    let opts = Options::new("kg-e2e-real");
    let p = Progress::default();
    let failures = with_install(&client, &opts, &p, keep_from_env(), async |run| {
        let bypass = run.scenario("bypass").await?;
        // Each flow waits for as many pods as its Deployment asks for.
        let gitops_opts = Options {
            replicas: GITOPS_REPLICAS,
            ..opts.clone()
        };
        let gitops = run.scenario_with(&gitops_opts, "gitops").await?;
        let ports_opts = Options {
            replicas: 1,
            ..opts.clone()
        };
        let ports = run.scenario_with(&ports_opts, "ports").await?;
        let serving = run.scenario_with(&ports_opts, "serving").await?;
        let mut failures = Vec::new();
        for (flow, result) in [
            ("bypassing Service", bypass_flow(&bypass, &p).await),
            ("GitOps re-apply", gitops_flow(&gitops, &p).await),
            ("taken ports", ports_flow(&ports, &p).await),
            (
                "stayServing readiness",
                stay_serving_flow(&serving, &p).await,
            ),
        ] {
            match result {
                Ok(line) => eprintln!("{flow}: {line}"),
                Err(e) => failures.push(format!("{flow}: {e:#}")),
            }
        }
        Ok(failures)
    })
    .await?;
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// `kubectl <args>` with the test's kubeconfig, `stdin` piped in; stdout and stderr.
async fn kubectl(args: &[&str], stdin: &str) -> Result<(String, String)> {
    use tokio::io::AsyncWriteExt;
    let kubeconfig = kubegrace_e2e::kubeconfig_path().context("no kubeconfig")?;
    let bin = std::env::var_os("KUBEGRACE_TOOLS_BIN")
        .map(|d| Path::new(&d).join("kubectl"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "kubectl".into());
    let mut child = tokio::process::Command::new(&bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin.as_bytes()).await?;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("kubectl took longer than 60s")??;
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    ensure!(out.status.success(), "kubectl {args:?}: {e}");
    Ok((o, e))
}

fn route_yaml(name: &str) -> String {
    json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": {"targetRef": {"kind": "Deployment", "name": name}, "ports": [{"name": "http"}],
                 "drain": {"minDelay": "2s", "quiet": "1s", "maxDelay": "5s", "timeout": "10s"}},
    })
    .to_string()
}

/// The route's condition `type_` as (status, reason, message).
async fn condition(sc: &Scenario, route: &str, type_: &str) -> Result<(String, String, String)> {
    let r = graceroute_api(&sc.client, &sc.namespace).get(route).await?;
    Ok(route_condition(&r, type_))
}

/// Waits until the `Degraded` condition of route `WITH` is as `wanted(status, reason)`
/// says; returns its message.
async fn wait_degraded(
    sc: &Scenario,
    p: &Progress,
    what: &str,
    wanted: impl Fn(&str, &str) -> bool,
) -> Result<String> {
    p.wait(what, Patience::API_CHANGE, || async {
        let (status, reason, msg) = condition(sc, WITH, "Degraded")
            .await
            .map_err(|e| format!("{e:#}"))?;
        if wanted(&status, &reason) {
            Ok(msg)
        } else {
            Err(format!("Degraded {status} {reason}: {msg}"))
        }
    })
    .await
}

/// Waits until the route validator answers in `sc`'s namespace: the API server picks up
/// the webhook's caBundle a moment after it is written, and with failurePolicy Ignore a
/// route applied before that is admitted without warnings. The probe is a server-side dry
/// run of a route whose target does not exist, which the validator always warns about.
async fn route_validator_answers(sc: &Scenario, p: &Progress) -> Result<()> {
    let probe = route_yaml("validator-probe");
    p.wait(
        "the route validator answers (server-side dry run)",
        Patience::API_CHANGE,
        || async {
            let (_, warnings) = kubectl(
                &["apply", "--dry-run=server", "-n", &sc.namespace, "-f", "-"],
                &probe,
            )
            .await
            .map_err(|e| format!("{e:#}"))?;
            if warnings.contains("does not exist in namespace") {
                Ok(())
            } else {
                Err(format!("no warning yet: {warnings:?}"))
            }
        },
    )
    .await
}

/// A Service by number (reported, with the fix), one by name (not reported).
async fn bypass_flow(sc: &Scenario, p: &Progress) -> Result<String> {
    // The app and the numeric Service exist first, so the webhook can see it at apply time.
    sc.create_app(WITH, true, p).await?;
    let services: Api<Service> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let numeric: Service = serde_json::from_value(json!({
        "metadata": {"name": "by-number"},
        "spec": {"selector": {"app": WITH}, "ports": [{"port": 80, "targetPort": APP_PORT}]},
    }))?;
    services.create(&PostParams::default(), &numeric).await?;
    route_validator_answers(sc, p).await?;
    let (_, warnings) = kubectl(
        &["apply", "-n", &sc.namespace, "-f", "-"],
        &route_yaml(WITH),
    )
    .await?;
    p.step(format!(
        "kubectl apply of the route warned: {}",
        warnings.trim()
    ));
    // The admission warning counts the Services and names none (the webhook tells a
    // caller nothing the review did not name); the route's Degraded condition, read
    // under the GraceRoute's own RBAC, names them (below).
    ensure!(
        warnings.contains("1 Service(s) in namespace")
            && warnings.contains("by the app's port number")
            && !warnings.contains("by-number"),
        "no admission warning counting the Service by number: {warnings:?}"
    );
    ensure!(
        !warnings.contains(&format!("Service {WITH} ")),
        "the named Service {WITH} was reported: {warnings}"
    );
    sc.settle(WITH, true, p).await?;
    let msg = wait_degraded(
        sc,
        p,
        "route Degraded: ServiceBypassesSidecar",
        |status, reason| status == "True" && reason == "ServiceBypassesSidecar",
    )
    .await?;
    ensure!(
        msg.contains("Service by-number port 80 targets 8080 by number")
            && msg.contains("kubectl patch service by-number")
            && !msg.contains(&format!("Service {WITH} ")),
        "condition message: {msg}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(sc.client.clone(), &sc.namespace);
    let seen = events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("ServiceBypassesSidecar"));
    ensure!(seen, "no ServiceBypassesSidecar Event in {}", sc.namespace);
    // The fix from the message clears it (the operator watches Services).
    services
        .patch(
            "by-number",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}]}})),
        )
        .await?;
    wait_degraded(
        sc,
        p,
        "Degraded cleared once the Service targets the port name",
        |status, _| status == "False",
    )
    .await?;
    Ok(format!("reported, then cleared by the fix: {msg}"))
}

/// Replicas of the GitOps flow's Deployments.
const GITOPS_REPLICAS: i32 = 2;

/// A GitOps-style manifest: the inject label in the template (no operator copy), and the
/// fields a chart typically spells out, which an operator editing them would fight over.
fn gitops_deployment(name: &str) -> serde_json::Value {
    let mut app = demo_container();
    app["resources"] = json!({"requests": {"cpu": "10m", "memory": "16Mi"}});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": GITOPS_REPLICAS,
            "minReadySeconds": 0,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, (keys::INJECT): "enabled"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "automountServiceAccountToken": false,
                    "containers": [app],
                },
            },
        },
    })
}

async fn replica_sets(sc: &Scenario, app: &str) -> Result<BTreeSet<String>> {
    let rs: Api<ReplicaSet> = Api::namespaced(sc.client.clone(), &sc.namespace);
    Ok(rs
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect())
}

/// Polls for `window` that the ReplicaSets of `app` stay `want` (an operator fighting the
/// re-apply would add one within a second or two of it).
async fn stays(sc: &Scenario, app: &str, want: &BTreeSet<String>, what: &str) -> Result<()> {
    for _ in 0..10 {
        let now = replica_sets(sc, app).await?;
        ensure!(
            &now == want,
            "{what}: ReplicaSets of {app} changed from {want:?} to {now:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// The app's Service (by port name, as the scenario's), which `settle` answers through.
async fn create_service(sc: &Scenario, app: &str) -> Result<()> {
    Api::<Service>::namespaced(sc.client.clone(), &sc.namespace)
        .create(&PostParams::default(), &service(app)?)
        .await
        .with_context(|| format!("creating Service {app}"))?;
    Ok(())
}

/// Every live pod of `app` has the sidecar and a grace period of at least `budget`.
async fn pods_carry(sc: &Scenario, app: &str, budget: i64) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    for pod in pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
    {
        let tgp = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds);
        ensure!(
            has_sidecar(&pod) && tgp >= Some(budget),
            "pod {:?}: sidecar {}, terminationGracePeriodSeconds {tgp:?}, budget {budget}",
            pod.metadata.name,
            has_sidecar(&pod)
        );
    }
    Ok(())
}

/// The same manifest re-applied by kubectl and by helm makes no new ReplicaSet, and the pods keep the budget.
async fn gitops_flow(sc: &Scenario, p: &Progress) -> Result<String> {
    let ns = sc.namespace.as_str();
    // kubectl: route, then the manifest, applied client-side.
    const KC: &str = "kubectl-app";
    kubectl(&["apply", "-n", ns, "-f", "-"], &route_yaml(KC)).await?;
    create_service(sc, KC).await?;
    let manifest = gitops_deployment(KC).to_string();
    kubectl(&["apply", "-n", ns, "-f", "-"], &manifest).await?;
    sc.settle(KC, true, p).await?;
    let budget = sc.wait_budget_applied(KC, p).await?;
    ensure!(
        budget > 5,
        "the test needs a budget above the manifest's 5s"
    );
    pods_carry(sc, KC, budget).await?;
    let first = replica_sets(sc, KC).await?;
    ensure!(
        first.len() == 1,
        "ReplicaSets after the first apply: {first:?}"
    );
    for i in 1..=2 {
        kubectl(&["apply", "-n", ns, "-f", "-"], &manifest).await?;
        stays(sc, KC, &first, &format!("kubectl apply #{}", i + 1)).await?;
    }

    // helm: a chart of one Deployment, installed, then upgraded twice unchanged.
    const HELM: &str = "helm-app";
    kubectl(&["apply", "-n", ns, "-f", "-"], &route_yaml(HELM)).await?;
    create_service(sc, HELM).await?;
    let dir = std::env::temp_dir().join(format!("kg-real-chart-{ns}"));
    std::fs::create_dir_all(dir.join("templates"))?;
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: gitops-app\nversion: 0.1.0\n",
    )?;
    std::fs::write(
        dir.join("templates/deployment.yaml"),
        // JSON is YAML: Helm reads it as the template.
        serde_json::to_string_pretty(&gitops_deployment(HELM))?,
    )?;
    let chart = dir.to_string_lossy().into_owned();
    let helm = |verb: &'static str| {
        let chart = chart.clone();
        async move {
            let kubeconfig = kubegrace_e2e::kubeconfig_path().context("no kubeconfig")?;
            let bin = std::env::var_os("KUBEGRACE_TOOLS_BIN")
                .map(|d| Path::new(&d).join("helm"))
                .filter(|p| p.exists())
                .unwrap_or_else(|| "helm".into());
            let out = tokio::time::timeout(
                Duration::from_secs(90),
                tokio::process::Command::new(bin)
                    .args([verb, "gitops-app", &chart, "-n", ns, "--kubeconfig"])
                    .arg(&kubeconfig)
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .context("helm took longer than 90s")??;
            ensure!(
                out.status.success(),
                "helm {verb}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok::<_, anyhow::Error>(())
        }
    };
    helm("install").await?;
    sc.settle(HELM, true, p).await?;
    pods_carry(sc, HELM, budget).await?;
    let first_helm = replica_sets(sc, HELM).await?;
    ensure!(
        first_helm.len() == 1,
        "ReplicaSets after helm install: {first_helm:?}"
    );
    for i in 1..=2 {
        helm("upgrade").await?;
        stays(sc, HELM, &first_helm, &format!("helm upgrade #{i}")).await?;
    }
    pods_carry(sc, KC, budget).await?;
    pods_carry(sc, HELM, budget).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "budget {budget}s on every pod; 1 ReplicaSet each after 3x kubectl apply and helm install + 2x upgrade"
    ))
}

/// The app listens on Istio's 15020 and on our default admin and listener ports.
async fn ports_flow(sc: &Scenario, p: &Progress) -> Result<String> {
    const APP: &str = "taken-ports";
    let extra = |port: u16| {
        json!({
            "name": format!("also-{port}"), "image": demo_image(), "imagePullPolicy": "Never",
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "KUBEGRACE_DEMO_LISTEN", "value": format!("0.0.0.0:{port}")}],
            "ports": [{"name": format!("p{port}"), "containerPort": port}],
            "resources": {"requests": {"cpu": "5m", "memory": "8Mi"}},
            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                "capabilities": {"drop": ["ALL"]}},
        })
    };
    let mut d = gitops_deployment(APP);
    d["spec"]["replicas"] = json!(1);
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .context("containers")?;
    for port in [15020, admin::DEFAULT_PORT, pod::FIRST_LISTEN_PORT] {
        containers.push(extra(port));
    }
    kubectl(&["apply", "-n", &sc.namespace, "-f", "-"], &route_yaml(APP)).await?;
    create_service(sc, APP).await?;
    kubectl(&["apply", "-n", &sc.namespace, "-f", "-"], &d.to_string()).await?;
    sc.settle(APP, true, p).await?;
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), &sc.namespace);
    let pod = pods
        .list(&ListParams::default().labels(&format!("app={APP}")))
        .await?
        .items
        .into_iter()
        .next()
        .context("no pod")?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let all_ready = kubegrace_e2e::container_statuses(&status).all(|c| c.ready);
    ensure!(
        all_ready,
        "not every container of {name} is ready: {status:?}"
    );
    let admin = sc.admin_port(&name).await?;
    let spec = pod.spec.as_ref().context("spec")?;
    let listen = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| c.name == pod::CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("http"))
        .map(|p| p.container_port)
        .context("the sidecar has no http port")?;
    ensure!(
        (admin, listen) == (15182, 15183),
        "admin {admin}, listener {listen}: expected the next free ports 15182, 15183"
    );
    let ready = sc.admin_get(&name, admin::path::READY).await?;
    let body = sc
        .pod_get(&name, u16::try_from(listen)?, "/")
        .await
        .context("GET / on the sidecar's listener")?;
    ensure!(
        body.starts_with("pod="),
        "answer through the sidecar: {body}"
    );
    Ok(format!(
        "injected with admin {admin} and listener {listen}; /ready {}; served: {}",
        ready.trim(),
        body.trim()
    ))
}

/// Grace phase of the two routes in `stay_serving_flow`: long enough that a probe period
/// and the EndpointSlice controller's latency are small beside it.
const SERVING_MIN_DELAY_S: u64 = 10;

/// How long each app's deleted pod stayed `serving: true, terminating: true` in its
/// EndpointSlice: `stayServing` through the grace phase, `failFast` (the baseline, same
/// timers) at most a probe period or two.
async fn stay_serving_flow(sc: &Scenario, p: &Progress) -> Result<String> {
    const STAY: &str = "stay-serving";
    const FAIL: &str = "fail-fast";
    let ns = sc.namespace.as_str();
    let mut old_pods = BTreeMap::new();
    for (app, readiness) in [(STAY, "stayServing"), (FAIL, "failFast")] {
        let route = json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": app},
            "spec": {"targetRef": {"kind": "Deployment", "name": app}, "ports": [{"name": "http"}],
                     "drain": {"minDelay": format!("{SERVING_MIN_DELAY_S}s"), "quiet": "500ms",
                               "maxDelay": format!("{}s", SERVING_MIN_DELAY_S + 2),
                               "timeout": "5s", "readiness": readiness}},
        });
        kubectl(&["apply", "-n", ns, "-f", "-"], &route.to_string()).await?;
        create_service(sc, app).await?;
        let mut d = gitops_deployment(app);
        d["spec"]["replicas"] = json!(1);
        kubectl(&["apply", "-n", ns, "-f", "-"], &d.to_string()).await?;
    }
    let pods: Api<Pod> = Api::namespaced(sc.client.clone(), ns);
    for app in [STAY, FAIL] {
        sc.settle(app, true, p).await?;
        let pod = kubegrace_e2e::a_pod_of(&pods, app)
            .await?
            .with_context(|| format!("{app}: no pod"))?;
        old_pods.insert(app, pod);
    }
    p.step(format!(
        "deleting {:?} and watching their EndpointSlices",
        old_pods.values().collect::<Vec<_>>()
    ));
    for pod in old_pods.values() {
        pods.delete(pod, &Default::default()).await?;
    }
    let slices: Api<EndpointSlice> = Api::namespaced(sc.client.clone(), ns);
    // Per app: when its old endpoint was first and last seen serving while terminating.
    let mut spans: BTreeMap<&str, (Option<Instant>, Option<Instant>)> = BTreeMap::new();
    let watch_for = Duration::from_secs(SERVING_MIN_DELAY_S + 6);
    let start = Instant::now();
    while start.elapsed() < watch_for {
        for (app, pod) in &old_pods {
            let list = slices
                .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={app}")))
                .await?;
            let serving_while_terminating = list.items.iter().flat_map(|s| &s.endpoints).any(|e| {
                let c = e.conditions.clone().unwrap_or_default();
                e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(pod.as_str())
                    && c.serving == Some(true)
                    && c.terminating == Some(true)
            });
            if serving_while_terminating {
                let span = spans.entry(app).or_default();
                let now = Instant::now();
                span.0.get_or_insert(now);
                span.1 = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let lasted = |app: &str| match spans.get(app) {
        Some((Some(first), Some(last))) => last.duration_since(*first).as_secs_f64(),
        _ => 0.0,
    };
    let (stay, fail) = (lasted(STAY), lasted(FAIL));
    ensure!(
        stay >= (SERVING_MIN_DELAY_S / 2) as f64,
        "stayServing: the deleted pod's endpoint was serving while terminating for {stay:.1}s, \
         expected most of the {SERVING_MIN_DELAY_S}s grace phase (failFast: {fail:.1}s)"
    );
    ensure!(
        fail < (SERVING_MIN_DELAY_S / 2) as f64,
        "failFast: the deleted pod's endpoint was serving while terminating for {fail:.1}s: \
         readiness did not fail at the drain's start (stayServing: {stay:.1}s)"
    );
    Ok(format!(
        "serving while terminating: stayServing {stay:.1}s, failFast {fail:.1}s (grace phase {SERVING_MIN_DELAY_S}s)"
    ))
}
