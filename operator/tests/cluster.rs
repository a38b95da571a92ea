//! API integration tests against a real kube-apiserver (the local cluster of
//! `e2e/cluster/up`, or any cluster in `KUBEGRACE_E2E_KUBECONFIG` /
//! `KUBECONFIG`). Without one they print "skipped: no cluster" and pass.
//!
//! The operator runs in-process on this host; the API server reaches its
//! webhook by URL (`https://127.0.0.1:<port>/mutate`), with the caBundle the
//! operator itself patches in. Each test has its own labelled namespace,
//! webhook configuration, Lease and ports, and removes them at the end; the
//! tests run one at a time because every operator watches all namespaces.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use kubegrace_operator::cli::RunArgs;
use kubegrace_operator::crd::GraceRoute;
use kubegrace_sidecar_api::config::Config;
use kubegrace_sidecar_api::{admin, keys, pod};
use serde_json::json;

/// Tests share the cluster-wide watches of their operators: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const TEST_LABEL: &str = "kubegrace.io/test";

async fn client() -> Option<Client> {
    // Only the cluster tier's variable: `make test-unit` must never touch the cluster the
    // shell's KUBECONFIG points at.
    let path = std::env::var("KUBEGRACE_E2E_KUBECONFIG")
        .ok()
        .filter(|p| !p.is_empty())?;
    let kc = Kubeconfig::read_from(&path).expect("readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("usable kubeconfig");
    Some(Client::try_from(config).expect("client"))
}

/// Polls `check` every 250ms until it returns Some, for at most `secs`.
async fn wait_for<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// Distinct free ports: the listeners are held until all are chosen (the
/// kernel happily hands the same port to consecutive binds otherwise).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("addr").port())
}

async fn install_crd(client: &Client) {
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

struct TestNs {
    client: Client,
    name: String,
}

impl TestNs {
    async fn new(client: &Client, prefix: &str, inject_label: bool) -> Self {
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

    async fn cleanup(self) {
        let _ = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        // The operator is stopped by now: drop the routes' finalizers, or
        // the namespace would wait for them forever.
        let routes: Api<GraceRoute> = Api::namespaced(self.client.clone(), &self.name);
        if let Ok(list) = routes.list(&ListParams::default()).await {
            for r in list {
                let _ = routes
                    .patch(
                        &r.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

/// A webhook configuration for this namespace only, calling the operator on
/// this host.
async fn webhook_config(client: &Client, ns: &str, port: u16, failure_policy: &str) {
    let mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": ns, "labels": {TEST_LABEL: "true"}},
        "webhooks": [{
            "name": "pod.inject.kubegrace.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/mutate")},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "reinvocationPolicy": "IfNeeded",
        }]
    }))
    .expect("mwc");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mwc)
        .await
        .expect("create webhook configuration");
}

/// The GraceRoute validating webhook for this namespace only, calling the
/// operator on this host; failurePolicy Fail, so a refusal can only come
/// from the operator's answer.
async fn validating_webhook_config(client: &Client, ns: &str, port: u16) {
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": ns, "labels": {TEST_LABEL: "true"}},
        "webhooks": [{
            "name": "graceroutes.validate.kubegrace.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
            "rules": [{"apiGroups": ["kubegrace.io"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["graceroutes"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": 5,
        }]
    }))
    .expect("vwc");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("create validating webhook configuration");
}

/// Starts the operator in-process; returns its shutdown trigger and task.
fn start_operator(
    client: &Client,
    ns: &str,
    webhook_port: u16,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<kubegrace_operator::Result<()>>,
) {
    let admin = loop {
        let p = free_port();
        if p != webhook_port {
            break p;
        }
    };
    start_operator_with_admin(client, ns, webhook_port, admin)
}

fn start_operator_with_admin(
    client: &Client,
    ns: &str,
    webhook_port: u16,
    admin_port: u16,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<kubegrace_operator::Result<()>>,
) {
    let args = RunArgs::from_args([
        "--namespace".to_string(),
        ns.to_string(),
        "--webhook-addr".into(),
        format!("127.0.0.1:{webhook_port}"),
        "--admin-addr".into(),
        format!("127.0.0.1:{admin_port}"),
        "--webhook-config".into(),
        ns.to_string(),
        // Never the chart's default name: a real install may be running.
        "--validating-webhook-config".into(),
        ns.to_string(),
        "--webhook-extra-san".into(),
        "127.0.0.1".into(),
        "--leader-election-lease".into(),
        format!("kubegrace-test-{ns}"),
        "--sidecar-image".into(),
        "localhost/kubegrace/sidecar:e2e".into(),
    ])
    .expect("valid flags");
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

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app", "image": "localhost/kubegrace/pause:e2e", "imagePullPolicy": "Never",
                    "ports": [{"name": "http", "containerPort": 8080}]
                }]}
            }
        }
    }))
    .expect("deployment")
}

fn condition(r: &GraceRoute, type_: &str) -> Option<(String, String, String)> {
    r.condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn has_sidecar(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .any(|c| c.name == pod::CONTAINER)
    })
}

macro_rules! cluster_or_skip {
    () => {
        match client().await {
            Some(c) => c,
            None => {
                println!("skipped: no cluster");
                return;
            }
        }
    };
}

#[tokio::test]
async fn the_api_server_refuses_invalid_routes_with_a_message_that_says_what_to_fix() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-invalid", false).await;
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let cases = [
        (
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "drain": {"minDelay": "2 seconds"}}),
            "should match",
        ),
        (
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "drain": {"minDelay": "20s", "maxDelay": "5s"}}),
            "minDelay 20s is longer than maxDelay 5s",
        ),
        (
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "selector": {"matchLabels": {"app": "web"}}, "ports": [{"name": "http"}]}),
            "set exactly one of targetRef",
        ),
        (
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "HTTP_PORT"}]}),
            "ports[0].name",
        ),
        (
            json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}], "rollout": {"maxSurge": 0, "maxUnavailable": 0}}),
            "cannot both be 0",
        ),
    ];
    // Sent untyped: the point is what the API server says.
    let ar = ApiResource::erase::<GraceRoute>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    for (i, (spec, expect)) in cases.into_iter().enumerate() {
        let route: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": format!("bad-{i}")},
            "spec": spec,
        }))
        .expect("object");
        let err = raw
            .create(&PostParams::default(), &route)
            .await
            .expect_err(&format!("case {i} must be refused"));
        let msg = err.to_string();
        assert!(
            msg.contains(expect),
            "case {i}: {msg:?} should say {expect:?}"
        );
    }
    // And the defaults a valid route gets from the schema.
    let ok: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "good"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}]},
    }))
    .expect("object");
    raw.create(&PostParams::default(), &ok)
        .await
        .expect("valid route accepted");
    let _ = routes;
    let good = Api::<GraceRoute>::namespaced(client.clone(), &ns.name)
        .get("good")
        .await
        .expect("typed read");
    assert_eq!(good.spec.drain.max_delay.to_string(), "15s");
    assert!(
        good.spec.rollout.is_none(),
        "no rollout block is defaulted in: the workload's own strategy stays"
    );
    assert_eq!(
        good.spec.ports[0].protocol,
        kubegrace_operator::crd::PortProtocol::Http
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn a_route_is_reconciled_injected_idempotent_and_restored_on_delete() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-route", false).await;
    let [port, admin] = free_ports::<2>();
    webhook_config(&client, &ns.name, port, "Fail").await;
    let (stop, task) = start_operator_with_admin(&client, &ns.name, port, admin);

    // The operator writes its CA into the webhook configuration.
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(30, "caBundle patched", || async {
        let m = mwcs.get(&ns.name).await.ok()?;
        m.webhooks?
            .first()?
            .client_config
            .ca_bundle
            .as_ref()
            .map(|_| ())
    })
    .await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web"))
        .await
        .expect("create deployment");
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route: GraceRoute = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "web"},
        "spec": {
            "targetRef": {"kind": "Deployment", "name": "web"},
            "ports": [{"name": "http"}],
            "drain": {"maxDelay": "10s", "timeout": "20s"},
            "routes": [{"name": "slow", "match": {"pathPrefix": "/slow"}, "timeout": "40s"}]
        }
    }))
    .expect("route");
    let started = std::time::Instant::now();
    routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create route");

    // Accepted, config written, budget = 10s + 40s (longest route) + 5s.
    let r = wait_for(60, "Accepted with budget", || async {
        let r = routes.get("web").await.ok()?;
        (r.status.as_ref()?.budget_seconds == Some(55)).then_some(r)
    })
    .await;
    let reconcile_time = started.elapsed();
    println!("first reconcile to status: {reconcile_time:?}");
    let (accepted, _, msg) = condition(&r, "Accepted").expect("Accepted");
    assert_eq!(accepted, "True", "{msg}");
    let (ready, reason, msg) = condition(&r, "Ready").expect("Ready");
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "InjectionNotEnabled"),
        "{msg}"
    );
    assert!(
        msg.contains("kubectl annotate deployment web kubegrace.io/inject=enabled"),
        "{msg}"
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get("kubegrace-web")
        .await
        .expect("ConfigMap");
    let yaml = cm
        .data
        .as_ref()
        .and_then(|d| d.get(pod::CONFIG_FILE))
        .expect("config.yaml");
    let config: Config = serde_yaml::from_str(yaml).expect("the sidecar parses it");
    config.validate().expect("the sidecar accepts it");
    assert_eq!(config.drain.timeout.get(), Duration::from_secs(40));
    // No rollout block: the Deployment is left exactly as the user wrote it
    // (the grace period reaches pods through the webhook).
    let d = deployments.get("web").await.expect("deployment");
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(
        spec.template
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
        Some(30)
    );
    assert_eq!(spec.min_ready_seconds.unwrap_or(0), 0);
    assert_eq!(
        d.metadata.generation,
        Some(1),
        "the operator wrote nothing into it"
    );
    assert!(!d.annotations().contains_key(keys::ORIGINAL));

    // Opt in: the operator copies the annotation into the template; the
    // rolled pods come back with the sidecar and the route turns Ready.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": { (keys::INJECT): "enabled" }}})),
        )
        .await
        .expect("annotate");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_for(90, "an injected pod of web", || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        list.items.iter().any(has_sidecar).then_some(())
    })
    .await;
    let r = wait_for(90, "route Ready", || async {
        let r = routes.get("web").await.ok()?;
        (condition(&r, "Ready")?.0 == "True").then_some(r)
    })
    .await;
    let status = r.status.expect("status");
    assert!(
        status.pods_injected >= 1 && status.pods_injected == status.pods_expected,
        "{status:?}"
    );

    // A pod created through the API server comes back injected, once.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "direct", "labels": { (keys::INJECT): "enabled" }, "annotations": { (keys::ROUTE): "web" }},
        "spec": {"containers": [{"name": "app", "image": "localhost/kubegrace/pause:e2e", "imagePullPolicy": "Never",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .expect("pod");
    let t0 = std::time::Instant::now();
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    println!("pod create through the webhook: {:?}", t0.elapsed());
    assert!(has_sidecar(&created), "injected");
    let spec = created.spec.as_ref().expect("spec");
    let sidecar = spec
        .init_containers
        .as_ref()
        .map(|c| &c[0])
        .expect("native sidecar");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    let app_port = spec.containers[0].ports.as_ref().expect("ports")[0].clone();
    assert_eq!(
        (app_port.name.as_deref(), app_port.container_port),
        (Some("kg-http"), 8080)
    );
    // Idempotent: the injected pod, submitted again, gains nothing.
    let mut again = created.clone();
    again.metadata = kube::api::ObjectMeta {
        name: Some("direct-again".into()),
        labels: created.metadata.labels.clone(),
        annotations: created.metadata.annotations.clone(),
        ..Default::default()
    };
    let again = pods
        .create(&PostParams::default(), &again)
        .await
        .expect("create again");
    let count = |p: &Pod| {
        p.spec.as_ref().map_or(0, |s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
                .filter(|c| c.name == pod::CONTAINER)
                .count()
        })
    };
    assert_eq!(count(&again), 1);

    // Config changes reach the sidecars by hot reload: the ConfigMap
    // changes, the pod template does not (no pod restarts).
    let generation = |d: &Deployment| d.metadata.generation.unwrap_or(0);
    let before = generation(&deployments.get("web").await.expect("deployment"));
    let hash = routes
        .get("web")
        .await
        .expect("route")
        .status
        .and_then(|s| s.config_hash);
    routes
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"circuitBreaker": {"maxConcurrent": 10}}})),
        )
        .await
        .expect("change config");
    wait_for(30, "new config hash", || async {
        let r = routes.get("web").await.ok()?;
        let h = r.status?.config_hash;
        (h.is_some() && h != hash).then_some(())
    })
    .await;
    assert_eq!(
        generation(&deployments.get("web").await.expect("deployment")),
        before,
        "no roll"
    );
    // A budget change rolls nothing either: new pods get it from the webhook.
    routes
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drain": {"timeout": "50s"}}})),
        )
        .await
        .expect("change budget");
    wait_for(30, "budget 65 in the status", || async {
        let r = routes.get("web").await.ok()?;
        (r.status?.budget_seconds == Some(10 + 50 + 5)).then_some(())
    })
    .await;
    let d = deployments.get("web").await.expect("deployment");
    assert_eq!(generation(&d), before, "a budget change rolls nothing");
    let mut next = pod.clone();
    next.metadata.name = Some("direct-65".into());
    let next = pods
        .create(&PostParams::default(), &next)
        .await
        .expect("create pod");
    assert_eq!(
        next.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
        Some(65),
        "a new pod gets the new budget from the webhook"
    );

    // Numbers for the record: webhook and reconcile time as the operator sees them.
    let metrics = http_get(&format!("127.0.0.1:{admin}"), "/metrics")
        .await
        .expect("admin port");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    for m in [
        "kubegrace_operator_webhook_duration_seconds",
        "kubegrace_operator_reconcile_duration_seconds",
    ] {
        let (sum, count) = (value(&format!("{m}_sum ")), value(&format!("{m}_count ")));
        println!(
            "{m}: {count} observations, mean {:.1}ms",
            if count > 0.0 { sum / count * 1e3 } else { 0.0 }
        );
    }
    assert!(
        metrics.contains("kubegrace_operator_webhook_requests_total{result=\"injected\"}"),
        "{metrics}"
    );

    // Removing the annotation removes what the operator copied into the
    // pod template (which rolls the pods back out).
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": { (keys::INJECT): null }}})),
        )
        .await
        .expect("un-annotate");
    wait_for(30, "template label removed", || async {
        let d = deployments.get("web").await.ok()?;
        let labels = d.spec?.template.metadata?.labels.unwrap_or_default();
        (!labels.contains_key(keys::INJECT)).then_some(())
    })
    .await;

    // Deleting the route restores what it changed.
    routes
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete route");
    wait_for(60, "route gone", || async {
        routes.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    let d = deployments.get("web").await.expect("deployment");
    let spec = d.spec.as_ref().expect("spec");
    assert_eq!(
        spec.template
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds),
        Some(30)
    );
    assert_eq!(spec.min_ready_seconds.unwrap_or(0), 0);
    assert!(!d.annotations().contains_key(keys::ORIGINAL));
    assert!(
        spec.template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .is_none_or(|a| !a.contains_key(keys::ROUTE))
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("operator stops on the signal")
        .expect("join")
        .expect("clean exit");
    ns.cleanup().await;
}

#[tokio::test]
async fn with_the_webhook_down_and_failure_policy_ignore_pods_start_bare_and_the_route_says_so() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-drift", true).await;
    // The webhook configuration points at a port nobody listens on.
    webhook_config(&client, &ns.name, free_port(), "Ignore").await;
    let (stop, task) = start_operator(&client, &ns.name, free_port());
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route: GraceRoute = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "ports": [{"name": "http"}]}
    }))
    .expect("route");
    routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create route");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bare", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "localhost/kubegrace/pause:e2e", "imagePullPolicy": "Never",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .expect("pod");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("admitted despite the webhook");
    assert!(!has_sidecar(&created));
    let r = wait_for(60, "PodsNotInjected", || async {
        let r = routes.get("web").await.ok()?;
        let (status, reason, msg) = condition(&r, "Degraded")?;
        (status == "True" && reason == "PodsNotInjected").then_some(msg)
    })
    .await;
    assert!(r.contains("1 of 1 pods lack the sidecar, e.g. bare"), "{r}");
    // ... and a person browsing events sees it too.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    wait_for(30, "PodsNotInjected event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("PodsNotInjected")
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn an_operator_killed_mid_reconcile_converges_when_it_starts_again() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-restart", false).await;
    let port = free_port();
    webhook_config(&client, &ns.name, port, "Ignore").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web"))
        .await
        .expect("create deployment");
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route: GraceRoute = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "web"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}]}
    }))
    .expect("route");
    routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create route");
    let (_stop, task) = start_operator(&client, &ns.name, port);
    // Kill it as soon as the reconcile has begun (the finalizer is its first write).
    wait_for(60, "finalizer added", || async {
        let r = routes.get("web").await.ok()?;
        (!r.finalizers().is_empty()).then_some(())
    })
    .await;
    task.abort();
    let _ = task.await;
    let (stop, task) = start_operator(&client, &ns.name, port);
    let r = wait_for(90, "converged", || async {
        let r = routes.get("web").await.ok()?;
        let s = r.status.as_ref()?;
        (s.budget_seconds == Some(50) && s.config_hash.is_some()).then_some(r)
    })
    .await;
    assert_eq!(condition(&r, "Accepted").map(|c| c.0), Some("True".into()));
    // The budget reaches pods through the webhook; the Deployment keeps the
    // grace period it had (the API server default, 30 s): re-applies of the
    // user's manifest change nothing.
    let d = deployments.get("web").await.expect("deployment");
    assert_eq!(
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.termination_grace_period_seconds),
        Some(30)
    );
    routes
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(60, "route gone", || async {
        routes.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn an_unknown_port_and_an_overlapping_route_are_conditions_a_person_can_act_on() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-cond", false).await;
    let port = free_port();
    webhook_config(&client, &ns.name, port, "Ignore").await;
    let (stop, task) = start_operator(&client, &ns.name, port);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web"))
        .await
        .expect("create deployment");
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route = |name: &str, port: &str| -> GraceRoute {
        serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": name},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": port}]}
        }))
        .expect("route")
    };
    routes
        .create(&PostParams::default(), &route("grpc", "grpc"))
        .await
        .expect("create");
    let msg = wait_for(60, "UnknownPort", || async {
        let r = routes.get("grpc").await.ok()?;
        let (status, reason, msg) = condition(&r, "Accepted")?;
        (status == "False" && reason == "UnknownPort").then_some(msg)
    })
    .await;
    assert!(
        msg.contains("Deployment/web has no container port named \"grpc\" (it has: http)"),
        "{msg}"
    );
    // Fixing the route fixes the condition (level-triggered).
    routes
        .patch(
            "grpc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"name": "http"}]}})),
        )
        .await
        .expect("fix");
    wait_for(60, "Accepted after the fix", || async {
        let r = routes.get("grpc").await.ok()?;
        (condition(&r, "Accepted")?.0 == "True").then_some(())
    })
    .await;
    // A second route on the same workload is reported, not merged.
    routes
        .create(&PostParams::default(), &route("second", "http"))
        .await
        .expect("create");
    let msg = wait_for(60, "Overlap", || async {
        let r = routes.get("second").await.ok()?;
        let (status, reason, msg) = condition(&r, "Degraded")?;
        (status == "True" && reason == "Overlap").then_some(msg)
    })
    .await;
    assert!(
        msg.contains("Deployment/web is also targeted by GraceRoute grpc"),
        "{msg}"
    );
    for name in ["second", "grpc"] {
        routes
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for(60, "routes gone", || async {
        routes
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

/// One HTTP/1.1 GET over a plain socket (the host reaches pod IPs on the
/// local cluster's bridge); returns the status line and body.
async fn http_get(addr: &str, path: &str) -> Option<String> {
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

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The real thing: the sidecar image runs as injected (restricted security
/// context, flags, config file, probes), the app behind it answers through
/// it, and a deleted pod drains within its budget. Needs the images of
/// `e2e/cluster/images`; skipped without them.
#[tokio::test]
async fn an_injected_pod_runs_serves_through_the_sidecar_and_drains_within_its_budget() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes");
    let present = |image: &str| {
        nodes.items.iter().any(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.images.as_ref())
                .is_some_and(|imgs| {
                    imgs.iter()
                        .any(|i| i.names.iter().flatten().any(|x| x.ends_with(image)))
                })
        })
    };
    if !present("kubegrace/sidecar:e2e") || !present("kubegrace/demo-app:e2e") {
        println!("skipped: sidecar/demo-app images not in the cluster (e2e/cluster/images)");
        return;
    }
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-run", true).await;
    let port = free_port();
    webhook_config(&client, &ns.name, port, "Fail").await;
    let (stop, task) = start_operator(&client, &ns.name, port);
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(30, "caBundle patched", || async {
        let m = mwcs.get(&ns.name).await.ok()?;
        m.webhooks?
            .first()?
            .client_config
            .ca_bundle
            .as_ref()
            .map(|_| ())
    })
    .await;
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route: GraceRoute = serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": "demo"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "demo"}, "ports": [{"name": "http"}],
                 "drain": {"minDelay": "1s", "quiet": "500ms", "maxDelay": "3s", "timeout": "5s"}}
    }))
    .expect("route");
    routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create route");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let demo: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "demo"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "demo"}},
            "template": {
                "metadata": {"labels": {"app": "demo"}},
                "spec": {"containers": [{
                    "name": "app", "image": "localhost/kubegrace/demo-app:e2e", "imagePullPolicy": "Never",
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1}
                }]}
            }
        }
    }))
    .expect("deployment");
    deployments
        .create(&PostParams::default(), &demo)
        .await
        .expect("create");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod = wait_for(120, "an injected demo pod Ready", || async {
        let list = pods
            .list(&ListParams::default().labels("app=demo"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|p| has_sidecar(p) && pod_ready(p) && p.metadata.deletion_timestamp.is_none())
    })
    .await;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    let through = wait_for(20, "the app through the sidecar", || async {
        let r = http_get(&format!("{ip}:{}", pod::FIRST_LISTEN_PORT), "/").await?;
        r.starts_with("HTTP/1.1 200").then_some(r)
    })
    .await;
    assert!(through.contains("pod="), "{through}");
    let admin_port = kubegrace_operator::inject::admin_port_of(&pod).expect("a kg-admin port");
    let ready = http_get(&format!("{ip}:{admin_port}"), admin::path::READY)
        .await
        .expect("admin port");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    // Without the pod's token nobody may drain it.
    let drain = http_get(&format!("{ip}:{admin_port}"), admin::path::DRAIN)
        .await
        .expect("admin port");
    assert!(!drain.starts_with("HTTP/1.1 2"), "{drain}");

    let budget = routes
        .get("demo")
        .await
        .ok()
        .and_then(|r| r.status?.budget_seconds)
        .expect("budget");
    assert_eq!(budget, 3 + 5 + 5);
    let name = pod.name_any();
    let t0 = std::time::Instant::now();
    pods.delete(&name, &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_for(
        u64::try_from(budget).unwrap_or(13) + 15,
        "pod gone",
        || async { pods.get_opt(&name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let took = t0.elapsed();
    println!("injected pod terminated in {took:?} (budget {budget}s)");
    assert!(
        took >= Duration::from_secs(1),
        "the drain held the pod for at least minDelay"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

/// Two replicas: both serve the webhook, one runs the controllers; when the
/// leader stops, the other takes over (it gave the Lease up on shutdown).
#[tokio::test]
async fn one_of_two_replicas_leads_and_the_other_takes_over() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-lease", false).await;
    let [a_port, b_port, a_admin, b_admin] = free_ports::<4>();
    let (a_stop, a_task) = start_operator_with_admin(&client, &ns.name, a_port, a_admin);
    let (b_stop, b_task) = start_operator_with_admin(&client, &ns.name, b_port, b_admin);
    let leader = |admin: u16| async move {
        let m = http_get(&format!("127.0.0.1:{admin}"), "/metrics").await?;
        let ready = http_get(&format!("127.0.0.1:{admin}"), "/readyz").await?;
        Some((
            m.lines().any(|l| l.trim() == "kubegrace_operator_leader 1"),
            ready.starts_with("HTTP/1.1 200"),
        ))
    };
    let (a_leads, b_leads) = wait_for(30, "one leader, both serving", || async {
        let (a, a_ready) = leader(a_admin).await?;
        let (b, b_ready) = leader(b_admin).await?;
        (a != b && a_ready && b_ready).then_some((a, b))
    })
    .await;
    assert!(a_leads ^ b_leads);
    let (stop_leader, leader_task, other_admin, other_stop, other_task) = if a_leads {
        (a_stop, a_task, b_admin, b_stop, b_task)
    } else {
        (b_stop, b_task, a_admin, a_stop, a_task)
    };
    let _ = stop_leader.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), leader_task).await;
    wait_for(30, "the other replica leads", || async {
        leader(other_admin).await.and_then(|(l, _)| l.then_some(()))
    })
    .await;
    let _ = other_stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), other_task).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn the_validating_webhook_refuses_an_unknown_port_and_an_over_budget_route_and_allows_a_missing_target()
 {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-admit", false).await;
    let port = free_port();
    validating_webhook_config(&client, &ns.name, port).await;
    let (stop, task) = start_operator(&client, &ns.name, port);
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    wait_for(
        60,
        "the operator's CA in the validating webhook",
        || async {
            let v = vwcs.get(&ns.name).await.ok()?;
            v.webhooks?
                .iter()
                .all(|w| w.client_config.ca_bundle.is_some())
                .then_some(())
        },
    )
    .await;
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &deployment("web"))
        .await
        .expect("create deployment");
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    let route = |name: &str, spec: serde_json::Value| -> GraceRoute {
        serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("route")
    };
    // The first call may reach the webhook before its listener is up: that
    // is a "failed calling webhook" error, not an answer. Retry until the
    // operator answers.
    let refused = |r: GraceRoute| {
        let routes = routes.clone();
        async move {
            wait_for(30, "an answer from the validating webhook", || async {
                match routes.create(&PostParams::default(), &r).await {
                    Ok(_) => panic!("route {} must be refused", r.name_any()),
                    Err(e) if e.to_string().contains("failed calling webhook") => None,
                    Err(e) => Some(e.to_string()),
                }
            })
            .await
        }
    };
    let msg = refused(route(
        "grpc",
        json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "grpc"}]}),
    ))
    .await;
    assert!(
        msg.contains("denied the request: UnknownPort: Deployment/web has no container port named \"grpc\" (it has: http)"),
        "{msg}"
    );
    let msg = refused(route(
        "tight",
        json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}],
               "drain": {"maxDelay": "10s", "timeout": "20s"},
               "rollout": {"terminationGracePeriodSeconds": 20}}),
    ))
    .await;
    assert!(
        msg.contains("BudgetDoesNotFit: rollout.terminationGracePeriodSeconds is 20 but a drain needs 35s (drain.maxDelay 10s + drain.timeout 20s + 5s margin = 35s > 20s)"),
        "{msg}"
    );
    // GitOps order: the route first, its Deployment later.
    routes
        .create(
            &PostParams::default(),
            &route(
                "later",
                json!({"targetRef": {"kind": "Deployment", "name": "not-yet"}, "ports": [{"name": "http"}]}),
            ),
        )
        .await
        .expect("a route whose target does not exist yet is accepted");
    // A valid route, then an edit that breaks it: the edit is refused too.
    routes
        .create(
            &PostParams::default(),
            &route(
                "web",
                json!({"targetRef": {"kind": "Deployment", "name": "web"}, "ports": [{"name": "http"}]}),
            ),
        )
        .await
        .expect("a valid route is accepted");
    let err = routes
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"name": "admin"}]}})),
        )
        .await
        .expect_err("an edit to an unknown port is refused");
    assert!(
        err.to_string()
            .contains("no container port named \"admin\""),
        "{err}"
    );
    // The operator's own writes (finalizer on, status, finalizer off at
    // deletion) go through the webhook and are never refused.
    wait_for(60, "web Accepted", || async {
        let r = routes.get("web").await.ok()?;
        (condition(&r, "Accepted")?.0 == "True").then_some(())
    })
    .await;
    for name in ["web", "later"] {
        routes
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for(
        60,
        "routes gone (finalizers removed through the webhook)",
        || async {
            routes
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

/// Starts the operator in-process with `start_operator_with_admin`'s flags,
/// `extra` replacing or adding to them, on the given client.
fn start_operator_extra(
    client: &Client,
    ns: &str,
    webhook_port: u16,
    extra: &[String],
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<kubegrace_operator::Result<()>>,
) {
    let [admin] = free_ports::<1>();
    let mut flags = vec![
        format!("--namespace={ns}"),
        format!("--webhook-addr=127.0.0.1:{webhook_port}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--webhook-config={ns}"),
        format!("--validating-webhook-config={ns}"),
        "--webhook-extra-san=127.0.0.1".into(),
        format!("--leader-election-lease=kubegrace-test-{ns}"),
        "--sidecar-image=localhost/kubegrace/sidecar:e2e".into(),
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

fn graceroute(name: &str, target: &str) -> GraceRoute {
    serde_json::from_value(json!({
        "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
        "metadata": {"name": name},
        "spec": {"targetRef": {"kind": "Deployment", "name": target}, "ports": [{"name": "http"}]}
    }))
    .expect("route")
}

/// A user's ConfigMap that happens to be named `kubegrace-<route>` is never
/// taken over: not applied to, not given an owner reference, not deleted
/// with the route; the route says why and what to do, with an Event.
#[tokio::test]
async fn a_users_configmap_named_like_the_routes_survives_untouched_and_the_route_says_why() {
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = TestNs::new(&client, "kg-own", false).await;
    let port = free_port();
    // This operator watches only the test namespace.
    let (stop, task) = start_operator_extra(
        &client,
        &ns.name,
        port,
        &[format!("--watch-namespaces={}", ns.name)],
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let user_cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kubegrace-web", "labels": {"app": "web"}},
        "data": {"settings.ini": "mine=1\n"}
    }))
    .expect("cm");
    let before = cms
        .create(&PostParams::default(), &user_cm)
        .await
        .expect("create the user's ConfigMap");
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &deployment("web"))
        .await
        .expect("create deployment");
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), &ns.name);
    routes
        .create(&PostParams::default(), &graceroute("web", "web"))
        .await
        .expect("create route");
    let msg = wait_for(60, "Accepted=False ConfigMapNotOwned", || async {
        let r = routes.get("web").await.ok()?;
        let (status, reason, msg) = condition(&r, "Accepted")?;
        (status == "False" && reason == "ConfigMapNotOwned").then_some(msg)
    })
    .await;
    let cm_ref = format!("ConfigMap {}/kubegrace-web", ns.name);
    for part in [
        cm_ref.as_str(),
        "was not created by kubegrace",
        "will not overwrite or delete it",
        "Rename or delete that ConfigMap",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &ns.name);
    wait_for(30, "a Warning Event ConfigMapNotOwned", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ConfigMapNotOwned")
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await;
    let untouched = |cm: &ConfigMap| {
        assert_eq!(cm.data, before.data, "data changed");
        assert_eq!(cm.labels(), before.labels(), "labels changed");
        assert!(cm.owner_references().is_empty(), "owner reference added");
        assert!(
            cm.managed_fields()
                .iter()
                .all(|m| m.manager.as_deref() != Some(kubegrace_operator::FIELD_MANAGER)),
            "kubegrace manages fields of it: {:?}",
            cm.managed_fields()
        );
    };
    untouched(&cms.get("kubegrace-web").await.expect("still there"));
    // Deleting the route leaves the ConfigMap alone.
    routes
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete route");
    wait_for(60, "route gone", || async {
        routes.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    // The garbage collector would act within seconds if it had an owner.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = cms.get("kubegrace-web").await.expect("survives the route");
    untouched(&after);
    assert_eq!(after.metadata.uid, before.metadata.uid, "re-created");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    ns.cleanup().await;
}

/// `helm template` of the chart's RBAC with `watchNamespaces`, as objects.
fn render_rbac(release: &str, release_ns: &str, watch: &str) -> Vec<serde_yaml::Value> {
    let helm = std::env::var_os("KUBEGRACE_TOOLS_BIN")
        .map(|d| std::path::PathBuf::from(d).join("helm"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "helm".into());
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/kubegrace");
    let out = std::process::Command::new(&helm)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", release_ns])
        .args(["--set", &format!("fullnameOverride={release}")])
        .args(["--set", &format!("watchNamespaces={{{watch}}}")])
        .args(["--show-only", "templates/rbac.yaml"])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e} (the cluster tier needs helm)",
                helm.display()
            )
        });
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|d| {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(d).ok()?;
            (!v.is_null()).then_some(v)
        })
        .collect()
}

/// What `kubectl auth can-i VERB RESOURCE -n NS --as SA` answers: a
/// SelfSubjectAccessReview made by a client impersonating the SA.
async fn can_i(as_sa: &Client, verb: &str, group: &str, resource: &str, ns: Option<&str>) -> bool {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {
            "verb": verb, "group": group, "resource": resource,
            "namespace": ns.unwrap_or_default()
        }}
    }))
    .expect("review");
    Api::<SelfSubjectAccessReview>::all(as_sa.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("self subject access review")
        .status
        .is_some_and(|s| s.allowed)
}

/// The chart's namespaced RBAC mode, enforced by the real API server: the
/// operator runs in-process as the chart's ServiceAccount (impersonated),
/// with `--watch-namespaces`; its route in the watched namespace
/// reconciles, it may not write ConfigMaps or Deployments elsewhere, and a
/// route elsewhere is left alone.
#[tokio::test]
async fn with_watch_namespaces_the_operator_works_there_and_may_write_nothing_elsewhere() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let client = cluster_or_skip!();
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let op_ns = TestNs::new(&client, "kg-rbac-op", false).await;
    let watched = TestNs::new(&client, "kg-rbac-w", false).await;
    let other = TestNs::new(&client, "kg-rbac-x", false).await;
    let release = format!("kg-rbac-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let docs = render_rbac(&release, &op_ns.name, &watched.name);
    let pp = PostParams::default();
    let mut cluster_roles = Vec::new();
    for d in &docs {
        let kind = d["kind"].as_str().unwrap_or_default().to_string();
        let ns = d["metadata"]["namespace"].as_str().map(str::to_string);
        let j = serde_json::to_value(d).expect("json");
        let ns_of = || ns.clone().expect("namespaced object has a namespace");
        match kind.as_str() {
            "ServiceAccount" => drop(
                Api::<ServiceAccount>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("sa"))
                    .await
                    .expect("sa"),
            ),
            "Role" => drop(
                Api::<Role>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("role"))
                    .await
                    .expect("role"),
            ),
            "RoleBinding" => drop(
                Api::<RoleBinding>::namespaced(client.clone(), &ns_of())
                    .create(&pp, &serde_json::from_value(j).expect("rb"))
                    .await
                    .expect("rb"),
            ),
            "ClusterRole" => {
                let cr: ClusterRole = serde_json::from_value(j).expect("cr");
                cluster_roles.push(("ClusterRole", cr.name_any()));
                Api::<ClusterRole>::all(client.clone())
                    .create(&pp, &cr)
                    .await
                    .expect("cr");
            }
            "ClusterRoleBinding" => {
                let crb: ClusterRoleBinding = serde_json::from_value(j).expect("crb");
                cluster_roles.push(("ClusterRoleBinding", crb.name_any()));
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&pp, &crb)
                    .await
                    .expect("crb");
            }
            other => panic!("unexpected {other} in the RBAC render"),
        }
    }
    // The operator's client: the chart's ServiceAccount, impersonated.
    let sa = format!("system:serviceaccount:{}:{release}-operator", op_ns.name);
    let path = std::env::var("KUBEGRACE_E2E_KUBECONFIG").expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path).expect("kubeconfig"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    config.auth_info.impersonate = Some(sa.clone());
    let as_sa = Client::try_from(config).expect("client");

    // `kubectl auth can-i ... --as <sa>`
    let (w, o) = (watched.name.as_str(), other.name.as_str());
    for (verb, group, res, ns, want) in [
        ("create", "", "configmaps", Some(w), true),
        ("patch", "apps", "deployments", Some(w), true),
        ("create", "", "configmaps", Some(o), false),
        ("patch", "", "configmaps", Some(o), false),
        ("delete", "", "configmaps", Some(o), false),
        ("update", "apps", "deployments", Some(o), false),
        ("update", "apps", "statefulsets", Some(o), false),
        ("list", "", "configmaps", None, false),
        ("watch", "", "pods", None, false),
    ] {
        assert_eq!(
            can_i(&as_sa, verb, group, res, ns).await,
            want,
            "{sa} can-i {verb} {group}/{res} in {ns:?}"
        );
    }

    let port = free_port();
    let (stop, task) = start_operator_extra(
        &as_sa,
        &op_ns.name,
        port,
        &[
            format!("--watch-namespaces={w}"),
            format!("--cert-secret={release}-webhook-cert"),
            format!("--leader-election-lease={release}-operator"),
            format!("--webhook-config={release}-sidecar-injector"),
            format!("--validating-webhook-config={release}-route-validator"),
        ],
    );
    for ns in [w, o] {
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&pp, &deployment("web"))
            .await
            .expect("deployment");
        Api::<GraceRoute>::namespaced(client.clone(), ns)
            .create(&pp, &graceroute("web", "web"))
            .await
            .expect("route");
    }
    let routes: Api<GraceRoute> = Api::namespaced(client.clone(), w);
    wait_for(90, "the watched namespace's route accepted", || async {
        let r = routes.get("web").await.ok()?;
        (condition(&r, "Accepted")?.0 == "True").then_some(())
    })
    .await;
    let cm = Api::<ConfigMap>::namespaced(client.clone(), w)
        .get("kubegrace-web")
        .await
        .expect("the route's ConfigMap, written as the ServiceAccount");
    assert!(cm.data.is_some_and(|d| d.contains_key(pod::CONFIG_FILE)));
    // Nothing happened in the other namespace: no status, no finalizer, no
    // ConfigMap (and the API server would have refused them anyway).
    let elsewhere = Api::<GraceRoute>::namespaced(client.clone(), o)
        .get("web")
        .await
        .expect("route");
    assert!(elsewhere.status.is_none(), "{:?}", elsewhere.status);
    assert!(elsewhere.finalizers().is_empty());
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), o)
            .get_opt("kubegrace-web")
            .await
            .expect("get")
            .is_none()
    );
    assert!(!task.is_finished(), "the operator stopped: {task:?}");
    // Let the operator remove its finalizer while it runs.
    routes
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(60, "route gone", || async {
        routes.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    for (kind, name) in cluster_roles {
        let dp = DeleteParams::default();
        let _ = match kind {
            "ClusterRole" => Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(drop),
            _ => Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(drop),
        };
    }
    for ns in [other, watched, op_ns] {
        ns.cleanup().await;
    }
}
