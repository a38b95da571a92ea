//! The end-to-end scenario, one implementation for `e2e/tests/rollout.rs` and `make demo`
//! (`kubegrace-demo`): install the chart, deploy the demo app twice (with kubegrace and
//! plain), roll each under the same constant load, count every failed request.
//!
//! Steps, each printed with the seconds elapsed ([`Progress`]):
//! 1. [`Install::helm_install`]: `helm install` of `charts/kubegrace` into its own
//!    namespace, with the locally imported images; the webhook is then scoped to this run's
//!    namespaces (label `kubegrace.io/e2e-run=<release>`), so a shared cluster's other tests
//!    never see this operator's webhook, and its `failurePolicy` is `Fail`, so a pod without
//!    the sidecar cannot slip into the measurement.
//! 2. [`Scenario::deploy`]: one labelled namespace; Deployment `demo-with` annotated
//!    `kubegrace.io/inject=enabled` (the operator copies it into the pod template, the
//!    webhook injects) plus a GraceRoute with short drain timers; Deployment `demo-without`
//!    (no sidecar; the demo app exits at once on SIGTERM); a Service in front of each.
//!    Waits until both are settled: every pod ready, the route `Ready`, the sidecar in every
//!    `demo-with` pod, the Service answering through its ClusterIP.
//! 3. [`Scenario::roll_under_load`]: open-loop HTTP/1.1 keep-alive load at a constant rate
//!    on the Service's ClusterIP from this host (or its NodePort where the host does not
//!    route ClusterIPs, e.g. kind), a restart of
//!    the pod template (what `kubectl rollout restart` does), then waits until the rollout
//!    is complete and every old pod is gone; the load stops there and its summary is the
//!    result. [`Action::Scale`] does the same with a scale-down.
//! 4. [`Install::uninstall`]: routes deleted while the operator still runs (finalizers),
//!    namespaces deleted, `helm uninstall`.
//!
//! Every wait is on a condition with a deadline; the load is bounded in rate, count and time.

pub mod kit;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client};
use serde_json::json;

use crate::load::report::{DemoRun, Event};
use crate::load::{self, Protocol, Summary};
use crate::{E2E_LABEL, demo_image, http_get};

/// Label that scopes this run's webhook to its own namespaces.
pub const RUN_LABEL: &str = "kubegrace.io/e2e-run";
/// The demo app's container port (named `http`; the Service targets the name).
pub const APP_PORT: i32 = 8080;

/// Prints each step with the seconds since the scenario started.
#[derive(Clone, Debug)]
pub struct Progress {
    start: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            start: Instant::now(),
        }
    }
}

impl Progress {
    pub fn step(&self, msg: impl std::fmt::Display) {
        eprintln!("[{:6.1}s] {msg}", self.start.elapsed().as_secs_f64());
    }

    /// Polls `probe` every `interval` until it returns `Ok`, at most `timeout`. `Err` carries
    /// what is still missing; it is printed when it changes, so a slow step shows why.
    pub async fn wait<T, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        interval: Duration,
        mut probe: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: std::future::Future<Output = std::result::Result<T, String>>,
    {
        self.step(format!(
            "waiting for {what} (at most {}s)",
            timeout.as_secs()
        ));
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::new();
        loop {
            match probe().await {
                Ok(v) => {
                    self.step(format!(
                        "  {what}: done after {:.1}s",
                        started.elapsed().as_secs_f64()
                    ));
                    return Ok(v);
                }
                Err(state) => {
                    if state != last {
                        self.step(format!("  {what}: {state}"));
                        last = state;
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
            }
            tokio::time::sleep(interval).await;
        }
    }
}

/// Drain timers of the GraceRoute (sidecar durations, e.g. `500ms`).
#[derive(Clone, Debug)]
pub struct Drain {
    pub min_delay: String,
    pub quiet: String,
    pub max_delay: String,
    pub timeout: String,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            min_delay: "1s".into(),
            quiet: "500ms".into(),
            max_delay: "5s".into(),
            timeout: "10s".into(),
        }
    }
}

/// The load of one run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Requests per second (open loop).
    pub rate: f64,
    /// Keep-alive connections (at most this many requests in flight).
    pub connections: usize,
    /// Path of every request; a little server time keeps requests in flight, as in real
    /// traffic, so a pod that dies cuts some.
    pub path: String,
    /// Deadline of one request.
    pub timeout: Duration,
    /// Load before the rollout starts: the steady state the rollout is read against.
    pub lead_in: Duration,
    /// Upper bound of one run's load; the run normally stops earlier, when the rollout is
    /// done and the old pods are gone.
    pub max_duration: Duration,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            rate: 150.0,
            connections: 32,
            path: "/delay?ms=50".into(),
            timeout: Duration::from_secs(5),
            lead_in: Duration::from_secs(3),
            max_duration: Duration::from_secs(240),
        }
    }
}

/// Everything the scenario needs to know.
#[derive(Clone, Debug)]
pub struct Options {
    pub chart: PathBuf,
    pub release: String,
    pub release_namespace: String,
    pub image_registry: String,
    pub image_tag: String,
    pub replicas: i32,
    pub drain: Drain,
    pub load: LoadOptions,
    /// Bound of one rollout (template change to every pod replaced and ready).
    pub rollout_timeout: Duration,
}

impl Options {
    /// Defaults for the local images (`e2e/cluster/images`), with a release name unique to
    /// this process.
    pub fn new(release_prefix: &str) -> Options {
        let release = format!("{release_prefix}-{}", suffix());
        Options {
            chart: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/kubegrace"),
            release_namespace: release.clone(),
            release,
            image_registry: "localhost".into(),
            image_tag: "e2e".into(),
            replicas: 3,
            drain: Drain::default(),
            load: LoadOptions::default(),
            rollout_timeout: Duration::from_secs(180),
        }
    }
}

/// Five lowercase hex digits, different per process and call.
pub fn suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:05x}", (nanos ^ (std::process::id() << 12)) & 0xf_ffff)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `helm` from the pinned tools when `e2e/cluster/env` says where they are, else from PATH.
fn helm_bin() -> PathBuf {
    std::env::var_os("KUBEGRACE_TOOLS_BIN")
        .map(|d| PathBuf::from(d).join("helm"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("helm"))
}

async fn helm(args: &[String], timeout: Duration) -> Result<String> {
    let kubeconfig = crate::kubeconfig_path().context("no kubeconfig for helm")?;
    let mut cmd = tokio::process::Command::new(helm_bin());
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .map_err(|_| anyhow!("helm {} took longer than {timeout:?}", args.join(" ")))?
        .with_context(|| format!("running {}", helm_bin().display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "helm {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

pub fn graceroute_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubegrace.io", "v1alpha1", "GraceRoute"),
        "graceroutes",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// The chart, installed for one run.
#[derive(Debug)]
pub struct Install {
    pub release: String,
    pub namespace: String,
}

impl Install {
    /// The release `opts` names (nothing installed yet), so that cleanup can run whatever
    /// part of the install failed.
    pub fn new(opts: &Options) -> Install {
        Install {
            release: opts.release.clone(),
            namespace: opts.release_namespace.clone(),
        }
    }

    /// `helm install` with the local images, one operator replica, `failurePolicy: Fail`;
    /// then waits for the operator's certificate in the webhook configuration and scopes
    /// the webhook to namespaces labelled `kubegrace.io/e2e-run=<release>`.
    pub async fn helm_install(&self, client: &Client, opts: &Options, p: &Progress) -> Result<()> {
        let install = self;
        p.step(format!(
            "helm install {} {} (namespace {}, images {}/kubegrace/*:{})",
            install.release,
            opts.chart.display(),
            install.namespace,
            opts.image_registry,
            opts.image_tag
        ));
        let set = |k: &str, v: &str| ["--set".to_owned(), format!("{k}={v}")];
        let mut args: Vec<String> = vec![
            "install".into(),
            install.release.clone(),
            opts.chart.display().to_string(),
            "--namespace".into(),
            install.namespace.clone(),
            "--create-namespace".into(),
            "--wait".into(),
            "--timeout".into(),
            "180s".into(),
        ];
        args.extend(set("fullnameOverride", &install.release));
        args.extend(set("image.registry", &opts.image_registry));
        args.extend(set("image.tag", &opts.image_tag));
        args.extend(set("image.pullPolicy", "IfNotPresent"));
        args.extend(set("operator.replicas", "1"));
        args.extend(set("webhook.failurePolicy", "Fail"));
        helm(&args, Duration::from_secs(200)).await?;
        p.step("helm install done: operator ready");

        let name = format!("{}-sidecar-injector", install.release);
        let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let count = p
            .wait(
                "the operator's CA in the webhook configuration",
                Duration::from_secs(90),
                Duration::from_millis(500),
                || async {
                    let m = mwcs.get(&name).await.map_err(|e| e.to_string())?;
                    let hooks = m.webhooks.unwrap_or_default();
                    let with_ca = hooks
                        .iter()
                        .filter(|w| w.client_config.ca_bundle.is_some())
                        .count();
                    if !hooks.is_empty() && with_ca == hooks.len() {
                        Ok(hooks.len())
                    } else {
                        Err(format!("{with_ca}/{} entries have a caBundle", hooks.len()))
                    }
                },
            )
            .await?;
        // Read-modify-replace (the resourceVersion guards against a concurrent caBundle
        // write; a conflict fails the install, loudly).
        let mut mwc = mwcs.get(&name).await?;
        for hook in mwc.webhooks.iter_mut().flatten() {
            hook.namespace_selector
                .get_or_insert_with(Default::default)
                .match_expressions
                .get_or_insert_with(Vec::new)
                .push(LabelSelectorRequirement {
                    key: RUN_LABEL.into(),
                    operator: "In".into(),
                    values: Some(vec![install.release.clone()]),
                });
        }
        ensure!(count > 0, "webhook configuration {name} has no entries");
        mwcs.replace(&name, &PostParams::default(), &mwc)
            .await
            .context("scoping the webhook to this run's namespaces")?;
        p.step(format!(
            "webhook {name} scoped to namespaces labelled {RUN_LABEL}={}",
            install.release
        ));
        Ok(())
    }

    /// Deletes the routes of `namespaces` while the operator still runs (it removes their
    /// finalizers), then the namespaces, then the release and its namespace. Best effort:
    /// problems are printed, not returned, so cleanup never hides the test's own result.
    pub async fn uninstall(&self, client: &Client, namespaces: &[String], p: &Progress) {
        let ns_api: Api<Namespace> = Api::all(client.clone());
        for ns in namespaces {
            let routes = graceroute_api(client, ns);
            if let Err(e) = routes
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
            {
                eprintln!("warning: deleting GraceRoutes in {ns}: {e}");
            }
            let gone = p
                .wait(
                    &format!("GraceRoutes in {ns} deleted"),
                    Duration::from_secs(60),
                    Duration::from_millis(500),
                    || async {
                        match routes.list(&ListParams::default()).await {
                            Ok(l) if l.items.is_empty() => Ok(()),
                            Ok(l) => Err(format!("{} left", l.items.len())),
                            Err(e) => Err(e.to_string()),
                        }
                    },
                )
                .await;
            if let Err(e) = gone {
                eprintln!("warning: {e:#}");
            }
            if let Err(e) = ns_api.delete(ns, &DeleteParams::background()).await {
                eprintln!("warning: deleting namespace {ns}: {e}");
            }
        }
        p.step(format!("helm uninstall {}", self.release));
        let args: Vec<String> = vec![
            "uninstall".into(),
            self.release.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--wait".into(),
            "--timeout".into(),
            "90s".into(),
        ];
        if let Err(e) = helm(&args, Duration::from_secs(120)).await {
            eprintln!("warning: {e:#}");
        }
        if let Err(e) = ns_api
            .delete(&self.namespace, &DeleteParams::background())
            .await
        {
            eprintln!("warning: deleting namespace {}: {e}", self.namespace);
        }
    }
}

/// What a run does to the Deployment while the load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A new pod template (what `kubectl rollout restart` does): every pod replaced.
    Restart,
    /// Scale to this many replicas: the pods beyond it deleted.
    Scale(i32),
}

/// The result of one run under load.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub summary: Summary,
    /// From the template change (or scale) to the Deployment rolled out, in seconds.
    pub rollout_s: f64,
    /// When the change was made, UNIX time in seconds.
    pub rollout_at_unix_s: f64,
    /// Old pods seen terminating, UNIX time in seconds.
    pub events: Vec<(f64, String)>,
}

impl RunResult {
    /// The run as the demo report takes it.
    pub fn demo_run(&self) -> DemoRun {
        let t0 = self.summary.started_at_unix_s;
        DemoRun {
            summary: self.summary.clone(),
            rollout_s: self.rollout_s,
            rollout_start_s: Some(self.rollout_at_unix_s - t0),
            events: self
                .events
                .iter()
                .map(|(at, label)| Event {
                    t_s: at - t0,
                    label: label.clone(),
                })
                .collect(),
        }
    }

    /// `--with-rollout-s ...` style arguments of `kubegrace-demo-report` for this run
    /// (`side` is `with` or `without`); the summary itself goes in a file.
    pub fn report_args(&self, side: &str) -> Vec<String> {
        let mut args = vec![
            format!("--{side}-rollout-s={:.3}", self.rollout_s),
            format!("--{side}-rollout-at={:.3}", self.rollout_at_unix_s),
        ];
        for (at, label) in &self.events {
            args.push(format!("--{side}-event={at:.3}={label}"));
        }
        args
    }

    /// `requests`, `failed` and the failure reasons on one line.
    pub fn describe(&self) -> String {
        let s = &self.summary;
        let reasons: Vec<String> = load::Reason::FAILURES
            .iter()
            .map(|r| (r, s.by_reason.get(*r)))
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r}={n}"))
            .collect();
        format!(
            "{} requests, {} failed [{}], rollout {:.1}s, p99 {:.1} ms{}",
            s.requests,
            s.failed,
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(" ")
            },
            self.rollout_s,
            s.p99_ms,
            if s.by_detail.is_empty() {
                String::new()
            } else {
                format!(", details {:?}", s.by_detail)
            }
        )
    }
}

/// The demo app, deployed in one namespace, with and without kubegrace.
#[derive(Clone)]
pub struct Scenario {
    pub client: Client,
    pub namespace: String,
    pub opts: Options,
}

/// The Deployment (and Service) fronted by kubegrace.
pub const WITH: &str = "demo-with";
/// The Deployment (and Service) without kubegrace.
pub const WITHOUT: &str = "demo-without";

pub fn deployment(name: &str, replicas: i32, kubegrace: bool) -> Result<Deployment> {
    let mut d = json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "app",
                        "image": demo_image(),
                        "imagePullPolicy": "Never",
                        "ports": [{"name": "http", "containerPort": APP_PORT}],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
                        "resources": {"requests": {"cpu": "20m", "memory": "16Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    });
    if kubegrace {
        // What a user types: `kubectl annotate deployment demo-with kubegrace.io/inject=enabled`.
        d["metadata"]["annotations"] = json!({"kubegrace.io/inject": "enabled"});
    }
    Ok(serde_json::from_value(d)?)
}

pub fn service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        // NodePort too, for hosts that do not route ClusterIPs (kind): the same
        // kube-proxy rules, reached on the node's address.
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))?)
}

fn has_sidecar(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .any(|c| c.name == "kubegrace-sidecar")
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Ok when the Deployment's controller has seen its spec and every replica is updated,
/// ready and available, with no extra pod counted.
fn rolled_out(d: &Deployment) -> std::result::Result<(), String> {
    let generation = d.metadata.generation.unwrap_or(0);
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    if s.observed_generation.unwrap_or(0) < generation {
        return Err("the Deployment controller has not seen the change yet".into());
    }
    let updated = s.updated_replicas.unwrap_or(0);
    let ready = s.ready_replicas.unwrap_or(0);
    let available = s.available_replicas.unwrap_or(0);
    let total = s.replicas.unwrap_or(0);
    if updated == want && ready == want && available == want && total == want {
        Ok(())
    } else {
        Err(format!(
            "{updated} updated, {ready} ready, {available} available of {want} ({total} counted)"
        ))
    }
}

fn short(pod: &str) -> &str {
    pod.rsplit('-').next().unwrap_or(pod)
}

impl Scenario {
    /// Creates the namespace (labelled for cleanup and for this run's webhook).
    pub async fn new(client: &Client, opts: &Options, p: &Progress) -> Result<Scenario> {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let name = format!("kg-e2e-rollout-{}", suffix());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {E2E_LABEL: "true", RUN_LABEL: opts.release}},
        }))?;
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        p.step(format!("namespace {name}"));
        Ok(Scenario {
            client: client.clone(),
            namespace: name,
            opts: opts.clone(),
        })
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates both Deployments, their Services and the GraceRoute, and waits until both
    /// are settled and answer through their ClusterIPs.
    pub async fn deploy(&self, p: &Progress) -> Result<()> {
        let post = PostParams::default();
        let d = &self.opts.drain;
        let route: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": WITH},
            "spec": {
                "targetRef": {"kind": "Deployment", "name": WITH},
                "ports": [{"name": "http", "protocol": "http"}],
                "drain": {"minDelay": d.min_delay, "quiet": d.quiet, "maxDelay": d.max_delay, "timeout": d.timeout},
            },
        }))?;
        graceroute_api(&self.client, &self.namespace)
            .create(&post, &route)
            .await
            .context("creating the GraceRoute")?;
        p.step(format!(
            "GraceRoute {WITH}: drain minDelay {} quiet {} maxDelay {} timeout {}",
            d.min_delay, d.quiet, d.max_delay, d.timeout
        ));
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        for (name, kubegrace) in [(WITH, true), (WITHOUT, false)] {
            self.deployments()
                .create(&post, &deployment(name, self.opts.replicas, kubegrace)?)
                .await
                .with_context(|| format!("creating Deployment {name}"))?;
            services
                .create(&post, &service(name)?)
                .await
                .with_context(|| format!("creating Service {name}"))?;
            p.step(format!(
                "Deployment {name} ({} replicas{}) and its Service",
                self.opts.replicas,
                if kubegrace {
                    ", annotated kubegrace.io/inject=enabled"
                } else {
                    ", plain"
                }
            ));
        }
        self.settle(WITH, true, p).await?;
        self.settle(WITHOUT, false, p).await?;
        Ok(())
    }

    /// Waits until `name` is rolled out with exactly its replicas, all ready, none
    /// terminating, with the sidecar in every pod iff `kubegrace` (and the route Ready),
    /// and its Service answers from this host.
    pub async fn settle(&self, name: &str, kubegrace: bool, p: &Progress) -> Result<()> {
        let deployments = self.deployments();
        let pods = self.pods();
        let routes = graceroute_api(&self.client, &self.namespace);
        let want = usize::try_from(self.opts.replicas).unwrap_or(0);
        p.wait(
            &format!(
                "{name}: {want} ready pods{}",
                if kubegrace {
                    " with the sidecar, route Ready"
                } else {
                    ""
                }
            ),
            self.opts.rollout_timeout,
            Duration::from_millis(500),
            || async {
                let d = deployments.get(name).await.map_err(|e| e.to_string())?;
                rolled_out(&d)?;
                let list = pods
                    .list(&ListParams::default().labels(&format!("app={name}")))
                    .await
                    .map_err(|e| e.to_string())?;
                let live: Vec<&Pod> = list.items.iter().collect();
                let terminating = live
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_some())
                    .count();
                let ready = live.iter().filter(|p| pod_ready(p)).count();
                let sidecars = live.iter().filter(|p| has_sidecar(p)).count();
                let sidecar_ok = if kubegrace {
                    sidecars == live.len()
                } else {
                    sidecars == 0
                };
                if live.len() != want || terminating > 0 || ready != want || !sidecar_ok {
                    return Err(format!(
                        "{} pods, {ready} ready, {terminating} terminating, {sidecars} with the sidecar",
                        live.len()
                    ));
                }
                if kubegrace {
                    let r = routes.get(name).await.map_err(|e| e.to_string())?;
                    let ready = r.data["status"]["conditions"]
                        .as_array()
                        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                        .cloned()
                        .unwrap_or_default();
                    if ready["status"] != "True" {
                        return Err(format!(
                            "route not Ready: {} {}",
                            ready["reason"].as_str().unwrap_or("-"),
                            ready["message"].as_str().unwrap_or("")
                        ));
                    }
                }
                Ok(())
            },
        )
        .await?;
        let addr = self.service_addr(name).await?;
        p.wait(
            &format!("{name}: an answer through {addr} from this host"),
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                match http_get(&addr, "/", Duration::from_secs(2)).await {
                    Ok((200, body)) if body.starts_with("pod=") => Ok(()),
                    Ok((status, body)) => Err(format!("{status} {}", body.trim())),
                    Err(e) => Err(format!("{e:#}")),
                }
            },
        )
        .await
    }

    /// Where this host sends the load for the Service `name`: `ClusterIP:80` when the host
    /// routes ClusterIPs (`KUBEGRACE_E2E_HOST_REACHES_SERVICES`, the local cluster), else
    /// `<node InternalIP>:<nodePort>` (kind: the node is a container on the host's network).
    pub async fn service_addr(&self, name: &str) -> Result<String> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let spec = services
            .get(name)
            .await?
            .spec
            .with_context(|| format!("Service {name} has no spec"))?;
        if std::env::var_os("KUBEGRACE_E2E_HOST_REACHES_SERVICES").is_some() {
            let ip = spec
                .cluster_ip
                .filter(|ip| !ip.is_empty() && ip != "None")
                .with_context(|| format!("Service {name} has no ClusterIP"))?;
            return Ok(format!("{ip}:80"));
        }
        let node_port = spec
            .ports
            .iter()
            .flatten()
            .find_map(|p| p.node_port)
            .with_context(|| format!("Service {name} has no nodePort"))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let ip = nodes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .flat_map(|n| n.status.and_then(|s| s.addresses).unwrap_or_default())
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address)
            .context("no node with an InternalIP")?;
        Ok(format!("{ip}:{node_port}"))
    }

    async fn pod_names(&self, name: &str) -> Result<BTreeMap<String, bool>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await?
            .items
            .into_iter()
            .filter_map(|p| {
                let terminating = p.metadata.deletion_timestamp.is_some();
                p.metadata.name.map(|n| (n, terminating))
            })
            .collect())
    }

    /// Runs the load on `name`'s Service, applies `action` after the lead-in, waits until
    /// the Deployment is rolled out and the pods it replaced (or scaled away) are gone,
    /// then stops the load. Fails (after stopping the load) when a wait times out.
    pub async fn roll_under_load(
        &self,
        name: &str,
        action: Action,
        p: &Progress,
    ) -> Result<RunResult> {
        let addr = self.service_addr(name).await?;
        let lo = &self.opts.load;
        let cfg = load::Config {
            target: format!("http://{addr}"),
            protocol: Protocol::Http1,
            rate: lo.rate,
            duration: lo.max_duration,
            max_requests: (lo.rate * lo.max_duration.as_secs_f64()).ceil() as u64,
            connections: lo.connections,
            path: lo.path.clone(),
            timeout: lo.timeout,
            ..load::Config::default()
        };
        let before = self.pod_names(name).await?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        p.step(format!(
            "{name}: load {}/s http1 keep-alive ({} connections, GET {}) on {addr}",
            lo.rate, lo.connections, lo.path
        ));
        let load_task = tokio::spawn(async move {
            load::run_outcomes_until(&cfg, async {
                let _ = stop_rx.await;
            })
            .await
            .map(|(_, summary)| summary)
        });
        let outcome = self.act_and_wait(name, action, &before, p).await;
        let _ = stop_tx.send(());
        let summary = load_task
            .await
            .context("load task")?
            .context("load generator")?;
        let (rollout_s, rollout_at_unix_s, events) = outcome?;
        let result = RunResult {
            summary,
            rollout_s,
            rollout_at_unix_s,
            events,
        };
        p.step(format!("{name}: {}", result.describe()));
        Ok(result)
    }

    async fn act_and_wait(
        &self,
        name: &str,
        action: Action,
        before: &BTreeMap<String, bool>,
        p: &Progress,
    ) -> Result<(f64, f64, Vec<(f64, String)>)> {
        // The lead-in is part of the measurement (steady state before the change), not a
        // wait for something to happen.
        tokio::time::sleep(self.opts.load.lead_in).await;
        let deployments = self.deployments();
        let at = unix_now();
        let started = Instant::now();
        let patch = match action {
            Action::Restart => {
                p.step(format!("{name}: rollout restart (new pod template)"));
                json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": format!("{at:.3}"),
                }}}}})
            }
            Action::Scale(n) => {
                p.step(format!("{name}: scale {} -> {n}", before.len()));
                json!({"spec": {"replicas": n}})
            }
        };
        deployments
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching Deployment {name}"))?;

        // What the probe saw so far (the probe runs one at a time; no borrow crosses an await).
        let events: RefCell<Vec<(f64, String)>> = RefCell::default();
        let noted: RefCell<BTreeSet<String>> = RefCell::default();
        let rollout_s: Cell<Option<f64>> = Cell::new(None);
        let wait_old = match action {
            Action::Restart => "every old pod",
            Action::Scale(_) => "the scaled-away pods",
        };
        let keep = match action {
            Action::Restart => 0,
            Action::Scale(n) => usize::try_from(n).unwrap_or(0),
        };
        let budget = self.opts.rollout_timeout + Duration::from_secs(60);
        p.wait(
            &format!("{name}: rolled out and {wait_old} gone"),
            budget,
            Duration::from_millis(250),
            || async {
                let now = self.pod_names(name).await.map_err(|e| format!("{e:#}"))?;
                // Only the deletions are marked: more labels would not fit the timeline.
                for (pod, terminating) in &now {
                    if *terminating
                        && before.contains_key(pod)
                        && noted.borrow_mut().insert(pod.clone())
                    {
                        let label = format!("{} terminating", short(pod));
                        events.borrow_mut().push((unix_now(), label));
                    }
                }
                if rollout_s.get().is_none() {
                    let d = deployments.get(name).await.map_err(|e| e.to_string())?;
                    if rolled_out(&d).is_ok() {
                        rollout_s.set(Some(started.elapsed().as_secs_f64()));
                    }
                }
                let old_left = before.keys().filter(|pod| now.contains_key(*pod)).count();
                let done = match action {
                    Action::Restart => old_left == 0,
                    Action::Scale(_) => now.len() == keep && now.values().all(|t| !t),
                };
                match rollout_s.get() {
                    Some(_) if done => Ok(()),
                    Some(s) => Err(format!(
                        "rolled out after {s:.1}s; {old_left} old pods left of {} pods",
                        now.len()
                    )),
                    None => Err(format!(
                        "rolling: {} pods, {old_left} of them old",
                        now.len()
                    )),
                }
            },
        )
        .await?;
        Ok((rollout_s.get().unwrap_or_default(), at, events.into_inner()))
    }
}

/// The whole scenario's results.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub with: RunResult,
    pub without: RunResult,
    /// `demo-with` scaled down under load, when asked for.
    pub scale: Option<RunResult>,
}

impl Outcome {
    /// `result.json`'s shape.
    pub fn demo_result(&self) -> crate::load::report::DemoResult {
        crate::load::report::DemoResult {
            with: self.with.demo_run(),
            without: self.without.demo_run(),
        }
    }
}

/// Install, deploy, roll `demo-with` then `demo-without` under the same load, optionally
/// scale `demo-with` to `scale_to` under load; then clean up (unless `keep`), also when a
/// step failed.
pub async fn run(
    client: &Client,
    opts: &Options,
    p: &Progress,
    scale_to: Option<i32>,
    keep: bool,
) -> Result<Outcome> {
    let install = Install::new(opts);
    let mut namespaces = Vec::new();
    let outcome = async {
        install.helm_install(client, opts, p).await?;
        let sc = Scenario::new(client, opts, p).await?;
        namespaces.push(sc.namespace.clone());
        sc.deploy(p).await?;
        let with = sc.roll_under_load(WITH, Action::Restart, p).await?;
        let without = sc.roll_under_load(WITHOUT, Action::Restart, p).await?;
        let scale = match scale_to {
            Some(n) => Some(sc.roll_under_load(WITH, Action::Scale(n), p).await?),
            None => None,
        };
        Ok(Outcome {
            with,
            without,
            scale,
        })
    }
    .await;
    if let Err(e) = &outcome {
        p.step(format!("scenario failed: {e:#}"));
    }
    if keep {
        p.step(format!(
            "keeping release {} (namespace {}) and namespaces {namespaces:?}",
            install.release, install.namespace
        ));
    } else {
        install.uninstall(client, &namespaces, p).await;
    }
    outcome
}
