//! The end-to-end scenario, one implementation for `e2e/tests/rollout.rs` and `make demo`
//! (`kubegrace-demo`): install the chart, deploy the demo app twice (with kubegrace and
//! plain), roll each under the same constant load, count every failed request.
//!
//! Steps, each printed with the seconds elapsed ([`Progress`]):
//! 1. [`Install::helm_install`]: `helm install` of `charts/kubegrace` into its own
//!    namespace, with the locally imported images; the webhook is scoped to this run's
//!    namespaces (label `kubegrace.io/e2e-run=<release>`, the chart's
//!    `webhook.namespaceSelector`), so a shared cluster's other tests never see this
//!    operator's webhook, and its `failurePolicy` is `Fail`, so a pod without the sidecar
//!    cannot slip into the measurement.
//! 2. [`Scenario::deploy`]: one labelled namespace; Deployment `demo-with` annotated
//!    `kubegrace.io/inject=enabled` (the operator copies it into the pod template, the
//!    webhook injects) plus a GraceRoute with short drain timers; Deployment `demo-without`
//!    (no sidecar; the demo app exits at once on SIGTERM); a Service in front of each.
//!    Waits until both are settled: every pod ready, the route `Ready`, the sidecar in every
//!    `demo-with` pod, the Service answering through its ClusterIP.
//! 3. [`Scenario::roll_under_load`]: open-loop HTTP/1.1 keep-alive load at a constant rate
//!    on the Service's ClusterIP, sent by `kubegrace-loadgen` running as a Job in the test
//!    namespace ([`LoadMode::Job`], the default) or from this process
//!    (`KUBEGRACE_E2E_LOAD_FROM=host`, [`LoadMode::Host`]: the ClusterIP, or the NodePort
//!    where the host does not route ClusterIPs); then a restart of the pod template (what `kubectl rollout
//!    restart` does), and a wait until the rollout is complete and every old pod is gone.
//!    The load stops there (for the Job: `POST /stop` through the API server's pod proxy;
//!    its summary is the last JSON line of the Job's log) and its summary is the result. [`Action`] also scales
//!    down, annotates (`kubegrace.io/inject`) or kills operator pods mid-rollout.
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
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, Patch,
    PatchParams, PostParams,
};
use kube::{Api, Client};
use kubegrace_sidecar_api::{admin, keys, pod};
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

/// Where the load generator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// `kubegrace-loadgen` as a Job in the test namespace, on the Service's ClusterIP: the
    /// traffic takes the path a client pod's does (kube-proxy on the node), on kind too.
    Job,
    /// In this process, on the ClusterIP (hosts that route it, the local cluster) or the
    /// NodePort (kind). A fallback for clusters without the loadgen image.
    Host,
}

impl LoadMode {
    /// `KUBEGRACE_E2E_LOAD_FROM` unset or `job` is [`LoadMode::Job`] (the load comes from
    /// inside the cluster, as a real client's would); `host` is [`LoadMode::Host`];
    /// anything else is an error, so a typo cannot change what is measured.
    pub fn from_env() -> Result<LoadMode> {
        match std::env::var("KUBEGRACE_E2E_LOAD_FROM").as_deref() {
            Err(_) | Ok("" | "job") => Ok(LoadMode::Job),
            Ok("host") => Ok(LoadMode::Host),
            Ok(other) => bail!("KUBEGRACE_E2E_LOAD_FROM={other:?}: expected job or host"),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            LoadMode::Job => "a loadgen Job in the cluster",
            LoadMode::Host => "this host",
        }
    }
}

/// The load of one run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Where the load generator runs.
    pub mode: LoadMode,
    /// HTTP/1.1 keep-alive until the demo app serves h2c and gRPC too.
    pub protocol: Protocol,
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
            mode: LoadMode::Host,
            protocol: Protocol::Http1,
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
    /// Operator replicas (the chart's default is 2; one is enough where no test kills one).
    pub operator_replicas: u32,
    pub replicas: i32,
    pub drain: Drain,
    pub load: LoadOptions,
    /// Bound of one rollout (template change to every pod replaced and ready).
    pub rollout_timeout: Duration,
    /// Extra chart values (`--set key=value`), e.g. `sidecar.mode=classic`.
    pub chart_values: Vec<(String, String)>,
}

impl Options {
    /// Defaults for the local images (`e2e/cluster/images`), with a release name unique to
    /// this process; the load from this process ([`Options::with_load_from_env`] reads
    /// `KUBEGRACE_E2E_LOAD_FROM`).
    pub fn new(release_prefix: &str) -> Options {
        let release = format!("{release_prefix}-{}", suffix());
        Options {
            chart: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/kubegrace"),
            release_namespace: release.clone(),
            release,
            image_registry: "localhost".into(),
            image_tag: crate::image_tag(),
            operator_replicas: 1,
            replicas: 3,
            drain: Drain::default(),
            load: LoadOptions::default(),
            rollout_timeout: Duration::from_secs(180),
            chart_values: Vec::new(),
        }
    }

    /// The load runs where `KUBEGRACE_E2E_LOAD_FROM` says ([`LoadMode::from_env`]).
    pub fn with_load_from_env(mut self) -> Result<Options> {
        self.load.mode = LoadMode::from_env()?;
        Ok(self)
    }

    /// The loadgen image: `KUBEGRACE_E2E_LOADGEN_IMAGE`, else the one `e2e/cluster/images`
    /// builds next to the chart's images.
    pub fn loadgen_image(&self) -> String {
        std::env::var("KUBEGRACE_E2E_LOADGEN_IMAGE").unwrap_or_else(|_| {
            format!(
                "{}/kubegrace/loadgen:{}",
                self.image_registry, self.image_tag
            )
        })
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

    /// `helm install` with the local images, `opts.operator_replicas`, `failurePolicy: Fail`,
    /// the webhook scoped to namespaces labelled `kubegrace.io/e2e-run=<release>`; then
    /// waits for the operator's certificate in the webhook configuration.
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
        args.extend(set(
            "operator.replicas",
            &opts.operator_replicas.to_string(),
        ));
        args.extend(set("webhook.failurePolicy", "Fail"));
        for (k, v) in &opts.chart_values {
            args.extend(set(k, v));
        }
        // Scoped at install (the chart ANDs this into every webhook entry): a shared
        // cluster's other tests never see this run's webhook, from its first moment.
        let key = RUN_LABEL.replace('.', "\\.");
        args.push("--set-string".into());
        args.push(format!(
            "webhook.namespaceSelector.matchLabels.{key}={}",
            install.release
        ));
        helm(&args, Duration::from_secs(200)).await?;
        p.step(format!(
            "helm install done: operator ready, webhook scoped to namespaces labelled {RUN_LABEL}={}",
            install.release
        ));

        let name = format!("{}-sidecar-injector", install.release);
        let mwcs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let release = install.release.clone();
        p.wait(
            "the operator's CA in the webhook configuration",
            Duration::from_secs(90),
            Duration::from_millis(500),
            || async {
                let m = mwcs.get(&name).await.map_err(|e| e.to_string())?;
                let hooks = m.webhooks.unwrap_or_default();
                // The scope is what keeps this run's webhook out of other tests: check the
                // chart rendered it, rather than trust it.
                let scoped = hooks
                    .iter()
                    .filter(|w| {
                        w.namespace_selector
                            .as_ref()
                            .and_then(|s| s.match_labels.as_ref())
                            .and_then(|l| l.get(RUN_LABEL))
                            == Some(&release)
                    })
                    .count();
                let with_ca = hooks
                    .iter()
                    .filter(|w| w.client_config.ca_bundle.is_some())
                    .count();
                if scoped != hooks.len() {
                    // Not something time fixes; the wait prints it and times out.
                    return Err(format!(
                        "only {scoped}/{} entries select {RUN_LABEL}={release}",
                        hooks.len()
                    ));
                }
                if !hooks.is_empty() && with_ca == hooks.len() {
                    Ok(())
                } else {
                    Err(format!("{with_ca}/{} entries have a caBundle", hooks.len()))
                }
            },
        )
        .await?;
        // The route validator too: with failurePolicy Ignore, a route applied before its
        // caBundle lands is admitted without the webhook's warnings.
        let name = format!("{}-route-validator", install.release);
        let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        p.wait(
            "the operator's CA in the route validator",
            Duration::from_secs(90),
            Duration::from_millis(500),
            || async {
                let v = vwcs.get(&name).await.map_err(|e| e.to_string())?;
                let hooks = v.webhooks.unwrap_or_default();
                let with_ca = hooks
                    .iter()
                    .filter(|w| w.client_config.ca_bundle.is_some())
                    .count();
                if !hooks.is_empty() && with_ca == hooks.len() {
                    Ok(())
                } else {
                    Err(format!("{with_ca}/{} entries have a caBundle", hooks.len()))
                }
            },
        )
        .await?;
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
    /// Set (`true`) or remove (`false`) the Deployment's `kubegrace.io/inject=enabled`
    /// annotation with a merge patch, as `kubectl annotate` does; the operator then changes
    /// the pod template, which rolls every pod.
    Inject(bool),
    /// [`Action::Restart`], and while it rolls, operator pods deleted with grace period 0:
    /// the Lease holder as soon as the first old pod terminates, then the other replica it
    /// started with when the second one does (both serve the webhook, so every pod the
    /// rollout creates in between goes through a webhook whose endpoint just vanished).
    RestartKillingOperator,
}

impl Action {
    fn replaces_every_pod(self) -> bool {
        !matches!(self, Action::Scale(_))
    }
}

/// The result of one run under load.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub summary: Summary,
    /// From the template change (or scale) to the Deployment rolled out, in seconds.
    pub rollout_s: f64,
    /// When the change was made, UNIX time in seconds.
    pub rollout_at_unix_s: f64,
    /// Old pods seen terminating (and operator pods killed), UNIX time in seconds.
    pub events: Vec<(f64, String)>,
    /// Where the load ran ([`LoadMode::describe`] and the Job's name).
    pub load_from: String,
    /// Operator pods deleted during the run ([`Action::RestartKillingOperator`]).
    pub operator_pods_killed: Vec<String>,
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
            "{} requests, {} failed [{}], rollout {:.1}s, p99 {:.1} ms, load from {}{}",
            s.requests,
            s.failed,
            if reasons.is_empty() {
                "-".to_owned()
            } else {
                reasons.join(" ")
            },
            self.rollout_s,
            s.p99_ms,
            self.load_from,
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
        d["metadata"]["annotations"] = json!({ (keys::INJECT): "enabled" });
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

/// Whether the pod has the injected sidecar container.
pub fn has_sidecar(p: &Pod) -> bool {
    p.spec.as_ref().is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .any(|c| c.name == pod::CONTAINER)
    })
}

pub fn pod_ready(p: &Pod) -> bool {
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
    /// Creates the namespace `kg-e2e-rollout-xxxxx` (labelled for cleanup and for this
    /// run's webhook).
    pub async fn new(client: &Client, opts: &Options, p: &Progress) -> Result<Scenario> {
        Scenario::named(client, opts, p, "rollout").await
    }

    /// Like [`Scenario::new`], in namespace `kg-e2e-<what>-xxxxx`.
    pub async fn named(
        client: &Client,
        opts: &Options,
        p: &Progress,
        what: &str,
    ) -> Result<Scenario> {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let name = format!("kg-e2e-{what}-{}", suffix());
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
        self.create_route(WITH, p).await?;
        self.create_app(WITH, true, p).await?;
        self.create_app(WITHOUT, false, p).await?;
        self.settle(WITH, true, p).await?;
        self.settle(WITHOUT, false, p).await?;
        Ok(())
    }

    /// Creates GraceRoute `name` targeting Deployment `name` (port `http`, `opts.drain`).
    pub async fn create_route(&self, name: &str, p: &Progress) -> Result<()> {
        let d = &self.opts.drain;
        let route: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kubegrace.io/v1alpha1", "kind": "GraceRoute",
            "metadata": {"name": name},
            "spec": {
                "targetRef": {"kind": "Deployment", "name": name},
                "ports": [{"name": "http", "protocol": "http"}],
                "drain": {"minDelay": d.min_delay, "quiet": d.quiet, "maxDelay": d.max_delay, "timeout": d.timeout},
            },
        }))?;
        graceroute_api(&self.client, &self.namespace)
            .create(&PostParams::default(), &route)
            .await
            .with_context(|| format!("creating GraceRoute {name}"))?;
        p.step(format!(
            "GraceRoute {name}: drain minDelay {} quiet {} maxDelay {} timeout {}",
            d.min_delay, d.quiet, d.max_delay, d.timeout
        ));
        Ok(())
    }

    /// Creates Deployment `name` (the demo app, `opts.replicas`; annotated
    /// `kubegrace.io/inject=enabled` iff `kubegrace`) and a Service in front of it.
    pub async fn create_app(&self, name: &str, kubegrace: bool, p: &Progress) -> Result<()> {
        let post = PostParams::default();
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
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
        Ok(())
    }

    /// Waits until GraceRoute `name` has computed its time budget, and checks that the
    /// operator left Deployment `name` alone: the budget reaches pods through the webhook
    /// (terminationGracePeriodSeconds raised on each pod it injects), never through the pod
    /// template, so nothing rolls and a GitOps re-apply of the manifest changes nothing.
    pub async fn wait_budget_applied(&self, name: &str, p: &Progress) -> Result<i64> {
        let routes = graceroute_api(&self.client, &self.namespace);
        let budget = p
            .wait(
                &format!("GraceRoute {name}: time budget computed"),
                Duration::from_secs(60),
                Duration::from_millis(500),
                || async {
                    let r = routes.get(name).await.map_err(|e| e.to_string())?;
                    r.data["status"]["budgetSeconds"]
                        .as_i64()
                        .ok_or_else(|| "no budget in the route's status yet".to_string())
                },
            )
            .await?;
        let d = self.deployments().get(name).await?;
        let tgp = d
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.termination_grace_period_seconds);
        ensure!(
            tgp != Some(budget),
            "Deployment {name}'s pod template carries the budget {budget}s: the operator edited it"
        );
        Ok(budget)
    }

    /// The sidecar's admin port in pod `pod`: its `kg-admin` container port (chosen per
    /// pod by the webhook, against the pod's own ports).
    pub async fn admin_port(&self, pod: &str) -> Result<u16> {
        let pod = self.pods().get(pod).await?;
        let spec = pod.spec.context("pod without spec")?;
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(admin::PORT_NAME))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .context("no kg-admin port: the pod has no sidecar")
    }

    /// `GET path` on the sidecar's admin port of pod `pod`.
    pub async fn admin_get(&self, pod: &str, path: &str) -> Result<String> {
        let port = self.admin_port(pod).await?;
        self.pod_get(pod, port, path).await
    }

    /// The live pods of Deployment `name`.
    pub async fn app_pods(&self, name: &str) -> Result<Vec<Pod>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await?
            .items)
    }

    /// `GET path` on port `port` of pod `pod`, through the API server's pod proxy (it
    /// reaches the pod IP wherever the API server does, kind included). Returns the body.
    pub async fn pod_get(&self, pod: &str, port: u16, path: &str) -> Result<String> {
        let url = format!(
            "/api/v1/namespaces/{}/pods/{pod}:{port}/proxy/{}",
            self.namespace,
            path.trim_start_matches('/')
        );
        let req = http::Request::get(url.as_str()).body(Vec::new())?;
        self.client
            .request_text(req)
            .await
            .with_context(|| format!("GET {url}"))
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
                    // The budget reaches each pod through the webhook, not the template.
                    let budget = r.data["status"]["budgetSeconds"].as_i64().unwrap_or(0);
                    let short: Vec<String> = live
                        .iter()
                        .filter(|p| {
                            p.spec
                                .as_ref()
                                .and_then(|s| s.termination_grace_period_seconds)
                                .unwrap_or(30)
                                < budget
                        })
                        .filter_map(|p| p.metadata.name.clone())
                        .collect();
                    if !short.is_empty() {
                        return Err(format!(
                            "pods with a grace period below the budget {budget}s: {}",
                            short.join(", ")
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

    /// Starts the load on `name`'s Service where `opts.load.mode` says, and returns once it
    /// runs. Stop it with [`RunningLoad::finish`].
    pub async fn start_load(&self, name: &str, p: &Progress) -> Result<RunningLoad> {
        let lo = &self.opts.load;
        match lo.mode {
            LoadMode::Host => {
                let addr = self.service_addr(name).await?;
                let cfg = self.load_config(format!("http://{addr}"));
                p.step(format!(
                    "{name}: load {}/s {} keep-alive ({} connections, GET {}) on {addr} from {}",
                    lo.rate,
                    lo.protocol.as_str(),
                    lo.connections,
                    lo.path,
                    lo.mode.describe()
                ));
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    load::run_outcomes_until(&cfg, async {
                        let _ = stop_rx.await;
                    })
                    .await
                    .map(|(_, summary)| summary)
                });
                Ok(RunningLoad {
                    from: lo.mode.describe().to_owned(),
                    inner: Running::Host { stop_tx, task },
                })
            }
            LoadMode::Job => self.start_load_job(name, p).await,
        }
    }

    fn load_config(&self, target: String) -> load::Config {
        let lo = &self.opts.load;
        load::Config {
            target,
            protocol: lo.protocol,
            rate: lo.rate,
            duration: lo.max_duration,
            max_requests: (lo.rate * lo.max_duration.as_secs_f64()).ceil() as u64,
            connections: lo.connections,
            path: lo.path.clone(),
            timeout: lo.timeout,
            ..load::Config::default()
        }
    }

    /// Creates the loadgen Job on the Service's ClusterIP and waits until its pod is ready
    /// (its control endpoint answers, so the load runs).
    async fn start_load_job(&self, name: &str, p: &Progress) -> Result<RunningLoad> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let cluster_ip = services
            .get(name)
            .await?
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
            .with_context(|| format!("Service {name} has no ClusterIP"))?;
        let cfg = self.load_config(format!("http://{cluster_ip}:80"));
        let job_name = format!("loadgen-{name}-{}", suffix());
        // The Job ends by itself even if nobody stops it: the loadgen's own schedule is
        // bounded (rate x max_duration), and the deadline bounds the pod's life.
        let deadline_s = cfg.duration.as_secs() + cfg.timeout.as_secs() + 120;
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": job_name, "labels": {"app": "loadgen", "loadgen-for": name}},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": deadline_s,
                "template": {
                    "metadata": {"labels": {"app": "loadgen", "loadgen-for": name}},
                    "spec": {
                        "restartPolicy": "Never",
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": cfg.timeout.as_secs() + 5,
                        "containers": [{
                            "name": "loadgen",
                            "image": self.opts.loadgen_image(),
                            "imagePullPolicy": "IfNotPresent",
                            "args": [
                                format!("--target={}", cfg.target),
                                format!("--protocol={}", cfg.protocol.as_str()),
                                format!("--rate={}", cfg.rate),
                                format!("--duration={}s", cfg.duration.as_secs()),
                                format!("--max-requests={}", cfg.max_requests),
                                format!("--connections={}", cfg.connections),
                                format!("--path={}", cfg.path),
                                format!("--timeout={}ms", cfg.timeout.as_millis()),
                                format!("--control=0.0.0.0:{LOADGEN_CONTROL_PORT}"),
                            ],
                            "ports": [{"name": "control", "containerPort": LOADGEN_CONTROL_PORT}],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": "control"}, "periodSeconds": 1},
                            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                                                "capabilities": {"drop": ["ALL"]},
                                                "seccompProfile": {"type": "RuntimeDefault"}},
                        }],
                    },
                },
            },
        }))?;
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.namespace);
        jobs.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating the loadgen Job {job_name}"))?;
        p.step(format!(
            "{name}: load {}/s {} keep-alive ({} connections, GET {}) on {cluster_ip}:80 from Job {job_name}",
            cfg.rate,
            cfg.protocol.as_str(),
            cfg.connections,
            cfg.path
        ));
        let pods = self.pods();
        let selector = format!("job-name={job_name}");
        let pod = p
            .wait(
                &format!("Job {job_name}: its pod sending (ready)"),
                Duration::from_secs(60),
                Duration::from_millis(250),
                || async {
                    let list = pods
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| e.to_string())?;
                    let Some(pod) = list.items.first() else {
                        return Err("no pod yet".to_owned());
                    };
                    let phase = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if phase == "Failed" || phase == "Succeeded" {
                        // Not retryable: say so at once (the wait prints it and times out
                        // otherwise, which would only hide the reason).
                        return Err(format!("pod ended early ({phase})"));
                    }
                    match (pod_ready(pod), pod.metadata.name.clone()) {
                        (true, Some(n)) => Ok(n),
                        _ => Err(format!("pod {phase}, not ready")),
                    }
                },
            )
            .await?;
        Ok(RunningLoad {
            from: format!("{} ({job_name})", LoadMode::Job.describe()),
            inner: Running::Job {
                client: self.client.clone(),
                namespace: self.namespace.clone(),
                job: job_name,
                pod,
                timeout: cfg.timeout,
            },
        })
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
        let before = self.pod_names(name).await?;
        let load = self.start_load(name, p).await?;
        let outcome = self.act_and_wait(name, action, &before, p).await;
        let load_from = load.from.clone();
        let summary = load.finish(p).await?;
        let acted = outcome?;
        let result = RunResult {
            summary,
            rollout_s: acted.rollout_s,
            rollout_at_unix_s: acted.at_unix_s,
            events: acted.events,
            load_from,
            operator_pods_killed: acted.killed,
        };
        p.step(format!("{name}: {}", result.describe()));
        Ok(result)
    }

    /// The operator pods of this run's release that are not terminating (name, ready), and
    /// the Lease holder.
    pub async fn operator_pods(&self) -> Result<(Vec<(String, bool)>, Option<String>)> {
        let ns = &self.opts.release_namespace;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let selector = format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component=operator",
            self.opts.release
        );
        let names = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                let ready = pod_ready(&p);
                p.metadata.name.map(|n| (n, ready))
            })
            .collect();
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        let holder = leases
            .get_opt(&format!("{}-operator", self.opts.release))
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        Ok((names, holder))
    }

    /// Deletes operator pod `pod` with grace period 0 (as `kubectl delete --grace-period=0
    /// --force` does): the process is killed, nothing drains.
    async fn kill_operator_pod(&self, pod: &str) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.opts.release_namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete(pod, &dp)
            .await
            .with_context(|| format!("deleting operator pod {pod}"))?;
        Ok(())
    }

    async fn act_and_wait(
        &self,
        name: &str,
        action: Action,
        before: &BTreeMap<String, bool>,
        p: &Progress,
    ) -> Result<Acted> {
        // The lead-in is part of the measurement (steady state before the change), not a
        // wait for something to happen.
        tokio::time::sleep(self.opts.load.lead_in).await;
        let deployments = self.deployments();
        // The rollout counts only once the Deployment's generation moved past this: an
        // annotation changes no spec, so the generation moves when the operator acts.
        let generation_before = deployments
            .get(name)
            .await?
            .metadata
            .generation
            .unwrap_or(0);
        // Operator pods to kill, in order: the Lease holder first.
        let mut victims: Vec<String> = Vec::new();
        if action == Action::RestartKillingOperator {
            let (pods, holder) = self.operator_pods().await?;
            let mut pods: Vec<String> = pods.into_iter().map(|(n, _)| n).collect();
            ensure!(
                pods.len() >= 2,
                "killing an operator pod needs 2 replicas; release {} runs {:?}",
                self.opts.release,
                pods
            );
            if let Some(h) = holder.filter(|h| pods.contains(h)) {
                pods.retain(|p| p != &h);
                victims.push(h);
            }
            victims.extend(pods);
            p.step(format!(
                "operator pods to kill mid-rollout, in order: {victims:?}"
            ));
        }
        let at = unix_now();
        let started = Instant::now();
        let patch = match action {
            Action::Restart | Action::RestartKillingOperator => {
                p.step(format!("{name}: rollout restart (new pod template)"));
                json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": format!("{at:.3}"),
                }}}}})
            }
            Action::Scale(n) => {
                p.step(format!("{name}: scale {} -> {n}", before.len()));
                json!({"spec": {"replicas": n}})
            }
            Action::Inject(true) => {
                p.step(format!(
                    "{name}: annotate kubegrace.io/inject=enabled (the operator rolls it)"
                ));
                json!({"metadata": {"annotations": { (keys::INJECT): "enabled" }}})
            }
            Action::Inject(false) => {
                p.step(format!(
                    "{name}: annotate kubegrace.io/inject- (the operator rolls it back)"
                ));
                json!({"metadata": {"annotations": { (keys::INJECT): null }}})
            }
        };
        deployments
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching Deployment {name}"))?;

        // What the probe saw so far (the probe runs one at a time; no borrow crosses an await).
        let events: RefCell<Vec<(f64, String)>> = RefCell::default();
        let noted: RefCell<BTreeSet<String>> = RefCell::default();
        let killed: RefCell<Vec<String>> = RefCell::default();
        let rollout_s: Cell<Option<f64>> = Cell::new(None);
        let wait_old = if action.replaces_every_pod() {
            "every old pod"
        } else {
            "the scaled-away pods"
        };
        let keep = match action {
            Action::Scale(n) => usize::try_from(n).unwrap_or(0),
            _ => 0,
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
                // One operator pod killed per old pod seen terminating, so each kill falls
                // while the rollout creates pods.
                let due = noted.borrow().len().min(victims.len());
                while killed.borrow().len() < due {
                    let victim = victims[killed.borrow().len()].clone();
                    self.kill_operator_pod(&victim)
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    p.step(format!("  killed operator pod {victim} (grace period 0)"));
                    events
                        .borrow_mut()
                        .push((unix_now(), format!("operator {} killed", short(&victim))));
                    killed.borrow_mut().push(victim);
                }
                if rollout_s.get().is_none() {
                    let d = deployments.get(name).await.map_err(|e| e.to_string())?;
                    let moved = d.metadata.generation.unwrap_or(0) > generation_before;
                    if moved && rolled_out(&d).is_ok() {
                        rollout_s.set(Some(started.elapsed().as_secs_f64()));
                    }
                }
                let old_left = before.keys().filter(|pod| now.contains_key(*pod)).count();
                let done = if action.replaces_every_pod() {
                    old_left == 0
                } else {
                    now.len() == keep && now.values().all(|t| !t)
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
        Ok(Acted {
            rollout_s: rollout_s.get().unwrap_or_default(),
            at_unix_s: at,
            events: events.into_inner(),
            killed: killed.into_inner(),
        })
    }
}

/// What [`Scenario::act_and_wait`] saw.
struct Acted {
    rollout_s: f64,
    at_unix_s: f64,
    events: Vec<(f64, String)>,
    killed: Vec<String>,
}

/// The loadgen's control port in its Job (`GET /ready`, `POST /stop`).
pub const LOADGEN_CONTROL_PORT: u16 = 9000;

/// A load that runs until [`RunningLoad::finish`].
pub struct RunningLoad {
    /// Where it runs, for the report.
    pub from: String,
    inner: Running,
}

enum Running {
    Host {
        stop_tx: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Result<Summary, load::Error>>,
    },
    Job {
        client: Client,
        namespace: String,
        job: String,
        pod: String,
        timeout: Duration,
    },
}

impl RunningLoad {
    /// Stops sending, lets the requests in flight finish and returns the summary. The Job
    /// is stopped through the API server's pod proxy (`POST /stop` on its control port),
    /// which reaches pods wherever the API server does (kind too); its summary is the last
    /// JSON line of the pod's log.
    pub async fn finish(self, p: &Progress) -> Result<Summary> {
        match self.inner {
            Running::Host { stop_tx, task } => {
                let _ = stop_tx.send(());
                Ok(task.await.context("load task")?.context("load generator")?)
            }
            Running::Job {
                client,
                namespace,
                job,
                pod,
                timeout,
            } => {
                let url = format!(
                    "/api/v1/namespaces/{namespace}/pods/{pod}:{LOADGEN_CONTROL_PORT}/proxy/stop"
                );
                p.wait(
                    &format!("Job {job}: POST /stop accepted"),
                    Duration::from_secs(30),
                    Duration::from_millis(500),
                    || async {
                        let req = http::Request::post(url.as_str())
                            .body(Vec::new())
                            .map_err(|e| e.to_string())?;
                        client
                            .request_text(req)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string())
                    },
                )
                .await?;
                let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                let phase = p
                    .wait(
                        &format!("Job {job}: requests in flight done, pod {pod} finished"),
                        timeout + Duration::from_secs(60),
                        Duration::from_millis(500),
                        || async {
                            let got = pods.get(&pod).await.map_err(|e| e.to_string())?;
                            match got.status.and_then(|s| s.phase).as_deref() {
                                Some(ph @ ("Succeeded" | "Failed")) => Ok(ph.to_owned()),
                                other => Err(format!("phase {}", other.unwrap_or("-"))),
                            }
                        },
                    )
                    .await?;
                let log = pods
                    .logs(
                        &pod,
                        &LogParams {
                            container: Some("loadgen".into()),
                            ..LogParams::default()
                        },
                    )
                    .await
                    .with_context(|| format!("reading the log of {pod}"))?;
                ensure!(
                    phase == "Succeeded",
                    "loadgen pod {pod} {phase}; its log:\n{log}"
                );
                let line = log
                    .lines()
                    .rev()
                    .find(|l| l.trim_start().starts_with('{'))
                    .with_context(|| format!("no JSON summary in the log of {pod}:\n{log}"))?;
                serde_json::from_str(line)
                    .with_context(|| format!("parsing the summary in the log of {pod}"))
            }
        }
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
