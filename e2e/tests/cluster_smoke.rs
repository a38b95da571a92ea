//! Smoke tests of the e2e cluster itself (local single-node cluster or kind):
//! our image runs, a Service routes through its ClusterIP (kube-proxy), and pod deletion
//! follows Kubernetes' termination order: preStop hook, then SIGTERM, then SIGKILL at
//! the end of the grace period, with the EndpointSlice showing the endpoint terminating.
//!
//! Skipped (with a message) outside the cluster tier; see `kubegrace_e2e::cluster_client`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use futures_util::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::runtime::conditions;
use kube::{Api, Client};
use kubegrace_e2e::scenario::demo_container;
use kubegrace_e2e::{http_get, in_test_namespace, poll, wait_deleted, wait_for};
use serde_json::json;

const APP_PORT: u16 = 8080;

fn container(args: &[&str], pre_stop_hold_ms: Option<u64>) -> serde_json::Value {
    let mut c = demo_container();
    c["args"] = json!(args);
    if let Some(ms) = pre_stop_hold_ms {
        c["lifecycle"] = json!({"preStop": {"httpGet": {"path": format!("/prestop?hold_ms={ms}"), "port": "http"}}});
    }
    c
}

fn service(name: &str, app: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?)
}

fn pod(
    name: &str,
    grace_seconds: i64,
    args: &[&str],
    pre_stop_hold_ms: Option<u64>,
) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": grace_seconds,
            "automountServiceAccountToken": false,
            "containers": [container(args, pre_stop_hold_ms)],
        },
    }))?)
}

async fn pod_ip(pods: &Api<Pod>, name: &str) -> Result<String> {
    let pod = wait_for(
        pods,
        name,
        "pod ready",
        Duration::from_secs(90),
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        },
    )
    .await?;
    pod.status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| anyhow!("pod {name} has no IP"))
}

/// GETs `url` from inside the cluster: a Job runs the demo image's `get` client; returns
/// the body it printed.
async fn probe_from_pod(client: &Client, ns: &str, url: &str) -> Result<String> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut probe = container(&["get", "--timeout", "60", url], None);
    probe["ports"] = json!([]);
    probe["readinessProbe"] = serde_json::Value::Null;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 120,
            "template": {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": false, "containers": [probe]}},
        },
    }))?;
    jobs.create(&PostParams::default(), &job).await?;
    let done = wait_for(
        &jobs,
        "probe",
        "probe job finished",
        Duration::from_secs(150),
        |j: Option<&Job>| {
            j.and_then(|j| j.status.as_ref())
                .is_some_and(|s| s.succeeded.unwrap_or(0) + s.failed.unwrap_or(0) > 0)
        },
    )
    .await?;
    let pod = pods
        .list(&ListParams::default().labels("job-name=probe"))
        .await?
        .items
        .into_iter()
        .next()
        .and_then(|p| p.metadata.name)
        .context("no pod for the probe job")?;
    let logs = pods
        .logs(&pod, &LogParams::default())
        .await
        .unwrap_or_default();
    ensure!(
        done.status.and_then(|s| s.succeeded).unwrap_or(0) > 0,
        "GET {url} from a pod failed: {logs}"
    );
    Ok(logs)
}

/// GET on a pod's port through the API server's pod proxy (works wherever the API works).
async fn pod_proxy_get(
    client: &Client,
    ns: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> Result<String> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy{path}"
    ))
    .body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Collects the container's log lines until it exits (follow), at most `limit`.
fn follow_logs(
    pods: Api<Pod>,
    name: String,
    limit: Duration,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut lines = Vec::new();
        let params = LogParams {
            follow: true,
            ..LogParams::default()
        };
        let collect = async {
            match pods.log_stream(&name, &params).await {
                Ok(stream) => {
                    let mut stream = stream.lines();
                    while let Some(Ok(line)) = stream.next().await {
                        lines.push(line);
                    }
                }
                Err(e) => lines.push(format!("<log stream failed: {e}>")),
            }
        };
        let _ = tokio::time::timeout(limit, collect).await;
        lines
    })
}

/// The conditions (ready, serving, terminating) of the endpoint that belongs to `pod_name`.
async fn endpoint_conditions(
    slices: &Api<EndpointSlice>,
    service: &str,
    pod_name: &str,
) -> Option<(bool, bool, bool)> {
    let list = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .ok()?;
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .find_map(|ep| {
            let target = ep.target_ref.as_ref()?.name.as_deref()?;
            (target == pod_name).then(|| {
                let c = ep.conditions.clone().unwrap_or_default();
                (
                    c.ready.unwrap_or(false),
                    c.serving.unwrap_or(false),
                    c.terminating.unwrap_or(false),
                )
            })
        })
}

#[tokio::test]
async fn service_cluster_ip_reaches_demo_deployment() -> Result<()> {
    in_test_namespace("service_cluster_ip_reaches_demo_deployment", "svc", |client: Client, ns: String| async move {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "demo"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "demo"}},
                "template": {
                    "metadata": {"labels": {"app": "demo"}},
                    "spec": {"automountServiceAccountToken": false, "containers": [container(&[], None)]},
                },
            },
        }))?;
        deployments.create(&PostParams::default(), &deployment).await?;
        let svc = services.create(&PostParams::default(), &service("demo", "demo")?).await?;
        let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).context("service has no ClusterIP")?;

        wait_for(&deployments, "demo", "deployment available", Duration::from_secs(120), conditions::is_deployment_completed())
            .await?;

        // From a pod, which works on any cluster: a Job runs the image's one-shot client.
        let body = probe_from_pod(&client, &ns, &format!("http://{cluster_ip}:80/")).await?;
        // (the log also holds the client's retry messages from before kube-proxy caught up)
        ensure!(body.lines().any(|l| l.starts_with("pod=demo-")), "unexpected answer through the ClusterIP: {body:?}");

        // From the host, where the node routes service traffic (the local cluster says so).
        if std::env::var_os("KUBEGRACE_E2E_HOST_REACHES_SERVICES").is_none() {
            eprintln!("not checking the ClusterIP from the host (KUBEGRACE_E2E_HOST_REACHES_SERVICES unset)");
            return Ok(());
        }
        let addr = format!("{cluster_ip}:80");
        let body = poll("an answer through the ClusterIP from the host", Duration::from_secs(60), Duration::from_millis(250), || async {
            match http_get(&addr, "/", Duration::from_secs(2)).await {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        })
        .await?;
        ensure!(body.starts_with("pod=demo-"), "unexpected answer through {addr}: {body:?}");

        // Both replicas answer through the same ClusterIP.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            if let Ok((200, body)) = http_get(&addr, "/", Duration::from_secs(2)).await {
                seen.insert(body.trim().to_owned());
            }
            if seen.len() == 2 {
                break;
            }
        }
        ensure!(seen.len() == 2, "expected both replicas behind {addr}, saw {seen:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn pod_deletion_runs_prestop_then_sigterm_and_endpoint_terminates() -> Result<()> {
    let test = "pod_deletion_runs_prestop_then_sigterm_and_endpoint_terminates";
    in_test_namespace(test, "stop", |client: Client, ns: String| async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        const HOLD_MS: u64 = 4000;
        const GRACE: i64 = 30;
        services.create(&PostParams::default(), &service("naive", "naive")?).await?;
        let created = pods.create(&PostParams::default(), &pod("naive", GRACE, &[], Some(HOLD_MS))?).await?;
        let uid = created.metadata.uid.context("pod without uid")?;
        pod_ip(&pods, "naive").await?;
        poll("endpoint ready", Duration::from_secs(30), Duration::from_millis(200), || async {
            endpoint_conditions(&slices, "naive", "naive").await.filter(|c| c.0)
        })
        .await?;

        let logs = follow_logs(pods.clone(), "naive".into(), Duration::from_secs(60));
        let started = Instant::now();
        pods.delete("naive", &DeleteParams::default()).await?;

        // While the preStop hook holds, the app still serves and has seen the hook ...
        poll("preStop hook recorded by the app", Duration::from_secs(HOLD_MS / 1000 + 5), Duration::from_millis(100), || async {
            matches!(pod_proxy_get(&client, &ns, "naive", APP_PORT, "/prestop-seen").await, Ok(b) if b.trim() == "true").then_some(())
        })
        .await?;
        // ... and the EndpointSlice shows the endpoint terminating, not ready, still serving.
        let (ready, serving, terminating) =
            poll("endpoint terminating", Duration::from_secs(HOLD_MS / 1000 + 5), Duration::from_millis(100), || async {
                endpoint_conditions(&slices, "naive", "naive").await.filter(|c| c.2)
            })
            .await?;
        ensure!(!ready && serving && terminating, "endpoint conditions ready={ready} serving={serving} terminating={terminating}");

        // SIGTERM comes after the hook; the naive app exits at once, well before the grace period ends.
        wait_deleted(&pods, "naive", &uid, Duration::from_secs(GRACE as u64 + 30)).await?;
        let elapsed = started.elapsed();
        eprintln!("pod gone {elapsed:?} after deletion (preStop hold {HOLD_MS} ms, grace {GRACE}s)");
        let lines = logs.await?;
        let prestop = lines.iter().position(|l| l.contains("prestop hook ran"));
        let sigterm = lines.iter().position(|l| l.contains("SIGTERM received"));
        ensure!(
            matches!((prestop, sigterm), (Some(p), Some(s)) if p < s),
            "expected the preStop hook before SIGTERM in the app's log, got {lines:?}"
        );
        ensure!(
            elapsed >= Duration::from_millis(HOLD_MS) && elapsed < Duration::from_secs(GRACE as u64),
            "pod took {elapsed:?} to go (preStop hold {HOLD_MS} ms, grace {GRACE}s)"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn grace_period_is_honoured_before_sigkill() -> Result<()> {
    in_test_namespace(
        "grace_period_is_honoured_before_sigkill",
        "grace",
        |client: Client, ns: String| async move {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            const GRACE: i64 = 5;
            let created = pods
                .create(
                    &PostParams::default(),
                    &pod("stubborn", GRACE, &["--on-sigterm", "ignore"], None)?,
                )
                .await?;
            let uid = created.metadata.uid.context("pod without uid")?;
            pod_ip(&pods, "stubborn").await?;

            let logs = follow_logs(pods.clone(), "stubborn".into(), Duration::from_secs(60));
            let started = Instant::now();
            pods.delete("stubborn", &DeleteParams::default()).await?;
            wait_deleted(
                &pods,
                "stubborn",
                &uid,
                Duration::from_secs(GRACE as u64 + 30),
            )
            .await?;
            let elapsed = started.elapsed();
            eprintln!("pod gone {elapsed:?} after deletion (grace {GRACE}s, SIGTERM ignored)");
            let lines = logs.await?;
            ensure!(
                lines.iter().any(|l| l.contains("ignoring SIGTERM")),
                "the app never saw SIGTERM: {lines:?}"
            );
            ensure!(
                !lines.iter().any(|l| l.contains("exiting")),
                "the app exited by itself, it should have been killed: {lines:?}"
            );
            // SIGKILL only when the grace period is over (a little slack for clock granularity).
            ensure!(
                elapsed >= Duration::from_millis(GRACE as u64 * 1000 - 500)
                    && elapsed < Duration::from_secs(GRACE as u64 + 20),
                "pod took {elapsed:?} to go with a grace period of {GRACE}s"
            );
            Ok(())
        },
    )
    .await
}
