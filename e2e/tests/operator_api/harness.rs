//! What every operator-in-process test needs: the cluster gate, a labelled
//! namespace, webhook configurations that call this host, the operator
//! started as a task, and small waits and probes.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use kubegrace_operator::cli::RunArgs;
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::keys;
use serde_json::json;

pub use kubegrace_e2e::scenario::{has_sidecar, pod_ready};

/// Tests share the cluster-wide watches of their operators: one at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
pub const TEST_LABEL: &str = "kubegrace.io/test";

/// The start of every test: the cluster under test through the e2e crate's
/// one gate (`None` outside the cluster tier: the test returns, having
/// printed that it skipped; in the tier a missing or unreachable cluster
/// fails the test), this process's turn ([`SERIAL`]) and the CRD installed.
pub async fn cluster(test: &str) -> Option<(Client, tokio::sync::MutexGuard<'static, ()>)> {
    let client = match kubegrace_e2e::cluster_client(test).await {
        Ok(client) => client?,
        Err(e) => panic!("{e:#}"),
    };
    let serial = SERIAL.lock().await;
    install_crd(&client).await;
    Some((client, serial))
}

/// Runs a test's `body` in the cluster tier ([`cluster`]; outside it, returns at once) in
/// its own labelled namespace `<prefix>-xxxxxx` (labelled `kubegrace.io/inject=enabled`
/// too when `inject_label`), deleted after the body returns.
pub async fn in_cluster(
    test: &str,
    prefix: &str,
    inject_label: bool,
    body: impl AsyncFnOnce(&Client, &TestNs),
) {
    let Some((client, _serial)) = cluster(test).await else {
        return;
    };
    let ns = TestNs::new(&client, prefix, inject_label).await;
    body(&client, &ns).await;
    ns.cleanup().await;
}

/// Polls `check` every 250ms until it returns Some, for at most `secs`.
pub async fn wait_for<T, F, Fut>(secs: u64, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    kubegrace_e2e::poll(
        what,
        Duration::from_secs(secs),
        Duration::from_millis(250),
        check,
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// Distinct free ports ([`kubegrace_e2e::free_ports`]).
pub fn free_ports<const N: usize>() -> [u16; N] {
    kubegrace_e2e::free_ports().expect("free ports")
}

pub async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = GraceRoute::crd();
    crds.patch(
        "graceroutes.kubegrace.io",
        &PatchParams::apply("kubegrace-operator-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the generated CRD installs");
    wait_for(60, "CRD Established", || async {
        let c = crds.get("graceroutes.kubegrace.io").await.ok()?;
        let established = c
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        established.then_some(())
    })
    .await;
}

pub struct TestNs {
    client: Client,
    pub name: String,
}

impl TestNs {
    pub async fn new(client: &Client, prefix: &str, inject_label: bool) -> Self {
        let name = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let mut labels = BTreeMap::from([(TEST_LABEL.to_string(), "true".to_string())]);
        if inject_label {
            labels.insert(keys::INJECT.into(), "enabled".into());
        }
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("ns");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        Self {
            client: client.clone(),
            name,
        }
    }

    /// Deletes the namespace and what the test made for it ([`kubegrace_e2e::delete_test_namespace`]).
    pub async fn cleanup(self) {
        kubegrace_e2e::delete_test_namespace(&self.client, &self.name).await;
    }
}

/// A webhook configuration for this namespace only, calling the operator on
/// this host.
pub async fn webhook_config(client: &Client, ns: &str, port: u16, failure_policy: &str) {
    let pods = json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"});
    let mut entry = webhook_entry(
        ns,
        port,
        "pod.inject.kubegrace.io",
        "/mutate",
        pods,
        failure_policy,
    );
    entry["reinvocationPolicy"] = json!("IfNeeded");
    create_webhook_config::<MutatingWebhookConfiguration>(client, ns, entry).await;
}

/// [`webhook_config`] calling a free port of this host; returns the port, where the
/// operator must serve.
pub async fn webhook_on_free_port(client: &Client, ns: &str, failure_policy: &str) -> u16 {
    let port = free_port();
    webhook_config(client, ns, port, failure_policy).await;
    port
}

/// The GraceRoute validating webhook for this namespace only, calling the
/// operator on this host; failurePolicy Fail, so a refusal can only come
/// from the operator's answer.
pub async fn validating_webhook_config(client: &Client, ns: &str, port: u16) {
    let routes = json!({"apiGroups": ["kubegrace.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["graceroutes"], "scope": "Namespaced"});
    let entry = webhook_entry(
        ns,
        port,
        "graceroutes.validate.kubegrace.io",
        "/validate",
        routes,
        "Fail",
    );
    create_webhook_config::<ValidatingWebhookConfiguration>(client, ns, entry).await;
}

/// One webhook entry for objects in `ns` matching `rule`, calling the
/// operator's `path` on this host.
fn webhook_entry(
    ns: &str,
    port: u16,
    name: &str,
    path: &str,
    rule: serde_json::Value,
    failure_policy: &str,
) -> serde_json::Value {
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}")},
        "rules": [rule],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "timeoutSeconds": 5,
    })
}

/// Creates a webhook configuration named after the test's namespace (and
/// labelled, for cleanup) with the one `entry`.
async fn create_webhook_config<K>(client: &Client, ns: &str, entry: serde_json::Value)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let config: K = serde_json::from_value(json!({
        "metadata": {"name": ns, "labels": {TEST_LABEL: "true"}},
        "webhooks": [entry],
    }))
    .expect("webhook configuration");
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", K::kind(&())));
}

/// The operator running as a task: its shutdown trigger and the task.
pub type Operator = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<kubegrace_operator::Result<()>>,
);

/// Starts the operator in-process with its webhook on `webhook_port`.
pub fn start_operator(client: &Client, ns: &str, webhook_port: u16) -> Operator {
    start_operator_extra(client, ns, webhook_port, &[])
}

/// [`start_operator`] with the admin port (metrics, `/readyz`) on `admin_port`.
pub fn start_operator_with_admin(
    client: &Client,
    ns: &str,
    webhook_port: u16,
    admin_port: u16,
) -> Operator {
    start_operator_extra(
        client,
        ns,
        webhook_port,
        &[format!("--admin-addr=127.0.0.1:{admin_port}")],
    )
}

/// Stops an operator started here and waits (at most 20s) for it to end.
pub async fn stop_operator((stop, task): Operator) {
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
}

/// Waits until the operator has written its CA into the test's mutating
/// webhook configuration: before that the API server cannot call it.
pub async fn wait_ca_bundle(client: &Client, ns: &str) {
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(30, "caBundle patched", || async {
        let m = mwcs.get(ns).await.ok()?;
        m.webhooks?
            .first()?
            .client_config
            .ca_bundle
            .as_ref()
            .map(|_| ())
    })
    .await;
}

/// Creates `obj` through `api`; panics with `what` when the API server refuses.
pub async fn create<K>(api: &Api<K>, obj: &K, what: &str) -> K
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(&PostParams::default(), obj).await.expect(what)
}

/// Merge-patches the spec of route `name` with `spec`.
pub async fn patch_route_spec(
    routes: &Api<GraceRoute>,
    name: &str,
    spec: serde_json::Value,
) -> kube::Result<GraceRoute> {
    routes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
}

/// Deletes route `name` and waits until it is gone: the operator (still running) removed
/// its finalizer.
pub async fn delete_route(routes: &Api<GraceRoute>, name: &str) {
    routes
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete route");
    wait_for(60, &format!("route {name} gone"), || async {
        routes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Waits until route `name` has the condition `(type, status, reason)`; returns its
/// message.
pub async fn wait_condition(
    routes: &Api<GraceRoute>,
    name: &str,
    (type_, want_status, want_reason): (&str, &str, &str),
) -> String {
    let what = format!("{name}: {type_}={want_status} {want_reason}");
    wait_for(60, &what, || async {
        let r = routes.get(name).await.ok()?;
        let (status, reason, msg) = condition(&r, type_)?;
        (status == want_status && reason == want_reason).then_some(msg)
    })
    .await
}

/// Deletes the named routes and waits until they are gone: the operator
/// (still running) removed its finalizer from each.
pub async fn delete_routes(routes: &Api<GraceRoute>, names: &[&str], what: &str) {
    for name in names {
        routes
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for(60, what, || async {
        routes
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
}

/// Waits for a Warning Event with this reason in the namespace: what a
/// person browsing `kubectl get events` sees.
pub async fn wait_warning_event(client: &Client, ns: &str, reason: &str) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    wait_for(30, &format!("a Warning Event {reason}"), || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
            .then_some(())
    })
    .await;
}

/// The pause image the test Deployments run (no sidecar needed to schedule).
pub fn pause_image() -> String {
    format!("localhost/kubegrace/pause:{}", kubegrace_e2e::image_tag())
}

pub fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app", "image": pause_image(), "imagePullPolicy": "Never",
                    "ports": [{"name": "http", "containerPort": 8080}]
                }]}
            }
        }
    }))
    .expect("deployment")
}

/// [`deployment`] `name` running `container` (JSON) instead of the pause one.
pub fn deployment_with(name: &str, container: serde_json::Value) -> Deployment {
    let mut d = deployment(name);
    if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.containers = vec![serde_json::from_value(container).expect("container")];
    }
    d
}

/// Creates Deployment `web` serving HTTP: the demo app on port `http`, so an injected pod's
/// sidecar turns ready and a rollout completes (a pause container would leave the
/// sidecar unready, the new pod never Ready, and the old one running for good).
pub async fn create_serving_web_deployment(client: &Client, ns: &str) -> Api<Deployment> {
    let d = deployment_with("web", kubegrace_e2e::scenario::demo_container());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    create(&deployments, &d, "create deployment").await;
    deployments
}

/// Creates Deployment `web` ([`deployment`]) in `ns`; returns the namespace's Deployments.
pub async fn create_web_deployment(client: &Client, ns: &str) -> Api<Deployment> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    create(&deployments, &deployment("web"), "create deployment").await;
    deployments
}

pub fn condition(r: &GraceRoute, type_: &str) -> Option<(String, String, String)> {
    r.condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// One HTTP/1.1 GET over a plain socket (the host reaches pod IPs on the
/// local cluster's bridge); returns the status line and body.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(out)
}

/// Starts the operator in-process on the given client: flags for this
/// test's namespace, webhook configurations and Lease, `extra` replacing or
/// adding to them.
pub fn start_operator_extra(
    client: &Client,
    ns: &str,
    webhook_port: u16,
    extra: &[String],
) -> Operator {
    // The kernel may hand out the webhook's port again once it is free.
    let admin = loop {
        let p = free_port();
        if p != webhook_port {
            break p;
        }
    };
    let mut flags = vec![
        format!("--namespace={ns}"),
        format!("--webhook-addr=127.0.0.1:{webhook_port}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--webhook-config={ns}"),
        // Never the chart's default name: a real install may be running.
        format!("--validating-webhook-config={ns}"),
        "--webhook-extra-san=127.0.0.1".into(),
        format!("--leader-election-lease=kubegrace-test-{ns}"),
        format!("--sidecar-image={}", kubegrace_e2e::sidecar_image()),
        // These tests check the native placement (an init container with restartPolicy
        // Always); the default, classic, is what the chart-installed e2e suite runs.
        "--sidecar-mode=native".into(),
    ];
    // clap refuses a flag given twice: `extra` replaces the default.
    let name = |f: &str| f.split('=').next().unwrap_or_default().to_string();
    flags.retain(|f| !extra.iter().any(|e| name(e) == name(f)));
    flags.extend(extra.iter().cloned());
    let args = RunArgs::from_args(flags).expect("valid flags");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(kubegrace_operator::run::run(
        client.clone(),
        args,
        async move {
            let _ = rx.await;
        },
    ));
    (tx, task)
}

/// GraceRoute `name` on Deployment `target`, port `http`, nothing else set.
pub fn graceroute(name: &str, target: &str) -> GraceRoute {
    graceroute_spec(
        name,
        json!({"targetRef": {"kind": "Deployment", "name": target}, "ports": [{"name": "http"}]}),
    )
}

/// GraceRoute `name` with this spec.
pub fn graceroute_spec(name: &str, spec: serde_json::Value) -> GraceRoute {
    serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("route")
}

/// `kubectl annotate deployment NAME kubegrace.io/inject=enabled`, as a merge patch.
pub async fn annotate_inject(deployments: &Api<Deployment>, name: &str) {
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": { (keys::INJECT): "enabled" }}})),
        )
        .await
        .expect("annotate");
}
